//! Fetch sessions of the Kafka Fetch API (KIP-227), the consumer's side of
//! what `replication::session` does for followers over gRPC: after a full
//! fetch that opened a session, a client names only the partitions whose
//! fetch state changed (and the ones it drops), and the broker answers only
//! the partitions with something new: records, an error, or a high
//! watermark, last stable offset or log start the client was not told.
//!
//! This module owns the session cache: ids, epochs, each session's
//! partitions in fetch order with what each was last told, and eviction.
//! It is sans-IO: the Fetch handler passes the time in, reads the
//! partitions itself and reports what it answered.
//!
//! Invariants:
//! - A request continues a session only with the session's id, the epoch
//!   the session expects next, the principal that opened it, and the same
//!   topic naming (names before Fetch v13, ids from v13). Accepting a
//!   request moves the epoch, so of two requests with one epoch only the
//!   first is served.
//! - What a session was told changes only through the answer of the
//!   request that took the session's latest epoch; a later request (or a
//!   closed session) makes that answer's report a no-op.
//! - At most `slots` sessions live. A new session takes the slot of the
//!   session idle longest if it has been idle for [`EVICTION_IDLE_MS`],
//!   else that of the smallest session if the new one names more
//!   partitions, else it gets none (session id 0) and its client goes on
//!   with full fetches, as in Kafka.
//! - Partitions that carried records move to the end of their session's
//!   order, so a byte budget that cuts an answer short serves the others
//!   first next time.
//! - A partition is *settled* when its last read found nothing past the
//!   fetch offset and the client was told what the partition says. A later
//!   fetch skips reading it while its news count
//!   (`Partition::note_replication_news`: high watermark, log end, log
//!   start, leadership) and the broker's partition generation stand, so an
//!   idle consumer's fetch does not read every partition it holds. A
//!   request that names the partition again unsettles it.
//! - Each session has one bell, registered with every partition it reads
//!   (`Partition::ring_on_high_watermark`) and rung when that partition's
//!   high watermark moves: a session's long poll waits on its bell, not
//!   on a subscription per partition per round.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

use indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::FetchPartition;
use kafka_protocol::messages::{FetchRequest, TopicName};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samsa_metrics::partitions::PartitionMetrics;
use uuid::Uuid;

use crate::replica::{Partition, ReplicaManager};
use crate::security::Principal;

/// The first Fetch version with sessions.
pub const FIRST_SESSION_VERSION: i16 = 7;
/// The first Fetch version that names topics by id.
const TOPIC_IDS: i16 = 13;
/// A request's epoch that asks for a new session (closing the named one).
const INITIAL_EPOCH: i32 = 0;
/// A request's epoch that asks for no session (closing the named one).
const FINAL_EPOCH: i32 = -1;
/// `min.incremental.fetch.session.eviction.ms`: a session unused this long
/// gives its slot to a new one.
pub const EVICTION_IDLE_MS: u64 = 120_000;

/// A partition of a session: a topic by name (before v13) or by id, and
/// the partition index.
pub type PartitionKey = (TopicName, Uuid, i32);

/// What an answer told the client about a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Told {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
}

/// A partition whose last read found nothing new for the client: the
/// partition read, and its news count and the broker's partition
/// generation before that read.
#[derive(Clone, Debug)]
pub struct Settled {
    partition: Weak<Partition>,
    news: u64,
    generation: u64,
}

impl Settled {
    /// Sampled before reading `partition`.
    pub fn before_reading(partition: &Arc<Partition>, replicas: &ReplicaManager) -> Settled {
        Settled {
            generation: replicas.generation(),
            news: partition.replication_news(),
            partition: Arc::downgrade(partition),
        }
    }

    /// The partition, if nothing happened to it since: reading it again
    /// would find nothing new.
    pub fn still(&self, replicas: &ReplicaManager) -> Option<Arc<Partition>> {
        if replicas.generation() != self.generation {
            return None;
        }
        let partition = self.partition.upgrade()?;
        (partition.replication_news() == self.news).then_some(partition)
    }
}

/// A partition to read for a request.
#[derive(Clone, Debug)]
pub struct Wanted {
    pub topic: TopicName,
    pub topic_id: Uuid,
    pub fetch: FetchPartition,
    /// What the session last told the client about it; `None`: answer it
    /// whatever it holds.
    pub told: Option<Told>,
    /// Whether the session's last read found nothing new in it.
    pub settled: Option<Settled>,
}

