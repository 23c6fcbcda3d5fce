//! DescribeQuorum (KIP-595, KIP-836, KIP-853): the metadata quorum as
//! `kafka-metadata-quorum describe --status` / `--replication` show it.
//!
//! A Kafka broker forwards DescribeQuorum to the active controller, whose
//! Raft layer answers from its leader state. samsa does the same through the
//! metadata store: in cluster mode the Raft leader of the controller quorum
//! answers with its replication view (`samsa_controller::quorum`), found by
//! following leader hints and waiting out an election for
//! `controller_request_timeout_ms`; on a single node the local store
//! describes this node as the only voter (see `LocalMetadataStore`).
//!
//! Kafka's rules kept here:
//! - the request must name exactly `__cluster_metadata` partition 0;
//!   otherwise every requested partition gets UNKNOWN_TOPIC_OR_PARTITION;
//! - no active controller in time is REQUEST_TIMED_OUT at the top level
//!   (what a Kafka broker's forwarding answers when it times out);
//! - the leader's own timestamps are the current time; observers are
//!   empty (every samsa broker is a voter, as in Kafka's combined mode);
//! - v2 adds each voter's directory id (zero: samsa's voters are static,
//!   as Kafka reports for `controller.quorum.voters`) and `nodes`: each
//!   voter's controller listener, named `CONTROLLER`, at its voter address
//!   — samsa's controllers speak gRPC there, not the Kafka protocol;
//! - error messages are empty strings on success, Kafka's defaults.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{BrokerId, DescribeQuorumRequest, DescribeQuorumResponse};
use uuid::Uuid;

use super::{str_bytes, topic_name};
use crate::error::metadata_error_code;
use crate::metadata::QuorumDescription;
use crate::Broker;

/// The metadata log's name in Kafka (KRaft).
pub const METADATA_TOPIC: &str = "__cluster_metadata";
/// The listener name `nodes` gives each voter's controller address.
const CONTROLLER_LISTENER: &str = "CONTROLLER";

pub async fn handle(
    broker: &Broker,
    request: DescribeQuorumRequest,
    version: i16,
) -> DescribeQuorumResponse {
    if !names_the_metadata_partition(&request) {
        return partition_errors(&request, ResponseError::UnknownTopicOrPartition);
    }
    match broker.metadata.describe_quorum().await {
        Ok(quorum) => answer(&quorum, version),
        Err(e) => {
            tracing::warn!(error = %e, "DescribeQuorum: no answer from the quorum");
            DescribeQuorumResponse::default()
                .with_error_code(metadata_error_code(&e).code())
                .with_error_message(Some(str_bytes(e.to_string())))
        }
    }
}

fn names_the_metadata_partition(request: &DescribeQuorumRequest) -> bool {
    match request.topics.as_slice() {
        [topic] => {
            topic.topic_name.0.as_str() == METADATA_TOPIC
                && matches!(topic.partitions.as_slice(), [p] if p.partition_index == 0)
        }
        _ => false,
    }
}

/// Every requested partition with `error`.
fn partition_errors(
    request: &DescribeQuorumRequest,
    error: ResponseError,
) -> DescribeQuorumResponse {
    let message =
        format!("DescribeQuorum describes only {METADATA_TOPIC} partition 0, the metadata log");
    let topics = request
        .topics
        .iter()
        .map(|t| {
            TopicData::default()
                .with_topic_name(t.topic_name.clone())
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(error.code())
                                .with_error_message(Some(str_bytes(message.clone())))
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeQuorumResponse::default().with_topics(topics)
}

fn answer(quorum: &QuorumDescription, version: i16) -> DescribeQuorumResponse {
    let voters = quorum
        .voters
        .iter()
        .map(|v| {
            ReplicaState::default()
                .with_replica_id(BrokerId(v.node_id))
                .with_replica_directory_id(Uuid::nil())
                .with_log_end_offset(v.log_end_offset)
                .with_last_fetch_timestamp(v.last_fetch_timestamp)
                .with_last_caught_up_timestamp(v.last_caught_up_timestamp)
        })
        .collect();
    let partition = PartitionData::default()
        .with_partition_index(0)
        .with_leader_id(BrokerId(quorum.leader_id))
        .with_leader_epoch(quorum.leader_epoch)
        .with_high_watermark(quorum.high_watermark)
        .with_current_voters(voters)
        .with_observers(Vec::new());
    let mut response = DescribeQuorumResponse::default().with_topics(vec![TopicData::default()
        .with_topic_name(topic_name(METADATA_TOPIC))
        .with_partitions(vec![partition])]);
    if version >= 2 {
        response.nodes = quorum
            .voters
            .iter()
            .map(|v| {
                let listeners = v
                    .endpoint
                    .iter()
                    .map(|(host, port)| {
                        Listener::default()
                            .with_name(str_bytes(CONTROLLER_LISTENER))
                            .with_host(str_bytes(host.clone()))
                            .with_port(*port)
                    })
                    .collect();
                Node::default()
                    .with_node_id(BrokerId(v.node_id))
                    .with_listeners(listeners)
            })
            .collect();
    }
    response
}
