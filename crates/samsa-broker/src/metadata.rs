//! The broker's view of cluster metadata: which topics exist (ids, partition
//! counts, configs), who leads each partition (leader, leader epoch, replicas,
//! ISR), and which brokers exist with their advertised endpoints.
//!
//! [`MetadataStore`] is the boundary between the broker and wherever metadata
//! is decided. Two implementations exist and produce the *same* kind of
//! [`MetadataView`], so handlers never branch on the mode:
//!
//! - [`LocalMetadataStore`] (single node): one JSON file written atomically;
//!   every partition is led by this node at leader epoch 0 and the broker list
//!   is this node alone;
//! - `cluster::QuorumMetadataStore` (cluster mode): the view follows the
//!   controller quorum's committed metadata log (the controller's
//!   `MetadataImage`, converted by `cluster::metadata_view`).
//!
//! Readers take an immutable [`MetadataView`] snapshot (an `Arc`), so a
//! request sees one consistent view even while metadata changes.
//!
//! Invariants: a topic name maps to exactly one topic id; every topic carries
//! exactly `partitions` partition states; a change is durable (on disk, or
//! committed by the quorum) before the new image is published.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::MetadataError;
use crate::fsutil::write_atomic;
use samsa_controller::logic::{ElectLeaders, ElectionResult, Reassignment, ReassignmentResult};
pub use samsa_controller::records::{AclBinding, ConfigResource, MetadataRecord, ScramCredential};
use samsa_controller::ControllerError;

/// `leader` of a partition that has no leader (Kafka's -1), and the leader
/// and ISR of one partition: the controller's types, which the broker's view
/// carries as they are.
pub use samsa_controller::{PartitionState, NO_LEADER};

/// One broker as the metadata knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    pub node_id: i32,
    /// Advertised Kafka endpoints, one per listener.
    pub endpoints: Vec<KafkaEndpoint>,
    pub rack: Option<String>,
    /// Fenced brokers lead nothing and are left out of Metadata answers.
    pub fenced: bool,
}

impl BrokerInfo {
    /// The address this broker advertises on `listener`: a client is told
    /// the addresses of the listener it connected to, and a broker without
    /// that listener is one it cannot reach.
    pub fn endpoint(&self, listener: &str) -> Option<&KafkaEndpoint> {
        self.endpoints.iter().find(|e| e.listener == listener)
    }
}

/// One advertised Kafka endpoint of a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaEndpoint {
    /// The listener's name (upper case), e.g. `PLAINTEXT`.
    pub listener: String,
    pub host: String,
    pub port: i32,
}

/// One topic as the cluster knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMetadata {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: i32,
    pub replication_factor: i16,
    /// Topic-level config overrides (`retention.ms`, …), validated on entry.
    pub configs: BTreeMap<String, String>,
    /// Leadership of partitions `0..partitions`, by index. Not part of the
    /// single-node file: the local store derives it ("this node leads").
    #[serde(skip)]
    pub partition_states: Vec<PartitionState>,
}

impl TopicMetadata {
    pub fn partition(&self, index: i32) -> Option<&PartitionState> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partition_states.get(i))
    }
}

/// Kafka's internal topics (`Topic.isInternal`): Metadata and
/// DescribeTopicPartitions flag them `is_internal`.
pub fn is_internal_topic(name: &str) -> bool {
    matches!(
        name,
        crate::coordinator::placement::CONSUMER_OFFSETS_TOPIC
            | crate::coordinator::placement::TRANSACTION_STATE_TOPIC
            | "__share_group_state"
    )
}

/// The metadata quorum as its leader describes it (Kafka's DescribeQuorum).
/// Offsets are Kafka end offsets of the metadata log (one past its last
/// entry), times the leader's wall clock in ms; -1 means unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumDescription {
    pub leader_id: i32,
    /// The Raft term (0 on a single node: there never was an election).
    pub leader_epoch: i32,
    /// What a majority of voters hold.
    pub high_watermark: i64,
    /// Every voter, by id; samsa has no observers (every broker is a voter).
    pub voters: Vec<QuorumVoter>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumVoter {
    pub node_id: i32,
    pub log_end_offset: i64,
    pub last_fetch_timestamp: i64,
    pub last_caught_up_timestamp: i64,
    /// Its controller address (`host`, `port`), where the other controllers
    /// reach it; `None` on a single node, which has no controller listener.
    pub endpoint: Option<(String, u16)>,
}

