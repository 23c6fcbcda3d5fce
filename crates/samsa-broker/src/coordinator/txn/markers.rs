//! COMMIT/ABORT markers, both ends.
//!
//! - Partition side ([`write_markers`]): a leader appends the control batch
//!   to each partition it leads (the log checks producer and coordinator
//!   epochs) and answers a partition only once its HW covers the marker —
//!   acks=all, like a produce. Used by the coordinator on this broker, by
//!   the `TxnService.WriteTxnMarkers` gRPC of other coordinators, and by
//!   Kafka's `WriteTxnMarkers` API.
//! - Coordinator side ([`spawn_drive`]): sends a [`WriteMarkers`] effect's markers
//!   to the current leader of every partition, grouped by broker, and
//!   retries the partitions that fail retriably (looking the leader up again
//!   each round) until all are written; then `markers_written` and its
//!   `Complete*` write. A partition whose topic is gone counts as written,
//!   except a `__consumer_offsets` partition (AddOffsetsToTxn makes sure
//!   that topic exists first): its marker is what makes the transaction's
//!   offsets visible or drops them, so it is retried until written.
//!   A fencing answer (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED)
//!   drops the effect: a newer epoch or coordinator owns the transaction.
//!   The sends stop as soon as this broker no longer coordinates the
//!   transaction's state partition at the epoch of the effect; the next
//!   coordinator finds the `Prepare*` record and sends them again, which is
//!   harmless because markers are idempotent for the log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use kafka_protocol::error::ResponseError;
use samsa_proto::txn as pb;
use samsa_storage::EndTxnMarker;
use tracing::{debug, info, warn, Instrument};

use crate::coordinator::placement::CONSUMER_OFFSETS_TOPIC;
use crate::coordinator::txn::WriteMarkers;
use crate::coordinator::Coordinator;
use crate::error::grpc_code_to_error;
use crate::error::{marker_error_is_retriable, partition_error_code};
use crate::topic_partition::TopicPartition;
use crate::{now_ms, Broker};

/// How long a partition leader waits for its ISR to take a marker.
const MARKER_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// Retry pacing of the coordinator's marker sends.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// A remote WriteTxnMarkers call gives up after this long (and is retried).
const RPC_TIMEOUT: Duration = Duration::from_secs(40);

/// Partition side: appends `marker` to each of `partitions` this broker
/// leads and waits for acks=all; the error of each partition, if any.
pub async fn write_markers(
    broker: &Broker,
    marker: EndTxnMarker,
    partitions: &[TopicPartition],
) -> Vec<(TopicPartition, Option<ResponseError>)> {
    let results = join_all(partitions.iter().map(|tp| async move {
        let outcome: Result<(), ResponseError> = async {
            let partition = broker.leader_partition(&tp.topic, tp.partition)?;
            if partition.in_sync_replicas().below_min() {
                return Err(ResponseError::NotEnoughReplicas);
            }
            let leader_epoch = partition.leader_epoch();
            let appended = partition.append_marker(&marker, now_ms()).map_err(|e| {
                let code = partition_error_code(&e);
                if code != ResponseError::NotLeaderOrFollower {
                    info!(partition = %partition.name(), error = %e, "transaction marker refused");
                }
                code
            })?;
            let deadline = tokio::time::Instant::now() + MARKER_ACK_TIMEOUT;
            partition
                .wait_acks_all(appended.info.last_offset + 1, leader_epoch, deadline)
                .await
                .map_err(|refusal| refusal.code)?;
            if tp.topic == CONSUMER_OFFSETS_TOPIC {
                // The group coordinator of this partition (this broker, as
                // its leader) makes the producer's offsets visible or drops them.
                broker
                    .groups
                    .marker_written(tp.partition, marker.producer_id, marker.commit);
            }
            Ok(())
        }
        .await;
        (tp.clone(), outcome.err())
    }))
    .await;
    results
}

/// Coordinator side, on a task of its own: see the module docs. Its span
/// is made where the markers are decided, so that a trace that ended the
/// transaction (EndTxn, or a timeout's abort) goes on through them: the
/// new task has only that span entered, not the request's.
pub(crate) fn spawn_drive(broker: Arc<Broker>, markers: WriteMarkers) {
    let span = tracing::info_span!(
        target: crate::trace::TARGET,
        "txn_markers",
        transactional_id = %markers.transactional_id,
        producer_id = markers.producer_id,
        producer_epoch = markers.producer_epoch,
        commit = markers.result.is_commit()
    );
    tokio::spawn(async move { drive(&broker, &markers).instrument(span).await });
}

async fn drive(broker: &Broker, m: &WriteMarkers) {
    if write_every_marker(broker, m).await {
        complete_transaction(broker, m).await;
    }
}

