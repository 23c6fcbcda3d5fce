//! Kafka configs that change while the cluster runs: every topic config
//! samsa takes and the broker configs Kafka lets an operator change
//! without a restart, under Kafka's names. This module owns what each key
//! means (its parser is its validation and its effect), the values a
//! broker runs with ([`effective_broker_config`]: the static
//! [`BrokerConfig`] overlaid with the metadata's dynamic values), and a
//! topic's log settings ([`topic_log_config`]).
//!
//! Precedence is Kafka's, highest first: the topic's own value
//! (DYNAMIC_TOPIC_CONFIG), this broker's dynamic value
//! (DYNAMIC_BROKER_CONFIG), the cluster-wide dynamic default
//! (DYNAMIC_DEFAULT_BROKER_CONFIG), the static configuration
//! (STATIC_BROKER_CONFIG), the default (DEFAULT_CONFIG).
//!
//! Invariants:
//! - a value enters the metadata only after its key's parser accepted it
//!   ([`validate_topic_config`], [`validate_broker_config`]), so applying
//!   the metadata cannot fail; a value a parser refuses anyway (written by
//!   another version) is skipped with a warning, never half-applied;
//! - a topic config and the broker config behind it (`retention.ms` →
//!   `log.retention.ms`) share one parser: the same value is valid at both
//!   levels;
//! - dynamic values are applied in the same order on every node (cluster
//!   defaults, then the broker's own), so nodes with the same metadata and
//!   the same static file run with the same settings.

use std::collections::BTreeMap;

use samsa_storage::{CleanupPolicy, CompressionType, LogConfig};
use tracing::warn;

use crate::config::BrokerConfig;
use crate::coordinator::placement::{CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC};
use crate::error::MetadataError;
use crate::metadata::{MetadataView, TopicMetadata};

/// Kafka's `ConfigEntry.ConfigType` (DescribeConfigs v3+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Short = 4,
    Long = 5,
    Double = 6,
    List = 7,
}

/// What a dynamic broker key's value changes. Log keys change the defaults
/// every topic without its own value takes; broker keys change the
/// broker's own settings.
#[derive(Clone, Copy)]
enum Effect {
    Log(fn(&mut LogConfig, &str) -> Result<(), String>),
    Broker(fn(&mut BrokerConfig, &str) -> Result<(), String>),
}

/// A broker config that can change at run time.
pub struct DynamicBrokerKey {
    pub name: &'static str,
    effect: Effect,
}

fn long_at_least(value: &str, min: i64) -> Result<i64, String> {
    match value.trim().parse::<i64>() {
        Ok(v) if v >= min => Ok(v),
        Ok(_) => Err(format!("must be at least {min}")),
        Err(_) => Err("must be an integer".into()),
    }
}

fn int_at_least(value: &str, min: i64) -> Result<u32, String> {
    let v = long_at_least(value, min)?;
    u32::try_from(v)
        .ok()
        .filter(|v| i32::try_from(*v).is_ok())
        .ok_or_else(|| format!("must be at most {}", i32::MAX))
}

fn boolean(value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

fn ratio(value: &str) -> Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err("must be a number between 0 and 1".into()),
    }
}

fn cleanup_policy(value: &str) -> Result<CleanupPolicy, String> {
    CleanupPolicy::parse(value).ok_or_else(|| "must be delete, compact, or compact,delete".into())
}

fn compression_type(value: &str) -> Result<CompressionType, String> {
    CompressionType::parse(value).ok_or_else(|| {
        format!(
            "must be one of: {}",
            CompressionType::ALL.map(CompressionType::name).join(", ")
        )
    })
}

fn timestamp_type_log_append(value: &str) -> Result<bool, String> {
    match value {
        "CreateTime" => Ok(false),
        "LogAppendTime" => Ok(true),
        _ => Err("must be CreateTime or LogAppendTime".into()),
    }
}

/// A value's check, for keys taken with no effect.
type ValueCheck = fn(&str) -> Result<(), String>;

/// A Kafka release as `message.format.version` names one: `0.10.2`,
/// `2.8-IV1`, `3.0`.
fn kafka_version(value: &str) -> Result<(), String> {
    let (release, iv) = match value.split_once("-IV") {
        Some((release, iv)) => (release, Some(iv)),
        None => (value, None),
    };
    let parts: Vec<&str> = release.split('.').collect();
    let numeric = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let ok = (2..=4).contains(&parts.len())
        && parts.iter().all(|p| numeric(p))
        && iv.is_none_or(numeric);
    if ok {
        Ok(())
    } else {
        Err("must be a Kafka version such as 0.10.2 or 3.0-IV1".into())
    }
}