/// A request to create a topic, already defaulted (no -1 counts).
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
    /// Manual placement: replica list per partition, by index.
    pub assignments: Option<Vec<Vec<i32>>>,
}

/// The broker's view of the cluster: an immutable snapshot of all metadata
/// as this broker serves it. In cluster mode it is built from the
/// controller's `samsa_controller::MetadataImage` (`cluster::metadata_view`:
/// Kafka endpoints, live brokers, the reported controller); on a single node
/// from the local file. Not to be confused with that image, which is the
/// controller's own state (registrations, epochs, producer-id blocks).
#[derive(Debug, Clone, Default)]
pub struct MetadataView {
    /// Position of this view in its store's history: the metadata log
    /// offset in cluster mode, a change counter in single-node mode. A newer
    /// view never has a smaller offset.
    pub offset: u64,
    pub cluster_id: String,
    /// The broker reported as "controller" to Kafka clients.
    pub controller_id: i32,
    /// Every registered broker (fenced ones included), by id.
    pub brokers: Vec<BrokerInfo>,
    pub topics: BTreeMap<String, Arc<TopicMetadata>>,
    topic_names_by_id: HashMap<Uuid, String>,
    /// Cluster-wide dynamic broker configs (Kafka's broker resource with an
    /// empty name); see `dynamic_config`.
    pub cluster_configs: BTreeMap<String, String>,
    /// Each broker's own dynamic configs, by broker id.
    pub broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    /// SCRAM credentials by user, then mechanism name (`security::sasl`).
    pub scram_credentials: Arc<BTreeMap<String, BTreeMap<String, ScramCredential>>>,
    /// Every ACL binding (`security::acl`).
    pub acls: Arc<BTreeSet<AclBinding>>,
}

impl MetadataView {
    /// Builds an image at `offset`; `brokers` are sorted by id. Each topic
    /// must carry its partition states.
    pub fn from_parts(
        offset: u64,
        cluster_id: String,
        controller_id: i32,
        mut brokers: Vec<BrokerInfo>,
        topics: impl IntoIterator<Item = TopicMetadata>,
    ) -> Self {
        brokers.sort_by_key(|b| b.node_id);
        let mut image = MetadataView {
            offset,
            cluster_id,
            controller_id,
            brokers,
            ..Default::default()
        };
        for topic in topics {
            image
                .topic_names_by_id
                .insert(topic.topic_id, topic.name.clone());
            image.topics.insert(topic.name.clone(), Arc::new(topic));
        }
        image
    }

    /// This view with the dynamic broker configs of the metadata.
    pub fn with_dynamic_configs(
        mut self,
        cluster_configs: BTreeMap<String, String>,
        broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    ) -> Self {
        self.cluster_configs = cluster_configs;
        self.broker_configs = broker_configs;
        self
    }

    /// This view with the users' SCRAM credentials and the ACLs.
    pub fn with_security(
        mut self,
        scram_credentials: BTreeMap<String, BTreeMap<String, ScramCredential>>,
        acls: BTreeSet<AclBinding>,
    ) -> Self {
        self.scram_credentials = Arc::new(scram_credentials);
        self.acls = Arc::new(acls);
        self
    }

    /// The dynamic configs of one config resource: the cluster-wide
    /// defaults, a broker's, or a topic's (`None`: no such topic).
    pub fn resource_configs(&self, resource: &ConfigResource) -> Option<BTreeMap<String, String>> {
        match resource {
            ConfigResource::Cluster => Some(self.cluster_configs.clone()),
            ConfigResource::Broker { id } => {
                Some(self.broker_configs.get(id).cloned().unwrap_or_default())
            }
            ConfigResource::Topic { name } => self.topic(name).map(|t| t.configs.clone()),
        }
    }

    /// Unfenced brokers: the ones clients are told about.
    pub fn live_brokers(&self) -> impl Iterator<Item = &BrokerInfo> {
        self.brokers.iter().filter(|b| !b.fenced)
    }

    pub fn broker(&self, node_id: i32) -> Option<&BrokerInfo> {
        self.brokers.iter().find(|b| b.node_id == node_id)
    }

    pub fn is_live_broker(&self, node_id: i32) -> bool {
        self.broker(node_id).is_some_and(|b| !b.fenced)
    }

