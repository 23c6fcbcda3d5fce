//! Partitions this broker hosts and the replica manager that owns them.
//!
//! A [`Partition`] wraps one [`PartitionLog`] behind a mutex, plus what the
//! network paths need around it: a watch of the high watermark for fetch long
//! polls, and group commit for `acks=all` under the fsync-before-answer policy.
//!
//! Each partition also carries its [`Leadership`] as the metadata last said
//! (leader or not, leader epoch); produce, fetch and list-offsets are served
//! only where this broker leads. The metadata applier (`apply`) sets it.
//!
//! `impl Partition` has two sites, split by lock: this file holds what the
//! request paths (produce, fetch, list-offsets, the coordinators) call —
//! log access, admission of transactional writes, reads, the acks=all waits
//! (fsync, then the HW: [`Partition::wait_replicated`]) — and
//! `replication/state.rs` everything that reads or changes the partition's
//! [`ReplicaState`] under the log and replication locks (leader appends that
//! advance the HW, serving a follower's fetch, a follower's appends and
//! truncations, ISR changes), so the lock order and the HW rule are kept in
//! one file.
//!
//! Invariants kept here:
//! - the high watermark is the minimum log end offset over the ISR (see
//!   `replication`); a partition whose ISR is just this leader has it equal
//!   to the log end offset after every append;
//! - the high watermark only moves forward, and every move is published on the
//!   watch so parked fetches wake up;
//! - an `acks=all` produce under [`FlushPolicy::EveryAck`] is answered only
//!   once a fsync covering its last offset has completed; concurrent waiters
//!   share one fsync (group commit), and fsync runs outside the log mutex so
//!   appends continue while the disk works.

use crate::error::PartitionError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use samsa_storage::{FlushPolicy, LogConfig, PartitionLog, ReadResult, StorageError};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn, Instrument};

use crate::controller_contact::ControllerContact;
use crate::dynamic_config::topic_log_config;
use crate::error::{BrokerError, Refusal};
use crate::hw_checkpoint;
use crate::metadata::TopicMetadata;
use crate::replication::session::{NewsBoard, NewsKey};
use crate::replication::{LeaderAppend, LeaderEpochCache, ReplicaState};
use crate::write_failures::{is_write_failure, WriteFailures, WriteOutcome};

/// What [`Partition::read_to_log_end`] read, and the log end it read to.
#[derive(Debug)]
pub struct ReadToLogEnd {
    pub read: ReadResult,
    pub log_end_offset: i64,
}

/// What a fetch saw of a partition.
pub struct PartitionRead {
    pub result: ReadResult,
    /// `read_committed` only: the aborted transactions overlapping the
    /// returned records (empty otherwise).
    pub aborted: Vec<samsa_storage::AbortedTxn>,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

/// Offsets of a partition at one moment.
#[derive(Debug, Clone, Copy)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_end_offset: i64,
}

/// Whether this broker leads a partition, and at which leader epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leadership {
    pub is_leader: bool,
    pub leader_epoch: i32,
}

impl Leadership {
    /// What a single node has for every partition.
    pub const SINGLE_NODE: Leadership = Leadership {
        is_leader: true,
        leader_epoch: 0,
    };

    // Packed into one atomic so readers never see a leader flag from one
    // change with the epoch of another.
    fn pack(self) -> u64 {
        (u64::from(self.is_leader) << 32) | u64::from(self.leader_epoch as u32)
    }

    fn unpack(bits: u64) -> Self {
        Leadership {
            is_leader: bits >> 32 != 0,
            leader_epoch: bits as u32 as i32,
        }
    }
}

pub struct Partition {
    pub topic: String,
    pub index: i32,
    /// [`Leadership`], packed.
    leadership: AtomicU64,
    /// Whether `acks=all` answers wait for an fsync (`FlushPolicy::EveryAck`).
    pub flushes_before_ack: bool,
    /// The topic's `compression.type` and `max.message.bytes` (what
    /// [`Self::in_topic_codec`] needs), copied from the log's config at open
    /// and on every config change ([`Self::set_log_config`]) so a produce
    /// does not take the log lock an extra time to read them. A produce
    /// racing a change may convert to the old codec: the append converts
    /// whatever is not in the log's codec then.
    topic_codec: std::sync::RwLock<(samsa_storage::CompressionType, u32)>,
    pub(crate) log: Mutex<Option<PartitionLog>>,
    pub(crate) high_watermark: watch::Sender<i64>,
    /// The log end offset, for follower fetches waiting on new data.
    pub(crate) log_end: watch::Sender<i64>,
    /// The consumer fetch sessions to wake when the high watermark moves:
    /// one bell per session, registered once however often it reads the
    /// partition, so a session's long poll waits on its bell instead of
    /// subscribing to every partition's watch each round. A bell whose
    /// session is gone is dropped when met.
    high_watermark_bells: Mutex<Vec<Weak<tokio::sync::Notify>>>,
    /// Counts changes a follower's fetch session must look at (HW, log
    /// end, replica set, leadership); see [`Self::note_replication_news`].
    replication_news: AtomicU64,
    /// Woken with every such change on this broker (shared by all
    /// partitions): what held replica fetches wait on.
    replication_news_board: Arc<NewsBoard>,
    /// Leader/ISR, follower progress and the leader-epoch cache (locked
    /// after `log`, never before).
    pub(crate) replication: Mutex<ReplicaState>,
    flush_lock: tokio::sync::Mutex<()>,
    /// The high watermark the broker's checkpoint file last recorded
    /// (`hw_checkpoint`).
    checkpointed_high_watermark: AtomicI64,
    /// KIP-890: producers (id → epoch) whose next transaction on this
    /// partition the coordinator confirmed, not yet opened by a batch.
    /// Locked after `log`. An entry is used up by the first transactional
    /// append of that epoch and dropped by any marker of the producer, so a
    /// verification never outlives the transaction it was made for.
    verified_txns: Mutex<HashMap<i64, i16>>,
    /// Whether writes to the log are failing (a full disk), for the log
    /// line, a follower's back-off and the metrics.
    pub(crate) write_failures: WriteFailures,
    /// This broker's contact with the controller (shared by all partitions),
    /// for [`Self::leadership_in_doubt_now`].
    pub(crate) controller_contact: Arc<ControllerContact>,
    /// Its topic's traffic counters (`samsa_topic_*`).
    pub traffic: samsa_metrics::topics::TopicTraffic,
    /// The broker's replication and storage meters (ISR changes, flushes).
    pub meters: samsa_metrics::partitions::PartitionMetrics,
}

