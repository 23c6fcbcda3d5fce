//! ListOffsets semantics, DeleteRecords, Fetch long polling, the first
//! OffsetFetch of a fresh broker, and OffsetCommit of unknown partitions.

use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::ApiKey;
use samsa_tests::batch::now_ms;
use samsa_tests::client::fetch_request;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes::{INVALID_TOPIC_EXCEPTION, NONE, OFFSET_OUT_OF_RANGE};
use samsa_tests::txn::{create_topic_default_rf, partition_leaders};
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

#[test]
fn list_offsets_earliest_latest_by_timestamp_and_max_timestamp() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("lo");
    c.create_topic(&t, 1).unwrap();

    // Empty partition: earliest = latest = 0.
    assert_eq!(c.list_offsets(&t, 0, -2).unwrap().offset, 0);
    assert_eq!(c.list_offsets(&t, 0, -1).unwrap().offset, 0);

    // Timestamps an hour in the past (within any timestamp-skew limit).
    let base = now_ms() - 3_600_000;
    let batches = [
        // offsets 0,1,2
        BatchBuilder::new()
            .record_at("t0", base)
            .record_at("t1", base + 10)
            .record_at("t2", base + 20),
        // offsets 3,4: not monotonic; 3 holds the partition's max timestamp
        BatchBuilder::new()
            .record_at("t3", base + 500)
            .record_at("t4", base + 400),
        // offset 5
        BatchBuilder::new().record_at("t5", base + 300),
    ];
    let mut next = 0;
    for b in &batches {
        let r = c.produce(&t, 0, b.build(), -1).unwrap();
        assert_eq!((r.error_code, r.base_offset), (NONE, next), "{r:?}");
        next += b.len() as i64;
    }

    let lo = |c: &mut samsa_tests::KafkaClient, ts: i64| {
        let r = c.list_offsets(&t, 0, ts).unwrap();
        assert_eq!(r.error_code, NONE, "ListOffsets {ts}: {r:?}");
        (r.offset, r.timestamp)
    };
    assert_eq!(lo(&mut c, -2).0, 0, "earliest");
    assert_eq!(lo(&mut c, -1).0, 6, "latest");
    // By timestamp: the first offset whose timestamp is >= the target.
    assert_eq!(lo(&mut c, base), (0, base), "exact first timestamp");
    assert_eq!(lo(&mut c, base - 1000), (0, base), "before everything");
    assert_eq!(
        lo(&mut c, base + 10),
        (1, base + 10),
        "exact middle timestamp"
    );
    assert_eq!(lo(&mut c, base + 11), (2, base + 20), "between two records");
    assert_eq!(
        lo(&mut c, base + 21),
        (3, base + 500),
        "first record of batch 2"
    );
    assert_eq!(
        lo(&mut c, base + 350),
        (3, base + 500),
        "earliest offset with ts >= target (offset 3), not the closest timestamp"
    );
    assert_eq!(lo(&mut c, base + 501), (-1, -1), "after every timestamp");

    // Max timestamp (-3, ListOffsets v7+): the record holding the largest timestamp.
    let max_v = c.version_for(ApiKey::ListOffsets).unwrap();
    assert!(
        max_v >= 7,
        "ListOffsets v{max_v}: max-timestamp lookup (-3) needs v7"
    );
    assert_eq!(lo(&mut c, -3), (3, base + 500), "max timestamp");

    // Unknown partition.
    let r = c.list_offsets(&t, 9, -1).unwrap();
    assert_eq!(
        r.error_code,
        samsa_tests::codes::UNKNOWN_TOPIC_OR_PARTITION,
        "{r:?}"
    );

    // ListOffsets v1 (oldest served by Kafka 4) gives the same answers.
    let v1 = c.list_offsets_at(&t, 0, base + 11, 1).unwrap();
    assert_eq!(
        (v1.error_code, v1.offset, v1.timestamp),
        (NONE, 2, base + 20)
    );
}

