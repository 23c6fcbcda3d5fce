//! Transactions from the outside: librdkafka transactional producers with
//! synchronous sends, assign()-based readers at either isolation level, and
//! where a transactional id's coordinator lives.
//!
//! Everything here is blocking (librdkafka's transactional calls block);
//! call it from plain threads, never from inside an async runtime.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreateTopicsRequest};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::client::{topic_name, KafkaClient};

/// The internal topic that holds transaction coordinator state.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
/// Its partition count unless a test changes `transaction.state.log.num.partitions`.
pub const TRANSACTION_STATE_PARTITIONS: i32 = 50;

/// Java's `String.hashCode` over UTF-16 code units, wrapping.
///
/// Deliberately written again instead of calling the broker's
/// `coordinator::placement`: the tests are an independent oracle for Kafka's
/// placement (this copy caught the broker's sign-bit-clearing `abs`).
pub fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// Kafka's `Utils.abs`: `Math.abs`, except that `Integer.MIN_VALUE` maps
/// to 0. (Not the sign-bit clearing `Utils.toPositive` that partitioners
/// use: for a negative hash the two give different partitions.)
pub fn kafka_abs(n: i32) -> i32 {
    if n == i32::MIN {
        0
    } else {
        n.abs()
    }
}

/// The `__transaction_state` partition that coordinates `transactional_id`:
/// `Utils.abs(id.hashCode()) % partitions`, as Kafka places it.
pub fn transaction_state_partition(transactional_id: &str, partitions: i32) -> i32 {
    kafka_abs(java_string_hash(transactional_id)) % partitions
}

/// Settings of a transactional librdkafka producer. Timeouts stay at
/// librdkafka's defaults derived from `transaction.timeout.ms` (librdkafka
/// refuses a `socket.timeout.ms` above it); backoffs are short so that a
/// coordinator move is found quickly.
pub fn transactional_producer_config(bootstrap: &str, transactional_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("transactional.id", transactional_id)
        .set("linger.ms", "5")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "500")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .set("broker.address.family", "v4");
    if let Ok(contexts) = std::env::var("SAMSA_TEST_RDKAFKA_DEBUG") {
        c.set("debug", contexts);
    }
    c
}

/// A plain producer: no idempotence, no transactions, acks=all.
pub fn plain_producer_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "false")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set("broker.address.family", "v4");
    c
}

/// A delivery report: (partition, offset) or the delivery error.
pub type Delivered = Result<(i32, i64), KafkaError>;

/// Delivery reports by value, and the client's fatal error if it raised one.
#[derive(Default)]
pub struct DeliveryLog {
    reports: Mutex<HashMap<Vec<u8>, Delivered>>,
    pub errors: Mutex<Vec<String>>,
    pub fatal: Mutex<Option<String>>,
}

impl ClientContext for DeliveryLog {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        eprintln!("[rdkafka {level:?} {fac}] {log_message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let msg = format!("{error}: {reason}");
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            *self.fatal.lock().unwrap() = Some(msg.clone());
        }
        self.errors.lock().unwrap().push(msg);
    }
}

impl ProducerContext for DeliveryLog {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let (value, outcome) = match result {
            Ok(m) => (
                m.payload().unwrap_or_default().to_vec(),
                Ok((m.partition(), m.offset())),
            ),
            Err((e, m)) => (m.payload().unwrap_or_default().to_vec(), Err(e.clone())),
        };
        self.reports.lock().unwrap().insert(value, outcome);
    }
}

/// A librdkafka producer (transactional or not) whose sends can be made
/// synchronous: [`TxnProducer::send_sync`] returns only once the broker
/// acknowledged (or refused) the record, so an abort that follows cannot
/// drop it on the client side before it reached the log (seed 000).
pub struct TxnProducer {
    inner: ThreadedProducer<DeliveryLog>,
}

