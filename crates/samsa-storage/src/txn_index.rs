//! The transaction index (`.txnindex`) of a segment: one entry per aborted
//! transaction whose ABORT marker is in the segment, which is what a
//! `read_committed` fetch needs to tell consumers which records to drop.
//!
//! File format: entries back to back, no header, 38 bytes each, big-endian:
//!
//! ```text
//! version i16 = 0 | producer_id i64 | first_offset i64 | last_offset i64
//! | last_stable_offset i64 | crc32c u32 of the 34 bytes before it
//! ```
//!
//! `first_offset` is the transaction's first offset (possibly in an earlier
//! segment), `last_offset` the offset of its ABORT marker, and
//! `last_stable_offset` the partition's first unstable offset just after the
//! marker: the first offset of the oldest transaction still ongoing then, or
//! `last_offset + 1` (not bounded by the high watermark). Any aborted
//! transaction whose marker comes later started at or after it, so a query
//! whose upper bound is at or below it can stop there.
//!
//! Invariants:
//! - entries are in marker order (`last_offset` strictly increasing), inside
//!   their segment, with `first_offset <= last_offset` and
//!   `last_stable_offset <= last_offset + 1`;
//! - the whole index is in memory; an entry is written to the file when added
//!   (aborts are rare, so there is no batching) and the file is fsynced when
//!   the segment is sealed. A failed write keeps the entry in memory and is
//!   retried by the next write; sealing reports it;
//! - a segment cannot rebuild its own index (a transaction's first offset may
//!   lie in an earlier segment): the log rebuilds it from a replay of producer
//!   state. A file that is missing, torn, fails a CRC or contradicts its
//!   segment is therefore reported, not repaired, here.
//!
//! This module is the one owner of the layout: tools that read `.txnindex`
//! files (`samsa dump-log`) go through [`TxnIndexEntries`], which yields the
//! entries as stored (version included) before the log's own checks.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::slice::ChunksExact;

use crate::fsutil::open_for_writes;

pub(crate) const TXN_INDEX_EXTENSION: &str = "txnindex";
const ENTRY_VERSION: i16 = 0;
const ENTRY_SIZE: usize = 38;
/// Bytes covered by an entry's CRC: everything before it.
const ENTRY_CRC_AT: usize = 34;

/// An aborted transaction as a `read_committed` fetch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// First offset of the transaction; its data may start in an earlier segment.
    pub first_offset: i64,
}

/// One entry of a transaction index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxnEntry {
    pub producer_id: i64,
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
    /// First unstable offset right after the marker (see the module docs).
    pub last_stable_offset: i64,
}

/// An entry as the file stores it: CRC checked, nothing else (the version,
/// and the entry against its segment, are the log's checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredTxnIndexEntry {
    pub version: i16,
    pub producer_id: i64,
    pub first_offset: i64,
    /// Offset of the ABORT marker.
    pub last_offset: i64,
    /// First unstable offset right after the marker (see the module docs).
    pub last_stable_offset: i64,
}

/// An entry whose stored CRC-32C is not the one of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
pub struct TxnIndexCrcMismatch {
    pub stored: u32,
    pub computed: u32,
}

/// The entries of a transaction index file's bytes, in file order, each
/// checked against its CRC. A tail shorter than an entry (a torn write) is
/// not yielded: [`TxnIndexEntries::trailing_bytes`] says how long it is.
pub struct TxnIndexEntries<'a> {
    chunks: ChunksExact<'a, u8>,
}

impl<'a> TxnIndexEntries<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        TxnIndexEntries {
            chunks: bytes.chunks_exact(ENTRY_SIZE),
        }
    }

    /// Bytes after the last whole entry.
    pub fn trailing_bytes(&self) -> usize {
        self.chunks.remainder().len()
    }
}

impl Iterator for TxnIndexEntries<'_> {
    type Item = Result<StoredTxnIndexEntry, TxnIndexCrcMismatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.chunks.next().map(StoredTxnIndexEntry::decode)
    }
}

fn be_i64(bytes: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    i64::from_be_bytes(b)
}

impl StoredTxnIndexEntry {
    /// `bytes` is exactly one entry ([`ENTRY_SIZE`] bytes).
    fn decode(bytes: &[u8]) -> Result<Self, TxnIndexCrcMismatch> {
        let stored = u32::from_be_bytes([
            bytes[ENTRY_CRC_AT],
            bytes[ENTRY_CRC_AT + 1],
            bytes[ENTRY_CRC_AT + 2],
            bytes[ENTRY_CRC_AT + 3],
        ]);
        let computed = crc32c::crc32c(&bytes[..ENTRY_CRC_AT]);
        if stored != computed {
            return Err(TxnIndexCrcMismatch { stored, computed });
        }
        Ok(StoredTxnIndexEntry {
            version: i16::from_be_bytes([bytes[0], bytes[1]]),
            producer_id: be_i64(bytes, 2),
            first_offset: be_i64(bytes, 10),
            last_offset: be_i64(bytes, 18),
            last_stable_offset: be_i64(bytes, 26),
        })
    }
}

