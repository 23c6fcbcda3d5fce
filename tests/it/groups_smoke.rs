//! Consumer groups, end to end with librdkafka, as a quick smoke test (the
//! broad group suite lives in `groups.rs`): two `subscribe()` consumers of
//! one group split a four-partition topic between them and commit what they
//! read; once they have left, a third consumer of the group resumes exactly
//! where they committed. On one node, and on a three-node cluster where the
//! group coordinator is whichever broker leads the group's
//! `__consumer_offsets` partition.
//!
//! And offsets in a transaction: a consumer-group member's transactional
//! producer sends its offsets with the transaction
//! (`send_offsets_to_transaction`); OffsetFetch with `require_stable`
//! answers UNSTABLE_OFFSET_COMMIT until the transaction commits, then the
//! offsets; offsets sent with an aborted transaction never become visible.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, ApiKey, GroupId, OffsetFetchRequest, ProducerId, TopicName,
    TransactionalId, TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes;
use samsa_tests::txn::{create_topic_default_rf, retry_coordinator, TxnProducer, TXN_CALL_TIMEOUT};
use samsa_tests::wait::wait_until;
use samsa_tests::{unique_topic, KafkaClient, SamsaNode};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i64 = 10;

fn produce(bootstrap: &str, topic: &str, per_partition: i64, tag: &str) {
    produce_to(bootstrap, topic, PARTITIONS, per_partition, tag);
}

fn produce_to(bootstrap: &str, topic: &str, partitions: i32, per_partition: i64, tag: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    for p in 0..partitions {
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

/// Connects to a node by id.
type Connect<'a> = &'a dyn Fn(i32) -> anyhow::Result<KafkaClient>;

/// OffsetFetch (v8+, `require_stable`) of `topic`-0 for `group`, asked of
/// the group's coordinator (found through node `ask`): `(partition error
/// code, committed offset)`. Coordinator errors are retried for 30 s.
fn try_stable_offset(
    connect: Connect<'_>,
    ask: i32,
    group: &str,
    topic: &str,
) -> anyhow::Result<(i16, i64)> {
    let mut any = connect(ask)?;
    let (code, node) =
        retry_coordinator("FindCoordinator(GROUP)", Duration::from_secs(30), || {
            any.find_coordinator(0, group)
        })?;
    anyhow::ensure!(code == 0, "FindCoordinator for {group}: error {code}");
    let mut coordinator = connect(node)?;
    let version = coordinator.version_for(ApiKey::OffsetFetch)?;
    anyhow::ensure!(version >= 8, "OffsetFetch v{version}");
    let request = OffsetFetchRequest::default()
        .with_require_stable(true)
        .with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_indexes(vec![0])]))]);
    let (_, answer) = retry_coordinator("OffsetFetch", Duration::from_secs(30), || {
        let r = coordinator.send(&request, version)?;
        let g = r
            .groups
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no group answered"))?;
        if g.error_code != 0 {
            return Ok((g.error_code, (g.error_code, -1)));
        }
        let p = &g.topics[0].partitions[0];
        Ok((0, (p.error_code, p.committed_offset)))
    })?;
    Ok(answer)
}

fn stable_offset(connect: Connect<'_>, group: &str, topic: &str) -> (i16, i64) {
    try_stable_offset(connect, 1, group, topic).unwrap()
}