impl Partition {
    /// A partition of `manager` (whose broker-wide handles it shares).
    fn new(
        topic: String,
        index: i32,
        log: PartitionLog,
        leadership: Leadership,
        manager: &ReplicaManager,
    ) -> Self {
        let hw = log.high_watermark();
        let leo = log.log_end_offset();
        let epochs = LeaderEpochCache::open(&log);
        let traffic = manager.topic_metrics.topic(&topic);
        Partition {
            topic,
            index,
            leadership: AtomicU64::new(leadership.pack()),
            flushes_before_ack: log.config().flush == FlushPolicy::EveryAck,
            topic_codec: std::sync::RwLock::new((
                log.config().compression_type,
                log.config().max_message_bytes,
            )),
            log: Mutex::new(Some(log)),
            high_watermark: watch::Sender::new(hw),
            log_end: watch::Sender::new(leo),
            high_watermark_bells: Mutex::new(Vec::new()),
            replication_news: AtomicU64::new(0),
            replication_news_board: Arc::clone(&manager.replication_news_board),
            replication: Mutex::new(ReplicaState::new(epochs)),
            flush_lock: tokio::sync::Mutex::new(()),
            checkpointed_high_watermark: AtomicI64::new(hw),
            verified_txns: Mutex::new(HashMap::new()),
            write_failures: WriteFailures::default(),
            controller_contact: Arc::clone(&manager.controller_contact),
            traffic,
            meters: manager.partition_metrics.clone(),
        }
    }

    pub fn name(&self) -> String {
        format!("{}-{}", self.topic, self.index)
    }

    pub fn leadership(&self) -> Leadership {
        Leadership::unpack(self.leadership.load(Ordering::Acquire))
    }

    pub fn is_leader(&self) -> bool {
        self.leadership().is_leader
    }

    /// The current leader epoch (stamped into appended batches, compared with
    /// the epoch clients send in Fetch).
    pub fn leader_epoch(&self) -> i32 {
        self.leadership().leader_epoch
    }

    /// Applies a leadership change from the metadata; returns the previous one.
    /// The check of a client's `current_leader_epoch` (KIP-320: Fetch v9+,
    /// ListOffsets v4+, OffsetForLeaderEpoch v2+): -1 skips it; an older
    /// epoch than this leader's is FENCED_LEADER_EPOCH (the client's
    /// metadata is stale), a newer one UNKNOWN_LEADER_EPOCH (this broker's
    /// is).
    pub fn check_current_leader_epoch(&self, current: i32) -> Result<(), ResponseError> {
        let leader_epoch = self.leader_epoch();
        if current < 0 || current == leader_epoch {
            Ok(())
        } else if current > leader_epoch {
            Err(ResponseError::UnknownLeaderEpoch)
        } else {
            Err(ResponseError::FencedLeaderEpoch)
        }
    }

    pub fn set_leadership(&self, leadership: Leadership) -> Leadership {
        let before = Leadership::unpack(self.leadership.swap(leadership.pack(), Ordering::AcqRel));
        if before != leadership {
            self.note_replication_news();
        }
        before
    }

    /// Something a fetch of this partition may answer differently changed
    /// (high watermark, log end, log start, leadership, replicas): fetch
    /// sessions, followers' and consumers', look at the partition again
    /// instead of trusting their last answer, and held follower fetches wake.
    pub(crate) fn note_replication_news(&self) {
        self.replication_news.fetch_add(1, Ordering::AcqRel);
        self.replication_news_board.post();
    }

    /// How many changes [`Self::note_replication_news`] has counted.
    pub(crate) fn replication_news(&self) -> u64 {
        self.replication_news.load(Ordering::Acquire)
    }

    /// Takes a changed topic config (see `apply`): the log's, and the
    /// codec produce requests are converted to. A closed partition has
    /// nothing to change.
    pub fn set_log_config(&self, config: samsa_storage::LogConfig) {
        *self.topic_codec.write().unwrap_or_else(|p| p.into_inner()) =
            (config.compression_type, config.max_message_bytes);
        let _ = self.with_log(|log| {
            log.set_config(config);
            Ok(())
        });
    }

    /// The log's current config (a copy).
    pub fn log_config(&self) -> Option<samsa_storage::LogConfig> {
        self.with_log(|log| Ok(log.config().clone())).ok()
    }

