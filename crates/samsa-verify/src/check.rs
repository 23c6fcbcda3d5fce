//! The checker: a history in, the anomalies it shows out. Pure (no IO, no
//! clock): the same history always gives the same findings, which is what
//! lets `samsa verify check` re-check a run offline.
//!
//! What it relates: sends and acknowledgements, transaction outcomes,
//! group polls and offset commits, and the final reads of every topic from
//! its beginning (read_committed and read_uncommitted). Partitions whose
//! final read did not complete are not judged for what is missing from
//! them (they are listed as unchecked instead), only for what was seen.
//!
//! Compacted topics ([`compaction`]) are judged by key instead: the latest
//! write of every key must be there, superseded records and tombstones
//! must go by the topic's deadlines, tombstones not before theirs, and a
//! deleted key must not come back;
//! the value-level checks (offsets, aborted reads, duplicates, order,
//! unknown values) apply to them as to every topic.
//!
//! A transaction's outcome is: committed (commit acknowledged), aborted
//! (abort acknowledged), unknown (commit issued, neither acknowledged nor
//! followed by an abort: all or nothing is fine, never a part) or never
//! committed (no commit issued: nothing of it may ever be visible).

mod compaction;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

pub use compaction::CompactedTopic;

use crate::history::{Event, EventKind, Isolation, TopicRole, Workload};

/// How many examples a finding keeps.
pub const MAX_EXAMPLES: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// Acknowledged (or in a transaction whose commit was acknowledged, or
    /// a pipeline input below a committed offset) but absent from the final read.
    Lost,
    /// One value at more than one offset in the final read_committed read
    /// (pipeline: one input with more than one output).
    Duplicate,
    /// Two different values seen at one (partition, offset).
    OffsetConflict,
    /// A read_committed read returned a record of an aborted transaction (G1a).
    AbortedRead,
    /// A read_committed poll returned a transaction's record before its
    /// commit was issued.
    ReadBeforeCommit,
    /// Some but not all records of a committed or unknown-outcome
    /// transaction are in the final read_committed read.
    TornTransaction,
    /// A consumer's polls of a partition went back or repeated within one assignment.
    PollBackwards,
    /// A group committed an offset past input it never processed.
    CommitSkipsInput,
    /// A group's committed offset went back.
    CommitBackwards,
    /// Two records of one producer in one partition are in the final read
    /// in an order other than the one they were sent in.
    Reordered,
    /// A read returned a value no producer of the run sent (or a sent
    /// value with another key, or as a tombstone when it was not one).
    UnknownValue,
    /// Compacted topic: the latest write of a key (acknowledged, or of a
    /// committed transaction; not a tombstone) is not at its offset in the
    /// final read, and no later record of the key could have replaced it.
    CompactedLatestMissing,
    /// Compacted topic: a record superseded by a later write of its key is
    /// still there after `max.compaction.lag.ms` (plus the grace).
    CompactionOverdue,
    /// Compacted topic: a tombstone is still there after
    /// `max.compaction.lag.ms` and `delete.retention.ms` (plus the grace).
    TombstoneOverdue,
    /// Compacted topic: a tombstone, the latest write of its key, is gone
    /// before `delete.retention.ms` passed since it was acknowledged.
    TombstoneEarly,
    /// Compacted topic: a key's tombstone is gone while an older value of
    /// the key is still there: a reader sees the deleted key again.
    Resurrected,
}

impl AnomalyKind {
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::Lost => "lost",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::OffsetConflict => "offset-conflict",
            AnomalyKind::AbortedRead => "aborted-read",
            AnomalyKind::ReadBeforeCommit => "read-before-commit",
            AnomalyKind::TornTransaction => "torn-transaction",
            AnomalyKind::PollBackwards => "poll-backwards",
            AnomalyKind::CommitSkipsInput => "commit-skips-input",
            AnomalyKind::CommitBackwards => "commit-backwards",
            AnomalyKind::Reordered => "reordered",
            AnomalyKind::UnknownValue => "unknown-value",
            AnomalyKind::CompactedLatestMissing => "compacted-latest-missing",
            AnomalyKind::CompactionOverdue => "compaction-overdue",
            AnomalyKind::TombstoneOverdue => "tombstone-overdue",
            AnomalyKind::TombstoneEarly => "tombstone-early",
            AnomalyKind::Resurrected => "resurrected",
        }
    }
}

