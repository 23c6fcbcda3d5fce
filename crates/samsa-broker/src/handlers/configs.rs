//! DescribeConfigs for topics (2) and brokers (4): the effective value of every
//! config samsa has, under Kafka's name, with where it comes from. The
//! changes themselves are `handlers::alter_configs`; what each key means
//! and which ones can change is `dynamic_config`.
//!
//! Sources follow Kafka's rules, highest precedence first: a topic's own
//! value (DYNAMIC_TOPIC_CONFIG), this broker's dynamic value
//! (DYNAMIC_BROKER_CONFIG), the cluster-wide dynamic default
//! (DYNAMIC_DEFAULT_BROKER_CONFIG), the static configuration
//! (STATIC_BROKER_CONFIG: a samsa setting given explicitly — config file,
//! flag, `--set`, `samsa dev`'s presets: [`BrokerConfig::explicit_keys`]),
//! the default (DEFAULT_CONFIG). A topic config without its own value takes
//! the source of the broker key behind it (`retention.ms` →
//! `log.retention.ms`). Synonyms (`include_synonyms`) list every level that
//! has a value, grouped by level in that order, as Kafka lists them;
//! Kafka's multi-unit families (`log.retention.ms` / `.minutes` / `.hours`,
//! `log.roll.ms` / `.hours`) list the members from the one described on.
//! samsa's retention and roll settings are in milliseconds, so the `.ms`
//! member carries a configured value and `.hours` keeps Kafka's default of
//! 168, as in a Kafka whose `server.properties` sets `log.retention.ms`.
//!
//! A broker key is read-only unless `dynamic_config` can change it. The
//! broker resource with an empty name stands for the cluster-wide dynamic
//! defaults: it lists exactly the ones set, as Kafka does. A broker answers
//! for itself only (another id is INVALID_REQUEST, as in Kafka: clients
//! send a broker resource to that broker).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use samsa_storage::LogConfig;

use super::str_bytes;
use crate::config::{BrokerConfig, KafkaListener, MAIN_LISTENER};
use crate::dynamic_config::{
    compatibility_default, dynamic_broker_key, dynamic_value, min_insync_replicas,
    topic_log_config, DynamicLevel, TOPIC_CONFIG_KEYS,
};
use crate::metadata::{MetadataView, TopicMetadata};
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

pub(crate) const RESOURCE_TOPIC: i8 = 2;
pub(crate) const RESOURCE_BROKER: i8 = 4;

const SOURCE_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT: i8 = 3;
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

    fn is_dynamic(&self) -> bool {
        dynamic_broker_key(self.name).is_some()
    }
}

/// Where the dynamic values of this broker's keys are read.
struct DynamicValues<'a> {
    view: &'a MetadataView,
    node_id: i32,
}

impl DynamicValues<'_> {
    fn get(&self, level: DynamicLevel, name: &str) -> Option<String> {
        dynamic_value(self.view, self.node_id, level, name).map(str::to_owned)
    }
}

/// One config of a resource, ready to encode.
struct Entry {
    name: String,
    value: Option<String>,
    config_type: i8,
    /// Highest precedence first; the first one's source is the entry's.
    synonyms: Vec<Synonym>,
    read_only: bool,
    /// A broker key samsa does not know, stored as Kafka stores custom
    /// configs: Kafka reports those sensitive, their values null.
    sensitive: bool,
    doc: &'static str,
}

