//! Metadata: topics, partitions (leader, epoch, replicas, ISR) and the live
//! brokers, all from the broker's metadata image, with auto-creation.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::error::metadata_error_code;
use crate::metadata::{validate_topic_name, TopicMetadata, NO_LEADER};
use crate::Broker;

pub async fn handle(broker: &Broker, request: MetadataRequest, version: i16) -> MetadataResponse {
    let image = broker.metadata.image();

    let mut topics = Vec::new();
    match request.topics {
        None => {
            for topic in image.topics.values() {
                topics.push(topic_response(broker, topic, version));
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
                let response = match (topic, by_name) {
                    (Some(topic), _) => topic_response(broker, &topic, version),
                    (None, Some(name)) => {
                        if let Err(e) = validate_topic_name(&name) {
                            error_topic(Some(name), Uuid::nil(), metadata_error_code(&e))
                        } else if allow_auto_create && broker.config.auto_create_topics_enable {
                            match broker.auto_create_topic(&name).await {
                                Ok(topic) => topic_response(broker, &topic, version),
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
    let brokers = image
        .live_brokers()
        .map(|b| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(b.node_id))
                .with_host(str_bytes(b.host.clone()))
                .with_port(b.port)
                .with_rack(b.rack.clone().map(str_bytes))
        })
        .collect();
    MetadataResponse::default()
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

fn topic_response(broker: &Broker, topic: &TopicMetadata, version: i16) -> MetadataResponseTopic {
    let me = broker.config.node_id;
    let image = broker.metadata.image();
    let ids = |ids: &[i32]| ids.iter().map(|b| BrokerId(*b)).collect::<Vec<_>>();
    let partitions = (0..topic.partitions)
        .map(|index| {
            let Some(state) = topic.partition(index) else {
                // Created but not yet in this broker's image.
                return MetadataResponsePartition::default()
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_partition_index(index)
                    .with_leader_id(BrokerId(NO_LEADER));
            };
            // A partition this node should lead but could not open has no
            // leader as far as clients are concerned.
            let leader = if state.leader == me && broker.replicas.get(&topic.name, index).is_none()
            {
                NO_LEADER
            } else {
                state.leader
            };
            let error = if leader == NO_LEADER {
                ResponseError::LeaderNotAvailable.code()
            } else {
                0
            };
            let offline: Vec<i32> = state
                .replicas
                .iter()
                .copied()
                .filter(|b| !image.is_live_broker(*b))
                .collect();
            let mut partition = MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(index)
                .with_leader_id(BrokerId(leader))
                .with_replica_nodes(ids(&state.replicas))
                .with_isr_nodes(ids(&state.isr));
            if version >= 5 {
                partition = partition.with_offline_replicas(ids(&offline));
            }
            if version >= 7 {
                partition = partition.with_leader_epoch(state.leader_epoch);
            }
            partition
        })
        .collect();
    let mut response = MetadataResponseTopic::default()
        .with_name(Some(topic_name(topic.name.clone())))
        .with_topic_id(topic.topic_id)
        .with_is_internal(topic.name.starts_with("__"))
        .with_partitions(partitions);
    if version >= 8 {
        response = response.with_topic_authorized_operations(i32::MIN);
    }
    response
}