/// Timeout of the blocking transactional calls.
pub const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl TxnProducer {
    pub fn new(config: &ClientConfig) -> TxnProducer {
        TxnProducer {
            inner: config
                .create_with_context(DeliveryLog::default())
                .expect("create rdkafka producer"),
        }
    }

    /// A transactional producer for `transactional_id`, `init_transactions` done.
    pub fn transactional(bootstrap: &str, transactional_id: &str) -> TxnProducer {
        let p = Self::new(&transactional_producer_config(bootstrap, transactional_id));
        p.init()
            .unwrap_or_else(|e| panic!("init_transactions for {transactional_id} failed: {e}"));
        p
    }

    pub fn inner(&self) -> &ThreadedProducer<DeliveryLog> {
        &self.inner
    }

    pub fn init(&self) -> KafkaResult<()> {
        self.inner.init_transactions(TXN_CALL_TIMEOUT)
    }

    pub fn begin(&self) -> KafkaResult<()> {
        self.inner.begin_transaction()
    }

    pub fn commit(&self) -> KafkaResult<()> {
        self.inner.commit_transaction(TXN_CALL_TIMEOUT)
    }

    pub fn abort(&self) -> KafkaResult<()> {
        self.inner.abort_transaction(TXN_CALL_TIMEOUT)
    }

    /// The fatal error librdkafka raised, if any: its own record of it
    /// (`rd_kafka_fatal_error`). The error event cannot be relied on: with
    /// the event API librdkafka 2.12 reports a fatal error with its
    /// underlying code (e.g. `_FENCED`), not `_FATAL`.
    pub fn fatal_error(&self) -> Option<String> {
        if let Some((code, reason)) = self.inner.client().fatal_error() {
            return Some(format!("{code:?}: {reason}"));
        }
        self.inner.context().fatal.lock().unwrap().clone()
    }

    /// Enqueues `value` (unique within the test) and waits for its delivery
    /// report: `Ok((partition, offset))` once acknowledged, the delivery
    /// error otherwise. `Err` also when it cannot even be enqueued.
    pub fn send_sync(&self, topic: &str, partition: Option<i32>, value: &str) -> Delivered {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut rec: BaseRecord<'_, [u8], [u8]> =
                BaseRecord::to(topic).payload(value.as_bytes());
            if let Some(p) = partition {
                rec = rec.partition(p);
            }
            match self.inner.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if Instant::now() < deadline =>
                {
                    // Back-off while the polling thread drains reports.
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e),
            }
        }
        // flush() waits for every outstanding delivery report.
        let flushed = self.inner.flush(Duration::from_secs(120));
        let report = self
            .inner
            .context()
            .reports
            .lock()
            .unwrap()
            .remove(value.as_bytes());
        match (report, flushed) {
            (Some(r), _) => r,
            (None, Err(e)) => Err(e),
            (None, Ok(())) => Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fail)),
        }
    }

    /// [`TxnProducer::send_sync`] that must succeed.
    pub fn send_ok(&self, topic: &str, partition: Option<i32>, value: &str) -> (i32, i64) {
        self.send_sync(topic, partition, value)
            .unwrap_or_else(|e| panic!("send of {value:?} to {topic} failed: {e}"))
    }
}

/// How a transaction that lost its coordinator ended, by what the client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientView {
    /// commit_transaction returned Ok: the transaction must be committed.
    Committed,
    /// The commit failed abortably and abort_transaction returned Ok.
    Aborted,
    /// The producer was unusable; a new one with the same id took over
    /// (its InitProducerId completes or aborts the transaction).
    Unknown,
}

/// Resolves the commit attempt of `p` (which may have failed because its
/// coordinator died) and returns a producer able to run the next
/// transaction, with what the client knows about the outcome.
pub fn resolve_commit(
    p: TxnProducer,
    commit: rdkafka::error::KafkaResult<()>,
    bootstrap: &str,
    id: &str,
) -> (TxnProducer, ClientView) {
    match commit {
        Ok(()) => (p, ClientView::Committed),
        Err(e) if requires_abort(&e) => {
            eprintln!("commit failed abortably: {e}");
            match p.abort() {
                Ok(()) => (p, ClientView::Aborted),
                Err(e) => {
                    eprintln!("abort failed too: {e}; taking over with a new producer");
                    drop(p);
                    (
                        TxnProducer::transactional(bootstrap, id),
                        ClientView::Unknown,
                    )
                }
            }
        }
        Err(e) => {
            eprintln!("commit failed: {e}; taking over with a new producer");
            drop(p);
            (
                TxnProducer::transactional(bootstrap, id),
                ClientView::Unknown,
            )
        }
    }
}

