//! Partition failover under load on three real `samsa server` processes.
//!
//! - `leader_kills_lose_no_acknowledged_record`: an idempotent librdkafka
//!   `acks=all` producer writes continuously to a 6-partition topic created
//!   with the defaults (replication factor 3, `min.insync.replicas` 2) while
//!   the leader of one partition is SIGKILLed per round (every third round
//!   it is the node that is also the controller leader), a new leader takes
//!   over, and the killed node is restarted; then a follower is SIGSTOPped
//!   until it leaves the ISR and resumed until it is back. A reader follows
//!   the topic during the run; at the end every replica holds the same bytes
//!   and a full read is checked by the exactly-once checker (every
//!   acknowledged record exactly once at its acknowledged offset, per
//!   producer order, and no offset seen with two different records over the
//!   whole run).
//! - `follower_truncates_an_unreplicated_suffix`: a leader appends with
//!   acks=1 while its followers are stopped and dies; the followers elect a
//!   new leader that writes other records at those offsets, and the old
//!   leader, restarted, cuts its divergent suffix and ends byte-identical.
//! - `librdkafka_detects_the_truncation_of_an_unclean_election`: a
//!   librdkafka consumer that read records an unclean election drops
//!   resumes where the new leader's copy of that epoch ends (KIP-320,
//!   OffsetForLeaderEpoch) and reads the records written there.
//!
//! Waits are polls with deadlines; every process is killed when the cluster
//! is dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::CreateTopicsRequest;
use nix::sys::signal::Signal;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::checker::SharedChecker;
use samsa_tests::client::{produce_request, topic_name};
use samsa_tests::cluster::{median_and_max, SamsaCluster};
use samsa_tests::rdk;
use samsa_tests::wait::try_wait_until;
use samsa_tests::{codes, unique_topic, wait_until, BatchBuilder, EosChecker, KafkaClient};

use crate::replication::{create_assigned_topic, signal, stored_batches, ACKS_ALL};

const PARTITIONS: i32 = 6;
/// acks=1 records the doomed leader writes while its followers are stopped.
const UNREPLICATED: i64 = 5;
const ROUNDS: usize = 10;
/// Settings on top of the harness's fast ones: followers leave the ISR
/// after 2 s without catching up. Broker sessions of 5 s instead of the
/// harness's 3 s: on a loaded 2-core machine the heartbeats of *live*
/// brokers were seen 3-5 s apart, the controller fenced them, and a
/// partition whose other ISR members were fenced stayed leaderless until
/// the killed broker came back (which this test does only once the
/// partition is writable again). A kill is still detected within 5 s.
const SETTINGS: &[&str] = &[
    "replica_lag_time_max_ms=2000",
    "replica_fetch_wait_max_ms=200",
    "broker_session_timeout_ms=5000",
];

/// One partition as a broker's Metadata shows it.
#[derive(Debug, Clone, PartialEq)]
struct PartitionState {
    leader: i32,
    leader_epoch: i32,
    replicas: Vec<i32>,
    isr: Vec<i32>,
}

