//! Metadata: topics, partitions and the (single) broker, with auto-creation.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::error::metadata_error_code;
use crate::metadata::{validate_topic_name, TopicMetadata};
use crate::Broker;

pub async fn handle(broker: &Broker, request: MetadataRequest, version: i16) -> MetadataResponse {
    let node_id = broker.config.node_id;
    let (host, port) = broker.config.advertised_host_port();
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

    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(node_id))
            .with_host(str_bytes(host))
            .with_port(port)])
        .with_cluster_id(Some(str_bytes(image.cluster_id.clone())))
        .with_controller_id(BrokerId(node_id))
        .with_topics(topics)
}

fn error_topic(name: Option<String>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    MetadataResponseTopic::default()
        .with_name(name.map(topic_name))
        .with_topic_id(id)
        .with_error_code(error.code())
}

fn topic_response(broker: &Broker, topic: &TopicMetadata, version: i16) -> MetadataResponseTopic {
    let node = BrokerId(broker.config.node_id);
    let partitions = (0..topic.partitions)
        .map(|index| {
            let hosted = broker.replicas.get(&topic.name, index);
            let (error, leader_epoch) = match &hosted {
                Some(p) => (0, p.leader_epoch),
                None => (ResponseError::LeaderNotAvailable.code(), -1),
            };
            let mut partition = MetadataResponsePartition::default()
                .with_error_code(error)
                .with_partition_index(index)
                .with_leader_id(if hosted.is_some() { node } else { BrokerId(-1) })
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node]);
            if version >= 7 {
                partition = partition.with_leader_epoch(leader_epoch);
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