    pub fn topic(&self, name: &str) -> Option<&Arc<TopicMetadata>> {
        self.topics.get(name)
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<&PartitionState> {
        self.topic(topic).and_then(|t| t.partition(index))
    }

    pub fn topic_by_id(&self, id: &Uuid) -> Option<&Arc<TopicMetadata>> {
        self.topic_names_by_id
            .get(id)
            .and_then(|name| self.topics.get(name))
    }
}

/// Where metadata is decided. Implementations publish a new image only after
/// the change is durable, and a successful change is visible in [`image`]
/// when the call returns.
///
/// [`image`]: MetadataStore::image
pub trait MetadataStore: Send + Sync {
    fn image(&self) -> Arc<MetadataView>;
    fn create_topic(
        &self,
        topic: NewTopic,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>>;
    fn delete_topic(
        &self,
        name: String,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>>;
    /// Grows a topic to `new_count` partitions; `assignments` places the new
    /// ones (one replica list per new partition).
    fn create_partitions(
        &self,
        name: String,
        new_count: i32,
        assignments: Option<Vec<Vec<i32>>>,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>>;
    /// The metadata quorum as its leader sees it (DescribeQuorum): the
    /// quorum store asks the active controller (waiting out an election,
    /// bounded), the local store describes this node as the only voter.
    fn describe_quorum(&self) -> BoxFuture<'_, Result<QuorumDescription, MetadataError>>;
    /// Sets (`Some`) or removes (`None`) dynamic config keys of one
    /// resource, in order; the values were validated by the caller
    /// (`dynamic_config`). A topic must exist (UnknownTopic otherwise).
    fn alter_configs(
        &self,
        resource: ConfigResource,
        changes: Vec<(String, Option<String>)>,
    ) -> BoxFuture<'_, Result<(), MetadataError>>;
    /// Applies SCRAM credential and ACL records (`ScramCredentialChanged`,
    /// `AclCreated`, `AclDeleted`), all or none, checked by the caller.
    fn alter_security(
        &self,
        records: Vec<MetadataRecord>,
    ) -> BoxFuture<'_, Result<(), MetadataError>>;
    /// ElectLeaders: PREFERRED or UNCLEAN elections, one result per
    /// partition (for every partition, only those that needed one).
    fn elect_leaders(
        &self,
        request: ElectLeaders,
    ) -> BoxFuture<'_, Result<Vec<ElectionResult>, MetadataError>>;
    /// AlterPartitionReassignments (KIP-455): starts, replaces or cancels
    /// reassignments, one result per partition in request order.
    fn alter_reassignments(
        &self,
        requests: Vec<Reassignment>,
    ) -> BoxFuture<'_, Result<Vec<ReassignmentResult>, MetadataError>>;
    /// UnregisterBroker: removes broker `broker_id`'s registration (answered
    /// once committed).
    fn unregister_broker(&self, broker_id: i32) -> BoxFuture<'_, Result<(), MetadataError>>;
}

#[derive(Serialize, Deserialize)]
struct MetadataFile {
    cluster_id: String,
    /// The image offset: how many changes this file has seen (absent in
    /// files written before it was kept, which count from 0).
    #[serde(default)]
    offset: u64,
    topics: Vec<TopicMetadata>,
    /// Dynamic broker configs (absent in files written before them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    cluster_configs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    broker_configs: BTreeMap<i32, BTreeMap<String, String>>,
    /// SCRAM credentials (salted; never a password) and ACLs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    scram_credentials: BTreeMap<String, BTreeMap<String, ScramCredential>>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    acls: BTreeSet<AclBinding>,
}

/// Single-node metadata store: one JSON file, rewritten atomically per change.
/// The image it publishes names `local` as the only broker, the controller
/// and the leader (epoch 0) of every partition.
pub struct LocalMetadataStore {
    path: PathBuf,
    local: BrokerInfo,
    image: Mutex<Arc<MetadataView>>,
}

/// The single-node image: `local` leads every partition at epoch 0.
fn local_image(
    offset: u64,
    cluster_id: String,
    local: &BrokerInfo,
    topics: impl IntoIterator<Item = TopicMetadata>,
) -> MetadataView {
    let me = local.node_id;
    let topics = topics.into_iter().map(|mut topic| {
        topic.partition_states = (0..topic.partitions)
            .map(|_| PartitionState::new(vec![me], vec![me], me, 0, 0))
            .collect();
        topic
    });
    MetadataView::from_parts(offset, cluster_id, me, vec![local.clone()], topics)
}

impl LocalMetadataStore {
    /// Opens `path`, creating it with a fresh cluster id if it does not
    /// exist. `local` is this broker.
    pub fn open(path: PathBuf, local: BrokerInfo) -> Result<Self, MetadataError> {
        let image = match std::fs::read(&path) {
            Ok(bytes) => {
                let file: MetadataFile =
                    serde_json::from_slice(&bytes).map_err(|e| MetadataError::Corrupt {
                        path: path.clone(),
                        reason: e.to_string(),
                    })?;
                local_image(file.offset, file.cluster_id, &local, file.topics)
                    .with_dynamic_configs(file.cluster_configs, file.broker_configs)
                    .with_security(file.scram_credentials, file.acls)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let image = local_image(0, new_cluster_id(), &local, []);
                persist(&path, &image)?;
                image
            }
            Err(source) => return Err(MetadataError::Io { path, source }),
        };
        Ok(LocalMetadataStore {
            path,
            local,
            image: Mutex::new(Arc::new(image)),
        })
    }

    /// Applies `change` to a copy of the image, persists it, then publishes it.
    /// The lock is held across the write so changes are serialized.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut BTreeMap<String, TopicMetadata>) -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        self.update_with_configs(|topics, _| change(topics))
    }

    /// [`Self::update`] of the topics and the dynamic broker configs.
    fn update_with_configs<T>(
        &self,
        change: impl FnOnce(
            &mut BTreeMap<String, TopicMetadata>,
            &mut DynamicBrokerConfigs,
        ) -> Result<T, MetadataError>,
    ) -> Result<T, MetadataError> {
        let mut guard = self.image.lock().unwrap_or_else(|p| p.into_inner());
        let mut topics: BTreeMap<String, TopicMetadata> = guard
            .topics
            .iter()
            .map(|(name, t)| (name.clone(), TopicMetadata::clone(t)))
            .collect();
        let mut configs = DynamicBrokerConfigs {
            cluster: guard.cluster_configs.clone(),
            brokers: guard.broker_configs.clone(),
            scram_credentials: BTreeMap::clone(&guard.scram_credentials),
            acls: BTreeSet::clone(&guard.acls),
        };
        let result = change(&mut topics, &mut configs)?;
        let image = local_image(
            guard.offset + 1,
            guard.cluster_id.clone(),
            &self.local,
            topics.into_values(),
        )
        .with_dynamic_configs(configs.cluster, configs.brokers)
        .with_security(configs.scram_credentials, configs.acls);
        persist(&self.path, &image)?;
        *guard = Arc::new(image);
        Ok(result)
    }
}

/// What a single node's file holds besides topics: the dynamic broker
/// configs, SCRAM credentials and ACLs.
struct DynamicBrokerConfigs {
    cluster: BTreeMap<String, String>,
    brokers: BTreeMap<i32, BTreeMap<String, String>>,
    scram_credentials: BTreeMap<String, BTreeMap<String, ScramCredential>>,
    acls: BTreeSet<AclBinding>,
}

fn new_cluster_id() -> String {
    // Kafka cluster ids are 16 random bytes in URL-safe base64 without padding.
    let uuid = Uuid::new_v4();
    base64_url(uuid.as_bytes())
}

fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    let mut bits: u32 = 0;
    let mut nbits = 0;
    for &b in bytes {
        bits = (bits << 8) | u32::from(b);
        nbits += 8;
        while nbits >= 6 {
            nbits -= 6;
            out.push(char::from(ALPHABET[((bits >> nbits) & 63) as usize]));
        }
    }
    if nbits > 0 {
        out.push(char::from(ALPHABET[((bits << (6 - nbits)) & 63) as usize]));
    }
    out
}

fn persist(path: &std::path::Path, image: &MetadataView) -> Result<(), MetadataError> {
    let file = MetadataFile {
        cluster_id: image.cluster_id.clone(),
        offset: image.offset,
        topics: image
            .topics
            .values()
            .map(|t| TopicMetadata::clone(t))
            .collect(),
        cluster_configs: image.cluster_configs.clone(),
        broker_configs: image.broker_configs.clone(),
        scram_credentials: BTreeMap::clone(&image.scram_credentials),
        acls: BTreeSet::clone(&image.acls),
    };
    let bytes = serde_json::to_vec_pretty(&file).map_err(|e| MetadataError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    write_atomic(path, &bytes).map_err(|source| MetadataError::Io {
        path: path.to_path_buf(),
        source,
    })
}

impl MetadataStore for LocalMetadataStore {
    fn image(&self) -> Arc<MetadataView> {
        self.image.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn create_topic(
        &self,
        topic: NewTopic,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        let result = self.update(|topics| {
            validate_topic_name(&topic.name)?;
            if topics.contains_key(&topic.name) {
                return Err(MetadataError::TopicAlreadyExists(topic.name.clone()));
            }
            let created = TopicMetadata {
                name: topic.name.clone(),
                topic_id: Uuid::new_v4(),
                partitions: topic.partitions,
                replication_factor: topic.replication_factor,
                configs: topic.configs.clone(),
                partition_states: Vec::new(),
            };
            topics.insert(topic.name.clone(), created.clone());
            Ok(Arc::new(created))
        });
        // Answer with the published topic, which carries its partition states.
        let result = result.map(|created| self.published(created));
        Box::pin(async move { result })
    }

    fn delete_topic(
        &self,
        name: String,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        let result = self.update(|topics| {
            topics
                .remove(&name)
                .map(Arc::new)
                .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))
        });
        Box::pin(async move { result })
    }

    fn create_partitions(
        &self,
        name: String,
        new_count: i32,
        // One node: the handler has checked that assignments name only it.
        _assignments: Option<Vec<Vec<i32>>>,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        let result = self.update(|topics| {
            let topic = topics
                .get_mut(&name)
                .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?;
            if new_count <= topic.partitions {
                return Err(MetadataError::InvalidPartitions {
                    count: new_count,
                    reason: format!(
                        "topic currently has {} partitions, which is higher than or equal to the requested {}",
                        topic.partitions, new_count
                    ),
                });
            }
            topic.partitions = new_count;
            Ok(Arc::new(topic.clone()))
        });
        let result = result.map(|grown| self.published(grown));
        Box::pin(async move { result })
    }

    /// The one node leads every partition already: nothing needs electing.
    fn elect_leaders(
        &self,
        request: ElectLeaders,
    ) -> BoxFuture<'_, Result<Vec<ElectionResult>, MetadataError>> {
        let image = self.image();
        let results = request
            .partitions
            .unwrap_or_default()
            .into_iter()
            .map(|(topic, partition)| ElectionResult {
                result: Err(single_node_partition(&image, &topic, partition)
                    .err()
                    .unwrap_or(ControllerError::ElectionNotNeeded)),
                topic,
                partition,
            })
            .collect();
        Box::pin(async move { Ok(results) })
    }

