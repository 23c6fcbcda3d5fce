//! `MetadataImage`: the cluster metadata as of one metadata offset.
//!
//! The image is what the controller's Raft state machine holds and what
//! brokers rebuild from the metadata stream. It owns these invariants, and
//! [`MetadataImage::apply`] is the only way to change it:
//!
//! - **pure and deterministic**: `apply` reads nothing but the image and the
//!   record (no clock, no randomness), so every replica and every broker that
//!   applies the same batches in the same order holds the same image;
//! - **atomic batches**: [`MetadataImage::apply_batch`] applies all records of
//!   an entry or none of them (a rejected batch still advances the offset, on
//!   every replica alike);
//! - **guards**: each record's precondition (see [`crate::records`]) is
//!   checked before anything changes; partition epochs only grow by one per
//!   change, leader epochs never go down, producer-id blocks only move
//!   forward (so no id is handed out twice), topic names and ids are unique,
//!   every ISR is a subset of its partition's replicas.
//!
//! Broker liveness (the time of a broker's last heartbeat) is deliberately
//! *not* part of the image: it changes every couple of seconds per broker and
//! only the active controller needs it, so it lives in the leader's soft state
//! ([`crate::logic::BrokerLiveness`]). Writing every heartbeat through Raft
//! would put one log entry per broker per heartbeat interval on every
//! controller's disk. What *is* replicated is the outcome: fenced / unfenced.
//!
//! Topics are held behind `Arc`, so cloning an image (which atomic batches,
//! handlers' scratch copies and readers do) copies pointers, not partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::records::{
    AclBinding, BrokerEndpoint, BrokerId, ConfigResource, MetadataRecord, ReplicaAssignment,
    ScramCredential, NO_LEADER,
};

/// Topic config that allows electing a leader from outside the ISR.
pub const UNCLEAN_LEADER_ELECTION_ENABLE: &str = "unclean.leader.election.enable";
/// Topic config read by partition leaders for `acks=all`.
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";

/// A broker's registration as the quorum knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerRegistration {
    pub broker_id: BrokerId,
    /// Random id of the broker process that registered; a restart brings a new one.
    pub incarnation_id: Uuid,
    /// Grows with every registration in the cluster; requests from an older
    /// incarnation carry an older epoch and are refused.
    pub broker_epoch: i64,
    pub endpoints: Vec<BrokerEndpoint>,
    pub rack: Option<String>,
    /// Fenced brokers lead nothing and are not in any ISR (except as the last
    /// member of a leaderless partition's ISR).
    pub fenced: bool,
    /// Set by controlled shutdown; cleared only by a new registration.
    pub in_controlled_shutdown: bool,
    /// Metadata offset of the registration; the broker counts as caught up
    /// once it has applied this offset.
    pub registered_offset: u64,
}

impl BrokerRegistration {
    /// May lead partitions and join ISRs.
    pub fn is_active(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }
}

/// Leader and ISR of one partition. The one type for it: the broker's view
/// (`samsa_broker::metadata::TopicMetadata`) carries these too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// Assigned replicas, preferred leader first.
    pub replicas: Vec<BrokerId>,
    /// In-sync replicas; never empty, always a subset of `replicas`.
    pub isr: Vec<BrokerId>,
    /// [`NO_LEADER`] when no eligible replica is available.
    pub leader: BrokerId,
    /// Bumped on every leader change.
    pub leader_epoch: i32,
    /// Bumped on every change of this partition; `AlterPartition` compares it.
    pub partition_epoch: i32,
    /// Replicas a reassignment adds (in `replicas`, catching up); empty
    /// when no reassignment is in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding_replicas: Vec<BrokerId>,
    /// Replicas a reassignment removes once every adding one is in sync.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing_replicas: Vec<BrokerId>,
}

impl PartitionState {
    /// A partition without a reassignment in progress.
    pub fn new(
        replicas: Vec<BrokerId>,
        isr: Vec<BrokerId>,
        leader: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
    ) -> Self {
        Self {
            replicas,
            isr,
            leader,
            leader_epoch,
            partition_epoch,
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
        }
    }

    /// Whether a reassignment is in progress (KIP-455).
    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas the partition will have once its reassignment
    /// completes (its replicas when none is in progress), preferred first.
    pub fn target_replicas(&self) -> Vec<BrokerId> {
        self.replicas
            .iter()
            .copied()
            .filter(|b| !self.removing_replicas.contains(b))
            .collect()
    }

