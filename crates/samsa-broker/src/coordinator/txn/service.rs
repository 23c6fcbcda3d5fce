//! The IO shell around the sans-IO transaction coordinator ([`crate::txn`]),
//! and the partition side of transactions that needs the network.
//!
//! What this module owns:
//!
//! - **`__transaction_state`** ([`TxnShell::ensure_state_topic`]): created on
//!   first use (FindCoordinator or InitProducerId with a transactional id)
//!   with `transaction_state_log_num_partitions` partitions, replication
//!   `transaction_state_log_replication_factor` (default min(3, live
//!   brokers)), `min.insync.replicas` 2 when RF ≥ 3, no retention and no
//!   unclean election. Until it exists and has leaders, callers answer
//!   COORDINATOR_NOT_AVAILABLE and clients retry.
//! - **Ownership** (`reconcile`): one [`TxnCoordinator`] per broker behind a
//!   mutex. A background task compares the state partitions this broker
//!   leads (and at which leader epoch) with what the coordinator holds:
//!   newly led → `begin_loading`, replay the partition from its start to its
//!   log end, `finish_loading`, then resend the markers of unfinished
//!   transactions; no longer led → `unload`. The applier pokes the task
//!   after every metadata image, and it also looks twice a second. Client
//!   requests lock the coordinator through `serving`, which first tells it
//!   which partitions the image says this broker leads.
//! - **Writes** ([`TxnShell::complete`]): a [`TxnWrite`] is appended to its
//!   state partition as leader at the coordinator epoch, with acks=all (the
//!   produce path's fsync + HW wait, [`Partition::wait_acks_all`]), and only
//!   then reported with `complete_write`; effects (markers) run after.
//! - **Markers** ([`markers`]): sent to the current leader of each
//!   partition — locally or over gRPC (`proto/txn.proto`) — and retried
//!   until each is acknowledged acks=all, then `markers_written`.
//! - **Verification** ([`verify`]): a partition leader asks the coordinator
//!   of the producer's transactional id before its first transactional
//!   write to the partition (KIP-890).
//! - **Timers**: `abort_expired_transactions` every
//!   `transaction_abort_timed_out_transaction_cleanup_interval_ms`,
//!   `expire_transactional_ids` hourly.
//!
//! Invariants kept here:
//! - the coordinator's mutex is never held across an await: every call into
//!   it is a short synchronous step;
//! - a write is reported `Ok` only once its record is covered by the state
//!   partition's high watermark in the leader epoch it was planned for, so a
//!   transition takes effect only once durable on the ISR;
//! - a marker counts as written only once its partition's HW covers it in
//!   the leader epoch that appended it; marker sends of a partition stop as
//!   soon as this broker no longer coordinates it at that epoch (a new
//!   coordinator re-issues them from the log).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use samsa_proto::txn::txn_service_client::TxnServiceClient;
use tokio::sync::{watch, Notify};
use tonic::transport::Channel;
use tracing::{debug, info, warn, Instrument};

use crate::coordinator::runtime::{
    append_durable, ownership_changes, read_log, InternalTopic, Ownership, RECONCILE_EVERY,
};
use crate::coordinator::group::LogEntry;
use crate::metadata::BrokerInfo;
use crate::producer_ids::ProducerIdManager;
use crate::coordinator::placement::TRANSACTION_STATE_TOPIC;
use crate::coordinator::txn::{
    CoordinatorResponse, CoordinatorState, Effect, Outcome, ProducerIdSource, TxnConfig,
    TxnCoordinator, TxnWrite, WriteCompletion,
};
use crate::{now_ms, Broker, BrokerConfig};

/// Transactional-id expiration runs this often (Kafka: hourly).
const EXPIRE_IDS_EVERY: Duration = Duration::from_secs(3600);

/// Producer ids for coordinator handlers, which cannot await: taken from the
/// block the broker holds ([`ProducerIdManager::ensure_block`] first).
struct HeldIds<'a>(&'a ProducerIdManager);

impl ProducerIdSource for HeldIds<'_> {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError> {
        self.0
            .try_next_producer_id()
            .ok_or(ResponseError::CoordinatorLoadInProgress)
    }
}

