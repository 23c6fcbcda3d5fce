//! Transaction APIs: the wire side of the coordinator (`InitProducerId`
//! with a transactional id, `AddPartitionsToTxn`, `AddOffsetsToTxn`,
//! `EndTxn`, `DescribeTransactions`, `ListTransactions`) and of partition
//! leaders (`WriteTxnMarkers`, `DescribeProducers`).
//!
//! Each handler converts the `kafka-protocol` message to the coordinator's
//! [`crate::coordinator::txn::api`] structs, runs the coordinator under its lock, waits
//! for the write it asks for (`TxnRuntime::respond`), and converts back.
//! Every coordinator call runs in a span carrying the transactional id and
//! producer id.
//!
//! AddPartitionsToTxn, AddOffsetsToTxn and EndTxn that the coordinator
//! answers CONCURRENT_TRANSACTIONS (the id's previous transaction is still
//! writing its markers or its `Complete*` record) are asked again each time
//! a state write completes, for up to [`CONCURRENT_WAIT`], and only then
//! answered CONCURRENT_TRANSACTIONS ([`unless_concurrent`]).

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProducerId, TransactionalId, WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
};
use samsa_storage::EndTxnMarker;
use tracing::{info_span, Instrument};

use super::topic_name;
use crate::coordinator::txn::markers::write_markers;
use crate::coordinator::txn::{self, Outcome, TxnResult};
use crate::error::wire_code;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::topic_partition::TopicPartition;
use crate::{now_ms, Broker};

/// How long a request the coordinator answers CONCURRENT_TRANSACTIONS
/// waits on the broker for the conflicting write to finish. The client
/// would retry anyway after a backoff (librdkafka: 20 ms for
/// AddPartitionsToTxn, `retry.backoff.ms` otherwise); back-to-back
/// transactions meet this on every first AddPartitionsToTxn, because EndTxn
/// is answered once `Prepare*` is durable and the markers and `Complete*`
/// follow. Short, so a transaction whose markers cannot be written still
/// gets its answer and the client's own retry loop as before.
const CONCURRENT_WAIT: Duration = Duration::from_millis(100);

/// Runs `attempt` (a coordinator handler) and, while it plans no write and
/// its response is `concurrent`, runs it again after each completed state
/// write, until [`CONCURRENT_WAIT`] has passed. The same answer a client
/// retry would get, without the client's backoff.
async fn unless_concurrent<R>(
    broker: &Broker,
    mut attempt: impl FnMut() -> Outcome<R>,
    concurrent: impl Fn(&R) -> bool,
) -> Outcome<R> {
    let deadline = tokio::time::Instant::now() + CONCURRENT_WAIT;
    loop {
        let settled = broker.txn.settled();
        tokio::pin!(settled);
        // Registered before the attempt: a write completing in between
        // still wakes this wait.
        settled.as_mut().enable();
        let outcome = attempt();
        if outcome.write.is_some()
            || !concurrent(&outcome.response)
            || tokio::time::Instant::now() >= deadline
        {
            return outcome;
        }
        // On timeout the loop asks once more and returns that answer.
        let _ = tokio::time::timeout_at(deadline, settled).await;
    }
}

fn is_concurrent(error: Option<ResponseError>) -> bool {
    error == Some(ResponseError::ConcurrentTransactions)
}

/// `InitProducerId` with a transactional id (the idempotent path stays in
/// `init_producer_id`).
pub async fn init_producer_id(
    broker: &Broker,
    request: &InitProducerIdRequest,
    transactional_id: &str,
    version: i16,
) -> InitProducerIdResponse {
    let span = info_span!(
        "init_producer_id",
        transactional_id,
        producer_id = request.producer_id.0
    );
    async {
        let answer = |r: txn::InitProducerIdResponse| {
            InitProducerIdResponse::default()
                .with_error_code(wire_code(r.error))
                .with_producer_id(ProducerId(r.producer_id))
                .with_producer_epoch(r.producer_epoch)
        };
        if let Err(e) = broker.txn.ensure_state_topic(broker) {
            return answer(txn::InitProducerIdResponse::error(e));
        }
        let current = if version >= 3 {
            match txn::InitProducerIdRequest::current_from_wire(
                request.producer_id.0,
                request.producer_epoch,
            ) {
                Ok(current) => current,
                Err(e) => return answer(txn::InitProducerIdResponse::error(e)),
            }
        } else {
            None
        };
        let req = txn::InitProducerIdRequest {
            transactional_id: transactional_id.to_string(),
            transaction_timeout_ms: request.transaction_timeout_ms,
            current,
            version,
        };
        broker.txn.prepare_ids(broker).await;
        let outcome = broker
            .txn
            .with_ids(broker, |c, ids| c.init_producer_id(&req, now_ms(), ids));
        answer(broker.txn.respond(broker, outcome).await)
    }
    .instrument(span)
    .await
}

