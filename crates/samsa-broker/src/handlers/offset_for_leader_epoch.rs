//! OffsetForLeaderEpoch (v2–v4; Kafka 4 removed v0–v1, and kafka-protocol
//! encodes only these): where a leader epoch ends in the leader's log.
//! Consumers send it after a leader change to find out whether the records
//! they consumed were truncated (KIP-320); samsa's own followers ask the
//! same question inside their gRPC fetch.
//!
//! As Kafka answers it: a client (`replica_id` -1) or a broker asks the
//! leader (anyone else answers NOT_LEADER_OR_FOLLOWER); the debugging id
//! -2 may ask any replica; `current_leader_epoch` is checked as Fetch
//! checks it; an epoch newer than any this log knows answers -1 / -1.
//! Clients need DESCRIBE on the topic, brokers CLUSTER_ACTION.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::error::{storage_error_code, PartitionError};
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// `replica_id` of a request that may be answered by any replica.
const DEBUGGING_REPLICA_ID: i32 = -2;

pub fn handle(
    broker: &Broker,
    access: &Access,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let replica_id = request.replica_id.0;
    let from_broker = replica_id >= 0;
    let cluster_allowed = !from_broker || access.allows_cluster(AclOperation::ClusterAction);
    let topics = request
        .topics
        .into_iter()
        .map(|topic| {
            let name = topic.topic.0.as_str().to_owned();
            let denied = if from_broker {
                !cluster_allowed
            } else {
                !access.allows_topic(AclOperation::Describe, &name)
            };
            let partitions = topic
                .partitions
                .into_iter()
                .map(|wanted| {
                    let mut answer = EpochEndOffset::default()
                        .with_partition(wanted.partition)
                        .with_leader_epoch(-1)
                        .with_end_offset(-1);
                    let result = if denied {
                        Err(if from_broker {
                            ResponseError::ClusterAuthorizationFailed
                        } else {
                            ResponseError::TopicAuthorizationFailed
                        })
                    } else {
                        end_offset(
                            broker,
                            &name,
                            wanted.partition,
                            wanted.current_leader_epoch,
                            wanted.leader_epoch,
                            replica_id == DEBUGGING_REPLICA_ID,
                        )
                    };
                    match result {
                        Ok((epoch, offset)) => {
                            answer.leader_epoch = epoch;
                            answer.end_offset = offset;
                        }
                        Err(error) => answer.error_code = error.code(),
                    }
                    answer
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(topic.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

fn end_offset(
    broker: &Broker,
    topic: &str,
    index: i32,
    current_leader_epoch: i32,
    requested: i32,
    any_replica: bool,
) -> Result<(i32, i64), ResponseError> {
    let partition = match broker.replicas.get(topic, index) {
        Some(hosted) if any_replica => hosted,
        _ => broker.leader_partition(topic, index)?,
    };
    partition.check_current_leader_epoch(current_leader_epoch)?;
    match partition.epoch_end_offset(requested) {
        Ok(end) => Ok((end.epoch, end.end_offset)),
        Err(PartitionError::Storage(e)) => Err(storage_error_code(&e)),
        Err(_) => Err(ResponseError::NotLeaderOrFollower),
    }
}
