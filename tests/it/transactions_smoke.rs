//! Transactions, end to end with librdkafka, as a quick smoke test (the full
//! transaction suite — seed experiments, fencing, timeouts, failover — lives
//! elsewhere): a transactional producer commits 5 records and aborts 3;
//! a `read_committed` consumer sees exactly the 5, a `read_uncommitted` one
//! all 8. On one node, and on a three-node cluster where the topic's
//! partitions, the transaction coordinator and the markers are spread over
//! the brokers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::rdk::{
    assign_consumer_config, create_topic_admin, idempotent_producer_config, partition_zero_at,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, SamsaNode};

const PARTITIONS: i32 = 3;
const TXN_TIMEOUT: Duration = Duration::from_secs(60);

fn create_topic(bootstrap: &str, topic: &str, replication: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let results = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(
                topic,
                PARTITIONS,
                TopicReplication::Fixed(replication),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        ))
        .unwrap();
    for r in results {
        r.unwrap();
    }
}

/// Every value of `topic` a consumer with `isolation` reads from the start
/// until it reaches the end of every partition.
fn read_all(bootstrap: &str, topic: &str, isolation: &str) -> Vec<String> {
    let consumer: BaseConsumer = assign_consumer_config(bootstrap)
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut values = Vec::new();
    let mut at_end = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while at_end.len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "{isolation} consumer did not reach the end of {topic}: {values:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => panic!("{isolation} consumer error: {e}"),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
            }
        }
    }
    values.sort();
    values
}

fn commit_five_abort_three(bootstrap: &str, topic: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("transactional.id", unique_topic("smoke-txn"))
        .set("transaction.timeout.ms", "30000")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    producer.init_transactions(TXN_TIMEOUT).unwrap();

    producer.begin_transaction().unwrap();
    for i in 0..5 {
        let key = format!("k{i}");
        let value = format!("committed-{i}");
        producer
            .send(BaseRecord::to(topic).key(&key).payload(&value))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.commit_transaction(TXN_TIMEOUT).unwrap();

    producer.begin_transaction().unwrap();
    for i in 0..3 {
        let key = format!("a{i}");
        let value = format!("aborted-{i}");
        producer
            .send(BaseRecord::to(topic).key(&key).payload(&value))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(TXN_TIMEOUT).unwrap();
    producer.abort_transaction(TXN_TIMEOUT).unwrap();
}

fn check_reads(bootstrap: &str, topic: &str) {
    let committed: Vec<String> = (0..5).map(|i| format!("committed-{i}")).collect();
    let mut all = committed.clone();
    all.extend((0..3).map(|i| format!("aborted-{i}")));
    all.sort();
    // EndTxn is answered once the decision is durable; the markers follow,
    // and read_committed readers see the records once they are written.
    let got = try_wait_until(Duration::from_secs(30), || {
        let got = read_all(bootstrap, topic, "read_committed");
        (got == committed).then_some(())
    });
    assert!(
        got.is_some(),
        "read_committed saw {:?}",
        read_all(bootstrap, topic, "read_committed")
    );
    let uncommitted = try_wait_until(Duration::from_secs(30), || {
        let got = read_all(bootstrap, topic, "read_uncommitted");
        (got == all).then_some(())
    });
    assert!(
        uncommitted.is_some(),
        "read_uncommitted saw {:?}",
        read_all(bootstrap, topic, "read_uncommitted")
    );
}

#[test]
fn transactions_commit_and_abort_on_one_node() {
    let node = SamsaNode::start_with(&[
        "transaction_abort_timed_out_transaction_cleanup_interval_ms=1000",
    ]);
    let topic = unique_topic("txn-smoke");
    create_topic(&node.bootstrap(), &topic, 1);
    commit_five_abort_three(&node.bootstrap(), &topic);
    check_reads(&node.bootstrap(), &topic);
}

#[test]
fn transactions_commit_and_abort_on_three_nodes() {
    let cluster = SamsaCluster::start(
        3,
        &["transaction_abort_timed_out_transaction_cleanup_interval_ms=1000"],
    );
    let topic = unique_topic("txn-smoke3");
    create_topic(&cluster.bootstrap(), &topic, 3);
    commit_five_abort_three(&cluster.bootstrap(), &topic);
    check_reads(&cluster.bootstrap(), &topic);
}

/// A transactional producer's first `send_offsets_to_transaction` on a
/// fresh node, sent while `__consumer_offsets` is still being created (500
/// partitions take seconds), completes: FindCoordinator waits for the
/// creation instead of answering COORDINATOR_NOT_AVAILABLE at once, which
/// librdkafka retries only twice, 100 ms apart, before it waits for a
/// broker state change that never comes — the call then hung past its own
/// timeout.
#[test]
fn first_transactional_offset_commit_waits_for_the_offsets_topic_to_be_created() {
    let node = SamsaNode::start_with(&["offsets_topic_num_partitions=500"]);
    let bootstrap = node.bootstrap();
    let topic = unique_topic("first-commit");
    create_topic_admin(&bootstrap, &topic, 1).unwrap();
    let t = Duration::from_secs(30);
    let txn: BaseProducer = idempotent_producer_config(&bootstrap)
        .set("transactional.id", unique_topic("first-commit-txn"))
        .set("transaction.timeout.ms", "120000")
        .create()
        .unwrap();
    txn.init_transactions(t).unwrap();
    txn.begin_transaction().unwrap();
    // Created only now: its own coordinator lookup starts the creation.
    let group: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", unique_topic("first-commit-group"))
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    let metadata = group.group_metadata().unwrap();
    let (sent, outcome) = std::sync::mpsc::channel();
    let offsets = partition_zero_at(&topic, 0);
    let committing = std::thread::spawn(move || {
        let result = txn
            .send_offsets_to_transaction(&offsets, &metadata, t)
            .and_then(|()| txn.commit_transaction(t));
        let _ = sent.send(result.map_err(|e| e.to_string()));
    });
    // Both calls bound themselves by `t`; a hang shows as no outcome.
    let result = outcome
        .recv_timeout(3 * t)
        .expect("send_offsets_to_transaction + commit hung past their own timeouts");
    assert_eq!(result, Ok(()));
    committing.join().unwrap();
}