    pub(crate) fn with_log<T>(
        &self,
        f: impl FnOnce(&mut PartitionLog) -> Result<T, StorageError>,
    ) -> Result<T, PartitionError> {
        let mut guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(log) => Ok(f(log)?),
            None => Err(PartitionError::Closed(self.name())),
        }
    }

    /// Records how a write to the log went: one warning when writes start
    /// failing, one line when they work again, nothing per failed write.
    pub(crate) fn note_write<T>(&self, result: &Result<T, PartitionError>) {
        let now = Instant::now();
        match result {
            Ok(_) => {
                if let WriteOutcome::Recovered {
                    failed_writes,
                    failing_for,
                } = self.write_failures.succeeded(now)
                {
                    info!(partition = %self.name(), failed_writes, failing_for_ms = failing_for.as_millis() as u64, "log writes work again");
                }
            }
            Err(e) if is_write_failure(e) => match self.write_failures.failed(now) {
                WriteOutcome::StartedFailing => {
                    warn!(partition = %self.name(), error = %e, "log writes are failing (disk full?): writes are answered KAFKA_STORAGE_ERROR and retried, reads go on; logged again when writes work")
                }
                _ => debug!(partition = %self.name(), error = %e, "log write failed again"),
            },
            Err(_) => {}
        }
    }

    /// Appends a produce request's records as leader and advances the HW
    /// as far as the ISR allows (to the LEO when this replica is alone).
    pub fn append(&self, records: &[u8], now_ms: i64) -> Result<LeaderAppend, PartitionError> {
        let records = self.in_topic_codec(records)?;
        self.append_as_leader_replicated(&records, now_ms)
    }

    /// `records` recompressed to the topic's `compression.type`
    /// (`samsa_storage::compression::to_topic_codec`), done here, outside
    /// the log lock, because it is CPU work on the request's bytes alone;
    /// the append then finds its batches already in the topic's codec.
    fn in_topic_codec<'a>(
        &self,
        records: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, PartitionError> {
        let (codec, max_message_bytes) =
            *self.topic_codec.read().unwrap_or_else(|p| p.into_inner());
        Ok(samsa_storage::compression::to_topic_codec(
            records,
            codec,
            max_message_bytes,
        )?)
    }

    /// Appends a produce request's transactional records of producer
    /// `(producer_id, producer_epoch)`: only if the producer already has a
    /// transaction open here, or its next one was verified with the
    /// coordinator ([`Self::mark_txn_verified`]); otherwise
    /// [`PartitionError::TxnNotVerified`]. Checked under the log lock, so a
    /// marker landing between verification and append cannot let the batch
    /// open a transaction no coordinator knows (a hanging transaction).
    pub fn append_transactional(
        &self,
        records: &[u8],
        producer_id: i64,
        producer_epoch: i16,
        now_ms: i64,
    ) -> Result<LeaderAppend, PartitionError> {
        let records = self.in_topic_codec(records)?;
        self.leader_append_with(|log, epoch| {
            let mut verified = self.verified_txns.lock().unwrap_or_else(|p| p.into_inner());
            if !txn_admitted(log, &verified, producer_id, producer_epoch) {
                return Ok(Err(PartitionError::TxnNotVerified {
                    partition: self.name(),
                    producer_id,
                    producer_epoch,
                }));
            }
            let info = log.append_as_leader(&records, epoch, now_ms)?;
            verified.remove(&producer_id);
            Ok(Ok(info))
        })
    }

    /// DeleteRecords as leader: moves the log start offset up to `offset`
    /// (-1: the high watermark), deleting the segments wholly below it.
    /// Followers follow on their next fetch. Above the high watermark is
    /// OFFSET_OUT_OF_RANGE. Returns the log start offset after it.
    pub fn delete_records_before(&self, offset: i64) -> Result<i64, PartitionError> {
        let (before, after) = self.with_log(|log| {
            let offset = if offset == -1 {
                log.high_watermark()
            } else {
                offset
            };
            let before = log.log_start_offset();
            Ok((before, log.delete_records_before(offset)?))
        })?;
        if after != before {
            // Fetch sessions tell followers and consumers the new log start.
            self.note_replication_news();
        }
        Ok(after)
    }

    /// Whether a transactional write of this producer must first be
    /// verified with its coordinator: it has no transaction open here at
    /// this epoch and no verification waiting.
    pub fn txn_needs_verification(
        &self,
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<bool, PartitionError> {
        self.with_log(|log| {
            let verified = self.verified_txns.lock().unwrap_or_else(|p| p.into_inner());
            Ok(!txn_admitted(log, &verified, producer_id, producer_epoch))
        })
    }

    /// The coordinator confirmed that the producer's ongoing transaction
    /// includes this partition.
    pub fn mark_txn_verified(&self, producer_id: i64, producer_epoch: i16) {
        let _log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        self.verified_txns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(producer_id, producer_epoch);
    }

    /// Appends a COMMIT/ABORT marker as leader (`WriteTxnMarkers`), with the
    /// log's producer- and coordinator-epoch checks, and drops any pending
    /// verification of the producer. Durability (acks=all) is the caller's
    /// wait.
    pub fn append_marker(
        &self,
        marker: &samsa_storage::EndTxnMarker,
        now_ms: i64,
    ) -> Result<LeaderAppend, PartitionError> {
        self.leader_append_with(|log, epoch| {
            let info = log.append_txn_marker(marker, epoch, now_ms)?;
            self.verified_txns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&marker.producer_id);
            Ok(Ok(info))
        })
    }

    /// acks=all for a leader write that ended at `end_offset` in
    /// `leader_epoch`: the group-commit fsync (under `every-ack`), then the
    /// HW covering it (see [`Self::wait_replicated`]). Shared by produce,
    /// transaction markers and the coordinator's state writes.
    pub async fn wait_acks_all(
        &self,
        end_offset: i64,
        leader_epoch: i32,
        deadline: Instant,
    ) -> Result<(), Refusal> {
        if self.flushes_before_ack {
            let fsync = tracing::debug_span!(
                target: crate::trace::TARGET,
                "fsync",
                topic = %self.topic,
                partition = self.index,
                end_offset
            );
            if let Err(e) = self.wait_durable(end_offset).instrument(fsync).await {
                // The partition logs when its writes start and stop failing.
                debug!(partition = %self.name(), error = %e, "fsync before acks=all answer failed");
                return Err(Refusal::new(
                    ResponseError::KafkaStorageError,
                    e.to_string(),
                ));
            }
        }
        let replication = tracing::debug_span!(
            target: crate::trace::TARGET,
            "replication_wait",
            topic = %self.topic,
            partition = self.index,
            end_offset
        );
        self.wait_replicated(end_offset, leader_epoch, deadline)
            .instrument(replication)
            .await
            .map_err(|code| {
                info!(partition = %self.name(), end_offset, ?code, "acks=all write appended but not acknowledged");
                Refusal::new(
                    code,
                    format!(
                        "{}: the write ending at {end_offset} was not acknowledged by the ISR: {code:?}",
                        self.name()
                    ),
                )
            })
    }

    /// Waits until the HW covers `end_offset` (acks=all). Fails with
    /// NOT_LEADER_OR_FOLLOWER when leadership or its epoch changes,
    /// REQUEST_TIMED_OUT at `deadline`, and NOT_ENOUGH_REPLICAS_AFTER_APPEND
    /// when the HW got there with fewer ISR members than `min.insync.replicas`.
    pub async fn wait_replicated(
        &self,
        end_offset: i64,
        leader_epoch: i32,
        deadline: Instant,
    ) -> Result<(), ResponseError> {
        // Leadership changes do not move the HW; look again at least this often.
        const RECHECK: Duration = Duration::from_millis(100);
        let mut hw = self.watch_high_watermark();
        loop {
            // The HW is read before the leadership: a HW covering the batch
            // counts only if this replica still leads in the epoch that
            // appended it. A replica that lost leadership may have had the
            // batch cut as a divergent suffix, and its HW then moves with
            // the new leader's records at those offsets.
            let covered = *hw.borrow_and_update() >= end_offset;
            let leadership = self.leadership();
            if !leadership.is_leader
                || leadership.leader_epoch != leader_epoch
                || self.leadership_in_doubt_now()
            {
                return Err(ResponseError::NotLeaderOrFollower);
            }
            if covered {
                return if self.in_sync_replicas().below_min() {
                    Err(ResponseError::NotEnoughReplicasAfterAppend)
                } else {
                    Ok(())
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ResponseError::RequestTimedOut);
            }
            let wake = deadline.min(now + RECHECK);
            if let Ok(Err(_)) = tokio::time::timeout_at(wake, hw.changed()).await {
                return Err(ResponseError::NotLeaderOrFollower);
            }
        }
    }

    /// DescribeProducers' view of this partition.
    pub fn describe_producers(
        &self,
    ) -> Result<Vec<samsa_storage::ProducerDescription>, PartitionError> {
        self.with_log(|log| Ok(log.describe_producers()))
    }

    /// This partition's line in the broker's HW checkpoint file, and
    /// whether its HW moved since the file last recorded it.
    fn high_watermark_entry(&self) -> Result<(hw_checkpoint::Entry, bool), PartitionError> {
        let (generation, high_watermark) =
            self.with_log(|log| Ok((log.generation(), log.high_watermark())))?;
        let moved = self.checkpointed_high_watermark.load(Ordering::Relaxed) != high_watermark;
        Ok((
            hw_checkpoint::Entry {
                topic: self.topic.clone(),
                partition: self.index,
                generation,
                high_watermark,
            },
            moved,
        ))
    }

    /// Waits until everything below `end_offset` is on disk (group commit).
    pub async fn wait_durable(&self, end_offset: i64) -> Result<(), PartitionError> {
        loop {
            if self.with_log(|log| Ok(log.flushed_offset()))? >= end_offset {
                return Ok(());
            }
            // One flusher at a time; whoever waits here while an fsync runs is
            // covered by the next one, which takes everything appended so far.
            let _flushing = self.flush_lock.lock().await;
            let target = self.with_log(|log| {
                if log.flushed_offset() >= end_offset {
                    return Ok(None);
                }
                Ok(log.flush_target())
            })?;
            let Some(target) = target else {
                continue;
            };
            let up_to = target.up_to_offset();
            let started = std::time::Instant::now();
            let synced = tokio::task::spawn_blocking(move || target.sync())
                .await
                .map_err(|e| PartitionError::Flush(std::io::Error::other(e)))
                .and_then(|r| r.map_err(PartitionError::Flush));
            self.note_write(&synced);
            synced?;
            self.meters.flushed(started.elapsed().as_secs_f64());
            self.with_log(|log| log.mark_flushed(up_to))?;
        }
    }

    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        read_committed: bool,
    ) -> Result<PartitionRead, PartitionError> {
        self.with_log(|log| {
            let high_watermark = log.high_watermark();
            let last_stable_offset = log.last_stable_offset();
            let upper = if read_committed {
                last_stable_offset
            } else {
                high_watermark
            };
            let result = log.read(offset, max_bytes, upper)?;
            let aborted = if read_committed && !result.records.is_empty() {
                log.aborted_transactions(offset, records_end(&result.records).unwrap_or(upper))
            } else {
                Vec::new()
            };
            Ok(PartitionRead {
                result,
                aborted,
                high_watermark,
                last_stable_offset,
                log_start_offset: log.log_start_offset(),
            })
        })
    }

    /// Whole batches from `offset` up to the log end (not the HW): what a
    /// new leader of an internal partition replays. Its own log is never
    /// truncated while it leads, so what it reads will become committed.
    pub fn read_to_log_end(
        &self,
        offset: i64,
        max_bytes: usize,
    ) -> Result<ReadToLogEnd, PartitionError> {
        self.with_log(|log| {
            let log_end_offset = log.log_end_offset();
            Ok(ReadToLogEnd {
                read: log.read(offset, max_bytes, log_end_offset)?,
                log_end_offset,
            })
        })
    }

    pub fn offsets(&self) -> Result<PartitionOffsets, PartitionError> {
        self.with_log(|log| {
            Ok(PartitionOffsets {
                log_start_offset: log.log_start_offset(),
                high_watermark: log.high_watermark(),
                last_stable_offset: log.last_stable_offset(),
                log_end_offset: log.log_end_offset(),
            })
        })
    }

    pub fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>, PartitionError> {
        self.with_log(|log| log.offset_for_timestamp(timestamp))
    }

    pub fn max_timestamp_and_offset(&self) -> Result<Option<(i64, i64)>, PartitionError> {
        self.with_log(|log| Ok(log.max_timestamp_and_offset()))
    }

    /// A receiver that changes whenever the high watermark moves.
    pub fn watch_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// Rings `bell` (`notify_one`: a ring while nobody waits is kept for
    /// the next wait) whenever the high watermark moves, for as long as
    /// the bell lives; registering it again changes nothing.
    pub fn ring_on_high_watermark(&self, bell: &Arc<tokio::sync::Notify>) {
        let mut bells = self
            .high_watermark_bells
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        bells.retain(|b| b.strong_count() > 0);
        if !bells
            .iter()
            .any(|b| std::ptr::eq(b.as_ptr(), Arc::as_ptr(bell)))
        {
            bells.push(Arc::downgrade(bell));
        }
    }

    /// Stops ringing `bell` (its session forgot this partition).
    pub fn stop_ringing(&self, bell: &Arc<tokio::sync::Notify>) {
        self.high_watermark_bells
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|b| b.strong_count() > 0 && !std::ptr::eq(b.as_ptr(), Arc::as_ptr(bell)));
    }

    pub(crate) fn ring_high_watermark_bells(&self) {
        let mut bells = self
            .high_watermark_bells
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        bells.retain(|b| match b.upgrade() {
            Some(bell) => {
                bell.notify_one();
                true
            }
            None => false,
        });
    }

    fn flush(&self) -> Result<(), PartitionError> {
        self.with_log(|log| log.flush())
    }

    fn enforce_retention(&self, now_ms: i64) -> Result<usize, PartitionError> {
        let deleted = self.with_log(|log| log.enforce_retention(now_ms))?;
        if deleted > 0 {
            // The log start moved: fetch sessions tell it.
            self.note_replication_news();
        }
        Ok(deleted)
    }

    /// Takes the log out and closes it cleanly; later calls see `Closed`.
    fn close(&self) -> Result<(), StorageError> {
        // A closed partition leads nothing: an acks=all produce parked on
        // it (its topic deleted, or the partition moved away, so the
        // followers stopped fetching it) is answered NOT_LEADER_OR_FOLLOWER
        // at its next look instead of waiting out the request's timeout.
        self.set_leadership(Leadership {
            is_leader: false,
            leader_epoch: self.leader_epoch(),
        });
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner()).take();
        match log {
            Some(log) => log.close(),
            None => Ok(()),
        }
    }
}

