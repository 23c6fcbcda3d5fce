//! `samsa verify`: runs workloads against any Kafka-compatible cluster and
//! checks what they saw, through the Kafka protocol only (librdkafka), so
//! the same run works against samsa, Apache Kafka, Redpanda or tansu.
//!
//! A run: create the workloads' topics, run the selected workloads
//! ([`workload`]) for `--duration`, stop producing, let the consumer
//! groups catch up (the drain, at most `--settle`), stop them, read every
//! topic from its beginning with read_committed and with
//! read_uncommitted, and write all of it to the history ([`history`]).
//! Then the history file is read back, checked ([`check`], pure) and
//! reported ([`report`]); `samsa verify check` does only that last step.
//!
//! Exit codes: 0 ran and found no anomaly; 1 anomalies found; 2 could not
//! run (or could not check in full: a final read did not finish).

pub mod check;
pub mod history;
pub mod report;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rand::Rng;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tools::client::{CliContext, ConnectArgs, METADATA_TIMEOUT, REQUEST_TIMEOUT};

use crate::history::{
    Compaction, EventKind, FinalPartition, GroupInfo, Isolation, Recorder, TopicInfo, TopicRole,
    Workload, ID_HEADER,
};
use crate::workload::Env;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct VerifyArgs {
    #[command(subcommand)]
    pub command: Option<VerifyCommand>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum VerifyCommand {
    /// Check a history file again, offline (same checker, same report).
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The history (JSON Lines) a run wrote.
    #[arg(long, value_name = "FILE")]
    pub history: PathBuf,
    /// A nemesis fault log (JSON Lines): adds unavailability per fault kind.
    #[arg(long, value_name = "FILE")]
    pub faults: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Workloads to run, comma-separated (compact only when named).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Workload::DEFAULT)]
    pub workload: Vec<Workload>,
    /// How long to produce, e.g. 60s, 5m, 1500ms.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub duration: Duration,
    /// Records per second over all workloads together.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seed of the random choices (printed; default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prefix of the topics, groups and transactional ids (default: verify-<random>).
    #[arg(long)]
    pub topic_prefix: Option<String>,
    /// Partitions of each topic.
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// Replication factor of each topic (default: min(3, brokers in the metadata)).
    #[arg(long)]
    pub replication_factor: Option<i32>,
    /// Share of transactions the txn workload aborts on purpose.
    #[arg(long, default_value_t = 0.25)]
    pub abort_ratio: f64,
    /// Where to write the history (default: <topic prefix>.history.jsonl here).
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// A nemesis fault log to read at the end: adds unavailability per fault kind.
    #[arg(long, value_name = "FILE")]
    pub faults: Option<PathBuf>,
    /// compact: how many keys the workload writes (its key space).
    #[arg(long, default_value_t = 40)]
    pub compact_keys: u32,
    /// compact: the topic's max.compaction.lag.ms (30s, 500ms, ...).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub compact_max_lag: Duration,
    /// compact: the topic's delete.retention.ms (how long tombstones stay).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub compact_delete_retention: Duration,
    /// compact: slack the compaction deadlines allow for the cleaner's
    /// scheduling and passes (raise it for brokers that clean less often).
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    pub compact_grace: Duration,
    /// Longest wait for the groups to catch up, and for the final reads, after producing stops.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub settle: Duration,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `10s`, `5m`, `1500ms`, `1h`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s}: expected a duration like 30s, 5m or 500ms"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s}: unknown unit {unit} (ms, s, m, h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s}: {e}"))
}

/// Runs `samsa verify …`; every error is a one-line message and exit code 2.
pub async fn run(args: VerifyArgs) -> Result<ExitCode> {
    let result = match args.command {
        Some(VerifyCommand::Check(check)) => check_offline(&check),
        None => run_workloads(args.run).await,
    };
    Ok(match result {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {line}");
            ExitCode::from(2)
        }
    })
}

