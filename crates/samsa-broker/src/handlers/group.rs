//! Group APIs: the wire side of the group coordinator (JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
//! OffsetDelete, DescribeGroups, ListGroups, DeleteGroups, TxnOffsetCommit).
//!
//! Each handler converts the `kafka-protocol` message, runs the coordinator
//! through [`crate::coordinator::group::GroupShell`] (waiting for the reply delivered to
//! the request's token where the coordinator parks it), and converts back
//! with only the fields the request's version has. Every call runs in a span
//! carrying the group id.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{info_span, Instrument};

use super::{str_bytes, topic_name};
use crate::coordinator::group::{
    ClientInfo, CommitPartition, CommitRequest, FetchedOffset, PartitionResult, Reply,
};
use crate::coordinator::TransactionalWrite;
use crate::error::producer_fenced_for_version;
use crate::error::wire_code;
use crate::Broker;

/// The reply a dropped waiter gets (the shell shut down under it).
const LOST: ResponseError = ResponseError::CoordinatorNotAvailable;

pub async fn join_group(
    broker: &Broker,
    request: JoinGroupRequest,
    version: i16,
    client: ClientInfo,
) -> JoinGroupResponse {
    let span = info_span!(
        "join_group",
        group = request.group_id.as_str(),
        member = request.member_id.as_str()
    );
    async {
        let reply = broker
            .groups
            .call(|c, token, now| c.join_group(token, &request, version, client, now))
            .await;
        match reply {
            Some(Reply::Join(r)) => protocol_name_as_kafka_sends_it(r, version),
            _ => JoinGroupResponse::default()
                .with_error_code(LOST.code())
                .with_generation_id(-1)
                .with_protocol_name((version < 7).then(|| str_bytes("")))
                .with_member_id(request.member_id.clone()),
        }
    }
    .instrument(span)
    .await
}

/// Kafka's rule for JoinGroup's protocol name: nullable from v7, where an
/// empty name (an error, MEMBER_ID_REQUIRED) goes out as null; before v7 a
/// null one goes out as "".
fn protocol_name_as_kafka_sends_it(mut r: JoinGroupResponse, version: i16) -> JoinGroupResponse {
    if version >= 7 {
        if r.protocol_name.as_ref().is_some_and(|n| n.is_empty()) {
            r.protocol_name = None;
        }
    } else if r.protocol_name.is_none() {
        r.protocol_name = Some(str_bytes(""));
    }
    r
}

pub async fn sync_group(
    broker: &Broker,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let span = info_span!(
        "sync_group",
        group = request.group_id.as_str(),
        member = request.member_id.as_str()
    );
    async {
        let reply = broker
            .groups
            .call(|c, token, now| c.sync_group(token, &request, version, now))
            .await;
        match reply {
            Some(Reply::Sync(mut r)) => {
                if version < 5 {
                    r.protocol_type = None;
                    r.protocol_name = None;
                }
                r
            }
            _ => SyncGroupResponse::default().with_error_code(LOST.code()),
        }
    }
    .instrument(span)
    .await
}

pub fn heartbeat(broker: &Broker, request: HeartbeatRequest) -> HeartbeatResponse {
    let error = broker
        .groups
        .with(|c, now| (c.heartbeat(&request, now), Default::default()));
    HeartbeatResponse::default().with_error_code(wire_code(error))
}

pub fn leave_group(
    broker: &Broker,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let _span = info_span!("leave_group", group = request.group_id.as_str()).entered();
    broker
        .groups
        .with(|c, now| c.leave_group(&request, version, now))
}

/// The offsets of an OffsetCommit or TxnOffsetCommit request, by accessors
/// of its topic and partition types; leader epochs only if the version has them.
fn commit_partitions<T, P>(
    topics: &[T],
    name: impl Fn(&T) -> &str,
    partitions: impl Fn(&T) -> &[P],
    fields: impl Fn(&P) -> (i32, i64, i32, Option<&StrBytes>),
    with_leader_epoch: bool,
) -> Vec<CommitPartition> {
    topics
        .iter()
        .flat_map(|t| {
            partitions(t).iter().map(|p| {
                let (partition, offset, leader_epoch, metadata) = fields(p);
                CommitPartition {
                    topic: name(t).to_string(),
                    partition,
                    offset,
                    leader_epoch: if with_leader_epoch { leader_epoch } else { -1 },
                    metadata: metadata.map(|m| m.to_string()),
                }
            })
        })
        .collect()
}