/// A fresh client to node `id`, or `None` if it does not answer quickly.
fn quick_client(cluster: &SamsaCluster, id: i32) -> Option<KafkaClient> {
    let mut c =
        KafkaClient::connect_with_timeout(cluster.node(id).addr(), Duration::from_secs(1)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.api_versions().ok()?;
    Some(c)
}

/// Every partition of `topic` as node `id` reports it.
fn states(cluster: &SamsaCluster, id: i32, topic: &str) -> Option<Vec<PartitionState>> {
    let t = quick_client(cluster, id)?.topic_metadata(topic)?;
    let mut parts = BTreeMap::new();
    for p in t.partitions {
        let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
        isr.sort_unstable();
        let mut replicas: Vec<i32> = p.replica_nodes.iter().map(|b| b.0).collect();
        replicas.sort_unstable();
        parts.insert(
            p.partition_index,
            PartitionState {
                leader: p.leader_id.0,
                leader_epoch: p.leader_epoch,
                replicas,
                isr,
            },
        );
    }
    Some(parts.into_values().collect())
}

/// Waits until every running node reports a live leader and the full ISR
/// for every partition; returns the states.
fn wait_full_isr(
    cluster: &mut SamsaCluster,
    topic: &str,
    timeout: Duration,
) -> Vec<PartitionState> {
    let all = cluster.ids();
    let running = cluster.running();
    wait_until(
        "a live leader and a full ISR on every partition",
        timeout,
        || {
            let mut seen = None;
            for id in &running {
                let s = states(cluster, *id, topic)?;
                let ok = s.len() == PARTITIONS as usize
                    && s.iter()
                        .all(|p| running.contains(&p.leader) && p.isr == all);
                if !ok {
                    return None;
                }
                seen = Some(s);
            }
            seen
        },
    )
}

/// Produces one probe record with acks=all to the current leader of
/// `partition` (as a running node other than `victim` reports it) until one
/// is acknowledged; every attempt is recorded in the checker as producer
/// "probe". Returns when the partition took a write again. A transport
/// error or an error code a producer retries while leadership moves is
/// tried again; any other code fails the test.
fn probe_until_available(
    cluster: &mut SamsaCluster,
    topic: &str,
    partition: i32,
    victim: i32,
    checker: &SharedChecker,
    seq: &mut u64,
    timeout: Duration,
) {
    let running = cluster.running();
    wait_until(
        &format!("partition {partition} to take acks=all writes after node {victim} died"),
        timeout,
        || {
            let observer = running.iter().copied().find(|id| *id != victim)?;
            let leader = states(cluster, observer, topic)?
                .get(usize::try_from(partition).ok()?)?
                .leader;
            if leader == victim || !running.contains(&leader) {
                return None;
            }
            let mut client = quick_client(cluster, leader)?;
            *seq += 1;
            let value = format!("probe-{seq:06}");
            checker.lock().unwrap().send("probe", value.as_bytes());
            let req = produce_request(
                topic,
                partition,
                BatchBuilder::new().values([value.as_str()]).build(),
                ACKS_ALL,
            )
            .with_timeout_ms(2_000);
            let resp = client.call(&req).ok()?;
            let r = resp
                .responses
                .first()
                .and_then(|t| t.partition_responses.first())
                .unwrap_or_else(|| panic!("a Produce answer without the partition: {resp:?}"));
            if r.error_code != 0 {
                assert!(
                    codes::produce_retriable_during_failover(r.error_code),
                    "probe of partition {partition} on node {leader} answered error code {} \
                     ({:?}), which no producer retries",
                    r.error_code,
                    r.error_message
                );
                return None;
            }
            checker
                .lock()
                .unwrap()
                .ack(value.as_bytes(), partition, r.base_offset);
            Some(())
        },
    );
}

/// Waits until every replica of every partition stores the same bytes.
fn wait_identical_replicas(cluster: &SamsaCluster, topic: &str, timeout: Duration) -> usize {
    let mut total = 0;
    for partition in 0..PARTITIONS {
        let dir = |id: i32| {
            cluster
                .node(id)
                .data_dir()
                .join(format!("{topic}-{partition}"))
        };
        let bytes = wait_until(
            &format!("every replica of partition {partition} to hold the same bytes"),
            timeout,
            || {
                let ids = cluster.ids();
                let reference = stored_batches(&dir(ids[0]));
                ids.iter()
                    .all(|id| stored_batches(&dir(*id)) == reference)
                    .then_some(reference.len())
            },
        );
        total += bytes;
    }
    total
}

// History: one CI-simulation run (of 7) before commit d31fc72 found 572
// records of one partition stored twice after a failover. That commit closed
// three role races (a leader append and a follower's fetch answer now check
// role and epoch under the log lock; an acks=all wait trusts the HW only while
// leading its epoch); 20 runs since, 12 of them two at a time, found none.
// With SAMSA_TEST_KEEP_LOGS=<dir> a failing run keeps every node's log.
#[test]
fn leader_kills_lose_no_acknowledged_record() {
    let started = Instant::now();
    let mut cluster = SamsaCluster::start(3, SETTINGS);
    let topic = unique_topic("failover");

    // Defaults: replication factor -1 → min(3, brokers) = 3.
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(&topic))
            .with_num_partitions(PARTITIONS)
            .with_replication_factor(-1)])
        .with_timeout_ms(30_000);
    let resp = cluster.client(1).call(&req).unwrap();
    assert_eq!(
        resp.topics[0].error_code, 0,
        "{:?}",
        resp.topics[0].error_message
    );
    assert_eq!(
        resp.topics[0].replication_factor, 3,
        "default replication factor"
    );
    // Auto-creation gets the same default.
    let auto = unique_topic("failover-auto");
    cluster
        .client(2)
        .metadata_with(Some(&[auto.as_str()]), true)
        .unwrap();
    let auto_states = wait_until("the auto-created topic", Duration::from_secs(20), || {
        states(&cluster, 2, &auto).filter(|s| !s.is_empty())
    });
    assert!(
        auto_states.iter().all(|p| p.replicas == [1, 2, 3]),
        "auto-created topic replicas: {auto_states:?}"
    );
    wait_full_isr(&mut cluster, &topic, Duration::from_secs(30));

    // The producer, writing round-robin over the partitions until told to stop.
    let checker = EosChecker::shared();
    let producer = Arc::new(rdk::checking_producer(
        &rdk::idempotent_producer_config(&cluster.bootstrap()),
        Arc::clone(&checker),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (producer, stop, topic) = (Arc::clone(&producer), Arc::clone(&stop), topic.clone());
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let partition = i32::try_from(n % PARTITIONS as u64).unwrap();
                let value = format!("rdk-{n:08}");
                rdk::send_checked(&producer, "rdk", &topic, Some(partition), value.as_bytes())?;
                n += 1;
                // Pacing (about 500 records/s), not synchronisation.
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(n)
        })
    };
    // A reader following the topic for the whole run: what it sees at each
    // offset goes to the checker, so a record later replaced by another at
    // the same offset is an offset conflict. Lost connections to killed
    // nodes are what librdkafka reports while it moves to the new leaders;
    // any other consumer error ends the reader and fails the test.
    let live_reads = Arc::new(AtomicU64::new(0));
    let reader = {
        let (checker, stop, topic, reads) = (
            Arc::clone(&checker),
            Arc::clone(&stop),
            topic.clone(),
            Arc::clone(&live_reads),
        );
        let config = rdk::assign_consumer_config(&cluster.bootstrap());
        std::thread::spawn(move || -> anyhow::Result<()> {
            let consumer: BaseConsumer = config.create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&topic, p, Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(100)) {
                    None => {}
                    Some(Ok(m)) => {
                        checker.lock().unwrap().read(
                            m.partition(),
                            m.offset(),
                            m.payload().unwrap_or_default(),
                        );
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
                    ))) => {}
                    Some(Err(e)) => anyhow::bail!("live reader: consumer error {e}"),
                }
            }
            Ok(())
        })
    };
    wait_until(
        "the producer's first acknowledgements",
        Duration::from_secs(30),
        || (rdk::acked_count(&producer) > 100).then_some(()),
    );
    // The live reader has the whole run to read at least these.
    let acked_before_kills = rdk::acked_count(&producer);

    let mut unavailable = Vec::new();
    let mut controller_kills = 0;
    let mut probe_seq = 0u64;
    for round in 0..ROUNDS {
        let before = wait_full_isr(&mut cluster, &topic, Duration::from_secs(60));
        let controller = cluster.wait_leader(Duration::from_secs(20));
        // Every third round: a partition led by the controller leader, so
        // one SIGKILL takes down both. Otherwise one led by another node.
        let with_controller = round % 3 == 2;
        let partition = (0..PARTITIONS)
            .map(|i| (i + i32::try_from(round).unwrap()) % PARTITIONS)
            .find(|p| (before[*p as usize].leader == controller) == with_controller)
            .unwrap_or(i32::try_from(round).unwrap() % PARTITIONS);
        let victim = before[partition as usize].leader;
        if victim == controller {
            controller_kills += 1;
        }
        let acked_before = rdk::acked_count(&producer);
        let killed_at = Instant::now();
        cluster.sigkill(victim);
        probe_until_available(
            &mut cluster,
            &topic,
            partition,
            victim,
            &checker,
            &mut probe_seq,
            Duration::from_secs(40),
        );
        let window = killed_at.elapsed();
        unavailable.push(window);
        println!(
            "round {round}: killed node {victim} (leader of partition {partition}{}), \
             writable again after {window:?}",
            if victim == controller {
                ", controller leader"
            } else {
                ""
            }
        );
        cluster.restart(victim);
        wait_until(
            "the producer to make progress",
            Duration::from_secs(60),
            || (rdk::acked_count(&producer) > acked_before).then_some(()),
        );
    }

    // A stopped follower leaves the ISR and rejoins once resumed.
    wait_full_isr(&mut cluster, &topic, Duration::from_secs(60));
    let controller = cluster.wait_leader(Duration::from_secs(20));
    let stopped = cluster
        .ids()
        .into_iter()
        .find(|id| *id != controller)
        .unwrap();
    let observer = controller;
    signal(&cluster, stopped, Signal::SIGSTOP);
    let left = try_wait_until(Duration::from_secs(30), || {
        states(&cluster, observer, &topic).filter(|s| {
            s.iter()
                .all(|p| !p.isr.contains(&stopped) && p.leader != stopped)
        })
    });
    signal(&cluster, stopped, Signal::SIGCONT);
    assert!(
        left.is_some(),
        "node {stopped} never left the ISR while stopped"
    );
    let rejoined_at = Instant::now();
    wait_full_isr(&mut cluster, &topic, Duration::from_secs(60));
    println!(
        "node {stopped}: left the ISR while stopped, rejoined {:?} after SIGCONT",
        rejoined_at.elapsed()
    );

    // Stop writing; everything sent must be acknowledged.
    stop.store(true, Ordering::Relaxed);
    let sent = writer.join().unwrap().expect("the producer failed");
    reader.join().unwrap().expect("the live reader failed");
    producer
        .flush(Duration::from_secs(120))
        .expect("flush the producer");
    let fatal = producer.context().fatal.lock().unwrap().clone();
    assert!(fatal.is_none(), "producer fatal error: {fatal:?}");

    wait_full_isr(&mut cluster, &topic, Duration::from_secs(60));
    let bytes = wait_identical_replicas(&cluster, &topic, Duration::from_secs(30));
    let final_reads = rdk::consume_to_end(
        &cluster.bootstrap(),
        &topic,
        PARTITIONS,
        Duration::from_secs(60),
        |p, o, v| checker.lock().unwrap().read(p, o, v),
    )
    .unwrap();

    let report = checker.lock().unwrap().check();
    let (median, worst) = median_and_max(&unavailable);
    println!(
        "failover summary: records sent {sent} (+{probe_seq} probes), acknowledged {}, found {} \
         (live reads {}, final read {final_reads}), duplicates {}, lost {}, offset conflicts {}, \
         order violations {}, delivery failures {}; failovers {} ({controller_kills} also the \
         controller leader); unavailability median {median:?}, worst {worst:?}; replicas \
         byte-identical ({bytes} bytes per replica); total {:?}",
        report.acked,
        report.distinct_read,
        live_reads.load(Ordering::Relaxed),
        report.duplicates.len(),
        report.lost.len(),
        report.offset_conflicts.len(),
        report.order_violations.len(),
        report.failed,
        unavailable.len(),
        started.elapsed(),
    );
    report.assert_ok();
    assert_eq!(report.failed, 0, "deliveries failed: {report}");
    let live = live_reads.load(Ordering::Relaxed);
    assert!(
        live >= acked_before_kills,
        "the live reader read {live} records over the whole run, fewer than the \
         {acked_before_kills} acknowledged before the first kill"
    );
    assert!(
        controller_kills > 0,
        "no round killed the controller leader"
    );
}

