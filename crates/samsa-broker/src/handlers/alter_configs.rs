//! IncrementalAlterConfigs (44) and AlterConfigs (33) for topics and
//! brokers: what a request asks, checked as Kafka checks it, then made
//! durable in the metadata (the controller's log in a cluster, the
//! metadata file on a single node) through [`Broker::alter_configs`].
//! What a key means and whether it may change is `dynamic_config`'s.
//!
//! Kafka's answers, kept here:
//! - a topic's bad value or unknown key: INVALID_CONFIG; an unknown topic:
//!   UNKNOWN_TOPIC_OR_PARTITION (checked after the values, as Kafka does);
//! - a broker config that cannot change at run time, or a bad value for
//!   one: INVALID_REQUEST with Kafka's message (Kafka answers broker
//!   validation failures so, KAFKA-13609); a broker key samsa does not
//!   have is stored with no effect, as Kafka stores custom configs (and
//!   logged);
//! - a broker resource is the cluster-wide defaults (empty name) or this
//!   broker (its id); another id is INVALID_REQUEST, since clients send it
//!   to that broker;
//! - APPEND / SUBTRACT only on list configs (INVALID_CONFIG otherwise);
//! - a key twice in one resource, a resource twice in one request, a null
//!   value to set: INVALID_REQUEST;
//! - AlterConfigs replaces the resource's whole set: keys it does not
//!   name are removed;
//! - `validate_only` runs every check and changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::configs::{is_broker_key, RESOURCE_BROKER, RESOURCE_TOPIC};
use super::str_bytes;
use crate::dynamic_config::{
    topic_config_key, topic_log_config, validate_broker_config, validate_topic_config,
    validate_topic_configs, ConfigType,
};
use crate::error::{metadata_error_code, MetadataError};
use crate::metadata::{ConfigResource, MetadataView};
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// Kafka's `AlterConfigOp.OpType`.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// A refused resource: the code and message it is answered with.
type Refusal = (ResponseError, String);

fn invalid_request(message: impl Into<String>) -> Refusal {
    (ResponseError::InvalidRequest, message.into())
}

/// One entry of either request: a key, the operation, the value.
struct Op {
    name: String,
    op: i8,
    value: Option<String>,
}

/// Which config resource a request names, as Kafka reads it.
fn resource_of(broker: &Broker, resource_type: i8, name: &str) -> Result<ConfigResource, Refusal> {
    match resource_type {
        RESOURCE_TOPIC if name.is_empty() => {
            Err(invalid_request("Default topic resources are not allowed."))
        }
        RESOURCE_TOPIC => Ok(ConfigResource::Topic { name: name.into() }),
        RESOURCE_BROKER if name.is_empty() => Ok(ConfigResource::Cluster),
        RESOURCE_BROKER => match name.parse::<i32>() {
            Ok(id) if id == broker.config.node_id => Ok(ConfigResource::Broker { id }),
            Ok(id) => Err(invalid_request(format!(
                "Unexpected broker id, expected {}, but received {id}",
                broker.config.node_id
            ))),
            Err(_) => Err(invalid_request(format!(
                "Node id must be an integer, but it is: {name}"
            ))),
        },
        other => Err(invalid_request(format!(
            "Unsupported resource type {other}: samsa alters topic (2) and broker (4) configs"
        ))),
    }
}

/// Whether a key takes a comma-separated list (APPEND / SUBTRACT apply).
fn is_list(resource: &ConfigResource, name: &str) -> bool {
    match resource {
        ConfigResource::Topic { .. } => {
            topic_config_key(name).is_some_and(|k| k.config_type == ConfigType::List)
        }
        _ => name == "log.cleanup.policy",
    }
}

