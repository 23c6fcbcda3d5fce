//! samsa-storage: the partition log.
//!
//! A [`PartitionLog`] owns one partition directory: segments of Kafka
//! RecordBatch v2 bytes with sparse offset and time indexes and an index of
//! aborted transactions, idempotent and transactional producer state with
//! snapshots, a checkpoint of log start / recovery point /
//! high watermark, and crash recovery. Everything is synchronous `std::fs`; no
//! networking and no async. The broker wraps each log in a mutex and does
//! group-commit fsyncs outside it ([`PartitionLog::flush_target`]).
//!
//! Module map: [`batch`] (v2 framing, CRC, transaction markers),
//! [`cleaner`] (compaction: the offset map and what a pass keeps),
//! [`compression`] (codecs and the topic's `compression.type`), [`config`],
//! [`log`] (the log and recovery), [`producer_state`] (idempotence and
//! ongoing transactions), [`txn_index`] (aborted transactions per segment;
//! public for its file reader), and private `segment`, `index`, `scan`
//! (sequential batch scanning) and `fsutil` (atomic file replacement).

pub mod batch;
pub mod cleaner;
pub mod compression;
pub mod config;
mod error;
mod fsutil;
mod index;
pub mod log;
pub mod open_files;
pub mod producer_state;
pub mod record_time;
mod scan;
mod segment;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod txn_index;

pub use batch::{BatchError, BatchHeader, EndTxnMarker};
pub use compression::CompressionType;
pub use config::{CleanupPolicy, FlushPolicy, LogConfig};
pub use error::StorageError;
pub use fsutil::replace_file_durably;
pub use log::{AppendInfo, FlushTarget, PartitionLog, ReadResult, RecoveryReport};
pub use producer_state::{ProducerDescription, ProducerStateEntry, ProducerStateManager};
pub use txn_index::AbortedTxn;
