//! Metadata: topics, partitions (leader, epoch, replicas, ISR) and the live
//! brokers, all from the broker's metadata image, with auto-creation.
//!
//! Authorization as Kafka's: a request for every topic lists only those the
//! caller may DESCRIBE; a named topic it may not DESCRIBE answers
//! TOPIC_AUTHORIZATION_FAILED (without its id), whether it exists or not,
//! and auto-creation needs CREATE on the cluster or on the topic.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::error::metadata_error_code;
use crate::metadata::{
    is_internal_topic, validate_topic_name, MetadataView, TopicMetadata, NO_LEADER,
};
use crate::security::access::Access;
use crate::security::access::{CLUSTER_OPERATIONS, TOPIC_OPERATIONS};
use crate::security::acl::{AclOperation, ResourceType, CLUSTER_NAME};
use crate::Broker;

pub async fn handle(
    broker: &Broker,
    access: &Access,
    request: MetadataRequest,
    version: i16,
    listener: &str,
) -> MetadataResponse {
    let image = broker.metadata.image();
    let topic_operations = version >= 8 && request.include_topic_authorized_operations;
    let cluster_operations =
        ((8..=10).contains(&version) && request.include_cluster_authorized_operations).then(|| {
            access.authorized_operations(CLUSTER_OPERATIONS, ResourceType::Cluster, CLUSTER_NAME)
        });

    let mut topics = Vec::new();
    match request.topics {
        None => {
            for topic in image.topics.values() {
                if !access.allows_topic(AclOperation::Describe, &topic.name) {
                    continue;
                }
                topics.push(topic_response(
                    broker,
                    access,
                    topic,
                    topic_operations,
                    version,
                    listener,
                ));
            }
        }
        Some(requested) => {
            // Before v4 there is no flag and Kafka always allowed auto-creation.
            let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
            for wanted in requested {
                let by_name = wanted.name.as_ref().map(|n| n.0.as_str().to_string());
                let topic = match &by_name {
                    Some(name) => image.topic(name).cloned(),
                    None => image.topic_by_id(&wanted.topic_id).cloned(),
                };
                let describable = |name: &str| access.allows_topic(AclOperation::Describe, name);
                let response = match (topic, by_name) {
                    (Some(topic), by_name) if !describable(&topic.name) => error_topic(
                        by_name,
                        Uuid::nil(),
                        ResponseError::TopicAuthorizationFailed,
                    ),
                    (Some(topic), _) => {
                        topic_response(broker, access, &topic, topic_operations, version, listener)
                    }
                    (None, Some(name)) => {
                        let auto_create =
                            allow_auto_create && broker.config.auto_create_topics_enable;
                        if let Err(e) = validate_topic_name(&name) {
                            error_topic(Some(name), Uuid::nil(), metadata_error_code(&e))
                        } else if !describable(&name)
                            || (auto_create
                                && !access.allows_cluster(AclOperation::Create)
                                && !access.allows_topic(AclOperation::Create, &name))
                        {
                            error_topic(
                                Some(name),
                                Uuid::nil(),
                                ResponseError::TopicAuthorizationFailed,
                            )
                        } else if auto_create {
                            match broker.auto_create_topic(&name).await {
                                Ok(topic) => topic_response(
                                    broker,
                                    access,
                                    &topic,
                                    topic_operations,
                                    version,
                                    listener,
                                ),
                                Err(e) => {
                                    error_topic(Some(name), Uuid::nil(), metadata_error_code(&e))
                                }
                            }
                        } else {
                            error_topic(
                                Some(name),
                                Uuid::nil(),
                                ResponseError::UnknownTopicOrPartition,
                            )
                        }
                    }
                    (None, None) => {
                        error_topic(None, wanted.topic_id, ResponseError::UnknownTopicId)
                    }
                };
                topics.push(response);
            }
        }
    }

    // Auto-creation may have changed the image: list the brokers as of now.
    let image = broker.metadata.image();
    // Brokers without the client's listener are left out: the client could
    // not reach them (Kafka does the same).
    let brokers = image
        .live_brokers()
        .filter_map(|b| {
            let endpoint = b.endpoint(listener)?;
            Some(
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(b.node_id))
                    .with_host(str_bytes(endpoint.host.clone()))
                    .with_port(endpoint.port)
                    .with_rack(b.rack.clone().map(str_bytes)),
            )
        })
        .collect();
    let mut response = MetadataResponse::default();
    if let Some(operations) = cluster_operations {
        response.cluster_authorized_operations = operations;
    }
    response
        .with_brokers(brokers)
        .with_cluster_id(Some(str_bytes(image.cluster_id.clone())))
        .with_controller_id(BrokerId(image.controller_id))
        .with_topics(topics)
}