#[test]
fn follower_truncates_an_unreplicated_suffix() {
    let mut cluster = SamsaCluster::start(3, SETTINGS);
    let topic = unique_topic("diverge");
    let (a, b, c) = (1, 2, 3);
    create_assigned_topic(&mut cluster.client(a), &topic, &[a, b, c], None);
    wait_until("a full ISR led by node 1", Duration::from_secs(30), || {
        states(&cluster, a, &topic).filter(|s| s[0].leader == a && s[0].isr == [1, 2, 3])
    });
    let mut ac = cluster.client(a);
    for i in 0..3 {
        let r = ac
            .produce(
                &topic,
                0,
                BatchBuilder::new().values([format!("before-{i}")]).build(),
                ACKS_ALL,
            )
            .unwrap();
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    }
    let dirs: BTreeMap<i32, std::path::PathBuf> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.node(id).data_dir().join(format!("{topic}-0"))))
        .collect();
    let dir = |id: i32| dirs[&id].clone();
    let replicated = stored_batches(&dir(a));
    for id in [b, c] {
        wait_until(
            &format!("node {id} to hold the leader's bytes"),
            Duration::from_secs(20),
            || (stored_batches(&dir(id)) == replicated).then_some(()),
        );
    }

    // The followers stop (and the quorum with them); the leader takes
    // acks=1 writes nobody copies, then dies.
    signal(&cluster, b, Signal::SIGSTOP);
    signal(&cluster, c, Signal::SIGSTOP);
    for i in 0..UNREPLICATED {
        let r = ac
            .produce(
                &topic,
                0,
                BatchBuilder::new()
                    .values([format!("unreplicated-{i}")])
                    .build(),
                1,
            )
            .unwrap();
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    }
    cluster.sigkill(a);
    signal(&cluster, b, Signal::SIGCONT);
    signal(&cluster, c, Signal::SIGCONT);
    let old = stored_batches(&dir(a));
    assert!(
        old.len() > replicated.len()
            && old
                .windows(b"unreplicated".len())
                .any(|w| w == b"unreplicated"),
        "the dead leader holds the unreplicated suffix"
    );

    // A new leader among the followers writes other records at those offsets.
    let (leader, epoch) = wait_until("a new leader", Duration::from_secs(40), || {
        let s = states(&cluster, b, &topic)?;
        (s[0].leader == b || s[0].leader == c).then_some((s[0].leader, s[0].leader_epoch))
    });
    let mut lc = cluster.client(leader);
    let mut after_offsets = Vec::new();
    for i in 0..3 {
        let value = format!("after-{i}");
        let r = wait_until(
            "acks=all on the new leader",
            Duration::from_secs(30),
            || {
                let produced = lc.produce(
                    &topic,
                    0,
                    BatchBuilder::new().values([value.as_str()]).build(),
                    ACKS_ALL,
                );
                // A transport error (the answer later than the client's read
                // timeout): a fresh connection, and again.
                let Ok(r) = produced else {
                    lc = cluster.client(leader);
                    return None;
                };
                assert!(
                    r.error_code == 0 || codes::produce_retriable_during_failover(r.error_code),
                    "the new leader answered error code {} ({:?}), which no producer retries",
                    r.error_code,
                    r.error_message
                );
                (r.error_code == 0).then_some(r)
            },
        );
        after_offsets.push(r.base_offset);
    }
    // A parked follower fetch may have carried the first unreplicated
    // record out before the stop took effect: the new leader may keep a
    // prefix of the suffix, never all of it (the followers sent no fetch
    // while stopped).
    let kept = after_offsets[0] - 3;
    assert!(
        (0..UNREPLICATED).contains(&kept) && after_offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "offsets of the new leader's records: {after_offsets:?}"
    );

    // The old leader comes back as a follower and cuts its divergent suffix.
    cluster.restart(a);
    let expected = stored_batches(&dir(leader));
    for id in [a, b, c] {
        wait_until(
            &format!("node {id} to hold the new leader's bytes"),
            Duration::from_secs(30),
            || (stored_batches(&dir(id)) == expected).then_some(()),
        );
    }
    let values: Vec<String> = lc
        .fetch_all(&topic, 0, 0)
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    let expected_values: Vec<String> = (0..3)
        .map(|i| format!("before-{i}"))
        .chain((0..kept).map(|i| format!("unreplicated-{i}")))
        .chain((0..3).map(|i| format!("after-{i}")))
        .collect();
    assert_eq!(values, expected_values);
    let truncated = std::fs::read_to_string(cluster.node(a).log_path()).unwrap_or_default();
    assert!(
        truncated.contains("truncating a divergent suffix"),
        "node {a} never logged the truncation"
    );
    println!("divergence: the new leader kept {kept} of {UNREPLICATED} unreplicated records; node {a} cut its unreplicated suffix and follows node {leader} at epoch {epoch}");
}

