//! Replication state of one hosted partition and the operations on it that
//! must happen under the log's lock: leader appends that advance the HW,
//! serving a follower's fetch, a follower's appends and truncations, and ISR
//! changes.
//!
//! This is the second `impl Partition` site (the first, in `replica.rs`,
//! holds what the request paths call): every `Partition` method that takes
//! the [`ReplicaState`] lock is here, so the lock order and the rule that
//! moves the HW (the minimum LEO over the maximal ISR, `hw_bound`) are read
//! in one file.
//!
//! Lock order: the partition's log mutex first, then [`ReplicaState`]'s.

use kafka_protocol::error::ResponseError;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use samsa_storage::{AppendInfo, PartitionLog};
use tracing::{debug, error, info};
use uuid::Uuid;

use super::epoch_cache::{EpochEnd, LeaderEpochCache};
use super::session::SessionClock;
use crate::error::PartitionError;
use crate::metadata::PartitionState;
use crate::replica::Partition;

/// What a leader append wrote, and the log start offset after it (produce
/// answers carry it).
#[derive(Debug, Clone)]
pub struct LeaderAppend {
    pub info: AppendInfo,
    pub log_start_offset: i64,
}

/// The ISR's size against `min.insync.replicas`, as one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InSyncReplicas {
    pub count: usize,
    pub min: usize,
}

impl InSyncReplicas {
    /// acks=all cannot be satisfied: NOT_ENOUGH_REPLICAS.
    pub fn below_min(self) -> bool {
        self.count < self.min
    }
}

/// A leader's view of its replicas, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationFigures {
    pub replicas: usize,
    pub in_sync: usize,
    pub min_in_sync: usize,
    pub followers: Vec<FollowerLag>,
}

/// How far one follower is behind its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerLag {
    pub replica: i32,
    /// Leader log end offset minus the follower's, as of its last fetch.
    pub records: i64,
    /// Time since the follower last had everything the leader had (Kafka's
    /// replica.lag.time.max.ms measure); 0 while it is caught up.
    pub millis: i64,
}

/// What the leader knows of one follower.
#[derive(Debug, Clone)]
pub struct FollowerProgress {
    /// The follower's log end offset as of its last fetch; -1 = unknown.
    pub log_end_offset: i64,
    /// Last time (ms) the follower had everything the leader had.
    pub last_caught_up_ms: i64,
    /// Leader LEO and time of the follower's previous fetch (Kafka's rule:
    /// fetching at least that far means it was caught up at that time).
    prev_fetch_leader_leo: i64,
    prev_fetch_ms: i64,
    /// The fetch session that holds this partition, when the follower's
    /// last fetch of it came through one: a session's later fetches count
    /// as fetches of this partition too, though the leader does not look
    /// at a partition that has nothing new (see [`super::session`]).
    session: Option<Arc<SessionClock>>,
}

impl FollowerProgress {
    fn new(now_ms: i64) -> Self {
        FollowerProgress {
            log_end_offset: -1,
            last_caught_up_ms: now_ms,
            prev_fetch_leader_leo: i64::MAX,
            prev_fetch_ms: now_ms,
            session: None,
        }
    }

    /// When the follower last fetched this partition.
    fn fetched_ms(&self) -> i64 {
        self.session.as_ref().map_or(self.prev_fetch_ms, |s| {
            s.last_fetch_ms().max(self.prev_fetch_ms)
        })
    }

    /// When the follower last had everything the leader had, the leader's
    /// log ending at `leader_leo` now: while it still has all of it, its
    /// session's last fetch is such a time.
    pub fn caught_up_ms(&self, leader_leo: i64) -> i64 {
        match &self.session {
            Some(s) if self.log_end_offset >= leader_leo => {
                self.last_caught_up_ms.max(s.last_fetch_ms())
            }
            _ => self.last_caught_up_ms,
        }
    }
}

