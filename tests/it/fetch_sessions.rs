//! Kafka fetch sessions (KIP-227) over the raw protocol: a full fetch that
//! opens a session, incremental fetches that name only what changed and
//! get answers for only the partitions with news (a settled partition
//! included, when new records or a new log start arrive), forgotten partitions,
//! the session errors a client starts over from, closing, and the
//! `/metrics` gauges. kafka-python's consumer drives the same sessions in
//! `tests/compat/test_kafka_python.py`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use samsa_tests::codes::NONE;
use samsa_tests::http::{http_get, metric};
use samsa_tests::{unique_topic, BatchBuilder, KafkaClient, SamsaNode};

/// Fetch by topic name (v13 names topics by id).
const V12: i16 = 12;
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
const INVALID_FETCH_SESSION_EPOCH: i16 = 71;
const FETCH_SESSION_TOPIC_ID_ERROR: i16 = 106;

fn request(topic: &str, offsets: &[(i32, i64)], session_id: i32, epoch: i32) -> FetchRequest {
    let partitions = offsets
        .iter()
        .map(|(partition, offset)| {
            FetchPartition::default()
                .with_partition(*partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(*offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1024 * 1024)
        })
        .collect::<Vec<_>>();
    let topics = if partitions.is_empty() {
        Vec::new()
    } else {
        vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(partitions)]
    };
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        // An answer with nothing new waits this long: short, as the test
        // expects empty answers.
        .with_max_wait_ms(200)
        .with_min_bytes(1)
        .with_max_bytes(16 * 1024 * 1024)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

fn name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_owned()))
}

/// Per partition an answer names: (high watermark, record values).
fn answered(resp: &FetchResponse) -> BTreeMap<i32, (i64, Vec<String>)> {
    let mut out = BTreeMap::new();
    for topic in &resp.responses {
        for p in &topic.partitions {
            assert_eq!(p.error_code, NONE, "partition {}", p.partition_index);
            let data = p.records.as_ref().map(|b| b.as_ref()).unwrap_or(&[]);
            let (records, _) = samsa_tests::batch::decode_records(p.partition_index, data).unwrap();
            let values = records
                .iter()
                .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or(&[])).into_owned())
                .collect();
            out.insert(p.partition_index, (p.high_watermark, values));
        }
    }
    out
}

fn produce(c: &mut KafkaClient, topic: &str, partition: i32, value: &str) {
    let batch: Bytes = BatchBuilder::new().record(value).build();
    let r = c.produce(topic, partition, batch, -1).unwrap();
    assert_eq!(r.error_code, NONE);
}

fn session_gauges(node: &SamsaNode) -> (Option<i64>, Option<i64>) {
    let (status, body) = http_get(node.http_addr(), "/metrics").expect("GET /metrics");
    assert_eq!(status, 200);
    (
        metric(&body, "samsa_fetch_sessions"),
        metric(&body, "samsa_fetch_session_partitions"),
    )
}

