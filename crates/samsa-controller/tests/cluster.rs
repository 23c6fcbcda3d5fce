//! In-process controller quorums on loopback ports: formation, replication
//! of metadata to every node, leader failover, restart on the same data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::client::{ControllerClient, MetadataFollower};
use samsa_controller::logic::{CreateTopic, Heartbeat, RegisterBroker};
use samsa_controller::node::{ControllerConfig, ControllerNode, NodeError, RaftTimings};
use samsa_controller::records::BrokerEndpoint;
use samsa_controller::{MetadataImage, NodeId};
use tempfile::TempDir;
use tokio::net::TcpListener;
use uuid::Uuid;

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

fn config(node_id: NodeId, voters: &[(NodeId, String)], dir: &TempDir) -> ControllerConfig {
    let mut config = ControllerConfig::new(node_id, voters.to_vec(), dir.path());
    config.raft = RaftTimings {
        heartbeat_interval_ms: 100,
        election_timeout_min_ms: 600,
        election_timeout_max_ms: 1_200,
        snapshot_after_entries: 5_000,
    };
    config.tick_interval = Duration::from_millis(200);
    config.write_timeout = Duration::from_secs(5);
    config
}

async fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// All nodes agree on one leader among them.
async fn agreed_leader(nodes: &[&ControllerNode]) -> NodeId {
    eventually(
        "a leader all nodes agree on",
        Duration::from_secs(20),
        || {
            let first = nodes[0].current_leader()?;
            let ids: BTreeSet<NodeId> = nodes.iter().map(|n| n.node_id()).collect();
            (ids.contains(&first) && nodes.iter().all(|n| n.current_leader() == Some(first)))
                .then_some(first)
        },
    )
    .await
}

/// All nodes hold the same image, and `check` holds on it.
async fn converged(
    nodes: &[&ControllerNode],
    check: impl Fn(&MetadataImage) -> bool,
) -> Arc<MetadataImage> {
    eventually("images to converge", Duration::from_secs(20), || {
        let first = nodes[0].image();
        (check(&first) && nodes.iter().all(|n| *n.image() == *first)).then_some(first)
    })
    .await
}

struct FakeBroker {
    id: i32,
    epoch: i64,
}

