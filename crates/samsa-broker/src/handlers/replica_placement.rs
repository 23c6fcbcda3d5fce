//! Who holds and who leads each partition, as an operator changes it:
//! ElectLeaders (v0–v2: PREFERRED, and UNCLEAN from v1),
//! AlterPartitionReassignments (v0–v1, KIP-455, with KIP-860's
//! `allow_replication_factor_change`) and ListPartitionReassignments (v0).
//!
//! The decisions are the controller's (`samsa_controller::logic`, its
//! `reassignment` module); these handlers check what Kafka checks at the
//! broker — ALTER (DESCRIBE for the listing) on the cluster, the election
//! type, a replication factor change the request does not allow — forward
//! the rest and shape the answer. The listing is read from this broker's
//! image, which carries every partition's adding and removing replicas.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ElectLeadersRequest, ElectLeadersResponse, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
};
use samsa_controller::logic::{ElectLeaders, ElectionType, Reassignment};
use samsa_controller::ControllerError;
use std::collections::BTreeMap;

use super::{str_bytes, topic_name};
use crate::error::metadata_error_code;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

/// `(error code, message)` of a per-partition outcome.
fn outcome(result: &Result<(), ControllerError>) -> (i16, Option<String>) {
    match result {
        Ok(()) => (0, None),
        Err(e) => (e.code(), Some(e.to_string())),
    }
}

pub async fn elect_leaders(
    broker: &Broker,
    access: &Access,
    request: ElectLeadersRequest,
    version: i16,
) -> ElectLeadersResponse {
    let listed: Option<Vec<(String, i32)>> = request.topic_partitions.map(|topics| {
        topics
            .into_iter()
            .flat_map(|t| {
                let name = t.topic.0.as_str().to_owned();
                t.partitions.into_iter().map(move |p| (name.clone(), p))
            })
            .collect()
    });
    let refuse = |error: ResponseError| {
        let results = listed
            .iter()
            .flatten()
            .map(|(topic, partition)| (topic.clone(), *partition, Err(error), None));
        ElectLeadersResponse::default()
            .with_error_code(if version >= 1 { error.code() } else { 0 })
            .with_replica_election_results(group_election_results(results))
    };
    if !access.allows_cluster(AclOperation::Alter) {
        return refuse(ResponseError::ClusterAuthorizationFailed);
    }
    let election_type = match (version, request.election_type) {
        (0, _) | (_, PREFERRED) => ElectionType::Preferred,
        (_, UNCLEAN) => ElectionType::Unclean,
        _ => return refuse(ResponseError::InvalidRequest),
    };
    let elect = ElectLeaders {
        election_type,
        partitions: listed.clone(),
    };
    match broker.metadata.elect_leaders(elect).await {
        Ok(results) => {
            let results = results.into_iter().map(|r| {
                let message = r.result.as_ref().err().map(|e| e.to_string());
                let code = r.result.map(|_| ()).map_err(|e| e.kafka_error());
                (r.topic, r.partition, code, message)
            });
            ElectLeadersResponse::default()
                .with_replica_election_results(group_election_results(results))
        }
        Err(e) => {
            tracing::info!(error = %e, "ElectLeaders failed");
            refuse(metadata_error_code(&e))
        }
    }
}

type ElectionOutcome = (String, i32, Result<(), ResponseError>, Option<String>);

fn group_election_results(
    results: impl Iterator<Item = ElectionOutcome>,
) -> Vec<ReplicaElectionResult> {
    let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for (topic, partition, result, message) in results {
        by_topic.entry(topic).or_default().push(
            PartitionResult::default()
                .with_partition_id(partition)
                .with_error_code(result.err().map_or(0, |e| e.code()))
                .with_error_message(message.map(str_bytes)),
        );
    }
    by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            ReplicaElectionResult::default()
                .with_topic(topic_name(topic))
                .with_partition_result(partitions)
        })
        .collect()
}

