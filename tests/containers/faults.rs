//! The properties of docs/RELIABILITY.md under the nemesis
//! (`samsa_nemesis`, through `samsa_tests::nemesis`): network partitions
//! made with iptables in the containers' network namespaces, pauses, slow
//! and lossy links, full disks, and a short random schedule of all of them.
//! Each test: a fresh compose cluster, background loads checked exactly
//! once, the fault, its heal, then a full ISR and the same batches on every
//! replica (segment files compared below the high watermark).
//!
//! The nemesis is declared after the cluster in every test, so it is
//! dropped first: a failing test heals before the cluster goes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use samsa_nemesis::log::FaultLog;
use samsa_nemesis::run::run_schedule;
use samsa_nemesis::schedule::{self, FaultKind, ScheduleParams};
use samsa_tests::compose::{ComposeCluster, READY_TIMEOUT};
use samsa_tests::load::IdempotentLoad;
use samsa_tests::nemesis::{
    controller_seen_by, leader_seen_by, nemesis, wait_replicas_agree, ClusterRoles, Probe,
};
use samsa_tests::verify_run::VerifyRun;
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, wait_until};
use samsa_verify::history::Workload;

use super::{assert_exactly_once, index_of, report_gap, Loads};
use super::{PARTITIONS, STATE};

/// `broker_session_timeout_ms` of the container tests (compose::TEST_SETTINGS).
const SESSION_TIMEOUT_MS: u128 = 5_000;

/// Errors a producer may see from a broker whose disk is full (or from a
/// partition moving away from it); every one is retriable.
const RETRIABLE_DISK_ERRORS: &[i16] = &[
    6,  // NOT_LEADER_OR_FOLLOWER
    7,  // REQUEST_TIMED_OUT
    19, // NOT_ENOUGH_REPLICAS
    20, // NOT_ENOUGH_REPLICAS_AFTER_APPEND
    56, // KAFKA_STORAGE_ERROR
];

fn others(victim: i32) -> Vec<usize> {
    (0..3).filter(|i| *i != index_of(victim)).collect()
}

/// After the heal: every node ready, a full ISR on `topics`, the workload
/// checked, and every replica of every topic the same.
fn settle_and_check(c: &ComposeCluster, work: Loads, extra_topics: &[&str]) {
    for i in 0..3 {
        c.wait_node_ready(i, READY_TIMEOUT);
    }
    let mut topics = work.topics().to_vec();
    topics.extend(extra_topics.iter().map(|t| t.to_string()));
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    c.wait_full_isr(&refs, STATE);
    work.finish(c);
    for t in &topics {
        match wait_replicas_agree(c, t, PARTITIONS.min(partitions_of(c, t)), STATE) {
            Ok(n) => eprintln!("containers: {t}: {n} batches the same on all three replicas"),
            Err(why) => panic!("replicas of {t} differ after the heal: {why}"),
        }
    }
}

fn partitions_of(c: &ComposeCluster, topic: &str) -> i32 {
    c.partitions(0, topic)
        .map(|p| i32::try_from(p.len()).unwrap())
        .unwrap_or(PARTITIONS)
}

/// Whether the loads' librdkafka clients took writes on every partition
/// within 20 s after `since` while the fault lasts: `Err` says they did not.
/// A client that still reaches a cut-off node must be sent elsewhere by it
/// (docs/RELIABILITY.md, "An isolated partition leader").
fn clients_moved_on(loads: &Loads, since: Instant) -> Result<String, String> {
    let ctx = loads.idem.producer.context();
    let all = try_wait_until(Duration::from_secs(20), || {
        (0..PARTITIONS)
            .all(|p| ctx.last_ack(p).is_some_and(|t| t > since))
            .then_some(())
    });
    let txn = loads
        .txn
        .finished
        .load(std::sync::atomic::Ordering::Relaxed);
    match all {
        Some(()) => Ok(format!(
            "the idempotent load took writes on every partition {} ms later (transactions ended \
             so far: {txn})",
            since.elapsed().as_millis()
        )),
        None => Err(format!(
            "the idempotent load did NOT take writes on every partition within 20 s during the \
             fault (transactions ended so far: {txn})"
        )),
    }
}

/// A node that is not the controller leader, and the other two.
fn non_controller(c: &ComposeCluster) -> (i32, i32, i32) {
    let controller = c.wait_controller_leader(STATE);
    let victim = (1..=3).rev().find(|id| *id != controller).unwrap();
    let o: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
    (victim, o[0], o[1])
}