    /// The replicas the partition had before its reassignment started.
    pub fn original_replicas(&self) -> Vec<BrokerId> {
        self.replicas
            .iter()
            .copied()
            .filter(|b| !self.adding_replicas.contains(b))
            .collect()
    }

    /// The replica set as a record carries it.
    pub fn assignment(&self) -> ReplicaAssignment {
        ReplicaAssignment {
            replicas: self.replicas.clone(),
            adding_replicas: self.adding_replicas.clone(),
            removing_replicas: self.removing_replicas.clone(),
        }
    }

    pub fn has_leader(&self) -> bool {
        self.leader != NO_LEADER
    }

    /// Whether `broker` is one of the partition's replicas (and so hosts its log).
    pub fn is_replica(&self, broker: BrokerId) -> bool {
        self.replicas.contains(&broker)
    }
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicImage {
    pub name: String,
    pub topic_id: Uuid,
    pub configs: BTreeMap<String, String>,
    /// Indexed by partition id.
    pub partitions: Vec<PartitionState>,
}

impl TopicImage {
    /// Replicas per partition, as Kafka reports a topic's replication
    /// factor: partition 0's count (0 for a topic without partitions).
    pub fn replication_factor(&self) -> usize {
        self.partitions.first().map_or(0, |p| p.replicas.len())
    }

    pub fn partition(&self, partition: i32) -> Option<&PartitionState> {
        usize::try_from(partition)
            .ok()
            .and_then(|p| self.partitions.get(p))
    }
}

/// Why a record could not be applied. A rejected batch leaves the image as it
/// was (apart from the offset).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("cluster id is already {0}")]
    ClusterIdAlreadySet(String),
    #[error("broker epoch {got} is not the next one ({expected})")]
    BrokerEpochNotNext { got: i64, expected: i64 },
    #[error("broker {0} is not registered")]
    UnknownBroker(BrokerId),
    #[error("broker {broker_id} has epoch {current}, record has {got}")]
    StaleBrokerEpoch {
        broker_id: BrokerId,
        got: i64,
        current: i64,
    },
    #[error("broker {0} is in controlled shutdown")]
    BrokerShuttingDown(BrokerId),
    #[error("broker {0} is not fenced")]
    BrokerNotFenced(BrokerId),
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("topic id {0} already exists")]
    TopicIdExists(Uuid),
    #[error("unknown topic id {0}")]
    UnknownTopicId(Uuid),
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("topic {topic_id} has {count} partitions, cannot create partition {partition}")]
    PartitionOutOfOrder {
        topic_id: Uuid,
        partition: i32,
        count: usize,
    },
    #[error("unknown partition {topic_id}-{partition}")]
    UnknownPartition { topic_id: Uuid, partition: i32 },
    #[error("partition epoch {got} does not follow {current}")]
    PartitionEpochNotNext { got: i32, current: i32 },
    #[error("leader epoch {got} is below {current}")]
    LeaderEpochWentBack { got: i32, current: i32 },
    #[error("invalid partition state: {0}")]
    InvalidPartitionState(String),
    #[error("producer id block starts at {got}, next free id is {expected}")]
    ProducerIdNotNext { got: i64, expected: i64 },
    #[error("producer id block of size {0} is invalid")]
    InvalidProducerIdBlock(i32),
}

/// The cluster metadata as of [`MetadataImage::offset`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    cluster_id: Option<String>,
    offset: u64,
    brokers: BTreeMap<BrokerId, BrokerRegistration>,
    topics: BTreeMap<String, Arc<TopicImage>>,
    topic_ids: BTreeMap<Uuid, String>,
    cluster_configs: BTreeMap<String, String>,
    /// Per-broker dynamic configs, by broker id (absent in images written
    /// before brokers had them).
    #[serde(default)]
    broker_configs: BTreeMap<BrokerId, BTreeMap<String, String>>,
    /// SCRAM credentials by user, then mechanism.
    #[serde(default)]
    scram_credentials: BTreeMap<String, BTreeMap<String, ScramCredential>>,
    /// Every ACL binding.
    #[serde(default)]
    acls: BTreeSet<AclBinding>,
    next_producer_id: i64,
    next_broker_epoch: i64,
}

