//! The IO side every coordinator shares: one [`Runtime`] per coordinator,
//! owning its state machine and everything that drives it.
//!
//! - **The state topic** ([`StateTopic`]): created on first use; until it
//!   exists and the key's partition has a live leader, requests answer
//!   COORDINATOR_NOT_AVAILABLE, which clients retry.
//! - **Leadership** ([`Runtime::reconcile`]): a background loop compares
//!   the state partitions this broker leads (and at which leader epoch)
//!   with what the coordinator holds: newly led → `begin_loading`, replay
//!   the partition from its start to its log end, `finish_loading`; no
//!   longer led → `unload`. The applier pokes the loop after every
//!   metadata image ([`Runtime::poke`]), and it also looks twice a second.
//!   Client requests lock the coordinator through [`Runtime::serving`],
//!   which first tells it which partitions the image says this broker
//!   leads, so one whose load has not begun answers
//!   COORDINATOR_LOAD_IN_PROGRESS rather than NOT_COORDINATOR.
//! - **Writes** ([`Runtime::process`], [`Runtime::write`]): each
//!   [`Write`] of a step is appended as leader at the coordinator epoch
//!   with acks=all ([`state_topic::append_durable`]) and only then
//!   reported with `complete_write` — or, for a write that
//!   [`TakesEffect::OnceAppended`], reported once appended while acks=all
//!   is awaited in the background; the rest of each step goes to the
//!   coordinator's service ([`Hosted::carry_out`]).
//! - **Timers**: the loop sleeps until the coordinator's next deadline (and
//!   wakes when a call may have moved it), then calls `tick`.
//!
//! Invariants kept here:
//! - the coordinator's mutex is held for one synchronous call, never across
//!   an await, and never while waiting for another lock;
//! - a write is reported `Ok` only once its record is covered by the state
//!   partition's high watermark in the leader epoch it was planned for
//!   (one that [`TakesEffect::OnceAppended`]: once it is in the leader's
//!   log at that epoch, before every later write to the partition);
//! - a partition is served only by the leader of its state partition, at
//!   the epoch it loaded at.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn, Instrument};

use super::state_topic::{self, read_log, StateTopic};
use super::{Coordinator, ProducerIdSource, Step, TakesEffect, Write};
use crate::metadata::BrokerInfo;
use crate::producer_ids::ProducerIdManager;
use crate::{now_ms, Broker};

/// How often ownership is reconciled even without a metadata change.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(500);

/// The IO side of one coordinator: what its runtime needs from it besides
/// the sans-IO [`Coordinator`] contract.
pub trait Hosted: Coordinator + Sized {
    /// What only this coordinator's service holds (gRPC clients, parked
    /// requests).
    type Service: Send + Sync + 'static;
    /// A name for logs and spans ("transaction", "group").
    const KIND: &'static str;
    /// This coordinator's runtime in `broker`.
    fn runtime(broker: &Broker) -> &Runtime<Self>;
    /// Carries out what `step` asks besides its writes (replies to deliver,
    /// markers to send). Its writes were already taken out.
    fn carry_out(runtime: &Runtime<Self>, step: Self::Step);
}

/// One coordinator of this broker and everything that drives it.
pub struct Runtime<C: Hosted> {
    coordinator: Mutex<C>,
    broker: OnceLock<Weak<Broker>>,
    pub(crate) topic: StateTopic,
    /// Ownership may have changed (metadata image applied).
    wake: Notify,
    /// The next deadline may have moved.
    timer: Notify,
    /// Notified after every write completes (see [`Self::settled`]).
    settled: Notify,
    pub(crate) service: C::Service,
}

/// Producer ids for coordinator calls, which cannot await: taken from the
/// block the broker holds ([`ProducerIdManager::ensure_block`] first).
pub(crate) struct HeldIds<'a>(pub(crate) &'a ProducerIdManager);

impl ProducerIdSource for HeldIds<'_> {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError> {
        self.0
            .try_next_producer_id()
            .ok_or(ResponseError::CoordinatorLoadInProgress)
    }
}