/// One kind of anomaly: how often, and the first few cases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: AnomalyKind,
    pub count: usize,
    pub examples: Vec<String>,
}

/// Everything the checker concluded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Findings {
    /// Only kinds that occurred, in [`AnomalyKind`] order.
    pub anomalies: Vec<Finding>,
    /// Partitions whose final read did not reach its end (`topic[p] isolation`).
    pub unchecked: Vec<String>,
    /// Whether the groups caught up with their input in the drain.
    pub drained: bool,
    /// Transactions by outcome.
    pub txns: TxnCounts,
    /// What the final read of each compacted topic shows of its compaction.
    pub compacted: Vec<CompactedTopic>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TxnCounts {
    pub committed: usize,
    pub aborted: usize,
    pub unknown: usize,
    pub never_committed: usize,
}

impl Findings {
    pub fn anomaly_count(&self) -> usize {
        self.anomalies.iter().map(|f| f.count).sum()
    }

    pub fn count(&self, kind: AnomalyKind) -> usize {
        self.anomalies
            .iter()
            .find(|f| f.kind == kind)
            .map_or(0, |f| f.count)
    }
}

#[derive(Default)]
struct Collector {
    found: BTreeMap<AnomalyKind, (usize, Vec<String>)>,
}

impl Collector {
    fn add(&mut self, kind: AnomalyKind, example: impl FnOnce() -> String) {
        let entry = self.found.entry(kind).or_default();
        entry.0 += 1;
        if entry.1.len() < MAX_EXAMPLES {
            entry.1.push(example());
        }
    }

