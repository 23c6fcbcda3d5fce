//! Per-partition log settings (Kafka's topic-level `segment.*`, `retention.*`,
//! `index.interval.bytes`, `max.message.bytes`, `message.timestamp.type`,
//! `compression.type`, `cleanup.policy` and the compaction settings) and the
//! fsync policy.
//!
//! Defaults are Kafka's. The struct deserializes with missing fields taking
//! their defaults, so a config file only names what it changes.

use serde::{Deserialize, Serialize};

use crate::compression::CompressionType;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `cleanup.policy`: whether retention deletes old segments, the cleaner
    /// compacts them, or both.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone (and a transaction
    /// marker whose records are gone) stays after the cleaner first passes it.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`: the share of the cleanable log not yet
    /// compacted above which the cleaner takes the log.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: a record stays uncompacted at least this long.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a record is compacted at the latest this long
    /// after it was written, whatever the dirty ratio (and the active
    /// segment rolls by then, so it can be).
    pub max_compaction_lag_ms: i64,
}

/// Kafka's `cleanup.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CleanupPolicy {
    #[default]
    Delete,
    Compact,
    /// `compact,delete`: compacted, and old segments deleted by retention too.
    CompactDelete,
}

impl CleanupPolicy {
    /// Kafka's list syntax: `delete`, `compact`, or both in either order.
    pub fn parse(value: &str) -> Option<CleanupPolicy> {
        let mut compact = false;
        let mut delete = false;
        for item in value.split(',').map(str::trim) {
            match item {
                "compact" => compact = true,
                "delete" => delete = true,
                _ => return None,
            }
        }
        match (compact, delete) {
            (true, true) => Some(CleanupPolicy::CompactDelete),
            (true, false) => Some(CleanupPolicy::Compact),
            (false, true) => Some(CleanupPolicy::Delete),
            (false, false) => None,
        }
    }

    /// The value as Kafka lists it.
    pub fn name(self) -> &'static str {
        match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::CompactDelete => "compact,delete",
        }
    }

    pub fn compacts(self) -> bool {
        matches!(self, CleanupPolicy::Compact | CleanupPolicy::CompactDelete)
    }

    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::CompactDelete)
    }
}

impl LogConfig {
    /// The age at which the active segment rolls: `segment.ms`, or sooner
    /// when `max.compaction.lag.ms` needs its records compacted (Kafka's rule).
    pub fn roll_after_ms(&self) -> i64 {
        if self.cleanup_policy.compacts() && self.max_compaction_lag_ms > 0 {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        }
    }
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
            cleanup_policy: CleanupPolicy::Delete,
            delete_retention_ms: 86_400_000,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
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
        assert_eq!(c.cleanup_policy, CleanupPolicy::Delete);
        assert_eq!(c.delete_retention_ms, 86_400_000);
        assert_eq!(c.min_cleanable_dirty_ratio, 0.5);
        assert_eq!(
            (c.min_compaction_lag_ms, c.max_compaction_lag_ms),
            (0, i64::MAX)
        );
        assert_eq!(c.roll_after_ms(), c.segment_ms);
    }

    #[test]
    fn cleanup_policy_parses_kafkas_lists() {
        for (text, policy) in [
            ("delete", CleanupPolicy::Delete),
            ("compact", CleanupPolicy::Compact),
            ("compact,delete", CleanupPolicy::CompactDelete),
            ("delete, compact", CleanupPolicy::CompactDelete),
        ] {
            assert_eq!(CleanupPolicy::parse(text), Some(policy), "{text}");
        }
        assert_eq!(
            CleanupPolicy::parse(CleanupPolicy::CompactDelete.name()),
            Some(CleanupPolicy::CompactDelete)
        );
        for bad in ["", "compacted", "delete,,compact", "none"] {
            assert_eq!(CleanupPolicy::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn max_compaction_lag_rolls_a_compacted_log_sooner() {
        let c = LogConfig {
            cleanup_policy: CleanupPolicy::Compact,
            max_compaction_lag_ms: 60_000,
            ..LogConfig::default()
        };
        assert_eq!(c.roll_after_ms(), 60_000);
        let deleting = LogConfig {
            cleanup_policy: CleanupPolicy::Delete,
            ..c.clone()
        };
        assert_eq!(deleting.roll_after_ms(), deleting.segment_ms);
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
