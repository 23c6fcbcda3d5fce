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
//!
//! Transactional batches (KIP-890): before a producer's first transactional
//! write to a partition in a transaction, the leader checks with the
//! transaction coordinator that the partition is in the ongoing transaction
//! (Produce v12+, transaction version 2: adds it), see
//! `transactions::verify`; an unverified write is refused
//! (INVALID_TXN_STATE, or TRANSACTION_ABORTABLE for v11+), a coordinator
//! that cannot answer now gives NOT_ENOUGH_REPLICAS (retriable). A
//! producer's transactional writes to a partition are verified and
//! appended one at a time, in request order (`Partition::txn_write_turn`).

use std::sync::Arc;

use futures::future::join_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use samsa_storage::BatchHeader;
use tracing::{debug, info, warn, Instrument};

use super::str_bytes;
use crate::error::{partition_error_code, produce_verification_error, storage_error_code};
use crate::replica::PartitionError;
use crate::transactions::verify::verify_partition;
use crate::txn::TopicPartition;
use crate::{now_ms, Broker};

struct PendingDurability {
    topic: usize,
    partition: usize,
    end_offset: i64,
    leader_epoch: i32,
}

pub async fn handle(broker: &Broker, request: ProduceRequest, version: i16) -> ProduceResponse {
    let now = now_ms();
    let acks = request.acks;
    let deadline = tokio::time::Instant::now()
        + std::time::Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
    // As Kafka: transactional records in a request without a transactional
    // id fail the whole request with TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    // (the id is what the write is authorised and verified against).
    let untagged_txn = request.transactional_id.is_none()
        && request.topic_data.iter().any(|t| {
            t.partition_data.iter().any(|p| {
                p.records
                    .as_ref()
                    .and_then(|r| BatchHeader::parse(r).ok())
                    .is_some_and(|h| h.is_transactional())
            })
        });
    let mut responses = Vec::with_capacity(request.topic_data.len());
    let mut waits = Vec::new();
    let mut hosts = Vec::new();

    for (topic_index, topic) in request.topic_data.into_iter().enumerate() {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for (partition_index, data) in topic.partition_data.into_iter().enumerate() {
            let mut response = PartitionProduceResponse::default()
                .with_index(data.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let error: Option<(ResponseError, String)> = 'partition: {
                if untagged_txn {
                    break 'partition Some((
                        ResponseError::TransactionalIdAuthorizationFailed,
                        "transactional records without a transactional id".to_string(),
                    ));
                }
                if !matches!(acks, -1..=1) {
                    break 'partition Some((
                        ResponseError::InvalidRequiredAcks,
                        format!("acks={acks} is not -1, 0 or 1"),
                    ));
                }
                let partition = match broker.leader_partition(&name, data.index) {
                    Ok(partition) => partition,
                    Err(code) => {
                        let why = if code == ResponseError::NotLeaderOrFollower {
                            "this broker does not lead"
                        } else {
                            "this server does not host"
                        };
                        break 'partition Some((code, format!("{why} {name}-{}", data.index)));
                    }
                };
                let records = data.records.unwrap_or_default();
                // Only a group coordinator writes transactional batches
                // without a sequence (offsets committed in a transaction);
                // the log checks nothing but their epoch, so clients may not.
                let unsequenced = samsa_storage::batch::batches(&records).any(|b| {
                    b.is_ok_and(|(h, _)| {
                        h.is_transactional() && h.base_sequence == samsa_storage::batch::NO_SEQUENCE
                    })
                });
                if unsequenced {
                    break 'partition Some((
                        ResponseError::InvalidRecord,
                        "a transactional batch without a sequence number".to_string(),
                    ));
                }
                // (producer id, epoch) of a transactional batch.
                let txn = BatchHeader::parse(&records)
                    .ok()
                    .filter(BatchHeader::is_transactional)
                    .map(|h| (h.producer_id, h.producer_epoch));
                // Held through the append: the producer's pipelined writes
                // land in request order even while one waits for its
                // verification.
                let _turn = match txn {
                    Some((producer_id, _)) => Some(partition.txn_write_turn(producer_id).await),
                    None => None,
                };
                if let Some((producer_id, producer_epoch)) = txn {
                    let Some(transactional_id) = request.transactional_id.as_ref() else {
                        // Unreachable: `untagged_txn` answered above.
                        break 'partition Some((
                            ResponseError::TransactionalIdAuthorizationFailed,
                            "transactional records without a transactional id".to_string(),
                        ));
                    };
                    let needs = match partition.txn_needs_verification(producer_id, producer_epoch)
                    {
                        Ok(needs) => needs,
                        Err(e) => break 'partition Some((partition_error_code(&e), e.to_string())),
                    };
                    if needs && !broker.config.transaction_partition_verification_enable {
                        // Verification off: the write opens its transaction
                        // on trust, as Kafka does with the same setting.
                        partition.mark_txn_verified(producer_id, producer_epoch);
                    } else if needs {
                        let verified = verify_partition(
                            broker,
                            transactional_id.0.as_str(),
                            producer_id,
                            producer_epoch,
                            TopicPartition::new(name.clone(), data.index),
                            // Produce v12+ is transaction version 2: the
                            // write adds the partition itself.
                            version >= 12,
                        )
                        .instrument(tracing::debug_span!(
                            "verify_txn",
                            transactional_id = transactional_id.0.as_str(),
                            producer_id,
                            producer_epoch
                        ))
                        .await;
                        if let Err(e) = verified {
                            let code = produce_verification_error(e, version);
                            info!(partition = %partition.name(), transactional_id = transactional_id.0.as_str(), producer_id, producer_epoch, coordinator_error = ?e, answer = ?code, "transactional write not verified");
                            break 'partition Some((
                                code,
                                format!(
                                    "{name}-{}: the transaction coordinator answered {e:?}",
                                    data.index
                                ),
                            ));
                        }
                        partition.mark_txn_verified(producer_id, producer_epoch);
                    }
                }
                if acks == -1 {
                    let (isr, min_isr) = partition.isr_and_min();
                    if isr < min_isr {
                        break 'partition Some((
                            ResponseError::NotEnoughReplicas,
                            format!(
                                "{name}-{}: {isr} in-sync replicas, min.insync.replicas is {min_isr}",
                                data.index
                            ),
                        ));
                    }
                }
                let leader_epoch = partition.leader_epoch();
                let appended = crate::blocking_io(|| match txn {
                    Some((producer_id, producer_epoch)) => {
                        partition.append_transactional(&records, producer_id, producer_epoch, now)
                    }
                    None => partition.append(&records, now),
                });
                match appended {
                    Ok((info, log_start_offset)) => {
                        if info.duplicate {
                            debug!(partition = %partition.name(), base_offset = info.base_offset, "duplicate batch; answering with original offset");
                        }
                        response.base_offset = info.base_offset;
                        response.log_append_time_ms = info.log_append_time_ms;
                        response.log_start_offset = log_start_offset;
                        if acks == -1 {
                            waits.push(PendingDurability {
                                topic: topic_index,
                                partition: partition_index,
                                end_offset: info.last_offset + 1,
                                leader_epoch,
                            });
                            hosts.push(Arc::clone(&partition));
                        }
                        None
                    }
                    Err(PartitionError::Storage(e)) => {
                        let code = storage_error_code(&e);
                        if code == ResponseError::KafkaStorageError {
                            warn!(partition = %partition.name(), error = %e, "append failed");
                        } else if matches!(
                            code,
                            ResponseError::OutOfOrderSequenceNumber
                                | ResponseError::InvalidProducerEpoch
                        ) {
                            // Rare and consequential: a client bumps its
                            // epoch or fails on these.
                            info!(partition = %partition.name(), error = %e, "idempotent batch rejected");
                        } else {
                            debug!(partition = %partition.name(), error = %e, "append rejected");
                        }
                        Some((code, e.to_string()))
                    }
                    Err(e @ (PartitionError::Closed(_) | PartitionError::RoleChanged { .. })) => {
                        Some((ResponseError::NotLeaderOrFollower, e.to_string()))
                    }
                    Err(e @ PartitionError::Flush(_)) => {
                        Some((ResponseError::KafkaStorageError, e.to_string()))
                    }
                    Err(e @ PartitionError::TxnNotVerified { .. }) => Some((
                        produce_verification_error(ResponseError::InvalidTxnState, version),
                        e.to_string(),
                    )),
                }
            };
            if let Some((code, message)) = error {
                response.error_code = code.code();
                if version >= 8 {
                    response.error_message = Some(str_bytes(message));
                }
            }
            partitions.push(response);
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(super::topic_name(name))
                .with_partition_responses(partitions),
        );
    }

    // acks=all: answer only after the group-commit fsync covering each
    // batch and once the HW (every ISR member) covers it.
    let outcomes = join_all(
        waits
            .iter()
            .zip(hosts.iter())
            .map(|(wait, partition)| async move {
                partition
                    .wait_acks_all(wait.end_offset, wait.leader_epoch, deadline)
                    .await
            }),
    )
    .await;
    for (wait, outcome) in waits.iter().zip(outcomes) {
        if let Err((code, message)) = outcome {
            let response = &mut responses[wait.topic].partition_responses[wait.partition];
            response.error_code = code.code();
            response.base_offset = -1;
            if version >= 8 {
                response.error_message = Some(str_bytes(message));
            }
        }
    }

    ProduceResponse::default().with_responses(responses)
}
