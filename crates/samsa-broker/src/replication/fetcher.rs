//! The follower side of replication: one fetch loop per peer broker, each
//! batching every partition this broker follows with that peer as leader.
//!
//! Each round sends, per partition, the log end offset and the epoch of the
//! last batch: for every followed partition in the first round (a full
//! fetch that opens a fetch session), then only for those whose state
//! changed, and the leader answers only partitions with news
//! ([`super::session`]). The answer is applied per partition: records are appended
//! (offsets and epochs as the leader assigned them) and the leader's HW is
//! taken up to this log's end; a divergence truncates this log to where the
//! leader's and its own copy of that epoch end (whichever is lower); an
//! out-of-range answer restarts the log at the leader's log start or cuts
//! it back to the leader's log end. Other errors wait for the metadata to
//! catch up.

use kafka_protocol::error::ResponseError;
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::tls::{peer_endpoint, InterNodeTls};
use samsa_proto::replication::replication_service_client::ReplicationServiceClient;
use samsa_proto::replication::{FetchPartition, PartitionData, ReplicaFetchRequest};
use tokio::sync::watch;
use tonic::transport::Channel;
use tracing::{debug, warn, Instrument};

use super::session::{FollowerSession, NewsKey, NextFetch};
use super::throttle::ByteRate;
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
    let mut session = FollowerSession::default();
    // Which partitions follow this leader changes only with news (a
    // leadership or replica set change, a partition opened or removed).
    let mut followed: Vec<(Arc<Partition>, i32)> = Vec::new();
    let mut followed_at: Option<NewsKey> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let news = broker.replicas.news_key();
        if followed_at != Some(news) {
            followed = broker
                .replicas
                .all()
                .into_iter()
                .filter_map(|p| match p.followed_leader() {
                    Some(followed) if followed.leader == leader => Some((p, followed.leader_epoch)),
                    _ => None,
                })
                .collect();
            followed_at = Some(news);
        }
        let pause = if followed.is_empty() {
            Some(IDLE)
        } else {
            match fetch_once(
                &broker,
                &mut client,
                &mut session,
                &followed,
                news,
                max_wait,
            )
            .await
            {
                Ok(fetched) => {
                    if let Some(bytes) = fetched {
                        meters.fetched(bytes);
                    }
                    None
                }
                Err(e) => {
                    session.reset();
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
    session: &mut FollowerSession,
    followed: &[(Arc<Partition>, i32)],
    news: NewsKey,
    max_wait_ms: u64,
) -> Result<Option<usize>, tonic::Status> {
    let me = broker.config.node_id;
    let throttle_rate = broker
        .effective_config()
        .follower_replication_throttled_rate;
    let throttle = &broker.replication_throttles.follower;
    let mut next = match session.unchanged_fetch(news) {
        Some(unchanged) => unchanged,
        None => match next_fetch(session, followed, news, throttle_rate, throttle, me) {
            Some(next) => next,
            None => {
                session.reset();
                tokio::time::sleep(RETRY).await;
                return Ok(None);
            }
        },
    };
    let full = next.session_id == 0;
    let mut request = tonic::Request::new(ReplicaFetchRequest {
        replica_id: broker.config.node_id,
        max_wait_ms: u32::try_from(max_wait_ms).unwrap_or(u32::MAX),
        max_bytes: broker.config.replica_fetch_max_bytes,
        partitions: std::mem::take(&mut next.partitions),
        open_session: full,
        session_id: next.session_id,
        session_epoch: next.session_epoch,
        // Kept in `next` too: the session drops them once answered.
        forgotten: next.forgotten.clone(),
    });
    request.set_timeout(Duration::from_millis(max_wait_ms) + Duration::from_secs(5));
    let response = client.fetch(request).await?.into_inner();
    if response.error_code != 0 {
        // The leader does not know this session (it restarted, or a fetch
        // of it was cut short): start a new one.
        debug!(
            code = response.error_code,
            "fetch session refused; the next fetch is full"
        );
        session.reset();
        return Ok(Some(0));
    }
    session.answered(next, response.session_id);
    let bytes = response.partitions.iter().map(|p| p.records.len()).sum();
    let mut all_failed = full && !response.partitions.is_empty();
    let mut answers = Vec::with_capacity(response.partitions.len());
    for data in response.partitions {
        let Some((partition, asked)) = session.asked(&data.topic, data.partition) else {
            continue;
        };
        if throttle_rate.is_some() && partition.is_adding(me) {
            throttle.spend(data.records.len());
        }
        // The answer belongs to the epoch it was asked under.
        let epoch = asked.current_leader_epoch;
        if partition.followed_leader().map(|f| f.leader_epoch) != Some(epoch) {
            continue;
        }
        answers.push((Arc::clone(partition), epoch, asked.fetch_offset, data));
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
            Err(e) => {
                // Its back-off (a write failure) or its next try is only
                // seen by looking at every partition again.
                session.look_again();
                // The partition logs when its writes start and stop failing.
                if !is_write_failure(&e) {
                    warn!(partition = %partition.name(), error = %e, "applying fetched data failed");
                }
            }
        }
    }
    if all_failed {
        // Every partition answered an error: the metadata is moving; let it.
        // (An incremental fetch answers an error once, so it cannot spin.)
        tokio::time::sleep(RETRY).await;
    }
    Ok(Some(bytes))
}

/// The next fetch built from every followed partition's state, or `None`
/// when every one of them sits this round out.
fn next_fetch(
    session: &mut FollowerSession,
    followed: &[(Arc<Partition>, i32)],
    news: NewsKey,
    throttle_rate: Option<u64>,
    throttle: &ByteRate,
    me: i32,
) -> Option<NextFetch> {
    let now = tokio::time::Instant::now();
    let mut asked = Vec::with_capacity(followed.len());
    // A throttle or a back-off leaves partitions out for a while: the next
    // round must look again even if nothing else moved.
    let mut complete = throttle_rate.is_none();
    for (partition, epoch) in followed {
        // A partition this broker is being added to, over the follower
        // throttle, sits this round out.
        let reassigning = throttle_rate.is_some() && partition.is_adding(me);
        if reassigning && !throttle.admits(throttle_rate, now.into_std()) {
            complete = false;
            continue;
        }
        // A replica whose last write failed (a full disk) waits out its
        // back-off; it falls out of the ISR meanwhile by the leader's lag rule.
        if partition
            .write_failures
            .retry_at()
            .is_some_and(|at| at > now)
        {
            complete = false;
            continue;
        }
        let Ok(position) = partition.follower_position() else {
            complete = false;
            continue;
        };
        asked.push((
            Arc::clone(partition),
            FetchPartition {
                topic: partition.topic.clone(),
                partition: partition.index,
                current_leader_epoch: *epoch,
                fetch_offset: position.fetch_offset,
                last_fetched_epoch: position.last_fetched_epoch,
                high_watermark: position.high_watermark,
            },
        ));
    }
    (!asked.is_empty()).then(|| session.next_fetch(asked, news, complete))
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
