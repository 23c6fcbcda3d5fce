//! Replica fetch sessions: KIP-227's idea on samsa's replication protocol
//! (`proto/replication.proto`). After one full fetch, a follower names only
//! the partitions whose fetch state changed, and the leader answers only
//! the partitions with news, so a round in which nothing moved costs the
//! same at any number of followed partitions.
//!
//! Leader side ([`LeaderSession`], one per follower broker in
//! [`FetchSessions`]): what the follower last said of each partition, what
//! it was last told, and whether the partition is *settled*: the follower
//! has everything, is in the ISR and was told the HW and log start. While
//! the partition's news count ([`Partition::replication_news`]) stays where
//! it was when it settled, serving it again would answer nothing and change
//! nothing but the follower's fetch time, so the leader does not look at it.
//! That fetch time is carried by the session's [`SessionClock`], ticked by
//! every fetch of the session: the leader's progress of a follower refers
//! to the clock, so a settled follower keeps counting as fetching and as
//! caught up (`FollowerProgress::caught_up_ms`), and stops counting when
//! its session stops fetching or forgets the partition.
//!
//! Follower side ([`FollowerSession`]): what it last told the leader of
//! each partition, by name.
//!
//! Invariants:
//! - after every answered fetch the two sides agree on the session's
//!   partitions and their fetch state; any failure (an RPC error, a session
//!   or epoch the leader does not know) ends the session: the follower's
//!   next fetch is full, and a full fetch that opens a session replaces the
//!   leader's session of that follower;
//! - a partition is answered whenever serving it tells the follower
//!   something: records, a divergence, an error not answered before, a HW
//!   or log start it was not told;
//! - a partition with news is served in the round that sees the news
//!   (every change that could alter an answer counts as news: HW, log end,
//!   leadership, replica set, ISR).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kafka_protocol::error::ResponseError;
use samsa_proto::replication::{EpochEndOffset, FetchPartition, PartitionData, PartitionRef};

use super::state::ReplicaFetch;
use super::throttle::ByteRate;
use crate::replica::{Partition, ReplicaManager};

/// Replication news on this broker: every partition's
/// [`Partition::note_replication_news`] posts here. Held fetches wait on
/// it; a follower whose count has not moved since its last fetch has
/// nothing new to tell any leader.
#[derive(Default)]
pub struct NewsBoard {
    posted: AtomicU64,
    notify: tokio::sync::Notify,
}

impl NewsBoard {
    pub fn post(&self) {
        self.posted.fetch_add(1, Ordering::AcqRel);
        self.notify.notify_waiters();
    }

    /// How many news were posted.
    pub fn posted(&self) -> u64 {
        self.posted.load(Ordering::Acquire)
    }

    /// Completes at the next post after it is enabled (or first polled).
    pub fn next_post(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}

/// When a session last fetched, shared with the progress of every
/// partition it holds.
#[derive(Debug)]
pub struct SessionClock(AtomicI64);

impl SessionClock {
    fn new(now_ms: i64) -> Self {
        SessionClock(AtomicI64::new(now_ms))
    }

    pub fn tick(&self, now_ms: i64) {
        self.0.fetch_max(now_ms, Ordering::AcqRel);
    }

