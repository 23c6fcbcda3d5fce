//! The consumer-group demos: consume-transform-produce with the input
//! offsets committed inside the output transaction (seed experiment 2),
//! a zombie member fenced after a rebalance, and the lag of a
//! read_committed consumer at the end of a transactional topic.
//!
//! `eos-attempt` is one consume-transform-produce transaction in its own
//! process: the `sigkill` and `zombie` demos (and the integration tests)
//! start it as a child so that it can be SIGKILLed or SIGSTOPped for real.
//! It prints one marker line per step on stdout (`PRODUCED`,
//! `READY-TO-COMMIT`, `COMMITTED`, `SEND-OFFSETS-FAILED`, `COMMIT-FAILED`)
//! for its parent to wait on.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::{check, Demo, VISIBLE};
use crate::client::{self, CliContext, ConnectArgs, REQUEST_TIMEOUT};
use crate::consume::{assigning_consumer, IsolationLevel};

/// The shortest session Kafka allows (`group.min.session.timeout.ms`): a
/// stopped member is out of the group six seconds after its last heartbeat.
const SESSION_TIMEOUT_MS: &str = "6000";
/// How long a step of an attempt (joining the group, reading its records)
/// may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Where `eos-attempt --wait-at` stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "kebab-case")]
pub enum WaitAt {
    /// After the outputs are acknowledged, before the offsets are sent.
    Produced,
    /// After the offsets joined the transaction, before the commit.
    ReadyToCommit,
}

impl WaitAt {
    fn flag(self) -> &'static str {
        match self {
            WaitAt::Produced => "produced",
            WaitAt::ReadyToCommit => "ready-to-commit",
        }
    }
}

