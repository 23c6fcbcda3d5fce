//! Topic administration (CreateTopics, DeleteTopics, CreatePartitions),
//! DescribeCluster and UnregisterBroker. Every change goes through [`Broker`] and its metadata
//! store (the local file, or the controller quorum in cluster mode), which
//! makes the change durable before logs are opened or removed. Replica counts
//! and assignments are checked against the brokers in the metadata image.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, DescribeClusterRequest,
    DescribeClusterResponse, UnregisterBrokerRequest, UnregisterBrokerResponse,
};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::dynamic_config::{validate_topic_config, validate_topic_configs};
use crate::error::{metadata_error_code, MetadataError};
use crate::metadata::{validate_topic_name, MetadataView, NewTopic};
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// Checks that an assignment names only known brokers, each once per partition.
fn check_assignment(
    image: &MetadataView,
    partition: i32,
    brokers: &[i32],
) -> Result<(), MetadataError> {
    if brokers.is_empty() {
        return Err(MetadataError::InvalidReplicaAssignment(format!(
            "partition {partition} has no replicas"
        )));
    }
    if let Some(unknown) = brokers.iter().find(|b| image.broker(**b).is_none()) {
        let known: Vec<i32> = image.brokers.iter().map(|b| b.node_id).collect();
        return Err(MetadataError::InvalidReplicaAssignment(format!(
            "partition {partition} names broker {unknown}; the brokers are {known:?}"
        )));
    }
    let mut distinct = brokers.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != brokers.len() {
        return Err(MetadataError::InvalidReplicaAssignment(format!(
            "partition {partition} lists a broker twice"
        )));
    }
    Ok(())
}

fn new_topic_from_request(
    broker: &Broker,
    topic: &CreatableTopic,
) -> Result<NewTopic, MetadataError> {
    let name = topic.name.0.as_str().to_string();
    validate_topic_name(&name)?;
    let image = broker.metadata.image();
    let available = image.live_brokers().count();
    let mut assignments = None;
    let (partitions, replication_factor) = if topic.assignments.is_empty() {
        let partitions = if topic.num_partitions == -1 {
            broker.config.num_partitions
        } else {
            topic.num_partitions
        };
        let replication_factor = if topic.replication_factor == -1 {
            broker.default_replication_factor()
        } else {
            topic.replication_factor
        };
        (partitions, replication_factor)
    } else {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err(MetadataError::InvalidReplicaAssignment(
                "both numPartitions/replicationFactor and replica assignments were given".into(),
            ));
        }
        let mut indexes: Vec<i32> = topic
            .assignments
            .iter()
            .map(|a| a.partition_index)
            .collect();
        indexes.sort_unstable();
        if indexes.iter().enumerate().any(|(i, p)| *p != i as i32) {
            return Err(MetadataError::InvalidReplicaAssignment(
                "partitions must be numbered consecutively from 0".into(),
            ));
        }
        let mut by_index: Vec<&_> = topic.assignments.iter().collect();
        by_index.sort_by_key(|a| a.partition_index);
        let mut lists = Vec::with_capacity(by_index.len());
        for assignment in by_index {
            let ids: Vec<i32> = assignment.broker_ids.iter().map(|b| b.0).collect();
            check_assignment(&image, assignment.partition_index, &ids)?;
            lists.push(ids);
        }
        let replication_factor = topic.assignments[0].broker_ids.len() as i16;
        if lists.iter().any(|l| l.len() != replication_factor as usize) {
            return Err(MetadataError::InvalidReplicaAssignment(
                "all partitions must have the same number of replicas".into(),
            ));
        }
        assignments = Some(lists);
        (indexes.len() as i32, replication_factor)
    };
    if partitions <= 0 {
        return Err(MetadataError::InvalidPartitions {
            count: partitions,
            reason: "number of partitions must be larger than 0".into(),
        });
    }
    if replication_factor <= 0 || replication_factor as usize > available {
        return Err(MetadataError::InvalidReplicationFactor {
            requested: replication_factor,
            available,
        });
    }
    let mut configs = BTreeMap::new();
    for config in &topic.configs {
        let key = config.name.as_str().to_string();
        let Some(value) = config.value.as_ref().map(|v| v.as_str().to_string()) else {
            continue;
        };
        validate_topic_config(&key, &value)?;
        configs.insert(key, value);
    }
    validate_topic_configs(&broker.effective_config().log, &configs)?;
    Ok(NewTopic {
        name,
        partitions,
        replication_factor,
        configs,
        assignments,
    })
}