/// Unknown topics answer UNKNOWN_TOPIC_OR_PARTITION and every other
/// partition of the request OPERATION_NOT_ATTEMPTED, as Kafka does; `None`
/// when every partition exists.
fn unknown_partitions(
    broker: &Broker,
    partitions: &[TopicPartition],
) -> Option<Vec<(TopicPartition, Option<ResponseError>)>> {
    let image = broker.metadata.image();
    let known = |tp: &TopicPartition| image.partition(&tp.topic, tp.partition).is_some();
    if partitions.iter().all(known) {
        return None;
    }
    Some(
        partitions
            .iter()
            .map(|tp| {
                let e = if known(tp) {
                    ResponseError::OperationNotAttempted
                } else {
                    ResponseError::UnknownTopicOrPartition
                };
                (tp.clone(), Some(e))
            })
            .collect(),
    )
}

fn topic_results(
    results: Vec<(TopicPartition, Option<ResponseError>)>,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut by_topic: BTreeMap<String, Vec<AddPartitionsToTxnPartitionResult>> = BTreeMap::new();
    for (tp, e) in results {
        by_topic.entry(tp.topic).or_default().push(
            AddPartitionsToTxnPartitionResult::default()
                .with_partition_index(tp.partition)
                .with_partition_error_code(wire_code(e)),
        );
    }
    by_topic
        .into_iter()
        .map(|(topic, partitions)| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(topic_name(topic))
                .with_results_by_partition(partitions)
        })
        .collect()
}

/// Kafka's authorization of one transaction of an AddPartitionsToTxn
/// request: without WRITE on the transactional id every partition answers
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED; otherwise the partitions of a
/// topic the caller may not WRITE answer TOPIC_AUTHORIZATION_FAILED and the
/// rest OPERATION_NOT_ATTEMPTED. `None`: all allowed.
fn unauthorized_partitions(
    access: &Access,
    transactional_id: &str,
    partitions: &[TopicPartition],
) -> Option<Vec<(TopicPartition, Option<ResponseError>)>> {
    if !access.allows_transactional_id(AclOperation::Write, transactional_id) {
        return Some(
            partitions
                .iter()
                .map(|tp| {
                    (
                        tp.clone(),
                        Some(ResponseError::TransactionalIdAuthorizationFailed),
                    )
                })
                .collect(),
        );
    }
    let denied: Vec<bool> = partitions
        .iter()
        .map(|tp| !access.allows_topic(AclOperation::Write, &tp.topic))
        .collect();
    if !denied.contains(&true) {
        return None;
    }
    Some(
        partitions
            .iter()
            .zip(denied)
            .map(|(tp, denied)| {
                let e = if denied {
                    ResponseError::TopicAuthorizationFailed
                } else {
                    ResponseError::OperationNotAttempted
                };
                (tp.clone(), Some(e))
            })
            .collect(),
    )
}

/// One transaction of an `AddPartitionsToTxn` request.
#[allow(clippy::too_many_arguments)]
async fn add_partitions_one(
    broker: &Broker,
    access: &Access,
    transactional_id: &TransactionalId,
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
    verify_only: bool,
    version: i16,
) -> Vec<(TopicPartition, Option<ResponseError>)> {
    let id = transactional_id.0.as_str();
    let span = info_span!(
        "add_partitions_to_txn",
        transactional_id = id,
        producer_id,
        producer_epoch,
        verify_only
    );
    async {
        if let Some(unauthorized) = unauthorized_partitions(access, id, &partitions) {
            return unauthorized;
        }
        if let Some(unknown) = unknown_partitions(broker, &partitions) {
            return unknown;
        }
        let req = txn::AddPartitionsRequest {
            transactional_id: id.to_string(),
            producer_id,
            producer_epoch,
            partitions,
            verify_only,
            version,
        };
        let outcome = unless_concurrent(
            broker,
            || broker.txn.serving().add_partitions_to_txn(&req, now_ms()),
            |r: &txn::AddPartitionsResponse| r.results.iter().any(|(_, e)| is_concurrent(*e)),
        )
        .await;
        broker.txn.respond(broker, outcome).await.results
    }
    .instrument(span)
    .await
}

pub async fn add_partitions_to_txn(
    broker: &Broker,
    access: &Access,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let flatten = |topics: &[kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic]| {
        topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| TopicPartition::new(t.name.0.as_str(), *p))
            })
            .collect::<Vec<_>>()
    };
    if version < 4 {
        let results = add_partitions_one(
            broker,
            access,
            &request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id.0,
            request.v3_and_below_producer_epoch,
            flatten(&request.v3_and_below_topics),
            false,
            version,
        )
        .await;
        return AddPartitionsToTxnResponse::default()
            .with_results_by_topic_v3_and_below(topic_results(results));
    }
    // v4+ batches transactions: a broker's request (Kafka's produce-path
    // verification), which needs CLUSTER_ACTION.
    if !access.allows_cluster(AclOperation::ClusterAction) {
        return AddPartitionsToTxnResponse::default()
            .with_error_code(ResponseError::ClusterAuthorizationFailed.code());
    }
    let mut out = Vec::with_capacity(request.transactions.len());
    for t in &request.transactions {
        let results = add_partitions_one(
            broker,
            access,
            &t.transactional_id,
            t.producer_id.0,
            t.producer_epoch,
            flatten(&t.topics),
            t.verify_only,
            version,
        )
        .await;
        out.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(topic_results(results)),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(out)
}

