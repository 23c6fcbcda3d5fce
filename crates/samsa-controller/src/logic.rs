//! The controller's decisions, as sans-IO handlers.
//!
//! Each handler takes the current [`MetadataImage`], a request and the time
//! (`now_ms`, milliseconds on any monotonic or wall clock — only differences
//! matter — as an `i64`, the broker's and Kafka's representation of
//! milliseconds) and returns the records to commit plus the response to send once
//! they are committed (Kafka's `ControllerResult`):
//!
//! ```text
//! (&MetadataImage, request, now_ms) -> Result<(Vec<MetadataRecord>, Response), ControllerError>
//! ```
//!
//! Nothing here does I/O, reads a clock or draws random numbers: a new topic's
//! UUID is passed in, and replica placement is seeded from it. The caller
//! (`service.rs`) must run handlers one at a time against an image that
//! reflects every record committed so far, and commit the returned records as
//! one batch before running the next handler.
//!
//! The only state kept between calls is [`ControllerLogic`]'s leader-local
//! soft state: [`BrokerLiveness`], the last heartbeat time of each broker. It
//! is not replicated (see [`crate::image`] for why); a controller that becomes
//! leader calls [`ControllerLogic::reset_liveness`], which gives every broker
//! a full session timeout from that moment.
//!
//! # Broker lifecycle
//!
//! | from | event | to | records |
//! |---|---|---|---|
//! | (none) / fenced / expired | `register_broker` with a new incarnation | registered, **fenced** | `BrokerRegistered` (+ partition moves if the old incarnation was active) |
//! | active, session alive | `register_broker` with another incarnation | unchanged | — (`DUPLICATE_BROKER_REGISTRATION`) |
//! | any | `register_broker` with the same incarnation | unchanged | — (idempotent retry) |
//! | fenced | `heartbeat`, caught up to its registration, `want_fence = false` | active | `BrokerUnfenced` + elections of leaderless partitions it replicates |
//! | active | `heartbeat` with `want_fence = true` | fenced | `BrokerFenced` + partition moves |
//! | active | no heartbeat for `broker.session.timeout.ms` (`fence_expired_brokers`) | fenced | `BrokerFenced` + partition moves |
//! | registered | `controlled_shutdown` | fenced, in controlled shutdown | `BrokerFenced{controlled_shutdown}` + partition moves |
//! | in controlled shutdown | `heartbeat` | unchanged | — (`should_shut_down = true`) |
//! | registered | `unregister_broker` (UnregisterBroker) | (none) | `BrokerFenced` + partition moves if it was active, `BrokerUnregistered`; a heartbeat then gets BROKER_ID_NOT_REGISTERED and a running broker registers again |
//!
//! # Partition moves (leader election)
//!
//! When brokers stop being active, every partition they lead or are in the
//! ISR of is re-decided ([`next_leader_and_isr`]):
//!
//! 1. the ISR keeps its active members; if none is left it keeps one member
//!    (the old leader if it was in the ISR), so the last in-sync copy is
//!    remembered and can lead again when it comes back;
//! 2. the leader stays if it is still active and in the ISR; otherwise the
//!    first replica (preferred order) that is active and in the ISR leads;
//! 3. if nobody qualifies the partition has no leader ([`NO_LEADER`]) — unless
//!    the topic (or cluster) sets `unclean.leader.election.enable=true`, in
//!    which case the first active replica leads with an ISR of itself;
//! 4. any change bumps `partition_epoch`; a change of leader also bumps
//!    `leader_epoch`.
//!
//! Leaderless partitions are re-decided the same way when a replica becomes
//! active again, and on every [`ControllerLogic::tick`].
//!
//! # `AlterPartition` (ISR changes proposed by a leader)
//!
//! Compare-and-set on the partition epoch, checked in this order: broker
//! epoch (`STALE_BROKER_EPOCH`), topic and partition exist, sender is the
//! leader (`NOT_LEADER_OR_FOLLOWER`), leader epoch equal
//! (`FENCED_LEADER_EPOCH`), partition epoch equal (`INVALID_UPDATE_VERSION`),
//! new ISR valid (`INVALID_REQUEST`) and every *added* member active
//! (`INELIGIBLE_REPLICA`). An unchanged ISR is answered without a record.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

use crate::error::ControllerError;
use crate::image::{
    MetadataImage, PartitionState, TopicImage, MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE,
};
use crate::records::{
    BrokerEndpoint, BrokerId, ConfigResource, MetadataRecord, ReplicaAssignment, NO_LEADER,
};

mod reassignment;
#[cfg(test)]
mod tests;

pub use reassignment::{Reassignment, ReassignmentResult};

/// What every handler returns: records to commit as one batch, and the
/// response to send after they are committed.
pub type Outcome<R> = Result<(Vec<MetadataRecord>, R), ControllerError>;

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// Tunables of the controller logic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicConfig {
    /// `broker.session.timeout.ms`: a broker without heartbeat for longer is fenced.
    pub broker_session_timeout_ms: i64,
    /// `num.partitions` for topics created without a count.
    pub default_num_partitions: i32,
    /// `default.replication.factor`; `None` means min(3, active brokers).
    pub default_replication_factor: Option<i32>,
    /// Size of each producer-id block.
    pub producer_id_block_size: i32,
    /// `auto.leader.rebalance.enable` with its check interval and
    /// threshold; `None` disables it.
    pub leader_rebalance: Option<LeaderRebalance>,
}

/// Kafka's automatic preferred-leader election: every `interval_ms`, a
/// broker that is the preferred leader of partitions it does not lead,
/// more than `imbalance_percent` % of those it is preferred for, gets them
/// back (where it is active and in sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderRebalance {
    /// `leader.imbalance.check.interval.seconds`, in ms.
    pub interval_ms: i64,
    /// `leader.imbalance.per.broker.percentage`.
    pub imbalance_percent: u32,
}

impl Default for LeaderRebalance {
    fn default() -> Self {
        Self {
            interval_ms: 300_000,
            imbalance_percent: 10,
        }
    }
}

impl Default for LogicConfig {
    fn default() -> Self {
        Self {
            broker_session_timeout_ms: 9_000,
            default_num_partitions: 1,
            default_replication_factor: None,
            producer_id_block_size: 1_000,
            leader_rebalance: Some(LeaderRebalance::default()),
        }
    }
}