/// Per-partition results as a response's topics, built by `topic` from its
/// name and the partitions `partition` builds from (index, error code).
fn response_topics<T, P>(
    results: Vec<PartitionResult>,
    topic: impl Fn(TopicName, Vec<P>) -> T,
    partition: impl Fn(i32, i16) -> P,
) -> Vec<T> {
    by_topic(results)
        .into_iter()
        .map(|(name, parts)| {
            let parts = parts
                .into_iter()
                .map(|(p, e)| partition(p, wire_code(e)))
                .collect();
            topic(topic_name(name), parts)
        })
        .collect()
}

/// Partition results of one topic: `(partition, error)`.
type TopicResults = Vec<(String, Vec<(i32, Option<ResponseError>)>)>;

fn by_topic(results: Vec<PartitionResult>) -> TopicResults {
    let mut out: TopicResults = Vec::new();
    for r in results {
        match out.iter_mut().find(|(t, _)| *t == r.topic) {
            Some((_, parts)) => parts.push((r.partition, r.error)),
            None => out.push((r.topic, vec![(r.partition, r.error)])),
        }
    }
    out
}

/// Kafka commits offsets only for partitions that exist: the others answer
/// UNKNOWN_TOPIC_OR_PARTITION and never reach the coordinator.
fn without_unknown_partitions(
    broker: &Broker,
    mut commit: CommitRequest,
) -> (CommitRequest, Vec<PartitionResult>) {
    let image = broker.metadata.image();
    let (known, unknown): (Vec<_>, Vec<_>) = std::mem::take(&mut commit.partitions)
        .into_iter()
        .partition(|p| image.partition(&p.topic, p.partition).is_some());
    commit.partitions = known;
    (
        commit,
        all_failed(&unknown, ResponseError::UnknownTopicOrPartition),
    )
}

fn all_failed(partitions: &[CommitPartition], error: ResponseError) -> Vec<PartitionResult> {
    partitions
        .iter()
        .map(|p| PartitionResult {
            topic: p.topic.clone(),
            partition: p.partition,
            error: Some(error),
        })
        .collect()
}

pub async fn offset_commit(
    broker: &Broker,
    request: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let span = info_span!("offset_commit", group = request.group_id.as_str());
    async {
        let commit = CommitRequest {
            group_id: request.group_id.to_string(),
            // v0 (not served) had no generation; v1+ all do.
            generation_id: request.generation_id_or_member_epoch,
            member_id: request.member_id.to_string(),
            group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
            partitions: commit_partitions(
                &request.topics,
                |t| t.name.as_str(),
                |t| &t.partitions,
                |p| {
                    (
                        p.partition_index,
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.committed_metadata.as_ref(),
                    )
                },
                version >= 6,
            ),
        };
        let (commit, mut results) = without_unknown_partitions(broker, commit);
        if !commit.partitions.is_empty() {
            results.extend(
                match broker
                    .groups
                    .call(|c, token, now| c.offset_commit(token, &commit, version, now))
                    .await
                {
                    Some(Reply::Commit(r)) => r,
                    _ => all_failed(&commit.partitions, LOST),
                },
            );
        }
        OffsetCommitResponse::default().with_topics(response_topics(
            results,
            |name, parts| {
                OffsetCommitResponseTopic::default()
                    .with_name(name)
                    .with_partitions(parts)
            },
            |p, e| {
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p)
                    .with_error_code(e)
            },
        ))
    }
    .instrument(span)
    .await
}

