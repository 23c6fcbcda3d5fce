//! Consume-transform-produce pipelines from the outside: `samsa pipeline
//! stage` processes started, SIGKILLed and restarted by the test
//! ([`StageProcesses`]), and what the test reads back with librdkafka: a
//! group's committed offsets, a topic's stable end offsets, every record of a
//! topic with its key.
//!
//! Blocking, like the rest of the librdkafka helpers: call from plain threads.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tempfile::TempDir;

use crate::cluster::{command, tail};
use crate::node::samsa_bin;
use crate::rdk::assign_consumer_config;

/// One stage of a pipeline: its consumer group reads `input`, writes `output`.
#[derive(Debug, Clone)]
pub struct Stage {
    pub name: String,
    pub group: String,
    pub input: String,
    pub output: String,
    /// Processes (slots 0..processes) the stage runs.
    pub processes: u32,
}

impl Stage {
    /// The transactional.id of `slot` (the stage's default: `<group>-<slot>`).
    pub fn transactional_id(&self, slot: u32) -> String {
        format!("{}-{slot}", self.group)
    }
}

/// The `samsa pipeline stage` processes of a test, by (stage, slot). Each
/// process logs to its own file; dropping this SIGKILLs every process, and
/// a panicking test first prints the tail of each log.
pub struct StageProcesses {
    bootstrap: String,
    extra: Vec<String>,
    dir: TempDir,
    stages: BTreeMap<String, Stage>,
    running: BTreeMap<(String, u32), Child>,
    /// Processes started, restarts included.
    pub starts: u32,
    /// Processes that exited by themselves, whatever their status: the test
    /// only ever SIGKILLs a stage process, so each of these is a stage that
    /// gave up (see [`StageExit`]).
    pub exits: Vec<StageExit>,
}

/// A stage process that ended without being killed by the test.
///
/// What its status means (`samsa pipeline stage`): 0 — it stopped cleanly
/// on SIGTERM/SIGINT, which no test sends; 1 — a fatal error (its producer
/// fenced, a transactional call failed past its retries, recovery after an
/// abort failed), the last log line says which; 3 — its watchdog ended a
/// transactional call that hung past its own timeout; killed by a signal —
/// it crashed. A test that never runs two processes of one slot at once
/// expects none of them.
#[derive(Debug, Clone)]
pub struct StageExit {
    pub stage: String,
    pub slot: u32,
    pub status: ExitStatus,
    /// The end of its log when the exit was seen (before a restart
    /// appends to the same file).
    pub log_tail: String,
}

impl std::fmt::Display for StageExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} exited by itself ({}); its log ended with:\n{}",
            self.stage, self.slot, self.status, self.log_tail
        )
    }
}

