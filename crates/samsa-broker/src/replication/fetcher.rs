//! The follower side of replication: one fetch loop per peer broker, each
//! batching every partition this broker follows with that peer as leader.
//!
//! Each round sends, per partition, the log end offset and the epoch of the
//! last batch; the answer is applied per partition: records are appended
//! (offsets and epochs as the leader assigned them) and the leader's HW is
//! taken up to this log's end; a divergence truncates this log to where the
//! leader's and its own copy of that epoch end (whichever is lower); an
//! out-of-range answer restarts the log at the leader's log start or cuts
//! it back to the leader's log end. Other errors wait for the metadata to
//! catch up.

use kafka_protocol::error::ResponseError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::tls::{peer_endpoint, InterNodeTls};
use samsa_proto::replication::replication_service_client::ReplicationServiceClient;
use samsa_proto::replication::{FetchPartition, PartitionData, ReplicaFetchRequest};
use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::{debug, warn, Instrument};

use crate::replica::Partition;
use crate::write_failures::is_write_failure;
use crate::{now_ms, Broker};

/// Pause when there is nothing to follow at this peer, or after a failure.
const IDLE: Duration = Duration::from_millis(100);
const RETRY: Duration = Duration::from_millis(250);

/// HTTP/2 flow-control window for replication streams.
pub const REPLICATION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Largest HTTP/2 frame a replication peer may send (the protocol allows up
/// to 16 MiB - 1).
pub const REPLICATION_MAX_FRAME_BYTES: u32 = 1024 * 1024;

fn channel(addr: &str, tls: Option<&InterNodeTls>) -> Result<Channel, tonic::transport::Error> {
    // HTTP/2's default 64 KiB stream window would make every megabyte of
    // records wait for ~16 window updates; the replication RTT is what
    // acks=all waits for, so let a whole fetch answer be in flight at once.
    Ok(peer_endpoint(addr, tls)?
        .initial_stream_window_size(Some(REPLICATION_WINDOW_BYTES))
        .initial_connection_window_size(Some(2 * REPLICATION_WINDOW_BYTES))
        // With HTTP/2's default 16 KiB frames a 1 MB answer is 64 frames,
        // each handed through the connection task separately.
        .max_frame_size(Some(REPLICATION_MAX_FRAME_BYTES))
        .connect_lazy())
}

/// Spawns the fetch loop that follows the partitions broker `leader` (at
/// replication gRPC address `addr`) leads.
pub fn spawn_fetcher(
    broker: &Arc<Broker>,
    leader: i32,
    addr: String,
    tls: Option<&InterNodeTls>,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let span = tracing::info_span!("replica_fetcher", leader);
    tokio::spawn(
        fetch_loop(Arc::clone(broker), leader, addr, tls.cloned(), stop.clone()).instrument(span),
    )
}

async fn fetch_loop(
    broker: Arc<Broker>,
    leader: i32,
    addr: String,
    tls: Option<InterNodeTls>,
    mut stop: watch::Receiver<bool>,
) {
    let channel = match channel(&addr, tls.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            warn!(%addr, error = %e, "bad replication address; not following this leader");
            return;
        }
    };
    let max_wait = broker.config.replica_fetch_wait_max_ms;
    let mut client =
        ReplicationServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let meters = broker.metrics.partitions.replica_fetcher(leader);
    loop {
        if *stop.borrow() {
            return;
        }
        let followed: Vec<(Arc<Partition>, i32)> = broker
            .replicas
            .all()
            .into_iter()
            .filter_map(|p| match p.followed_leader() {
                Some(followed) if followed.leader == leader => Some((p, followed.leader_epoch)),
                _ => None,
            })
            .collect();
        let pause = if followed.is_empty() {
            Some(IDLE)
        } else {
            match fetch_once(&broker, &mut client, &followed, max_wait).await {
                Ok(fetched) => {
                    if let Some(bytes) = fetched {
                        meters.fetched(bytes);
                    }
                    None
                }
                Err(e) => {
                    meters.failed();
                    debug!(error = %e, "replica fetch failed; retrying");
                    Some(RETRY)
                }
            }
        };
        if let Some(pause) = pause {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// One fetch from the leader, applied; the record bytes it brought, or
/// `None` when nothing was asked (every partition backing off).
async fn fetch_once(
    broker: &Broker,
    client: &mut ReplicationServiceClient<Channel>,
    followed: &[(Arc<Partition>, i32)],
    max_wait_ms: u64,
) -> Result<Option<usize>, tonic::Status> {
    let mut partitions = Vec::with_capacity(followed.len());
    let mut sent = Vec::with_capacity(followed.len());
    let now = tokio::time::Instant::now();
    let me = broker.config.node_id;
    let throttle_rate = broker
        .effective_config()
        .follower_replication_throttled_rate;
    let throttle = &broker.replication_throttles.follower;
    for (partition, epoch) in followed {
        // A partition this broker is being added to, over the follower
        // throttle, sits this round out.
        let reassigning = throttle_rate.is_some() && partition.is_adding(me);
        if reassigning && !throttle.admits(throttle_rate, now.into_std()) {
            continue;
        }
        // A replica whose last write failed (a full disk) waits out its
        // back-off; it falls out of the ISR meanwhile by the leader's lag rule.
        if partition
            .write_failures
            .retry_at()
            .is_some_and(|at| at > now)
        {
            continue;
        }
        let Ok(position) = partition.follower_position() else {
            continue;
        };
        partitions.push(FetchPartition {
            topic: partition.topic.clone(),
            partition: partition.index,
            current_leader_epoch: *epoch,
            fetch_offset: position.fetch_offset,
            last_fetched_epoch: position.last_fetched_epoch,
            high_watermark: position.high_watermark,
        });
        sent.push((
            Arc::clone(partition),
            *epoch,
            position.fetch_offset,
            reassigning,
        ));
    }
    if partitions.is_empty() {
        tokio::time::sleep(RETRY).await;
        return Ok(None);
    }
    let mut request = tonic::Request::new(ReplicaFetchRequest {
        replica_id: broker.config.node_id,
        max_wait_ms: u32::try_from(max_wait_ms).unwrap_or(u32::MAX),
        max_bytes: broker.config.replica_fetch_max_bytes,
        partitions,
    });
    request.set_timeout(Duration::from_millis(max_wait_ms) + Duration::from_secs(5));
    let response = client.fetch(request).await?.into_inner();
    let bytes = response.partitions.iter().map(|p| p.records.len()).sum();
    let mut all_failed = !response.partitions.is_empty();
    let mut answers = Vec::with_capacity(response.partitions.len());
    fn asked(entry: &(Arc<Partition>, i32, i64, bool)) -> (&str, i32) {
        (entry.0.topic.as_str(), entry.0.index)
    }
    for ((partition, epoch, fetch_offset, reassigning), data) in
        pair_answers(&sent, asked, response.partitions)
    {
        if *reassigning {
            throttle.spend(data.records.len());
        }
        // The answer belongs to the epoch it was asked under.
        if partition.followed_leader().map(|f| f.leader_epoch) != Some(*epoch) {
            continue;
        }
        answers.push((partition, *epoch, *fetch_offset, data));
    }
    // Each hand-off to a blocking thread costs thread switches; one covers
    // the whole answer, and an answer that only moves high watermarks (most
    // rounds while the producer waits for acks=all) needs none.
    let apply_all = || {
        answers
            .iter()
            .map(|(partition, epoch, fetch_offset, data)| {
                (partition, apply(partition, *epoch, *fetch_offset, data))
            })
            .collect::<Vec<_>>()
    };
    let applied = if answers
        .iter()
        .any(|(p, _, _, data)| writes_to_disk(p, data))
    {
        crate::blocking_io(apply_all)
    } else {
        apply_all()
    };
    for (partition, result) in applied {
        match result {
            Ok(true) => all_failed = false,
            Ok(false) => {}
            // The partition logs when its writes start and stop failing.
            Err(e) if is_write_failure(&e) => {}
            Err(e) => {
                warn!(partition = %partition.name(), error = %e, "applying fetched data failed")
            }
        }
    }
    if all_failed {
        // Every partition answered an error: the metadata is moving; let it.
        tokio::time::sleep(RETRY).await;
    }
    Ok(Some(bytes))
}

/// Pairs each partition of a fetch answer with what was asked for it
/// (`key` names an asked entry's topic and partition); an answer for a
/// partition not asked is dropped.
///
/// The leader answers every partition in the order asked, so the answer at
/// position i is checked against `asked[i]` first; an index by name is built
/// only if an answer is elsewhere. (A search of `asked` for each answer cost
/// partitions² string compares a round: at 3,333 partitions per leader that
/// was most of an idle cluster's CPU.)
fn pair_answers<T>(
    asked: &[T],
    key: impl Fn(&T) -> (&str, i32),
    answers: Vec<PartitionData>,
) -> Vec<(&T, PartitionData)> {
    let mut by_name: Option<HashMap<(&str, i32), &T>> = None;
    let mut paired = Vec::with_capacity(answers.len());
    for (position, data) in answers.into_iter().enumerate() {
        let wanted = (data.topic.as_str(), data.partition);
        let found = asked
            .get(position)
            .filter(|entry| key(entry) == wanted)
            .or_else(|| {
                by_name
                    .get_or_insert_with(|| asked.iter().map(|entry| (key(entry), entry)).collect())
                    .get(&wanted)
                    .copied()
            });
        if let Some(entry) = found {
            paired.push((entry, data));
        }
    }
    paired
}

/// Whether applying `data` may write or delete files: records to append, a
/// divergence or out-of-range answer to truncate at, or a log start the
/// leader moved past this replica's. Otherwise it only takes the leader's
/// high watermark, in memory.
fn writes_to_disk(partition: &Partition, data: &PartitionData) -> bool {
    !data.records.is_empty()
        || data.diverging_epoch.is_some()
        || data.error_code != 0
        || partition
            .offsets()
            .map_or(true, |own| data.log_start_offset > own.log_start_offset)
}

/// Applies one partition's answer; `Ok(false)` when it was an error to wait out.
fn apply(
    partition: &Partition,
    epoch: i32,
    fetch_offset: i64,
    data: &PartitionData,
) -> Result<bool, crate::error::PartitionError> {
    let now = now_ms();
    if let Some(diverging) = &data.diverging_epoch {
        let own_end = partition.own_epoch_end(diverging.epoch)?;
        let target = if diverging.epoch < 0 {
            diverging.end_offset
        } else {
            diverging.end_offset.min(own_end)
        };
        if target < partition.offsets()?.log_start_offset {
            partition.restart_at(epoch, data.log_start_offset.max(0), now)?;
        } else {
            partition.truncate_divergent(epoch, target, now)?;
        }
        return Ok(true);
    }
    match data.error_code {
        0 => {
            partition.append_from_leader(
                epoch,
                fetch_offset,
                &data.records,
                data.high_watermark,
                data.log_start_offset,
                now,
            )?;
            Ok(true)
        }
        code if code == i32::from(ResponseError::OffsetOutOfRange.code()) => {
            if fetch_offset < data.log_start_offset {
                partition.restart_at(epoch, data.log_start_offset, now)?;
            } else if fetch_offset > data.log_end_offset {
                partition.truncate_divergent(epoch, data.log_end_offset, now)?;
            }
            Ok(true)
        }
        code => {
            debug!(partition = %partition.name(), code, "leader refused the fetch");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(topic: &str, partition: i32) -> PartitionData {
        PartitionData {
            topic: topic.into(),
            partition,
            ..PartitionData::default()
        }
    }

    fn key(entry: &(String, i32)) -> (&str, i32) {
        (entry.0.as_str(), entry.1)
    }

    fn paired(asked: &[(String, i32)], answers: Vec<PartitionData>) -> Vec<(String, i32, String)> {
        pair_answers(asked, key, answers)
            .into_iter()
            .map(|(entry, data)| {
                (
                    entry.0.clone(),
                    entry.1,
                    format!("{}-{}", data.topic, data.partition),
                )
            })
            .collect()
    }

    #[test]
    fn answers_pair_with_what_was_asked_in_order_out_of_order_or_not_at_all() {
        let asked: Vec<(String, i32)> = vec![("a".into(), 0), ("a".into(), 1), ("b".into(), 0)];
        let expected = |pairs: &[(&str, i32)]| -> Vec<(String, i32, String)> {
            pairs
                .iter()
                .map(|(t, p)| (t.to_string(), *p, format!("{t}-{p}")))
                .collect()
        };
        // In the order asked (what samsa's leader does).
        assert_eq!(
            paired(&asked, vec![answer("a", 0), answer("a", 1), answer("b", 0)]),
            expected(&[("a", 0), ("a", 1), ("b", 0)])
        );
        // Another order, some left out, one never asked.
        assert_eq!(
            paired(&asked, vec![answer("b", 0), answer("c", 0), answer("a", 0)]),
            expected(&[("b", 0), ("a", 0)])
        );
        // Same topic, other partition at the asked position.
        assert_eq!(
            paired(&asked, vec![answer("a", 1), answer("a", 0)]),
            expected(&[("a", 1), ("a", 0)])
        );
    }
}
