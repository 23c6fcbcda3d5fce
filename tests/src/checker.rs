//! The exactly-once checker (TESTING.md, "Checking exactly-once").
//!
//! A test records, on the client side, every send (with a value unique in the
//! test), every acknowledgement (partition, offset) or delivery failure, and
//! every record it reads back. [`EosChecker::check`] then reports:
//!
//! - **lost**: an acknowledged record that was never read;
//! - **duplicates**: a value read at more than one (partition, offset);
//! - **offset conflicts**: one (partition, offset) read with two different values;
//! - **ack mismatches**: a record read somewhere other than where it was acknowledged;
//! - **order violations**: two records of one producer in one partition whose
//!   log order differs from their send order;
//! - **unknown**: a value read that no producer sent;
//! - **aborted read**: a record of an aborted transaction that a reader saw.
//!
//! Records that were sent but neither acknowledged nor read are fine (their
//! fate is unknown to the client, e.g. in flight when the broker died); records
//! whose delivery failed may be present exactly once.
//!
//! [`KeyChecker`] is the by-key variant for pipelines, where records are
//! written by stage processes the test does not see: every input key must be
//! read from the final topic exactly once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Shared handle for checkers fed from callbacks on other threads.
pub type SharedChecker = Arc<Mutex<EosChecker>>;

#[derive(Debug, Clone)]
struct SendRec {
    producer: String,
    /// Position in its producer's send order.
    order: u64,
    ack: Option<(i32, i64)>,
    failed: Option<String>,
    aborted: bool,
}

/// Collects sends, acknowledgements and reads; see the module docs.
#[derive(Debug, Default)]
pub struct EosChecker {
    sends: Vec<SendRec>,
    by_value: HashMap<Vec<u8>, usize>,
    next_order: HashMap<String, u64>,
    /// (partition, offset) -> values read there (normally exactly one).
    reads: BTreeMap<(i32, i64), Vec<Vec<u8>>>,
    read_events: usize,
}

impl EosChecker {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn shared() -> SharedChecker {
        Arc::new(Mutex::new(Self::new()))
    }

    /// Records that `producer` is about to send `value` (unique per test).
    /// Sends of one producer are ordered by the calls to this method.
    pub fn send(&mut self, producer: &str, value: &[u8]) {
        assert!(
            !self.by_value.contains_key(value),
            "test bug: value {:?} sent twice; values must be unique",
            String::from_utf8_lossy(value)
        );
        let order = self.next_order.entry(producer.to_string()).or_insert(0);
        let rec = SendRec {
            producer: producer.to_string(),
            order: *order,
            ack: None,
            failed: None,
            aborted: false,
        };
        *order += 1;
        self.by_value.insert(value.to_vec(), self.sends.len());
        self.sends.push(rec);
    }

    /// Records the acknowledgement of `value` at (partition, offset); a
    /// negative offset means the client did not learn where.
    pub fn ack(&mut self, value: &[u8], partition: i32, offset: i64) {
        let i = self.index(value);
        if let Some(prev) = self.sends[i].ack {
            panic!(
                "value {:?} acknowledged twice: {prev:?} and {:?}",
                String::from_utf8_lossy(value),
                (partition, offset)
            );
        }
        self.sends[i].ack = Some((partition, offset));
    }

    /// Records that the client reported delivery of `value` as failed.
    pub fn fail(&mut self, value: &[u8], error: impl Into<String>) {
        let i = self.index(value);
        self.sends[i].failed = Some(error.into());
    }

    /// Marks `value` as part of an aborted transaction: no reader may see it.
    pub fn abort(&mut self, value: &[u8]) {
        let i = self.index(value);
        self.sends[i].aborted = true;
    }

    /// Records that a reader saw `value` at (partition, offset). Reading the
    /// same record again (same place, same value) is fine.
    pub fn read(&mut self, partition: i32, offset: i64, value: &[u8]) {
        self.read_events += 1;
        let vals = self.reads.entry((partition, offset)).or_default();
        if !vals.iter().any(|v| v == value) {
            vals.push(value.to_vec());
        }
    }

    fn index(&self, value: &[u8]) -> usize {
        *self.by_value.get(value).unwrap_or_else(|| {
            panic!(
                "test bug: value {:?} was never recorded as sent",
                String::from_utf8_lossy(value)
            )
        })
    }

    /// Number of acknowledged sends.
    pub fn acked(&self) -> usize {
        self.sends.iter().filter(|s| s.ack.is_some()).count()
    }