impl StageProcesses {
    /// `extra`: arguments appended to every `samsa pipeline stage` command.
    pub fn new(bootstrap: &str, extra: &[&str]) -> StageProcesses {
        StageProcesses {
            bootstrap: bootstrap.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir: tempfile::Builder::new()
                .prefix("samsa-stages-")
                .tempdir()
                .expect("create temp dir"),
            stages: BTreeMap::new(),
            running: BTreeMap::new(),
            starts: 0,
            exits: Vec::new(),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The whole log of (stage, slot) so far, every start of it included.
    pub fn log(&self, stage: &str, slot: u32) -> String {
        std::fs::read_to_string(self.log_path(stage, slot)).unwrap_or_default()
    }

    fn log_path(&self, stage: &str, slot: u32) -> PathBuf {
        self.dir.path().join(format!("{stage}-{slot}.log"))
    }

    /// Starts every process of `stage`.
    pub fn start_stage(&mut self, stage: &Stage) {
        self.stages.insert(stage.name.clone(), stage.clone());
        for slot in 0..stage.processes {
            self.start(&stage.name, slot);
        }
    }

    /// Starts (stage, slot); it must not be running.
    pub fn start(&mut self, stage: &str, slot: u32) {
        let s = self.stages.get(stage).expect("known stage").clone();
        let key = (stage.to_string(), slot);
        assert!(
            !self.running.contains_key(&key),
            "{stage}/{slot} is already running"
        );
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path(stage, slot))
            .expect("open stage log");
        self.starts += 1;
        {
            use std::io::Write;
            let mut l = &log;
            let _ = writeln!(
                l,
                "===== {stage}/{slot} start (#{} overall) =====",
                self.starts
            );
        }
        let mut cmd = command(&samsa_bin());
        if std::env::var_os("SAMSA_TEST_RDKAFKA_DEBUG").is_some() {
            cmd.env("RUST_LOG", "info,librdkafka=debug");
        }
        let child = cmd
            .args([
                "pipeline",
                "stage",
                "--input",
                &s.input,
                "--output",
                &s.output,
                "--group",
                &s.group,
                "--stage",
                &s.name,
                "--slot",
                &slot.to_string(),
                "--bootstrap-server",
                &self.bootstrap,
            ])
            .args(&self.extra)
            .args(rdkafka_debug_args())
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone log fd")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("spawn samsa pipeline stage");
        self.running.insert(key, child);
    }

    /// SIGKILLs (stage, slot) and reaps it. Returns false if it was not
    /// running, or had already exited by itself (then recorded in
    /// [`Self::exits`]): the kill did nothing.
    pub fn sigkill(&mut self, stage: &str, slot: u32) -> bool {
        let Some(mut c) = self.running.remove(&(stage.to_string(), slot)) else {
            return false;
        };
        if let Ok(Some(status)) = c.try_wait() {
            self.record_exit(stage, slot, status);
            return false;
        }
        let _ = c.kill();
        let _ = c.wait();
        true
    }

    fn record_exit(&mut self, stage: &str, slot: u32, status: ExitStatus) -> StageExit {
        let exit = StageExit {
            stage: stage.to_string(),
            slot,
            status,
            log_tail: tail(&self.log_path(stage, slot), 20),
        };
        self.exits.push(exit.clone());
        exit
    }

    /// Restarts every process that exited by itself, so that the pipeline
    /// can go on (and a test can report everything before it fails on the
    /// exits). Returns what exited; [`Self::exits`] keeps them all.
    pub fn restart_exited(&mut self) -> Vec<StageExit> {
        let exited: Vec<(String, u32, ExitStatus)> = self
            .running
            .iter_mut()
            .filter_map(|((stage, slot), c)| {
                c.try_wait()
                    .ok()
                    .flatten()
                    .map(|st| (stage.clone(), *slot, st))
            })
            .collect();
        let mut out = Vec::new();
        for (stage, slot, status) in exited {
            self.running.remove(&(stage.clone(), slot));
            out.push(self.record_exit(&stage, slot, status));
            self.start(&stage, slot);
        }
        out
    }

    /// SIGKILLs every process (one that had exited by itself is recorded
    /// in [`Self::exits`]).
    pub fn kill_all(&mut self) {
        for ((stage, slot), mut c) in std::mem::take(&mut self.running) {
            if let Ok(Some(status)) = c.try_wait() {
                self.record_exit(&stage, slot, status);
                continue;
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `lines` lines of every stage process's log.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for s in self.stages.values() {
            for slot in 0..s.processes {
                let path = self.log_path(&s.name, slot);
                out.push_str(&format!(
                    "----- stage {}/{slot} log ({}) -----\n{}\n",
                    s.name,
                    path.display(),
                    tail(&path, lines)
                ));
            }
        }
        out
    }
}

impl StageProcesses {
    /// With `SAMSA_TEST_KEEP_LOGS=<dir>` set, copies every stage log into
    /// `<dir>/stages-<pid>/` (called for a failed test, whose temporary
    /// directory is about to be removed).
    pub fn keep_logs(&self) {
        let Some(dir) = std::env::var_os("SAMSA_TEST_KEEP_LOGS") else {
            return;
        };
        let dest = PathBuf::from(dir).join(format!("stages-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&dest) {
            eprintln!("could not keep stage logs in {}: {e}", dest.display());
            return;
        }
        for s in self.stages.values() {
            for slot in 0..s.processes {
                let from = self.log_path(&s.name, slot);
                if let Some(name) = from.file_name() {
                    let _ = std::fs::copy(&from, dest.join(name));
                }
            }
        }
        eprintln!("stage logs kept in {}", dest.display());
    }
}

/// `SAMSA_TEST_RDKAFKA_DEBUG=eos,broker,…` turns on librdkafka's debug
/// contexts in the stage processes too (their logs then show them).
fn rdkafka_debug_args() -> Vec<String> {
    match std::env::var("SAMSA_TEST_RDKAFKA_DEBUG") {
        Ok(contexts) => vec!["-X".into(), format!("debug={contexts}")],
        Err(_) => Vec::new(),
    }
}

impl Drop for StageProcesses {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tails(60));
            self.keep_logs();
        }
    }
}