pub async fn add_offsets_to_txn(
    broker: &Broker,
    access: &Access,
    request: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let id = request.transactional_id.0.as_str();
    let span = info_span!(
        "add_offsets_to_txn",
        transactional_id = id,
        producer_id = request.producer_id.0,
        group = request.group_id.0.as_str()
    );
    async {
        if !access.allows_transactional_id(AclOperation::Write, id) {
            return AddOffsetsToTxnResponse::default()
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
        }
        if !access.allows_group(AclOperation::Read, request.group_id.0.as_str()) {
            return AddOffsetsToTxnResponse::default()
                .with_error_code(ResponseError::GroupAuthorizationFailed.code());
        }
        // The markers of the transaction must reach the group's offsets
        // partition, so it has to exist before it joins the transaction.
        if let Err(e) = broker.groups.ensure_state_topic(broker) {
            return AddOffsetsToTxnResponse::default().with_error_code(e.code());
        }
        let req = txn::AddOffsetsRequest {
            transactional_id: id.to_string(),
            producer_id: request.producer_id.0,
            producer_epoch: request.producer_epoch,
            group_id: request.group_id.0.as_str().to_string(),
            version,
        };
        let outcome = unless_concurrent(
            broker,
            || broker.txn.serving().add_offsets_to_txn(&req, now_ms()),
            |r: &txn::AddOffsetsResponse| is_concurrent(r.error),
        )
        .await;
        let response = broker.txn.respond(broker, outcome).await;
        AddOffsetsToTxnResponse::default().with_error_code(wire_code(response.error))
    }
    .instrument(span)
    .await
}

pub async fn end_txn(
    broker: &Broker,
    access: &Access,
    request: EndTxnRequest,
    version: i16,
) -> EndTxnResponse {
    let id = request.transactional_id.0.as_str();
    let span = info_span!(
        "end_txn",
        transactional_id = id,
        producer_id = request.producer_id.0,
        producer_epoch = request.producer_epoch,
        commit = request.committed
    );
    async {
        if !access.allows_transactional_id(AclOperation::Write, id) {
            return EndTxnResponse::default()
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code());
        }
        let req = txn::EndTxnRequest {
            transactional_id: id.to_string(),
            producer_id: request.producer_id.0,
            producer_epoch: request.producer_epoch,
            result: TxnResult::from_committed(request.committed),
            version,
        };
        broker.txn.prepare_ids(broker).await;
        let outcome = unless_concurrent(
            broker,
            || {
                broker
                    .txn
                    .with_ids(broker, |c, ids| c.end_txn(&req, now_ms(), ids))
            },
            |r: &txn::EndTxnResponse| is_concurrent(r.error),
        )
        .await;
        let response = broker.txn.respond(broker, outcome).await;
        let mut out = EndTxnResponse::default().with_error_code(wire_code(response.error));
        if version >= 5 {
            out = out
                .with_producer_id(ProducerId(response.producer_id))
                .with_producer_epoch(response.producer_epoch);
        }
        out
    }
    .instrument(span)
    .await
}

/// Kafka's `WriteTxnMarkers` (sent by coordinators; samsa's own
/// coordinators use the gRPC `TxnService` between brokers, with the same
/// partition-side function).
pub async fn write_txn_markers(
    broker: &Broker,
    access: &Access,
    request: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let authorized = access.allows_cluster(AclOperation::ClusterAction);
    let mut out = Vec::with_capacity(request.markers.len());
    for m in request.markers {
        let marker = EndTxnMarker {
            producer_id: m.producer_id.0,
            producer_epoch: m.producer_epoch,
            coordinator_epoch: m.coordinator_epoch,
            commit: m.transaction_result,
        };
        let partitions: Vec<TopicPartition> = m
            .topics
            .iter()
            .flat_map(|t| {
                t.partition_indexes
                    .iter()
                    .map(|p| TopicPartition::new(t.name.0.as_str(), *p))
            })
            .collect();
        let span = info_span!(
            "write_txn_markers",
            producer_id = marker.producer_id,
            producer_epoch = marker.producer_epoch,
            commit = marker.commit
        );
        let results = if authorized {
            write_markers(broker, marker, &partitions)
                .instrument(span)
                .await
        } else {
            partitions
                .into_iter()
                .map(|tp| (tp, Some(ResponseError::ClusterAuthorizationFailed)))
                .collect()
        };
        let mut by_topic: BTreeMap<String, Vec<WritableTxnMarkerPartitionResult>> = BTreeMap::new();
        for (tp, e) in results {
            by_topic.entry(tp.topic).or_default().push(
                WritableTxnMarkerPartitionResult::default()
                    .with_partition_index(tp.partition)
                    .with_error_code(wire_code(e)),
            );
        }
        out.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(
                    by_topic
                        .into_iter()
                        .map(|(topic, partitions)| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(topic_name(topic))
                                .with_partitions(partitions)
                        })
                        .collect(),
                ),
        );
    }
    WriteTxnMarkersResponse::default().with_markers(out)
}