    /// Number of sends recorded.
    pub fn sent(&self) -> usize {
        self.sends.len()
    }

    /// Number of sends whose delivery failed.
    pub fn failed(&self) -> usize {
        self.sends.iter().filter(|s| s.failed.is_some()).count()
    }

    /// For each partition with an acknowledgement: highest acknowledged offset + 1
    /// (a reader must get at least this far).
    pub fn acked_end_offsets(&self) -> BTreeMap<i32, i64> {
        let mut m = BTreeMap::new();
        for s in &self.sends {
            if let Some((p, o)) = s.ack {
                let e = m.entry(p).or_insert(0);
                *e = (*e).max(o + 1);
            }
        }
        m
    }

    /// Runs every check.
    pub fn check(&self) -> EosReport {
        let show = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        let mut r = EosReport {
            sent: self.sends.len(),
            acked: self.acked(),
            failed: self.failed(),
            read_events: self.read_events,
            ..EosReport::default()
        };

        // Where each value was read.
        let mut seen_at: HashMap<&[u8], Vec<(i32, i64)>> = HashMap::new();
        for (&(p, o), vals) in &self.reads {
            if vals.len() > 1 {
                r.offset_conflicts.push(format!(
                    "partition {p} offset {o} read with {} different values: {:?}",
                    vals.len(),
                    vals.iter().map(|v| show(v)).collect::<Vec<_>>()
                ));
            }
            for v in vals {
                seen_at.entry(v.as_slice()).or_default().push((p, o));
            }
        }
        r.distinct_read = seen_at.len();

        for (v, places) in &seen_at {
            if places.len() > 1 {
                r.duplicates
                    .push(format!("{} read at {:?}", show(v), places));
                for &(p, o) in places {
                    r.duplicate_offsets.entry(p).or_default().push(o);
                }
            }
            match self.by_value.get(*v) {
                None => r
                    .unknown
                    .push(format!("{} read at {:?} but never sent", show(v), places)),
                Some(&i) => {
                    let s = &self.sends[i];
                    if s.aborted {
                        r.aborted_read
                            .push(format!("{} (aborted) read at {:?}", show(v), places));
                    }
                    if let Some(a) = s.ack {
                        // A negative offset is an acknowledgement without a
                        // place (librdkafka acks a batch "implicitly" when a
                        // later one of the same producer succeeds, with
                        // offset -1001): it counts for lost and duplicates.
                        if a.1 >= 0 && !places.contains(&a) {
                            r.ack_mismatches.push(format!(
                                "{} acknowledged at {a:?} but read at {places:?}",
                                show(v)
                            ));
                        }
                    } else if s.failed.is_some() {
                        r.failed_but_present += 1;
                    } else {
                        r.unacked_present += 1;
                    }
                }
            }
        }

        let mut values_by_index: Vec<Option<&[u8]>> = vec![None; self.sends.len()];
        for (v, &i) in &self.by_value {
            values_by_index[i] = Some(v.as_slice());
        }
        for (i, s) in self.sends.iter().enumerate() {
            if s.ack.is_some() && !s.aborted {
                let v = values_by_index[i].unwrap_or_default();
                if !seen_at.contains_key(v) {
                    r.lost.push(format!(
                        "{} acknowledged at {:?}, never read",
                        show(v),
                        s.ack
                    ));
                }
            }
        }

        // Per producer and partition, log order must follow send order.
        let mut last: HashMap<(&str, i32), (u64, i64, &[u8])> = HashMap::new();
        let mut counted: HashSet<&[u8]> = HashSet::new();
        for (&(p, o), vals) in &self.reads {
            for v in vals {
                if !counted.insert(v.as_slice()) {
                    continue; // only a value's first place counts for ordering
                }
                let Some(&i) = self.by_value.get(v.as_slice()) else {
                    continue;
                };
                let s = &self.sends[i];
                let key = (s.producer.as_str(), p);
                if let Some(&(prev_order, prev_off, prev_v)) = last.get(&key) {
                    if s.order < prev_order {
                        r.order_violations.push(format!(
                            "producer {} partition {p}: {} (send #{}) at offset {o} after {} (send #{prev_order}) at offset {prev_off}",
                            s.producer,
                            show(v),
                            s.order,
                            show(prev_v)
                        ));
                    }
                }
                last.insert(key, (s.order, o, v.as_slice()));
            }
        }

        for list in [
            &mut r.lost,
            &mut r.duplicates,
            &mut r.offset_conflicts,
            &mut r.ack_mismatches,
            &mut r.unknown,
            &mut r.aborted_read,
        ] {
            list.sort();
        }
        for offsets in r.duplicate_offsets.values_mut() {
            offsets.sort_unstable();
        }
        r
    }
}

