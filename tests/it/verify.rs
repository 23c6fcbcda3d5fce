//! `samsa verify` as a user runs it: the real binary against a single
//! node and against a three-node cluster whose partition leader is
//! SIGKILLed mid-run (both must come out clean, exit 0), and `samsa verify
//! check` on a real history with an event removed or altered (exit 1, the
//! anomaly named).

use std::path::{Path, PathBuf};
use std::time::Duration;

use samsa_tests::cluster::{run_cli, CliOutput, SamsaCluster};
use samsa_tests::node::samsa_bin;
use samsa_tests::txn::partition_leaders;
use samsa_tests::wait::{try_wait_until, wait_until};
use samsa_tests::{unique_topic, SamsaNode};
use serde_json::Value;

/// Longest a verify run of these tests may take, start to report.
const RUN_TIMEOUT: Duration = Duration::from_secs(150);
const WORKLOADS: [&str; 4] = ["idempotent", "txn", "pipeline", "queue"];

fn verify_args(bootstrap: &str, prefix: &str, history: &Path, duration: &str) -> Vec<String> {
    [
        "verify",
        "--bootstrap-server",
        bootstrap,
        "--duration",
        duration,
        "--rate",
        "200",
        "--seed",
        "15",
        "--topic-prefix",
        prefix,
        "--history",
        &history.display().to_string(),
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn report_of(out: &CliOutput) -> Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): status {:?}\nstdout: {}\nstderr: {}",
            out.status, out.stdout, out.stderr
        )
    })
}

/// Exit 0, no anomaly, every workload did something.
fn assert_clean(out: &CliOutput) -> Value {
    let report = report_of(out);
    let stderr_tail = || {
        let lines: Vec<&str> = out.stderr.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    };
    assert_eq!(
        out.status.code(),
        Some(0),
        "verify failed:\n{report:#}\nstderr: {}",
        stderr_tail()
    );
    assert_eq!(report["anomaly_count"], 0, "{report:#}");
    assert_eq!(report["valid"], true, "{report:#}");
    for w in WORKLOADS {
        let ops = report["workloads"][w]["ops"].as_u64().unwrap_or(0);
        assert!(
            ops > 0,
            "workload {w} did nothing: {report:#}\n{}",
            stderr_tail()
        );
    }
    assert!(report["transactions"]["committed"].as_u64().unwrap_or(0) > 0);
    report
}

fn history_in(dir: &Path) -> PathBuf {
    dir.join("history.jsonl")
}

#[test]
fn a_run_against_one_node_is_clean() {
    let node = SamsaNode::start();
    let dir = tempfile::tempdir().unwrap();
    let history = history_in(dir.path());
    let out = run_cli(
        &samsa_bin(),
        &verify_args(&node.bootstrap(), &unique_topic("verify1"), &history, "10s"),
        RUN_TIMEOUT,
    );
    let report = assert_clean(&out);
    assert!(history.is_file());
    // The offline check of the same history says the same.
    let again = run_cli(
        &samsa_bin(),
        &[
            "verify".into(),
            "check".into(),
            "--history".into(),
            history.display().to_string(),
            "--json".into(),
        ],
        RUN_TIMEOUT,
    );
    assert_eq!(again.status.code(), Some(0), "{}", again.stderr);
    assert_eq!(report_of(&again)["workloads"], report["workloads"]);
}

/// Broker sessions long enough for a loaded machine (see it/failover.rs).
const CLUSTER_SETTINGS: &[&str] = &[
    "replica_lag_time_max_ms=2000",
    "replica_fetch_wait_max_ms=200",
    "broker_session_timeout_ms=5000",
];

