//! A real client that pipelines: kafka-python producers with five produce
//! requests in flight per connection and several batches of one partition
//! in flight at once (`tests/compat/pipelined_producer.py`; librdkafka keeps
//! one batch per partition in flight, so nothing else in the suite does
//! this). Each test runs the script against real samsa processes, reads the
//! topic back and feeds the script's history and the reads to the
//! exactly-once checker:
//!
//! - `transactional_producers_pipeline_on_one_node`: three transactional
//!   producers, multi-partition transactions, some aborted on purpose;
//! - `idempotent_producers_pipeline_on_one_node`: three idempotent ones;
//! - `plain_producers_keep_order_on_one_node`: kafka-python as released,
//!   not idempotent (it pipelines plain batches without any change);
//! - `transactional_producers_pipeline_across_a_leader_kill`: two
//!   transactional producers on a three-node cluster (RF=3) while a node
//!   leading some of the topic's partitions is SIGKILLed and restarted.
//!
//! Every test requires: the script finished without a fatal error and
//! without a single OUT_OF_ORDER_SEQUENCE_NUMBER failure (the script fails
//! a batch with it when every earlier batch of its partition was
//! acknowledged: the broker appended a connection's batches out of order;
//! one behind an earlier batch awaiting its retry is retried, as Java's
//! producer does, and may occur around the kill, never on one node); the
//! client really had several batches of one partition in flight (its own
//! count); no
//! acknowledged or committed record lost, none duplicated, none of an
//! aborted transaction visible to read_committed, per-producer order kept;
//! and the broker's `/metrics` show it saw the pipelining
//! (`samsa_produce_pipelined_batches_total` > 0,
//! `samsa_produce_partition_in_flight_max` >= 2).
//!
//! The client's count alone is not enough: it is taken before the client
//! reads the answers that have already arrived, so a producer starved of
//! CPU (a loaded two-core CI machine) counts batches as pipelined that the
//! broker had answered before their successors arrived, and the broker sees
//! no overlap at all. So while the workload runs, until the brokers report
//! pipelining, the tests pause them now and then (SIGSTOP for [`PAUSE`],
//! then SIGCONT): what the producers send meanwhile queues up and reaches
//! the broker at once, as it does behind a stalled disk or a GC pause.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use samsa_tests::checker::EosReport;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::compat::{compat_script, History, PyScript};
use samsa_tests::http::{http_get, metric};
use samsa_tests::txn::{self, Isolation};
use samsa_tests::wait::{try_wait_until, wait_until};
use samsa_tests::{unique_topic, EosChecker, SamsaNode};

const PARTITIONS: i32 = 10;
/// The script's own deadline; a hang is a failure, not a wait.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(150);

/// The broker-side evidence of pipelining (see the module docs).
const PIPELINED_BATCHES: &str = "samsa_produce_pipelined_batches_total";
const IN_FLIGHT_MAX: &str = "samsa_produce_partition_in_flight_max";
/// How long one pause of the brokers lasts: the fault's length, far below
/// every timeout of the workload (requests 30 s, transactions 60 s) and of
/// the cluster (ISR 2 s, broker sessions 5 s).
const PAUSE: Duration = Duration::from_millis(300);

/// Arguments of `pipelined_producer.py` besides the ones every run has.
struct Workload {
    mode: &'static str,
    producers: u32,
    transactions: u32,
    records: u32,
    abort_ratio: f64,
    seed: u64,
    /// Prefix of the producers' names and transactional ids (`<run_id>p<i>`).
    run_id: String,
}

impl Workload {
    fn args(&self, bootstrap: &str, topic: &str, history: &Path) -> Vec<String> {
        [
            ("--bootstrap", bootstrap.to_string()),
            ("--topic", topic.to_string()),
            ("--partitions", PARTITIONS.to_string()),
            ("--mode", self.mode.to_string()),
            ("--producers", self.producers.to_string()),
            ("--transactions", self.transactions.to_string()),
            ("--records", self.records.to_string()),
            ("--abort-ratio", self.abort_ratio.to_string()),
            ("--seed", self.seed.to_string()),
            ("--run-id", self.run_id.clone()),
            ("--history", history.display().to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_string(), v])
        .collect()
    }
}