fn check_offline(args: &CheckArgs) -> Result<u8> {
    report_history(&args.history, args.faults.as_deref(), args.json)
}

/// Reads, checks and prints; returns the exit code.
fn report_history(path: &Path, faults: Option<&Path>, json: bool) -> Result<u8> {
    let events = history::read(path)?;
    let findings = check::check(&events);
    let faults = match faults {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the fault log {}", f.display()))?;
            report::parse_faults(&f.display().to_string(), &text)?
        }
        None => Vec::new(),
    };
    let report = report::build(&path.display().to_string(), &events, &findings, &faults);
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.text());
    }
    Ok(report.exit_code())
}

/// One workload's topics and groups, named from the prefix.
struct Plan {
    topics: Vec<TopicInfo>,
    groups: Vec<GroupInfo>,
}

fn topic_name(prefix: &str, suffix: &str) -> String {
    format!("{prefix}-{suffix}")
}

fn plan(prefix: &str, workloads: &[Workload], partitions: i32, compaction: Compaction) -> Plan {
    let mut topics = Vec::new();
    let mut groups = Vec::new();
    let mut topic = |name: String, workload, role| {
        topics.push(TopicInfo {
            topic: name,
            workload,
            role,
            partitions,
            compaction: None,
        });
    };
    for w in workloads {
        match w {
            Workload::Idempotent => topic(topic_name(prefix, "idempotent"), *w, TopicRole::Data),
            Workload::Txn => topic(topic_name(prefix, "txn"), *w, TopicRole::Data),
            Workload::Queue => {
                topic(topic_name(prefix, "queue"), *w, TopicRole::Data);
                groups.push(GroupInfo {
                    group: topic_name(prefix, "queue-group"),
                    workload: *w,
                    input_topic: topic_name(prefix, "queue"),
                });
            }
            Workload::Pipeline => {
                topic(
                    topic_name(prefix, "pipeline-in"),
                    *w,
                    TopicRole::PipelineInput,
                );
                topic(
                    topic_name(prefix, "pipeline-out"),
                    *w,
                    TopicRole::PipelineOutput,
                );
                groups.push(GroupInfo {
                    group: topic_name(prefix, "pipeline-group"),
                    workload: *w,
                    input_topic: topic_name(prefix, "pipeline-in"),
                });
            }
            Workload::Compact => topic(topic_name(prefix, "compact"), *w, TopicRole::Data),
        }
    }
    for t in &mut topics {
        if t.workload == Workload::Compact {
            t.compaction = Some(compaction);
        }
    }
    Plan { topics, groups }
}

fn topic_of(plan: &Plan, workload: Workload, role: TopicRole) -> Result<String> {
    plan.topics
        .iter()
        .find(|t| t.workload == workload && t.role == role)
        .map(|t| t.topic.clone())
        .ok_or_else(|| anyhow!("no {role:?} topic for {}", workload.name()))
}

/// How long the workloads' clients may take to be ready (transactional
/// producers initialised: the first use of transactions may create the
/// cluster's transaction state topic).
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long topic creation may take to show leaders for every partition.
const TOPICS_READY_TIMEOUT: Duration = Duration::from_secs(30);