#[derive(Debug, Args)]
pub struct EosAttemptArgs {
    /// Topic to consume (through the consumer group).
    #[arg(long)]
    input: String,
    /// Topic to write the processed records to (same partition as the input record).
    #[arg(long)]
    output: String,
    /// Consumer group (`group.id`).
    #[arg(long)]
    group: String,
    /// `transactional.id` of the producer.
    #[arg(long)]
    transactional_id: String,
    /// Label written into every output value.
    #[arg(long, default_value = "attempt")]
    name: String,
    /// Number of input records the one transaction processes.
    #[arg(long, default_value_t = 10)]
    records: usize,
    /// Print the step's marker and wait for a line on stdin before going on
    /// (EOF instead: exit without committing).
    #[arg(long, value_enum)]
    wait_at: Option<WaitAt>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// One input record as consumed.
struct Input {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    value: String,
}

/// `samsa demo eos-attempt`: init_transactions, join the group, consume
/// `--records` records, produce one output per record synchronously in a
/// transaction, send the consumed offsets to it, commit. Exit code 0 when
/// committed, 2 when the broker refused the offsets or the commit.
pub fn eos_attempt(args: &EosAttemptArgs) -> Result<ExitCode> {
    let who = format!("[attempt {} txn={}]", args.name, args.transactional_id);
    // First fence any earlier instance with this transactional.id (its open
    // transaction is aborted), then join: the group's offsets are then no
    // longer pending on the earlier instance's transaction.
    let producer: FutureProducer<CliContext> = args
        .connect
        .client_config(&[
            ("transactional.id", &args.transactional_id),
            ("linger.ms", "5"),
        ])?
        .create_with_context(CliContext)
        .context("cannot create the producer")?;
    producer
        .init_transactions(REQUEST_TIMEOUT)
        .context("init_transactions")?;
    println!("{who} init_transactions done");

    let consumer: BaseConsumer<CliContext> = args
        .connect
        .client_config(&[
            ("group.id", &args.group),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
            ("session.timeout.ms", SESSION_TIMEOUT_MS),
            ("heartbeat.interval.ms", "500"),
            ("fetch.wait.max.ms", "100"),
        ])?
        .create_with_context(CliContext)
        .context("cannot create the consumer")?;
    consumer.subscribe(&[&args.input])?;

    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut inputs = Vec::new();
    while inputs.len() < args.records {
        if Instant::now() > deadline {
            bail!(
                "{who} consumed {} of {} records of {} within {STEP_TIMEOUT:?}",
                inputs.len(),
                args.records,
                args.input
            );
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => tracing::warn!("{who} consumer: {e}"),
            Some(Ok(m)) => inputs.push(Input {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            }),
        }
    }
    // The generation that handed out these records: what the offsets are
    // committed under, even if the group moves on meanwhile.
    let group_metadata = consumer
        .group_metadata()
        .ok_or_else(|| anyhow!("{who} the consumer has no group metadata"))?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for r in &inputs {
        let e = next.entry(r.partition).or_insert(0);
        *e = (*e).max(r.offset + 1);
    }
    println!(
        "{who} consumed from {}: {} records (next offsets {next:?})",
        args.input,
        inputs.len()
    );

    producer.begin_transaction()?;
    let handle = tokio::runtime::Handle::current();
    for r in &inputs {
        let value = format!("{} processed by {}", r.value, args.name);
        let mut record: FutureRecord<'_, [u8], str> = FutureRecord::to(&args.output)
            .partition(r.partition)
            .payload(&value);
        if let Some(k) = &r.key {
            record = record.key(k.as_slice());
        }
        handle
            .block_on(producer.send(record, REQUEST_TIMEOUT))
            .map_err(|(e, _)| anyhow!("{who} send to {}: {e}", args.output))?;
    }
    println!(
        "{who} processed and wrote to {}: {} records (physically in the log, transaction still open, input offsets not committed)",
        args.output,
        inputs.len()
    );
    if args.wait_at == Some(WaitAt::Produced) {
        println!("PRODUCED n={}", inputs.len());
        wait_for_go_ahead(&who)?;
    }

    let mut offsets = TopicPartitionList::new();
    for (p, o) in &next {
        offsets.add_partition_offset(&args.input, *p, Offset::Offset(*o))?;
    }
    if let Err(e) = producer.send_offsets_to_transaction(&offsets, &group_metadata, REQUEST_TIMEOUT)
    {
        println!(
            "SEND-OFFSETS-FAILED code={:?} error={e}",
            e.rdkafka_error_code()
        );
        abort_after_failure(&producer, &who);
        return Ok(ExitCode::from(2));
    }
    println!("READY-TO-COMMIT n={}", inputs.len());
    if args.wait_at == Some(WaitAt::ReadyToCommit) {
        wait_for_go_ahead(&who)?;
    }
    if let Err(e) = producer.commit_transaction(REQUEST_TIMEOUT) {
        println!("COMMIT-FAILED code={:?} error={e}", e.rdkafka_error_code());
        abort_after_failure(&producer, &who);
        return Ok(ExitCode::from(2));
    }
    println!("COMMITTED n={} offsets={next:?}", inputs.len());
    Ok(ExitCode::SUCCESS)
}

fn wait_for_go_ahead(who: &str) -> Result<()> {
    std::io::stdout().flush()?;
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line)? == 0 {
        bail!("{who} stdin closed before the go-ahead: exiting without committing");
    }
    Ok(())
}

fn abort_after_failure(producer: &FutureProducer<CliContext>, who: &str) {
    match producer.abort_transaction(REQUEST_TIMEOUT) {
        Ok(()) => println!("ABORTED"),
        Err(e) => println!("{who} abort_transaction failed too: {e}"),
    }
}