impl<C: Hosted> Runtime<C> {
    pub fn new(coordinator: C, topic: StateTopic, service: C::Service) -> Self {
        Runtime {
            coordinator: Mutex::new(coordinator),
            broker: OnceLock::new(),
            topic,
            wake: Notify::new(),
            timer: Notify::new(),
            settled: Notify::new(),
            service,
        }
    }

    /// Gives the runtime its broker (for the tasks it spawns) and starts the
    /// ownership and timer loop until `stop`.
    pub fn start(broker: &Arc<Broker>, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let _ = C::runtime(broker).broker.set(Arc::downgrade(broker));
        tokio::spawn(run_loop::<C>(Arc::clone(broker), stop).in_current_span())
    }

    /// The coordinator, locked. Never hold the guard across an await.
    pub(crate) fn lock(&self) -> MutexGuard<'_, C> {
        self.coordinator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coordinator, locked for a client request: it first learns which
    /// state partitions the metadata image says this broker leads, so one
    /// whose load has not begun answers COORDINATOR_LOAD_IN_PROGRESS, and
    /// the ownership loop is woken to begin it.
    pub(crate) fn serving(&self) -> MutexGuard<'_, C> {
        // Read the image before locking: the coordinator's mutex is never
        // held while waiting for another lock.
        let led = self.broker_arc().map(|b| self.topic.led_by_image(&b));
        let mut guard = self.lock();
        if let Some(led) = led {
            if guard.set_led_by_image(led) {
                self.poke();
            }
        }
        guard
    }

    pub(crate) fn broker_arc(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// Wakes the ownership loop (after a metadata image was applied).
    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }

    /// The state partition of `key` (a transactional id or a group id).
    pub fn partition_for(&self, key: &str) -> i32 {
        super::placement::coordinator_partition(key, self.topic.partitions)
    }

    /// Ok if the state topic exists; otherwise starts creating it (once)
    /// and answers COORDINATOR_NOT_AVAILABLE, which clients retry.
    pub fn ensure_state_topic(&self, broker: &Broker) -> Result<(), ResponseError> {
        self.topic
            .ensure(broker, self.broker_arc(), |b| C::runtime(b).poke())
    }

    /// Waits up to `timeout` for a creation of the state topic this broker
    /// began to end; true if one was under way and ended.
    pub async fn state_topic_creation_ended(&self, timeout: Duration) -> bool {
        self.topic.creation_ended(timeout).await
    }

    /// The broker coordinating `key` (creating the state topic on first
    /// use): COORDINATOR_NOT_AVAILABLE until its partition has a live
    /// leader.
    ///
    /// When that is this broker, it answers only once its replica of the
    /// partition is open and leading, and first makes the coordinator hold
    /// the partition (loading, if not loaded): a client that sends its next
    /// request right after gets COORDINATOR_LOAD_IN_PROGRESS, which it
    /// retries, not NOT_COORDINATOR. The partitions of a just-created state
    /// topic open one by one while the metadata already names their
    /// leader, and the ownership loop only takes them over after the last
    /// one opened.
    pub fn coordinator_node(
        &self,
        broker: &Broker,
        key: &str,
    ) -> Result<BrokerInfo, ResponseError> {
        self.ensure_state_topic(broker)?;
        let p = self.partition_for(key);
        let node = self.topic.leader_of(broker, p)?;
        if node.node_id == broker.config.node_id {
            let Some(epoch) = led_epoch(broker, C::STATE_TOPIC, p) else {
                return Err(ResponseError::CoordinatorNotAvailable);
            };
            // Cut off from the controller and the state partition's
            // followers: another broker most likely coordinates by now.
            if !broker.leads_usably(C::STATE_TOPIC, p) {
                return Err(ResponseError::CoordinatorNotAvailable);
            }
            if self.lock().coordinator_epoch(p) != Some(epoch) {
                self.reconcile(broker);
            }
        }
        Ok(node)
    }

    /// Makes sure a producer-id block is held before a call that may need
    /// an id runs under the lock; a failure surfaces later as
    /// COORDINATOR_LOAD_IN_PROGRESS (retriable) from the call.
    pub(crate) async fn prepare_ids(&self, broker: &Broker) {
        if let Err(e) = broker.producer_ids.ensure_block().await {
            warn!(error = %e, kind = C::KIND, "no producer id block for the coordinator yet");
        }
    }

    /// Runs `f` on the coordinator locked for a request, with the broker's
    /// held producer ids.
    pub(crate) fn with_ids<T>(
        &self,
        broker: &Broker,
        f: impl FnOnce(&mut C, &mut dyn ProducerIdSource) -> T,
    ) -> T {
        let mut ids = HeldIds(&broker.producer_ids);
        let mut coordinator = self.serving();
        f(&mut coordinator, &mut ids)
    }

    /// Carries out `step`: its writes are persisted in the background (each
    /// completion is processed in turn), the rest goes to the service.
    pub(crate) fn process(&self, mut step: C::Step) {
        let writes = step.take_writes();
        if !writes.is_empty() {
            match self.broker_arc() {
                Some(broker) => {
                    for write in writes {
                        let broker = Arc::clone(&broker);
                        tokio::spawn(async move {
                            let runtime = C::runtime(&broker);
                            let step = runtime.write(&broker, write).await;
                            runtime.process(step);
                        });
                    }
                }
                None => {
                    // Shutting down: nothing can be appended any more.
                    let completions: Vec<C::Step> = {
                        let mut coordinator = self.lock();
                        writes
                            .iter()
                            .map(|w| {
                                coordinator.complete_write(
                                    w.id,
                                    Err(ResponseError::NotCoordinator),
                                    now_ms(),
                                )
                            })
                            .collect()
                    };
                    for mut completion in completions {
                        let dropped = completion.take_writes();
                        if !dropped.is_empty() {
                            debug!(
                                writes = dropped.len(),
                                "coordinator writes dropped at shutdown"
                            );
                        }
                        if !completion.is_empty() {
                            C::carry_out(self, completion);
                        }
                    }
                }
            }
        }
        if !step.is_empty() {
            C::carry_out(self, step);
        }
        if C::DEADLINES_FOLLOW_CALLS {
            self.timer.notify_one();
        }
    }

    /// Persists `write` (acks=all on its state partition) and reports it to
    /// the coordinator; the step its completion returns is the caller's to
    /// process (a request may read its answer from it first).
    pub(crate) async fn write(&self, broker: &Broker, write: Write) -> C::Step {
        let span = tracing::info_span!(
            target: crate::trace::TARGET,
            "coordinator_write",
            kind = C::KIND,
            owner = %write.owner,
            partition = write.partition,
            coordinator_epoch = write.coordinator_epoch
        );
        let result = match write.takes_effect {
            TakesEffect::OnceDurable => {
                state_topic::append_durable(broker, C::STATE_TOPIC, &write)
                    .instrument(span.clone())
                    .await
            }
            TakesEffect::OnceAppended => state_topic::append(broker, C::STATE_TOPIC, &write)
                .instrument(span.clone())
                .await
                .map(|appended| {
                    let base_offset = appended.base_offset;
                    // Nothing waits on it: a failure means this leader
                    // lost its role (and the next one replays the log) or
                    // the next write to the partition fails the same way.
                    tokio::spawn(
                        async move {
                            if let Err(e) = appended.wait_durable().await {
                                debug!(error = ?e, "coordinator state write not acknowledged after it took effect");
                            }
                        }
                        .instrument(span.clone()),
                    );
                    base_offset
                }),
        };
        if let Err(e) = result {
            span.in_scope(|| debug!(error = ?e, "coordinator state write failed"));
        }
        let step = self.lock().complete_write(write.id, result, now_ms());
        self.settled.notify_waiters();
        step
    }

    /// Resolves after the next state write completes: a request answered
    /// CONCURRENT_TRANSACTIONS may succeed now. Enable it before asking the
    /// coordinator, so no completion is missed between the answer and the
    /// wait.
    pub(crate) fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// Makes what the coordinator holds match the state partitions this
    /// broker leads (see the module docs).
    fn reconcile(&self, broker: &Broker) {
        let mut to_load = Vec::new();
        let mut steps = Vec::new();
        {
            let mut coordinator = self.lock();
            for change in ownership_changes(broker, C::STATE_TOPIC, self.topic.partitions, |p| {
                coordinator.coordinator_epoch(p)
            }) {
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
                            kind = C::KIND,
                            "no longer leads a coordinator state partition; unloading"
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
                tokio::spawn(load::<C>(broker, p, e).instrument(tracing::info_span!(
                    "coordinator_load",
                    kind = C::KIND,
                    partition = p,
                    coordinator_epoch = e
                )));
            }
        }
    }
}