/// The value a list key has now: the resource's own, else the one in force.
fn current_list(
    broker: &Broker,
    view: &MetadataView,
    resource: &ConfigResource,
    own: &BTreeMap<String, String>,
    name: &str,
) -> Vec<String> {
    let value = own.get(name).cloned().unwrap_or_else(|| {
        let effective = broker.effective_config();
        match resource {
            ConfigResource::Topic { name: topic } => view
                .topic(topic)
                .map(|t| topic_log_config(&effective.log, t))
                .unwrap_or_else(|| effective.log.clone())
                .cleanup_policy
                .name()
                .to_owned(),
            _ => effective.log.cleanup_policy.name().to_owned(),
        }
    });
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The changes a resource's operations make, checked (see the module
/// docs); `replace` (AlterConfigs) also removes every key not named.
fn plan_changes(
    broker: &Broker,
    view: &MetadataView,
    resource: &ConfigResource,
    ops: &[Op],
    replace: bool,
) -> Result<Vec<(String, Option<String>)>, Refusal> {
    let mut seen = BTreeSet::new();
    if ops.iter().any(|o| !seen.insert(o.name.as_str())) {
        return Err(invalid_request("Error due to duplicate config keys"));
    }
    let own = view.resource_configs(resource).unwrap_or_default();
    let mut changes: Vec<(String, Option<String>)> = Vec::new();
    for op in ops {
        let value = match op.op {
            OP_DELETE => None,
            OP_SET | OP_APPEND | OP_SUBTRACT => Some(op.value.clone().ok_or_else(|| {
                invalid_request(format!("Null value not supported for : {}", op.name))
            })?),
            other => {
                return Err(invalid_request(format!(
                    "Unknown config operation {other} for key {}",
                    op.name
                )))
            }
        };
        let value = match (op.op, value) {
            (OP_APPEND | OP_SUBTRACT, Some(v)) => {
                if !is_list(resource, &op.name) {
                    let verb = if op.op == OP_APPEND {
                        "append"
                    } else {
                        "subtract"
                    };
                    return Err((
                        ResponseError::InvalidConfig,
                        format!(
                            "Config value {verb} is not allowed for config key: {}",
                            op.name
                        ),
                    ));
                }
                let mut list = current_list(broker, view, resource, &own, &op.name);
                let items = v.split(',').map(str::trim).filter(|s| !s.is_empty());
                if op.op == OP_APPEND {
                    for item in items {
                        if !list.iter().any(|l| l == item) {
                            list.push(item.to_owned());
                        }
                    }
                } else {
                    let remove: Vec<&str> = items.collect();
                    list.retain(|l| !remove.contains(&l.as_str()));
                }
                // An emptied list goes back to the default, as in Kafka.
                (!list.is_empty()).then(|| list.join(","))
            }
            (_, value) => value,
        };
        changes.push((op.name.clone(), value));
    }
    if replace {
        for name in own.keys() {
            if !changes.iter().any(|(n, _)| n == name) {
                changes.push((name.clone(), None));
            }
        }
    }
    match resource {
        ConfigResource::Topic { name: topic } => {
            let mut merged = own.clone();
            for (name, value) in &changes {
                match value {
                    Some(v) => {
                        validate_topic_config(name, v).map_err(topic_refusal)?;
                        merged.insert(name.clone(), v.clone());
                    }
                    None => {
                        if topic_config_key(name).is_none() {
                            return Err((
                                ResponseError::InvalidConfig,
                                format!("Unknown topic config name: {name}"),
                            ));
                        }
                        merged.remove(name);
                    }
                }
            }
            validate_topic_configs(&broker.effective_config().log, &merged)
                .map_err(topic_refusal)?;
            if view.topic(topic).is_none() {
                return Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("The topic '{topic}' does not exist."),
                ));
            }
        }
        ConfigResource::Cluster | ConfigResource::Broker { .. } => {
            for (name, value) in &changes {
                let samsa_key = is_broker_key(broker, name);
                validate_broker_config(name, value.as_deref(), samsa_key)
                    .map_err(|e| invalid_request(e.to_string()))?;
                if !samsa_key && value.is_some() {
                    tracing::warn!(key = %name, "storing a broker config samsa does not have; it has no effect here (Kafka stores unknown broker configs for custom plugins)");
                }
            }
        }
    }
    Ok(changes)
}

