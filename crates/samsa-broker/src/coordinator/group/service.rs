//! The IO shell around the sans-IO group coordinator ([`crate::group`]).
//!
//! What this module owns:
//!
//! - **`__consumer_offsets`**: created on first use (FindCoordinator with
//!   key type GROUP) with `offsets_topic_num_partitions` partitions and
//!   replication `offsets_topic_replication_factor` (default min(3, live
//!   brokers)), through [`crate::coordinator::runtime::InternalTopic`] like
//!   `__transaction_state`.
//! - **Ownership** (`reconcile`): the partitions this broker leads are
//!   loaded by replaying them ([`crate::coordinator::runtime::read_log`],
//!   [`crate::coordinator::group::records::replay`]); those it no longer leads are
//!   unloaded. The applier pokes the loop after every metadata image, and
//!   it also looks twice a second. Client requests lock the coordinator
//!   through `serving`, which first tells it which partitions the image
//!   says this broker leads (FindCoordinator answers from the image).
//! - **Waiting requests**: every request gets a [`Token`] and a oneshot
//!   channel; the coordinator's [`Step`]s say which token gets which
//!   [`Reply`].
//! - **Writes**: appended as leader at the coordinator epoch, answered once
//!   acks=all (Kafka's `offsets.commit.required.acks=-1`); offsets of a
//!   transaction as a transactional batch of the producer, after KIP-890
//!   verification with its transaction coordinator.
//! - **Timers**: the loop sleeps until the coordinator's next deadline
//!   (and wakes when a call may have moved it), then calls `tick`.
//!
//! Invariant: the coordinator's mutex is never held across an await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tokio::sync::{oneshot, watch, Notify};
use tracing::{debug, info, warn, Instrument};

use crate::coordinator::runtime::{
    ownership_changes, read_log, wait_durable, writable_partition, InternalTopic, Ownership,
    RECONCILE_EVERY,
};
use crate::error::partition_error_code;
use crate::coordinator::group::records::replay;
use crate::coordinator::group::{GroupConfig, GroupCoordinator, GroupWrite, Reply, Step, Token};
use crate::metadata::BrokerInfo;
use crate::coordinator::placement::CONSUMER_OFFSETS_TOPIC;
use crate::coordinator::txn::TopicPartition;
use crate::{now_ms, Broker, BrokerConfig};

/// The group coordinator of this broker and everything that drives it.
pub struct GroupShell {
    coordinator: Mutex<GroupCoordinator>,
    broker: OnceLock<Weak<Broker>>,
    topic: InternalTopic,
    waiting: Mutex<HashMap<Token, oneshot::Sender<Reply>>>,
    next_token: AtomicU64,
    /// Ownership may have changed (metadata image applied).
    wake: Notify,
    /// The next deadline may have moved.
    timer: Notify,
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

impl GroupShell {
    pub fn new(config: &BrokerConfig) -> Self {
        // Member ids must not repeat across restarts of this broker or
        // across brokers: seed them with the node id and the start time.
        let seed = (u64::from(config.node_id as u32) << 48) ^ (now_ms() as u64);
        GroupShell {
            coordinator: Mutex::new(GroupCoordinator::new(group_config(config), seed)),
            broker: OnceLock::new(),
            topic: InternalTopic::new(
                CONSUMER_OFFSETS_TOPIC,
                config.offsets_topic_num_partitions,
                config.offsets_topic_replication_factor,
            ),
            waiting: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            wake: Notify::new(),
            timer: Notify::new(),
        }
    }

    /// Gives the shell its broker and starts the ownership and timer loop
    /// until `stop`.
    pub fn start(broker: &Arc<Broker>, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let _ = broker.groups.broker.set(Arc::downgrade(broker));
        tokio::spawn(run_loop(Arc::clone(broker), stop).in_current_span())
    }

    /// The coordinator, locked. Never hold the guard across an await.
    pub(crate) fn lock(&self) -> MutexGuard<'_, GroupCoordinator> {
        self.coordinator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coordinator, locked for a client request: it first learns which
    /// offsets partitions the metadata image says this broker leads, so
    /// one whose load has not begun answers COORDINATOR_LOAD_IN_PROGRESS,
    /// and the ownership loop is woken to begin it.
    pub(crate) fn serving(&self) -> MutexGuard<'_, GroupCoordinator> {
        self.topic.serving(
            self.broker_arc(),
            &self.coordinator,
            GroupCoordinator::set_led_by_image,
            || self.poke(),
        )
    }

    fn broker_arc(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// Wakes the ownership loop (after a metadata image was applied).
    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }

