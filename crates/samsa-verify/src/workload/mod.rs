//! The workloads and what they share: the librdkafka settings, a producer
//! context that records every delivery into the history, pacing, and the
//! start/stop flags.
//!
//! Every workload runs on plain threads (librdkafka's calls block). Each
//! client is driven by one thread, which records its events, so their
//! order in the history is the order that client saw (rebalance callbacks
//! run inside `poll`, on the same thread).

pub mod compact;
pub mod idempotent;
pub mod pipeline;
pub mod queue;
pub mod txn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tools::client::{forward_error, forward_log, ConnectArgs};

use crate::history::{EventKind, PartitionOffset, Recorder, TopicPartition, Workload, ID_HEADER};

/// What every workload thread gets.
#[derive(Clone)]
pub struct Env {
    pub recorder: Arc<Recorder>,
    pub connect: ConnectArgs,
    /// Set when the run's duration is over: producers finish what they
    /// have in hand and stop.
    pub stop_producing: Arc<AtomicBool>,
    /// Set after the drain: consumers commit what they hold and stop.
    pub stop: Arc<AtomicBool>,
    /// This workload's share of `--rate`, records per second.
    pub rate: f64,
    pub seed: u64,
    pub partitions: i32,
    /// Where producing threads wait until every workload is ready.
    pub gate: Arc<Gate>,
}

impl Env {
    pub fn producing(&self) -> bool {
        !self.stop_producing.load(Ordering::Relaxed)
    }

    pub fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// A librdkafka configuration: the connection flags, then `settings`.
    pub fn config(&self, settings: &[(&str, String)]) -> Result<ClientConfig> {
        let borrowed: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.connect.client_config(&borrowed)
    }
}

/// The start line: every producing thread arrives once its clients are
/// set up (transactional ones initialised), and none produces before all
/// have, so `--duration` is time under the whole load and no workload's
/// rate is spent while another waits for its transaction coordinator.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    arrived: usize,
    open: bool,
    closed: bool,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts this thread as ready and waits until the gate opens; false
    /// if the run was called off instead.
    pub fn arrive_and_wait(&self) -> bool {
        let mut s = self.lock();
        s.arrived += 1;
        self.changed.notify_all();
        while !s.open && !s.closed {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.open
    }

    /// Waits until `expected` threads arrived, at most `timeout`: how many did.
    pub fn wait_arrivals(&self, expected: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.arrived < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        s.arrived
    }

    pub fn open(&self) {
        self.lock().open = true;
        self.changed.notify_all();
    }

    /// Calls the run off: waiting threads return false.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

/// How long a blocking transactional call may take.
pub const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a record may wait for its acknowledgement before librdkafka
/// reports it failed (an unknown outcome). Longer than any outage a fault
/// schedule makes, because a timeout is not harmless for an idempotent
/// producer: librdkafka then bumps the producer's epoch, and records it
/// was retrying on other partitions (possibly written already) are sent
/// again under the new epoch, where no broker can recognise them. A
/// shorter timeout would test librdkafka's epoch bump, not the broker.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(300);
/// The transactions' timeout: how long a transaction left open by a
/// producer that died or was replaced holds back read_committed readers.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest consumer poll: bounds how late a stop is noticed.
pub const MAX_POLL: Duration = Duration::from_millis(100);
/// Consumer group session timeout of the workloads' consumers.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of every producer: acks=all, idempotence.
pub fn producer_settings(client_id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("client.id", client_id.to_string()),
        ("acks", "all".to_string()),
        ("enable.idempotence", "true".to_string()),
        ("linger.ms", "5".to_string()),
        (
            "message.timeout.ms",
            MESSAGE_TIMEOUT.as_millis().to_string(),
        ),
    ]
}

/// Settings of a transactional producer: [`producer_settings`] plus
/// samsa-tools' failover settings of a transactional producer (see
/// `samsa_tools::pipeline::transactional_producer_settings`).
pub fn transactional_settings(
    client_id: &str,
    transactional_id: &str,
) -> Vec<(&'static str, String)> {
    let mut settings = producer_settings(client_id);
    // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
    settings.retain(|(k, _)| *k != "message.timeout.ms");
    settings.push((
        "transaction.timeout.ms",
        TRANSACTION_TIMEOUT.as_millis().to_string(),
    ));
    settings.extend(samsa_tools::pipeline::transactional_producer_settings(
        transactional_id,
    ));
    settings
}