/// The transaction coordinator of this broker and everything that drives it.
pub struct TxnShell {
    coordinator: Mutex<TxnCoordinator>,
    broker: OnceLock<Weak<Broker>>,
    /// Cluster mode: node id → internal gRPC address of every broker.
    peers: OnceLock<HashMap<i32, String>>,
    clients: Mutex<HashMap<i32, TxnServiceClient<Channel>>>,
    topic: InternalTopic,
    wake: Notify,
    /// Notified after every state write completes (see [`Self::settled`]).
    settled: Notify,
}

pub(crate) fn txn_config(config: &BrokerConfig) -> TxnConfig {
    TxnConfig {
        transaction_state_partitions: config.transaction_state_log_num_partitions,
        max_timeout_ms: config.transaction_max_timeout_ms,
        transactional_id_expiration_ms: config.transactional_id_expiration_ms,
        consumer_offsets_partitions: config.offsets_topic_num_partitions,
    }
}

impl TxnShell {
    pub fn new(config: &BrokerConfig) -> Self {
        TxnShell {
            coordinator: Mutex::new(TxnCoordinator::new(txn_config(config))),
            broker: OnceLock::new(),
            peers: OnceLock::new(),
            clients: Mutex::new(HashMap::new()),
            topic: InternalTopic::new(
                TRANSACTION_STATE_TOPIC,
                config.transaction_state_log_num_partitions,
                config.transaction_state_log_replication_factor,
            ),
            wake: Notify::new(),
            settled: Notify::new(),
        }
    }

    /// Gives the shell its broker (for the tasks it spawns) and, in cluster
    /// mode, the gRPC address of every broker; then starts the ownership and
    /// timer loop until `stop`.
    pub fn start(
        broker: &Arc<Broker>,
        peers: Option<HashMap<i32, String>>,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let _ = broker.txn.broker.set(Arc::downgrade(broker));
        if let Some(peers) = peers {
            let _ = broker.txn.peers.set(peers);
        }
        tokio::spawn(run_loop(Arc::clone(broker), stop).in_current_span())
    }

