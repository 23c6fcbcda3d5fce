//! Produce: validate, append as leader, and answer per `acks`.
//!
//! acks=0 gets no answer (dispatch drops it), acks=1 is answered once the
//! batch is in the leader's log. acks=all is refused with NOT_ENOUGH_REPLICAS
//! before appending when the ISR is smaller than `min.insync.replicas`;
//! otherwise it waits for the fsync that makes the batch durable (flush
//! policy `every-ack`) and for the high watermark to cover it (every ISR
//! member has it), answering NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR
//! shrank below the minimum meanwhile, NOT_LEADER_OR_FOLLOWER if leadership
//! moved, and REQUEST_TIMED_OUT after the request's `timeout_ms`.
//! Idempotence (dedup, sequence and epoch checks) is enforced by the log itself.
//! From v10 a NOT_LEADER_OR_FOLLOWER answer names the current leader, its
//! epoch and endpoint (KIP-951); v13 names topics by id (KIP-516).
//!
//! Transactional batches (KIP-890): before a producer's first transactional
//! write to a partition in a transaction, the leader checks with the
//! transaction coordinator that the partition is in the ongoing transaction
//! (Produce v12+, transaction version 2: adds it), see
//! `transactions::verify`; one call per producer covers every partition of
//! the request that needs it. An unverified write is refused
//! (INVALID_TXN_STATE, or TRANSACTION_ABORTABLE for v11+), a coordinator
//! that cannot answer now gives NOT_ENOUGH_REPLICAS (retriable).
//!
//! Order: a request waits for its connection's earlier produce requests to
//! append before it looks at any partition, and lets the next one go once
//! its own batches are appended, before the acks=all waits
//! ([`crate::produce_order`]). Within a request, partitions are appended in
//! the request's order.

use samsa_metrics::partitions::Rejection;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse,
    TopicProduceResponse,
};
use kafka_protocol::messages::{BrokerId, ProduceRequest, ProduceResponse};
use samsa_storage::{BatchHeader, StorageError};
use tracing::{debug, info, warn, Instrument};

use super::str_bytes;
use crate::coordinator::txn::verify::verify_partitions;
use crate::error::{
    partition_error_code, produce_verification_error, storage_error_code, PartitionError, Refusal,
};
use crate::produce_order::AppendTurn;
use crate::replica::Partition;
use crate::replication::LeaderAppend;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::topic_partition::TopicPartition;
use crate::{now_ms, Broker};

struct PendingDurability {
    topic: usize,
    partition: usize,
    end_offset: i64,
    leader_epoch: i32,
}

/// One partition of the request on its way to the log.
struct Write {
    topic: usize,
    partition: usize,
    name: String,
    index: i32,
    records: bytes::Bytes,
    /// (producer id, epoch) of a transactional batch.
    txn: Option<(i64, i16)>,
    /// The hosted partition, once looked up.
    target: Option<Arc<Partition>>,
}

/// How long after a failed log write (a full disk) a batch that skips ahead
/// of its producer's sequence is answered KAFKA_STORAGE_ERROR instead of
/// OUT_OF_ORDER_SEQUENCE_NUMBER. A pipelining producer has its next request
/// in flight when the disk refuses one; the next finds a gap, and an
/// out-of-order answer makes librdkafka bump the producer's epoch and
/// renumber its queued records, retries a leader may already hold among
/// them (stored twice, then). A retriable refusal lets the client retry
/// both in order. Apache Kafka never gets there: a failed write takes its
/// log directory offline (a broker with one directory stops), so no later
/// request of the partition reaches that broker's sequence check; samsa
/// keeps the partition and retries the disk. The window is the
/// client's default `request.timeout.ms`, the longest a request in flight
/// behind the refused one can take to arrive.
const SEQUENCE_GAP_AFTER_FAILED_WRITE: std::time::Duration = std::time::Duration::from_secs(30);

/// The first version that names topics by id (KIP-516).
const TOPIC_IDS: i16 = 13;
/// The first version that carries leader hints on NOT_LEADER_OR_FOLLOWER
/// (KIP-951).
const LEADER_HINTS: i16 = 10;

