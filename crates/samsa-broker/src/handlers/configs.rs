//! DescribeConfigs for topics (2) and brokers (4): the effective value of every
//! config samsa has, under Kafka's name, with where it comes from.
//!
//! Sources follow Kafka's rules. A broker key is STATIC_BROKER_CONFIG when
//! its samsa setting was given explicitly (config file, flag, `--set`,
//! `samsa dev`'s presets: [`BrokerConfig::explicit_keys`]) and
//! DEFAULT_CONFIG otherwise; samsa has no dynamic broker configs. A topic
//! config is DYNAMIC_TOPIC_CONFIG when the topic sets it, else it takes the
//! source of the broker key behind it (`retention.ms` → `log.retention.ms`).
//! Synonyms (`include_synonyms`) list every level that has a value, highest
//! precedence first, as Kafka lists them: a broker key's explicit value,
//! then its default; Kafka's multi-unit families (`log.retention.ms` /
//! `.minutes` / `.hours`, `log.roll.ms` / `.hours`) list the members from
//! the one described on. samsa's retention and roll settings are in
//! milliseconds, so the `.ms` member carries a configured value and
//! `.hours` keeps Kafka's default of 168, as in a Kafka whose
//! `server.properties` sets `log.retention.ms`.
//!
//! Every broker key is read-only: samsa cannot change any broker config at
//! runtime (it has no AlterConfigs or IncrementalAlterConfigs), including
//! the ones Kafka can (`docs/COMPATIBILITY.md` lists them). The broker
//! resource with an empty name stands for the cluster-wide dynamic
//! defaults, of which samsa has none: its list is empty, as on a Kafka
//! cluster that never set one.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use samsa_storage::LogConfig;

use super::str_bytes;
use crate::config::{BrokerConfig, KafkaListener, MAIN_LISTENER};
use crate::metadata::TopicMetadata;
use crate::Broker;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_SHORT: i8 = 4;
const TYPE_LONG: i8 = 5;
const TYPE_DOUBLE: i8 = 6;
const TYPE_LIST: i8 = 7;

const MS_PER_HOUR: i64 = 3_600_000;

/// Kafka's broker configs that name one setting in several units, in
/// Kafka's precedence order (the first one set wins).
const SYNONYM_FAMILIES: &[&[&str]] = &[
    &[
        "log.retention.ms",
        "log.retention.minutes",
        "log.retention.hours",
    ],
    &["log.roll.ms", "log.roll.hours"],
];

/// One broker config under its Kafka name.
struct BrokerKey {
    name: &'static str,
    config_type: i8,
    /// The `BrokerConfig` field (dotted) that sets it; `None` when samsa
    /// has no setting for this name (a fixed behaviour, or a unit samsa
    /// does not take).
    setting: Option<&'static str>,
    /// The setting's value in this process (used when it was given).
    value: Option<String>,
    /// The value when the setting is not given; `None`: null, no default.
    default: Option<String>,
    doc: &'static str,
}

impl BrokerKey {
    fn is_static(&self, config: &BrokerConfig) -> bool {
        self.setting.is_some_and(|s| config.is_explicit(s))
    }
}

/// One config of a resource, ready to encode.
struct Entry {
    name: &'static str,
    value: Option<String>,
    config_type: i8,
    /// Highest precedence first; the first one's source is the entry's.
    synonyms: Vec<Synonym>,
    read_only: bool,
    doc: &'static str,
}

struct Synonym {
    name: &'static str,
    value: Option<String>,
    source: i8,
}

impl Entry {
    fn source(&self) -> i8 {
        self.synonyms.first().map_or(SOURCE_DEFAULT, |s| s.source)
    }
}

fn key(
    name: &'static str,
    config_type: i8,
    setting: Option<&'static str>,
    value: Option<String>,
    default: Option<String>,
    doc: &'static str,
) -> BrokerKey {
    BrokerKey {
        name,
        config_type,
        setting,
        value,
        default,
        doc,
    }
}

