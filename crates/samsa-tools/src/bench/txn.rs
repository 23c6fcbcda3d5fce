//! `samsa bench txn`: what transactions cost a librdkafka producer, measured
//! against idempotent non-transactional producing in the same run.
//!
//! Scenarios, one after another against the same topic, each for
//! `--seconds`:
//!
//! 1. idempotent, not transactional: records are offered as fast as the
//!    local queue takes them, then flushed (the baseline);
//! 2. one transactional producer per `--txn-sizes` entry: begin, send that
//!    many records, flush (what `commit_transaction` would do first: send
//!    at once, wait for acks=all), then `commit_transaction`, timed on its
//!    own: with nothing left to flush it is the EndTxn round trip plus the
//!    client's bookkeeping;
//! 3. `--producers` transactional producers at once (distinct
//!    transactional ids, so spread over coordinator partitions), each
//!    committing `--concurrent-txn-size` records per transaction;
//! 4. the baseline again, so drift within the run shows; each single
//!    producer's throughput is then also given against the mean of both
//!    baselines, since it ran between them.
//!
//! Throughput counts records acknowledged over the wall time of the
//! scenario, commits included. With `--metrics` (the brokers' HTTP
//! listeners) a second table splits each transactional scenario's time on
//! the brokers' side, per transaction: the requests of each type and their
//! time at the broker (and how much of it was spent waiting for fsyncs,
//! replication or the coordinator), the markers' time, the fsyncs, and the
//! brokers' CPU time.
//! Nothing here asserts: it prints tables.

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

use super::broker_metrics::Scrape;
use super::{ensure_topic, payload};
use crate::client::{self, ConnectArgs, REQUEST_TIMEOUT};
use crate::produce::DeliveryTally;

#[derive(Debug, Args)]
pub struct BenchTxnArgs {
    /// Topic to write (created with --partitions if missing).
    #[arg(long, default_value = "samsa-bench-txn")]
    topic: String,
    /// Partitions of the topic if it has to be created [default: 1].
    #[arg(long, value_name = "P")]
    partitions: Option<i32>,
    /// Value size of each record in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    record_size: usize,
    /// How long each scenario runs.
    #[arg(long, value_name = "S", default_value_t = 10)]
    seconds: u64,
    /// Records per transaction of the single transactional producer, one scenario each.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = [10u64, 100, 1000])]
    txn_sizes: Vec<u64>,
    /// Concurrent transactional producers of the last scenario (0 skips it).
    #[arg(long, value_name = "N", default_value_t = 16)]
    producers: usize,
    /// Records per transaction of each concurrent producer.
    #[arg(long, value_name = "N", default_value_t = 10)]
    concurrent_txn_size: u64,
    /// linger.ms of every producer (flush and commit send at once regardless).
    #[arg(long, value_name = "MS", default_value_t = 5)]
    linger_ms: u64,
    /// Prefix of the transactional ids (a run-unique suffix is added).
    #[arg(long, default_value = "samsa-bench-txn")]
    transactional_id_prefix: String,
    /// HTTP listeners (`host:port`) of every broker, whose `/metrics` are
    /// read around each transactional scenario for the broker-side table.
    #[arg(long, value_name = "HOST:PORT,...", value_delimiter = ',')]
    metrics: Vec<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

pub async fn run(args: BenchTxnArgs) -> Result<ExitCode> {
    if args.seconds == 0 || args.txn_sizes.contains(&0) || args.concurrent_txn_size == 0 {
        bail!("--seconds, --txn-sizes and --concurrent-txn-size must be at least 1");
    }
    ensure_topic(&args.connect, &args.topic, args.partitions).await?;
    client::blocking(move || bench_txn(&args)).await
}

impl DeliveryTally {
    /// The records delivered, or an error naming the first failure.
    fn check(&self) -> Result<u64> {
        let failed = self.failed.load(Ordering::Relaxed);
        if failed > 0 {
            let first = self
                .first_error
                .lock()
                .ok()
                .and_then(|f| f.clone())
                .unwrap_or_default();
            bail!("{failed} records failed; first error: {first}");
        }
        Ok(self.delivered.load(Ordering::Relaxed))
    }
}

/// Sends whatever waits in the local queue at once (linger is skipped, as
/// in `commit_transaction`'s own flush) and waits until every record sent
/// so far is acknowledged and its delivery report served.
///
/// `rd_kafka_flush` itself rather than rdkafka's `Producer::flush`: with a
/// `ThreadedProducer`, that one polls the event queue in 100 ms slices
/// while the producer's own thread takes the events, so it returns up to
/// 100 ms after the last acknowledgement — a client artefact that would
/// swamp a commit.
#[allow(unsafe_code)]
fn flush(producer: &ThreadedProducer<DeliveryTally>, timeout: Duration) -> Result<()> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the handle stays valid while `producer` is borrowed, and
    // librdkafka allows rd_kafka_flush from any thread; with the event API
    // (which rdkafka uses) it only waits for the message count to reach 0.
    let err =
        unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), timeout_ms) };
    if err != rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
        bail!(
            "flush: {} records still unacknowledged after {timeout:?} ({err:?})",
            producer.in_flight_count()
        );
    }
    Ok(())
}