pub async fn alter_partition_reassignments(
    broker: &Broker,
    access: &Access,
    request: AlterPartitionReassignmentsRequest,
    version: i16,
) -> AlterPartitionReassignmentsResponse {
    let allow_rf_change = version < 1 || request.allow_replication_factor_change;
    let wanted: Vec<Reassignment> = request
        .topics
        .into_iter()
        .flat_map(|t| {
            let name = t.name.0.as_str().to_owned();
            t.partitions.into_iter().map(move |p| Reassignment {
                topic: name.clone(),
                partition: p.partition_index,
                target: p.replicas.map(|r| r.into_iter().map(|b| b.0).collect()),
            })
        })
        .collect();
    let answer = |results: Vec<(String, i32, i16, Option<String>)>| {
        let mut by_topic: BTreeMap<String, Vec<ReassignablePartitionResponse>> = BTreeMap::new();
        for (topic, partition, code, message) in results {
            by_topic.entry(topic).or_default().push(
                ReassignablePartitionResponse::default()
                    .with_partition_index(partition)
                    .with_error_code(code)
                    .with_error_message(message.map(str_bytes)),
            );
        }
        AlterPartitionReassignmentsResponse::default()
            .with_allow_replication_factor_change(allow_rf_change)
            .with_responses(
                by_topic
                    .into_iter()
                    .map(|(topic, partitions)| {
                        ReassignableTopicResponse::default()
                            .with_name(topic_name(topic))
                            .with_partitions(partitions)
                    })
                    .collect(),
            )
    };
    let refuse_all = |wanted: &[Reassignment], error: ResponseError, message: String| {
        let results = wanted
            .iter()
            .map(|r| {
                (
                    r.topic.clone(),
                    r.partition,
                    error.code(),
                    Some(message.clone()),
                )
            })
            .collect();
        answer(results)
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(message)))
    };
    if !access.allows_cluster(AclOperation::Alter) {
        return refuse_all(
            &wanted,
            ResponseError::ClusterAuthorizationFailed,
            "ALTER on the cluster is required to reassign partitions".into(),
        );
    }
    // KIP-860: a target of another size than the partition's replica set
    // (before any reassignment in progress) is refused unless allowed.
    let image = broker.metadata.image();
    let (refused, forwarded): (Vec<_>, Vec<_>) = wanted.into_iter().partition(|r| {
        !allow_rf_change
            && r.target.as_ref().is_some_and(|target| {
                image
                    .partition(&r.topic, r.partition)
                    .is_some_and(|p| p.original_replicas().len() != target.len())
            })
    });
    let mut results: Vec<(String, i32, i16, Option<String>)> = refused
        .into_iter()
        .map(|r| {
            (
                r.topic,
                r.partition,
                ResponseError::InvalidReplicationFactor.code(),
                Some("the reassignment changes the replication factor, which the request does not allow".into()),
            )
        })
        .collect();
    if !forwarded.is_empty() {
        match broker.metadata.alter_reassignments(forwarded.clone()).await {
            Ok(done) => results.extend(done.into_iter().map(|r| {
                let (code, message) = outcome(&r.result);
                (r.topic, r.partition, code, message)
            })),
            Err(e) => {
                tracing::info!(error = %e, "AlterPartitionReassignments failed");
                return refuse_all(&forwarded, metadata_error_code(&e), e.to_string());
            }
        }
    }
    answer(results)
}

pub fn list_partition_reassignments(
    broker: &Broker,
    access: &Access,
    request: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    if !access.allows_cluster(AclOperation::Describe) {
        return ListPartitionReassignmentsResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let image = broker.metadata.image();
    let wanted: Vec<(String, Vec<i32>)> = match request.topics {
        Some(topics) => topics
            .into_iter()
            .map(|t| (t.name.0.as_str().to_owned(), t.partition_indexes))
            .collect(),
        None => image
            .topics
            .values()
            .map(|t| (t.name.clone(), (0..t.partitions).collect()))
            .collect(),
    };
    let mut topics = Vec::new();
    for (name, indexes) in wanted {
        let Some(topic) = image.topic(&name) else {
            return ListPartitionReassignmentsResponse::default()
                .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                .with_error_message(Some(str_bytes(format!("unknown topic {name}"))));
        };
        let partitions: Vec<OngoingPartitionReassignment> = indexes
            .into_iter()
            .filter_map(|index| {
                let state = topic.partition(index)?;
                state.is_reassigning().then(|| {
                    let ids = |list: &[i32]| list.iter().copied().map(BrokerId).collect();
                    OngoingPartitionReassignment::default()
                        .with_partition_index(index)
                        .with_replicas(ids(&state.replicas))
                        .with_adding_replicas(ids(&state.adding_replicas))
                        .with_removing_replicas(ids(&state.removing_replicas))
                })
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(
                OngoingTopicReassignment::default()
                    .with_name(topic_name(name))
                    .with_partitions(partitions),
            );
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