/// Every broker config samsa has, with this process's values. Long on
/// purpose: it is the table, one entry per key.
/// Kafka's form of a listener list, `NAME://address,…`, of the listeners
/// as the broker runs them.
fn listener_list(config: &BrokerConfig, address: impl Fn(&KafkaListener) -> String) -> String {
    config
        .kafka_listeners()
        .unwrap_or_default()
        .iter()
        .map(|l| format!("{}://{}", l.name, address(l)))
        .collect::<Vec<_>>()
        .join(",")
}

fn broker_keys(broker: &Broker) -> Vec<BrokerKey> {
    let c = &broker.config;
    let d = BrokerConfig::default();
    let log_default = LogConfig::default();
    let s = |v: &dyn ToString| Some(v.to_string());
    // `(value, default)` of a plain setting.
    macro_rules! plain {
        ($name:literal, $type:expr, $field:ident, $doc:literal) => {
            key(
                $name,
                $type,
                Some(stringify!($field)),
                s(&c.$field),
                s(&d.$field),
                $doc,
            )
        };
    }
    macro_rules! log_key {
        ($name:literal, $type:expr, $field:ident, $doc:literal) => {
            key(
                $name,
                $type,
                Some(concat!("log.", stringify!($field))),
                s(&c.log.$field),
                s(&log_default.$field),
                $doc,
            )
        };
    }
    let roles = |voters: &Option<String>| {
        Some(
            if voters.is_some() {
                "broker,controller"
            } else {
                "broker"
            }
            .to_string(),
        )
    };
    let rf_default = broker.replication_factor_or_default(None).to_string();
    let timestamp_type = |log_append: bool| {
        Some(
            if log_append {
                "LogAppendTime"
            } else {
                "CreateTime"
            }
            .to_string(),
        )
    };
    vec![
        // --- the node ---
        key("node.id", TYPE_INT, Some("node_id"), s(&c.node_id), s(&d.node_id),
            "samsa: node_id. This node's id in Metadata, DescribeCluster and the controller quorum."),
        key("broker.id", TYPE_INT, Some("node_id"), s(&c.node_id), s(&d.node_id),
            "samsa: node_id (the broker id is the node id)."),
        key("process.roles", TYPE_LIST, Some("controller_quorum_voters"),
            roles(&c.controller_quorum_voters), roles(&d.controller_quorum_voters),
            "samsa: follows controller_quorum_voters. Set, every node runs a controller of the quorum and a broker; unset, a single broker keeps its metadata in local files."),
        key("listeners", TYPE_STRING, Some("listen"),
            s(&listener_list(c, |l| l.listen.to_string())), s(&format!("{MAIN_LISTENER}://{}", d.listen)),
            "samsa: listen (the main listener, PLAINTEXT) and listeners.<name>.listen. The addresses the Kafka listeners bind to (the controller's gRPC listener is controller_listen)."),
        key("advertised.listeners", TYPE_STRING, Some("advertised_listener"),
            (c.advertised_listener.is_some() || !c.listeners.is_empty()).then(|| {
                listener_list(c, |l| format!("{}:{}", l.advertised_host, l.advertised_port))
            }),
            None,
            "samsa: advertised_listener and listeners.<name>.advertised_listener. The addresses clients of each listener are told to connect to; unset, the listen address with 0.0.0.0 or :: replaced by 127.0.0.1."),
        key("log.dirs", TYPE_STRING, Some("data_dir"),
            s(&c.data_dir.display()), s(&d.data_dir.display()),
            "samsa: data_dir. The directory of the partition logs and the broker's metadata."),
        plain!("num.partitions", TYPE_INT, num_partitions,
            "samsa: num_partitions. Partitions of auto-created topics and of CreateTopics requests that leave the count at -1."),
        key("default.replication.factor", TYPE_INT, Some("default_replication_factor"),
            s(&broker.default_replication_factor()), Some(rf_default.clone()),
            "samsa: default_replication_factor. Replicas of auto-created topics and of CreateTopics requests that leave it at -1; unset, min(3, unfenced brokers)."),
        plain!("auto.create.topics.enable", TYPE_BOOLEAN, auto_create_topics_enable,
            "samsa: auto_create_topics_enable. Whether a Metadata request for an unknown topic creates it."),
        key("socket.request.max.bytes", TYPE_INT, Some("max_request_bytes"),
            s(&c.max_request_bytes), s(&d.max_request_bytes),
            "samsa: max_request_bytes. A request frame larger than this closes the connection."),
        // --- partition logs ---
        key("log.retention.check.interval.ms", TYPE_LONG, Some("retention_check_interval_ms"),
            s(&c.retention_check_interval_ms), s(&d.retention_check_interval_ms),
            "samsa: retention_check_interval_ms. How often retention deletes old segments."),
        key("compression.type", TYPE_STRING, Some("log.compression_type"),
            s(&c.log.compression_type.name()), s(&log_default.compression_type.name()),
            "samsa: log.compression_type. The codec of stored batches for topics without their own compression.type; producer keeps the producer's."),
        log_key!("log.segment.bytes", TYPE_INT, segment_bytes,
            "samsa: log.segment_bytes. A segment is rolled before an append would make it larger."),
        key("log.roll.ms", TYPE_LONG, Some("log.segment_ms"), s(&c.log.segment_ms), None,
            "samsa: log.segment_ms. A segment is rolled once its first batch is this old; unset, log.roll.hours applies."),
        key("log.roll.hours", TYPE_INT, None, None, s(&(log_default.segment_ms / MS_PER_HOUR)),
            "samsa: log.segment_ms (samsa takes milliseconds only). The segment age that rolls a segment when log.roll.ms is unset."),
        key("log.retention.ms", TYPE_LONG, Some("log.retention_ms"), s(&c.log.retention_ms), None,
            "samsa: log.retention_ms. Segments whose newest timestamp is older are deleted, -1 never; unset, log.retention.hours applies."),
        key("log.retention.minutes", TYPE_INT, None, None, None,
            "samsa: log.retention_ms (samsa takes milliseconds only)."),
        key("log.retention.hours", TYPE_INT, None, None, s(&(log_default.retention_ms / MS_PER_HOUR)),
            "samsa: log.retention_ms (samsa takes milliseconds only). The retention time when log.retention.ms is unset."),
        log_key!("log.retention.bytes", TYPE_LONG, retention_bytes,
            "samsa: log.retention_bytes. The oldest segments are deleted while a partition is larger; -1 unlimited."),
        log_key!("log.index.interval.bytes", TYPE_INT, index_interval_bytes,
            "samsa: log.index_interval_bytes. Bytes of batches between two offset-index entries."),
        key("message.max.bytes", TYPE_INT, Some("log.max_message_bytes"),
            s(&c.log.max_message_bytes), s(&log_default.max_message_bytes),
            "samsa: log.max_message_bytes. The largest record batch a producer may send."),
        key("log.message.timestamp.type", TYPE_STRING, Some("log.message_timestamp_type_log_append"),
            timestamp_type(c.log.message_timestamp_type_log_append),
            timestamp_type(log_default.message_timestamp_type_log_append),
            "samsa: log.message_timestamp_type_log_append. CreateTime keeps the producer's timestamps, LogAppendTime stamps batches with the broker's clock."),
        log_key!("producer.id.expiration.ms", TYPE_INT, producer_id_expiration_ms,
            "samsa: log.producer_id_expiration_ms. The idempotence state of a producer silent this long is dropped."),
        key("log.cleanup.policy", TYPE_LIST, Some("log.cleanup_policy"),
            s(&c.log.cleanup_policy.name()), s(&log_default.cleanup_policy.name()),
            "samsa: log.cleanup_policy. delete: old segments are deleted by retention; compact: the cleaner keeps the latest record of each key; compact,delete: both."),
        log_key!("log.cleaner.delete.retention.ms", TYPE_LONG, delete_retention_ms,
            "samsa: log.delete_retention_ms. How long a tombstone, and a transaction marker whose records are gone, stays after the cleaner first passes it."),
        log_key!("log.cleaner.min.cleanable.ratio", TYPE_DOUBLE, min_cleanable_dirty_ratio,
            "samsa: log.min_cleanable_dirty_ratio. The share of a log's cleanable bytes not yet compacted above which the cleaner takes it."),
        log_key!("log.cleaner.min.compaction.lag.ms", TYPE_LONG, min_compaction_lag_ms,
            "samsa: log.min_compaction_lag_ms. A record stays uncompacted at least this long."),
        log_key!("log.cleaner.max.compaction.lag.ms", TYPE_LONG, max_compaction_lag_ms,
            "samsa: log.max_compaction_lag_ms. A record is compacted at the latest this long after it was written."),
        plain!("log.cleaner.enable", TYPE_BOOLEAN, log_cleaner_enable,
            "samsa: log_cleaner_enable. Whether compacted topics are compacted."),
        plain!("log.cleaner.dedupe.buffer.size", TYPE_LONG, log_cleaner_dedupe_buffer_size,
            "samsa: log_cleaner_dedupe_buffer_size. Memory of the cleaner's key map, 24 bytes a key: how many distinct keys one pass compacts."),
        key("log.cleaner.io.max.bytes.per.second", TYPE_DOUBLE, Some("log_cleaner_io_max_bytes_per_second"),
            c.log_cleaner_io_max_bytes_per_second.map(|v| v.to_string()), s(&f64::MAX),
            "samsa: log_cleaner_io_max_bytes_per_second. The cleaner's read and write rate; unset, unthrottled."),
        plain!("log.cleaner.backoff.ms", TYPE_LONG, log_cleaner_backoff_ms,
            "samsa: log_cleaner_backoff_ms. How long the cleaner sleeps when no log needs cleaning."),
        key("log.cleaner.threads", TYPE_INT, None, None, s(&1),
            "Fixed in samsa: one cleaner task per broker."),
        key("unclean.leader.election.enable", TYPE_BOOLEAN, None, None, s(&false),
            "Fixed in samsa: a replica outside the ISR never becomes leader."),
        // --- cluster mode ---
        key("controller.quorum.voters", TYPE_LIST, Some("controller_quorum_voters"),
            s(&c.controller_quorum_voters.clone().unwrap_or_default()), s(&""),
            "samsa: controller_quorum_voters. The static controller quorum, id@host:port of each voter; empty, single-node mode."),
        plain!("broker.heartbeat.interval.ms", TYPE_INT, broker_heartbeat_interval_ms,
            "samsa: broker_heartbeat_interval_ms. How often the broker heartbeats the active controller."),
        plain!("broker.session.timeout.ms", TYPE_INT, broker_session_timeout_ms,
            "samsa: broker_session_timeout_ms. A broker without heartbeat this long is fenced and its leaderships move."),
        plain!("controller.quorum.election.timeout.ms", TYPE_INT, controller_quorum_election_timeout_ms,
            "samsa: controller_quorum_election_timeout_ms. The base Raft election timeout; a failover takes about 2.5 to 3 times this."),
        plain!("replica.lag.time.max.ms", TYPE_LONG, replica_lag_time_max_ms,
            "samsa: replica_lag_time_max_ms. A follower behind the leader's log end this long leaves the ISR."),
        plain!("replica.fetch.wait.max.ms", TYPE_INT, replica_fetch_wait_max_ms,
            "samsa: replica_fetch_wait_max_ms. How long a leader holds a follower's fetch when it has nothing new."),
        plain!("replica.high.watermark.checkpoint.interval.ms", TYPE_LONG, replica_high_watermark_checkpoint_interval_ms,
            "samsa: replica_high_watermark_checkpoint_interval_ms. How often a partition whose high watermark moved writes it to its checkpoint."),
        // --- transactions ---
        plain!("transaction.state.log.num.partitions", TYPE_INT, transaction_state_log_num_partitions,
            "samsa: transaction_state_log_num_partitions. Partitions of __transaction_state, created on first use."),
        key("transaction.state.log.replication.factor", TYPE_SHORT, Some("transaction_state_log_replication_factor"),
            s(&broker.replication_factor_or_default(c.transaction_state_log_replication_factor)),
            Some(rf_default.clone()),
            "samsa: transaction_state_log_replication_factor. Replicas of __transaction_state when it is created; unset, min(3, unfenced brokers)."),
        plain!("transaction.state.log.segment.bytes", TYPE_INT, transaction_state_log_segment_bytes,
            "samsa: transaction_state_log_segment_bytes. The segment size __transaction_state is created with; compaction never takes the active segment."),
        plain!("transaction.max.timeout.ms", TYPE_INT, transaction_max_timeout_ms,
            "samsa: transaction_max_timeout_ms. The largest transaction timeout a producer may ask for."),
        plain!("transaction.abort.timed.out.transaction.cleanup.interval.ms", TYPE_INT, transaction_abort_timed_out_transaction_cleanup_interval_ms,
            "samsa: transaction_abort_timed_out_transaction_cleanup_interval_ms. How often the coordinator aborts transactions older than their timeout."),
        plain!("transactional.id.expiration.ms", TYPE_INT, transactional_id_expiration_ms,
            "samsa: transactional_id_expiration_ms. A transactional id unused this long is forgotten."),
        plain!("transaction.partition.verification.enable", TYPE_BOOLEAN, transaction_partition_verification_enable,
            "samsa: transaction_partition_verification_enable. A partition leader checks with the coordinator before a producer's first transactional write to it (KIP-890)."),
        // --- consumer groups ---
        plain!("offsets.topic.num.partitions", TYPE_INT, offsets_topic_num_partitions,
            "samsa: offsets_topic_num_partitions. Partitions of __consumer_offsets, created on first use."),
        key("offsets.topic.replication.factor", TYPE_SHORT, Some("offsets_topic_replication_factor"),
            s(&broker.replication_factor_or_default(c.offsets_topic_replication_factor)),
            Some(rf_default),
            "samsa: offsets_topic_replication_factor. Replicas of __consumer_offsets when it is created; unset, min(3, unfenced brokers)."),
        plain!("offsets.topic.segment.bytes", TYPE_INT, offsets_topic_segment_bytes,
            "samsa: offsets_topic_segment_bytes. The segment size __consumer_offsets is created with; compaction never takes the active segment."),
        plain!("group.initial.rebalance.delay.ms", TYPE_INT, group_initial_rebalance_delay_ms,
            "samsa: group_initial_rebalance_delay_ms. How long the first rebalance of an empty group waits for more members."),
        plain!("group.min.session.timeout.ms", TYPE_INT, group_min_session_timeout_ms,
            "samsa: group_min_session_timeout_ms. The smallest session timeout a member may ask for."),
        plain!("group.max.session.timeout.ms", TYPE_INT, group_max_session_timeout_ms,
            "samsa: group_max_session_timeout_ms. The largest session timeout a member may ask for."),
        plain!("offsets.retention.minutes", TYPE_INT, offsets_retention_minutes,
            "samsa: offsets_retention_minutes. How long committed offsets outlive the group's last member."),
        plain!("offsets.retention.check.interval.ms", TYPE_LONG, offsets_retention_check_interval_ms,
            "samsa: offsets_retention_check_interval_ms. How often expired offsets are looked for."),
        key("offset.metadata.max.bytes", TYPE_INT, None, None, s(&4096),
            "Fixed in samsa: the largest metadata string of a committed offset."),
    ]
}