/// A one-partition topic led by `leader` (followers `a`, `b`), for a probe.
fn probe_topic(c: &ComposeCluster, name: &str, leader: i32, a: i32, b: i32) -> String {
    let topic = unique_topic(name);
    let client = c.quick_client(index_of(a)).expect("a node to create on");
    c.create_topic_through(client, &topic, 1, Some(&[[leader, a, b]]));
    c.wait_full_isr(&[&topic], STATE);
    topic
}

/// Property: a partition leader cut off from the other nodes (and so from
/// the controller majority) stops acknowledging acks=all writes, a new
/// leader is elected and takes writes, and the old leader acknowledges
/// nothing once the new one leads. Clients on the host still reach it.
#[test]
fn isolated_partition_leader_stops_acking_and_a_new_leader_takes_writes() {
    let started = Instant::now();
    let c = ComposeCluster::start(&[]);
    let mut nem = nemesis(&c);
    let (victim, a, b) = non_controller(&c);
    let ptopic = probe_topic(&c, "isolated-probe", victim, a, b);
    let loads = Loads::start(&c, "isolated");
    let probe = Probe::start(&c, &ptopic, 0, victim);
    loads.idem.wait_progress(500, STATE);

    let at = Instant::now();
    let fault = nem
        .isolate(FaultKind::PartitionLeader, u32::try_from(victim).unwrap())
        .unwrap();
    let new_leader = wait_until("a new leader of the probe partition", STATE, || {
        leader_seen_by(&c, &others(victim), &ptopic, 0).filter(|l| *l != victim)
    });
    let elected = Instant::now();
    // The new leader takes acks=all writes.
    let fresh = Probe::start(&c, &ptopic, 0, new_leader);
    let took_writes = elected.elapsed();
    let moved_on = clients_moved_on(&loads, elected).unwrap_or_else(|e| panic!("{e}"));
    let last_ack = probe
        .last_ack_before(Instant::now())
        .expect("the probe had acks");
    let since_cut = last_ack.saturating_duration_since(at).as_millis();
    let late = probe.acks_after(elected);
    // Cut off for a session timeout, the old leader refuses as leader: the
    // probe's next answer (its requests wait at most 3 s) says so.
    let refused = try_wait_until(Duration::from_secs(10), || {
        probe.errors.lock().unwrap().contains_key(&6).then_some(())
    });
    let errors = probe.errors.lock().unwrap().clone();
    eprintln!(
        "containers: isolated leader {victim}: last acks=all ack {} ms after the cut{}, node \
         {new_leader} elected after {} ms (broker session timeout {SESSION_TIMEOUT_MS} ms); the \
         isolated node kept answering the probe: error codes {errors:?}",
        since_cut,
        if last_ack < at {
            " (none after it)"
        } else {
            ""
        },
        (elected - at).as_millis()
    );
    assert!(
        late.is_empty(),
        "the isolated old leader {victim} acknowledged {} writes after node {new_leader} was \
         elected: {late:?}",
        late.len()
    );
    assert!(!errors.is_empty(), "the isolated node answered nothing");
    assert!(
        refused.is_some(),
        "the isolated node never answered NOT_LEADER_OR_FOLLOWER (it must stop acting as \
         leader once cut off for a session timeout): {errors:?}"
    );
    eprintln!(
        "containers: new leader {new_leader} acknowledged a probe write {} ms after its \
         election; {moved_on}",
        took_writes.as_millis()
    );
    nem.heal(fault).unwrap();
    c.wait_full_isr(&[&ptopic], STATE);
    loads.idem.wait_progress(300, STATE);
    let gap = report_gap(
        &loads.idem,
        at,
        &format!("partition-leader: node {victim} isolated"),
    );
    for (name, p) in [("old", probe), ("new", fresh)] {
        let report = p.finish(&c.bootstrap());
        eprintln!("containers: probe through the {name} leader: {report}");
        assert_exactly_once(&c, &ptopic, &report);
    }
    settle_and_check(&c, loads, &[&ptopic]);
    eprintln!(
        "containers: partition-leader test: unavailability {} ms, wall time {:.1} s",
        gap.as_millis(),
        started.elapsed().as_secs_f64()
    );
}