    pub fn last_fetch_ms(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }
}

/// One partition of a leader's session.
pub struct SessionEntry {
    /// What the follower last said of it.
    pub asked: FetchPartition,
    /// The partition as this broker hosts it (`None`: it does not).
    pub partition: Option<Arc<Partition>>,
    /// The partition's news count when it last settled.
    settled_at: Option<u64>,
    told_high_watermark: i64,
    told_log_start: i64,
    told_error: i32,
}

/// What one served partition told, applied to its entry once the answer
/// is sent (an answer built and then dropped for a newer look told nothing).
pub struct Told {
    pub entry: usize,
    pub high_watermark: i64,
    pub log_start: i64,
    pub error: i32,
    /// The news count the answer was built at, if it left the partition settled.
    pub settled_at: Option<u64>,
}

/// A leader's view of one follower's session.
pub struct LeaderSession {
    /// 0 for the one-fetch view of a fetch that opened no session.
    pub id: u32,
    next_epoch: i32,
    /// `None` for the one-fetch view: its follower's progress then counts
    /// only the fetches that named the partition.
    pub clock: Option<Arc<SessionClock>>,
    pub entries: Vec<SessionEntry>,
    index: HashMap<(String, i32), usize>,
    /// [`ReplicaManager::generation`] when the entries' partitions were looked up.
    generation: u64,
}

impl LeaderSession {
    /// A session (or, with `id` 0, the view of one full fetch) of the
    /// partitions a full fetch named.
    pub fn new(
        id: u32,
        partitions: Vec<FetchPartition>,
        replicas: &ReplicaManager,
        now_ms: i64,
    ) -> Self {
        let mut session = LeaderSession {
            id,
            next_epoch: 1,
            clock: (id != 0).then(|| Arc::new(SessionClock::new(now_ms))),
            entries: Vec::with_capacity(partitions.len()),
            index: HashMap::new(),
            generation: replicas.generation(),
        };
        for asked in partitions {
            session.upsert(asked, replicas);
        }
        session
    }

    /// Whether `epoch` is the one this session expects next.
    pub fn expects(&self, epoch: i32) -> bool {
        epoch == self.next_epoch
    }

    /// Applies an incremental fetch: drops what it forgets, then takes what
    /// it names (new partitions and changed fetch states).
    pub fn update(
        &mut self,
        partitions: Vec<FetchPartition>,
        forgotten: &[PartitionRef],
        replica_id: i32,
        replicas: &ReplicaManager,
    ) {
        self.next_epoch = self.next_epoch.wrapping_add(1).max(1);
        for gone in forgotten {
            let Some(at) = self.index.remove(&(gone.topic.clone(), gone.partition)) else {
                continue;
            };
            let entry = self.entries.swap_remove(at);
            if let (Some(partition), Some(clock)) = (&entry.partition, &self.clock) {
                partition.forget_fetch_session(replica_id, clock);
            }
            if let Some(moved) = self.entries.get(at) {
                self.index
                    .insert((moved.asked.topic.clone(), moved.asked.partition), at);
            }
        }
        for asked in partitions {
            self.upsert(asked, replicas);
        }
    }

    fn upsert(&mut self, asked: FetchPartition, replicas: &ReplicaManager) {
        let partition = replicas.get(&asked.topic, asked.partition);
        let key = (asked.topic.clone(), asked.partition);
        let entry = SessionEntry {
            asked,
            partition,
            settled_at: None,
            told_high_watermark: -1,
            told_log_start: -1,
            told_error: 0,
        };
        match self.index.get(&key) {
            Some(&at) => self.entries[at] = entry,
            None => {
                self.index.insert(key, self.entries.len());
                self.entries.push(entry);
            }
        }
    }

    /// Looks up again the partitions opened or removed since the last
    /// look (a topic deleted and created again is another partition), all
    /// of them if this broker no longer knows which.
    pub fn look_up_again_if_moved(&mut self, replicas: &ReplicaManager) {
        let generation = replicas.generation();
        if generation == self.generation {
            return;
        }
        let changed: Vec<usize> = match replicas.opened_or_removed_since(self.generation) {
            Some(keys) => keys
                .iter()
                .filter_map(|key| self.index.get(key).copied())
                .collect(),
            None => (0..self.entries.len()).collect(),
        };
        self.generation = generation;
        for at in changed {
            let entry = &mut self.entries[at];
            let now = replicas.get(&entry.asked.topic, entry.asked.partition);
            let same = match (&now, &entry.partition) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                entry.partition = now;
                entry.settled_at = None;
            }
        }
    }

    /// The answer was sent: what it told is now known to the follower.
    pub fn answered(&mut self, told: Vec<Told>) {
        for t in told {
            let e = &mut self.entries[t.entry];
            e.told_high_watermark = t.high_watermark;
            e.told_log_start = t.log_start;
            e.told_error = t.error;
            e.settled_at = t.settled_at;
        }
    }
}

/// The leader's reassignment throttle, as one look at a session uses it.
pub struct LeaderThrottle<'a> {
    /// `leader.replication.throttled.rate`; `None`: no throttle.
    pub rate: Option<u64>,
    pub meter: &'a ByteRate,
}