pub async fn txn_offset_commit(
    broker: &Broker,
    request: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let span = info_span!(
        "txn_offset_commit",
        group = request.group_id.as_str(),
        transactional_id = request.transactional_id.as_str(),
        producer_id = request.producer_id.0
    );
    async {
        let commit = CommitRequest {
            group_id: request.group_id.to_string(),
            // v0–v2 carry no member: they commit like a standalone consumer.
            generation_id: if version >= 3 {
                request.generation_id
            } else {
                -1
            },
            member_id: if version >= 3 {
                request.member_id.to_string()
            } else {
                String::new()
            },
            group_instance_id: if version >= 3 {
                request.group_instance_id.as_ref().map(|s| s.to_string())
            } else {
                None
            },
            partitions: commit_partitions(
                &request.topics,
                |t| t.name.as_str(),
                |t| &t.partitions,
                |p| {
                    (
                        p.partition_index,
                        p.committed_offset,
                        p.committed_leader_epoch,
                        p.committed_metadata.as_ref(),
                    )
                },
                version >= 2,
            ),
        };
        let producer = TransactionalWrite {
            transactional_id: request.transactional_id.to_string(),
            producer_id: request.producer_id.0,
            producer_epoch: request.producer_epoch,
            add_partition: version >= 5,
        };
        let (commit, mut results) = without_unknown_partitions(broker, commit);
        if !commit.partitions.is_empty() {
            results.extend(
                match broker
                    .groups
                    .call(|c, token, now| c.txn_offset_commit(token, &commit, producer, now))
                    .await
                {
                    Some(Reply::Commit(r)) => r,
                    _ => all_failed(&commit.partitions, LOST),
                },
            );
        }
        let results = results
            .into_iter()
            .map(|r| PartitionResult {
                error: txn_commit_error(r.error, version),
                ..r
            })
            .collect();
        TxnOffsetCommitResponse::default().with_topics(response_topics(
            results,
            |name, parts| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(name)
                    .with_partitions(parts)
            },
            |p, e| {
                TxnOffsetCommitResponsePartition::default()
                    .with_partition_index(p)
                    .with_error_code(e)
            },
        ))
    }
    .instrument(span)
    .await
}

/// What a TxnOffsetCommit of `version` answers for a write error: the
/// transaction coordinator's verdicts as a producer of that version knows
/// them.
fn txn_commit_error(error: Option<ResponseError>, version: i16) -> Option<ResponseError> {
    let error = match error {
        // Not in the transaction (v0–v4 verify only): the producer must abort.
        Some(ResponseError::TransactionAbortable | ResponseError::InvalidTxnState)
            if version < 5 =>
        {
            Some(ResponseError::InvalidTxnState)
        }
        // The verification call itself failed: retriable, as Kafka's group
        // coordinator answers it. CONCURRENT_TRANSACTIONS (markers of the
        // previous transaction in flight) goes back as it is: clients retry it.
        Some(ResponseError::NetworkException) => Some(ResponseError::CoordinatorLoadInProgress),
        other => other,
    };
    // KIP-588: TxnOffsetCommit knows PRODUCER_FENCED from v3; older
    // versions get INVALID_PRODUCER_EPOCH.
    producer_fenced_for_version(error, version, 3)
}

/// `(topic, partitions)` the request names; `None`: every partition.
type Wanted = Option<Vec<(String, Vec<i32>)>>;

fn fetched(
    broker: &Broker,
    group_id: &str,
    wanted: &Wanted,
    require_stable: bool,
) -> Result<Vec<FetchedOffset>, ResponseError> {
    broker
        .groups
        .serving()
        .offset_fetch(group_id, wanted.as_deref(), require_stable)
}

fn group_fetched(offsets: Vec<FetchedOffset>) -> Vec<(String, Vec<FetchedOffset>)> {
    let mut out: Vec<(String, Vec<FetchedOffset>)> = Vec::new();
    for o in offsets {
        match out.iter_mut().find(|(t, _)| *t == o.topic) {
            Some((_, v)) => v.push(o),
            None => out.push((o.topic.clone(), vec![o])),
        }
    }
    out
}

