//! [`Lifecycle`]: this broker's registration with the quorum, its heartbeats
//! (which carry the fenced / unfenced answers) and controlled shutdown.
//!
//! Invariants: the broker epoch published in `epoch` is the one of the
//! registration the controller last accepted (negative before the first);
//! a registration lost while running (stale epoch, unknown broker) is
//! redone, bounded; a failed heartbeat keeps the current leaderships (the
//! controller fences this broker after `broker_session_timeout_ms` and moves
//! them, which it learns on return) until contact is lost for a session
//! timeout: then a leadership whose in-sync followers went silent too is in
//! doubt and refused (see [`crate::controller_contact`]); every wait is
//! bounded, and a heartbeat asks another controller when the one it
//! remembers does not answer within half a heartbeat interval.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::client::ControllerClient;
use samsa_controller::error::ResponseError;
use samsa_controller::logic::{Heartbeat, RegisterBroker};
use samsa_controller::records::BrokerEndpoint;
use samsa_controller::{ControllerError, MetadataImage};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};
use uuid::Uuid;

use super::ClusterSettings;
use crate::controller_contact::ControllerContact;
use crate::error::BrokerError;

/// How long SIGTERM waits for the controller to move leaderships away.
const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting start-up says what it waits for.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Registration and heartbeats of this broker.
pub(super) struct Lifecycle {
    settings: ClusterSettings,
    /// Short deadline: one registration or heartbeat attempt round.
    client: ControllerClient,
    incarnation_id: Uuid,
    endpoints: Vec<BrokerEndpoint>,
    cluster_id: Option<String>,
    /// This broker's epoch; negative until it is registered.
    pub(super) epoch: Arc<AtomicI64>,
    fenced: watch::Sender<bool>,
    /// Told of every heartbeat answered unfenced.
    contact: Arc<ControllerContact>,
}

impl Lifecycle {
    /// A new incarnation of this broker (not registered yet), advertising
    /// `endpoints`, publishing its epoch in `epoch` and the controller's
    /// fenced / unfenced answers on `fenced`.
    pub(super) fn new(
        settings: &ClusterSettings,
        endpoints: Vec<BrokerEndpoint>,
        cluster_id: Option<String>,
        epoch: Arc<AtomicI64>,
        fenced: watch::Sender<bool>,
        contact: Arc<ControllerContact>,
    ) -> Self {
        contact.follow_controller(settings.session_timeout, crate::now_ms());
        Self {
            // Half a heartbeat interval per controller asked: a heartbeat
            // whose remembered leader went silent reaches another controller
            // within the same call, well inside the session timeout.
            client: ControllerClient::with_attempt_timeout(
                settings.endpoints(),
                settings.heartbeat_interval.max(Duration::from_secs(1)),
                (settings.heartbeat_interval / 2).max(Duration::from_millis(500)),
            )
            .with_inter_node_tls(settings.inter_node_tls.clone()),
            settings: settings.clone(),
            incarnation_id: Uuid::new_v4(),
            endpoints,
            cluster_id,
            epoch,
            fenced,
            contact,
        }
    }

    fn register_request(&self) -> RegisterBroker {
        RegisterBroker {
            broker_id: self.settings.node_id,
            incarnation_id: self.incarnation_id,
            cluster_id: self.cluster_id.clone(),
            endpoints: self.endpoints.clone(),
            rack: None,
        }
    }