async fn run_workloads(args: RunArgs) -> Result<u8> {
    if args.workload.is_empty() {
        bail!("--workload: name at least one workload");
    }
    if args.partitions < 1 {
        bail!("--partitions must be at least 1");
    }
    if !(0.0..=1.0).contains(&args.abort_ratio) {
        bail!("--abort-ratio must be between 0 and 1");
    }
    if args.rate.is_nan() || args.rate <= 0.0 {
        bail!("--rate must be positive");
    }
    if args.compact_keys == 0 {
        bail!("--compact-keys must be at least 1");
    }
    if args.compact_max_lag < Duration::from_millis(1) {
        bail!("--compact-max-lag must be at least 1ms");
    }
    let mut workloads = args.workload.clone();
    workloads.sort();
    workloads.dedup();
    let seed = args.seed.unwrap_or_else(|| rand::thread_rng().gen());
    let prefix = args
        .topic_prefix
        .clone()
        .unwrap_or_else(|| format!("verify-{seed:016x}"));
    let history_path = args
        .history
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{prefix}.history.jsonl")));
    let bootstrap = args.connect.bootstrap.bootstrap_server.clone();
    eprintln!(
        "samsa verify: seed {seed}, prefix {prefix}, history {}",
        history_path.display()
    );

    // The cluster, reachable within a bounded time, and its broker count.
    let admin: AdminClient<CliContext> = args
        .connect
        .client_config(&[])?
        .create_with_context(CliContext)
        .context("cannot create the Kafka admin client")?;
    let brokers = {
        let metadata = admin
            .inner()
            .fetch_metadata(None, METADATA_TIMEOUT)
            .map_err(|e| anyhow!("cannot reach the cluster at {bootstrap}: {e}"))?;
        metadata.brokers().len()
    };
    let replication = args
        .replication_factor
        .unwrap_or_else(|| i32::try_from(brokers.clamp(1, 3)).unwrap_or(1));
    let requested = Compaction {
        max_lag_ms: Some(millis(args.compact_max_lag)),
        delete_retention_ms: Some(millis(args.compact_delete_retention)),
        grace_ms: millis(args.compact_grace),
    };
    let mut plan = plan(&prefix, &workloads, args.partitions, requested);
    create_topics(&admin, &plan, args.partitions, replication).await?;
    wait_topics_ready(&admin, &plan, args.partitions).await?;
    // The checks go by what the cluster says the topic has.
    for t in &mut plan.topics {
        if let Some(c) = &mut t.compaction {
            *c = effective_compaction(&admin, &t.topic, *c).await;
        }
    }
    drop(admin);

    let recorder = Arc::new(Recorder::create(&history_path)?);
    recorder.record(EventKind::RunStarted {
        seed,
        bootstrap: bootstrap.clone(),
        workloads: workloads.clone(),
        topics: plan.topics.clone(),
        groups: plan.groups.clone(),
    });
    let stop_producing = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let env = Env {
        recorder: Arc::clone(&recorder),
        connect: args.connect.clone(),
        stop_producing: Arc::clone(&stop_producing),
        stop: Arc::clone(&stop),
        rate: args.rate / workloads.len() as f64,
        seed,
        partitions: args.partitions,
        gate: Arc::new(workload::Gate::default()),
    };
    let (producers, consumers) = start(&env, &plan, &prefix, &workloads, &args)?;
    let expected = producers.len()
        + consumers
            .iter()
            .filter(|(name, _)| name.starts_with("pipeline-w"))
            .count();
    let gate = Arc::clone(&env.gate);
    let arrived = tokio::task::spawn_blocking(move || gate.wait_arrivals(expected, READY_TIMEOUT))
        .await
        .map_err(|e| anyhow!("waiting for the workloads failed: {e}"))?;
    if arrived < expected {
        env.gate.close();
        stop_producing.store(true, Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || join_all(producers) + join_all(consumers))
            .await
            .map_err(|e| anyhow!("stopping the workloads failed: {e}"))?;
        bail!(
            "only {arrived} of {expected} producers were ready within {READY_TIMEOUT:?} \
             (are transactions available on the cluster? see the warnings above)"
        );
    }
    env.gate.open();
    tracing::info!(
        workloads = workloads.len(),
        brokers,
        replication,
        "running for {:?}",
        args.duration
    );

    let shutdown = samsa_tools::signals::shutdown_signal()?;
    tokio::select! {
        () = tokio::time::sleep(args.duration) => {}
        () = shutdown => eprintln!("samsa verify: interrupted; stopping and checking what ran"),
    }
    stop_producing.store(true, Ordering::Relaxed);
    let settle = args.settle;
    let job_env = env.clone();
    let plan_topics = plan.topics.clone();
    let plan_groups = plan.groups.clone();
    let outcome = tokio::task::spawn_blocking(move || -> Result<()> {
        let failures = join_all(producers);
        job_env.recorder.record(EventKind::ProducingStopped {});
        let (complete, detail) = drain(&job_env, &plan_groups, settle);
        if !complete {
            eprintln!("samsa verify: drain incomplete: {detail}");
        }
        job_env
            .recorder
            .record(EventKind::Drained { complete, detail });
        stop.store(true, Ordering::Relaxed);
        let failures = failures + join_all(consumers);
        if failures > 0 {
            tracing::warn!("{failures} workload thread(s) ended with an error");
        }
        let deadline = Instant::now() + settle;
        // Every read in parallel: each is mostly waiting for its client.
        std::thread::scope(|scope| {
            let reads: Vec<_> = plan_topics
                .iter()
                .flat_map(|t| {
                    [Isolation::ReadCommitted, Isolation::ReadUncommitted].map(|isolation| {
                        let env = &job_env;
                        scope.spawn(move || {
                            final_read(env, &t.topic, t.partitions, isolation, deadline)
                        })
                    })
                })
                .collect();
            reads.into_iter().try_for_each(|r| {
                r.join()
                    .map_err(|_| anyhow!("a final read panicked"))
                    .and_then(|r| r)
            })
        })?;
        job_env.recorder.record(EventKind::RunEnded {});
        Ok(())
    })
    .await
    .map_err(|e| anyhow!("the run's task failed: {e}"))?;
    outcome?;
    recorder.finish()?;
    eprintln!(
        "samsa verify: history written to {}",
        history_path.display()
    );
    report_history(&history_path, args.faults.as_deref(), args.json)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `segment.bytes` of the compacted topic: small, so segments roll (and
/// become cleanable) often. A cluster that refuses it (Kafka 4 wants at
/// least 1 MiB) gets its default instead: `max.compaction.lag.ms` rolls
/// segments all the same.
const COMPACT_SEGMENT_BYTES: &str = "16384";

/// The topic configs of a compacted topic; `small_segments`: with
/// [`COMPACT_SEGMENT_BYTES`].
fn compaction_configs(c: &Compaction, small_segments: bool) -> Vec<(&'static str, String)> {
    let mut configs = vec![
        ("cleanup.policy", "compact".to_string()),
        ("min.cleanable.dirty.ratio", "0.01".to_string()),
        ("min.compaction.lag.ms", "0".to_string()),
    ];
    if small_segments {
        configs.push(("segment.bytes", COMPACT_SEGMENT_BYTES.to_string()));
    }
    if let Some(ms) = c.max_lag_ms {
        configs.push(("max.compaction.lag.ms", ms.to_string()));
    }
    if let Some(ms) = c.delete_retention_ms {
        configs.push(("delete.retention.ms", ms.to_string()));
    }
    configs
}

fn new_topic<'a>(
    topic: &'a TopicInfo,
    configs: &'a [(&'static str, String)],
    partitions: i32,
    replication: i32,
) -> NewTopic<'a> {
    let mut new = NewTopic::new(
        &topic.topic,
        partitions,
        TopicReplication::Fixed(replication),
    );
    for (k, v) in configs {
        new = new.set(k, v);
    }
    new
}