/// One look at a session's partitions: the answer it would send now.
pub struct Look {
    pub out: Vec<PartitionData>,
    pub told: Vec<Told>,
    /// Records, an error or a divergence to answer at once.
    pub ready: bool,
    /// A HW the follower was not told (answered after `HW_ONLY_LINGER`).
    pub hw_news: bool,
    /// ISR expansions the look found due, to propose to the controller.
    pub expand_isr: Vec<(Arc<Partition>, Vec<i32>)>,
}

impl LeaderSession {
    /// Serves every partition of the session that is not settled or has
    /// news since it settled (all of them in a full fetch), and builds the
    /// answer: every served partition in a full fetch, otherwise those with
    /// something to tell. Partitions served with nothing to tell settle.
    pub fn look(
        &mut self,
        replica_id: i32,
        full: bool,
        max_bytes: usize,
        throttle: LeaderThrottle<'_>,
        now_ms: i64,
    ) -> Look {
        let mut budget = max_bytes;
        let mut look = Look {
            out: Vec::new(),
            told: Vec::new(),
            ready: false,
            hw_news: false,
            expand_isr: Vec::new(),
        };
        for at in 0..self.entries.len() {
            let entry = &mut self.entries[at];
            let fp = &entry.asked;
            let data = || PartitionData {
                topic: fp.topic.clone(),
                partition: fp.partition,
                ..PartitionData::default()
            };
            let Some(partition) = entry.partition.clone() else {
                let error = i32::from(ResponseError::NotLeaderOrFollower.code());
                if full || error != entry.told_error {
                    look.ready = true;
                    look.told.push(Told {
                        entry: at,
                        high_watermark: entry.told_high_watermark,
                        log_start: entry.told_log_start,
                        error,
                        settled_at: None,
                    });
                    look.out.push(PartitionData {
                        error_code: error,
                        ..data()
                    });
                }
                continue;
            };
            let news = partition.replication_news();
            if !full && entry.settled_at == Some(news) {
                continue;
            }
            entry.settled_at = None;
            let reassigning = throttle.rate.is_some() && partition.is_adding(replica_id);
            let throttled = reassigning
                && !throttle
                    .meter
                    .admits(throttle.rate, std::time::Instant::now());
            let answer = partition.serve_replica_fetch(
                ReplicaFetch {
                    replica_id,
                    current_leader_epoch: fp.current_leader_epoch,
                    fetch_offset: fp.fetch_offset,
                    last_fetched_epoch: fp.last_fetched_epoch,
                    max_bytes: budget,
                    throttled,
                    session: self.clock.clone(),
                },
                now_ms,
            );
            if reassigning {
                throttle.meter.spend(answer.records.len());
            }
            budget = budget.saturating_sub(answer.records.len());
            let error = i32::from(answer.error_code);
            // In a full fetch every error is news, as before sessions (the
            // follower backs off when every partition failed); in a
            // session an error is answered once.
            let tells = !answer.records.is_empty()
                || answer.diverging.is_some()
                || (error != 0 && (full || error != entry.told_error));
            let newer_hw = answer.high_watermark > fp.high_watermark.max(entry.told_high_watermark);
            let newer_log_start = answer.log_start_offset != entry.told_log_start;
            look.ready |= tells;
            look.hw_news |= newer_hw;
            let settles = error == 0
                && answer.records.is_empty()
                && answer.diverging.is_none()
                && !throttled
                && answer.expand_isr_to.is_none()
                && answer.in_isr
                && fp.fetch_offset >= answer.log_end_offset;
            if let Some(isr) = answer.expand_isr_to {
                look.expand_isr.push((Arc::clone(&partition), isr));
            }
            if !(full || tells || newer_hw || newer_log_start) {
                if settles {
                    entry.settled_at = Some(news);
                }
                continue;
            }
            look.told.push(Told {
                entry: at,
                high_watermark: answer.high_watermark.max(entry.told_high_watermark),
                log_start: answer.log_start_offset,
                error,
                settled_at: settles.then_some(news),
            });
            look.out.push(PartitionData {
                error_code: error,
                high_watermark: answer.high_watermark,
                log_start_offset: answer.log_start_offset,
                log_end_offset: answer.log_end_offset,
                diverging_epoch: answer.diverging.map(|end| EpochEndOffset {
                    epoch: end.epoch,
                    end_offset: end.end_offset,
                }),
                records: answer.records,
                ..data()
            });
        }
        look
    }
}