/// Leader, replicas and ISR of a partition as this broker knows them, the
/// leader-side progress of followers, and the leader-epoch cache.
#[derive(Debug)]
pub struct ReplicaState {
    /// This broker.
    pub me: i32,
    pub topic_id: Uuid,
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub replicas: Vec<i32>,
    /// Replicas a reassignment is adding (their catch-up is throttled).
    pub adding_replicas: Vec<i32>,
    /// Committed ISR. Empty while unknown: then this replica counts as alone
    /// (single-node semantics: HW = LEO).
    pub isr: Vec<i32>,
    /// An ISR proposed to the controller and not yet answered. Expansions
    /// count for the HW at once (the maximal ISR), shrinks only once committed.
    pub pending_isr: Option<Vec<i32>>,
    /// `min.insync.replicas` of the topic.
    pub min_insync_replicas: usize,
    pub followers: HashMap<i32, FollowerProgress>,
    pub epochs: LeaderEpochCache,
}

impl ReplicaState {
    pub fn new(epochs: LeaderEpochCache) -> Self {
        ReplicaState {
            me: -1,
            topic_id: Uuid::nil(),
            leader: -1,
            leader_epoch: 0,
            partition_epoch: -1,
            replicas: Vec::new(),
            adding_replicas: Vec::new(),
            isr: Vec::new(),
            pending_isr: None,
            min_insync_replicas: 1,
            followers: HashMap::new(),
            epochs,
        }
    }

    /// The ISR the HW must respect: committed ∪ pending.
    pub fn maximal_isr(&self) -> Vec<i32> {
        let mut isr = self.isr.clone();
        if let Some(pending) = &self.pending_isr {
            for id in pending {
                if !isr.contains(id) {
                    isr.push(*id);
                }
            }
        }
        isr
    }

    /// What the controller compares for an ISR change of this leader.
    fn alter_context(&self) -> AlterContext {
        AlterContext {
            topic_id: self.topic_id,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
        }
    }

    /// ISR members this leader counts for `min.insync.replicas` (itself included).
    pub fn isr_size(&self) -> usize {
        self.isr.len().max(1)
    }

    /// Leader: every other member of the committed ISR has been silent (no
    /// fetch) since before `silent_since_ms`, and there is at least one. A
    /// leader alone in its ISR (replication factor 1, or after a committed
    /// shrink) is never silent-followed: nobody else could have taken over.
    pub fn isr_followers_silent_since(&self, silent_since_ms: i64) -> bool {
        if self.leader != self.me {
            return false;
        }
        let mut others = self.isr.iter().filter(|id| **id != self.me).peekable();
        others.peek().is_some()
            && others.all(|id| {
                self.followers
                    .get(id)
                    .is_none_or(|f| f.fetched_ms() < silent_since_ms)
            })
    }

    /// The HW the ISR allows: min LEO over the ISR members; `None` while a
    /// member's LEO is unknown.
    fn hw_bound(&self, my_leo: i64) -> Option<i64> {
        let mut bound = my_leo;
        for id in self.maximal_isr() {
            if id == self.me {
                continue;
            }
            let leo = self.followers.get(&id).map_or(-1, |f| f.log_end_offset);
            if leo < 0 {
                return None;
            }
            bound = bound.min(leo);
        }
        Some(bound)
    }
}

/// What a follower asked of one partition.
#[derive(Debug, Clone)]
pub struct ReplicaFetch {
    pub replica_id: i32,
    pub current_leader_epoch: i32,
    pub fetch_offset: i64,
    pub last_fetched_epoch: i32,
    pub max_bytes: usize,
    /// Over the reassignment throttle: answer without records.
    pub throttled: bool,
    /// The fetch session this fetch came through, if any.
    pub session: Option<Arc<SessionClock>>,
}

/// The leader's answer for one partition.
#[derive(Debug, Default)]
pub struct ReplicaFetchAnswer {
    /// Kafka error code, 0 = none.
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// The follower's log diverged: where its last epoch ends here.
    pub diverging: Option<EpochEnd>,
    pub records: Bytes,
    /// The follower qualifies to join the ISR: propose this ISR.
    pub expand_isr_to: Option<Vec<i32>>,
    /// The follower is in the committed ISR.
    pub in_isr: bool,
}

/// Where a follower fetches from, as it tells the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerPosition {
    /// This replica's log end offset.
    pub fetch_offset: i64,
    /// Epoch of its last batch; -1 when it has none.
    pub last_fetched_epoch: i32,
    pub high_watermark: i64,
}

