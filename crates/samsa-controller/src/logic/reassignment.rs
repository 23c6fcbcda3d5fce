//! Partition reassignment (KIP-455), as the controller decides it.
//!
//! A reassignment moves a partition from its *original* replicas to a
//! *target* list in three steps, each one metadata record:
//!
//! 1. **start** (`AlterPartitionReassignments`): the replica set becomes
//!    target ++ (original − target), with `adding_replicas` = target −
//!    original and `removing_replicas` = original − target. The leader and
//!    the ISR stay; the adding replicas open the log and fetch as followers.
//! 2. **catch-up**: the leader adds each adding replica to the ISR through
//!    `AlterPartition` once it has reached the high watermark, as it does
//!    for any follower.
//! 3. **completion** ([`complete_reassignment`]), in the same batch as the
//!    ISR change that puts the last target replica in sync (or at a tick):
//!    replicas = target, ISR = ISR ∩ target, leadership moves to the first
//!    in-sync active target replica when the leader is removed (leader epoch
//!    + 1); the removed brokers delete their copy when they apply it.
//!
//! Invariants: every committed record stays on the ISR, which only loses a
//! member that is being removed, and only once every target replica is in
//! it, so nothing acknowledged leaves the partition with the old replicas;
//! an adding replica leads only from inside the ISR (never by unclean
//! election); cancelling (a `None` target) restores the original replicas
//! and the ISR among them. A new target for a partition that is already
//! moving replaces the old one, measured from the same original replicas.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::{partition_changed, Changes, ControllerLogic, Outcome};
use crate::error::ControllerError;
use crate::image::MetadataImage;
use crate::records::{BrokerId, ReplicaAssignment, NO_LEADER};

/// One partition of an `AlterPartitionReassignments` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reassignment {
    pub topic: String,
    pub partition: i32,
    /// The target replicas, preferred leader first; `None` cancels the
    /// reassignment in progress.
    pub target: Option<Vec<BrokerId>>,
}

/// The answer for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReassignmentResult {
    pub topic: String,
    pub partition: i32,
    pub result: Result<(), ControllerError>,
}

impl ControllerLogic {
    /// Starts, replaces or cancels the reassignment of each partition
    /// listed; each partition succeeds or fails on its own.
    pub fn alter_reassignments(
        &mut self,
        image: &MetadataImage,
        requests: Vec<Reassignment>,
        _now_ms: i64,
    ) -> Outcome<Vec<ReassignmentResult>> {
        let mut changes = Changes::new(image);
        let mut results = Vec::with_capacity(requests.len());
        for request in requests {
            let result = reassign_one(&mut changes, &request);
            if let Err(e) = &result {
                tracing::info!(topic = %request.topic, partition = request.partition,
                    target = ?request.target, error = %e, "reassignment refused");
            }
            results.push(ReassignmentResult {
                topic: request.topic,
                partition: request.partition,
                result,
            });
        }
        Ok((changes.records, results))
    }
}

fn reassign_one(changes: &mut Changes, request: &Reassignment) -> Result<(), ControllerError> {
    let image = &changes.scratch;
    let topic = image
        .topic(&request.topic)
        .ok_or_else(|| ControllerError::UnknownTopic(request.topic.clone()))?;
    let state = topic
        .partition(request.partition)
        .ok_or_else(|| ControllerError::UnknownPartition {
            topic: request.topic.clone(),
            partition: request.partition,
        })?
        .clone();
    let topic_id = topic.topic_id;
    let original = state.original_replicas();
    let assignment = match &request.target {
        None => {
            if !state.is_reassigning() {
                return Err(ControllerError::NoReassignmentInProgress);
            }
            ReplicaAssignment {
                replicas: original,
                ..ReplicaAssignment::default()
            }
        }
        Some(target) => {
            validate_target(image, target)?;
            let mut replicas = target.clone();
            replicas.extend(original.iter().filter(|b| !target.contains(b)));
            ReplicaAssignment {
                adding_replicas: target
                    .iter()
                    .copied()
                    .filter(|b| !original.contains(b))
                    .collect(),
                removing_replicas: original
                    .iter()
                    .copied()
                    .filter(|b| !target.contains(b))
                    .collect(),
                replicas,
            }
        }
    };
    if assignment == state.assignment() {
        return Ok(());
    }
    // A replaced reassignment's adding replicas that the new one drops
    // leave the ISR with it.
    let isr: Vec<BrokerId> = state
        .isr
        .iter()
        .copied()
        .filter(|b| assignment.replicas.contains(b))
        .collect();
    if isr.is_empty() {
        return Err(ControllerError::InvalidReplicaAssignment(format!(
            "no in-sync replica of {}-{} would be left",
            request.topic, request.partition
        )));
    }
    let leader = if isr.contains(&state.leader) {
        state.leader
    } else {
        first_electable(image, &assignment.replicas, &isr).unwrap_or(NO_LEADER)
    };
    tracing::info!(topic = %request.topic, partition = request.partition,
        replicas = ?assignment.replicas, adding = ?assignment.adding_replicas,
        removing = ?assignment.removing_replicas, "reassignment {}",
        if request.target.is_some() { "started" } else { "cancelled" });
    changes.push(partition_changed(
        topic_id,
        request.partition,
        &state,
        leader,
        isr,
        Some(assignment),
    ))?;
    complete_reassignment(changes, topic_id, request.partition)
}

