//! One segment of a partition log: `{base:020}.log` holding batches with
//! contiguous offsets from `base_offset`, its offset and time indexes, and its
//! transaction index (`.txnindex`, the aborted transactions whose ABORT marker
//! is in the segment; see `txn_index`).
//!
//! Invariants while a `Segment` is alive:
//! - bytes `[0, size)` of the log file are whole, CRC-valid batches whose
//!   offsets increase from `base_offset` to `next_offset - 1`: contiguously
//!   as a leader writes them, with gaps where a cleaner removed batches
//!   (here, or in the leader's log a follower copies); a
//!   failed write (a full disk) is cut back to `size` at once, and if even
//!   the cut fails the segment refuses appends (`torn_tail`) until a later
//!   append manages the cut: no batch is ever written after bytes that are
//!   not a whole batch;
//! - the in-memory indexes describe exactly those bytes (the index files may
//!   lag; see `index`);
//! - `max_timestamp` / `offset_of_max_timestamp` are the largest batch max
//!   timestamp in the segment and the last offset of the first batch carrying it;
//! - the transaction index is only as good as what the log put in it: the
//!   segment cannot check it against its batches beyond offset ranges
//!   ([`Segment::txn_index_problem`]), and [`Segment::recover`] leaves it alone.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::batch::{verify_crc, BatchHeader, BATCH_HEADER_LEN, NO_TIMESTAMP};
use crate::error::{IoContext, StorageError};
use crate::fsutil::{self, offset_file_name};
use crate::index::{validate_offset_index, validate_time_index, IndexFile, OffsetEntry, TimeEntry};
use crate::open_files::SegmentFile;
use crate::scan::{BatchScanner, BATCH_SCAN_CHUNK, HEADER_SCAN_CHUNK};
use crate::txn_index::{AbortedTxn, AbortedTxnEntry, TxnIndex, TXN_INDEX_EXTENSION};

pub(crate) const LOG_EXTENSION: &str = "log";
pub(crate) const INDEX_EXTENSION: &str = "index";
pub(crate) const TIME_INDEX_EXTENSION: &str = "timeindex";

/// Where one batch of an append lands, computed before the write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchPlacement {
    /// Byte position of the batch inside the appended buffer.
    pub offset_in_buffer: usize,
    pub size: usize,
    pub base_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

/// How the batches of an append may follow the segment's last one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offsets {
    /// Right after it: offsets the leader assigns.
    Contiguous,
    /// After it, perhaps with a gap: batches copied from a compacted log.
    MayGap,
}

impl Offsets {
    /// Whether a batch at `base_offset` may follow one ending before `expected`.
    pub fn accepts(self, base_offset: i64, expected: i64) -> bool {
        match self {
            Offsets::Contiguous => base_offset == expected,
            Offsets::MayGap => base_offset >= expected,
        }
    }

    fn describe(self, expected: i64) -> String {
        match self {
            Offsets::Contiguous => expected.to_string(),
            Offsets::MayGap => format!("at least {expected}"),
        }
    }
}

/// What a full scan of a segment found.
#[derive(Debug, Default)]
pub(crate) struct ScanOutcome {
    pub batches: u64,
    /// Bytes cut from the end of the file because they were not valid batches.
    pub truncated_bytes: u64,
}

pub(crate) struct Segment {
    base_offset: i64,
    next_offset: i64,
    size: u64,
    /// Held open while the segment is active, else opened on demand (see
    /// `open_files`).
    log: SegmentFile,
    offset_index: IndexFile<OffsetEntry>,
    time_index: IndexFile<TimeEntry>,
    txn_index: TxnIndex,
    /// Whether both index files existed and held a whole number of entries when opened.
    index_files_intact: bool,
    /// Why the transaction index file could not be read when opened.
    txn_index_unreadable: Option<String>,
    bytes_since_last_index_entry: u64,
    max_timestamp: i64,
    offset_of_max_timestamp: i64,
    /// Max timestamp of the first batch: what `segment.ms` is measured from (Kafka's rule).
    first_batch_timestamp: Option<i64>,
    created_ms: i64,
    last_modified_ms: i64,
    /// Whether the directory entry of the log file is known to be on disk.
    pub dir_entry_durable: bool,
    /// The file may hold bytes past `size` from a failed write that could
    /// not be cut yet.
    torn_tail: bool,
}

