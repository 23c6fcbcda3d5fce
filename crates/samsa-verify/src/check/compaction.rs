//! The checks of compacted topics (`cleanup.policy=compact`, the compact
//! workload's). A log cleaner may remove any record a later record of the
//! same key supersedes, and a tombstone once its delete horizon passed; it
//! never moves a record to another offset, never removes the latest record
//! of a key that is not a tombstone, and never lets an aborted record
//! hide an older one. So, per partition and key, from the final
//! read_committed read:
//!
//! - **latest**: the latest write known to be in the log (acknowledged, or
//!   of a committed transaction; by offset) must be at its offset, unless
//!   it is a tombstone or a later record of the key may have replaced it:
//!   one seen in the final read at a higher offset, or a tombstone written
//!   after it that did not certainly fail (whose removal leaves no trace).
//!   Whatever replaced it last is one of those, so this never blames a
//!   record the cleaner was allowed to remove;
//! - **tombstone early**: a tombstone that is the latest such write (and
//!   that nothing written after it may have replaced) stays for at least
//!   `delete.retention.ms`: its delete horizon is that long after a pass
//!   that ran after it was written. Gone from a final read that ended
//!   sooner after its acknowledgement, it went early (both times are the
//!   run's clock);
//! - **resurrected**: a tombstone that is the latest such write and gone,
//!   while an older value of its key is still the key's latest record in
//!   the read: the cleaner removes a tombstone only in a pass after the one
//!   that removed everything older of its key;
//! - **overdue** (only with the topic's `max.compaction.lag.ms`): a
//!   record superseded by a write acknowledged (or committed) at `t` must
//!   be gone once a pass was due. A record can only be compacted once its
//!   segment rolled, and a segment rolls when an append comes
//!   `max.compaction.lag.ms` after its first record: so the deadline is the
//!   acknowledgement of the first record of the partition sent after
//!   `t + max lag`, plus the grace (`--compact-grace`: the cleaner's
//!   scheduling and the pass). A partition with no such append (the run
//!   stopped writing first) has no deadline. A tombstone's deadline is two
//!   passes: the first sets its delete horizon (`delete.retention.ms`
//!   later), the second, due by the same rule after the horizon, removes
//!   it. Compared with the time the final read began (every record it
//!   returned was fetched after that).
//!
//! The value-level checks of the parent module (offset conflicts, aborted
//! reads, duplicates, order, unknown values) run on these topics too; here
//! also a read whose key or tombstone-ness differs from its send is an
//! unknown value.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use super::{AnomalyKind, Collector, FinalRead, Outcome, Tp, Txn};
use crate::history::{Compaction, Event, EventKind, Isolation};

/// What the final read of a compacted topic shows of its compaction.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CompactedTopic {
    pub topic: String,
    /// Distinct keys of the writes.
    pub keys: usize,
    /// Writes known to be in the log: acknowledged, of a committed
    /// transaction, or seen in the final read.
    pub writes: usize,
    /// How many of them are tombstones.
    pub tombstones: usize,
    /// Records in the final read_committed read.
    pub read: usize,
    /// How many of them are tombstones.
    pub tombstones_read: usize,
    /// Records in the final read that a later write of their key
    /// supersedes (not cleaned yet, or not yet due).
    pub superseded_read: usize,
    /// Writes whose removal was due (superseded, or tombstones) when the
    /// final read began: none of them may be in it.
    pub due_for_removal: usize,
}

/// Whether a write is in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// Acknowledged (at `since_ms`), committed (at `since_ms`), or seen in
    /// the final read (`since_ms` unknown).
    Certain { since_ms: Option<i64> },
    /// Failed delivery, or a transaction whose outcome is unknown: maybe.
    Uncertain,
    /// An aborted transaction's, or one that never issued its commit.
    Impossible,
}

struct Write<'a> {
    value: &'a str,
    key: &'a str,
    tombstone: bool,
    tp: Tp,
    txn: Option<&'a str>,
    send_ms: i64,
    /// (offset, when) of the acknowledgement.
    ack: Option<(i64, i64)>,
    status: Status,
    /// Where it is: the acknowledged offset, else where a final read saw it.
    offset: Option<i64>,
}

/// A record of a final read_committed read of a compacted topic.
struct Seen<'a> {
    value: &'a str,
    key: Option<&'a str>,
    tombstone: bool,
}

/// The appends of a partition: (send time, acknowledgement time) by send
/// time, and the earliest acknowledgement from each position on.
#[derive(Default)]
struct Appends {
    sent: Vec<(i64, i64)>,
    earliest_ack_from: Vec<i64>,
}