/// The offset after the last batch of `records` (whole batches).
fn records_end(records: &[u8]) -> Option<i64> {
    samsa_storage::batch::batches(records)
        .filter_map(Result::ok)
        .last()
        .map(|(header, _)| header.last_offset() + 1)
}

/// How many openings and removals of partitions [`ReplicaManager`] keeps
/// for fetch sessions to catch up with one by one.
const OPENINGS_KEPT: usize = 4096;

/// A hosted partition's `(topic, index)` as a map key, so that a lookup
/// by `(&str, i32)` hashes and compares as the stored `(String, i32)` does
/// without building a `String` (every produced and fetched partition is
/// looked up).
trait TopicIndex {
    fn topic(&self) -> &str;
    fn index(&self) -> i32;
}

impl TopicIndex for (String, i32) {
    fn topic(&self) -> &str {
        &self.0
    }
    fn index(&self) -> i32 {
        self.1
    }
}

impl TopicIndex for (&str, i32) {
    fn topic(&self) -> &str {
        self.0
    }
    fn index(&self) -> i32 {
        self.1
    }
}

impl<'a> std::borrow::Borrow<dyn TopicIndex + 'a> for (String, i32) {
    fn borrow(&self) -> &(dyn TopicIndex + 'a) {
        self
    }
}