/// A check without an effect: the key is taken for compatibility.
fn accepted_long(value: &str) -> Result<(), String> {
    long_at_least(value, 0).map(drop)
}

const fn log_key(
    name: &'static str,
    apply: fn(&mut LogConfig, &str) -> Result<(), String>,
) -> DynamicBrokerKey {
    DynamicBrokerKey {
        name,
        effect: Effect::Log(apply),
    }
}

const fn broker_key(
    name: &'static str,
    apply: fn(&mut BrokerConfig, &str) -> Result<(), String>,
) -> DynamicBrokerKey {
    DynamicBrokerKey {
        name,
        effect: Effect::Broker(apply),
    }
}

/// Kafka's dynamically updatable broker configs that samsa has (Kafka's
/// `DynamicBrokerConfig`: the log defaults, the cleaner's settings,
/// `producer.id.expiration.ms`, `transaction.partition.verification.enable`),
/// each settable per broker and as a cluster-wide default. Every other
/// broker config is read-only. Long on purpose: it is the table.
pub const DYNAMIC_BROKER_KEYS: &[DynamicBrokerKey] = &[
    log_key("log.segment.bytes", |c, v| {
        c.segment_bytes = u64::from(int_at_least(v, 14)?);
        Ok(())
    }),
    log_key("log.roll.ms", |c, v| {
        c.segment_ms = long_at_least(v, 1)?;
        Ok(())
    }),
    log_key("log.retention.ms", |c, v| {
        c.retention_ms = long_at_least(v, -1)?;
        Ok(())
    }),
    log_key("log.retention.bytes", |c, v| {
        c.retention_bytes = long_at_least(v, -1)?;
        Ok(())
    }),
    log_key("log.index.interval.bytes", |c, v| {
        c.index_interval_bytes = int_at_least(v, 0)?;
        Ok(())
    }),
    log_key("log.cleanup.policy", |c, v| {
        c.cleanup_policy = cleanup_policy(v)?;
        Ok(())
    }),
    log_key("log.cleaner.delete.retention.ms", |c, v| {
        c.delete_retention_ms = long_at_least(v, 0)?;
        Ok(())
    }),
    log_key("log.cleaner.min.compaction.lag.ms", |c, v| {
        c.min_compaction_lag_ms = long_at_least(v, 0)?;
        Ok(())
    }),
    log_key("log.cleaner.max.compaction.lag.ms", |c, v| {
        c.max_compaction_lag_ms = long_at_least(v, 1)?;
        Ok(())
    }),
    log_key("log.cleaner.min.cleanable.ratio", |c, v| {
        c.min_cleanable_dirty_ratio = ratio(v)?;
        Ok(())
    }),
    log_key("compression.type", |c, v| {
        c.compression_type = compression_type(v)?;
        Ok(())
    }),
    log_key("message.max.bytes", |c, v| {
        c.max_message_bytes = int_at_least(v, 0)?;
        Ok(())
    }),
    log_key("log.message.timestamp.type", |c, v| {
        c.message_timestamp_type_log_append = timestamp_type_log_append(v)?;
        Ok(())
    }),
    log_key("producer.id.expiration.ms", |c, v| {
        c.producer_id_expiration_ms = long_at_least(v, 1)?;
        Ok(())
    }),
    broker_key("min.insync.replicas", |c, v| {
        c.min_insync_replicas = Some(int_at_least(v, 1)?);
        Ok(())
    }),
    // Read by the controller from the cluster-wide and topic values.
    broker_key("unclean.leader.election.enable", |_, v| {
        boolean(v).map(drop)
    }),
    broker_key("log.cleaner.io.max.bytes.per.second", |c, v| {
        let rate = v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| *r >= 1.0)
            .ok_or("must be a number of bytes per second, at least 1")?;
        // Kafka's default (Double.MAX_VALUE) and anything near it: unthrottled.
        c.log_cleaner_io_max_bytes_per_second = (rate < 1e18).then_some(rate as u64);
        Ok(())
    }),
    broker_key("leader.replication.throttled.rate", |c, v| {
        c.leader_replication_throttled_rate = Some(long_at_least(v, 1)? as u64);
        Ok(())
    }),
    broker_key("follower.replication.throttled.rate", |c, v| {
        c.follower_replication_throttled_rate = Some(long_at_least(v, 1)? as u64);
        Ok(())
    }),
    broker_key("log.cleaner.dedupe.buffer.size", |c, v| {
        c.log_cleaner_dedupe_buffer_size = long_at_least(v, 1024 * 1024)? as u64;
        Ok(())
    }),
    broker_key("log.cleaner.backoff.ms", |c, v| {
        c.log_cleaner_backoff_ms = long_at_least(v, 0)? as u64;
        Ok(())
    }),
    broker_key("transaction.partition.verification.enable", |c, v| {
        c.transaction_partition_verification_enable = boolean(v)?;
        Ok(())
    }),
];