/// Microsecond histogram up to an hour.
fn histogram() -> Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|err| anyhow!("cannot create a latency histogram: {err}"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What one scenario measured.
struct Measured {
    records: u64,
    elapsed: Duration,
    transactions: u64,
    /// `commit_transaction` after the flush, per transaction (µs).
    commit_us: Histogram<u64>,
    /// begin → commit returned, per transaction (µs).
    round_us: Histogram<u64>,
    /// The brokers' metrics before and after, with `--metrics`.
    brokers: Option<(Scrape, Scrape)>,
}

impl Measured {
    fn empty() -> Result<Self> {
        Ok(Measured {
            records: 0,
            elapsed: Duration::ZERO,
            transactions: 0,
            commit_us: histogram()?,
            round_us: histogram()?,
            brokers: None,
        })
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct Bench<'a> {
    args: &'a BenchTxnArgs,
    payload: Vec<u8>,
    run_id: u128,
}

/// The requests of one transaction, in the order a transaction-version-1
/// client sends them.
const TXN_APIS: [&str; 3] = ["AddPartitionsToTxn", "Produce", "EndTxn"];

impl Bench<'_> {
    /// Runs `scenario` between two reads of the brokers' metrics (with
    /// `--metrics`).
    fn with_brokers(&self, scenario: impl FnOnce() -> Result<Measured>) -> Result<Measured> {
        if self.args.metrics.is_empty() {
            return scenario();
        }
        let before = Scrape::take(&self.args.metrics)?;
        let mut measured = scenario()?;
        measured.brokers = Some((before, Scrape::take(&self.args.metrics)?));
        Ok(measured)
    }

    fn producer(&self, transactional_id: Option<&str>) -> Result<ThreadedProducer<DeliveryTally>> {
        let linger = self.args.linger_ms.to_string();
        let mut settings: Vec<(&str, &str)> = vec![
            ("acks", "all"),
            ("enable.idempotence", "true"),
            ("linger.ms", &linger),
            ("queue.buffering.max.messages", "1000000"),
            ("queue.buffering.max.kbytes", "65536"),
        ];
        if let Some(id) = transactional_id {
            settings.push(("transactional.id", id));
        }
        let producer: ThreadedProducer<DeliveryTally> = self
            .args
            .connect
            .client_config(&settings)?
            .create_with_context(DeliveryTally::default())
            .context("cannot create the Kafka producer")?;
        if transactional_id.is_some() {
            producer
                .init_transactions(REQUEST_TIMEOUT)
                .context("init_transactions failed")?;
        }
        Ok(producer)
    }

    fn send(&self, producer: &ThreadedProducer<DeliveryTally>) -> Result<()> {
        let mut record =
            BaseRecord::<(), [u8], ()>::to(&self.args.topic).payload(&self.payload[..]);
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err((err, _)) => return Err(anyhow!("cannot enqueue a record: {err}")),
            }
        }
    }

    fn idempotent(&self) -> Result<Measured> {
        let producer = &self.producer(None)?;
        let run_for = Duration::from_secs(self.args.seconds);
        let start = Instant::now();
        let mut sent: u64 = 0;
        while sent & 0x3FF != 0 || start.elapsed() < run_for {
            self.send(producer)?;
            sent += 1;
        }
        flush(producer, REQUEST_TIMEOUT * 4)?;
        let elapsed = start.elapsed();
        Ok(Measured {
            records: producer.context().check()?,
            elapsed,
            ..Measured::empty()?
        })
    }

    /// Transactions of `size` records from `start` for `--seconds`, on a
    /// producer that has run `init_transactions`.
    fn transactions(
        &self,
        producer: &ThreadedProducer<DeliveryTally>,
        size: u64,
        start: Instant,
    ) -> Result<Measured> {
        let mut measured = Measured::empty()?;
        let deadline = start + Duration::from_secs(self.args.seconds);
        while Instant::now() < deadline {
            let begin = Instant::now();
            producer
                .begin_transaction()
                .context("begin_transaction failed")?;
            for _ in 0..size {
                self.send(producer)?;
            }
            flush(producer, REQUEST_TIMEOUT)?;
            let commit = Instant::now();
            producer
                .commit_transaction(REQUEST_TIMEOUT)
                .context("commit_transaction failed")?;
            let done = Instant::now();
            measured
                .commit_us
                .saturating_record(micros(done.duration_since(commit)));
            measured
                .round_us
                .saturating_record(micros(done.duration_since(begin)));
            measured.transactions += 1;
        }
        measured.records = producer.context().check()?;
        measured.elapsed = start.elapsed();
        Ok(measured)
    }

    fn transactional(&self, size: u64) -> Result<Measured> {
        let id = format!(
            "{}-{}-single-{size}",
            self.args.transactional_id_prefix, self.run_id
        );
        let producer = self.producer(Some(&id))?;
        self.transactions(&producer, size, Instant::now())
    }

    /// `--producers` transactional producers at once: they all finish
    /// `init_transactions` before the clock starts.
    fn concurrent(&self) -> Result<Measured> {
        let n = self.args.producers;
        let ready = Barrier::new(n + 1);
        let started = Mutex::new(None::<Instant>);
        let results: Vec<Result<Measured>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (ready, started) = (&ready, &started);
                    scope.spawn(move || -> Result<Measured> {
                        let id = format!(
                            "{}-{}-concurrent-{i}",
                            self.args.transactional_id_prefix, self.run_id
                        );
                        let producer = self.producer(Some(&id));
                        ready.wait();
                        let producer = producer?;
                        let start = started
                            .lock()
                            .map_err(|_| anyhow!("start lock poisoned"))?
                            .ok_or_else(|| anyhow!("no start time"))?;
                        self.transactions(&producer, self.args.concurrent_txn_size, start)
                    })
                })
                .collect();
            if let Ok(mut s) = started.lock() {
                *s = Some(Instant::now());
            }
            // The start time is set before the producers pass the barrier.
            ready.wait();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("producer thread panicked")))
                })
                .collect()
        });
        let mut total = Measured::empty()?;
        for result in results {
            let m = result?;
            total.records += m.records;
            total.transactions += m.transactions;
            total.elapsed = total.elapsed.max(m.elapsed);
            total
                .commit_us
                .add(&m.commit_us)
                .map_err(|e| anyhow!("cannot merge histograms: {e}"))?;
            total
                .round_us
                .add(&m.round_us)
                .map_err(|e| anyhow!("cannot merge histograms: {e}"))?;
        }
        Ok(total)
    }
}

