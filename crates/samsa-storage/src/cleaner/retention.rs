//! What a cleaning pass keeps: the decisions about records, batches and
//! transaction markers, made while the pass walks the cleaned range in
//! offset order. Pure: the caller reads the batches and writes the
//! survivors; nothing here touches a file.
//!
//! The rules (Kafka's log cleaner semantics):
//! - a record is kept if it is the latest of its key that the offset map
//!   knows (or lies past the part of the log the map covers); a record without a key
//!   goes (compacted topics refuse them, so only old data has any); a
//!   tombstone (no value) goes once its batch's delete horizon passed;
//! - every record of an aborted transaction goes;
//! - a transaction's marker stays while the pass met any batch of that
//!   transaction before it. Once a pass meets none, the marker may go
//!   (after its own delete horizon, which the caller keeps): so a marker
//!   outlives its records by at least one pass, and a read_committed
//!   reader never meets a transaction's records without the marker that
//!   decides them;
//! - an ABORT marker that stays keeps its entry in the cleaned segment's
//!   transaction index; one that goes takes its entry with it;
//! - a batch left empty goes, except the last batch of a producer that is
//!   still alive (it carries the last sequence and epoch idempotence
//!   needs) and the last batch of the pass (it carries the cleaned range's
//!   last offset): those stay, empty if their records go (an aborted
//!   transaction's last batch loses its records all the same).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::offset_map::OffsetMap;
use crate::txn_index::AbortedTxnEntry;

/// Whether a record survives the pass. `map_covers_until`: the offset
/// after the last batch whose keys went into `map`. `tombstone_due`: the
/// record's batch has a delete horizon and it has passed.
pub fn keep_record(
    map: &OffsetMap,
    map_covers_until: i64,
    offset: i64,
    key: Option<&[u8]>,
    has_value: bool,
    tombstone_due: bool,
) -> bool {
    if offset >= map_covers_until {
        return true;
    }
    let Some(key) = key else { return false };
    let latest = map.get(key).is_none_or(|latest| offset >= latest);
    latest && (has_value || !tombstone_due)
}

/// What happens to a batch and its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchFate {
    /// Every record goes and so does the batch (an aborted transaction's
    /// data, or a marker that may go).
    Drop,
    /// Every record goes, but the batch stays, empty: it is what a live
    /// producer's state ends with.
    KeepEmpty,
    /// The batch stays with the records kept; it goes if none are.
    DropIfEmpty,
    /// The batch stays with the records kept, even with none.
    KeepEvenIfEmpty,
}

impl BatchFate {
    /// Whether the batch's records are decided one by one (else all go).
    pub fn decides_records(self) -> bool {
        matches!(self, BatchFate::DropIfEmpty | BatchFate::KeepEvenIfEmpty)
    }

    /// Whether the batch stays when no record of it is left.
    pub fn stays_empty(self) -> bool {
        matches!(self, BatchFate::KeepEmpty | BatchFate::KeepEvenIfEmpty)
    }
}

/// The fate of a batch. `discard`: the pass decided all its records go (an
/// aborted transaction's data, or a marker past its horizon);
/// `last_of_live_producer`: it is the batch whose sequence (or, for a
/// marker, epoch) the producer's current state ends with;
/// `last_of_pass`: it ends the cleaned range.
pub fn batch_fate(discard: bool, last_of_live_producer: bool, last_of_pass: bool) -> BatchFate {
    match (discard, last_of_live_producer || last_of_pass) {
        (true, true) => BatchFate::KeepEmpty,
        (true, false) => BatchFate::Drop,
        (false, true) => BatchFate::KeepEvenIfEmpty,
        (false, false) => BatchFate::DropIfEmpty,
    }
}

/// What the pass decided about a transaction marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerFate {
    /// Records of its transaction were met in this pass: the marker stays;
    /// an ABORT's index entry stays with it.
    Keep {
        index_entry: Option<AbortedTxnEntry>,
    },
    /// No record of its transaction is left before it: it may go once its
    /// delete horizon passed.
    MayGo,
}

