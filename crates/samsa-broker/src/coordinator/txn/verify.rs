//! KIP-890 verification: before a producer's first transactional write to a
//! partition in a transaction, the partition leader asks the coordinator of
//! the producer's transactional id whether the partition is part of the
//! ongoing transaction (`verify_only`), or — for transaction version 2
//! producers (Produce v12+) — adds it.
//!
//! The coordinator is reached by a local call when this broker leads the
//! id's `__transaction_state` partition, otherwise over gRPC
//! (`TxnService.AddPartitionsToTxn`). The partition remembers a positive
//! answer for (producer id, epoch) until the producer's first transactional
//! append or its next marker (`Partition::mark_txn_verified`), so only the
//! first write of each transaction pays for the round trip, and a late
//! write after the transaction ended cannot open a transaction the
//! coordinator does not know (a hanging transaction).

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use samsa_proto::txn as pb;
use tracing::debug;

use crate::coordinator::txn::AddPartitionsRequest;
use crate::error::grpc_code_to_error;
use crate::topic_partition::TopicPartition;
use crate::{now_ms, Broker};

const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the coordinator of `transactional_id` whether `tp` is in the
/// ongoing transaction of `(producer_id, producer_epoch)`, or (`add`) adds
/// it. `Ok` means the write may open the transaction on this partition; the
/// error is the coordinator's (map it for the client with
/// `error::produce_verification_error`).
pub async fn verify_partition(
    broker: &Broker,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    tp: TopicPartition,
    add: bool,
) -> Result<(), ResponseError> {
    let results = verify_partitions(
        broker,
        transactional_id,
        producer_id,
        producer_epoch,
        vec![tp.clone()],
        add,
    )
    .await?;
    match results.into_iter().find(|(p, _)| *p == tp) {
        Some((_, None)) => Ok(()),
        Some((_, Some(e))) => Err(e),
        None => Err(ResponseError::UnknownServerError),
    }
}

/// [`verify_partition`] for several partitions of one producer in one call
/// to its coordinator (a produce request's first writes of a transaction to
/// several partitions). `Err` when the coordinator cannot be asked; else
/// each partition's answer (`None`: verified), in no particular order.
pub async fn verify_partitions(
    broker: &Broker,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
    add: bool,
) -> Result<Vec<(TopicPartition, Option<ResponseError>)>, ResponseError> {
    let node = broker.txn.coordinator_node(broker, transactional_id)?;
    if node.node_id == broker.config.node_id {
        return Ok(add_partitions_local(
            broker,
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
            !add,
        )
        .await);
    }
    let Some(mut client) = broker.txn.client(node.node_id) else {
        return Err(ResponseError::CoordinatorNotAvailable);
    };
    let mut request = tonic::Request::new(pb::AddPartitionsToTxnRequest {
        transactional_id: transactional_id.to_string(),
        producer_id,
        producer_epoch: i32::from(producer_epoch),
        verify_only: !add,
        partitions: partitions
            .into_iter()
            .map(|tp| pb::TopicPartition {
                topic: tp.topic,
                partition: tp.partition,
            })
            .collect(),
    });
    request.set_timeout(RPC_TIMEOUT);
    crate::trace::inject(&mut request);
    match client.add_partitions_to_txn(request).await {
        Ok(response) => Ok(response
            .into_inner()
            .partitions
            .into_iter()
            .map(|r| {
                (
                    TopicPartition::new(r.topic, r.partition),
                    grpc_code_to_error(r.error_code),
                )
            })
            .collect()),
        Err(status) => {
            debug!(coordinator = node.node_id, %status, "verification call failed");
            Err(ResponseError::CoordinatorNotAvailable)
        }
    }
}

/// `AddPartitionsToTxn` (v4+ semantics) on this broker's coordinator:
/// verify-only, or adding for a transaction version 2 producer. Waits for
/// the write an add needs.
pub async fn add_partitions_local(
    broker: &Broker,
    transactional_id: &str,
    producer_id: i64,
    producer_epoch: i16,
    partitions: Vec<TopicPartition>,
    verify_only: bool,
) -> Vec<(TopicPartition, Option<ResponseError>)> {
    let request = AddPartitionsRequest {
        transactional_id: transactional_id.to_string(),
        producer_id,
        producer_epoch,
        partitions,
        verify_only,
        version: if verify_only { 4 } else { 5 },
    };
    let outcome = broker
        .txn
        .serving()
        .add_partitions_to_txn(&request, now_ms());
    let response = match outcome.write {
        None => outcome.response,
        Some(write) => broker
            .txn
            .complete(broker, write)
            .await
            .response(outcome.response),
    };
    response.results
}