impl Appends {
    fn finish(&mut self) {
        self.sent.sort_unstable();
        let mut earliest = i64::MAX;
        self.earliest_ack_from = self
            .sent
            .iter()
            .rev()
            .map(|(_, ack)| {
                earliest = earliest.min(*ack);
                earliest
            })
            .collect();
        self.earliest_ack_from.reverse();
    }

    /// When the first record sent after `t` was acknowledged (so appended).
    fn first_ack_of_send_after(&self, t: i64) -> Option<i64> {
        let i = self.sent.partition_point(|(sent, _)| *sent <= t);
        self.earliest_ack_from.get(i).copied()
    }
}

/// The deadlines of one compacted partition.
struct Deadlines<'a> {
    settings: Compaction,
    appends: Option<&'a Appends>,
}

impl Deadlines<'_> {
    /// By when a pass must have compacted what was in the log at `t`.
    fn pass_by(&self, t: i64) -> Option<i64> {
        let lag = self.settings.max_lag_ms?;
        let rolled = self
            .appends?
            .first_ack_of_send_after(t.saturating_add(lag))?;
        Some(rolled.saturating_add(self.settings.grace_ms))
    }

    /// By when a tombstone in the log at `t` must be gone: a pass sets its
    /// delete horizon, a pass after the horizon removes it.
    fn tombstone_gone_by(&self, t: i64) -> Option<i64> {
        let retention = self.settings.delete_retention_ms?;
        let first = self.pass_by(t)?;
        self.pass_by(first.saturating_add(retention))
    }
}