    /// The `__consumer_offsets` partition of `group_id`.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        crate::coordinator::placement::coordinator_partition(group_id, self.topic.partitions)
    }

    /// The broker coordinating `group_id` (creating `__consumer_offsets` on
    /// first use): COORDINATOR_NOT_AVAILABLE until it has a live leader.
    ///
    /// When that is this broker, it answers only once its replica of the
    /// partition is open and leading, and first makes the coordinator hold
    /// the partition (loading, if not loaded): a client that sends its
    /// OffsetFetch right after gets COORDINATOR_LOAD_IN_PROGRESS, which it
    /// retries, not NOT_COORDINATOR. The partitions of a just-created
    /// `__consumer_offsets` open one by one while the metadata already
    /// names their leader, and the ownership loop only takes them over
    /// after the last one opened.
    pub fn coordinator_node(
        &self,
        broker: &Broker,
        group_id: &str,
    ) -> Result<BrokerInfo, ResponseError> {
        self.topic
            .ensure(broker, self.broker_arc(), |b| b.groups.poke())?;
        let p = self.partition_for(group_id);
        let node = self.topic.leader_of(broker, p)?;
        if node.node_id == broker.config.node_id {
            let led = broker
                .replicas
                .get(CONSUMER_OFFSETS_TOPIC, p)
                .map(|r| r.leadership())
                .filter(|l| l.is_leader)
                .map(|l| l.leader_epoch);
            let Some(epoch) = led else {
                return Err(ResponseError::CoordinatorNotAvailable);
            };
            if self.lock().coordinator_epoch(p) != Some(epoch) {
                self.reconcile(broker);
            }
        }
        Ok(node)
    }

    /// Ok if `__consumer_offsets` exists; otherwise starts creating it and
    /// answers COORDINATOR_NOT_AVAILABLE (retriable).
    pub fn ensure_offsets_topic(&self, broker: &Broker) -> Result<(), ResponseError> {
        self.topic
            .ensure(broker, self.broker_arc(), |b| b.groups.poke())
    }

    /// Runs `f` on the locked coordinator with a fresh token and waits for
    /// the reply delivered to that token (at once, or once a rebalance or a
    /// write completes).
    pub async fn call(
        &self,
        f: impl FnOnce(&mut GroupCoordinator, Token, i64) -> Step,
    ) -> Option<Reply> {
        let token = Token(self.next_token.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.waiting_lock().insert(token, tx);
        let step = {
            let mut coordinator = self.serving();
            f(&mut coordinator, token, now_ms())
        };
        self.process(step);
        let reply = rx.await.ok();
        if reply.is_none() {
            warn!(?token, "a group request was dropped without a reply");
        }
        reply
    }

    /// Runs `f` on the locked coordinator, then carries out the step it returns.
    pub fn with<T>(&self, f: impl FnOnce(&mut GroupCoordinator, i64) -> (T, Step)) -> T {
        let (value, step) = {
            let mut coordinator = self.serving();
            f(&mut coordinator, now_ms())
        };
        self.process(step);
        value
    }

    fn waiting_lock(&self) -> MutexGuard<'_, HashMap<Token, oneshot::Sender<Reply>>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Delivers a step's replies and starts its writes.
    pub(crate) fn process(&self, step: Step) {
        if !step.deliveries.is_empty() {
            let mut waiting = self.waiting_lock();
            for (token, reply) in step.deliveries {
                if let Some(tx) = waiting.remove(&token) {
                    // The requester may have gone (connection closed).
                    let _ = tx.send(reply);
                }
            }
        }
        if !step.writes.is_empty() {
            match self.broker_arc() {
                Some(broker) => {
                    for write in step.writes {
                        let broker = Arc::clone(&broker);
                        let span = tracing::info_span!(
                            "group_write",
                            group = %write.group,
                            partition = write.partition,
                            coordinator_epoch = write.coordinator_epoch
                        );
                        tokio::spawn(
                            async move {
                                let result = persist(&broker, &write).await;
                                if let Err(e) = result {
                                    debug!(error = ?e, "group write failed");
                                }
                                let step =
                                    broker
                                        .groups
                                        .lock()
                                        .complete_write(write.id, result, now_ms());
                                broker.groups.process(step);
                            }
                            .instrument(span),
                        );
                    }
                }
                None => {
                    let mut coordinator = self.lock();
                    for write in step.writes {
                        let _ = coordinator.complete_write(
                            write.id,
                            Err(ResponseError::NotCoordinator),
                            now_ms(),
                        );
                    }
                }
            }
        }
        self.timer.notify_one();
    }

    /// A marker of `producer_id` is durable on offsets partition `p`.
    pub(crate) fn marker_written(&self, p: i32, producer_id: i64, commit: bool) {
        self.lock().complete_transaction(p, producer_id, commit);
    }

    fn reconcile(&self, broker: &Broker) {
        let mut to_load = Vec::new();
        let mut steps = Vec::new();
        {
            let mut coordinator = self.lock();
            let changes =
                ownership_changes(broker, CONSUMER_OFFSETS_TOPIC, self.topic.partitions, |p| {
                    coordinator.coordinator_epoch(p)
                });
            for change in changes {
                match change {
                    Ownership::Load { partition, epoch } => {
                        if let Some(step) = coordinator.begin_loading(partition, epoch) {
                            steps.push(step);
                            to_load.push((partition, epoch));
                        }
                    }
                    Ownership::Unload { partition, epoch } => {
                        info!(
                            partition,
                            coordinator_epoch = epoch,
                            "no longer leads an offsets partition; unloading"
                        );
                        steps.push(coordinator.unload(partition, Some(epoch)));
                    }
                }
            }
        }
        for step in steps {
            self.process(step);
        }
        for (p, e) in to_load {
            if let Some(broker) = self.broker_arc() {
                tokio::spawn(
                    async move { load(&broker, p, e) }.instrument(tracing::info_span!(
                        "group_load",
                        partition = p,
                        coordinator_epoch = e
                    )),
                );
            }
        }
    }
}

