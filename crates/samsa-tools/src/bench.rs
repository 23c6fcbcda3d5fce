//! `samsa bench produce|consume|txn`: load generators in the spirit of
//! kafka-producer-perf-test / kafka-consumer-perf-test, and the transaction
//! benchmark ([`txn`]).
//!
//! The producer keeps many records in flight: the sending thread only enqueues
//! into librdkafka (retrying on a full local queue) while a `ThreadedProducer`
//! thread serves delivery reports. Latency is measured per record from
//! `send()` to its delivery report, so it includes time spent in the local
//! queue, as Kafka's tool does.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{self, CliContext, ConnectArgs, REQUEST_TIMEOUT};
use crate::consume::{assigning_consumer, IsolationLevel};
use crate::produce::Acks;

mod broker_metrics;
mod txn;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Produce N records of a fixed size as fast as possible; report throughput and latency.
    Produce(BenchProduceArgs),
    /// Read a topic from the beginning as fast as possible; report throughput.
    Consume(BenchConsumeArgs),
    /// Transactional producers (10/100/1000 records per transaction, and 16 at
    /// once) against idempotent producing in the same run; commit latency.
    Txn(txn::BenchTxnArgs),
}

#[derive(Debug, Args)]
pub struct BenchProduceArgs {
    /// Topic to write (created with --partitions if missing).
    #[arg(long, default_value = "samsa-bench")]
    topic: String,
    /// Number of records to send.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    records: u64,
    /// Value size of each record in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    record_size: usize,
    /// Partitions of the topic if it has to be created [default: 1].
    #[arg(long, value_name = "P")]
    partitions: Option<i32>,
    /// Acknowledgements to wait for.
    #[arg(long, value_enum, default_value_t = Acks::All)]
    acks: Acks,
    /// Enable the idempotent producer.
    #[arg(long)]
    idempotent: bool,
    /// linger.ms: how long librdkafka waits to fill a batch.
    #[arg(long, value_name = "MS", default_value_t = 5)]
    linger_ms: u64,
    /// batch.size: maximum bytes per batch (default: librdkafka's, 1000000).
    #[arg(long, value_name = "BYTES")]
    batch_size: Option<u64>,
    /// What the record values hold.
    #[arg(long, value_enum, default_value_t = PayloadKind::Same)]
    payload: PayloadKind,
    /// Give records keys, cycling through N distinct ones (`k0` … `kN-1`,
    /// padded to one length): a compacted topic needs them, and N sets how
    /// much the cleaner can drop. Without it records have no key.
    #[arg(long, value_name = "N")]
    keys: Option<u64>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Record values of `samsa bench produce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PayloadKind {
    /// Every record carries the same pseudo-random letters (a batch of them
    /// compresses extremely well: one record, then repeats).
    Same,
    /// Each record is fresh pseudo-random text: words of a fixed
    /// 512-word vocabulary, so a codec finds what it finds in log lines
    /// (roughly 3:1 for gzip and zstd), not repeats of a whole record.
    Text,
}

#[derive(Debug, Args)]
pub struct BenchConsumeArgs {
    /// Topic to read from the beginning.
    #[arg(long, default_value = "samsa-bench")]
    topic: String,
    /// Stop after N records (default: everything up to the end offsets seen at start).
    #[arg(long, value_name = "N")]
    records: Option<u64>,
    /// Isolation level of the fetches.
    #[arg(long, value_enum, default_value_t = IsolationLevel::ReadUncommitted)]
    isolation_level: IsolationLevel,
    /// Give up after this many milliseconds without a record.
    #[arg(long, value_name = "T", default_value_t = 10_000)]
    timeout_ms: u64,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub async fn run(command: BenchCommand) -> Result<ExitCode> {
    match command {
        BenchCommand::Produce(args) => {
            ensure_topic(&args.connect, &args.topic, args.partitions).await?;
            client::blocking(move || bench_produce(&args)).await
        }
        BenchCommand::Consume(args) => client::blocking(move || bench_consume(&args)).await,
        BenchCommand::Txn(args) => txn::run(args).await,
    }
}

/// Creates the topic unless it exists, then waits until every partition has
/// a leader so the first sends don't measure topic creation.
async fn ensure_topic(connect: &ConnectArgs, topic: &str, requested: Option<i32>) -> Result<()> {
    let partitions = requested.unwrap_or(1);
    let admin: AdminClient<CliContext> = connect
        .client_config(&[])?
        .create_with_context(CliContext)
        .context("cannot create the Kafka admin client")?;
    let admin = std::sync::Arc::new(admin);
    let existing = {
        let admin = std::sync::Arc::clone(&admin);
        let topic = topic.to_string();
        client::blocking(move || client::lookup_topic_partitions(admin.inner(), &topic)).await?
    };
    match existing {
        Some(found) => {
            if requested.is_some() && i32::try_from(found.len()).ok() != requested {
                tracing::warn!(
                    "topic {topic} exists with {} partitions; --partitions {partitions} is ignored",
                    found.len()
                );
            }
            return Ok(());
        }
        None => {
            let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
            let options = AdminOptions::new()
                .request_timeout(Some(REQUEST_TIMEOUT))
                .operation_timeout(Some(REQUEST_TIMEOUT));
            let results = admin
                .create_topics([&new], &options)
                .await
                .with_context(|| format!("cannot create topic {topic}"))?;
            for result in results {
                match result {
                    Ok(_) => {}
                    // Lost a race with another creator: fine.
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((name, code)) => bail!("cannot create topic {name}: {code}"),
                }
            }
            eprintln!("created topic {topic} with {partitions} partitions");
        }
    }
    let topic = topic.to_string();
    client::blocking(move || {
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let metadata = admin
                .inner()
                .fetch_metadata(Some(&topic), client::METADATA_TIMEOUT)
                .context("cannot fetch metadata")?;
            let ready = metadata.topics().iter().any(|t| {
                t.name() == topic
                    && t.error().is_none()
                    && !t.partitions().is_empty()
                    && t.partitions().iter().all(|p| p.leader() >= 0)
            });
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("topic {topic} has no leader for every partition after {REQUEST_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
}

/// Per-record latency and delivery counts, fed by the delivery callback.
struct LatencyRecorder {
    start: Instant,
    /// Microseconds from send() to the delivery report.
    latency_us: Mutex<Histogram<u64>>,
    delivered: AtomicU64,
    failed: AtomicU64,
    /// Nanoseconds since `start` of the latest delivery report: the end of the run.
    last_report_ns: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl LatencyRecorder {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

impl ClientContext for LatencyRecorder {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        client::forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client::forward_error(&error, reason);
    }
}

impl ProducerContext for LatencyRecorder {
    /// Send time in nanoseconds since `start`: carried in the opaque pointer
    /// itself, so no allocation per record.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_ns: usize) {
        let now = self.now_ns();
        self.last_report_ns.fetch_max(now, Ordering::Relaxed);
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                let sent = u64::try_from(sent_ns).unwrap_or(0);
                if let Ok(mut hist) = self.latency_us.lock() {
                    hist.saturating_record(now.saturating_sub(sent) / 1_000);
                }
            }
            Err((err, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_error.lock() {
                    first.get_or_insert_with(|| err.to_string());
                }
            }
        }
    }
}

fn bench_produce(args: &BenchProduceArgs) -> Result<ExitCode> {
    if args.records == 0 {
        bail!("--records must be at least 1");
    }
    let linger = args.linger_ms.to_string();
    let batch_size = args.batch_size.map(|b| b.to_string());
    let mut settings: Vec<(&str, &str)> = vec![
        ("acks", args.acks.as_config()),
        ("linger.ms", &linger),
        // A deep local queue keeps the pipeline full; 64 MiB bounds memory and,
        // like Kafka's 32 MiB buffer.memory, bounds the queueing in the latency.
        ("queue.buffering.max.messages", "1000000"),
        ("queue.buffering.max.kbytes", "65536"),
    ];
    if args.idempotent {
        settings.push(("enable.idempotence", "true"));
    }
    if let Some(batch_size) = &batch_size {
        settings.push(("batch.size", batch_size));
    }
    let histogram = Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|err| anyhow!("cannot create the latency histogram: {err}"))?;
    let recorder = LatencyRecorder {
        start: Instant::now(),
        latency_us: Mutex::new(histogram),
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        last_report_ns: AtomicU64::new(0),
        first_error: Mutex::new(None),
    };
    let producer: ThreadedProducer<LatencyRecorder> = args
        .connect
        .client_config(&settings)?
        .create_with_context(recorder)
        .context("cannot create the Kafka producer")?;

    let mut payload = payload(args.record_size);
    let mut text = TextPayload::new();
    let ctx = producer.context();
    let mut progress = Progress::new(ctx.now_ns());
    let key_width = args
        .keys
        .map_or(0, |n| n.saturating_sub(1).to_string().len());
    let mut key = String::new();
    for i in 0..args.records {
        if args.payload == PayloadKind::Text {
            text.fill(&mut payload, args.record_size);
        }
        if let Some(n) = args.keys.filter(|n| *n > 0) {
            key.clear();
            use std::fmt::Write as _;
            let _ = write!(key, "k{:0key_width$}", i % n);
        }
        // Stamped once, before the first attempt: like Kafka's tool, time
        // spent waiting for room in a full queue counts as latency.
        let sent_ns = usize::try_from(ctx.now_ns()).unwrap_or(usize::MAX);
        let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(&args.topic, sent_ns)
            .payload(&payload[..]);
        if args.keys.is_some() {
            record = record.key(key.as_bytes());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The polling thread drains delivery reports; give it a moment.
                    record = back;
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err((err, _)) => return Err(anyhow!("cannot enqueue a record: {err}")),
            }
        }
        progress.maybe_report(ctx, args.record_size);
    }
    producer
        .flush(Timeout::Never)
        .context("flush did not complete")?;

    let delivered = ctx.delivered.load(Ordering::Relaxed);
    let failed = ctx.failed.load(Ordering::Relaxed);
    let secs = ctx.last_report_ns.load(Ordering::Relaxed) as f64 / 1e9;
    let hist = ctx
        .latency_us
        .lock()
        .map_err(|_| anyhow!("latency histogram lock poisoned"))?;
    println!(
        "{}",
        produce_summary(delivered, failed, secs, args.record_size, &hist)
    );
    if let Ok(first) = ctx.first_error.lock() {
        if let Some(err) = first.as_ref() {
            eprintln!("first delivery error: {err}");
        }
    }
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Kafka-perf-test-style one-line summary. MB means MiB, as in Kafka's tool.
fn produce_summary(
    delivered: u64,
    failed: u64,
    secs: f64,
    record_size: usize,
    hist: &Histogram<u64>,
) -> String {
    let secs = secs.max(1e-9);
    let rate = delivered as f64 / secs;
    let mb = rate * record_size as f64 / (1024.0 * 1024.0);
    let ms = |us: u64| us as f64 / 1000.0;
    format!(
        "{delivered} records sent, {failed} failed, {rate:.1} records/sec ({mb:.2} MB/sec), \
         {:.2} ms avg latency, {:.2} ms max latency, {:.2} ms 50th, {:.2} ms 99th, {:.2} ms 99.9th.",
        hist.mean() / 1000.0,
        ms(hist.max()),
        ms(hist.value_at_quantile(0.50)),
        ms(hist.value_at_quantile(0.99)),
        ms(hist.value_at_quantile(0.999)),
    )
}

/// A progress line on stderr every few seconds during long runs.
struct Progress {
    last_ns: u64,
    last_delivered: u64,
    sends: u64,
}

impl Progress {
    const INTERVAL_NS: u64 = 5_000_000_000;

    fn new(now_ns: u64) -> Self {
        Progress {
            last_ns: now_ns,
            last_delivered: 0,
            sends: 0,
        }
    }

    fn maybe_report(&mut self, ctx: &LatencyRecorder, record_size: usize) {
        self.sends += 1;
        // Reading the clock per record would cost more than the check saves.
        if self.sends & 0xFFF != 0 {
            return;
        }
        let now = ctx.now_ns();
        if now.saturating_sub(self.last_ns) < Self::INTERVAL_NS {
            return;
        }
        let delivered = ctx.delivered.load(Ordering::Relaxed);
        let secs = now.saturating_sub(self.last_ns) as f64 / 1e9;
        let rate = delivered.saturating_sub(self.last_delivered) as f64 / secs;
        eprintln!(
            "{} records sent, {delivered} acknowledged, {rate:.1} records/sec ({:.2} MB/sec)",
            self.sends,
            rate * record_size as f64 / (1024.0 * 1024.0)
        );
        self.last_ns = now;
        self.last_delivered = delivered;
    }
}

/// Incompressible-looking printable bytes (a fixed xorshift sequence), so the
/// numbers don't depend on a compressor being lucky.
fn payload(size: usize) -> Vec<u8> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            b'A' + (state % 26) as u8
        })
        .collect()
}

/// Pseudo-random text of a fixed vocabulary ([`PayloadKind::Text`]),
/// deterministic from run to run.
struct TextPayload {
    state: u64,
    words: Vec<Vec<u8>>,
}

impl TextPayload {
    fn new() -> Self {
        let mut generator = TextPayload {
            state: 0x2545_F491_4F6C_DD1D,
            words: Vec::new(),
        };
        generator.words = (0..512)
            .map(|_| {
                let len = 2 + generator.next() % 9;
                (0..len)
                    .map(|_| b'a' + (generator.next() % 26) as u8)
                    .collect()
            })
            .collect();
        generator
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// Replaces `out` with `size` bytes of words separated by spaces.
    fn fill(&mut self, out: &mut Vec<u8>, size: usize) {
        out.clear();
        while out.len() < size {
            let word = (self.next() % self.words.len() as u64) as usize;
            out.extend_from_slice(&self.words[word]);
            out.push(b' ');
        }
        out.truncate(size);
    }
}

fn bench_consume(args: &BenchConsumeArgs) -> Result<ExitCode> {
    let consumer = assigning_consumer(
        &args.connect,
        args.isolation_level,
        &[("enable.partition.eof", "true")],
    )?;
    let partitions = client::topic_partitions(consumer.client(), &args.topic)?;
    // The run ends at the end offsets seen now; anything produced later is
    // not part of the measurement.
    let mut end_offsets = Vec::with_capacity(partitions.len());
    let mut assignment = TopicPartitionList::new();
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(&args.topic, p, client::METADATA_TIMEOUT)
            .with_context(|| format!("cannot read the offsets of partition {p}"))?;
        if high > low {
            end_offsets.push((p, high));
            assignment
                .add_partition_offset(&args.topic, p, Offset::Beginning)
                .context("cannot build the partition assignment")?;
        }
    }
    if end_offsets.is_empty() {
        bail!("topic {} is empty", args.topic);
    }
    let mut pending: Vec<(i32, i64)> = end_offsets;
    let start = Instant::now();
    consumer
        .assign(&assignment)
        .context("cannot assign partitions")?;

    let idle_limit = Duration::from_millis(args.timeout_ms);
    let mut last_record = Instant::now();
    let mut last_record_at = start;
    let mut count: u64 = 0;
    let mut bytes: u64 = 0;
    while !pending.is_empty() && args.records.is_none_or(|n| count < n) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {
                if last_record.elapsed() >= idle_limit {
                    tracing::warn!(
                        "no record for {idle_limit:?}; stopping with partitions {:?} unfinished",
                        pending.iter().map(|(p, _)| p).collect::<Vec<_>>()
                    );
                    break;
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => pending.retain(|(q, _)| *q != p),
            Some(Err(err)) => tracing::warn!("consume error: {err}"),
            Some(Ok(message)) => {
                last_record = Instant::now();
                last_record_at = last_record;
                count += 1;
                bytes += (message.payload_len() + message.key().map_or(0, <[u8]>::len)) as u64;
                let (p, offset) = (message.partition(), message.offset());
                // Control records (transaction markers) are never delivered, so
                // the last data record may sit below end-1: EOF covers that case.
                pending.retain(|&(q, end)| !(q == p && offset + 1 >= end));
            }
        }
    }
    let secs = last_record_at.duration_since(start).as_secs_f64().max(1e-9);
    let mb = bytes as f64 / (1024.0 * 1024.0);
    println!(
        "{count} records consumed, {mb:.2} MB in {secs:.2} s, {:.1} records/sec ({:.2} MB/sec)",
        count as f64 / secs,
        mb / secs
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_sized_and_printable() {
        let p = payload(1024);
        assert_eq!(p.len(), 1024);
        assert!(p.iter().all(u8::is_ascii_uppercase));
        assert_eq!(p, payload(1024));
    }

    #[test]
    fn text_payload_is_sized_fresh_and_compressible_words() {
        let mut text = TextPayload::new();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        text.fill(&mut a, 1024);
        text.fill(&mut b, 1024);
        assert_eq!((a.len(), b.len()), (1024, 1024));
        assert_ne!(a, b);
        assert!(a.iter().all(|c| c.is_ascii_lowercase() || *c == b' '));
        let mut again = Vec::new();
        TextPayload::new().fill(&mut again, 1024);
        assert_eq!(again, a, "deterministic");
    }

    #[test]
    fn summary_line() {
        let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for us in 1..=1000 {
            hist.record(us).unwrap();
        }
        let line = produce_summary(1000, 0, 2.0, 1024, &hist);
        assert!(
            line.starts_with("1000 records sent, 0 failed, 500.0 records/sec (0.49 MB/sec)"),
            "{line}"
        );
        assert!(line.contains("ms 50th"), "{line}");
        assert!(line.contains("ms 99.9th."), "{line}");
    }
}
