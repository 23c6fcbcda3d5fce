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
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::rdk::assign_consumer_config;
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
