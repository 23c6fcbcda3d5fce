//! Where a `samsa pipeline stage` starts reading a partition whose
//! committed offset sits in an open transaction.
//!
//! The group's offset of the input partition is first committed (stable)
//! at `STABLE`, then a second transaction commits `PENDING` and stays open,
//! so OffsetFetch answers UNSTABLE_OFFSET_COMMIT. A stage is started on the
//! group and, once it has been assigned the partition, other members join
//! (each until the coordinator lists it) and leave while the transaction is
//! open, so a stage that did not wait would have the partition re-assigned
//! again and again. Nothing may reach the output while the offset is
//! unstable; once the transaction commits, the stage must read from
//! `PENDING`: nothing before it may reach the output. (librdkafka's own
//! fetch of the committed offsets takes a late UNSTABLE_OFFSET_COMMIT
//! answer, offset -1, as "no offset" after such a re-assignment and starts
//! at the log start.)

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use samsa_tests::pipeline::{high_watermarks, read_keyed, Stage, StageProcesses};
use samsa_tests::rdk::{create_topic_admin, idempotent_producer_config, partition_zero_at};
use samsa_tests::wait::{try_wait_until, wait_until};
use samsa_tests::{unique_topic, SamsaNode};

const RECORDS: i64 = 200;
const STABLE: i64 = 50;
const PENDING: i64 = 120;
/// Members that join and leave while the offset is unstable (each takes
/// about 5 s: the member's close waits on its pending join).
const REBALANCES: u32 = 3;
/// How long a state the test waits for may take to show.
const STATE_TIMEOUT: Duration = Duration::from_secs(60);

/// A member (client id `client_id`) that joins `group`, stays until the
/// coordinator lists it among the group's members (its join reached the
/// coordinator and started a rebalance) as `observer` asks, and leaves.
fn join_and_leave(
    bootstrap: &str,
    group: &str,
    topic: &str,
    client_id: &str,
    observer: &BaseConsumer,
) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        // Sorts after the stage's member id: the range assignor keeps
        // giving the one partition to the stage.
        .set("client.id", client_id)
        .set("session.timeout.ms", "6000")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    wait_until(
        &format!("member {client_id} to be listed in group {group}"),
        STATE_TIMEOUT,
        || {
            let _ = consumer.poll(Duration::from_millis(50));
            let groups = observer
                .fetch_group_list(Some(group), Duration::from_secs(5))
                .ok()?;
            groups
                .groups()
                .iter()
                .flat_map(|g| g.members())
                .any(|m| m.client_id() == client_id)
                .then_some(())
        },
    );
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
    txn.send_offsets_to_transaction(&partition_zero_at(&input, STABLE), &metadata, t)
        .unwrap();
    txn.commit_transaction(t).unwrap();
    txn.begin_transaction().unwrap();
    txn.send_offsets_to_transaction(&partition_zero_at(&input, PENDING), &metadata, t)
        .unwrap();

    let mut procs = StageProcesses::new(&bootstrap, &["--session-timeout-ms", "6000"]);
    procs.start_stage(&Stage {
        name: "mid".into(),
        group: group.clone(),
        input: input.clone(),
        output: output.clone(),
        processes: 1,
    });
    // The stage joined and was given the partition: it now reads where to
    // start, which stays unstable until the commit below.
    wait_until(
        "the stage to be assigned the input partition",
        STATE_TIMEOUT,
        || {
            procs
                .log("mid", 0)
                .contains("partitions assigned")
                .then_some(())
        },
    );
    // Re-assignments while the offset is unstable.
    for n in 0..REBALANCES {
        join_and_leave(
            &bootstrap,
            &group,
            &input,
            &format!("zz-rebalancer-{n}"),
            &group_handle,
        );
    }
    let written = high_watermarks(&bootstrap, &output, 1).unwrap();
    assert_eq!(
        written[&0],
        0,
        "the stage wrote output while its start offset was unstable\n{}",
        procs.log_tails(40)
    );
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