async fn register(client: &ControllerClient, follower: &MetadataFollower, id: i32) -> FakeBroker {
    let req = RegisterBroker {
        broker_id: id,
        incarnation_id: Uuid::new_v4(),
        cluster_id: None,
        endpoints: vec![BrokerEndpoint {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port: 19_092 + u16::try_from(id).unwrap(),
            security_protocol: "PLAINTEXT".into(),
        }],
        rack: None,
    };
    let epoch = client.register_broker(&req).await.unwrap().broker_epoch;
    // Heartbeat until caught up with its own registration and unfenced.
    loop {
        let offset = follower.image().offset();
        let reply = client
            .heartbeat(&Heartbeat {
                broker_id: id,
                broker_epoch: epoch,
                metadata_offset: offset,
                want_fence: false,
            })
            .await
            .unwrap();
        if !reply.is_fenced {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    FakeBroker { id, epoch }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_replicate_metadata_and_survive_losing_the_leader() {
    init_tracing();
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let voters: Vec<(NodeId, String)> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (i as NodeId + 1, l.local_addr().unwrap().to_string()))
        .collect();
    let mut nodes = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let node = ControllerNode::start_with_listener(
            config(i as NodeId + 1, &voters, &dirs[i]),
            listener,
        )
        .await
        .unwrap();
        nodes.push(Some(node));
    }
    let all: Vec<&ControllerNode> = nodes.iter().flatten().collect();
    let first_leader = agreed_leader(&all).await;
    let image = converged(&all, |i| i.cluster_id().is_some()).await;
    let cluster_id = image.cluster_id().unwrap().to_owned();
    // Each node publishes the cluster id on its own watch right after
    // applying the image that holds it: wait for every node's, don't race it.
    eventually(
        "every node to publish the cluster id",
        Duration::from_secs(20),
        || {
            all.iter()
                .all(|n| n.cluster_id().as_deref() == Some(cluster_id.as_str()))
                .then_some(())
        },
    )
    .await;

    // Brokers talk to any controller; the client finds the leader.
    let addrs: Vec<String> = voters.iter().map(|(_, a)| a.clone()).collect();
    let client = ControllerClient::new(addrs.clone(), Duration::from_secs(20));
    let quorum = client.describe_quorum().await.unwrap();
    assert_eq!(quorum.cluster_id, cluster_id);
    assert_eq!(quorum.voters.len(), 3);
    let follower = MetadataFollower::spawn(client.clone(), 1);
    let mut brokers = Vec::new();
    for id in 1..=3 {
        brokers.push(register(&client, &follower, id).await);
    }
    // Keep the brokers' sessions alive for the rest of the test.
    let heartbeats = {
        let client = client.clone();
        let brokers: Vec<(i32, i64)> = brokers.iter().map(|b| (b.id, b.epoch)).collect();
        let image = follower.watch();
        tokio::spawn(async move {
            loop {
                for &(id, epoch) in &brokers {
                    let offset = image.borrow().offset();
                    let _ = client
                        .heartbeat(&Heartbeat {
                            broker_id: id,
                            broker_epoch: epoch,
                            metadata_offset: offset,
                            want_fence: false,
                        })
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    // A topic created through the leader reaches every controller.
    let orders = client
        .create_topic(
            &CreateTopic {
                name: "orders".into(),
                num_partitions: Some(6),
                ..CreateTopic::default()
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(orders.replication_factor, 3);
    let image = converged(&all, |i| i.topic("orders").is_some()).await;
    let topic = image.topic("orders").unwrap();
    assert_eq!(topic.topic_id, orders.topic_id);
    assert_eq!(topic.partitions.len(), 6);
    assert!(topic
        .partitions
        .iter()
        .all(|p| p.isr.len() == 3 && p.leader > 0));
    // ...and the broker-side follower.
    let seen = follower.wait_for_offset(image.offset()).await;
    assert_eq!(seen.topic("orders"), image.topic("orders"));

    let mut blocks = Vec::new();
    for b in &brokers {
        blocks.push(client.allocate_producer_ids(b.id, b.epoch).await.unwrap());
    }

    // Lose the leader.
    let old_leader = nodes[first_leader as usize - 1].take().unwrap();
    old_leader.shutdown().await.unwrap();
    let rest: Vec<&ControllerNode> = nodes.iter().flatten().collect();
    assert_eq!(rest.len(), 2);
    let new_leader = agreed_leader(&rest).await;
    assert_ne!(new_leader, first_leader);

    // Writes keep working through the new leader.
    let payments = client
        .create_topic(
            &CreateTopic {
                name: "payments".into(),
                num_partitions: Some(3),
                ..CreateTopic::default()
            },
            false,
        )
        .await
        .unwrap();
    assert_ne!(payments.topic_id, orders.topic_id);
    for b in &brokers {
        blocks.push(client.allocate_producer_ids(b.id, b.epoch).await.unwrap());
    }
    let image = converged(&rest, |i| i.topic("payments").is_some()).await;
    assert!(image.topic("orders").is_some());
    assert!(
        image.brokers().all(|b| !b.fenced),
        "brokers that kept heartbeating stay unfenced across the leader change"
    );

    // Producer-id blocks stay unique across the leader change.
    let mut ranges: Vec<(i64, i64)> = blocks
        .iter()
        .map(|b| (b.first, b.first + i64::from(b.size)))
        .collect();
    ranges.sort_unstable();
    assert_eq!(ranges.len(), 6);
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping producer id blocks {w:?}");
    }
    assert!(image.next_producer_id() >= ranges[5].1);

    // The broker-side follower reconnects to a live controller if needed.
    let seen = follower.wait_for_offset(image.offset()).await;
    assert!(seen.topic("payments").is_some());

    heartbeats.abort();
    drop(follower);
    for node in nodes.into_iter().flatten() {
        node.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarts_on_its_data_and_refuses_another_clusters_data() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let voters = vec![(1, addr.to_string())];
    let mut cfg = config(1, &voters, &dir);
    cfg.cluster_id = Some("cluster-a".into());

    let node = ControllerNode::start_with_listener(cfg.clone(), listener)
        .await
        .unwrap();
    converged(&[&node], |i| i.cluster_id() == Some("cluster-a")).await;
    let client = ControllerClient::new([addr.to_string()], Duration::from_secs(10));
    let follower = MetadataFollower::spawn(client.clone(), 1);
    register(&client, &follower, 1).await;
    client
        .create_topic(
            &CreateTopic {
                name: "kept".into(),
                ..CreateTopic::default()
            },
            false,
        )
        .await
        .unwrap();
    let before = node.image();
    drop(follower);
    node.shutdown().await.unwrap();

    // Another cluster id on the same data: refused with a clear error.
    let mut other = cfg.clone();
    other.cluster_id = Some("cluster-b".into());
    other.listen_addr = Some("127.0.0.1:0".parse().unwrap());
    let err = match ControllerNode::start(other).await {
        Err(e) => e,
        Ok(_) => panic!("started on another cluster's data"),
    };
    assert!(matches!(err, NodeError::ClusterIdMismatch { .. }), "{err}");
    assert!(err.to_string().contains("cluster-a") && err.to_string().contains("cluster-b"));

    // Same cluster: comes back with its metadata.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node = ControllerNode::start_with_listener(cfg, listener)
        .await
        .unwrap();
    let after = converged(&[&node], |i| i.offset() >= before.offset()).await;
    assert_eq!(after.topic("kept"), before.topic("kept"));
    assert_eq!(after.cluster_id(), Some("cluster-a"));
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_controller_is_served_by_the_callers_grpc_server() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (node, routes) = ControllerNode::start_embedded(config(1, &[(1, addr.to_string())], &dir))
        .await
        .unwrap();
    assert!(node.local_addr().is_none());
    // The process's own server (in combined mode it also carries broker services).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stop_rx.await;
                },
            ),
    );
    let client = ControllerClient::new([addr.to_string()], Duration::from_secs(10));
    let follower = MetadataFollower::spawn(client.clone(), 1);
    let broker = register(&client, &follower, 1).await;
    let block = client
        .allocate_producer_ids(broker.id, broker.epoch)
        .await
        .unwrap();
    assert_eq!((block.first, block.size), (0, 1000));
    drop(follower);
    node.shutdown().await.unwrap();
    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}

/// Forwards TCP connections to `target` until `silence` is set; from then on
/// it keeps every connection open and passes nothing, as a peer behind a
/// dropping firewall or a paused process does.
async fn silenceable_proxy(
    target: std::net::SocketAddr,
    silence: tokio::sync::watch::Receiver<bool>,
) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Silenced: whatever arrives is dropped, and both halves stay open.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        silence: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) if *silence.borrow() => {}
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            tokio::spawn(pump(in_read, out_write, silence.clone()));
            tokio::spawn(pump(out_read, in_write, silence.clone()));
        }
    });
    addr
}

