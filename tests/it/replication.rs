//! Partition replication on three-node clusters of real `samsa server`
//! processes: acks=all with replication factor 3 lands byte-identical on
//! every replica; a stopped follower leaves the ISR (AlterPartition) and
//! rejoins once resumed; too small an ISR refuses acks=all with
//! NOT_ENOUGH_REPLICAS.
//!
//! Waits are polls with deadlines; every process is killed when the cluster
//! is dropped (stopped ones are resumed first by the test on every path
//! that continues).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::CreateTopicsRequest;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use samsa_tests::client::topic_name;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::http::{http_get, metric};
use samsa_tests::{unique_topic, wait_until, BatchBuilder, KafkaClient};

pub(crate) const ACKS_ALL: i16 = -1;
const NOT_ENOUGH_REPLICAS: i16 = 19;

/// Creates `topic` with `partitions` partitions and replication factor `rf`.
pub(crate) fn create_replicated_topic(
    client: &mut KafkaClient,
    topic: &str,
    partitions: i32,
    rf: i16,
) {
    let req = CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(rf)])
        .with_timeout_ms(30_000);
    let resp = client.call(&req).unwrap();
    assert_eq!(
        resp.topics[0].error_code, 0,
        "CreateTopics {topic}: {:?}",
        resp.topics[0].error_message
    );
}

/// `(leader, isr)` per partition as node `client` reports it.
pub(crate) fn leader_and_isr(
    client: &mut KafkaClient,
    topic: &str,
) -> Option<Vec<(i32, Vec<i32>)>> {
    let t = client.topic_metadata(topic)?;
    let mut parts: BTreeMap<i32, (i32, Vec<i32>)> = BTreeMap::new();
    for p in t.partitions {
        let mut isr: Vec<i32> = p.isr_nodes.iter().map(|b| b.0).collect();
        isr.sort_unstable();
        parts.insert(p.partition_index, (p.leader_id.0, isr));
    }
    Some(parts.into_values().collect())
}

/// The record batches stored in a partition directory, concatenated in
/// offset order (segment files are named by base offset, so name order is
/// offset order).
pub(crate) fn stored_batches(dir: &Path) -> Vec<u8> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    segments.sort();
    let mut out = Vec::new();
    for segment in segments {
        let bytes = std::fs::read(&segment).unwrap_or_default();
        // Whole batches only: a follower may be mid-write.
        let mut pos = 0;
        while pos + 12 <= bytes.len() {
            let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into().unwrap());
            let Ok(len) = usize::try_from(len) else { break };
            if len == 0 || pos + 12 + len > bytes.len() {
                break;
            }
            out.extend_from_slice(&bytes[pos..pos + 12 + len]);
            pos += 12 + len;
        }
    }
    out
}

pub(crate) fn signal(cluster: &SamsaCluster, id: i32, sig: Signal) {
    let pid = cluster.pid(id).expect("node runs");
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), sig).unwrap();
}

/// acks=all with RF=3 through each partition's leader: every answer is
/// success, consecutive offsets, and all three replicas end up holding the
/// very same bytes.
#[test]
fn acks_all_replicates_byte_identical_to_every_replica() {
    let cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("repl");
    const PARTITIONS: i32 = 3;
    const BATCHES: i64 = 50;
    create_replicated_topic(&mut cluster.client(1), &topic, PARTITIONS, 3);
    let mut observer = cluster.client(1);
    let state = wait_until(
        "leaders and a full ISR for every partition",
        Duration::from_secs(20),
        || {
            leader_and_isr(&mut observer, &topic).filter(|parts| {
                parts.len() == PARTITIONS as usize
                    && parts.iter().all(|(l, isr)| *l > 0 && isr == &[1, 2, 3])
            })
        },
    );

    for (partition, (leader, _)) in state.iter().enumerate() {
        let partition = i32::try_from(partition).unwrap();
        let mut client = cluster.client(*leader);
        for i in 0..BATCHES {
            let batch = BatchBuilder::new()
                .values([
                    format!("p{partition}-r{i}-a"),
                    format!("p{partition}-r{i}-b"),
                ])
                .build();
            let r = client.produce(&topic, partition, batch, ACKS_ALL).unwrap();
            assert_eq!(
                r.error_code, 0,
                "produce {partition}/{i}: {:?}",
                r.error_message
            );
            assert_eq!(r.base_offset, 2 * i, "offset of batch {i} on {partition}");
        }
        // Consumers on the leader see everything acknowledged.
        let values = client.fetch_all(&topic, partition, 0).unwrap();
        assert_eq!(values.len(), 2 * BATCHES as usize);
    }

    for partition in 0..PARTITIONS {
        let leader = state[partition as usize].0;
        let dir = |id: i32| {
            cluster
                .node(id)
                .data_dir()
                .join(format!("{topic}-{partition}"))
        };
        let reference = stored_batches(&dir(leader));
        assert!(!reference.is_empty());
        for id in cluster.ids() {
            wait_until(
                &format!("node {id} to hold the same bytes as leader {leader} for {partition}"),
                Duration::from_secs(20),
                || (stored_batches(&dir(id)) == reference).then_some(()),
            );
        }
        println!(
            "partition {partition}: {} bytes identical on nodes {:?} (leader {leader})",
            reference.len(),
            cluster.ids()
        );
    }
}