pub fn offset_fetch(
    broker: &Broker,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let require_stable = version >= 7 && request.require_stable;
    if version >= 8 {
        let groups = request
            .groups
            .iter()
            .map(|g| {
                let wanted: Wanted = g.topics.as_ref().map(|ts| {
                    ts.iter()
                        .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                        .collect()
                });
                let group = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                match fetched(broker, g.group_id.as_str(), &wanted, require_stable) {
                    Err(e) => group.with_error_code(e.code()),
                    Ok(offsets) => group.with_topics(
                        group_fetched(offsets)
                            .into_iter()
                            .map(|(topic, parts)| {
                                OffsetFetchResponseTopics::default()
                                    .with_name(topic_name(topic))
                                    .with_partitions(
                                        parts
                                            .into_iter()
                                            .map(|o| {
                                                let (offset, epoch, metadata) = split(&o);
                                                OffsetFetchResponsePartitions::default()
                                                    .with_partition_index(o.partition)
                                                    .with_committed_offset(offset)
                                                    .with_committed_leader_epoch(epoch)
                                                    .with_metadata(Some(str_bytes(metadata)))
                                                    .with_error_code(wire_code(o.error))
                                            })
                                            .collect(),
                                    )
                            })
                            .collect(),
                    ),
                }
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let wanted: Wanted = request.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
            .collect()
    });
    // v1 has no "all partitions" (null topics is v2+).
    let wanted = if version < 2 && wanted.is_none() {
        Some(Vec::new())
    } else {
        wanted
    };
    match fetched(broker, request.group_id.as_str(), &wanted, require_stable) {
        Err(e) if version >= 2 => OffsetFetchResponse::default().with_error_code(e.code()),
        Err(e) => {
            // v1 reports a coordinator error on every partition.
            let offsets = wanted
                .unwrap_or_default()
                .into_iter()
                .flat_map(|(t, ps)| {
                    ps.into_iter().map(move |p| FetchedOffset {
                        topic: t.clone(),
                        partition: p,
                        offset: None,
                        error: Some(e),
                    })
                })
                .collect();
            OffsetFetchResponse::default().with_topics(v7_topics(offsets, version))
        }
        Ok(offsets) => OffsetFetchResponse::default().with_topics(v7_topics(offsets, version)),
    }
}

fn split(o: &FetchedOffset) -> (i64, i32, String) {
    match &o.offset {
        Some(c) => (
            c.offset,
            c.leader_epoch,
            c.metadata.clone().unwrap_or_default(),
        ),
        None => (-1, -1, String::new()),
    }
}

fn v7_topics(offsets: Vec<FetchedOffset>, version: i16) -> Vec<OffsetFetchResponseTopic> {
    group_fetched(offsets)
        .into_iter()
        .map(|(topic, parts)| {
            OffsetFetchResponseTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(
                    parts
                        .into_iter()
                        .map(|o| {
                            let (offset, epoch, metadata) = split(&o);
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(o.partition)
                                .with_committed_offset(offset)
                                .with_committed_leader_epoch(if version >= 5 { epoch } else { -1 })
                                .with_metadata(Some(str_bytes(metadata)))
                                .with_error_code(wire_code(o.error))
                        })
                        .collect(),
                )
        })
        .collect()
}

pub async fn offset_delete(broker: &Broker, request: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group_id = request.group_id.to_string();
    let partitions: Vec<(String, i32)> = request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    let mut top_error = None;
    let reply = broker
        .groups
        .call(
            |c, token, now| match c.offset_delete(token, &group_id, &partitions, now) {
                Ok(step) => step,
                Err(e) => {
                    top_error = Some(e);
                    crate::coordinator::group::GroupStep {
                        deliveries: vec![(token, Reply::Commit(Vec::new()))],
                        writes: Vec::new(),
                    }
                }
            },
        )
        .await;
    if let Some(e) = top_error {
        return OffsetDeleteResponse::default().with_error_code(e.code());
    }
    let Some(Reply::Commit(results)) = reply else {
        return OffsetDeleteResponse::default().with_error_code(LOST.code());
    };
    OffsetDeleteResponse::default().with_topics(response_topics(
        results,
        |name, parts| {
            OffsetDeleteResponseTopic::default()
                .with_name(name)
                .with_partitions(parts)
        },
        |p, e| {
            OffsetDeleteResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(e)
        },
    ))
}

pub async fn delete_groups(broker: &Broker, request: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for group in &request.groups_names {
        let name = group.to_string();
        let error = match broker
            .groups
            .call(|c, token, now| c.delete_group(token, &name, now))
            .await
        {
            Some(Reply::Deleted(e)) => e,
            _ => Some(LOST),
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group.clone())
                .with_error_code(wire_code(error)),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

pub fn describe_groups(
    broker: &Broker,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let coordinator = broker.groups.serving();
    let groups = request
        .groups
        .iter()
        .map(|g: &GroupId| {
            let described = DescribedGroup::default().with_group_id(g.clone());
            match coordinator.describe_group(g.as_str()) {
                Err(e) => described
                    .with_error_code(e.code())
                    .with_group_state(str_bytes("")),
                Ok(d) => {
                    let unknown = d.state == crate::coordinator::group::GroupState::Dead
                        && d.members.is_empty()
                        && d.protocol_type.is_empty();
                    let described = described
                        .with_group_state(str_bytes(d.state.name()))
                        .with_protocol_type(str_bytes(d.protocol_type))
                        .with_protocol_data(str_bytes(d.protocol))
                        .with_members(
                            d.members
                                .into_iter()
                                .map(|m| {
                                    let mut r = DescribedGroupMember::default()
                                        .with_member_id(str_bytes(m.member_id))
                                        .with_client_id(str_bytes(m.client_id))
                                        .with_client_host(str_bytes(m.client_host))
                                        .with_member_metadata(m.metadata.into())
                                        .with_member_assignment(m.assignment.into());
                                    if version >= 4 {
                                        r = r.with_group_instance_id(m.instance_id.map(str_bytes));
                                    }
                                    r
                                })
                                .collect(),
                        );
                    // v6 (KIP-1043) reports an unknown group as not found.
                    if unknown && version >= 6 {
                        described
                            .with_error_code(ResponseError::GroupIdNotFound.code())
                            .with_error_message(Some(str_bytes(format!(
                                "Group {} not found.",
                                g.as_str()
                            ))))
                    } else {
                        described
                    }
                }
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub fn list_groups(
    broker: &Broker,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let listed = match broker.groups.serving().list_groups() {
        Ok(l) => l,
        Err(e) => return ListGroupsResponse::default().with_error_code(e.code()),
    };
    let states: Vec<String> = if version >= 4 {
        request
            .states_filter
            .iter()
            .map(|s| s.to_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let types: Vec<String> = if version >= 5 {
        request
            .types_filter
            .iter()
            .map(|s| s.to_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let groups = listed
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state.name().to_lowercase()))
        // Every group samsa has is a classic group.
        .filter(|_| types.is_empty() || types.iter().any(|t| t == "classic"))
        .map(|g| {
            let mut r = ListedGroup::default()
                .with_group_id(GroupId(str_bytes(g.group_id)))
                .with_protocol_type(str_bytes(g.protocol_type));
            if version >= 4 {
                r = r.with_group_state(str_bytes(g.state.name()));
            }
            if version >= 5 {
                r = r.with_group_type(str_bytes("classic"));
            }
            r
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ResponseError as E;

    #[test]
    fn txn_offset_commit_errors_are_kafkas() {
        // Markers of the previous transaction still in flight: passed on
        // for the client to retry (Kafka's group coordinator does the same).
        assert_eq!(
            txn_commit_error(Some(E::ConcurrentTransactions), 3),
            Some(E::ConcurrentTransactions)
        );
        assert_eq!(
            txn_commit_error(Some(E::CoordinatorLoadInProgress), 3),
            Some(E::CoordinatorLoadInProgress)
        );
        assert_eq!(
            txn_commit_error(Some(E::NetworkException), 4),
            Some(E::CoordinatorLoadInProgress)
        );
        assert_eq!(
            txn_commit_error(Some(E::TransactionAbortable), 4),
            Some(E::InvalidTxnState)
        );
        assert_eq!(
            txn_commit_error(Some(E::TransactionAbortable), 5),
            Some(E::TransactionAbortable)
        );
        // KIP-588: PRODUCER_FENCED from v3, INVALID_PRODUCER_EPOCH before.
        assert_eq!(
            txn_commit_error(Some(E::ProducerFenced), 2),
            Some(E::InvalidProducerEpoch)
        );
        assert_eq!(
            txn_commit_error(Some(E::ProducerFenced), 3),
            Some(E::ProducerFenced)
        );
        assert_eq!(
            txn_commit_error(Some(E::InvalidProducerIdMapping), 4),
            Some(E::InvalidProducerIdMapping)
        );
        assert_eq!(txn_commit_error(None, 3), None);
    }
}
