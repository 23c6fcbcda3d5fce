//! Metadata records: the commands of the controller's Raft state machine.
//!
//! The controller quorum's Raft log *is* the metadata log. Every normal Raft
//! entry carries one [`MetadataBatch`]: records that one controller handler
//! produced together and that are applied atomically (all or none) by
//! [`MetadataImage::apply_batch`](crate::MetadataImage::apply_batch). The
//! entry's Raft log index is the batch's *metadata offset*.
//!
//! Records describe facts, not requests: each carries the complete new value
//! of what it changes (for partitions: the whole leader/ISR/epoch tuple), so
//! applying one needs no computation beyond checks. Those checks are guards
//! (compare-and-set style: `broker_epoch`, `partition_epoch + 1`,
//! `first_producer_id == next`), which makes a record computed against a stale
//! image fail deterministically on every replica instead of corrupting state.
//!
//! | record | changes | guard checked on apply |
//! |---|---|---|
//! | [`ClusterIdAssigned`](MetadataRecord::ClusterIdAssigned) | sets the cluster id, once | no cluster id yet |
//! | [`BrokerRegistered`](MetadataRecord::BrokerRegistered) | (re)places the broker's registration: new incarnation, new epoch, endpoints, rack; starts **fenced** | `broker_epoch == next_broker_epoch` |
//! | [`BrokerFenced`](MetadataRecord::BrokerFenced) | broker fenced (missed heartbeats, asked to, or controlled shutdown) | registered with that epoch |
//! | [`BrokerUnfenced`](MetadataRecord::BrokerUnfenced) | broker unfenced (caught up and heartbeating) | registered with that epoch, not in controlled shutdown |
//! | [`TopicCreated`](MetadataRecord::TopicCreated) | new topic: name, UUID, configs | name and UUID unused |
//! | [`PartitionCreated`](MetadataRecord::PartitionCreated) | new partition with replicas, ISR, leader, epochs | topic exists, partition id == current count, ISR ⊆ replicas |
//! | [`PartitionChanged`](MetadataRecord::PartitionChanged) | new leader / ISR / leader epoch of one partition | `partition_epoch == current + 1`, leader epoch not lower, ISR ⊆ replicas |
//! | [`TopicDeleted`](MetadataRecord::TopicDeleted) | topic and its partitions removed | topic exists with that name and UUID |
//! | [`ProducerIdsAllocated`](MetadataRecord::ProducerIdsAllocated) | next producer-id block start moves past the block | `first_producer_id == next_producer_id`, size > 0 |
//! | [`ConfigChanged`](MetadataRecord::ConfigChanged) | one config key set or removed on the cluster-wide broker defaults, one broker, or a topic | the topic exists |

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Kafka broker id.
pub type BrokerId = i32;

/// `leader` value of a partition that has no leader.
pub const NO_LEADER: BrokerId = -1;

/// A listener a broker advertises.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoint {
    /// Listener name, e.g. `PLAINTEXT`.
    pub name: String,
    pub host: String,
    pub port: u16,
    pub security_protocol: String,
}

/// What a [`MetadataRecord::ConfigChanged`] applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ConfigResource {
    /// Cluster-wide defaults of broker configs (Kafka's broker resource
    /// with an empty name: `unclean.leader.election.enable`,
    /// `log.retention.ms`, …).
    Cluster,
    /// One broker's own dynamic configs (Kafka's broker resource named by
    /// its id); they take precedence over the cluster-wide defaults.
    Broker { id: BrokerId },
    /// One topic, by name.
    Topic { name: String },
}

/// One metadata change. See the module docs for the table of records and
/// the guard each one checks when applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MetadataRecord {
    ClusterIdAssigned {
        cluster_id: String,
    },
    BrokerRegistered {
        broker_id: BrokerId,
        incarnation_id: Uuid,
        broker_epoch: i64,
        endpoints: Vec<BrokerEndpoint>,
        rack: Option<String>,
    },
    BrokerFenced {
        broker_id: BrokerId,
        broker_epoch: i64,
        /// Fenced because it went through controlled shutdown: it must not be
        /// unfenced again until it registers anew.
        controlled_shutdown: bool,
    },
    BrokerUnfenced {
        broker_id: BrokerId,
        broker_epoch: i64,
    },
    TopicCreated {
        name: String,
        topic_id: Uuid,
        configs: BTreeMap<String, String>,
    },
    PartitionCreated {
        topic_id: Uuid,
        partition: i32,
        replicas: Vec<BrokerId>,
        isr: Vec<BrokerId>,
        leader: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
    },
    PartitionChanged {
        topic_id: Uuid,
        partition: i32,
        isr: Vec<BrokerId>,
        leader: BrokerId,
        leader_epoch: i32,
        partition_epoch: i32,
    },
    TopicDeleted {
        topic_id: Uuid,
        name: String,
    },
    ProducerIdsAllocated {
        broker_id: BrokerId,
        broker_epoch: i64,
        first_producer_id: i64,
        size: i32,
    },
    ConfigChanged {
        resource: ConfigResource,
        name: String,
        /// `None` removes the key.
        value: Option<String>,
    },
}

impl fmt::Display for MetadataRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ClusterIdAssigned { cluster_id } => write!(f, "ClusterIdAssigned({cluster_id})"),
            Self::BrokerRegistered {
                broker_id,
                broker_epoch,
                ..
            } => write!(f, "BrokerRegistered({broker_id}, epoch {broker_epoch})"),
            Self::BrokerFenced {
                broker_id,
                controlled_shutdown,
                ..
            } => write!(
                f,
                "BrokerFenced({broker_id}, controlled_shutdown={controlled_shutdown})"
            ),
            Self::BrokerUnfenced { broker_id, .. } => write!(f, "BrokerUnfenced({broker_id})"),
            Self::TopicCreated { name, topic_id, .. } => {
                write!(f, "TopicCreated({name}, {topic_id})")
            }
            Self::PartitionCreated {
                topic_id,
                partition,
                leader,
                ..
            } => write!(f, "PartitionCreated({topic_id}-{partition}, leader {leader})"),
            Self::PartitionChanged {
                topic_id,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
            } => write!(
                f,
                "PartitionChanged({topic_id}-{partition}, leader {leader}, leader_epoch {leader_epoch}, isr {isr:?}, partition_epoch {partition_epoch})"
            ),
            Self::TopicDeleted { name, .. } => write!(f, "TopicDeleted({name})"),
            Self::ProducerIdsAllocated {
                broker_id,
                first_producer_id,
                size,
                ..
            } => write!(
                f,
                "ProducerIdsAllocated(broker {broker_id}, [{first_producer_id}, +{size}))"
            ),
            Self::ConfigChanged { resource, name, value } => {
                write!(f, "ConfigChanged({resource:?}, {name}={value:?})")
            }
        }
    }
}

/// The application data of one Raft entry: records applied atomically.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataBatch {
    pub records: Vec<MetadataRecord>,
}

impl fmt::Display for MetadataBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MetadataBatch({} records)", self.records.len())
    }
}
