//! The IO side that only the group coordinator needs, on top of the shared
//! [`Runtime`]: [`GroupRuntime`] is `Runtime<GroupCoordinator>` with the
//! requests parked until the coordinator answers them.
//!
//! What this module owns:
//!
//! - **`__consumer_offsets`**: created on first use (FindCoordinator with
//!   key type GROUP) with `offsets_topic_num_partitions` partitions and
//!   replication `offsets_topic_replication_factor` (default min(3, live
//!   brokers)), through the runtime's [`StateTopic`] like
//!   `__transaction_state`.
//! - **Parked requests** ([`ParkedRequests`]): every request gets a
//!   [`Token`] and a oneshot channel; the coordinator's steps say which
//!   token gets which [`Reply`] — at once, or once a rebalance or a write
//!   completes, possibly from another request's call or from `tick`.
//! - **Writes** go through the runtime: appended as leader at the
//!   coordinator epoch, answered once acks=all (Kafka's
//!   `offsets.commit.required.acks=-1`); offsets of a transaction as a
//!   transactional batch of the producer, after KIP-890 verification with
//!   its transaction coordinator.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;
use tracing::warn;

use super::{GroupConfig, GroupCoordinator, GroupStep, Reply, Token};
use crate::coordinator::placement::CONSUMER_OFFSETS_TOPIC;
use crate::coordinator::runtime::{Hosted, Runtime};
use crate::coordinator::state_topic::StateTopic;
use crate::{now_ms, Broker, BrokerConfig};

/// The group coordinator of this broker and everything that drives it.
pub type GroupRuntime = Runtime<GroupCoordinator>;

/// Requests waiting for the coordinator's reply, by token.
#[derive(Default)]
pub struct ParkedRequests {
    waiting: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
}

impl ParkedRequests {
    fn lock(&self) -> MutexGuard<'_, HashMap<Token, oneshot::Sender<Reply>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(crate) fn group_config(config: &BrokerConfig) -> GroupConfig {
    GroupConfig {
        offsets_partitions: config.offsets_topic_num_partitions,
        initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
        min_session_timeout_ms: config.group_min_session_timeout_ms,
        max_session_timeout_ms: config.group_max_session_timeout_ms,
        offsets_retention_ms: config.offsets_retention_minutes.saturating_mul(60_000),
        offsets_retention_check_interval_ms: config.offsets_retention_check_interval_ms.max(1),
        ..GroupConfig::default()
    }
}

impl Hosted for GroupCoordinator {
    type Service = ParkedRequests;
    const KIND: &'static str = "group";

    fn runtime(broker: &Broker) -> &Runtime<Self> {
        &broker.groups
    }

    /// Delivers a step's replies to the requests parked under their tokens.
    fn carry_out(runtime: &Runtime<Self>, step: GroupStep) {
        let mut waiting = runtime.service.lock();
        for (token, reply) in step.deliveries {
            if let Some(tx) = waiting.remove(&token) {
                // The requester may have gone (connection closed).
                let _ = tx.send(reply);
            }
        }
    }
}

impl Runtime<GroupCoordinator> {
    pub fn for_config(
        config: &BrokerConfig,
        meters: samsa_metrics::coordinators::GroupMeters,
    ) -> Self {
        // Member ids must not repeat across restarts of this broker or
        // across brokers: seed them with the node id and the start time.
        let seed = (u64::from(config.node_id as u32) << 48) ^ (now_ms() as u64);
        Runtime::new(
            GroupCoordinator::new(group_config(config), seed).with_meters(meters),
            StateTopic::new(
                CONSUMER_OFFSETS_TOPIC,
                config.offsets_topic_num_partitions,
                config.offsets_topic_replication_factor,
            ),
            ParkedRequests::default(),
        )
    }

    /// Runs `f` on the coordinator locked for a request, with a fresh
    /// token, and waits for the reply delivered to that token (at once, or
    /// once a rebalance or a write completes).
    pub async fn call(
        &self,
        f: impl FnOnce(&mut GroupCoordinator, Token, i64) -> GroupStep,
    ) -> Option<Reply> {
        let token = Token(self.service.next_token.fetch_add(1, Ordering::Relaxed) + 1);
        let (tx, rx) = oneshot::channel();
        self.service.lock().insert(token, tx);
        let step = {
            let mut coordinator = self.serving();
            let now = now_ms();
            let mut step = coordinator.timers_due(now);
            step.merge(f(&mut coordinator, token, now));
            step
        };
        self.process(step);
        // A rebalance, or the coordinator's state write and its replication.
        let reply = samsa_metrics::requests::waiting_remotely(rx).await.ok();
        if reply.is_none() {
            warn!(?token, "a group request was dropped without a reply");
        }
        reply
    }

    /// Runs `f` on the coordinator locked for a request, then carries out
    /// the step it returns.
    pub fn with<T>(&self, f: impl FnOnce(&mut GroupCoordinator, i64) -> (T, GroupStep)) -> T {
        let (value, step) = {
            let mut coordinator = self.serving();
            let now = now_ms();
            let mut step = coordinator.timers_due(now);
            let (value, more) = f(&mut coordinator, now);
            step.merge(more);
            (value, step)
        };
        self.process(step);
        value
    }

    /// A marker of `producer_id` is durable on offsets partition `p`.
    pub(crate) fn marker_written(&self, p: i32, producer_id: i64, commit: bool) {
        self.lock().complete_transaction(p, producer_id, commit);
    }
}