/// The leader a follower fetches from, in the epoch it follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowedLeader {
    pub leader: i32,
    pub leader_epoch: i32,
}

/// What the controller compares before it accepts an ISR change from this
/// leader (each `AlterPartitions` change is a compare-and-set on these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlterContext {
    pub topic_id: Uuid,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

/// An ISR shrink this leader decided on (and marked pending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrShrink {
    pub new_isr: Vec<i32>,
    pub context: AlterContext,
}

impl Partition {
    pub(crate) fn with_log_and_state<T>(
        &self,
        f: impl FnOnce(&mut PartitionLog, &mut ReplicaState) -> Result<T, samsa_storage::StorageError>,
    ) -> Result<T, PartitionError> {
        self.with_log(|log| {
            let mut state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
            f(log, &mut state)
        })
    }

    /// Publishes HW and LEO to their watchers.
    pub(crate) fn publish(&self, high_watermark: i64, log_end_offset: i64) {
        let hw_moved = self.high_watermark.send_if_modified(|current| {
            if high_watermark > *current {
                *current = high_watermark;
                true
            } else {
                false
            }
        });
        let log_end_moved = self.log_end.send_if_modified(|current| {
            if log_end_offset != *current {
                *current = log_end_offset;
                true
            } else {
                false
            }
        });
        if hw_moved || log_end_moved {
            self.note_replication_news();
        }
        // After the news count moved: a session woken by its bell must not
        // find the partition still settled.
        if hw_moved {
            self.ring_high_watermark_bells();
        }
    }

    /// Leader append: records the epoch's start before writing (so the
    /// epoch checkpoint is never behind the log), appends, and advances the
    /// HW as far as the ISR allows (to the LEO when this replica is alone).
    pub(crate) fn append_as_leader_replicated(
        &self,
        records: &[u8],
        now_ms: i64,
    ) -> Result<LeaderAppend, PartitionError> {
        self.leader_append_with(|log, epoch| Ok(Ok(log.append_as_leader(records, epoch, now_ms)?)))
    }

    /// The one leader write path (produce batches and transaction markers):
    /// under the log and replication locks, checks that this replica still
    /// leads in the epoch it was admitted under, records the epoch's start,
    /// runs `write` (which may refuse with a [`PartitionError`] of its own
    /// before touching the log), advances the HW and publishes it.
    pub(crate) fn leader_append_with(
        &self,
        write: impl FnOnce(
            &mut PartitionLog,
            i32,
        )
            -> Result<Result<AppendInfo, PartitionError>, samsa_storage::StorageError>,
    ) -> Result<LeaderAppend, PartitionError> {
        let span = tracing::debug_span!(
            target: crate::trace::TARGET,
            "append",
            topic = %self.topic,
            partition = self.index,
            base_offset = tracing::field::Empty,
            last_offset = tracing::field::Empty,
        )
        .entered();
        let result = self.leader_append_unrecorded(write);
        if let Ok(appended) = &result {
            span.record("base_offset", appended.info.base_offset);
            span.record("last_offset", appended.info.last_offset);
        }
        self.note_write(&result);
        result
    }

    fn leader_append_unrecorded(
        &self,
        write: impl FnOnce(
            &mut PartitionLog,
            i32,
        )
            -> Result<Result<AppendInfo, PartitionError>, samsa_storage::StorageError>,
    ) -> Result<LeaderAppend, PartitionError> {
        let epoch = self.leader_epoch();
        let appended = self.with_log_and_state(|log, state| {
            // Checked under the log lock: the metadata may have moved
            // leadership away since the caller looked it up, and a former
            // leader's append would be a write no ISR will ever hold.
            if !self.is_leader() || state.leader != state.me || state.leader_epoch != epoch {
                return Ok(None);
            }
            // Durable before the batch that starts the epoch (see epoch_cache).
            let epochs_path = state.epochs.path().to_path_buf();
            state
                .epochs
                .assign(epoch, log.log_end_offset())
                .map_err(|source| samsa_storage::StorageError::Io {
                    path: epochs_path,
                    source,
                })?;
            let info = match write(log, epoch)? {
                Ok(info) => info,
                Err(refused) => return Ok(Some(Err(refused))),
            };
            let leo = log.log_end_offset();
            if let Some(bound) = state.hw_bound(leo) {
                log.set_high_watermark(bound)?;
            }
            Ok(Some(Ok((
                info,
                log.high_watermark(),
                leo,
                log.log_start_offset(),
            ))))
        })?;
        let (info, hw, leo, log_start_offset) = match appended {
            None => {
                return Err(PartitionError::RoleChanged {
                    partition: self.name(),
                    role: "the leader",
                    leader_epoch: epoch,
                })
            }
            Some(result) => result?,
        };
        self.publish(hw, leo);
        Ok(LeaderAppend {
            info,
            log_start_offset,
        })
    }