/// An `eos-attempt` child of a demo, its stdout read on a thread.
struct AttemptChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Demo {
    /// Starts `samsa demo eos-attempt` (this binary) against the demo's broker.
    fn spawn_attempt(
        &self,
        name: &str,
        [input, output, group, transactional_id]: [&str; 4],
        wait_at: Option<WaitAt>,
    ) -> Result<AttemptChild> {
        let exe = std::env::current_exe().context("cannot find the samsa binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(["demo", "eos-attempt", "--bootstrap-server"])
            .arg(&self.connect.bootstrap.bootstrap_server);
        for p in &self.connect.properties {
            cmd.arg("-X").arg(p);
        }
        cmd.args(["--input", input, "--output", output, "--group", group])
            .args(["--transactional-id", transactional_id, "--name", name]);
        if let Some(w) = wait_at {
            cmd.args(["--wait-at", w.flag()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start the attempt")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                println!("    | {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(AttemptChild {
            child,
            stdin,
            lines,
        })
    }

    /// The group's committed offset of partition 0 of `topic` (`None`:
    /// nothing committed). Read without require_stable, so a pending
    /// transactional commit shows as what is committed, not as an error.
    fn group_offset(&self, group: &str, topic: &str) -> Result<Option<i64>> {
        let consumer = assigning_consumer(
            &self.connect,
            IsolationLevel::ReadUncommitted,
            &[("group.id", group)],
        )?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, 0);
        let committed = consumer.committed_offsets(tpl, REQUEST_TIMEOUT)?;
        match committed.find_partition(topic, 0).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Ok(Some(o)),
            _ => Ok(None),
        }
    }

    /// Waits until the group's committed offset is `expected` (offsets
    /// committed in a transaction appear when its marker is written).
    fn wait_group_offset(&self, group: &str, topic: &str, expected: Option<i64>) -> Result<()> {
        let deadline = Instant::now() + VISIBLE;
        loop {
            let got = self.group_offset(group, topic)?;
            if got == expected {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("committed offset of group {group}: expected {expected:?}, got {got:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Input topic with `n` plain records `input-i` (keys `key-i`), an
    /// empty output topic, a group and a transactional id, all fresh.
    fn pipeline(&self, what: &str, n: usize) -> Result<[String; 4]> {
        let names = [
            self.name(&format!("{what}-input")),
            self.name(&format!("{what}-output")),
            self.name(&format!("{what}-group")),
            self.name(&format!("{what}-txn")),
        ];
        self.create_topic(&names[0], 1)?;
        self.create_topic(&names[1], 1)?;
        let plain = self.plain()?;
        for i in 0..n {
            let value = format!("input-{i}");
            let key = format!("key-{i}");
            let record: FutureRecord<'_, str, str> = FutureRecord::to(&names[0])
                .partition(0)
                .key(key.as_str())
                .payload(value.as_str());
            self.handle
                .block_on(plain.send(record, REQUEST_TIMEOUT))
                .map_err(|(e, _)| anyhow!("send to {}: {e}", names[0]))?;
        }
        println!("wrote {n} input records to {}", names[0]);
        Ok(names)
    }

    /// Prints and checks what the output and the group show.
    fn verify_pipeline(
        &self,
        [input, output, group, _]: [&str; 4],
        committed: usize,
        uncommitted: usize,
        group_offset: Option<i64>,
    ) -> Result<Vec<String>> {
        self.wait_group_offset(group, input, group_offset)?;
        let rc = self.values(output, IsolationLevel::ReadCommitted)?;
        let ru = self.values(output, IsolationLevel::ReadUncommitted)?;
        let shown = group_offset.map_or("none".to_string(), |o| o.to_string());
        println!(
            "  output read_committed={} read_uncommitted={} (physically), group committed offset={shown}",
            rc.len(),
            ru.len()
        );
        check("output read_committed count", rc.len(), committed)?;
        check("output read_uncommitted count", ru.len(), uncommitted)?;
        Ok(rc)
    }
}

impl AttemptChild {
    /// Reads the child's stdout until a line starts with `marker`.
    fn wait_for(&self, marker: &str) -> Result<String> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(marker) => return Ok(line),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("the attempt printed no {marker} within {STEP_TIMEOUT:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("the attempt exited before printing {marker}")
                }
            }
        }
    }

    /// Waits for the child to exit; collects the lines it printed meanwhile.
    fn wait_exit(&mut self) -> Result<(ExitStatus, Vec<String>)> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            if let Some(status) = self.child.try_wait()? {
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    seen.push(line);
                }
                return Ok((status, seen));
            }
            if Instant::now() > deadline {
                bail!("the attempt did not finish within {STEP_TIMEOUT:?}");
            }
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(50)) {
                seen.push(line);
            }
        }
    }

    fn go_on(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("stdin closed"))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id())?);
        nix::sys::signal::kill(pid, signal).with_context(|| format!("kill({signal})"))
    }
}