fn bench_txn(args: &BenchTxnArgs) -> Result<ExitCode> {
    let bench = Bench {
        args,
        payload: payload(args.record_size),
        run_id: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
    };
    println!(
        "| scenario | records/s | vs idempotent | MB/s | transactions | commit p50 / p99 / max ms | begin→commit p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    eprintln!("idempotent, not transactional ({} s)", args.seconds);
    let baseline = bench.idempotent()?;
    let base_rate = baseline.rate();
    let row = |name: &str, m: &Measured| {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let rate = m.rate();
        let mb = rate * args.record_size as f64 / (1024.0 * 1024.0);
        let latencies = if m.transactions == 0 {
            ("—".to_string(), "—".to_string())
        } else {
            (
                format!(
                    "{:.2} / {:.2} / {:.2}",
                    ms(&m.commit_us, 0.5),
                    ms(&m.commit_us, 0.99),
                    m.commit_us.max() as f64 / 1000.0
                ),
                format!("{:.2} / {:.2}", ms(&m.round_us, 0.5), ms(&m.round_us, 0.99)),
            )
        };
        println!(
            "| {name} | {rate:.0} | {:.1}% | {mb:.1} | {} | {} | {} |",
            100.0 * rate / base_rate.max(1e-9),
            m.transactions,
            latencies.0,
            latencies.1
        );
    };
    row("idempotent, not transactional", &baseline);
    let mut single = Vec::new();
    let mut broker_side = Vec::new();
    for &size in &args.txn_sizes {
        eprintln!("1 transactional producer, {size} records per transaction");
        let m = bench.with_brokers(|| bench.transactional(size))?;
        let name = format!("1 transactional producer, {size} records/transaction");
        row(&name, &m);
        single.push((size, m.rate()));
        broker_side.push((name, m));
    }
    if args.producers > 0 {
        eprintln!(
            "{} transactional producers, {} records per transaction",
            args.producers, args.concurrent_txn_size
        );
        let m = bench.with_brokers(|| bench.concurrent())?;
        let name = format!(
            "{} transactional producers, {} records/transaction each",
            args.producers, args.concurrent_txn_size
        );
        row(&name, &m);
        broker_side.push((name, m));
    }
    eprintln!("idempotent again");
    let again = bench.idempotent()?;
    row("idempotent, not transactional (again)", &again);
    // The baseline drifts within a run (the second one is often 20-40%
    // lower on a 2-core machine), so the ratio against the mean of both is
    // printed too: the transactional scenarios ran between them.
    let mean_rate = (base_rate + again.rate()) / 2.0;
    println!();
    for (size, rate) in single {
        println!(
            "{size} records/transaction: {:.1}% of the first idempotent run, {:.1}% of the mean of both ({mean_rate:.0} records/s)",
            100.0 * rate / base_rate.max(1e-9),
            100.0 * rate / mean_rate.max(1e-9),
        );
    }
    print_broker_side(&broker_side);
    Ok(ExitCode::SUCCESS)
}

/// The second table: per transaction, means over the scenario.
fn print_broker_side(scenarios: &[(String, Measured)]) {
    if scenarios.iter().all(|(_, m)| m.brokers.is_none()) {
        return;
    }
    println!();
    println!("Broker side, per transaction (means over the scenario, summed over the brokers; \"waiting\" is Kafka's RemoteTime: fsync, replication, the coordinator):");
    println!();
    let api_columns: Vec<String> = TXN_APIS
        .iter()
        .map(|api| format!("{api}: requests, ms (waiting)"))
        .collect();
    println!(
        "| scenario | {} | markers, decided → written ms | fsyncs | ms per fsync | broker CPU ms |",
        api_columns.join(" | ")
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, m) in scenarios {
        let Some((before, after)) = &m.brokers else {
            continue;
        };
        let txns = (m.transactions as f64).max(1.0);
        let ms = |seconds: f64| seconds * 1000.0;
        let apis: Vec<String> = TXN_APIS
            .iter()
            .map(|api| {
                let labels = format!("api=\"{api}\"");
                let (count, total) = after.observations_since(
                    before,
                    "samsa_kafka_request_duration_seconds",
                    &labels,
                );
                let (_, waiting) =
                    after.observations_since(before, "samsa_kafka_request_remote_seconds", &labels);
                format!("{:.2}, {:.2} ({:.2})", count / txns, ms(total), ms(waiting))
            })
            .collect();
        let (_, markers) = after.observations_since(
            before,
            "samsa_transaction_end_duration_seconds",
            "outcome=\"commit\"",
        );
        let (fsyncs, fsync) =
            after.observations_since(before, "samsa_log_flush_duration_seconds", "");
        let cpu = after.since(before, "process_cpu_seconds_total");
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            apis.join(" | "),
            ms(markers),
            fsyncs / txns,
            ms(fsync),
            ms(cpu) / txns
        );
    }
}