/// Kafka's synonym list of broker config `name`: the explicit values of its
/// family, then their defaults, from `name` on.
fn broker_synonyms(keys: &[BrokerKey], config: &BrokerConfig, name: &str) -> Vec<Synonym> {
    let family: Vec<&BrokerKey> = SYNONYM_FAMILIES
        .iter()
        .find(|f| f.contains(&name))
        .map_or_else(
            || keys.iter().filter(|k| k.name == name).collect(),
            |f| {
                f.iter()
                    .filter_map(|n| keys.iter().find(|k| k.name == *n))
                    .collect()
            },
        );
    let statics = family
        .iter()
        .filter(|k| k.is_static(config))
        .map(|k| Synonym {
            name: k.name,
            value: k.value.clone(),
            source: SOURCE_STATIC_BROKER,
        });
    let defaults = family.iter().filter_map(|k| {
        k.default.as_ref().map(|d| Synonym {
            name: k.name,
            value: Some(d.clone()),
            source: SOURCE_DEFAULT,
        })
    });
    statics
        .chain(defaults)
        .skip_while(|s| s.name != name)
        .collect()
}

fn broker_entries(broker: &Broker) -> Vec<Entry> {
    let keys = broker_keys(broker);
    keys.iter()
        .map(|k| Entry {
            name: k.name,
            value: if k.is_static(&broker.config) {
                k.value.clone()
            } else {
                k.default.clone()
            },
            config_type: k.config_type,
            synonyms: broker_synonyms(&keys, &broker.config, k.name),
            read_only: true,
            doc: k.doc,
        })
        .collect()
}

