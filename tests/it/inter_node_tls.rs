//! Mutual TLS on the inter-node gRPC port (`inter_node_tls_*`): a
//! three-node cluster whose nodes hold certificates of one CA elects a
//! controller, replicates and commits transactions across nodes (markers
//! travel over the port); a process without a certificate of that CA —
//! plaintext, or one of another CA — can neither take part in Raft, ask the
//! controller, fetch replicas nor write markers.

use std::time::Duration;

use samsa_controller::client::ControllerClient;
use samsa_controller::tls::{peer_endpoint, InterNodeTls};
use samsa_proto::raft::raft_service_client::RaftServiceClient;
use samsa_proto::raft::RaftRequest;
use samsa_proto::replication::replication_service_client::ReplicationServiceClient;
use samsa_proto::replication::ReplicaFetchRequest;
use samsa_proto::txn::txn_service_client::TxnServiceClient;
use samsa_proto::txn::WriteTxnMarkersRequest;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::pki::Ca;
use samsa_tests::txn::{create_topic_default_rf, TxnProducer};
use samsa_tests::unique_topic;

/// Whether a call reached its service: an answer, or an error status the
/// service sent (a garbage request is refused by the service itself).
/// A transport failure (no connection, a refused TLS handshake) or no
/// answer in time did not reach it.
fn reached<T>(outcome: Result<Result<T, tonic::Status>, tokio::time::error::Elapsed>) -> bool {
    match outcome {
        Ok(Ok(_)) => true,
        // Transport failures come as statuses too: Unavailable (no
        // connection, a refused handshake) or Internal with the HTTP/2
        // error as their source (a plaintext client talking to TLS).
        Ok(Err(status)) => {
            std::error::Error::source(&status).is_none()
                && !matches!(
                    status.code(),
                    tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                )
        }
        Err(_) => false,
    }
}

/// Asks the gRPC port of `addr` one call of each service (Raft, controller,
/// replication, transaction markers) as a client with `tls`; the services
/// the calls reached.
fn services_reached(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    tls: Option<&InterNodeTls>,
) -> Vec<&'static str> {
    rt.block_on(async {
        let mut reached_services = Vec::new();
        let timeout = Duration::from_secs(5);
        let controller = ControllerClient::new([addr.to_owned()], Duration::from_secs(2))
            .with_inter_node_tls(tls.cloned());
        if matches!(
            tokio::time::timeout(timeout, controller.describe_quorum()).await,
            Ok(Ok(_))
        ) {
            reached_services.push("ControllerService.DescribeQuorum");
        }
        let channel = peer_endpoint(addr, tls).unwrap().connect_lazy();
        let mut raft = RaftServiceClient::new(channel.clone());
        if reached(tokio::time::timeout(timeout, raft.vote(RaftRequest::default())).await) {
            reached_services.push("RaftService.Vote");
        }
        let mut replication = ReplicationServiceClient::new(channel.clone());
        let fetch = replication.fetch(ReplicaFetchRequest::default());
        if reached(tokio::time::timeout(timeout, fetch).await) {
            reached_services.push("ReplicationService.Fetch");
        }
        let mut txn = TxnServiceClient::new(channel);
        let markers = txn.write_txn_markers(WriteTxnMarkersRequest::default());
        if reached(tokio::time::timeout(timeout, markers).await) {
            reached_services.push("TxnService.WriteTxnMarkers");
        }
        reached_services
    })
}

#[test]
fn cluster_over_mutual_tls_serves_and_refuses_peers_without_its_certificate() {
    let pki = tempfile::tempdir().unwrap();
    let ca = Ca::new("samsa cluster CA");
    let node = ca.issue("node", pki.path());
    let (cert, key, ca_file) = (node.cert.clone(), node.key.clone(), node.ca.clone());
    let settings = [
        format!("inter_node_tls_cert_file={}", cert.display()),
        format!("inter_node_tls_key_file={}", key.display()),
        format!("inter_node_tls_ca_file={}", ca_file.display()),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let cluster = SamsaCluster::start(3, &settings);

    // Replicated writes (acks=all over three replicas: followers fetch
    // over mTLS) and transactions (the coordinator writes markers to the
    // partition leaders over mTLS) work end to end.
    let topic = unique_topic("mtls");
    create_topic_default_rf(&mut cluster.client(1), &topic, 3).unwrap();
    let producer = TxnProducer::transactional(&cluster.bootstrap(), &unique_topic("mtls-txn"));
    for round in 0..5 {
        producer.begin().unwrap();
        for partition in 0..3 {
            producer.send_ok(&topic, Some(partition), &format!("r{round}-p{partition}"));
        }
        producer.commit().unwrap();
    }

    // The cluster's own certificate is let in (so the refusals below are
    // about the certificate, not the address).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let member = InterNodeTls::from_pem(
        node.cert_pem.clone().into_bytes(),
        node.key_pem.clone().into_bytes(),
        ca.pem().into_bytes(),
    );
    let addr = cluster.node(1).controller_addr();
    assert_eq!(
        services_reached(&rt, &addr, Some(&member)).len(),
        4,
        "the cluster's own certificate must reach every service"
    );

    // Plaintext, and a certificate of another CA (trusting the cluster's
    // CA, so only the client side is wrong), are refused on every service.
    let other = Ca::new("another CA");
    let stranger = other.issue("stranger", pki.path());
    let stranger = InterNodeTls::from_pem(
        stranger.cert_pem.into_bytes(),
        stranger.key_pem.into_bytes(),
        ca.pem().into_bytes(),
    );
    for id in cluster.ids() {
        let addr = cluster.node(id).controller_addr();
        let plaintext = services_reached(&rt, &addr, None);
        assert!(
            plaintext.is_empty(),
            "node {id} let a plaintext client reach {plaintext:?}"
        );
        let strange = services_reached(&rt, &addr, Some(&stranger));
        assert!(
            strange.is_empty(),
            "node {id} let another CA's certificate reach {strange:?}"
        );
    }

    // `samsa cluster status` speaks gRPC to the controllers: with the
    // cluster's certificate it reports the quorum; without, it cannot.
    let status = |tls: bool| {
        let mut args = vec![
            "cluster".to_owned(),
            "status".to_owned(),
            "--controller".to_owned(),
            addr.clone(),
        ];
        if tls {
            for (flag, path) in [
                ("--tls-cert", &cert),
                ("--tls-key", &key),
                ("--tls-ca", &ca_file),
            ] {
                args.push(flag.to_owned());
                args.push(path.display().to_string());
            }
        }
        cluster.run_to_exit(&args, Duration::from_secs(60))
    };
    let (code, output) = status(true);
    assert!(
        code.success() && output.contains("leader"),
        "{code}: {output}"
    );
    let (code, output) = status(false);
    assert!(
        !code.success(),
        "a plaintext `cluster status` got an answer: {output}"
    );

    // And the cluster went on: another transaction commits.
    producer.begin().unwrap();
    producer.send_ok(&topic, Some(0), "after the strangers");
    producer.commit().unwrap();
}
