//! The report of a run (or of a re-checked history): per-workload counts,
//! the checker's findings, availability over time and, given a nemesis
//! fault log, unavailability per fault kind. Printed as text or as one
//! JSON object; built from the history alone (pure), so `samsa verify
//! check` reports exactly what the run did.
//!
//! Availability counts successful operations: acknowledged
//! non-transactional records and committed transactions; failed ones are
//! failed deliveries and failed commits. A gap is the time between two
//! successive successful operations (of any workload), bounded by the
//! first send and the moment producing stopped.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::check::{CompactedTopic, Finding, Findings, TxnCounts};
use crate::history::{Event, EventKind, Workload};

#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkloadStats {
    /// Records sent plus records polled.
    pub ops: u64,
    pub sends: u64,
    pub acks: u64,
    /// Failed deliveries of records outside transactions.
    pub ack_failures: u64,
    pub txns_committed: u64,
    pub txns_aborted: u64,
    pub commit_failures: u64,
    pub polls: u64,
    pub offset_commits: u64,
}

/// A stretch without a successful operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub start_ms: i64,
    pub end_ms: i64,
    pub ms: i64,
}

/// Successful and failed operations in one second of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Seconds since the start of the run.
    pub second: i64,
    pub ok: u64,
    pub failed: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkloadAvailability {
    pub longest_gap: Option<Gap>,
    pub buckets: Vec<Bucket>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Availability {
    pub start_ms: i64,
    pub end_ms: i64,
    /// Over every workload together.
    pub longest_gap: Option<Gap>,
    pub workloads: BTreeMap<Workload, WorkloadAvailability>,
}

/// One fault of a nemesis log (see docs/VERIFY.md for the format).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Fault {
    pub fault: String,
    #[serde(default)]
    pub targets: Vec<i64>,
    #[serde(default)]
    pub detail: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// Unavailability under one fault kind: the longest gap overlapping each
/// window of that kind, their median and the worst.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultStats {
    pub fault: String,
    pub count: usize,
    pub median_gap_ms: i64,
    pub worst_gap_ms: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub history: String,
    pub seed: Option<u64>,
    /// Zero anomalies.
    pub valid: bool,
    pub anomaly_count: usize,
    pub anomalies: Vec<Finding>,
    /// Partitions whose final read did not complete (not judged for loss).
    pub unchecked: Vec<String>,
    /// Whether the consumer groups caught up with their input before the end.
    pub drained: bool,
    pub transactions: TxnCounts,
    /// Per compacted topic: writes, what the final read still had, what
    /// had to be gone (only with the compact workload).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compacted: Vec<CompactedTopic>,
    pub workloads: BTreeMap<Workload, WorkloadStats>,
    pub availability: Availability,
    pub faults: Vec<FaultStats>,
}

#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: not a fault: {source}")]
pub struct FaultParseError {
    pub path: String,
    pub line: usize,
    pub source: serde_json::Error,
}

/// Parses a nemesis fault log (JSON Lines); lines without `fault` (the
/// header) are skipped.
pub fn parse_faults(path: &str, text: &str) -> Result<Vec<Fault>, FaultParseError> {
    let mut faults = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |source| FaultParseError {
            path: path.to_string(),
            line: n + 1,
            source,
        };
        let value: serde_json::Value = serde_json::from_str(line).map_err(err)?;
        if value.get("fault").is_none() {
            continue;
        }
        faults.push(serde_json::from_value(value).map_err(err)?);
    }
    Ok(faults)
}

fn workload_of(kind: &EventKind) -> Option<Workload> {
    match kind {
        EventKind::Send { workload, .. }
        | EventKind::Ack { workload, .. }
        | EventKind::AckFailed { workload, .. }
        | EventKind::TxnBegin { workload, .. }
        | EventKind::TxnOffsets { workload, .. }
        | EventKind::TxnCommitIssued { workload, .. }
        | EventKind::TxnCommitted { workload, .. }
        | EventKind::TxnCommitFailed { workload, .. }
        | EventKind::TxnAborted { workload, .. }
        | EventKind::TxnAbortFailed { workload, .. }
        | EventKind::Poll { workload, .. }
        | EventKind::OffsetCommitIssued { workload, .. }
        | EventKind::OffsetCommitted { workload, .. }
        | EventKind::OffsetCommitFailed { workload, .. }
        | EventKind::Assigned { workload, .. }
        | EventKind::Revoked { workload, .. }
        | EventKind::Seek { workload, .. } => Some(*workload),
        _ => None,
    }
}

