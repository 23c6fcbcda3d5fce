//! ISR changes proposed by partition leaders through the controller's
//! `AlterPartitions` (each change a compare-and-set on the partition epoch).
//!
//! - shrink: every `replica_lag_time_max_ms / 4` the leader looks for ISR
//!   members that have not caught up with its log end for longer than
//!   `replica_lag_time_max_ms` and proposes the ISR without them;
//! - expand: the fetch service proposes adding a follower that reached the HW.
//!
//! At most one proposal per partition is in flight, and at most one
//! `AlterPartitions` request per broker, carrying the proposals waiting (up
//! to [`MAX_CHANGES_PER_REQUEST`]). A shrink takes effect for the HW only
//! once committed; an expansion counts at once (see
//! [`ReplicaState::maximal_isr`](super::state::ReplicaState::maximal_isr)).
//! A refused or failed proposal is dropped; the next tick or fetch retries.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::client::ControllerClient;
use samsa_controller::logic::AlterPartition;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{info, warn, Instrument};

use crate::replica::Partition;
use crate::{now_ms, Broker};

/// An ISR the leader of `partition` wants the controller to commit.
pub struct IsrProposal {
    pub partition: Arc<Partition>,
    pub new_isr: Vec<i32>,
    /// The leader epoch the proposal was made under; `None`: the current one.
    pub leader_epoch: Option<i32>,
}

/// Most ISR changes in one `AlterPartitions` request: one metadata batch
/// of bounded size; the rest wait for the next request.
const MAX_CHANGES_PER_REQUEST: usize = 2_000;

/// Runs until `stop`: shrinks lagging ISRs and forwards proposals, all the
/// proposals waiting in one request with at most one request in flight (as
/// Kafka's AlterPartition manager does). One metadata write per request
/// rather than per partition: a broker rejoining the ISRs of thousands of
/// partitions after a restart waits for a few controller writes, not for
/// one per partition.
pub async fn isr_loop(
    broker: Arc<Broker>,
    client: ControllerClient,
    broker_epoch: Arc<AtomicI64>,
    mut proposals: mpsc::UnboundedReceiver<IsrProposal>,
    mut stop: watch::Receiver<bool>,
) {
    let lag_max = broker.config.replica_lag_time_max_ms;
    let every = Duration::from_millis((lag_max / 4).clamp(50, 5_000));
    let mut tick = tokio::time::interval(every);
    let mut waiting: Vec<IsrProposal> = Vec::new();
    // Empty or one request.
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            proposal = proposals.recv() => {
                let Some(proposal) = proposal else { return };
                waiting.push(proposal);
            }
            _ = tick.tick() => {
                let now = now_ms();
                for partition in broker.replicas.all() {
                    let lag = i64::try_from(lag_max).unwrap_or(i64::MAX);
                    if let Some(shrink) = partition.lagging_isr(lag, now) {
                        info!(partition = %partition.name(), new_isr = ?shrink.new_isr, "followers lag more than replica_lag_time_max_ms; shrinking the ISR");
                        waiting.push(IsrProposal {
                            partition,
                            new_isr: shrink.new_isr,
                            leader_epoch: Some(shrink.context.leader_epoch),
                        });
                    }
                }
            }
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = stop.changed() => return,
        }
        if in_flight.is_empty() && !waiting.is_empty() {
            let rest = waiting.split_off(waiting.len().min(MAX_CHANGES_PER_REQUEST));
            let batch = std::mem::replace(&mut waiting, rest);
            in_flight.spawn(
                propose(
                    client.clone(),
                    broker.config.node_id,
                    Arc::clone(&broker_epoch),
                    batch,
                )
                .in_current_span(),
            );
        }
    }
}

/// Sends `proposals` as one request and tells each partition its answer.
async fn propose(
    client: ControllerClient,
    me: i32,
    broker_epoch: Arc<AtomicI64>,
    proposals: Vec<IsrProposal>,
) {
    let broker_epoch = broker_epoch.load(Ordering::Acquire);
    let mut sent = Vec::with_capacity(proposals.len());
    let mut changes = Vec::with_capacity(proposals.len());
    for proposal in proposals {
        let context = proposal.partition.alter_context();
        if proposal
            .leader_epoch
            .is_some_and(|e| e != context.leader_epoch)
        {
            proposal.partition.isr_change_failed();
            continue;
        }
        changes.push(AlterPartition {
            broker_id: me,
            broker_epoch,
            topic_id: context.topic_id,
            partition: proposal.partition.index,
            leader_epoch: context.leader_epoch,
            partition_epoch: context.partition_epoch,
            new_isr: proposal.new_isr.clone(),
        });
        sent.push(proposal);
    }
    if changes.is_empty() {
        return;
    }
    match client.alter_partitions(&changes).await {
        Ok(answers) => {
            for (proposal, answer) in sent.into_iter().zip(answers) {
                let partition = proposal.partition;
                match answer {
                    Ok(state) => {
                        info!(partition = %partition.name(), isr = ?state.isr, partition_epoch = state.partition_epoch, "ISR changed");
                        partition.isr_committed(
                            state.leader_epoch,
                            state.partition_epoch,
                            state.isr,
                        );
                    }
                    Err(e) => {
                        warn!(partition = %partition.name(), new_isr = ?proposal.new_isr, error = %e, "ISR change refused");
                        partition.isr_change_failed();
                    }
                }
            }
        }
        Err(e) => {
            warn!(changes = sent.len(), error = %e, "ISR changes not sent to the controller");
            for proposal in sent {
                proposal.partition.isr_change_failed();
            }
        }
    }
}