/// Creates a one-partition topic on `replicas` (the first leads) with
/// optional `min.insync.replicas`.
pub(crate) fn create_assigned_topic(
    client: &mut KafkaClient,
    topic: &str,
    replicas: &[i32],
    min_insync: Option<&str>,
) {
    use kafka_protocol::messages::create_topics_request::{
        CreatableReplicaAssignment, CreatableTopicConfig,
    };
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::protocol::StrBytes;
    let mut t = CreatableTopic::default()
        .with_name(topic_name(topic))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(replicas.iter().map(|id| BrokerId(*id)).collect())]);
    if let Some(v) = min_insync {
        t = t.with_configs(vec![CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("min.insync.replicas"))
            .with_value(Some(StrBytes::from_string(v.to_string())))]);
    }
    let req = CreateTopicsRequest::default()
        .with_topics(vec![t])
        .with_timeout_ms(30_000);
    let resp = client.call(&req).unwrap();
    assert_eq!(
        resp.topics[0].error_code, 0,
        "CreateTopics {topic}: {:?}",
        resp.topics[0].error_message
    );
}

pub(crate) fn isr_of(client: &mut KafkaClient, topic: &str) -> Option<(i32, Vec<i32>)> {
    leader_and_isr(client, topic).and_then(|p| p.into_iter().next())
}

/// A SIGSTOPped follower leaves the ISR after replica_lag_time_max_ms while
/// acks=all keeps working under min.insync.replicas=2 (the RF=3 default),
/// and fails with NOT_ENOUGH_REPLICAS on a topic asking for 3; resumed, the
/// follower rejoins both ISRs and holds the leader's bytes.
#[test]
fn lagging_follower_leaves_and_rejoins_the_isr() {
    let mut cluster = SamsaCluster::start(3, &["replica_lag_time_max_ms=2000"]);
    // The controller leader leads both topics, so stopping a follower
    // never stops the active controller.
    let leader = cluster.wait_leader(Duration::from_secs(20));
    let stopped = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let other = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != stopped)
        .unwrap();
    let topic = unique_topic("isr");
    let strict = unique_topic("isr-strict");
    let mut lc = cluster.client(leader);
    create_assigned_topic(&mut lc, &topic, &[leader, stopped, other], None);
    create_assigned_topic(&mut lc, &strict, &[leader, stopped, other], Some("3"));
    for t in [&topic, &strict] {
        wait_until(
            &format!("a full ISR for {t}"),
            Duration::from_secs(20),
            || isr_of(&mut lc, t).filter(|(l, isr)| *l == leader && isr == &[1, 2, 3]),
        );
    }
    let produce = |lc: &mut KafkaClient, t: &str, value: &str| {
        lc.produce(t, 0, BatchBuilder::new().values([value]).build(), ACKS_ALL)
            .unwrap()
    };
    assert_eq!(produce(&mut lc, &topic, "all three").error_code, 0);
    assert_eq!(produce(&mut lc, &strict, "all three").error_code, 0);

    signal(&cluster, stopped, Signal::SIGSTOP);
    for t in [&topic, &strict] {
        let shrunk = wait_until(
            &format!("the ISR of {t} to drop node {stopped}"),
            Duration::from_secs(20),
            || isr_of(&mut lc, t).filter(|(_, isr)| isr.len() == 2 && !isr.contains(&stopped)),
        );
        println!("{t}: ISR {:?} while node {stopped} is stopped", shrunk.1);
    }
    let r = produce(&mut lc, &topic, "two of three");
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let r = produce(&mut lc, &strict, "refused");
    // Resume before asserting, so a failure leaves no stopped process behind.
    signal(&cluster, stopped, Signal::SIGCONT);
    assert_eq!(r.error_code, NOT_ENOUGH_REPLICAS, "{:?}", r.error_message);

    for t in [&topic, &strict] {
        wait_until(
            &format!("the ISR of {t} to be full again"),
            Duration::from_secs(30),
            || isr_of(&mut lc, t).filter(|(_, isr)| isr == &[1, 2, 3]),
        );
    }
    let r = produce(&mut lc, &topic, "all three again");
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let values: Vec<String> = lc
        .fetch_all(&topic, 0, 0)
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(values, ["all three", "two of three", "all three again"]);
    let dir = |id: i32| cluster.node(id).data_dir().join(format!("{topic}-0"));
    let reference = stored_batches(&dir(leader));
    for id in [stopped, other] {
        wait_until(
            &format!("node {id} to hold the leader's bytes"),
            Duration::from_secs(20),
            || (stored_batches(&dir(id)) == reference).then_some(()),
        );
    }
}