/// Leader-local record of when each broker last sent a heartbeat.
#[derive(Debug, Clone, Default)]
pub struct BrokerLiveness {
    /// When this controller started tracking (became leader); brokers not
    /// heard from since count as seen at this time.
    since_ms: i64,
    last_heartbeat_ms: BTreeMap<BrokerId, i64>,
}

impl BrokerLiveness {
    pub fn new(now_ms: i64) -> Self {
        Self {
            since_ms: now_ms,
            last_heartbeat_ms: BTreeMap::new(),
        }
    }

    /// Forget everything and give every broker a full session from `now_ms`.
    pub fn reset(&mut self, now_ms: i64) {
        *self = Self::new(now_ms);
    }

    pub fn touch(&mut self, broker: BrokerId, now_ms: i64) {
        let slot = self.last_heartbeat_ms.entry(broker).or_insert(now_ms);
        *slot = (*slot).max(now_ms);
    }

    pub fn last_heartbeat_ms(&self, broker: BrokerId) -> i64 {
        self.last_heartbeat_ms
            .get(&broker)
            .copied()
            .unwrap_or(self.since_ms)
    }

    pub fn is_expired(&self, broker: BrokerId, now_ms: i64, timeout_ms: i64) -> bool {
        now_ms.saturating_sub(self.last_heartbeat_ms(broker)) > timeout_ms
    }
}