/// KIP-320 through librdkafka: consumers that read records an unclean
/// election then drops notice it. Node 1 leads alone (node 2 stopped, out
/// of the ISR) and its records are read by a librdkafka consumer; node
/// 1 dies and node 2 is elected uncleanly with a shorter log and writes
/// new records at those offsets. After the leader change librdkafka asks
/// OffsetForLeaderEpoch where the epoch of its last record ends and seeks
/// back to that end, reading the new records from there. Without
/// OffsetForLeaderEpoch (or with a wrong answer) its fetch past the log
/// end would be OFFSET_OUT_OF_RANGE and `auto.offset.reset=latest` would
/// jump over the new records. (With `auto.offset.reset=error` librdkafka
/// reports a truncation as AUTO_OFFSET_RESET, the code an out-of-range
/// fetch gets too, so that case proves nothing and is not tested.)
#[test]
fn librdkafka_detects_the_truncation_of_an_unclean_election() {
    use kafka_protocol::messages::incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig,
    };
    use kafka_protocol::messages::IncrementalAlterConfigsRequest;
    use kafka_protocol::protocol::StrBytes;

    let mut cluster = SamsaCluster::start(3, SETTINGS);
    let topic = unique_topic("truncated");
    create_assigned_topic(&mut cluster.client(1), &topic, &[1, 2], Some("1"));
    let set_unclean = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_string(topic.clone()))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_static_str("unclean.leader.election.enable"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_static_str("true")))]),
    ]);
    let answer = cluster.client(1).call(&set_unclean).unwrap();
    assert_eq!(answer.responses[0].error_code, 0);
    wait_until(
        "node 1 leading both replicas in sync",
        Duration::from_secs(30),
        || states(&cluster, 1, &topic).filter(|s| s[0].leader == 1 && s[0].isr == [1, 2]),
    );
    let produce = |cluster: &SamsaCluster, leader: i32, value: String| {
        wait_until(&format!("{value} written"), Duration::from_secs(30), || {
            let mut c = quick_client(cluster, leader)?;
            let batch = BatchBuilder::new().values([value.as_str()]).build();
            let r = c.produce(&topic, 0, batch, ACKS_ALL).ok()?;
            (r.error_code == 0).then_some(r.base_offset)
        })
    };
    for i in 0..5 {
        produce(&cluster, 1, format!("both-{i}"));
    }
    // Node 2 stops and leaves the ISR; node 1 alone takes five more.
    signal(&cluster, 2, Signal::SIGSTOP);
    wait_until("node 2 out of the ISR", Duration::from_secs(30), || {
        states(&cluster, 1, &topic).filter(|s| s[0].isr == [1])
    });
    for i in 0..5 {
        produce(&cluster, 1, format!("alone-{i}"));
    }
    let consumer = |reset: &str| -> BaseConsumer {
        let mut config = rdk::assign_consumer_config(&cluster.bootstrap());
        config.set("auto.offset.reset", reset);
        let consumer: BaseConsumer = config.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        consumer
    };
    let seeking = consumer("latest");
    let mut read = 0;
    wait_until("the ten records read", Duration::from_secs(30), || {
        if let Some(Ok(m)) = seeking.poll(Duration::from_millis(100)) {
            read += 1;
            assert_eq!(m.offset(), read - 1);
        }
        (read == 10).then_some(())
    });
    // Paused until the new records are written: an out-of-range fetch
    // would then reset to their end, so only the epoch check finds them.
    let assignment = seeking.assignment().unwrap();
    seeking.pause(&assignment).unwrap();

    // Node 1 dies; node 2, out of sync, is elected uncleanly.
    cluster.sigkill(1);
    signal(&cluster, 2, Signal::SIGCONT);
    wait_until("node 2 leading", Duration::from_secs(60), || {
        states(&cluster, 2, &topic).filter(|s| s[0].leader == 2)
    });
    for i in 0..3 {
        let offset = produce(&cluster, 2, format!("new-{i}"));
        assert_eq!(offset, 5 + i64::from(i), "new-{i} goes where alone-{i} was");
    }
    seeking.resume(&assignment).unwrap();

    let mut values = Vec::new();
    wait_until(
        "the new records read after a seek back",
        Duration::from_secs(60),
        || {
            match seeking.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => values.push((
                    m.offset(),
                    String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                )),
                Some(Err(e)) => eprintln!("consumer (latest): {e}"),
                None => {}
            }
            (values.len() == 3).then_some(())
        },
    );
    assert_eq!(
        values,
        vec![
            (5, "new-0".to_string()),
            (6, "new-1".to_string()),
            (7, "new-2".to_string())
        ]
    );
}
