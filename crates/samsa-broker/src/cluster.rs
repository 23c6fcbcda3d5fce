//! Cluster mode: one process runs a controller of the metadata quorum and a
//! broker (combined mode), and the broker follows the quorum's metadata.
//!
//! # What this module owns
//!
//! - [`ClusterSettings`]: the validated cluster part of [`BrokerConfig`]
//!   (static voters, this node among them, timings);
//! - the node's data-directory identity (`meta/cluster.json`: cluster id and
//!   node id), which makes a node with another cluster's data refuse to start;
//! - [`QuorumMetadataStore`]: the [`MetadataStore`] whose image follows the
//!   committed metadata log and whose changes go through the active
//!   controller;
//! - [`ControllerProducerIdBlockSource`]: producer-id blocks from the quorum;
//! - the broker lifecycle: registration, heartbeats, fencing, controlled
//!   shutdown ([`run`]).
//!
//! # Metadata flow
//!
//! ```text
//! controller quorum ──SubscribeMetadata──▶ MetadataFollower (controller image)
//!   (Raft log = metadata log)                     │ + Raft leader changes
//!                                                 ▼
//!                                   broker_image() ─▶ broker MetadataImage (watch)
//!                                                 │
//!                    ┌────────────────────────────┴──────────────┐
//!                    ▼                                           ▼
//!         Kafka handlers (Metadata, DescribeCluster,    applier: Broker::apply_image
//!         produce/fetch leadership checks)              (open logs, become leader /
//!                                                        stop serving, delete topics)
//! ```
//!
//! The follower prefers this node's own controller, so the broker's image is
//! exactly what this node's controller has committed.
//!
//! # Start-up, in order
//!
//! 1. validate the settings (this node must be a voter) and the data
//!    directory (no single-node data, no other node's or cluster's data);
//! 2. refuse to start if something already answers at this node's own
//!    controller address (the same `node_id` configured twice);
//! 3. bind the Kafka port (so a conflict fails fast), start the controller;
//! 4. register with the active controller, retrying until
//!    `controller_startup_timeout_ms` (logging why it waits);
//! 5. wait until the local image contains the registration and the cluster
//!    id; record the cluster id in the data directory;
//! 6. apply the image (open hosted partitions), start heartbeating, wait to
//!    be unfenced, then accept Kafka connections.
//!
//! Every failure on the way is one clear [`BrokerError`]; nothing here panics
//! on peer input and no wait is unbounded.
//!
//! # Invariants
//!
//! - the broker serves produce/fetch/list-offsets only for partitions its
//!   applied image says it leads (see `apply`); when it cannot reach the
//!   quorum it keeps the leaderships it has (the controller fences it after
//!   `broker_session_timeout_ms` and moves them, which it learns on return);
//! - a metadata change answered as successful is committed by the quorum and
//!   (unless the wait for it timed out) visible in this broker's image;
//! - producer-id blocks come only from the quorum, which commits each block
//!   before handing it out, so no id is handed out twice cluster-wide.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use samsa_controller::client::{ControllerClient, MetadataFollower};
use samsa_controller::error::ResponseError;
use samsa_controller::logic::{
    CreatePartitions, CreateTopic, Heartbeat, LogicConfig, RegisterBroker, TopicRef,
};
use samsa_controller::node::{parse_voters, ControllerConfig, ControllerNode, RaftTimings};
use samsa_controller::records::BrokerEndpoint;
use samsa_controller::{ControllerError, MetadataImage as ControllerImage, NodeId};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Instrument};
use uuid::Uuid;

use crate::error::{BrokerError, MetadataError};
use crate::fsutil::write_atomic;
use crate::metadata::{
    BrokerInfo, MetadataImage, MetadataStore, NewTopic, PartitionInfo, QuorumDescription,
    QuorumVoter, TopicMetadata,
};
use crate::producer_ids::{ProducerIdBlock, ProducerIdBlockSource, ProducerIdError};
use crate::replication::fetcher::spawn_fetchers;
use crate::replication::isr::isr_loop;
use crate::replication::service::{ReplicationGrpc, ReplicationHub};
use crate::{maintenance_loop, server, Broker, BrokerConfig};
use samsa_proto::replication::replication_service_server::ReplicationServiceServer;

/// Name of the Kafka listener brokers register.
const LISTENER: &str = "PLAINTEXT";
/// `meta/<this>` in a cluster node's data directory.
pub const CLUSTER_FILE: &str = "cluster.json";
/// `meta/<this>` in a single-node data directory.
pub const SINGLE_NODE_FILE: &str = "topics.json";
/// How long SIGTERM waits for the controller to move leaderships away.
const CONTROLLED_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a waiting start-up says what it waits for.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(5);

/// The cluster part of a [`BrokerConfig`], validated.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    pub node_id: i32,
    /// Static voter set, by node id.
    pub voters: Vec<(NodeId, String)>,
    /// This node's controller address in the voter set.
    pub own_address: String,
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub request_timeout: Duration,
    pub startup_timeout: Duration,
}

fn config_error(message: String) -> BrokerError {
    BrokerError::Config(message)
}

fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok())
}

