//! librdkafka end to end: 100,000 idempotent records into 4 partitions, read
//! back with assign(), checked exactly once and in order.

use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use samsa_tests::rdk::{
    checking_producer, consume_to_end, create_topic_admin, idempotent_producer_config, send_checked,
};
use samsa_tests::{unique_topic, EosChecker, SamsaNode};

const RECORDS: usize = 100_000;
const PARTITIONS: i32 = 4;

#[test]
fn librdkafka_idempotent_100k_exactly_once() {
    let node = SamsaNode::start();
    let topic = unique_topic("eos100k");
    create_topic_admin(&node.bootstrap(), &topic, PARTITIONS).unwrap();

    let checker = EosChecker::shared();
    let started = Instant::now();
    // Records without keys: librdkafka's sticky partitioner would keep each
    // burst the full queue lets through (20,000 records) on one random
    // partition, five or so bursts in all, and a run could leave a
    // partition out (it did, one in many). Per-record random partitions
    // spread them over all four, which the test checks.
    let mut config = idempotent_producer_config(&node.bootstrap());
    config.set("sticky.partitioning.linger.ms", "0");
    let producer = checking_producer(&config, checker.clone());
    for i in 0..RECORDS {
        send_checked(&producer, "p0", &topic, None, format!("v{i:07}").as_bytes()).unwrap();
    }
    producer.flush(Duration::from_secs(180)).unwrap();
    let produced_in = started.elapsed();
    let ctx = producer.context();
    assert!(
        ctx.fatal.lock().unwrap().is_none(),
        "fatal producer error: {:?}",
        ctx.fatal.lock().unwrap()
    );
    {
        let c = checker.lock().unwrap();
        assert_eq!(
            c.failed(),
            0,
            "deliveries failed; client errors: {:?}",
            ctx.errors.lock().unwrap()
        );
        assert_eq!(c.acked(), RECORDS);
        let ends = c.acked_end_offsets();
        assert_eq!(
            ends.len(),
            PARTITIONS as usize,
            "not every partition got records: {ends:?}"
        );
    }
    drop(producer);

    let started = Instant::now();
    let n = consume_to_end(
        &node.bootstrap(),
        &topic,
        PARTITIONS,
        Duration::from_secs(180),
        |p, o, v| checker.lock().unwrap().read(p, o, v),
    )
    .unwrap();
    let consumed_in = started.elapsed();
    let report = checker.lock().unwrap().check();
    eprintln!("produced {RECORDS} in {produced_in:?}, consumed {n} in {consumed_in:?}\n{report}");
    report.assert_ok();
    assert_eq!(report.distinct_read, RECORDS, "{report}");
}