struct Synonym {
    name: String,
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
        // --- security (docs/SECURITY.md) ---
        key("listener.security.protocol.map", TYPE_STRING, Some("security_protocol"),
            s(&listener_list(c, |l| l.security_protocol.name().to_owned()).replace("://", ":")),
            s(&format!("{MAIN_LISTENER}:{MAIN_LISTENER}")),
            "samsa: security_protocol (the main listener, named after it) and listeners.<name>.security_protocol. Each listener's security protocol."),
        key("sasl.enabled.mechanisms", TYPE_LIST, Some("sasl_enabled_mechanisms"),
            s(&c.sasl_enabled_mechanisms.join(",")), s(&d.sasl_enabled_mechanisms.join(",")),
            "samsa: sasl_enabled_mechanisms. The SASL mechanisms SASL listeners offer."),
        key("ssl.client.auth", TYPE_STRING, Some("ssl_client_auth"),
            s(&c.ssl_client_auth.name()), s(&d.ssl_client_auth.name()),
            "samsa: ssl_client_auth. Whether TLS listeners ask for a client certificate: none, requested, required."),
        plain!("connections.max.reauth.ms", TYPE_LONG, connections_max_reauth_ms,
            "samsa: connections_max_reauth_ms. The longest a SASL session lasts before the client must re-authenticate (KIP-368); 0, forever."),
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
        key("leader.replication.throttled.rate", TYPE_LONG, Some("leader_replication_throttled_rate"),
            c.leader_replication_throttled_rate.map(|v| v.to_string()), s(&i64::MAX),
            "samsa: leader_replication_throttled_rate. Bytes/s a leader sends to the replicas a reassignment is adding; unset, unthrottled."),
        key("follower.replication.throttled.rate", TYPE_LONG, Some("follower_replication_throttled_rate"),
            c.follower_replication_throttled_rate.map(|v| v.to_string()), s(&i64::MAX),
            "samsa: follower_replication_throttled_rate. Bytes/s a broker fetches for the partitions a reassignment is adding it to; unset, unthrottled."),
        plain!("log.cleaner.backoff.ms", TYPE_LONG, log_cleaner_backoff_ms,
            "samsa: log_cleaner_backoff_ms. How long the cleaner sleeps when no log needs cleaning."),
        plain!("num.recovery.threads.per.data.dir", TYPE_INT, log_open_threads,
            "samsa: log_open_threads. How many partitions are opened at once, recovering them at start-up or creating them for CreateTopics."),
        key("log.cleaner.threads", TYPE_INT, None, None, s(&1),
            "Fixed in samsa: one cleaner task per broker."),
        key("unclean.leader.election.enable", TYPE_BOOLEAN, None, None, s(&false),
            "Whether the controller may elect a replica outside the ISR when no ISR member is left (losing what only the ISR had); read from the topic's value, else the cluster-wide default."),
        key("min.insync.replicas", TYPE_INT, Some("min_insync_replicas"),
            c.min_insync_replicas.map(|v| v.to_string()), None,
            "samsa: min_insync_replicas. In-sync replicas an acks=all produce needs, for topics without their own value; unset, 2 for topics of three or more replicas, else 1."),
        // --- cluster mode ---
        key("controller.quorum.voters", TYPE_LIST, Some("controller_quorum_voters"),
            s(&c.controller_quorum_voters.clone().unwrap_or_default()), s(&""),
            "samsa: controller_quorum_voters. The static controller quorum, id@host:port of each voter; empty, single-node mode."),
        plain!("broker.heartbeat.interval.ms", TYPE_INT, broker_heartbeat_interval_ms,
            "samsa: broker_heartbeat_interval_ms. How often the broker heartbeats the active controller."),
        plain!("broker.session.timeout.ms", TYPE_INT, broker_session_timeout_ms,
            "samsa: broker_session_timeout_ms. A broker without heartbeat this long is fenced and its leaderships move."),
        plain!("auto.leader.rebalance.enable", TYPE_BOOLEAN, auto_leader_rebalance_enable,
            "samsa: auto_leader_rebalance_enable. The controller moves leadership back to preferred replicas when a broker's imbalance passes leader.imbalance.per.broker.percentage."),
        plain!("leader.imbalance.check.interval.seconds", TYPE_LONG, leader_imbalance_check_interval_seconds,
            "samsa: leader_imbalance_check_interval_seconds. How often the controller checks the leader imbalance."),
        plain!("leader.imbalance.per.broker.percentage", TYPE_INT, leader_imbalance_per_broker_percentage,
            "samsa: leader_imbalance_per_broker_percentage. The share of a broker's preferred partitions led elsewhere above which they are moved back."),
        plain!("controller.quorum.election.timeout.ms", TYPE_INT, controller_quorum_election_timeout_ms,
            "samsa: controller_quorum_election_timeout_ms. The base Raft election timeout; a failover takes about 2.5 to 3 times this."),
        plain!("replica.lag.time.max.ms", TYPE_LONG, replica_lag_time_max_ms,
            "samsa: replica_lag_time_max_ms. A follower behind the leader's log end this long leaves the ISR."),
        plain!("replica.fetch.wait.max.ms", TYPE_INT, replica_fetch_wait_max_ms,
            "samsa: replica_fetch_wait_max_ms. How long a leader holds a follower's fetch when it has nothing new."),
        plain!("replica.high.watermark.checkpoint.interval.ms", TYPE_LONG, replica_high_watermark_checkpoint_interval_ms,
            "samsa: replica_high_watermark_checkpoint_interval_ms. How often a partition whose high watermark moved writes it to its checkpoint."),
        plain!("max.incremental.fetch.session.cache.slots", TYPE_INT, max_incremental_fetch_session_cache_slots,
            "samsa: max_incremental_fetch_session_cache_slots. How many fetch sessions (KIP-227) the broker keeps for its clients."),
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

/// Kafka's synonym list of broker config `name`: the members of its family
/// with a value at each level — this broker's dynamic values, the
/// cluster-wide dynamic defaults, the explicit static values, the defaults —
/// from `name` on.
fn broker_synonyms(
    keys: &[BrokerKey],
    config: &BrokerConfig,
    dynamic: &DynamicValues<'_>,
    name: &str,
) -> Vec<Synonym> {
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
    let at_level = |level: DynamicLevel, source: i8| {
        family.iter().filter_map(move |k| {
            dynamic.get(level, k.name).map(|v| Synonym {
                name: k.name.to_owned(),
                value: Some(v),
                source,
            })
        })
    };
    let statics = family
        .iter()
        .filter(|k| k.is_static(config))
        .map(|k| Synonym {
            name: k.name.to_owned(),
            value: k.value.clone(),
            source: SOURCE_STATIC_BROKER,
        });
    let defaults = family.iter().filter_map(|k| {
        k.default.as_ref().map(|d| Synonym {
            name: k.name.to_owned(),
            value: Some(d.clone()),
            source: SOURCE_DEFAULT,
        })
    });
    at_level(DynamicLevel::Broker, SOURCE_DYNAMIC_BROKER)
        .chain(at_level(
            DynamicLevel::ClusterDefault,
            SOURCE_DYNAMIC_DEFAULT,
        ))
        .chain(statics)
        .chain(defaults)
        .skip_while(|s| s.name != name)
        .collect()
}

fn broker_entries(broker: &Broker, view: &MetadataView) -> Vec<Entry> {
    let keys = broker_keys(broker);
    let dynamic = DynamicValues {
        view,
        node_id: broker.config.node_id,
    };
    let mut entries: Vec<Entry> = keys
        .iter()
        .map(|k| {
            let synonyms = broker_synonyms(&keys, &broker.config, &dynamic, k.name);
            let value = match synonyms.first() {
                Some(first) if first.name == k.name => first.value.clone(),
                _ => k.default.clone(),
            };
            Entry {
                name: k.name.to_owned(),
                value,
                config_type: k.config_type,
                synonyms,
                read_only: !k.is_dynamic(),
                sensitive: false,
                doc: k.doc,
            }
        })
        .collect();
    // Custom keys set for this broker or cluster-wide.
    let own = view.broker_configs.get(&broker.config.node_id);
    let custom: std::collections::BTreeSet<&String> = own
        .into_iter()
        .flat_map(|c| c.keys())
        .chain(view.cluster_configs.keys())
        .filter(|name| !keys.iter().any(|k| k.name == name.as_str()))
        .collect();
    for name in custom {
        let levels = [
            (
                own.is_some_and(|c| c.contains_key(name)),
                SOURCE_DYNAMIC_BROKER,
            ),
            (
                view.cluster_configs.contains_key(name),
                SOURCE_DYNAMIC_DEFAULT,
            ),
        ];
        entries.push(custom_entry(
            name,
            levels
                .iter()
                .filter(|(set, _)| *set)
                .map(|(_, source)| *source),
        ));
    }
    entries
}

/// A broker key samsa does not know, set at the `sources` levels: listed
/// as Kafka lists custom configs (sensitive, value null).
fn custom_entry(name: &str, sources: impl Iterator<Item = i8>) -> Entry {
    Entry {
        name: name.to_owned(),
        value: None,
        config_type: TYPE_STRING,
        synonyms: sources
            .map(|source| Synonym {
                name: name.to_owned(),
                value: None,
                source,
            })
            .collect(),
        read_only: false,
        sensitive: true,
        doc: "Not a samsa setting: stored as set, with no effect (Kafka stores unknown broker configs for custom plugins).",
    }
}

/// Whether `name` is a broker config samsa has (dynamic or read-only).
pub(crate) fn is_broker_key(broker: &Broker, name: &str) -> bool {
    broker_keys(broker).iter().any(|k| k.name == name)
}

/// The cluster-wide dynamic defaults that are set, each with its one
/// synonym (Kafka lists only DYNAMIC_DEFAULT_BROKER_CONFIG ones here).
fn cluster_default_entries(broker: &Broker, view: &MetadataView) -> Vec<Entry> {
    let keys = broker_keys(broker);
    view.cluster_configs
        .iter()
        .map(|(name, value)| match keys.iter().find(|k| k.name == name) {
            Some(key) => Entry {
                name: name.clone(),
                value: Some(value.clone()),
                config_type: key.config_type,
                synonyms: vec![Synonym {
                    name: name.clone(),
                    value: Some(value.clone()),
                    source: SOURCE_DYNAMIC_DEFAULT,
                }],
                read_only: false,
                sensitive: false,
                doc: key.doc,
            },
            None => custom_entry(name, std::iter::once(SOURCE_DYNAMIC_DEFAULT)),
        })
        .collect()
}

/// The value a topic runs with for `name`, when it does not set its own.
fn topic_default_value(
    name: &str,
    log: &LogConfig,
    effective: &BrokerConfig,
    topic: &TopicMetadata,
    view: &MetadataView,
) -> Option<String> {
    Some(match name {
        "cleanup.policy" => log.cleanup_policy.name().into(),
        "compression.type" => log.compression_type.name().into(),
        "delete.retention.ms" => log.delete_retention_ms.to_string(),
        "index.interval.bytes" => log.index_interval_bytes.to_string(),
        "max.compaction.lag.ms" => log.max_compaction_lag_ms.to_string(),
        "max.message.bytes" => log.max_message_bytes.to_string(),
        "message.timestamp.type" => if log.message_timestamp_type_log_append {
            "LogAppendTime"
        } else {
            "CreateTime"
        }
        .into(),
        "min.cleanable.dirty.ratio" => log.min_cleanable_dirty_ratio.to_string(),
        "min.compaction.lag.ms" => log.min_compaction_lag_ms.to_string(),
        "min.insync.replicas" => min_insync_replicas(effective, topic).to_string(),
        "retention.bytes" => log.retention_bytes.to_string(),
        "retention.ms" => log.retention_ms.to_string(),
        "segment.bytes" => log.segment_bytes.to_string(),
        "segment.ms" => log.segment_ms.to_string(),
        "unclean.leader.election.enable" => view
            .cluster_configs
            .get(name)
            .cloned()
            .unwrap_or_else(|| "false".into()),
        other => return compatibility_default(other).map(str::to_owned),
    })
}

fn topic_entries(broker: &Broker, view: &MetadataView, topic: &TopicMetadata) -> Vec<Entry> {
    let effective = broker.effective_config();
    let log = topic_log_config(&effective.log, topic);
    let keys = broker_keys(broker);
    let dynamic = DynamicValues {
        view,
        node_id: broker.config.node_id,
    };
    TOPIC_CONFIG_KEYS
        .iter()
        .map(|k| {
            let own = topic.configs.get(k.name);
            let mut synonyms: Vec<Synonym> = own
                .map(|v| Synonym {
                    name: k.name.to_owned(),
                    value: Some(v.clone()),
                    source: SOURCE_TOPIC,
                })
                .into_iter()
                .collect();
            synonyms.extend(broker_synonyms(
                &keys,
                &broker.config,
                &dynamic,
                k.broker_key,
            ));
            Entry {
                name: k.name.to_owned(),
                value: own
                    .cloned()
                    .or_else(|| topic_default_value(k.name, &log, &effective, topic, view)),
                config_type: k.config_type as i8,
                synonyms,
                read_only: false,
                sensitive: false,
                doc: k.doc,
            }
        })
        .collect()
}

fn describe_resource(
    broker: &Broker,
    resource: &DescribeConfigsResource,
) -> Result<Vec<Entry>, (ResponseError, String)> {
    let name = resource.resource_name.as_str();
    let view = broker.metadata.image();
    match resource.resource_type {
        RESOURCE_TOPIC => match view.topic(name) {
            Some(topic) => Ok(topic_entries(broker, &view, topic)),
            None => Err((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name} does not exist"),
            )),
        },
        RESOURCE_BROKER if name.is_empty() => Ok(cluster_default_entries(broker, &view)),
        RESOURCE_BROKER => match name.parse::<i32>() {
            Ok(id) if id == broker.config.node_id => Ok(broker_entries(broker, &view)),
            Ok(id) => Err((
                ResponseError::InvalidRequest,
                format!(
                    "Unexpected broker id, expected {} or empty string, but received {id}",
                    broker.config.node_id
                ),
            )),
            Err(_) => Err((
                ResponseError::InvalidRequest,
                format!("Broker id must be an integer, but it is: {name}"),
            )),
        },
        other => Err((
            ResponseError::InvalidRequest,
            format!("unsupported resource type {other}"),
        )),
    }
}

