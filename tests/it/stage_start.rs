//! Where a `samsa pipeline stage` starts reading a partition whose
//! committed offset sits in an open transaction.
//!
//! The group's offset of the input partition is first committed (stable)
//! at `STABLE`, then a second transaction commits `PENDING` and stays open,
//! so OffsetFetch answers UNSTABLE_OFFSET_COMMIT. A stage is started on the
//! group, and other members join and leave while the transaction is open,
//! re-assigning the partition to the stage again and again. Once the
//! transaction commits, the stage must read from `PENDING`: nothing before
//! it may reach the output. (librdkafka's own fetch of the committed
//! offsets takes a late UNSTABLE_OFFSET_COMMIT answer, offset -1, as "no
//! offset" after such a re-assignment and starts at the log start.)

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::pipeline::{read_keyed, Stage, StageProcesses};
use samsa_tests::rdk::{create_topic_admin, idempotent_producer_config};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, SamsaNode};

const RECORDS: i64 = 200;
const STABLE: i64 = 50;
const PENDING: i64 = 120;

fn offsets(topic: &str, offset: i64) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    tpl
}

/// A member that joins `group`, takes part in one rebalance and leaves.
fn join_and_leave(bootstrap: &str, group: &str, topic: &str, stay: Duration) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        // Sorts after the stage's member id: the range assignor keeps
        // giving the one partition to the stage.
        .set("client.id", "zz-rebalancer")
        .set("session.timeout.ms", "6000")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let until = Instant::now() + stay;
    while Instant::now() < until {
        let _ = consumer.poll(Duration::from_millis(50));
    }
    consumer.unsubscribe();
}

#[test]
fn stage_waits_for_an_open_transactions_offset_instead_of_rereading_from_the_start() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let [input, output] = ["start-in", "start-out"].map(unique_topic);
    for t in [&input, &output] {
        create_topic_admin(&bootstrap, t, 1).unwrap();
    }
    let group = unique_topic("start-group");

    let producer: BaseProducer = idempotent_producer_config(&bootstrap).create().unwrap();
    for i in 0..RECORDS {
        let key = format!("k{i:05}");
        producer
            .send(BaseRecord::to(&input).key(&key).payload(&key))
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    // The group's offsets, committed in transactions of another producer
    // (a standalone commit: generation -1, no member).
    let group_handle: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    let metadata = group_handle.group_metadata().unwrap();
    let txn: BaseProducer = idempotent_producer_config(&bootstrap)
        .set("transactional.id", unique_topic("start-txn"))
        .set("transaction.timeout.ms", "120000")
        .create()
        .unwrap();
    let t = Duration::from_secs(30);
    txn.init_transactions(t).unwrap();
    txn.begin_transaction().unwrap();
    txn.send_offsets_to_transaction(&offsets(&input, STABLE), &metadata, t)
        .unwrap();
    txn.commit_transaction(t).unwrap();
    txn.begin_transaction().unwrap();
    txn.send_offsets_to_transaction(&offsets(&input, PENDING), &metadata, t)
        .unwrap();

    let mut procs = StageProcesses::new(&bootstrap, &["--session-timeout-ms", "6000"]);
    procs.start_stage(&Stage {
        name: "mid".into(),
        group: group.clone(),
        input: input.clone(),
        output: output.clone(),
        processes: 1,
    });
    // Re-assignments while the offset is unstable.
    let rebalancing_until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < rebalancing_until {
        join_and_leave(&bootstrap, &group, &input, Duration::from_millis(1500));
    }
    txn.commit_transaction(t).unwrap();

    // The stage's committed output reaches the input's end.
    let expected = (RECORDS - PENDING) as usize;
    let mut seen = Vec::new();
    let done = try_wait_until(Duration::from_secs(60), || {
        seen = read_keyed(&bootstrap, &output, 1, "read_committed", t).ok()?;
        (seen.len() >= expected).then_some(())
    });
    let keys: Vec<String> = seen
        .iter()
        .map(|(_, _, k, _)| String::from_utf8_lossy(k).into_owned())
        .collect();
    let before_pending = keys
        .iter()
        .filter(|k| k.as_str() < format!("k{PENDING:05}").as_str())
        .count();
    assert!(
        done.is_some() && before_pending == 0 && keys.len() == expected,
        "the stage wrote {} records, {before_pending} of them from before the committed offset {PENDING} \
         (expected exactly the {expected} from {PENDING} on); first keys: {:?}\n{}",
        keys.len(),
        keys.iter().take(5).collect::<Vec<_>>(),
        procs.log_tails(40)
    );
}