/// Property: the active controller cut off is replaced, CreateTopics
/// through the majority works, the loads go on.
#[test]
fn isolated_controller_is_replaced_and_metadata_keeps_working() {
    let started = Instant::now();
    let c = ComposeCluster::start(&[]);
    let mut nem = nemesis(&c);
    let loads = Loads::start(&c, "ctrl");
    loads.idem.wait_progress(500, STATE);
    let controller = c.wait_controller_leader(STATE);
    let at = Instant::now();
    let fault = nem
        .isolate(
            FaultKind::PartitionController,
            u32::try_from(controller).unwrap(),
        )
        .unwrap();
    let majority = others(controller);
    let next = wait_until("a new controller leader in the majority", STATE, || {
        controller_seen_by(&c, &majority).filter(|l| *l != controller)
    });
    let elected = at.elapsed();
    let topic = unique_topic("ctrl-created");
    // Replication factor 1: the isolated node is fenced by now, so two
    // brokers are available (CreateTopics with 3 answers INVALID_REPLICATION_FACTOR).
    // Retriable refusals (no controller yet, a timeout) are retried and
    // reported.
    let mut refusals = Vec::new();
    wait_until(
        "CreateTopics through the majority to succeed",
        STATE,
        || match c.quick_client(majority[0])?.create_topic(&topic, 1) {
            Ok(()) => Some(()),
            // An earlier attempt that timed out on the client created it.
            Err(e) if format!("{e:#}").contains("error 36") => Some(()),
            Err(e) => {
                refusals.push(format!("{e:#}"));
                None
            }
        },
    );
    eprintln!(
        "containers: CreateTopics after the controller change: {} refusals before success, first: {:?}",
        refusals.len(),
        refusals.first()
    );
    // Finding 2: the brokers' heartbeats hung on the silent controller, the
    // new one fenced them all, and CreateTopics counted no broker.
    assert!(
        !refusals.iter().any(|r| r.contains("error 38")),
        "CreateTopics was refused INVALID_REPLICATION_FACTOR after the controller change: \
         {refusals:?}"
    );
    wait_until("the new topic in the majority's Metadata", STATE, || {
        c.partitions(majority[1], &topic).filter(|p| !p.is_empty())
    });
    eprintln!(
        "containers: controller {controller} isolated: node {next} leads the quorum after {} ms; \
         CreateTopics through node {} answered after {} ms",
        elected.as_millis(),
        majority[0] + 1,
        at.elapsed().as_millis()
    );
    let moved_on = clients_moved_on(&loads, at).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("containers: controller isolated: {moved_on}");
    nem.heal(fault).unwrap();
    loads.idem.wait_progress(300, STATE);
    let gap = report_gap(
        &loads.idem,
        at,
        &format!("partition-controller: node {controller} isolated"),
    );
    settle_and_check(&c, loads, &[]);
    eprintln!(
        "containers: partition-controller test: unavailability {} ms, wall time {:.1} s",
        gap.as_millis(),
        started.elapsed().as_secs_f64()
    );
}

/// Property: the node hosting the transaction coordinator of the load's
/// transactional id cut off while transactions run: another coordinator
/// takes over and every transaction commits or aborts everywhere (no torn
/// or aborted reads: the transactional load's checks).
#[test]
fn transaction_coordinator_cut_off_mid_commit_never_tears_a_transaction() {
    let started = Instant::now();
    let c = ComposeCluster::start(&[]);
    let mut nem = nemesis(&c);
    let loads = Loads::start(&c, "txncoord");
    loads.txn.wait_progress(4, STATE);
    let coordinator = wait_until("the transaction coordinator", STATE, || {
        let (err, node) = c.any_client()?.find_coordinator(1, &loads.tid).ok()?;
        (err == 0 && node > 0).then_some(node)
    });
    let at = Instant::now();
    let fault = nem
        .isolate(
            FaultKind::PartitionLeader,
            u32::try_from(coordinator).unwrap(),
        )
        .unwrap();
    let before = loads
        .txn
        .finished
        .load(std::sync::atomic::Ordering::Relaxed);
    let during = try_wait_until(Duration::from_secs(30), || {
        (loads
            .txn
            .finished
            .load(std::sync::atomic::Ordering::Relaxed)
            >= before + 4)
            .then_some(())
    });
    eprintln!(
        "containers: transaction coordinator node {coordinator} isolated: {} ({})",
        if during.is_some() {
            "4 more transactions ended"
        } else {
            "fewer than 4 transactions ended in 30 s"
        },
        clients_moved_on(&loads, at).unwrap_or_else(|e| panic!("{e}"))
    );
    nem.heal(fault).unwrap();
    loads.txn.wait_progress(4, STATE);
    let gap = report_gap(&loads.idem, at, "coordinator isolated");
    settle_and_check(&c, loads, &[]);
    eprintln!(
        "containers: coordinator test: unavailability {} ms, wall time {:.1} s",
        gap.as_millis(),
        started.elapsed().as_secs_f64()
    );
}