impl MetadataImage {
    /// The empty image, before any record.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// Metadata offset (Raft log index) of the last entry applied.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn broker(&self, id: BrokerId) -> Option<&BrokerRegistration> {
        self.brokers.get(&id)
    }

    pub fn brokers(&self) -> impl Iterator<Item = &BrokerRegistration> {
        self.brokers.values()
    }

    /// Registered, unfenced and not shutting down.
    pub fn is_broker_active(&self, id: BrokerId) -> bool {
        self.brokers
            .get(&id)
            .is_some_and(BrokerRegistration::is_active)
    }

    /// Ids of active brokers, ascending.
    pub fn active_brokers(&self) -> Vec<BrokerId> {
        self.brokers
            .values()
            .filter(|b| b.is_active())
            .map(|b| b.broker_id)
            .collect()
    }

    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topics.get(name).map(|t| &**t)
    }

    pub fn topic_by_id(&self, id: &Uuid) -> Option<&TopicImage> {
        self.topic_ids.get(id).and_then(|name| self.topic(name))
    }

    /// Topics by name.
    pub fn topics(&self) -> impl Iterator<Item = &TopicImage> {
        self.topics.values().map(|t| &**t)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionState> {
        self.topic(topic).and_then(|t| t.partition(partition))
    }

    pub fn cluster_configs(&self) -> &BTreeMap<String, String> {
        &self.cluster_configs
    }

    /// SCRAM credentials by user, then mechanism.
    pub fn scram_credentials(&self) -> &BTreeMap<String, BTreeMap<String, ScramCredential>> {
        &self.scram_credentials
    }

    /// Every ACL binding.
    pub fn acls(&self) -> &BTreeSet<AclBinding> {
        &self.acls
    }

    /// Every broker's own dynamic configs, by broker id.
    pub fn broker_configs(&self) -> &BTreeMap<BrokerId, BTreeMap<String, String>> {
        &self.broker_configs
    }

    /// Effective value of a topic config: the topic's own, else the cluster's.
    pub fn topic_config<'a>(&'a self, topic: &'a TopicImage, key: &str) -> Option<&'a str> {
        topic
            .configs
            .get(key)
            .or_else(|| self.cluster_configs.get(key))
            .map(String::as_str)
    }

    /// First producer id of the next block to hand out.
    pub fn next_producer_id(&self) -> i64 {
        self.next_producer_id
    }

    /// Epoch the next broker registration gets.
    pub fn next_broker_epoch(&self) -> i64 {
        self.next_broker_epoch
    }

    /// Applies one committed entry: the batch at `offset`. All records are
    /// applied or, if one fails its guard, none is; the offset advances in
    /// both cases.
    pub fn apply_batch(
        &mut self,
        offset: u64,
        records: &[MetadataRecord],
    ) -> Result<(), ApplyError> {
        // The offset moves first: records applied here see their own offset
        // (a registration remembers it as `registered_offset`).
        self.offset = self.offset.max(offset);
        match records {
            [] => Ok(()),
            [single] => self.apply(single),
            many => {
                let mut next = self.clone();
                let res = many.iter().try_for_each(|r| next.apply(r));
                if res.is_ok() {
                    *self = next;
                }
                res
            }
        }
    }

    /// Moves the offset past an entry that carries no records (Raft blank or
    /// membership entries).
    pub fn advance_offset(&mut self, offset: u64) {
        self.offset = self.offset.max(offset);
    }

    /// Applies one record. Checks its guard first; on error nothing changed.
    /// Each record kind has its own step below (the guard table is in
    /// [`crate::records`]); this match only unpacks a record into its step,
    /// one arm per kind, which is why it is longer than a screen.
    pub fn apply(&mut self, record: &MetadataRecord) -> Result<(), ApplyError> {
        match record {
            MetadataRecord::ClusterIdAssigned { cluster_id } => self.assign_cluster_id(cluster_id),
            MetadataRecord::BrokerRegistered {
                broker_id,
                incarnation_id,
                broker_epoch,
                endpoints,
                rack,
            } => self.register_broker(BrokerRegistration {
                broker_id: *broker_id,
                incarnation_id: *incarnation_id,
                broker_epoch: *broker_epoch,
                endpoints: endpoints.clone(),
                rack: rack.clone(),
                fenced: true,
                in_controlled_shutdown: false,
                registered_offset: self.offset,
            }),
            MetadataRecord::BrokerFenced {
                broker_id,
                broker_epoch,
                controlled_shutdown,
            } => self.fence_broker(*broker_id, *broker_epoch, *controlled_shutdown),
            MetadataRecord::BrokerUnfenced {
                broker_id,
                broker_epoch,
            } => self.unfence_broker(*broker_id, *broker_epoch),
            MetadataRecord::BrokerUnregistered {
                broker_id,
                broker_epoch,
            } => self.unregister_broker(*broker_id, *broker_epoch),
            MetadataRecord::TopicCreated {
                name,
                topic_id,
                configs,
            } => self.create_topic(TopicImage {
                name: name.clone(),
                topic_id: *topic_id,
                configs: configs.clone(),
                partitions: Vec::new(),
            }),
            MetadataRecord::PartitionCreated {
                topic_id,
                partition,
                replicas,
                isr,
                leader,
                leader_epoch,
                partition_epoch,
            } => self.create_partition(
                topic_id,
                *partition,
                PartitionState::new(
                    replicas.clone(),
                    isr.clone(),
                    *leader,
                    *leader_epoch,
                    *partition_epoch,
                ),
            ),
            MetadataRecord::PartitionChanged {
                topic_id,
                partition,
                isr,
                leader,
                leader_epoch,
                partition_epoch,
                assignment,
            } => self.change_partition(
                topic_id,
                *partition,
                PartitionChange {
                    isr,
                    leader: *leader,
                    leader_epoch: *leader_epoch,
                    partition_epoch: *partition_epoch,
                    assignment: assignment.as_ref(),
                },
            ),
            MetadataRecord::TopicDeleted { topic_id, name } => self.delete_topic(topic_id, name),
            MetadataRecord::ProducerIdsAllocated {
                first_producer_id,
                size,
                ..
            } => self.allocate_producer_ids(*first_producer_id, *size),
            MetadataRecord::ConfigChanged {
                resource,
                name,
                value,
            } => self.change_config(resource, name, value.as_deref()),
            MetadataRecord::ScramCredentialChanged {
                user,
                mechanism,
                credential,
            } => {
                match credential {
                    Some(c) => {
                        self.scram_credentials
                            .entry(user.clone())
                            .or_default()
                            .insert(mechanism.clone(), c.clone());
                    }
                    None => {
                        if let Some(by_mechanism) = self.scram_credentials.get_mut(user) {
                            by_mechanism.remove(mechanism);
                            if by_mechanism.is_empty() {
                                self.scram_credentials.remove(user);
                            }
                        }
                    }
                }
                Ok(())
            }
            MetadataRecord::AclCreated { binding } => {
                self.acls.insert(binding.clone());
                Ok(())
            }
            MetadataRecord::AclDeleted { binding } => {
                self.acls.remove(binding);
                Ok(())
            }
        }
    }

    /// `ClusterIdAssigned`: the cluster id is set once.
    fn assign_cluster_id(&mut self, cluster_id: &str) -> Result<(), ApplyError> {
        if let Some(current) = &self.cluster_id {
            return Err(ApplyError::ClusterIdAlreadySet(current.clone()));
        }
        self.cluster_id = Some(cluster_id.to_owned());
        Ok(())
    }

    /// `BrokerRegistered`: (re)places the registration; its epoch must be
    /// the next one, so epochs grow with every registration.
    fn register_broker(&mut self, registration: BrokerRegistration) -> Result<(), ApplyError> {
        if registration.broker_epoch != self.next_broker_epoch {
            return Err(ApplyError::BrokerEpochNotNext {
                got: registration.broker_epoch,
                expected: self.next_broker_epoch,
            });
        }
        self.next_broker_epoch += 1;
        self.brokers.insert(registration.broker_id, registration);
        Ok(())
    }

    /// `BrokerFenced`, of the registration with that epoch.
    fn fence_broker(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: i64,
        controlled_shutdown: bool,
    ) -> Result<(), ApplyError> {
        let broker = self.broker_with_epoch(broker_id, broker_epoch)?;
        broker.fenced = true;
        broker.in_controlled_shutdown |= controlled_shutdown;
        Ok(())
    }

    /// `BrokerUnfenced`, of the registration with that epoch, unless it is
    /// shutting down (only a new registration clears that).
    fn unfence_broker(&mut self, broker_id: BrokerId, broker_epoch: i64) -> Result<(), ApplyError> {
        let broker = self.broker_with_epoch(broker_id, broker_epoch)?;
        if broker.in_controlled_shutdown {
            return Err(ApplyError::BrokerShuttingDown(broker_id));
        }
        broker.fenced = false;
        Ok(())
    }

    /// `BrokerUnregistered`, of the fenced registration with that epoch.
    fn unregister_broker(
        &mut self,
        broker_id: BrokerId,
        broker_epoch: i64,
    ) -> Result<(), ApplyError> {
        if !self.broker_with_epoch(broker_id, broker_epoch)?.fenced {
            return Err(ApplyError::BrokerNotFenced(broker_id));
        }
        self.brokers.remove(&broker_id);
        Ok(())
    }

    /// `TopicCreated`: name and id both unused.
    fn create_topic(&mut self, topic: TopicImage) -> Result<(), ApplyError> {
        if self.topics.contains_key(&topic.name) {
            return Err(ApplyError::TopicExists(topic.name));
        }
        if self.topic_ids.contains_key(&topic.topic_id) {
            return Err(ApplyError::TopicIdExists(topic.topic_id));
        }
        self.topic_ids.insert(topic.topic_id, topic.name.clone());
        self.topics.insert(topic.name.clone(), Arc::new(topic));
        Ok(())
    }

    /// `PartitionCreated`: a valid state, appended as the topic's next
    /// partition (ids are dense).
    fn create_partition(
        &mut self,
        topic_id: &Uuid,
        partition: i32,
        state: PartitionState,
    ) -> Result<(), ApplyError> {
        check_partition_state(&state)?;
        let topic = self.topic_mut(topic_id)?;
        let count = topic.partitions.len();
        if usize::try_from(partition).ok() != Some(count) {
            return Err(ApplyError::PartitionOutOfOrder {
                topic_id: *topic_id,
                partition,
                count,
            });
        }
        topic.partitions.push(state);
        Ok(())
    }

    /// `PartitionChanged`: compare-and-set on the partition epoch (exactly
    /// the next one), the leader epoch never goes back, and the result is a
    /// valid state over the same replicas, or over the record's new
    /// assignment.
    fn change_partition(
        &mut self,
        topic_id: &Uuid,
        partition: i32,
        change: PartitionChange<'_>,
    ) -> Result<(), ApplyError> {
        let current = self
            .topic_by_id(topic_id)
            .ok_or(ApplyError::UnknownTopicId(*topic_id))?
            .partition(partition)
            .ok_or(ApplyError::UnknownPartition {
                topic_id: *topic_id,
                partition,
            })?;
        if Some(change.partition_epoch) != current.partition_epoch.checked_add(1) {
            return Err(ApplyError::PartitionEpochNotNext {
                got: change.partition_epoch,
                current: current.partition_epoch,
            });
        }
        if change.leader_epoch < current.leader_epoch {
            return Err(ApplyError::LeaderEpochWentBack {
                got: change.leader_epoch,
                current: current.leader_epoch,
            });
        }
        let assignment = change
            .assignment
            .cloned()
            .unwrap_or_else(|| current.assignment());
        let next = PartitionState {
            replicas: assignment.replicas,
            isr: change.isr.to_vec(),
            leader: change.leader,
            leader_epoch: change.leader_epoch,
            partition_epoch: change.partition_epoch,
            adding_replicas: assignment.adding_replicas,
            removing_replicas: assignment.removing_replicas,
        };
        check_partition_state(&next)?;
        let topic = self.topic_mut(topic_id)?;
        if let Some(slot) = usize::try_from(partition)
            .ok()
            .and_then(|p| topic.partitions.get_mut(p))
        {
            *slot = next;
        }
        Ok(())
    }

    /// `TopicDeleted`: the name and the id must name the same topic.
    fn delete_topic(&mut self, topic_id: &Uuid, name: &str) -> Result<(), ApplyError> {
        match self.topic_ids.get(topic_id) {
            Some(n) if n == name => {}
            Some(_) | None => return Err(ApplyError::UnknownTopicId(*topic_id)),
        }
        self.topic_ids.remove(topic_id);
        self.topics.remove(name);
        Ok(())
    }

    /// `ProducerIdsAllocated`: blocks only move forward, one after the other,
    /// so no producer id is handed out twice.
    fn allocate_producer_ids(&mut self, first: i64, size: i32) -> Result<(), ApplyError> {
        if first != self.next_producer_id {
            return Err(ApplyError::ProducerIdNotNext {
                got: first,
                expected: self.next_producer_id,
            });
        }
        let next = (size > 0)
            .then(|| first.checked_add(i64::from(size)))
            .flatten()
            .ok_or(ApplyError::InvalidProducerIdBlock(size))?;
        self.next_producer_id = next;
        Ok(())
    }

    /// `ConfigChanged`: sets (`Some`) or removes (`None`) one key of the
    /// cluster's, a broker's or an existing topic's configs. A broker's
    /// configs may be set before it registers (as in Kafka); a broker
    /// left without any is dropped from the map.
    fn change_config(
        &mut self,
        resource: &ConfigResource,
        name: &str,
        value: Option<&str>,
    ) -> Result<(), ApplyError> {
        let configs = match resource {
            ConfigResource::Cluster => &mut self.cluster_configs,
            ConfigResource::Broker { id } => {
                if value.is_none() {
                    if let Some(configs) = self.broker_configs.get_mut(id) {
                        configs.remove(name);
                        if configs.is_empty() {
                            self.broker_configs.remove(id);
                        }
                    }
                    return Ok(());
                }
                self.broker_configs.entry(*id).or_default()
            }
            ConfigResource::Topic { name: topic } => {
                let topic = self
                    .topics
                    .get_mut(topic)
                    .ok_or_else(|| ApplyError::UnknownTopic(topic.clone()))?;
                &mut Arc::make_mut(topic).configs
            }
        };
        match value {
            Some(v) => configs.insert(name.to_owned(), v.to_owned()),
            None => configs.remove(name),
        };
        Ok(())
    }

    fn broker_with_epoch(
        &mut self,
        broker_id: BrokerId,
        epoch: i64,
    ) -> Result<&mut BrokerRegistration, ApplyError> {
        let broker = self
            .brokers
            .get_mut(&broker_id)
            .ok_or(ApplyError::UnknownBroker(broker_id))?;
        if broker.broker_epoch != epoch {
            return Err(ApplyError::StaleBrokerEpoch {
                broker_id,
                got: epoch,
                current: broker.broker_epoch,
            });
        }
        Ok(broker)
    }

    fn topic_mut(&mut self, topic_id: &Uuid) -> Result<&mut TopicImage, ApplyError> {
        let name = self
            .topic_ids
            .get(topic_id)
            .ok_or(ApplyError::UnknownTopicId(*topic_id))?;
        let topic = self
            .topics
            .get_mut(name)
            .ok_or_else(|| ApplyError::UnknownTopic(name.clone()))?;
        Ok(Arc::make_mut(topic))
    }
}