    fn into_findings(self) -> Vec<Finding> {
        self.found
            .into_iter()
            .map(|(kind, (count, examples))| Finding {
                kind,
                count,
                examples,
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Committed,
    Aborted { intentional: bool },
    Unknown,
    NeverCommitted,
}

#[derive(Debug, Default)]
struct Txn {
    workload: Option<Workload>,
    records: Vec<String>,
    offsets: Vec<(String, String, i32, i64)>,
    commit_issued_ms: Option<i64>,
    committed_ms: Option<i64>,
    aborted: Option<bool>,
}

impl Txn {
    fn outcome(&self) -> Outcome {
        if self.committed_ms.is_some() {
            Outcome::Committed
        } else if let Some(intentional) = self.aborted {
            Outcome::Aborted { intentional }
        } else if self.commit_issued_ms.is_some() {
            Outcome::Unknown
        } else {
            Outcome::NeverCommitted
        }
    }
}

struct SendInfo {
    workload: Workload,
    producer: String,
    txn: Option<String>,
    tp: Tp,
}

type Tp = (String, i32);

/// A final read: (topic, partition) → offset → value, and what completed.
#[derive(Default)]
struct FinalRead {
    records: BTreeMap<Tp, BTreeMap<i64, String>>,
    by_value: HashMap<String, Vec<(Tp, i64)>>,
    complete: HashSet<Tp>,
}

impl FinalRead {
    fn contains(&self, value: &str) -> bool {
        self.by_value.contains_key(value)
    }
}

/// The input id of a pipeline output value (`<input>@<worker>#<txn>`).
pub fn pipeline_input_of(output: &str) -> &str {
    output.split_once('@').map_or(output, |(input, _)| input)
}

/// Checks a history.
pub fn check(history: &[Event]) -> Findings {
    let mut c = Collector::default();
    let mut roles: HashMap<String, (Workload, TopicRole)> = HashMap::new();
    // Compacted topics: their records are judged by key, not one by one.
    let mut compacted: HashSet<String> = HashSet::new();
    let mut group_workload: HashMap<String, Workload> = HashMap::new();
    let mut sends: HashMap<String, SendInfo> = HashMap::new();
    let mut acks: Vec<(Workload, String, Tp, i64)> = Vec::new();
    let mut every_ack: Vec<(String, Tp, i64)> = Vec::new();
    let mut txns: BTreeMap<String, Txn> = BTreeMap::new();
    let mut committed_read = FinalRead::default();
    let mut uncommitted_read = FinalRead::default();
    let mut unchecked = Vec::new();
    let mut drained = true;
    // Every (partition, offset) → the values seen there and where.
    let mut seen_at: BTreeMap<(Tp, i64), BTreeMap<String, &'static str>> = BTreeMap::new();
    // Idempotent (not transactional) producers → how many of their records
    // librdkafka timed out (see the duplicates below).
    let mut message_timeouts: HashMap<String, usize> = HashMap::new();

    for e in history {
        match &e.kind {
            EventKind::RunStarted { topics, groups, .. } => {
                for t in topics {
                    roles.insert(t.topic.clone(), (t.workload, t.role));
                    if t.compaction.is_some() {
                        compacted.insert(t.topic.clone());
                    }
                }
                for g in groups {
                    group_workload.insert(g.group.clone(), g.workload);
                }
            }
            EventKind::Send {
                workload,
                producer,
                value,
                txn,
                topic,
                partition,
                ..
            } => {
                sends.insert(
                    value.clone(),
                    SendInfo {
                        workload: *workload,
                        producer: producer.clone(),
                        txn: txn.clone(),
                        tp: (topic.clone(), *partition),
                    },
                );
                if let Some(id) = txn {
                    let t = txns.entry(id.clone()).or_default();
                    t.workload = Some(*workload);
                    t.records.push(value.clone());
                }
            }
            EventKind::Ack {
                workload,
                value,
                topic,
                partition,
                offset,
                txn,
                ..
            } => {
                // An acknowledgement may carry no offset: librdkafka reports
                // -1001 for records a later batch's success acknowledged
                // implicitly (their own answer was lost) and on
                // DUPLICATE_SEQUENCE_NUMBER. Such a record must still be
                // there exactly once; only where is unknown.
                if *offset >= 0 {
                    seen_at
                        .entry(((topic.clone(), *partition), *offset))
                        .or_default()
                        .entry(value.clone())
                        .or_insert("ack");
                    every_ack.push((value.clone(), (topic.clone(), *partition), *offset));
                }
                if txn.is_none() {
                    acks.push((
                        *workload,
                        value.clone(),
                        (topic.clone(), *partition),
                        *offset,
                    ));
                }
            }
            EventKind::AckFailed {
                producer,
                txn: None,
                error,
                ..
            } if error.contains("MessageTimedOut") => {
                *message_timeouts.entry(producer.clone()).or_default() += 1;
            }
            EventKind::TxnBegin { workload, txn, .. } => {
                txns.entry(txn.clone()).or_default().workload = Some(*workload);
            }
            EventKind::TxnOffsets {
                txn,
                group,
                offsets,
                ..
            } => {
                let t = txns.entry(txn.clone()).or_default();
                for o in offsets {
                    t.offsets
                        .push((group.clone(), o.topic.clone(), o.partition, o.offset));
                }
            }
            EventKind::TxnCommitIssued { txn, .. } => {
                let t = txns.entry(txn.clone()).or_default();
                t.commit_issued_ms.get_or_insert(e.time_ms);
            }
            EventKind::TxnCommitted { txn, .. } => {
                txns.entry(txn.clone()).or_default().committed_ms = Some(e.time_ms);
            }
            EventKind::TxnAborted {
                txn, intentional, ..
            } => {
                txns.entry(txn.clone()).or_default().aborted = Some(*intentional);
            }
            EventKind::Poll {
                topic,
                partition,
                offset,
                value,
                ..
            } => {
                seen_at
                    .entry(((topic.clone(), *partition), *offset))
                    .or_default()
                    .entry(value.clone())
                    .or_insert("poll");
            }
            EventKind::Drained { complete, .. } => drained = *complete,
            EventKind::FinalRead {
                isolation,
                topic,
                partition,
                offset,
                value,
                ..
            } => {
                let tp = (topic.clone(), *partition);
                seen_at
                    .entry((tp.clone(), *offset))
                    .or_default()
                    .entry(value.clone())
                    .or_insert("final read");
                let read = match isolation {
                    Isolation::ReadCommitted => &mut committed_read,
                    Isolation::ReadUncommitted => &mut uncommitted_read,
                };
                read.records
                    .entry(tp.clone())
                    .or_default()
                    .insert(*offset, value.clone());
                read.by_value
                    .entry(value.clone())
                    .or_default()
                    .push((tp, *offset));
            }
            EventKind::FinalReadDone {
                isolation,
                topic,
                partitions,
                ..
            } => {
                let read = match isolation {
                    Isolation::ReadCommitted => &mut committed_read,
                    Isolation::ReadUncommitted => &mut uncommitted_read,
                };
                for p in partitions {
                    if p.complete {
                        read.complete.insert((topic.clone(), p.partition));
                    } else {
                        unchecked.push(format!(
                            "{topic}[{}] {} (end offset {})",
                            p.partition,
                            isolation.as_config(),
                            p.end_offset
                        ));
                    }
                }
            }
            _ => {}
        }
    }

    let outcome_of = |value: &str| -> Option<(&str, Outcome)> {
        let id = sends.get(value)?.txn.as_deref()?;
        Some((id, txns.get(id)?.outcome()))
    };

    // Lost: acknowledged non-transactional records missing from the final
    // read (compacted topics: see `compaction`).
    for (workload, value, tp, offset) in &acks {
        if committed_read.complete.contains(tp)
            && !committed_read.contains(value)
            && !compacted.contains(&tp.0)
        {
            c.add(AnomalyKind::Lost, || {
                format!(
                    "{}: {value} acknowledged at {}[{}]@{offset}, not in the final read",
                    workload.name(),
                    tp.0,
                    tp.1
                )
            });
        }
    }

    // Duplicates in the final read_committed read (a value at two offsets).
    for (value, places) in &committed_read.by_value {
        if places.len() > 1 {
            let send = sends.get(value);
            let workload = send.map_or("?", |s| s.workload.name());
            let timeouts = send
                .filter(|s| s.txn.is_none())
                .and_then(|s| message_timeouts.get(&s.producer))
                .copied()
                .unwrap_or(0);
            c.add(AnomalyKind::Duplicate, || {
                let at: Vec<String> = places
                    .iter()
                    .map(|((t, p), o)| format!("{t}[{p}]@{o}"))
                    .collect();
                // A message timeout makes librdkafka bump an idempotent
                // producer's epoch, and the records it was retrying on any
                // partition are then sent again under the new epoch, where
                // no broker can recognise them (a client-side duplicate).
                let hint = if timeouts > 0 {
                    format!(
                        " (its producer had {timeouts} message timeouts: librdkafka bumps the epoch then and resends retried records)"
                    )
                } else {
                    String::new()
                };
                format!("{workload}: {value} at {}{hint}", at.join(", "))
            });
        }
    }

    // Offset conflicts over acks, polls and both final reads.
    for ((tp, offset), values) in &seen_at {
        if values.len() > 1 {
            c.add(AnomalyKind::OffsetConflict, || {
                let vs: Vec<String> = values.iter().map(|(v, w)| format!("{v} ({w})")).collect();
                format!("{}[{}]@{offset}: {}", tp.0, tp.1, vs.join(" vs "))
            });
        }
    }

    // A record read only somewhere else than where it was acknowledged
    // (read there too and elsewhere as well is a duplicate).
    for (value, tp, offset) in &every_ack {
        for read in [&committed_read, &uncommitted_read] {
            let Some(places) = read.by_value.get(value) else {
                continue;
            };
            if places.iter().any(|(at, o)| at == tp && o == offset) {
                continue;
            }
            if let Some(((t, p), o)) = places.first() {
                c.add(AnomalyKind::OffsetConflict, || {
                    format!(
                        "{value} acknowledged at {}[{}]@{offset} but read at {t}[{p}]@{o}",
                        tp.0, tp.1
                    )
                });
                break;
            }
        }
    }

    // Aborted reads and reads before commit: polls (always read_committed)
    // and the final read_committed read.
    for e in history {
        let Some(SeenRecord {
            value,
            isolation: Isolation::ReadCommitted,
            poll_ms,
            place,
        }) = seen_record(e)
        else {
            continue;
        };
        let Some((id, outcome)) = outcome_of(value) else {
            continue;
        };
        match outcome {
            Outcome::Aborted { intentional } => c.add(AnomalyKind::AbortedRead, || {
                let why = if intentional {
                    "aborted on purpose"
                } else {
                    "aborted after an error"
                };
                format!("{value} of transaction {id} ({why}) {place}")
            }),
            Outcome::NeverCommitted => c.add(AnomalyKind::ReadBeforeCommit, || {
                format!("{value} of transaction {id} (no commit issued) {place}")
            }),
            Outcome::Committed | Outcome::Unknown => {
                let issued = txns.get(id).and_then(|t| t.commit_issued_ms);
                if let (Some(polled), Some(issued)) = (poll_ms, issued) {
                    if polled < issued {
                        c.add(AnomalyKind::ReadBeforeCommit, || {
                            format!(
                                "{value} of transaction {id} {place} at {polled}, commit issued at {issued}"
                            )
                        });
                    }
                }
            }
        }
    }

    // Torn (some records visible) or lost (none visible) transactions.
    let mut counts = TxnCounts::default();
    for (id, t) in &txns {
        let outcome = t.outcome();
        match outcome {
            Outcome::Committed => counts.committed += 1,
            Outcome::Aborted { .. } => counts.aborted += 1,
            Outcome::Unknown => counts.unknown += 1,
            Outcome::NeverCommitted => counts.never_committed += 1,
        }
        // Records on compacted topics may be gone legitimately: the
        // compaction checks judge them (an unknown outcome seen in part
        // counts as committed there).
        let records: Vec<&String> = t
            .records
            .iter()
            .filter(|v| sends.get(*v).is_none_or(|s| !compacted.contains(&s.tp.0)))
            .collect();
        if !matches!(outcome, Outcome::Committed | Outcome::Unknown) || records.is_empty() {
            continue;
        }
        // Only judge transactions whose partitions were all read to the end.
        let all_checked = records.iter().all(|v| {
            committed_read.contains(v)
                || sends
                    .get(v.as_str())
                    .is_none_or(|s| committed_read.complete.contains(&s.tp))
        });
        if !all_checked {
            continue;
        }
        let visible = records
            .iter()
            .filter(|v| committed_read.contains(v))
            .count();
        let workload = t.workload.map_or("?", Workload::name);
        if visible > 0 && visible < records.len() {
            c.add(AnomalyKind::TornTransaction, || {
                let missing: Vec<&str> = records
                    .iter()
                    .filter(|v| !committed_read.contains(v))
                    .map(|v| v.as_str())
                    .take(3)
                    .collect();
                format!(
                    "{workload}: transaction {id} ({}) has {visible} of {} records in the final read; missing {}",
                    if outcome == Outcome::Committed { "committed" } else { "outcome unknown" },
                    records.len(),
                    missing.join(", ")
                )
            });
        } else if visible == 0 && outcome == Outcome::Committed {
            for v in &records {
                c.add(AnomalyKind::Lost, || {
                    format!("{workload}: {v} of committed transaction {id} not in the final read")
                });
            }
        }
    }

    check_order(history, &committed_read, &mut c);
    for e in history {
        let Some(SeenRecord { value, place, .. }) = seen_record(e) else {
            continue;
        };
        if !sends.contains_key(value) {
            c.add(AnomalyKind::UnknownValue, || format!("{value:?} {place}"));
        }
    }
    check_polls(history, &mut c);
    check_queue_commits(history, &roles, &committed_read, &mut c);
    check_pipeline(&txns, &roles, &committed_read, &mut c);
    check_commit_order(history, &txns, &mut c);
    let compacted = compaction::check(history, &txns, &committed_read, &uncommitted_read, &mut c);

    Findings {
        anomalies: c.into_findings(),
        unchecked,
        drained,
        txns: counts,
        compacted,
    }
}

/// A record a reader saw, with where it was seen (for examples).
struct SeenRecord<'a> {
    value: &'a String,
    /// Polls are always read_committed.
    isolation: Isolation,
    /// When a poll saw it; `None` for the final reads.
    poll_ms: Option<i64>,
    place: String,
}

/// The record a poll or a final read saw; `None` for other events.
fn seen_record(e: &Event) -> Option<SeenRecord<'_>> {
    match &e.kind {
        EventKind::Poll {
            consumer,
            topic,
            partition,
            offset,
            value,
            ..
        } => Some(SeenRecord {
            value,
            isolation: Isolation::ReadCommitted,
            poll_ms: Some(e.time_ms),
            place: format!("polled by {consumer} at {topic}[{partition}]@{offset}"),
        }),
        EventKind::FinalRead {
            isolation,
            topic,
            partition,
            offset,
            value,
            ..
        } => Some(SeenRecord {
            value,
            isolation: *isolation,
            poll_ms: None,
            place: format!(
                "in the final {} read at {topic}[{partition}]@{offset}",
                isolation.as_config()
            ),
        }),
        _ => None,
    }
}

/// Each producer's records of one partition are in the final read in the
/// order it sent them (idempotent and transactional producers keep it).
fn check_order(history: &[Event], committed_read: &FinalRead, c: &mut Collector) {
    // (workload, producer, topic, partition) → (highest offset so far, its value).
    let mut last: HashMap<(Workload, &str, &str, i32), (i64, &str)> = HashMap::new();
    for e in history {
        let EventKind::Send {
            workload,
            producer,
            value,
            topic,
            partition,
            ..
        } = &e.kind
        else {
            continue;
        };
        let Some(places) = committed_read.by_value.get(value) else {
            continue;
        };
        let Some((_, offset)) = places
            .iter()
            .find(|((t, p), _)| t == topic && p == partition)
        else {
            continue;
        };
        let key = (*workload, producer.as_str(), topic.as_str(), *partition);
        match last.get(&key) {
            Some((prev, prev_value)) if offset < prev => {
                let prev_value = prev_value.to_string();
                c.add(AnomalyKind::Reordered, || {
                    format!(
                        "{}: {producer} sent {prev_value} before {value}, but they are at {topic}[{partition}]@{prev} and @{offset}",
                        workload.name()
                    )
                });
            }
            _ => {
                last.insert(key, (*offset, value.as_str()));
            }
        }
    }
}

/// Polls of one partition by one consumer go strictly forward between
/// assignments, revocations and seeks of it.
fn check_polls(history: &[Event], c: &mut Collector) {
    let mut last: HashMap<(String, Tp), i64> = HashMap::new();
    for e in history {
        match &e.kind {
            EventKind::Assigned {
                consumer,
                partitions,
                ..
            }
            | EventKind::Revoked {
                consumer,
                partitions,
                ..
            } => {
                for tp in partitions {
                    last.remove(&(consumer.clone(), (tp.topic.clone(), tp.partition)));
                }
            }
            EventKind::Seek {
                consumer,
                topic,
                partition,
                ..
            } => {
                last.remove(&(consumer.clone(), (topic.clone(), *partition)));
            }
            EventKind::Poll {
                workload,
                consumer,
                topic,
                partition,
                offset,
                ..
            } => {
                let key = (consumer.clone(), (topic.clone(), *partition));
                if let Some(prev) = last.insert(key, *offset) {
                    if *offset <= prev {
                        c.add(AnomalyKind::PollBackwards, || {
                            format!(
                                "{}: {consumer} polled {topic}[{partition}]@{offset} after @{prev}",
                                workload.name()
                            )
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// Queue groups: a committed offset k means every record below k was
/// polled by a member of the group before the commit was issued.
fn check_queue_commits(
    history: &[Event],
    roles: &HashMap<String, (Workload, TopicRole)>,
    committed_read: &FinalRead,
    c: &mut Collector,
) {
    // (group, topic, partition, offset) → first poll time by the group.
    let mut first_poll: HashMap<(String, Tp, i64), i64> = HashMap::new();
    let mut consumer_group: HashMap<String, String> = HashMap::new();
    let mut issued: HashMap<u64, (&Event, &str, &[crate::history::PartitionOffset])> =
        HashMap::new();
    for e in history {
        match &e.kind {
            EventKind::Assigned {
                consumer, group, ..
            } => {
                consumer_group.insert(consumer.clone(), group.clone());
            }
            EventKind::Poll {
                consumer,
                topic,
                partition,
                offset,
                ..
            } => {
                if let Some(group) = consumer_group.get(consumer) {
                    first_poll
                        .entry((group.clone(), (topic.clone(), *partition), *offset))
                        .or_insert(e.time_ms);
                }
            }
            EventKind::OffsetCommitIssued {
                group,
                commit,
                offsets,
                ..
            } => {
                issued.insert(*commit, (e, group.as_str(), offsets.as_slice()));
            }
            EventKind::OffsetCommitted {
                workload,
                consumer,
                commit,
                ..
            } => {
                let Some((issue, group, offsets)) = issued.get(commit) else {
                    continue;
                };
                for o in offsets.iter() {
                    let tp = (o.topic.clone(), o.partition);
                    if !committed_read.complete.contains(&tp)
                        || roles.get(&o.topic).is_none_or(|(w, _)| w != workload)
                    {
                        continue;
                    }
                    let Some(records) = committed_read.records.get(&tp) else {
                        continue;
                    };
                    let unpolled = records.range(..o.offset).find(|(off, _)| {
                        first_poll
                            .get(&(group.to_string(), tp.clone(), **off))
                            .is_none_or(|t| *t > issue.time_ms)
                    });
                    if let Some((off, value)) = unpolled {
                        c.add(AnomalyKind::CommitSkipsInput, || {
                            format!(
                                "{}: {consumer} committed {}[{}]={} for group {group}; {value} at offset {off} was not polled by then",
                                workload.name(),
                                o.topic,
                                o.partition,
                                o.offset
                            )
                        });
                    }
                }
            }
            _ => {}
        }
    }
}

/// The pipeline: every input record below a committed offset has its
/// output in the final read (else the commit skipped it and it is lost),
/// and no input has more than one output.
fn check_pipeline(
    txns: &BTreeMap<String, Txn>,
    roles: &HashMap<String, (Workload, TopicRole)>,
    committed_read: &FinalRead,
    c: &mut Collector,
) {
    let outputs: Vec<&String> = roles
        .iter()
        .filter(|(_, (_, role))| *role == TopicRole::PipelineOutput)
        .map(|(t, _)| t)
        .collect();
    if outputs.is_empty() {
        return;
    }
    // Input id → output values in the final read.
    let mut produced: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut outputs_complete = true;
    for topic in &outputs {
        for ((t, p), records) in &committed_read.records {
            if t == *topic {
                for value in records.values() {
                    produced
                        .entry(pipeline_input_of(value))
                        .or_default()
                        .push(value);
                }
                outputs_complete &= committed_read.complete.contains(&(t.clone(), *p));
            }
        }
    }
    for (input, outs) in &produced {
        if outs.len() > 1 {
            c.add(AnomalyKind::Duplicate, || {
                format!(
                    "pipeline: input {input} has {} outputs: {}",
                    outs.len(),
                    outs.join(", ")
                )
            });
        }
    }
    if !outputs_complete {
        return;
    }
    // Highest committed offset per input partition; every committed txn's
    // offsets checked against the input's final read.
    let mut highest: BTreeMap<Tp, i64> = BTreeMap::new();
    for (id, t) in txns {
        if t.outcome() != Outcome::Committed {
            continue;
        }
        for (group, topic, partition, offset) in &t.offsets {
            if roles.get(topic).map(|(_, r)| *r) != Some(TopicRole::PipelineInput) {
                continue;
            }
            let tp = (topic.clone(), *partition);
            if !committed_read.complete.contains(&tp) {
                continue;
            }
            let h = highest.entry(tp.clone()).or_insert(*offset);
            *h = (*h).max(*offset);
            let Some(records) = committed_read.records.get(&tp) else {
                continue;
            };
            if let Some((off, value)) = records
                .range(..*offset)
                .find(|(_, v)| !produced.contains_key(v.as_str()))
            {
                c.add(AnomalyKind::CommitSkipsInput, || {
                    format!(
                        "pipeline: transaction {id} committed {topic}[{partition}]={offset} for group {group}; input {value} at offset {off} has no output"
                    )
                });
            }
        }
    }
    for (tp, high) in &highest {
        let Some(records) = committed_read.records.get(tp) else {
            continue;
        };
        for (off, value) in records.range(..*high) {
            if !produced.contains_key(value.as_str()) {
                c.add(AnomalyKind::Lost, || {
                    format!(
                        "pipeline: input {value} at {}[{}]@{off} is below the committed offset {high} but has no output",
                        tp.0, tp.1
                    )
                });
            }
        }
    }
}

/// One acknowledged commit of a partition's offset: (issued_ms, acked_ms,
/// offset, who).
type Commit = (i64, i64, i64, String);

/// A group's committed offset of a partition never goes back: a commit
/// issued after another was acknowledged may not name a lower offset.
fn check_commit_order(history: &[Event], txns: &BTreeMap<String, Txn>, c: &mut Collector) {
    // (group, topic, partition) → commits (issued_ms, acked_ms, offset, who).
    let mut commits: BTreeMap<(String, String, i32), Vec<Commit>> = BTreeMap::new();
    let mut issued: HashMap<u64, &Event> = HashMap::new();
    for e in history {
        match &e.kind {
            EventKind::OffsetCommitIssued { commit, .. } => {
                issued.insert(*commit, e);
            }
            EventKind::OffsetCommitted { commit, .. } => {
                if let Some(issue) = issued.get(commit) {
                    if let EventKind::OffsetCommitIssued {
                        consumer,
                        group,
                        offsets,
                        ..
                    } = &issue.kind
                    {
                        for o in offsets {
                            commits
                                .entry((group.clone(), o.topic.clone(), o.partition))
                                .or_default()
                                .push((issue.time_ms, e.time_ms, o.offset, consumer.clone()));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for (id, t) in txns {
        let (Some(issued_ms), Some(committed_ms)) = (t.commit_issued_ms, t.committed_ms) else {
            continue;
        };
        for (group, topic, partition, offset) in &t.offsets {
            commits
                .entry((group.clone(), topic.clone(), *partition))
                .or_default()
                .push((
                    issued_ms,
                    committed_ms,
                    *offset,
                    format!("transaction {id}"),
                ));
        }
    }
    for ((group, topic, partition), list) in &mut commits {
        let mut by_ack: Vec<&Commit> = list.iter().collect();
        by_ack.sort_by_key(|x| x.1);
        let mut by_issue: Vec<&Commit> = list.iter().collect();
        by_issue.sort_by_key(|x| x.0);
        let mut acked = 0;
        let mut max_before: Option<&Commit> = None;
        for b in by_issue {
            while acked < by_ack.len() && by_ack[acked].1 < b.0 {
                if max_before.is_none_or(|m| by_ack[acked].2 > m.2) {
                    max_before = Some(by_ack[acked]);
                }
                acked += 1;
            }
            if let Some(a) = max_before {
                if b.2 < a.2 {
                    c.add(AnomalyKind::CommitBackwards, || {
                        format!(
                            "group {group} {topic}[{partition}]: {} committed {} after {} had committed {}",
                            b.3, b.2, a.3, a.2
                        )
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
