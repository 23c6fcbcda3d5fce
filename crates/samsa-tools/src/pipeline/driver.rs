//! Running a pipeline of stage processes from the outside: filling the
//! input topic with keyed records, starting `samsa pipeline stage`
//! processes (children of this process, killed when the driver ends),
//! SIGKILLing and restarting them, watching the output with a
//! read_committed reader, and reading a group's committed offsets.
//!
//! Two users: `samsa demo pipeline` ([`demo`]: two transactional stages,
//! a process of each SIGKILLed half-way, every key exactly once at the end)
//! and `samsa pipeline bench` ([`bench`]: end-to-end records/s of one
//! transactional stage against the plain one, same cluster, same run).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{self, CliContext, ConnectArgs, REQUEST_TIMEOUT};
use crate::consume::{assigning_consumer, IsolationLevel};

use super::{send_blocking, StageProducer, StageProducerContext};

/// One stage of a pipeline: its group reads `input` and writes `output`.
#[derive(Debug, Clone)]
pub struct StageSpec {
    pub name: String,
    pub group: String,
    pub input: String,
    pub output: String,
    pub plain: bool,
}

/// Stage processes started by this process, by (stage, slot). Dropping it
/// SIGKILLs every one still running.
pub struct Supervisor {
    bin: PathBuf,
    connect: ConnectArgs,
    log_dir: PathBuf,
    /// Extra `samsa pipeline stage` arguments for every process.
    extra: Vec<String>,
    running: BTreeMap<(String, u32), (StageSpec, Child)>,
    pub starts: u64,
}

impl Supervisor {
    pub fn new(connect: &ConnectArgs, log_dir: &Path, extra: &[String]) -> Result<Supervisor> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("cannot create {}", log_dir.display()))?;
        Ok(Supervisor {
            bin: std::env::current_exe().context("cannot find the samsa binary")?,
            connect: connect.clone(),
            log_dir: log_dir.to_path_buf(),
            extra: extra.to_vec(),
            running: BTreeMap::new(),
            starts: 0,
        })
    }

    /// Starts slot `slot` of `spec` (its log: `<log-dir>/<stage>-<slot>.log`).
    pub fn start(&mut self, spec: &StageSpec, slot: u32) -> Result<()> {
        let log_path = self.log_dir.join(format!("{}-{slot}.log", spec.name));
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("cannot open {}", log_path.display()))?;
        let mut args = vec![
            "pipeline".to_string(),
            "stage".into(),
            "--input".into(),
            spec.input.clone(),
            "--output".into(),
            spec.output.clone(),
            "--group".into(),
            spec.group.clone(),
            "--stage".into(),
            spec.name.clone(),
            "--slot".into(),
            slot.to_string(),
            "--bootstrap-server".into(),
            self.connect.bootstrap.bootstrap_server.clone(),
        ];
        if spec.plain {
            args.push("--plain".into());
        }
        for p in &self.connect.properties {
            args.push("-X".into());
            args.push(p.clone());
        }
        args.extend(self.extra.iter().cloned());
        let child = Command::new(&self.bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("cannot start {}", self.bin.display()))?;
        self.starts += 1;
        self.running
            .insert((spec.name.clone(), slot), (spec.clone(), child));
        Ok(())
    }

    /// SIGKILLs the process of (stage, slot) and reaps it.
    pub fn kill(&mut self, stage: &str, slot: u32) -> Option<StageSpec> {
        let (spec, mut child) = self.running.remove(&(stage.to_string(), slot))?;
        let _ = child.kill();
        let _ = child.wait();
        Some(spec)
    }

    /// SIGKILLs (stage, slot) and starts it again: the new process fences
    /// the old one's producer and resumes from the committed offsets.
    pub fn kill_and_restart(&mut self, stage: &str, slot: u32) -> Result<()> {
        let spec = self
            .kill(stage, slot)
            .ok_or_else(|| anyhow!("no process {stage}/{slot} is running"))?;
        self.start(&spec, slot)
    }

    /// Restarts every process that exited on its own (a stage exits
    /// non-zero on a fatal error, expecting exactly this); returns them.
    pub fn restart_exited(&mut self) -> Result<Vec<String>> {
        let mut exited = Vec::new();
        for ((stage, slot), (_, child)) in &mut self.running {
            if let Ok(Some(status)) = child.try_wait() {
                exited.push((stage.clone(), *slot, status));
            }
        }
        let mut report = Vec::new();
        for (stage, slot, status) in exited {
            if let Some((spec, _)) = self.running.remove(&(stage.clone(), slot)) {
                report.push(format!("{stage}/{slot} exited with {status}"));
                self.start(&spec, slot)?;
            }
        }
        Ok(report)
    }

    pub fn kill_all(&mut self) {
        for (_, (_, mut child)) in std::mem::take(&mut self.running) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Creates `topic` with the cluster's default replication factor.
pub fn create_topic(
    handle: &tokio::runtime::Handle,
    connect: &ConnectArgs,
    topic: &str,
    partitions: i32,
) -> Result<()> {
    let admin: AdminClient<CliContext> = connect
        .client_config(&[])?
        .create_with_context(CliContext)
        .context("cannot create the admin client")?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1));
    let options = AdminOptions::new()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .operation_timeout(Some(REQUEST_TIMEOUT));
    for r in handle
        .block_on(admin.create_topics([&new], &options))
        .with_context(|| format!("cannot create topic {topic}"))?
    {
        r.map_err(|(t, code)| anyhow!("cannot create topic {t}: {code}"))?;
    }
    Ok(())
}