/// Checks the compacted topics of `history`; what each one's final read
/// shows of its compaction.
pub(super) fn check(
    history: &[Event],
    txns: &BTreeMap<String, Txn>,
    committed_read: &FinalRead,
    uncommitted_read: &FinalRead,
    c: &mut Collector,
) -> Vec<CompactedTopic> {
    let mut settings: BTreeMap<&str, Compaction> = BTreeMap::new();
    let mut writes: Vec<Write<'_>> = Vec::new();
    let mut by_value: HashMap<&str, usize> = HashMap::new();
    let mut seen: BTreeMap<Tp, BTreeMap<i64, Seen<'_>>> = BTreeMap::new();
    let mut read_started: HashMap<&str, i64> = HashMap::new();
    let mut read_done: HashMap<&str, i64> = HashMap::new();
    let mut drained_ms = None;
    for e in history {
        match &e.kind {
            EventKind::RunStarted { topics, .. } => {
                for t in topics {
                    if let Some(compaction) = t.compaction {
                        settings.insert(&t.topic, compaction);
                    }
                }
            }
            EventKind::Send {
                value,
                topic,
                partition,
                txn,
                key,
                tombstone,
                ..
            } if settings.contains_key(topic.as_str()) => {
                by_value.insert(value, writes.len());
                writes.push(Write {
                    value,
                    key: key.as_deref().unwrap_or_default(),
                    tombstone: *tombstone,
                    tp: (topic.clone(), *partition),
                    txn: txn.as_deref(),
                    send_ms: e.time_ms,
                    ack: None,
                    status: Status::Uncertain,
                    offset: None,
                });
            }
            EventKind::Ack { value, offset, .. } => {
                if let Some(w) = by_value
                    .get(value.as_str())
                    .and_then(|i| writes.get_mut(*i))
                {
                    w.ack = Some((*offset, e.time_ms));
                }
            }
            EventKind::Drained { .. } => drained_ms = Some(e.time_ms),
            EventKind::FinalRead {
                isolation: Isolation::ReadCommitted,
                topic,
                partition,
                offset,
                value,
                key,
                tombstone,
            } if settings.contains_key(topic.as_str()) => {
                seen.entry((topic.clone(), *partition)).or_default().insert(
                    *offset,
                    Seen {
                        value,
                        key: key.as_deref(),
                        tombstone: *tombstone,
                    },
                );
            }
            EventKind::FinalReadDone {
                isolation: Isolation::ReadCommitted,
                topic,
                started_ms,
                ..
            } if settings.contains_key(topic.as_str()) => {
                if let Some(started) = started_ms {
                    read_started.insert(topic, *started);
                }
                read_done.insert(topic, e.time_ms);
            }
            _ => {}
        }
    }
    if settings.is_empty() {
        return Vec::new();
    }
    check_keys_as_sent(history, &settings, &writes, &by_value, c);

    let read_at = |read: &FinalRead, w: &Write<'_>| {
        read.by_value
            .get(w.value)
            .and_then(|places| places.iter().find(|(tp, _)| *tp == w.tp))
            .map(|(_, offset)| *offset)
    };
    let mut appends: BTreeMap<Tp, Appends> = BTreeMap::new();
    for w in &mut writes {
        let visible = read_at(committed_read, w);
        w.status = match w.txn {
            Some(id) => match txns.get(id).map(|t| (t, t.outcome())) {
                Some((t, Outcome::Committed)) => Status::Certain {
                    since_ms: t.committed_ms,
                },
                Some((_, Outcome::Aborted { .. } | Outcome::NeverCommitted)) => Status::Impossible,
                // All or nothing: a record of it seen means it committed.
                Some((t, Outcome::Unknown)) => {
                    if t.records.iter().any(|v| committed_read.contains(v)) {
                        Status::Certain { since_ms: None }
                    } else {
                        Status::Uncertain
                    }
                }
                None => Status::Uncertain,
            },
            None => match w.ack {
                Some((_, at)) => Status::Certain { since_ms: Some(at) },
                None if visible.is_some() => Status::Certain { since_ms: None },
                None => Status::Uncertain,
            },
        };
        w.offset = w
            .ack
            .map(|(offset, _)| offset)
            .filter(|o| *o >= 0)
            .or(visible)
            .or_else(|| read_at(uncommitted_read, w));
        if let Some((_, ack_ms)) = w.ack {
            appends
                .entry(w.tp.clone())
                .or_default()
                .sent
                .push((w.send_ms, ack_ms));
        }
    }
    for a in appends.values_mut() {
        a.finish();
    }

    // (topic, partition, key) → its writes and what the read saw of it.
    let mut keys: BTreeMap<(Tp, &str), Key<'_, '_>> = BTreeMap::new();
    for w in &writes {
        keys.entry((w.tp.clone(), w.key))
            .or_default()
            .writes
            .push(w);
    }
    for (tp, records) in &seen {
        for (offset, s) in records {
            if let Some(key) = s.key {
                keys.entry((tp.clone(), key))
                    .or_default()
                    .seen
                    .push((*offset, s));
            }
        }
    }

    let mut stats: BTreeMap<&str, CompactedTopic> = settings
        .keys()
        .map(|t| {
            (
                *t,
                CompactedTopic {
                    topic: t.to_string(),
                    ..CompactedTopic::default()
                },
            )
        })
        .collect();
    let mut key_names: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for ((tp, key), k) in &keys {
        let topic = tp.0.as_str();
        let Some(compaction) = settings.get(topic).copied() else {
            continue;
        };
        let deadlines = Deadlines {
            settings: compaction,
            appends: appends.get(tp),
        };
        let judge = KeyCheck {
            tp,
            key,
            k,
            deadlines: &deadlines,
            read_started_ms: read_started.get(topic).copied().or(drained_ms),
            read_done_ms: read_done.get(topic).copied(),
            complete: committed_read.complete.contains(tp),
        };
        let Some(st) = stats.get_mut(topic) else {
            continue;
        };
        judge.run(st, c);
        if k.writes.iter().any(|w| w.certain()) {
            key_names.entry(topic).or_default().insert(key);
        }
    }
    for (topic, names) in key_names {
        if let Some(st) = stats.get_mut(topic) {
            st.keys = names.len();
        }
    }
    stats.into_values().collect()
}

impl Write<'_> {
    fn certain(&self) -> bool {
        matches!(self.status, Status::Certain { .. })
    }

    fn since_ms(&self) -> Option<i64> {
        match self.status {
            Status::Certain { since_ms } => since_ms,
            _ => None,
        }
    }
}

/// One key of one partition: its writes (in send order) and the records
/// of it the final read saw (by offset).
#[derive(Default)]
struct Key<'w, 's> {
    writes: Vec<&'w Write<'w>>,
    seen: Vec<(i64, &'s Seen<'s>)>,
}

struct KeyCheck<'a, 'w, 's> {
    tp: &'a Tp,
    key: &'a str,
    k: &'a Key<'w, 's>,
    deadlines: &'a Deadlines<'a>,
    read_started_ms: Option<i64>,
    /// When the final read_committed read ended (all of it fetched).
    read_done_ms: Option<i64>,
    complete: bool,
}