    /// Applies the partition's leader/replicas/ISR from a metadata image.
    /// A newer leader epoch resets what is known of followers; an image
    /// older than an ISR change this leader already saw committed is ignored.
    pub(crate) fn set_replica_set(
        &self,
        me: i32,
        topic_id: Uuid,
        info: &PartitionState,
        min_insync_replicas: usize,
        now_ms: i64,
    ) {
        let mut state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        let before = (state.leader, state.leader_epoch, state.partition_epoch);
        state.me = me;
        state.topic_id = topic_id;
        state.min_insync_replicas = min_insync_replicas.max(1);
        if info.leader_epoch != state.leader_epoch || info.leader != state.leader {
            state.followers.clear();
            state.pending_isr = None;
        }
        state.leader = info.leader;
        state.leader_epoch = info.leader_epoch;
        if info.partition_epoch >= state.partition_epoch {
            state.partition_epoch = info.partition_epoch;
            state.replicas = info.replicas.clone();
            state.adding_replicas = info.adding_replicas.clone();
            state.isr = info.isr.clone();
            // A reassignment removed some: their progress no longer counts.
            let ReplicaState {
                followers,
                replicas,
                ..
            } = &mut *state;
            followers.retain(|id, _| replicas.contains(id));
        }
        if info.leader == me {
            for id in state.replicas.clone() {
                if id != me {
                    state
                        .followers
                        .entry(id)
                        .or_insert_with(|| FollowerProgress::new(now_ms));
                }
            }
        }
        let changed = before != (state.leader, state.leader_epoch, state.partition_epoch);
        drop(state);
        if changed {
            self.note_replication_news();
        }
    }

    /// An ISR change committed by the controller (its answer in `AlterPartitions`).
    pub(crate) fn isr_committed(&self, leader_epoch: i32, partition_epoch: i32, isr: Vec<i32>) {
        let (hw, leo) = {
            let mut guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let Some(log) = guard.as_mut() else { return };
            let mut state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
            state.pending_isr = None;
            if state.leader_epoch != leader_epoch || partition_epoch < state.partition_epoch {
                return;
            }
            state.partition_epoch = partition_epoch;
            self.meters.isr_changed(state.isr.len(), isr.len());
            state.isr = isr;
            let leo = log.log_end_offset();
            if let Some(bound) = state.hw_bound(leo) {
                // Nobody waits on this answer: the refusal (a bug) is logged
                // here, and the HW stays where it was.
                if let Err(e) = log.set_high_watermark(bound) {
                    error!(partition = %self.name(), error = %e, "ISR change: high watermark refused");
                }
            }
            (log.high_watermark(), leo)
        };
        self.publish(hw, leo);
        self.note_replication_news();
    }