/// The result of [`EosChecker::check`].
#[derive(Debug, Default, Clone)]
pub struct EosReport {
    pub sent: usize,
    pub acked: usize,
    pub failed: usize,
    pub read_events: usize,
    pub distinct_read: usize,
    /// Read, never acknowledged, no failure reported (fine).
    pub unacked_present: usize,
    /// Read although the client reported a delivery failure (fine: the
    /// failure may have come after the write).
    pub failed_but_present: usize,
    pub lost: Vec<String>,
    pub duplicates: Vec<String>,
    /// Partition -> every offset a duplicated value was read at (what a
    /// diagnosis looks up in the stored batches).
    pub duplicate_offsets: BTreeMap<i32, Vec<i64>>,
    pub offset_conflicts: Vec<String>,
    pub ack_mismatches: Vec<String>,
    pub order_violations: Vec<String>,
    pub unknown: Vec<String>,
    pub aborted_read: Vec<String>,
}

impl EosReport {
    pub fn is_ok(&self) -> bool {
        self.lost.is_empty()
            && self.duplicates.is_empty()
            && self.offset_conflicts.is_empty()
            && self.ack_mismatches.is_empty()
            && self.order_violations.is_empty()
            && self.unknown.is_empty()
            && self.aborted_read.is_empty()
    }

    /// Panics with the full report unless every check passed.
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "exactly-once check failed:\n{self}");
    }
}

impl fmt::Display for EosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sent {}, acked {}, failed {}, distinct read {} ({} read events), \
             read-but-unacked {}, read-but-failed {}",
            self.sent,
            self.acked,
            self.failed,
            self.distinct_read,
            self.read_events,
            self.unacked_present,
            self.failed_but_present
        )?;
        for (name, list) in [
            ("lost (acked, never read)", &self.lost),
            ("duplicates", &self.duplicates),
            ("offset conflicts", &self.offset_conflicts),
            ("ack mismatches", &self.ack_mismatches),
            ("order violations", &self.order_violations),
            ("unknown values", &self.unknown),
            ("aborted records read", &self.aborted_read),
        ] {
            writeln!(f, "{name}: {}", list.len())?;
            for item in list.iter().take(20) {
                writeln!(f, "  {item}")?;
            }
            if list.len() > 20 {
                writeln!(f, "  … and {} more", list.len() - 20)?;
            }
        }
        Ok(())
    }
}

/// Exactly-once by key, for pipelines: the test knows the set of input
/// keys, and a reader of the final topic records every (partition, offset,
/// key) it saw. [`KeyChecker::check`] reports input keys never seen
/// (**missing**), keys seen at more than one place (**duplicates**) and keys
/// that were never input (**unknown**). Re-reading one place is fine.
#[derive(Debug, Default)]
pub struct KeyChecker {
    expected: HashSet<Vec<u8>>,
    seen: HashMap<Vec<u8>, Vec<(i32, i64)>>,
    read_events: usize,
}

impl KeyChecker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `key` was input (keys must be unique).
    pub fn expect(&mut self, key: &[u8]) {
        assert!(
            self.expected.insert(key.to_vec()),
            "test bug: key {:?} input twice; keys must be unique",
            String::from_utf8_lossy(key)
        );
    }

    /// Records that a reader saw `key` at (partition, offset).
    pub fn read(&mut self, partition: i32, offset: i64, key: &[u8]) {
        self.read_events += 1;
        let places = self.seen.entry(key.to_vec()).or_default();
        if !places.contains(&(partition, offset)) {
            places.push((partition, offset));
        }
    }

    pub fn check(&self) -> KeyReport {
        let show = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        let mut r = KeyReport {
            expected: self.expected.len(),
            distinct_read: self.seen.len(),
            read_events: self.read_events,
            ..KeyReport::default()
        };
        for k in &self.expected {
            if !self.seen.contains_key(k) {
                r.missing.push(show(k));
            }
        }
        for (k, places) in &self.seen {
            if places.len() > 1 {
                let mut places = places.clone();
                places.sort_unstable();
                r.duplicates.push(format!("{} read at {places:?}", show(k)));
            }
            if !self.expected.contains(k) {
                r.unknown.push(format!("{} read at {places:?}", show(k)));
            }
        }
        for list in [&mut r.missing, &mut r.duplicates, &mut r.unknown] {
            list.sort();
        }
        r
    }
}