/// The tuple's hash: its fields in order.
impl std::hash::Hash for dyn TopicIndex + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.topic().hash(state);
        self.index().hash(state);
    }
}

impl PartialEq for dyn TopicIndex + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.index() == other.index() && self.topic() == other.topic()
    }
}

impl Eq for dyn TopicIndex + '_ {}

/// Owns every partition this broker hosts.
pub struct ReplicaManager {
    data_dir: PathBuf,
    /// The log defaults partitions open with: the broker's effective
    /// `log` settings (static, overlaid with dynamic ones by `apply`).
    defaults: RwLock<LogConfig>,
    partitions: RwLock<HashMap<(String, i32), Arc<Partition>>>,
    /// Counts partitions opened and removed: a fetch session that holds
    /// partitions looks them up again when it moved.
    generation: AtomicU64,
    /// The latest openings and removals, each with the generation it
    /// made, oldest first (at most [`OPENINGS_KEPT`]): a session looks up
    /// only the partitions that changed, unless it is further behind.
    openings: Mutex<std::collections::VecDeque<(u64, (String, i32))>>,
    /// Woken when any partition has replication news (see
    /// [`Partition::note_replication_news`]).
    replication_news_board: Arc<NewsBoard>,
    /// Partitions this broker should host but could not open at the last
    /// try, with why: their clients get KAFKA_STORAGE_ERROR, not a silent
    /// NOT_LEADER_OR_FOLLOWER, until a later apply opens them.
    unopened: Mutex<HashMap<(String, i32), String>>,
    /// The HW checkpoint file as this broker found it at start: a replicated
    /// partition opened later takes its line as a lower bound of its HW.
    saved_high_watermarks: hw_checkpoint::Saved,
    /// The last write of the HW checkpoint file failed: logged once, not
    /// every interval.
    hw_checkpoint_failing: AtomicBool,
    controller_contact: Arc<ControllerContact>,
    /// The per-topic traffic counters, each partition holding its topic's.
    topic_metrics: samsa_metrics::topics::TopicMetrics,
    partition_metrics: samsa_metrics::partitions::PartitionMetrics,
}

pub(crate) fn partition_dir(data_dir: &Path, topic: &str, partition: i32) -> PathBuf {
    data_dir.join(format!("{topic}-{partition}"))
}

