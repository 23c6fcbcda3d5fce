//! The three-node cluster of `deploy/compose.yaml` in real Docker
//! containers (`samsa_tests::compose::ComposeCluster`), under faults Docker
//! injects, checked by the exactly-once checker. Each test brings up its own
//! compose project and removes it (containers, network, volumes) at the end.
//!
//! - `forms_from_identical_config_and_serves_both_listeners`: node ids from
//!   the host names, Metadata through the host listener (127.0.0.1
//!   addresses) and the network listener (samsa-N:9092), host and in-network
//!   clients produce and read each other's records.
//! - `sigkill_of_partition_leader_then_controller_leader_loses_nothing`:
//!   `docker kill` of a partition leader, then of the controller leader,
//!   under an idempotent and a transactional load; both restarted.
//! - `paused_follower_leaves_and_rejoins_the_isr`: `docker pause` of a
//!   follower takes it out of the ISR, `unpause` brings it back.
//! - `rolling_restart_loses_nothing_and_tears_no_transaction`.
//! - `down_and_up_keeps_every_record`: `down` without `-v`, then `up`.
//! - `node_with_a_wiped_volume`: see its doc comment.
//! - `sasl_ssl::…`: `deploy/compose.sasl-ssl.yaml` (SASL_SSL, mutual TLS
//!   between containers, ACLs) serving confluent-kafka on the host.
//!
//! Every fault prints one `containers: …` line with the unavailability it
//! caused: the longest pause between acknowledgements of one partition of
//! the idempotent producer (acks=all) around the fault.
//!
//! Run with `cargo build --release -p samsa && cargo nextest run -p
//! samsa-tests --test containers --profile containers` (docs/DEPLOY.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use samsa_tests::checker::EosReport;
use samsa_tests::cluster::median_and_max;
use samsa_tests::compose::{image_size, ComposeCluster, READY_TIMEOUT, SERVICES};
use samsa_tests::load::{IdempotentLoad, TxnLoad};
use samsa_tests::pipeline::read_keyed;
use samsa_tests::rdk;
use samsa_tests::txn::{read_values, Isolation, TxnProducer};
use samsa_tests::{unique_topic, wait_until, KafkaClient};

mod faults;
mod sasl_ssl;

const PARTITIONS: i32 = 3;
/// How long a cluster state the tests wait for may take.
const STATE: Duration = Duration::from_secs(60);

fn index_of(node_id: i32) -> usize {
    usize::try_from(node_id - 1).expect("node ids start at 1")
}

/// A client to the node leading `topic`-`partition`, by any node's Metadata.
fn leader_client(c: &ComposeCluster, topic: &str, partition: i32) -> Option<KafkaClient> {
    let leader = (0..3).find_map(|i| {
        let parts = c.partitions(i, topic)?;
        let p = parts.iter().find(|p| p.partition == partition)?;
        (p.leader > 0).then_some(p.leader)
    })?;
    c.quick_client(index_of(leader))
}

/// Asserts `report` (a load on `topic`) is clean. A failure on
/// duplicates carries how every node stored their copies: the producer
/// epoch and sequence of each copy tell a broker that stored a retried
/// batch twice from a client that sent it again as a new one.
fn assert_exactly_once(c: &ComposeCluster, topic: &str, report: &EosReport) {
    if report.is_ok() {
        return;
    }
    let stored: Vec<String> = report
        .duplicate_offsets
        .iter()
        .map(|(partition, offsets)| {
            format!(
                "{topic}-{partition}:\n{}",
                samsa_tests::nemesis::describe_stored_batches(c, topic, *partition, offsets)
            )
        })
        .collect();
    panic!(
        "exactly-once check failed:\n{report}\nduplicates as stored:\n{}",
        stored.join("\n")
    );
}

/// An idempotent and a transactional load, each on its own topic
/// (3 partitions, RF 3, min.insync.replicas 2).
struct Loads {
    idem: IdempotentLoad,
    txn: TxnLoad,
    /// The transactional load's transactional id.
    tid: String,
}