/// Builds the report of `history` from the checker's `findings`.
pub fn build(
    history_path: &str,
    history: &[Event],
    findings: &Findings,
    faults: &[Fault],
) -> Report {
    let mut seed = None;
    let mut workloads: BTreeMap<Workload, WorkloadStats> = BTreeMap::new();
    let mut start_ms = history.first().map_or(0, |e| e.time_ms);
    let mut end_ms = None;
    // (time, workload, ok)
    let mut outcomes: Vec<(i64, Workload, bool)> = Vec::new();
    for e in history {
        if let EventKind::RunStarted {
            seed: s,
            workloads: ws,
            ..
        } = &e.kind
        {
            seed = Some(*s);
            start_ms = e.time_ms;
            for w in ws {
                workloads.entry(*w).or_default();
            }
        }
        if matches!(e.kind, EventKind::ProducingStopped {}) {
            end_ms = Some(e.time_ms);
        }
        let Some(w) = workload_of(&e.kind) else {
            continue;
        };
        let stats = workloads.entry(w).or_default();
        match &e.kind {
            EventKind::Send { .. } => {
                stats.sends += 1;
                stats.ops += 1;
            }
            EventKind::Poll { .. } => {
                stats.polls += 1;
                stats.ops += 1;
            }
            EventKind::Ack { txn, .. } => {
                stats.acks += 1;
                if txn.is_none() {
                    outcomes.push((e.time_ms, w, true));
                }
            }
            // A record of a failed transaction is that transaction's
            // failure, counted once in commit_failures (or an abort).
            EventKind::AckFailed { txn: None, .. } => {
                stats.ack_failures += 1;
                outcomes.push((e.time_ms, w, false));
            }
            EventKind::TxnCommitted { .. } => {
                stats.txns_committed += 1;
                outcomes.push((e.time_ms, w, true));
            }
            EventKind::TxnCommitFailed { .. } => {
                stats.commit_failures += 1;
                outcomes.push((e.time_ms, w, false));
            }
            EventKind::TxnAborted { .. } => stats.txns_aborted += 1,
            EventKind::OffsetCommitted { .. } => stats.offset_commits += 1,
            _ => {}
        }
    }
    // The load starts with the first send (clients are set up before).
    if let Some(first) = history
        .iter()
        .find(|e| matches!(e.kind, EventKind::Send { .. }))
    {
        start_ms = first.time_ms;
    }
    let end_ms = end_ms
        .or_else(|| history.last().map(|e| e.time_ms))
        .unwrap_or(start_ms);

    let successes = |only: Option<Workload>| -> Vec<i64> {
        let mut t: Vec<i64> = outcomes
            .iter()
            .filter(|(time, w, ok)| *ok && only.is_none_or(|o| o == *w) && *time <= end_ms)
            .map(|(time, _, _)| *time)
            .collect();
        t.sort_unstable();
        t
    };
    let all = gaps(start_ms, end_ms, &successes(None));
    let mut availability = Availability {
        start_ms,
        end_ms,
        longest_gap: all.iter().copied().max_by_key(|g| g.ms),
        workloads: BTreeMap::new(),
    };
    for w in workloads.keys() {
        let seconds = usize::try_from((end_ms - start_ms) / 1000 + 1).unwrap_or(0);
        let mut buckets: Vec<Bucket> = (0..seconds)
            .map(|s| Bucket {
                second: i64::try_from(s).unwrap_or(0),
                ..Bucket::default()
            })
            .collect();
        for (time, ow, ok) in &outcomes {
            if ow != w || *time < start_ms || *time > end_ms {
                continue;
            }
            let Ok(i) = usize::try_from((time - start_ms) / 1000) else {
                continue;
            };
            if let Some(b) = buckets.get_mut(i) {
                if *ok {
                    b.ok += 1;
                } else {
                    b.failed += 1;
                }
            }
        }
        availability.workloads.insert(
            *w,
            WorkloadAvailability {
                longest_gap: gaps(start_ms, end_ms, &successes(Some(*w)))
                    .into_iter()
                    .max_by_key(|g| g.ms),
                buckets,
            },
        );
    }

    let mut per_kind: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for f in faults {
        let worst = all
            .iter()
            .filter(|g| g.start_ms < f.end_ms && g.end_ms > f.start_ms)
            .map(|g| g.ms)
            .max();
        if let Some(worst) = worst {
            per_kind.entry(f.fault.as_str()).or_default().push(worst);
        }
    }
    let faults = per_kind
        .into_iter()
        .map(|(kind, mut gaps)| {
            gaps.sort_unstable();
            FaultStats {
                fault: kind.to_string(),
                count: gaps.len(),
                median_gap_ms: gaps[gaps.len() / 2],
                worst_gap_ms: gaps[gaps.len() - 1],
            }
        })
        .collect();

    Report {
        history: history_path.to_string(),
        seed,
        valid: findings.anomalies.is_empty(),
        anomaly_count: findings.anomaly_count(),
        anomalies: findings.anomalies.clone(),
        unchecked: findings.unchecked.clone(),
        drained: findings.drained,
        transactions: findings.txns.clone(),
        compacted: findings.compacted.clone(),
        workloads,
        availability,
        faults,
    }
}

