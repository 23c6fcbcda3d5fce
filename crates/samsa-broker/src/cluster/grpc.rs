//! The node's one gRPC port (`controller_listen`): the controller's
//! services, replication between brokers and the transaction service, served
//! from start-up until the node stops.
//!
//! Invariants: the port is bound before the broker opens (a conflict fails
//! start-up with the address in the message); replication frames and windows
//! are sized for whole fetch answers, and answers leave without Nagle delay.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn, Instrument};

use samsa_proto::replication::replication_service_server::ReplicationServiceServer;

use crate::error::BrokerError;
use crate::replication::service::ReplicationGrpc;

/// How long requests in flight may take to finish once the node stops
/// before the server is dropped with them: a stopping node must exit (a
/// fail-stop is restarted by its supervisor only once the process is gone).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Serves the controller's services and the replication service on this
/// node's controller address until `stop` turns true; [`stop_grpc`] waits
/// for it.
pub(super) async fn serve_grpc(
    listen: std::net::SocketAddr,
    routes: tonic::service::Routes,
    replication: ReplicationGrpc,
    txn: crate::coordinator::txn::grpc::TxnGrpc,
    tls: Option<&samsa_controller::tls::InterNodeTls>,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, BrokerError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        BrokerError::Cluster(format!(
            "cannot bind the controller/replication gRPC address {listen}: {e}"
        ))
    })?;
    let routes = routes.add_service(
        ReplicationServiceServer::new(replication)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024),
    );
    let routes = routes.add_service(samsa_proto::txn::txn_service_server::TxnServiceServer::new(
        txn,
    ));
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder
            .tls_config(tls.server_config())
            .map_err(|e| BrokerError::Cluster(format!("inter-node TLS: {e}")))?;
    }
    info!(%listen, mutual_tls = tls.is_some(), "gRPC listening (controller, replication, transactions)");
    Ok(tokio::spawn(
        async move {
            let served = builder
                .initial_stream_window_size(Some(crate::replication::REPLICATION_WINDOW_BYTES))
                .initial_connection_window_size(Some(
                    2 * crate::replication::REPLICATION_WINDOW_BYTES,
                ))
                .max_frame_size(Some(crate::replication::REPLICATION_MAX_FRAME_BYTES))
                .add_routes(routes)
                .serve_with_incoming_shutdown(
                    // Nagle on the answering side would hold the last
                    // frames of each fetch answer until the peer's delayed
                    // ACK (~40 ms on Linux), and acks=all waits for that
                    // round trip: these connections have no Nagle delay.
                    samsa_controller::network::peer_connections(listener),
                    async move {
                        let _ = stop.wait_for(|stopped| *stopped).await;
                    },
                )
                .await;
            if let Err(e) = served {
                error!(error = %e, "gRPC server failed");
            }
        }
        .in_current_span(),
    ))
}

/// Waits for the server of [`serve_grpc`], whose `stop` was set, to finish
/// its requests in flight; after [`STOP_GRACE`] it is dropped with them.
pub(super) async fn stop_grpc(mut server: JoinHandle<()>) {
    if tokio::time::timeout(STOP_GRACE, &mut server).await.is_err() {
        warn!(
            grace_s = STOP_GRACE.as_secs(),
            "gRPC requests still in flight after the grace period; closing their connections"
        );
        server.abort();
        let _ = server.await;
    }
}
