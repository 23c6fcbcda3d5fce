//! The one place where internal errors become Kafka error codes.
//!
//! Handlers return typed errors; the protocol edge asks the `*_error_code`
//! functions here for the code a real Kafka broker would answer. Controller
//! failures (cluster mode) arrive as [`ControllerError`]s, whose codes come
//! from the same `ResponseError` table, and become [`MetadataError`]s here
//! ([`controller_error`]). `Display` of these errors is a single
//! line meant for logs and `error_message` fields.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use samsa_controller::ControllerError;
use samsa_storage::StorageError;

/// Errors that stop the broker process.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open partition {partition}: {source}")]
    OpenPartition {
        partition: String,
        #[source]
        source: StorageError,
    },
    #[error("metadata: {0}")]
    Metadata(#[from] MetadataError),
    /// A configuration that cannot work (said in one line, with the fix).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Cluster mode could not start or keep running (quorum unreachable,
    /// another cluster's data, duplicate node id, …).
    #[error("{0}")]
    Cluster(String),
    #[error("i/o error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error(
        "another process is using this data directory (it holds {}); stop it, or give this \
         broker another data_dir",
        path.display()
    )]
    DataDirInUse { path: std::path::PathBuf },
}

/// Errors of the metadata store (single-node file store, or the controller
/// quorum in cluster mode).
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// No active controller answered in time (quorum lost, election in
    /// progress): retriable, answered as REQUEST_TIMED_OUT.
    #[error("controller quorum unavailable: {0}")]
    ControllerUnavailable(String),
    /// The controller refused the change with this Kafka error.
    #[error("{message}")]
    Rejected {
        error: ResponseError,
        message: String,
    },
    #[error("topic '{0}' already exists")]
    TopicAlreadyExists(String),
    #[error("unknown topic '{0}'")]
    UnknownTopic(String),
    #[error("invalid topic name '{name}': {reason}")]
    InvalidTopic { name: String, reason: String },
    #[error("invalid partition count {count}: {reason}")]
    InvalidPartitions { count: i32, reason: String },
    #[error("replication factor {requested} larger than available brokers {available}")]
    InvalidReplicationFactor { requested: i16, available: usize },
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("invalid config {key}={value}: {reason}")]
    InvalidConfig {
        key: String,
        value: String,
        reason: String,
    },
    #[error("metadata store i/o error on {path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata store file {path} is corrupt: {reason}")]
    Corrupt {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// Why an operation on a partition failed.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    /// The partition was closed (topic deleted or broker shutting down).
    #[error("partition {0} is closed")]
    Closed(String),
    /// The replica's role changed under the caller: a leader append after
    /// losing leadership (or the epoch it was admitted under), or a follower
    /// applying a fetch answer of an epoch it no longer follows.
    #[error("partition {partition} is no longer {role} in leader epoch {leader_epoch}")]
    RoleChanged {
        partition: String,
        role: &'static str,
        leader_epoch: i32,
    },
    #[error("{0}")]
    Storage(#[from] StorageError),
    #[error("fsync failed: {0}")]
    Flush(std::io::Error),
    /// A transactional batch of a producer whose transaction on this
    /// partition was not verified with its coordinator (KIP-890), or whose
    /// verification was used up by a marker meanwhile.
    #[error("partition {partition}: producer {producer_id} epoch {producer_epoch} has no verified transaction here")]
    TxnNotVerified {
        partition: String,
        producer_id: i64,
        producer_epoch: i16,
    },
}

/// Kafka error code for a storage error. A broken storage invariant (a bug,
/// see [`StorageError::is_invariant_violation`]) is answered
/// UNKNOWN_SERVER_ERROR, as Kafka answers an illegal state, and logged here
/// at error level, so that no such answer goes unseen.
pub fn storage_error_code(error: &StorageError) -> ResponseError {
    if error.is_invariant_violation() {
        tracing::error!(error = %error, "storage invariant violated; answering UNKNOWN_SERVER_ERROR");
    }
    match error {
        StorageError::CorruptRecord(_) => ResponseError::CorruptMessage,
        StorageError::InvalidRecord(_) | StorageError::KeylessRecords { .. } => {
            ResponseError::InvalidRecord
        }
        StorageError::RecordTooLarge { .. } | StorageError::DecompressedTooLarge { .. } => {
            ResponseError::MessageTooLarge
        }
        StorageError::Compression { .. } => ResponseError::UnknownServerError,
        StorageError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
        StorageError::InvalidProducerEpoch { .. } => ResponseError::InvalidProducerEpoch,
        StorageError::TransactionCoordinatorFenced { .. } => {
            ResponseError::TransactionCoordinatorFenced
        }
        StorageError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        StorageError::Io { .. } | StorageError::Corrupt(..) => ResponseError::KafkaStorageError,
        StorageError::HighWatermarkBeyondLogEnd { .. }
        | StorageError::OffsetsOutOfOrder { .. }
        | StorageError::OffsetsInconsistent { .. } => ResponseError::UnknownServerError,
    }
}

/// Kafka error code for a failed operation on a hosted partition.
pub fn partition_error_code(error: &PartitionError) -> ResponseError {
    match error {
        PartitionError::Storage(e) => storage_error_code(e),
        PartitionError::Closed(_) | PartitionError::RoleChanged { .. } => {
            ResponseError::NotLeaderOrFollower
        }
        PartitionError::Flush(_) => ResponseError::KafkaStorageError,
        PartitionError::TxnNotVerified { .. } => ResponseError::InvalidTxnState,
    }
}

/// A partition's answer to a write it refused or could not acknowledge:
/// the code, and the message for the versions that carry one.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: ResponseError,
    pub message: String,
    /// Produce only: the records of the batch that caused the refusal, by
    /// index, with why (KIP-467 `record_errors`); empty when the whole
    /// batch is at fault.
    pub record_errors: Vec<(i32, String)>,
}