/// The dynamic broker key `name`, if it is one.
pub fn dynamic_broker_key(name: &str) -> Option<&'static DynamicBrokerKey> {
    DYNAMIC_BROKER_KEYS.iter().find(|k| k.name == name)
}

impl DynamicBrokerKey {
    fn apply(&self, config: &mut BrokerConfig, value: &str) -> Result<(), String> {
        match self.effect {
            Effect::Log(apply) => apply(&mut config.log, value),
            Effect::Broker(apply) => apply(config, value),
        }
    }
}

/// Why a broker config change is refused; the handler answers it as Kafka
/// does (INVALID_REQUEST, with this as the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerConfigError {
    #[error("Cannot update these configs dynamically: {0}")]
    NotDynamic(String),
    #[error("Invalid value {value} for configuration {key}: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
}

/// Checks a broker config change. A dynamic key's value must parse; a key
/// samsa has that is not dynamic (`samsa_key`) is refused; any other key
/// is taken as Kafka takes custom configs (stored, no effect here). A
/// removal is always valid.
pub fn validate_broker_config(
    name: &str,
    value: Option<&str>,
    samsa_key: bool,
) -> Result<(), BrokerConfigError> {
    let Some(key) = dynamic_broker_key(name) else {
        return if samsa_key && value.is_some() {
            Err(BrokerConfigError::NotDynamic(name.into()))
        } else {
            Ok(())
        };
    };
    let Some(value) = value else { return Ok(()) };
    key.apply(&mut BrokerConfig::default(), value)
        .map_err(|reason| BrokerConfigError::InvalidValue {
            key: name.into(),
            value: value.into(),
            reason,
        })
}

/// Which dynamic level a broker config value is set at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicLevel {
    /// This broker's own value.
    Broker,
    /// The cluster-wide default.
    ClusterDefault,
}

/// The dynamic value of `name` set at `level` for broker `node_id`.
pub fn dynamic_value<'a>(
    view: &'a MetadataView,
    node_id: i32,
    level: DynamicLevel,
    name: &str,
) -> Option<&'a str> {
    match level {
        DynamicLevel::Broker => view.broker_configs.get(&node_id)?.get(name),
        DynamicLevel::ClusterDefault => view.cluster_configs.get(name),
    }
    .map(String::as_str)
}

/// The configuration broker `static_config.node_id` runs with under `view`:
/// its static configuration with the cluster-wide dynamic defaults, then
/// its own dynamic values, applied on top.
pub fn effective_broker_config(static_config: &BrokerConfig, view: &MetadataView) -> BrokerConfig {
    let mut config = static_config.clone();
    let levels = [
        Some(&view.cluster_configs),
        view.broker_configs.get(&static_config.node_id),
    ];
    for configs in levels.into_iter().flatten() {
        for (name, value) in configs {
            let Some(key) = dynamic_broker_key(name) else {
                // Stored by a version that had this key, or a topic-level
                // key set as a cluster default: nothing of the broker's.
                continue;
            };
            if let Err(reason) = key.apply(&mut config, value) {
                warn!(key = %name, value = %value, reason, "ignoring a dynamic broker config this version refuses");
            }
        }
    }
    config
}

/// One topic config samsa takes, with the broker config that sets its
/// default.
pub struct TopicConfigKey {
    pub name: &'static str,
    /// The broker config behind it (`retention.ms` → `log.retention.ms`):
    /// its parser, its synonyms in DescribeConfigs.
    pub broker_key: &'static str,
    pub config_type: ConfigType,
    pub doc: &'static str,
}