    /// Serves one partition of a follower's fetch (see `proto/replication.proto`).
    pub(crate) fn serve_replica_fetch(&self, req: ReplicaFetch, now_ms: i64) -> ReplicaFetchAnswer {
        let result = self.with_log_and_state(|log, state| {
            let leadership = self.leadership();
            let mut answer = ReplicaFetchAnswer {
                high_watermark: log.high_watermark(),
                log_start_offset: log.log_start_offset(),
                log_end_offset: log.log_end_offset(),
                ..ReplicaFetchAnswer::default()
            };
            if !leadership.is_leader || !state.replicas.contains(&req.replica_id) {
                answer.error_code = ResponseError::NotLeaderOrFollower.code();
                return Ok(answer);
            }
            if req.current_leader_epoch < leadership.leader_epoch {
                answer.error_code = ResponseError::FencedLeaderEpoch.code();
                return Ok(answer);
            }
            if req.current_leader_epoch > leadership.leader_epoch {
                answer.error_code = ResponseError::UnknownLeaderEpoch.code();
                return Ok(answer);
            }
            let leo = log.log_end_offset();
            if req.last_fetched_epoch >= 0 {
                let end = state.epochs.end_offset_for(req.last_fetched_epoch, leo);
                if end.epoch < req.last_fetched_epoch || end.end_offset < req.fetch_offset {
                    answer.diverging = Some(EpochEnd {
                        epoch: end.epoch,
                        end_offset: end.end_offset.max(log.log_start_offset()),
                    });
                    return Ok(answer);
                }
            }
            if req.fetch_offset < log.log_start_offset() || req.fetch_offset > leo {
                answer.error_code = ResponseError::OffsetOutOfRange.code();
                return Ok(answer);
            }
            let progress = state
                .followers
                .entry(req.replica_id)
                .or_insert_with(|| FollowerProgress::new(now_ms));
            progress.log_end_offset = req.fetch_offset;
            if req.fetch_offset >= leo {
                progress.last_caught_up_ms = now_ms;
            } else if req.fetch_offset >= progress.prev_fetch_leader_leo {
                // A session's fetches since count: the leader would have
                // looked at this partition had it moved before them.
                progress.last_caught_up_ms = progress.last_caught_up_ms.max(progress.fetched_ms());
            }
            progress.prev_fetch_leader_leo = leo;
            progress.prev_fetch_ms = now_ms;
            progress.session = req.session;
            if let Some(bound) = state.hw_bound(leo) {
                log.set_high_watermark(bound)?;
            }
            let hw = log.high_watermark();
            answer.high_watermark = hw;
            // Join the ISR once caught up to the HW and into this epoch
            // (KIP-101: a follower must have this leader's first batch or
            // reach its start, or an acknowledged suffix could go missing).
            let epoch_start = state
                .epochs
                .entries()
                .last()
                .filter(|e| e.epoch == leadership.leader_epoch)
                .map_or(leo, |e| e.start_offset);
            answer.in_isr = state.isr.contains(&req.replica_id);
            if state.pending_isr.is_none()
                && !answer.in_isr
                && req.fetch_offset >= hw
                && req.fetch_offset >= epoch_start.min(leo)
            {
                let mut isr = state.isr.clone();
                isr.push(req.replica_id);
                state.pending_isr = Some(isr.clone());
                answer.expand_isr_to = Some(isr);
            }
            if !req.throttled {
                answer.records = log.read(req.fetch_offset, req.max_bytes, leo)?.records;
            }
            Ok(answer)
        });
        match result {
            Ok(answer) => {
                self.publish(answer.high_watermark, answer.log_end_offset);
                answer
            }
            Err(e) => {
                debug!(partition = %self.name(), error = %e, "replica fetch failed");
                ReplicaFetchAnswer {
                    error_code: match e {
                        PartitionError::Storage(ref s) => {
                            crate::error::storage_error_code(s).code()
                        }
                        _ => ResponseError::NotLeaderOrFollower.code(),
                    },
                    ..ReplicaFetchAnswer::default()
                }
            }
        }
    }

    /// Leader: `replica_id`'s fetch session `clock` no longer holds this
    /// partition; only fetches that name it count from now on.
    pub(crate) fn forget_fetch_session(&self, replica_id: i32, clock: &Arc<SessionClock>) {
        let mut state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(progress) = state.followers.get_mut(&replica_id) {
            if progress
                .session
                .as_ref()
                .is_some_and(|s| Arc::ptr_eq(s, clock))
            {
                progress.prev_fetch_ms = progress.fetched_ms();
                progress.last_caught_up_ms = progress.caught_up_ms(*self.log_end.borrow());
                progress.session = None;
            }
        }
    }