impl ClusterSettings {
    /// Validates the cluster settings of `config`; every error names the key
    /// and what would fix it.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let text = config
            .controller_quorum_voters
            .as_deref()
            .ok_or_else(|| config_error("controller_quorum_voters is not set".into()))?;
        let voters = parse_voters(text)
            .map_err(|e| config_error(format!("controller_quorum_voters: {e}")))?;
        let node = NodeId::try_from(config.node_id)
            .map_err(|_| config_error(format!("node_id {} is negative", config.node_id)))?;
        let own_address = voters
            .iter()
            .find(|(id, _)| *id == node)
            .map(|(_, addr)| addr.clone())
            .ok_or_else(|| {
                config_error(format!(
                    "node_id {} is not in controller_quorum_voters {text:?}: every cluster node \
                     runs a controller (combined mode), so its node_id must be one of the voters",
                    config.node_id
                ))
            })?;
        if port_of(&own_address) != Some(config.controller_listen.port()) {
            return Err(config_error(format!(
                "controller_listen {} does not use the port of this node's voter address \
                 {own_address}; other controllers reach node {} there, so set controller_listen \
                 to that port",
                config.controller_listen, config.node_id
            )));
        }
        let positive = |key: &str, value: u64| {
            if value == 0 {
                Err(config_error(format!("{key} must be positive")))
            } else {
                Ok(Duration::from_millis(value))
            }
        };
        let heartbeat_interval = positive(
            "broker_heartbeat_interval_ms",
            config.broker_heartbeat_interval_ms,
        )?;
        let session_timeout = positive(
            "broker_session_timeout_ms",
            config.broker_session_timeout_ms,
        )?;
        let request_timeout = positive(
            "controller_request_timeout_ms",
            config.controller_request_timeout_ms,
        )?;
        let startup_timeout = positive(
            "controller_startup_timeout_ms",
            config.controller_startup_timeout_ms,
        )?;
        positive(
            "controller_quorum_election_timeout_ms",
            config.controller_quorum_election_timeout_ms,
        )?;
        positive(
            "controller_quorum_heartbeat_interval_ms",
            config.controller_quorum_heartbeat_interval_ms,
        )?;
        if session_timeout <= heartbeat_interval {
            return Err(config_error(format!(
                "broker_session_timeout_ms ({}) must be larger than broker_heartbeat_interval_ms ({})",
                config.broker_session_timeout_ms, config.broker_heartbeat_interval_ms
            )));
        }
        if config.controller_quorum_heartbeat_interval_ms
            >= config.controller_quorum_election_timeout_ms
        {
            return Err(config_error(format!(
                "controller_quorum_heartbeat_interval_ms ({}) must be smaller than \
                 controller_quorum_election_timeout_ms ({})",
                config.controller_quorum_heartbeat_interval_ms,
                config.controller_quorum_election_timeout_ms
            )));
        }
        if config.producer_id_block_size <= 0 {
            return Err(config_error(
                "producer_id_block_size must be positive".into(),
            ));
        }
        if config.metadata_snapshot_interval_entries == 0 {
            return Err(config_error(
                "metadata_snapshot_interval_entries must be positive".into(),
            ));
        }
        Ok(Self {
            node_id: config.node_id,
            voters,
            own_address,
            heartbeat_interval,
            session_timeout,
            request_timeout,
            startup_timeout,
        })
    }

    /// Controller addresses, this node's own first (it is always up to date
    /// with what this node committed, and local).
    pub fn endpoints(&self) -> Vec<String> {
        let mut endpoints = vec![self.own_address.clone()];
        endpoints.extend(
            self.voters
                .iter()
                .filter(|(_, addr)| *addr != self.own_address)
                .map(|(_, addr)| addr.clone()),
        );
        endpoints
    }

    fn voters_text(&self) -> String {
        self.voters
            .iter()
            .map(|(id, addr)| format!("{id}@{addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn majority(&self) -> usize {
        self.voters.len() / 2 + 1
    }
}

// ---------------------------------------------------------------------------
// Data directory identity
// ---------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct ClusterFile {
    version: u32,
    cluster_id: String,
    node_id: i32,
}

/// Which cluster and node a data directory belongs to (`meta/cluster.json`,
/// written once the cluster id is known).
struct DataDirIdentity {
    path: PathBuf,
    node_id: i32,
    cluster_id: Option<String>,
}

impl DataDirIdentity {
    /// Reads the identity of `data_dir` (creating the directory), refusing
    /// single-node data and another node's data.
    fn load(data_dir: &Path, node_id: i32) -> Result<Self, BrokerError> {
        let meta = data_dir.join("meta");
        std::fs::create_dir_all(&meta).map_err(|source| BrokerError::Io {
            path: meta.clone(),
            source,
        })?;
        if meta.join(SINGLE_NODE_FILE).exists() {
            return Err(BrokerError::Cluster(format!(
                "data directory {} holds single-node data ({}); a cluster node needs an empty \
                 data directory or one from its own cluster, so it refuses to start",
                data_dir.display(),
                meta.join(SINGLE_NODE_FILE).display()
            )));
        }
        let path = meta.join(CLUSTER_FILE);
        let cluster_id = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: ClusterFile = serde_json::from_slice(&bytes).map_err(|e| {
                    BrokerError::Cluster(format!("{} is corrupt: {e}", path.display()))
                })?;
                if file.node_id != node_id {
                    return Err(BrokerError::Cluster(format!(
                        "data directory {} belongs to node {}, not node_id {node_id}; use that \
                         node's id or an empty data directory",
                        data_dir.display(),
                        file.node_id
                    )));
                }
                Some(file.cluster_id)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(BrokerError::Io { path, source }),
        };
        Ok(Self {
            path,
            node_id,
            cluster_id,
        })
    }

    /// Checks the quorum's cluster id against this data directory's and the
    /// configured one, and records it the first time.
    fn check_and_record(
        &mut self,
        quorum: &str,
        configured: Option<&str>,
    ) -> Result<(), BrokerError> {
        if let Some(configured) = configured.filter(|c| *c != quorum) {
            return Err(BrokerError::Cluster(format!(
                "this node is configured for cluster {configured}, but the controller quorum is \
                 cluster {quorum}; refusing to start"
            )));
        }
        match &self.cluster_id {
            Some(stored) if stored != quorum => Err(another_cluster(stored, quorum)),
            Some(_) => Ok(()),
            None => {
                let bytes = serde_json::to_vec_pretty(&ClusterFile {
                    version: 0,
                    cluster_id: quorum.to_owned(),
                    node_id: self.node_id,
                })
                .map_err(|e| BrokerError::Cluster(e.to_string()))?;
                write_atomic(&self.path, &bytes).map_err(|source| BrokerError::Io {
                    path: self.path.clone(),
                    source,
                })?;
                info!(
                    cluster_id = quorum,
                    "joined cluster; recorded its id in the data directory"
                );
                self.cluster_id = Some(quorum.to_owned());
                Ok(())
            }
        }
    }
}