/// The key of input record `i`: fixed width, so keys sort like numbers.
pub fn key_of(i: u64) -> String {
    format!("k{i:09}")
}

/// Writes `records` records with keys [`key_of`]`(0..records)` and values
/// of `value_size` bytes (the key, then padding) to `topic` with an
/// idempotent acks=all producer; returns once every one is acknowledged.
pub fn fill_input(
    connect: &ConnectArgs,
    topic: &str,
    records: u64,
    value_size: usize,
) -> Result<()> {
    let producer: StageProducer = connect
        .client_config(&[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "10"),
        ])?
        .create_with_context(StageProducerContext::standalone())
        .context("cannot create the producer")?;
    for i in 0..records {
        let key = key_of(i);
        let mut value = key.clone().into_bytes();
        value.resize(value_size.max(value.len()), b'.');
        send_blocking(&producer, topic, Some(key.as_bytes()), &value)
            .with_context(|| format!("cannot produce to {topic}"))?;
    }
    producer
        .flush(Duration::from_secs(300))
        .with_context(|| format!("not every record reached {topic}"))?;
    if let Some((code, reason)) = producer.client().fatal_error() {
        bail!("the producer failed: {code:?}: {reason}");
    }
    let failed = producer.context().delivery_failures();
    if failed > 0 {
        bail!("{failed} records could not be written to {topic}");
    }
    Ok(())
}

/// Partition ids of `topic`.
fn partitions_of(connect: &ConnectArgs, topic: &str) -> Result<Vec<i32>> {
    let consumer = assigning_consumer(connect, IsolationLevel::ReadCommitted, &[])?;
    client::topic_partitions(consumer.client(), topic)
}

/// End offsets a read_committed reader sees (the last stable offsets).
pub fn stable_end_offsets(connect: &ConnectArgs, topic: &str) -> Result<BTreeMap<i32, i64>> {
    let consumer = assigning_consumer(connect, IsolationLevel::ReadCommitted, &[])?;
    let mut ends = BTreeMap::new();
    for p in client::topic_partitions(consumer.client(), topic)? {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, REQUEST_TIMEOUT)
            .with_context(|| format!("cannot read the end offset of {topic}[{p}]"))?;
        ends.insert(p, high);
    }
    Ok(ends)
}

/// The offsets `group` committed for `topic` (stable ones: the lookup
/// waits for pending transactional commits); `-1` where none.
pub fn committed_offsets(
    connect: &ConnectArgs,
    group: &str,
    topic: &str,
) -> Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer<CliContext> = connect
        .client_config(&[
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
        ])?
        .create_with_context(CliContext)
        .context("cannot create the consumer")?;
    let mut tpl = TopicPartitionList::new();
    for p in client::topic_partitions(consumer.client(), topic)? {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, REQUEST_TIMEOUT)
        .with_context(|| format!("cannot fetch the offsets of group {group}"))?;
    Ok(got
        .elements()
        .iter()
        .map(|e| {
            let o = match e.offset() {
                Offset::Offset(o) => o,
                _ => -1,
            };
            (e.partition(), o)
        })
        .collect())
}