/// The sessions a leader keeps: at most one per follower broker.
pub struct FetchSessions {
    next_id: AtomicU32,
    by_follower: Mutex<HashMap<i32, Arc<tokio::sync::Mutex<LeaderSession>>>>,
}

impl Default for FetchSessions {
    fn default() -> Self {
        // Ids differ from a previous run's, so a follower's session from
        // before a restart of this broker is not mistaken for a new one.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos() ^ (d.as_secs() as u32));
        FetchSessions {
            next_id: AtomicU32::new(seed),
            by_follower: Mutex::new(HashMap::new()),
        }
    }
}

impl FetchSessions {
    /// A fresh session id (never 0).
    pub fn new_id(&self) -> u32 {
        loop {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            if id != 0 {
                return id;
            }
        }
    }

    /// Keeps `session` as `replica_id`'s session, replacing any other.
    pub fn insert(&self, replica_id: i32, session: Arc<tokio::sync::Mutex<LeaderSession>>) {
        self.by_follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(replica_id, session);
    }

    /// `replica_id`'s session (the caller checks its id once it holds it).
    pub fn get(&self, replica_id: i32) -> Option<Arc<tokio::sync::Mutex<LeaderSession>>> {
        self.by_follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&replica_id)
            .cloned()
    }
}

/// What a follower last told a leader of one partition.
struct Sent {
    partition: Arc<Partition>,
    asked: FetchPartition,
    /// The round that last found this partition followed.
    seen: u64,
}

/// A follower's side of its session with one leader.
#[derive(Default)]
pub struct FollowerSession {
    /// 0: none; the next fetch is full.
    id: u32,
    next_epoch: i32,
    /// By topic, then partition (a topic name is looked up as `&str`).
    sent: HashMap<String, HashMap<i32, Sent>>,
    round: u64,
    /// The broker's news (partitions opened or removed, news posted) as of
    /// the last fetch built from every followed partition's state, unless
    /// that fetch left a partition out for a while (a back-off or the
    /// throttle) and so must look again.
    built_at: Option<NewsKey>,
}

/// [`ReplicaManager::generation`] and [`NewsBoard::posted`], read together:
/// while neither moves, no followed partition's state changed.
pub type NewsKey = (u64, u64);

/// The partitions and session fields of the next fetch.
pub struct NextFetch {
    pub partitions: Vec<FetchPartition>,
    pub forgotten: Vec<PartitionRef>,
    pub session_id: u32,
    pub session_epoch: i32,
    /// Kept until the answer: what the leader will know once it answers.
    pending: Vec<(Arc<Partition>, FetchPartition)>,
}

impl FollowerSession {
    /// An incremental fetch naming nothing, if nothing changed on this
    /// broker since the last fetch was built at `now` (read before anything
    /// else of the round): then building it again would name nothing.
    pub fn unchanged_fetch(&mut self, now: NewsKey) -> Option<NextFetch> {
        if self.id == 0 || self.built_at != Some(now) {
            return None;
        }
        self.round += 1;
        Some(NextFetch {
            partitions: Vec::new(),
            forgotten: Vec::new(),
            session_id: self.id,
            session_epoch: self.next_epoch,
            pending: Vec::new(),
        })
    }