fn topic_entries(broker: &Broker, topic: &TopicMetadata) -> Vec<Entry> {
    let log = &broker.config.log;
    let keys = broker_keys(broker);
    // A topic config, its broker-level key, its value without an override.
    let entry = |name: &'static str,
                 broker_key: Option<&str>,
                 default: String,
                 config_type: i8,
                 doc: &'static str| {
        let overridden = topic.configs.get(name);
        let mut synonyms: Vec<Synonym> = overridden
            .map(|v| Synonym {
                name,
                value: Some(v.clone()),
                source: SOURCE_TOPIC,
            })
            .into_iter()
            .collect();
        if let Some(broker_key) = broker_key {
            synonyms.extend(broker_synonyms(&keys, &broker.config, broker_key));
        }
        Entry {
            name,
            value: Some(overridden.cloned().unwrap_or(default)),
            config_type,
            synonyms,
            read_only: false,
            doc,
        }
    };
    vec![
        entry("cleanup.policy", Some("log.cleanup.policy"), log.cleanup_policy.name().into(), TYPE_LIST,
            "delete: old segments are deleted by retention; compact: the cleaner keeps the latest record of each key; compact,delete: both."),
        entry("delete.retention.ms", Some("log.cleaner.delete.retention.ms"), log.delete_retention_ms.to_string(), TYPE_LONG,
            "How long a tombstone, and a transaction marker whose records are gone, stays after the cleaner first passes it."),
        entry("max.compaction.lag.ms", Some("log.cleaner.max.compaction.lag.ms"), log.max_compaction_lag_ms.to_string(), TYPE_LONG,
            "A record is compacted at the latest this long after it was written."),
        entry("min.cleanable.dirty.ratio", Some("log.cleaner.min.cleanable.ratio"), log.min_cleanable_dirty_ratio.to_string(), TYPE_DOUBLE,
            "The share of the cleanable log not yet compacted above which the cleaner takes it."),
        entry("min.compaction.lag.ms", Some("log.cleaner.min.compaction.lag.ms"), log.min_compaction_lag_ms.to_string(), TYPE_LONG,
            "A record stays uncompacted at least this long."),
        entry("compression.type", Some("compression.type"), log.compression_type.name().into(), TYPE_STRING,
            "The codec of stored batches: producer keeps the producer's, any other codec is recompressed to on append."),
        entry("max.message.bytes", Some("message.max.bytes"), log.max_message_bytes.to_string(), TYPE_INT,
            "The largest record batch a producer may send to this topic."),
        entry("message.timestamp.type", Some("log.message.timestamp.type"),
            if log.message_timestamp_type_log_append { "LogAppendTime" } else { "CreateTime" }.into(),
            TYPE_STRING,
            "CreateTime keeps the producer's timestamps, LogAppendTime stamps batches with the broker's clock."),
        entry("min.insync.replicas", None, crate::apply::min_insync_replicas(topic).to_string(), TYPE_INT,
            "In-sync replicas an acks=all produce needs; default 2 for three or more replicas, else 1."),
        entry("retention.bytes", Some("log.retention.bytes"), log.retention_bytes.to_string(), TYPE_LONG,
            "The oldest segments are deleted while a partition is larger; -1 unlimited."),
        entry("retention.ms", Some("log.retention.ms"), log.retention_ms.to_string(), TYPE_LONG,
            "Segments whose newest timestamp is older are deleted; -1 never."),
        entry("segment.bytes", Some("log.segment.bytes"), log.segment_bytes.to_string(), TYPE_INT,
            "A segment is rolled before an append would make it larger."),
        entry("segment.ms", Some("log.roll.ms"), log.segment_ms.to_string(), TYPE_LONG,
            "A segment is rolled once its first batch is this old."),
        entry("unclean.leader.election.enable", Some("unclean.leader.election.enable"), "false".into(), TYPE_BOOLEAN,
            "Accepted for compatibility; samsa never elects a replica outside the ISR."),
    ]
}

