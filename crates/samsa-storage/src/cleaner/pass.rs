//! One cleaning pass: reads a partition's cleanable segments, builds the
//! offset map from their dirty part, and writes the cleaned segments into
//! the partition's `cleaning/` directory, without holding the log.
//!
//! A pass has three steps, so the produce path never waits on it:
//! 1. [`PartitionLog::cleaning_plan`](crate::log::PartitionLog::cleaning_plan),
//!    under the log's lock: which segments, what is dirty, which producers
//!    are alive ([`CleaningPlan`], holding the segment files open);
//! 2. [`clean`], without the lock: the map, then the rewrite of every
//!    segment up to where the map reached, grouped into segments of at most
//!    `segment.bytes` ([`CleanedLog`]);
//! 3. [`PartitionLog::install_cleaned`](crate::log::PartitionLog::install_cleaned),
//!    under the lock again: the swap, or nothing if the log changed under
//!    the pass (retention or truncation took one of its segments).
//!
//! Invariants of what the pass writes:
//! - every batch keeps its offsets; a cleaned segment starts at the base of
//!   the first segment it replaces and ends where the last one ended (its
//!   last batch always stays), so segments still follow one another;
//! - the map is built only from records a `read_committed` reader could
//!   see: an aborted transaction's records never hide an older value;
//! - the map covers whole batches: where it fills up, the pass cleans only
//!   up to the batch it reached, and records after that stay;
//! - what stays is decided by [`retention`](super::retention), batch by
//!   batch in offset order.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::offset_map::OffsetMap;
use super::retention::{batch_fate, keep_record, MarkerFate, TxnRetention};
use super::rewrite::{rewrite_batch, RewriteError, Rewritten};
use crate::batch::{self, verify_crc, BatchHeader, EndTxnMarker};
use crate::compression;
use crate::error::{IoContext, StorageError};
use crate::scan::{BatchScanner, BATCH_SCAN_CHUNK};
use crate::segment::{BatchPlacement, Offsets, Segment};
use crate::txn_index::AbortedTxnEntry;

/// The directory inside a partition's directory where a pass writes.
pub(crate) const CLEANING_DIR: &str = "cleaning";

#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot clean the batch at offset {offset} of {path}: {source}")]
    Rewrite {
        path: PathBuf,
        offset: i64,
        #[source]
        source: RewriteError,
    },
    #[error(
        "the batch at offset {offset} has {records} records, more than the cleaner's offset map holds ({max_keys} keys): raise log.cleaner.dedupe.buffer.size"
    )]
    MapTooSmall {
        offset: i64,
        records: i32,
        max_keys: usize,
    },
}

/// A segment the pass may read: its file stays open even if the log
/// deletes it meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct SegmentToClean {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size: u64,
    pub file: Arc<File>,
    pub path: PathBuf,
    pub aborted: Vec<AbortedTxnEntry>,
}

/// What step 1 hands to [`clean`].
#[derive(Debug)]
pub struct CleaningPlan {
    pub(crate) dir: PathBuf,
    /// From the log start, every segment below the first uncleanable offset.
    pub(crate) segments: Vec<SegmentToClean>,
    /// Where the part not yet compacted starts (the cleaner checkpoint).
    pub(crate) first_dirty_offset: i64,
    /// Producer id → last offset of its last data batch, for every
    /// producer the log still has state for.
    pub(crate) live_producers: HashMap<i64, i64>,
    pub(crate) segment_bytes: u64,
    pub(crate) index_interval_bytes: u32,
    pub(crate) decompression_limit: usize,
    pub(crate) delete_retention_ms: i64,
    pub(crate) now_ms: i64,
    /// Share of the cleanable bytes that is dirty.
    pub dirty_ratio: f64,
}

impl CleaningPlan {
    pub fn dirty_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.next_offset > self.first_dirty_offset)
            .map(|s| s.size)
            .sum()
    }
}

/// One cleaned segment, written and synced under `cleaning/`, and the
/// segments of the log it replaces.
pub struct CleanedSegment {
    pub(crate) segment: Segment,
    /// (base offset, size, next offset) of each replaced segment, as planned.
    pub(crate) replaces: Vec<(i64, u64, i64)>,
}