impl Refusal {
    pub fn new(code: ResponseError, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
            record_errors: Vec::new(),
        }
    }

    /// The refusal of a produce append that failed with `error`.
    pub fn of_storage(code: ResponseError, error: &StorageError) -> Self {
        let mut refusal = Refusal::new(code, error.to_string());
        if let StorageError::KeylessRecords { record_indexes } = error {
            refusal.record_errors = record_indexes
                .iter()
                .map(|&i| {
                    (
                        i,
                        "Compacted topic cannot accept message without key".to_owned(),
                    )
                })
                .collect();
        }
        refusal
    }
}

/// Kafka error code for a metadata error.
pub fn metadata_error_code(error: &MetadataError) -> ResponseError {
    match error {
        MetadataError::TopicAlreadyExists(_) => ResponseError::TopicAlreadyExists,
        MetadataError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
        MetadataError::InvalidTopic { .. } => ResponseError::InvalidTopicException,
        MetadataError::InvalidPartitions { .. } => ResponseError::InvalidPartitions,
        MetadataError::InvalidReplicationFactor { .. } => ResponseError::InvalidReplicationFactor,
        MetadataError::InvalidReplicaAssignment(_) => ResponseError::InvalidReplicaAssignment,
        MetadataError::InvalidConfig { .. } => ResponseError::InvalidConfig,
        MetadataError::Io { .. } | MetadataError::Corrupt { .. } => {
            ResponseError::UnknownServerError
        }
        MetadataError::ControllerUnavailable(_) => ResponseError::RequestTimedOut,
        MetadataError::Rejected { error, .. } => *error,
    }
}

/// A controller's failure of a metadata change to `topic` (cluster mode), as
/// the broker answers it: the topic errors by name, the retriable ones
/// (no leader, commit timeout, controller unreachable) as
/// [`MetadataError::ControllerUnavailable`] with what to check (the quorum
/// `voters`, the `request_timeout` waited), everything else with the
/// controller's own error.
pub fn controller_error(
    e: ControllerError,
    topic: &str,
    voters: &str,
    request_timeout: Duration,
) -> MetadataError {
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
            "no active controller within {request_timeout:?}: the quorum {voters} has no leader \
             (is a majority of the controllers down?); retry later"
        )),
        ControllerError::Timeout(why) => MetadataError::ControllerUnavailable(format!(
            "the active controller did not commit the change within {request_timeout:?} \
             ({why}); it may still take effect"
        )),
        ControllerError::Internal(why) => MetadataError::ControllerUnavailable(format!(
            "cannot reach an active controller of {voters}: {why}"
        )),
        other => MetadataError::Rejected {
            error: other.kafka_error(),
            message: other.to_string(),
        },
    }
}

/// The transaction coordinator's answer when appending its record to
/// `__transaction_state` failed with `error` (the produce path's code), as
/// Kafka's coordinator answers: retriable unavailability becomes
/// COORDINATOR_NOT_AVAILABLE, lost leadership NOT_COORDINATOR, size errors
/// UNKNOWN_SERVER_ERROR.
pub fn txn_append_error_code(error: ResponseError) -> ResponseError {
    match error {
        ResponseError::UnknownTopicOrPartition
        | ResponseError::NotEnoughReplicas
        | ResponseError::NotEnoughReplicasAfterAppend
        | ResponseError::RequestTimedOut => ResponseError::CoordinatorNotAvailable,
        ResponseError::NotLeaderOrFollower | ResponseError::KafkaStorageError => {
            ResponseError::NotCoordinator
        }
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => {
            ResponseError::UnknownServerError
        }
        other => other,
    }
}