/// `SAMSA_TEST_SEED` replays a run; otherwise a fresh seed, printed.
fn seed() -> u64 {
    std::env::var("SAMSA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u16>)
        .into()
}

/// Fails the test (with the script's output) unless the run finished
/// cleanly: exit 0, no fatal error, no OUT_OF_ORDER_SEQUENCE_NUMBER.
fn assert_script_ok(status: std::process::ExitStatus, history: &History, script: &PyScript) {
    let first_ooos: Vec<_> = history.out_of_order.iter().take(5).collect();
    assert!(
        history.out_of_order.is_empty(),
        "{} sends failed with OUT_OF_ORDER_SEQUENCE_NUMBER (a batch overtook an earlier one of \
         the same connection and partition), e.g. {first_ooos:#?}\nfatal: {:?}\n{}",
        history.out_of_order.len(),
        history.fatal,
        script.output(40)
    );
    assert!(
        history.fatal.is_empty() && status.success() && history.end.is_some(),
        "the workload failed ({status}): fatal errors {:?}\n{}",
        history.fatal,
        script.output(60)
    );
}

/// The client's own count: several batches of one partition were in flight.
fn assert_client_pipelined(history: &History) {
    let total = history.total_inflight();
    println!(
        "client side (kafka-python sender): {} produce requests, {} batches sent while an \
         earlier batch of their partition was unanswered, at most {} batches of one partition \
         and {} requests of one connection in flight; per producer {:?}",
        total.requests,
        total.pipelined_batches,
        total.max_batches_per_partition,
        total.max_requests_per_connection,
        history.inflight
    );
    println!(
        "OUT_OF_ORDER_SEQUENCE_NUMBER answers retried because an earlier batch of the partition \
         was unresolved (as any broker answers after a retriable error): {}",
        history.retried_out_of_order.len()
    );
    assert!(
        total.pipelined_batches > 0 && total.max_batches_per_partition >= 2,
        "the client never had two batches of one partition in flight: this run proves nothing \
         about pipelining ({total:?})"
    );
}

/// Reads `topic` read_committed until every committed (or, without
/// transactions, every acknowledged) value is visible, feeds the last read
/// and the history to the checker and returns its report.
fn check_exactly_once(bootstrap: &str, topic: &str, history: &History) -> EosReport {
    let mut checker = EosChecker::new();
    history.feed(&mut checker).expect("a well-formed history");
    let must_see: HashSet<&str> = if history.committed.is_empty() {
        history.acked.iter().map(String::as_str).collect()
    } else {
        history.committed_values().map(String::as_str).collect()
    };
    let mut last = Vec::new();
    let visible = try_wait_until(txn::VISIBLE, || {
        match txn::read_topic(bootstrap, topic, PARTITIONS, Isolation::ReadCommitted) {
            Ok(read) => {
                let seen: HashSet<&str> = read.iter().map(|(_, _, v)| v.as_str()).collect();
                let all = must_see.iter().all(|v| seen.contains(v));
                last = read;
                all.then_some(())
            }
            Err(e) => {
                eprintln!("read_committed of {topic}: {e:#}");
                None
            }
        }
    });
    if visible.is_none() {
        eprintln!(
            "not every committed value became visible within {:?}; checking the last read",
            txn::VISIBLE
        );
    }
    for (p, o, v) in &last {
        checker.read(*p, *o, v.as_bytes());
    }
    checker.check()
}

/// The broker-side pipelining metrics summed (counter) and maxed (gauge)
/// over `nodes`' `/metrics`.
fn broker_pipelining(nodes: &[SocketAddr]) -> (i64, i64) {
    let mut batches = 0;
    let mut max = 0;
    for addr in nodes {
        let (status, body) =
            http_get(*addr, "/metrics").unwrap_or_else(|e| panic!("GET {addr}/metrics: {e:#}"));
        assert_eq!(status, 200, "GET {addr}/metrics: {body}");
        batches += metric(&body, PIPELINED_BATCHES).unwrap_or(0);
        max = max.max(metric(&body, IN_FLIGHT_MAX).unwrap_or(0));
    }
    (batches, max)
}

fn brokers_saw_pipelining((batches, max): (i64, i64)) -> bool {
    batches > 0 && max >= 2
}

fn assert_broker_saw_pipelining(nodes: &[SocketAddr], pauses: u32) {
    let (batches, max) = broker_pipelining(nodes);
    println!(
        "broker side: {PIPELINED_BATCHES} {batches}, {IN_FLIGHT_MAX} {max} \
         ({pauses} pauses of {PAUSE:?})"
    );
    assert!(
        brokers_saw_pipelining((batches, max)),
        "the brokers did not report pipelined produce requests: {PIPELINED_BATCHES} = {batches}, \
         {IN_FLIGHT_MAX} = {max} (expected > 0 and >= 2) after {pauses} pauses of {PAUSE:?}"
    );
}

/// Processes stopped with SIGSTOP; dropping this continues them, also when
/// the test fails.
struct Stopped<'a>(&'a [Pid]);

impl<'a> Stopped<'a> {
    fn new(pids: &'a [Pid]) -> Self {
        for pid in pids {
            kill(*pid, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP {pid}: {e}"));
        }
        Stopped(pids)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        for pid in self.0 {
            let _ = kill(*pid, Signal::SIGCONT);
        }
    }
}

fn pid(raw: Option<u32>) -> Pid {
    Pid::from_raw(
        raw.and_then(|p| i32::try_from(p).ok())
            .expect("the broker runs"),
    )
}

/// How many `ack` events the history file holds so far.
fn acks_so_far(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches("\"ev\":\"ack\"").count())
        .unwrap_or(0)
}