impl KeyCheck<'_, '_, '_> {
    fn at(&self, offset: i64) -> String {
        format!("{}[{}]@{offset}", self.tp.0, self.tp.1)
    }

    fn run(&self, st: &mut CompactedTopic, c: &mut Collector) {
        let (tp, key, k) = (self.tp, self.key, self.k);
        let certain: Vec<&Write<'_>> = k.writes.iter().copied().filter(|w| w.certain()).collect();
        st.writes += certain.len();
        st.tombstones += certain.iter().filter(|w| w.tombstone).count();
        st.read += k.seen.len();
        st.tombstones_read += k.seen.iter().filter(|(_, s)| s.tombstone).count();

        // Certain writes with an offset, by offset, and the earliest time
        // a write from each position on was in the log.
        let mut placed: Vec<(i64, &Write<'_>)> = certain
            .iter()
            .filter_map(|w| w.offset.map(|o| (o, *w)))
            .collect();
        placed.sort_by_key(|(o, _)| *o);
        let mut earliest: Option<(i64, &Write<'_>)> = None;
        let mut earliest_from: Vec<Option<(i64, &Write<'_>)>> = placed
            .iter()
            .rev()
            .map(|(_, w)| {
                if let Some(t) = w.since_ms() {
                    if earliest.is_none_or(|(e, _)| t < e) {
                        earliest = Some((t, *w));
                    }
                }
                earliest
            })
            .collect();
        earliest_from.reverse();
        // The earliest-known write above `offset`: (when, which).
        let superseded_by = |offset: i64| {
            let i = placed.partition_point(|(o, _)| *o <= offset);
            earliest_from.get(i).copied().flatten()
        };
        let read_started = self.read_started_ms;
        let due = |deadline: Option<i64>| match (deadline, read_started) {
            (Some(d), Some(r)) => d <= r,
            _ => false,
        };

        // How many writes had to be gone by the read.
        for (offset, w) in &placed {
            let superseded_due =
                superseded_by(*offset).is_some_and(|(t, _)| due(self.deadlines.pass_by(t)));
            let tombstone_due = w.tombstone
                && w.since_ms()
                    .is_some_and(|t| due(self.deadlines.tombstone_gone_by(t)));
            if superseded_due || tombstone_due {
                st.due_for_removal += 1;
            }
        }

        // What the read saw: superseded records past their deadline,
        // tombstones past theirs.
        for (offset, s) in &k.seen {
            if placed.last().is_some_and(|(o, _)| o > offset) {
                st.superseded_read += 1;
            }
            let Some((since, by)) = superseded_by(*offset) else {
                if s.tombstone {
                    self.tombstone_overdue(*offset, s, c);
                }
                continue;
            };
            let deadline = self.deadlines.pass_by(since);
            if due(deadline) {
                let (Some(deadline), Some(read)) = (deadline, read_started) else {
                    continue;
                };
                c.add(AnomalyKind::CompactionOverdue, || {
                    format!(
                        "{} key {key}: {} is still there, though {} ({}) replaced it {} ms before the final read began; a cleaning pass was due {} ms before it (max.compaction.lag.ms {}, grace {} ms)",
                        self.at(*offset),
                        s.value,
                        by.value,
                        by.offset.map_or("?".into(), |o| format!("@{o}")),
                        read - since,
                        read - deadline,
                        self.deadlines.settings.max_lag_ms.unwrap_or_default(),
                        self.deadlines.settings.grace_ms,
                    )
                });
            } else if s.tombstone {
                self.tombstone_overdue(*offset, s, c);
            }
        }

        if !self.complete {
            return;
        }
        // The latest certain write with an offset must be there, unless
        // a later record of the key may have replaced it.
        let top_seen = k.seen.iter().map(|(o, _)| *o).max();
        let mut later_tombstone_at: Option<i64> = None;
        let mut tombstone_somewhere = false;
        for w in &k.writes {
            if w.tombstone && w.status != Status::Impossible {
                match w.offset {
                    Some(o) => later_tombstone_at = later_tombstone_at.max(Some(o)),
                    None => tombstone_somewhere = true,
                }
            }
        }
        let replaced_above = |offset: i64| {
            tombstone_somewhere
                || top_seen.is_some_and(|o| o > offset)
                || later_tombstone_at.is_some_and(|o| o > offset)
        };
        let seen_at = |w: &Write<'_>, offset: i64| {
            k.seen
                .iter()
                .any(|(o, s)| *o == offset && s.value == w.value)
        };
        if let Some((offset, latest)) = placed.last() {
            let there = seen_at(latest, *offset);
            if !latest.tombstone && !there && !replaced_above(*offset) {
                c.add(AnomalyKind::CompactedLatestMissing, || {
                    format!(
                        "{} key {key}: {}, the latest write of the key{}, is not in the final read",
                        self.at(*offset),
                        latest.value,
                        latest
                            .txn
                            .map_or(String::new(), |t| format!(" (committed transaction {t})"))
                    )
                });
            }
            // A tombstone stays for delete.retention.ms at least.
            let anywhere = k.seen.iter().any(|(_, s)| s.value == latest.value);
            if latest.tombstone && !anywhere && !replaced_above(*offset) {
                let retention = self.deadlines.settings.delete_retention_ms;
                if let (Some(done), Some((_, acked)), Some(retention)) =
                    (self.read_done_ms, latest.ack, retention)
                {
                    if done < acked.saturating_add(retention) {
                        c.add(AnomalyKind::TombstoneEarly, || {
                            format!(
                                "{} key {key}: tombstone {}, the latest write of the key, was gone from a final read that ended {} ms after it was acknowledged (delete.retention.ms {retention})",
                                self.at(*offset),
                                latest.value,
                                done - acked
                            )
                        });
                    }
                }
            }
            // A tombstone gone, and an older value of its key the latest
            // record left: the key is back.
            if latest.tombstone && !there {
                if let Some((o, s)) = k.seen.iter().max_by_key(|(o, _)| *o) {
                    if *o < *offset && !s.tombstone {
                        c.add(AnomalyKind::Resurrected, || {
                            format!(
                                "{} key {key}: tombstone {} is gone, but the older {} at @{o} is still in the final read",
                                self.at(*offset),
                                latest.value,
                                s.value
                            )
                        });
                    }
                }
            }
        }
        // Certain writes whose offset nobody knows (acknowledged without
        // one, never seen): some record of the key must have replaced them.
        for w in certain
            .iter()
            .filter(|w| w.offset.is_none() && !w.tombstone)
        {
            if !(tombstone_somewhere || top_seen.is_some() || later_tombstone_at.is_some()) {
                c.add(AnomalyKind::CompactedLatestMissing, || {
                    format!(
                        "{}[{}] key {key}: {} (acknowledged without an offset) is not in the final read, nor any record of its key that could have replaced it",
                        tp.0, tp.1, w.value
                    )
                });
            }
        }
    }

    /// A tombstone the read saw that no later write supersedes: gone by
    /// its deadline.
    fn tombstone_overdue(&self, offset: i64, s: &Seen<'_>, c: &mut Collector) {
        let Some(w) = self
            .k
            .writes
            .iter()
            .find(|w| w.value == s.value && w.tombstone)
        else {
            return;
        };
        let (Some(since), Some(read)) = (w.since_ms(), self.read_started_ms) else {
            return;
        };
        let Some(deadline) = self.deadlines.tombstone_gone_by(since) else {
            return;
        };
        if deadline <= read {
            let settings = self.deadlines.settings;
            c.add(AnomalyKind::TombstoneOverdue, || {
                format!(
                    "{} key {}: tombstone {} written {} ms before the final read began is still there; it was due {} ms before it (max.compaction.lag.ms {}, delete.retention.ms {}, grace {} ms)",
                    self.at(offset),
                    self.key,
                    s.value,
                    read - since,
                    read - deadline,
                    settings.max_lag_ms.unwrap_or_default(),
                    settings.delete_retention_ms.unwrap_or_default(),
                    settings.grace_ms
                )
            });
        }
    }
}

/// A read of a compacted topic whose key or tombstone-ness is not what
/// was sent with its value is a record nobody sent.
fn check_keys_as_sent(
    history: &[Event],
    settings: &BTreeMap<&str, Compaction>,
    writes: &[Write<'_>],
    by_value: &HashMap<&str, usize>,
    c: &mut Collector,
) {
    let describe = |key: Option<&str>, tombstone: bool| {
        format!(
            "key {}{}",
            key.unwrap_or("(none)"),
            if tombstone { ", tombstone" } else { "" }
        )
    };
    for e in history {
        let EventKind::FinalRead {
            isolation,
            topic,
            partition,
            offset,
            value,
            key,
            tombstone,
        } = &e.kind
        else {
            continue;
        };
        if !settings.contains_key(topic.as_str()) {
            continue;
        }
        let Some(w) = by_value.get(value.as_str()).and_then(|i| writes.get(*i)) else {
            continue;
        };
        let sent_key = (!w.key.is_empty()).then_some(w.key);
        if key.as_deref() != sent_key || *tombstone != w.tombstone {
            c.add(AnomalyKind::UnknownValue, || {
                format!(
                    "{value:?} in the final {} read at {topic}[{partition}]@{offset} with {}, sent with {}",
                    isolation.as_config(),
                    describe(key.as_deref(), *tombstone),
                    describe(sent_key, w.tombstone)
                )
            });
        }
    }
}