/// The librdkafka error code of a transactional call's error.
pub fn error_code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    e.rdkafka_error_code()
}

/// Whether a transactional call's error is fatal (the producer is unusable).
pub fn is_fatal(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.is_fatal())
}

/// Whether a transactional call's error requires `abort_transaction`.
pub fn requires_abort(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.txn_requires_abort())
}

/// Consumer isolation level: the one `samsa verify` records in its histories.
pub use samsa_verify::history::Isolation;

/// One record a reader saw: (partition, offset, value).
pub type Seen = (i32, i64, String);

/// Reads partitions `0..partitions` of `topic` from the beginning with a
/// librdkafka consumer at `isolation` (assign(), no group) until librdkafka
/// reports the end of every partition — the LSO for read_committed, the
/// high watermark otherwise — and returns what it delivered, sorted by
/// (partition, offset). Control records and (read_committed) aborted
/// records are librdkafka's to hide.
pub fn read_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: Isolation,
) -> Result<Vec<Seen>> {
    let records = crate::pipeline::read_keyed(
        bootstrap,
        topic,
        partitions,
        isolation.as_config(),
        Duration::from_secs(60),
    )?;
    Ok(records
        .into_iter()
        .map(|(p, o, _, v)| (p, o, String::from_utf8_lossy(&v).into_owned()))
        .collect())
}

/// The values of [`read_topic`], in (partition, offset) order.
pub fn read_values(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: Isolation,
) -> Result<Vec<String>> {
    Ok(read_topic(bootstrap, topic, partitions, isolation)?
        .into_iter()
        .map(|(_, _, v)| v)
        .collect())
}

/// How long a transaction's outcome may take to become visible to readers
/// after EndTxn (the coordinator answers before every marker is written).
pub const VISIBLE: Duration = Duration::from_secs(30);

/// Waits until a librdkafka reader at `isolation` sees exactly `expected`
/// (values in (partition, offset) order); panics with the last read.
pub fn wait_values(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: Isolation,
    expected: &[String],
) {
    let mut last = None;
    let ok = crate::wait::try_wait_until(VISIBLE, || {
        match read_values(bootstrap, topic, partitions, isolation) {
            Ok(v) if v == expected => return Some(()),
            Ok(v) => last = Some(Ok(v)),
            Err(e) => last = Some(Err(format!("{e:#}"))),
        }
        None
    });
    assert!(
        ok.is_some(),
        "{topic} ({isolation:?}): expected {expected:?} within {VISIBLE:?}, last read {last:?}"
    );
}

/// Creates `topic` with the broker's default replication factor (-1: on a
/// three-node cluster, 3 with min.insync.replicas 2) and fails unless the
/// broker answers NONE.
pub fn create_topic_default_rf(
    client: &mut KafkaClient,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(-1)])
        .with_timeout_ms(30_000);
    let resp = client.call(&req)?;
    let t = resp
        .topics
        .first()
        .ok_or_else(|| anyhow!("CreateTopics answered no topic"))?;
    if t.error_code != 0 {
        bail!(
            "CreateTopics {topic}: error {} ({:?})",
            t.error_code,
            t.error_message
        );
    }
    Ok(())
}

/// Leader of every partition of `topic` per `client`'s Metadata (`None`
/// if the topic is unknown or a partition has no leader).
pub fn partition_leaders(client: &mut KafkaClient, topic: &str) -> Option<BTreeMap<i32, i32>> {
    let md = client.metadata(Some(&[topic])).ok()?;
    let t = md
        .topics
        .into_iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))?;
    if t.error_code != 0 || t.partitions.is_empty() {
        return None;
    }
    let mut out = BTreeMap::new();
    for p in t.partitions {
        if p.error_code != 0 || p.leader_id.0 < 0 {
            return None;
        }
        out.insert(p.partition_index, p.leader_id.0);
    }
    Some(out)
}