/// Produce: refuse what the request alone rules out, wait for this
/// connection's append turn, find the leaders, verify transactional
/// first writes (KIP-890), append, pass the turn on, then wait for
/// acks=all.
pub async fn handle(
    broker: &Broker,
    access: &Access,
    request: ProduceRequest,
    version: i16,
    mut turn: AppendTurn,
    listener: &str,
) -> ProduceResponse {
    let names = super::topic_names(
        broker,
        version >= TOPIC_IDS,
        request.topic_data.iter().map(|t| (&t.name, &t.topic_id)),
    );
    let _in_flight = turn.track(
        &broker.pipelining,
        request
            .topic_data
            .iter()
            .zip(&names)
            .filter_map(|(t, name)| Some((t, name.as_deref()?)))
            .flat_map(|(t, name)| t.partition_data.iter().map(move |p| (name, p.index))),
    );
    let acks = request.acks;
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
    let transactional_id = request.transactional_id.as_ref().map(|t| t.0.to_string());
    let (mut responses, mut writes) = plan(access, request, names, version);

    turn.wait().await;
    find_leaders(broker, &mut writes, &mut responses, version);
    if let Some(transactional_id) = &transactional_id {
        verify_transactions(
            broker,
            transactional_id,
            &mut writes,
            &mut responses,
            version,
        )
        .await;
    }
    let waits = append_all(&writes, &mut responses, acks, version);
    // Every batch of this request is in its log (or refused): the
    // connection's next produce request may append while this one waits.
    turn.release();

    let _parked = (!waits.is_empty()).then(|| broker.metrics.partitions.produce_waiting());
    samsa_metrics::requests::waiting_remotely(wait_acks_all(
        &waits,
        deadline,
        &mut responses,
        version,
    ))
    .await;
    let mut response = ProduceResponse::default().with_responses(responses);
    if version >= LEADER_HINTS {
        add_leader_hints(broker, &mut response, &writes, listener);
    }
    response
}