#[test]
fn a_run_across_a_partition_leader_kill_is_clean() {
    let mut cluster = SamsaCluster::start(3, CLUSTER_SETTINGS);
    let dir = tempfile::tempdir().unwrap();
    let history = history_in(dir.path());
    let prefix = unique_topic("verify3");
    let args = verify_args(&cluster.bootstrap(), &prefix, &history, "20s");
    let run = std::thread::spawn(move || run_cli(&samsa_bin(), &args, RUN_TIMEOUT));

    // Mid-run: once the workloads have written for a while, kill the
    // leader of the txn topic's partition 0 and start it again once
    // another broker leads it.
    let topic = format!("{prefix}-txn");
    let victim = wait_until("the txn topic's leaders", Duration::from_secs(60), || {
        partition_leaders(&mut cluster.client(1), &topic)?
            .get(&0)
            .copied()
    });
    wait_until("the run to be under way", Duration::from_secs(60), || {
        let lines = std::fs::read_to_string(&history).ok()?.lines().count();
        (lines > 2_000).then_some(())
    });
    cluster.sigkill(victim);
    let other = cluster.ids().into_iter().find(|id| *id != victim).unwrap();
    let moved = try_wait_until(Duration::from_secs(30), || {
        let leader = *partition_leaders(&mut cluster.client(other), &topic)?.get(&0)?;
        (leader != victim).then_some(leader)
    });
    assert!(
        moved.is_some(),
        "no new leader of {topic}[0] after killing {victim}"
    );
    cluster.restart(victim);

    let out = run.join().unwrap();
    let report = assert_clean(&out);
    eprintln!(
        "longest gap without an ack: {}",
        report["availability"]["longest_gap"]
    );
}

/// `samsa verify check` on `events`, as a file in `dir`.
fn check(dir: &Path, name: &str, events: &[Value]) -> CliOutput {
    let path = dir.join(name);
    let text: String = events.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(&path, text).unwrap();
    run_cli(
        &samsa_bin(),
        &[
            "verify".into(),
            "check".into(),
            "--history".into(),
            path.display().to_string(),
        ],
        RUN_TIMEOUT,
    )
}

#[test]
fn check_names_an_anomaly_put_into_a_real_history() {
    let node = SamsaNode::start();
    let dir = tempfile::tempdir().unwrap();
    let history = history_in(dir.path());
    let out = run_cli(
        &samsa_bin(),
        &verify_args(&node.bootstrap(), &unique_topic("verifyc"), &history, "5s"),
        RUN_TIMEOUT,
    );
    assert_clean(&out);
    let events: Vec<Value> = std::fs::read_to_string(&history)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let untouched = check(dir.path(), "same.jsonl", &events);
    assert_eq!(untouched.status.code(), Some(0), "{}", untouched.stdout);

    // An acknowledged idempotent record missing from the final read: lost.
    let acked: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "ack" && e["workload"] == "idempotent")
        .filter_map(|e| e["value"].as_str())
        .collect();
    let victim = acked[acked.len() / 2].to_string();
    let without: Vec<Value> = events
        .iter()
        .filter(|e| !(e["type"] == "final_read" && e["value"] == victim.as_str()))
        .cloned()
        .collect();
    assert!(without.len() < events.len());
    let out = check(dir.path(), "lost.jsonl", &without);
    assert_eq!(out.status.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.contains("lost: 1"), "{}", out.stdout);
    assert!(out.stdout.contains(&victim), "{}", out.stdout);

    // A committed transaction's record read as the wrong value: an offset
    // conflict (and the record itself then torn out of its transaction).
    let mut altered = events.clone();
    let read = altered
        .iter_mut()
        .find(|e| {
            e["type"] == "final_read"
                && e["isolation"] == "read_committed"
                && e["topic"].as_str().is_some_and(|t| t.ends_with("-txn"))
        })
        .unwrap();
    read["value"] = Value::from("not-what-was-written");
    let out = check(dir.path(), "conflict.jsonl", &altered);
    assert_eq!(out.status.code(), Some(1), "{}", out.stdout);
    assert!(out.stdout.contains("offset-conflict: "), "{}", out.stdout);
    assert!(out.stdout.contains("torn-transaction: 1"), "{}", out.stdout);
}