    /// Follower: what to send the leader.
    pub(crate) fn follower_position(&self) -> Result<FollowerPosition, PartitionError> {
        self.with_log_and_state(|log, state| {
            Ok(FollowerPosition {
                fetch_offset: log.log_end_offset(),
                last_fetched_epoch: state
                    .epochs
                    .last_epoch_below(log.log_end_offset())
                    .unwrap_or(-1),
                high_watermark: log.high_watermark(),
            })
        })
    }

    /// Follower: appends records fetched from the leader (they carry their
    /// offsets and epochs) and takes the leader's HW, capped at this LEO.
    /// Records not starting at this log's end (a stale answer) are ignored.
    pub(crate) fn append_from_leader(
        &self,
        leader_epoch: i32,
        fetch_offset: i64,
        records: &[u8],
        leader_hw: i64,
        leader_log_start: i64,
        now_ms: i64,
    ) -> Result<(), PartitionError> {
        let result = self.append_from_leader_unrecorded(
            leader_epoch,
            fetch_offset,
            records,
            leader_hw,
            leader_log_start,
            now_ms,
        );
        if !records.is_empty() || result.is_err() {
            self.note_write(&result);
        }
        result
    }

    fn append_from_leader_unrecorded(
        &self,
        leader_epoch: i32,
        fetch_offset: i64,
        records: &[u8],
        leader_hw: i64,
        leader_log_start: i64,
        now_ms: i64,
    ) -> Result<(), PartitionError> {
        let (hw, leo) = self.with_log_and_state(|log, state| {
            if !self.follows_under_lock(state, leader_epoch) {
                return Ok((log.high_watermark(), log.log_end_offset()));
            }
            if log.log_end_offset() != fetch_offset {
                return Ok((log.high_watermark(), log.log_end_offset()));
            }
            if !records.is_empty() {
                let epochs_path = state.epochs.path().to_path_buf();
                state.epochs.observe_batches(records).map_err(|source| {
                    samsa_storage::StorageError::Io {
                        path: epochs_path,
                        source,
                    }
                })?;
                log.append_as_follower(records, now_ms)?;
            }
            // The leader's HW may be ahead of what this replica has fetched
            // yet: what is committed here is at most what it holds.
            log.set_high_watermark(leader_hw.min(log.log_end_offset()))?;
            // Records the leader deleted (DeleteRecords) go here too, as far
            // as this replica's high watermark.
            let start = leader_log_start.min(log.high_watermark());
            if start > log.log_start_offset() {
                log.delete_records_before(start)?;
            }
            Ok((log.high_watermark(), log.log_end_offset()))
        })?;
        self.publish(hw, leo);
        Ok(())
    }

    /// Follower: cuts the divergent suffix at `offset` (never below the log
    /// start: then the log restarts empty there).
    pub(crate) fn truncate_divergent(
        &self,
        leader_epoch: i32,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), PartitionError> {
        let (hw, leo) = self.with_log_and_state(|log, state| {
            if self.follows_under_lock(state, leader_epoch) && offset < log.log_end_offset() {
                info!(partition = %self.name(), from = log.log_end_offset(), to = offset, "truncating a divergent suffix");
                log.truncate_to(offset, now_ms)?;
                state.epochs.truncate_from_end(log.log_end_offset());
            }
            Ok((log.high_watermark(), log.log_end_offset()))
        })?;
        self.log_end.send_replace(leo);
        self.publish(hw, leo);
        self.note_replication_news();
        Ok(())
    }

    /// Follower: the leader's log starts past this one's end; restart empty there.
    pub(crate) fn restart_at(
        &self,
        leader_epoch: i32,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), PartitionError> {
        let (hw, leo) = self.with_log_and_state(|log, state| {
            if !self.follows_under_lock(state, leader_epoch) {
                return Ok((log.high_watermark(), log.log_end_offset()));
            }
            info!(partition = %self.name(), offset, "the leader's log starts later; restarting this replica's log there");
            log.truncate_fully_and_start_at(offset, now_ms)?;
            state.epochs.clear();
            Ok((log.high_watermark(), log.log_end_offset()))
        })?;
        self.log_end.send_replace(leo);
        self.publish(hw, leo);
        self.note_replication_news();
        Ok(())
    }

