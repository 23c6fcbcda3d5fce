//! Named Kafka listeners (`[listeners.<name>]`): a client is told the
//! addresses of the listener its connection came in on — in Metadata,
//! FindCoordinator and DescribeCluster — so that one broker can serve a
//! container network and the container's host at once.
//!
//! The main listener advertises an address nobody can reach, so a real
//! client that works through the second listener proves it was told that
//! listener's addresses, not the main ones.

use std::net::SocketAddr;
use std::time::Duration;

use kafka_protocol::messages::{DescribeClusterRequest, FindCoordinatorRequest};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::node::free_port;
use samsa_tests::rdk::{consume_to_end, idempotent_producer_config};
use samsa_tests::{unique_topic, wait_until, KafkaClient, SamsaNode};

/// Resolves nowhere (`.invalid` is reserved, RFC 2606).
const UNREACHABLE: &str = "samsa-main-listener.invalid:9092";
/// Kafka's LISTENER_NOT_FOUND.
const LISTENER_NOT_FOUND: i16 = 72;

/// `(node id, "host:port")` of the brokers a Metadata answer lists.
fn metadata_brokers(client: &mut KafkaClient) -> Vec<(i32, String)> {
    let mut brokers: Vec<(i32, String)> = client
        .metadata(Some(&[]))
        .unwrap()
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    brokers.sort();
    brokers
}

#[test]
fn clients_are_told_the_addresses_of_the_listener_they_came_in_on() {
    let host_port = free_port();
    let host_listener = format!("127.0.0.1:{host_port}");
    let node = SamsaNode::start_with(&[
        &format!("advertised_listener={UNREACHABLE}"),
        &format!("listeners.host.listen={host_listener}"),
        &format!("listeners.host.advertised_listener={host_listener}"),
    ]);
    let host_addr: SocketAddr = host_listener.parse().unwrap();

    let mut main = node.client();
    let mut host = KafkaClient::connect(host_addr).unwrap();
    assert_eq!(metadata_brokers(&mut main), [(1, UNREACHABLE.to_string())]);
    assert_eq!(metadata_brokers(&mut host), [(1, host_listener.clone())]);

    let find = FindCoordinatorRequest::default()
        .with_key_type(0)
        .with_coordinator_keys(vec![StrBytes::from_static_str("listeners-group")]);
    // The first FindCoordinator creates __consumer_offsets: retriable
    // COORDINATOR_NOT_AVAILABLE until it is there.
    let coordinator = wait_until("a group coordinator", Duration::from_secs(30), || {
        let answer = host.send(&find, 4).unwrap();
        let coordinator = answer.coordinators.into_iter().next()?;
        (coordinator.error_code == 0).then_some(coordinator)
    });
    assert_eq!(
        format!("{}:{}", coordinator.host.as_str(), coordinator.port),
        host_listener
    );
    let cluster = host.send(&DescribeClusterRequest::default(), 0).unwrap();
    let described: Vec<String> = cluster
        .brokers
        .iter()
        .map(|b| format!("{}:{}", b.host.as_str(), b.port))
        .collect();
    assert_eq!(described, std::slice::from_ref(&host_listener));

    // librdkafka through the second listener: bootstrap, then every
    // connection goes where Metadata said. Through the main listener it
    // would be sent to an address that does not resolve.
    let topic = unique_topic("listeners");
    host.create_topic(&topic, 2).unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        idempotent_producer_config(&host_listener).create().unwrap();
    for i in 0..200u32 {
        let value = i.to_string();
        producer
            .send(BaseRecord::<(), _>::to(&topic).payload(&value))
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let mut read = Vec::new();
    consume_to_end(
        &host_listener,
        &topic,
        2,
        Duration::from_secs(30),
        |_, _, v| read.push(String::from_utf8_lossy(v).parse::<u32>().unwrap()),
    )
    .unwrap();
    read.sort_unstable();
    assert_eq!(read, (0..200).collect::<Vec<_>>());
}

#[test]
fn cluster_listener_lists_only_brokers_that_have_it() {
    // Nodes 1 and 2 have a listener "host"; node 3 has only the main one.
    let mut cluster = SamsaCluster::new(3, &[]);
    let host_ports: Vec<u16> = (0..2).map(|_| free_port()).collect();
    for (id, port) in [1, 2].into_iter().zip(&host_ports) {
        cluster.set_for_node(id, &format!("listeners.host.listen=127.0.0.1:{port}"));
    }
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    for id in cluster.ids() {
        cluster.wait_ready(id);
    }
    let mut main = cluster.client(1);
    wait_until("every broker registered", Duration::from_secs(30), || {
        (metadata_brokers(&mut main).len() == 3).then_some(())
    });
    let mut host =
        KafkaClient::connect(format!("127.0.0.1:{}", host_ports[0]).parse().unwrap()).unwrap();
    let expected: Vec<(i32, String)> = [1, 2]
        .into_iter()
        .zip(&host_ports)
        .map(|(id, port)| (id, format!("127.0.0.1:{port}")))
        .collect();
    assert_eq!(metadata_brokers(&mut host), expected);

    // Six single-replica partitions spread over the three brokers: those
    // led by node 3 have no leader a client of "host" can reach.
    let topic = unique_topic("listeners-cluster");
    main.create_topic(&topic, 6).unwrap();
    let leaders = |client: &mut KafkaClient| -> Vec<(i32, i16, i32)> {
        let answer = client.metadata(Some(&[&topic])).unwrap();
        let mut partitions: Vec<(i32, i16, i32)> = answer.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code, p.leader_id.0))
            .collect();
        partitions.sort();
        partitions
    };
    let through_main = wait_until("every partition led", Duration::from_secs(30), || {
        let partitions = leaders(&mut main);
        partitions
            .iter()
            .all(|(_, error, leader)| *error == 0 && *leader > 0)
            .then_some(partitions)
    });
    assert!(
        through_main.iter().any(|(_, _, leader)| *leader == 3),
        "no partition led by node 3: {through_main:?}"
    );
    let through_host = wait_until("node 1 sees the leaders", Duration::from_secs(30), || {
        let partitions = leaders(&mut host);
        partitions
            .iter()
            .zip(&through_main)
            .all(|(h, m)| (h.2 == m.2) || (m.2 == 3))
            .then_some(partitions)
    });
    for ((index, error, leader), (_, _, main_leader)) in through_host.iter().zip(&through_main) {
        if *main_leader == 3 {
            assert_eq!(
                (*error, *leader),
                (LISTENER_NOT_FOUND, -1),
                "partition {index} is led by node 3, which lacks the listener"
            );
        } else {
            assert_eq!((*error, *leader), (0, *main_leader), "partition {index}");
        }
    }
}