    /// The one node cannot take itself away, and knows no other broker.
    fn unregister_broker(&self, broker_id: i32) -> BoxFuture<'_, Result<(), MetadataError>> {
        let refusal = if broker_id == self.local.node_id {
            MetadataError::Rejected {
                error: kafka_protocol::error::ResponseError::InvalidRequest,
                message: format!(
                    "broker {broker_id} is this single node: it cannot be unregistered"
                ),
            }
        } else {
            let e = ControllerError::BrokerIdNotRegistered(broker_id);
            MetadataError::Rejected {
                error: e.kafka_error(),
                message: e.to_string(),
            }
        };
        Box::pin(async move { Err(refusal) })
    }

    /// The only replica a partition can have is this node: a target of
    /// exactly it is already in place, any other broker is unknown.
    fn alter_reassignments(
        &self,
        requests: Vec<Reassignment>,
    ) -> BoxFuture<'_, Result<Vec<ReassignmentResult>, MetadataError>> {
        let image = self.image();
        let me = self.local.node_id;
        let results = requests
            .into_iter()
            .map(|r| {
                let result = single_node_partition(&image, &r.topic, r.partition).and_then(|()| {
                    match &r.target {
                        None => Err(ControllerError::NoReassignmentInProgress),
                        Some(target) if target == &[me] => Ok(()),
                        Some(target) => Err(ControllerError::InvalidReplicaAssignment(format!(
                            "the target replicas {target:?} name brokers other than the only one, {me}"
                        ))),
                    }
                });
                ReassignmentResult {
                    topic: r.topic,
                    partition: r.partition,
                    result,
                }
            })
            .collect();
        Box::pin(async move { Ok(results) })
    }

    /// No Raft here: this node is the only voter and the leader, at epoch 0
    /// (never elected, like its partitions), and its "metadata log" is the
    /// file's change count, which it holds in full.
    fn alter_configs(
        &self,
        resource: ConfigResource,
        changes: Vec<(String, Option<String>)>,
    ) -> BoxFuture<'_, Result<(), MetadataError>> {
        let result = self.update_with_configs(|topics, brokers| {
            let configs = match &resource {
                ConfigResource::Cluster => &mut brokers.cluster,
                ConfigResource::Broker { id } => brokers.brokers.entry(*id).or_default(),
                ConfigResource::Topic { name } => {
                    &mut topics
                        .get_mut(name)
                        .ok_or_else(|| MetadataError::UnknownTopic(name.clone()))?
                        .configs
                }
            };
            for (name, value) in changes {
                match value {
                    Some(v) => configs.insert(name, v),
                    None => configs.remove(&name),
                };
            }
            brokers.brokers.retain(|_, c| !c.is_empty());
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn alter_security(
        &self,
        records: Vec<MetadataRecord>,
    ) -> BoxFuture<'_, Result<(), MetadataError>> {
        let result = self.update_with_configs(|_, state| {
            for record in records {
                match record {
                    MetadataRecord::ScramCredentialChanged {
                        user,
                        mechanism,
                        credential: Some(credential),
                    } => {
                        state
                            .scram_credentials
                            .entry(user)
                            .or_default()
                            .insert(mechanism, credential);
                    }
                    MetadataRecord::ScramCredentialChanged {
                        user,
                        mechanism,
                        credential: None,
                    } => {
                        if let Some(by_mechanism) = state.scram_credentials.get_mut(&user) {
                            by_mechanism.remove(&mechanism);
                            if by_mechanism.is_empty() {
                                state.scram_credentials.remove(&user);
                            }
                        }
                    }
                    MetadataRecord::AclCreated { binding } => {
                        state.acls.insert(binding);
                    }
                    MetadataRecord::AclDeleted { binding } => {
                        state.acls.remove(&binding);
                    }
                    other => {
                        return Err(MetadataError::Rejected {
                            error: kafka_protocol::error::ResponseError::InvalidRequest,
                            message: format!("{other} is not a security change"),
                        })
                    }
                }
            }
            Ok(())
        });
        Box::pin(async move { result })
    }

    fn describe_quorum(&self) -> BoxFuture<'_, Result<QuorumDescription, MetadataError>> {
        let end = i64::try_from(self.image().offset).unwrap_or(i64::MAX);
        let now = crate::now_ms();
        let description = QuorumDescription {
            leader_id: self.local.node_id,
            leader_epoch: 0,
            high_watermark: end,
            voters: vec![QuorumVoter {
                node_id: self.local.node_id,
                log_end_offset: end,
                // Kafka reports the leader's own times as "now".
                last_fetch_timestamp: now,
                last_caught_up_timestamp: now,
                endpoint: None,
            }],
        };
        Box::pin(async move { Ok(description) })
    }
}

