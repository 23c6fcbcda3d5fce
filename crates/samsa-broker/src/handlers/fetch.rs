//! Fetch: reads up to the high watermark (`read_uncommitted`) or the last
//! stable offset (`read_committed`, with the aborted transactions that
//! overlap the returned batches, from the transaction index), and long-polls
//! until `min_bytes` are available or `max_wait_ms` passes. Every answer
//! carries the partition's real last stable offset. Control batches
//! (COMMIT/ABORT markers) are returned in the batch stream; clients skip them.
//!
//! The wait subscribes to every requested partition's high-watermark watch
//! *before* reading, so an append that lands between the read and the wait
//! still wakes the fetch. Size limits follow KIP-74: the first partition with
//! data always gets at least one whole batch, later ones only what fits.

use std::time::Duration;

use bytes::Bytes;
use futures::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ProducerId};
use tokio::time::Instant;
use tracing::warn;

use crate::error::storage_error_code;
use crate::replica::PartitionError;
use crate::Broker;

pub async fn handle(broker: &Broker, request: FetchRequest, _version: i16) -> FetchResponse {
    let read_committed = request.isolation_level == 1;
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
    let deadline = Instant::now() + max_wait;
    let min_bytes = usize::try_from(request.min_bytes).unwrap_or(0);
    let max_bytes = match usize::try_from(request.max_bytes) {
        Ok(0) | Err(_) => usize::MAX,
        Ok(n) => n,
    };

    loop {
        // Subscribe first: changes after this point wake the wait below.
        let mut watches: Vec<_> = request
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .filter_map(|p| broker.replicas.get(t.topic.0.as_str(), p.partition))
            })
            .map(|p| p.watch_high_watermark())
            .collect();

        let (responses, bytes, any_error) = read_once(broker, &request, read_committed, max_bytes);
        if bytes >= min_bytes || any_error || Instant::now() >= deadline || watches.is_empty() {
            return FetchResponse::default().with_responses(responses);
        }

        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {
                // Read once more so the answer reflects the latest state.
                let (responses, _, _) = read_once(broker, &request, read_committed, max_bytes);
                return FetchResponse::default().with_responses(responses);
            }
        }
    }
}

fn read_once(
    broker: &Broker,
    request: &FetchRequest,
    read_committed: bool,
    max_bytes: usize,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut total = 0usize;
    let mut any_error = false;
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in &request.topics {
        let name = topic.topic.0.as_str();
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for wanted in &topic.partitions {
            let mut data = PartitionData::default()
                .with_partition_index(wanted.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_records(Some(Bytes::new()));
            if read_committed {
                data.aborted_transactions = Some(Vec::new());
            }
            let partition = match broker.leader_partition(name, wanted.partition) {
                Ok(partition) => partition,
                Err(code) => {
                    data.error_code = code.code();
                    any_error = true;
                    partitions.push(data);
                    continue;
                }
            };
            let leader_epoch = partition.leader_epoch();
            if wanted.current_leader_epoch >= 0 && wanted.current_leader_epoch != leader_epoch {
                let error = if wanted.current_leader_epoch > leader_epoch {
                    ResponseError::UnknownLeaderEpoch
                } else {
                    ResponseError::FencedLeaderEpoch
                };
                data.error_code = error.code();
                any_error = true;
                partitions.push(data);
                continue;
            }
            let partition_max = usize::try_from(wanted.partition_max_bytes).unwrap_or(0);
            let remaining = max_bytes.saturating_sub(total);
            let limit = partition_max.min(remaining);
            let offset = wanted.fetch_offset;
            match partition.read(offset, limit, read_committed) {
                Ok(read) => {
                    data.high_watermark = read.high_watermark;
                    data.last_stable_offset = read.last_stable_offset;
                    data.log_start_offset = read.log_start_offset;
                    if read_committed {
                        data.aborted_transactions = Some(
                            read.aborted
                                .iter()
                                .map(|a| {
                                    AbortedTransaction::default()
                                        .with_producer_id(ProducerId(a.producer_id))
                                        .with_first_offset(a.first_offset)
                                })
                                .collect(),
                        );
                    }
                    let records = read.result.records;
                    // Only the first partition with data may exceed the limits (KIP-74).
                    if total == 0 || records.len() <= limit {
                        total += records.len();
                        data.records = Some(records);
                    }
                }
                Err(PartitionError::Storage(e)) => {
                    let code = storage_error_code(&e);
                    if code == ResponseError::KafkaStorageError {
                        warn!(partition = %partition.name(), error = %e, "read failed");
                    }
                    data.error_code = code.code();
                    if let Ok(offsets) = partition.offsets() {
                        data.high_watermark = offsets.high_watermark;
                        data.last_stable_offset = offsets.last_stable_offset;
                        data.log_start_offset = offsets.log_start_offset;
                    }
                    any_error = true;
                }
                Err(_) => {
                    data.error_code = ResponseError::NotLeaderOrFollower.code();
                    any_error = true;
                }
            }
            partitions.push(data);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(topic.topic.clone())
                .with_topic_id(topic.topic_id)
                .with_partitions(partitions),
        );
    }
    (topics, total, any_error)
}