/// The gaps between successive successes, from `start` to `end`.
fn gaps(start: i64, end: i64, successes: &[i64]) -> Vec<Gap> {
    let mut points = Vec::with_capacity(successes.len() + 2);
    points.push(start);
    points.extend(
        successes
            .iter()
            .copied()
            .filter(|t| *t >= start && *t <= end),
    );
    points.push(end);
    points
        .windows(2)
        .map(|w| Gap {
            start_ms: w[0],
            end_ms: w[1],
            ms: w[1] - w[0],
        })
        .collect()
}

impl Report {
    /// The process exit code: 0 clean, 1 anomalies, 2 a run that could not
    /// be checked in full (final reads incomplete).
    pub fn exit_code(&self) -> u8 {
        if !self.valid {
            1
        } else if !self.unchecked.is_empty() {
            2
        } else {
            0
        }
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        let seed = self.seed.map_or(String::new(), |s| format!(" (seed {s})"));
        let _ = writeln!(s, "history: {}{seed}", self.history);
        let _ = writeln!(
            s,
            "{:<11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8}",
            "workload",
            "ops",
            "sends",
            "acks",
            "failed",
            "committed",
            "aborted",
            "polls",
            "commits"
        );
        for (w, st) in &self.workloads {
            let _ = writeln!(
                s,
                "{:<11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8}",
                w.name(),
                st.ops,
                st.sends,
                st.acks,
                st.ack_failures + st.commit_failures,
                st.txns_committed,
                st.txns_aborted,
                st.polls,
                st.offset_commits
            );
        }
        let t = &self.transactions;
        let _ = writeln!(
            s,
            "transactions: {} committed, {} aborted, {} outcome unknown, {} never committed",
            t.committed, t.aborted, t.unknown, t.never_committed
        );
        for t in &self.compacted {
            let _ = writeln!(
                s,
                "compacted {}: {} writes ({} tombstones) over {} keys; the final read has {} records ({} tombstones, {} superseded); {} writes were due for removal",
                t.topic,
                t.writes,
                t.tombstones,
                t.keys,
                t.read,
                t.tombstones_read,
                t.superseded_read,
                t.due_for_removal
            );
        }
        let a = &self.availability;
        let _ = writeln!(
            s,
            "availability over {} s: longest gap without a successful ack {}",
            (a.end_ms - a.start_ms) / 1000,
            gap_text(a.longest_gap, a.start_ms)
        );
        for (w, wa) in &a.workloads {
            let idle = wa.buckets.iter().filter(|b| b.ok == 0).count();
            let failed: u64 = wa.buckets.iter().map(|b| b.failed).sum();
            let _ = writeln!(
                s,
                "  {:<10} longest gap {}; {idle} s without a success, {failed} failures",
                w.name(),
                gap_text(wa.longest_gap, a.start_ms)
            );
        }
        for f in &self.faults {
            let _ = writeln!(
                s,
                "fault {:<22} x{:<3} longest gap overlapping it: median {} ms, worst {} ms",
                f.fault, f.count, f.median_gap_ms, f.worst_gap_ms
            );
        }
        if !self.drained {
            let _ = writeln!(s, "warning: the consumer groups did not catch up with their input before the settle time ran out");
        }
        for u in &self.unchecked {
            let _ = writeln!(s, "unchecked (final read incomplete): {u}");
        }
        if self.anomalies.is_empty() {
            let _ = writeln!(s, "anomalies: none");
        } else {
            let _ = writeln!(s, "anomalies: {}", self.anomaly_count);
            for f in &self.anomalies {
                let _ = writeln!(s, "  {}: {}", f.kind.name(), f.count);
                for e in &f.examples {
                    let _ = writeln!(s, "    {e}");
                }
            }
        }
        let verdict = match self.exit_code() {
            0 => "OK",
            1 => "ANOMALIES FOUND",
            _ => "INCOMPLETE (final reads did not finish)",
        };
        let _ = writeln!(s, "result: {verdict}");
        s
    }
}