impl ReplicaManager {
    pub fn new(
        data_dir: PathBuf,
        defaults: LogConfig,
        topic_metrics: samsa_metrics::topics::TopicMetrics,
        partition_metrics: samsa_metrics::partitions::PartitionMetrics,
    ) -> Self {
        let saved_high_watermarks = hw_checkpoint::read(&data_dir).unwrap_or_else(|e| {
            warn!(error = %e, "high-watermark checkpoint file ignored: replicated partitions start from the HW of their own checkpoint");
            hw_checkpoint::Saved::new()
        });
        ReplicaManager {
            data_dir,
            defaults: RwLock::new(defaults),
            partitions: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
            openings: Mutex::new(std::collections::VecDeque::new()),
            replication_news_board: Arc::new(NewsBoard::default()),
            unopened: Mutex::new(HashMap::new()),
            saved_high_watermarks,
            hw_checkpoint_failing: AtomicBool::new(false),
            controller_contact: Arc::new(ControllerContact::standalone()),
            topic_metrics,
            partition_metrics,
        }
    }

    /// The log defaults partitions open with.
    pub fn defaults(&self) -> LogConfig {
        self.defaults
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the log defaults (a dynamic broker config changed).
    pub fn set_defaults(&self, defaults: LogConfig) {
        *self.defaults.write().unwrap_or_else(|p| p.into_inner()) = defaults;
    }

    /// When this broker last heard the controller (cluster mode updates it
    /// from its heartbeats; a single node never loses contact).
    pub fn controller_contact(&self) -> &Arc<ControllerContact> {
        &self.controller_contact
    }

    pub fn get(&self, topic: &str, partition: i32) -> Option<Arc<Partition>> {
        self.partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(topic, partition) as &dyn TopicIndex)
            .cloned()
    }

    /// Records that `topic`-`index` failed to open; true if it was not
    /// failing already (the caller logs the first failure loudly).
    pub fn record_open_failure(&self, topic: &str, index: i32, error: &BrokerError) -> bool {
        self.unopened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((topic.to_string(), index), error.to_string())
            .is_none()
    }

