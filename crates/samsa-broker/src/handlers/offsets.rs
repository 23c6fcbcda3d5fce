//! Offset APIs: the wire side of a group's committed offsets (OffsetCommit,
//! TxnOffsetCommit, OffsetFetch, OffsetDelete).
//!
//! Each handler converts the `kafka-protocol` message, runs the group
//! coordinator through its runtime (waiting for the reply delivered to the
//! request's token: a commit is answered once durable), and converts back
//! with only the fields the request's version has. Every call runs in a
//! span carrying the group id.
//!
//! Authorization as Kafka's: a commit needs READ on the group (and, in a
//! transaction, WRITE on the transactional id), else every partition
//! answers GROUP_AUTHORIZATION_FAILED (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
//! a partition of a topic the caller may not READ answers
//! TOPIC_AUTHORIZATION_FAILED. OffsetFetch needs DESCRIBE on the group and
//! on each topic (unnamed topics it may not DESCRIBE are left out);
//! OffsetDelete DELETE on the group and READ on each topic.

use kafka_protocol::error::ResponseError;
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
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, TopicName, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{info_span, Instrument};

use super::group::LOST;
use super::{str_bytes, topic_name};
use crate::coordinator::group::{
    CommitPartition, CommitRequest, FetchedOffset, PartitionResult, Reply,
};
use crate::coordinator::TransactionalWrite;
use crate::error::txn_offset_commit_error;
use crate::error::wire_code;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

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

/// The partitions the caller may commit (or delete) offsets of, and the
/// refusals of the others: all of them refused with `whole` (a group or
/// transactional id it may not use), else those of topics it may not READ.
fn without_unauthorized_partitions(
    access: &Access,
    whole: Option<ResponseError>,
    mut partitions: Vec<CommitPartition>,
) -> (Vec<CommitPartition>, Vec<PartitionResult>) {
    if let Some(error) = whole {
        return (Vec::new(), all_failed(&partitions, error));
    }
    let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut partitions)
        .into_iter()
        .partition(|p| access.allows_topic(AclOperation::Read, &p.topic));
    (
        allowed,
        all_failed(&denied, ResponseError::TopicAuthorizationFailed),
    )
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
    access: &Access,
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
        let group_denied = !access.allows_group(AclOperation::Read, &commit.group_id);
        let (allowed, refused) = without_unauthorized_partitions(
            access,
            group_denied.then_some(ResponseError::GroupAuthorizationFailed),
            commit.partitions,
        );
        let commit = CommitRequest {
            partitions: allowed,
            ..commit
        };
        let (commit, mut results) = without_unknown_partitions(broker, commit);
        results.extend(refused);
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
    access: &Access,
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
        let whole =
            if !access.allows_transactional_id(AclOperation::Write, &producer.transactional_id) {
                Some(ResponseError::TransactionalIdAuthorizationFailed)
            } else if !access.allows_group(AclOperation::Read, &commit.group_id) {
                Some(ResponseError::GroupAuthorizationFailed)
            } else {
                None
            };
        let (allowed, refused) = without_unauthorized_partitions(access, whole, commit.partitions);
        let commit = CommitRequest {
            partitions: allowed,
            ..commit
        };
        let (commit, mut results) = without_unknown_partitions(broker, commit);
        results.extend(refused);
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
                error: txn_offset_commit_error(r.error, version),
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

/// `(topic, partitions)` the request names; `None`: every partition.
type Wanted = Option<Vec<(String, Vec<i32>)>>;

fn fetched(
    broker: &Broker,
    access: &Access,
    group_id: &str,
    wanted: &Wanted,
    require_stable: bool,
) -> Result<Vec<FetchedOffset>, ResponseError> {
    if !access.allows_group(AclOperation::Describe, group_id) {
        return Err(ResponseError::GroupAuthorizationFailed);
    }
    let mut offsets =
        broker
            .groups
            .serving()
            .offset_fetch(group_id, wanted.as_deref(), require_stable)?;
    if wanted.is_none() {
        offsets.retain(|o| access.allows_topic(AclOperation::Describe, &o.topic));
    } else {
        for o in &mut offsets {
            if !access.allows_topic(AclOperation::Describe, &o.topic) {
                o.offset = None;
                o.error = Some(ResponseError::TopicAuthorizationFailed);
            }
        }
    }
    Ok(offsets)
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
    access: &Access,
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
                match fetched(broker, access, g.group_id.as_str(), &wanted, require_stable) {
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
    match fetched(
        broker,
        access,
        request.group_id.as_str(),
        &wanted,
        require_stable,
    ) {
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

pub async fn offset_delete(
    broker: &Broker,
    access: &Access,
    request: OffsetDeleteRequest,
) -> OffsetDeleteResponse {
    let group_id = request.group_id.to_string();
    if !access.allows_group(AclOperation::Delete, &group_id) {
        return OffsetDeleteResponse::default()
            .with_error_code(ResponseError::GroupAuthorizationFailed.code());
    }
    let denied: Vec<PartitionResult> = request
        .topics
        .iter()
        .filter(|t| !access.allows_topic(AclOperation::Read, t.name.as_str()))
        .flat_map(|t| {
            t.partitions.iter().map(move |p| PartitionResult {
                topic: t.name.to_string(),
                partition: p.partition_index,
                error: Some(ResponseError::TopicAuthorizationFailed),
            })
        })
        .collect();
    let partitions: Vec<(String, i32)> = request
        .topics
        .iter()
        .filter(|t| access.allows_topic(AclOperation::Read, t.name.as_str()))
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
    let Some(Reply::Commit(mut results)) = reply else {
        return OffsetDeleteResponse::default().with_error_code(LOST.code());
    };
    results.extend(denied);
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