/// A topic config refused, answered INVALID_CONFIG in Kafka's words.
fn topic_refusal(e: MetadataError) -> Refusal {
    match e {
        MetadataError::InvalidConfig { key, .. } if topic_config_key(&key).is_none() => (
            ResponseError::InvalidConfig,
            format!("Unknown topic config name: {key}"),
        ),
        MetadataError::InvalidConfig { key, value, reason } => (
            ResponseError::InvalidConfig,
            format!("Invalid value {value} for configuration {key}: {reason}"),
        ),
        other => (metadata_error_code(&other), other.to_string()),
    }
}

/// Checks and applies one resource's operations.
async fn alter_resource(
    broker: &Broker,
    resource_type: i8,
    resource_name: &str,
    ops: &[Op],
    replace: bool,
    validate_only: bool,
) -> Result<(), Refusal> {
    let resource = resource_of(broker, resource_type, resource_name)?;
    let view = broker.metadata.image();
    let changes = plan_changes(broker, &view, &resource, ops, replace)?;
    if validate_only || changes.is_empty() {
        return Ok(());
    }
    broker
        .alter_configs(resource, changes)
        .await
        .map_err(|e| (metadata_error_code(&e), e.to_string()))
}

/// The outcome of every resource of a request, in its order: resources
/// named twice are all refused, as Kafka does.
async fn alter_all(
    broker: &Broker,
    access: &Access,
    resources: Vec<(i8, StrBytes, Vec<Op>)>,
    replace: bool,
    validate_only: bool,
) -> Vec<(i8, StrBytes, Result<(), Refusal>)> {
    let mut counts: BTreeMap<(i8, String), usize> = BTreeMap::new();
    for (t, name, _) in &resources {
        *counts.entry((*t, name.to_string())).or_default() += 1;
    }
    let mut results = Vec::with_capacity(resources.len());
    for (resource_type, name, ops) in resources {
        let outcome = if counts[&(resource_type, name.to_string())] > 1 {
            Err(invalid_request("Each resource must appear at most once."))
        } else if let Err(refusal) = super::configs::authorize_config_resource(
            access,
            AclOperation::AlterConfigs,
            resource_type,
            name.as_str(),
        ) {
            Err(refusal)
        } else {
            alter_resource(broker, resource_type, &name, &ops, replace, validate_only).await
        };
        if let Err((code, message)) = &outcome {
            tracing::info!(resource_type, resource = %name, error = ?code, %message, "config change refused");
        }
        results.push((resource_type, name, outcome));
    }
    results
}

fn error_fields(outcome: &Result<(), Refusal>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (0, None),
        Err((code, message)) => (code.code(), Some(str_bytes(message.clone()))),
    }
}

pub async fn incremental_alter_configs(
    broker: &Broker,
    access: &Access,
    request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let resources = request
        .resources
        .into_iter()
        .map(|r| {
            let ops = r
                .configs
                .into_iter()
                .map(|c| Op {
                    name: c.name.to_string(),
                    op: c.config_operation,
                    value: c.value.map(|v| v.to_string()),
                })
                .collect();
            (r.resource_type, r.resource_name, ops)
        })
        .collect();
    let results = alter_all(broker, access, resources, false, request.validate_only).await;
    IncrementalAlterConfigsResponse::default().with_responses(
        results
            .into_iter()
            .map(|(resource_type, name, outcome)| {
                let (code, message) = error_fields(&outcome);
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            })
            .collect(),
    )
}

pub async fn alter_configs(
    broker: &Broker,
    access: &Access,
    request: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let resources = request
        .resources
        .into_iter()
        .map(|r| {
            let ops = r
                .configs
                .into_iter()
                .map(|c| Op {
                    name: c.name.to_string(),
                    // A null value in AlterConfigs removes the key.
                    op: if c.value.is_some() { OP_SET } else { OP_DELETE },
                    value: c.value.map(|v| v.to_string()),
                })
                .collect();
            (r.resource_type, r.resource_name, ops)
        })
        .collect();
    let results = alter_all(broker, access, resources, true, request.validate_only).await;
    AlterConfigsResponse::default().with_responses(
        results
            .into_iter()
            .map(|(resource_type, name, outcome)| {
                let (code, message) = error_fields(&outcome);
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_error_code(code)
                    .with_error_message(message)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            })
            .collect(),
    )
}