const fn topic_key(
    name: &'static str,
    broker_key: &'static str,
    config_type: ConfigType,
    doc: &'static str,
) -> TopicConfigKey {
    TopicConfigKey {
        name,
        broker_key,
        config_type,
        doc,
    }
}

/// Every topic config samsa takes, by name. Long on purpose: it is the table.
pub const TOPIC_CONFIG_KEYS: &[TopicConfigKey] = &[
    topic_key("cleanup.policy", "log.cleanup.policy", ConfigType::List,
        "delete: old segments are deleted by retention; compact: the cleaner keeps the latest record of each key; compact,delete: both."),
    topic_key("compression.type", "compression.type", ConfigType::String,
        "The codec of stored batches: producer keeps the producer's, any other codec is recompressed to on append."),
    topic_key("delete.retention.ms", "log.cleaner.delete.retention.ms", ConfigType::Long,
        "How long a tombstone, and a transaction marker whose records are gone, stays after the cleaner first passes it."),
    topic_key("file.delete.delay.ms", "log.segment.delete.delay.ms", ConfigType::Long,
        "Accepted for compatibility; samsa deletes a segment's files when retention or compaction drops it."),
    topic_key("flush.messages", "log.flush.interval.messages", ConfigType::Long,
        "Accepted for compatibility; samsa's fsync policy is the broker's log.flush setting."),
    topic_key("flush.ms", "log.flush.interval.ms", ConfigType::Long,
        "Accepted for compatibility; samsa's fsync policy is the broker's log.flush setting."),
    topic_key("index.interval.bytes", "log.index.interval.bytes", ConfigType::Int,
        "Bytes of batches between two offset-index entries."),
    topic_key("max.compaction.lag.ms", "log.cleaner.max.compaction.lag.ms", ConfigType::Long,
        "A record is compacted at the latest this long after it was written."),
    topic_key("max.message.bytes", "message.max.bytes", ConfigType::Int,
        "The largest record batch a producer may send to this topic."),
    topic_key("message.format.version", "log.message.format.version", ConfigType::String,
        "Accepted for compatibility with Kafka 3 clients (Kafka 4 removed it); samsa stores batches as producers send them, in the v2 format."),
    topic_key("message.timestamp.type", "log.message.timestamp.type", ConfigType::String,
        "CreateTime keeps the producer's timestamps, LogAppendTime stamps batches with the broker's clock."),
    topic_key("min.cleanable.dirty.ratio", "log.cleaner.min.cleanable.ratio", ConfigType::Double,
        "The share of the cleanable log not yet compacted above which the cleaner takes it."),
    topic_key("min.compaction.lag.ms", "log.cleaner.min.compaction.lag.ms", ConfigType::Long,
        "A record stays uncompacted at least this long."),
    topic_key("min.insync.replicas", "min.insync.replicas", ConfigType::Int,
        "In-sync replicas an acks=all produce needs; unset at every level, 2 for three or more replicas, else 1."),
    topic_key("preallocate", "log.preallocate", ConfigType::Boolean,
        "Accepted for compatibility; samsa does not preallocate segment files."),
    topic_key("retention.bytes", "log.retention.bytes", ConfigType::Long,
        "The oldest segments are deleted while a partition is larger; -1 unlimited."),
    topic_key("retention.ms", "log.retention.ms", ConfigType::Long,
        "Segments whose newest timestamp is older are deleted; -1 never."),
    topic_key("segment.bytes", "log.segment.bytes", ConfigType::Int,
        "A segment is rolled before an append would make it larger."),
    topic_key("segment.index.bytes", "log.index.size.max.bytes", ConfigType::Int,
        "Accepted for compatibility; samsa's offset index grows with its segment."),
    topic_key("segment.jitter.ms", "log.roll.jitter.ms", ConfigType::Long,
        "Accepted for compatibility; samsa rolls segments at segment.ms exactly."),
    topic_key("segment.ms", "log.roll.ms", ConfigType::Long,
        "A segment is rolled once its first batch is this old."),
    topic_key("unclean.leader.election.enable", "unclean.leader.election.enable", ConfigType::Boolean,
        "Whether the controller may elect a replica outside the ISR when no ISR member is left (losing what only the ISR had)."),
];

/// Topic keys taken for compatibility with no effect in samsa, and the
/// check their value must pass.
const COMPATIBILITY_TOPIC_KEYS: &[(&str, ValueCheck)] = &[
    ("file.delete.delay.ms", accepted_long),
    ("flush.messages", accepted_long),
    ("flush.ms", accepted_long),
    ("message.format.version", kafka_version),
    ("preallocate", |v| boolean(v).map(drop)),
    ("segment.index.bytes", |v| long_at_least(v, 4).map(drop)),
    ("segment.jitter.ms", accepted_long),
];