#[test]
fn fetch_long_poll_waits_and_wakes_on_produce() {
    let node = SamsaNode::start();
    let mut producer = node.client();
    let t = unique_topic("poll");
    producer.create_topic(&t, 1).unwrap();
    let r = producer
        .produce(&t, 0, BatchBuilder::new().record("first").build(), -1)
        .unwrap();
    assert_eq!((r.error_code, r.base_offset), (NONE, 0));

    let mut fetcher = node.client();
    let version = fetcher.version_for(ApiKey::Fetch).unwrap();

    // Nothing past offset 1: a fetch with max_wait 500 ms waits about that long.
    let started = Instant::now();
    let p = fetcher.fetch(&t, 0, 1, 500, 1).unwrap();
    let waited = started.elapsed();
    assert_eq!(p.error_code, NONE, "{p:?}");
    assert!(p.records.as_ref().is_none_or(|r| r.is_empty()), "{p:?}");
    assert_eq!(p.high_watermark, 1);
    // It waited (a lower bound, which a slow machine only makes longer) and
    // then answered: the answer came before the client's 30 s read timeout.
    assert!(
        waited >= Duration::from_millis(400),
        "an empty fetch with max_wait 500 ms and min_bytes 1 returned after {waited:?}"
    );

    // A long poll answers as soon as a record arrives. With a max_wait far
    // longer than any machine takes to produce a record (60 s), an answer
    // before max_wait can only be the wake-up by the produce; a broker that
    // sat out its max_wait fails the bound however fast the machine is.
    const LONG_POLL_MS: i32 = 60_000;
    let max_wait = Duration::from_millis(u64::try_from(LONG_POLL_MS).unwrap());
    fetcher
        .set_read_timeout(Some(max_wait + Duration::from_secs(30)))
        .unwrap();
    let req: FetchRequest = fetch_request(&t, 0, 1, LONG_POLL_MS, 1);
    let sent_at = Instant::now();
    let corr = fetcher.send_only(&req, version).unwrap();
    // Give the broker a request round trip on another connection, so the
    // fetch is most likely parked before the record is produced.
    producer.api_versions().unwrap();
    let r = producer
        .produce(&t, 0, BatchBuilder::new().record("second").build(), -1)
        .unwrap();
    assert_eq!((r.error_code, r.base_offset), (NONE, 1));
    let acked_at = Instant::now();
    let resp = fetcher.recv::<FetchRequest>(corr, version).unwrap();
    let answered_at = Instant::now();
    let total = answered_at - sent_at;
    let after_ack = answered_at - acked_at;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, NONE);
    let (recs, _) = samsa_tests::batch::decode_records(
        0,
        p.records.as_ref().map(|b| b.as_ref()).unwrap_or(&[]),
    )
    .unwrap();
    assert_eq!(
        recs.iter()
            .map(|r| (r.offset, r.value.clone().unwrap_or_default()))
            .collect::<Vec<_>>(),
        vec![(1, bytes::Bytes::from_static(b"second"))],
        "long poll answer"
    );
    assert!(
        total < max_wait,
        "long poll answered {total:?} after the fetch and {after_ack:?} after the produce \
         was acknowledged: it waited out its max_wait of {max_wait:?}"
    );
}

/// Produces `n` single-record batches to partition 0 of `topic`.
fn produce_records(c: &mut samsa_tests::KafkaClient, topic: &str, n: usize) {
    for i in 0..n {
        let r = c
            .produce(
                topic,
                0,
                BatchBuilder::new().record(format!("r{i}")).build(),
                -1,
            )
            .unwrap();
        assert_eq!(r.error_code, NONE, "{r:?}");
    }
}

