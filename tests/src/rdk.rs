//! librdkafka (through the `rdkafka` crate) wired to the exactly-once checker.
//! Everything here is blocking; call it from plain threads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::checker::SharedChecker;

/// Producer settings every idempotent test uses: acks=all, idempotence on,
/// generous timeouts so that a broker restart leads to retries, not failures.
pub fn idempotent_producer_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "120000")
        .set("request.timeout.ms", "30000")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "500")
        .set("reconnect.backoff.ms", "20")
        .set("reconnect.backoff.max.ms", "200")
        .set("queue.buffering.max.messages", "20000")
        .set("broker.address.family", "v4");
    with_debug_from_env(&mut c);
    c
}

/// `SAMSA_TEST_RDKAFKA_DEBUG=eos,msg,…` turns on librdkafka's debug contexts
/// for the producers the tests create; the lines go to stderr (see
/// [`CheckingContext`]'s `log`), which nextest shows for a failed test.
fn with_debug_from_env(c: &mut ClientConfig) {
    if let Ok(contexts) = std::env::var("SAMSA_TEST_RDKAFKA_DEBUG") {
        // The crate passes on only what its log level lets through.
        c.set("debug", contexts)
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    }
}

/// `config` with librdkafka's `eos` debug context on (unless
/// `SAMSA_TEST_RDKAFKA_DEBUG` chose others): a few lines per producer-id
/// change, drain, epoch bump or sequence error, the client's side of any
/// duplicate a fault test finds. They go to stderr, which nextest shows
/// only for a failed test.
pub fn with_eos_debug(mut config: ClientConfig) -> ClientConfig {
    if std::env::var_os("SAMSA_TEST_RDKAFKA_DEBUG").is_none() {
        config
            .set("debug", "eos")
            .set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    }
    config
}

/// Consumer settings for assign()-based reading: no subscription, no
/// commits. librdkafka's `rd_kafka_assign` needs a `group.id` (it fails with
/// "Unknown group" without one), so a unique, never-joined group is set.
/// `offset` for partition 0 of `topic`: the offsets a one-partition test
/// commits (`send_offsets_to_transaction`, `commit`).
pub fn partition_zero_at(topic: &str, offset: i64) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .expect("a valid offset for partition 0");
    tpl
}

pub fn assign_consumer_config(bootstrap: &str) -> ClientConfig {
    use std::sync::atomic::AtomicU32;
    static N: AtomicU32 = AtomicU32::new(0);
    let group = format!(
        "samsa-tests-assign-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("broker.address.family", "v4");
    c
}

/// Producer context that feeds acknowledgements and failures to a checker
/// and remembers client errors (a fatal idempotence error fails the test).
/// It also records, per partition, every pause of more than
/// [`ACK_GAP_MIN`] between two acknowledgements ([`AckGap`]): how long a
/// fault kept a partition from taking writes, as the client saw it.
pub struct CheckingContext {
    pub checker: SharedChecker,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
    pub errors: Mutex<Vec<String>>,
    pub fatal: Mutex<Option<String>>,
    last_ack: Mutex<BTreeMap<i32, Instant>>,
    pub gaps: Mutex<Vec<AckGap>>,
}

/// Pauses between acknowledgements shorter than this are not recorded.
pub const ACK_GAP_MIN: Duration = Duration::from_millis(50);

/// A pause between two consecutive acknowledgements of one partition.
#[derive(Debug, Clone, Copy)]
pub struct AckGap {
    pub partition: i32,
    /// The acknowledgement before the pause.
    pub from: Instant,
    /// The first acknowledgement after it.
    pub to: Instant,
}

impl AckGap {
    pub fn length(&self) -> Duration {
        self.to - self.from
    }
}

impl CheckingContext {
    /// When `partition`'s last acknowledgement arrived.
    pub fn last_ack(&self, partition: i32) -> Option<Instant> {
        self.last_ack.lock().unwrap().get(&partition).copied()
    }

    /// The longest pause between acknowledgements of one partition that
    /// overlaps `[from, to]` (zero if there was none longer than
    /// [`ACK_GAP_MIN`]), with its partition.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Option<AckGap> {
        self.gaps
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.to >= from && g.from <= to)
            .max_by_key(|g| g.length())
            .copied()
    }
}

impl CheckingContext {
    pub fn new(checker: SharedChecker) -> Self {
        CheckingContext {
            checker,
            acked: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            errors: Mutex::new(Vec::new()),
            fatal: Mutex::new(None),
            last_ack: Mutex::new(BTreeMap::new()),
            gaps: Mutex::new(Vec::new()),
        }
    }
}

impl ClientContext for CheckingContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!(
            "[rdkafka {}.{:03} {level:?} {fac}] {log_message}",
            since_epoch.as_secs(),
            since_epoch.subsec_millis()
        );
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let msg = format!("{error}: {reason}");
        if matches!(error.rdkafka_error_code(), Some(RDKafkaErrorCode::Fatal)) {
            *self.fatal.lock().unwrap() = Some(msg.clone());
        }
        self.errors.lock().unwrap().push(msg);
    }
}