/// While the workload runs and the brokers (`pids`, `/metrics` at `http`)
/// have not reported pipelining, pauses them for [`PAUSE`] (see the module
/// docs) and waits until they have answered something sent during the
/// pause. Returns how many pauses it took.
fn pause_until_brokers_see_pipelining(
    pids: &[Pid],
    http: &[SocketAddr],
    script: &mut PyScript,
    history: &Path,
) -> u32 {
    // A pause before the producers produce would hold only their start-up
    // requests.
    wait_until(
        "the workload's first acknowledgement",
        SCRIPT_TIMEOUT,
        || (acks_so_far(history) > 0 || script.has_exited()).then_some(()),
    );
    let mut pauses = 0;
    while !script.has_exited() && !brokers_saw_pipelining(broker_pipelining(http)) {
        let acks = acks_so_far(history);
        {
            let _stopped = Stopped::new(pids);
            std::thread::sleep(PAUSE);
        }
        pauses += 1;
        wait_until(
            "an acknowledgement after a pause of the brokers",
            SCRIPT_TIMEOUT,
            || (acks_so_far(history) > acks || script.has_exited()).then_some(()),
        );
    }
    pauses
}

fn summary(history: &History, report: &EosReport, took: Duration) {
    println!(
        "run: {} transactions committed, {} aborted ({} of them on purpose), {} send failures; \
         checker: {}; took {took:?}",
        history.committed.len(),
        history.aborted.len(),
        history
            .aborted
            .values()
            .filter(|(reason, _)| reason == "random")
            .count(),
        history.failures.len(),
        report.to_string().lines().next().unwrap_or_default()
    );
}

/// One node: run `workload`, then every check of the module docs.
fn run_on_one_node(workload: Workload) {
    let started = Instant::now();
    let node = SamsaNode::start();
    let topic = unique_topic(&format!("pipelined-{}", workload.mode));
    node.client().create_topic(&topic, PARTITIONS).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let history_path = dir.path().join("history.jsonl");
    println!("seed {} (SAMSA_TEST_SEED replays it)", workload.seed);
    let mut script = PyScript::spawn(
        &compat_script("pipelined_producer.py"),
        &workload.args(&node.bootstrap(), &topic, &history_path),
        dir.path(),
    );
    let pauses = pause_until_brokers_see_pipelining(
        &[pid(node.pid())],
        &[node.http_addr()],
        &mut script,
        &history_path,
    );
    let status = script.wait(SCRIPT_TIMEOUT);
    let history = History::read(&history_path).expect("read the history");
    println!("{}", script.output(5));
    assert_script_ok(status, &history, &script);
    // Nothing fails over on one node, so no batch waits for a retry and no
    // OUT_OF_ORDER_SEQUENCE_NUMBER is explained by one: all are the broker's.
    assert!(
        history.retried_out_of_order.is_empty(),
        "OUT_OF_ORDER_SEQUENCE_NUMBER on one node behind a batch awaiting its retry: {:?}\n{}",
        history.retried_out_of_order,
        script.output(40)
    );
    assert_client_pipelined(&history);
    let report = check_exactly_once(&node.bootstrap(), &topic, &history);
    summary(&history, &report, started.elapsed());
    report.assert_ok();
    assert_broker_saw_pipelining(&[node.http_addr()], pauses);
}

#[test]
fn transactional_producers_pipeline_on_one_node() {
    run_on_one_node(Workload {
        mode: "transactional",
        producers: 3,
        transactions: 4,
        records: 5000,
        abort_ratio: 0.25,
        seed: seed(),
        run_id: String::new(),
    });
}

#[test]
fn idempotent_producers_pipeline_on_one_node() {
    run_on_one_node(Workload {
        mode: "idempotent",
        producers: 3,
        transactions: 4,
        records: 5000,
        abort_ratio: 0.0,
        seed: seed(),
        run_id: String::new(),
    });
}

#[test]
fn plain_producers_keep_order_on_one_node() {
    run_on_one_node(Workload {
        mode: "plain",
        producers: 3,
        transactions: 4,
        records: 5000,
        abort_ratio: 0.0,
        seed: seed(),
        run_id: String::new(),
    });
}

/// Settings on top of the harness's fast ones (as in `failover.rs`):
/// followers leave the ISR 2 s after falling behind, a dead broker is
/// fenced 5 s after its last heartbeat.
const CLUSTER_SETTINGS: &[&str] = &[
    "replica_lag_time_max_ms=2000",
    "replica_fetch_wait_max_ms=200",
    "broker_session_timeout_ms=5000",
];