fn describe_resource(
    broker: &Broker,
    resource: &DescribeConfigsResource,
) -> Result<Vec<Entry>, (ResponseError, String)> {
    let name = resource.resource_name.as_str();
    match resource.resource_type {
        RESOURCE_TOPIC => match broker.metadata.image().topic(name) {
            Some(topic) => Ok(topic_entries(broker, topic)),
            None => Err((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name} does not exist"),
            )),
        },
        // The cluster-wide dynamic defaults: samsa has none.
        RESOURCE_BROKER if name.is_empty() => Ok(Vec::new()),
        RESOURCE_BROKER => match name.parse::<i32>() {
            Ok(id) if id == broker.config.node_id => Ok(broker_entries(broker)),
            Ok(id) => Err((
                ResponseError::InvalidRequest,
                format!(
                    "broker {id} is not this broker ({}); ask broker {id} itself",
                    broker.config.node_id
                ),
            )),
            Err(_) => Err((
                ResponseError::InvalidRequest,
                format!("a broker resource is named by its integer id, not {name:?}"),
            )),
        },
        other => Err((
            ResponseError::InvalidRequest,
            format!("unsupported resource type {other}"),
        )),
    }
}

pub fn describe_configs(
    broker: &Broker,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let include_synonyms = request.include_synonyms;
    let include_documentation = version >= 3 && request.include_documentation;
    let results = request
        .resources
        .iter()
        .map(|resource| {
            let mut result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            match describe_resource(broker, resource) {
                Ok(entries) => {
                    // A null or empty key list asks for every config.
                    let wanted = |name: &str| {
                        resource.configuration_keys.as_ref().is_none_or(|keys| {
                            keys.is_empty() || keys.iter().any(|k| k.as_str() == name)
                        })
                    };
                    result.configs = entries
                        .into_iter()
                        .filter(|e| wanted(e.name))
                        .map(|e| encode_entry(e, include_synonyms, include_documentation))
                        .collect();
                }
                Err((code, message)) => {
                    result.error_code = code.code();
                    result.error_message = Some(str_bytes(message));
                }
            }
            result
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn encode_entry(
    e: Entry,
    include_synonyms: bool,
    include_documentation: bool,
) -> DescribeConfigsResourceResult {
    let source = e.source();
    let synonyms = if include_synonyms {
        e.synonyms
            .into_iter()
            .map(|s| {
                DescribeConfigsSynonym::default()
                    .with_name(str_bytes(s.name))
                    .with_value(s.value.map(str_bytes))
                    .with_source(s.source)
            })
            .collect()
    } else {
        Vec::new()
    };
    DescribeConfigsResourceResult::default()
        .with_name(str_bytes(e.name))
        .with_value(e.value.map(str_bytes))
        .with_read_only(e.read_only)
        .with_config_source(source)
        .with_is_sensitive(false)
        .with_synonyms(synonyms)
        .with_config_type(e.config_type)
        // Null unless asked for (the codec's default is "").
        .with_documentation(include_documentation.then(|| str_bytes(e.doc)))
}
