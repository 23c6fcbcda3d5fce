//! ISR changes proposed by partition leaders through the controller's
//! `AlterPartition` (compare-and-set on the partition epoch).
//!
//! - shrink: every `replica_lag_time_max_ms / 4` the leader looks for ISR
//!   members that have not caught up with its log end for longer than
//!   `replica_lag_time_max_ms` and proposes the ISR without them;
//! - expand: the fetch service proposes adding a follower that reached the HW.
//!
//! At most one proposal per partition is in flight. A shrink takes effect
//! for the HW only once committed; an expansion counts at once (see
//! [`ReplicaState::maximal_isr`](super::state::ReplicaState::maximal_isr)).
//! A refused or failed proposal is dropped; the next tick or fetch retries.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::client::ControllerClient;
use samsa_controller::logic::AlterPartition;
use tokio::sync::{mpsc, watch};
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

/// Runs until `stop`: shrinks lagging ISRs and forwards proposals.
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
    loop {
        tokio::select! {
            proposal = proposals.recv() => {
                let Some(proposal) = proposal else { return };
                tokio::spawn(propose(client.clone(), broker.config.node_id, Arc::clone(&broker_epoch), proposal).in_current_span());
            }
            _ = tick.tick() => {
                let now = now_ms();
                for partition in broker.replicas.all() {
                    let lag = i64::try_from(lag_max).unwrap_or(i64::MAX);
                    if let Some(shrink) = partition.lagging_isr(lag, now) {
                        info!(partition = %partition.name(), new_isr = ?shrink.new_isr, "followers lag more than replica_lag_time_max_ms; shrinking the ISR");
                        tokio::spawn(propose(
                            client.clone(),
                            broker.config.node_id,
                            Arc::clone(&broker_epoch),
                            IsrProposal { partition, new_isr: shrink.new_isr, leader_epoch: Some(shrink.context.leader_epoch) },
                        ).in_current_span());
                    }
                }
            }
            _ = stop.changed() => return,
        }
    }
}

async fn propose(
    client: ControllerClient,
    me: i32,
    broker_epoch: Arc<AtomicI64>,
    proposal: IsrProposal,
) {
    let partition = proposal.partition;
    let context = partition.alter_context();
    if proposal
        .leader_epoch
        .is_some_and(|e| e != context.leader_epoch)
    {
        partition.isr_change_failed();
        return;
    }
    let req = AlterPartition {
        broker_id: me,
        broker_epoch: broker_epoch.load(Ordering::Acquire),
        topic_id: context.topic_id,
        partition: partition.index,
        leader_epoch: context.leader_epoch,
        partition_epoch: context.partition_epoch,
        new_isr: proposal.new_isr.clone(),
    };
    match client.alter_partition(&req).await {
        Ok(state) => {
            info!(partition = %partition.name(), isr = ?state.isr, partition_epoch = state.partition_epoch, "ISR changed");
            partition.isr_committed(state.leader_epoch, state.partition_epoch, state.isr);
        }
        Err(e) => {
            warn!(partition = %partition.name(), new_isr = ?proposal.new_isr, error = %e, "ISR change refused");
            partition.isr_change_failed();
        }
    }
}