impl Wanted {
    pub fn key(&self) -> PartitionKey {
        (self.topic.clone(), self.topic_id, self.fetch.partition)
    }
}

/// A request as its session (or its lack of one) makes it.
#[derive(Debug)]
pub struct Begun {
    /// The session id the answer carries: 0 for none.
    pub session_id: i32,
    /// Whether the answer names only partitions with news.
    pub incremental: bool,
    /// The partitions to read, in fetch order.
    pub partitions: Vec<Wanted>,
    /// The session's bell (none without a session): rung when a partition
    /// the session read moves its high watermark.
    pub bell: Option<Arc<Notify>>,
    /// The epoch the session expects after this request: the report of
    /// this answer counts only while it still does.
    next_epoch: i32,
}

/// Why a request cannot continue its session (the Fetch answer's
/// top-level error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FetchSessionError {
    #[error("fetch session {0} not found")]
    NotFound(i32),
    #[error("fetch session {id} expects epoch {expected}, the request carries {got}")]
    InvalidEpoch { id: i32, expected: i32, got: i32 },
    #[error("fetch session {0} names topics one way (names or ids) and the request the other")]
    TopicNaming(i32),
}

/// A partition as an answer read it.
#[derive(Debug)]
pub struct Answered {
    pub key: PartitionKey,
    /// What the answer told about it; `None`: the answer did not name it.
    pub told: Option<Told>,
    pub carried_records: bool,
    pub settled: Option<Settled>,
    /// The partition the read registered the session's bell with.
    pub belled_with: Option<Weak<Partition>>,
}

/// How many sessions and partitions the cache holds, and how many sessions
/// it evicted (`/metrics`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheFigures {
    pub sessions: usize,
    pub partitions: usize,
    pub evictions: u64,
}

struct Session {
    bell: Arc<Notify>,
    principal: Principal,
    uses_topic_ids: bool,
    next_epoch: i32,
    last_used_ms: u64,
    partitions: IndexMap<PartitionKey, Cached>,
}

struct Cached {
    fetch: FetchPartition,
    told: Option<Told>,
    settled: Option<Settled>,
    /// The partition the session's bell is registered with.
    belled_with: Option<Weak<Partition>>,
}

impl Cached {
    fn new(fetch: FetchPartition) -> Cached {
        Cached {
            fetch,
            told: None,
            settled: None,
            belled_with: None,
        }
    }
}

struct Sessions {
    slots: usize,
    by_id: HashMap<i32, Session>,
    figures: CacheFigures,
    ids: StdRng,
    meters: PartitionMetrics,
}

/// The broker's fetch sessions.
pub struct FetchSessionCache {
    sessions: Mutex<Sessions>,
}

impl FetchSessionCache {
    /// A cache of at most `slots` sessions (0 turns sessions off) whose ids
    /// are random, so a client holding an id from before a restart is not
    /// likely to meet a new session under it.
    pub fn new(slots: usize, meters: PartitionMetrics) -> FetchSessionCache {
        Self::with_ids(slots, StdRng::from_entropy(), meters)
    }