    /// The next fetch of `followed` (each partition with what to tell the
    /// leader of it), built at `news` (read before the partitions' states),
    /// `complete` unless a partition was left out for a while: all of them
    /// when there is no session, otherwise the changed ones and those no
    /// longer followed.
    pub fn next_fetch(
        &mut self,
        followed: Vec<(Arc<Partition>, FetchPartition)>,
        news: NewsKey,
        complete: bool,
    ) -> NextFetch {
        self.built_at = complete.then_some(news);
        self.round += 1;
        let round = self.round;
        let full = self.id == 0;
        let mut partitions = Vec::new();
        let mut pending = Vec::new();
        for (partition, asked) in followed {
            let known = self
                .sent
                .get_mut(asked.topic.as_str())
                .and_then(|by_index| by_index.get_mut(&asked.partition));
            let unchanged = match known {
                Some(sent) => {
                    sent.seen = round;
                    Arc::ptr_eq(&sent.partition, &partition) && sent.asked == asked
                }
                None => false,
            };
            if full || !unchanged {
                partitions.push(asked.clone());
                pending.push((partition, asked));
            }
        }
        let forgotten = if full {
            Vec::new()
        } else {
            self.sent
                .iter()
                .flat_map(|(topic, by_index)| {
                    by_index
                        .iter()
                        .filter(|(_, sent)| sent.seen != round)
                        .map(|(index, _)| PartitionRef {
                            topic: topic.clone(),
                            partition: *index,
                        })
                })
                .collect()
        };
        NextFetch {
            partitions,
            forgotten,
            session_id: self.id,
            session_epoch: if full { 0 } else { self.next_epoch },
            pending,
        }
    }

    /// The leader answered `fetch`; `session_id` is the answer's.
    pub fn answered(&mut self, fetch: NextFetch, session_id: u32) {
        let round = self.round;
        if fetch.session_id == 0 {
            self.sent.clear();
            self.id = session_id;
            self.next_epoch = 1;
        } else {
            self.next_epoch = self.next_epoch.wrapping_add(1).max(1);
            for gone in &fetch.forgotten {
                if let Some(by_index) = self.sent.get_mut(gone.topic.as_str()) {
                    by_index.remove(&gone.partition);
                    if by_index.is_empty() {
                        self.sent.remove(gone.topic.as_str());
                    }
                }
            }
        }
        for (partition, asked) in fetch.pending {
            self.sent.entry(asked.topic.clone()).or_default().insert(
                asked.partition,
                Sent {
                    partition,
                    asked,
                    seen: round,
                },
            );
        }
    }

    /// The next fetch is built from every followed partition's state, even
    /// if nothing was posted meanwhile.
    pub fn look_again(&mut self) {
        self.built_at = None;
    }

    /// Ends the session: the next fetch is full.
    pub fn reset(&mut self) {
        self.id = 0;
        self.sent.clear();
        self.built_at = None;
    }

