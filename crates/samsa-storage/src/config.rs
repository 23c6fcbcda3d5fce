//! Per-partition log settings (Kafka's topic-level `segment.*`, `retention.*`,
//! `index.interval.bytes`, `max.message.bytes`, `message.timestamp.type`,
//! `compression.type`) and the fsync policy.
//!
//! Defaults are Kafka's. The struct deserializes with missing fields taking
//! their defaults, so a config file only names what it changes.

use serde::{Deserialize, Serialize};

use crate::compression::CompressionType;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `segment.bytes`: a segment is rolled before an append would make it larger.
    pub segment_bytes: u64,
    /// `segment.ms`: a segment is rolled once its first batch is older than this.
    pub segment_ms: i64,
    /// `retention.bytes`: whole old segments are deleted while the log is larger; -1 = unlimited.
    pub retention_bytes: i64,
    /// `retention.ms`: segments whose newest timestamp is older are deleted; -1 = unlimited.
    pub retention_ms: i64,
    /// `index.interval.bytes`: bytes of batches between two offset-index entries.
    pub index_interval_bytes: u32,
    /// `max.message.bytes`: the largest record batch a producer may send.
    pub max_message_bytes: u32,
    /// When the produce path waits for fsync.
    pub flush: FlushPolicy,
    /// `producer.id.expiration.ms`: idempotence state of a producer silent this long is dropped.
    pub producer_id_expiration_ms: i64,
    /// `message.timestamp.type=LogAppendTime` when true, `CreateTime` when false.
    pub message_timestamp_type_log_append: bool,
    /// `compression.type`: the codec leader appends store (`producer`: the producer's).
    pub compression_type: CompressionType,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: 7 * 24 * 60 * 60 * 1000,
            retention_bytes: -1,
            retention_ms: 7 * 24 * 60 * 60 * 1000,
            index_interval_bytes: 4096,
            max_message_bytes: 1_048_588,
            flush: FlushPolicy::EveryAck,
            producer_id_expiration_ms: 86_400_000,
            message_timestamp_type_log_append: false,
            compression_type: CompressionType::Producer,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlushPolicy {
    /// fsync before acknowledging acks=all (group commit done by the broker; see
    /// `PartitionLog::flush_target`).
    EveryAck,
    /// Never fsync on the produce path; the OS writes back, and the broker
    /// fsyncs every `interval_ms` (0 = only on roll/shutdown).
    Interval { interval_ms: u64 },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn defaults_are_kafkas() {
        let c = LogConfig::default();
        assert_eq!(c.segment_bytes, 1 << 30);
        assert_eq!(c.segment_ms, 604_800_000);
        assert_eq!(c.retention_bytes, -1);
        assert_eq!(c.retention_ms, 604_800_000);
        assert_eq!(c.index_interval_bytes, 4096);
        assert_eq!(c.max_message_bytes, 1_048_588);
        assert_eq!(c.flush, FlushPolicy::EveryAck);
        assert_eq!(c.producer_id_expiration_ms, 86_400_000);
        assert!(!c.message_timestamp_type_log_append);
        assert_eq!(c.compression_type, CompressionType::Producer);
    }

    #[test]
    fn partial_json_takes_defaults_and_flush_policy_is_kebab_case() {
        let c: LogConfig = serde_json::from_str(
            r#"{"segment_bytes": 1000, "flush": {"interval": {"interval_ms": 50}}}"#,
        )
        .unwrap();
        assert_eq!(c.segment_bytes, 1000);
        assert_eq!(c.retention_ms, LogConfig::default().retention_ms);
        assert_eq!(c.flush, FlushPolicy::Interval { interval_ms: 50 });
        let every: FlushPolicy = serde_json::from_str(r#""every-ack""#).unwrap();
        assert_eq!(every, FlushPolicy::EveryAck);
        assert!(serde_json::from_str::<LogConfig>(r#"{"segment_byte": 1}"#).is_err());
        let zstd: LogConfig = serde_json::from_str(r#"{"compression_type": "zstd"}"#).unwrap();
        assert_eq!(zstd.compression_type, CompressionType::Zstd);
        assert!(serde_json::from_str::<LogConfig>(r#"{"compression_type": "ZSTD"}"#).is_err());
    }
}