fn error_topic(name: Option<String>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(topic_name))
        .with_topic_id(id)
        .with_error_code(error.code())
}

/// One partition as clients are told about it (Metadata,
/// DescribeTopicPartitions): the image's leadership, except that a partition
/// this node should lead but could not open (or whose leadership is in
/// doubt, see [`crate::controller_contact`]) has no leader, a leader
/// without the client's listener is none the client can use, and replicas
/// on brokers that are not live are offline.
pub(crate) struct PartitionView {
    pub leader: i32,
    /// The leader is live but has no endpoint on the client's listener
    /// (`leader` is then -1): Kafka's LISTENER_NOT_FOUND.
    pub leader_lacks_listener: bool,
    pub leader_epoch: i32,
    pub replicas: Vec<BrokerId>,
    pub isr: Vec<BrokerId>,
    pub offline: Vec<BrokerId>,
}

/// `None` for a partition created but not yet in this broker's image.
pub(crate) fn partition_view(
    broker: &Broker,
    image: &MetadataView,
    topic: &TopicMetadata,
    index: i32,
    listener: &str,
) -> Option<PartitionView> {
    let state = topic.partition(index)?;
    let me = broker.config.node_id;
    let mut leader = if state.leader == me && !broker.leads_usably(&topic.name, index) {
        NO_LEADER
    } else {
        state.leader
    };
    let leader_lacks_listener = image
        .broker(leader)
        .is_some_and(|b| !b.fenced && b.endpoint(listener).is_none());
    if leader_lacks_listener {
        leader = NO_LEADER;
    }
    let ids = |ids: &[i32]| ids.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    Some(PartitionView {
        leader,
        leader_lacks_listener,
        leader_epoch: state.leader_epoch,
        replicas: ids(&state.replicas),
        isr: ids(&state.isr),
        offline: state
            .replicas
            .iter()
            .filter(|b| !image.is_live_broker(**b))
            .map(|b| BrokerId(*b))
            .collect(),
    })
}

fn topic_response(
    broker: &Broker,
    access: &Access,
    topic: &TopicMetadata,
    // The request asked for the topic's authorized-operations bits (Kafka
    // answers i32::MIN when it did not).
    topic_operations: bool,
    version: i16,
    listener: &str,
) -> MetadataResponseTopic {
    let image = broker.metadata.image();
    let partitions = (0..topic.partitions)
        .map(|index| {
            let Some(view) = partition_view(broker, &image, topic, index, listener) else {
                // Created but not yet in this broker's image.
                return MetadataResponsePartition::default()
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_partition_index(index)
                    .with_leader_id(BrokerId(NO_LEADER));
            };
            // Kafka names the missing listener from v6 on.
            let error = if view.leader_lacks_listener && version >= 6 {
                ResponseError::ListenerNotFound.code()
            } else if view.leader == NO_LEADER {
                ResponseError::LeaderNotAvailable.code()
            } else {
                0
            };
            let mut partition = MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(index)
                .with_leader_id(BrokerId(view.leader))
                .with_replica_nodes(view.replicas)
                .with_isr_nodes(view.isr);
            if version >= 5 {
                partition = partition.with_offline_replicas(view.offline);
            }
            if version >= 7 {
                partition = partition.with_leader_epoch(view.leader_epoch);
            }
            partition
        })
        .collect();
    let mut response = MetadataResponseTopic::default()
        .with_name(Some(topic_name(topic.name.clone())))
        .with_topic_id(topic.topic_id)
        .with_is_internal(is_internal_topic(&topic.name))
        .with_partitions(partitions);
    if version >= 8 {
        let operations = if topic_operations {
            access.authorized_operations(TOPIC_OPERATIONS, ResourceType::Topic, &topic.name)
        } else {
            i32::MIN
        };
        response = response.with_topic_authorized_operations(operations);
    }
    response
}