/// KIP-588: a client speaking a version of the API older than
/// `first_version` does not know PRODUCER_FENCED and gets
/// INVALID_PRODUCER_EPOCH instead, which it handles the same way.
pub fn producer_fenced_for_version(
    error: Option<ResponseError>,
    version: i16,
    first_version: i16,
) -> Option<ResponseError> {
    match error {
        Some(ResponseError::ProducerFenced) if version < first_version => {
            Some(ResponseError::InvalidProducerEpoch)
        }
        other => other,
    }
}

/// The wire code of an outcome: 0 (NONE) for `None`, else the error's.
pub fn wire_code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |e| e.code())
}

/// The answer to a produce whose transactional batch could not be verified
/// with the transaction coordinator (KIP-890), for a Produce request of
/// `version`:
/// - the partition is not in the producer's transaction: TRANSACTION_ABORTABLE
///   for clients that know it (Produce v11+, KIP-890's "generic error"
///   version, as Kafka decides it), else INVALID_TXN_STATE;
/// - PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH, which every producer
///   handles as a fence;
/// - the coordinator could not answer (moved, loading, busy, unreachable):
///   NOT_ENOUGH_REPLICAS, which produce clients retry, as Kafka answers it;
/// - everything else as it came.
pub fn produce_verification_error(error: ResponseError, version: i16) -> ResponseError {
    match error {
        ResponseError::TransactionAbortable | ResponseError::InvalidTxnState => {
            if version >= 11 {
                ResponseError::TransactionAbortable
            } else {
                ResponseError::InvalidTxnState
            }
        }
        ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        ResponseError::NotCoordinator
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::ConcurrentTransactions
        | ResponseError::RequestTimedOut
        | ResponseError::NetworkException => ResponseError::NotEnoughReplicas,
        other => other,
    }
}

/// Whether a partition leader's answer to a transaction marker means "try
/// again (after looking up the leader again)" rather than "done" or "drop".
pub fn marker_error_is_retriable(error: ResponseError) -> bool {
    matches!(
        error,
        ResponseError::NotLeaderOrFollower
            | ResponseError::NotEnoughReplicas
            | ResponseError::NotEnoughReplicasAfterAppend
            | ResponseError::RequestTimedOut
            | ResponseError::KafkaStorageError
            | ResponseError::NetworkException
            | ResponseError::LeaderNotAvailable
            | ResponseError::UnknownServerError
            | ResponseError::CoordinatorLoadInProgress
    )
}

/// A failed `__consumer_offsets` append, as the group APIs answer it:
/// size errors are INVALID_COMMIT_OFFSET_SIZE, the rest as for
/// `__transaction_state` ([`txn_append_error_code`]).
pub fn commit_append_error(error: ResponseError) -> ResponseError {
    match error {
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => {
            ResponseError::InvalidCommitOffsetSize
        }
        other => txn_append_error_code(other),
    }
}

/// What a TxnOffsetCommit of `version` answers for a write error: the
/// transaction coordinator's verdicts as a producer of that version knows
/// them.
pub fn txn_offset_commit_error(
    error: Option<ResponseError>,
    version: i16,
) -> Option<ResponseError> {
    let error = match error {
        // Not in the transaction (v0–v4 verify only): the producer must abort.
        Some(ResponseError::TransactionAbortable | ResponseError::InvalidTxnState)
            if version < 5 =>
        {
            Some(ResponseError::InvalidTxnState)
        }
        // The verification call itself failed: retriable, as Kafka's group
        // coordinator answers it. CONCURRENT_TRANSACTIONS (markers of the
        // previous transaction in flight) goes back as it is: clients retry it.
        Some(ResponseError::NetworkException) => Some(ResponseError::CoordinatorLoadInProgress),
        other => other,
    };
    // KIP-588: TxnOffsetCommit knows PRODUCER_FENCED from v3; older
    // versions get INVALID_PRODUCER_EPOCH.
    producer_fenced_for_version(error, version, 3)
}

/// A numeric Kafka error code as sent over samsa's gRPC (0 = none).
pub fn grpc_code_to_error(code: i32) -> Option<ResponseError> {
    if code == 0 {
        return None;
    }
    Some(
        i16::try_from(code)
            .ok()
            .and_then(ResponseError::try_from_code)
            .unwrap_or(ResponseError::UnknownServerError),
    )
}

