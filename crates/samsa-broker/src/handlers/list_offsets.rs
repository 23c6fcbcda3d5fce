//! ListOffsets: earliest (-2), latest (-1), max timestamp (-3), earliest local
//! (-4, the log start on a log without tiered storage), latest tiered (-5,
//! v9+: offset -1 and leader epoch -1, Kafka's answer for a topic without
//! tiered storage) and by timestamp. `read_committed` answers the last
//! stable offset for "latest". v10 adds a timeout for reads from remote
//! storage; samsa has none, so every answer is immediate.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};

use crate::error::storage_error_code;
use crate::error::PartitionError;
use crate::replica::Partition;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;

/// A topic the caller may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED
/// on each partition, as Kafka's.
pub fn handle(
    broker: &Broker,
    access: &Access,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let read_committed = request.isolation_level == 1;
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.name.0.as_str().to_string();
            let denied = !access.allows_topic(AclOperation::Describe, &name);
            let partitions = topic
                .partitions
                .into_iter()
                .map(|wanted| {
                    let mut response = ListOffsetsPartitionResponse::default()
                        .with_partition_index(wanted.partition_index)
                        .with_timestamp(-1)
                        .with_offset(-1);
                    if denied {
                        response.error_code = ResponseError::TopicAuthorizationFailed.code();
                        return response;
                    }
                    let partition = match broker.leader_partition(&name, wanted.partition_index) {
                        Ok(partition) => partition,
                        Err(code) => {
                            response.error_code = code.code();
                            return response;
                        }
                    };
                    if let Err(error) =
                        partition.check_current_leader_epoch(wanted.current_leader_epoch)
                    {
                        response.error_code = error.code();
                        return response;
                    }
                    if version >= 4 {
                        // Nothing is tiered: no offset, so no epoch either.
                        response.leader_epoch = if wanted.timestamp == LATEST_TIERED {
                            -1
                        } else {
                            partition.leader_epoch()
                        };
                    }
                    match lookup(&partition, wanted.timestamp, read_committed) {
                        Ok(Some((offset, timestamp))) => {
                            response.offset = offset;
                            response.timestamp = timestamp;
                        }
                        Ok(None) => {}
                        Err(PartitionError::Storage(e)) => {
                            response.error_code = storage_error_code(&e).code()
                        }
                        Err(_) => response.error_code = ResponseError::NotLeaderOrFollower.code(),
                    }
                    response
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(topic.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// `(offset, timestamp)` for a ListOffsets query; `None` = no such record
/// (answered as offset -1, timestamp -1, no error, as Kafka does).
fn lookup(
    partition: &Partition,
    timestamp: i64,
    read_committed: bool,
) -> Result<Option<(i64, i64)>, PartitionError> {
    let offsets = partition.offsets()?;
    Ok(match timestamp {
        LATEST => Some((
            if read_committed {
                offsets.last_stable_offset
            } else {
                offsets.high_watermark
            },
            -1,
        )),
        EARLIEST | EARLIEST_LOCAL => Some((offsets.log_start_offset, -1)),
        MAX_TIMESTAMP => partition.max_timestamp_and_offset()?,
        ts if ts >= 0 => partition.offset_for_timestamp(ts)?,
        // LATEST_TIERED and unknown negative timestamps: no such record.
        _ => None,
    })
}