fn paths(dir: &Path, base_offset: i64) -> [PathBuf; 4] {
    [
        offset_file_name(dir, base_offset, LOG_EXTENSION),
        offset_file_name(dir, base_offset, INDEX_EXTENSION),
        offset_file_name(dir, base_offset, TIME_INDEX_EXTENSION),
        offset_file_name(dir, base_offset, TXN_INDEX_EXTENSION),
    ]
}

/// Deletes a segment's four files, whether or not it was ever opened.
pub(crate) fn remove_segment_files(dir: &Path, base_offset: i64) -> Result<(), StorageError> {
    for path in paths(dir, base_offset) {
        fsutil::remove_if_exists(&path)?;
    }
    Ok(())
}

impl Segment {
    /// Creates an empty segment, replacing any files of the same name.
    pub fn create(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Segment, StorageError> {
        let [log_path, index_path, time_index_path, txn_index_path] = paths(dir, base_offset);
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&log_path)
            .at(&log_path)?;
        Ok(Segment {
            base_offset,
            next_offset: base_offset,
            size: 0,
            log: SegmentFile::held(log_path, log),
            offset_index: IndexFile::create(&index_path).at(&index_path)?,
            time_index: IndexFile::create(&time_index_path).at(&time_index_path)?,
            txn_index: TxnIndex::create(&txn_index_path).at(&txn_index_path)?,
            index_files_intact: true,
            txn_index_unreadable: None,
            bytes_since_last_index_entry: 0,
            max_timestamp: NO_TIMESTAMP,
            offset_of_max_timestamp: -1,
            first_batch_timestamp: None,
            created_ms: now_ms,
            last_modified_ms: now_ms,
            dir_entry_durable: false,
            torn_tail: false,
        })
    }