/// The response skeleton of every partition, and the writes of those the
/// request alone does not rule out (unknown topic id, a batch that is not
/// admissible).
fn plan(
    access: &Access,
    request: ProduceRequest,
    names: Vec<Option<String>>,
    version: i16,
) -> (Vec<TopicProduceResponse>, Vec<Write>) {
    let acks = request.acks;
    // As Kafka: transactional records fail the whole request with
    // TRANSACTIONAL_ID_AUTHORIZATION_FAILED unless the request names a
    // transactional id the caller may WRITE (the id is what the write is
    // authorised and verified against).
    let has_txn_records = request.topic_data.iter().any(|t| {
        t.partition_data.iter().any(|p| {
            p.records
                .as_ref()
                .and_then(|r| BatchHeader::parse(r).ok())
                .is_some_and(|h| h.is_transactional())
        })
    });
    let txn_refused = has_txn_records
        && !request
            .transactional_id
            .as_ref()
            .is_some_and(|id| access.allows_transactional_id(AclOperation::Write, id.0.as_str()));
    let mut responses = Vec::with_capacity(request.topic_data.len());
    let mut writes = Vec::new();
    for (topic_index, (topic, name)) in request.topic_data.into_iter().zip(names).enumerate() {
        let topic_id = topic.topic_id;
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for (partition_index, data) in topic.partition_data.into_iter().enumerate() {
            let mut response = PartitionProduceResponse::default()
                .with_index(data.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let records = data.records.unwrap_or_default();
            let Some(name) = &name else {
                let message = format!("unknown topic id {topic_id}");
                refuse(
                    &mut response,
                    Refusal::new(ResponseError::UnknownTopicId, message),
                    version,
                );
                partitions.push(response);
                continue;
            };
            if !access.allows_topic(AclOperation::Write, name) {
                let message = format!("not authorized to write to topic {name}");
                refuse(
                    &mut response,
                    Refusal::new(ResponseError::TopicAuthorizationFailed, message),
                    version,
                );
                partitions.push(response);
                continue;
            }
            match admissible(txn_refused, acks, &records) {
                Ok(txn) => writes.push(Write {
                    topic: topic_index,
                    partition: partition_index,
                    name: name.clone(),
                    index: data.index,
                    records,
                    txn,
                    target: None,
                }),
                Err(refusal) => refuse(&mut response, refusal, version),
            }
            partitions.push(response);
        }
        let mut response = TopicProduceResponse::default().with_partition_responses(partitions);
        if version >= TOPIC_IDS {
            response.topic_id = topic_id;
        } else {
            response.name = super::topic_name(name.unwrap_or_default());
        }
        responses.push(response);
    }
    (responses, writes)
}

/// Each write's partition, if this broker leads it; the others refused.
fn find_leaders(
    broker: &Broker,
    writes: &mut [Write],
    responses: &mut [TopicProduceResponse],
    version: i16,
) {
    for write in writes {
        match broker.leader_partition(&write.name, write.index) {
            Ok(partition) => write.target = Some(partition),
            Err(code) => {
                let why = if code == ResponseError::NotLeaderOrFollower {
                    "this broker does not lead"
                } else {
                    "this server does not host"
                };
                let message = format!("{why} {}-{}", write.name, write.index);
                refuse(
                    &mut responses[write.topic].partition_responses[write.partition],
                    Refusal::new(code, message),
                    version,
                );
            }
        }
    }
}

/// Appends every write that still has a partition; for acks=all, what to
/// wait for.
fn append_all(
    writes: &[Write],
    responses: &mut [TopicProduceResponse],
    acks: i16,
    version: i16,
) -> Vec<(PendingDurability, Arc<Partition>)> {
    let now = now_ms();
    let mut waits = Vec::new();
    for write in writes {
        let Some(partition) = &write.target else {
            continue;
        };
        let response = &mut responses[write.topic].partition_responses[write.partition];
        match append(partition, write, acks, now, version) {
            Ok(AppendedBatch {
                append:
                    LeaderAppend {
                        info,
                        log_start_offset,
                    },
                leader_epoch,
            }) => {
                partition.traffic.produced(
                    write.records.len() as u64,
                    u64::try_from(info.last_offset - info.base_offset + 1).unwrap_or(0),
                );
                response.base_offset = info.base_offset;
                response.log_append_time_ms = info.log_append_time_ms;
                response.log_start_offset = log_start_offset;
                if acks == -1 {
                    let wait = PendingDurability {
                        topic: write.topic,
                        partition: write.partition,
                        end_offset: info.last_offset + 1,
                        leader_epoch,
                    };
                    waits.push((wait, Arc::clone(partition)));
                }
            }
            Err(refusal) => refuse(response, refusal, version),
        }
    }
    waits
}

/// acks=all: answer only after the group-commit fsync covering each batch
/// and once the HW (every ISR member) covers it.
async fn wait_acks_all(
    waits: &[(PendingDurability, Arc<Partition>)],
    deadline: tokio::time::Instant,
    responses: &mut [TopicProduceResponse],
    version: i16,
) {
    let outcomes = join_all(waits.iter().map(|(wait, partition)| async move {
        partition
            .wait_acks_all(wait.end_offset, wait.leader_epoch, deadline)
            .await
    }))
    .await;
    for ((wait, _), outcome) in waits.iter().zip(outcomes) {
        if let Err(refusal) = outcome {
            refuse(
                &mut responses[wait.topic].partition_responses[wait.partition],
                refusal,
                version,
            );
        }
    }
}

/// KIP-951: every NOT_LEADER_OR_FOLLOWER answer names the partition's
/// current leader and epoch, and the response carries those leaders'
/// endpoints, so the client need not refresh its metadata first.
fn add_leader_hints(
    broker: &Broker,
    response: &mut ProduceResponse,
    writes: &[Write],
    listener: &str,
) {
    let mut endpoints: BTreeMap<i32, NodeEndpoint> = BTreeMap::new();
    for write in writes {
        let answer = &mut response.responses[write.topic].partition_responses[write.partition];
        if answer.error_code != ResponseError::NotLeaderOrFollower.code() {
            continue;
        }
        let hint = super::leader_hint(broker, &write.name, write.index, listener);
        answer.current_leader = LeaderIdAndEpoch::default()
            .with_leader_id(BrokerId(hint.leader_id))
            .with_leader_epoch(hint.leader_epoch);
        if let Some(b) = hint.endpoint {
            endpoints.entry(hint.leader_id).or_insert_with(|| {
                NodeEndpoint::default()
                    .with_node_id(BrokerId(hint.leader_id))
                    .with_host(str_bytes(b.host))
                    .with_port(b.port)
                    .with_rack(b.rack.map(str_bytes))
            });
        }
    }
    response.node_endpoints = endpoints.into_values().collect();
}

/// The checks that need nothing but the request: `Ok` with the batch's
/// (producer id, epoch) when it is transactional.
fn admissible(txn_refused: bool, acks: i16, records: &[u8]) -> Result<Option<(i64, i16)>, Refusal> {
    if txn_refused {
        return Err(Refusal::new(
            ResponseError::TransactionalIdAuthorizationFailed,
            "transactional records without a transactional id the producer may write".to_string(),
        ));
    }
    if !matches!(acks, -1..=1) {
        return Err(Refusal::new(
            ResponseError::InvalidRequiredAcks,
            format!("acks={acks} is not -1, 0 or 1"),
        ));
    }
    // Only a group coordinator writes transactional batches without a
    // sequence (offsets committed in a transaction); the log checks nothing
    // but their epoch, so clients may not.
    let unsequenced = samsa_storage::batch::batches(records).any(|b| {
        b.is_ok_and(|(h, _)| {
            h.is_transactional() && h.base_sequence == samsa_storage::batch::NO_SEQUENCE
        })
    });
    if unsequenced {
        return Err(Refusal::new(
            ResponseError::InvalidRecord,
            "a transactional batch without a sequence number".to_string(),
        ));
    }
    Ok(BatchHeader::parse(records)
        .ok()
        .filter(BatchHeader::is_transactional)
        .map(|h| (h.producer_id, h.producer_epoch)))
}

/// KIP-890: asks the coordinator about every partition whose transactional
/// write would open its producer's transaction there, one call per
/// producer, and refuses the writes it does not confirm.
async fn verify_transactions(
    broker: &Broker,
    transactional_id: &str,
    writes: &mut [Write],
    responses: &mut [TopicProduceResponse],
    version: i16,
) {
    // (producer id, epoch) -> indexes into `writes`.
    let mut unverified: BTreeMap<(i64, i16), Vec<usize>> = BTreeMap::new();
    for (i, write) in writes.iter_mut().enumerate() {
        let (Some(partition), Some((producer_id, producer_epoch))) = (&write.target, write.txn)
        else {
            continue;
        };
        match partition.txn_needs_verification(producer_id, producer_epoch) {
            Ok(false) => {}
            // Verification off: the write opens its transaction on trust,
            // as Kafka does with the same setting.
            Ok(true)
                if !broker
                    .effective_config()
                    .transaction_partition_verification_enable =>
            {
                partition.mark_txn_verified(producer_id, producer_epoch);
            }
            Ok(true) => unverified
                .entry((producer_id, producer_epoch))
                .or_default()
                .push(i),
            Err(e) => {
                refuse(
                    &mut responses[write.topic].partition_responses[write.partition],
                    Refusal::new(partition_error_code(&e), e.to_string()),
                    version,
                );
                write.target = None;
            }
        }
    }
    let answers = join_all(unverified.iter().map(|(&(producer_id, epoch), indexes)| {
        let partitions = indexes
            .iter()
            .map(|&i| TopicPartition::new(writes[i].name.clone(), writes[i].index))
            .collect();
        verify_partitions(
            broker,
            transactional_id,
            producer_id,
            epoch,
            partitions,
            // Produce v12+ is transaction version 2: the write adds the
            // partition itself.
            version >= 12,
        )
        .instrument(tracing::debug_span!(
            target: crate::trace::TARGET,
            "verify_txn",
            transactional_id,
            producer_id,
            producer_epoch = epoch
        ))
    }))
    .await;
    for ((&(producer_id, producer_epoch), indexes), answer) in unverified.iter().zip(answers) {
        for &i in indexes {
            let write = &mut writes[i];
            let outcome = match &answer {
                Err(e) => Some(*e),
                Ok(results) => results
                    .iter()
                    .find(|(tp, _)| tp.topic == write.name && tp.partition == write.index)
                    .map_or(Some(ResponseError::UnknownServerError), |(_, e)| *e),
            };
            let Some(partition) = &write.target else {
                continue;
            };
            match outcome {
                None => partition.mark_txn_verified(producer_id, producer_epoch),
                Some(e) => {
                    let code = produce_verification_error(e, version);
                    info!(partition = %partition.name(), transactional_id, producer_id, producer_epoch, coordinator_error = ?e, answer = ?code, "transactional write not verified");
                    let message = format!(
                        "{}-{}: the transaction coordinator answered {e:?}",
                        write.name, write.index
                    );
                    refuse(
                        &mut responses[write.topic].partition_responses[write.partition],
                        Refusal::new(code, message),
                        version,
                    );
                    write.target = None;
                }
            }
        }
    }
}

/// A batch appended as leader, and the leader epoch it was written in.
struct AppendedBatch {
    append: LeaderAppend,
    leader_epoch: i32,
}

/// Appends one partition's batch as leader.
fn append(
    partition: &Partition,
    write: &Write,
    acks: i16,
    now: i64,
    version: i16,
) -> Result<AppendedBatch, Refusal> {
    if acks == -1 {
        let in_sync = partition.in_sync_replicas();
        if in_sync.below_min() {
            return Err(Refusal::new(
                ResponseError::NotEnoughReplicas,
                format!(
                    "{}-{}: {} in-sync replicas, min.insync.replicas is {}",
                    write.name, write.index, in_sync.count, in_sync.min
                ),
            ));
        }
    }
    let leader_epoch = partition.leader_epoch();
    let appended = crate::blocking_io(|| match write.txn {
        Some((producer_id, producer_epoch)) => {
            partition.append_transactional(&write.records, producer_id, producer_epoch, now)
        }
        None => partition.append(&write.records, now),
    });
    match appended {
        Ok(append) => {
            if append.info.duplicate {
                debug!(partition = %partition.name(), base_offset = append.info.base_offset, "duplicate batch; answering with original offset");
            }
            Ok(AppendedBatch {
                append,
                leader_epoch,
            })
        }
        Err(PartitionError::Storage(e))
            if e.is_sequence_gap()
                && partition.write_failures.failed_within(
                    tokio::time::Instant::now(),
                    SEQUENCE_GAP_AFTER_FAILED_WRITE,
                ) =>
        {
            debug!(partition = %partition.name(), error = %e, "batch skips ahead just after a failed write; answering KAFKA_STORAGE_ERROR");
            Err(Refusal::new(
                ResponseError::KafkaStorageError,
                format!(
                    "{}: {e}; a write to this partition failed just before, and the missing batch is likely the refused one: retry in order",
                    partition.name()
                ),
            ))
        }
        Err(PartitionError::Storage(e)) => {
            let code = storage_error_code(&e);
            let rejection = match &e {
                StorageError::OutOfOrderSequence { .. } => Some(Rejection::OutOfOrderSequence),
                StorageError::InvalidProducerEpoch { .. } => Some(Rejection::InvalidProducerEpoch),
                StorageError::TransactionCoordinatorFenced { .. } => {
                    Some(Rejection::CoordinatorFenced)
                }
                _ => None,
            };
            if let Some(why) = rejection {
                partition.meters.rejected(why);
            }
            if matches!(e, StorageError::Io { .. }) {
                // The partition logs when its writes start and stop failing.
                debug!(partition = %partition.name(), error = %e, "append failed");
            } else if code == ResponseError::KafkaStorageError {
                warn!(partition = %partition.name(), error = %e, "append failed");
            } else if matches!(
                code,
                ResponseError::OutOfOrderSequenceNumber | ResponseError::InvalidProducerEpoch
            ) {
                // Rare and consequential: a client bumps its epoch or fails
                // on these.
                info!(partition = %partition.name(), error = %e, "idempotent batch rejected");
            } else {
                debug!(partition = %partition.name(), error = %e, "append rejected");
            }
            Err(Refusal::of_storage(code, &e))
        }
        Err(e @ (PartitionError::Closed(_) | PartitionError::RoleChanged { .. })) => Err(
            Refusal::new(ResponseError::NotLeaderOrFollower, e.to_string()),
        ),
        Err(e @ PartitionError::Flush(_)) => Err(Refusal::new(
            ResponseError::KafkaStorageError,
            e.to_string(),
        )),
        Err(e @ PartitionError::TxnNotVerified { .. }) => {
            partition.meters.rejected(Rejection::TxnNotVerified);
            Err(Refusal::new(
                produce_verification_error(ResponseError::InvalidTxnState, version),
                e.to_string(),
            ))
        }
    }
}

fn refuse(
    response: &mut PartitionProduceResponse,
    Refusal {
        code,
        message,
        record_errors,
    }: Refusal,
    version: i16,
) {
    response.error_code = code.code();
    response.base_offset = -1;
    if version >= 8 {
        response.error_message = Some(str_bytes(message));
        // KIP-467: a client fails the records named here with the error and
        // the batch's others with INVALID_DIFFERENT_RECORD (retriable).
        response.record_errors = record_errors
            .into_iter()
            .map(|(batch_index, why)| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(batch_index)
                    .with_batch_index_error_message(Some(str_bytes(why)))
            })
            .collect();
    }
}