/// Property: a paused leader that wakes after losing its leadership (the
/// pause outlasts the session timeout: a new leader is elected meanwhile)
/// acknowledges nothing as leader, and its log converges with the others.
#[test]
fn paused_leader_that_lost_leadership_cannot_acknowledge() {
    let started = Instant::now();
    let c = ComposeCluster::start(&[]);
    let mut nem = nemesis(&c);
    let (victim, a, b) = non_controller(&c);
    let ptopic = probe_topic(&c, "paused-probe", victim, a, b);
    let load = IdempotentLoad::start(&c.bootstrap(), &unique_or(&c, "paused-idem"), PARTITIONS);
    let probe = Probe::start(&c, &ptopic, 0, victim);
    let at = Instant::now();
    let fault = nem.pause(u32::try_from(victim).unwrap()).unwrap();
    let new_leader = wait_until("a new leader of the probe partition", STATE, || {
        leader_seen_by(&c, &others(victim), &ptopic, 0).filter(|l| *l != victim)
    });
    let elected = Instant::now();
    let target = load.acked() + 300;
    let during = try_wait_until(Duration::from_secs(20), || {
        (load.acked() >= target).then_some(())
    });
    eprintln!(
        "containers: paused leader {victim}: the load {} during the pause",
        if during.is_some() {
            "took 300 more acks"
        } else {
            "did NOT take 300 more acks in 20 s"
        }
    );
    nem.heal(fault).unwrap();
    load.wait_progress(300, STATE);
    let woke = Instant::now();
    c.wait_node_ready(index_of(victim), READY_TIMEOUT);
    c.wait_full_isr(&[&ptopic, &load.topic], STATE);
    // The woken node answered the probe (as a follower) by now.
    let answered = probe.errors.lock().unwrap().clone();
    let late = probe.acks_after(elected);
    let leader_now = leader_seen_by(&c, &[0, 1, 2], &ptopic, 0);
    eprintln!(
        "containers: paused leader {victim}: node {new_leader} elected {} ms into the pause, \
         unpaused after {} ms; acks from node {victim} after the election: {}; its answers: \
         {answered:?}",
        (elected - at).as_millis(),
        (woke - at).as_millis(),
        late.len()
    );
    assert_ne!(
        leader_now,
        Some(victim),
        "the old leader leads again, which this test does not expect"
    );
    assert!(
        late.is_empty(),
        "node {victim} acknowledged {} writes after it lost leadership: {late:?}",
        late.len()
    );
    let gap = report_gap(&load, at, &format!("pause of leader node {victim}"));
    let report = probe.finish(&c.bootstrap());
    assert_exactly_once(&c, &ptopic, &report);
    let topic = load.topic.clone();
    let r = load.finish(&c.bootstrap());
    eprintln!("containers: idempotent load: {r}");
    assert_exactly_once(&c, &topic, &r);
    for t in [&topic, &ptopic] {
        let parts = partitions_of(&c, t);
        wait_replicas_agree(&c, t, parts, STATE)
            .unwrap_or_else(|why| panic!("replicas of {t} differ: {why}"));
    }
    eprintln!(
        "containers: paused-leader test: unavailability {} ms, wall time {:.1} s",
        gap.as_millis(),
        started.elapsed().as_secs_f64()
    );
}

/// A topic of [`PARTITIONS`] partitions (RF 3) with a full ISR.
fn unique_or(c: &ComposeCluster, name: &str) -> String {
    let t = unique_topic(name);
    c.create_topic(&t, PARTITIONS, None);
    c.wait_full_isr(&[&t], STATE);
    t
}