#[test]
fn an_unreachable_cluster_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let port = samsa_tests::node::free_port();
    let out = run_cli(
        &samsa_bin(),
        &verify_args(
            &format!("127.0.0.1:{port}"),
            "verify-unreachable",
            &history_in(dir.path()),
            "5s",
        ),
        RUN_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("error: cannot reach the cluster"),
        "{}",
        out.stderr
    );
}

/// The compact workload against one node whose cleaner looks for work
/// every 200 ms: the run is clean (exit 0) and its final read shows that
/// compaction happened (fewer records than writes, superseded writes due
/// and gone); a superseded record put back into its history is then
/// `compaction-overdue`.
#[test]
fn a_compacted_topic_run_against_one_node_is_clean() {
    let started = std::time::Instant::now();
    let node = SamsaNode::start_with(&["log_cleaner_backoff_ms=200"]);
    let dir = tempfile::tempdir().unwrap();
    let history = history_in(dir.path());
    let mut args = verify_args(&node.bootstrap(), &unique_topic("verifyk"), &history, "15s");
    args.extend(
        [
            "--workload",
            "compact",
            "--compact-max-lag",
            "2s",
            "--compact-delete-retention",
            "2s",
            "--compact-grace",
            "5s",
            "--settle",
            "20s",
        ]
        .map(String::from),
    );
    let out = run_cli(&samsa_bin(), &args, Duration::from_secs(55));
    let report = report_of(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "verify failed:\n{report:#}\nstderr: {}",
        out.stderr
    );
    assert_eq!(report["anomaly_count"], 0, "{report:#}");
    let compacted = &report["compacted"][0];
    let count = |field: &str| compacted[field].as_u64().unwrap_or(0);
    let (writes, read, due) = (count("writes"), count("read"), count("due_for_removal"));
    eprintln!(
        "compacted topic: {writes} writes acknowledged or committed, {read} records in the final read, {due} due for removal, run took {:?}",
        started.elapsed()
    );
    assert!(writes > 500, "{report:#}");
    assert!(count("tombstones") > 0, "{report:#}");
    assert!(read < writes / 2, "no compaction to speak of: {report:#}");
    assert!(due > writes / 4, "the deadlines judged little: {report:#}");
    assert!(report["transactions"]["committed"].as_u64().unwrap_or(0) > 0);
    assert!(report["transactions"]["aborted"].as_u64().unwrap_or(0) > 0);

    // Put back a superseded record where it was acknowledged: the cleaner
    // had to remove it long before the final read.
    let events: Vec<Value> = std::fs::read_to_string(&history)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let read_values: std::collections::HashSet<&str> = events
        .iter()
        .filter(|e| e["type"] == "final_read")
        .filter_map(|e| e["value"].as_str())
        .collect();
    let send_of = |value: &str| {
        events
            .iter()
            .find(|e| e["type"] == "send" && e["value"] == value)
            .unwrap()
            .clone()
    };
    let first_gone = events
        .iter()
        .find(|e| {
            e["type"] == "ack"
                && e["workload"] == "compact"
                && e["txn"].is_null()
                && e["offset"].as_i64().is_some_and(|o| o >= 0)
                && e["value"]
                    .as_str()
                    .is_some_and(|v| !read_values.contains(v) && send_of(v)["tombstone"].is_null())
        })
        .unwrap()
        .clone();
    let mut altered = events.clone();
    let at = altered
        .iter()
        .position(|e| e["type"] == "final_read_done")
        .unwrap();
    altered.insert(
        at,
        serde_json::json!({
            "time_ms": altered[at]["time_ms"],
            "type": "final_read",
            "isolation": "read_committed",
            "topic": first_gone["topic"],
            "partition": first_gone["partition"],
            "offset": first_gone["offset"],
            "value": first_gone["value"],
            "key": send_of(first_gone["value"].as_str().unwrap())["key"],
        }),
    );
    let out = check(dir.path(), "overdue.jsonl", &altered);
    assert_eq!(out.status.code(), Some(1), "{}", out.stdout);
    assert!(
        out.stdout.contains("compaction-overdue: 1"),
        "{}",
        out.stdout
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}