impl ProducerContext for CheckingContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                let v = m.payload().unwrap_or_default();
                self.checker
                    .lock()
                    .unwrap()
                    .ack(v, m.partition(), m.offset());
                self.acked.fetch_add(1, Ordering::Relaxed);
                let now = Instant::now();
                let previous = self.last_ack.lock().unwrap().insert(m.partition(), now);
                if let Some(from) = previous.filter(|t| now - *t > ACK_GAP_MIN) {
                    self.gaps.lock().unwrap().push(AckGap {
                        partition: m.partition(),
                        from,
                        to: now,
                    });
                }
            }
            Err((e, m)) => {
                let v = m.payload().unwrap_or_default();
                self.checker.lock().unwrap().fail(v, e.to_string());
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

pub type CheckingProducer = ThreadedProducer<CheckingContext>;

/// A producer whose deliveries go to `checker`.
pub fn checking_producer(config: &ClientConfig, checker: SharedChecker) -> CheckingProducer {
    config
        .create_with_context(CheckingContext::new(checker))
        .expect("create rdkafka producer")
}

/// Records the send in the checker and enqueues it, waiting (polling) while
/// the local queue is full. `partition: None` lets librdkafka choose.
pub fn send_checked(
    producer: &CheckingProducer,
    producer_name: &str,
    topic: &str,
    partition: Option<i32>,
    value: &[u8],
) -> Result<()> {
    producer
        .context()
        .checker
        .lock()
        .unwrap()
        .send(producer_name, value);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let mut rec: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(value);
        if let Some(p) = partition {
            rec = rec.partition(p);
        }
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                if Instant::now() > deadline {
                    bail!("producer queue stayed full for 180 s");
                }
                // ThreadedProducer polls on its own thread; give it a moment
                // to drain deliveries (back-off, not synchronisation).
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((e, _)) => bail!("produce failed: {e}"),
        }
        if let Some(f) = producer.context().fatal.lock().unwrap().clone() {
            bail!("producer hit a fatal error: {f}");
        }
    }
}

/// Reads partitions `0..partitions` of `topic` from the beginning with
/// assign() until each partition's position reaches the high watermark seen
/// at the start (queried from the broker); every record goes to `sink`.
/// Returns the number of records read.
pub fn consume_to_end(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    timeout: Duration,
    mut sink: impl FnMut(i32, i64, &[u8]),
) -> Result<u64> {
    let consumer: BaseConsumer = assign_consumer_config(bootstrap).create()?;
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (_low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(30))?;
        ends.insert(p, high);
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut next: BTreeMap<i32, i64> = (0..partitions).map(|p| (p, 0)).collect();
    let done = |next: &BTreeMap<i32, i64>| {
        ends.iter()
            .all(|(p, e)| next.get(p).copied().unwrap_or(0) >= *e)
    };
    let mut n = 0u64;
    while !done(&next) {
        if Instant::now() > deadline {
            return Err(anyhow!(
                "consuming {topic} timed out: positions {next:?}, targets {ends:?}"
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(e)) => bail!("consumer error: {e}"),
            Some(Ok(m)) => {
                sink(m.partition(), m.offset(), m.payload().unwrap_or_default());
                n += 1;
                let e = next.entry(m.partition()).or_insert(0);
                *e = (*e).max(m.offset() + 1);
            }
        }
    }
    Ok(n)
}

/// Creates a topic through librdkafka's admin API and waits for the result.
pub fn create_topic_admin(bootstrap: &str, topic: &str, partitions: i32) -> Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in res {
        if let Err((t, e)) = r {
            bail!("create topic {t}: {e}");
        }
    }
    Ok(())
}

/// Shared counters of a producer, for progress checks from another thread.
pub fn acked_count(p: &Arc<CheckingProducer>) -> u64 {
    p.context().acked.load(Ordering::Relaxed)
}

/// What went wrong for a client: librdkafka's client-level errors (its
/// error callback) and, for a producer, its failed deliveries.
#[derive(Clone, Default)]
pub struct ClientErrors(Arc<Mutex<Vec<(KafkaError, String)>>>);

impl ClientContext for ClientErrors {
    fn error(&self, error: KafkaError, reason: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((error, reason.to_owned()));
    }
}

impl ProducerContext for ClientErrors {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((error, _)) = result {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((error.clone(), DELIVERY.to_owned()));
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ClientErrors {}

/// The reason recorded beside a failed delivery.
const DELIVERY: &str = "delivery";

impl ClientErrors {
    /// The errors of failed deliveries, in order.
    pub fn delivery_failures(&self) -> Vec<KafkaError> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, reason)| reason == DELIVERY)
            .map(|(e, _)| e.clone())
            .collect()
    }

    /// Everything recorded, in order.
    pub fn all(&self) -> Vec<(KafkaError, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The reason of the first authentication failure reported.
    pub fn authentication_failure(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(e, _)| matches!(e, KafkaError::Global(RDKafkaErrorCode::Authentication)))
            .map(|(_, reason)| reason.clone())
    }
}

/// The reason librdkafka reports for refusing the authentication of a
/// client of `config` (which must be refused: its metadata request fails).
pub fn authentication_refusal(config: &ClientConfig) -> String {
    let errors = ClientErrors::default();
    let consumer: BaseConsumer<ClientErrors> = config
        .create_with_context(errors.clone())
        .expect("a consumer");
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(5));
    assert!(
        metadata.is_err(),
        "metadata answered without authentication: {config:?}"
    );
    // A consumer's error callback is served by its poll.
    crate::wait::try_wait_until(Duration::from_secs(20), || {
        let _ = consumer.poll(Duration::from_millis(100));
        errors.authentication_failure()
    })
    .unwrap_or_else(|| {
        panic!(
            "librdkafka reported no authentication failure; its errors: {:?}",
            errors.all()
        )
    })
}