/// Sends the markers until every partition has one (true), or until they
/// are fenced or this broker stops coordinating the transaction (false).
async fn write_every_marker(broker: &Broker, m: &WriteMarkers) -> bool {
    let marker = EndTxnMarker {
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        coordinator_epoch: m.coordinator_epoch,
        commit: m.result.is_commit(),
    };
    let mut remaining: BTreeSet<TopicPartition> = m.partitions.iter().cloned().collect();
    let mut pending = broker.metrics.txns.markers_pending(remaining.len());
    let mut backoff = RETRY_MIN;
    let started = std::time::Instant::now();
    while !remaining.is_empty() {
        if !still_coordinating(broker, m) {
            debug!("no longer the coordinator of this transaction; marker sends stop");
            return false;
        }
        let image = broker.metadata.image();
        let mut by_leader: BTreeMap<i32, Vec<TopicPartition>> = BTreeMap::new();
        for tp in remaining.clone() {
            match image.partition(&tp.topic, tp.partition) {
                // A group's offsets partition joined the transaction only
                // once `__consumer_offsets` existed; its marker is always
                // written, or the offsets would never resolve.
                None if image.topic(&tp.topic).is_none() && tp.topic != CONSUMER_OFFSETS_TOPIC => {
                    debug!(partition = %tp, "topic is gone; its marker counts as written");
                    remaining.remove(&tp);
                    pending.not_needed();
                }
                None => {}
                Some(p) if p.leader < 0 => {}
                Some(p) => by_leader.entry(p.leader).or_default().push(tp),
            }
        }
        let me = broker.config.node_id;
        let sends = by_leader.into_iter().map(|(leader, parts)| {
            let span = tracing::debug_span!(
                target: crate::trace::TARGET,
                "marker_write",
                otel.kind = if leader == me { "internal" } else { "client" },
                leader,
                partitions = parts.len()
            );
            async move {
                if leader == me {
                    write_markers(broker, marker, &parts).await
                } else {
                    send_remote(broker, leader, marker, &parts).await
                }
            }
            .instrument(span)
        });
        for (tp, error) in join_all(sends).await.into_iter().flatten() {
            match error {
                None => {
                    if remaining.remove(&tp) {
                        pending.written();
                    }
                }
                Some(ResponseError::InvalidProducerEpoch | ResponseError::ProducerFenced)
                | Some(ResponseError::TransactionCoordinatorFenced) => {
                    info!(partition = %tp, error = ?error, "markers fenced by a newer producer epoch or coordinator; dropping them");
                    return false;
                }
                Some(ResponseError::UnknownTopicOrPartition)
                    if tp.topic != CONSUMER_OFFSETS_TOPIC
                        && broker.metadata.image().topic(&tp.topic).is_none() =>
                {
                    if remaining.remove(&tp) {
                        pending.not_needed();
                    }
                }
                Some(e) => {
                    if !marker_error_is_retriable(e) {
                        warn!(partition = %tp, error = ?e, "unexpected marker error; retrying");
                    } else {
                        debug!(partition = %tp, error = ?e, "marker not written yet; retrying");
                    }
                }
            }
        }
        if !remaining.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }
    debug!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "all markers written"
    );
    true
}

/// Complete* after every marker; retried while the write fails retriably.
async fn complete_transaction(broker: &Broker, m: &WriteMarkers) {
    let mut backoff = RETRY_MIN;
    loop {
        let write = broker.txn.lock().markers_written(m, now_ms());
        let write = match write {
            Ok(w) => w,
            Err(error) => {
                debug!(%error, "markers written, but the transaction moved on");
                return;
            }
        };
        let completion = broker.txn.complete(broker, write).await;
        match completion.error {
            None | Some(ResponseError::NotCoordinator) => return,
            Some(error) => {
                debug!(%error, "completing the transaction failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
            }
        }
    }
}

fn still_coordinating(broker: &Broker, m: &WriteMarkers) -> bool {
    broker.txn.lock().coordinator_epoch(m.partition) == Some(m.coordinator_epoch)
}

/// Sends markers to partition leader `leader` over gRPC; a transport error
/// answers every partition NETWORK_EXCEPTION (retried).
async fn send_remote(
    broker: &Broker,
    leader: i32,
    marker: EndTxnMarker,
    parts: &[TopicPartition],
) -> Vec<(TopicPartition, Option<ResponseError>)> {
    let all = |e: ResponseError| parts.iter().map(|tp| (tp.clone(), Some(e))).collect();
    let Some(mut client) = broker.txn.client(leader) else {
        return all(ResponseError::LeaderNotAvailable);
    };
    let mut request = tonic::Request::new(pb::WriteTxnMarkersRequest {
        producer_id: marker.producer_id,
        producer_epoch: i32::from(marker.producer_epoch),
        commit: marker.commit,
        coordinator_epoch: marker.coordinator_epoch,
        partitions: parts
            .iter()
            .map(|tp| pb::TopicPartition {
                topic: tp.topic.clone(),
                partition: tp.partition,
            })
            .collect(),
    });
    request.set_timeout(RPC_TIMEOUT);
    crate::trace::inject(&mut request);
    match client.write_txn_markers(request).await {
        Ok(response) => response
            .into_inner()
            .partitions
            .into_iter()
            .map(|r| {
                let tp = TopicPartition::new(r.topic, r.partition);
                (tp, grpc_code_to_error(r.error_code))
            })
            .collect(),
        Err(status) => {
            debug!(leader, %status, "WriteTxnMarkers call failed");
            all(ResponseError::NetworkException)
        }
    }
}