    /// Registers this incarnation, retrying transient failures until
    /// `deadline`. Errors say why and what to check.
    pub(super) async fn register(&self, deadline: Instant) -> Result<i64, BrokerError> {
        let request = self.register_request();
        let mut first_duplicate: Option<Instant> = None;
        let mut last_log: Option<Instant> = None;
        let mut pause = Duration::from_millis(100);
        loop {
            let error = match self.client.register_broker(&request).await {
                Ok(reply) => {
                    self.epoch.store(reply.broker_epoch, Ordering::Release);
                    info!(broker_epoch = reply.broker_epoch, incarnation = %self.incarnation_id, "registered with the controller quorum");
                    return Ok(reply.broker_epoch);
                }
                Err(e) => self.retry_reason(&e, &mut first_duplicate)?,
            };
            if Instant::now() >= deadline {
                return Err(self.quorum_unreachable(&error));
            }
            if last_log.is_none_or(|t| t.elapsed() >= WAIT_LOG_INTERVAL) {
                info!(voters = %self.settings.voters_text(), reason = %error, "waiting for the controller quorum");
                last_log = Some(Instant::now());
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Why a refused registration is worth retrying, or the error that ends
    /// start-up. `first_duplicate` is when the controller first answered
    /// that another incarnation holds this broker id.
    fn retry_reason(
        &self,
        e: &ControllerError,
        first_duplicate: &mut Option<Instant>,
    ) -> Result<String, BrokerError> {
        let id = self.settings.node_id;
        // Match on Kafka errors: errors that crossed the wire come back
        // as `ControllerError::Remote` for codes without a variant.
        match e.kafka_error() {
            ResponseError::InconsistentClusterId => Err(BrokerError::Cluster(format!(
                "this node's data belongs to another cluster than the controller \
                 quorum ({e}); refusing to start on another cluster's data (use an \
                 empty data directory to join this quorum's cluster)"
            ))),
            ResponseError::DuplicateBrokerRegistration => {
                // A previous incarnation's session has not expired yet, or
                // another live process uses this node id. The former ends
                // within a session timeout (plus a leader change, which
                // restarts sessions).
                let since = *first_duplicate.get_or_insert_with(Instant::now);
                let patience = self.settings.session_timeout * 2 + Duration::from_secs(5);
                if since.elapsed() > patience {
                    return Err(BrokerError::Cluster(format!(
                        "broker id {id} is still registered by another live process \
                         after {patience:?}: is node_id {id} configured on two nodes?"
                    )));
                }
                Ok(
                    "broker id registered by a previous incarnation; waiting for its \
                    session to expire"
                        .to_owned(),
                )
            }
            ResponseError::NotController
            | ResponseError::RequestTimedOut
            | ResponseError::UnknownServerError => Ok(e.to_string()),
            _ => Err(BrokerError::Cluster(format!(
                "the controller refused to register broker {id}: {e}"
            ))),
        }
    }

    /// The error when registration kept failing until its deadline.
    pub(super) fn quorum_unreachable(&self, last_error: &str) -> BrokerError {
        BrokerError::Cluster(format!(
            "could not register with the controller quorum {} within {:?} (last error: \
             {last_error}); at least {} of the {} voters must be running and reachable at the \
             addresses in controller_quorum_voters",
            self.settings.voters_text(),
            self.settings.startup_timeout,
            self.settings.majority(),
            self.settings.voters.len()
        ))
    }

    /// Heartbeats until `stop`; returns only on a fatal error (or `None` when stopped).
    pub(super) async fn heartbeat_loop(
        self: Arc<Self>,
        follower: watch::Receiver<Arc<MetadataImage>>,
        mut stop: watch::Receiver<bool>,
    ) -> Option<BrokerError> {
        let mut ticker = tokio::time::interval(self.settings.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        let mut contact_lost = false;
        loop {
            match self.contact.lost(crate::now_ms()) {
                Some(session_ms) if !contact_lost => {
                    warn!(
                        session_ms,
                        "no heartbeat answered unfenced for a session timeout: leaderships whose \
                         in-sync followers stopped fetching are refused until the controller answers"
                    );
                    contact_lost = true;
                }
                None if contact_lost => {
                    info!(
                        "the controller answers again: leaderships are served as the metadata says"
                    );
                    contact_lost = false;
                }
                _ => {}
            }
            tokio::select! {
                _ = ticker.tick() => {}
                _ = async { stop.wait_for(|s| *s).await.is_ok() } => return None,
            }
            let request = Heartbeat {
                broker_id: self.settings.node_id,
                broker_epoch: self.epoch.load(Ordering::Acquire),
                metadata_offset: follower.borrow().offset(),
                want_fence: false,
            };
            match self.client.heartbeat(&request).await {
                Ok(reply) => {
                    // A fenced broker leads nothing in the controller's
                    // view (its leaderships were moved when it was fenced):
                    // only an unfenced answer confirms them.
                    if !reply.is_fenced {
                        self.contact.heard(crate::now_ms());
                    }
                    if failures > 0 {
                        info!(failures, "heartbeats reach the active controller again");
                    }
                    failures = 0;
                    self.note_fenced(reply.is_fenced);
                }
                Err(e)
                    if matches!(
                        e.kafka_error(),
                        ResponseError::StaleBrokerEpoch | ResponseError::BrokerIdNotRegistered
                    ) =>
                {
                    warn!(error = %e, "registration lost; registering again");
                    let deadline = Instant::now() + self.settings.session_timeout * 3;
                    if let Err(e) = self.register(deadline).await {
                        return Some(e);
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 || failures % 10 == 0 {
                        warn!(failures, error = %e, "heartbeat failed");
                    }
                }
            }
        }
    }

    /// Publishes the controller's fenced / unfenced answer, logging changes.
    fn note_fenced(&self, fenced: bool) {
        let was = self.fenced.send_replace(fenced);
        if was != fenced {
            if fenced {
                warn!("fenced by the controller");
            } else {
                info!("unfenced by the controller");
            }
        }
    }

    /// Asks the controller to move this broker's leaderships away (bounded).
    pub(super) async fn controlled_shutdown(&self) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if epoch < 0 {
            return;
        }
        let client = ControllerClient::new(self.settings.endpoints(), CONTROLLED_SHUTDOWN_TIMEOUT)
            .with_inter_node_tls(self.settings.inter_node_tls.clone());
        let call = client.controlled_shutdown(self.settings.node_id, epoch);
        match tokio::time::timeout(CONTROLLED_SHUTDOWN_TIMEOUT, call).await {
            Ok(Ok(reply)) => info!(
                leaderships_moved = reply.leaderships_moved,
                partitions_offline = reply.partitions_offline.len(),
                "controlled shutdown done"
            ),
            Ok(Err(e)) => warn!(error = %e, "controlled shutdown failed; stopping anyway"),
            Err(_) => warn!("controlled shutdown timed out; stopping anyway"),
        }
    }
}
