//! The Raft leader's view of the metadata quorum, which Kafka's
//! DescribeQuorum (`kafka-metadata-quorum describe --status/--replication`)
//! reports: the term, the high watermark, and per voter its log end offset,
//! when it last answered the leader and when it was last caught up.
//!
//! The term, the high watermark and the log end offsets come from openraft's
//! replication progress (`RaftMetrics::replication`, the index each voter is
//! known to hold). openraft keeps no times, so [`ReplicationClock`] records
//! them from the AppendEntries answers the leader's network layer receives
//! (heartbeats included): that answer is what a Kafka follower's fetch is to
//! a Kafka leader.
//!
//! Invariants:
//! - offsets are Kafka end offsets: Raft index `i` held means offset `i + 1`;
//! - times are the leader's wall clock in ms since the Unix epoch, and only
//!   answers to requests of the leader's current term count: a new leader
//!   reports -1 for a voter until that voter has answered it (as Kafka's new
//!   leader state starts empty);
//! - a voter's last caught-up time never goes back within a term, and is at
//!   most its last answer time.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};

use openraft::{BasicNode, RaftMetrics, ServerState};
use samsa_proto::controller as pb;
use tokio::sync::watch;

use crate::NodeId;

/// Wall-clock milliseconds since the Unix epoch (Kafka's timestamps).
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// When each voter last answered the leader, and was last caught up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoterTimes {
    /// The leader term these times belong to.
    term: u64,
    pub last_fetch_ms: i64,
    pub last_caught_up_ms: i64,
    /// The leader's log end offset when the voter last answered.
    leader_end_at_last_fetch: i64,
}

impl VoterTimes {
    fn new(term: u64) -> Self {
        VoterTimes {
            term,
            last_fetch_ms: -1,
            last_caught_up_ms: -1,
            leader_end_at_last_fetch: -1,
        }
    }

    /// One successful answer at `now_ms`: the voter holds everything below
    /// `voter_end`, the leader's log ends at `leader_end`. The rule of
    /// Kafka's leader state: caught up now if the voter has the leader's
    /// whole log, else caught up as of its previous answer if it now has
    /// what the leader had then.
    fn answered(&mut self, voter_end: i64, leader_end: i64, now_ms: i64) {
        if voter_end >= leader_end {
            self.last_caught_up_ms = self.last_caught_up_ms.max(now_ms);
        } else if self.leader_end_at_last_fetch > 0 && voter_end >= self.leader_end_at_last_fetch {
            self.last_caught_up_ms = self.last_caught_up_ms.max(self.last_fetch_ms);
        }
        self.leader_end_at_last_fetch = leader_end;
        self.last_fetch_ms = self.last_fetch_ms.max(now_ms);
    }
}

/// Answer times per voter, fed by the Raft network client of this node.
#[derive(Default)]
pub struct ReplicationClock {
    /// This node's Raft metrics (its own log end and term); attached once
    /// Raft runs, which is after the network factory exists.
    metrics: OnceLock<watch::Receiver<RaftMetrics<NodeId, BasicNode>>>,
    voters: Mutex<HashMap<NodeId, VoterTimes>>,
}

impl ReplicationClock {
    pub fn attach(&self, metrics: watch::Receiver<RaftMetrics<NodeId, BasicNode>>) {
        let _ = self.metrics.set(metrics);
    }

    /// `target` answered an AppendEntries request of leader term `term`
    /// successfully: it now holds everything below `voter_end`.
    pub fn record_answer(&self, target: NodeId, term: u64, voter_end: i64) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let (current_term, leader_end) = {
            let m = metrics.borrow();
            (m.current_term, end_offset(m.last_log_index))
        };
        // An answer to a request of an earlier leadership says nothing about
        // this one (nor about a later one).
        if current_term != term {
            return;
        }
        let now = wall_clock_ms();
        let mut voters = self.voters.lock().unwrap_or_else(|p| p.into_inner());
        let times = voters
            .entry(target)
            .or_insert_with(|| VoterTimes::new(term));
        if times.term != term {
            *times = VoterTimes::new(term);
        }
        times.answered(voter_end, leader_end, now);
    }

    /// The times recorded in `term`.
    fn times(&self, term: u64) -> HashMap<NodeId, VoterTimes> {
        self.voters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, t)| t.term == term)
            .map(|(id, t)| (*id, *t))
            .collect()
    }
}

/// Kafka end offset of a log whose last index is `last_index` (0 when empty).
fn end_offset(last_index: Option<u64>) -> i64 {
    last_index.map_or(0, |i| i64::try_from(i).map_or(i64::MAX, |i| i + 1))
}

/// The leader's view, or `None` when this node is not the Raft leader.
pub fn leader_view(
    metrics: &RaftMetrics<NodeId, BasicNode>,
    clock: &ReplicationClock,
    now_ms: i64,
) -> Option<pb::QuorumReplication> {
    if metrics.state != ServerState::Leader || metrics.current_leader != Some(metrics.id) {
        return None;
    }
    let progress: BTreeMap<NodeId, Option<u64>> = metrics
        .replication
        .as_ref()?
        .iter()
        .map(|(id, matched)| (*id, matched.map(|l| l.index)))
        .collect();
    let voters: Vec<NodeId> = metrics.membership_config.membership().voter_ids().collect();
    Some(build(
        metrics.current_term,
        metrics.id,
        &voters,
        &progress,
        &clock.times(metrics.current_term),
        now_ms,
    ))
}