/// Finding 2 of docs/RELIABILITY.md: a broker whose remembered controller
/// leader goes silent (its packets dropped) must still heartbeat another
/// controller within its heartbeat deadline, not hang on the old connection
/// until keep-alive gives up (the session then expired on every broker at
/// once and the new controller fenced them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_moves_on_when_the_remembered_controller_goes_silent() {
    init_tracing();
    let dir = TempDir::new().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node =
        ControllerNode::start_with_listener(config(1, &[(1, addr.to_string())], &dir), listener)
            .await
            .unwrap();
    let (silence_tx, silence_rx) = tokio::sync::watch::channel(false);
    let proxy = silenceable_proxy(addr, silence_rx).await;
    let deadline = Duration::from_secs(2);
    // The proxy first: it is asked first and remembered as the leader.
    let client = ControllerClient::with_attempt_timeout(
        [proxy.to_string(), addr.to_string()],
        deadline,
        Duration::from_millis(500),
    );
    let follower = MetadataFollower::spawn(
        ControllerClient::new([addr.to_string()], Duration::from_secs(10)),
        1,
    );
    let broker = register(&client, &follower, 1).await;

    silence_tx.send(true).unwrap();
    let heartbeat = Heartbeat {
        broker_id: broker.id,
        broker_epoch: broker.epoch,
        metadata_offset: follower.image().offset(),
        want_fence: false,
    };
    let reply = tokio::time::timeout(deadline * 2, client.heartbeat(&heartbeat))
        .await
        .expect("the heartbeat call outlived twice its deadline");
    assert!(
        reply.is_ok(),
        "a heartbeat with another live controller failed: {reply:?}"
    );

    // A client whose calls may not be repeated gives up at its deadline
    // (shorter than the 1 s connect timeout, so it is the deadline that ends
    // the call, not a failed connection).
    let once = ControllerClient::new([proxy.to_string()], Duration::from_millis(700));
    let reply = tokio::time::timeout(Duration::from_secs(3), once.heartbeat(&heartbeat))
        .await
        .expect("a call outlived its deadline");
    assert!(
        matches!(reply, Err(samsa_controller::ControllerError::Timeout(_))),
        "{reply:?}"
    );
    drop(follower);
    node.shutdown().await.unwrap();
}