    /// Whether `topic`-`index` could not open at the last try (the log
    /// says why).
    pub fn failed_to_open(&self, topic: &str, index: i32) -> bool {
        self.unopened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&(topic, index) as &dyn TopicIndex)
    }

    /// How many partitions this broker should host but could not open.
    pub fn unopened_count(&self) -> usize {
        self.unopened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    fn forget_open_failure(&self, topic: &str, index: i32) -> Option<String> {
        self.unopened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(topic.to_string(), index))
    }

    /// Changes with every partition opened or removed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Counts an opening or removal of `topic`-`index`; called with the
    /// partitions' write lock held, so generations are recorded in order.
    fn opened_or_removed(&self, topic: &str, index: i32) {
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let mut openings = self.openings.lock().unwrap_or_else(|p| p.into_inner());
        if openings.len() == OPENINGS_KEPT {
            openings.pop_front();
        }
        openings.push_back((generation, (topic.to_string(), index)));
    }

    /// The partitions opened or removed after generation `since`, or `None`
    /// when some of them are no longer recorded.
    pub(crate) fn opened_or_removed_since(&self, since: u64) -> Option<Vec<(String, i32)>> {
        let openings = self.openings.lock().unwrap_or_else(|p| p.into_inner());
        let start = openings.partition_point(|(generation, _)| *generation <= since);
        let complete = match openings.front() {
            Some((oldest, _)) => *oldest <= since + 1,
            None => self.generation() == since,
        };
        complete.then(|| {
            openings
                .range(start..)
                .map(|(_, key)| key.clone())
                .collect()
        })
    }

    /// Where this broker's replication news stands now.
    pub(crate) fn news_key(&self) -> NewsKey {
        (self.generation(), self.replication_news_board.posted())
    }

    /// Woken when any partition has replication news.
    pub(crate) fn replication_news_board(&self) -> &Arc<NewsBoard> {
        &self.replication_news_board
    }

    pub fn all(&self) -> Vec<Arc<Partition>> {
        self.partitions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Opens (recovering if needed) or creates every partition of `topic` not
    /// yet open, led by this node (single-node semantics).
    pub fn ensure_topic(&self, topic: &TopicMetadata, now_ms: i64) -> Result<(), BrokerError> {
        for index in 0..topic.partitions {
            self.ensure_partition(topic, index, Leadership::SINGLE_NODE, now_ms)?;
        }
        Ok(())
    }

    /// Opens (recovering if needed) or creates partition `index` of `topic`
    /// if it is not open yet, and sets its leadership (also when it was open).
    /// A new partition gets its leadership before anyone can look it up.
    pub fn ensure_partition(
        &self,
        topic: &TopicMetadata,
        index: i32,
        leadership: Leadership,
        now_ms: i64,
    ) -> Result<Arc<Partition>, BrokerError> {
        if let Some(partition) = self.get(&topic.name, index) {
            partition.set_leadership(leadership);
            return Ok(partition);
        }
        let config = topic_log_config(&self.defaults(), topic);
        let dir = partition_dir(&self.data_dir, &topic.name, index);
        let name = format!("{}-{}", topic.name, index);
        let (mut log, report) = PartitionLog::open(&dir, config, now_ms).map_err(|source| {
            BrokerError::OpenPartition {
                partition: name.clone(),
                source,
            }
        })?;
        // One replica: everything in the log is committed (the HW
        // checkpoint may lag after a crash). With more, the checkpointed HW
        // (the log's own, or the broker's file when newer under the same
        // generation) stands until the ISR moves it.
        let log_end_offset = log.log_end_offset();
        let restored = if topic.replication_factor <= 1 {
            log.set_high_watermark(log_end_offset)
        } else {
            match self.saved_high_watermarks.get(&(topic.name.clone(), index)) {
                Some(&(generation, hw)) => log.restore_high_watermark(generation, hw).map(|_| ()),
                None => Ok(()),
            }
        };
        restored.map_err(|source| BrokerError::OpenPartition {
            partition: name.clone(),
            source,
        })?;
        match self.forget_open_failure(&topic.name, index) {
            Some(failed) => {
                info!(partition = %name, log_end_offset, ?leadership, recovery = ?report,
                earlier_failure = %failed, "partition opened after failing to")
            }
            None => {
                info!(partition = %name, log_end_offset, ?leadership, recovery = ?report, "partition opened")
            }
        }
        let partition = Arc::new(Partition::new(
            topic.name.clone(),
            index,
            log,
            leadership,
            self,
        ));
        {
            let mut partitions = self.partitions.write().unwrap_or_else(|p| p.into_inner());
            partitions.insert((topic.name.clone(), index), partition.clone());
            self.opened_or_removed(&topic.name, index);
        }
        Ok(partition)
    }

    /// Closes and deletes every partition of a deleted topic.
    pub fn remove_topic(&self, topic: &TopicMetadata) {
        for index in 0..topic.partitions {
            self.remove_partition(&topic.name, index, topic.topic_id);
        }
    }

    /// Closes partition `index` of `topic` if it is open and deletes its
    /// directory (the topic was deleted, or a reassignment moved the
    /// partition off this broker). The directory is first renamed to
    /// `*.<topic id>-delete` (atomic), so a crash midway never resurrects
    /// the data under a recreated topic of the same name or a later
    /// reassignment back to this broker.
    pub fn remove_partition(&self, topic: &str, index: i32, topic_id: uuid::Uuid) {
        self.forget_open_failure(topic, index);
        let removed = {
            let mut partitions = self.partitions.write().unwrap_or_else(|p| p.into_inner());
            let removed = partitions.remove(&(topic, index) as &dyn TopicIndex);
            if removed.is_some() {
                self.opened_or_removed(topic, index);
            }
            removed
        };
        if let Some(partition) = removed {
            if let Err(e) = partition.close() {
                warn!(partition = %partition.name(), error = %e, "closing a removed partition failed");
            }
        }
        let dir = partition_dir(&self.data_dir, topic, index);
        if !dir.exists() {
            return;
        }
        let doomed = self
            .data_dir
            .join(format!("{topic}-{index}.{}-delete", topic_id.simple()));
        if let Err(e) = std::fs::rename(&dir, &doomed) {
            warn!(dir = %dir.display(), error = %e, "renaming a removed partition failed");
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&doomed) {
            warn!(dir = %doomed.display(), error = %e, "removing a removed partition failed");
        }
    }

    /// Removes directories of partitions whose deletion was interrupted.
    pub fn purge_deleted_dirs(&self) -> Result<(), BrokerError> {
        let entries = std::fs::read_dir(&self.data_dir).map_err(|source| BrokerError::Io {
            path: self.data_dir.clone(),
            source,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().ends_with("-delete") {
                info!(dir = %entry.path().display(), "removing partition left over from an interrupted delete");
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    warn!(dir = %entry.path().display(), error = %e, "cannot remove deleted partition");
                }
            }
        }
        Ok(())
    }

    /// Moves a directory that exists where a brand-new partition must be created.
    pub fn clear_stale_dirs(&self, topic: &TopicMetadata) {
        for index in 0..topic.partitions {
            let dir = partition_dir(&self.data_dir, &topic.name, index);
            if dir.exists() && self.get(&topic.name, index).is_none() {
                warn!(dir = %dir.display(), "removing stale directory of a topic that no longer exists");
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    warn!(dir = %dir.display(), error = %e, "cannot remove stale partition dir");
                }
            }
        }
    }

    /// Makes every segment closed by a roll durable (an fsync outside the
    /// log lock, as a group commit does), as Kafka flushes a segment once it
    /// rolls. Without it, a log written only with acks=0/1 under the
    /// default flush policy would never advance its recovery point: crash
    /// recovery would replay all of it and the cleaner would take none of it.
    pub async fn flush_rolled_segments(&self) {
        for partition in self.all() {
            let Ok(Some(end)) = partition.with_log(|log| Ok(log.rolled_unflushed_end())) else {
                continue;
            };
            if let Err(e) = partition.wait_durable(end).await {
                debug!(partition = %partition.name(), error = %e, "flush of rolled segments failed; retried");
            }
        }
    }

    pub fn flush_all(&self) {
        for partition in self.all() {
            if let Err(e) = partition.flush() {
                warn!(partition = %partition.name(), error = %e, "periodic flush failed");
            }
        }
    }

    /// Replaces the HW checkpoint file (`hw_checkpoint`) with every hosted
    /// partition's HW when one of them moved since the last write. A
    /// partition whose log cannot be read keeps no line (its own
    /// checkpoint stands). Blocking: two fsyncs.
    pub fn checkpoint_high_watermarks(&self) {
        let mut recorded = Vec::new();
        let mut entries = Vec::new();
        let mut moved = false;
        for partition in self.all() {
            if let Ok((entry, partition_moved)) = partition.high_watermark_entry() {
                moved |= partition_moved;
                recorded.push(partition);
                entries.push(entry);
            }
        }
        if !moved {
            return;
        }
        let result = hw_checkpoint::write(&self.data_dir, &entries);
        let was_failing = self
            .hw_checkpoint_failing
            .swap(result.is_err(), Ordering::Relaxed);
        match result {
            Ok(()) => {
                for (partition, entry) in recorded.iter().zip(&entries) {
                    partition
                        .checkpointed_high_watermark
                        .store(entry.high_watermark, Ordering::Relaxed);
                }
                if was_failing {
                    info!(
                        partitions = entries.len(),
                        "high-watermark checkpoint works again"
                    );
                }
            }
            Err(e) if !was_failing => {
                warn!(error = %e, file = %hw_checkpoint::path(&self.data_dir).display(), "high-watermark checkpoint failed; retried every interval, logged again when it works")
            }
            Err(e) => debug!(error = %e, "high-watermark checkpoint failed again"),
        }
    }

    pub fn enforce_retention(&self, now_ms: i64) {
        for partition in self.all() {
            match partition.enforce_retention(now_ms) {
                Ok(0) => {}
                Ok(deleted) => {
                    info!(partition = %partition.name(), segments = deleted, "retention deleted segments")
                }
                Err(e) => warn!(partition = %partition.name(), error = %e, "retention failed"),
            }
        }
    }

    /// Clean shutdown of every log: flush, producer-state snapshot,
    /// checkpoint; `threads` partitions at a time (mostly fsyncs: thousands
    /// one after another kept a stopping broker for tens of seconds).
    pub fn close_all(&self, threads: usize) {
        let partitions: Vec<Arc<Partition>> = self
            .partitions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, p)| p)
            .collect();
        crate::parallel::for_each_in_parallel(&partitions, threads.max(1), |partition| {
            if let Err(e) = partition.close() {
                warn!(partition = %partition.name(), error = %e, "closing partition failed");
            }
            Ok(())
        });
    }
}