/// The topic config `name`, if samsa takes it.
pub fn topic_config_key(name: &str) -> Option<&'static TopicConfigKey> {
    TOPIC_CONFIG_KEYS.iter().find(|k| k.name == name)
}

/// Kafka's default of a compatibility-only topic key, for DescribeConfigs.
pub fn compatibility_default(name: &str) -> Option<&'static str> {
    Some(match name {
        "file.delete.delay.ms" => "60000",
        "flush.messages" | "flush.ms" => "9223372036854775807",
        "preallocate" => "false",
        "message.format.version" => "3.0-IV1",
        "segment.index.bytes" => "10485760",
        "segment.jitter.ms" => "0",
        _ => return None,
    })
}

/// Checks one topic config entry; the error names the key and why.
pub fn validate_topic_config(key: &str, value: &str) -> Result<(), MetadataError> {
    let invalid = |reason: String| MetadataError::InvalidConfig {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    };
    let Some(topic_key) = topic_config_key(key) else {
        return Err(invalid(format!(
            "unknown topic config; samsa knows {}",
            TOPIC_CONFIG_KEYS
                .iter()
                .map(|k| k.name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if let Some((_, check)) = COMPATIBILITY_TOPIC_KEYS.iter().find(|(n, _)| *n == key) {
        return check(value).map_err(invalid);
    }
    match dynamic_broker_key(topic_key.broker_key) {
        Some(broker_key) => broker_key
            .apply(&mut BrokerConfig::default(), value)
            .map_err(invalid),
        None => Err(invalid("no parser for this key (a samsa bug)".into())),
    }
}

/// Checks a topic's configs together, after each passed
/// [`validate_topic_config`]: `min.compaction.lag.ms` may not exceed
/// `max.compaction.lag.ms` (Kafka's rule), taking the broker's default for
/// the one not given.
pub fn validate_topic_configs(
    defaults: &LogConfig,
    configs: &BTreeMap<String, String>,
) -> Result<(), MetadataError> {
    let config = log_config_with(defaults, "", configs);
    if config.min_compaction_lag_ms > config.max_compaction_lag_ms {
        return Err(MetadataError::InvalidConfig {
            key: "min.compaction.lag.ms".into(),
            value: config.min_compaction_lag_ms.to_string(),
            reason: format!(
                "must not exceed max.compaction.lag.ms ({})",
                config.max_compaction_lag_ms
            ),
        });
    }
    Ok(())
}

/// The effective log config of a topic: the broker's defaults (its
/// effective config's `log`) overridden by the topic's configs. The
/// coordinators' topics are compacted unless their own configs say
/// otherwise, and do not take the broker's default `compression.type`:
/// their loaders read records uncompressed, and they are created with
/// `producer` / `uncompressed` as Kafka does (see
/// `coordinator::state_topic`), which an older one may not have recorded.
pub fn topic_log_config(defaults: &LogConfig, topic: &TopicMetadata) -> LogConfig {
    log_config_with(defaults, &topic.name, &topic.configs)
}

fn log_config_with(
    defaults: &LogConfig,
    topic: &str,
    configs: &BTreeMap<String, String>,
) -> LogConfig {
    let mut broker = BrokerConfig {
        log: defaults.clone(),
        ..BrokerConfig::default()
    };
    if topic == CONSUMER_OFFSETS_TOPIC || topic == TRANSACTION_STATE_TOPIC {
        broker.log.compression_type = CompressionType::Producer;
        // Compacted whatever the broker default, also when created by a
        // version that did not record the policy.
        broker.log.cleanup_policy = CleanupPolicy::Compact;
    }
    for (name, value) in configs {
        let Some(key) = topic_config_key(name) else {
            continue;
        };
        let Some(
            broker_key @ DynamicBrokerKey {
                effect: Effect::Log(_),
                ..
            },
        ) = dynamic_broker_key(key.broker_key)
        else {
            continue;
        };
        if let Err(reason) = broker_key.apply(&mut broker, value) {
            warn!(topic, key = %name, value = %value, reason, "ignoring a topic config this version refuses");
        }
    }
    broker.log
}

/// `min.insync.replicas` of a topic: its own value, else the broker's
/// (dynamic or static), else 2 when it has three or more replicas (so
/// acks=all survives one loss without going below two copies), else 1.
pub fn min_insync_replicas(config: &BrokerConfig, topic: &TopicMetadata) -> usize {
    topic
        .configs
        .get(samsa_controller::image::MIN_INSYNC_REPLICAS)
        .and_then(|v| v.parse::<usize>().ok())
        .or(config.min_insync_replicas.map(|v| v as usize))
        .unwrap_or(if topic.replication_factor >= 3 { 2 } else { 1 })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn view(cluster: &[(&str, &str)], broker: &[(i32, &str, &str)]) -> MetadataView {
        let mut view = MetadataView::default();
        for (k, v) in cluster {
            view.cluster_configs.insert((*k).into(), (*v).into());
        }
        for (id, k, v) in broker {
            view.broker_configs
                .entry(*id)
                .or_default()
                .insert((*k).into(), (*v).into());
        }
        view
    }

    #[test]
    fn every_topic_key_has_a_parser_and_a_broker_key() {
        for key in TOPIC_CONFIG_KEYS {
            let compatibility = COMPATIBILITY_TOPIC_KEYS.iter().any(|(n, _)| *n == key.name);
            assert!(
                compatibility || dynamic_broker_key(key.broker_key).is_some(),
                "{} has no parser",
                key.name
            );
            assert_eq!(
                compatibility,
                compatibility_default(key.name).is_some(),
                "{}",
                key.name
            );
        }
    }

    #[test]
    fn broker_value_beats_cluster_default_beats_static() {
        let mut static_config = BrokerConfig {
            node_id: 2,
            ..BrokerConfig::default()
        };
        static_config.log.retention_ms = 1000;
        static_config.log.segment_bytes = 5000;
        let v = view(
            &[("log.retention.ms", "2000"), ("log.segment.bytes", "7000")],
            &[
                (2, "log.retention.ms", "3000"),
                (3, "log.segment.bytes", "9000"),
            ],
        );
        let effective = effective_broker_config(&static_config, &v);
        assert_eq!(effective.log.retention_ms, 3000, "this broker's own value");
        assert_eq!(
            effective.log.segment_bytes, 7000,
            "the cluster default; broker 3's value is not ours"
        );
        let none = effective_broker_config(&static_config, &MetadataView::default());
        assert_eq!(none.log.retention_ms, 1000);
    }

    #[test]
    fn broker_keys_parse_their_values_and_refuse_static_ones() {
        assert!(validate_broker_config("log.retention.ms", Some("-1"), true).is_ok());
        assert!(validate_broker_config("log.retention.ms", None, true).is_ok());
        assert!(matches!(
            validate_broker_config("log.retention.ms", Some("soon"), true),
            Err(BrokerConfigError::InvalidValue { .. })
        ));
        assert!(matches!(
            validate_broker_config("log.cleanup.policy", Some("sometimes"), true),
            Err(BrokerConfigError::InvalidValue { .. })
        ));
        assert_eq!(
            validate_broker_config("log.dirs", Some("/tmp"), true),
            Err(BrokerConfigError::NotDynamic("log.dirs".into()))
        );
        // A key samsa does not have: a custom config, as Kafka takes it.
        assert!(validate_broker_config("my.plugin.setting", Some("1"), false).is_ok());
        let mut c = BrokerConfig::default();
        dynamic_broker_key("log.cleaner.io.max.bytes.per.second")
            .unwrap()
            .apply(&mut c, "1.7976931348623157E308")
            .unwrap();
        assert_eq!(c.log_cleaner_io_max_bytes_per_second, None);
        dynamic_broker_key("log.cleaner.io.max.bytes.per.second")
            .unwrap()
            .apply(&mut c, "1048576")
            .unwrap();
        assert_eq!(c.log_cleaner_io_max_bytes_per_second, Some(1_048_576));
    }

    #[test]
    fn topic_keys_share_their_broker_keys_parsers() {
        assert!(validate_topic_config("retention.ms", "-1").is_ok());
        assert!(validate_topic_config("retention.ms", "abc").is_err());
        assert!(validate_topic_config("segment.bytes", "13").is_err());
        assert!(validate_topic_config("cleanup.policy", "compact,delete").is_ok());
        assert!(validate_topic_config("cleanup.policy", "foo").is_err());
        assert!(validate_topic_config("min.cleanable.dirty.ratio", "1.5").is_err());
        assert!(validate_topic_config("segment.index.bytes", "52428800").is_ok());
        assert!(validate_topic_config("preallocate", "maybe").is_err());
        assert!(validate_topic_config("message.format.version", "0.10.0").is_ok());
        assert!(validate_topic_config("message.format.version", "0.10.0.0").is_ok());
        assert!(validate_topic_config("message.format.version", "2.8-IV1").is_ok());
        assert!(validate_topic_config("message.format.version", "new").is_err());
        assert!(validate_topic_config("no.such.key", "1").is_err());
        assert!(validate_topic_config("min.insync.replicas", "0").is_err());
    }

    #[test]
    fn topic_log_config_takes_topic_values_over_defaults() {
        let defaults = LogConfig {
            retention_ms: 10,
            ..LogConfig::default()
        };
        let mut topic = TopicMetadata {
            name: "t".into(),
            topic_id: uuid::Uuid::nil(),
            partitions: 1,
            replication_factor: 1,
            configs: BTreeMap::new(),
            partition_states: Vec::new(),
        };
        topic.configs.insert("segment.bytes".into(), "1000".into());
        topic
            .configs
            .insert("cleanup.policy".into(), "compact".into());
        topic
            .configs
            .insert("segment.index.bytes".into(), "4096".into());
        let c = topic_log_config(&defaults, &topic);
        assert_eq!(c.retention_ms, 10);
        assert_eq!(c.segment_bytes, 1000);
        assert_eq!(c.cleanup_policy, CleanupPolicy::Compact);
        let mut lags = BTreeMap::new();
        lags.insert("min.compaction.lag.ms".to_string(), "100".to_string());
        lags.insert("max.compaction.lag.ms".to_string(), "50".to_string());
        assert!(validate_topic_configs(&defaults, &lags).is_err());
    }

    #[test]
    fn min_insync_replicas_topic_then_broker_then_replication_rule() {
        let mut topic = TopicMetadata {
            name: "t".into(),
            topic_id: uuid::Uuid::nil(),
            partitions: 1,
            replication_factor: 3,
            configs: BTreeMap::new(),
            partition_states: Vec::new(),
        };
        let mut config = BrokerConfig::default();
        assert_eq!(min_insync_replicas(&config, &topic), 2);
        config.min_insync_replicas = Some(3);
        assert_eq!(min_insync_replicas(&config, &topic), 3);
        topic
            .configs
            .insert("min.insync.replicas".into(), "1".into());
        assert_eq!(min_insync_replicas(&config, &topic), 1);
    }

    #[test]
    fn topic_config_validation() {
        assert!(validate_topic_config("retention.ms", "1000").is_ok());
        assert!(validate_topic_config("retention.ms", "-2").is_err());
        assert!(validate_topic_config("retention.ms", "abc").is_err());
        assert!(validate_topic_config("no.such.config", "1").is_err());
        assert!(validate_topic_config("message.timestamp.type", "LogAppendTime").is_ok());
        for codec in ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"] {
            assert!(
                validate_topic_config("compression.type", codec).is_ok(),
                "{codec}"
            );
        }
        match validate_topic_config("compression.type", "brotli") {
            Err(MetadataError::InvalidConfig { reason, .. }) => assert_eq!(
                reason,
                "must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compression_type_comes_from_the_topic_then_the_broker() {
        let topic = |name: &str, configs: &[(&str, &str)]| TopicMetadata {
            name: name.into(),
            topic_id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 1,
            configs: configs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            partition_states: Vec::new(),
        };
        let kafka = LogConfig::default();
        let broker_zstd = LogConfig {
            compression_type: CompressionType::Zstd,
            ..LogConfig::default()
        };
        let plain = topic("t", &[]);
        let gzip = topic("t", &[("compression.type", "gzip")]);
        assert_eq!(
            topic_log_config(&kafka, &plain).compression_type,
            CompressionType::Producer
        );
        assert_eq!(
            topic_log_config(&broker_zstd, &plain).compression_type,
            CompressionType::Zstd
        );
        assert_eq!(
            topic_log_config(&broker_zstd, &gzip).compression_type,
            CompressionType::Gzip
        );
        for internal in ["__consumer_offsets", "__transaction_state"] {
            assert_eq!(
                topic_log_config(&broker_zstd, &topic(internal, &[])).compression_type,
                CompressionType::Producer,
                "{internal}"
            );
        }
    }
}