/// What a `PartitionChanged` record sets on a partition (its replicas stay).
struct PartitionChange<'a> {
    isr: &'a [BrokerId],
    leader: BrokerId,
    leader_epoch: i32,
    partition_epoch: i32,
    assignment: Option<&'a ReplicaAssignment>,
}

fn check_partition_state(state: &PartitionState) -> Result<(), ApplyError> {
    let invalid = |why: &str| Err(ApplyError::InvalidPartitionState(why.to_owned()));
    if state.replicas.is_empty() {
        return invalid("no replicas");
    }
    let mut sorted = state.replicas.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != state.replicas.len() {
        return invalid("duplicate replicas");
    }
    if state.isr.is_empty() {
        return invalid("empty ISR");
    }
    if state.isr.iter().any(|b| !state.replicas.contains(b)) {
        return invalid("ISR member is not a replica");
    }
    if state.leader != NO_LEADER && !state.isr.contains(&state.leader) {
        return invalid("leader is not in the ISR");
    }
    if state.leader_epoch < 0 || state.partition_epoch < 0 {
        return invalid("negative epoch");
    }
    let moving = state.adding_replicas.iter().chain(&state.removing_replicas);
    if moving.clone().any(|b| !state.replicas.contains(b)) {
        return invalid("adding or removing replica is not a replica");
    }
    if state
        .adding_replicas
        .iter()
        .any(|b| state.removing_replicas.contains(b))
    {
        return invalid("replica both added and removed");
    }
    if !state.removing_replicas.is_empty() && state.target_replicas().is_empty() {
        return invalid("reassignment removes every replica");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn topic_records(name: &str, id: Uuid) -> Vec<MetadataRecord> {
        vec![
            MetadataRecord::TopicCreated {
                name: name.into(),
                topic_id: id,
                configs: BTreeMap::new(),
            },
            MetadataRecord::PartitionCreated {
                topic_id: id,
                partition: 0,
                replicas: vec![1, 2],
                isr: vec![1, 2],
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
            },
        ]
    }

    #[test]
    fn batch_is_atomic_and_offset_advances() {
        let mut image = MetadataImage::new();
        let id = Uuid::from_u128(7);
        let mut bad = topic_records("t", id);
        bad.push(MetadataRecord::PartitionCreated {
            topic_id: id,
            partition: 5,
            replicas: vec![1],
            isr: vec![1],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
        });
        assert!(image.apply_batch(3, &bad).is_err());
        assert!(image.topic("t").is_none());
        assert_eq!(image.offset(), 3);

        image.apply_batch(4, &topic_records("t", id)).unwrap();
        assert_eq!(image.topic("t").unwrap().partitions.len(), 1);
        assert_eq!(image.offset(), 4);
    }

    #[test]
    fn a_new_assignment_must_hold_the_isr_and_its_moving_replicas() {
        let mut image = MetadataImage::new();
        let id = Uuid::from_u128(9);
        image.apply_batch(1, &topic_records("t", id)).unwrap();
        let before = image.partition("t", 0).unwrap().clone();
        let change = |replicas: Vec<i32>, adding: Vec<i32>, removing: Vec<i32>| {
            MetadataRecord::PartitionChanged {
                topic_id: id,
                partition: 0,
                isr: before.isr.clone(),
                leader: before.leader,
                leader_epoch: before.leader_epoch,
                partition_epoch: before.partition_epoch + 1,
                assignment: Some(ReplicaAssignment {
                    replicas,
                    adding_replicas: adding,
                    removing_replicas: removing,
                }),
            }
        };
        let mut target = before.replicas.clone();
        target.push(7);
        for bad in [
            change(vec![7], vec![7], vec![]),
            change(target.clone(), vec![8], vec![]),
            change(target.clone(), vec![7], vec![7]),
            change(target.clone(), vec![], target.clone()),
        ] {
            assert!(
                matches!(image.apply(&bad), Err(ApplyError::InvalidPartitionState(_))),
                "{bad}"
            );
        }
        image
            .apply(&change(target.clone(), vec![7], vec![]))
            .unwrap();
        let moving = image.partition("t", 0).unwrap();
        assert_eq!(moving.replicas, target);
        assert_eq!(moving.adding_replicas, vec![7]);
        assert!(moving.is_reassigning());
        assert_eq!(moving.original_replicas(), before.replicas);
    }

    #[test]
    fn partition_change_is_compare_and_set() {
        let mut image = MetadataImage::new();
        let id = Uuid::from_u128(9);
        image.apply_batch(1, &topic_records("t", id)).unwrap();
        let change = |epoch| MetadataRecord::PartitionChanged {
            topic_id: id,
            partition: 0,
            isr: vec![1],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: epoch,
            assignment: None,
        };
        assert!(matches!(
            image.apply(&change(2)),
            Err(ApplyError::PartitionEpochNotNext { .. })
        ));
        image.apply(&change(1)).unwrap();
        assert!(image.apply(&change(1)).is_err());
        assert_eq!(image.partition("t", 0).unwrap().isr, vec![1]);
    }

    #[test]
    fn producer_blocks_only_move_forward() {
        let mut image = MetadataImage::new();
        let alloc = |first| MetadataRecord::ProducerIdsAllocated {
            broker_id: 1,
            broker_epoch: 0,
            first_producer_id: first,
            size: 1000,
        };
        image.apply(&alloc(0)).unwrap();
        assert!(image.apply(&alloc(0)).is_err());
        image.apply(&alloc(1000)).unwrap();
        assert_eq!(image.next_producer_id(), 2000);
    }

    #[test]
    fn image_roundtrips_through_json() {
        let mut image = MetadataImage::new();
        image
            .apply_batch(2, &topic_records("t", Uuid::from_u128(1)))
            .unwrap();
        let json = serde_json::to_vec(&image).unwrap();
        let back: MetadataImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, image);
    }
}