/// Whether a transactional write of `producer_id` at `producer_epoch` may be
/// appended without asking the coordinator: its transaction is already open
/// in this log at that epoch, or the coordinator verified it and the
/// verification is still waiting for its first write.
fn txn_admitted(
    log: &PartitionLog,
    verified: &HashMap<i64, i16>,
    producer_id: i64,
    producer_epoch: i16,
) -> bool {
    let open = log
        .producer_state()
        .get(producer_id)
        .is_some_and(|e| e.current_txn_first_offset.is_some() && e.epoch == producer_epoch);
    open || verified.get(&producer_id) == Some(&producer_epoch)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use samsa_storage::testing::simple_batch;
    use std::collections::BTreeMap;
    use uuid::Uuid;

    const NOW: i64 = 1_700_000_000_000;

    fn manager(data_dir: &Path) -> ReplicaManager {
        ReplicaManager::new(
            data_dir.to_path_buf(),
            LogConfig::default(),
            Default::default(),
            samsa_metrics::partitions::PartitionMetrics::register(&mut Default::default()),
        )
    }

    /// Partition 0 of topic `t`, replication factor 3, opened (or
    /// recovered) by `replicas`.
    fn open_replicated(replicas: &ReplicaManager) -> Arc<Partition> {
        let topic = TopicMetadata {
            name: "t".into(),
            topic_id: Uuid::from_u128(7),
            partitions: 1,
            replication_factor: 3,
            configs: BTreeMap::new(),
            partition_states: Vec::new(),
        };
        replicas
            .ensure_partition(&topic, 0, Leadership::SINGLE_NODE, NOW)
            .unwrap()
    }

    /// A replicated partition that is not closed (a crash) comes back with
    /// the HW of the broker's checkpoint file, not the older one of its own
    /// `checkpoint`; after a truncation the file's line no longer applies.
    #[test]
    fn a_partition_key_is_found_by_borrowed_topic_and_index() {
        let mut map: HashMap<(String, i32), i32> = HashMap::new();
        for t in ["", "a", "ab", "topic-with-a-long-name"] {
            for i in [-1, 0, 1, 7, i32::MAX] {
                map.insert((t.to_string(), i), i);
            }
        }
        for t in ["", "a", "ab", "topic-with-a-long-name"] {
            for i in [-1, 0, 1, 7, i32::MAX] {
                assert_eq!(map.get(&(t, i) as &dyn TopicIndex), Some(&i), "{t}-{i}");
            }
        }
        assert_eq!(map.get(&("b", 0) as &dyn TopicIndex), None);
        assert_eq!(map.get(&("a", 2) as &dyn TopicIndex), None);
        assert_eq!(map.remove(&("ab", 7) as &dyn TopicIndex), Some(7));
        assert_eq!(map.len(), 19);
    }

    #[test]
    fn a_replicated_partition_reopens_with_the_hw_of_the_broker_file_under_its_generation() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let p = open_replicated(&replicas);
        p.with_log(|log| {
            for _ in 0..4 {
                log.append_as_leader(&simple_batch(5, NOW), 0, NOW)?;
            }
            log.flush()?;
            log.set_high_watermark(15)?;
            Ok(())
        })
        .unwrap();
        replicas.checkpoint_high_watermarks();
        let saved = hw_checkpoint::read(dir.path()).unwrap();
        let generation = p.with_log(|log| Ok(log.generation())).unwrap();
        assert_eq!(saved[&("t".to_string(), 0)], (generation, 15));
        drop((p, replicas));

        let replicas = manager(dir.path());
        let p = open_replicated(&replicas);
        assert_eq!(p.with_log(|log| Ok(log.high_watermark())).unwrap(), 15);
        // Truncated below the recorded HW, not checkpointed since: the file's
        // line is of an older generation and the reopened log keeps its own.
        p.with_log(|log| log.truncate_to(10, NOW)).unwrap();
        drop((p, replicas));
        let replicas = manager(dir.path());
        let p = open_replicated(&replicas);
        assert_eq!(p.with_log(|log| Ok(log.high_watermark())).unwrap(), 10);
    }

    /// Nothing moved, nothing written: an idle broker does no disk work.
    #[test]
    fn the_file_is_written_only_when_a_high_watermark_moved() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let p = open_replicated(&replicas);
        replicas.checkpoint_high_watermarks();
        assert!(!hw_checkpoint::path(dir.path()).exists());
        p.with_log(|log| {
            log.append_as_leader(&simple_batch(2, NOW), 0, NOW)?;
            log.set_high_watermark(2)?;
            Ok(())
        })
        .unwrap();
        replicas.checkpoint_high_watermarks();
        let written = std::fs::metadata(hw_checkpoint::path(dir.path())).unwrap();
        std::fs::remove_file(hw_checkpoint::path(dir.path())).unwrap();
        replicas.checkpoint_high_watermarks();
        assert!(written.len() > 0);
        assert!(!hw_checkpoint::path(dir.path()).exists());
    }
}