/// How many `commit` events the history file holds so far.
fn commits_so_far(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches("\"ev\":\"commit\"").count())
        .unwrap_or(0)
}

#[test]
fn transactional_producers_pipeline_across_a_leader_kill() {
    let started = Instant::now();
    let mut cluster = SamsaCluster::start(3, CLUSTER_SETTINGS);
    let topic = unique_topic("pipelined-failover");
    txn::create_topic_default_rf(&mut cluster.client(1), &topic, PARTITIONS).unwrap();
    let leaders = wait_until(
        "a leader for every partition",
        Duration::from_secs(30),
        || {
            txn::partition_leaders(&mut cluster.client(1), &topic)
                .filter(|l| l.len() == PARTITIONS as usize)
        },
    );
    let controller = cluster.wait_leader(Duration::from_secs(20));
    // The victim leads some of the topic's partitions; it is neither the
    // controller leader nor the transaction coordinator of the producers,
    // so that only data partitions fail over with pipelined batches in
    // flight (failover.rs and transactions.rs kill those others).
    let victim = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != controller)
        .max_by_key(|id| leaders.values().filter(|l| *l == id).count())
        .unwrap();
    let led: Vec<i32> = leaders
        .iter()
        .filter(|(_, l)| **l == victim)
        .map(|(p, _)| *p)
        .collect();
    assert!(!led.is_empty(), "node {victim} leads none of {leaders:?}");
    const PRODUCERS: u32 = 2;
    let run_id = wait_until(
        "transactional ids coordinated by another node than the victim",
        Duration::from_secs(30),
        || {
            let mut client = cluster.client(controller);
            // FindCoordinator creates __transaction_state if need be.
            client.find_coordinator(1, "pipelined-probe").ok()?;
            let coordinators = txn::partition_leaders(&mut client, txn::TRANSACTION_STATE_TOPIC)?;
            let n = i32::try_from(coordinators.len()).ok()?;
            (0..100).map(|r| format!("r{r}")).find(|run| {
                (0..PRODUCERS).all(|i| {
                    let id = format!("{run}p{i}");
                    coordinators.get(&txn::transaction_state_partition(&id, n)) != Some(&victim)
                })
            })
        },
    );

    let workload = Workload {
        mode: "transactional",
        producers: PRODUCERS,
        transactions: 10,
        records: 5000,
        abort_ratio: 0.2,
        seed: seed(),
        run_id,
    };
    println!("seed {} (SAMSA_TEST_SEED replays it)", workload.seed);
    let dir = tempfile::tempdir().unwrap();
    let history_path = dir.path().join("history.jsonl");
    let mut script = PyScript::spawn(
        &compat_script("pipelined_producer.py"),
        &workload.args(&cluster.bootstrap(), &topic, &history_path),
        dir.path(),
    );

    // Mid-run: the producers have committed twice, more is in flight.
    wait_until(
        "two committed transactions",
        Duration::from_secs(60),
        || (commits_so_far(&history_path) >= 2).then_some(()),
    );
    let commits_at_kill = commits_so_far(&history_path);
    cluster.sigkill(victim);
    println!(
        "killed node {victim} (leader of partitions {led:?}) after {commits_at_kill} commits, \
         {:?} into the run",
        started.elapsed()
    );
    let observer = controller;
    wait_until(
        "the victim's partitions to fail over",
        Duration::from_secs(30),
        || {
            txn::partition_leaders(&mut cluster.client(observer), &topic)
                .filter(|l| l.len() == PARTITIONS as usize && l.values().all(|n| *n != victim))
        },
    );
    cluster.restart(victim);
    println!(
        "restarted node {victim} {:?} into the run",
        started.elapsed()
    );
    // The restarted node counts from zero; the pauses make sure that the
    // nodes as they are now saw pipelining, whatever the kill did.
    let pids: Vec<Pid> = cluster
        .ids()
        .into_iter()
        .map(|id| pid(cluster.pid(id)))
        .collect();
    let http: Vec<SocketAddr> = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.node(id).http_addr())
        .collect();
    let pauses = pause_until_brokers_see_pipelining(&pids, &http, &mut script, &history_path);

    let status = script.wait(SCRIPT_TIMEOUT);
    let history = History::read(&history_path).expect("read the history");
    println!("{}", script.output(5));
    assert!(
        history.committed.len() > commits_at_kill,
        "no transaction committed after the kill: the kill was not mid-run"
    );
    assert_script_ok(status, &history, &script);
    assert_client_pipelined(&history);
    let report = check_exactly_once(&cluster.bootstrap(), &topic, &history);
    summary(&history, &report, started.elapsed());
    report.assert_ok();
    assert_broker_saw_pipelining(&http, pauses);
}
