//! [`run`]: one cluster node from start to stop — the checks before anything
//! starts, the embedded controller (a voter's; a broker-only node has none),
//! the gRPC and HTTP servers around the broker, and their shutdown in order
//! once the broker stops.
//!
//! Invariants: nothing is bound or started before the settings and the data
//! directory are checked; a controller that cannot go on (its store was lost,
//! or its Raft core stopped on a store error such as a full disk) stops the
//! node with the reason; the Kafka and HTTP ports are bound before the
//! controller starts (a conflict fails fast); whatever way the broker stops,
//! the controller is shut down, then the gRPC and HTTP servers, and the
//! broker's outcome is what `run` returns.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{info, warn, Instrument};

use super::broker::{serve, BrokerServices};
use super::controller::{probe_duplicate, start_controller};
use super::grpc::{serve_grpc, stop_grpc};
use super::identity::DataDirIdentity;
use super::ClusterSettings;
use crate::error::BrokerError;
use crate::replication::service::ReplicationGrpc;
use crate::{server, BrokerConfig};
use samsa_controller::node::ControllerNode;

/// Runs a cluster node (controller + broker) until `shutdown` resolves or a
/// fatal error; see the module docs for the start-up sequence.
pub async fn run(
    config: BrokerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    let node_id = config.node_id;
    run_node(config, shutdown)
        .instrument(tracing::info_span!("node", node_id))
        .await
}

async fn run_node(
    config: BrokerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    let settings = ClusterSettings::from_config(&config)?;
    let identity = DataDirIdentity::load(&config.data_dir, config.node_id)?;
    identity.check_configured(config.cluster_id.as_deref(), &config.data_dir)?;
    if settings.is_controller() {
        probe_duplicate(&settings).await?;
    }
    let listener = server::bind_listeners(&config).await?;
    let http_listener = crate::http::bind(config.http_listen).await?;
    let http_state = Arc::new(crate::http::HttpState::default());
    let cluster_id = config.cluster_id.clone().or(identity.cluster_id.clone());
    // A broker-only node runs no controller: its gRPC port serves only
    // replication and the transaction service.
    let (controller, routes) = if settings.is_controller() {
        let (controller, routes) = start_controller(&config, &settings, cluster_id).await?;
        http_state.attach_controller(crate::metrics::ControllerView::follow(&controller));
        (Some(controller), routes)
    } else {
        (None, tonic::service::Routes::default())
    };
    let replication = ReplicationGrpc::new();
    let txn_grpc = crate::coordinator::txn::grpc::TxnGrpc::new();
    let (grpc_stop_tx, grpc_stop_rx) = watch::channel(false);
    let grpc = match serve_grpc(
        config.controller_listen,
        routes,
        replication.clone(),
        txn_grpc.clone(),
        settings.inter_node_tls.as_ref(),
        grpc_stop_rx.clone(),
    )
    .await
    {
        Ok(grpc) => grpc,
        Err(e) => {
            if let Some(controller) = controller {
                let _ = controller.shutdown().await;
            }
            return Err(e);
        }
    };
    if controller.is_some() {
        info!(
            voters = %settings.voters_text(),
            controller_listen = %config.controller_listen,
            "controller started"
        );
    } else {
        info!(
            voters = %settings.voters_text(),
            inter_node_address = %settings.own_address,
            "broker-only node: no controller here"
        );
    }
    let http = tokio::spawn(
        crate::http::serve(http_listener, Arc::clone(&http_state), grpc_stop_rx.clone())
            .in_current_span(),
    );
    // A controller that must not run (its store was lost, see
    // samsa-controller's node.rs) stops the node with its reason.
    let mut refusal = controller.as_ref().map(ControllerNode::refusal);
    let refused = {
        let refusal = refusal.clone();
        async move {
            // The sender goes away once the controller takes part: then
            // there is nothing to wait for.
            let refused = match refusal {
                Some(mut refusal) => refusal.wait_for(Option::is_some).await.is_ok(),
                None => false,
            };
            if !refused {
                std::future::pending::<()>().await;
            }
        }
    };
    // A controller whose Raft core stopped on an error (its store failed:
    // sled keeps the first I/O error, e.g. a full disk, and fails every
    // later call until it is reopened) never takes part again in this
    // process. Stopping the node with the reason (fail-stop, for a
    // supervisor to restart it) beats a node whose metadata silently stops.
    let raft_failure: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let raft_failed = {
        let metrics = controller.as_ref().map(|c| c.raft().metrics());
        let raft_failure = Arc::clone(&raft_failure);
        async move {
            let Some(mut metrics) = metrics else {
                return std::future::pending::<()>().await;
            };
            loop {
                let fatal = match &metrics.borrow_and_update().running_state {
                    Err(fatal) => Some(fatal.to_string()),
                    Ok(()) => None,
                };
                if let Some(fatal) = fatal {
                    *raft_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(fatal);
                    return;
                }
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let shutdown = async move {
        tokio::select! {
            () = shutdown => {}
            () = refused => {}
            () = raft_failed => {}
        }
    };
    let result = serve(
        config,
        settings,
        identity,
        controller.as_ref(),
        BrokerServices {
            replication,
            txn: txn_grpc,
            http: http_state,
        },
        listener,
        shutdown,
    )
    .await;
    let raft_failure = raft_failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    let refused = refusal.as_mut().and_then(|r| r.borrow_and_update().clone());
    let result = match (refused, raft_failure) {
        (Some(reason), _) => Err(BrokerError::Cluster(reason)),
        (None, Some(fatal)) => Err(BrokerError::Cluster(format!(
            "this node's controller stopped: {fatal}. The node stops so that it can be \
             restarted; if the data directory's disk is full, free space first"
        ))),
        (None, None) => result,
    };
    if let Some(controller) = controller {
        if let Err(e) = controller.shutdown().await {
            warn!(error = %e, "controller did not stop cleanly");
        }
    }
    let _ = grpc_stop_tx.send(true);
    stop_grpc(grpc).await;
    let _ = http.await;
    result
}