/// Replays offsets partition `p` (led at epoch `e`) and starts serving it.
fn load(broker: &Broker, p: i32, e: i32) {
    let started = std::time::Instant::now();
    let loaded = crate::blocking_io(|| read_log(broker, CONSUMER_OFFSETS_TOPIC, p))
        .and_then(|entries| replay(entries).map_err(|e| e.to_string()));
    let loaded = match loaded {
        Ok(l) => l,
        Err(why) => {
            warn!(error = %why, "cannot load the offsets partition; will retry");
            let step = broker.groups.lock().unload(p, Some(e));
            broker.groups.process(step);
            return;
        }
    };
    match broker.groups.lock().finish_loading(p, e, loaded, now_ms()) {
        Ok(groups) => info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            groups, "offsets partition loaded"
        ),
        Err(error) => debug!(%error, "load finished after the partition moved on"),
    }
    broker.groups.timer.notify_one();
}

/// Appends `write` to its offsets partition and waits for acks=all; the
/// base offset of its batch.
async fn persist(broker: &Broker, write: &GroupWrite) -> Result<i64, ResponseError> {
    let partition = writable_partition(
        broker,
        CONSUMER_OFFSETS_TOPIC,
        write.partition,
        write.coordinator_epoch,
    )?;
    let records: Vec<(&[u8], Option<&[u8]>)> = write
        .records
        .iter()
        .map(|r| (r.key.as_slice(), r.value.as_deref()))
        .collect();
    let now = now_ms();
    let info = match &write.transactional {
        None => {
            let batch = samsa_storage::batch::key_value_batch(&records, now);
            partition
                .append(&batch, now)
                .map_err(|e| partition_error_code(&e))?
                .0
        }
        Some(t) => {
            let tp = TopicPartition::new(CONSUMER_OFFSETS_TOPIC.to_string(), write.partition);
            let needs = partition
                .txn_needs_verification(t.producer_id, t.producer_epoch)
                .map_err(|e| partition_error_code(&e))?;
            if needs {
                crate::coordinator::txn::verify::verify_partition(
                    broker,
                    &t.transactional_id,
                    t.producer_id,
                    t.producer_epoch,
                    tp,
                    t.add_partition,
                )
                .await?;
                partition.mark_txn_verified(t.producer_id, t.producer_epoch);
            }
            let batch = samsa_storage::batch::transactional_key_value_batch(
                &records,
                t.producer_id,
                t.producer_epoch,
                now,
            );
            partition
                .append_transactional(&batch, t.producer_id, t.producer_epoch, now)
                .map_err(|e| partition_error_code(&e))?
                .0
        }
    };
    wait_durable(&partition, info.last_offset + 1, write.coordinator_epoch).await?;
    Ok(info.base_offset)
}

/// Ownership reconciliation and the coordinator's timers, until `stop`.
async fn run_loop(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    loop {
        let next = broker.groups.lock().next_deadline();
        let sleep_ms = next.map_or(RECONCILE_EVERY.as_millis() as i64, |d| {
            (d - now_ms()).max(0)
        });
        let sleep = tokio::time::sleep(Duration::from_millis(sleep_ms as u64).min(RECONCILE_EVERY));
        tokio::select! {
            _ = reconcile.tick() => broker.groups.reconcile(&broker),
            _ = broker.groups.wake.notified() => broker.groups.reconcile(&broker),
            _ = broker.groups.timer.notified() => {}
            _ = sleep => {
                let step = broker.groups.lock().tick(now_ms());
                broker.groups.process(step);
            }
            _ = stop.changed() => return,
        }
    }
}
