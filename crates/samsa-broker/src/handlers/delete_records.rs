//! DeleteRecords: moves a partition's log start offset forward on its
//! leader (`Partition::delete_records_before`), deleting the segments wholly
//! below it; followers follow the leader's log start on their next fetch.
//!
//! As Kafka: offset -1 means the high watermark, an offset above it is
//! OFFSET_OUT_OF_RANGE, internal topics are refused (INVALID_TOPIC_EXCEPTION),
//! and the answer's low watermark is the new log start. Unlike Kafka, the
//! answer does not wait for the followers to have moved theirs.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
use tracing::info;

use crate::coordinator::placement::{CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC};
use crate::error::partition_error_code;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED.
pub fn handle(
    broker: &Broker,
    access: &Access,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.as_str();
            let denied = !access.allows_topic(AclOperation::Delete, name);
            let partitions = topic
                .partitions
                .into_iter()
                .map(|wanted| {
                    let mut result = DeleteRecordsPartitionResult::default()
                        .with_partition_index(wanted.partition_index)
                        .with_low_watermark(-1);
                    let deleted = if denied {
                        Err(ResponseError::TopicAuthorizationFailed)
                    } else {
                        delete(broker, name, wanted.partition_index, wanted.offset)
                    };
                    match deleted {
                        Ok(low_watermark) => result.low_watermark = low_watermark,
                        Err(code) => result.error_code = code.code(),
                    }
                    result
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}

/// The new log start offset of `topic`-`index`, or Kafka's error.
fn delete(broker: &Broker, topic: &str, index: i32, offset: i64) -> Result<i64, ResponseError> {
    if topic == TRANSACTION_STATE_TOPIC || topic == CONSUMER_OFFSETS_TOPIC {
        return Err(ResponseError::InvalidTopicException);
    }
    let partition = broker.leader_partition(topic, index)?;
    if offset < -1 {
        return Err(ResponseError::OffsetOutOfRange);
    }
    let low_watermark = crate::blocking_io(|| partition.delete_records_before(offset))
        .map_err(|e| partition_error_code(&e))?;
    info!(partition = %partition.name(), requested = offset, low_watermark, "records deleted");
    Ok(low_watermark)
}