/// A read_committed reader of a whole topic from the beginning (assign(),
/// no group) that counts the records it was given: how far a pipeline's
/// committed output got. Aborted records and control records, which also
/// advance offsets, are not counted.
pub struct CommittedCounter {
    consumer: BaseConsumer,
    pub records: u64,
    /// Failed connections to killed nodes librdkafka reported (it reads on
    /// from the live leaders); any other consumer error fails the test.
    pub transient_errors: u64,
}

impl CommittedCounter {
    pub fn new(bootstrap: &str, topic: &str, partitions: i32) -> Result<CommittedCounter> {
        let mut config = assign_consumer_config(bootstrap);
        config.set("isolation.level", "read_committed");
        let consumer: BaseConsumer = config.create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        Ok(CommittedCounter {
            consumer,
            records: 0,
            transient_errors: 0,
        })
    }

    /// Reads what is available (up to `for_at_most`); returns the count.
    /// Panics on a consumer error other than a failed connection.
    pub fn poll(&mut self, for_at_most: Duration) -> u64 {
        let until = Instant::now() + for_at_most;
        while Instant::now() < until {
            match self.consumer.poll(Duration::from_millis(10)) {
                Some(Ok(_)) => self.records += 1,
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
                ))) => self.transient_errors += 1,
                Some(Err(e)) => panic!("the reader of the committed output failed: {e}"),
                None => break,
            }
        }
        self.records
    }
}

/// A consumer for offset lookups at `isolation` (assign(), never joins).
fn lookup_consumer(bootstrap: &str, group: Option<&str>, isolation: &str) -> Result<BaseConsumer> {
    let mut config = assign_consumer_config(bootstrap);
    config.set("isolation.level", isolation);
    if let Some(g) = group {
        config.set("group.id", g);
    }
    Ok(config.create()?)
}

/// Offsets `group` committed for partitions `0..partitions` of `topic`
/// (`-1` where none). Read with `require_stable` (librdkafka asks so for a
/// read_committed consumer), so a pending transactional commit is waited
/// out rather than skipped.
pub fn committed_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i64>> {
    let consumer = lookup_consumer(bootstrap, Some(group), "read_committed")?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .with_context(|| format!("OffsetFetch of group {group}"))?;
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

/// The end offsets a read_committed reader sees for partitions
/// `0..partitions` of `topic`: the last stable offsets.
pub fn stable_end_offsets(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i64>> {
    end_offsets(bootstrap, topic, partitions, "read_committed")
}

/// The high watermarks of partitions `0..partitions` of `topic`.
pub fn high_watermarks(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<BTreeMap<i32, i64>> {
    end_offsets(bootstrap, topic, partitions, "read_uncommitted")
}

fn end_offsets(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
) -> Result<BTreeMap<i32, i64>> {
    let consumer = lookup_consumer(bootstrap, None, isolation)?;
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .with_context(|| format!("end offset of {topic}[{p}] ({isolation})"))?;
        ends.insert(p, high);
    }
    Ok(ends)
}

/// One record a reader saw: (partition, offset, key, value).
pub type KeyedRecord = (i32, i64, Vec<u8>, Vec<u8>);

/// Every record of partitions `0..partitions` of `topic`, from the
/// beginning up to the end librdkafka reports (the LSO for read_committed),
/// with keys; sorted by (partition, offset).
pub fn read_keyed(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    isolation: &str,
    timeout: Duration,
) -> Result<Vec<KeyedRecord>> {
    let mut config = assign_consumer_config(bootstrap);
    config
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true");
    let consumer: BaseConsumer = config.create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut at_end: BTreeMap<i32, bool> = (0..partitions).map(|p| (p, false)).collect();
    let mut seen = Vec::new();
    while at_end.values().any(|e| !e) {
        if Instant::now() > deadline {
            bail!("reading {topic} ({isolation}) did not reach the end of every partition: {at_end:?}");
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            // A node is down: librdkafka reports the failed connection and
            // reads from the live leaders; the deadline still applies.
            Some(Err(KafkaError::MessageConsumption(
                code
                @ (RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown),
            ))) => {
                eprintln!("reading {topic} ({isolation}): transient client error {code:?}");
            }
            Some(Err(e)) => bail!("consumer error: {e}"),
            Some(Ok(m)) => {
                at_end.insert(m.partition(), false);
                seen.push((
                    m.partition(),
                    m.offset(),
                    m.key().unwrap_or_default().to_vec(),
                    m.payload().unwrap_or_default().to_vec(),
                ));
            }
        }
    }
    seen.sort();
    Ok(seen)
}
