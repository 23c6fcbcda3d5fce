//! `ControllerError`: every way a controller request can fail, and the one
//! place where those failures become Kafka error codes ([`ControllerError::code`]).
//!
//! `Display` gives a one-line message without the cause chain; the cause, when
//! there is one, is logged where the error is produced.

use crate::records::BrokerId;
use uuid::Uuid;

/// Kafka error codes the controller answers with (values from the Kafka protocol).
pub mod codes {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_PARTITIONS: i16 = 37;
    pub const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub const INVALID_CONFIG: i16 = 40;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const INVALID_REQUEST: i16 = 42;
    pub const FENCED_LEADER_EPOCH: i16 = 74;
    pub const STALE_BROKER_EPOCH: i16 = 77;
    pub const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    pub const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;
    pub const ELECTION_NOT_NEEDED: i16 = 84;
    pub const INVALID_UPDATE_VERSION: i16 = 95;
    pub const UNKNOWN_TOPIC_ID: i16 = 100;
    pub const DUPLICATE_BROKER_REGISTRATION: i16 = 101;
    pub const BROKER_ID_NOT_REGISTERED: i16 = 102;
    pub const INCONSISTENT_CLUSTER_ID: i16 = 104;
    pub const INELIGIBLE_REPLICA: i16 = 107;
}

/// Where the Raft leader is, as far as this node knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderHint {
    pub node_id: u64,
    /// gRPC address of the leader (`host:port`).
    pub address: String,
}

/// Failure of a controller request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControllerError {
    #[error("this node is not the active controller")]
    NotController { leader: Option<LeaderHint> },
    #[error("broker {0} is not registered")]
    BrokerIdNotRegistered(BrokerId),
    #[error("broker {broker_id} epoch {got} is stale (current {current})")]
    StaleBrokerEpoch {
        broker_id: BrokerId,
        got: i64,
        current: i64,
    },
    #[error("broker {0} is registered by another live incarnation")]
    DuplicateBrokerRegistration(BrokerId),
    #[error("cluster id {got} does not match this cluster ({expected})")]
    InconsistentClusterId { expected: String, got: String },
    #[error("topic {0} already exists")]
    TopicAlreadyExists(String),
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("unknown topic id {0}")]
    UnknownTopicId(Uuid),
    #[error("unknown partition {topic}-{partition}")]
    UnknownPartition { topic: String, partition: i32 },
    #[error("invalid topic name: {0}")]
    InvalidTopic(String),
    #[error("invalid partitions: {0}")]
    InvalidPartitions(String),
    #[error("invalid replication factor: {0}")]
    InvalidReplicationFactor(String),
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("broker {broker_id} is not the leader of the partition (leader is {leader})")]
    NotLeader {
        broker_id: BrokerId,
        leader: BrokerId,
    },
    #[error("leader epoch {got} is fenced (current {current})")]
    FencedLeaderEpoch { got: i32, current: i32 },
    #[error("partition epoch {got} is stale (current {current})")]
    InvalidUpdateVersion { got: i32, current: i32 },
    #[error("ineligible replica: {0}")]
    IneligibleReplica(String),
    #[error("preferred leader is not available")]
    PreferredLeaderNotAvailable,
    #[error("no eligible leader is available")]
    EligibleLeadersNotAvailable,
    #[error("election not needed")]
    ElectionNotNeeded,
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// An error received from a controller whose code has no variant here.
    #[error("controller error {code}: {message}")]
    Remote { code: i16, message: String },
}

impl ControllerError {
    /// The Kafka error code for this failure.
    pub fn code(&self) -> i16 {
        use codes::*;
        match self {
            Self::NotController { .. } => NOT_CONTROLLER,
            Self::BrokerIdNotRegistered(_) => BROKER_ID_NOT_REGISTERED,
            Self::StaleBrokerEpoch { .. } => STALE_BROKER_EPOCH,
            Self::DuplicateBrokerRegistration(_) => DUPLICATE_BROKER_REGISTRATION,
            Self::InconsistentClusterId { .. } => INCONSISTENT_CLUSTER_ID,
            Self::TopicAlreadyExists(_) => TOPIC_ALREADY_EXISTS,
            Self::UnknownTopic(_) | Self::UnknownPartition { .. } => UNKNOWN_TOPIC_OR_PARTITION,
            Self::UnknownTopicId(_) => UNKNOWN_TOPIC_ID,
            Self::InvalidTopic(_) => INVALID_TOPIC_EXCEPTION,
            Self::InvalidPartitions(_) => INVALID_PARTITIONS,
            Self::InvalidReplicationFactor(_) => INVALID_REPLICATION_FACTOR,
            Self::InvalidReplicaAssignment(_) => INVALID_REPLICA_ASSIGNMENT,
            Self::InvalidConfig(_) => INVALID_CONFIG,
            Self::InvalidRequest(_) => INVALID_REQUEST,
            Self::NotLeader { .. } => NOT_LEADER_OR_FOLLOWER,
            Self::FencedLeaderEpoch { .. } => FENCED_LEADER_EPOCH,
            Self::InvalidUpdateVersion { .. } => INVALID_UPDATE_VERSION,
            Self::IneligibleReplica(_) => INELIGIBLE_REPLICA,
            Self::PreferredLeaderNotAvailable => PREFERRED_LEADER_NOT_AVAILABLE,
            Self::EligibleLeadersNotAvailable => ELIGIBLE_LEADERS_NOT_AVAILABLE,
            Self::ElectionNotNeeded => ELECTION_NOT_NEEDED,
            Self::Timeout(_) => REQUEST_TIMED_OUT,
            Self::Internal(_) => UNKNOWN_SERVER_ERROR,
            Self::Remote { code, .. } => *code,
        }
    }

    /// Rebuilds an error from a code and message received over the wire (the
    /// client side of [`ControllerError::code`]). Codes without a dedicated
    /// variant come back as [`ControllerError::Internal`] carrying the message.
    pub fn from_code(code: i16, message: String, leader: Option<LeaderHint>) -> Self {
        use codes::*;
        match code {
            NOT_CONTROLLER => Self::NotController { leader },
            TOPIC_ALREADY_EXISTS => Self::TopicAlreadyExists(message),
            UNKNOWN_TOPIC_OR_PARTITION => Self::UnknownTopic(message),
            INVALID_TOPIC_EXCEPTION => Self::InvalidTopic(message),
            INVALID_PARTITIONS => Self::InvalidPartitions(message),
            INVALID_REPLICATION_FACTOR => Self::InvalidReplicationFactor(message),
            INVALID_REPLICA_ASSIGNMENT => Self::InvalidReplicaAssignment(message),
            INVALID_CONFIG => Self::InvalidConfig(message),
            INVALID_REQUEST => Self::InvalidRequest(message),
            INELIGIBLE_REPLICA => Self::IneligibleReplica(message),
            PREFERRED_LEADER_NOT_AVAILABLE => Self::PreferredLeaderNotAvailable,
            ELIGIBLE_LEADERS_NOT_AVAILABLE => Self::EligibleLeadersNotAvailable,
            ELECTION_NOT_NEEDED => Self::ElectionNotNeeded,
            REQUEST_TIMED_OUT => Self::Timeout(message),
            _ => Self::Remote { code, message },
            // NONE never reaches here: callers only rebuild failures.
        }
    }
}