/// The leader of `topic`-`partition` once it serves the partition: node
/// `ask`'s Metadata can name a leader before that broker has applied its
/// leadership (it answers NOT_LEADER_OR_FOLLOWER until then, which clients
/// retry), so this waits until the named leader answers ListOffsets for it.
pub fn serving_leader(
    cluster: &crate::cluster::SamsaCluster,
    ask: i32,
    topic: &str,
    partition: i32,
    timeout: std::time::Duration,
) -> i32 {
    crate::wait::wait_until("a serving leader", timeout, || {
        let leader = *partition_leaders(&mut cluster.client(ask), topic)?.get(&partition)?;
        let answer = cluster
            .client(leader)
            .list_offsets(topic, partition, -1)
            .ok()?;
        (answer.error_code == 0).then_some(leader)
    })
}

/// The broker leading the `__transaction_state` partition of
/// `transactional_id` (per Kafka's placement), from `client`'s Metadata.
pub fn transaction_state_leader(client: &mut KafkaClient, transactional_id: &str) -> Option<i32> {
    let leaders = partition_leaders(client, TRANSACTION_STATE_TOPIC)?;
    let n = i32::try_from(leaders.len()).ok()?;
    leaders
        .get(&transaction_state_partition(transactional_id, n))
        .copied()
}

/// Retries `f` while it answers a retriable coordinator error code (load
/// in progress, not coordinator, not available, concurrent transactions),
/// until `timeout`; returns the last answer's code and value.
pub fn retry_coordinator<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<(i16, T)>,
) -> Result<(i16, T)> {
    use crate::codes::*;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    loop {
        let (code, v) = f().with_context(|| what.to_string())?;
        let retriable = matches!(
            code,
            COORDINATOR_LOAD_IN_PROGRESS
                | COORDINATOR_NOT_AVAILABLE
                | NOT_COORDINATOR
                | CONCURRENT_TRANSACTIONS
        );
        if !retriable || Instant::now() >= deadline {
            return Ok((code, v));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// InitProducerId for transactional id `id` on a fresh start (no current
/// producer), with transaction timeout `timeout_ms`, retried while the
/// coordinator comes up (30 s); panics unless it succeeds. Returns
/// (producer id, epoch).
pub fn init_transactional_id(client: &mut KafkaClient, id: &str, timeout_ms: i32) -> (i64, i16) {
    let (code, resp) = retry_coordinator("InitProducerId", Duration::from_secs(30), || {
        let r = client.init_producer_id_txn(id, timeout_ms, (-1, -1))?;
        Ok((r.error_code, r))
    })
    .unwrap_or_else(|e| panic!("InitProducerId(transactional.id={id}): {e:#}"));
    assert_eq!(
        code, 0,
        "InitProducerId(transactional.id={id}) failed: {resp:?}"
    );
    assert!(
        resp.producer_id.0 >= 0 && resp.producer_epoch >= 0,
        "{resp:?}"
    );
    (resp.producer_id.0, resp.producer_epoch)
}

/// EndTxn v5 (transaction version 2) retried while CONCURRENT_TRANSACTIONS
/// (markers in flight) or the coordinator moves, up to 30 s; returns (error
/// code, (producer id, epoch) answered: what the producer uses next).
pub fn end_txn_v5(
    client: &mut KafkaClient,
    id: &str,
    producer: (i64, i16),
    commit: bool,
) -> (i16, (i64, i16)) {
    retry_coordinator("EndTxn", Duration::from_secs(30), || {
        let r = client.end_txn_at(id, producer, commit, 5)?;
        Ok((r.error_code, (r.producer_id.0, r.producer_epoch)))
    })
    .unwrap_or_else(|e| panic!("EndTxn({id}): {e:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_kafkas() {
        assert_eq!(java_string_hash("hello"), 99_162_322);
        assert_eq!(transaction_state_partition("hello", 50), 22);
        // Negative hash: Math.abs, not sign-bit clearing (which gives 3).
        assert_eq!(java_string_hash("my-txn"), -1_061_187_895);
        assert_eq!(transaction_state_partition("my-txn", 50), 45);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE → 0.
        assert_eq!(transaction_state_partition("polygenelubricants", 50), 0);
    }
}