/// The leader epoch at which this broker leads `topic`-`p`, if it does.
fn led_epoch(broker: &Broker, topic: &str, p: i32) -> Option<i32> {
    broker
        .replicas
        .get(topic, p)
        .map(|x| x.leadership())
        .filter(|l| l.is_leader)
        .map(|l| l.leader_epoch)
}

/// A change of which partitions a coordinator should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ownership {
    /// Newly led (or led at a new epoch): load it at this epoch.
    Load { partition: i32, epoch: i32 },
    /// Held at `epoch` but no longer led here: unload it.
    Unload { partition: i32, epoch: i32 },
}

/// Compares the partitions of `topic` this broker leads with what a
/// coordinator holds (`held(p)`: the epoch it holds `p` at).
fn ownership_changes(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    held: impl Fn(i32) -> Option<i32>,
) -> Vec<Ownership> {
    let mut changes = Vec::new();
    for p in 0..partitions {
        match (led_epoch(broker, topic, p), held(p)) {
            (Some(e), Some(h)) if e == h => {}
            (Some(e), _) => changes.push(Ownership::Load {
                partition: p,
                epoch: e,
            }),
            (None, Some(h)) => changes.push(Ownership::Unload {
                partition: p,
                epoch: h,
            }),
            (None, None) => {}
        }
    }
    changes
}