fn another_cluster(ours: &str, quorum: &str) -> BrokerError {
    BrokerError::Cluster(format!(
        "this node's data belongs to cluster {ours}, but the controller quorum is cluster \
         {quorum}; refusing to start on another cluster's data (use an empty data directory to \
         join cluster {quorum})"
    ))
}

// ---------------------------------------------------------------------------
// Broker image from the controller image
// ---------------------------------------------------------------------------

/// The broker's view of a controller image. `raft_leader` is reported as the
/// Kafka "controller" when it is a live broker (combined mode makes every
/// controller a broker); otherwise the lowest live broker, else `me`.
pub fn broker_image(
    image: &ControllerImage,
    raft_leader: Option<NodeId>,
    me: i32,
) -> MetadataImage {
    let brokers: Vec<BrokerInfo> = image
        .brokers()
        .filter_map(|b| {
            let endpoint = b
                .endpoints
                .iter()
                .find(|e| e.name == LISTENER)
                .or_else(|| b.endpoints.first())?;
            Some(BrokerInfo {
                node_id: b.broker_id,
                host: endpoint.host.clone(),
                port: i32::from(endpoint.port),
                rack: b.rack.clone(),
                fenced: !b.is_active(),
            })
        })
        .collect();
    let live = |id: i32| brokers.iter().any(|b| b.node_id == id && !b.fenced);
    let controller_id = raft_leader
        .and_then(|l| i32::try_from(l).ok())
        .filter(|l| live(*l))
        .or_else(|| brokers.iter().find(|b| !b.fenced).map(|b| b.node_id))
        .unwrap_or(me);
    let topics = image.topics().map(|t| TopicMetadata {
        name: t.name.clone(),
        topic_id: t.topic_id,
        partitions: i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
        replication_factor: t
            .partitions
            .first()
            .map_or(0, |p| i16::try_from(p.replicas.len()).unwrap_or(i16::MAX)),
        configs: t.configs.clone(),
        partition_states: t
            .partitions
            .iter()
            .map(|p| PartitionInfo {
                leader: p.leader,
                leader_epoch: p.leader_epoch,
                replicas: p.replicas.clone(),
                isr: p.isr.clone(),
                partition_epoch: p.partition_epoch,
            })
            .collect(),
    });
    MetadataImage::from_parts(
        image.offset(),
        image.cluster_id().unwrap_or_default().to_owned(),
        controller_id,
        brokers,
        topics,
    )
}

// ---------------------------------------------------------------------------
// Metadata store and producer ids over the quorum
// ---------------------------------------------------------------------------

/// [`MetadataStore`] backed by the controller quorum: reads come from the
/// followed image, changes go to the active controller and return once this
/// broker's image shows them (or after `request_timeout`, trusting the
/// controller's answer).
pub struct QuorumMetadataStore {
    client: ControllerClient,
    image: watch::Receiver<Arc<MetadataImage>>,
    request_timeout: Duration,
    voters: String,
}

impl QuorumMetadataStore {
    pub fn new(
        client: ControllerClient,
        image: watch::Receiver<Arc<MetadataImage>>,
        settings: &ClusterSettings,
    ) -> Self {
        Self {
            client,
            image,
            request_timeout: settings.request_timeout,
            voters: settings.voters_text(),
        }
    }

    /// Waits (bounded) until the image satisfies `done`.
    async fn visible(
        &self,
        done: impl FnMut(&Arc<MetadataImage>) -> bool,
    ) -> Option<Arc<MetadataImage>> {
        let mut rx = self.image.clone();
        tokio::time::timeout(self.request_timeout, async move {
            rx.wait_for(done).await.map(|image| Arc::clone(&image)).ok()
        })
        .await
        .ok()
        .flatten()
    }

    /// The one translation of controller failures for Kafka clients.
    fn error(&self, e: ControllerError, topic: &str) -> MetadataError {
        match e {
            ControllerError::TopicAlreadyExists(_) => {
                MetadataError::TopicAlreadyExists(topic.to_owned())
            }
            ControllerError::UnknownTopic(_) | ControllerError::UnknownTopicId(_) => {
                MetadataError::UnknownTopic(topic.to_owned())
            }
            ControllerError::InvalidTopic(reason) => MetadataError::InvalidTopic {
                name: topic.to_owned(),
                reason,
            },
            ControllerError::NotController { .. } => MetadataError::ControllerUnavailable(format!(
                "no active controller within {:?}: the quorum {} has no leader (is a majority \
                 of the controllers down?); retry later",
                self.request_timeout, self.voters
            )),
            ControllerError::Timeout(why) => MetadataError::ControllerUnavailable(format!(
                "the active controller did not commit the change within {:?} ({why}); it may \
                 still take effect",
                self.request_timeout
            )),
            ControllerError::Internal(why) => MetadataError::ControllerUnavailable(format!(
                "cannot reach an active controller of {}: {why}",
                self.voters
            )),
            other => MetadataError::Rejected {
                code: other.code(),
                message: other.to_string(),
            },
        }
    }
}

impl MetadataStore for QuorumMetadataStore {
    fn image(&self) -> Arc<MetadataImage> {
        Arc::clone(&self.image.borrow())
    }