/// What [`clean`] produced.
pub struct CleanedLog {
    pub(crate) dir: PathBuf,
    pub(crate) segments: Vec<CleanedSegment>,
    /// The new cleaner checkpoint: everything below is compacted.
    pub(crate) cleaned_up_to: i64,
    /// The earliest delete horizon a batch kept by the pass carries: when a
    /// later pass has something to remove even without new data.
    pub(crate) earliest_horizon_ms: Option<i64>,
    pub stats: CleanStats,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub batches_read: u64,
    pub batches_removed: u64,
    pub records_read: u64,
    pub records_removed: u64,
    pub keys_in_map: usize,
}

/// `log.cleaner.io.max.bytes.per.second`: paces a pass's reads and writes.
/// The pass runs on its own thread, so pacing is a sleep there.
#[derive(Debug)]
pub struct Throttle {
    bytes_per_second: Option<u64>,
    started: Instant,
    bytes: u64,
}

impl Throttle {
    /// `None`: unthrottled.
    pub fn new(bytes_per_second: Option<u64>) -> Throttle {
        Throttle {
            bytes_per_second: bytes_per_second.filter(|&b| b > 0),
            started: Instant::now(),
            bytes: 0,
        }
    }

    fn pace(&mut self, bytes: u64) {
        let Some(rate) = self.bytes_per_second else {
            return;
        };
        self.bytes += bytes;
        let due = Duration::from_secs_f64(self.bytes as f64 / rate as f64);
        if let Some(ahead) = due.checked_sub(self.started.elapsed()) {
            std::thread::sleep(ahead);
        }
    }
}

/// Runs step 2 of a pass (see the module docs). `map` is cleared first; its
/// size bounds how far one pass reaches.
pub fn clean(
    plan: &CleaningPlan,
    map: &mut OffsetMap,
    throttle: &mut Throttle,
) -> Result<CleanedLog, CleanError> {
    let mut stats = CleanStats::default();
    map.clear();
    let map_end = build_map(plan, map, throttle)?;
    stats.keys_in_map = map.len();
    let scratch = plan.dir.join(CLEANING_DIR);
    remove_scratch(&scratch)?;
    std::fs::create_dir(&scratch).at(&scratch)?;

    let to_clean: Vec<&SegmentToClean> = plan
        .segments
        .iter()
        .filter(|s| s.base_offset < map_end)
        .collect();
    // Every abort of the cleanable range: one decided past where the map
    // reached still decides records before it.
    let mut txns = TxnRetention::new(plan.segments.iter().flat_map(|s| s.aborted.iter().copied()));
    let horizon = plan.now_ms.saturating_add(plan.delete_retention_ms);
    let mut earliest_horizon_ms: Option<i64> = None;
    let mut cleaned = Vec::new();
    for group in group_by_size(&to_clean, plan.segment_bytes) {
        let base = group[0].base_offset;
        let mut out = Segment::create(&scratch, base, plan.now_ms)?;
        let mut pending = Pending::default();
        for (i, segment) in group.iter().enumerate() {
            let last_segment = i + 1 == group.len();
            let mut scanner = BatchScanner::new(&segment.file, 0, segment.size, BATCH_SCAN_CHUNK);
            while let Some((position, header, bytes)) = next_verified(&mut scanner, segment)? {
                stats.batches_read += 1;
                stats.records_read += header.records_count.max(0) as u64;
                stats.bytes_read += bytes.len() as u64;
                throttle.pace(bytes.len() as u64);
                let last_of_group = last_segment && position + bytes.len() as u64 >= segment.size;
                let tombstones_due = header.delete_horizon_ms().is_some_and(|h| h <= plan.now_ms);
                // A marker's horizon starts once its records are gone; a data
                // batch's once it keeps a tombstone (see `rewrite_batch`).
                let (fate, index_entry, batch_horizon) = if header.is_control() {
                    let commit = marker_of(bytes, &header, &segment.path).map(|m| m.commit);
                    match txns.on_marker(header.producer_id, header.base_offset, commit) {
                        MarkerFate::Keep { index_entry } => {
                            (batch_fate(false, true, false), index_entry, None)
                        }
                        MarkerFate::MayGo => {
                            let stays = !tombstones_due || last_of_group;
                            (batch_fate(!stays, false, stays), None, Some(horizon))
                        }
                    }
                } else {
                    let discard = header.has_producer_id()
                        && txns.on_data_batch(
                            header.producer_id,
                            header.is_transactional(),
                            header.last_offset(),
                        );
                    let live = header.has_producer_id()
                        && plan.live_producers.get(&header.producer_id)
                            == Some(&header.last_offset());
                    (
                        batch_fate(discard, live, last_of_group),
                        None,
                        Some(horizon),
                    )
                };
                let control = header.is_control();
                let rewritten = rewrite_batch(
                    bytes,
                    plan.decompression_limit,
                    fate,
                    batch_horizon,
                    |offset, record| {
                        control
                            || keep_record(
                                map,
                                map_end,
                                offset,
                                record.key,
                                record.value.is_some(),
                                tombstones_due,
                            )
                    },
                )
                .map_err(|source| CleanError::Rewrite {
                    path: segment.path.clone(),
                    offset: header.base_offset,
                    source,
                })?;
                let kept: &[u8] = match &rewritten {
                    Rewritten::Unchanged => bytes,
                    Rewritten::Replaced(b) => b,
                    Rewritten::Removed => {
                        stats.batches_removed += 1;
                        stats.records_removed += header.records_count.max(0) as u64;
                        continue;
                    }
                };
                let kept_header = BatchHeader::parse(kept).map_err(StorageError::from)?;
                stats.records_removed +=
                    (header.records_count - kept_header.records_count).max(0) as u64;
                // A horizon already passed is on a batch kept only because
                // it ends the group: nothing more to remove there.
                if let Some(h) = kept_header.delete_horizon_ms().filter(|&h| h > plan.now_ms) {
                    earliest_horizon_ms = Some(earliest_horizon_ms.map_or(h, |e| e.min(h)));
                }
                pending.push(kept, &kept_header);
                if let Some(entry) = index_entry {
                    pending.aborted.push(entry);
                }
                if pending.bytes.len() >= BATCH_SCAN_CHUNK {
                    stats.bytes_written += pending.flush_into(&mut out, plan)?;
                    throttle.pace(0);
                }
            }
        }
        stats.bytes_written += pending.flush_into(&mut out, plan)?;
        out.sync_all()?;
        cleaned.push(CleanedSegment {
            segment: out,
            replaces: group
                .iter()
                .map(|s| (s.base_offset, s.size, s.next_offset))
                .collect(),
        });
    }
    crate::fsutil::fsync_dir(&scratch)?;
    Ok(CleanedLog {
        dir: plan.dir.clone(),
        segments: cleaned,
        cleaned_up_to: map_end,
        earliest_horizon_ms,
        stats,
    })
}

