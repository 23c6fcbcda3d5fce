//! Consumer groups, end to end with librdkafka, as a quick smoke test (the
//! broad group suite lives in `groups.rs`): two `subscribe()` consumers of
//! one group split a four-partition topic between them and commit what they
//! read; once they have left, a third consumer of the group resumes exactly
//! where they committed. On one node, and on a three-node cluster where the
//! group coordinator is whichever broker leads the group's
//! `__consumer_offsets` partition.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::txn::create_topic_default_rf;
use samsa_tests::{unique_topic, KafkaClient, SamsaNode};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i64 = 10;

fn produce(bootstrap: &str, topic: &str, per_partition: i64, tag: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for p in 0..PARTITIONS {
        for i in 0..per_partition {
            let value = format!("{tag}-{p}-{i}");
            producer
                .send(BaseRecord::<(), _>::to(topic).partition(p).payload(&value))
                .map_err(|(e, _)| e)
                .unwrap();
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

fn group_consumer(bootstrap: &str, group: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

fn assigned(consumer: &BaseConsumer) -> BTreeSet<i32> {
    consumer
        .assignment()
        .map(|tpl| tpl.elements().iter().map(|e| e.partition()).collect())
        .unwrap_or_default()
}

/// Polls `consumer` once; a message goes into `seen` (partition → offsets).
fn poll_into(consumer: &BaseConsumer, seen: &mut BTreeMap<i32, BTreeSet<i64>>) {
    match consumer.poll(Duration::from_millis(50)) {
        None | Some(Err(KafkaError::PartitionEOF(_))) => {}
        Some(Err(e)) => panic!("consumer error: {e}"),
        Some(Ok(m)) => {
            seen.entry(m.partition()).or_default().insert(m.offset());
        }
    }
}

fn committed_offsets(consumer: &BaseConsumer, topic: &str) -> BTreeMap<i32, Offset> {
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .unwrap()
        .elements()
        .iter()
        .map(|e| (e.partition(), e.offset()))
        .collect()
}

fn split_commit_resume(bootstrap: &str, admin: &mut KafkaClient) {
    let topic = unique_topic("groups-smoke");
    let group = unique_topic("groups-smoke-g");
    create_topic_default_rf(admin, &topic, PARTITIONS).unwrap();
    produce(bootstrap, &topic, PER_PARTITION, "first");

    let a = group_consumer(bootstrap, &group, &topic);
    let b = group_consumer(bootstrap, &group, &topic);
    let mut seen_a = BTreeMap::new();
    let mut seen_b = BTreeMap::new();
    // Until both hold two partitions each and every record was read by the
    // member that now holds its partition.
    let deadline = Instant::now() + Duration::from_secs(60);
    let complete = |owner: &BTreeSet<i32>, seen: &BTreeMap<i32, BTreeSet<i64>>| {
        owner
            .iter()
            .all(|p| seen.get(p).is_some_and(|o| o.len() as i64 == PER_PARTITION))
    };
    loop {
        poll_into(&a, &mut seen_a);
        poll_into(&b, &mut seen_b);
        let (pa, pb) = (assigned(&a), assigned(&b));
        if pa.len() == 2 && pb.len() == 2 && complete(&pa, &seen_a) && complete(&pb, &seen_b) {
            assert!(
                pa.is_disjoint(&pb),
                "both members hold a partition: {pa:?} {pb:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle on a 2+2 split: a {pa:?} read {seen_a:?}, b {pb:?} read {seen_b:?}"
        );
    }
    a.commit_consumer_state(CommitMode::Sync).unwrap();
    b.commit_consumer_state(CommitMode::Sync).unwrap();
    let committed = committed_offsets(&a, &topic);
    assert_eq!(
        committed,
        (0..PARTITIONS)
            .map(|p| (p, Offset::Offset(PER_PARTITION)))
            .collect(),
        "committed offsets after the split"
    );
    drop(a);
    drop(b);

    produce(bootstrap, &topic, 2, "second");
    let c = group_consumer(bootstrap, &group, &topic);
    let mut seen_c = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen_c.values().map(BTreeSet::len).sum::<usize>() < 2 * PARTITIONS as usize {
        poll_into(&c, &mut seen_c);
        assert!(
            Instant::now() < deadline,
            "the third member read only {seen_c:?}"
        );
    }
    let expected: BTreeMap<i32, BTreeSet<i64>> = (0..PARTITIONS)
        .map(|p| (p, [PER_PARTITION, PER_PARTITION + 1].into_iter().collect()))
        .collect();
    assert_eq!(
        seen_c, expected,
        "the third member resumes at the committed offsets"
    );
}

#[test]
fn two_members_split_commit_and_a_third_resumes() {
    let node = SamsaNode::start();
    split_commit_resume(&node.bootstrap(), &mut node.client());
}

#[test]
fn cluster_two_members_split_commit_and_a_third_resumes() {
    let cluster = SamsaCluster::start(3, &[]);
    split_commit_resume(&cluster.bootstrap(), &mut cluster.client(1));
}
