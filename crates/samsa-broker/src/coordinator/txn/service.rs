//! The IO side that only the transaction coordinator needs, on top of the
//! shared [`Runtime`]: [`TxnRuntime`] is `Runtime<TxnCoordinator>` with
//! the gRPC clients that reach other brokers.
//!
//! What this module owns:
//!
//! - **`__transaction_state`**: created on first use (FindCoordinator or
//!   InitProducerId with a transactional id) with
//!   `transaction_state_log_num_partitions` partitions, replication
//!   `transaction_state_log_replication_factor` (default min(3, live
//!   brokers)), through the runtime's [`StateTopic`].
//! - **Requests** ([`TxnRuntime::respond`]): a handler's [`Outcome`] is
//!   answered at once without a write, otherwise once its write is durable
//!   (or with the error it failed with); the markers it releases are sent
//!   after.
//! - **Markers** ([`super::markers`]): sent to the current leader of each
//!   partition — locally or over gRPC (`proto/txn.proto`) — and retried
//!   until each is acknowledged acks=all, then `markers_written`.
//! - **Verification** ([`super::verify`]): a partition leader asks the
//!   coordinator of the producer's transactional id before its first
//!   transactional write to the partition (KIP-890).
//! - **Timers**: the runtime's tick aborts timed-out transactions every
//!   `transaction_abort_timed_out_transaction_cleanup_interval_ms` and
//!   expires idle transactional ids hourly.
//!
//! Invariant: a marker counts as written only once its partition's HW
//! covers it in the leader epoch that appended it; marker sends of a
//! partition stop as soon as this broker no longer coordinates it at that
//! epoch (a new coordinator re-issues them from the log).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use samsa_proto::txn::txn_service_client::TxnServiceClient;
use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::warn;

use super::{CoordinatorResponse, Effect, Outcome, TxnConfig, TxnCoordinator, TxnStep};
use crate::coordinator::placement::TRANSACTION_STATE_TOPIC;
use crate::coordinator::runtime::{Hosted, Runtime};
use crate::coordinator::state_topic::StateTopic;
use crate::coordinator::{Step, Write};
use crate::{Broker, BrokerConfig};
use samsa_controller::tls::{peer_endpoint, InterNodeTls};

/// The transaction coordinator of this broker and everything that drives it.
pub type TxnRuntime = Runtime<TxnCoordinator>;

/// Cluster mode: how this broker reaches the others (markers, verification).
/// The addresses follow the registered brokers (`cluster::peers`): a broker
/// that joins is reachable once its registration is applied here.
#[derive(Default)]
pub struct PeerClients {
    /// The mutual TLS the nodes speak (if any); set once, in cluster mode.
    tls: OnceLock<Option<InterNodeTls>>,
    /// Node id → internal gRPC address of every broker.
    addresses: Mutex<HashMap<i32, String>>,
    /// Clients by node id, with the address each was made for.
    clients: Mutex<HashMap<i32, (String, TxnServiceClient<Channel>)>>,
}

impl PeerClients {
    /// The brokers' current addresses; a node whose address changed gets a
    /// new client at its next use.
    pub fn set_addresses(&self, addresses: HashMap<i32, String>) {
        *self.addresses.lock().unwrap_or_else(|p| p.into_inner()) = addresses;
    }
}

pub(crate) fn txn_config(config: &BrokerConfig) -> TxnConfig {
    TxnConfig {
        transaction_state_partitions: config.transaction_state_log_num_partitions,
        max_timeout_ms: config.transaction_max_timeout_ms,
        transactional_id_expiration_ms: config.transactional_id_expiration_ms,
        consumer_offsets_partitions: config.offsets_topic_num_partitions,
        abort_check_interval_ms: config
            .transaction_abort_timed_out_transaction_cleanup_interval_ms
            .max(10) as i64,
        ..TxnConfig::default()
    }
}

impl Hosted for TxnCoordinator {
    type Service = PeerClients;
    const KIND: &'static str = "transaction";

    fn runtime(broker: &Broker) -> &Runtime<Self> {
        &broker.txn
    }

    fn carry_out(runtime: &Runtime<Self>, step: TxnStep) {
        let Some(broker) = runtime.broker_arc() else {
            warn!("transaction markers dropped: the broker is shutting down");
            return;
        };
        for effect in step.effects {
            match effect {
                Effect::WriteMarkers(m) => {
                    super::markers::spawn_drive(Arc::clone(&broker), m);
                }
            }
        }
    }
}

impl Runtime<TxnCoordinator> {
    pub fn for_config(
        config: &BrokerConfig,
        meters: samsa_metrics::coordinators::TxnMeters,
    ) -> Self {
        Runtime::new(
            TxnCoordinator::new(txn_config(config)).with_meters(meters),
            StateTopic::new(
                TRANSACTION_STATE_TOPIC,
                config.transaction_state_log_num_partitions,
                config.transaction_state_log_replication_factor,
            ),
            PeerClients::default(),
        )
    }

    /// In cluster mode, the inter-node TLS (`Some`, its content `None` for
    /// plaintext; the addresses come with each metadata view, see
    /// [`PeerClients::set_addresses`]); then starts the runtime's loop until
    /// `stop`.
    pub fn start_with_peers(
        broker: &Arc<Broker>,
        cluster_tls: Option<Option<InterNodeTls>>,
        stop: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        if let Some(tls) = cluster_tls {
            let _ = broker.txn.service.tls.set(tls);
        }
        Runtime::<TxnCoordinator>::start(broker, stop)
    }

    /// Persists `write`, reports it to the coordinator, and starts what its
    /// completion released (markers; follow-up writes in the background).
    pub(crate) async fn complete(&self, broker: &Broker, write: Write) -> TxnStep {
        let mut step = self.write(broker, write).await;
        let error = step.error;
        let rest = TxnStep {
            effects: std::mem::take(&mut step.effects),
            writes: step.take_writes(),
            error: None,
        };
        self.process(rest);
        TxnStep {
            error,
            ..TxnStep::default()
        }
    }

    /// The response of a handler's [`Outcome`]: at once without a write,
    /// otherwise once the write is durable (or with the error it failed with).
    pub(crate) async fn respond<R: CoordinatorResponse>(
        &self,
        broker: &Broker,
        outcome: Outcome<R>,
    ) -> R {
        match outcome.write {
            None => outcome.response,
            // The coordinator's state write and its replication.
            Some(write) => samsa_metrics::requests::waiting_remotely(self.complete(broker, write))
                .await
                .response(outcome.response),
        }
    }

    /// A gRPC client for broker `node` (cluster mode).
    pub(crate) fn client(&self, node: i32) -> Option<TxnServiceClient<Channel>> {
        let tls = self.service.tls.get()?;
        let addr = self
            .service
            .addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)?
            .clone();
        let mut clients = self
            .service
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((made_for, c)) = clients.get(&node) {
            if *made_for == addr {
                return Some(c.clone());
            }
        }
        let channel = peer_endpoint(&addr, tls.as_ref()).ok()?.connect_lazy();
        let client = TxnServiceClient::new(channel);
        clients.insert(node, (addr, client.clone()));
        Some(client)
    }
}