    /// The coordinator, locked. Never hold the guard across an await.
    pub(crate) fn lock(&self) -> MutexGuard<'_, TxnCoordinator> {
        self.coordinator.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The coordinator, locked for a client request: it first learns which
    /// state partitions the metadata image says this broker leads, so one
    /// whose load has not begun answers COORDINATOR_LOAD_IN_PROGRESS, and
    /// the ownership loop is woken to begin it.
    pub(crate) fn serving(&self) -> MutexGuard<'_, TxnCoordinator> {
        self.topic.serving(
            self.broker_arc(),
            &self.coordinator,
            TxnCoordinator::set_led_by_image,
            || self.poke(),
        )
    }

    pub(crate) fn broker_arc(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// Wakes the ownership loop (after a metadata image was applied).
    pub(crate) fn poke(&self) {
        self.wake.notify_one();
    }

    /// The `__transaction_state` partition of `transactional_id`.
    pub fn partition_for(&self, transactional_id: &str) -> i32 {
        crate::coordinator::placement::coordinator_partition(transactional_id, self.topic.partitions)
    }

    /// Ok if `__transaction_state` exists; otherwise starts creating it (once)
    /// and answers COORDINATOR_NOT_AVAILABLE, which clients retry.
    pub fn ensure_state_topic(&self, broker: &Broker) -> Result<(), ResponseError> {
        self.topic
            .ensure(broker, self.broker_arc(), |b| b.txn.poke())
    }

    /// The broker leading the state partition of `transactional_id`
    /// (creating the topic on first use): COORDINATOR_NOT_AVAILABLE while
    /// it has no live leader.
    pub fn coordinator_node(
        &self,
        broker: &Broker,
        transactional_id: &str,
    ) -> Result<BrokerInfo, ResponseError> {
        self.ensure_state_topic(broker)?;
        self.topic
            .leader_of(broker, self.partition_for(transactional_id))
    }

    /// Makes sure a producer-id block is held before a handler that may need
    /// an id runs under the lock; a failure surfaces later as
    /// COORDINATOR_LOAD_IN_PROGRESS (retriable) from the handler.
    pub(crate) async fn prepare_ids(&self, broker: &Broker) {
        if let Err(e) = broker.producer_ids.ensure_block().await {
            warn!(error = %e, "no producer id block for the transaction coordinator yet");
        }
    }

    /// Runs `f` on the locked coordinator with the broker's held ids.
    pub(crate) fn with_ids<T>(
        &self,
        broker: &Broker,
        f: impl FnOnce(&mut TxnCoordinator, &mut dyn ProducerIdSource) -> T,
    ) -> T {
        let mut ids = HeldIds(&broker.producer_ids);
        let mut coordinator = self.serving();
        f(&mut coordinator, &mut ids)
    }

    /// Persists `write` (acks=all on its state partition), reports it to the
    /// coordinator, and starts the effects it released.
    pub(crate) async fn complete(&self, broker: &Broker, write: TxnWrite) -> WriteCompletion {
        let span = tracing::info_span!(
            "txn_write",
            transactional_id = %write.transactional_id,
            partition = write.partition,
            coordinator_epoch = write.coordinator_epoch
        );
        let result = persist(broker, &write).instrument(span.clone()).await;
        let completion = self.lock().complete_write(write.id, result);
        span.in_scope(|| {
            if let Err(e) = result {
                debug!(error = ?e, "transaction state write failed");
            }
        });
        self.run_effects(completion.effects.clone());
        self.settled.notify_waiters();
        completion
    }

    /// Resolves after the next state write of any transactional id
    /// completes: a request answered CONCURRENT_TRANSACTIONS may succeed
    /// now. Enable it before asking the coordinator, so no completion is
    /// missed between the answer and the wait.
    pub(crate) fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// The response of a handler's [`Outcome`]: at once without a write,
    /// otherwise once the write is durable (or with the error it failed with).
    pub(crate) async fn respond<R: CoordinatorResponse>(
        &self,
        broker: &Broker,
        outcome: Outcome<R>,
    ) -> R {
        match outcome.write {
            None => outcome.response,
            Some(write) => self
                .complete(broker, write)
                .await
                .response(outcome.response),
        }
    }

    /// Completes `write` in the background (timer and load writes answer no
    /// one).
    pub(crate) fn complete_in_background(&self, write: TxnWrite) {
        let Some(broker) = self.broker_arc() else {
            return;
        };
        tokio::spawn(
            async move {
                let completion = broker.txn.complete(&broker, write).await;
                if let Some(e) = completion.error {
                    debug!(error = %e, "background transaction state write failed");
                }
            }
            .in_current_span(),
        );
    }

    pub(crate) fn run_effects(&self, effects: Vec<Effect>) {
        if effects.is_empty() {
            return;
        }
        let Some(broker) = self.broker_arc() else {
            warn!("transaction effects dropped: the broker is shutting down");
            return;
        };
        for effect in effects {
            match effect {
                Effect::WriteMarkers(m) => {
                    tokio::spawn(super::markers::drive(Arc::clone(&broker), m));
                }
            }
        }
    }

    /// A gRPC client for broker `node` (cluster mode).
    pub(crate) fn client(&self, node: i32) -> Option<TxnServiceClient<Channel>> {
        let addr = self.peers.get()?.get(&node)?;
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&node) {
            return Some(c.clone());
        }
        let uri = if addr.starts_with("http://") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        let channel = tonic::transport::Endpoint::from_shared(uri)
            .ok()?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .connect_lazy();
        let client = TxnServiceClient::new(channel);
        clients.insert(node, client.clone());
        Some(client)
    }

    /// Makes what the coordinator holds match the state partitions this
    /// broker leads (see the module docs).
    fn reconcile(&self, broker: &Broker) {
        let mut to_load = Vec::new();
        {
            let mut coordinator = self.lock();
            let changes = ownership_changes(
                broker,
                TRANSACTION_STATE_TOPIC,
                self.topic.partitions,
                |p| coordinator.coordinator_epoch(p),
            );
            for change in changes {
                match change {
                    Ownership::Load {
                        partition: p,
                        epoch: e,
                    } => {
                        if coordinator.begin_loading(p, e) {
                            to_load.push((p, e));
                        }
                    }
                    Ownership::Unload {
                        partition: p,
                        epoch: h,
                    } => {
                        info!(
                            partition = p,
                            coordinator_epoch = h,
                            "no longer leads a transaction state partition; unloading"
                        );
                        coordinator.unload(p, Some(h));
                    }
                }
            }
        }
        for (p, e) in to_load {
            if let Some(broker) = self.broker_arc() {
                tokio::spawn(async move { load(&broker, p, e).await }.instrument(
                    tracing::info_span!("txn_load", partition = p, coordinator_epoch = e),
                ));
            }
        }
    }
}