/// An idle follower's fetch session names no partition, and the leader does
/// not look at a partition whose follower has everything; the follower
/// still stays in the ISR: each fetch of its session counts as a fetch of
/// every partition the session holds. Records written after the idle spell
/// reach every replica (min.insync.replicas 3: acks=all needs all three).
#[test]
fn an_idle_follower_stays_in_the_isr_while_its_fetch_session_names_nothing() {
    const LAG_MAX: Duration = Duration::from_millis(1000);
    let mut cluster = SamsaCluster::start(3, &["replica_lag_time_max_ms=1000"]);
    let leader = cluster.wait_leader(Duration::from_secs(20));
    let others: Vec<i32> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .collect();
    let topic = unique_topic("idle-isr");
    let mut lc = cluster.client(leader);
    create_assigned_topic(&mut lc, &topic, &[leader, others[0], others[1]], Some("3"));
    wait_until("a full ISR", Duration::from_secs(20), || {
        isr_of(&mut lc, &topic).filter(|(l, isr)| *l == leader && isr == &[1, 2, 3])
    });
    let produce = |lc: &mut KafkaClient, value: &str| {
        lc.produce(
            &topic,
            0,
            BatchBuilder::new().values([value]).build(),
            ACKS_ALL,
        )
        .unwrap()
    };
    assert_eq!(produce(&mut lc, "before").error_code, 0);
    let shrinks = || {
        let (status, body) =
            http_get(cluster.node(leader).http_addr(), "/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        metric(&body, "samsa_isr_shrinks_total").expect("samsa_isr_shrinks_total")
    };
    let shrinks_before = shrinks();
    // Observed for five times the lag limit with nothing written (the
    // leader checks for laggards every quarter of it).
    let idle_until = std::time::Instant::now() + 5 * LAG_MAX;
    while std::time::Instant::now() < idle_until {
        let (_, isr) = isr_of(&mut lc, &topic).expect("metadata");
        assert_eq!(isr, [1, 2, 3], "an idle follower left the ISR");
        std::thread::sleep(Duration::from_millis(100)); // the observation's pace
    }
    assert_eq!(
        shrinks(),
        shrinks_before,
        "the leader shrank an ISR while idle"
    );
    let r = produce(&mut lc, "after");
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let dir = |id: i32| cluster.node(id).data_dir().join(format!("{topic}-0"));
    let reference = stored_batches(&dir(leader));
    for id in others {
        wait_until(
            &format!("node {id} to hold the leader's bytes"),
            Duration::from_secs(20),
            || (stored_batches(&dir(id)) == reference).then_some(()),
        );
    }
}

/// The generation a partition's own `checkpoint` file names (a JSON object
/// written atomically by the log).
fn checkpointed_generation(partition_dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(partition_dir.join("checkpoint")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("generation")?.as_u64()
}

/// The (generation, HW) the broker's `replication-offset-checkpoint` holds
/// for `topic`-`partition`, if the file is there and has its line.
fn broker_checkpoint_line(data_dir: &Path, topic: &str, partition: i32) -> Option<(u64, i64)> {
    let text = std::fs::read_to_string(data_dir.join("replication-offset-checkpoint")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let entry = json.get("partitions")?.as_array()?.iter().find(|e| {
        e.get("topic").and_then(|t| t.as_str()) == Some(topic)
            && e.get("partition").and_then(|p| p.as_i64()) == Some(i64::from(partition))
    })?;
    Some((
        entry.get("generation")?.as_u64()?,
        entry.get("high_watermark")?.as_i64()?,
    ))
}

/// Without a segment roll, truncation or shutdown a partition's own
/// checkpoint keeps the HW of the partition's opening; the periodic HW
/// checkpoint (`replica_high_watermark_checkpoint_interval_ms`, one file
/// per broker) brings every replica's line up to the HW the ISR reached,
/// under the generation of that replica's log.
#[test]
fn every_replica_checkpoints_the_high_watermark_periodically() {
    let cluster = SamsaCluster::start(3, &["replica_high_watermark_checkpoint_interval_ms=200"]);
    let topic = unique_topic("hwckpt");
    create_assigned_topic(&mut cluster.client(1), &topic, &[1, 2, 3], None);
    let mut observer = cluster.client(1);
    wait_until("a full ISR led by node 1", Duration::from_secs(20), || {
        isr_of(&mut observer, &topic).filter(|(l, isr)| *l == 1 && isr == &[1, 2, 3])
    });
    let mut leader = cluster.client(1);
    const BATCHES: i64 = 10;
    for i in 0..BATCHES {
        let batch = BatchBuilder::new()
            .values([format!("r{i}-a"), format!("r{i}-b")])
            .build();
        let r = leader.produce(&topic, 0, batch, ACKS_ALL).unwrap();
        assert_eq!(r.error_code, 0, "produce {i}: {:?}", r.error_message);
    }
    let acknowledged = 2 * BATCHES;
    for id in cluster.ids() {
        let data_dir = cluster.node(id).data_dir();
        let (generation, hw) = wait_until(
            &format!("node {id}'s checkpoint to hold HW {acknowledged}"),
            Duration::from_secs(20),
            || broker_checkpoint_line(&data_dir, &topic, 0).filter(|(_, hw)| *hw == acknowledged),
        );
        assert_eq!(hw, acknowledged);
        assert_eq!(
            Some(generation),
            checkpointed_generation(&data_dir.join(format!("{topic}-0"))),
            "node {id}: the line names the log's generation"
        );
    }
}