/// The transactions a pass is inside of, per producer.
#[derive(Debug, Default)]
pub struct TxnRetention {
    /// Aborted transactions of the cleaned range not yet reached, by first offset.
    pending_aborted: BTreeMap<i64, AbortedTxnEntry>,
    /// Producer → its aborted transaction the pass is inside, and whether a
    /// batch of it was met.
    open_aborted: HashMap<i64, (AbortedTxnEntry, bool)>,
    /// Producers with a transaction of which the pass met a batch and not
    /// yet the marker (one not in the aborted list: committed, or still
    /// open).
    open_other: HashSet<i64>,
}

impl TxnRetention {
    /// A pass over a range whose aborted transactions (from its segments'
    /// transaction indexes) are `aborted`.
    pub fn new(aborted: impl IntoIterator<Item = AbortedTxnEntry>) -> TxnRetention {
        TxnRetention {
            pending_aborted: aborted.into_iter().map(|e| (e.first_offset, e)).collect(),
            ..TxnRetention::default()
        }
    }

    /// Enters the aborted transactions that begin at or before `offset`.
    fn reach(&mut self, offset: i64) {
        while let Some(entry) = self.pending_aborted.first_entry() {
            if *entry.key() > offset {
                break;
            }
            let entry = entry.remove();
            // A producer's transactions follow each other: a newer one
            // beginning means any older one here has ended.
            self.open_aborted.insert(entry.producer_id, (entry, false));
        }
    }

    /// A data batch ending at `last_offset`: true if its records belong to
    /// an aborted transaction and go.
    pub fn on_data_batch(
        &mut self,
        producer_id: i64,
        transactional: bool,
        last_offset: i64,
    ) -> bool {
        self.reach(last_offset);
        if !transactional {
            return false;
        }
        match self.open_aborted.get_mut(&producer_id) {
            Some((_, met)) => {
                *met = true;
                true
            }
            None => {
                self.open_other.insert(producer_id);
                false
            }
        }
    }