impl Loads {
    fn start(c: &ComposeCluster, name: &str) -> Loads {
        let idem_topic = unique_topic(&format!("{name}-idem"));
        let txn_topic = unique_topic(&format!("{name}-txn"));
        c.create_topic(&idem_topic, PARTITIONS, None);
        c.create_topic(&txn_topic, PARTITIONS, None);
        c.wait_full_isr(&[&idem_topic, &txn_topic], STATE);
        let idem = IdempotentLoad::start(&c.bootstrap(), &idem_topic, PARTITIONS);
        let tid = unique_topic(&format!("{name}-tid"));
        let txn = TxnLoad::start(&c.bootstrap(), &txn_topic, PARTITIONS, &tid);
        Loads { idem, txn, tid }
    }

    fn topics(&self) -> [String; 2] {
        [self.idem.topic.clone(), self.txn.topic.clone()]
    }

    /// Stops both loads and asserts the checker's verdicts: nothing lost,
    /// duplicated or out of order, no aborted record read, no transaction
    /// partly visible, some transactions committed and some aborted.
    fn finish(self, c: &ComposeCluster) {
        self.finish_through(c, &c.bootstrap());
    }

    /// [`Loads::finish`], reading back through `bootstrap`.
    fn finish_through(self, c: &ComposeCluster, bootstrap: &str) {
        let txn_topic = self.txn.topic.clone();
        let idem_topic = self.idem.topic.clone();
        let report = self.idem.finish(bootstrap);
        eprintln!("containers: idempotent load: {report}");
        assert_exactly_once(c, &idem_topic, &report);
        let out = self
            .txn
            .finish(bootstrap, |p| leader_client(c, &txn_topic, p));
        eprintln!(
            "containers: transactional load: {} committed, {} aborted, {} unknown to the client \
             ({} of them committed), torn {}; {}",
            out.committed,
            out.aborted,
            out.unknown,
            out.unknown_committed,
            out.torn.len(),
            out.report
        );
        assert!(out.torn.is_empty(), "torn transactions: {:#?}", out.torn);
        assert_exactly_once(c, &txn_topic, &out.report);
        assert!(
            out.committed > 0 && out.aborted > 0,
            "the transactional load committed {} and aborted {}",
            out.committed,
            out.aborted
        );
    }
}

/// After a fault to node `victim` at `at`: waits until the other nodes'
/// Metadata shows no partition of the loads' topics led by it (or without
/// a leader), then until every partition of the idempotent topic took an
/// acknowledgement after that and the transactional load ended two more
/// transactions. Prints and returns the unavailability: the longest pause
/// between acknowledgements of one partition overlapping the fault.
fn await_failover(
    c: &ComposeCluster,
    loads: &Loads,
    victim: i32,
    at: Instant,
    what: &str,
) -> Duration {
    let topics = loads.topics();
    let others: Vec<usize> = (0..3).filter(|i| *i != index_of(victim)).collect();
    wait_until(
        &format!("the partitions of node {victim} to move to other leaders"),
        STATE,
        || {
            let i = *others.iter().find(|i| c.quick_client(**i).is_some())?;
            for t in &topics {
                let parts = c.partitions(i, t)?;
                if parts.iter().any(|p| p.leader == victim || p.leader <= 0) {
                    return None;
                }
            }
            Some(())
        },
    );
    let moved = Instant::now();
    let ctx = loads.idem.producer.context();
    wait_ack_on_every_partition(ctx, moved, "after the leaders moved");
    loads.txn.wait_progress(2, STATE);
    report_gap(&loads.idem, at, what)
}

/// Waits until the idempotent producer has an acknowledgement newer than
/// `since` on every partition: writes go on everywhere.
fn wait_ack_on_every_partition(ctx: &rdk::CheckingContext, since: Instant, when: &str) {
    wait_until(
        &format!("an acknowledgement on every partition {when}"),
        STATE,
        || {
            (0..PARTITIONS)
                .all(|p| ctx.last_ack(p).is_some_and(|t| t > since))
                .then_some(())
        },
    );
}

fn report_gap(idem: &IdempotentLoad, at: Instant, what: &str) -> Duration {
    let gap = idem.longest_gap(at, Instant::now());
    let (length, partition) = gap.map_or((Duration::ZERO, -1), |g| (g.length(), g.partition));
    eprintln!(
        "containers: fault {what}: unavailable {} ms (longest pause between acknowledgements of \
         one partition, partition {partition})",
        length.as_millis()
    );
    length
}