#[test]
fn a_fetch_session_answers_only_partitions_with_news() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let topic = unique_topic("fetch-session");
    c.create_topic(&topic, 3).unwrap();
    for partition in 0..3 {
        produce(&mut c, &topic, partition, &format!("first-{partition}"));
    }
    let mut f = node.client();

    // A full fetch opening a session answers every partition.
    let all_at_zero = [(0, 0), (1, 0), (2, 0)];
    let resp = f.send(&request(&topic, &all_at_zero, 0, 0), V12).unwrap();
    assert_eq!(resp.error_code, NONE);
    let id = resp.session_id;
    assert_ne!(id, 0, "the broker opened no session");
    let expected: BTreeMap<_, _> = (0..3)
        .map(|p| (p, (1, vec![format!("first-{p}")])))
        .collect();
    assert_eq!(answered(&resp), expected);
    assert_eq!(session_gauges(&node), (Some(1), Some(3)));

    // The client moved on in every partition: nothing new to answer.
    let moved = [(0, 1), (1, 1), (2, 1)];
    let resp = f.send(&request(&topic, &moved, id, 1), V12).unwrap();
    assert_eq!((resp.error_code, resp.session_id), (NONE, id));
    assert_eq!(answered(&resp), BTreeMap::new());

    // A record in one partition: only that partition is answered, for a
    // request that names nothing.
    produce(&mut c, &topic, 1, "second-1");
    let resp = f.send(&request(&topic, &[], id, 2), V12).unwrap();
    assert_eq!(
        answered(&resp),
        BTreeMap::from([(1, (2, vec!["second-1".to_owned()]))])
    );

    // The same epoch again, another session's id, another naming: each is
    // refused with no partitions, and the session goes on.
    let resp = f.send(&request(&topic, &[], id, 2), V12).unwrap();
    assert_eq!(
        (resp.error_code, resp.responses.len()),
        (INVALID_FETCH_SESSION_EPOCH, 0)
    );
    let other = if id == i32::MAX { 1 } else { id + 1 };
    let resp = f.send(&request(&topic, &[], other, 1), V12).unwrap();
    assert_eq!(resp.error_code, FETCH_SESSION_ID_NOT_FOUND);
    let resp = f.send(&request(&topic, &[], id, 3), 13).unwrap();
    assert_eq!(resp.error_code, FETCH_SESSION_TOPIC_ID_ERROR);

    // Forget partition 0; a record there is then not answered.
    let mut forget = request(&topic, &[(1, 2)], id, 3);
    forget.forgotten_topics_data = vec![ForgottenTopic::default()
        .with_topic(name(&topic))
        .with_partitions(vec![0])];
    produce(&mut c, &topic, 0, "second-0");
    let resp = f.send(&forget, V12).unwrap();
    assert_eq!((resp.error_code, resp.session_id), (NONE, id));
    assert_eq!(answered(&resp), BTreeMap::new());
    assert_eq!(session_gauges(&node), (Some(1), Some(2)));

    // Naming it again answers it from the offset named.
    let resp = f.send(&request(&topic, &[(0, 1)], id, 4), V12).unwrap();
    assert_eq!(
        answered(&resp),
        BTreeMap::from([(0, (2, vec!["second-0".to_owned()]))])
    );

    // Caught up everywhere: nothing to answer, and every partition is
    // settled (the broker skips reading it).
    let resp = f.send(&request(&topic, &[(0, 2)], id, 5), V12).unwrap();
    assert_eq!(answered(&resp), BTreeMap::new());

    // A long poll on settled partitions wakes when a record arrives: with
    // a max_wait no machine takes to produce a record (60 s), an answer
    // before it can only be the wake-up by the produce.
    let long_poll = request(&topic, &[], id, 6).with_max_wait_ms(60_000);
    f.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let sent_at = Instant::now();
    let corr = f.send_only(&long_poll, V12).unwrap();
    // A round trip on the other connection first, so the fetch is most
    // likely parked when the record lands.
    c.api_versions().unwrap();
    produce(&mut c, &topic, 2, "second-2");
    let resp = f.recv::<FetchRequest>(corr, V12).unwrap();
    let waited = sent_at.elapsed();
    assert_eq!(
        answered(&resp),
        BTreeMap::from([(2, (2, vec!["second-2".to_owned()]))])
    );
    assert!(
        waited < Duration::from_secs(60),
        "the long poll answered after {waited:?}: it sat out its max_wait"
    );

    // Settled again at the log end, then the log start moves: news.
    let resp = f.send(&request(&topic, &[(2, 2)], id, 7), V12).unwrap();
    assert_eq!(answered(&resp), BTreeMap::new());
    assert_eq!(c.delete_records(&topic, 2, 1).unwrap(), (NONE, 1));
    let resp = f.send(&request(&topic, &[], id, 8), V12).unwrap();
    let named: Vec<_> = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| {
            (
                p.partition_index,
                p.error_code,
                p.high_watermark,
                p.log_start_offset,
            )
        })
        .collect();
    assert_eq!(named, vec![(2, NONE, 2, 1)]);

    // Closing the session answers in full, without a session; the id is
    // then unknown.
    let resp = f.send(&request(&topic, &moved, id, -1), V12).unwrap();
    assert_eq!((resp.error_code, resp.session_id), (NONE, 0));
    assert_eq!(
        answered(&resp)
            .into_iter()
            .map(|(p, (hw, values))| (p, hw, values.len()))
            .collect::<Vec<_>>(),
        vec![(0, 2, 1), (1, 2, 1), (2, 2, 1)]
    );
    let resp = f.send(&request(&topic, &[], id, 9), V12).unwrap();
    assert_eq!(resp.error_code, FETCH_SESSION_ID_NOT_FOUND);
    assert_eq!(session_gauges(&node), (Some(0), Some(0)));
}

#[test]
fn without_session_slots_every_fetch_is_full() {
    let node = SamsaNode::start_with(&["max_incremental_fetch_session_cache_slots=0"]);
    let mut c = node.client();
    let topic = unique_topic("fetch-no-session");
    c.create_topic(&topic, 2).unwrap();
    produce(&mut c, &topic, 0, "only");
    let resp = c
        .send(&request(&topic, &[(0, 0), (1, 0)], 0, 0), V12)
        .unwrap();
    assert_eq!((resp.error_code, resp.session_id), (NONE, 0));
    assert_eq!(
        answered(&resp),
        BTreeMap::from([(0, (1, vec!["only".to_owned()])), (1, (0, vec![]))])
    );
    assert_eq!(session_gauges(&node), (Some(0), Some(0)));
}
