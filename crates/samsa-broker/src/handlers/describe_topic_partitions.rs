//! DescribeTopicPartitions (KIP-966): topics and their partitions from the
//! broker's metadata image, like Metadata but paged with a cursor.
//!
//! Kafka's rules kept here:
//! - no topics named means every topic; topics are answered in name order,
//!   each named topic once, starting at the cursor (its topic from its
//!   partition, later topics from partition 0);
//! - at most `response_partition_limit` partitions (capped at 2000, Kafka's
//!   `max.request.partition.size.limit`, and at least 1) per answer; when the
//!   limit cuts a topic, or is used up exactly before another topic,
//!   `next_cursor` names where the next request starts;
//! - a named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION
//!   (INVALID_TOPIC_EXCEPTION if the name is not a valid one), never
//!   auto-created; a cursor on a topic that is not named, or with a negative
//!   partition, makes the whole request INVALID_REQUEST;
//! - partitions carry no error code (a partition without a live leader has
//!   leader -1), and empty eligible-leader-replica lists: samsa has no ELR;
//! - `topic_authorized_operations` is what the caller may do on the topic
//!   (every topic operation with no authorizer, as Kafka reports it).

use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse,
};
use uuid::Uuid;

use super::metadata::partition_view;
use super::topic_name;
use crate::metadata::{is_internal_topic, validate_topic_name, MetadataView, TopicMetadata};
use crate::Broker;

/// Kafka's default `max.request.partition.size.limit`.
pub const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

/// The topic's authorized-operations bit field for the caller.
fn topic_operations(access: &crate::security::access::Access, topic: &str) -> i32 {
    access.authorized_operations(
        crate::security::access::TOPIC_OPERATIONS,
        crate::security::acl::ResourceType::Topic,
        topic,
    )
}

/// Topics the caller may not DESCRIBE are left out of a listing of every
/// topic, and answer TOPIC_AUTHORIZATION_FAILED when named.
pub fn handle(
    broker: &Broker,
    access: &crate::security::access::Access,
    request: DescribeTopicPartitionsRequest,
    listener: &str,
) -> DescribeTopicPartitionsResponse {
    let image = broker.metadata.image();
    let all_topics = request.topics.is_empty();
    let cursor = request
        .cursor
        .as_ref()
        .map(|c| (c.topic_name.0.as_str().to_owned(), c.partition_index));
    let from = cursor.as_ref().map_or("", |(t, _)| t.as_str());
    let names: BTreeSet<String> = if all_topics {
        image
            .topics
            .keys()
            .filter(|t| t.as_str() >= from)
            .cloned()
            .collect()
    } else {
        request
            .topics
            .iter()
            .map(|t| t.name.0.as_str().to_owned())
            .filter(|t| t.as_str() >= from)
            .collect()
    };
    let invalid_cursor = match &cursor {
        Some((topic, _)) if !all_topics && !names.contains(topic) => true,
        Some((_, partition)) => *partition < 0,
        None => false,
    };
    if invalid_cursor {
        tracing::debug!(
            ?cursor,
            "DescribeTopicPartitions cursor outside the request"
        );
        return invalid_request(&request);
    }

    let limit = request
        .response_partition_limit
        .clamp(1, MAX_PARTITIONS_PER_RESPONSE);
    let mut remaining = usize::try_from(limit).unwrap_or(1);
    let mut topics = Vec::new();
    let mut next_cursor = None;
    for name in names {
        if remaining == 0 {
            // Every partition before fitted exactly: go on at this topic.
            next_cursor = Some(cursor_at(&name, 0));
            break;
        }
        if !access.allows_topic(crate::security::acl::AclOperation::Describe, &name) {
            if !all_topics {
                topics.push(
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(ResponseError::TopicAuthorizationFailed.code())
                        .with_name(Some(topic_name(name)))
                        .with_topic_id(Uuid::nil()),
                );
            }
            continue;
        }
        let Some(topic) = image.topic(&name) else {
            if !all_topics {
                let error = match validate_topic_name(&name) {
                    Ok(()) => ResponseError::UnknownTopicOrPartition,
                    Err(_) => ResponseError::InvalidTopicException,
                };
                topics.push(
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_error_code(error.code())
                        .with_is_internal(is_internal_topic(&name))
                        .with_topic_authorized_operations(topic_operations(access, &name))
                        .with_name(Some(topic_name(name)))
                        .with_topic_id(Uuid::nil()),
                );
            }
            continue;
        };
        let start = match &cursor {
            Some((t, p)) if *t == name => *p,
            _ => 0,
        };
        let (partitions, next) = partitions_from(broker, &image, topic, start, remaining, listener);
        remaining -= partitions.len();
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(topic_name(name.clone())))
                .with_topic_id(topic.topic_id)
                .with_is_internal(is_internal_topic(&name))
                .with_partitions(partitions)
                .with_topic_authorized_operations(topic_operations(access, &name)),
        );
        if let Some(next) = next {
            next_cursor = Some(cursor_at(&name, next));
            break;
        }
    }
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor)
}

/// Up to `max` partitions of `topic` from index `start`, and the index
/// where the next page starts if some are left.
fn partitions_from(
    broker: &Broker,
    image: &MetadataView,
    topic: &TopicMetadata,
    start: i32,
    max: usize,
    listener: &str,
) -> (Vec<DescribeTopicPartitionsResponsePartition>, Option<i32>) {
    let max = i32::try_from(max).unwrap_or(i32::MAX);
    let end = topic.partitions.min(start.saturating_add(max));
    let next = (end < topic.partitions).then_some(end);
    let partitions = (start..end)
        .filter_map(|index| {
            // A partition created but not in this broker's image yet is left
            // out, as Kafka leaves out what its image does not have.
            let view = partition_view(broker, image, topic, index, listener)?;
            let error = if view.leader_lacks_listener {
                ResponseError::ListenerNotFound.code()
            } else {
                0
            };
            Some(
                DescribeTopicPartitionsResponsePartition::default()
                    .with_error_code(error)
                    .with_partition_index(index)
                    .with_leader_id(BrokerId(view.leader))
                    .with_leader_epoch(view.leader_epoch)
                    .with_replica_nodes(view.replicas)
                    .with_isr_nodes(view.isr)
                    .with_eligible_leader_replicas(Some(Vec::new()))
                    .with_last_known_elr(Some(Vec::new()))
                    .with_offline_replicas(view.offline),
            )
        })
        .collect();
    (partitions, next)
}

fn cursor_at(topic: &str, partition: i32) -> Cursor {
    Cursor::default()
        .with_topic_name(topic_name(topic))
        .with_partition_index(partition)
}

/// Kafka's answer to a request it refuses as a whole: every named topic
/// with the error and no partitions.
fn invalid_request(request: &DescribeTopicPartitionsRequest) -> DescribeTopicPartitionsResponse {
    let topics = request
        .topics
        .iter()
        .map(|t| {
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(t.name.clone()))
                .with_error_code(ResponseError::InvalidRequest.code())
        })
        .collect();
    DescribeTopicPartitionsResponse::default().with_topics(topics)
}