/// Kafka's authorization of a config resource: `operation`
/// (DESCRIBE_CONFIGS or ALTER_CONFIGS) on the topic, or on the cluster for
/// a broker; a resource of another type is left to the handler to refuse.
pub(crate) fn authorize_config_resource(
    access: &Access,
    operation: AclOperation,
    resource_type: i8,
    name: &str,
) -> Result<(), (ResponseError, String)> {
    let allowed = match resource_type {
        RESOURCE_TOPIC => access.allows_topic(operation, name),
        RESOURCE_BROKER => access.allows_cluster(operation),
        _ => true,
    };
    if allowed {
        return Ok(());
    }
    let error = if resource_type == RESOURCE_TOPIC {
        ResponseError::TopicAuthorizationFailed
    } else {
        ResponseError::ClusterAuthorizationFailed
    };
    Err((
        error,
        format!("not authorized to {operation} of this resource"),
    ))
}

pub fn describe_configs(
    broker: &Broker,
    access: &Access,
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
            let described = authorize_config_resource(
                access,
                AclOperation::DescribeConfigs,
                resource.resource_type,
                resource.resource_name.as_str(),
            )
            .and_then(|()| describe_resource(broker, resource));
            match described {
                Ok(entries) => {
                    // A null or empty key list asks for every config.
                    let wanted = |name: &str| {
                        resource.configuration_keys.as_ref().is_none_or(|keys| {
                            keys.is_empty() || keys.iter().any(|k| k.as_str() == name)
                        })
                    };
                    result.configs = entries
                        .into_iter()
                        .filter(|e| wanted(&e.name))
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
        .with_is_sensitive(e.sensitive)
        .with_synonyms(synonyms)
        .with_config_type(e.config_type)
        // Null unless asked for (the codec's default is "").
        .with_documentation(include_documentation.then(|| str_bytes(e.doc)))
}