/// Puts the keys of the dirty part into `map`, in offset order, up to where
/// it fills; returns the offset after the last batch it took.
fn build_map(
    plan: &CleaningPlan,
    map: &mut OffsetMap,
    throttle: &mut Throttle,
) -> Result<i64, CleanError> {
    let dirty: Vec<&SegmentToClean> = plan
        .segments
        .iter()
        .filter(|s| s.next_offset > plan.first_dirty_offset)
        .collect();
    // Only aborts decided in the dirty part matter; one decided before it
    // would stay open forever and swallow the producer's later transactions.
    let mut txns = TxnRetention::new(
        dirty
            .iter()
            .flat_map(|s| s.aborted.iter().copied())
            .filter(|e| e.last_offset >= plan.first_dirty_offset),
    );
    let mut map_end = plan.first_dirty_offset;
    for segment in dirty {
        let mut scanner = BatchScanner::new(&segment.file, 0, segment.size, BATCH_SCAN_CHUNK);
        while let Some((_, header, bytes)) = next_verified(&mut scanner, segment)? {
            if header.last_offset() < plan.first_dirty_offset {
                continue;
            }
            throttle.pace(bytes.len() as u64);
            if header.is_control() {
                let commit = marker_of(bytes, &header, &segment.path).map(|m| m.commit);
                txns.on_marker(header.producer_id, header.base_offset, commit);
                map_end = header.last_offset() + 1;
                continue;
            }
            let aborted = header.has_producer_id()
                && txns.on_data_batch(
                    header.producer_id,
                    header.is_transactional(),
                    header.last_offset(),
                );
            if !aborted {
                let records = header.records_count.max(0) as usize;
                if map.len() + records > map.max_keys() {
                    if map_end == plan.first_dirty_offset {
                        return Err(CleanError::MapTooSmall {
                            offset: header.base_offset,
                            records: header.records_count,
                            max_keys: map.max_keys(),
                        });
                    }
                    return Ok(map_end);
                }
                let body = compression::decompressed_records(bytes, plan.decompression_limit)
                    .map_err(|e| corrupt(segment, header.base_offset, &e))?;
                for record in batch::records_in(&body, header.records_count) {
                    let record = record.map_err(|e| corrupt(segment, header.base_offset, &e))?;
                    if let Some(key) = record.key {
                        let offset = header.base_offset + i64::from(record.offset_delta);
                        // Checked above: the batch's keys fit.
                        if map.put(key, offset).is_err() {
                            return Ok(map_end);
                        }
                    }
                }
            }
            map_end = header.last_offset() + 1;
        }
    }
    Ok(map_end)
}

