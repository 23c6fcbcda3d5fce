//! DescribeConfigs for topics (2) and brokers (4): the effective value of every
//! config samsa understands, with where it comes from.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};

use samsa_storage::CompressionType;

use super::str_bytes;
use crate::metadata::{topic_log_config, TopicMetadata};
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
const TYPE_LIST: i8 = 7;

struct Entry {
    name: &'static str,
    value: String,
    source: i8,
    config_type: i8,
}

fn topic_entries(broker: &Broker, topic: &TopicMetadata) -> Vec<Entry> {
    let log = &broker.config.log;
    let default = |name: &'static str, value: String, config_type: i8| {
        let (value, source) = match topic.configs.get(name) {
            Some(v) => (v.clone(), SOURCE_TOPIC),
            None => (value, SOURCE_DEFAULT),
        };
        Entry {
            name,
            value,
            source,
            config_type,
        }
    };
    vec![
        default("cleanup.policy", "delete".into(), TYPE_LIST),
        compression_type_entry(broker, topic),
        default(
            "max.message.bytes",
            log.max_message_bytes.to_string(),
            TYPE_INT,
        ),
        default(
            "message.timestamp.type",
            if log.message_timestamp_type_log_append {
                "LogAppendTime".into()
            } else {
                "CreateTime".into()
            },
            TYPE_STRING,
        ),
        default(
            "min.insync.replicas",
            crate::apply::min_insync_replicas(topic).to_string(),
            TYPE_INT,
        ),
        default(
            "retention.bytes",
            log.retention_bytes.to_string(),
            TYPE_LONG,
        ),
        default("retention.ms", log.retention_ms.to_string(), TYPE_LONG),
        default("segment.bytes", log.segment_bytes.to_string(), TYPE_INT),
        default("segment.ms", log.segment_ms.to_string(), TYPE_LONG),
        default(
            "unclean.leader.election.enable",
            "false".into(),
            TYPE_BOOLEAN,
        ),
    ]
}

/// A topic's `compression.type`: its own config, else the broker's
/// `log.compression_type` (a static broker config when it is not Kafka's
/// default `producer`).
fn compression_type_entry(broker: &Broker, topic: &TopicMetadata) -> Entry {
    let effective = topic_log_config(&broker.config.log, topic).compression_type;
    let source = if topic.configs.contains_key("compression.type") {
        SOURCE_TOPIC
    } else if effective != CompressionType::default() {
        SOURCE_STATIC_BROKER
    } else {
        SOURCE_DEFAULT
    };
    Entry {
        name: "compression.type",
        value: effective.name().into(),
        source,
        config_type: TYPE_STRING,
    }
}

fn broker_entries(broker: &Broker) -> Vec<Entry> {
    let c = &broker.config;
    let entry = |name: &'static str, value: String, config_type: i8| Entry {
        name,
        value,
        source: SOURCE_STATIC_BROKER,
        config_type,
    };
    vec![
        entry("node.id", c.node_id.to_string(), TYPE_INT),
        entry("broker.id", c.node_id.to_string(), TYPE_INT),
        entry("log.dirs", c.data_dir.display().to_string(), TYPE_STRING),
        entry("num.partitions", c.num_partitions.to_string(), TYPE_INT),
        entry(
            "auto.create.topics.enable",
            c.auto_create_topics_enable.to_string(),
            TYPE_BOOLEAN,
        ),
        entry(
            "default.replication.factor",
            broker.default_replication_factor().to_string(),
            TYPE_SHORT,
        ),
        entry(
            "socket.request.max.bytes",
            c.max_request_bytes.to_string(),
            TYPE_INT,
        ),
        entry(
            "log.retention.check.interval.ms",
            c.retention_check_interval_ms.to_string(),
            TYPE_LONG,
        ),
        entry(
            "log.segment.bytes",
            c.log.segment_bytes.to_string(),
            TYPE_INT,
        ),
        entry("log.roll.ms", c.log.segment_ms.to_string(), TYPE_LONG),
        entry(
            "log.retention.ms",
            c.log.retention_ms.to_string(),
            TYPE_LONG,
        ),
        entry(
            "log.retention.bytes",
            c.log.retention_bytes.to_string(),
            TYPE_LONG,
        ),
        entry(
            "log.index.interval.bytes",
            c.log.index_interval_bytes.to_string(),
            TYPE_INT,
        ),
        entry(
            "message.max.bytes",
            c.log.max_message_bytes.to_string(),
            TYPE_INT,
        ),
        entry(
            "compression.type",
            c.log.compression_type.name().into(),
            TYPE_STRING,
        ),
        entry(
            "producer.id.expiration.ms",
            c.log.producer_id_expiration_ms.to_string(),
            TYPE_INT,
        ),
    ]
}

pub fn describe_configs(
    broker: &Broker,
    request: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let image = broker.metadata.image();
    let results = request
        .resources
        .into_iter()
        .map(|resource| {
            let name = resource.resource_name.as_str().to_string();
            let mut result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            let entries = match resource.resource_type {
                RESOURCE_TOPIC => match image.topic(&name) {
                    Some(topic) => Ok(topic_entries(broker, topic)),
                    None => Err((
                        ResponseError::UnknownTopicOrPartition,
                        format!("topic {name} does not exist"),
                    )),
                },
                RESOURCE_BROKER => {
                    if name.is_empty() || name == broker.config.node_id.to_string() {
                        Ok(broker_entries(broker))
                    } else {
                        Err((
                            ResponseError::InvalidRequest,
                            format!("unknown broker {name}"),
                        ))
                    }
                }
                other => Err((
                    ResponseError::InvalidRequest,
                    format!("unsupported resource type {other}"),
                )),
            };
            match entries {
                Ok(entries) => {
                    result.configs = entries
                        .into_iter()
                        .filter(|e| {
                            resource
                                .configuration_keys
                                .as_ref()
                                .is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name))
                        })
                        .map(|e| {
                            let mut config = DescribeConfigsResourceResult::default()
                                .with_name(str_bytes(e.name))
                                .with_value(Some(str_bytes(e.value)))
                                .with_read_only(resource.resource_type == RESOURCE_BROKER)
                                .with_config_source(e.source);
                            if version >= 3 {
                                config = config.with_config_type(e.config_type);
                            }
                            config
                        })
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