fn offsets_in_transactions(bootstrap: &str, admin: &mut KafkaClient, connect: Connect<'_>) {
    let input = unique_topic("groups-txn-in");
    let output = unique_topic("groups-txn-out");
    let group = unique_topic("groups-txn-g");
    create_topic_default_rf(admin, &input, 1).unwrap();
    create_topic_default_rf(admin, &output, 1).unwrap();
    produce_to(bootstrap, &input, 1, 10, "in");

    let consumer = group_consumer(bootstrap, &group, &input);
    let producer = TxnProducer::transactional(bootstrap, &unique_topic("groups-txn-p"));
    // Reads the next `count` records of the input.
    let read = |count: usize| {
        let mut seen = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen.get(&0).map_or(0, BTreeSet::len) < count {
            poll_into(&consumer, &mut seen);
            assert!(Instant::now() < deadline, "the member read only {seen:?}");
        }
    };
    let send_offsets = |offset: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&input, 0, Offset::Offset(offset))
            .unwrap();
        producer
            .inner()
            .send_offsets_to_transaction(
                &tpl,
                &consumer.group_metadata().unwrap(),
                TXN_CALL_TIMEOUT,
            )
            .unwrap();
    };

    // Committed with the transaction.
    read(10);
    producer.begin().unwrap();
    for i in 0..10 {
        producer.send_ok(&output, Some(0), &format!("out-{i}"));
    }
    send_offsets(10);
    assert_eq!(
        stable_offset(connect, &group, &input).0,
        codes::UNSTABLE_OFFSET_COMMIT,
        "offsets of an open transaction are unstable"
    );
    producer.commit().unwrap();
    // EndTxn is answered once the decision is durable; the marker that
    // makes the offsets visible follows.
    wait_until(
        "the committed transaction's offsets",
        Duration::from_secs(30),
        || (stable_offset(connect, &group, &input) == (0, 10)).then_some(()),
    );

    // Sent with an aborted transaction: never visible.
    produce_to(bootstrap, &input, 1, 5, "more");
    read(5);
    producer.begin().unwrap();
    producer.send_ok(&output, Some(0), "aborted");
    send_offsets(15);
    assert_eq!(
        stable_offset(connect, &group, &input).0,
        codes::UNSTABLE_OFFSET_COMMIT
    );
    producer.abort().unwrap();
    wait_until(
        "the aborted transaction's offsets to be dropped",
        Duration::from_secs(30),
        || (stable_offset(connect, &group, &input).0 == 0).then_some(()),
    );
    assert_eq!(
        stable_offset(connect, &group, &input),
        (0, 10),
        "the abort left the offsets as they were"
    );
}

#[test]
fn transactional_offsets_are_visible_once_committed_and_never_if_aborted() {
    let node = SamsaNode::start();
    offsets_in_transactions(
        &node.bootstrap(),
        &mut node.client(),
        &|_| Ok(node.client()),
    );
}

#[test]
fn cluster_transactional_offsets_are_visible_once_committed_and_never_if_aborted() {
    let cluster = SamsaCluster::start(3, &[]);
    offsets_in_transactions(&cluster.bootstrap(), &mut cluster.client(1), &|id| {
        KafkaClient::connect(cluster.node(id).addr())
    });
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

/// The group coordinator is SIGKILLed after a plain commit and a committed
/// transaction's offsets: the broker that takes over its
/// `__consumer_offsets` partition rebuilds both by replaying it (the
/// transactional offsets resolved by the COMMIT marker in the log).
#[test]
fn cluster_offsets_survive_a_coordinator_sigkill() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let bootstrap = cluster.bootstrap();
    let input = unique_topic("groups-failover-in");
    let output = unique_topic("groups-failover-out");
    let group = unique_topic("groups-failover-g");
    create_topic_default_rf(&mut cluster.client(1), &input, 1).unwrap();
    create_topic_default_rf(&mut cluster.client(1), &output, 1).unwrap();
    produce_to(&bootstrap, &input, 1, 10, "in");

    // A standalone commit of 7 (assign(), generation -1) ...
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("broker.address.family", "v4")
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&input, 0, Offset::Offset(7))
        .unwrap();
    // The group's offsets partition of a fresh cluster may still be
    // loading: librdkafka hands COORDINATOR_LOAD_IN_PROGRESS to the
    // application after its own retries, and an application commits again.
    wait_until(
        "the first commit",
        Duration::from_secs(30),
        || match consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => Some(()),
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::CoordinatorLoadInProgress)) => None,
            Err(e) => panic!("commit: {e}"),
        },
    );
    // ... then 9 with a committed transaction.
    let producer = TxnProducer::transactional(&bootstrap, &unique_topic("groups-failover-p"));
    producer.begin().unwrap();
    producer.send_ok(&output, Some(0), "out");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&input, 0, Offset::Offset(9))
        .unwrap();
    producer
        .inner()
        .send_offsets_to_transaction(&tpl, &consumer.group_metadata().unwrap(), TXN_CALL_TIMEOUT)
        .unwrap();
    producer.commit().unwrap();
    let connect = |id: i32| KafkaClient::connect(cluster.node(id).addr());
    wait_until("the transaction's offsets", Duration::from_secs(30), || {
        (stable_offset(&connect, &group, &input) == (0, 9)).then_some(())
    });
    drop(producer);
    drop(consumer);

    let (code, coordinator) = cluster.client(1).find_coordinator(0, &group).unwrap();
    assert_eq!(code, 0);
    cluster.sigkill(coordinator);
    let ask = if coordinator == 1 { 2 } else { 1 };
    let connect = |id: i32| {
        anyhow::ensure!(id != coordinator, "node {id} was killed");
        KafkaClient::connect(cluster.node(id).addr())
    };
    wait_until(
        "a new coordinator with the offsets",
        Duration::from_secs(60),
        || {
            let answer = try_stable_offset(&connect, ask, &group, &input).ok()?;
            assert!(
                answer.0 != 0 || answer.1 == 9,
                "the new coordinator answers {answer:?}, not offset 9"
            );
            (answer == (0, 9)).then_some(())
        },
    );
}

fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// TxnOffsetCommit of offset 1 for `topic`-0 at `version`: the partition's
/// error code.
#[allow(clippy::too_many_arguments)]
fn txn_offset_commit(
    client: &mut KafkaClient,
    version: i16,
    transactional_id: &str,
    producer: (i64, i16),
    group: &str,
    generation: i32,
    member: &str,
    topic: &str,
) -> i16 {
    let request = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(sb(transactional_id)))
        .with_group_id(GroupId(sb(group)))
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_generation_id(if version >= 3 { generation } else { -1 })
        .with_member_id(sb(if version >= 3 { member } else { "" }))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(sb(topic)))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default()
                .with_partition_index(0)
                .with_committed_offset(1)])]);
    let (_, code) = retry_coordinator("TxnOffsetCommit", Duration::from_secs(30), || {
        let r = client.send(&request, version)?;
        let code = r.topics[0].partitions[0].error_code;
        Ok((code, code))
    })
    .unwrap();
    code
}

/// On the wire: a TxnOffsetCommit naming a member the group does not know
/// is refused (KIP-447; the other checks are unit tests of the coordinator); one from a producer whose
/// epoch a newer instance bumped is PRODUCER_FENCED (INVALID_PRODUCER_EPOCH
/// below v3); a producer that never added the offsets partition to its
/// transaction cannot commit offsets (INVALID_TXN_STATE).
#[test]
fn txn_offset_commit_fences_zombies_and_stale_producers() {
    let node = SamsaNode::start();
    let mut client = node.client();
    let topic = unique_topic("groups-fence-in");
    create_topic_default_rf(&mut client, &topic, 1).unwrap();
    let group = unique_topic("groups-fence-g");
    let tid = unique_topic("groups-fence-t");
    let init = |client: &mut KafkaClient| {
        let (_, r) = retry_coordinator("InitProducerId", Duration::from_secs(30), || {
            let r = client.init_producer_id_txn(&tid, 60_000, (-1, -1))?;
            Ok((r.error_code, r))
        })
        .unwrap();
        assert_eq!(r.error_code, 0);
        (r.producer_id.0, r.producer_epoch)
    };
    let producer = init(&mut client);
    let (code, _) = retry_coordinator("FindCoordinator(GROUP)", Duration::from_secs(30), || {
        client.find_coordinator(0, &group)
    })
    .unwrap();
    assert_eq!(code, 0);

    // Not in the transaction yet: nothing may be committed.
    assert_eq!(
        txn_offset_commit(&mut client, 3, &tid, producer, &group, -1, "", &topic),
        codes::INVALID_TXN_STATE
    );
    let add = AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(sb(&tid)))
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_group_id(GroupId(sb(&group)));
    let (code, _) = retry_coordinator("AddOffsetsToTxn", Duration::from_secs(30), || {
        let r = client.call(&add)?;
        Ok((r.error_code, ()))
    })
    .unwrap();
    assert_eq!(code, 0);

    // KIP-447: a member the group does not have (a zombie).
    assert_eq!(
        txn_offset_commit(&mut client, 3, &tid, producer, &group, 4, "zombie", &topic),
        codes::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        txn_offset_commit(&mut client, 3, &tid, producer, &group, -1, "", &topic),
        0,
        "outside the group (generation -1, no member) the offsets are taken"
    );

    // A new instance bumps the epoch (fencing the open transaction).
    let (_, newer) = retry_coordinator("InitProducerId", Duration::from_secs(30), || {
        let r = client.init_producer_id_txn(&tid, 60_000, (-1, -1))?;
        Ok((r.error_code, r))
    })
    .unwrap();
    assert_eq!(newer.error_code, 0);
    assert!(newer.producer_epoch > producer.1);
    assert_eq!(
        txn_offset_commit(&mut client, 3, &tid, producer, &group, -1, "", &topic),
        codes::PRODUCER_FENCED
    );
    assert_eq!(
        txn_offset_commit(&mut client, 2, &tid, producer, &group, -1, "", &topic),
        codes::INVALID_PRODUCER_EPOCH
    );
    // The fence aborted the transaction: its offsets never became visible.
    let connect = |_: i32| Ok(node.client());
    wait_until(
        "the fenced transaction to resolve",
        Duration::from_secs(30),
        || (stable_offset(&connect, &group, &topic) == (0, -1)).then_some(()),
    );
}