    /// A control batch at `offset`; `commit` is its marker's kind, `None`
    /// for a control batch without a readable marker (an emptied one).
    pub fn on_marker(&mut self, producer_id: i64, offset: i64, commit: Option<bool>) -> MarkerFate {
        self.reach(offset);
        match commit {
            Some(false) => match self.open_aborted.remove(&producer_id) {
                Some((entry, true)) => MarkerFate::Keep {
                    index_entry: Some(entry),
                },
                _ => MarkerFate::MayGo,
            },
            Some(true) => {
                if self.open_other.remove(&producer_id) {
                    MarkerFate::Keep { index_entry: None }
                } else {
                    MarkerFate::MayGo
                }
            }
            None => MarkerFate::MayGo,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::cleaner::offset_map::DEFAULT_LOAD_FACTOR;

    fn map(entries: &[(&[u8], i64)]) -> OffsetMap {
        let mut m = OffsetMap::with_memory(24 * 64, DEFAULT_LOAD_FACTOR);
        for (k, o) in entries {
            m.put(k, *o).unwrap();
        }
        m
    }

    #[test]
    fn only_the_latest_value_of_a_key_survives() {
        let m = map(&[(b"a", 5), (b"b", 3)]);
        assert!(!keep_record(&m, 6, 1, Some(b"a"), true, false));
        assert!(keep_record(&m, 6, 5, Some(b"a"), true, false));
        assert!(keep_record(&m, 6, 3, Some(b"b"), true, false));
        // A key the map never saw (its latest value is older than the
        // dirty range) stays.
        assert!(keep_record(&m, 6, 2, Some(b"c"), true, false));
        // Past everything the map saw: not decided by this pass.
        assert!(keep_record(&m, 6, 6, Some(b"a"), true, false));
        assert!(keep_record(&m, 6, 6, None, true, true));
    }

    #[test]
    fn records_without_a_key_go() {
        let m = map(&[(b"a", 5)]);
        assert!(!keep_record(&m, 6, 1, None, true, false));
    }

    #[test]
    fn a_tombstone_stays_until_its_horizon_then_goes() {
        let m = map(&[(b"a", 5)]);
        assert!(keep_record(&m, 6, 5, Some(b"a"), false, false));
        assert!(!keep_record(&m, 6, 5, Some(b"a"), false, true));
        // The horizon only concerns tombstones.
        assert!(keep_record(&m, 6, 5, Some(b"a"), true, true));
    }

    #[test]
    fn empty_batches_go_unless_a_producer_or_the_pass_ends_with_them() {
        assert_eq!(batch_fate(false, false, false), BatchFate::DropIfEmpty);
        assert_eq!(batch_fate(true, false, false), BatchFate::Drop);
        assert_eq!(batch_fate(false, false, true), BatchFate::KeepEvenIfEmpty);
        assert_eq!(batch_fate(false, true, false), BatchFate::KeepEvenIfEmpty);
        // An aborted transaction's data that a live producer's state ends
        // with: the batch stays for its sequence, its records still go.
        let fate = batch_fate(true, true, false);
        assert_eq!(fate, BatchFate::KeepEmpty);
        assert!(!fate.decides_records() && fate.stays_empty());
        assert!(BatchFate::DropIfEmpty.decides_records() && !BatchFate::DropIfEmpty.stays_empty());
    }

    fn aborted(producer_id: i64, first_offset: i64, marker: i64) -> AbortedTxnEntry {
        AbortedTxnEntry {
            producer_id,
            first_offset,
            last_offset: marker,
            last_stable_offset: marker + 1,
        }
    }

    #[test]
    fn aborted_data_goes_and_its_marker_stays_for_one_more_pass() {
        // Producer 7 aborts 10..=11 (marker 12); producer 8 commits 11 (marker 13).
        let mut pass = TxnRetention::new([aborted(7, 10, 12)]);
        assert!(!pass.on_data_batch(1, false, 9));
        assert!(pass.on_data_batch(7, true, 10));
        assert!(!pass.on_data_batch(8, true, 11));
        assert!(pass.on_data_batch(7, true, 11));
        assert_eq!(
            pass.on_marker(7, 12, Some(false)),
            MarkerFate::Keep {
                index_entry: Some(aborted(7, 10, 12))
            }
        );
        assert_eq!(
            pass.on_marker(8, 13, Some(true)),
            MarkerFate::Keep { index_entry: None }
        );
        // The next pass: the aborted data is gone, the committed record was
        // superseded; both markers may go now.
        let mut next = TxnRetention::new([aborted(7, 10, 12)]);
        assert!(!next.on_data_batch(1, false, 9));
        assert_eq!(next.on_marker(7, 12, Some(false)), MarkerFate::MayGo);
        assert_eq!(next.on_marker(8, 13, Some(true)), MarkerFate::MayGo);
    }

    #[test]
    fn transactions_of_one_producer_follow_each_other() {
        // Producer 7: aborted 0..=1 (marker 2), committed 3 (marker 4),
        // aborted 5 (marker 6).
        let mut pass = TxnRetention::new([aborted(7, 0, 2), aborted(7, 5, 6)]);
        assert!(pass.on_data_batch(7, true, 1));
        assert!(matches!(
            pass.on_marker(7, 2, Some(false)),
            MarkerFate::Keep { .. }
        ));
        assert!(!pass.on_data_batch(7, true, 3));
        assert_eq!(
            pass.on_marker(7, 4, Some(true)),
            MarkerFate::Keep { index_entry: None }
        );
        assert!(pass.on_data_batch(7, true, 5));
        assert!(matches!(
            pass.on_marker(7, 6, Some(false)),
            MarkerFate::Keep { .. }
        ));
    }

    #[test]
    fn a_marker_without_a_readable_kind_may_go() {
        let mut pass = TxnRetention::new([]);
        assert_eq!(pass.on_marker(3, 0, None), MarkerFate::MayGo);
    }
}