/// The view from its parts (pure, for tests): `progress` is the index each
/// node is known to hold (`None`: nothing confirmed in this term).
fn build(
    term: u64,
    leader: NodeId,
    voters: &[NodeId],
    progress: &BTreeMap<NodeId, Option<u64>>,
    times: &HashMap<NodeId, VoterTimes>,
    now_ms: i64,
) -> pb::QuorumReplication {
    let known_end = |id: &NodeId| {
        progress
            .get(id)
            .copied()
            .flatten()
            .map(|i| end_offset(Some(i)))
    };
    // openraft's commit rule: the highest index a majority holds.
    let mut ends: Vec<i64> = voters.iter().map(|id| known_end(id).unwrap_or(0)).collect();
    ends.sort_unstable_by(|a, b| b.cmp(a));
    let majority = voters.len() / 2 + 1;
    let high_watermark = match ends.get(majority - 1) {
        Some(&end) if end > 0 => end,
        _ => -1,
    };
    let voters = voters
        .iter()
        .map(|id| {
            let (last_fetch, last_caught_up) = if *id == leader {
                (now_ms, now_ms)
            } else {
                times
                    .get(id)
                    .map_or((-1, -1), |t| (t.last_fetch_ms, t.last_caught_up_ms))
            };
            pb::ReplicaProgress {
                node_id: *id,
                log_end_offset: known_end(id).unwrap_or(-1),
                last_fetch_timestamp: last_fetch,
                last_caught_up_timestamp: last_caught_up,
            }
        })
        .collect();
    pb::QuorumReplication {
        term,
        high_watermark,
        voters,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn caught_up_now_when_the_voter_has_the_whole_log() {
        let mut t = VoterTimes::new(3);
        t.answered(10, 10, 1_000);
        assert_eq!((t.last_fetch_ms, t.last_caught_up_ms), (1_000, 1_000));
        // Behind the leader now, and behind what the leader had before: the
        // caught-up time stays.
        t.answered(9, 12, 2_000);
        assert_eq!((t.last_fetch_ms, t.last_caught_up_ms), (2_000, 1_000));
        // Behind now, but it holds what the leader had at its last answer
        // (12): caught up as of that answer.
        t.answered(12, 15, 3_000);
        assert_eq!((t.last_fetch_ms, t.last_caught_up_ms), (3_000, 2_000));
    }

    #[test]
    fn a_voter_never_caught_up_reports_minus_one() {
        let mut t = VoterTimes::new(1);
        t.answered(0, 40, 500);
        t.answered(5, 40, 600);
        assert_eq!((t.last_fetch_ms, t.last_caught_up_ms), (600, -1));
    }

    #[test]
    fn high_watermark_is_what_a_majority_holds() {
        let progress: BTreeMap<NodeId, Option<u64>> =
            [(1, Some(41)), (2, Some(30)), (3, None)].into();
        let times: HashMap<NodeId, VoterTimes> = [(
            2,
            VoterTimes {
                term: 4,
                last_fetch_ms: 900,
                last_caught_up_ms: 800,
                leader_end_at_last_fetch: 42,
            },
        )]
        .into();
        let view = build(4, 1, &[1, 2, 3], &progress, &times, 1_000);
        assert_eq!(view.term, 4);
        assert_eq!(view.high_watermark, 31);
        let by_id: Vec<(u64, i64, i64, i64)> = view
            .voters
            .iter()
            .map(|v| {
                (
                    v.node_id,
                    v.log_end_offset,
                    v.last_fetch_timestamp,
                    v.last_caught_up_timestamp,
                )
            })
            .collect();
        assert_eq!(
            by_id,
            vec![(1, 42, 1_000, 1_000), (2, 31, 900, 800), (3, -1, -1, -1)]
        );
    }

    #[test]
    fn no_high_watermark_before_a_majority_answered() {
        let progress: BTreeMap<NodeId, Option<u64>> = [(1, Some(7)), (2, None), (3, None)].into();
        let view = build(2, 1, &[1, 2, 3], &progress, &HashMap::new(), 5);
        assert_eq!(view.high_watermark, -1);
        // A single voter is its own majority.
        let progress: BTreeMap<NodeId, Option<u64>> = [(1, Some(7))].into();
        let view = build(2, 1, &[1], &progress, &HashMap::new(), 5);
        assert_eq!(view.high_watermark, 8);
    }

    #[test]
    fn answers_of_another_term_are_not_reported() {
        let clock = ReplicationClock::default();
        let (tx, rx) = watch::channel(RaftMetrics::new_initial(1));
        clock.attach(rx);
        tx.send_modify(|m| {
            m.current_term = 5;
            m.last_log_index = Some(9);
        });
        clock.record_answer(2, 4, 10);
        assert!(clock.times(5).is_empty());
        clock.record_answer(2, 5, 10);
        let times = clock.times(5);
        assert!(times[&2].last_caught_up_ms > 0, "{times:?}");
        assert!(clock.times(6).is_empty());
    }
}