fn gap_text(gap: Option<Gap>, start: i64) -> String {
    match gap {
        Some(g) => format!(
            "{} ms (from +{:.1} s to +{:.1} s)",
            g.ms,
            (g.start_ms - start) as f64 / 1000.0,
            (g.end_ms - start) as f64 / 1000.0
        ),
        None => "-".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(time_ms: i64, kind: EventKind) -> Event {
        Event { time_ms, kind }
    }

    fn ack(time_ms: i64) -> Event {
        at(
            time_ms,
            EventKind::Ack {
                workload: Workload::Idempotent,
                producer: "p".into(),
                value: format!("v{time_ms}"),
                topic: "t".into(),
                partition: 0,
                offset: time_ms,
                txn: None,
            },
        )
    }

    #[test]
    fn gaps_buckets_and_faults() {
        let mut h = vec![at(
            0,
            EventKind::RunStarted {
                seed: 7,
                bootstrap: "b".into(),
                workloads: vec![Workload::Idempotent],
                topics: vec![],
                groups: vec![],
            },
        )];
        for t in [100, 200, 300, 3_300, 3_400] {
            h.push(ack(t));
        }
        h.push(at(
            3_500,
            EventKind::AckFailed {
                workload: Workload::Idempotent,
                producer: "p".into(),
                value: "x".into(),
                topic: "t".into(),
                partition: 0,
                txn: None,
                error: "e".into(),
            },
        ));
        h.push(at(4_000, EventKind::ProducingStopped {}));
        let faults = parse_faults(
            "f",
            "{\"seed\":1,\"schedule\":\"s\"}\n\
             {\"fault\":\"kill\",\"targets\":[2],\"detail\":\"\",\"start_ms\":1000,\"end_ms\":2000}\n\
             {\"fault\":\"kill\",\"targets\":[1],\"start_ms\":3350,\"end_ms\":3360}\n\
             {\"fault\":\"pause\",\"targets\":[1],\"start_ms\":9000,\"end_ms\":9500}\n",
        )
        .unwrap();
        assert_eq!(faults.len(), 3);
        let r = build("h", &h, &Findings::default(), &faults);
        assert_eq!(r.seed, Some(7));
        let g = r.availability.longest_gap.unwrap();
        assert_eq!((g.start_ms, g.end_ms, g.ms), (300, 3_300, 3_000));
        let w = &r.availability.workloads[&Workload::Idempotent];
        assert_eq!(w.buckets.len(), 5);
        assert_eq!(w.buckets[0].ok, 3);
        assert_eq!(w.buckets[1].ok, 0);
        assert_eq!((w.buckets[3].ok, w.buckets[3].failed), (2, 1));
        // Two kills (3000 ms and 100 ms gaps); the pause was outside the run.
        assert_eq!(
            r.faults,
            vec![FaultStats {
                fault: "kill".into(),
                count: 2,
                median_gap_ms: 3_000,
                worst_gap_ms: 3_000
            }]
        );
        assert_eq!(r.exit_code(), 0);
        assert!(r.text().contains("result: OK"), "{}", r.text());
    }
}