/// The numeric code samsa's gRPC carries for an outcome (0 = none).
pub fn grpc_error_code(error: Option<ResponseError>) -> i32 {
    error.map_or(0, |e| i32::from(e.code()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_failures_keep_their_kafka_code() {
        let code = |e: ControllerError| {
            metadata_error_code(&controller_error(
                e,
                "t",
                "1@h:9093",
                Duration::from_secs(1),
            ))
        };
        assert_eq!(
            code(ControllerError::TopicAlreadyExists("t".into())),
            ResponseError::TopicAlreadyExists
        );
        assert_eq!(
            code(ControllerError::UnknownTopicId(uuid::Uuid::nil())),
            ResponseError::UnknownTopicOrPartition
        );
        // No leader, a commit timeout and an unreachable controller are
        // retriable for the client.
        for retriable in [
            ControllerError::NotController { leader: None },
            ControllerError::Timeout("commit".into()),
            ControllerError::Internal("connection refused".into()),
        ] {
            assert_eq!(code(retriable), ResponseError::RequestTimedOut);
        }
        assert_eq!(
            code(ControllerError::InvalidReplicationFactor("3 > 1".into())),
            ResponseError::InvalidReplicationFactor
        );
        assert_eq!(
            code(ControllerError::Remote {
                code: ResponseError::PolicyViolation.code(),
                message: "no".into()
            }),
            ResponseError::PolicyViolation
        );
    }

    #[test]
    fn produce_verification_errors_follow_the_request_version() {
        use ResponseError as E;
        // Not in the transaction: TRANSACTION_ABORTABLE from Produce v11,
        // the first version whose clients know it.
        for (version, expected) in [
            (3, E::InvalidTxnState),
            (10, E::InvalidTxnState),
            (11, E::TransactionAbortable),
            (12, E::TransactionAbortable),
        ] {
            for coordinator in [E::InvalidTxnState, E::TransactionAbortable] {
                assert_eq!(
                    produce_verification_error(coordinator, version),
                    expected,
                    "Produce v{version}, coordinator answered {coordinator:?}"
                );
            }
        }
        assert_eq!(
            produce_verification_error(E::ProducerFenced, 12),
            E::InvalidProducerEpoch
        );
        for transient in [
            E::NotCoordinator,
            E::CoordinatorNotAvailable,
            E::CoordinatorLoadInProgress,
            E::ConcurrentTransactions,
            E::RequestTimedOut,
            E::NetworkException,
        ] {
            assert_eq!(
                produce_verification_error(transient, 10),
                E::NotEnoughReplicas
            );
        }
        assert_eq!(
            produce_verification_error(E::InvalidProducerIdMapping, 10),
            E::InvalidProducerIdMapping
        );
    }

    #[test]
    fn txn_offset_commit_errors_are_kafkas() {
        use ResponseError as E;
        // Markers of the previous transaction still in flight: passed on
        // for the client to retry (Kafka's group coordinator does the same).
        assert_eq!(
            txn_offset_commit_error(Some(E::ConcurrentTransactions), 3),
            Some(E::ConcurrentTransactions)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::CoordinatorLoadInProgress), 3),
            Some(E::CoordinatorLoadInProgress)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::NetworkException), 4),
            Some(E::CoordinatorLoadInProgress)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::TransactionAbortable), 4),
            Some(E::InvalidTxnState)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::TransactionAbortable), 5),
            Some(E::TransactionAbortable)
        );
        // KIP-588: PRODUCER_FENCED from v3, INVALID_PRODUCER_EPOCH before.
        assert_eq!(
            txn_offset_commit_error(Some(E::ProducerFenced), 2),
            Some(E::InvalidProducerEpoch)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::ProducerFenced), 3),
            Some(E::ProducerFenced)
        );
        assert_eq!(
            txn_offset_commit_error(Some(E::InvalidProducerIdMapping), 4),
            Some(E::InvalidProducerIdMapping)
        );
        assert_eq!(txn_offset_commit_error(None, 3), None);
    }

    #[test]
    fn broken_storage_invariants_are_unknown_server_errors() {
        let dir = std::path::PathBuf::from("/data/t-0");
        for error in [
            StorageError::HighWatermarkBeyondLogEnd {
                dir: dir.clone(),
                high_watermark: 10,
                log_end_offset: 5,
            },
            StorageError::OffsetsOutOfOrder {
                path: dir.join("00000000000000000000.log"),
                base_offset: 7,
                last_offset: 8,
                expected: 5,
            },
            StorageError::OffsetsInconsistent {
                dir: dir.clone(),
                reason: "the active segment ends at 4, the LEO is 5".into(),
            },
        ] {
            assert!(error.is_invariant_violation(), "{error}");
            assert_eq!(
                storage_error_code(&error),
                ResponseError::UnknownServerError,
                "{error}"
            );
        }
        // A corrupt file stays a storage error (the replica is unusable, the
        // client tries elsewhere), not a bug.
        let corrupt = StorageError::Corrupt(dir, "crc mismatch".into());
        assert!(!corrupt.is_invariant_violation());
        assert_eq!(
            storage_error_code(&corrupt),
            ResponseError::KafkaStorageError
        );
    }
}