    fn with_ids(slots: usize, ids: StdRng, meters: PartitionMetrics) -> FetchSessionCache {
        FetchSessionCache {
            sessions: Mutex::new(Sessions {
                slots,
                by_id: HashMap::new(),
                figures: CacheFigures::default(),
                ids,
                meters,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn figures(&self) -> CacheFigures {
        self.lock().figures
    }

    /// Takes a Fetch request of `version` from `principal` at `now_ms`: the
    /// partitions to read and how to answer, or why its session cannot go on.
    pub fn begin(
        &self,
        request: &FetchRequest,
        version: i16,
        principal: &Principal,
        now_ms: u64,
    ) -> Result<Begun, FetchSessionError> {
        let requested = || requested_partitions(request);
        if version < FIRST_SESSION_VERSION {
            return Ok(sessionless(requested()));
        }
        let uses_topic_ids = version >= TOPIC_IDS;
        let (id, epoch) = (request.session_id, request.session_epoch);
        if (id, epoch) == (0, FINAL_EPOCH) {
            // No session asked for and none to close (every librdkafka
            // fetch): no need for the broker-wide lock.
            return Ok(sessionless(requested()));
        }
        let mut sessions = self.lock();
        match epoch {
            FINAL_EPOCH => {
                sessions.close(id, principal);
                Ok(sessionless(requested()))
            }
            INITIAL_EPOCH => {
                sessions.close(id, principal);
                let partitions = requested();
                let session = Session {
                    bell: Arc::new(Notify::new()),
                    principal: principal.clone(),
                    uses_topic_ids,
                    next_epoch: next_epoch(INITIAL_EPOCH),
                    last_used_ms: now_ms,
                    partitions: partitions
                        .iter()
                        .map(|w| (w.key(), Cached::new(w.fetch.clone())))
                        .collect(),
                };
                let next_epoch = session.next_epoch;
                let bell = Arc::clone(&session.bell);
                let session_id = sessions.open(session, now_ms);
                Ok(Begun {
                    session_id,
                    incremental: false,
                    partitions,
                    bell: (session_id != 0).then_some(bell),
                    next_epoch,
                })
            }
            _ => {
                let session = sessions
                    .by_id
                    .get_mut(&id)
                    .filter(|s| s.principal == *principal)
                    .ok_or(FetchSessionError::NotFound(id))?;
                if session.uses_topic_ids != uses_topic_ids {
                    return Err(FetchSessionError::TopicNaming(id));
                }
                if session.next_epoch != epoch {
                    return Err(FetchSessionError::InvalidEpoch {
                        id,
                        expected: session.next_epoch,
                        got: epoch,
                    });
                }
                let before = session.partitions.len();
                // As in Kafka: additions and changes first, then what the
                // request forgets (a partition in both is forgotten).
                for wanted in requested() {
                    match session.partitions.get_mut(&wanted.key()) {
                        Some(cached) => {
                            cached.fetch = wanted.fetch;
                            cached.settled = None;
                        }
                        None => {
                            let cached = Cached::new(wanted.fetch.clone());
                            session.partitions.insert(wanted.key(), cached);
                        }
                    }
                }
                for topic in &request.forgotten_topics_data {
                    for partition in &topic.partitions {
                        let key = (topic.topic.clone(), topic.topic_id, *partition);
                        let forgotten = session.partitions.shift_remove(&key);
                        // Its high watermark no longer wakes this session.
                        if let Some(partition) = forgotten
                            .and_then(|c| c.belled_with)
                            .and_then(|p| p.upgrade())
                        {
                            partition.stop_ringing(&session.bell);
                        }
                    }
                }
                session.next_epoch = next_epoch(epoch);
                session.last_used_ms = now_ms;
                let partitions = session
                    .partitions
                    .iter()
                    .map(|((topic, topic_id, _), cached)| Wanted {
                        topic: topic.clone(),
                        topic_id: *topic_id,
                        fetch: cached.fetch.clone(),
                        told: cached.told,
                        settled: cached.settled.clone(),
                    })
                    .collect();
                let next_epoch = session.next_epoch;
                let bell = Arc::clone(&session.bell);
                let after = session.partitions.len();
                sessions.figures.partitions = sessions.figures.partitions + after - before;
                sessions.publish();
                Ok(Begun {
                    session_id: id,
                    incremental: true,
                    partitions,
                    bell: Some(bell),
                    next_epoch,
                })
            }
        }
    }

    /// Records what the answer to `begun` read and told the client (a
    /// partition it skipped as settled stays as it was), unless a later
    /// request has taken the session since (or it is gone).
    pub fn answered(&self, begun: &Begun, answered: impl IntoIterator<Item = Answered>) {
        if begun.session_id == 0 {
            return;
        }
        let mut sessions = self.lock();
        let Some(session) = sessions.by_id.get_mut(&begun.session_id) else {
            return;
        };
        if session.next_epoch != begun.next_epoch {
            return;
        }
        let mut carried = Vec::new();
        for answer in answered {
            if let Some(cached) = session.partitions.get_mut(&answer.key) {
                if answer.told.is_some() {
                    cached.told = answer.told;
                }
                cached.settled = answer.settled;
                if answer.belled_with.is_some() {
                    cached.belled_with = answer.belled_with;
                }
                if answer.carried_records {
                    carried.push(answer.key);
                }
            }
        }
        // The partitions that carried records go last, keeping their
        // order: one pass, however many there are.
        if !carried.is_empty() {
            let carried: std::collections::HashSet<_> = carried.into_iter().collect();
            let (last, first): (IndexMap<_, _>, IndexMap<_, _>) =
                std::mem::take(&mut session.partitions)
                    .into_iter()
                    .partition(|(key, _)| carried.contains(key));
            session.partitions = first;
            session.partitions.extend(last);
        }
    }
}

impl Sessions {
    /// Removes session `id` if `principal` opened it.
    fn close(&mut self, id: i32, principal: &Principal) {
        if id == 0 {
            return;
        }
        if self
            .by_id
            .get(&id)
            .is_some_and(|s| s.principal == *principal)
        {
            self.remove(id);
        }
    }

    fn remove(&mut self, id: i32) {
        if let Some(session) = self.by_id.remove(&id) {
            self.figures.sessions -= 1;
            self.figures.partitions -= session.partitions.len();
            self.publish();
        }
    }

    fn publish(&self) {
        let figures = self.figures;
        self.meters
            .fetch_sessions_held(figures.sessions, figures.partitions);
    }

    /// Keeps `session` under a new id, evicting another if the cache is
    /// full and one may go; 0 when it gets no slot.
    fn open(&mut self, session: Session, now_ms: u64) -> i32 {
        if self.slots == 0 {
            return 0;
        }
        if self.by_id.len() >= self.slots {
            let idle_longest = self
                .by_id
                .iter()
                .min_by_key(|(_, s)| s.last_used_ms)
                .filter(|(_, s)| now_ms.saturating_sub(s.last_used_ms) >= EVICTION_IDLE_MS)
                .map(|(id, _)| *id);
            let smaller = || {
                self.by_id
                    .iter()
                    .min_by_key(|(_, s)| (s.partitions.len(), s.last_used_ms))
                    .filter(|(_, s)| s.partitions.len() < session.partitions.len())
                    .map(|(id, _)| *id)
            };
            let Some(evicted) = idle_longest.or_else(smaller) else {
                return 0;
            };
            self.remove(evicted);
            self.figures.evictions += 1;
            self.meters.fetch_session_evicted();
        }
        let id = loop {
            let id = self.ids.gen_range(1..=i32::MAX);
            if !self.by_id.contains_key(&id) {
                break id;
            }
        };
        self.figures.sessions += 1;
        self.figures.partitions += session.partitions.len();
        self.by_id.insert(id, session);
        self.publish();
        id
    }
}

/// Kafka's epoch sequence: 1, 2, … `i32::MAX`, then 1 again.
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

fn sessionless(partitions: Vec<Wanted>) -> Begun {
    Begun {
        session_id: 0,
        incremental: false,
        partitions,
        bell: None,
        next_epoch: FINAL_EPOCH,
    }
}

fn requested_partitions(request: &FetchRequest) -> Vec<Wanted> {
    request
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(|fetch| Wanted {
                topic: topic.topic.clone(),
                topic_id: topic.topic_id,
                fetch: fetch.clone(),
                told: None,
                settled: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use kafka_protocol::messages::fetch_request::{FetchTopic, ForgottenTopic};
    use kafka_protocol::protocol::StrBytes;

    const V12: i16 = 12;

    fn alice() -> Principal {
        Principal::user("alice")
    }

    fn name(topic: &str) -> TopicName {
        TopicName(StrBytes::from_string(topic.to_owned()))
    }

    fn fetch(partitions: &[(&str, i32, i64)]) -> FetchRequest {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (topic, partition, offset) in partitions {
            let wanted = FetchPartition::default()
                .with_partition(*partition)
                .with_fetch_offset(*offset);
            match topics.last_mut() {
                Some(last) if last.topic == name(topic) => last.partitions.push(wanted),
                _ => topics.push(
                    FetchTopic::default()
                        .with_topic(name(topic))
                        .with_partitions(vec![wanted]),
                ),
            }
        }
        FetchRequest::default().with_topics(topics)
    }

    fn session(request: FetchRequest, id: i32, epoch: i32) -> FetchRequest {
        request.with_session_id(id).with_session_epoch(epoch)
    }

    fn told(hw: i64) -> Told {
        Told {
            high_watermark: hw,
            last_stable_offset: hw,
            log_start_offset: 0,
        }
    }

    fn answer(begun: &Begun, hw: i64, carried: &[i32]) -> Vec<Answered> {
        begun
            .partitions
            .iter()
            .map(|w| Answered {
                key: w.key(),
                told: Some(told(hw)),
                carried_records: carried.contains(&w.fetch.partition),
                settled: None,
                belled_with: None,
            })
            .collect()
    }

    fn shape(begun: &Begun) -> Vec<(i32, i64, Option<i64>)> {
        begun
            .partitions
            .iter()
            .map(|w| {
                let told = w.told.map(|t| t.high_watermark);
                (w.fetch.partition, w.fetch.fetch_offset, told)
            })
            .collect()
    }

    fn cache(slots: usize) -> FetchSessionCache {
        let meters = samsa_metrics::Metrics::new().partitions.clone();
        FetchSessionCache::with_ids(slots, StdRng::seed_from_u64(7), meters)
    }

    #[test]
    fn an_incremental_fetch_carries_the_session_forward() {
        let cache = cache(10);
        let full = fetch(&[("t", 0, 0), ("t", 1, 0), ("t", 2, 0)]);
        let begun = cache.begin(&session(full, 0, 0), V12, &alice(), 0).unwrap();
        assert!(!begun.incremental);
        assert_ne!(begun.session_id, 0);
        let id = begun.session_id;
        cache.answered(&begun, answer(&begun, 5, &[1]));
        assert_eq!(
            cache.figures(),
            CacheFigures {
                sessions: 1,
                partitions: 3,
                evictions: 0
            }
        );

        // Partition 1 moved on, partition 3 joins, partition 0 leaves.
        let mut next = session(fetch(&[("t", 1, 5), ("t", 3, 0)]), id, 1);
        next.forgotten_topics_data = vec![ForgottenTopic::default()
            .with_topic(name("t"))
            .with_partitions(vec![0])];
        let begun = cache.begin(&next, V12, &alice(), 10).unwrap();
        assert!(begun.incremental);
        assert_eq!(begun.session_id, id);
        // The partition that carried records went last, keeping what it
        // was told; the new one was told nothing.
        assert_eq!(
            shape(&begun),
            vec![(2, 0, Some(5)), (1, 5, Some(5)), (3, 0, None)]
        );
        assert_eq!(cache.figures().partitions, 3);

        // The same epoch again is refused, the next one is served.
        let again = session(fetch(&[]), id, 1);
        assert_eq!(
            cache.begin(&again, V12, &alice(), 20).unwrap_err(),
            FetchSessionError::InvalidEpoch {
                id,
                expected: 2,
                got: 1
            }
        );
        let begun = cache
            .begin(&session(fetch(&[]), id, 2), V12, &alice(), 20)
            .unwrap();
        assert_eq!(begun.partitions.len(), 3);
    }

    #[test]
    fn a_settled_partition_stays_settled_until_a_request_names_it() {
        let cache = cache(10);
        let full = fetch(&[("t", 0, 0), ("t", 1, 0)]);
        let begun = cache.begin(&session(full, 0, 0), V12, &alice(), 0).unwrap();
        let id = begun.session_id;
        let settled = || Settled {
            partition: Weak::new(),
            news: 3,
            generation: 1,
        };
        let reports = begun.partitions.iter().map(|w| Answered {
            key: w.key(),
            told: Some(told(1)),
            carried_records: false,
            settled: Some(settled()),
            belled_with: None,
        });
        cache.answered(&begun, reports);
        let settled_of = |begun: &Begun| -> Vec<(i32, bool)> {
            begun
                .partitions
                .iter()
                .map(|w| (w.fetch.partition, w.settled.is_some()))
                .collect()
        };
        let next = cache
            .begin(&session(fetch(&[("t", 1, 1)]), id, 1), V12, &alice(), 1)
            .unwrap();
        assert_eq!(settled_of(&next), vec![(0, true), (1, false)]);
        // An answer that did not name partition 0 (it skipped it) leaves
        // what it was told; one that read it and found news unsettles it.
        let reports = vec![Answered {
            key: (name("t"), Uuid::nil(), 0),
            told: None,
            carried_records: false,
            settled: None,
            belled_with: None,
        }];
        cache.answered(&next, reports);
        let last = cache
            .begin(&session(fetch(&[]), id, 2), V12, &alice(), 2)
            .unwrap();
        assert_eq!(settled_of(&last), vec![(0, false), (1, false)]);
        assert_eq!(shape(&last), vec![(0, 0, Some(1)), (1, 1, Some(1))]);
    }

    #[test]
    fn a_stale_answer_does_not_change_what_the_session_was_told() {
        let cache = cache(10);
        let full = fetch(&[("t", 0, 0)]);
        let first = cache.begin(&session(full, 0, 0), V12, &alice(), 0).unwrap();
        let id = first.session_id;
        cache.answered(&first, answer(&first, 1, &[]));
        let second = cache
            .begin(&session(fetch(&[]), id, 1), V12, &alice(), 1)
            .unwrap();
        let third = cache
            .begin(&session(fetch(&[]), id, 2), V12, &alice(), 2)
            .unwrap();
        // The second request's answer comes after the third began.
        cache.answered(&second, answer(&second, 9, &[]));
        cache.answered(&third, answer(&third, 3, &[]));
        let fourth = cache
            .begin(&session(fetch(&[]), id, 3), V12, &alice(), 3)
            .unwrap();
        assert_eq!(shape(&fourth), vec![(0, 0, Some(3))]);
    }

    #[test]
    fn a_session_answers_only_its_owner_its_naming_and_its_epoch() {
        let cache = cache(10);
        let begun = cache
            .begin(&session(fetch(&[("t", 0, 0)]), 0, 0), V12, &alice(), 0)
            .unwrap();
        let id = begun.session_id;
        let next = session(fetch(&[]), id, 1);
        let mallory = Principal::user("mallory");
        assert_eq!(
            cache.begin(&next, V12, &mallory, 1).unwrap_err(),
            FetchSessionError::NotFound(id)
        );
        // Another principal cannot close it either.
        cache
            .begin(&session(fetch(&[]), id, FINAL_EPOCH), V12, &mallory, 1)
            .unwrap();
        assert_eq!(
            cache.begin(&next, 13, &alice(), 1).unwrap_err(),
            FetchSessionError::TopicNaming(id)
        );
        assert_eq!(cache.begin(&next, V12, &alice(), 1).unwrap().session_id, id);
        // Closing it leaves a sessionless fetch; the id is then unknown.
        let closed = cache
            .begin(
                &session(fetch(&[("t", 0, 0)]), id, FINAL_EPOCH),
                V12,
                &alice(),
                2,
            )
            .unwrap();
        assert_eq!((closed.session_id, closed.partitions.len()), (0, 1));
        assert_eq!(
            cache
                .begin(&session(fetch(&[]), id, 2), V12, &alice(), 3)
                .unwrap_err(),
            FetchSessionError::NotFound(id)
        );
        assert_eq!(cache.figures().sessions, 0);
        // Before v7 a fetch has no session, whatever its fields say.
        let old = cache
            .begin(&session(fetch(&[("t", 0, 0)]), 0, 0), 6, &alice(), 4)
            .unwrap();
        assert_eq!(old.session_id, 0);
        assert_eq!(cache.figures().sessions, 0);
    }

    #[test]
    fn a_full_cache_gives_a_slot_to_an_idle_or_a_larger_session_only() {
        let cache = cache(2);
        let open = |partitions: &[(&str, i32, i64)], now| {
            cache
                .begin(&session(fetch(partitions), 0, 0), V12, &alice(), now)
                .unwrap()
                .session_id
        };
        let small = open(&[("t", 0, 0)], 0);
        let large = open(&[("t", 0, 0), ("t", 1, 0)], 1_000);
        assert!(small != 0 && large != 0);
        // Full, nobody idle, and the newcomer is no larger than the smallest.
        assert_eq!(open(&[("u", 0, 0)], 2_000), 0);
        // A larger newcomer takes the smallest session's slot.
        let larger = open(&[("u", 0, 0), ("u", 1, 0)], 3_000);
        assert_ne!(larger, 0);
        assert_eq!(cache.figures().evictions, 1);
        let next = session(fetch(&[]), small, 1);
        assert_eq!(
            cache.begin(&next, V12, &alice(), 3_000).unwrap_err(),
            FetchSessionError::NotFound(small)
        );
        // Once idle long enough, the session used longest ago gives way to any.
        let now = 1_000 + EVICTION_IDLE_MS;
        assert_ne!(open(&[("v", 0, 0)], now), 0);
        let next = session(fetch(&[]), large, 1);
        assert_eq!(
            cache.begin(&next, V12, &alice(), now).unwrap_err(),
            FetchSessionError::NotFound(large)
        );
        assert_eq!(
            cache.figures(),
            CacheFigures {
                sessions: 2,
                partitions: 3,
                evictions: 2
            }
        );
        // No slots: no sessions at all.
        let none = FetchSessionCache::new(0, samsa_metrics::Metrics::new().partitions.clone());
        let begun = none
            .begin(&session(fetch(&[("t", 0, 0)]), 0, 0), V12, &alice(), 0)
            .unwrap();
        assert_eq!((begun.session_id, begun.incremental), (0, false));
    }
}