/// DeleteRecords moves the log start: earliest answers it, fetches below
/// it are out of range, the records from it on stay readable, and the move
/// survives a SIGKILL and restart. Offsets above the high watermark and internal
/// topics are refused with Kafka's codes; -1 deletes up to the HW.
#[test]
fn delete_records_moves_the_log_start_and_survives_restart() {
    let mut node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("delrec");
    c.create_topic(&t, 1).unwrap();
    produce_records(&mut c, &t, 10);

    assert_eq!(
        c.delete_records(&t, 0, 11).unwrap(),
        (OFFSET_OUT_OF_RANGE, -1)
    );
    assert_eq!(c.delete_records(&t, 0, 6).unwrap(), (NONE, 6));
    assert_eq!(c.list_offsets(&t, 0, -2).unwrap().offset, 6, "earliest");
    assert_eq!(
        c.fetch(&t, 0, 5, 0, 1).unwrap().error_code,
        OFFSET_OUT_OF_RANGE
    );
    let read = c.fetch_all(&t, 0, 6).unwrap();
    assert_eq!(read.first().map(|r| r.offset), Some(6), "{read:?}");
    assert_eq!(read.len(), 4, "{read:?}");
    // A lower offset leaves the log start where it is.
    assert_eq!(c.delete_records(&t, 0, 3).unwrap(), (NONE, 6));
    assert_eq!(
        c.delete_records("__consumer_offsets", 0, 0).unwrap().0,
        INVALID_TOPIC_EXCEPTION
    );

    node.sigkill();
    node.restart();
    let mut c = node.client();
    assert_eq!(
        c.list_offsets(&t, 0, -2).unwrap().offset,
        6,
        "earliest after restart"
    );
    assert_eq!(
        c.delete_records(&t, 0, -1).unwrap(),
        (NONE, 10),
        "-1 = the high watermark"
    );
    assert_eq!(c.list_offsets(&t, 0, -2).unwrap().offset, 10);
}

/// Followers follow the leader's DeleteRecords: after the leader is
/// killed, the new leader's log starts where the old one's did.
/// Three nodes: in the `heavy` nextest group with the other cluster tests.
#[test]
fn cluster_delete_records_reaches_the_followers() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let t = unique_topic("delrec-rf3");
    create_topic_default_rf(&mut cluster.client(1), &t, 1).unwrap();
    let leader = samsa_tests::txn::serving_leader(&cluster, 1, &t, 0, Duration::from_secs(30));
    let mut c = cluster.client(leader);
    produce_records(&mut c, &t, 10);
    assert_eq!(c.delete_records(&t, 0, 7).unwrap(), (NONE, 7));

    // One more acks=all record: the HW passes it only once every ISR
    // follower fetched it, in an answer that carried the new log start.
    produce_records(&mut c, &t, 1);
    let survivor = *cluster.ids().iter().find(|&&id| id != leader).unwrap();
    cluster.sigkill(leader);
    let earliest = samsa_tests::wait_until(
        "a new leader's earliest offset",
        Duration::from_secs(60),
        || {
            let new_leader = partition_leaders(&mut cluster.client(survivor), &t)?[&0];
            if new_leader == leader {
                return None;
            }
            let r = cluster.client(new_leader).list_offsets(&t, 0, -2).ok()?;
            (r.error_code == NONE).then_some(r.offset)
        },
    );
    assert_eq!(earliest, 7, "the new leader's log start");
}

/// Waits until FindCoordinator(GROUP) names a coordinator for `group`
/// (the first request creates `__consumer_offsets`).
fn wait_group_coordinator(c: &mut samsa_tests::KafkaClient, group: &str) {
    use samsa_tests::codes::COORDINATOR_NOT_AVAILABLE;
    const GROUP_KEY: i8 = 0;
    samsa_tests::wait_until("a group coordinator", Duration::from_secs(60), || {
        let (code, _) = c.find_coordinator(GROUP_KEY, group).unwrap();
        assert!(
            code == NONE || code == COORDINATOR_NOT_AVAILABLE,
            "FindCoordinator: {code}"
        );
        (code == NONE).then_some(())
    });
}

