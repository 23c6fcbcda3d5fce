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
//! | [`BrokerUnregistered`](MetadataRecord::BrokerUnregistered) | the broker's registration removed (UnregisterBroker); partitions keep naming it until moved | registered with that epoch, fenced |
//! | [`TopicCreated`](MetadataRecord::TopicCreated) | new topic: name, UUID, configs | name and UUID unused |
//! | [`PartitionCreated`](MetadataRecord::PartitionCreated) | new partition with replicas, ISR, leader, epochs | topic exists, partition id == current count, ISR ⊆ replicas |
//! | [`PartitionChanged`](MetadataRecord::PartitionChanged) | new leader / ISR / leader epoch of one partition, and with `assignment` its replicas and the adding / removing replicas of a reassignment | `partition_epoch == current + 1`, leader epoch not lower, ISR ⊆ replicas, adding and removing ⊆ replicas and disjoint |
//! | [`TopicDeleted`](MetadataRecord::TopicDeleted) | topic and its partitions removed | topic exists with that name and UUID |
//! | [`ProducerIdsAllocated`](MetadataRecord::ProducerIdsAllocated) | next producer-id block start moves past the block | `first_producer_id == next_producer_id`, size > 0 |
//! | [`ConfigChanged`](MetadataRecord::ConfigChanged) | one config key set or removed on the cluster-wide broker defaults, one broker, or a topic | the topic exists |
//! | [`ScramCredentialChanged`](MetadataRecord::ScramCredentialChanged) | a user's SCRAM credential of one mechanism set (salted, never the password) or removed | none (a removal of none is a no-op) |
//! | [`AclCreated`](MetadataRecord::AclCreated) / [`AclDeleted`](MetadataRecord::AclDeleted) | one ACL binding added / removed | none (adding one twice or removing a missing one changes nothing) |

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

/// A user's SCRAM credential for one mechanism (RFC 5802): what the
/// server keeps instead of the password. Bytes are base64 in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScramCredential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    /// H(ClientKey), ClientKey = HMAC(SaltedPassword, "Client Key").
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

/// One ACL as Kafka's CreateAcls names it (an `AclBinding`), in Kafka's
/// codes so that it passes through the protocol unchanged: resource type
/// (2 TOPIC, 3 GROUP, 4 CLUSTER, 5 TRANSACTIONAL_ID, 6 DELEGATION_TOKEN,
/// 7 USER), pattern type (3 LITERAL, 4 PREFIXED), operation (2 ALL, 3 READ,
/// 4 WRITE, 5 CREATE, 6 DELETE, 7 ALTER, 8 DESCRIBE, 9 CLUSTER_ACTION,
/// 10 DESCRIBE_CONFIGS, 11 ALTER_CONFIGS, 12 IDEMPOTENT_WRITE,
/// 13 CREATE_TOKENS, 14 DESCRIBE_TOKENS), permission (2 DENY, 3 ALLOW).
/// The principal is `Type:name` (`User:alice`, `User:*`), the host an IP
/// address or `*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: i8,
    pub resource_name: String,
    pub pattern_type: i8,
    pub principal: String,
    pub host: String,
    pub operation: i8,
    pub permission_type: i8,
}

/// Serde of byte strings as base64 text.
mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
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

/// A partition's replica set with the reassignment in progress, if any
/// (KIP-455): `replicas` holds the target replicas followed by those
/// being removed; `adding_replicas` are target replicas not yet in the
/// original set, `removing_replicas` original ones not in the target.
/// Without a reassignment both lists are empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaAssignment {
    pub replicas: Vec<BrokerId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding_replicas: Vec<BrokerId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing_replicas: Vec<BrokerId>,
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
    BrokerUnregistered {
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
        /// The new replica set, when it changes (a reassignment starts,
        /// completes or is cancelled); `None` keeps the current one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        assignment: Option<ReplicaAssignment>,
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
    ScramCredentialChanged {
        user: String,
        /// `SCRAM-SHA-256` or `SCRAM-SHA-512`.
        mechanism: String,
        /// `None` removes it.
        credential: Option<ScramCredential>,
    },
    AclCreated {
        binding: AclBinding,
    },
    AclDeleted {
        binding: AclBinding,
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
            Self::BrokerUnregistered { broker_id, .. } => {
                write!(f, "BrokerUnregistered({broker_id})")
            }
            Self::TopicCreated { name, topic_id, .. } => {
                write!(f, "TopicCreated({name}, {topic_id})")
            }
            Self::PartitionCreated {
                topic_id,
                partition,
                leader,
                ..
            } => write!(
                f,
                "PartitionCreated({topic_id}-{partition}, leader {leader})"
            ),
            Self::PartitionChanged {
                topic_id,
                partition,
                leader,
                leader_epoch,
                partition_epoch,
                isr,
                assignment,
            } => {
                write!(
                    f,
                    "PartitionChanged({topic_id}-{partition}, leader {leader}, leader_epoch {leader_epoch}, isr {isr:?}, partition_epoch {partition_epoch}"
                )?;
                if let Some(a) = assignment {
                    write!(
                        f,
                        ", replicas {:?}, adding {:?}, removing {:?}",
                        a.replicas, a.adding_replicas, a.removing_replicas
                    )?;
                }
                write!(f, ")")
            }
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
            Self::ConfigChanged {
                resource,
                name,
                value,
            } => {
                write!(f, "ConfigChanged({resource:?}, {name}={value:?})")
            }
            Self::ScramCredentialChanged {
                user,
                mechanism,
                credential,
            } => write!(
                f,
                "ScramCredentialChanged({user}, {mechanism}, {})",
                if credential.is_some() {
                    "set"
                } else {
                    "removed"
                }
            ),
            Self::AclCreated { binding } => write!(f, "AclCreated({binding:?})"),
            Self::AclDeleted { binding } => write!(f, "AclDeleted({binding:?})"),
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