fn print_summary(what: &str, gaps: &[Duration]) {
    let (median, worst) = median_and_max(gaps);
    eprintln!(
        "containers: {what}: {} faults, unavailability median {} ms, worst {} ms",
        gaps.len(),
        median.as_millis(),
        worst.as_millis()
    );
}

/// The node's address on the project network, for the test process (on the
/// Docker host, which routes to the bridge network).
fn container_ip(c: &ComposeCluster, index: usize) -> String {
    let ip = samsa_tests::compose::docker(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &c.container(index),
    ]);
    ip.trim().to_string()
}

#[test]
fn forms_from_identical_config_and_serves_both_listeners() {
    let c = ComposeCluster::start(&[]);
    let size = image_size(c.image());
    eprintln!(
        "containers: image {} is {:.1} MB",
        c.image(),
        size as f64 / 1e6
    );

    // Through the host listener: 127.0.0.1 and the published ports; node
    // n + 1 is samsa-n, whose port that is.
    let host: BTreeMap<i32, String> = (0..3)
        .map(|i| (i32::try_from(i).unwrap() + 1, c.addr(i).to_string()))
        .collect();
    for (i, service) in SERVICES.iter().enumerate() {
        assert_eq!(
            c.metadata_brokers(i).unwrap(),
            host,
            "Metadata through {}'s host listener",
            service
        );
        let hostname = samsa_tests::compose::docker(&[
            "inspect",
            "--format",
            "{{.Config.Hostname}}",
            &c.container(i),
        ]);
        assert_eq!(hostname.trim(), *service);
    }
    // Through the network listener (port 9092 of each container): the
    // DNS names of the network.
    let network: BTreeMap<i32, String> = (0..3)
        .map(|i| {
            (
                i32::try_from(i).unwrap() + 1,
                format!("{}:9092", SERVICES[i]),
            )
        })
        .collect();
    for (i, service) in SERVICES.iter().enumerate() {
        let addr: SocketAddr = format!("{}:9092", container_ip(&c, i)).parse().unwrap();
        let md = KafkaClient::connect(addr)
            .unwrap_or_else(|e| panic!("connect to {}'s network listener {addr}: {e:#}", service))
            .metadata(Some(&[]))
            .unwrap();
        let brokers: BTreeMap<i32, String> = md
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        assert_eq!(
            brokers, network,
            "Metadata through {}'s network listener",
            service
        );
    }
    // The quorum as `samsa cluster status` sees it from inside the network.
    let (ok, status, err) = c.run_in_network(
        &[
            "cluster",
            "status",
            "--controller",
            "samsa-0:9093,samsa-1:9093,samsa-2:9093",
        ],
        "",
    );
    assert!(ok, "samsa cluster status failed: {status}{err}");
    assert!(
        status.lines().any(|l| l.starts_with("Controller leader:")),
        "{status}"
    );
    for (i, service) in SERVICES.iter().enumerate() {
        let id = i + 1;
        assert!(
            status.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.first() == Some(&id.to_string().as_str())
                    && f.get(1) == Some(&format!("{}:9092", service).as_str())
                    && f.contains(&"active")
            }),
            "broker {id} is not {}:9092, active:\n{status}",
            service
        );
    }

    // Host clients and network clients write and read one topic.
    let topic = unique_topic("both");
    c.create_topic(&topic, PARTITIONS, None);
    c.wait_full_isr(&[&topic], STATE);
    let producer = TxnProducer::new(&rdk::idempotent_producer_config(&c.bootstrap()));
    let host_values: Vec<String> = (0..100).map(|i| format!("host-{i:03}")).collect();
    for v in &host_values {
        producer.send_ok(&topic, None, v);
    }
    producer.inner().flush(Duration::from_secs(30)).unwrap();
    let net_values: Vec<String> = (0..100).map(|i| format!("net-{i:03}")).collect();
    let (ok, out, err) = c.run_in_network(
        &[
            "produce",
            &topic,
            "--idempotent",
            "--acks",
            "all",
            "-b",
            "samsa-1:9092",
        ],
        &(net_values.join("\n") + "\n"),
    );
    assert!(ok, "produce inside the network failed: {out}{err}");
    let all: BTreeSet<String> = host_values.iter().chain(&net_values).cloned().collect();
    let from_host: BTreeSet<String> = read_values(
        &c.bootstrap(),
        &topic,
        PARTITIONS,
        Isolation::ReadUncommitted,
    )
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(from_host, all, "records read on the host");
    let (ok, out, err) = c.run_in_network(
        &[
            "consume",
            &topic,
            "--from-beginning",
            "--max-messages",
            "200",
            "-b",
            "samsa-2:9092",
        ],
        "",
    );
    assert!(ok, "consume inside the network failed: {out}{err}");
    let from_network: BTreeSet<String> = out.lines().map(str::to_string).collect();
    assert_eq!(from_network, all, "records read inside the network");
    eprintln!(
        "containers: 100 records from the host through 127.0.0.1 and 100 from inside the network \
         through samsa-1:9092, all read on both sides"
    );
}