    /// Opens an existing segment. Its contents are not examined yet: follow
    /// with [`Segment::load_trusted`] or [`Segment::recover`]. Its log file
    /// is not held open ([`Segment::hold_file`] makes it the active one's).
    pub fn open(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Segment, StorageError> {
        let [log_path, index_path, time_index_path, txn_index_path] = paths(dir, base_offset);
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log_path)
            .at(&log_path)?;
        let metadata = log.metadata().at(&log_path)?;
        let last_modified_ms = metadata
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(now_ms, |d| d.as_millis() as i64);
        // A missing index file would be recreated empty and look valid, yet it
        // could hide timestamps of batches before the last offset-index entry.
        let both_exist = index_path.exists() && time_index_path.exists();
        // At most one entry per batch, and no batch is smaller than its header.
        let max_entries = metadata.len() / BATCH_HEADER_LEN as u64 + 1;
        let (offset_index, offset_whole) =
            IndexFile::open(&index_path, max_entries).at(&index_path)?;
        let (time_index, time_whole) =
            IndexFile::open(&time_index_path, max_entries).at(&time_index_path)?;
        let (txn_index, txn_readable) =
            TxnIndex::open(&txn_index_path, max_entries).at(&txn_index_path)?;
        let mut log = SegmentFile::held(log_path, log);
        log.release();
        Ok(Segment {
            base_offset,
            next_offset: base_offset,
            size: metadata.len(),
            log,
            offset_index,
            time_index,
            txn_index,
            index_files_intact: both_exist && offset_whole && time_whole,
            txn_index_unreadable: txn_readable.err(),
            bytes_since_last_index_entry: 0,
            max_timestamp: NO_TIMESTAMP,
            offset_of_max_timestamp: -1,
            first_batch_timestamp: None,
            created_ms: now_ms,
            last_modified_ms,
            dir_entry_durable: true,
            torn_tail: false,
        })
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    pub fn log_path(&self) -> &Path {
        self.log.path()
    }

    /// A handle on the log file (for a sync or a cleaning pass outside the
    /// log's lock).
    pub fn log_file(&self) -> &SegmentFile {
        &self.log
    }

    /// The open log file.
    fn file(&self) -> Result<Arc<File>, StorageError> {
        self.log.get().at(self.log.path())
    }

    /// Keeps the log file open: the segment is now the active one.
    pub fn hold_file(&mut self) -> Result<(), StorageError> {
        self.log.hold().at(self.log.path())
    }

    /// Lets the log file be closed when unused: the segment is no longer active.
    pub fn release_file(&mut self) {
        self.log.release();
    }

    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    pub fn offset_of_max_timestamp(&self) -> i64 {
        self.offset_of_max_timestamp
    }

    /// The timestamp retention compares against: the newest record timestamp,
    /// or the file's modification time if the batches carry none.
    pub fn largest_timestamp(&self) -> i64 {
        if self.max_timestamp > NO_TIMESTAMP {
            self.max_timestamp
        } else {
            self.last_modified_ms
        }
    }

    /// Max timestamp of the first batch, if the segment has one with a timestamp.
    pub fn first_batch_timestamp(&self) -> Option<i64> {
        self.first_batch_timestamp.filter(|&t| t > NO_TIMESTAMP)
    }

    /// How old the segment is by `segment.ms` rules (Kafka's): the incoming
    /// batch's timestamp minus the first batch's, so data with old timestamps
    /// does not roll on every append; wall time since creation if either
    /// timestamp is missing.
    pub fn age_ms(&self, incoming_max_timestamp: i64, now_ms: i64) -> i64 {
        match self.first_batch_timestamp {
            Some(first) if first > NO_TIMESTAMP && incoming_max_timestamp > NO_TIMESTAMP => {
                incoming_max_timestamp.saturating_sub(first)
            }
            _ => now_ms.saturating_sub(self.created_ms),
        }
    }

    /// Records a batch that now occupies `[position, position + size)`.
    fn track_batch(
        &mut self,
        position: u64,
        size: u64,
        base_offset: i64,
        last_offset: i64,
        max_timestamp: i64,
        index_interval: u32,
    ) {
        if self.first_batch_timestamp.is_none() {
            self.first_batch_timestamp = Some(max_timestamp);
        }
        if max_timestamp > self.max_timestamp {
            self.max_timestamp = max_timestamp;
            self.offset_of_max_timestamp = last_offset;
        }
        if self.bytes_since_last_index_entry >= u64::from(index_interval) {
            // Relative offsets and positions fit in u32: the log rolls before they would not.
            self.offset_index.push(OffsetEntry {
                relative_offset: (base_offset - self.base_offset) as u32,
                position: position as u32,
            });
            self.maybe_append_time_entry();
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += size;
        self.next_offset = last_offset + 1;
        self.size = position + size;
    }

    fn maybe_append_time_entry(&mut self) {
        let indexed = self.time_index.last().map_or(NO_TIMESTAMP, |e| e.timestamp);
        if self.max_timestamp > indexed {
            self.time_index.push(TimeEntry {
                timestamp: self.max_timestamp,
                relative_offset: (self.offset_of_max_timestamp - self.base_offset) as u32,
            });
        }
    }

    /// Writes `bytes` (whole batches, already validated and carrying their
    /// final offsets) at the end of the segment with one positioned write.
    /// The placements must continue the segment's offsets
    /// (`OffsetsOutOfOrder`, nothing written): every write path of the log
    /// comes through here, so this is where "offsets increase" is checked.
    /// [`Offsets::Contiguous`] for a leader's appends; [`Offsets::MayGap`]
    /// for copies of a compacted log (a follower's, a cleaner's), where
    /// removed batches left gaps.
    pub fn append(
        &mut self,
        bytes: &[u8],
        placements: &[BatchPlacement],
        offsets: Offsets,
        index_interval: u32,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        let mut expected = self.next_offset;
        for p in placements {
            if !offsets.accepts(p.base_offset, expected) || p.last_offset < p.base_offset {
                return Err(StorageError::OffsetsOutOfOrder {
                    path: self.log_path().to_path_buf(),
                    base_offset: p.base_offset,
                    last_offset: p.last_offset,
                    expected,
                });
            }
            expected = p.last_offset + 1;
        }
        if self.torn_tail {
            // The cut of an earlier failed write did not happen: bytes past
            // `size` may be the torn part of a batch, and nothing may follow
            // them. Retry the cut; until it works, refuse.
            self.cut_torn_tail()?;
        }
        let start = self.size;
        if let Err(source) = fsutil::write_all_at(&*self.file()?, bytes, start) {
            // Cut the partial write so the file never ends in a torn batch
            // while the log runs.
            self.torn_tail = true;
            if let Err(e) = self.cut_torn_tail() {
                tracing::warn!(path = %self.log_path().display(), error = %e, "cannot cut a failed append; the segment refuses appends until it can");
            }
            return Err(StorageError::Io {
                path: self.log_path().to_path_buf(),
                source,
            });
        }
        for p in placements {
            self.track_batch(
                start + p.offset_in_buffer as u64,
                p.size as u64,
                p.base_offset,
                p.last_offset,
                p.max_timestamp,
                index_interval,
            );
        }
        self.last_modified_ms = now_ms;
        Ok(())
    }

    /// Makes the indexes complete and durable: the segment stops growing (roll)
    /// or the log closes.
    pub fn seal(&mut self) -> Result<(), StorageError> {
        self.maybe_append_time_entry();
        self.offset_index.sync().at(self.offset_index.path())?;
        self.time_index.sync().at(self.time_index.path())?;
        self.txn_index.sync().at(self.txn_index.path())?;
        Ok(())
    }

    /// Records an aborted transaction whose marker was just appended here.
    pub fn push_aborted_txn(&mut self, entry: AbortedTxnEntry) {
        self.txn_index.push(entry);
    }

    /// The aborted transactions whose markers are in this segment, in marker order.
    pub fn aborted_txns(&self) -> &[AbortedTxnEntry] {
        self.txn_index.entries()
    }

    /// Why the transaction index cannot be trusted: unreadable when opened, or
    /// contradicting the segment's offsets. Call once the segment's end is known.
    pub fn txn_index_problem(&self) -> Option<String> {
        if let Some(reason) = &self.txn_index_unreadable {
            return Some(reason.clone());
        }
        self.txn_index
            .validate(self.base_offset, self.next_offset)
            .err()
    }

    /// Replaces the transaction index with rebuilt entries, durably.
    pub fn replace_txn_index(&mut self, entries: Vec<AbortedTxnEntry>) -> Result<(), StorageError> {
        self.txn_index.replace(entries).at(self.txn_index.path())?;
        self.txn_index_unreadable = None;
        Ok(())
    }

    /// Drops, durably, the aborted transactions whose markers are at or after `offset`.
    pub fn truncate_txn_index(&mut self, offset: i64) -> Result<(), StorageError> {
        self.txn_index
            .truncate_from(offset)
            .at(self.txn_index.path())
    }

    /// Adds the aborted transactions overlapping `[fetch_offset,
    /// upper_bound_offset)` to `out`; true when no later segment can hold more.
    pub fn collect_aborted_txns(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
        out: &mut Vec<AbortedTxn>,
    ) -> bool {
        self.txn_index
            .collect(fetch_offset, upper_bound_offset, out)
    }

    /// fsyncs the log file and the indexes.
    pub fn sync_all(&mut self) -> Result<(), StorageError> {
        self.file()?.sync_data().at(self.log_path())?;
        self.seal()
    }

    /// Cuts bytes past `size` left by a failed write.
    pub fn trim_file(&mut self) -> Result<(), StorageError> {
        let log = self.file()?;
        let len = log.metadata().at(self.log_path())?.len();
        if len != self.size {
            fsutil::set_len(&log, self.size).at(self.log_path())?;
            log.sync_data().at(self.log_path())?;
        }
        self.torn_tail = false;
        Ok(())
    }

    /// Cuts the file back to `size` after a failed write. Not fsynced: a
    /// crash before the cut reaches the disk leaves a torn tail, which
    /// recovery cuts the same way.
    fn cut_torn_tail(&mut self) -> Result<(), StorageError> {
        fsutil::set_len(&*self.file()?, self.size).at(self.log_path())?;
        self.torn_tail = false;
        Ok(())
    }

    /// Validates every batch from the start of the file (framing, offsets
    /// following from `base_offset` as `offsets` allows, CRC), truncates the
    /// file at the first invalid batch, and rebuilds both indexes and the
    /// timestamps. (The base offset is outside the batch CRC: a damaged one
    /// is only caught by where it lands, hence `Contiguous` wherever no
    /// cleaner has been.)
    pub fn recover(
        &mut self,
        index_interval: u32,
        offsets: Offsets,
    ) -> Result<ScanOutcome, StorageError> {
        let log = self.file()?;
        let file_len = log.metadata().at(self.log_path())?.len();
        self.offset_index
            .replace(Vec::new())
            .at(self.offset_index.path())?;
        self.time_index
            .replace(Vec::new())
            .at(self.time_index.path())?;
        self.index_files_intact = true;
        self.next_offset = self.base_offset;
        self.size = 0;
        self.bytes_since_last_index_entry = 0;
        self.max_timestamp = NO_TIMESTAMP;
        self.offset_of_max_timestamp = -1;
        self.first_batch_timestamp = None;

        let mut scanner = BatchScanner::new(&log, 0, file_len, BATCH_SCAN_CHUNK);
        let mut outcome = ScanOutcome::default();
        let mut invalid: Option<String> = None;
        while let Some(item) = scanner.next_batch().at(self.log.path())? {
            let (position, header, bytes) = match item {
                Ok(batch) => batch,
                Err(framing) => {
                    invalid = Some(framing.error.to_string());
                    break;
                }
            };
            if let Some(reason) = self.reject(position, &header, bytes, offsets) {
                invalid = Some(reason);
                break;
            }
            self.track_batch(
                position,
                header.total_size() as u64,
                header.base_offset,
                header.last_offset(),
                header.max_timestamp,
                index_interval,
            );
            outcome.batches += 1;
        }
        if self.size < file_len {
            outcome.truncated_bytes = file_len - self.size;
            tracing::warn!(
                path = %self.log_path().display(),
                offset = self.next_offset,
                position = self.size,
                bytes_dropped = outcome.truncated_bytes,
                reason = invalid.as_deref().unwrap_or("unknown"),
                "truncating invalid tail of log segment during recovery"
            );
            fsutil::set_len(&log, self.size).at(self.log_path())?;
        }
        self.torn_tail = false;
        Ok(outcome)
    }

    /// Why a framed batch cannot be kept at this place in the segment.
    fn reject(
        &self,
        position: u64,
        header: &BatchHeader,
        bytes: &[u8],
        offsets: Offsets,
    ) -> Option<String> {
        if !offsets.accepts(header.base_offset, self.next_offset) {
            return Some(format!(
                "batch at position {position} has base offset {}, expected {}",
                header.base_offset,
                offsets.describe(self.next_offset)
            ));
        }
        if header.last_offset_delta < 0 {
            return Some(format!(
                "batch at position {position} has negative last offset delta {}",
                header.last_offset_delta
            ));
        }
        if header.last_offset() - self.base_offset > i64::from(u32::MAX)
            || position > u64::from(u32::MAX)
        {
            return Some(format!(
                "batch at position {position} does not fit the segment's index"
            ));
        }
        if let Err(e) = verify_crc(bytes) {
            return Some(format!("batch at position {position}: {e}"));
        }
        None
    }

    /// Adopts the indexes as they are on disk after checking they agree with
    /// the log file, and finds the segment's end by scanning batch headers from
    /// the last indexed batch. `Ok(Err(reason))`: the indexes or the tail cannot
    /// be trusted, call [`Segment::recover`].
    pub fn load_trusted(&mut self, offsets: Offsets) -> Result<Result<(), String>, StorageError> {
        let log = self.file()?;
        let file_len = log.metadata().at(self.log_path())?.len();
        self.size = file_len;
        if !self.index_files_intact {
            return Ok(Err(
                "an index file is missing or not a whole number of entries".into(),
            ));
        }
        if let Err(reason) = validate_offset_index(self.offset_index.entries(), file_len, None)
            .and_then(|()| validate_time_index(self.time_index.entries(), None))
        {
            return Ok(Err(reason));
        }

        let (start_position, mut expected) = match self.offset_index.last() {
            Some(e) => (
                u64::from(e.position),
                self.base_offset + i64::from(e.relative_offset),
            ),
            None => (0, self.base_offset),
        };
        let mut tail_max = (NO_TIMESTAMP, -1);
        let mut scanner = BatchScanner::new(&log, start_position, file_len, HEADER_SCAN_CHUNK);
        while let Some(item) = scanner.next_header().at(self.log.path())? {
            let (position, header) = match item {
                Ok(h) => h,
                Err(framing) => {
                    return Ok(Err(format!(
                        "tail at position {}: {}",
                        framing.position, framing.error
                    )))
                }
            };
            if !offsets.accepts(header.base_offset, expected) || header.last_offset_delta < 0 {
                return Ok(Err(format!(
                    "batch at position {position} has base offset {}, expected {}",
                    header.base_offset,
                    offsets.describe(expected)
                )));
            }
            if header.max_timestamp > tail_max.0 {
                tail_max = (header.max_timestamp, header.last_offset());
            }
            expected = header.last_offset() + 1;
        }
        let max_relative = expected - 1 - self.base_offset;
        if let Err(reason) =
            validate_offset_index(self.offset_index.entries(), file_len, Some(max_relative))
                .and_then(|()| validate_time_index(self.time_index.entries(), Some(max_relative)))
        {
            return Ok(Err(reason));
        }

        self.next_offset = expected;
        self.bytes_since_last_index_entry = file_len - start_position;
        (self.max_timestamp, self.offset_of_max_timestamp) = match self.time_index.last() {
            Some(e) => (e.timestamp, self.base_offset + i64::from(e.relative_offset)),
            None => (NO_TIMESTAMP, -1),
        };
        if tail_max.0 > self.max_timestamp {
            (self.max_timestamp, self.offset_of_max_timestamp) = tail_max;
        }
        if file_len >= BATCH_HEADER_LEN as u64 {
            let mut header = [0u8; BATCH_HEADER_LEN];
            log.read_exact_at(&mut header, 0).at(self.log_path())?;
            match BatchHeader::parse(&header) {
                Ok(h) => self.first_batch_timestamp = Some(h.max_timestamp),
                Err(e) => return Ok(Err(format!("first batch: {e}"))),
            }
        }
        Ok(Ok(()))
    }

    /// Position and header of the batch containing `offset` (or the first batch
    /// after it), found through the offset index and a header scan. `None`: the
    /// segment ends before `offset`. The batch where the scan starts must have
    /// the base offset the index recorded for that position (at position 0,
    /// one at or after the segment's base: a cleaner may have removed the
    /// first batches), else the index and the file disagree (`Corrupt`).
    pub fn locate(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>, StorageError> {
        // `None`: the scan starts at the file's start, where the first batch
        // may begin after the segment's base.
        let indexed = self
            .offset_index
            .lookup_entry(offset - self.base_offset)
            .map(|e| {
                (
                    u64::from(e.position),
                    self.base_offset + i64::from(e.relative_offset),
                )
            });
        let start = indexed.map_or(0, |(position, _)| position);
        let log = self.file()?;
        let mut scanner = BatchScanner::new(&log, start, self.size, HEADER_SCAN_CHUNK);
        let mut first = true;
        while let Some(item) = scanner.next_header().at(self.log_path())? {
            let (position, header) =
                item.map_err(|f| self.corrupt(f.position, &f.error.to_string()))?;
            if std::mem::take(&mut first) {
                let misplaced = match indexed {
                    Some((_, indexed_base)) => header.base_offset != indexed_base,
                    None => header.base_offset < self.base_offset,
                };
                if misplaced {
                    return Err(self.corrupt(
                        position,
                        &format!(
                            "the offset index puts offset {} here, but the batch starts at {}",
                            indexed.map_or(self.base_offset, |(_, base)| base),
                            header.base_offset
                        ),
                    ));
                }
            }
            if header.last_offset() >= offset {
                return Ok(Some((position, header)));
            }
        }
        Ok(None)
    }

    /// Header scan of `[start, size)` calling `visit` per batch until it returns false.
    pub fn scan_headers(
        &self,
        start: u64,
        mut visit: impl FnMut(u64, &BatchHeader) -> bool,
    ) -> Result<(), StorageError> {
        let log = self.file()?;
        let mut scanner = BatchScanner::new(&log, start, self.size, HEADER_SCAN_CHUNK);
        while let Some(item) = scanner.next_header().at(self.log_path())? {
            let (position, header) =
                item.map_err(|f| self.corrupt(f.position, &f.error.to_string()))?;
            if !visit(position, &header) {
                break;
            }
        }
        Ok(())
    }

    /// Where a search for the first batch with max timestamp >= `timestamp` starts.
    pub fn time_search_start(&self, timestamp: i64) -> u64 {
        match self.time_index.last_below(timestamp) {
            Some(e) => self.offset_index.lookup(i64::from(e.relative_offset)),
            None => 0,
        }
    }

    /// Appends `len` bytes from `position` to `out`.
    pub fn read_into(
        &self,
        out: &mut Vec<u8>,
        position: u64,
        len: usize,
    ) -> Result<(), StorageError> {
        let start = out.len();
        out.resize(start + len, 0);
        self.file()?
            .read_exact_at(&mut out[start..], position)
            .at(self.log_path())
    }

    /// Cuts the segment at `position` (a batch boundary) and rebuilds its
    /// indexes, durably.
    pub fn truncate_to_position(
        &mut self,
        position: u64,
        index_interval: u32,
    ) -> Result<(), StorageError> {
        fsutil::set_len(&*self.file()?, position).at(self.log_path())?;
        self.torn_tail = false;
        // Truncation keeps a prefix the segment already held.
        self.recover(index_interval, Offsets::MayGap)?;
        self.sync_all()
    }

    pub fn corrupt(&self, position: u64, reason: &str) -> StorageError {
        StorageError::Corrupt(
            self.log_path().to_path_buf(),
            format!(
                "segment {} at position {position}: {reason}",
                self.base_offset
            ),
        )
    }

    /// Deletes the segment's files.
    pub fn remove_files(self, dir: &Path) -> Result<(), StorageError> {
        let base = self.base_offset;
        drop(self);
        remove_segment_files(dir, base)
    }

    #[cfg(test)]
    pub fn offset_index_entries(&self) -> &[OffsetEntry] {
        self.offset_index.entries()
    }

    #[cfg(test)]
    pub fn time_index_entries(&self) -> &[TimeEntry] {
        self.time_index.entries()
    }
}