/// The result of [`KeyChecker::check`].
#[derive(Debug, Default, Clone)]
pub struct KeyReport {
    pub expected: usize,
    pub distinct_read: usize,
    pub read_events: usize,
    pub missing: Vec<String>,
    pub duplicates: Vec<String>,
    pub unknown: Vec<String>,
}

impl KeyReport {
    pub fn is_ok(&self) -> bool {
        self.missing.is_empty() && self.duplicates.is_empty() && self.unknown.is_empty()
    }

    /// Panics with the full report unless every key was read exactly once.
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "exactly-once-by-key check failed:\n{self}");
    }
}

impl fmt::Display for KeyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "keys expected {}, distinct read {} ({} read events)",
            self.expected, self.distinct_read, self.read_events
        )?;
        for (name, list) in [
            ("missing (input, never read)", &self.missing),
            ("duplicates", &self.duplicates),
            ("unknown keys", &self.unknown),
        ] {
            writeln!(f, "{name}: {}", list.len())?;
            for item in list.iter().take(20) {
                writeln!(f, "  {item}")?;
            }
            if list.len() > 20 {
                writeln!(f, "  … and {} more", list.len() - 20)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_history_passes() {
        let mut c = EosChecker::new();
        for i in 0..3 {
            c.send("p", format!("v{i}").as_bytes());
        }
        c.ack(b"v0", 0, 0);
        c.ack(b"v1", 0, 1);
        c.read(0, 0, b"v0");
        c.read(0, 1, b"v1");
        c.read(0, 1, b"v1"); // re-read is fine
        c.read(0, 2, b"v2"); // unacked but present is fine
        let r = c.check();
        r.assert_ok();
        assert_eq!(r.unacked_present, 1);
        assert_eq!(c.acked_end_offsets().get(&0), Some(&2));
    }

    #[test]
    fn an_ack_without_an_offset_counts_for_lost_and_duplicates_only() {
        let mut c = EosChecker::new();
        for v in ["once", "twice", "never"] {
            c.send("p", v.as_bytes());
        }
        for v in ["once", "twice", "never"] {
            c.ack(v.as_bytes(), 0, -1001);
        }
        c.read(0, 0, b"once");
        c.read(0, 1, b"twice");
        c.read(0, 2, b"twice");
        let r = c.check();
        assert!(r.ack_mismatches.is_empty(), "{r}");
        assert_eq!(r.duplicates.len(), 1, "{r}");
        assert_eq!(r.lost.len(), 1, "{r}");
    }

    #[test]
    fn every_violation_is_reported() {
        let mut c = EosChecker::new();
        for v in ["a", "b", "c", "d", "e", "f"] {
            c.send("p", v.as_bytes());
        }
        c.ack(b"a", 0, 0); // lost
        c.ack(b"b", 0, 1);
        c.read(0, 1, b"b");
        c.read(0, 5, b"b"); // duplicate
        c.read(0, 2, b"d");
        c.read(0, 3, b"c"); // order violation: c sent before d
        c.read(0, 4, b"e");
        c.read(0, 4, b"zzz"); // conflict + unknown
        c.ack(b"f", 1, 0);
        c.read(1, 7, b"f"); // ack mismatch
        c.abort(b"e"); // aborted read
        let r = c.check();
        assert!(!r.is_ok());
        assert_eq!(r.lost.len(), 1, "{r}");
        assert_eq!(r.duplicates.len(), 1, "{r}");
        assert_eq!(r.order_violations.len(), 1, "{r}");
        assert_eq!(r.offset_conflicts.len(), 1, "{r}");
        assert_eq!(r.unknown.len(), 1, "{r}");
        assert_eq!(r.ack_mismatches.len(), 1, "{r}");
        assert_eq!(r.aborted_read.len(), 1, "{r}");
    }

    #[test]
    fn keys_exactly_once() {
        let mut c = KeyChecker::new();
        for k in ["a", "b", "c"] {
            c.expect(k.as_bytes());
        }
        c.read(0, 0, b"a");
        c.read(0, 0, b"a"); // re-read of one place is fine
        c.read(1, 0, b"b");
        c.read(1, 1, b"c");
        c.check().assert_ok();

        c.read(2, 5, b"b"); // duplicate
        c.read(2, 6, b"z"); // unknown
        let mut d = KeyChecker::new();
        d.expect(b"m"); // missing
        let r = c.check();
        assert_eq!((r.duplicates.len(), r.unknown.len()), (1, 1), "{r}");
        assert_eq!(d.check().missing, vec!["m".to_string()]);
    }
}
