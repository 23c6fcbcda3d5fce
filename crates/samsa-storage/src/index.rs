//! The sparse offset index (`.index`) and time index (`.timeindex`) of a segment.
//!
//! Both are kept whole in memory and appended to their files lazily: entries
//! are written in blocks (positioned writes, so a failed or partial write is
//! simply rewritten later) and fsynced only when the segment is sealed (roll,
//! close). No descriptor is kept between writes: the file is opened for each
//! block and each sync, so indexes cost no descriptors (see `open_files`). A crash can therefore leave an index file short or torn; recovery
//! rebuilds the indexes of every segment it scans, and [`validate_offset_index`]
//! / [`validate_time_index`] reject index files that contradict their segment.
//!
//! Entry formats (big-endian):
//! - offset index: relative offset u32 (batch base offset − segment base offset),
//!   file position u32 of that batch; both strictly increasing.
//! - time index: timestamp i64 (largest timestamp of the segment so far), relative
//!   offset u32 of the last offset of the batch carrying it; timestamps strictly
//!   increasing, offsets non-decreasing.

use std::fmt::Debug;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::fsutil::open_for_writes;

/// Entries buffered in memory before they are written to the index file.
const WRITE_BLOCK_ENTRIES: usize = 512;

pub(crate) trait IndexEntry: Copy + Debug + Eq {
    const SIZE: usize;
    fn encode(&self, out: &mut Vec<u8>);
    fn decode(bytes: &[u8]) -> Self;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

impl IndexEntry for OffsetEntry {
    const SIZE: usize = 8;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Self {
        OffsetEntry {
            relative_offset: be_u32(&bytes[0..4]),
            position: be_u32(&bytes[4..8]),
        }
    }
}

impl IndexEntry for TimeEntry {
    const SIZE: usize = 12;
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.timestamp.to_be_bytes());
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
    }
    fn decode(bytes: &[u8]) -> Self {
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&bytes[0..8]);
        TimeEntry {
            timestamp: i64::from_be_bytes(ts),
            relative_offset: be_u32(&bytes[8..12]),
        }
    }
}

/// An index file and its complete in-memory copy.
pub(crate) struct IndexFile<E: IndexEntry> {
    path: PathBuf,
    entries: Vec<E>,
    /// Entries `[..persisted]` have been written to the file (not necessarily fsynced).
    persisted: usize,
    /// The last background write failed: logged once, not on every retry.
    write_failing: bool,
}

impl<E: IndexEntry> IndexFile<E> {
    /// Opens (creating if missing) and reads the file. Returns the index and
    /// whether the file looked intact: a whole number of entries, and at most
    /// `max_entries` of them (more than the segment could have means garbage,
    /// which is then not even read). The ignored part is overwritten later.
    pub fn open(path: &Path, max_entries: u64) -> io::Result<(Self, bool)> {
        let file = open_for_writes(path)?;
        let len = file.metadata()?.len();
        let plausible = len <= max_entries.saturating_mul(E::SIZE as u64);
        let entries: Vec<E> = if plausible {
            let mut raw = vec![0u8; len as usize];
            file.read_exact_at(&mut raw, 0)?;
            raw.chunks_exact(E::SIZE).map(E::decode).collect()
        } else {
            Vec::new()
        };
        let intact = plausible && len % E::SIZE as u64 == 0;
        let persisted = entries.len();
        Ok((
            IndexFile {
                path: path.to_path_buf(),
                entries,
                persisted,
                write_failing: false,
            },
            intact,
        ))
    }