    /// Leader: ISR members other than itself that have not caught up for
    /// `lag_max_ms`; the ISR without them if there are any and no change is
    /// pending (it is pending from now on).
    pub(crate) fn lagging_isr(&self, lag_max_ms: i64, now_ms: i64) -> Option<IsrShrink> {
        if !self.is_leader() {
            return None;
        }
        let mut state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        if state.pending_isr.is_some() || state.leader != state.me {
            return None;
        }
        let me = state.me;
        let leo = *self.log_end.borrow();
        let keep: Vec<i32> = state
            .isr
            .iter()
            .copied()
            .filter(|id| {
                *id == me
                    || state
                        .followers
                        .get(id)
                        .is_some_and(|f| now_ms - f.caught_up_ms(leo) <= lag_max_ms)
            })
            .collect();
        if keep.len() == state.isr.len() || !keep.contains(&me) {
            return None;
        }
        state.pending_isr = Some(keep.clone());
        Some(IsrShrink {
            new_isr: keep,
            context: state.alter_context(),
        })
    }

    /// Leader: the ISR change it proposed failed; it may propose again.
    pub(crate) fn isr_change_failed(&self) {
        self.replication
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending_isr = None;
        // A follower that qualified meanwhile is proposed again at its next look.
        self.note_replication_news();
    }

    /// What a leader reports of its replicas when scraped: replicas, ISR
    /// and `min.insync.replicas`, and each follower's lag behind
    /// `leader_leo` in records and in time since it last had everything.
    pub(crate) fn replication_figures(&self, leader_leo: i64, now_ms: i64) -> ReplicationFigures {
        let state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        let followers = state
            .replicas
            .iter()
            .filter(|&&id| id != state.me)
            .map(|&id| {
                let (records, millis) = match state.followers.get(&id) {
                    Some(f) if f.log_end_offset >= 0 => (
                        (leader_leo - f.log_end_offset).max(0),
                        (now_ms - f.caught_up_ms(leader_leo)).max(0),
                    ),
                    // Never fetched since this leader took over: all of
                    // the log may be missing.
                    _ => (leader_leo, 0),
                };
                FollowerLag {
                    replica: id,
                    records,
                    millis,
                }
            })
            .collect();
        ReplicationFigures {
            // A single node's partitions list no replicas: just itself.
            replicas: state.replicas.len().max(1),
            in_sync: state.isr_size(),
            min_in_sync: state.min_insync_replicas,
            followers,
        }
    }

    /// The ISR's size and `min.insync.replicas`, read together, for
    /// acks=all checks.
    pub(crate) fn in_sync_replicas(&self) -> InSyncReplicas {
        let state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        InSyncReplicas {
            count: state.isr_size(),
            min: state.min_insync_replicas,
        }
    }

    /// This broker leads the partition by its metadata but has lost the
    /// controller for a session timeout and every in-sync follower has been
    /// silent for as long (see [`crate::controller_contact`]): the
    /// controller has most likely fenced it and elected another leader, so
    /// it must not act as the leader. Takes the replication lock only while
    /// contact is lost.
    pub fn leadership_in_doubt_now(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        let now = crate::now_ms();
        self.controller_contact.lost(now).is_some_and(|session_ms| {
            self.replication
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .isr_followers_silent_since(now.saturating_sub(session_ms))
        })
    }

    /// What the controller must see to accept an ISR change from this leader.
    pub(crate) fn alter_context(&self) -> AlterContext {
        self.replication
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alter_context()
    }

    /// Whether this replica still follows in `leader_epoch`; called with the
    /// log and replication locks held, so a fetch answer is applied only by
    /// the follower of the epoch it was asked under (a leadership change
    /// between the fetch and its answer drops the answer).
    fn follows_under_lock(&self, state: &ReplicaState, leader_epoch: i32) -> bool {
        let leadership = self.leadership();
        !leadership.is_leader
            && leadership.leader_epoch == leader_epoch
            && state.leader_epoch == leader_epoch
            && state.leader != state.me
    }