    /// The partition and what the leader knows of it, for an answer naming
    /// `topic`-`index`.
    pub fn asked(&self, topic: &str, index: i32) -> Option<(&Arc<Partition>, &FetchPartition)> {
        self.sent
            .get(topic)
            .and_then(|by_index| by_index.get(&index))
            .map(|sent| (&sent.partition, &sent.asked))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::metadata::{PartitionState, TopicMetadata};
    use crate::replica::Leadership;
    use samsa_storage::testing::simple_batch;
    use samsa_storage::LogConfig;
    use std::collections::BTreeMap;

    const NOW: i64 = 1_700_000_000_000;
    const LEADER: i32 = 1;
    const FOLLOWER: i32 = 2;

    fn manager(dir: &std::path::Path) -> ReplicaManager {
        ReplicaManager::new(
            dir.to_path_buf(),
            LogConfig::default(),
            Default::default(),
            samsa_metrics::partitions::PartitionMetrics::register(&mut Default::default()),
        )
    }

    /// Partitions 0..count of topic `t`, led by this broker (1) in epoch 3,
    /// broker 2 following and in the ISR.
    fn led(replicas: &ReplicaManager, count: i32) -> Vec<Arc<Partition>> {
        let topic = TopicMetadata {
            name: "t".into(),
            topic_id: uuid::Uuid::from_u128(7),
            partitions: count,
            replication_factor: 2,
            configs: BTreeMap::new(),
            partition_states: Vec::new(),
        };
        let leadership = Leadership {
            is_leader: true,
            leader_epoch: 3,
        };
        (0..count)
            .map(|index| {
                let p = replicas
                    .ensure_partition(&topic, index, leadership, NOW)
                    .unwrap();
                let state = PartitionState::new(
                    vec![LEADER, FOLLOWER],
                    vec![LEADER, FOLLOWER],
                    LEADER,
                    3,
                    5,
                );
                p.set_replica_set(LEADER, topic.topic_id, &state, 1, NOW);
                p
            })
            .collect()
    }

    fn asked(index: i32, fetch_offset: i64, high_watermark: i64) -> FetchPartition {
        FetchPartition {
            topic: "t".into(),
            partition: index,
            current_leader_epoch: 3,
            fetch_offset,
            last_fetched_epoch: if fetch_offset > 0 { 3 } else { -1 },
            high_watermark,
        }
    }

    fn look(session: &mut LeaderSession, full: bool, now_ms: i64) -> Look {
        let meter = ByteRate::default();
        let mut look = session.look(
            FOLLOWER,
            full,
            1 << 20,
            LeaderThrottle {
                rate: None,
                meter: &meter,
            },
            now_ms,
        );
        session.answered(std::mem::take(&mut look.told));
        look
    }

    fn answered(look: &Look) -> Vec<i32> {
        look.out.iter().map(|d| d.partition).collect()
    }

    /// A full fetch answers every partition; then only partitions with
    /// news are served and answered, and a settled follower keeps counting
    /// as caught up through the session's clock, though the leader no
    /// longer looks at its partition, until the session forgets it.
    #[test]
    fn a_session_answers_only_news_and_its_clock_keeps_a_settled_follower_caught_up() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let partitions = led(&replicas, 3);
        let mut session =
            LeaderSession::new(9, (0..3).map(|i| asked(i, 0, 0)).collect(), &replicas, NOW);
        let first = look(&mut session, true, NOW);
        assert_eq!(answered(&first), vec![0, 1, 2]);
        assert!(!first.ready, "nothing to fetch yet");

        // Nothing moved: an incremental look answers nothing.
        session.update(Vec::new(), &[], FOLLOWER, &replicas);
        assert_eq!(
            answered(&look(&mut session, false, NOW + 1)),
            Vec::<i32>::new()
        );

        // Records on partition 1: only it is answered, with them.
        partitions[1]
            .append_as_leader_replicated(&simple_batch(4, NOW), NOW)
            .unwrap();
        session.update(Vec::new(), &[], FOLLOWER, &replicas);
        let with_records = look(&mut session, false, NOW + 2);
        assert_eq!(answered(&with_records), vec![1]);
        assert!(with_records.ready && !with_records.out[0].records.is_empty());

        // The follower has them: the HW moves, and is told once.
        session.update(vec![asked(1, 4, 0)], &[], FOLLOWER, &replicas);
        let hw = look(&mut session, false, NOW + 3);
        assert_eq!(answered(&hw), vec![1]);
        assert_eq!(hw.out[0].high_watermark, 4);
        assert!(hw.hw_news && !hw.ready);
        session.update(Vec::new(), &[], FOLLOWER, &replicas);
        assert_eq!(
            answered(&look(&mut session, false, NOW + 4)),
            Vec::<i32>::new()
        );

        // A minute of idle fetches through the session, none looking at
        // partition 1: its follower is still caught up, and silent only
        // as of the session's last fetch.
        let later = NOW + 60_000;
        session.clock.as_ref().unwrap().tick(later);
        session.update(Vec::new(), &[], FOLLOWER, &replicas);
        assert_eq!(
            answered(&look(&mut session, false, later)),
            Vec::<i32>::new()
        );
        assert!(partitions[1].lagging_isr(30_000, later + 1).is_none());
        assert!(!partitions[1]
            .replication
            .lock()
            .unwrap()
            .isr_followers_silent_since(later - 1));

        // Once the session forgets the partition, the follower's fetches
        // of it stopped: it lags from then on.
        session.update(
            Vec::new(),
            &[PartitionRef {
                topic: "t".into(),
                partition: 1,
            }],
            FOLLOWER,
            &replicas,
        );
        assert_eq!(session.entries.len(), 2);
        session.clock.as_ref().unwrap().tick(later + 40_000);
        assert!(partitions[1].lagging_isr(30_000, later + 40_000).is_some());
    }