/// Settings of a group consumer: read_committed, no auto commit.
pub fn group_consumer_settings(client_id: &str, group: &str) -> Vec<(&'static str, String)> {
    let session = SESSION_TIMEOUT.as_millis();
    vec![
        ("client.id", client_id.to_string()),
        ("group.id", group.to_string()),
        ("auto.offset.reset", "earliest".to_string()),
        ("isolation.level", "read_committed".to_string()),
        ("enable.auto.commit", "false".to_string()),
        ("enable.auto.offset.store", "false".to_string()),
        ("session.timeout.ms", session.to_string()),
        ("heartbeat.interval.ms", (session / 3).to_string()),
        ("fetch.wait.max.ms", "100".to_string()),
    ]
}

/// What a delivery report needs to be recorded.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    pub value: String,
    pub topic: String,
    pub partition: i32,
    pub txn: Option<String>,
    /// The record's key (keyed workloads only).
    pub key: Option<String>,
    /// A null value: `value` goes in the [`ID_HEADER`] header instead.
    pub tombstone: bool,
}

/// Producer context: every delivery report becomes an `Ack` or
/// `AckFailed` event; librdkafka's logs go to `tracing`.
pub struct RecordingContext {
    pub recorder: Arc<Recorder>,
    pub workload: Workload,
    pub producer: String,
}

impl ClientContext for RecordingContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ProducerContext for RecordingContext {
    type DeliveryOpaque = Box<Pending>;

    fn delivery(&self, result: &DeliveryResult<'_>, pending: Box<Pending>) {
        let Pending {
            value,
            topic,
            partition,
            txn,
            ..
        } = *pending;
        let kind = match result {
            Ok(msg) => EventKind::Ack {
                workload: self.workload,
                producer: self.producer.clone(),
                value,
                topic,
                partition: msg.partition(),
                offset: msg.offset(),
                txn,
            },
            Err((err, _)) => EventKind::AckFailed {
                workload: self.workload,
                producer: self.producer.clone(),
                value,
                topic,
                partition,
                txn,
                error: err.to_string(),
            },
        };
        self.recorder.record(kind);
    }
}

pub type RecordingProducer = ThreadedProducer<RecordingContext>;

pub fn recording_producer(
    env: &Env,
    workload: Workload,
    name: &str,
    settings: &[(&'static str, String)],
) -> Result<RecordingProducer> {
    Ok(env
        .config(settings)?
        .create_with_context(RecordingContext {
            recorder: Arc::clone(&env.recorder),
            workload,
            producer: name.to_string(),
        })?)
}

/// Records a `Send` and hands the record to the producer, waiting while
/// librdkafka's queue is full. An immediate error is returned (and
/// recorded as a failed delivery: nothing was sent). A tombstone is sent
/// with a null value and its id in the [`ID_HEADER`] header.
pub fn send(
    producer: &RecordingProducer,
    workload: Workload,
    name: &str,
    pending: Pending,
) -> Result<(), KafkaError> {
    producer.context().recorder.record(EventKind::Send {
        workload,
        producer: name.to_string(),
        value: pending.value.clone(),
        topic: pending.topic.clone(),
        partition: pending.partition,
        txn: pending.txn.clone(),
        key: pending.key.clone(),
        tombstone: pending.tombstone,
    });
    let mut pending = Box::new(pending);
    loop {
        let topic = pending.topic.clone();
        let value = pending.value.clone();
        let key = pending.key.clone();
        let partition = pending.partition;
        let tombstone = pending.tombstone;
        let mut record: BaseRecord<'_, [u8], [u8], Box<Pending>> =
            BaseRecord::with_opaque_to(&topic, pending).partition(partition);
        if let Some(key) = &key {
            record = record.key(key.as_bytes());
        }
        record = if tombstone {
            record.headers(OwnedHeaders::new().insert(Header {
                key: ID_HEADER,
                value: Some(value.as_bytes()),
            }))
        } else {
            record.payload(value.as_bytes())
        };
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), record)) => {
                pending = record.delivery_opaque;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((err, record)) => {
                let p = record.delivery_opaque;
                producer.context().recorder.record(EventKind::AckFailed {
                    workload,
                    producer: name.to_string(),
                    value: p.value,
                    topic: p.topic,
                    partition: p.partition,
                    txn: p.txn,
                    error: err.to_string(),
                });
                return Err(err);
            }
        }
    }
}