#[test]
fn sigkill_of_partition_leader_then_controller_leader_loses_nothing() {
    let c = ComposeCluster::start(&[]);
    let loads = Loads::start(&c, "kill");
    loads.idem.wait_progress(1_000, STATE);
    let topics = loads.topics();
    let topic_refs = [topics[0].as_str(), topics[1].as_str()];
    let mut gaps = Vec::new();

    // A partition leader that is not the controller leader.
    let controller = c.wait_controller_leader(STATE);
    let parts = c.partitions(0, &loads.idem.topic).unwrap();
    let victim = parts
        .iter()
        .map(|p| p.leader)
        .find(|l| *l != controller)
        .unwrap_or(parts[0].leader);
    let at = Instant::now();
    c.kill(index_of(victim));
    gaps.push(await_failover(
        &c,
        &loads,
        victim,
        at,
        &format!("docker kill of partition leader node {victim}"),
    ));
    c.start_node(index_of(victim));
    c.wait_node_ready(index_of(victim), READY_TIMEOUT);
    c.wait_full_isr(&topic_refs, STATE);
    eprintln!(
        "containers: node {victim} restarted, ready and back in every ISR {} ms after the kill",
        at.elapsed().as_millis()
    );
    loads.idem.wait_progress(500, STATE);

    // The controller leader.
    let controller = c.wait_controller_leader(STATE);
    let at = Instant::now();
    c.kill(index_of(controller));
    let next = wait_until("a new controller leader", STATE, || {
        c.controller_leader().filter(|l| *l != controller)
    });
    eprintln!(
        "containers: controller leader {controller} killed; node {next} leads the quorum after {} ms",
        at.elapsed().as_millis()
    );
    gaps.push(await_failover(
        &c,
        &loads,
        controller,
        at,
        &format!("docker kill of controller leader node {controller}"),
    ));
    c.start_node(index_of(controller));
    c.wait_node_ready(index_of(controller), READY_TIMEOUT);
    c.wait_full_isr(&topic_refs, STATE);
    loads.idem.wait_progress(500, STATE);

    loads.finish(&c);
    print_summary("docker kill", &gaps);
}

#[test]
fn paused_follower_leaves_and_rejoins_the_isr() {
    let c = ComposeCluster::start(&[]);
    // A follower of every partition of the topic, not the controller leader.
    let controller = c.wait_controller_leader(STATE);
    let victim = (1..=3).rev().find(|id| *id != controller).unwrap();
    let others: Vec<i32> = (1..=3).filter(|id| *id != victim).collect();
    let (a, b) = (others[0], others[1]);
    let topic = unique_topic("pause");
    c.create_topic(
        &topic,
        3,
        Some(&[[a, b, victim], [b, a, victim], [a, b, victim]]),
    );
    c.wait_full_isr(&[&topic], STATE);
    let load = IdempotentLoad::start(&c.bootstrap(), &topic, PARTITIONS);
    load.wait_progress(1_000, STATE);
    let observer = index_of(a);

    let at = Instant::now();
    c.pause(index_of(victim));
    wait_until(
        &format!("paused node {victim} to leave the ISR of every partition"),
        Duration::from_secs(30),
        || {
            let parts = c.partitions(observer, &topic)?;
            parts
                .iter()
                .all(|p| !p.isr.contains(&victim) && p.leader != victim)
                .then_some(())
        },
    );
    let left = at.elapsed();
    // Writes go on without it.
    load.wait_progress(500, STATE);
    let ctx = load.producer.context();
    let now = Instant::now();
    wait_ack_on_every_partition(ctx, now, "while paused");
    let gap = report_gap(
        &load,
        at,
        &format!("docker pause of follower node {victim}"),
    );
    let resumed = Instant::now();
    c.unpause(index_of(victim));
    c.wait_full_isr(&[&topic], STATE);
    eprintln!(
        "containers: paused node {victim} left the ISR after {} ms, rejoined {} ms after unpause \
         (replica_lag_time_max_ms 3000, broker_session_timeout_ms 5000)",
        left.as_millis(),
        resumed.elapsed().as_millis()
    );
    c.wait_node_ready(index_of(victim), READY_TIMEOUT);
    load.wait_progress(500, STATE);
    let report = load.finish(&c.bootstrap());
    eprintln!("containers: idempotent load: {report}");
    assert_exactly_once(&c, &topic, &report);
    print_summary("docker pause", &[gap]);
}