    fn create_topic(
        &self,
        topic: NewTopic,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let request = CreateTopic {
                name: topic.name.clone(),
                num_partitions: Some(topic.partitions),
                replication_factor: Some(i32::from(topic.replication_factor)),
                assignments: topic.assignments.clone(),
                configs: topic.configs.clone(),
            };
            let reply = self
                .client
                .create_topic(&request, false)
                .await
                .map_err(|e| self.error(e, &topic.name))?;
            let id = reply.topic_id;
            let name = topic.name.clone();
            let shown = self
                .visible(|image| image.topic(&name).is_some_and(|t| t.topic_id == id))
                .await
                .and_then(|image| image.topic(&topic.name).cloned());
            Ok(shown.unwrap_or_else(|| {
                warn!(topic = %topic.name, "topic created but not yet visible here");
                Arc::new(TopicMetadata {
                    name: topic.name,
                    topic_id: id,
                    partitions: reply.num_partitions,
                    replication_factor: i16::try_from(reply.replication_factor).unwrap_or(-1),
                    configs: topic.configs,
                    partition_states: Vec::new(),
                })
            }))
        })
    }

    fn delete_topic(
        &self,
        name: String,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let before = self.image().topic(&name).cloned();
            let reply = self
                .client
                .delete_topic(&TopicRef::Name(name.clone()))
                .await
                .map_err(|e| self.error(e, &name))?;
            let id = reply.topic_id;
            if self
                .visible(|image| image.topics.values().all(|t| t.topic_id != id))
                .await
                .is_none()
            {
                warn!(topic = %name, "topic deleted but still visible here");
            }
            Ok(before.filter(|t| t.topic_id == id).unwrap_or_else(|| {
                Arc::new(TopicMetadata {
                    name: reply.name,
                    topic_id: id,
                    partitions: 0,
                    replication_factor: 0,
                    configs: Default::default(),
                    partition_states: Vec::new(),
                })
            }))
        })
    }

    fn create_partitions(
        &self,
        name: String,
        new_count: i32,
        assignments: Option<Vec<Vec<i32>>>,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let request = CreatePartitions {
                topic: name.clone(),
                new_total_count: new_count,
                assignments,
            };
            let reply = self
                .client
                .create_partitions(&request, false)
                .await
                .map_err(|e| self.error(e, &name))?;
            let id = reply.topic_id;
            let shown = self
                .visible(|image| {
                    image
                        .topic(&name)
                        .is_some_and(|t| t.topic_id == id && t.partitions >= new_count)
                })
                .await
                .and_then(|image| image.topic(&name).cloned());
            shown
                .or_else(|| self.image().topic(&name).cloned())
                .ok_or(MetadataError::UnknownTopic(name))
        })
    }

    /// Asked of the active controller, as a Kafka broker forwards
    /// DescribeQuorum to it; the answer is the Raft leader's own view.
    fn describe_quorum(&self) -> BoxFuture<'_, Result<QuorumDescription, MetadataError>> {
        Box::pin(async move {
            let answer = self.client.describe_quorum_leader().await.map_err(|e| {
                MetadataError::ControllerUnavailable(format!(
                    "no active controller of {} described the quorum within {:?}: {e}",
                    self.voters, self.request_timeout
                ))
            })?;
            quorum_description(answer)
        })
    }
}

/// Kafka's DescribeQuorum view of a leader's `DescribeQuorum` gRPC answer.
fn quorum_description(
    answer: samsa_proto::controller::DescribeQuorumResponse,
) -> Result<QuorumDescription, MetadataError> {
    let unavailable = |why: &str| MetadataError::ControllerUnavailable(why.to_owned());
    let replication = answer
        .replication
        .ok_or_else(|| unavailable("the controller that answered is no longer the leader"))?;
    let node_id = |id: u64| {
        i32::try_from(id).map_err(|_| unavailable(&format!("controller id {id} is not a node id")))
    };
    let endpoint = |id: u64| {
        let address = &answer.voters.iter().find(|v| v.node_id == id)?.address;
        let (host, port) = address.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    };
    let voters = replication
        .voters
        .iter()
        .map(|v| {
            Ok(QuorumVoter {
                node_id: node_id(v.node_id)?,
                log_end_offset: v.log_end_offset,
                last_fetch_timestamp: v.last_fetch_timestamp,
                last_caught_up_timestamp: v.last_caught_up_timestamp,
                endpoint: endpoint(v.node_id),
            })
        })
        .collect::<Result<Vec<_>, MetadataError>>()?;
    Ok(QuorumDescription {
        leader_id: node_id(answer.node_id)?,
        leader_epoch: i32::try_from(replication.term).unwrap_or(i32::MAX),
        high_watermark: replication.high_watermark,
        voters,
    })
}

/// Producer-id blocks from the controller quorum. Any failure is retriable
/// ([`ProducerIdError::Unavailable`]): a block that was committed but whose
/// answer was lost is simply never used, which skips ids but never repeats one.
pub struct ControllerProducerIdBlockSource {
    client: ControllerClient,
    broker_id: i32,
    /// This broker's epoch; negative until it is registered.
    epoch: Arc<AtomicI64>,
}

impl ProducerIdBlockSource for ControllerProducerIdBlockSource {
    fn allocate_block(&self) -> BoxFuture<'_, Result<ProducerIdBlock, ProducerIdError>> {
        Box::pin(async move {
            let epoch = self.epoch.load(Ordering::Acquire);
            if epoch < 0 {
                return Err(ProducerIdError::Unavailable(
                    "this broker is not registered with the controller yet".into(),
                ));
            }
            let block = self
                .client
                .allocate_producer_ids(self.broker_id, epoch)
                .await
                .map_err(|e| ProducerIdError::Unavailable(e.to_string()))?;
            if block.size <= 0 || block.first < 0 {
                return Err(ProducerIdError::Unavailable(format!(
                    "controller answered an invalid block [{}, +{})",
                    block.first, block.size
                )));
            }
            info!(
                first = block.first,
                size = block.size,
                "producer id block from the controller"
            );
            Ok(ProducerIdBlock {
                first: block.first,
                size: i64::from(block.size),
            })
        })
    }
}

// ---------------------------------------------------------------------------
// Broker lifecycle
// ---------------------------------------------------------------------------

/// Registration and heartbeats of this broker.
struct Lifecycle {
    settings: ClusterSettings,
    /// Short deadline: one registration or heartbeat attempt round.
    client: ControllerClient,
    incarnation_id: Uuid,
    endpoint: BrokerEndpoint,
    cluster_id: Option<String>,
    epoch: Arc<AtomicI64>,
    fenced: watch::Sender<bool>,
}