/// Kafka's checks of a target replica list: not empty, no broker twice,
/// every broker registered.
fn validate_target(image: &MetadataImage, target: &[BrokerId]) -> Result<(), ControllerError> {
    let invalid = |why: String| Err(ControllerError::InvalidReplicaAssignment(why));
    if target.is_empty() {
        return invalid("the target replica list is empty".into());
    }
    if target.iter().collect::<BTreeSet<_>>().len() != target.len() {
        return invalid(format!(
            "the target replicas {target:?} name a broker twice"
        ));
    }
    if let Some(b) = target.iter().find(|b| image.broker(**b).is_none()) {
        return invalid(format!("broker {b} is not registered"));
    }
    Ok(())
}

/// The first of `replicas` that is in `isr` and active.
fn first_electable(
    image: &MetadataImage,
    replicas: &[BrokerId],
    isr: &[BrokerId],
) -> Option<BrokerId> {
    replicas
        .iter()
        .copied()
        .find(|b| isr.contains(b) && image.is_broker_active(*b))
}

/// Completes the reassignment of one partition if every target replica is
/// in its ISR (see the module docs); otherwise changes nothing. A leader
/// being removed hands over to the first in-sync active target replica;
/// with none active the reassignment waits.
pub(super) fn complete_reassignment(
    changes: &mut Changes,
    topic_id: Uuid,
    partition: i32,
) -> Result<(), ControllerError> {
    let image = &changes.scratch;
    let Some(state) = image
        .topic_by_id(&topic_id)
        .and_then(|t| t.partition(partition))
    else {
        return Ok(());
    };
    if !state.is_reassigning() {
        return Ok(());
    }
    let target = state.target_replicas();
    if !target.iter().all(|b| state.isr.contains(b)) {
        return Ok(());
    }
    let isr: Vec<BrokerId> = state
        .isr
        .iter()
        .copied()
        .filter(|b| target.contains(b))
        .collect();
    let leader = if target.contains(&state.leader) {
        state.leader
    } else {
        match first_electable(image, &target, &isr) {
            Some(b) => b,
            None => return Ok(()),
        }
    };
    let state = state.clone();
    tracing::info!(%topic_id, partition, replicas = ?target, leader, "reassignment completed");
    let record = partition_changed(
        topic_id,
        partition,
        &state,
        leader,
        isr,
        Some(ReplicaAssignment {
            replicas: target,
            ..ReplicaAssignment::default()
        }),
    );
    changes.push(record)
}

/// Completes every reassignment that is ready (a tick's duty: a target
/// replica may have been in sync already when the reassignment started, or
/// the leader handover waited for an active target replica).
pub(super) fn complete_ready_reassignments(changes: &mut Changes) -> Result<(), ControllerError> {
    let moving: Vec<(Uuid, i32)> = changes
        .scratch
        .topics()
        .flat_map(|t| {
            t.partitions
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_reassigning())
                .filter_map(move |(i, _)| Some((t.topic_id, i32::try_from(i).ok()?)))
        })
        .collect();
    for (topic_id, partition) in moving {
        complete_reassignment(changes, topic_id, partition)?;
    }
    Ok(())
}