async fn create_topics(
    admin: &AdminClient<CliContext>,
    plan: &Plan,
    partitions: i32,
    replication: i32,
) -> Result<()> {
    let configs: Vec<Vec<(&str, String)>> = plan
        .topics
        .iter()
        .map(|t| {
            t.compaction
                .as_ref()
                .map_or_else(Vec::new, |c| compaction_configs(c, true))
        })
        .collect();
    let new: Vec<NewTopic<'_>> = plan
        .topics
        .iter()
        .zip(&configs)
        .map(|(t, c)| new_topic(t, c, partitions, replication))
        .collect();
    let options = AdminOptions::new()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .operation_timeout(Some(REQUEST_TIMEOUT));
    let results = admin
        .create_topics(new.iter(), &options)
        .await
        .context("cannot create the topics")?;
    for result in results {
        match result {
            Ok(_) => {}
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                bail!("topic {topic} exists already: choose another --topic-prefix (a run needs topics of its own)")
            }
            Err((
                topic,
                code @ (RDKafkaErrorCode::InvalidConfig | RDKafkaErrorCode::PolicyViolation),
            )) => {
                // Once more with the cluster's own segment size (the likely
                // culprit; anything else fails again, and is reported).
                let Some(info) = plan
                    .topics
                    .iter()
                    .find(|t| t.topic == topic && t.compaction.is_some())
                else {
                    bail!("cannot create topic {topic}: {code}");
                };
                let configs = info
                    .compaction
                    .as_ref()
                    .map_or_else(Vec::new, |c| compaction_configs(c, false));
                eprintln!(
                    "samsa verify: the cluster refused the configs of topic {topic} ({code}); \
                     trying again without segment.bytes={COMPACT_SEGMENT_BYTES} (Kafka 4 wants at least 1 MiB)"
                );
                let retry_topic = new_topic(info, &configs, partitions, replication);
                let retry = admin
                    .create_topics([&retry_topic], &options)
                    .await
                    .context("cannot create the topics")?;
                for r in retry {
                    if let Err((topic, code)) = r {
                        bail!("cannot create compacted topic {topic}: {code}");
                    }
                }
            }
            Err((topic, code)) => bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(())
}

/// The compaction settings `topic` has according to the cluster
/// (DescribeConfigs): `requested` where it cannot tell. A
/// `max.compaction.lag.ms` of i64::MAX (Kafka's "never") is no deadline.
async fn effective_compaction(
    admin: &AdminClient<CliContext>,
    topic: &str,
    requested: Compaction,
) -> Compaction {
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await;
    let resource = match described {
        Ok(mut results) if !results.is_empty() => results.swap_remove(0),
        Ok(_) => Err(RDKafkaErrorCode::UnknownTopicOrPartition),
        Err(e) => {
            eprintln!("samsa verify: cannot describe topic {topic} ({e}); checking with the requested compaction settings");
            return requested;
        }
    };
    let resource = match resource {
        Ok(r) => r,
        Err(code) => {
            eprintln!("samsa verify: cannot describe topic {topic} ({code}); checking with the requested compaction settings");
            return requested;
        }
    };
    let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
    if let Some(policy) = value("cleanup.policy") {
        if !policy.contains("compact") {
            eprintln!("samsa verify: warning: topic {topic} has cleanup.policy={policy}, not compact: expect compaction anomalies");
        }
    }
    let millis_of = |name: &str, requested: Option<i64>| -> Option<i64> {
        let Some(text) = value(name) else {
            return requested;
        };
        match text.trim().parse::<i64>() {
            Ok(i64::MAX) => None,
            Ok(ms) => {
                if Some(ms) != requested {
                    eprintln!(
                        "samsa verify: warning: topic {topic} has {name}={ms}, not the {} requested; checking with {ms}",
                        requested.map_or("unbounded".to_string(), |r| r.to_string())
                    );
                }
                Some(ms)
            }
            Err(_) => requested,
        }
    };
    Compaction {
        max_lag_ms: millis_of("max.compaction.lag.ms", requested.max_lag_ms),
        delete_retention_ms: millis_of("delete.retention.ms", requested.delete_retention_ms),
        grace_ms: requested.grace_ms,
    }
}

/// Waits until the metadata shows every partition of every topic with a leader.
async fn wait_topics_ready(
    admin: &AdminClient<CliContext>,
    plan: &Plan,
    partitions: i32,
) -> Result<()> {
    let deadline = Instant::now() + TOPICS_READY_TIMEOUT;
    loop {
        let mut missing = None;
        for t in &plan.topics {
            let ready = admin
                .inner()
                .fetch_metadata(Some(&t.topic), METADATA_TIMEOUT)
                .ok()
                .and_then(|m| {
                    m.topics().iter().find(|mt| mt.name() == t.topic).map(|mt| {
                        mt.error().is_none()
                            && mt.partitions().len() == usize::try_from(partitions).unwrap_or(0)
                            && mt.partitions().iter().all(|p| p.leader() >= 0)
                    })
                })
                .unwrap_or(false);
            if !ready {
                missing = Some(t.topic.clone());
                break;
            }
        }
        let Some(topic) = missing else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            bail!("topic {topic} has no leader for every partition after {TOPICS_READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Handles = Vec<(String, JoinHandle<Result<()>>)>;

fn spawn(
    handles: &mut Handles,
    name: String,
    job: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<()> {
    let handle = std::thread::Builder::new()
        .name(name.clone())
        .spawn(job)
        .with_context(|| format!("cannot start thread {name}"))?;
    handles.push((name, handle));
    Ok(())
}

/// Starts every workload thread: (producers, consumers).
fn start(
    env: &Env,
    plan: &Plan,
    prefix: &str,
    workloads: &[Workload],
    args: &RunArgs,
) -> Result<(Handles, Handles)> {
    let abort_ratio = args.abort_ratio;
    let mut producers = Handles::new();
    let mut consumers = Handles::new();
    for w in workloads {
        match w {
            Workload::Idempotent => {
                let topic = topic_of(plan, *w, TopicRole::Data)?;
                for i in 0..workload::idempotent::PRODUCERS {
                    let (env, topic) = (env.clone(), topic.clone());
                    spawn(&mut producers, format!("idempotent-p{i}"), move || {
                        workload::idempotent::run_producer(&env, &topic, i)
                    })?;
                }
            }
            Workload::Txn => {
                let topic = topic_of(plan, *w, TopicRole::Data)?;
                for i in 0..workload::txn::PRODUCERS {
                    let (env, topic) = (env.clone(), topic.clone());
                    let id = format!("{prefix}-txn-{i}");
                    spawn(&mut producers, format!("txn-p{i}"), move || {
                        workload::txn::run_producer(&env, &topic, &id, i, abort_ratio)
                    })?;
                }
            }
            Workload::Queue => {
                let topic = topic_of(plan, *w, TopicRole::Data)?;
                let group = topic_name(prefix, "queue-group");
                for i in 0..workload::queue::PRODUCERS {
                    let (env, topic) = (env.clone(), topic.clone());
                    spawn(&mut producers, format!("queue-p{i}"), move || {
                        workload::queue::run_producer(&env, &topic, i)
                    })?;
                }
                for i in 0..workload::queue::CONSUMERS {
                    let (env, topic, group) = (env.clone(), topic.clone(), group.clone());
                    spawn(&mut consumers, format!("queue-c{i}"), move || {
                        workload::queue::run_consumer(&env, &topic, &group, i)
                    })?;
                }
            }
            Workload::Pipeline => {
                let topics = workload::pipeline::Topics {
                    input: topic_of(plan, *w, TopicRole::PipelineInput)?,
                    output: topic_of(plan, *w, TopicRole::PipelineOutput)?,
                    group: topic_name(prefix, "pipeline-group"),
                    transactional_id_prefix: topic_name(prefix, "pipeline"),
                };
                {
                    let (env, topic) = (env.clone(), topics.input.clone());
                    spawn(&mut producers, "pipeline-in".into(), move || {
                        workload::pipeline::run_input_producer(&env, &topic)
                    })?;
                }
                for i in 0..workload::pipeline::WORKERS {
                    let (env, topics) = (env.clone(), topics.clone());
                    spawn(&mut consumers, format!("pipeline-w{i}"), move || {
                        workload::pipeline::run_worker(&env, &topics, i)
                    })?;
                }
            }
            Workload::Compact => {
                let topic = topic_of(plan, *w, TopicRole::Data)?;
                let keys = Arc::new(workload::compact::KeySpace::new(
                    args.compact_keys,
                    env.partitions,
                ));
                {
                    let keys = Arc::clone(&keys);
                    let (env, topic) = (env.clone(), topic.clone());
                    spawn(&mut producers, "compact-p0".into(), move || {
                        workload::compact::run_producer(&env, &topic, &keys)
                    })?;
                }
                let (env, id) = (env.clone(), topic_name(prefix, "compact-txn"));
                spawn(&mut producers, "compact-t0".into(), move || {
                    workload::compact::run_txn_producer(&env, &topic, &id, &keys, abort_ratio)
                })?;
            }
        }
    }
    Ok((producers, consumers))
}

/// Joins threads; how many ended with an error (each logged).
fn join_all(handles: Handles) -> usize {
    let mut failed = 0;
    for (name, handle) in handles {
        match handle.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(thread = %name, "workload ended with an error: {e:#}");
                failed += 1;
            }
            Err(_) => {
                tracing::warn!(thread = %name, "workload thread panicked");
                failed += 1;
            }
        }
    }
    failed
}

/// A consumer that takes partitions by assign(), never joining a group
/// (librdkafka still wants a group.id for it).
fn assigning_consumer(
    env: &Env,
    isolation: Isolation,
    eof: bool,
) -> Result<BaseConsumer<CliContext>> {
    let settings = [
        ("group.id", "samsa-verify-reader".to_string()),
        ("client.id", "samsa-verify-reader".to_string()),
        ("enable.auto.commit", "false".to_string()),
        ("enable.auto.offset.store", "false".to_string()),
        ("isolation.level", isolation.as_config().to_string()),
        ("enable.partition.eof", eof.to_string()),
        ("auto.offset.reset", "earliest".to_string()),
    ];
    let borrowed: Vec<(&str, String)> = settings.to_vec();
    env.config(&borrowed)?
        .create_with_context(CliContext)
        .context("cannot create a reader")
}

/// Waits until every group's committed offsets reach its input's end
/// offsets (or `settle` runs out): (caught up, what was still behind).
fn drain(env: &Env, groups: &[GroupInfo], settle: Duration) -> (bool, String) {
    let deadline = Instant::now() + settle;
    let mut behind = String::new();
    for g in groups {
        loop {
            match group_lag(env, g) {
                Ok(0) => {
                    behind.clear();
                    break;
                }
                Ok(lag) => {
                    behind = format!(
                        "group {} is {lag} record(s) behind {}",
                        g.group, g.input_topic
                    )
                }
                Err(e) => behind = format!("group {}: {e:#}", g.group),
            }
            if Instant::now() >= deadline {
                return (false, behind);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    (true, String::new())
}

/// Records of the group's input not yet covered by its committed offsets.
fn group_lag(env: &Env, g: &GroupInfo) -> Result<i64> {
    let reader = assigning_consumer(env, Isolation::ReadUncommitted, false)?;
    let metadata = reader.fetch_metadata(Some(&g.input_topic), METADATA_TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .find(|t| t.name() == g.input_topic)
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let member = env
        .config(&[
            ("group.id", g.group.clone()),
            ("enable.auto.commit", "false".to_string()),
        ])?
        .create::<BaseConsumer>()?;
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition(&g.input_topic, *p);
    }
    let committed = member.committed_offsets(tpl, REQUEST_TIMEOUT)?;
    let mut lag = 0;
    for p in &partitions {
        let (low, high) = reader.fetch_watermarks(&g.input_topic, *p, METADATA_TIMEOUT)?;
        let at = committed
            .find_partition(&g.input_topic, *p)
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => low,
            })
            .unwrap_or(low);
        lag += (high - at).max(0);
    }
    Ok(lag)
}

/// Reads `topic` from its beginning to the end offsets it has now, with
/// `isolation`, recording every record; a partition not finished by
/// `deadline` is recorded as incomplete.
fn final_read(
    env: &Env,
    topic: &str,
    partitions: i32,
    isolation: Isolation,
    deadline: Instant,
) -> Result<()> {
    let probe = assigning_consumer(env, Isolation::ReadUncommitted, false)?;
    let mut ends: Vec<(i32, i64)> = Vec::new();
    for p in 0..partitions {
        let end = loop {
            match probe.fetch_watermarks(topic, p, METADATA_TIMEOUT) {
                Ok((_, high)) => break Some(high),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("watermarks of {topic}[{p}]: {e}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    tracing::warn!("watermarks of {topic}[{p}]: {e}");
                    break None;
                }
            }
        };
        ends.push((p, end.unwrap_or(-1)));
    }
    // read_committed can only end where the last stable offset has
    // reached the end: wait for every transaction in it to finish (the
    // LSO is what a read_committed client's ListOffsets answers).
    let mut ready: Vec<bool> = ends.iter().map(|(_, e)| *e >= 0).collect();
    if isolation == Isolation::ReadCommitted {
        let committed_probe = assigning_consumer(env, Isolation::ReadCommitted, false)?;
        for (i, (p, end)) in ends.iter().enumerate() {
            if !ready[i] {
                continue;
            }
            ready[i] = loop {
                match committed_probe.fetch_watermarks(topic, *p, METADATA_TIMEOUT) {
                    Ok((_, stable)) if stable >= *end => break true,
                    Ok(_) => {}
                    Err(e) => tracing::debug!("stable offset of {topic}[{p}]: {e}"),
                }
                if Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(200));
            };
        }
    }
    let reader = assigning_consumer(env, isolation, true)?;
    let mut tpl = TopicPartitionList::new();
    for (i, (p, _)) in ends.iter().enumerate() {
        if ready[i] {
            tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
        }
    }
    let mut done: Vec<bool> = ends
        .iter()
        .enumerate()
        .map(|(i, (_, end))| ready[i] && *end == 0)
        .collect();
    // Every record this read returns is fetched after this.
    let started_ms = history::now_ms();
    if tpl.count() > 0 {
        reader.assign(&tpl)?;
    }
    while done.iter().zip(&ready).any(|(d, r)| *r && !*d) && Instant::now() < deadline {
        match reader.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) => {
                // A tombstone (null value) carries its id in a header.
                let tombstone = msg.payload().is_none();
                let value = match msg.payload() {
                    Some(payload) => payload,
                    None => msg
                        .headers()
                        .and_then(|h| h.iter().find(|h| h.key == ID_HEADER))
                        .and_then(|h| h.value)
                        .unwrap_or_default(),
                };
                env.recorder.record(EventKind::FinalRead {
                    isolation,
                    topic: topic.to_string(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                    value: String::from_utf8_lossy(value).into_owned(),
                    key: msg.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                    tombstone,
                });
            }
            // The fetch reached the end offset, which was already at least
            // the one this read must reach.
            Some(Err(KafkaError::PartitionEOF(p))) => {
                if let Some(i) = ends.iter().position(|(q, _)| *q == p) {
                    done[i] = true;
                }
            }
            Some(Err(e)) => tracing::debug!("final read of {topic}: {e}"),
            None => {}
        }
    }
    env.recorder.record(EventKind::FinalReadDone {
        isolation,
        topic: topic.to_string(),
        partitions: ends
            .iter()
            .enumerate()
            .map(|(i, (p, end))| FinalPartition {
                partition: *p,
                end_offset: *end,
                complete: done[i],
            })
            .collect(),
        started_ms: Some(started_ms),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(
            parse_duration("1500ms").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("s").is_err());
    }
}
