//! A transactional producer configured as a `samsa pipeline stage` commits
//! offsets to a transaction after the broker that coordinated the group
//! was SIGKILLed, fenced and dropped by the client, as the pipeline chaos
//! test does to its stages.
//!
//! librdkafka drops a broker that a Metadata answer leaves out (samsa, like
//! Kafka, leaves out a fenced broker) but keeps it in its coordinator
//! cache; a TxnOffsetCommit that finds it there waits for some broker
//! connection of the client to change state before it asks for the new
//! coordinator, and `send_offsets_to_transaction` does not enforce its
//! timeout meanwhile. Here the group's coordinator is a broker that neither
//! coordinates the transactional id nor leads the data partition, so no
//! other connection of the producer changes state: without the stage's
//! setting (`samsa_tools::pipeline::transactional_producer_settings`) the
//! call never returns.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes::NONE;
use samsa_tests::pipeline::committed_offsets;
use samsa_tests::rdk::partition_zero_at;
use samsa_tests::txn::{create_topic_default_rf, partition_leaders, transaction_state_leader};
use samsa_tests::{unique_topic, wait_until};

/// Timeout of each transactional call, and the bound on how long the send
/// of offsets may take once the group's coordinator is gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a cluster state the test waits for may take to show.
const STATE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn send_offsets_to_transaction_finds_a_new_group_coordinator_after_its_broker_is_dropped() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let bootstrap = cluster.bootstrap();
    let topic = unique_topic("coordloss");
    create_topic_default_rf(&mut cluster.client(1), &topic, 1).unwrap();
    let data_leader = wait_until("a leader of the data partition", STATE_TIMEOUT, || {
        partition_leaders(&mut cluster.client(1), &topic)?
            .get(&0)
            .copied()
    });

    let transactional_id = unique_topic("coordloss-txn");
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true");
    for (key, value) in samsa_tools::pipeline::transactional_producer_settings(&transactional_id) {
        config.set(key, value);
    }
    let producer: Arc<ThreadedProducer<DefaultProducerContext>> =
        Arc::new(config.create().expect("create the transactional producer"));
    producer.init_transactions(CALL_TIMEOUT).unwrap();
    let txn_coordinator = wait_until("the transaction coordinator", STATE_TIMEOUT, || {
        transaction_state_leader(&mut cluster.client(1), &transactional_id)
    });

    // A group coordinated by the third broker: killing it leaves the
    // producer's transaction coordinator and data leader alone.
    let (group, victim) = (0..)
        .find_map(|i| {
            let group = format!("{}-{i}", unique_topic("coordloss-group"));
            let node = wait_until("the group's coordinator", STATE_TIMEOUT, || {
                match cluster.client(1).find_coordinator(0, &group).ok()? {
                    (NONE, node) => Some(node),
                    _ => None,
                }
            });
            (node != data_leader && node != txn_coordinator).then_some((group, node))
        })
        .unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .create()
        .unwrap();
    let group_metadata = Arc::new(consumer.group_metadata().expect("group metadata"));

    // A first transaction: the producer learns (and caches) the group's
    // coordinator.
    producer.begin_transaction().unwrap();
    producer
        .send(BaseRecord::<str, str>::to(&topic).payload("one"))
        .map_err(|(e, _)| e)
        .unwrap();
    producer
        .send_offsets_to_transaction(&partition_zero_at(&topic, 1), &group_metadata, CALL_TIMEOUT)
        .unwrap();
    producer.commit_transaction(CALL_TIMEOUT).unwrap();

    cluster.sigkill(victim);
    // Each Metadata answer the producer gets without the victim (fenced
    // after its session timeout) makes it drop the victim's broker.
    wait_until(
        "the producer's Metadata to leave out the killed broker",
        STATE_TIMEOUT,
        || {
            let md = producer
                .client()
                .fetch_metadata(None, Duration::from_secs(5))
                .ok()?;
            md.brokers().iter().all(|b| b.id() != victim).then_some(())
        },
    );

    producer.begin_transaction().unwrap();
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    {
        let producer = Arc::clone(&producer);
        let group_metadata = Arc::clone(&group_metadata);
        let tpl = partition_zero_at(&topic, 2);
        std::thread::spawn(move || {
            let _ =
                tx.send(producer.send_offsets_to_transaction(&tpl, &group_metadata, CALL_TIMEOUT));
        });
    }
    let sent = rx.recv_timeout(CALL_TIMEOUT + Duration::from_secs(10));
    let took = started.elapsed();
    eprintln!("COORDINATOR LOSS: send_offsets_to_transaction returned {sent:?} after {took:?}");
    match sent {
        Ok(result) => result
            .unwrap_or_else(|e| panic!("send_offsets_to_transaction failed after {took:?}: {e}")),
        Err(_) => panic!(
            "send_offsets_to_transaction did not return within {took:?} (its timeout is \
             {CALL_TIMEOUT:?}): it waits for the dropped coordinator"
        ),
    }
    producer.commit_transaction(CALL_TIMEOUT).unwrap();
    assert_eq!(
        committed_offsets(&bootstrap, &group, &topic, 1).unwrap(),
        BTreeMap::from([(0, 2)]),
        "the offsets of the second transaction are the group's"
    );
}