impl LocalMetadataStore {
    /// The current image's version of `topic` (with partition states), or
    /// `topic` itself if it is not there.
    fn published(&self, topic: Arc<TopicMetadata>) -> Arc<TopicMetadata> {
        self.image()
            .topic(&topic.name)
            .filter(|t| t.topic_id == topic.topic_id)
            .cloned()
            .unwrap_or(topic)
    }
}

/// Kafka's topic name rules: 1–249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
/// Whether the single-node image has this partition (as the controller
/// answers a partition it does not know).
fn single_node_partition(
    image: &MetadataView,
    topic: &str,
    partition: i32,
) -> Result<(), ControllerError> {
    match image.topic(topic) {
        None => Err(ControllerError::UnknownTopic(topic.to_owned())),
        Some(t) if partition < 0 || partition >= t.partitions => {
            Err(ControllerError::UnknownPartition {
                topic: topic.to_owned(),
                partition,
            })
        }
        Some(_) => Ok(()),
    }
}

pub fn validate_topic_name(name: &str) -> Result<(), MetadataError> {
    let invalid = |reason: &str| MetadataError::InvalidTopic {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() {
        return Err(invalid("topic name is empty"));
    }
    if name == "." || name == ".." {
        return Err(invalid("topic name cannot be '.' or '..'"));
    }
    if name.len() > 249 {
        return Err(invalid("topic name is longer than 249 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
    {
        return Err(invalid(
            "topic name contains characters other than ASCII alphanumerics, '.', '_' and '-'",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn new_topic(name: &str, partitions: i32) -> NewTopic {
        NewTopic {
            name: name.to_string(),
            partitions,
            replication_factor: 1,
            configs: BTreeMap::new(),
            assignments: None,
        }
    }

    fn me() -> BrokerInfo {
        BrokerInfo {
            node_id: 1,
            endpoints: vec![KafkaEndpoint {
                listener: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092,
            }],
            rack: None,
            fenced: false,
        }
    }

    #[tokio::test]
    async fn topics_survive_reopen_and_keep_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topics.json");
        let store = LocalMetadataStore::open(path.clone(), me()).unwrap();
        let cluster_id = store.image().cluster_id.clone();
        let created = store.create_topic(new_topic("orders", 3)).await.unwrap();
        store
            .create_partitions("orders".into(), 5, None)
            .await
            .unwrap();
        store.create_topic(new_topic("gone", 1)).await.unwrap();
        store.delete_topic("gone".into()).await.unwrap();
        drop(store);

        let reopened = LocalMetadataStore::open(path, me()).unwrap();
        let image = reopened.image();
        assert_eq!(image.cluster_id, cluster_id);
        let orders = image.topic("orders").unwrap();
        assert_eq!(orders.partitions, 5);
        assert_eq!(orders.topic_id, created.topic_id);
        assert!(image.topic("gone").is_none());
        assert_eq!(image.topic_by_id(&created.topic_id).unwrap().name, "orders");
    }

    #[tokio::test]
    async fn duplicate_and_invalid_topics_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalMetadataStore::open(dir.path().join("t.json"), me()).unwrap();
        store.create_topic(new_topic("a", 1)).await.unwrap();
        assert!(matches!(
            store.create_topic(new_topic("a", 1)).await,
            Err(MetadataError::TopicAlreadyExists(_))
        ));
        assert!(matches!(
            store.create_topic(new_topic("bad/name", 1)).await,
            Err(MetadataError::InvalidTopic { .. })
        ));
        assert!(matches!(
            store.create_partitions("a".into(), 1, None).await,
            Err(MetadataError::InvalidPartitions { .. })
        ));
    }

    #[tokio::test]
    async fn single_node_image_says_this_node_leads_everything() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalMetadataStore::open(dir.path().join("t.json"), me()).unwrap();
        let before = store.image().offset;
        let created = store.create_topic(new_topic("a", 2)).await.unwrap();
        assert_eq!(created.partition_states.len(), 2);
        let image = store.image();
        assert!(image.offset > before);
        assert_eq!(image.controller_id, 1);
        assert_eq!(image.live_brokers().count(), 1);
        for index in 0..2 {
            let p = image.partition("a", index).unwrap();
            assert_eq!((p.leader, p.leader_epoch), (1, 0));
            assert_eq!(
                (p.replicas.as_slice(), p.isr.as_slice()),
                (&[1][..], &[1][..])
            );
        }
        store.create_partitions("a".into(), 3, None).await.unwrap();
        assert!(store.image().partition("a", 2).is_some());
    }

    #[tokio::test]
    async fn single_node_quorum_is_this_node_and_its_change_count_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let store = LocalMetadataStore::open(path.clone(), me()).unwrap();
        store.create_topic(new_topic("a", 1)).await.unwrap();
        store.create_topic(new_topic("b", 1)).await.unwrap();
        let quorum = store.describe_quorum().await.unwrap();
        assert_eq!((quorum.leader_id, quorum.leader_epoch), (1, 0));
        assert_eq!(quorum.high_watermark, 2);
        assert_eq!(quorum.voters.len(), 1);
        assert_eq!(quorum.voters[0].log_end_offset, 2);
        assert!(quorum.voters[0].last_fetch_timestamp > 0);
        drop(store);
        // The high watermark never goes back: the count is in the file.
        let store = LocalMetadataStore::open(path, me()).unwrap();
        assert_eq!(store.describe_quorum().await.unwrap().high_watermark, 2);
        store.delete_topic("a".into()).await.unwrap();
        assert_eq!(store.describe_quorum().await.unwrap().high_watermark, 3);
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            LocalMetadataStore::open(path, me()),
            Err(MetadataError::Corrupt { .. })
        ));
    }

    #[test]
    fn cluster_id_is_22_chars_of_url_safe_base64() {
        let id = new_cluster_id();
        assert_eq!(id.len(), 22);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }
}