#[test]
fn rolling_restart_loses_nothing_and_tears_no_transaction() {
    let c = ComposeCluster::start(&[]);
    let loads = Loads::start(&c, "rolling");
    loads.idem.wait_progress(1_000, STATE);
    let topics = loads.topics();
    let topic_refs = [topics[0].as_str(), topics[1].as_str()];
    let mut gaps = Vec::new();
    for (i, service) in SERVICES.iter().enumerate() {
        let at = Instant::now();
        c.restart(i);
        c.wait_node_ready(i, READY_TIMEOUT);
        c.wait_full_isr(&topic_refs, STATE);
        let ctx = loads.idem.producer.context();
        let now = Instant::now();
        wait_ack_on_every_partition(ctx, now, "after the restart");
        loads.txn.wait_progress(2, STATE);
        eprintln!(
            "containers: {} restarted (docker restart), ready and in every ISR after {} ms",
            service,
            at.elapsed().as_millis()
        );
        gaps.push(report_gap(
            &loads.idem,
            at,
            &format!("docker restart of {}", service),
        ));
    }
    loads.finish(&c);
    print_summary("rolling restart", &gaps);
}

#[test]
fn down_and_up_keeps_every_record() {
    let mut c = ComposeCluster::start(&[]);
    let loads = Loads::start(&c, "downup");
    loads.idem.wait_progress(2_000, STATE);
    loads.txn.wait_progress(8, STATE);
    let [idem, txn] = loads.topics();
    loads.finish(&c);
    let read = |c: &ComposeCluster| {
        (
            read_keyed(&c.bootstrap(), &idem, PARTITIONS, "read_uncommitted", STATE).unwrap(),
            read_keyed(&c.bootstrap(), &txn, PARTITIONS, "read_committed", STATE).unwrap(),
        )
    };
    let before = read(&c);
    assert!(before.0.len() >= 2_000 && !before.1.is_empty());

    c.down_keep_volumes();
    for (i, service) in SERVICES.iter().enumerate() {
        assert!(c.container(i).is_empty(), "{} survived down", service);
    }
    let mut volumes = c.existing_volumes();
    volumes.sort();
    assert_eq!(volumes, (0..3).map(|i| c.volume(i)).collect::<Vec<_>>());
    let took = c.up();
    eprintln!(
        "containers: up after down (volumes kept) to all ready in {:.1} s",
        took.as_secs_f64()
    );
    c.wait_full_isr(&[&idem, &txn], STATE);
    let after = read(&c);
    assert!(
        after == before,
        "records differ after down and up: {} + {} before, {} + {} after",
        before.0.len(),
        before.1.len(),
        after.0.len(),
        after.1.len()
    );
    eprintln!(
        "containers: down + up kept all {} idempotent and {} committed transactional records",
        before.0.len(),
        before.1.len()
    );
}

/// The start of the error a node logs when it refuses to start on an
/// empty data directory the quorum knows (crates/samsa-controller/src/node.rs).
const REFUSAL: &str = "started on an empty controller store, but the quorum knows this node";