/// One idempotent producer writing unique values (`<name>-<n>`) round-robin
/// over the partitions of `topic` at `rate` records/s until producing stops,
/// then waiting for its outstanding acknowledgements: the producer of the
/// idempotent and queue workloads and the pipeline's input.
pub fn produce_round_robin(
    env: &Env,
    workload: Workload,
    name: &str,
    topic: &str,
    rate: f64,
) -> Result<()> {
    let producer = recording_producer(env, workload, name, &producer_settings(name))
        .with_context(|| format!("cannot create producer {name}"))?;
    if !env.gate.arrive_and_wait() {
        return Ok(());
    }
    let partitions = u64::try_from(env.partitions.max(1)).unwrap_or(1);
    let mut pacer = Pacer::new(rate);
    let mut n: u64 = 0;
    while pacer.wait(|| env.producing()) {
        let pending = Pending {
            value: format!("{name}-{n}"),
            topic: topic.to_string(),
            partition: i32::try_from(n % partitions).unwrap_or(0),
            ..Pending::default()
        };
        n += 1;
        if let Err(e) = send(&producer, workload, name, pending) {
            tracing::warn!(producer = %name, "send failed: {e}");
        }
        if let Some((code, reason)) = producer.client().fatal_error() {
            tracing::warn!(producer = %name, "fatal producer error {code:?}: {reason}; stopping it");
            break;
        }
    }
    // Every outstanding record is acknowledged or fails by its message timeout.
    if let Err(e) = producer.flush(MESSAGE_TIMEOUT + Duration::from_secs(10)) {
        tracing::warn!(producer = %name, "flush: {e}");
    }
    Ok(())
}

/// Paces one thread at `rate` per second: [`Pacer::wait`] returns when the
/// next operation is due (or at once when behind).
pub struct Pacer {
    start: Instant,
    interval: Duration,
    done: u32,
}

impl Pacer {
    pub fn new(rate: f64) -> Pacer {
        let interval = if rate > 0.0 {
            Duration::from_secs_f64(1.0 / rate)
        } else {
            Duration::from_secs(1)
        };
        Pacer {
            start: Instant::now(),
            interval,
            done: 0,
        }
    }

    /// Waits until the next operation is due, at most until `keep_going`
    /// turns false (checked every 50 ms); false then.
    pub fn wait(&mut self, keep_going: impl Fn() -> bool) -> bool {
        let due = self.start + self.interval * self.done;
        loop {
            if !keep_going() {
                return false;
            }
            let now = Instant::now();
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
        }
        self.done += 1;
        true
    }
}

/// Partitions of a rebalance list, for the history.
pub fn partitions_of(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition {
            topic: e.topic().to_string(),
            partition: e.partition(),
        })
        .collect()
}

/// The consumer's positions (next offset to read) of the assigned
/// partitions that have one.
pub fn positions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
) -> Result<Vec<PartitionOffset>> {
    let tpl = consumer.position()?;
    Ok(tpl
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(PartitionOffset {
                topic: e.topic().to_string(),
                partition: e.partition(),
                offset: o,
            }),
            _ => None,
        })
        .collect())
}

pub fn offsets_list(offsets: &[PartitionOffset]) -> Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for o in offsets {
        tpl.add_partition_offset(&o.topic, o.partition, Offset::Offset(o.offset))?;
    }
    Ok(tpl)
}

/// A unique name for a transaction of `producer`.
pub fn txn_id(producer: &str, n: u64) -> String {
    format!("{producer}-t{n}")
}