/// Replays state partition `p` (led at epoch `e`) and starts serving it.
async fn load<C: Hosted>(broker: Arc<Broker>, p: i32, e: i32) {
    let runtime = C::runtime(&broker);
    let started = std::time::Instant::now();
    let replayed = crate::blocking_io(|| read_log(&broker, C::STATE_TOPIC, p))
        .and_then(|entries| C::replay(entries));
    let replayed = match replayed {
        Ok(r) => r,
        Err(why) => {
            warn!(error = %why, "cannot load the coordinator state partition; will retry");
            let step = runtime.lock().unload(p, Some(e));
            runtime.process(step);
            return;
        }
    };
    if C::USES_PRODUCER_IDS {
        runtime.prepare_ids(&broker).await;
    }
    let mut ids = HeldIds(&broker.producer_ids);
    let loaded = runtime
        .lock()
        .finish_loading(p, e, replayed, now_ms(), &mut ids);
    match loaded {
        Ok(step) => {
            info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "coordinator state partition loaded"
            );
            runtime.process(step);
        }
        Err(error) => debug!(%error, "load finished after the partition moved on"),
    }
}

/// Ownership reconciliation and the coordinator's timers, until `stop`.
async fn run_loop<C: Hosted>(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let runtime = C::runtime(&broker);
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    loop {
        let next = runtime.lock().next_deadline();
        let sleep_ms = next.map_or(RECONCILE_EVERY.as_millis() as i64, |d| {
            (d - now_ms()).max(0)
        });
        let sleep = tokio::time::sleep(Duration::from_millis(sleep_ms as u64).min(RECONCILE_EVERY));
        tokio::select! {
            _ = reconcile.tick() => runtime.reconcile(&broker),
            _ = runtime.wake.notified() => runtime.reconcile(&broker),
            _ = runtime.timer.notified() => {}
            _ = sleep => {
                if next.is_some_and(|d| d <= now_ms()) {
                    if C::USES_PRODUCER_IDS {
                        runtime.prepare_ids(&broker).await;
                    }
                    let mut ids = HeldIds(&broker.producer_ids);
                    let step = runtime.lock().tick(now_ms(), &mut ids);
                    runtime.process(step);
                }
            }
            _ = stop.changed() => return,
        }
    }
}