impl Drop for AttemptChild {
    fn drop(&mut self) {
        let _ = self.signal(nix::sys::signal::Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seed experiment 2: attempt A is SIGKILLed between produce and commit;
/// attempt B with the same transactional.id and group redoes the work.
pub(super) fn sigkill(d: &Demo) -> Result<()> {
    let names = d.pipeline("eos", 10)?;
    let [input, output, group, txn] = names.each_ref().map(String::as_str);
    println!(
        "attempt A: consumes {input} in group {group}, writes 10 outputs synchronously in a transaction with the offsets, is SIGKILLed before committing"
    );
    let mut a = d.spawn_attempt(
        "A",
        [input, output, group, txn],
        Some(WaitAt::ReadyToCommit),
    )?;
    a.wait_for("READY-TO-COMMIT")?;
    println!("--- READY-TO-COMMIT seen: SIGKILL attempt A (before commit) ---");
    a.child.kill().context("SIGKILL attempt A")?;
    let status = a.child.wait()?;
    {
        use std::os::unix::process::ExitStatusExt;
        println!("--- attempt A ended by {status} (a real crash, not an exit) ---");
        check("signal that ended attempt A", status.signal(), Some(9))?;
    }
    println!("verify before the retry:");
    d.verify_pipeline([input, output, group, txn], 0, 10, None)?;
    println!("  OK: no partial state (the outputs are in the log, invisible; the offsets were not advanced)");

    println!("attempt B: same transactional.id (fences A's hanging transaction), same group (re-reads the same 10)");
    let mut b = d.spawn_attempt("B", [input, output, group, txn], None)?;
    let (status, _) = b.wait_exit()?;
    if !status.success() {
        bail!("attempt B failed: {status}");
    }
    println!("verify after the retry:");
    let seen = d.verify_pipeline([input, output, group, txn], 10, 20, Some(10))?;
    let expected: Vec<String> = (0..10)
        .map(|i| format!("input-{i} processed by B"))
        .collect();
    check("output read_committed", seen, expected)?;
    println!("  OK: every input exactly once in the output, the group offset moved with it");
    Ok(())
}

/// A member is stopped (SIGSTOP) after writing its outputs, past its
/// session timeout; another member takes the partition and commits. When
/// the first one continues, its offsets are refused (its generation is
/// gone) and its outputs are aborted.
pub(super) fn zombie(d: &Demo) -> Result<()> {
    let names = d.pipeline("zombie", 10)?;
    let [input, output, group, _] = names.each_ref().map(String::as_str);
    let (z_txn, h_txn) = (d.name("zombie-z-txn"), d.name("zombie-h-txn"));
    println!("member Z consumes {input} in group {group} and writes 10 outputs in a transaction");
    let mut z = d.spawn_attempt("Z", [input, output, group, &z_txn], Some(WaitAt::Produced))?;
    z.wait_for("PRODUCED")?;
    z.signal(nix::sys::signal::Signal::SIGSTOP)?;
    println!("--- Z stopped (SIGSTOP) before sending its offsets: no heartbeats, its session ({SESSION_TIMEOUT_MS} ms) runs out ---");

    println!("member H joins the same group, gets the partition once Z is out, redoes the work and commits");
    let mut h = d.spawn_attempt("H", [input, output, group, &h_txn], None)?;
    let (status, _) = h.wait_exit()?;
    if !status.success() {
        bail!("member H failed: {status}");
    }

    println!("--- Z continues (SIGCONT): it sends its offsets under its old generation ---");
    z.signal(nix::sys::signal::Signal::SIGCONT)?;
    z.go_on()?;
    let (status, lines) = z.wait_exit()?;
    let refused = lines
        .iter()
        .find(|l| l.starts_with("SEND-OFFSETS-FAILED") || l.starts_with("COMMIT-FAILED"));
    match refused {
        Some(l) if !status.success() => println!("  Z was fenced: {l}"),
        _ => bail!("the zombie member's transaction was not refused ({status}): {lines:?}"),
    }
    println!("verify:");
    let seen = d.verify_pipeline([input, output, group, &z_txn], 10, 20, Some(10))?;
    let expected: Vec<String> = (0..10)
        .map(|i| format!("input-{i} processed by H"))
        .collect();
    check("output read_committed", seen, expected)?;
    println!("  OK: nothing the zombie wrote became visible; the offsets are H's");
    Ok(())
}

/// Consumer context that keeps librdkafka's latest statistics.
#[derive(Default)]
struct StatsContext {
    latest: Mutex<Option<Statistics>>,
}

impl ClientContext for StatsContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        client::forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client::forward_error(&error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        if let Ok(mut l) = self.latest.lock() {
            *l = Some(statistics);
        }
    }
}

impl ConsumerContext for StatsContext {}

/// A read_committed group consumer at the end of a topic whose last
/// records are transaction markers reports lag 0.
pub(super) fn consumer_lag(d: &Demo) -> Result<()> {
    let topic = d.name("lag");
    let group = d.name("lag-group");
    d.create_topic(&topic, 1)?;
    let p = d.transactional(&d.name("lag-txn"))?;
    for (n, commit) in [(3, true), (2, false), (2, true), (1, false)] {
        p.begin_transaction()?;
        for i in 0..n {
            d.send_ok(
                &p,
                &topic,
                &format!("{}-{i}", if commit { "kept" } else { "dropped" }),
            )?;
        }
        if commit {
            p.commit_transaction(REQUEST_TIMEOUT)?;
        } else {
            p.abort_transaction(REQUEST_TIMEOUT)?;
        }
        println!(
            "  {} a transaction of {n}",
            if commit { "committed" } else { "aborted" }
        );
    }
    // 8 records and 4 markers: the log ends at 12 with an ABORT marker.
    d.wait_committed(
        &topic,
        &["kept-0", "kept-1", "kept-2", "kept-0", "kept-1"].map(String::from),
    )?;
    let (_, hw) = d.watermarks(&topic, IsolationLevel::ReadUncommitted)?;
    let (_, lso) = d.watermarks(&topic, IsolationLevel::ReadCommitted)?;
    println!("high watermark {hw}, last stable offset {lso}");
    check("last stable offset once every transaction ended", lso, hw)?;

    let consumer: BaseConsumer<StatsContext> = d
        .connect
        .client_config(&[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
            ("auto.offset.reset", "earliest"),
            ("enable.partition.eof", "true"),
            ("statistics.interval.ms", "100"),
            ("fetch.wait.max.ms", "100"),
        ])?
        .create_with_context(StatsContext::default())
        .context("cannot create the consumer")?;
    consumer.subscribe(&[&topic])?;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut read = 0;
    loop {
        if Instant::now() > deadline {
            bail!("the group consumer did not reach the end of {topic}");
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => tracing::warn!("consumer: {e}"),
            Some(Ok(_)) => read += 1,
        }
    }
    consumer.commit_consumer_state(CommitMode::Sync)?;
    let position = consumer
        .position()?
        .find_partition(&topic, 0)
        .map(|e| e.offset());
    println!("group consumer read {read} records; position {position:?}; committed its position");
    check("records read", read, 5)?;
    check("position", position, Some(Offset::Offset(hw)))?;
    d.wait_group_offset(&group, &topic, Some(hw))?;
    println!("  committed offset {hw} = high watermark {hw}");

    // librdkafka's own lag: end offset (the LSO for read_committed) minus
    // the committed offset, from its statistics.
    let deadline = Instant::now() + VISIBLE;
    loop {
        let _ = consumer.poll(Duration::from_millis(100));
        let lag = consumer
            .context()
            .latest
            .lock()
            .map_err(|_| anyhow!("statistics lock poisoned"))?
            .as_ref()
            .and_then(|s| s.topics.get(&topic))
            .and_then(|t| t.partitions.get(&0))
            .map(|p| (p.consumer_lag, p.committed_offset, p.ls_offset));
        if let Some((0, committed, end)) = lag {
            println!("librdkafka statistics: consumer_lag 0 (committed {committed}, end {end})");
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("librdkafka never reported lag 0: (consumer_lag, committed, end) = {lag:?}");
        }
    }
}

/// Runs `eos-attempt` on the blocking pool (it blocks on librdkafka calls).
pub(super) async fn run_attempt(args: EosAttemptArgs) -> Result<ExitCode> {
    client::blocking(move || eos_attempt(&args)).await
}