/// Appends `write`'s records to its state partition as leader at the
/// coordinator epoch and waits for acks=all.
async fn persist(broker: &Broker, write: &TxnWrite) -> Result<(), ResponseError> {
    let records: Vec<(&[u8], Option<&[u8]>)> = write
        .records
        .iter()
        .map(|r| (r.key.as_slice(), r.value.as_deref()))
        .collect();
    append_durable(
        broker,
        TRANSACTION_STATE_TOPIC,
        write.partition,
        write.coordinator_epoch,
        &records,
    )
    .await
}

/// Replays state partition `p` (led at epoch `e`) and starts serving it.
async fn load(broker: &Arc<Broker>, p: i32, e: i32) {
    let started = std::time::Instant::now();
    let state = match read_state(broker, p) {
        Ok(state) => state,
        Err(why) => {
            warn!(error = %why, "cannot load the transaction state partition; will retry");
            broker.txn.lock().unload(p, Some(e));
            return;
        }
    };
    broker.txn.prepare_ids(broker).await;
    let loaded = broker.txn.with_ids(broker, |c, ids| {
        c.finish_loading(p, e, state, now_ms(), ids)
    });
    match loaded {
        Ok(loaded) => {
            info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                markers = loaded.effects.len(),
                writes = loaded.writes.len(),
                "transaction state partition loaded"
            );
            broker.txn.run_effects(loaded.effects);
            for w in loaded.writes {
                broker.txn.complete_in_background(w);
            }
        }
        Err(error) => debug!(%error, "load finished after the partition moved on"),
    }
}

/// Every record of state partition `p`, from its start to its log end
/// (markers are not state).
fn read_state(broker: &Broker, p: i32) -> Result<CoordinatorState, String> {
    let records = read_log(broker, TRANSACTION_STATE_TOPIC, p)?
        .into_iter()
        .filter_map(|entry| match entry {
            LogEntry::Record { key, value, .. } => Some((key, value)),
            LogEntry::Marker { .. } => None,
        });
    CoordinatorState::replay(records).map_err(|e| e.to_string())
}

/// Ownership reconciliation and the coordinator's timers, until `stop`.
async fn run_loop(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let cleanup_every = Duration::from_millis(
        broker
            .config
            .transaction_abort_timed_out_transaction_cleanup_interval_ms
            .max(10),
    );
    let mut cleanup = tokio::time::interval(cleanup_every);
    let mut expire_ids = tokio::time::interval(EXPIRE_IDS_EVERY);
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    loop {
        tokio::select! {
            _ = reconcile.tick() => broker.txn.reconcile(&broker),
            _ = broker.txn.wake.notified() => broker.txn.reconcile(&broker),
            _ = cleanup.tick() => {
                broker.txn.prepare_ids(&broker).await;
                let writes = broker.txn.with_ids(&broker, |c, ids| c.abort_expired_transactions(now_ms(), ids));
                for w in writes {
                    broker.txn.complete_in_background(w);
                }
            }
            _ = expire_ids.tick() => {
                let writes = broker.txn.lock().expire_transactional_ids(now_ms());
                for w in writes {
                    broker.txn.complete_in_background(w);
                }
            }
            _ = stop.changed() => return,
        }
    }
}