    /// Follower: the leader to fetch from and the epoch to present, if this
    /// broker follows the partition.
    pub(crate) fn followed_leader(&self) -> Option<FollowedLeader> {
        let leadership = self.leadership();
        if leadership.is_leader {
            return None;
        }
        let state = self.replication.lock().unwrap_or_else(|p| p.into_inner());
        (state.leader >= 0 && state.leader != state.me && state.replicas.contains(&state.me))
            .then_some(FollowedLeader {
                leader: state.leader,
                leader_epoch: state.leader_epoch,
            })
    }

    /// Whether a reassignment is adding `replica` to this partition (its
    /// catch-up is reassignment traffic, throttled).
    pub(crate) fn is_adding(&self, replica: i32) -> bool {
        self.replication
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .adding_replicas
            .contains(&replica)
    }

    /// Follower: where `epoch` ends in this log (the log end when it does
    /// not know that epoch or any older one).
    pub(crate) fn own_epoch_end(&self, epoch: i32) -> Result<i64, PartitionError> {
        self.with_log_and_state(|log, state| {
            let leo = log.log_end_offset();
            let end = state.epochs.end_offset_for(epoch, leo);
            Ok(if end.epoch < 0 {
                leo
            } else {
                end.end_offset.min(leo)
            })
        })
    }

    /// OffsetForLeaderEpoch (KIP-101, KIP-320): where leader epoch
    /// `requested` ends in this replica's log, as Kafka's leader epoch
    /// cache answers it: the current epoch (the leadership's, or the
    /// latest known) ends at the log end; an older one at the start of the
    /// next known epoch, named by the largest known epoch not newer than it
    /// (by `requested` itself when it predates every known epoch); one
    /// newer than any known is UNKNOWN (-1, -1).
    pub fn epoch_end_offset(&self, requested: i32) -> Result<EpochEnd, PartitionError> {
        let leader_epoch = self.leader_epoch();
        self.with_log_and_state(|log, state| {
            let leo = log.log_end_offset();
            let latest = state.epochs.latest_epoch().unwrap_or(-1).max(leader_epoch);
            if requested < 0 || requested > latest {
                return Ok(EpochEnd::UNKNOWN);
            }
            if requested == latest {
                return Ok(EpochEnd {
                    epoch: requested,
                    end_offset: leo,
                });
            }
            let entries = state.epochs.entries();
            let next_start = entries
                .iter()
                .find(|e| e.epoch > requested)
                .map_or(leo, |e| e.start_offset);
            let epoch = entries
                .iter()
                .rev()
                .find(|e| e.epoch <= requested)
                .map_or(requested, |e| e.epoch);
            Ok(EpochEnd {
                epoch,
                end_offset: next_start,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader_of(isr: &[i32]) -> ReplicaState {
        let mut state = ReplicaState::new(LeaderEpochCache::in_memory(Vec::new()));
        state.me = 1;
        state.leader = 1;
        state.replicas = vec![1, 2, 3];
        state.isr = isr.to_vec();
        state
    }

    fn fetched_at(state: &mut ReplicaState, follower: i32, at_ms: i64) {
        let progress = state
            .followers
            .entry(follower)
            .or_insert_with(|| FollowerProgress::new(at_ms));
        progress.prev_fetch_ms = at_ms;
    }

    #[test]
    fn followers_are_silent_only_when_every_other_isr_member_is() {
        let mut state = leader_of(&[1, 2, 3]);
        fetched_at(&mut state, 2, 1_000);
        fetched_at(&mut state, 3, 5_000);
        assert!(!state.isr_followers_silent_since(2_000), "3 fetched since");
        assert!(state.isr_followers_silent_since(6_000));
        // A follower that never fetched in this leadership is silent.
        state.followers.remove(&3);
        assert!(state.isr_followers_silent_since(2_000));
    }

    #[test]
    fn a_leader_alone_in_its_isr_or_a_follower_is_never_in_doubt() {
        let state = leader_of(&[1]);
        assert!(!state.isr_followers_silent_since(i64::MAX));
        let mut state = leader_of(&[1, 2]);
        state.leader = 2;
        assert!(!state.isr_followers_silent_since(i64::MAX));
    }
}