/// Authorization as Kafka's: CREATE on the cluster or on the topic, else
/// TOPIC_AUTHORIZATION_FAILED.
pub async fn create_topics(
    broker: &Broker,
    access: &Access,
    request: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    let may_create_any = access.allows_cluster(AclOperation::Create);
    for topic in &request.topics {
        let mut result = CreatableTopicResult::default()
            .with_name(topic.name.clone())
            .with_num_partitions(-1)
            .with_replication_factor(-1);
        if !may_create_any && !access.allows_topic(AclOperation::Create, topic.name.0.as_str()) {
            result.error_code = ResponseError::TopicAuthorizationFailed.code();
            result.error_message = Some(str_bytes(format!(
                "not authorized to create topic {}",
                topic.name.0.as_str()
            )));
            results.push(result);
            continue;
        }
        let outcome = match new_topic_from_request(broker, topic) {
            Ok(new_topic) if request.validate_only => {
                if broker.metadata.image().topic(&new_topic.name).is_some() {
                    Err(MetadataError::TopicAlreadyExists(new_topic.name))
                } else {
                    Ok((
                        Uuid::nil(),
                        new_topic.partitions,
                        new_topic.replication_factor,
                        new_topic.configs,
                    ))
                }
            }
            Ok(new_topic) => broker.create_topic(new_topic).await.map(|created| {
                (
                    created.topic_id,
                    created.partitions,
                    created.replication_factor,
                    created.configs.clone(),
                )
            }),
            Err(e) => Err(e),
        };
        match outcome {
            Ok((id, partitions, replication_factor, configs)) => {
                // Null on success, as Kafka sends it (the codec's default is "").
                result.error_message = None;
                result.topic_id = id;
                result.num_partitions = partitions;
                result.replication_factor = replication_factor;
                if version >= 5 {
                    result.configs = Some(
                        configs
                            .into_iter()
                            .map(|(k, v)| {
                                CreatableTopicConfigs::default()
                                    .with_name(str_bytes(k))
                                    .with_value(Some(str_bytes(v)))
                                    .with_config_source(1)
                            })
                            .collect(),
                    );
                }
            }
            Err(e) => {
                result.error_code = metadata_error_code(&e).code();
                result.error_message = Some(str_bytes(e.to_string()));
            }
        }
        results.push(result);
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED.
pub async fn delete_topics(
    broker: &Broker,
    access: &Access,
    request: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    // v6 names topics by name or id in `topics`; earlier versions use `topic_names`.
    let wanted: Vec<(Option<String>, Uuid)> = if version >= 6 {
        request
            .topics
            .iter()
            .map(|t| {
                (
                    t.name.as_ref().map(|n| n.0.as_str().to_string()),
                    t.topic_id,
                )
            })
            .collect()
    } else {
        request
            .topic_names
            .iter()
            .map(|n| (Some(n.0.as_str().to_string()), Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(wanted.len());
    for (name, id) in wanted {
        let image = broker.metadata.image();
        let resolved = match &name {
            Some(name) => Ok(name.clone()),
            None => image
                .topic_by_id(&id)
                .map(|t| t.name.clone())
                .ok_or(ResponseError::UnknownTopicId),
        };
        let mut result = DeletableTopicResult::default()
            .with_name(name.clone().map(topic_name))
            .with_topic_id(id);
        let resolved = resolved.and_then(|resolved| {
            if access.allows_topic(AclOperation::Delete, &resolved) {
                Ok(resolved)
            } else {
                Err(ResponseError::TopicAuthorizationFailed)
            }
        });
        match resolved {
            Ok(resolved) => match broker.delete_topic(resolved.clone()).await {
                Ok(deleted) => {
                    result.name = Some(topic_name(resolved));
                    result.topic_id = deleted.topic_id;
                }
                Err(e) => {
                    result.error_code = metadata_error_code(&e).code();
                    result.error_message = Some(str_bytes(e.to_string()));
                }
            },
            Err(code) => {
                result.error_code = code.code();
                result.error_message = Some(str_bytes(code.to_string()));
            }
        }
        responses.push(result);
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

/// ALTER on the topic, else TOPIC_AUTHORIZATION_FAILED.
pub async fn create_partitions(
    broker: &Broker,
    access: &Access,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let name = topic.name.0.as_str().to_string();
        let mut result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        if !access.allows_topic(AclOperation::Alter, &name) {
            result.error_code = ResponseError::TopicAuthorizationFailed.code();
            result.error_message = Some(str_bytes(format!("not authorized to alter topic {name}")));
            results.push(result);
            continue;
        }
        let image = broker.metadata.image();
        let current = image.topic(&name).map_or(0, |t| t.partitions);
        let assignments: Option<Vec<Vec<i32>>> = topic.assignments.as_ref().map(|assignments| {
            assignments
                .iter()
                .map(|a| a.broker_ids.iter().map(|b| b.0).collect())
                .collect()
        });
        let bad_assignment = assignments.as_ref().and_then(|lists| {
            lists
                .iter()
                .zip(current..)
                .find_map(|(ids, partition)| check_assignment(&image, partition, ids).err())
        });
        let outcome = if let Some(e) = bad_assignment {
            Err(e)
        } else if request.validate_only {
            match broker.metadata.image().topic(&name) {
                None => Err(MetadataError::UnknownTopic(name.clone())),
                Some(t) if topic.count <= t.partitions => Err(MetadataError::InvalidPartitions {
                    count: topic.count,
                    reason: format!("topic already has {} partitions", t.partitions),
                }),
                Some(_) => Ok(()),
            }
        } else {
            broker
                .create_partitions(name, topic.count, assignments)
                .await
                .map(|_| ())
        };
        if let Err(e) = outcome {
            result.error_code = metadata_error_code(&e).code();
            result.error_message = Some(str_bytes(e.to_string()));
        }
        results.push(result);
    }
    CreatePartitionsResponse::default().with_results(results)
}

/// `endpoint_type` of DescribeCluster v1+: 1 asks a broker, 2 a controller.
const ENDPOINT_BROKERS: i8 = 1;
const ENDPOINT_CONTROLLERS: i8 = 2;

/// DescribeCluster: the unfenced brokers, and from v2 with
/// `include_fenced_brokers` the fenced ones too, flagged. samsa's Kafka
/// listener is a broker endpoint: a v1+ request for controllers gets
/// MISMATCHED_ENDPOINT_TYPE (controllers speak gRPC, not the Kafka protocol),
/// an unknown endpoint type UNSUPPORTED_ENDPOINT_TYPE (v0: INVALID_REQUEST).
pub fn describe_cluster(
    broker: &Broker,
    access: &Access,
    request: DescribeClusterRequest,
    version: i16,
    listener: &str,
) -> DescribeClusterResponse {
    let endpoint_error = match request.endpoint_type {
        ENDPOINT_BROKERS => None,
        ENDPOINT_CONTROLLERS => Some((
            ResponseError::MismatchedEndpointType,
            "this is a broker endpoint; samsa's controllers are not reachable over the Kafka protocol",
        )),
        _ => Some((
            ResponseError::UnsupportedEndpointType,
            "unknown endpoint type",
        )),
    };
    if let Some((error, message)) = endpoint_error {
        let error = if version == 0 {
            ResponseError::InvalidRequest
        } else {
            error
        };
        return DescribeClusterResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(format!(
                "{message} ({})",
                request.endpoint_type
            ))));
    }
    let include_fenced = version >= 2 && request.include_fenced_brokers;
    let image = broker.metadata.image();
    // As in Metadata: the addresses of the client's listener; brokers
    // without it are left out.
    let brokers = image
        .brokers
        .iter()
        .filter(|b| include_fenced || !b.fenced)
        .filter_map(|b| {
            let endpoint = b.endpoint(listener)?;
            Some(
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.node_id))
                    .with_host(str_bytes(endpoint.host.clone()))
                    .with_port(endpoint.port)
                    .with_rack(b.rack.clone().map(str_bytes))
                    .with_is_fenced(include_fenced && b.fenced),
            )
        })
        .collect();
    let mut response = DescribeClusterResponse::default();
    if request.include_cluster_authorized_operations {
        response.cluster_authorized_operations = access.authorized_operations(
            crate::security::access::CLUSTER_OPERATIONS,
            crate::security::acl::ResourceType::Cluster,
            crate::security::acl::CLUSTER_NAME,
        );
    }
    response
        .with_cluster_id(str_bytes(image.cluster_id.clone()))
        .with_controller_id(BrokerId(image.controller_id))
        .with_brokers(brokers)
}

/// UnregisterBroker (v0): ALTER on the cluster, as Kafka checks it; the
/// controller fences the broker if it is active and removes its
/// registration (BROKER_ID_NOT_REGISTERED for an unknown id).
pub async fn unregister_broker(
    broker: &Broker,
    access: &Access,
    request: UnregisterBrokerRequest,
) -> UnregisterBrokerResponse {
    if !access.allows_cluster(AclOperation::Alter) {
        return UnregisterBrokerResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let broker_id = request.broker_id.0;
    match broker.metadata.unregister_broker(broker_id).await {
        Ok(()) => {
            tracing::info!(broker_id, "broker unregistered");
            UnregisterBrokerResponse::default()
        }
        Err(e) => {
            tracing::info!(broker_id, error = %e, "UnregisterBroker refused");
            UnregisterBrokerResponse::default()
                .with_error_code(metadata_error_code(&e).code())
                .with_error_message(Some(str_bytes(e.to_string())))
        }
    }
}