/// A batch read by a pass: its position in the segment, header and bytes.
type ReadBatch<'s> = (u64, BatchHeader, &'s [u8]);

/// The next batch of a segment, its framing and CRC checked: the pass
/// recomputes CRCs, so it must never rewrite a batch that was damaged.
fn next_verified<'s>(
    scanner: &'s mut BatchScanner<'_>,
    segment: &SegmentToClean,
) -> Result<Option<ReadBatch<'s>>, StorageError> {
    let Some(item) = scanner.next_batch().at(&segment.path)? else {
        return Ok(None);
    };
    let (position, header, bytes) = item.map_err(|f| {
        StorageError::Corrupt(
            segment.path.clone(),
            format!("cleaner: at position {}: {}", f.position, f.error),
        )
    })?;
    verify_crc(bytes).map_err(|e| corrupt(segment, header.base_offset, &e))?;
    Ok(Some((position, header, bytes)))
}

fn corrupt(segment: &SegmentToClean, offset: i64, error: &dyn std::fmt::Display) -> StorageError {
    StorageError::Corrupt(
        segment.path.clone(),
        format!("cleaner: batch at offset {offset}: {error}"),
    )
}

fn marker_of(bytes: &[u8], header: &BatchHeader, path: &Path) -> Option<EndTxnMarker> {
    match EndTxnMarker::parse(bytes) {
        Ok(marker) => marker,
        Err(e) => {
            tracing::warn!(path = %path.display(), offset = header.base_offset, error = %e,
                "cleaner: control batch without a readable transaction marker");
            None
        }
    }
}

/// Consecutive segments whose bytes together fit one segment (and its
/// index's 32-bit relative offsets): what one cleaned segment replaces.
fn group_by_size<'a>(
    segments: &[&'a SegmentToClean],
    segment_bytes: u64,
) -> Vec<Vec<&'a SegmentToClean>> {
    let mut groups: Vec<Vec<&SegmentToClean>> = Vec::new();
    let mut size = 0u64;
    for &segment in segments {
        let fits = groups.last().is_some_and(|group| {
            size + segment.size <= segment_bytes
                && segment.next_offset - 1 - group[0].base_offset <= i64::from(i32::MAX)
        });
        if fits {
            size += segment.size;
            if let Some(group) = groups.last_mut() {
                group.push(segment);
            }
        } else {
            size = segment.size;
            groups.push(vec![segment]);
        }
    }
    groups
}

/// Kept batches waiting to be written to the cleaned segment in one write.
#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    placements: Vec<BatchPlacement>,
    aborted: Vec<AbortedTxnEntry>,
}

impl Pending {
    fn push(&mut self, batch: &[u8], header: &BatchHeader) {
        self.placements.push(BatchPlacement {
            offset_in_buffer: self.bytes.len(),
            size: batch.len(),
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            max_timestamp: header.max_timestamp,
        });
        self.bytes.extend_from_slice(batch);
    }

    fn flush_into(&mut self, out: &mut Segment, plan: &CleaningPlan) -> Result<u64, StorageError> {
        if !self.bytes.is_empty() {
            out.append(
                &self.bytes,
                &self.placements,
                Offsets::MayGap,
                plan.index_interval_bytes,
                plan.now_ms,
            )?;
        }
        for entry in self.aborted.drain(..) {
            out.push_aborted_txn(entry);
        }
        let written = self.bytes.len() as u64;
        self.bytes.clear();
        self.placements.clear();
        Ok(written)
    }
}

/// Deletes a pass's scratch directory (an interrupted or abandoned pass).
pub(crate) fn remove_scratch(scratch: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(scratch) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).at(scratch),
    }
}