/// A node whose volume is gone: `docker stop`, its container and volume
/// removed, a new container on a new, empty volume. The data directory has
/// no `meta/cluster.json` and an empty Raft store, but the other voters hold
/// this node's broker registration: the node must not take part in the
/// quorum as the voter it was (it could help a lagging voter win an
/// election, see `wiped_voter_cannot_erase_an_acknowledged_topic`), so it
/// exits with an error saying why and what to do. The other two nodes go
/// on under an idempotent and a transactional load, which lose nothing.
#[test]
fn node_with_a_wiped_volume_refuses_to_start_and_the_others_go_on() {
    let c = ComposeCluster::start(&[]);
    let loads = Loads::start(&c, "wiped");
    loads.idem.wait_progress(2_000, STATE);
    let victim = 1;
    let at = Instant::now();
    c.stop(victim);
    c.wipe_and_recreate(victim);
    let code = c.wait_exited(victim, STATE);
    let logs = c.service_logs(victim);
    assert!(
        code != 0 && logs.contains(REFUSAL),
        "{} on an empty volume: exit code {code}, and the log lacks the refusal:\n{logs}",
        SERVICES[victim]
    );
    eprintln!(
        "containers: {} recreated on an empty volume refused to start (exit code {code}) {} ms \
         after the stop",
        SERVICES[victim],
        at.elapsed().as_millis()
    );
    loads.idem.wait_progress(1_000, STATE);
    loads.txn.wait_progress(3, STATE);
    report_gap(
        &loads.idem,
        at,
        &format!(
            "docker stop of {} (then refused on a wiped volume)",
            SERVICES[victim]
        ),
    );
    // Read back through the two live nodes only.
    let live: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    loads.finish_through(&c, &c.bootstrap_of(&live));
}

/// Raft safety with a wiped voter. A controller whose Raft store is gone
/// has forgotten its log and its vote; if it voted again as the voter it
/// was, it could make a majority with a lagging voter that never saw
/// entries the quorum had committed. Here: samsa-Z is paused (lagging), a
/// topic is created (CreateTopics answers NONE: committed by the controller
/// leader L and the third voter X), X's volume is removed, L is killed, Z
/// resumes and X comes back empty. X must refuse to start (before samsa
/// refused, X voted for Z and the quorum Z led had no such topic); then L
/// returns, L and Z form the quorum, and the topic is there.
#[test]
fn wiped_voter_cannot_erase_an_acknowledged_topic() {
    let c = ComposeCluster::start(&[]);
    let l = c.wait_controller_leader(STATE);
    let others: Vec<i32> = (1..=3).filter(|id| *id != l).collect();
    let (x, z) = (others[0], others[1]);
    let (li, xi, zi) = (index_of(l), index_of(x), index_of(z));

    c.pause(zi);
    let topic = unique_topic("acknowledged");
    c.create_topic(&topic, 1, None);
    for i in [li, xi] {
        wait_until(
            &format!("{topic} in node {}'s Metadata", i + 1),
            STATE,
            || c.partitions(i, &topic).filter(|p| !p.is_empty()),
        );
    }
    eprintln!(
        "containers: {topic} created (committed by controller leader {l} and voter {x}; voter \
         {z} paused)"
    );
    c.kill(xi);
    c.remove_with_volume(xi);
    c.kill(li);
    c.unpause(zi);
    c.recreate(xi);
    let code = c.wait_exited(xi, STATE);
    let logs = c.service_logs(xi);
    assert!(
        code != 0 && logs.contains(REFUSAL),
        "wiped voter {x}: exit code {code}, and the log lacks the refusal:\n{logs}"
    );
    c.start_node(li);
    for i in [li, zi] {
        c.wait_node_ready_with(i, 2, READY_TIMEOUT);
    }
    let leader = c.wait_controller_leader(STATE);
    assert!(leader == l || leader == z, "controller leader {leader}");
    for i in [li, zi] {
        let parts = c.partitions(i, &topic);
        assert!(
            parts.is_some_and(|p| !p.is_empty()),
            "the acknowledged topic {topic} is gone from node {}'s Metadata",
            i + 1
        );
    }
    eprintln!(
        "containers: wiped voter {x} refused to start (exit code {code}); voters {l} and {z} \
         (leader {leader}) still have {topic}"
    );
}