    /// An error is answered once per session, not in every round (which
    /// would make the follower spin), and again once it changed.
    #[test]
    fn an_error_is_answered_once() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let _partitions = led(&replicas, 1);
        let mut fenced = asked(0, 0, 0);
        fenced.current_leader_epoch = 2;
        let mut session = LeaderSession::new(9, vec![fenced], &replicas, NOW);
        let first = look(&mut session, true, NOW);
        assert_eq!(
            first.out[0].error_code,
            i32::from(ResponseError::FencedLeaderEpoch.code())
        );
        session.update(Vec::new(), &[], FOLLOWER, &replicas);
        let again = look(&mut session, false, NOW + 1);
        assert!(again.out.is_empty() && !again.ready);
        // The follower caught up with the epoch: answered normally.
        session.update(vec![asked(0, 0, 0)], &[], FOLLOWER, &replicas);
        let fixed = look(&mut session, false, NOW + 2);
        assert_eq!(answered(&fixed), vec![0]);
        assert_eq!(fixed.out[0].error_code, 0);
    }

    /// A topic deleted and created again is another partition: the session
    /// looks it up again and serves the new one.
    #[test]
    fn a_partition_opened_again_is_looked_up_again() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let before = led(&replicas, 1);
        let mut session = LeaderSession::new(9, vec![asked(0, 0, 0)], &replicas, NOW);
        look(&mut session, true, NOW);
        replicas.remove_partition("t", 0, uuid::Uuid::from_u128(7));
        let after = led(&replicas, 1);
        assert!(!Arc::ptr_eq(&before[0], &after[0]));
        session.look_up_again_if_moved(&replicas);
        assert!(Arc::ptr_eq(
            session.entries[0].partition.as_ref().unwrap(),
            &after[0]
        ));
    }

    /// The follower names every partition in a full fetch, then only what
    /// changed, and forgets what it no longer follows; a reset starts over.
    #[test]
    fn a_follower_sends_only_changes_after_the_first_fetch() {
        let dir = tempfile::tempdir().unwrap();
        let replicas = manager(dir.path());
        let partitions = led(&replicas, 3);
        let followed = |offsets: &[(i32, i64)]| -> Vec<(Arc<Partition>, FetchPartition)> {
            offsets
                .iter()
                .map(|&(i, offset)| (Arc::clone(&partitions[i as usize]), asked(i, offset, 0)))
                .collect()
        };
        let names = |fetch: &NextFetch| -> Vec<i32> {
            let mut names: Vec<i32> = fetch.partitions.iter().map(|p| p.partition).collect();
            names.sort();
            names
        };
        let mut session = FollowerSession::default();
        let full = session.next_fetch(followed(&[(0, 0), (1, 0), (2, 0)]), (0, 0), true);
        assert_eq!((full.session_id, full.session_epoch), (0, 0));
        assert_eq!(names(&full), vec![0, 1, 2]);
        session.answered(full, 77);

        let idle = session.next_fetch(followed(&[(0, 0), (1, 0), (2, 0)]), (0, 0), true);
        assert_eq!((idle.session_id, idle.session_epoch), (77, 1));
        assert!(idle.partitions.is_empty() && idle.forgotten.is_empty());
        session.answered(idle, 77);
        // Nothing posted since: the next fetch is built without looking.
        let unchanged = session.unchanged_fetch((0, 0)).unwrap();
        assert!(unchanged.partitions.is_empty() && unchanged.session_epoch == 2);
        session.answered(unchanged, 77);
        assert!(session.unchanged_fetch((0, 1)).is_none(), "news was posted");

        let moved = session.next_fetch(followed(&[(0, 0), (1, 5)]), (0, 1), false);
        assert_eq!(moved.session_epoch, 3);
        assert_eq!(names(&moved), vec![1]);
        assert_eq!(moved.forgotten.len(), 1);
        assert_eq!(moved.forgotten[0].partition, 2);
        session.answered(moved, 77);
        assert_eq!(session.asked("t", 1).unwrap().1.fetch_offset, 5);
        assert!(session.asked("t", 2).is_none());
        // That fetch left a partition out for a while: the next one looks.
        assert!(session.unchanged_fetch((0, 1)).is_none());

        session.reset();
        let again = session.next_fetch(followed(&[(0, 0), (1, 5)]), (0, 1), true);
        assert_eq!((again.session_id, again.session_epoch), (0, 0));
        assert_eq!(names(&again), vec![0, 1]);
    }
}