    /// Creates an empty index, truncating any existing file.
    pub fn create(path: &Path) -> io::Result<Self> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(IndexFile {
            path: path.to_path_buf(),
            entries: Vec::new(),
            persisted: 0,
            write_failing: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[E] {
        &self.entries
    }

    pub fn last(&self) -> Option<&E> {
        self.entries.last()
    }

    /// Adds an entry; the file catches up once a block has accumulated. A
    /// failed background write is not an error here: the entry stays in memory,
    /// the write is retried, and sealing the segment reports the failure.
    pub fn push(&mut self, entry: E) {
        self.entries.push(entry);
        if self.entries.len() - self.persisted >= WRITE_BLOCK_ENTRIES {
            match self.write_pending() {
                Err(e) if !self.write_failing => {
                    self.write_failing = true;
                    tracing::warn!(path = %self.path.display(), error = %e, "index write failed; will retry");
                }
                Ok(()) if self.write_failing => {
                    self.write_failing = false;
                    tracing::info!(path = %self.path.display(), "index writes work again");
                }
                _ => {}
            }
        }
    }

    /// Writes every entry not yet in the file.
    pub fn write_pending(&mut self) -> io::Result<()> {
        if self.persisted == self.entries.len() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity((self.entries.len() - self.persisted) * E::SIZE);
        for entry in &self.entries[self.persisted..] {
            entry.encode(&mut bytes);
        }
        let file = open_for_writes(&self.path)?;
        crate::fsutil::write_all_at(&file, &bytes, (self.persisted * E::SIZE) as u64)?;
        self.persisted = self.entries.len();
        // A file longer than its entries (torn tail from an earlier life) would
        // be misread after a restart; cut it.
        let want = (self.entries.len() * E::SIZE) as u64;
        if file.metadata()?.len() != want {
            crate::fsutil::set_len(&file, want)?;
        }
        Ok(())
    }

    /// Writes pending entries and fsyncs the file (an fsync through any
    /// descriptor makes the file's data durable).
    pub fn sync(&mut self) -> io::Result<()> {
        self.write_pending()?;
        open_for_writes(&self.path)?.sync_data()
    }

    /// Replaces all entries (after a rebuild) and rewrites the file.
    pub fn replace(&mut self, entries: Vec<E>) -> io::Result<()> {
        self.entries = entries;
        self.persisted = 0;
        crate::fsutil::set_len(&open_for_writes(&self.path)?, 0)?;
        self.write_pending()
    }
}

impl IndexFile<OffsetEntry> {
    /// Position of the last indexed batch whose base offset is <= `relative_offset`
    /// (0 if none): where a scan for that offset starts.
    pub fn lookup(&self, relative_offset: i64) -> u64 {
        self.lookup_entry(relative_offset)
            .map_or(0, |e| u64::from(e.position))
    }

    /// The last entry whose relative offset is <= `relative_offset`, if any.
    pub fn lookup_entry(&self, relative_offset: i64) -> Option<OffsetEntry> {
        let idx = self
            .entries
            .partition_point(|e| i64::from(e.relative_offset) <= relative_offset);
        idx.checked_sub(1).map(|i| self.entries[i])
    }
}

impl IndexFile<TimeEntry> {
    /// The last entry whose timestamp is < `timestamp`: every batch appended
    /// before that entry was written has a smaller max timestamp, so a search
    /// for `timestamp` can start at its offset.
    pub fn last_below(&self, timestamp: i64) -> Option<TimeEntry> {
        let idx = self.entries.partition_point(|e| e.timestamp < timestamp);
        idx.checked_sub(1).map(|i| self.entries[i])
    }
}

/// Why an index file cannot be trusted.
pub(crate) type IndexProblem = String;

/// Checks an offset index against its segment: entries strictly increasing,
/// positions inside the log file, offsets inside the segment's offset range
/// (`max_relative_offset`, when known).
pub(crate) fn validate_offset_index(
    entries: &[OffsetEntry],
    log_size: u64,
    max_relative_offset: Option<i64>,
) -> Result<(), IndexProblem> {
    let mut previous: Option<&OffsetEntry> = None;
    for (i, e) in entries.iter().enumerate() {
        if u64::from(e.position) >= log_size {
            return Err(format!(
                "entry {i} points at position {} beyond the log size {log_size}",
                e.position
            ));
        }
        if let Some(max) = max_relative_offset {
            if i64::from(e.relative_offset) > max {
                return Err(format!(
                    "entry {i} has relative offset {} beyond the segment",
                    e.relative_offset
                ));
            }
        }
        if let Some(p) = previous {
            if e.relative_offset <= p.relative_offset || e.position <= p.position {
                return Err(format!("entry {i} does not increase"));
            }
        }
        previous = Some(e);
    }
    Ok(())
}

/// Checks a time index: timestamps strictly increasing, offsets non-decreasing
/// and inside the segment.
pub(crate) fn validate_time_index(
    entries: &[TimeEntry],
    max_relative_offset: Option<i64>,
) -> Result<(), IndexProblem> {
    let mut previous: Option<&TimeEntry> = None;
    for (i, e) in entries.iter().enumerate() {
        if let Some(max) = max_relative_offset {
            if i64::from(e.relative_offset) > max {
                return Err(format!(
                    "time entry {i} has relative offset {} beyond the segment",
                    e.relative_offset
                ));
            }
        }
        if let Some(p) = previous {
            if e.timestamp <= p.timestamp || e.relative_offset < p.relative_offset {
                return Err(format!("time entry {i} does not increase"));
            }
        }
        previous = Some(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn oe(relative_offset: u32, position: u32) -> OffsetEntry {
        OffsetEntry {
            relative_offset,
            position,
        }
    }

    #[test]
    fn entries_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.index");
        let mut index = IndexFile::<OffsetEntry>::create(&path).unwrap();
        for i in 0..1_000u32 {
            index.push(oe(i * 3, i * 100));
        }
        // Some entries were written in blocks already, the rest are pending.
        let on_disk = std::fs::metadata(&path).unwrap().len();
        assert_eq!(on_disk, (WRITE_BLOCK_ENTRIES * 8) as u64);
        index.sync().unwrap();
        let (reopened, whole) = IndexFile::<OffsetEntry>::open(&path, 10_000).unwrap();
        assert!(whole);
        assert_eq!(reopened.entries(), index.entries());
        assert_eq!(std::fs::read(&path).unwrap()[..8], [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            std::fs::read(&path).unwrap()[8..16],
            [0, 0, 0, 3, 0, 0, 0, 100]
        );
    }

    #[test]
    fn torn_tail_is_reported_and_cut_on_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.timeindex");
        let mut index = IndexFile::<TimeEntry>::create(&path).unwrap();
        index.push(TimeEntry {
            timestamp: 5,
            relative_offset: 1,
        });
        index.sync().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        let (mut reopened, whole) = IndexFile::<TimeEntry>::open(&path, 10_000).unwrap();
        assert!(!whole);
        assert_eq!(reopened.entries().len(), 1);
        reopened.push(TimeEntry {
            timestamp: 9,
            relative_offset: 2,
        });
        reopened.sync().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 24);
        let (too_many, intact) = IndexFile::<TimeEntry>::open(&path, 1).unwrap();
        assert!(!intact);
        assert!(too_many.entries().is_empty());
    }

    #[test]
    fn lookup_finds_floor_entry() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = IndexFile::<OffsetEntry>::create(&dir.path().join("i")).unwrap();
        assert_eq!(index.lookup(100), 0);
        index.push(oe(10, 1000));
        index.push(oe(20, 2000));
        assert_eq!(index.lookup(9), 0);
        assert_eq!(index.lookup(10), 1000);
        assert_eq!(index.lookup(19), 1000);
        assert_eq!(index.lookup(25), 2000);
    }

    #[test]
    fn replace_rewrites_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("i");
        let mut index = IndexFile::<OffsetEntry>::create(&path).unwrap();
        index.push(oe(1, 10));
        index.push(oe(2, 20));
        index.sync().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 16);
        index
            .replace(vec![oe(5, 50), oe(6, 60), oe(7, 70)])
            .unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 24);
    }

    #[test]
    fn time_lookup_is_strictly_below() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = IndexFile::<TimeEntry>::create(&dir.path().join("t")).unwrap();
        index.push(TimeEntry {
            timestamp: 100,
            relative_offset: 3,
        });
        index.push(TimeEntry {
            timestamp: 200,
            relative_offset: 8,
        });
        assert_eq!(index.last_below(100), None);
        assert_eq!(index.last_below(101).unwrap().relative_offset, 3);
        assert_eq!(index.last_below(200).unwrap().relative_offset, 3);
        assert_eq!(index.last_below(201).unwrap().relative_offset, 8);
    }

    #[test]
    fn validation_rejects_what_contradicts_the_segment() {
        assert!(validate_offset_index(&[oe(1, 10), oe(2, 20)], 100, Some(5)).is_ok());
        assert!(validate_offset_index(&[oe(1, 10), oe(2, 200)], 100, None).is_err());
        assert!(validate_offset_index(&[oe(2, 10), oe(2, 20)], 100, None).is_err());
        assert!(validate_offset_index(&[oe(1, 20), oe(2, 10)], 100, None).is_err());
        assert!(validate_offset_index(&[oe(9, 10)], 100, Some(5)).is_err());
        // A zero-filled file (torn write) is caught by the increase check.
        assert!(validate_offset_index(&[oe(0, 0), oe(0, 0)], 100, None).is_err());
        let t = |timestamp, relative_offset| TimeEntry {
            timestamp,
            relative_offset,
        };
        assert!(validate_time_index(&[t(1, 0), t(2, 0), t(3, 4)], Some(4)).is_ok());
        assert!(validate_time_index(&[t(1, 0), t(1, 1)], None).is_err());
        assert!(validate_time_index(&[t(1, 2), t(2, 1)], None).is_err());
        assert!(validate_time_index(&[t(1, 7)], Some(4)).is_err());
    }
}