// ---------------------------------------------------------------------------
// Requests and responses
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterBroker {
    pub broker_id: BrokerId,
    pub incarnation_id: Uuid,
    pub cluster_id: Option<String>,
    pub endpoints: Vec<BrokerEndpoint>,
    pub rack: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterBrokerReply {
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
    /// Highest metadata offset the broker has applied.
    pub metadata_offset: u64,
    pub want_fence: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub is_fenced: bool,
    pub is_caught_up: bool,
    pub should_shut_down: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateTopic {
    pub name: String,
    /// `None`: [`LogicConfig::default_num_partitions`].
    pub num_partitions: Option<i32>,
    /// `None`: [`LogicConfig::default_replication_factor`].
    pub replication_factor: Option<i32>,
    /// Manual placement, one replica list per partition; overrides the counts.
    pub assignments: Option<Vec<Vec<BrokerId>>>,
    pub configs: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateTopicReply {
    pub topic_id: Uuid,
    pub num_partitions: i32,
    pub replication_factor: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicRef {
    Name(String),
    Id(Uuid),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTopicReply {
    pub name: String,
    pub topic_id: Uuid,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitions {
    pub topic: String,
    pub new_total_count: i32,
    /// Placement of the new partitions only.
    pub assignments: Option<Vec<Vec<BrokerId>>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePartitionsReply {
    pub topic_id: Uuid,
    pub num_partitions: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterPartition {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
    pub topic_id: Uuid,
    pub partition: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub new_isr: Vec<BrokerId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocateProducerIds {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
}

/// A contiguous, never-reused range of producer ids, `[first, first + size)`,
/// sized as Kafka's `ProducerIdsRecord` (an i64 start, an i32 length). The
/// one block type: the controller hands it out, and the broker's block
/// sources (the quorum's and the single-node file's) return it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdBlock {
    pub first: i64,
    pub size: i32,
}

impl ProducerIdBlock {
    /// One past the block's last id.
    pub fn end(&self) -> i64 {
        self.first.saturating_add(i64::from(self.size))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlledShutdown {
    pub broker_id: BrokerId,
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlledShutdownReply {
    /// Partitions whose leadership moved to another broker.
    pub leaderships_moved: u32,
    /// Partitions left leaderless (this broker was their only in-sync replica).
    pub partitions_offline: Vec<(String, i32)>,
    /// The broker is fenced and leads nothing: it may exit.
    pub shutdown_ready: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionType {
    /// Move leadership to the first replica if it is active and in the ISR.
    Preferred,
    /// Give leaderless partitions a leader even from outside the ISR.
    Unclean,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectLeaders {
    pub election_type: ElectionType,
    /// `None`: every partition.
    pub partitions: Option<Vec<(String, i32)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionResult {
    pub topic: String,
    pub partition: i32,
    /// The new leader.
    pub result: Result<BrokerId, ControllerError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterConfigs {
    pub resource: ConfigResource,
    /// `(name, None)` removes the key.
    pub changes: Vec<(String, Option<String>)>,
}

/// What a [`ControllerLogic::tick`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    pub fenced: Vec<BrokerId>,
    pub partitions_changed: usize,
}

// ---------------------------------------------------------------------------
// Record building against a scratch image
// ---------------------------------------------------------------------------

/// One ISR change of [`ControllerLogic::alter_partitions`], checked
/// against (and pushed onto) `changes`: compare-and-set on the partition
/// epoch; the partition's state after it.
fn alter_isr(
    changes: &mut Changes,
    req: AlterPartition,
) -> Result<PartitionState, ControllerError> {
    let image = &changes.scratch;
    check_broker_epoch(image, req.broker_id, req.broker_epoch)?;
    let topic = image
        .topic_by_id(&req.topic_id)
        .ok_or(ControllerError::UnknownTopicId(req.topic_id))?;
    let state = topic
        .partition(req.partition)
        .ok_or_else(|| ControllerError::UnknownPartition {
            topic: topic.name.clone(),
            partition: req.partition,
        })?
        .clone();
    if state.leader != req.broker_id {
        return Err(ControllerError::NotLeader {
            broker_id: req.broker_id,
            leader: state.leader,
        });
    }
    if req.leader_epoch != state.leader_epoch {
        return Err(ControllerError::FencedLeaderEpoch {
            got: req.leader_epoch,
            current: state.leader_epoch,
        });
    }
    if req.partition_epoch != state.partition_epoch {
        return Err(ControllerError::InvalidUpdateVersion {
            got: req.partition_epoch,
            current: state.partition_epoch,
        });
    }
    let distinct: BTreeSet<_> = req.new_isr.iter().collect();
    if distinct.len() != req.new_isr.len() {
        return Err(ControllerError::InvalidRequest(
            "new ISR lists a broker twice".into(),
        ));
    }
    if !req.new_isr.contains(&req.broker_id) {
        return Err(ControllerError::InvalidRequest(
            "new ISR does not contain the leader".into(),
        ));
    }
    if let Some(b) = req.new_isr.iter().find(|b| !state.replicas.contains(b)) {
        return Err(ControllerError::InvalidRequest(format!(
            "broker {b} is not a replica of the partition"
        )));
    }
    if let Some(b) = req
        .new_isr
        .iter()
        .find(|b| !state.isr.contains(b) && !image.is_broker_active(**b))
    {
        return Err(ControllerError::IneligibleReplica(format!(
            "broker {b} is fenced or shutting down and cannot join the ISR"
        )));
    }
    if req.new_isr == state.isr {
        return Ok(state);
    }
    changes.push(MetadataRecord::PartitionChanged {
        topic_id: req.topic_id,
        partition: req.partition,
        isr: req.new_isr,
        leader: state.leader,
        leader_epoch: state.leader_epoch,
        partition_epoch: state.partition_epoch.saturating_add(1),
        assignment: None,
    })?;
    // The ISR change that brings the last target replica in sync
    // completes a reassignment in the same batch; the leader is told
    // the state after both.
    reassignment::complete_reassignment(changes, req.topic_id, req.partition)?;
    changes
        .scratch
        .topic_by_id(&req.topic_id)
        .and_then(|t| t.partition(req.partition))
        .cloned()
        .ok_or(ControllerError::UnknownTopicId(req.topic_id))
}

/// Records being built by one handler, applied as they are produced to a
/// scratch copy of the image so later decisions see earlier ones, and so a
/// record that would not apply is caught here rather than in the Raft log.
struct Changes {
    scratch: MetadataImage,
    records: Vec<MetadataRecord>,
}

impl Changes {
    fn new(image: &MetadataImage) -> Self {
        Self {
            scratch: image.clone(),
            records: Vec::new(),
        }
    }

    fn push(&mut self, record: MetadataRecord) -> Result<(), ControllerError> {
        self.scratch.apply(&record).map_err(|e| {
            tracing::error!(%record, error = %e, "controller produced a record that does not apply");
            ControllerError::Internal(format!("record {record} does not apply: {e}"))
        })?;
        self.records.push(record);
        Ok(())
    }

    /// Fences broker `broker_id` (registered with `broker_epoch`) and moves
    /// what it leads or is in the ISR of: its leaderships go to other
    /// in-sync replicas, it leaves the ISRs.
    fn fence(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: i64,
        controlled_shutdown: bool,
    ) -> Result<Vec<PartitionMove>, ControllerError> {
        self.push(MetadataRecord::BrokerFenced {
            broker_id,
            broker_epoch,
            controlled_shutdown,
        })?;
        self.reconcile(touches(broker_id))
    }

    /// Re-decides leader and ISR of every partition `select` picks, against
    /// the scratch image. Returns `(topic, partition, old, new)` per change.
    fn reconcile(
        &mut self,
        select: impl Fn(&PartitionState) -> bool,
    ) -> Result<Vec<PartitionMove>, ControllerError> {
        let mut planned = Vec::new();
        for topic in self.scratch.topics() {
            let unclean = unclean_allowed(&self.scratch, topic);
            for (index, state) in topic.partitions.iter().enumerate() {
                if !select(state) {
                    continue;
                }
                let (leader, isr) = next_leader_and_isr(&self.scratch, state, unclean);
                if let Some(record) = change_record(topic.topic_id, index, state, leader, isr) {
                    planned.push((
                        PartitionMove {
                            topic: topic.name.clone(),
                            partition: to_partition_id(index)?,
                            old_leader: state.leader,
                            new_leader: leader,
                        },
                        record,
                    ));
                }
            }
        }
        let mut moves = Vec::with_capacity(planned.len());
        for (m, record) in planned {
            self.push(record)?;
            moves.push(m);
        }
        Ok(moves)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PartitionMove {
    topic: String,
    partition: i32,
    old_leader: BrokerId,
    new_leader: BrokerId,
}

fn to_partition_id(index: usize) -> Result<i32, ControllerError> {
    i32::try_from(index).map_err(|_| ControllerError::Internal("partition id overflow".into()))
}

fn unclean_allowed(image: &MetadataImage, topic: &TopicImage) -> bool {
    image
        .topic_config(topic, UNCLEAN_LEADER_ELECTION_ENABLE)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Leader and ISR a partition should have given which brokers are active in
/// `image`. See the module docs for the rules.
pub fn next_leader_and_isr(
    image: &MetadataImage,
    state: &PartitionState,
    unclean_allowed: bool,
) -> (BrokerId, Vec<BrokerId>) {
    let active = |b: &BrokerId| image.is_broker_active(*b);
    let mut isr: Vec<BrokerId> = state.isr.iter().copied().filter(active).collect();
    if isr.is_empty() {
        let keep = if state.isr.contains(&state.leader) {
            Some(state.leader)
        } else {
            state.isr.first().copied()
        };
        isr.extend(keep);
    }
    let leader =
        if state.leader != NO_LEADER && active(&state.leader) && isr.contains(&state.leader) {
            state.leader
        } else {
            state
                .replicas
                .iter()
                .copied()
                .find(|b| isr.contains(b) && active(b))
                .unwrap_or(NO_LEADER)
        };
    // A replica a reassignment is adding may still be copying the log: it
    // leads only once it is in sync, never by unclean election.
    if leader == NO_LEADER && unclean_allowed {
        if let Some(b) = state
            .replicas
            .iter()
            .copied()
            .filter(|b| !state.adding_replicas.contains(b))
            .find(active)
        {
            return (b, vec![b]);
        }
    }
    (leader, isr)
}

/// The `PartitionChanged` record that moves `state` to `(leader, isr)`, or
/// `None` if nothing changes.
fn change_record(
    topic_id: Uuid,
    index: usize,
    state: &PartitionState,
    leader: BrokerId,
    isr: Vec<BrokerId>,
) -> Option<MetadataRecord> {
    if leader == state.leader && isr == state.isr {
        return None;
    }
    let partition = i32::try_from(index).ok()?;
    Some(partition_changed(
        topic_id, partition, state, leader, isr, None,
    ))
}

/// The next `PartitionChanged` of `state`: partition epoch + 1, leader
/// epoch + 1 when the leader changes, and the new replica set if any.
fn partition_changed(
    topic_id: Uuid,
    partition: i32,
    state: &PartitionState,
    leader: BrokerId,
    isr: Vec<BrokerId>,
    assignment: Option<ReplicaAssignment>,
) -> MetadataRecord {
    MetadataRecord::PartitionChanged {
        topic_id,
        partition,
        isr,
        leader,
        leader_epoch: if leader != state.leader {
            state.leader_epoch.saturating_add(1)
        } else {
            state.leader_epoch
        },
        partition_epoch: state.partition_epoch.saturating_add(1),
        assignment,
    }
}

/// Replica lists for partitions `first_partition .. first_partition + count`
/// over `brokers` (ascending ids). Leaders go round-robin from an offset
/// derived from `seed`; followers are spread by a shift that changes every
/// `brokers.len()` partitions, so no two replicas of a partition coincide and
/// both leaders and followers balance across brokers.
pub fn assign_replicas(
    brokers: &[BrokerId],
    first_partition: usize,
    count: usize,
    replication_factor: usize,
    seed: u64,
) -> Vec<Vec<BrokerId>> {
    let n = brokers.len();
    if n == 0 || replication_factor == 0 || replication_factor > n {
        return Vec::new();
    }
    let seed = usize::try_from(seed % (n as u64 * 1_000_003)).unwrap_or(0);
    let start = seed % n;
    let base_shift = seed / n;
    (first_partition..first_partition + count)
        .map(|p| {
            let first = (start + p) % n;
            let mut replicas = Vec::with_capacity(replication_factor);
            replicas.push(brokers[first]);
            if n > 1 {
                let shift = (base_shift + p / n) % (n - 1);
                for j in 1..replication_factor {
                    let offset = 1 + (shift + j - 1) % (n - 1);
                    replicas.push(brokers[(first + offset) % n]);
                }
            }
            replicas
        })
        .collect()
}

fn seed_of(topic_id: &Uuid) -> u64 {
    let (hi, lo) = topic_id.as_u64_pair();
    hi ^ lo
}

/// Kafka's topic name rules.
pub fn validate_topic_name(name: &str) -> Result<(), ControllerError> {
    let invalid = |why: String| Err(ControllerError::InvalidTopic(why));
    if name.is_empty() {
        return invalid("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return invalid(format!("topic name cannot be '{name}'"));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return invalid(format!(
            "topic name is longer than {MAX_TOPIC_NAME_LEN} characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return invalid(format!(
            "topic name {name:?} contains illegal character {c:?}"
        ));
    }
    Ok(())
}

fn validate_config(name: &str, value: Option<&str>) -> Result<(), ControllerError> {
    let Some(value) = value else { return Ok(()) };
    let bad = || {
        Err(ControllerError::InvalidConfig(format!(
            "invalid value {value:?} for {name}"
        )))
    };
    match name {
        UNCLEAN_LEADER_ELECTION_ENABLE
            if !(value.eq_ignore_ascii_case("true") || value.eq_ignore_ascii_case("false")) =>
        {
            bad()
        }
        MIN_INSYNC_REPLICAS if !value.parse::<i32>().is_ok_and(|v| v >= 1) => bad(),
        _ => Ok(()),
    }
}

/// Checks a manual assignment: non-empty lists of equal length, no duplicate
/// broker in a list, every broker registered.
fn validate_assignment(
    image: &MetadataImage,
    assignments: &[Vec<BrokerId>],
    expected_rf: Option<usize>,
) -> Result<usize, ControllerError> {
    let invalid = |why: String| Err(ControllerError::InvalidReplicaAssignment(why));
    let Some(first) = assignments.first() else {
        return invalid("no partitions in the assignment".into());
    };
    let rf = expected_rf.unwrap_or(first.len());
    for (p, replicas) in assignments.iter().enumerate() {
        if replicas.is_empty() {
            return invalid(format!("partition {p} has no replicas"));
        }
        if replicas.len() != rf {
            return invalid(format!(
                "partition {p} has {} replicas, expected {rf}",
                replicas.len()
            ));
        }
        let distinct: BTreeSet<_> = replicas.iter().collect();
        if distinct.len() != replicas.len() {
            return invalid(format!("partition {p} lists a broker twice"));
        }
        if let Some(b) = replicas.iter().find(|b| image.broker(**b).is_none()) {
            return invalid(format!("broker {b} is not registered"));
        }
    }
    Ok(rf)
}

/// Initial state of a new partition: the active replicas form the ISR, the
/// first of them leads.
fn initial_state(
    image: &MetadataImage,
    partition: usize,
    replicas: Vec<BrokerId>,
) -> Result<PartitionState, ControllerError> {
    let isr: Vec<BrokerId> = replicas
        .iter()
        .copied()
        .filter(|b| image.is_broker_active(*b))
        .collect();
    let Some(&leader) = isr.first() else {
        return Err(ControllerError::InvalidReplicaAssignment(format!(
            "no replica of partition {partition} is on an active broker"
        )));
    };
    Ok(PartitionState::new(replicas, isr, leader, 0, 0))
}

/// The record creating partition `index`, for CreateTopics and CreatePartitions.
fn partition_created(
    image: &MetadataImage,
    topic_id: Uuid,
    index: usize,
    replicas: Vec<BrokerId>,
) -> Result<MetadataRecord, ControllerError> {
    let state = initial_state(image, index, replicas)?;
    Ok(MetadataRecord::PartitionCreated {
        topic_id,
        partition: to_partition_id(index)?,
        replicas: state.replicas,
        isr: state.isr,
        leader: state.leader,
        leader_epoch: state.leader_epoch,
        partition_epoch: state.partition_epoch,
    })
}

fn check_broker_epoch(
    image: &MetadataImage,
    broker_id: BrokerId,
    broker_epoch: i64,
) -> Result<(), ControllerError> {
    let broker = image
        .broker(broker_id)
        .ok_or(ControllerError::BrokerIdNotRegistered(broker_id))?;
    if broker.broker_epoch != broker_epoch {
        return Err(ControllerError::StaleBrokerEpoch {
            broker_id,
            got: broker_epoch,
            current: broker.broker_epoch,
        });
    }
    Ok(())
}

fn touches(broker: BrokerId) -> impl Fn(&PartitionState) -> bool {
    move |p| p.leader == broker || p.isr.contains(&broker)
}

// ---------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------

/// The controller's sans-IO handlers plus the leader's soft state.
#[derive(Debug, Clone)]
pub struct ControllerLogic {
    config: LogicConfig,
    liveness: BrokerLiveness,
    /// When the last automatic leader rebalance check ran (leader-local,
    /// like liveness: a new active controller waits a full interval).
    last_leader_rebalance_ms: i64,
}

impl ControllerLogic {
    pub fn new(config: LogicConfig, now_ms: i64) -> Self {
        Self {
            config,
            liveness: BrokerLiveness::new(now_ms),
            last_leader_rebalance_ms: now_ms,
        }
    }

    pub fn config(&self) -> &LogicConfig {
        &self.config
    }

    pub fn liveness(&self) -> &BrokerLiveness {
        &self.liveness
    }

    /// A heartbeat of `broker_id` at `broker_epoch` *arrived* at `at_ms`,
    /// whenever its handler gets to run: a controller busy with a burst of
    /// writes must not fence a broker whose heartbeat waits in its queue.
    /// Only the registered incarnation counts, and never from before this
    /// controller's liveness tracking began (which gives a full session).
    pub fn note_contact(
        &mut self,
        image: &MetadataImage,
        broker_id: BrokerId,
        broker_epoch: i64,
        at_ms: i64,
    ) {
        if image
            .broker(broker_id)
            .is_some_and(|b| b.broker_epoch == broker_epoch)
        {
            let at = at_ms.max(self.liveness.since_ms);
            self.liveness.touch(broker_id, at);
        }
    }

    /// Call when this controller becomes the leader: every broker gets a full
    /// session timeout from `now_ms` before it can be fenced.
    pub fn reset_liveness(&mut self, now_ms: i64) {
        self.liveness.reset(now_ms);
        self.last_leader_rebalance_ms = now_ms;
    }

    /// Records the cluster id once, at first formation.
    pub fn assign_cluster_id(
        &mut self,
        image: &MetadataImage,
        cluster_id: &str,
    ) -> Outcome<String> {
        match image.cluster_id() {
            Some(existing) => Ok((Vec::new(), existing.to_owned())),
            None => Ok((
                vec![MetadataRecord::ClusterIdAssigned {
                    cluster_id: cluster_id.to_owned(),
                }],
                cluster_id.to_owned(),
            )),
        }
    }

    /// Registers a broker incarnation. See the lifecycle table.
    pub fn register_broker(
        &mut self,
        image: &MetadataImage,
        req: RegisterBroker,
        now_ms: i64,
    ) -> Outcome<RegisterBrokerReply> {
        if let (Some(expected), Some(got)) = (image.cluster_id(), req.cluster_id.as_deref()) {
            if !got.is_empty() && expected != got {
                return Err(ControllerError::InconsistentClusterId {
                    expected: expected.to_owned(),
                    got: got.to_owned(),
                });
            }
        }
        if req.broker_id < 0 {
            return Err(ControllerError::InvalidRequest(format!(
                "broker id {} is negative",
                req.broker_id
            )));
        }
        let id = req.broker_id;
        let mut was_active = false;
        if let Some(existing) = image.broker(id) {
            if existing.incarnation_id == req.incarnation_id {
                self.liveness.touch(id, now_ms);
                return Ok((
                    Vec::new(),
                    RegisterBrokerReply {
                        broker_epoch: existing.broker_epoch,
                    },
                ));
            }
            let session_alive =
                !self
                    .liveness
                    .is_expired(id, now_ms, self.config.broker_session_timeout_ms);
            if !existing.fenced && session_alive {
                return Err(ControllerError::DuplicateBrokerRegistration(id));
            }
            was_active = existing.is_active();
        }
        let broker_epoch = image.next_broker_epoch();
        let mut changes = Changes::new(image);
        changes.push(MetadataRecord::BrokerRegistered {
            broker_id: id,
            incarnation_id: req.incarnation_id,
            broker_epoch,
            endpoints: req.endpoints,
            rack: req.rack,
        })?;
        if was_active {
            changes.reconcile(touches(id))?;
        }
        self.liveness.touch(id, now_ms);
        Ok((changes.records, RegisterBrokerReply { broker_epoch }))
    }

    /// A broker's heartbeat: refreshes its session and fences or unfences it.
    pub fn heartbeat(
        &mut self,
        image: &MetadataImage,
        req: Heartbeat,
        now_ms: i64,
    ) -> Outcome<HeartbeatReply> {
        check_broker_epoch(image, req.broker_id, req.broker_epoch)?;
        let Some(broker) = image.broker(req.broker_id) else {
            return Err(ControllerError::BrokerIdNotRegistered(req.broker_id));
        };
        self.liveness.touch(req.broker_id, now_ms);
        let is_caught_up = req.metadata_offset >= broker.registered_offset;
        if broker.in_controlled_shutdown {
            return Ok((
                Vec::new(),
                HeartbeatReply {
                    is_fenced: true,
                    is_caught_up,
                    should_shut_down: true,
                },
            ));
        }
        let mut changes = Changes::new(image);
        let is_fenced = match (broker.fenced, req.want_fence) {
            (true, false) if is_caught_up => {
                changes.push(MetadataRecord::BrokerUnfenced {
                    broker_id: req.broker_id,
                    broker_epoch: req.broker_epoch,
                })?;
                let id = req.broker_id;
                changes.reconcile(move |p| !p.has_leader() && p.replicas.contains(&id))?;
                false
            }
            (false, true) => {
                changes.fence(req.broker_id, req.broker_epoch, false)?;
                true
            }
            (fenced, _) => fenced,
        };
        Ok((
            changes.records,
            HeartbeatReply {
                is_fenced,
                is_caught_up,
                should_shut_down: false,
            },
        ))
    }

    /// Fences every active broker whose session expired, moving its
    /// leaderships. Returns the fenced brokers.
    pub fn fence_expired_brokers(
        &mut self,
        image: &MetadataImage,
        now_ms: i64,
    ) -> Outcome<Vec<BrokerId>> {
        let mut changes = Changes::new(image);
        let fenced = self.fence_expired(&mut changes, now_ms)?;
        Ok((changes.records, fenced))
    }

    fn fence_expired(
        &self,
        changes: &mut Changes,
        now_ms: i64,
    ) -> Result<Vec<BrokerId>, ControllerError> {
        let expired: Vec<(BrokerId, i64)> = changes
            .scratch
            .brokers()
            .filter(|b| !b.fenced)
            .filter(|b| {
                self.liveness
                    .is_expired(b.broker_id, now_ms, self.config.broker_session_timeout_ms)
            })
            .map(|b| (b.broker_id, b.broker_epoch))
            .collect();
        for &(broker_id, broker_epoch) in &expired {
            tracing::info!(
                broker_id,
                last_heartbeat_ms = self.liveness.last_heartbeat_ms(broker_id),
                now_ms,
                "fencing broker: session expired"
            );
            changes.fence(broker_id, broker_epoch, false)?;
        }
        Ok(expired.into_iter().map(|(b, _)| b).collect())
    }

    /// Periodic duties of the active controller: fence expired brokers, then
    /// give leaderless partitions a leader where one is eligible now.
    pub fn tick(&mut self, image: &MetadataImage, now_ms: i64) -> Outcome<TickReport> {
        let mut changes = Changes::new(image);
        let fenced = self.fence_expired(&mut changes, now_ms)?;
        changes.reconcile(|p| !p.has_leader())?;
        reassignment::complete_ready_reassignments(&mut changes)?;
        if let Some(rebalance) = self.config.leader_rebalance {
            if now_ms.saturating_sub(self.last_leader_rebalance_ms) >= rebalance.interval_ms {
                self.last_leader_rebalance_ms = now_ms;
                self.rebalance_leaders(&mut changes, rebalance)?;
            }
        }
        let partitions_changed = changes
            .records
            .iter()
            .filter(|r| matches!(r, MetadataRecord::PartitionChanged { .. }))
            .count();
        Ok((
            changes.records,
            TickReport {
                fenced,
                partitions_changed,
            },
        ))
    }

    /// Creates a topic with `topic_id` (chosen by the caller). A topic of
    /// that name and id already exists only if this very request was
    /// committed before and is being resent (its first answer was lost with
    /// a controller that failed): it is answered as it was the first time,
    /// with nothing written, rather than TOPIC_ALREADY_EXISTS.
    pub fn create_topic(
        &mut self,
        image: &MetadataImage,
        req: CreateTopic,
        topic_id: Uuid,
        _now_ms: i64,
    ) -> Outcome<CreateTopicReply> {
        validate_topic_name(&req.name)?;
        if let Some(existing) = image.topic(&req.name) {
            if existing.topic_id != topic_id {
                return Err(ControllerError::TopicAlreadyExists(req.name));
            }
            return Ok((
                Vec::new(),
                CreateTopicReply {
                    topic_id,
                    num_partitions: to_partition_id(existing.partitions.len())?,
                    replication_factor: i32::try_from(existing.replication_factor())
                        .unwrap_or(i32::MAX),
                },
            ));
        }
        if image.topic_by_id(&topic_id).is_some() {
            return Err(ControllerError::Internal(format!(
                "topic id {topic_id} is already in use"
            )));
        }
        for (name, value) in &req.configs {
            validate_config(name, Some(value))?;
        }
        let assignments = match req.assignments {
            Some(assignments) => {
                validate_assignment(image, &assignments, None)?;
                assignments
            }
            None => {
                let num_partitions = req
                    .num_partitions
                    .filter(|n| *n != -1)
                    .unwrap_or(self.config.default_num_partitions);
                let count = usize::try_from(num_partitions)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        ControllerError::InvalidPartitions(format!(
                            "number of partitions must be positive, got {num_partitions}"
                        ))
                    })?;
                let active = image.active_brokers();
                let rf = self.replication_factor(req.replication_factor, active.len())?;
                assign_replicas(&active, 0, count, rf, seed_of(&topic_id))
            }
        };
        let replication_factor = assignments
            .first()
            .map_or(0, |r| i32::try_from(r.len()).unwrap_or(i32::MAX));
        let mut changes = Changes::new(image);
        changes.push(MetadataRecord::TopicCreated {
            name: req.name.clone(),
            topic_id,
            configs: req.configs,
        })?;
        let num_partitions = assignments.len();
        for (index, replicas) in assignments.into_iter().enumerate() {
            changes.push(partition_created(image, topic_id, index, replicas)?)?;
        }
        Ok((
            changes.records,
            CreateTopicReply {
                topic_id,
                num_partitions: to_partition_id(num_partitions)?,
                replication_factor,
            },
        ))
    }

    fn replication_factor(
        &self,
        requested: Option<i32>,
        active: usize,
    ) -> Result<usize, ControllerError> {
        let rf = match requested.filter(|rf| *rf != -1) {
            Some(rf) => rf,
            None => match self.config.default_replication_factor {
                Some(rf) => rf,
                None => i32::try_from(active.min(3)).unwrap_or(3),
            },
        };
        let rf = usize::try_from(rf)
            .ok()
            .filter(|rf| *rf > 0)
            .ok_or_else(|| {
                ControllerError::InvalidReplicationFactor(if active == 0 {
                    "no active brokers".to_owned()
                } else {
                    format!("replication factor must be positive, got {rf}")
                })
            })?;
        if rf > active {
            return Err(ControllerError::InvalidReplicationFactor(format!(
                "replication factor {rf} is larger than the {active} active brokers"
            )));
        }
        Ok(rf)
    }

    pub fn delete_topic(
        &mut self,
        image: &MetadataImage,
        topic: TopicRef,
        _now_ms: i64,
    ) -> Outcome<DeleteTopicReply> {
        let found = match &topic {
            TopicRef::Name(name) => image
                .topic(name)
                .ok_or_else(|| ControllerError::UnknownTopic(name.clone()))?,
            TopicRef::Id(id) => image
                .topic_by_id(id)
                .ok_or(ControllerError::UnknownTopicId(*id))?,
        };
        let reply = DeleteTopicReply {
            name: found.name.clone(),
            topic_id: found.topic_id,
        };
        Ok((
            vec![MetadataRecord::TopicDeleted {
                topic_id: reply.topic_id,
                name: reply.name.clone(),
            }],
            reply,
        ))
    }

    pub fn create_partitions(
        &mut self,
        image: &MetadataImage,
        req: CreatePartitions,
        _now_ms: i64,
    ) -> Outcome<CreatePartitionsReply> {
        let topic = image
            .topic(&req.topic)
            .ok_or_else(|| ControllerError::UnknownTopic(req.topic.clone()))?;
        let current = topic.partitions.len();
        let target = usize::try_from(req.new_total_count).unwrap_or(0);
        if target <= current {
            return Err(ControllerError::InvalidPartitions(format!(
                "topic {} has {current} partitions; the new count must be larger, got {}",
                req.topic, req.new_total_count
            )));
        }
        let rf = topic.partitions.first().map_or(1, |p| p.replicas.len());
        let assignments = match req.assignments {
            Some(assignments) => {
                if assignments.len() != target - current {
                    return Err(ControllerError::InvalidReplicaAssignment(format!(
                        "{} assignments for {} new partitions",
                        assignments.len(),
                        target - current
                    )));
                }
                validate_assignment(image, &assignments, Some(rf))?;
                assignments
            }
            None => {
                let active = image.active_brokers();
                if rf > active.len() {
                    return Err(ControllerError::InvalidReplicationFactor(format!(
                        "replication factor {rf} is larger than the {} active brokers",
                        active.len()
                    )));
                }
                assign_replicas(
                    &active,
                    current,
                    target - current,
                    rf,
                    seed_of(&topic.topic_id),
                )
            }
        };
        let topic_id = topic.topic_id;
        let mut changes = Changes::new(image);
        for (offset, replicas) in assignments.into_iter().enumerate() {
            let index = current + offset;
            changes.push(partition_created(image, topic_id, index, replicas)?)?;
        }
        Ok((
            changes.records,
            CreatePartitionsReply {
                topic_id,
                num_partitions: to_partition_id(target)?,
            },
        ))
    }

    /// ISR change proposed by a partition leader; compare-and-set on the
    /// partition epoch. Answers the partition's state after the change.
    pub fn alter_partition(
        &mut self,
        image: &MetadataImage,
        req: AlterPartition,
        now_ms: i64,
    ) -> Outcome<PartitionState> {
        let (records, mut results) = self.alter_partitions(image, vec![req], now_ms)?;
        let state = results
            .pop()
            .ok_or_else(|| ControllerError::Internal("one change, no answer".into()))??;
        Ok((records, state))
    }

    /// ISR changes proposed by partition leaders, committed as one batch
    /// of records: each is checked against the image with the earlier ones
    /// applied (the same partition twice: the second is a stale epoch), and
    /// each is answered on its own, a refused one leaving the others
    /// standing, as Kafka's AlterPartition answers per partition.
    pub fn alter_partitions(
        &mut self,
        image: &MetadataImage,
        reqs: Vec<AlterPartition>,
        _now_ms: i64,
    ) -> Outcome<Vec<Result<PartitionState, ControllerError>>> {
        let mut changes = Changes::new(image);
        let mut results = Vec::with_capacity(reqs.len());
        for req in reqs {
            let pushed = changes.records.len();
            let result = alter_isr(&mut changes, req);
            // A change refused after some of its records were pushed
            // (a record that does not apply: a bug) leaves the scratch
            // image half changed; nothing of the batch is committed then.
            if let Err(e) = &result {
                if changes.records.len() != pushed {
                    return Err(e.clone());
                }
            }
            results.push(result);
        }
        Ok((changes.records, results))
    }

    /// Hands out the next block of producer ids. Blocks never overlap and are
    /// never handed out twice: the image's next start only moves forward.
    pub fn allocate_producer_ids(
        &mut self,
        image: &MetadataImage,
        req: AllocateProducerIds,
        _now_ms: i64,
    ) -> Outcome<ProducerIdBlock> {
        check_broker_epoch(image, req.broker_id, req.broker_epoch)?;
        let size = self.config.producer_id_block_size;
        let first = image.next_producer_id();
        if size <= 0 || first.checked_add(i64::from(size)).is_none() {
            return Err(ControllerError::Internal(
                "producer id space exhausted".into(),
            ));
        }
        Ok((
            vec![MetadataRecord::ProducerIdsAllocated {
                broker_id: req.broker_id,
                broker_epoch: req.broker_epoch,
                first_producer_id: first,
                size,
            }],
            ProducerIdBlock { first, size },
        ))
    }

    /// UnregisterBroker (Kafka's KIP-631 API, for a broker taken away for
    /// good): removes the registration, fencing the broker first if it is
    /// active (its leaderships move, it leaves the ISRs, in the same batch).
    /// Partitions keep naming it as a replica until they are moved
    /// (`samsa cluster decommission`). A broker that is still running
    /// registers again, as Kafka's does.
    pub fn unregister_broker(
        &mut self,
        image: &MetadataImage,
        broker_id: BrokerId,
        _now_ms: i64,
    ) -> Outcome<()> {
        let Some(broker) = image.broker(broker_id) else {
            return Err(ControllerError::BrokerIdNotRegistered(broker_id));
        };
        let broker_epoch = broker.broker_epoch;
        let mut changes = Changes::new(image);
        if !broker.fenced {
            changes.fence(broker_id, broker_epoch, false)?;
        }
        changes.push(MetadataRecord::BrokerUnregistered {
            broker_id,
            broker_epoch,
        })?;
        Ok((changes.records, ()))
    }

    /// A broker about to stop: move its leaderships to other in-sync
    /// replicas, take it out of every ISR it is not the last member of, and
    /// fence it — all in one batch, so when this answers the broker leads
    /// nothing that anyone else could lead.
    pub fn controlled_shutdown(
        &mut self,
        image: &MetadataImage,
        req: ControlledShutdown,
        _now_ms: i64,
    ) -> Outcome<ControlledShutdownReply> {
        check_broker_epoch(image, req.broker_id, req.broker_epoch)?;
        let id = req.broker_id;
        let mut changes = Changes::new(image);
        let already = image
            .broker(id)
            .is_some_and(|b| b.fenced && b.in_controlled_shutdown);
        let moves = if already {
            Vec::new()
        } else {
            changes.fence(id, req.broker_epoch, true)?
        };
        let leaderships_moved = moves
            .iter()
            .filter(|m| m.old_leader == id && m.new_leader != NO_LEADER)
            .count();
        let mut partitions_offline = Vec::new();
        for topic in changes.scratch.topics() {
            for (index, state) in topic.partitions.iter().enumerate() {
                if !state.has_leader() && state.isr == [id] {
                    partitions_offline.push((topic.name.clone(), to_partition_id(index)?));
                }
            }
        }
        Ok((
            changes.records,
            ControlledShutdownReply {
                leaderships_moved: u32::try_from(leaderships_moved).unwrap_or(u32::MAX),
                partitions_offline,
                shutdown_ready: true,
            },
        ))
    }

    /// Admin-triggered elections (Kafka's `ElectLeaders`).
    pub fn elect_leaders(
        &mut self,
        image: &MetadataImage,
        req: ElectLeaders,
        _now_ms: i64,
    ) -> Outcome<Vec<ElectionResult>> {
        let explicit = req.partitions.is_some();
        let targets: Vec<(String, i32)> = match req.partitions {
            Some(list) => list,
            None => image
                .topics()
                .flat_map(|t| {
                    (0..t.partitions.len())
                        .filter_map(move |i| Some((t.name.clone(), i32::try_from(i).ok()?)))
                })
                .collect(),
        };
        let mut changes = Changes::new(image);
        let mut results = Vec::new();
        for (topic_name, partition) in targets {
            let outcome = self.elect_one(&mut changes, &topic_name, partition, req.election_type);
            if !explicit && outcome == Err(ControllerError::ElectionNotNeeded) {
                continue;
            }
            results.push(ElectionResult {
                topic: topic_name,
                partition,
                result: outcome,
            });
        }
        Ok((changes.records, results))
    }

    /// `auto.leader.rebalance.enable`: preferred elections for the
    /// partitions of every broker whose share of preferred partitions it
    /// does not lead is above the threshold (Kafka's
    /// `checkAndTriggerAutoLeaderRebalance`).
    fn rebalance_leaders(
        &self,
        changes: &mut Changes,
        rebalance: LeaderRebalance,
    ) -> Result<(), ControllerError> {
        let mut preferred: BTreeMap<BrokerId, (u32, Vec<(String, i32)>)> = BTreeMap::new();
        for topic in changes.scratch.topics() {
            for (index, state) in topic.partitions.iter().enumerate() {
                let Some(&first) = state.replicas.first() else {
                    continue;
                };
                let entry = preferred.entry(first).or_default();
                entry.0 += 1;
                if state.leader != first && !state.is_reassigning() {
                    entry.1.push((topic.name.clone(), to_partition_id(index)?));
                }
            }
        }
        for (broker, (total, misplaced)) in preferred {
            let imbalance = misplaced.len() as u64 * 100;
            if misplaced.is_empty()
                || imbalance <= u64::from(rebalance.imbalance_percent) * u64::from(total)
                || !changes.scratch.is_broker_active(broker)
            {
                continue;
            }
            let mut moved = 0;
            for (topic, partition) in misplaced {
                if self
                    .elect_one(changes, &topic, partition, ElectionType::Preferred)
                    .is_ok()
                {
                    moved += 1;
                }
            }
            tracing::info!(
                broker,
                preferred_partitions = total,
                moved,
                "leader imbalance above the threshold: preferred leaders elected"
            );
        }
        Ok(())
    }

    fn elect_one(
        &self,
        changes: &mut Changes,
        topic_name: &str,
        partition: i32,
        election_type: ElectionType,
    ) -> Result<BrokerId, ControllerError> {
        let image = &changes.scratch;
        let topic = image
            .topic(topic_name)
            .ok_or_else(|| ControllerError::UnknownTopic(topic_name.to_owned()))?;
        let state =
            topic
                .partition(partition)
                .ok_or_else(|| ControllerError::UnknownPartition {
                    topic: topic_name.to_owned(),
                    partition,
                })?;
        let index = usize::try_from(partition)
            .map_err(|_| ControllerError::InvalidRequest("negative partition".into()))?;
        let (leader, isr) = match election_type {
            ElectionType::Preferred => {
                let Some(&preferred) = state.replicas.first() else {
                    return Err(ControllerError::PreferredLeaderNotAvailable);
                };
                if state.leader == preferred {
                    return Err(ControllerError::ElectionNotNeeded);
                }
                if !image.is_broker_active(preferred) || !state.isr.contains(&preferred) {
                    return Err(ControllerError::PreferredLeaderNotAvailable);
                }
                (preferred, state.isr.clone())
            }
            ElectionType::Unclean => {
                if state.has_leader() {
                    return Err(ControllerError::ElectionNotNeeded);
                }
                let (leader, isr) = next_leader_and_isr(image, state, true);
                if leader == NO_LEADER {
                    return Err(ControllerError::EligibleLeadersNotAvailable);
                }
                (leader, isr)
            }
        };
        let topic_id = topic.topic_id;
        if let Some(record) = change_record(topic_id, index, state, leader, isr) {
            changes.push(record)?;
        }
        Ok(leader)
    }

    /// Applies SCRAM credential and ACL changes (checked by the broker that
    /// took the Kafka request); refuses any other kind of record.
    pub fn alter_security(
        &mut self,
        image: &MetadataImage,
        records: Vec<MetadataRecord>,
        _now_ms: i64,
    ) -> Outcome<()> {
        let mut changes = Changes::new(image);
        for record in records {
            match record {
                MetadataRecord::ScramCredentialChanged { .. }
                | MetadataRecord::AclCreated { .. }
                | MetadataRecord::AclDeleted { .. } => changes.push(record)?,
                other => {
                    return Err(ControllerError::InvalidRequest(format!(
                        "{other} is not a security change"
                    )))
                }
            }
        }
        Ok((changes.records, ()))
    }

    /// Sets or removes config keys on the cluster or one topic.
    pub fn alter_configs(
        &mut self,
        image: &MetadataImage,
        req: AlterConfigs,
        _now_ms: i64,
    ) -> Outcome<()> {
        if let ConfigResource::Topic { name } = &req.resource {
            if image.topic(name).is_none() {
                return Err(ControllerError::UnknownTopic(name.clone()));
            }
        }
        let mut changes = Changes::new(image);
        for (name, value) in req.changes {
            validate_config(&name, value.as_deref())?;
            changes.push(MetadataRecord::ConfigChanged {
                resource: req.resource.clone(),
                name,
                value,
            })?;
        }
        Ok((changes.records, ()))
    }
}