/// Property: a slow link, then a lossy one, on one node: the loads go on
/// (maybe slower) and nothing is lost.
#[test]
fn slow_and_lossy_links_lose_nothing() {
    let started = Instant::now();
    let c = ComposeCluster::start(&[]);
    let mut nem = nemesis(&c);
    let loads = Loads::start(&c, "links");
    loads.idem.wait_progress(500, STATE);
    let mut gaps = Vec::new();
    for (i, kind) in [FaultKind::Delay, FaultKind::Loss].into_iter().enumerate() {
        let node = u32::try_from(i + 1).unwrap();
        let at = Instant::now();
        let fault = match kind {
            FaultKind::Delay => nem.delay(node, 100).unwrap(),
            _ => nem.loss(node, 20).unwrap(),
        };
        eprintln!("containers: {kind} on node {node}: {}", fault.detail);
        loads.idem.wait_progress(500, STATE);
        loads.txn.wait_progress(2, STATE);
        let took = at.elapsed();
        nem.heal(fault).unwrap();
        eprintln!(
            "containers: {kind} on node {node}: 500 acks and 2 transactions took {} ms",
            took.as_millis()
        );
        gaps.push(report_gap(
            &loads.idem,
            at,
            &format!("{kind} on node {node}"),
        ));
    }
    settle_and_check(&c, loads, &[]);
    eprintln!(
        "containers: links test: unavailability {:?} ms, wall time {:.1} s",
        gaps.iter().map(Duration::as_millis).collect::<Vec<_>>(),
        started.elapsed().as_secs_f64()
    );
}

/// What a node logs when it stops because its controller's store failed
/// (`crates/samsa-broker/src/cluster/node.rs`).
const CONTROLLER_FAIL_STOP: &str = "this node's controller stopped";

fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `docker inspect` StartedAt of node `index`'s container: unchanged means
/// no restart.
fn started_at(c: &ComposeCluster, index: usize) -> String {
    samsa_tests::compose::docker(&[
        "inspect",
        "--format",
        "{{.State.StartedAt}}",
        &c.container(index),
    ])
    .trim()
    .to_string()
}