/// Offset retention (`offsets_retention_minutes`, a minute being the least
/// Kafka's setting allows): the offsets a group committed stay while it has
/// a member and for the retention after its last member left, then expire,
/// and a consumer of the group starts over at `auto.offset.reset`.
#[test]
fn committed_offsets_expire_a_retention_after_the_group_empties() {
    let node = SamsaNode::start_with(&[
        "offsets_retention_minutes=1",
        "offsets_retention_check_interval_ms=500",
    ]);
    let bootstrap = node.bootstrap();
    let mut admin = node.client();
    let topic = unique_topic("retention");
    let group = unique_topic("retention-g");
    admin.create_topic(&topic, 1).unwrap();
    produce_to(&bootstrap, &topic, 1, 3, "r");

    let consumer = group_consumer(&bootstrap, &group, &topic);
    let mut seen = BTreeMap::new();
    wait_until("three records read", Duration::from_secs(60), || {
        poll_into(&consumer, &mut seen);
        (seen.get(&0).map_or(0, BTreeSet::len) == 3).then_some(())
    });
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();
    drop(consumer);
    let emptied = Instant::now();
    assert_eq!(
        samsa_tests::group::wait_committed_offset(
            &mut admin,
            &group,
            &topic,
            0,
            3,
            Duration::from_secs(30)
        ),
        Ok(3),
        "committed, and kept once the group is empty"
    );
    samsa_tests::group::wait_committed_offset(
        &mut admin,
        &group,
        &topic,
        0,
        -1,
        Duration::from_secs(120),
    )
    .unwrap_or_else(|last| panic!("the offset never expired: {last}"));
    // The broker's clock started when the member left, a moment before
    // `emptied`; the expiry cannot come before the retention.
    assert!(
        emptied.elapsed() >= Duration::from_secs(55),
        "expired {:?} after the group emptied, before its retention of a minute",
        emptied.elapsed()
    );
}
