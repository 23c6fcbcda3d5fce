//! This node's controller of the metadata quorum: refusing to start a second
//! one at the same address, and starting it (embedded) with timings derived
//! from the broker's settings.
//!
//! Invariants: no two processes run a controller for the same voter address
//! (a duplicate `node_id` is refused before anything binds); the Raft and
//! fencing timings follow from the validated [`ClusterSettings`], so a broker
//! session always spans several fencing ticks.

use std::time::Duration;

use samsa_controller::client::ControllerClient;
use samsa_controller::logic::{LeaderRebalance, LogicConfig};
use samsa_controller::node::{ControllerConfig, ControllerNode, RaftTimings};
use samsa_controller::NodeId;

use super::settings::config_error;
use super::ClusterSettings;
use crate::error::BrokerError;
use crate::BrokerConfig;

/// Refuses to start when something already answers at this node's own
/// controller address before this process has bound it.
pub(super) async fn probe_duplicate(settings: &ClusterSettings) -> Result<(), BrokerError> {
    let addr = &settings.own_address;
    let connect = tokio::net::TcpStream::connect(addr.as_str());
    if !matches!(
        tokio::time::timeout(Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    ) {
        return Ok(());
    }
    let client = ControllerClient::new([addr.clone()], Duration::from_secs(2))
        .with_inter_node_tls(settings.inter_node_tls.clone());
    Err(BrokerError::Cluster(match client.describe_quorum().await {
        Ok(other) => format!(
            "a controller already answers at {addr}, this node's address in \
             controller_quorum_voters (it is node {} of cluster {:?}): is node_id {} configured \
             twice? Each node needs its own node_id",
            other.node_id, other.cluster_id, settings.node_id
        ),
        Err(_) => format!(
            "{addr}, this node's address in controller_quorum_voters, is already in use by \
             another program"
        ),
    }))
}

/// Starts this node's controller (embedded: its gRPC routes are served with
/// the replication and transaction services, see [`super::grpc`]).
pub(super) async fn start_controller(
    config: &BrokerConfig,
    settings: &ClusterSettings,
    cluster_id: Option<String>,
) -> Result<(ControllerNode, tonic::service::Routes), BrokerError> {
    let node = NodeId::try_from(config.node_id)
        .map_err(|_| config_error(format!("node_id {} is negative", config.node_id)))?;
    let mut cc = ControllerConfig::new(node, settings.voters.clone(), &config.data_dir);
    cc.listen_addr = Some(config.controller_listen);
    cc.cluster_id = cluster_id;
    cc.logic = LogicConfig {
        // The controller counts time in i64 ms; a session longer than
        // i64::MAX ms (positive, validated) never ends either way.
        broker_session_timeout_ms: i64::try_from(config.broker_session_timeout_ms)
            .unwrap_or(i64::MAX),
        producer_id_block_size: config.producer_id_block_size,
        leader_rebalance: config
            .auto_leader_rebalance_enable
            .then(|| LeaderRebalance {
                interval_ms: i64::try_from(
                    config
                        .leader_imbalance_check_interval_seconds
                        .saturating_mul(1000),
                )
                .unwrap_or(i64::MAX),
                imbalance_percent: config.leader_imbalance_per_broker_percentage,
            }),
        ..LogicConfig::default()
    };
    let election = config.controller_quorum_election_timeout_ms;
    cc.raft = RaftTimings {
        heartbeat_interval_ms: config.controller_quorum_heartbeat_interval_ms,
        election_timeout_min_ms: election,
        // openraft waits a full leader lease (= the maximum) plus the
        // randomized timeout before it campaigns, so failover takes
        // max + [min, max]; a narrow range keeps it near 2.5 × the setting.
        election_timeout_max_ms: election.saturating_add(election / 2).max(election + 1),
        snapshot_after_entries: config.metadata_snapshot_interval_entries,
    };
    // Fencing is checked on ticks: tick often enough relative to the session.
    cc.tick_interval = (settings.session_timeout / 6)
        .clamp(Duration::from_millis(100), Duration::from_millis(500));
    cc.write_timeout = settings.request_timeout;
    cc.inter_node_tls = settings.inter_node_tls.clone();
    // Embedded: this process serves one gRPC port for the controller and
    // for replication between brokers.
    ControllerNode::start_embedded(cc)
        .await
        .map_err(|e| BrokerError::Cluster(format!("cannot start the controller: {e}")))
}
