//! A broker's file descriptors under a small open-file limit (`prlimit`):
//! it holds one per partition plus a bounded cache of inactive segments,
//! so many segments on disk fit; it reads every segment back through that
//! cache; it refuses (KAFKA_STORAGE_ERROR, naming the limit) a topic whose
//! partitions would not fit, instead of creating partitions it could not
//! open; and it recovers all of it after a SIGKILL under the same limit.

use samsa_tests::client::KafkaClient;
use samsa_tests::http::{http_get, metric};
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

const KAFKA_STORAGE_ERROR: i16 = 56;
const LIMIT: u64 = 1024;
const PARTITIONS: i32 = 300;
const BATCHES: usize = 6;

fn open_descriptors(node: &SamsaNode) -> usize {
    let pid = node.pid().expect("the node runs");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read the node's descriptors")
        .count()
}

fn value(partition: i32, batch: usize) -> String {
    format!("p{partition}-b{batch}-{}", "v".repeat(300))
}

fn read_back(c: &mut KafkaClient, topic: &str) {
    for partition in 0..PARTITIONS {
        let values: Vec<String> = c
            .fetch_all(topic, partition, 0)
            .unwrap_or_else(|e| panic!("read {topic}-{partition}: {e}"))
            .into_iter()
            .map(|r| String::from_utf8_lossy(&r.value.unwrap_or_default()).into_owned())
            .collect();
        let expected: Vec<String> = (0..BATCHES).map(|b| value(partition, b)).collect();
        assert_eq!(values, expected, "{topic}-{partition}");
    }
}

#[test]
fn many_segments_fit_a_small_open_file_limit_and_partitions_that_would_not_are_refused() {
    // Segments of about two batches: each partition ends with three or
    // more, ~900 in all; four descriptors per segment would be 3,600.
    let mut node = SamsaNode::start_with_open_file_limit(LIMIT, &["log.segment_bytes=1024"]);
    let mut c = node.client();
    let topic = unique_topic("descriptors");
    c.create_topic(&topic, PARTITIONS).unwrap();
    for batch in 0..BATCHES {
        for partition in 0..PARTITIONS {
            let records = BatchBuilder::new().record(value(partition, batch)).build();
            let r = c.produce(&topic, partition, records, -1).unwrap();
            assert_eq!(r.error_code, 0, "produce {topic}-{partition} batch {batch}");
        }
    }
    let segments = std::fs::read_dir(node.data_dir())
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().starts_with(&topic))
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
        .count();
    assert!(segments >= 3 * PARTITIONS as usize, "{segments} segments");

    // Reading from the start goes through every inactive segment.
    read_back(&mut c, &topic);
    let open = open_descriptors(&node);
    let (_, page) = http_get(node.http_addr(), "/metrics").unwrap();
    let budget = metric(&page, "samsa_segment_files_inactive_max").unwrap();
    let cached = metric(&page, "samsa_segment_files_inactive_open").unwrap();
    let opens = metric(&page, "samsa_segment_file_opens_total").unwrap();
    assert_eq!(
        budget,
        (LIMIT / 4) as i64,
        "a quarter of the limit by default"
    );
    assert!(
        cached <= budget,
        "{cached} cached over a budget of {budget}"
    );
    assert!(opens > 0, "inactive segments were opened on demand");
    assert!(
        open < PARTITIONS as usize + budget as usize + 128,
        "{open} descriptors for {PARTITIONS} partitions, {segments} segments"
    );
    assert_eq!(metric(&page, "samsa_partitions_unopened"), Some(0));

    // A topic that would not fit is refused before it exists.
    let too_big = unique_topic("too-many");
    let refused = c.create_topic_result(&too_big, 1000).unwrap();
    assert_eq!(refused.error_code, KAFKA_STORAGE_ERROR, "{refused:?}");
    let message = refused
        .error_message
        .map(|m| m.to_string())
        .unwrap_or_default();
    assert!(message.contains("open-file limit"), "{message}");
    assert!(
        c.topic_metadata(&too_big).is_none(),
        "a refused topic does not exist"
    );
    assert!(
        !node.data_dir().join(format!("{too_big}-0")).exists(),
        "no partition of a refused topic was created"
    );

    // Recovery after a crash opens every segment under the same limit.
    node.sigkill();
    node.restart();
    let mut c = node.client();
    read_back(&mut c, &topic);
    assert!(open_descriptors(&node) < LIMIT as usize);
}