impl AbortedTxnEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&ENTRY_VERSION.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.first_offset.to_be_bytes());
        out.extend_from_slice(&self.last_offset.to_be_bytes());
        out.extend_from_slice(&self.last_stable_offset.to_be_bytes());
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }

    /// An entry read back, if this version of samsa writes its version.
    fn from_stored(stored: StoredTxnIndexEntry) -> Result<Self, String> {
        if stored.version != ENTRY_VERSION {
            return Err(format!("unsupported entry version {}", stored.version));
        }
        Ok(AbortedTxnEntry {
            producer_id: stored.producer_id,
            first_offset: stored.first_offset,
            last_offset: stored.last_offset,
            last_stable_offset: stored.last_stable_offset,
        })
    }
}

/// A transaction index file and its complete in-memory copy.
pub(crate) struct TxnIndex {
    path: PathBuf,
    entries: Vec<AbortedTxnEntry>,
    /// Entries `[..persisted]` have been written to the file (not necessarily fsynced).
    persisted: usize,
}

impl TxnIndex {
    /// Creates an empty index, truncating any existing file.
    pub fn create(path: &Path) -> io::Result<Self> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(TxnIndex {
            path: path.to_path_buf(),
            entries: Vec::new(),
            persisted: 0,
        })
    }

    /// Opens (creating if missing) and reads the file. `Err(reason)` beside
    /// the index: the file was missing, not a whole number of entries, longer
    /// than `max_entries` entries, or an entry failed its check; the index is
    /// then empty and must be rebuilt before it is used.
    pub fn open(path: &Path, max_entries: u64) -> io::Result<(Self, Result<(), String>)> {
        let existed = path.exists();
        let file = open_for_writes(path)?;
        let len = file.metadata()?.len();
        let mut index = TxnIndex {
            path: path.to_path_buf(),
            entries: Vec::new(),
            persisted: 0,
        };
        let problem = if !existed {
            Err("the transaction index file is missing".to_owned())
        } else if len % ENTRY_SIZE as u64 != 0 {
            Err(format!("{len} bytes is not a whole number of entries"))
        } else if len > max_entries.saturating_mul(ENTRY_SIZE as u64) {
            Err(format!(
                "{len} bytes is more entries than the segment has batches"
            ))
        } else {
            let mut raw = vec![0u8; len as usize];
            file.read_exact_at(&mut raw, 0)?;
            TxnIndexEntries::new(&raw)
                .enumerate()
                .map(|(i, stored)| {
                    stored
                        .map_err(|crc| crc.to_string())
                        .and_then(AbortedTxnEntry::from_stored)
                        .map_err(|reason| format!("entry {i}: {reason}"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|entries| {
                    index.persisted = entries.len();
                    index.entries = entries;
                })
        };
        Ok((index, problem))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[AbortedTxnEntry] {
        &self.entries
    }

    /// Adds an entry and writes it. A failed write is not an error here: the
    /// entry stays in memory, the write is retried, and sealing the segment
    /// reports the failure.
    pub fn push(&mut self, entry: AbortedTxnEntry) {
        self.entries.push(entry);
        if let Err(e) = self.write_pending() {
            tracing::warn!(path = %self.path.display(), error = %e, "transaction index write failed; will retry");
        }
    }

    /// Writes every entry not yet in the file.
    pub fn write_pending(&mut self) -> io::Result<()> {
        if self.persisted == self.entries.len() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity((self.entries.len() - self.persisted) * ENTRY_SIZE);
        for entry in &self.entries[self.persisted..] {
            entry.encode(&mut bytes);
        }
        let file = open_for_writes(&self.path)?;
        crate::fsutil::write_all_at(&file, &bytes, (self.persisted * ENTRY_SIZE) as u64)?;
        self.persisted = self.entries.len();
        // A longer file (a torn tail from an earlier life) would be misread
        // after a restart; cut it.
        let want = (self.entries.len() * ENTRY_SIZE) as u64;
        if file.metadata()?.len() != want {
            crate::fsutil::set_len(&file, want)?;
        }
        Ok(())
    }

    /// Writes pending entries and fsyncs the file.
    pub fn sync(&mut self) -> io::Result<()> {
        self.write_pending()?;
        open_for_writes(&self.path)?.sync_data()
    }

    /// Replaces all entries (a rebuild) and rewrites the file, durably.
    pub fn replace(&mut self, entries: Vec<AbortedTxnEntry>) -> io::Result<()> {
        self.entries = entries;
        self.persisted = 0;
        crate::fsutil::set_len(&open_for_writes(&self.path)?, 0)?;
        self.sync()
    }

    /// Drops the entries of markers at or after `offset` (log truncation), durably.
    pub fn truncate_from(&mut self, offset: i64) -> io::Result<()> {
        let keep = self.entries.partition_point(|e| e.last_offset < offset);
        if keep == self.entries.len() {
            return Ok(());
        }
        self.entries.truncate(keep);
        self.persisted = self.persisted.min(keep);
        crate::fsutil::set_len(
            &open_for_writes(&self.path)?,
            (self.persisted * ENTRY_SIZE) as u64,
        )?;
        self.sync()
    }

    /// Checks the entries against a segment holding offsets
    /// `[base_offset, next_offset)`: the invariants of the module docs.
    pub fn validate(&self, base_offset: i64, next_offset: i64) -> Result<(), String> {
        let mut previous: Option<&AbortedTxnEntry> = None;
        for (i, e) in self.entries.iter().enumerate() {
            if e.last_offset < base_offset || e.last_offset >= next_offset {
                return Err(format!(
                    "entry {i} has its marker at {} outside the segment [{base_offset}, {next_offset})",
                    e.last_offset
                ));
            }
            if e.producer_id < 0
                || e.first_offset < 0
                || e.first_offset > e.last_offset
                || e.last_stable_offset > e.last_offset + 1
            {
                return Err(format!("entry {i} is inconsistent: {e:?}"));
            }
            if previous.is_some_and(|p| p.last_offset >= e.last_offset) {
                return Err(format!("entry {i} does not increase"));
            }
            previous = Some(e);
        }
        Ok(())
    }

    /// Adds to `out` every entry overlapping `[fetch_offset, upper_bound_offset)`.
    /// Returns true once an entry shows no later one can overlap (its last
    /// stable offset is at or above the upper bound), so the caller can stop.
    pub fn collect(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
        out: &mut Vec<AbortedTxn>,
    ) -> bool {
        let from = self
            .entries
            .partition_point(|e| e.last_offset < fetch_offset);
        for e in &self.entries[from..] {
            if e.first_offset < upper_bound_offset {
                out.push(AbortedTxn {
                    producer_id: e.producer_id,
                    first_offset: e.first_offset,
                });
            }
            if e.last_stable_offset >= upper_bound_offset {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn entry(producer_id: i64, first: i64, last: i64, lso: i64) -> AbortedTxnEntry {
        AbortedTxnEntry {
            producer_id,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        }
    }

    #[test]
    fn entries_round_trip_and_every_flipped_byte_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.txnindex");
        let mut index = TxnIndex::create(&path).unwrap();
        index.push(entry(7, 3, 10, 5));
        index.push(entry(8, 5, 12, 13));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            76,
            "written through"
        );
        index.sync().unwrap();
        let (reopened, problem) = TxnIndex::open(&path, 100).unwrap();
        problem.unwrap();
        assert_eq!(reopened.entries(), index.entries());
        reopened.validate(0, 13).unwrap();

        let good = std::fs::read(&path).unwrap();
        assert_eq!(good[..2], [0, 0], "version 0");
        assert_eq!(good[2..10], 7i64.to_be_bytes());
        for at in 0..good.len() {
            let mut bad = good.clone();
            bad[at] ^= 0x04;
            std::fs::write(&path, &bad).unwrap();
            let (index, problem) = TxnIndex::open(&path, 100).unwrap();
            assert!(problem.is_err(), "flip at {at} undetected");
            assert!(index.entries().is_empty());
        }
    }

    #[test]
    fn the_reader_yields_entries_as_stored_and_reports_crc_and_torn_tails() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.txnindex");
        let mut index = TxnIndex::create(&path).unwrap();
        index.push(entry(7, 3, 10, 5));
        index.push(entry(8, 5, 12, 13));
        let bytes = std::fs::read(&path).unwrap();
        let read: Vec<_> = TxnIndexEntries::new(&bytes).map(Result::unwrap).collect();
        let stored = |e: &AbortedTxnEntry| StoredTxnIndexEntry {
            version: ENTRY_VERSION,
            producer_id: e.producer_id,
            first_offset: e.first_offset,
            last_offset: e.last_offset,
            last_stable_offset: e.last_stable_offset,
        };
        assert_eq!(read, index.entries().iter().map(stored).collect::<Vec<_>>());
        assert_eq!(TxnIndexEntries::new(&bytes).trailing_bytes(), 0);

        let torn = &bytes[..ENTRY_SIZE + 5];
        let mut entries = TxnIndexEntries::new(torn);
        assert_eq!(entries.by_ref().count(), 1);
        assert_eq!(entries.trailing_bytes(), 5);

        let mut bad = bytes.clone();
        bad[ENTRY_SIZE + 3] ^= 0x10;
        let mut entries = TxnIndexEntries::new(&bad);
        assert!(entries.next().unwrap().is_ok());
        let mismatch = entries.next().unwrap().unwrap_err();
        assert_eq!(
            mismatch.stored,
            u32::from_be_bytes(bad[2 * ENTRY_SIZE - 4..2 * ENTRY_SIZE].try_into().unwrap())
        );
        assert_ne!(mismatch.stored, mismatch.computed);
    }

    #[test]
    fn missing_torn_or_oversized_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.txnindex");
        let (_, problem) = TxnIndex::open(&path, 100).unwrap();
        assert!(problem.is_err());
        assert!(path.exists(), "created for the rebuild to write into");
        let (_, problem) = TxnIndex::open(&path, 100).unwrap();
        problem.unwrap();

        let mut index = TxnIndex::create(&path).unwrap();
        index.push(entry(1, 0, 1, 2));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0; 5]);
        std::fs::write(&path, &bytes).unwrap();
        assert!(TxnIndex::open(&path, 100).unwrap().1.is_err());
        bytes.truncate(ENTRY_SIZE);
        std::fs::write(&path, &bytes).unwrap();
        assert!(TxnIndex::open(&path, 1).unwrap().1.is_ok());
        assert!(TxnIndex::open(&path, 0).unwrap().1.is_err());
        // A zero-filled entry (a torn write on some file systems) fails its CRC.
        std::fs::write(&path, [0u8; ENTRY_SIZE]).unwrap();
        assert!(TxnIndex::open(&path, 100).unwrap().1.is_err());
    }

    #[test]
    fn validation_checks_entries_against_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = TxnIndex::create(&dir.path().join("t")).unwrap();
        index
            .replace(vec![entry(1, 2, 20, 21), entry(2, 5, 25, 5)])
            .unwrap();
        index.validate(10, 26).unwrap();
        assert!(index.validate(21, 30).is_err(), "marker before the segment");
        assert!(index.validate(10, 25).is_err(), "marker after the segment");
        for bad in [
            vec![entry(1, 2, 20, 21), entry(2, 5, 20, 5)],
            vec![entry(1, 21, 20, 21)],
            vec![entry(1, 2, 20, 22)],
            vec![entry(-1, 2, 20, 21)],
        ] {
            index.replace(bad.clone()).unwrap();
            assert!(index.validate(0, 100).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn truncation_drops_markers_at_or_after_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let mut index = TxnIndex::create(&path).unwrap();
        for (i, last) in [10, 20, 30].into_iter().enumerate() {
            index.push(entry(i as i64, last - 5, last, last + 1));
        }
        index.truncate_from(20).unwrap();
        assert_eq!(index.entries().len(), 1);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), ENTRY_SIZE as u64);
        index.truncate_from(100).unwrap();
        assert_eq!(index.entries().len(), 1);
        index.push(entry(5, 15, 40, 41));
        let (reopened, problem) = TxnIndex::open(&path, 100).unwrap();
        problem.unwrap();
        assert_eq!(reopened.entries(), index.entries());
    }

    #[test]
    fn collect_returns_overlapping_entries_and_stops_at_a_stable_point() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = TxnIndex::create(&dir.path().join("t")).unwrap();
        // pid 1: [0, 10] while pid 2 (started 5) is open; pid 2: [5, 20]; pid 3: [30, 40].
        index
            .replace(vec![
                entry(1, 0, 10, 5),
                entry(2, 5, 20, 21),
                entry(3, 30, 40, 41),
            ])
            .unwrap();
        let run = |fetch, upper| {
            let mut out = Vec::new();
            let complete = index.collect(fetch, upper, &mut out);
            (
                out.iter().map(|a| a.producer_id).collect::<Vec<_>>(),
                complete,
            )
        };
        assert_eq!(run(0, 100), (vec![1, 2, 3], false));
        assert_eq!(run(11, 100), (vec![2, 3], false));
        assert_eq!(run(0, 5), (vec![1], true), "entry 2 starts at the bound");
        assert_eq!(run(0, 6), (vec![1, 2], true));
        assert_eq!(run(21, 30), (vec![], true));
        assert_eq!(run(41, 50), (vec![], false));
    }
}