/// A read_committed reader of a whole topic from the beginning (assign(),
/// no group) that counts how often it saw each key.
pub struct OutputWatch {
    consumer: BaseConsumer<CliContext>,
    pub by_key: HashMap<Vec<u8>, u32>,
    pub records: u64,
    pub first_at: Option<Instant>,
    pub last_at: Option<Instant>,
    /// Values that do not carry every expected stage tag.
    pub untagged: Vec<String>,
    tags: Vec<Vec<u8>>,
}

impl OutputWatch {
    /// `tags`: byte strings every value must contain (e.g. `|mid/`).
    pub fn new(connect: &ConnectArgs, topic: &str, tags: &[String]) -> Result<OutputWatch> {
        let consumer = assigning_consumer(
            connect,
            IsolationLevel::ReadCommitted,
            &[("fetch.wait.max.ms", "50")],
        )?;
        let mut tpl = TopicPartitionList::new();
        for p in partitions_of(connect, topic)? {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(OutputWatch {
            consumer,
            by_key: HashMap::new(),
            records: 0,
            first_at: None,
            last_at: None,
            untagged: Vec::new(),
            tags: tags.iter().map(|t| t.as_bytes().to_vec()).collect(),
        })
    }

    /// Reads what is there for up to `for_at_most`.
    pub fn poll_for(&mut self, for_at_most: Duration) -> Result<()> {
        let until = Instant::now() + for_at_most;
        while Instant::now() < until {
            match self.consumer.poll(Duration::from_millis(20)) {
                None => return Ok(()),
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                Some(Err(e)) => tracing::warn!("output reader: {e}"),
                Some(Ok(m)) => {
                    let now = Instant::now();
                    self.first_at.get_or_insert(now);
                    self.last_at = Some(now);
                    self.records += 1;
                    let value = m.payload().unwrap_or_default();
                    if !self.tags.iter().all(|t| contains(value, t)) && self.untagged.len() < 20 {
                        self.untagged
                            .push(String::from_utf8_lossy(value).chars().take(80).collect());
                    }
                    *self
                        .by_key
                        .entry(m.key().unwrap_or_default().to_vec())
                        .or_insert(0) += 1;
                }
            }
        }
        Ok(())
    }

    pub fn distinct(&self) -> u64 {
        self.by_key.len() as u64
    }

    /// (keys seen more than once, how many extra copies).
    pub fn duplicates(&self) -> (u64, u64) {
        self.by_key
            .values()
            .filter(|&&n| n > 1)
            .fold((0, 0), |(k, extra), &n| (k + 1, extra + u64::from(n - 1)))
    }

    /// Input keys `0..records` never seen.
    pub fn missing(&self, records: u64) -> u64 {
        (0..records)
            .filter(|&i| !self.by_key.contains_key(key_of(i).as_bytes()))
            .count() as u64
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn unique_suffix() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// samsa demo pipeline
// ---------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Input records (unique keys).
    #[arg(long, default_value_t = 50_000)]
    records: u64,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Processes per stage.
    #[arg(long, default_value_t = 2)]
    processes: u32,
    /// Prefix of the topics and groups the demo creates (a unique suffix is added).
    #[arg(long, default_value = "demo")]
    prefix: String,
    /// Where the stage processes' logs go (default: a new directory under the temp dir).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// How long the demo waits for the pipeline to drain its input.
const DEMO_DEADLINE: Duration = Duration::from_secs(300);

/// input → mid → final through two transactional stages of `processes`
/// processes each; one process of each stage is SIGKILLed (and restarted)
/// when the first output appears. Succeeds when read_committed
/// sees every key exactly once and each group's committed offsets equal
/// its input's end offsets.
pub fn demo(args: &DemoArgs, handle: &tokio::runtime::Handle) -> Result<()> {
    let suffix = unique_suffix();
    let name = |what: &str| format!("{}-pipeline-{what}-{suffix}", args.prefix);
    let (input, mid, output) = (name("input"), name("mid"), name("final"));
    for t in [&input, &mid, &output] {
        create_topic(handle, &args.connect, t, args.partitions)?;
    }
    println!(
        "created topics {input}, {mid}, {output} ({} partitions each)",
        args.partitions
    );
    fill_input(&args.connect, &input, args.records, 0)?;
    println!("wrote {} records with unique keys to {input}", args.records);

    let stages = [
        StageSpec {
            name: "mid".into(),
            group: name("mid-group"),
            input: input.clone(),
            output: mid.clone(),
            plain: false,
        },
        StageSpec {
            name: "final".into(),
            group: name("final-group"),
            input: mid.clone(),
            output: output.clone(),
            plain: false,
        },
    ];
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("samsa-pipeline-demo-{suffix}")));
    let mut sup = Supervisor::new(
        &args.connect,
        &log_dir,
        &["--session-timeout-ms".into(), "6000".into()],
    )?;
    for s in &stages {
        for slot in 0..args.processes {
            sup.start(s, slot)?;
        }
        println!(
            "started {} transactional processes of stage {} (group {}, transactional ids {}-0..)",
            args.processes, s.name, s.group, s.group
        );
    }
    println!("stage logs: {}", log_dir.display());

    let tags = ["|mid/".to_string(), "|final/".to_string()];
    let mut watch = OutputWatch::new(&args.connect, &output, &tags)?;
    let started = Instant::now();
    let mut killed = false;
    while watch.distinct() < args.records {
        if started.elapsed() > DEMO_DEADLINE {
            bail!(
                "the pipeline delivered {} of {} keys within {DEMO_DEADLINE:?} (stage logs in {})",
                watch.distinct(),
                args.records,
                log_dir.display()
            );
        }
        watch.poll_for(Duration::from_millis(200))?;
        for line in sup.restart_exited()? {
            println!("  {line}; restarted");
        }
        // As soon as output shows up, each stage is in the middle of its
        // work (a transaction is open every 100 ms): kill a process of each.
        if !killed && watch.distinct() > 0 {
            killed = true;
            for s in &stages {
                sup.kill_and_restart(&s.name, 0)?;
                println!(
                    "  {} of {} keys through: SIGKILLed {}/0 and started it again \
                     (its open transaction is aborted when the new process fences it)",
                    watch.distinct(),
                    args.records,
                    s.name
                );
            }
        }
    }
    println!(
        "all {} keys reached {output} after {:.1} s",
        args.records,
        started.elapsed().as_secs_f64()
    );

    // Wait for the groups' offsets to reach the end of their inputs (the
    // last offsets-only transactions), then stop the processes.
    for s in &stages {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ends = stable_end_offsets(&args.connect, &s.input)?;
            let committed = committed_offsets(&args.connect, &s.group, &s.input)?;
            if committed == ends {
                println!(
                    "group {} committed offsets {committed:?} = end offsets of {}",
                    s.group, s.input
                );
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "group {}: committed {committed:?}, end offsets of {} {ends:?}",
                    s.group,
                    s.input
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    sup.kill_all();

    // One more read of the whole output, from the beginning.
    let mut fin = OutputWatch::new(&args.connect, &output, &tags)?;
    let ends = stable_end_offsets(&args.connect, &output)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while fin.distinct() < args.records || fin.records < watch.records {
        if Instant::now() > deadline {
            break;
        }
        fin.poll_for(Duration::from_millis(200))?;
    }
    let (dup_keys, extra) = fin.duplicates();
    let missing = fin.missing(args.records);
    let uncommitted: i64 = ends.values().sum();
    println!(
        "read_committed {output}: {} records, {} distinct keys, duplicates {dup_keys} ({extra} extra copies), missing {missing}",
        fin.records,
        fin.distinct()
    );
    println!(
        "the log itself holds {uncommitted} offsets (records of aborted transactions and control records included); \
         {} stage processes were started in all",
        sup.starts
    );
    if !fin.untagged.is_empty() {
        bail!("records without both stage tags: {:?}", fin.untagged);
    }
    if dup_keys != 0 || missing != 0 || fin.records != args.records {
        bail!("not exactly once: {dup_keys} duplicated keys, {missing} missing");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// samsa pipeline bench
// ---------------------------------------------------------------------------

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Records per measurement.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Value size of each input record in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1024)]
    record_size: usize,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 6)]
    partitions: i32,
    /// Stage processes (one consumer group).
    #[arg(long, default_value_t = 2)]
    processes: u32,
    /// Transaction interval of the transactional stage.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    txn_interval_ms: u64,
    /// Measurements of each kind, alternating plain and transactional.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Where the stage processes' logs go (default: a new directory under the temp dir).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// The 1, 5 and 15 minute load averages (the machine may be shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// How long one measurement may take before the bench gives up.
const BENCH_DEADLINE: Duration = Duration::from_secs(600);

pub async fn bench(args: BenchArgs) -> Result<ExitCode> {
    let handle = tokio::runtime::Handle::current();
    client::blocking(move || {
        let suffix = unique_suffix();
        let log_dir = args
            .log_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("samsa-pipeline-bench-{suffix}")));
        let mut results: Vec<(bool, f64, f64)> = Vec::new();
        for round in 0..args.rounds {
            for plain in [true, false] {
                let (steady, total) = measure(&args, &handle, &log_dir, suffix, round, plain)?;
                let kind = if plain { "plain" } else { "transactional" };
                println!(
                    "{kind}: {} records of {} B: {steady:.0} records/s end to end (first to last output record), {total:.0} records/s including start-up; load average {}",
                    args.records,
                    args.record_size,
                    load_average()
                );
                results.push((plain, steady, total));
            }
        }
        let mean = |want_plain: bool, f: fn(&(bool, f64, f64)) -> f64| {
            let v: Vec<f64> = results.iter().filter(|r| r.0 == want_plain).map(f).collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let (plain, txn) = (mean(true, |r| r.1), mean(false, |r| r.1));
        println!(
            "RESULT plain {plain:.0} records/s, transactional {txn:.0} records/s ({:.0}% of plain; {} process(es), {} partitions, transaction every {} ms)",
            100.0 * txn / plain.max(1.0),
            args.processes,
            args.partitions,
            args.txn_interval_ms
        );
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// One measurement: fresh topics, the input filled before the clock
/// starts, `processes` stage processes started, the output read with
/// read_committed until every record arrived. Returns records/s from the
/// first to the last output record, and from the start of the processes.
fn measure(
    args: &BenchArgs,
    handle: &tokio::runtime::Handle,
    log_dir: &Path,
    suffix: u128,
    round: u32,
    plain: bool,
) -> Result<(f64, f64)> {
    let kind = if plain { "plain" } else { "txn" };
    let name = |what: &str| format!("bench-pipeline-{kind}-{round}-{what}-{suffix}");
    let (input, output) = (name("input"), name("output"));
    create_topic(handle, &args.connect, &input, args.partitions)?;
    create_topic(handle, &args.connect, &output, args.partitions)?;
    let fill = Instant::now();
    fill_input(&args.connect, &input, args.records, args.record_size)?;
    eprintln!(
        "[bench] {kind}: input filled ({} records) in {:.1} s",
        args.records,
        fill.elapsed().as_secs_f64()
    );
    let spec = StageSpec {
        name: kind.into(),
        group: name("group"),
        input,
        output: output.clone(),
        plain,
    };
    let mut sup = Supervisor::new(
        &args.connect,
        log_dir,
        &["--txn-interval-ms".into(), args.txn_interval_ms.to_string()],
    )?;
    let mut watch = OutputWatch::new(&args.connect, &output, &[])?;
    let started = Instant::now();
    for slot in 0..args.processes {
        sup.start(&spec, slot)?;
    }
    while watch.records < args.records {
        if started.elapsed() > BENCH_DEADLINE {
            bail!(
                "{kind}: {} of {} records arrived within {BENCH_DEADLINE:?} (logs in {})",
                watch.records,
                args.records,
                log_dir.display()
            );
        }
        watch.poll_for(Duration::from_millis(200))?;
        let exited = sup.restart_exited()?;
        if !exited.is_empty() {
            bail!("{kind}: stage processes exited during the measurement: {exited:?}");
        }
    }
    sup.kill_all();
    let (Some(first), Some(last)) = (watch.first_at, watch.last_at) else {
        bail!("{kind}: no output record arrived");
    };
    let steady = args.records as f64 / last.duration_since(first).as_secs_f64().max(1e-3);
    let total = args.records as f64 / last.duration_since(started).as_secs_f64().max(1e-3);
    Ok((steady, total))
}
