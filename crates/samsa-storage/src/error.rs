//! The one error type of the storage crate.
//!
//! Each variant maps to exactly one Kafka error code (noted on the variant), so
//! the broker can translate without looking inside messages. `Display` prints a
//! single line and never the chain of sources.

use std::path::{Path, PathBuf};

use crate::batch::BatchError;

#[derive(thiserror::Error, Debug)]
pub enum StorageError {
    /// Kafka `KAFKA_STORAGE_ERROR` (56).
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Kafka `CORRUPT_MESSAGE` (2).
    #[error("corrupt record batch: {0}")]
    CorruptRecord(#[from] BatchError),
    /// Kafka `INVALID_RECORD` (87).
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// Kafka `INVALID_RECORD` (87) for records without a key in a compacted
    /// log, with the index of each such record in its batch (KIP-467's
    /// `record_errors`, which clients use to fail only those records).
    #[error("{} record(s) without a key (indexes {record_indexes:?} of the batch); a compacted topic cannot accept records without a key", record_indexes.len())]
    KeylessRecords { record_indexes: Vec<i32> },
    /// Kafka `MESSAGE_TOO_LARGE` (10).
    #[error("record batch of {size} bytes exceeds max.message.bytes {max}")]
    RecordTooLarge { size: usize, max: u32 },
    /// Kafka `MESSAGE_TOO_LARGE` (10): a compressed batch whose records
    /// inflate beyond `compression::decompression_limit`.
    #[error("record batch decompresses to more than {limit} bytes")]
    DecompressedTooLarge { limit: usize },
    /// Kafka `UNKNOWN_SERVER_ERROR` (-1): the topic's codec failed to
    /// compress records that did decompress (an encoder error, not the data's fault).
    #[error("cannot compress records with {codec}: {reason}")]
    Compression { codec: &'static str, reason: String },
    /// Kafka `OUT_OF_ORDER_SEQUENCE_NUMBER` (45).
    #[error(
        "out of order sequence for producer {producer_id}: expected {expected}, found {found}"
    )]
    OutOfOrderSequence {
        producer_id: i64,
        expected: i32,
        found: i32,
    },
    /// Kafka `INVALID_PRODUCER_EPOCH` (47).
    #[error("producer {producer_id} epoch {found} is older than current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        current: i16,
        found: i16,
    },
    /// Kafka `TRANSACTION_COORDINATOR_FENCED` (52): a transaction marker from a
    /// coordinator older than the last one that wrote a marker for the producer.
    #[error(
        "transaction marker for producer {producer_id} from coordinator epoch {found}, older than {current}"
    )]
    TransactionCoordinatorFenced {
        producer_id: i64,
        current: i32,
        found: i32,
    },
    /// Kafka `OFFSET_OUT_OF_RANGE` (1).
    #[error("offset {offset} out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    /// Kafka `KAFKA_STORAGE_ERROR` (56): the files disagree with themselves in a
    /// way recovery did not (or could not) repair.
    #[error("log directory {0} is corrupt: {1}")]
    Corrupt(PathBuf, String),
    /// Kafka `UNKNOWN_SERVER_ERROR` (-1), what Kafka answers for an illegal
    /// state: a high watermark above the log end offset, which no replica can
    /// have committed. Refused, not clamped: it is the caller's bug.
    #[error(
        "high watermark {high_watermark} is beyond the log end offset {log_end_offset} of {dir}"
    )]
    HighWatermarkBeyondLogEnd {
        dir: PathBuf,
        high_watermark: i64,
        log_end_offset: i64,
    },
    /// Kafka `UNKNOWN_SERVER_ERROR` (-1), as Kafka answers an append at an
    /// invalid offset: batches that do not continue the segment's offsets
    /// (a gap, an overlap, or a last offset before the base). Nothing is written.
    #[error(
        "append of offsets {base_offset}..={last_offset} to {path}, which continues at {expected}"
    )]
    OffsetsOutOfOrder {
        path: PathBuf,
        base_offset: i64,
        last_offset: i64,
        expected: i64,
    },
    /// Kafka `UNKNOWN_SERVER_ERROR` (-1): the log's offsets broke one of the
    /// orderings its module docs promise (log start <= LSO <= HW <= LEO,
    /// recovery point <= LEO, the active segment ending at the LEO) after an
    /// operation; the operation reports it instead of leaving it unseen.
    #[error("offsets of {dir} are inconsistent: {reason}")]
    OffsetsInconsistent { dir: PathBuf, reason: String },
}

impl StorageError {
    /// Whether the error says the log broke its own invariants (a bug), as
    /// opposed to bad input, a refused request or a failing disk.
    pub fn is_invariant_violation(&self) -> bool {
        matches!(
            self,
            StorageError::HighWatermarkBeyondLogEnd { .. }
                | StorageError::OffsetsOutOfOrder { .. }
                | StorageError::OffsetsInconsistent { .. }
        )
    }

    /// Whether this is an out-of-order batch whose sequence lies ahead of
    /// the expected one (batches before it are missing), as opposed to one
    /// behind it (an old retry). Sequences wrap from `i32::MAX` to 0; a
    /// distance of less than half the range forward counts as ahead.
    pub fn is_sequence_gap(&self) -> bool {
        const RANGE: i64 = i32::MAX as i64 + 1;
        match *self {
            StorageError::OutOfOrderSequence {
                expected, found, ..
            } => {
                let forward = (i64::from(found) - i64::from(expected)).rem_euclid(RANGE);
                forward > 0 && forward < RANGE / 2
            }
            _ => false,
        }
    }
}

/// Attaches the path an I/O error happened on.
pub(crate) trait IoContext<T> {
    fn at(self, path: &Path) -> Result<T, StorageError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &Path) -> Result<T, StorageError> {
        self.map_err(|source| StorageError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::StorageError;

    fn out_of_order(expected: i32, found: i32) -> StorageError {
        StorageError::OutOfOrderSequence {
            producer_id: 1,
            expected,
            found,
        }
    }

    #[test]
    fn a_sequence_gap_is_a_batch_ahead_of_the_expected_one_across_the_wrap() {
        assert!(out_of_order(5, 13).is_sequence_gap());
        assert!(out_of_order(i32::MAX - 2, 4).is_sequence_gap());
        assert!(!out_of_order(13, 5).is_sequence_gap());
        assert!(!out_of_order(3, i32::MAX - 1).is_sequence_gap());
        assert!(!out_of_order(5, 5).is_sequence_gap());
        assert!(!StorageError::InvalidRecord("x".into()).is_sequence_gap());
    }
}