impl Lifecycle {
    fn register_request(&self) -> RegisterBroker {
        RegisterBroker {
            broker_id: self.settings.node_id,
            incarnation_id: self.incarnation_id,
            cluster_id: self.cluster_id.clone(),
            endpoints: vec![self.endpoint.clone()],
            rack: None,
        }
    }

    /// Registers this incarnation, retrying transient failures until
    /// `deadline`. Errors say why and what to check.
    async fn register(&self, deadline: Instant) -> Result<i64, BrokerError> {
        let request = self.register_request();
        let id = self.settings.node_id;
        let mut first_duplicate: Option<Instant> = None;
        let mut last_log: Option<Instant> = None;
        let mut pause = Duration::from_millis(100);
        loop {
            // Match on Kafka errors: errors that crossed the wire come back
            // as `ControllerError::Remote` for codes without a variant.
            let error = match self.client.register_broker(&request).await {
                Ok(reply) => {
                    self.epoch.store(reply.broker_epoch, Ordering::Release);
                    info!(broker_epoch = reply.broker_epoch, incarnation = %self.incarnation_id, "registered with the controller quorum");
                    return Ok(reply.broker_epoch);
                }
                Err(e) => match e.kafka_error() {
                    ResponseError::InconsistentClusterId => {
                        return Err(BrokerError::Cluster(format!(
                            "this node's data belongs to another cluster than the controller \
                             quorum ({e}); refusing to start on another cluster's data (use an \
                             empty data directory to join this quorum's cluster)"
                        )));
                    }
                    ResponseError::DuplicateBrokerRegistration => {
                        // A previous incarnation's session has not expired
                        // yet, or another live process uses this node id. The
                        // former ends within a session timeout (plus a leader
                        // change, which restarts sessions).
                        let since = *first_duplicate.get_or_insert_with(Instant::now);
                        let patience = self.settings.session_timeout * 2 + Duration::from_secs(5);
                        if since.elapsed() > patience {
                            return Err(BrokerError::Cluster(format!(
                                "broker id {id} is still registered by another live process \
                                 after {patience:?}: is node_id {id} configured on two nodes?"
                            )));
                        }
                        "broker id registered by a previous incarnation; waiting for its \
                         session to expire"
                            .to_owned()
                    }
                    ResponseError::NotController
                    | ResponseError::RequestTimedOut
                    | ResponseError::UnknownServerError => e.to_string(),
                    _ => {
                        return Err(BrokerError::Cluster(format!(
                            "the controller refused to register broker {id}: {e}"
                        )))
                    }
                },
            };
            if Instant::now() >= deadline {
                return Err(BrokerError::Cluster(format!(
                    "could not register with the controller quorum {} within {:?} (last error: \
                     {error}); at least {} of the {} voters must be running and reachable at the \
                     addresses in controller_quorum_voters",
                    self.settings.voters_text(),
                    self.settings.startup_timeout,
                    self.settings.majority(),
                    self.settings.voters.len()
                )));
            }
            if last_log.is_none_or(|t| t.elapsed() >= WAIT_LOG_INTERVAL) {
                info!(voters = %self.settings.voters_text(), reason = %error, "waiting for the controller quorum");
                last_log = Some(Instant::now());
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Heartbeats until `stop`; returns only on a fatal error (or `None` when stopped).
    async fn heartbeat_loop(
        self: Arc<Self>,
        follower: watch::Receiver<Arc<ControllerImage>>,
        mut stop: watch::Receiver<bool>,
    ) -> Option<BrokerError> {
        let mut ticker = tokio::time::interval(self.settings.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        loop {
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
                    if failures > 0 {
                        info!(failures, "heartbeats reach the active controller again");
                    }
                    failures = 0;
                    let was = self.fenced.send_replace(reply.is_fenced);
                    if was != reply.is_fenced {
                        if reply.is_fenced {
                            warn!("fenced by the controller");
                        } else {
                            info!("unfenced by the controller");
                        }
                    }
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
                        warn!(failures, error = %e, "heartbeat failed; keeping current leaderships");
                    }
                }
            }
        }
    }

    /// Asks the controller to move this broker's leaderships away (bounded).
    async fn controlled_shutdown(&self) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if epoch < 0 {
            return;
        }
        let client = ControllerClient::new(self.settings.endpoints(), CONTROLLED_SHUTDOWN_TIMEOUT);
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

/// Aborts the tasks it holds when dropped (start-up failures included).
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Tasks {
    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(task.in_current_span()));
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Refuses to start when something already answers at this node's own
/// controller address before this process has bound it.
async fn probe_duplicate(settings: &ClusterSettings) -> Result<(), BrokerError> {
    let addr = &settings.own_address;
    let connect = tokio::net::TcpStream::connect(addr.as_str());
    if !matches!(
        tokio::time::timeout(Duration::from_millis(500), connect).await,
        Ok(Ok(_))
    ) {
        return Ok(());
    }
    let client = ControllerClient::new([addr.clone()], Duration::from_secs(2));
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

async fn start_controller(
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
        broker_session_timeout_ms: config.broker_session_timeout_ms,
        producer_id_block_size: config.producer_id_block_size,
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
    // Embedded: this process serves one gRPC port for the controller and
    // for replication between brokers.
    ControllerNode::start_embedded(cc)
        .await
        .map_err(|e| BrokerError::Cluster(format!("cannot start the controller: {e}")))
}

/// Serves the controller's services and the replication service on this
/// node's controller address until `stop` turns true.
async fn serve_grpc(
    listen: std::net::SocketAddr,
    routes: tonic::service::Routes,
    replication: ReplicationGrpc,
    txn: crate::transactions::grpc::TxnGrpc,
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
    info!(%listen, "gRPC listening (controller, replication, transactions)");
    Ok(tokio::spawn(
        async move {
            let served = tonic::transport::Server::builder()
                .initial_stream_window_size(Some(crate::replication::REPLICATION_WINDOW_BYTES))
                .initial_connection_window_size(Some(
                    2 * crate::replication::REPLICATION_WINDOW_BYTES,
                ))
                .max_frame_size(Some(crate::replication::REPLICATION_MAX_FRAME_BYTES))
                .add_routes(routes)
                .serve_with_incoming_shutdown(
                    // Nagle on the answering side holds the last frames of
                    // each fetch answer until the peer's delayed ACK (~40 ms
                    // on Linux), and acks=all waits for that round trip. The
                    // builder's tcp_nodelay does not reach connections from a
                    // caller-supplied listener, so it is set here.
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
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
    if let (Some(configured), Some(stored)) = (&config.cluster_id, &identity.cluster_id) {
        if configured != stored {
            return Err(BrokerError::Cluster(format!(
                "data directory {} belongs to cluster {stored}, but this node is configured for \
                 cluster {configured} (cluster_id); refusing to start on another cluster's data",
                config.data_dir.display()
            )));
        }
    }
    probe_duplicate(&settings).await?;
    let listener = server::bind(config.listen).await?;
    let http_listener = crate::http::bind(config.http_listen).await?;
    let http_state = Arc::new(crate::http::HttpState::default());
    let cluster_id = config.cluster_id.clone().or(identity.cluster_id.clone());
    let (controller, routes) = start_controller(&config, &settings, cluster_id).await?;
    let replication = ReplicationGrpc::new();
    let txn_grpc = crate::transactions::grpc::TxnGrpc::new();
    let (grpc_stop_tx, grpc_stop_rx) = watch::channel(false);
    let grpc = match serve_grpc(
        config.controller_listen,
        routes,
        replication.clone(),
        txn_grpc.clone(),
        grpc_stop_rx.clone(),
    )
    .await
    {
        Ok(grpc) => grpc,
        Err(e) => {
            let _ = controller.shutdown().await;
            return Err(e);
        }
    };
    info!(
        voters = %settings.voters_text(),
        controller_listen = %config.controller_listen,
        "controller started"
    );
    let http = tokio::spawn(
        crate::http::serve(http_listener, Arc::clone(&http_state), grpc_stop_rx.clone())
            .in_current_span(),
    );
    let result = serve(
        config,
        settings,
        identity,
        &controller,
        BrokerServices {
            replication,
            txn: txn_grpc,
            http: http_state,
        },
        listener,
        shutdown,
    )
    .await;
    if let Err(e) = controller.shutdown().await {
        warn!(error = %e, "controller did not stop cleanly");
    }
    let _ = grpc_stop_tx.send(true);
    let _ = grpc.await;
    let _ = http.await;
    result
}

/// The broker-to-broker gRPC services, served from start-up and attached to
/// the broker once it is open.
struct BrokerServices {
    replication: ReplicationGrpc,
    txn: crate::transactions::grpc::TxnGrpc,
    /// What `/metrics` and `/readyz` read (the HTTP server runs from start-up).
    http: Arc<crate::http::HttpState>,
}

async fn serve(
    config: BrokerConfig,
    settings: ClusterSettings,
    mut identity: DataDirIdentity,
    controller: &ControllerNode,
    services: BrokerServices,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    let me = config.node_id;
    let BrokerServices {
        replication,
        txn: txn_grpc,
        http,
    } = services;
    let mut tasks = Tasks::default();
    let follower = MetadataFollower::spawn(
        ControllerClient::new(settings.endpoints(), settings.request_timeout),
        me,
    );

    // Controller image (+ Raft leader) → broker image.
    let (image_tx, image_rx) = watch::channel(Arc::new(MetadataImage::default()));
    {
        let mut images = follower.watch();
        let mut metrics = controller.raft().metrics();
        tasks.spawn(async move {
            let mut leader = metrics.borrow_and_update().current_leader;
            loop {
                let image = Arc::clone(&images.borrow_and_update());
                image_tx.send_replace(Arc::new(broker_image(&image, leader, me)));
                loop {
                    tokio::select! {
                        changed = images.changed() => {
                            if changed.is_err() { return; }
                            break;
                        }
                        changed = metrics.changed() => {
                            if changed.is_err() { return; }
                            let now = metrics.borrow_and_update().current_leader;
                            if now != leader {
                                leader = now;
                                break;
                            }
                        }
                    }
                }
            }
        });
    }

    let admin_client = ControllerClient::new(settings.endpoints(), settings.request_timeout);
    let store = Arc::new(QuorumMetadataStore::new(
        admin_client.clone(),
        image_rx.clone(),
        &settings,
    ));
    let epoch = Arc::new(AtomicI64::new(-1));
    let isr_client = admin_client.clone();
    let ids = ControllerProducerIdBlockSource {
        client: admin_client,
        broker_id: me,
        epoch: Arc::clone(&epoch),
    };
    let (host, port) = config.advertised_host_port();
    let endpoint = BrokerEndpoint {
        name: LISTENER.into(),
        host,
        port: u16::try_from(port)
            .map_err(|_| config_error(format!("advertised port {port} is not a TCP port")))?,
        security_protocol: LISTENER.into(),
    };
    let configured_cluster_id = config.cluster_id.clone();
    let broker = {
        let store: Arc<dyn MetadataStore> = store.clone();
        tokio::task::spawn_blocking(move || Broker::open_with(config, store, Box::new(ids)))
            .await
            .map_err(|e| BrokerError::Cluster(format!("opening the broker failed: {e}")))??
    };
    let broker = Arc::new(broker);
    http.attach(Arc::clone(&broker));
    let (isr_tx, isr_rx) = tokio::sync::mpsc::unbounded_channel();
    replication.attach(Arc::new(ReplicationHub {
        broker: Arc::clone(&broker),
        isr_proposals: isr_tx,
    }));
    let (fenced_tx, mut fenced_rx) = watch::channel(true);
    let lifecycle = Arc::new(Lifecycle {
        client: ControllerClient::new(
            settings.endpoints(),
            settings.heartbeat_interval.max(Duration::from_secs(1)),
        ),
        settings: settings.clone(),
        incarnation_id: Uuid::new_v4(),
        endpoint,
        cluster_id: identity.cluster_id.clone(),
        epoch,
        fenced: fenced_tx,
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);

    // Start-up: register, catch up, host partitions, get unfenced.
    let startup = async {
        let deadline = Instant::now() + settings.startup_timeout;
        let broker_epoch = lifecycle.register(deadline).await?;
        let mut images = follower.watch();
        // The watch guard must not live across an await (the future is Send).
        let caught_up = async {
            let image = images
                .wait_for(|image| {
                    image.cluster_id().is_some()
                        && image
                            .broker(me)
                            .is_some_and(|b| b.broker_epoch == broker_epoch)
                })
                .await
                .ok()?;
            image.cluster_id().map(str::to_owned)
        };
        let Ok(Some(cluster_id)) = tokio::time::timeout_at(deadline, caught_up).await else {
            return Err(BrokerError::Cluster(format!(
                "registered with the controller quorum but did not receive the metadata up to \
                 the registration within {:?}",
                settings.startup_timeout
            )));
        };
        identity.check_and_record(&cluster_id, configured_cluster_id.as_deref())?;
        let image = broker.metadata.image();
        let opening = Arc::clone(&broker);
        let span = tracing::Span::current();
        match tokio::task::spawn_blocking(move || span.in_scope(|| opening.apply_image(&image)))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "some partitions could not be opened; will retry"),
            Err(e) => warn!(error = %e, "applying metadata failed; will retry"),
        }
        Ok::<_, BrokerError>(())
    };
    tokio::select! {
        result = startup => result?,
        _ = &mut shutdown => {
            info!("stopped during start-up");
            let closing = Arc::clone(&broker);
            let _ = tokio::task::spawn_blocking(move || closing.replicas.close_all()).await;
            return Ok(());
        }
    }

    // Replication: follow the leaders of the partitions this broker
    // follows, and keep the ISRs of those it leads.
    {
        let peers: Vec<(i32, String)> = settings
            .voters
            .iter()
            .filter_map(|(id, addr)| Some((i32::try_from(*id).ok()?, addr.clone())))
            .collect();
        for fetcher in spawn_fetchers(&broker, &peers, &stop_rx) {
            tasks.0.push(fetcher);
        }
        // Transactions: markers and verification reach other brokers at
        // the same gRPC addresses.
        txn_grpc.attach(Arc::clone(&broker));
        tasks.0.push(crate::transactions::TxnShell::start(
            &broker,
            Some(peers.iter().cloned().collect()),
            stop_rx.clone(),
        ));
        tasks
            .0
            .push(crate::groups::GroupShell::start(&broker, stop_rx.clone()));
        tasks.spawn(
            isr_loop(
                Arc::clone(&broker),
                isr_client,
                Arc::clone(&lifecycle.epoch),
                isr_rx,
                stop_rx.clone(),
            )
            .in_current_span(),
        );
    }

    // Keep hosted partitions in line with every later image.
    {
        let broker = Arc::clone(&broker);
        let mut images = image_rx;
        tasks.spawn(async move {
            while images.changed().await.is_ok() {
                let image = Arc::clone(&images.borrow_and_update());
                let applying = Arc::clone(&broker);
                let span = tracing::Span::current();
                match tokio::task::spawn_blocking(move || {
                    span.in_scope(|| applying.apply_image(&image))
                })
                .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        warn!(error = %e, "applying metadata: some partitions could not be opened")
                    }
                    Err(e) => error!(error = %e, "applying metadata panicked"),
                }
            }
        });
    }
    let mut heartbeats = tokio::spawn(
        Arc::clone(&lifecycle)
            .heartbeat_loop(follower.watch(), stop_rx.clone())
            .in_current_span(),
    );
    let unfenced = tokio::time::timeout_at(Instant::now() + settings.startup_timeout, async {
        fenced_rx.wait_for(|fenced| !*fenced).await.is_ok()
    });
    let fatal: Option<BrokerError> = tokio::select! {
        result = unfenced => match result {
            Ok(true) => None,
            _ => Some(BrokerError::Cluster(format!(
                "registered, but the controller did not unfence this broker within {:?}",
                settings.startup_timeout
            ))),
        },
        result = &mut heartbeats => Some(result.ok().flatten().unwrap_or_else(|| {
            BrokerError::Cluster("heartbeats stopped during start-up".into())
        })),
        _ = &mut shutdown => {
            heartbeats.abort();
            lifecycle.controlled_shutdown().await;
            let closing = Arc::clone(&broker);
            let _ = tokio::task::spawn_blocking(move || closing.replicas.close_all()).await;
            return Ok(());
        }
    };
    if let Some(e) = fatal {
        heartbeats.abort();
        let closing = Arc::clone(&broker);
        let _ = tokio::task::spawn_blocking(move || closing.replicas.close_all()).await;
        return Err(e);
    }

    let accept = tokio::spawn(
        server::accept_loop(listener, Arc::clone(&broker), stop_rx.clone()).in_current_span(),
    );
    let maintenance =
        tokio::spawn(maintenance_loop(Arc::clone(&broker), stop_rx.clone()).in_current_span());
    // Ready while unfenced: a fenced broker leads nothing and clients
    // should go elsewhere.
    {
        let http = Arc::clone(&http);
        let mut fenced = fenced_rx.clone();
        let mut stop = stop_rx.clone();
        tasks.spawn(async move {
            loop {
                http.set_ready(!*fenced.borrow_and_update());
                tokio::select! {
                    changed = fenced.changed() => if changed.is_err() { break },
                    _ = stop.changed() => break,
                }
            }
            http.set_ready(false);
        });
    }
    let (host, port) = broker.config.advertised_host_port();
    info!(listen = %broker.config.listen, advertised = %format!("{host}:{port}"), "broker started (cluster mode)");

    let outcome = tokio::select! {
        _ = &mut shutdown => {
            info!("shutting down");
            lifecycle.controlled_shutdown().await;
            Ok(())
        }
        result = &mut heartbeats => Err(result.ok().flatten().unwrap_or_else(|| {
            BrokerError::Cluster("heartbeats stopped unexpectedly".into())
        })),
    };
    http.set_ready(false);
    let _ = stop_tx.send(true);
    heartbeats.abort();
    let _ = accept.await;
    let _ = maintenance.await;
    drop(tasks);
    drop(follower);
    let closing = Arc::clone(&broker);
    let span = tracing::Span::current();
    let _ =
        tokio::task::spawn_blocking(move || span.in_scope(|| closing.replicas.close_all())).await;
    if let Err(e) = &outcome {
        error!(error = %e, "broker stopped");
    } else {
        info!("shutdown complete");
    }
    outcome
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn config(voters: &str, node_id: i32, port: u16) -> BrokerConfig {
        BrokerConfig {
            node_id,
            controller_quorum_voters: Some(voters.into()),
            controller_listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn settings_reject_bad_voter_lists() {
        let ok = ClusterSettings::from_config(&config(
            "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293",
            2,
            9193,
        ))
        .unwrap();
        assert_eq!(ok.own_address, "127.0.0.1:9193");
        assert_eq!(ok.endpoints()[0], "127.0.0.1:9193");
        assert_eq!(ok.majority(), 2);

        let not_a_voter =
            ClusterSettings::from_config(&config("1@h:9093,2@h:9193", 3, 9093)).unwrap_err();
        assert!(
            not_a_voter
                .to_string()
                .contains("not in controller_quorum_voters"),
            "{not_a_voter}"
        );
        let duplicate =
            ClusterSettings::from_config(&config("1@h:9093,1@h:9193", 1, 9093)).unwrap_err();
        assert!(
            duplicate.to_string().contains("appears twice"),
            "{duplicate}"
        );
        let wrong_port =
            ClusterSettings::from_config(&config("1@h:9093,2@h:9193", 2, 9093)).unwrap_err();
        assert!(
            wrong_port.to_string().contains("controller_listen"),
            "{wrong_port}"
        );
        let mut bad_timing = config("1@h:9093", 1, 9093);
        bad_timing.broker_session_timeout_ms = 1_000;
        bad_timing.broker_heartbeat_interval_ms = 2_000;
        assert!(ClusterSettings::from_config(&bad_timing).is_err());
    }

    #[test]
    fn data_dir_identity_refuses_other_nodes_clusters_and_single_node_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut identity = DataDirIdentity::load(dir.path(), 1).unwrap();
        assert_eq!(identity.cluster_id, None);
        identity.check_and_record("c1", None).unwrap();
        let mut again = DataDirIdentity::load(dir.path(), 1).unwrap();
        assert_eq!(again.cluster_id.as_deref(), Some("c1"));
        let err = again.check_and_record("c2", None).unwrap_err();
        assert!(err.to_string().contains("another cluster"), "{err}");
        let err = again.check_and_record("c1", Some("c3")).unwrap_err();
        assert!(
            err.to_string().contains("configured for cluster c3"),
            "{err}"
        );
        let err = DataDirIdentity::load(dir.path(), 2).err().unwrap();
        assert!(err.to_string().contains("belongs to node 1"), "{err}");

        let single = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(single.path().join("meta")).unwrap();
        std::fs::write(single.path().join("meta").join(SINGLE_NODE_FILE), b"{}").unwrap();
        let err = DataDirIdentity::load(single.path(), 1).err().unwrap();
        assert!(err.to_string().contains("single-node data"), "{err}");
    }

    #[test]
    fn broker_image_reports_leaders_live_brokers_and_controller() {
        use samsa_controller::records::MetadataRecord;
        let mut image = ControllerImage::new();
        let endpoint = |port| BrokerEndpoint {
            name: LISTENER.into(),
            host: "127.0.0.1".into(),
            port,
            security_protocol: LISTENER.into(),
        };
        let topic_id = Uuid::from_u128(5);
        image
            .apply_batch(
                1,
                &[
                    MetadataRecord::ClusterIdAssigned {
                        cluster_id: "c".into(),
                    },
                    MetadataRecord::BrokerRegistered {
                        broker_id: 1,
                        incarnation_id: Uuid::from_u128(1),
                        broker_epoch: 0,
                        endpoints: vec![endpoint(9092)],
                        rack: None,
                    },
                    MetadataRecord::BrokerRegistered {
                        broker_id: 2,
                        incarnation_id: Uuid::from_u128(2),
                        broker_epoch: 1,
                        endpoints: vec![endpoint(9192)],
                        rack: None,
                    },
                    MetadataRecord::BrokerUnfenced {
                        broker_id: 2,
                        broker_epoch: 1,
                    },
                    MetadataRecord::TopicCreated {
                        name: "t".into(),
                        topic_id,
                        configs: Default::default(),
                    },
                    MetadataRecord::PartitionCreated {
                        topic_id,
                        partition: 0,
                        replicas: vec![2],
                        isr: vec![2],
                        leader: 2,
                        leader_epoch: 3,
                        partition_epoch: 0,
                    },
                ],
            )
            .unwrap();
        // Raft leader 1 is fenced: the live broker 2 is reported instead.
        let converted = broker_image(&image, Some(1), 1);
        assert_eq!(converted.cluster_id, "c");
        assert_eq!(converted.controller_id, 2);
        assert_eq!(
            converted
                .live_brokers()
                .map(|b| b.node_id)
                .collect::<Vec<_>>(),
            vec![2]
        );
        let p = converted.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.leader_epoch), (2, 3));
        assert_eq!(converted.topic("t").unwrap().replication_factor, 1);
        assert_eq!(broker_image(&image, Some(2), 1).controller_id, 2);
    }
}