/// Property: a full disk on a follower, then on the leader: produce answers
/// only retriable errors (KAFKA_STORAGE_ERROR or one that moves the client
/// on), nothing acknowledged is lost, and once space is freed the node
/// recovers without operator action and catches up (a full ISR again):
/// its broker without a restart, its controller (if a metadata write
/// reached it meanwhile) by a fail-stop and the supervisor's restart.
#[test]
fn full_disk_on_follower_then_leader_loses_nothing_and_recovers_once_space_is_freed() {
    let started = Instant::now();
    let c = ComposeCluster::with_small_disks(&[], 256);
    let mut nem = nemesis(&c);
    let (follower, leader, other) = non_controller(&c);
    // `leader` leads every partition, `follower` follows every one.
    let topic = unique_topic("disk");
    c.create_topic(
        &topic,
        PARTITIONS,
        Some(&[
            [leader, other, follower],
            [leader, other, follower],
            [leader, other, follower],
        ]),
    );
    c.wait_full_isr(&[&topic], STATE);
    let load = IdempotentLoad::start(&c.bootstrap(), &topic, PARTITIONS);
    // The probe on a topic of its own (the load's checker reads every
    // record of its topic), with the same replicas.
    let ptopic = probe_topic(&c, "disk-probe", leader, other, follower);
    let probe = Probe::start(&c, &ptopic, 0, leader);
    load.wait_progress(500, STATE);

    for (node, role) in [(follower, "follower"), (leader, "leader")] {
        let index = index_of(node);
        let before = started_at(&c, index);
        let errors_before = probe.errors.lock().unwrap().clone();
        let at = Instant::now();
        let fault = nem.disk_full(u32::try_from(node).unwrap()).unwrap();
        eprintln!(
            "containers: disk-full on {role} node {node}: {}",
            fault.detail
        );
        if role == "follower" {
            wait_until(
                &format!("follower {node} with a full disk out of an ISR"),
                STATE,
                || {
                    let parts = c.partitions(index_of(leader), &topic)?;
                    parts.iter().any(|p| !p.isr.contains(&node)).then_some(())
                },
            );
            load.wait_progress(300, STATE);
        } else {
            wait_until(
                "a produce error from the leader with a full disk (or its fail-stop)",
                STATE,
                || {
                    (*probe.errors.lock().unwrap() != errors_before
                        || started_at(&c, index) != before)
                        .then_some(())
                },
            );
        }
        let errors = probe.errors.lock().unwrap().clone();
        nem.heal(fault).unwrap();
        let healed = Instant::now();
        c.wait_full_isr(&[&topic], STATE);
        load.wait_progress(300, STATE);
        let after = started_at(&c, index);
        eprintln!(
            "containers: disk-full on {role} node {node}: produce answers {errors:?} (code → \
             count), full ISR {} ms after space was freed; container started at {before} / \
             {after}",
            healed.elapsed().as_millis()
        );
        // The broker rides out a full disk; its controller cannot (sled
        // keeps its first I/O error): if a metadata write reached it while
        // the disk was full, the node stopped with that reason and the
        // compose file's `restart: on-failure` brought it back once space
        // was freed. Any other restart is a crash.
        if before != after {
            let logs = c.service_logs(index);
            assert!(
                logs.contains(CONTROLLER_FAIL_STOP),
                "{role} node {node} restarted with a full disk, and not because its controller \
                 stopped:\n{}",
                tail_lines(&logs, 80)
            );
            eprintln!(
                "containers: disk-full on {role} node {node}: its controller's store failed on \
                 the full disk; the node stopped and was restarted by the supervisor"
            );
        }
        for code in errors.keys() {
            assert!(
                RETRIABLE_DISK_ERRORS.contains(code),
                "the probe saw error code {code} with a full disk on {role} node {node}"
            );
        }
        report_gap(&load, at, &format!("disk-full on {role} node {node}"));
    }
    let report = probe.finish(&c.bootstrap());
    assert_exactly_once(&c, &ptopic, &report);
    let r = load.finish(&c.bootstrap());
    eprintln!("containers: idempotent load: {r}");
    assert_exactly_once(&c, &topic, &r);
    wait_replicas_agree(&c, &topic, PARTITIONS, STATE)
        .unwrap_or_else(|why| panic!("replicas of {topic} differ: {why}"));
    eprintln!(
        "containers: disk-full test: wall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// For every duplicate anomaly of `report`, the stored batches holding its
/// copies on every node: their producer epoch and sequence say whether a
/// broker stored a retried batch twice or a client sent it again as a new
/// one (before, a failing run kept only the values and offsets).
fn print_duplicates_as_stored(c: &ComposeCluster, report: &serde_json::Value) {
    let Some(anomalies) = report["anomalies"].as_array() else {
        return;
    };
    let examples = anomalies
        .iter()
        .filter(|a| a["kind"] == "duplicate")
        .filter_map(|a| a["examples"].as_array())
        .flatten()
        .filter_map(|e| e.as_str());
    for example in examples {
        // "<workload>: <value> at <topic>[<partition>]@<offset>, …"
        let mut at: BTreeMap<(String, i32), Vec<i64>> = BTreeMap::new();
        for place in example.split([' ', ',']) {
            let parsed = place.split_once('[').and_then(|(topic, rest)| {
                let (partition, offset) = rest.split_once("]@")?;
                Some((
                    topic.to_string(),
                    partition.parse().ok()?,
                    offset.parse().ok()?,
                ))
            });
            if let Some((topic, partition, offset)) = parsed {
                at.entry((topic, partition)).or_default().push(offset);
            }
        }
        for ((topic, partition), offsets) in at {
            eprintln!(
                "containers: duplicate {example}; stored as:\n{}",
                samsa_tests::nemesis::describe_stored_batches(c, &topic, partition, &offsets)
            );
        }
    }
}

/// The short random schedule: every fault kind at least once in about three
/// minutes while `samsa verify` runs all four workloads (idempotent,
/// transactional, consume-transform-produce, queue) against the cluster
/// through the host ports; verify must find zero anomalies, and afterwards
/// every partition has a full ISR and the same batches on every replica.
/// `SAMSA_TEST_SEED` replays a schedule; the seed is always printed.
#[test]
fn random_schedule_of_every_fault_kind_under_samsa_verify_has_no_anomaly() {
    let started = Instant::now();
    let seed: u64 = std::env::var("SAMSA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    // The long schedule of docs/RELIABILITY.md is this test with
    // SAMSA_SCHEDULE_SECS=1800, run by hand (`cargo test`, no nextest limit).
    let schedule_secs: u64 = std::env::var("SAMSA_SCHEDULE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(170);
    let params = ScheduleParams {
        duration: Duration::from_secs(schedule_secs),
        kinds: FaultKind::ALL.to_vec(),
        mean_interval: Duration::from_secs(4),
        mean_length: Duration::from_secs(8),
        nodes: 3,
    };
    let steps = schedule::generate(seed, &params);
    let summary = schedule::summary(seed, &params, &steps);
    eprintln!("containers: nemesis {summary} (replay: SAMSA_TEST_SEED={seed})");
    for k in FaultKind::ALL {
        assert!(
            steps.iter().any(|s| s.kind == k),
            "seed {seed}: the schedule lacks {k}"
        );
    }
    let c = ComposeCluster::with_small_disks(&[], 256);
    let mut nem = nemesis(&c);
    let faults_dir = tempfile::TempDir::new().unwrap();
    let fault_log_path = faults_dir.path().join("faults.jsonl");
    let mut fault_log = FaultLog::create(&fault_log_path).unwrap();
    fault_log.header(seed, &summary).unwrap();
    // Producing lasts the schedule and a fault-free tail, so every workload
    // also shows it recovered.
    let verify = VerifyRun::start(
        &[
            "--bootstrap-server",
            &c.bootstrap(),
            "--duration",
            &format!("{}s", schedule_secs + 20),
            "--rate",
            "200",
            "--seed",
            &seed.to_string(),
            "--faults",
            &fault_log_path.display().to_string(),
            // librdkafka's idempotence and transaction states, epoch bumps
            // with their cause among them: a duplicate stored under a new
            // producer epoch is explained by them (RELIABILITY, Open).
            "-X",
            "debug=eos",
        ]
        .map(String::from),
    );
    let topics = verify.wait_producing(Duration::from_secs(120));
    let data_topic = topics
        .iter()
        .find(|t| t.workload == Workload::Idempotent)
        .map(|t| t.topic.clone())
        .expect("verify's run_started names its idempotent topic");
    let mut roles = ClusterRoles {
        cluster: &c,
        topic: data_topic,
        partition: 0,
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = run_schedule(&mut nem, &mut roles, &steps, &stop, |line| {
        eprintln!("containers: nemesis {line}")
    })
    .unwrap_or_else(|e| panic!("seed {seed}: the nemesis failed: {e}"));
    for r in &out.healed {
        fault_log.write(r).unwrap();
    }
    eprintln!(
        "containers: seed {seed}: {} faults healed, skipped {:?}",
        out.healed.len(),
        out.skipped
    );
    // The fault-free tail, the drain and the final reads (`--settle` 60 s each).
    let done = verify.finish(Duration::from_secs(300));
    let report = &done.report;
    print_duplicates_as_stored(&c, report);
    assert_eq!(
        done.status.code(),
        Some(0),
        "seed {seed}: samsa verify failed:\n{report:#}\nlibrdkafka's epoch bumps and sequence \
         errors:\n{}\nstderr ends:\n{}",
        done.stderr_lines_with(
            &["ERRSEQ", "UNKPID", "epoch bump for", "requires epoch bump"],
            200
        ),
        done.stderr_tail(60)
    );
    assert_eq!(report["anomaly_count"], 0, "seed {seed}: {report:#}");
    for w in ["idempotent", "txn", "pipeline", "queue"] {
        let ops = report["workloads"][w]["ops"].as_u64().unwrap_or(0);
        assert!(ops > 0, "seed {seed}: workload {w} did nothing: {report:#}");
    }
    eprintln!(
        "containers: seed {seed}: samsa verify: {} operations, 0 anomalies; unavailability per \
         fault kind: {}",
        ["idempotent", "txn", "pipeline", "queue"]
            .iter()
            .map(|w| report["workloads"][*w]["ops"].as_u64().unwrap_or(0))
            .sum::<u64>(),
        report["faults"]
    );
    for i in 0..3 {
        c.wait_node_ready(i, READY_TIMEOUT);
    }
    let names: Vec<&str> = topics.iter().map(|t| t.topic.as_str()).collect();
    c.wait_full_isr(&names, STATE);
    for t in &topics {
        match wait_replicas_agree(&c, &t.topic, t.partitions, STATE) {
            Ok(n) => eprintln!(
                "containers: {}: {n} batches the same on all three replicas",
                t.topic
            ),
            Err(why) => panic!(
                "seed {seed}: replicas of {} differ after the heal: {why}",
                t.topic
            ),
        }
    }
    eprintln!(
        "containers: random schedule seed {seed}: wall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