/// The first group of a fresh broker creates `__consumer_offsets`, whose
/// partitions open one by one. Once FindCoordinator names this broker, an
/// OffsetFetch sent at once may have to wait for the partition to load
/// (COORDINATOR_LOAD_IN_PROGRESS, which clients retry) but is never
/// NOT_COORDINATOR, which librdkafka hands to the application as a consumer
/// error (seen in librdkafka's 0113 cooperative_rebalance test).
#[test]
fn offset_fetch_right_after_find_coordinator_is_not_refused() {
    use kafka_protocol::messages::{GroupId, OffsetFetchRequest};
    use kafka_protocol::protocol::StrBytes;
    use samsa_tests::codes::COORDINATOR_LOAD_IN_PROGRESS;

    // Many offsets partitions, so that opening them takes a while, and a
    // group of the last one to open, asked for without pause between
    // tries: the first answer naming a coordinator comes as early as the
    // broker gives one.
    const PARTITIONS: i32 = 200;
    let node = SamsaNode::start_with(&[&format!("offsets_topic_num_partitions={PARTITIONS}")]);
    let mut c = node.client();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let prefix = unique_topic("first-group");
    let group = (0..100_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|g| samsa_tests::txn::transaction_state_partition(g, PARTITIONS) == PARTITIONS - 1)
        .expect("a group id placed on the last offsets partition");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, _) = c.find_coordinator(0, &group).unwrap();
        if code == NONE {
            break;
        }
        assert_eq!(
            code,
            samsa_tests::codes::COORDINATOR_NOT_AVAILABLE,
            "FindCoordinator"
        );
        assert!(
            Instant::now() < deadline,
            "no group coordinator within 60 s"
        );
    }
    let fetch = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.clone())))
        .with_topics(None);
    let code = c.send(&fetch, 7).unwrap().error_code;
    assert!(
        code == NONE || code == COORDINATOR_LOAD_IN_PROGRESS,
        "OffsetFetch right after FindCoordinator answered {code}"
    );
    // And it is served once loaded.
    samsa_tests::wait_until("OffsetFetch served", Duration::from_secs(30), || {
        (c.send(&fetch, 7).unwrap().error_code == NONE).then_some(())
    });
}

/// As Kafka, OffsetCommit answers UNKNOWN_TOPIC_OR_PARTITION for each
/// partition the metadata does not know, and commits the others (found by
/// librdkafka's 0030 offset_commit test, which commits to a topic that
/// does not exist).
#[test]
fn offset_commit_of_unknown_partitions_is_refused_per_partition() {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest};
    use kafka_protocol::protocol::StrBytes;
    use samsa_tests::client::topic_name;
    use samsa_tests::codes::{
        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
        UNKNOWN_TOPIC_OR_PARTITION,
    };

    let node = SamsaNode::start();
    let mut c = node.client();
    let known = unique_topic("commit-known");
    c.create_topic(&known, 1).unwrap();
    let missing = unique_topic("commit-missing");
    let group = unique_topic("commit-group");
    let topic = |name: &str, partitions: &[i32]| {
        OffsetCommitRequestTopic::default()
            .with_name(topic_name(name))
            .with_partitions(
                partitions
                    .iter()
                    .map(|&p| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(5)
                    })
                    .collect(),
            )
    };
    wait_group_coordinator(&mut c, &group);
    // A standalone commit (no generation, no member), as librdkafka's
    // rd_kafka_commit() of an unsubscribed consumer sends it.
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.clone())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![topic(&known, &[0, 7]), topic(&missing, &[0, 1])]);
    let answers = samsa_tests::wait_until(
        "a loaded group coordinator",
        Duration::from_secs(60),
        || {
            let resp = c.send(&commit, 8).unwrap();
            let mut answers: Vec<(String, i32, i16)> = resp
                .topics
                .iter()
                .flat_map(|t| {
                    t.partitions
                        .iter()
                        .map(move |p| (t.name.0.to_string(), p.partition_index, p.error_code))
                })
                .collect();
            answers.sort();
            // Retry while the coordinator is created and loads.
            let loading = answers.iter().any(|a| {
                matches!(
                    a.2,
                    COORDINATOR_LOAD_IN_PROGRESS | COORDINATOR_NOT_AVAILABLE | NOT_COORDINATOR
                )
            });
            (!loading).then_some(answers)
        },
    );
    let mut expected = vec![
        (known.clone(), 0, NONE),
        (known.clone(), 7, UNKNOWN_TOPIC_OR_PARTITION),
        (missing.clone(), 0, UNKNOWN_TOPIC_OR_PARTITION),
        (missing.clone(), 1, UNKNOWN_TOPIC_OR_PARTITION),
    ];
    expected.sort();
    assert_eq!(answers, expected);
}
