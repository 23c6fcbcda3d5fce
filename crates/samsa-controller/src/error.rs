//! `ControllerError`: every way a controller request can fail, and the one
//! place where those failures become Kafka error codes
//! ([`ControllerError::kafka_error`]).
//!
//! The codes themselves come from the same table the broker answers with,
//! `kafka_protocol::error::ResponseError`, so no code number is written in
//! samsa: a controller answer and a broker answer for the same failure carry
//! the same code by construction.
//!
//! `Display` gives a one-line message without the cause chain; the cause, when
//! there is one, is logged where the error is produced.

pub use kafka_protocol::error::ResponseError;
use uuid::Uuid;

use crate::records::BrokerId;

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
    #[error("no partition reassignment is in progress")]
    NoReassignmentInProgress,
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// An error received from a controller whose code has no variant here.
    #[error("controller error {code}: {message}")]
    Remote { code: i16, message: String },
}

impl ControllerError {
    /// The Kafka error for this failure.
    pub fn kafka_error(&self) -> ResponseError {
        use ResponseError as E;
        match self {
            Self::NotController { .. } => E::NotController,
            Self::BrokerIdNotRegistered(_) => E::BrokerIdNotRegistered,
            Self::StaleBrokerEpoch { .. } => E::StaleBrokerEpoch,
            Self::DuplicateBrokerRegistration(_) => E::DuplicateBrokerRegistration,
            Self::InconsistentClusterId { .. } => E::InconsistentClusterId,
            Self::TopicAlreadyExists(_) => E::TopicAlreadyExists,
            Self::UnknownTopic(_) | Self::UnknownPartition { .. } => E::UnknownTopicOrPartition,
            Self::UnknownTopicId(_) => E::UnknownTopicId,
            Self::InvalidTopic(_) => E::InvalidTopicException,
            Self::InvalidPartitions(_) => E::InvalidPartitions,
            Self::InvalidReplicationFactor(_) => E::InvalidReplicationFactor,
            Self::InvalidReplicaAssignment(_) => E::InvalidReplicaAssignment,
            Self::InvalidConfig(_) => E::InvalidConfig,
            Self::InvalidRequest(_) => E::InvalidRequest,
            Self::NotLeader { .. } => E::NotLeaderOrFollower,
            Self::FencedLeaderEpoch { .. } => E::FencedLeaderEpoch,
            Self::InvalidUpdateVersion { .. } => E::InvalidUpdateVersion,
            Self::IneligibleReplica(_) => E::IneligibleReplica,
            Self::PreferredLeaderNotAvailable => E::PreferredLeaderNotAvailable,
            Self::EligibleLeadersNotAvailable => E::EligibleLeadersNotAvailable,
            Self::ElectionNotNeeded => E::ElectionNotNeeded,
            Self::NoReassignmentInProgress => E::NoReassignmentInProgress,
            Self::Timeout(_) => E::RequestTimedOut,
            Self::Internal(_) => E::UnknownServerError,
            // A code received over the wire, kept as it came (`Unknown` for
            // a code kafka-protocol does not name).
            Self::Remote { code, .. } => {
                ResponseError::try_from_code(*code).unwrap_or(E::Unknown(*code))
            }
        }
    }

    /// The Kafka error code for this failure, as it goes on the wire.
    pub fn code(&self) -> i16 {
        self.kafka_error().code()
    }

    /// Rebuilds an error from a code and message received over the wire (the
    /// client side of [`ControllerError::code`]). Codes without a dedicated
    /// variant come back as [`ControllerError::Internal`] carrying the message.
    pub fn from_code(code: i16, message: String, leader: Option<LeaderHint>) -> Self {
        use ResponseError as E;
        match ResponseError::try_from_code(code) {
            Some(E::NotController) => Self::NotController { leader },
            Some(E::TopicAlreadyExists) => Self::TopicAlreadyExists(message),
            Some(E::UnknownTopicOrPartition) => Self::UnknownTopic(message),
            Some(E::InvalidTopicException) => Self::InvalidTopic(message),
            Some(E::InvalidPartitions) => Self::InvalidPartitions(message),
            Some(E::InvalidReplicationFactor) => Self::InvalidReplicationFactor(message),
            Some(E::InvalidReplicaAssignment) => Self::InvalidReplicaAssignment(message),
            Some(E::InvalidConfig) => Self::InvalidConfig(message),
            Some(E::InvalidRequest) => Self::InvalidRequest(message),
            Some(E::IneligibleReplica) => Self::IneligibleReplica(message),
            Some(E::PreferredLeaderNotAvailable) => Self::PreferredLeaderNotAvailable,
            Some(E::EligibleLeadersNotAvailable) => Self::EligibleLeadersNotAvailable,
            Some(E::ElectionNotNeeded) => Self::ElectionNotNeeded,
            Some(E::NoReassignmentInProgress) => Self::NoReassignmentInProgress,
            Some(E::RequestTimedOut) => Self::Timeout(message),
            // NONE (`None`) never reaches here: callers only rebuild failures.
            _ => Self::Remote { code, message },
        }
    }
}
