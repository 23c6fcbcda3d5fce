//! [`PartitionLog`]: the replicated commit log of one partition, on disk in one
//! directory.
//!
//! Directory layout:
//! - `{base:020}.log` / `.index` / `.timeindex`: segments (see `segment`, `index`);
//! - `{base:020}.txnindex`: the aborted transactions whose ABORT markers are
//!   in that segment (see `txn_index`);
//! - `{offset:020}.snapshot`: producer state, ongoing transactions included,
//!   as of `offset` (see `producer_state`);
//! - `checkpoint`: JSON `{version, log_start_offset, recovery_point, high_watermark,
//!   cleaner_offset, generation}`, replaced atomically;
//! - `cleaning/`: the segments a cleaning pass is writing; `{base:020}.log.swap`:
//!   a cleaned segment being swapped in (see `log_cleaning`);
//! - `clean_shutdown`: written last by [`PartitionLog::close`], removed (durably)
//!   first thing by [`PartitionLog::open`].
//!
//! Invariants:
//! - segments are keyed by base offset; each starts where the previous one
//!   ends (a roll starts the new one at the log end; a cleaned segment keeps
//!   the last batch of the range it replaces), so offsets increase from
//!   `log_start_offset` (the first segment's base, or inside the first
//!   segment after DeleteRecords) to `log_end_offset - 1`; the last segment
//!   is the active one. A leader's appends are contiguous; gaps exist only
//!   inside segments, where a cleaner removed batches (here or, for a
//!   follower, in the leader's log it copies). Every write
//!   checks that its batches follow the active segment's without an overlap
//!   (`Segment::append`, `OffsetsOutOfOrder`), and a read checks that each
//!   batch has the offsets and CRC it was written with (`Corrupt`);
//! - `log_start_offset <= last_stable_offset <= high_watermark <=
//!   log_end_offset` and `recovery_point <= log_end_offset`: every operation
//!   that moves an offset ends with [`PartitionLog::check_offsets`]
//!   (`OffsetsInconsistent`), and [`PartitionLog::set_high_watermark`]
//!   refuses a HW beyond the log end (`HighWatermarkBeyondLogEnd`);
//! - everything below `recovery_point` is fsynced, and so are the directory
//!   entries and the indexes of every segment wholly below it; the checkpointed
//!   recovery point is never ahead of the real one, so after a crash only the
//!   segments from the one holding it onwards need validating;
//! - producer state reflects exactly the batches in the log, and so do the
//!   ongoing transactions (a transactional batch opens one, a marker closes
//!   it): the first unstable offset is the first offset of the oldest, and
//!   the last stable offset is min(first unstable offset, high watermark);
//! - every ABORT marker in the log that closed an ongoing transaction has its
//!   entry in the transaction index of its segment, and no other marker does;
//!   the indexes of segments wholly below the recovery point are durable, the
//!   others are rebuilt by recovery from a replay of producer state;
//! - an append is validated completely before any byte is written: a request
//!   is stored whole or not at all. A write that fails (a full disk) leaves
//!   the log as it was: the segment cuts the partial bytes (or refuses
//!   appends until it can, see `segment`), producer state and offsets move
//!   only after the bytes are written, and a roll that fails adds no
//!   segment; the next append after space is freed just works.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::batch::{
    self, set_base_offset, set_log_append_time, set_partition_leader_epoch, verify_crc, BatchError,
    BatchHeader, EndTxnMarker, BATCH_HEADER_LEN, NO_TIMESTAMP,
};
use crate::compression;
use crate::config::{FlushPolicy, LogConfig};
use crate::error::{IoContext, StorageError};
use crate::fsutil::{self, fsync_dir, parse_offset_file_name, TMP_SUFFIX};
use crate::open_files::SegmentFile;
use crate::producer_state::{
    self, CompletedTxn, ProducerDescription, ProducerStateManager, StagedProducers,
};
use crate::record_time;
use crate::segment::{
    remove_segment_files, BatchPlacement, Offsets, Segment, INDEX_EXTENSION, LOG_EXTENSION,
    TIME_INDEX_EXTENSION,
};
use crate::txn_index::{AbortedTxn, AbortedTxnEntry, TXN_INDEX_EXTENSION};

/// `{base:020}.log.swap`: a cleaned segment past its commit point.
pub(crate) const SWAP_EXTENSION: &str = "log.swap";

const CHECKPOINT_FILE: &str = "checkpoint";
const CLEAN_SHUTDOWN_FILE: &str = "clean_shutdown";
const CHECKPOINT_VERSION: u32 = 1;
/// Snapshots kept besides the newest one at or below the recovery point.
const SNAPSHOTS_RETAINED: usize = 2;

/// Result of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    /// First offset assigned (or, for a duplicate, the original first offset).
    pub base_offset: i64,
    pub last_offset: i64,
    /// Largest batch max timestamp of the append; -1 if none.
    pub max_timestamp: i64,
    /// Last offset of the batch carrying `max_timestamp` (Kafka's shallow offset),
    /// or the first offset under LogAppendTime; -1 if none.
    pub offset_of_max_timestamp: i64,
    /// Offsets covered: `last_offset - base_offset + 1`.
    pub record_count: i64,
    /// True: a retried idempotent batch already in the log; nothing was written.
    pub duplicate: bool,
    /// The broker time stamped on the batches under LogAppendTime, else -1.
    pub log_append_time_ms: i64,
}

/// Result of a read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadResult {
    /// Whole batches back to back, may be empty.
    pub records: Bytes,
    /// Base offset of the first batch in `records`.
    pub first_batch_offset: Option<i64>,
}

/// What to fsync to make the log durable up to an offset; taken under the
/// log's lock, synced outside it (group commit), then passed back through
/// [`PartitionLog::mark_flushed`].
#[derive(Debug, Clone)]
pub struct FlushTarget {
    files: Vec<SegmentFile>,
    /// Set when a segment file was created since the directory was last fsynced.
    dir: Option<PathBuf>,
    up_to_offset: i64,
}

impl FlushTarget {
    /// Everything below this offset is durable once [`FlushTarget::sync`] returns.
    pub fn up_to_offset(&self) -> i64 {
        self.up_to_offset
    }

    /// fdatasyncs every file with unflushed data (and the directory if needed).
    pub fn sync(&self) -> io::Result<()> {
        for file in &self.files {
            file.get()?.sync_data()?;
        }
        if let Some(dir) = &self.dir {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// What [`PartitionLog::open`] found and repaired, for logging.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The previous run ended with `close()`.
    pub clean_shutdown: bool,
    /// Segments whose every batch was validated (and indexes rebuilt).
    pub segments_scanned: usize,
    /// Segments whose index files failed their sanity check and were rebuilt.
    pub indexes_rebuilt: usize,
    /// Segments whose transaction index was rebuilt from a producer-state
    /// replay: every validated segment, and those whose file was missing or
    /// damaged.
    pub transaction_indexes_rebuilt: usize,
    /// Bytes of invalid batches cut, including whole segments deleted after them.
    pub bytes_truncated: u64,
    /// Segments deleted because they followed a truncation or a gap.
    pub segments_deleted: usize,
    /// Offset where the log was cut, if it was.
    pub truncated_at_offset: Option<i64>,
    /// Producer snapshot the state was loaded from.
    pub snapshot_offset: Option<i64>,
    /// Batches replayed into producer state after the snapshot.
    pub batches_replayed: u64,
    pub log_end_offset: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    log_start_offset: i64,
    recovery_point: i64,
    high_watermark: i64,
    /// Everything below is compacted (the cleaner checkpoint); absent in
    /// logs written before compaction existed.
    #[serde(default)]
    cleaner_offset: Option<i64>,
    /// See [`PartitionLog::generation`]; absent in logs written before it
    /// existed (such a log gets one at open).
    #[serde(default)]
    generation: Option<u64>,
}

pub struct PartitionLog {
    dir: PathBuf,
    config: LogConfig,
    /// Never empty; the last one is active.
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    log_end_offset: i64,
    high_watermark: i64,
    recovery_point: i64,
    /// Base of the segment holding the recovery point last written to `checkpoint`:
    /// the checkpoint is rewritten when the recovery point leaves that segment,
    /// which bounds crash recovery to about one segment without an extra fsync
    /// per flush.
    checkpointed_recovery_segment: Option<i64>,
    producers: ProducerStateManager,
    /// See [`PartitionLog::generation`].
    generation: u64,
    /// The cleaner checkpoint: everything below is compacted.
    cleaner_offset: i64,
    /// The earliest delete horizon the last pass left: from then on a pass
    /// has tombstones or markers to remove even without new data.
    cleaner_horizon_due_ms: Option<i64>,
    // Reused across appends so the produce path does not allocate.
    append_buffer: Vec<u8>,
    placements: Vec<BatchPlacement>,
    staged: StagedProducers,
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("dir", &self.dir)
            .field("log_start_offset", &self.log_start_offset)
            .field("log_end_offset", &self.log_end_offset)
            .field("high_watermark", &self.high_watermark)
            .field("recovery_point", &self.recovery_point)
            .field("segments", &self.segments.len())
            .field("producers", &self.producers.len())
            .finish()
    }
}

/// Files of a partition directory, by kind.
#[derive(Default)]
struct Listing {
    segment_bases: Vec<i64>,
    index_bases: Vec<i64>,
    /// Cleaned segments whose swap a crash interrupted.
    swap_bases: Vec<i64>,
}

fn list_dir(dir: &Path) -> Result<Listing, StorageError> {
    let mut listing = Listing::default();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(TMP_SUFFIX) {
            // An atomic write that did not reach its rename.
            fsutil::remove_if_exists(&entry.path())?;
        } else if let Some(base) = parse_offset_file_name(name, LOG_EXTENSION) {
            listing.segment_bases.push(base);
        } else if let Some(base) = parse_offset_file_name(name, SWAP_EXTENSION) {
            listing.swap_bases.push(base);
        } else if let Some(base) = parse_offset_file_name(name, INDEX_EXTENSION)
            .or_else(|| parse_offset_file_name(name, TIME_INDEX_EXTENSION))
            .or_else(|| parse_offset_file_name(name, TXN_INDEX_EXTENSION))
        {
            listing.index_bases.push(base);
        }
    }
    listing.segment_bases.sort_unstable();
    listing.swap_bases.sort_unstable();
    Ok(listing)
}

fn read_checkpoint(dir: &Path) -> Result<Option<Checkpoint>, StorageError> {
    let path = dir.join(CHECKPOINT_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).at(&path),
    };
    match serde_json::from_slice::<Checkpoint>(&bytes) {
        Ok(c) if c.version == CHECKPOINT_VERSION => Ok(Some(c)),
        Ok(c) => Err(StorageError::Corrupt(
            path,
            format!("unsupported checkpoint version {}", c.version),
        )),
        Err(e) => {
            // Written atomically, so this is outside damage; recovering from the
            // start of the log is always safe.
            warn!(path = %path.display(), error = %e, "ignoring unreadable checkpoint; recovering the whole log");
            Ok(None)
        }
    }
}

/// The transaction marker of a control batch read back from the log, if it
/// holds one. A marker that cannot be read does not stop the log: it was
/// accepted once (a leader only writes markers it built), so it is logged and
/// counted as a control batch without a marker, which only moves the epoch.
fn stored_marker(
    segment: &Segment,
    position: u64,
    header: &BatchHeader,
    buf: &mut Vec<u8>,
) -> Result<Option<EndTxnMarker>, StorageError> {
    if !header.is_control() || !header.has_producer_id() {
        return Ok(None);
    }
    buf.clear();
    segment.read_into(buf, position, header.total_size())?;
    Ok(readable_marker(buf, header, segment.log_path()))
}

/// [`EndTxnMarker::parse`] for a batch already accepted into the log; see
/// [`stored_marker`].
fn readable_marker(bytes: &[u8], header: &BatchHeader, path: &Path) -> Option<EndTxnMarker> {
    match EndTxnMarker::parse(bytes) {
        Ok(marker) => marker,
        Err(e) => {
            warn!(path = %path.display(), offset = header.base_offset, error = %e,
                "control batch without a readable transaction marker");
            None
        }
    }
}

/// The transaction-index entry of a completed transaction, if it was aborted:
/// `producers` must already reflect the marker.
fn aborted_entry(producers: &ProducerStateManager, done: &CompletedTxn) -> Option<AbortedTxnEntry> {
    done.aborted.then(|| AbortedTxnEntry {
        producer_id: done.producer_id,
        first_offset: done.first_offset,
        last_offset: done.last_offset,
        last_stable_offset: producers
            .first_unstable_offset()
            .unwrap_or(done.last_offset + 1),
    })
}

/// Loads the newest usable snapshot at or below `log_end_offset` (and at or
/// below the base of every segment in `rebuild_txn_indexes`) and replays the
/// log after it. Snapshots above the log end describe batches that are gone
/// (a crash lost them, or the log was truncated) and are deleted.
///
/// The transaction indexes of the segments in `rebuild_txn_indexes` are
/// rebuilt by the replay: the aborted transactions whose markers it meets in
/// them are written anew. That is why the replay starts at or below the first
/// of them: an abort's entry needs the transaction's first offset, which only
/// the producer state before the marker knows.
fn rebuild_producer_state(
    dir: &Path,
    segments: &mut BTreeMap<i64, Segment>,
    rebuild_txn_indexes: &BTreeSet<i64>,
    log_start_offset: i64,
    log_end_offset: i64,
    expiration_ms: i64,
) -> Result<(ProducerStateManager, Option<i64>, u64), StorageError> {
    let snapshots = producer_state::list_snapshots(dir)?;
    let usable_up_to = rebuild_txn_indexes
        .first()
        .map_or(log_end_offset, |&base| base.min(log_end_offset));
    let mut loaded = None;
    for &offset in snapshots.iter().rev() {
        let path = producer_state::snapshot_path(dir, offset);
        if offset > log_end_offset {
            info!(path = %path.display(), log_end_offset, "deleting producer snapshot beyond the log end");
            fsutil::remove_if_exists(&path)?;
            continue;
        }
        if loaded.is_some() || offset > usable_up_to {
            continue;
        }
        match ProducerStateManager::read_snapshot(&path, offset, expiration_ms)? {
            Ok(manager) => loaded = Some((manager, offset)),
            Err(reason) => {
                warn!(path = %path.display(), reason, "ignoring damaged producer snapshot");
                fsutil::remove_if_exists(&path)?;
            }
        }
    }
    let snapshot_offset = loaded.as_ref().map(|(_, offset)| *offset);
    let (mut producers, replay_from) = match loaded {
        Some((manager, offset)) => (manager, offset.max(log_start_offset)),
        None => (ProducerStateManager::new(expiration_ms), log_start_offset),
    };
    let mut replayed = 0u64;
    let first_base = segments
        .range(..=replay_from)
        .next_back()
        .map_or(replay_from, |(base, _)| *base);
    let mut rebuilt: BTreeMap<i64, Vec<AbortedTxnEntry>> = rebuild_txn_indexes
        .iter()
        .map(|&base| (base, Vec::new()))
        .collect();
    let mut buf = Vec::new();
    for segment in segments.range(first_base..).map(|(_, s)| s) {
        let start = if segment.base_offset() < replay_from {
            match segment.locate(replay_from)? {
                Some((position, _)) => position,
                None => continue,
            }
        } else {
            0
        };
        let mut aborted = rebuilt.get_mut(&segment.base_offset());
        let mut failure = None;
        segment.scan_headers(start, |position, header| {
            if header.base_offset < replay_from || header.base_offset >= log_end_offset {
                return true;
            }
            let marker = match stored_marker(segment, position, header, &mut buf) {
                Ok(marker) => marker,
                Err(e) => {
                    failure = Some(e);
                    return false;
                }
            };
            if let Some(done) = producers.apply_replicated(header, marker.as_ref()) {
                if let (Some(entries), Some(entry)) =
                    (aborted.as_mut(), aborted_entry(&producers, &done))
                {
                    entries.push(entry);
                }
            }
            replayed += 1;
            true
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
    }
    for (base, entries) in rebuilt {
        if let Some(segment) = segments.get_mut(&base) {
            segment.replace_txn_index(entries)?;
        }
    }
    Ok((producers, snapshot_offset, replayed))
}

/// Opens the segments in `segment_bases` (ascending) in order. Segments from
/// `recover_from_base` on are validated batch by batch and cut at the first
/// invalid one; earlier ones keep their indexes if those pass a sanity check
/// (else they are validated too). A cut, or a segment not starting where the
/// previous one ends, deletes every later segment. The bases of the segments
/// whose transaction index must be rebuilt (every validated one, and those
/// whose index is damaged) are added to `rebuild_txn_indexes`. Batches may
/// leave gaps between them only in segments starting below `gaps_below`
/// (where a cleaner may have been: see `Segment::recover`).
#[allow(clippy::too_many_arguments)]
fn load_segments(
    dir: &Path,
    segment_bases: &[i64],
    recover_from_base: Option<i64>,
    gaps_below: i64,
    index_interval: u32,
    now_ms: i64,
    report: &mut RecoveryReport,
    rebuild_txn_indexes: &mut BTreeSet<i64>,
) -> Result<BTreeMap<i64, Segment>, StorageError> {
    let mut segments = BTreeMap::new();
    let mut expected_base: Option<i64> = None;
    let mut cut = false;
    for &base in segment_bases {
        if !cut {
            if let Some(expected) = expected_base.filter(|&e| e != base) {
                warn!(
                    path = %fsutil::offset_file_name(dir, base, LOG_EXTENSION).display(),
                    offset = expected,
                    reason = "segment does not start where the previous one ends",
                    "deleting this and every later segment"
                );
                report.truncated_at_offset.get_or_insert(expected);
                cut = true;
            }
        }
        if cut {
            let path = fsutil::offset_file_name(dir, base, LOG_EXTENSION);
            let dropped = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            warn!(path = %path.display(), offset = base, bytes_dropped = dropped,
                reason = "follows a truncated or missing part of the log", "deleting segment during recovery");
            remove_segment_files(dir, base)?;
            report.segments_deleted += 1;
            report.bytes_truncated += dropped;
            continue;
        }
        let mut segment = Segment::open(dir, base, now_ms)?;
        let offsets = if base < gaps_below {
            Offsets::MayGap
        } else {
            Offsets::Contiguous
        };
        let must_validate = recover_from_base.is_some_and(|from| base >= from);
        let untrusted_reason = if must_validate {
            None
        } else {
            segment.load_trusted(offsets)?.err()
        };
        if must_validate || untrusted_reason.is_some() {
            if let Some(reason) = &untrusted_reason {
                warn!(path = %segment.log_path().display(), reason, "segment indexes untrusted; rebuilding");
                report.indexes_rebuilt += 1;
            }
            let outcome = segment.recover(index_interval, offsets)?;
            segment.sync_all()?;
            report.segments_scanned += 1;
            // Entries written since the last seal may be lost or describe
            // batches just cut: rebuild rather than trust.
            rebuild_txn_indexes.insert(base);
            if outcome.truncated_bytes > 0 {
                report.bytes_truncated += outcome.truncated_bytes;
                report
                    .truncated_at_offset
                    .get_or_insert(segment.next_offset());
                cut = true;
            }
        }
        if !rebuild_txn_indexes.contains(&base) {
            if let Some(reason) = segment.txn_index_problem() {
                warn!(path = %segment.log_path().display(), reason, "transaction index untrusted; rebuilding");
                rebuild_txn_indexes.insert(base);
            }
        }
        expected_base = Some(segment.next_offset());
        segments.insert(base, segment);
    }
    Ok(segments)
}

impl PartitionLog {
    /// Opens or creates the log in `dir`.
    ///
    /// Without a `clean_shutdown` marker, every segment from the one holding
    /// the checkpointed recovery point onwards is validated batch by batch
    /// (framing, offsets increasing from the previous batch, CRC); the first
    /// invalid batch and everything after it are cut (later segments deleted),
    /// indexes are rebuilt and the recovered segments fsynced. Segments before
    /// that, and all segments after a clean shutdown, keep their indexes if a
    /// sanity check against the log file passes (else they are rebuilt the same
    /// way). Producer state comes from the newest snapshot at or below the
    /// recovered log end plus a replay of the batches after it. That replay
    /// also rebuilds the transaction indexes of the validated segments and of
    /// those whose `.txnindex` is missing or damaged (so it starts from a
    /// snapshot at or below the first of them).
    pub fn open(
        dir: &Path,
        config: LogConfig,
        now_ms: i64,
    ) -> Result<(PartitionLog, RecoveryReport), StorageError> {
        std::fs::create_dir_all(dir).at(dir)?;
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean_shutdown = marker.exists();
        if clean_shutdown {
            // Gone for good before anything can be appended: a crash from here
            // on must be recovered as unclean.
            std::fs::remove_file(&marker).at(&marker)?;
            fsync_dir(dir)?;
        }
        let mut report = RecoveryReport {
            clean_shutdown,
            ..RecoveryReport::default()
        };
        let listing = log_cleaning::finish_interrupted_cleaning(dir, list_dir(dir)?)?;
        let checkpoint = read_checkpoint(dir)?;
        // Unclean: validate from the segment holding the recovery point.
        let recover_from_base = if clean_shutdown {
            None
        } else {
            let recovery_point = checkpoint.as_ref().map_or(i64::MIN, |c| c.recovery_point);
            Some(
                listing
                    .segment_bases
                    .iter()
                    .rev()
                    .find(|&&base| base <= recovery_point)
                    .copied()
                    .unwrap_or(i64::MIN),
            )
        };

        let mut rebuild_txn_indexes = BTreeSet::new();
        // A compacted log has gaps anywhere (its own cleaner's, or its
        // leader's it copied); another only where a cleaner was before
        // compaction was switched off.
        let gaps_below = if config.cleanup_policy.compacts() {
            i64::MAX
        } else {
            checkpoint
                .as_ref()
                .and_then(|c| c.cleaner_offset)
                .unwrap_or(i64::MIN)
        };
        let mut segments = load_segments(
            dir,
            &listing.segment_bases,
            recover_from_base,
            gaps_below,
            config.index_interval_bytes,
            now_ms,
            &mut report,
            &mut rebuild_txn_indexes,
        )?;
        for base in listing.index_bases {
            if !segments.contains_key(&base) {
                remove_segment_files(dir, base)?;
            }
        }
        if segments.is_empty() {
            let base = checkpoint.as_ref().map_or(0, |c| c.log_start_offset.max(0));
            segments.insert(base, Segment::create(dir, base, now_ms)?);
        }
        // Only the active segment keeps its file open (see `open_files`).
        if let Some(active) = segments.values_mut().next_back() {
            active.hold_file()?;
        }

        let (first_base, log_end_offset) =
            match (segments.first_key_value(), segments.last_key_value()) {
                (Some((first, _)), Some((_, last))) => (*first, last.next_offset()),
                _ => {
                    return Err(StorageError::Corrupt(
                        dir.to_path_buf(),
                        "no segment after open".into(),
                    ))
                }
            };
        let log_start_offset = checkpoint
            .as_ref()
            .map_or(first_base, |c| c.log_start_offset)
            .max(first_base)
            .min(log_end_offset);
        let high_watermark = checkpoint
            .as_ref()
            .map_or(log_start_offset, |c| c.high_watermark)
            .clamp(log_start_offset, log_end_offset);

        let (mut producers, snapshot_offset, replayed) = rebuild_producer_state(
            dir,
            &mut segments,
            &rebuild_txn_indexes,
            log_start_offset,
            log_end_offset,
            config.producer_id_expiration_ms,
        )?;
        producers.expire(now_ms);
        report.transaction_indexes_rebuilt = rebuild_txn_indexes.len();
        report.snapshot_offset = snapshot_offset;
        report.batches_replayed = replayed;
        report.log_end_offset = log_end_offset;

        // Recovered segments were fsynced, the rest were durable already; only
        // directory entries may still be in the page cache (a process crash).
        fsync_dir(dir)?;
        for segment in segments.values_mut() {
            segment.dir_entry_durable = true;
        }
        // A horizon the last run's passes left is not known: one more
        // retention period covers them all.
        let cleaner_horizon_due_ms = config
            .cleanup_policy
            .compacts()
            .then(|| now_ms.saturating_add(config.delete_retention_ms));
        let mut log = PartitionLog {
            dir: dir.to_path_buf(),
            config,
            segments,
            log_start_offset,
            log_end_offset,
            high_watermark,
            recovery_point: log_end_offset,
            checkpointed_recovery_segment: None,
            producers,
            cleaner_offset: checkpoint
                .as_ref()
                .and_then(|c| c.cleaner_offset)
                .unwrap_or(log_start_offset)
                .clamp(log_start_offset, log_end_offset),
            cleaner_horizon_due_ms,
            generation: checkpoint
                .as_ref()
                .and_then(|c| c.generation)
                .unwrap_or_else(rand::random),
            append_buffer: Vec::new(),
            placements: Vec::new(),
            staged: StagedProducers::default(),
        };
        log.check_offsets()?;
        log.write_checkpoint()?;
        Ok((log, report))
    }

    fn active(&self) -> Result<&Segment, StorageError> {
        self.segments
            .values()
            .next_back()
            .ok_or_else(|| StorageError::Corrupt(self.dir.clone(), "log has no segment".into()))
    }

    fn active_mut(&mut self) -> Result<&mut Segment, StorageError> {
        let dir = &self.dir;
        self.segments
            .values_mut()
            .next_back()
            .ok_or_else(|| StorageError::Corrupt(dir.clone(), "log has no segment".into()))
    }

    /// Base offset of the segment holding `offset` (the first segment if below all).
    fn segment_base_for(&self, offset: i64) -> Option<i64> {
        self.segments
            .range(..=offset)
            .next_back()
            .or_else(|| self.segments.first_key_value())
            .map(|(base, _)| *base)
    }

    /// Validates and appends a produce request's `records` (one or more whole
    /// batches) as the leader.
    ///
    /// Every batch must frame, be magic 2, pass CRC (`CorruptRecord`), be at
    /// most `max_message_bytes` (`RecordTooLarge`), not be a control batch and
    /// have `records_count == last_offset_delta + 1` (`InvalidRecord`). Batches
    /// with a producer id pass the producer-state rules (see `producer_state`)
    /// against the state as changed by the request's earlier batches. If any
    /// batch is a retried duplicate, nothing is written and its original
    /// offsets are returned. Offsets are assigned by rewriting base offsets,
    /// the partition leader epoch is set, and under LogAppendTime the max
    /// timestamp is stamped (CRC recomputed). One positioned write, no fsync.
    ///
    /// Under a `compression.type` other than `producer`, batches in another
    /// codec are first recompressed ([`compression::to_topic_codec`]) and
    /// the checks above apply to the result. Callers may do that beforehand,
    /// outside any lock: batches already in the topic's codec pass through.
    pub fn append_as_leader(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo, StorageError> {
        if records.is_empty() {
            return Err(StorageError::InvalidRecord("no record batches".into()));
        }
        let records = compression::to_topic_codec(
            records,
            self.config.compression_type,
            self.config.max_message_bytes,
        )?;
        let records: &[u8] = &records;
        let log_append_time = self.config.message_timestamp_type_log_append;
        let max_message_bytes = self.config.max_message_bytes;
        let mut placements = std::mem::take(&mut self.placements);
        let mut staged = std::mem::take(&mut self.staged);
        placements.clear();
        staged.clear();
        let validated = self.validate_leader_batches(
            records,
            now_ms,
            log_append_time,
            max_message_bytes,
            &mut placements,
            &mut staged,
        );
        let result = match validated {
            Ok(None) => self.write_leader_batches(
                records,
                leader_epoch,
                now_ms,
                log_append_time,
                &placements,
                &mut staged,
            ),
            Ok(Some(duplicate)) => Ok(duplicate),
            Err(e) => Err(e),
        };
        self.placements = placements;
        self.staged = staged;
        result
    }

    /// A compacted log keeps the latest record of each key, so a record
    /// without one could never be kept: refused (Kafka's INVALID_RECORD).
    fn refuse_keyless_records(
        &self,
        batch: &[u8],
        header: &BatchHeader,
    ) -> Result<(), StorageError> {
        let body = compression::decompressed_records(batch, self.decompression_limit())?;
        let mut record_indexes = Vec::new();
        for (i, record) in batch::records_in(&body, header.records_count).enumerate() {
            if record?.key.is_none() {
                record_indexes.push(i32::try_from(i).unwrap_or(i32::MAX));
            }
        }
        if record_indexes.is_empty() {
            Ok(())
        } else {
            Err(StorageError::KeylessRecords { record_indexes })
        }
    }

    /// First pass over a produce request: every check, no side effect. Fills
    /// `placements` and `staged`; returns the answer for a duplicate.
    fn validate_leader_batches(
        &self,
        records: &[u8],
        now_ms: i64,
        log_append_time: bool,
        max_message_bytes: u32,
        placements: &mut Vec<BatchPlacement>,
        staged: &mut StagedProducers,
    ) -> Result<Option<AppendInfo>, StorageError> {
        let mut next_offset = self.log_end_offset;
        let mut iter = batch::batches(records);
        loop {
            let offset_in_buffer = iter.position();
            let Some(item) = iter.next() else { break };
            let (header, bytes) = item?;
            if header.total_size() > max_message_bytes as usize {
                return Err(StorageError::RecordTooLarge {
                    size: header.total_size(),
                    max: max_message_bytes,
                });
            }
            verify_crc(bytes)?;
            if header.is_control() {
                return Err(StorageError::InvalidRecord(
                    "producers cannot write control batches".into(),
                ));
            }
            if self.config.cleanup_policy.compacts() {
                self.refuse_keyless_records(bytes, &header)?;
            }
            if header.last_offset_delta < 0
                || i64::from(header.records_count) != i64::from(header.last_offset_delta) + 1
            {
                return Err(StorageError::InvalidRecord(format!(
                    "batch claims {} records but a last offset delta of {}",
                    header.records_count, header.last_offset_delta
                )));
            }
            if header.is_transactional() && !header.has_producer_id() {
                return Err(StorageError::InvalidRecord(
                    "transactional batch without a producer id".into(),
                ));
            }
            let base_offset = next_offset;
            let last_offset = base_offset + i64::from(header.last_offset_delta);
            let max_timestamp = if log_append_time {
                now_ms
            } else {
                header.max_timestamp
            };
            if header.has_producer_id() {
                if let Some(original) = self.producers.stage(
                    staged,
                    &header,
                    base_offset,
                    last_offset,
                    max_timestamp,
                )? {
                    if original.first_offset >= self.log_end_offset {
                        return Err(StorageError::InvalidRecord(
                            "the same idempotent batch twice in one request".into(),
                        ));
                    }
                    return Ok(Some(AppendInfo {
                        base_offset: original.first_offset,
                        last_offset: original.last_offset,
                        max_timestamp: original.timestamp,
                        offset_of_max_timestamp: original.last_offset,
                        record_count: original.last_offset - original.first_offset + 1,
                        duplicate: true,
                        log_append_time_ms: if log_append_time {
                            original.timestamp
                        } else {
                            NO_TIMESTAMP
                        },
                    }));
                }
            }
            placements.push(BatchPlacement {
                offset_in_buffer,
                size: header.total_size(),
                base_offset,
                last_offset,
                max_timestamp,
            });
            next_offset = last_offset + 1;
        }
        Ok(None)
    }

    fn write_leader_batches(
        &mut self,
        records: &[u8],
        leader_epoch: i32,
        now_ms: i64,
        log_append_time: bool,
        placements: &[BatchPlacement],
        staged: &mut StagedProducers,
    ) -> Result<AppendInfo, StorageError> {
        let (Some(first), Some(last)) = (placements.first(), placements.last()) else {
            return Err(StorageError::InvalidRecord("no record batches".into()));
        };
        let (max_timestamp, offset_of_max_timestamp) = if log_append_time {
            (now_ms, first.base_offset)
        } else {
            max_timestamp_of(placements)
        };
        self.maybe_roll(records.len(), last.last_offset, max_timestamp, now_ms)?;

        let mut buffer = std::mem::take(&mut self.append_buffer);
        buffer.clear();
        buffer.extend_from_slice(records);
        for p in placements {
            let batch = &mut buffer[p.offset_in_buffer..p.offset_in_buffer + p.size];
            set_base_offset(batch, p.base_offset);
            set_partition_leader_epoch(batch, leader_epoch);
            if log_append_time {
                set_log_append_time(batch, now_ms)?;
            }
        }
        let interval = self.config.index_interval_bytes;
        let written = self
            .active_mut()
            .and_then(|s| s.append(&buffer, placements, Offsets::Contiguous, interval, now_ms));
        self.append_buffer = buffer;
        written?;

        self.producers.commit(staged);
        self.log_end_offset = last.last_offset + 1;
        self.check_offsets()?;
        Ok(AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset,
            max_timestamp,
            offset_of_max_timestamp,
            record_count: last.last_offset - first.base_offset + 1,
            duplicate: false,
            log_append_time_ms: if log_append_time {
                now_ms
            } else {
                NO_TIMESTAMP
            },
        })
    }

    /// Writes a transaction marker (`WriteTxnMarkers`) as the leader: checks it
    /// against the producer's state (`InvalidProducerEpoch` for an older
    /// producer epoch, `TransactionCoordinatorFenced` for an older coordinator
    /// epoch; see `producer_state`), appends the control batch at the log end
    /// stamped `now_ms` and `leader_epoch`, closes the producer's ongoing
    /// transaction and, for an ABORT that closed one, adds it to the active
    /// segment's transaction index. A marker for a producer with no ongoing
    /// transaction is appended too (the coordinator retries markers), and
    /// moves the producer's epoch up if it is newer. No fsync.
    pub fn append_txn_marker(
        &mut self,
        marker: &EndTxnMarker,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<AppendInfo, StorageError> {
        if marker.producer_id < 0 {
            return Err(StorageError::InvalidRecord(
                "transaction marker without a producer id".into(),
            ));
        }
        self.producers.check_marker(marker)?;
        let offset = self.log_end_offset;
        let log_append_time = self.config.message_timestamp_type_log_append;
        let mut bytes = marker.to_batch(now_ms);
        set_base_offset(&mut bytes, offset);
        set_partition_leader_epoch(&mut bytes, leader_epoch);
        if log_append_time {
            set_log_append_time(&mut bytes, now_ms)?;
        }
        let placement = BatchPlacement {
            offset_in_buffer: 0,
            size: bytes.len(),
            base_offset: offset,
            last_offset: offset,
            max_timestamp: now_ms,
        };
        self.maybe_roll(bytes.len(), offset, now_ms, now_ms)?;
        let interval = self.config.index_interval_bytes;
        self.active_mut()?
            .append(&bytes, &[placement], Offsets::Contiguous, interval, now_ms)?;
        self.log_end_offset = offset + 1;
        if let Some(done) = self.producers.apply_marker(marker, offset, now_ms) {
            self.index_completed_txn(&done)?;
        }
        self.check_offsets()?;
        Ok(AppendInfo {
            base_offset: offset,
            last_offset: offset,
            max_timestamp: now_ms,
            offset_of_max_timestamp: offset,
            record_count: 1,
            duplicate: false,
            log_append_time_ms: if log_append_time {
                now_ms
            } else {
                NO_TIMESTAMP
            },
        })
    }

    /// Adds an aborted transaction whose marker was just appended to the
    /// active segment's transaction index.
    fn index_completed_txn(&mut self, done: &CompletedTxn) -> Result<(), StorageError> {
        if let Some(entry) = aborted_entry(&self.producers, done) {
            self.active_mut()?.push_aborted_txn(entry);
        }
        Ok(())
    }

    /// Appends batches that already carry their offsets (replication): each
    /// must pass framing and CRC checks and start at or after the end of the
    /// one before it, the first at or after the log end offset (a gap is the
    /// leader's cleaner having removed batches). An empty log (nothing
    /// between log start and log end) instead restarts at the first batch's
    /// offset, as a follower does when the leader's log starts later. Producer state is
    /// updated without idempotence or marker checks: the leader made them.
    /// Transactions open and close as on the leader, and aborted ones enter
    /// the transaction index.
    pub fn append_as_follower(
        &mut self,
        records: &[u8],
        now_ms: i64,
    ) -> Result<AppendInfo, StorageError> {
        if records.is_empty() {
            return Err(StorageError::InvalidRecord("no record batches".into()));
        }
        let mut placements = std::mem::take(&mut self.placements);
        placements.clear();
        let result = self.append_replicated(records, now_ms, &mut placements);
        self.placements = placements;
        result
    }

    fn append_replicated(
        &mut self,
        records: &[u8],
        now_ms: i64,
        placements: &mut Vec<BatchPlacement>,
    ) -> Result<AppendInfo, StorageError> {
        let mut expected: Option<i64> = None;
        let mut restart_at = None;
        let mut iter = batch::batches(records);
        loop {
            let offset_in_buffer = iter.position();
            let Some(item) = iter.next() else { break };
            let (header, bytes) = item?;
            verify_crc(bytes)?;
            if header.last_offset_delta < 0 {
                return Err(StorageError::InvalidRecord(format!(
                    "negative last offset delta {}",
                    header.last_offset_delta
                )));
            }
            let expected_base = expected.unwrap_or(self.log_end_offset);
            let restart = expected.is_none()
                && header.base_offset > self.log_end_offset
                && self.log_start_offset == self.log_end_offset;
            if header.base_offset < expected_base {
                return Err(StorageError::InvalidRecord(format!(
                    "replicated batch at offset {} but the log expects at least {expected_base}",
                    header.base_offset
                )));
            }
            if restart {
                restart_at = Some(header.base_offset);
            }
            placements.push(BatchPlacement {
                offset_in_buffer,
                size: header.total_size(),
                base_offset: header.base_offset,
                last_offset: header.last_offset(),
                max_timestamp: header.max_timestamp,
            });
            expected = Some(header.last_offset() + 1);
        }
        let (Some(first), Some(last)) = (placements.first().copied(), placements.last().copied())
        else {
            return Err(StorageError::InvalidRecord("no record batches".into()));
        };
        if let Some(offset) = restart_at {
            self.truncate_fully_and_start_at(offset, now_ms)?;
        }
        let (max_timestamp, offset_of_max_timestamp) = max_timestamp_of(placements);
        self.maybe_roll(records.len(), last.last_offset, max_timestamp, now_ms)?;
        let interval = self.config.index_interval_bytes;
        self.active_mut()?
            .append(records, placements, Offsets::MayGap, interval, now_ms)?;
        self.log_end_offset = last.last_offset + 1;
        // The bytes are written: from here on the state must follow them even
        // if a marker is unreadable (see `readable_marker`).
        for item in batch::batches(records) {
            let (header, bytes) = item?;
            let marker = if header.is_control() && header.has_producer_id() {
                readable_marker(bytes, &header, &self.dir)
            } else {
                None
            };
            if let Some(done) = self.producers.apply_replicated(&header, marker.as_ref()) {
                self.index_completed_txn(&done)?;
            }
        }
        self.check_offsets()?;
        Ok(AppendInfo {
            base_offset: first.base_offset,
            last_offset: last.last_offset,
            max_timestamp,
            offset_of_max_timestamp,
            record_count: last.last_offset - first.base_offset + 1,
            duplicate: false,
            log_append_time_ms: NO_TIMESTAMP,
        })
    }

    /// Rolls before an append of `incoming_bytes` ending at `last_offset` with
    /// largest timestamp `incoming_max_timestamp` if the active segment is
    /// full, too old, or could not index it.
    fn maybe_roll(
        &mut self,
        incoming_bytes: usize,
        last_offset: i64,
        incoming_max_timestamp: i64,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        let active = self.active()?;
        if active.is_empty() {
            return Ok(());
        }
        let size_after = active.size() + incoming_bytes as u64;
        let full = size_after > self.config.segment_bytes;
        let aged = active.age_ms(incoming_max_timestamp, now_ms) > self.config.roll_after_ms();
        let index_overflow = last_offset - active.base_offset() > i64::from(i32::MAX)
            || size_after > u64::from(u32::MAX);
        if full || aged || index_overflow {
            self.roll(now_ms)?;
        }
        Ok(())
    }

    /// Seals the active segment and starts a new one at the log end offset,
    /// snapshotting producer state there.
    fn roll(&mut self, now_ms: i64) -> Result<(), StorageError> {
        let new_base = self.log_end_offset;
        let active = self.active_mut()?;
        if active.base_offset() == new_base {
            return Ok(());
        }
        // Indexes are fsynced now because nothing else will: once the recovery
        // point passes this segment, a crash leaves them trusted.
        active.seal()?;
        // The new segment joins the log only once its files and the
        // snapshot exist: a roll that fails (a full disk) leaves the log as
        // it was, without files of a segment it does not have.
        let created = Segment::create(&self.dir, new_base, now_ms).and_then(|segment| {
            self.producers
                .write_snapshot(&self.dir, new_base)
                .map(|()| segment)
        });
        let segment = match created {
            Ok(segment) => segment,
            Err(e) => {
                if let Err(cleanup) = remove_segment_files(&self.dir, new_base) {
                    warn!(dir = %self.dir.display(), error = %cleanup, "cannot remove the files of a failed roll");
                }
                return Err(e);
            }
        };
        if let Some(sealed) = self.segments.values_mut().next_back() {
            sealed.release_file();
        }
        self.segments.insert(new_base, segment);
        self.delete_old_snapshots()?;
        if self.config.flush == (FlushPolicy::Interval { interval_ms: 0 }) {
            // "Only on roll/shutdown": the finished segment becomes durable now.
            self.flush()?;
        }
        Ok(())
    }

    /// Keeps the newest snapshots, the newest one at or below the recovery
    /// point, and the newest one at or below the base of the segment holding
    /// the recovery point (where recovery from a crash right now would start
    /// its replay: it rebuilds that segment's transaction index).
    fn delete_old_snapshots(&self) -> Result<(), StorageError> {
        let snapshots = producer_state::list_snapshots(&self.dir)?;
        let newest_at_or_below =
            |limit: i64| snapshots.iter().rev().find(|&&s| s <= limit).copied();
        let newest_durable = newest_at_or_below(self.recovery_point);
        let recovery_start = self
            .segment_base_for(self.recovery_point)
            .and_then(newest_at_or_below);
        let keep_from = snapshots.len().saturating_sub(SNAPSHOTS_RETAINED);
        for (i, &offset) in snapshots.iter().enumerate() {
            if i < keep_from && Some(offset) != newest_durable && Some(offset) != recovery_start {
                fsutil::remove_if_exists(&producer_state::snapshot_path(&self.dir, offset))?;
            }
        }
        Ok(())
    }

    /// Reads whole batches starting with the batch that contains `offset`:
    /// at most `max_bytes`, except that the first batch is always returned whole
    /// (KIP-74), and never a batch whose last offset is >= `max_offset` (the HW
    /// or LSO). Reading at the log end or at/after `max_offset` returns nothing;
    /// below the log start or past the log end is `OffsetOutOfRange`. Every
    /// batch returned has been checked for framing, increasing offsets and CRC.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
    ) -> Result<ReadResult, StorageError> {
        if offset < self.log_start_offset || offset > self.log_end_offset {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start: self.log_start_offset,
                log_end: self.log_end_offset,
            });
        }
        if offset >= self.log_end_offset || offset >= max_offset {
            return Ok(ReadResult::default());
        }
        let Some(first_segment_base) = self.segment_base_for(offset) else {
            return Ok(ReadResult::default());
        };
        let mut out: Vec<u8> = Vec::new();
        let mut first: Option<BatchHeader> = None;
        let mut expected_base: Option<i64> = None;
        for segment in self.segments.range(first_segment_base..).map(|(_, s)| s) {
            let start = if first.is_none() {
                match segment.locate(offset)? {
                    Some((position, header)) => {
                        if header.last_offset() >= max_offset {
                            break;
                        }
                        first = Some(header);
                        position
                    }
                    None => continue,
                }
            } else {
                0
            };
            // Stop the read where max_offset starts, so a fetch bounded by the
            // HW reads no more than it returns.
            let end = if max_offset < segment.next_offset() {
                match segment.locate(max_offset)? {
                    Some((position, _)) => position,
                    None => segment.size(),
                }
            } else {
                segment.size()
            };
            if end <= start {
                break;
            }
            let budget = max_bytes.saturating_sub(out.len());
            let want = if out.is_empty() {
                budget.max(first.map_or(0, |h| h.total_size()))
            } else {
                budget
            };
            if want < BATCH_HEADER_LEN {
                break;
            }
            let want = (want as u64).min(end - start) as usize;
            let chunk_start = out.len();
            segment.read_into(&mut out, start, want)?;
            let mut accepted = 0usize;
            let mut reached_limit = false;
            for item in batch::batches(&out[chunk_start..]) {
                let (header, bytes) = match item {
                    Ok(b) => b,
                    Err(BatchError::Truncated { .. }) if (start + want as u64) < end => {
                        // Cut by max_bytes, not by the segment.
                        reached_limit = true;
                        break;
                    }
                    Err(e) => return Err(segment.corrupt(start + accepted as u64, &e.to_string())),
                };
                if header.last_offset() >= max_offset {
                    reached_limit = true;
                    break;
                }
                // The batch must be the one located (the first) or follow
                // the previous one: the offsets it was written with.
                match expected_base {
                    Some(expected) if header.base_offset < expected => {
                        return Err(segment.corrupt(
                            start + accepted as u64,
                            &format!(
                                "base offset {} where at least {expected} was expected",
                                header.base_offset
                            ),
                        ));
                    }
                    None if first.is_some_and(|located| {
                        located.base_offset != header.base_offset || located.crc != header.crc
                    }) =>
                    {
                        return Err(segment.corrupt(
                            start,
                            &format!(
                                "the batch read back (base offset {}, crc {}) is not the one located there",
                                header.base_offset, header.crc
                            ),
                        ));
                    }
                    _ => {}
                }
                verify_crc(bytes)
                    .map_err(|e| segment.corrupt(start + accepted as u64, &e.to_string()))?;
                accepted += bytes.len();
                expected_base = Some(header.last_offset() + 1);
            }
            out.truncate(chunk_start + accepted);
            if reached_limit || start + (accepted as u64) < segment.size() {
                break;
            }
        }
        let first_batch_offset = if out.is_empty() {
            None
        } else {
            first.map(|h| h.base_offset)
        };
        Ok(ReadResult {
            records: Bytes::from(out),
            first_batch_offset,
        })
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }

    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset
    }

    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// Names this log's history: drawn at random when the log is created
    /// (or first opened by a version that did not write one) and again
    /// whenever its end is cut back (truncation, a restart at another
    /// offset), kept in `checkpoint` (written before the cutting call
    /// returns) and unchanged otherwise. Within one generation the HW only
    /// moves forward, so an HW recorded elsewhere under the same generation
    /// (the broker's one-file checkpoint of every partition's HW) is a
    /// lower bound of this log's, and one recorded under another generation
    /// says nothing about it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// After [`PartitionLog::open`]: takes `high_watermark` recorded under
    /// `generation` elsewhere, when that is this log's generation and the
    /// value is above the checkpointed one (capped at the log end, which a
    /// crash may have cut below it). Returns whether the HW moved.
    pub fn restore_high_watermark(
        &mut self,
        generation: u64,
        high_watermark: i64,
    ) -> Result<bool, StorageError> {
        if generation != self.generation {
            return Ok(false);
        }
        let before = self.high_watermark;
        self.set_high_watermark(high_watermark.min(self.log_end_offset))?;
        Ok(self.high_watermark > before)
    }

    /// Moves the HW forward to `hw`.
    ///
    /// A value above the log end offset is refused
    /// (`HighWatermarkBeyondLogEnd`, the HW unchanged): nothing can be
    /// committed that this log does not hold, so such a value is a caller's
    /// bug; a follower holding its leader's HW caps it at its own LEO first.
    /// A value at or below the current HW changes nothing: replication
    /// legitimately presents lower ones (a follower hears the HW of a new
    /// leader that has not caught up with the old one's; a leader's bound
    /// over its ISR drops when a member reports a shorter log after losing an
    /// unflushed tail), and only truncation moves the HW back.
    pub fn set_high_watermark(&mut self, hw: i64) -> Result<(), StorageError> {
        if hw > self.log_end_offset {
            return Err(StorageError::HighWatermarkBeyondLogEnd {
                dir: self.dir.clone(),
                high_watermark: hw,
                log_end_offset: self.log_end_offset,
            });
        }
        if hw > self.high_watermark {
            self.high_watermark = hw;
        }
        Ok(())
    }

    /// The orderings of the module docs: log start <= LSO <= HW <= LEO,
    /// recovery point <= LEO, and the active segment ending at the LEO.
    /// Every operation that moves an offset ends with this check, so a
    /// broken ordering stops that operation with `OffsetsInconsistent`
    /// (and every later one, until the partition is reopened and recovered)
    /// instead of being served. A handful of comparisons.
    pub fn check_offsets(&self) -> Result<(), StorageError> {
        let lso = self.last_stable_offset();
        let active_end = self.active()?.next_offset();
        let reason = if !(self.log_start_offset <= lso
            && lso <= self.high_watermark
            && self.high_watermark <= self.log_end_offset)
        {
            format!(
                "log start {} <= LSO {lso} <= HW {} <= LEO {} does not hold",
                self.log_start_offset, self.high_watermark, self.log_end_offset
            )
        } else if self.recovery_point > self.log_end_offset {
            format!(
                "recovery point {} is beyond the LEO {}",
                self.recovery_point, self.log_end_offset
            )
        } else if active_end != self.log_end_offset {
            format!(
                "the active segment ends at {active_end}, the LEO is {}",
                self.log_end_offset
            )
        } else {
            return Ok(());
        };
        Err(StorageError::OffsetsInconsistent {
            dir: self.dir.clone(),
            reason,
        })
    }

    /// First offset of the oldest ongoing transaction, raised to the log start
    /// offset if that transaction began in a segment retention deleted; `None`
    /// when no transaction is ongoing.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.producers
            .first_unstable_offset()
            .map(|first| first.max(self.log_start_offset))
    }

    /// min(first unstable offset, HW): what a `read_committed` fetch may read
    /// up to. Between log start and HW ([`PartitionLog::check_offsets`]).
    pub fn last_stable_offset(&self) -> i64 {
        self.first_unstable_offset()
            .map_or(self.high_watermark, |first| first.min(self.high_watermark))
    }

    /// The aborted transactions a `read_committed` fetch of `[fetch_offset,
    /// upper_bound_offset)` must report: every one whose range (first offset
    /// to ABORT marker) overlaps it, in marker order. Looks at the segment
    /// holding `fetch_offset` and later ones, until an entry shows no later
    /// transaction can overlap (see `txn_index`).
    pub fn aborted_transactions(
        &self,
        fetch_offset: i64,
        upper_bound_offset: i64,
    ) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        if upper_bound_offset <= fetch_offset {
            return out;
        }
        let Some(from) = self.segment_base_for(fetch_offset) else {
            return out;
        };
        for segment in self.segments.range(from..).map(|(_, s)| s) {
            if segment.collect_aborted_txns(fetch_offset, upper_bound_offset, &mut out) {
                break;
            }
        }
        out
    }

    /// What DescribeProducers reports for this partition: every producer with
    /// state here, by producer id.
    pub fn describe_producers(&self) -> Vec<ProducerDescription> {
        let mut out: Vec<ProducerDescription> = self
            .producers
            .iter()
            .map(ProducerDescription::from)
            .collect();
        out.sort_unstable_by_key(|d| d.producer_id);
        out
    }

    /// ListOffsets by timestamp: `(offset, timestamp)` of the first record whose
    /// timestamp is >= `timestamp`, found through the time index. Within a
    /// CreateTime batch the exact record is found (compressed batches are
    /// decompressed); LogAppendTime batches, and compressed ones that do not
    /// decompress, answer with the batch's base offset and max timestamp.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>, StorageError> {
        for segment in self.segments.values() {
            if segment.is_empty() || segment.max_timestamp() < timestamp {
                continue;
            }
            let mut found: Option<(u64, BatchHeader)> = None;
            segment.scan_headers(segment.time_search_start(timestamp), |position, header| {
                if header.max_timestamp >= timestamp {
                    found = Some((position, *header));
                    false
                } else {
                    true
                }
            })?;
            let Some((position, header)) = found else {
                continue;
            };
            if header.timestamp_type_is_log_append() {
                return Ok(Some((header.base_offset, header.max_timestamp)));
            }
            let mut bytes = Vec::new();
            segment.read_into(&mut bytes, position, header.total_size())?;
            return record_time::first_record_at_or_after(
                &bytes,
                timestamp,
                self.decompression_limit(),
            )
            .map_err(|e| segment.corrupt(position, &e.to_string()));
        }
        Ok(None)
    }

    /// ListOffsets MAX_TIMESTAMP: `(offset, timestamp)` of the first record with
    /// the largest timestamp in the log, if any record has a timestamp. (Note
    /// the order: offset first, like [`PartitionLog::offset_for_timestamp`].)
    /// The record is found inside the batch (decompressed if need be); if
    /// its records cannot be read the offset is the carrying batch's last
    /// offset (base offset under LogAppendTime).
    pub fn max_timestamp_and_offset(&self) -> Option<(i64, i64)> {
        let mut best: Option<&Segment> = None;
        for segment in self.segments.values() {
            if segment.max_timestamp() > best.map_or(NO_TIMESTAMP, |b| b.max_timestamp()) {
                best = Some(segment);
            }
        }
        let segment = best?;
        let timestamp = segment.max_timestamp();
        let shallow_offset = segment.offset_of_max_timestamp();
        let exact = (|| -> Result<Option<i64>, StorageError> {
            let Some((position, header)) = segment.locate(shallow_offset)? else {
                return Ok(None);
            };
            if header.max_timestamp != timestamp {
                return Ok(None);
            }
            let mut bytes = Vec::new();
            segment.read_into(&mut bytes, position, header.total_size())?;
            Ok(record_time::offset_of_max_timestamp(&bytes, self.decompression_limit()).ok())
        })();
        match exact {
            Ok(Some(offset)) => Some((offset, timestamp)),
            Ok(None) => Some((shallow_offset, timestamp)),
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot read the batch with the max timestamp");
                Some((shallow_offset, timestamp))
            }
        }
    }

    /// Group commit support: what must be fsynced to make everything up to the
    /// current log end durable; `None` if it already is. Call
    /// [`FlushTarget::sync`] outside the log's lock, then [`PartitionLog::mark_flushed`].
    pub fn flush_target(&self) -> Option<FlushTarget> {
        if self.recovery_point >= self.log_end_offset {
            return None;
        }
        let from = self.segment_base_for(self.recovery_point)?;
        let mut files = Vec::new();
        let mut dir = None;
        for segment in self.segments.range(from..).map(|(_, s)| s) {
            if segment.is_empty() {
                continue;
            }
            files.push(segment.log_file().clone());
            if !segment.dir_entry_durable {
                dir = Some(self.dir.clone());
            }
        }
        Some(FlushTarget {
            files,
            dir,
            up_to_offset: self.log_end_offset,
        })
    }

    /// Records that a [`FlushTarget`] covering `up_to_offset` was synced:
    /// advances the recovery point (never backwards, never past the log end)
    /// and checkpoints it when it moves into another segment.
    pub fn mark_flushed(&mut self, up_to_offset: i64) -> Result<(), StorageError> {
        let up_to = up_to_offset.min(self.log_end_offset);
        if up_to <= self.recovery_point {
            return Ok(());
        }
        for segment in self.segments.values_mut() {
            if segment.base_offset() < up_to {
                segment.dir_entry_durable = true;
            }
        }
        self.recovery_point = up_to;
        if self.segment_base_for(up_to) != self.checkpointed_recovery_segment {
            self.write_checkpoint()?;
        }
        Ok(())
    }

    /// The recovery point: everything below it is on disk.
    pub fn flushed_offset(&self) -> i64 {
        self.recovery_point
    }

    /// The base of the active segment when segments rolled since the last
    /// flush are not all durable yet: what a flush after a roll covers
    /// (Kafka flushes a segment once it rolls). Until then the cleaner does
    /// not take them and a crash recovery replays them.
    pub fn rolled_unflushed_end(&self) -> Option<i64> {
        let active_base = self.active().ok()?.base_offset();
        (self.recovery_point < active_base).then_some(active_base)
    }

    /// Synchronous fsync of everything appended, then [`PartitionLog::mark_flushed`].
    pub fn flush(&mut self) -> Result<(), StorageError> {
        if let Some(target) = self.flush_target() {
            target.sync().at(&self.dir)?;
            self.mark_flushed(target.up_to_offset())?;
        }
        Ok(())
    }

    /// Writes `checkpoint` (log start, recovery point, high watermark) now. The
    /// log writes it itself on open, close, retention, truncation and when the
    /// recovery point crosses a segment; a broker may call this periodically so
    /// that the high watermark survives a crash more precisely.
    pub fn write_checkpoint(&mut self) -> Result<(), StorageError> {
        let checkpoint = Checkpoint {
            version: CHECKPOINT_VERSION,
            log_start_offset: self.log_start_offset,
            recovery_point: self.recovery_point,
            high_watermark: self.high_watermark,
            cleaner_offset: Some(self.cleaner_offset),
            generation: Some(self.generation),
        };
        let json = serde_json::to_vec(&checkpoint).map_err(|e| {
            StorageError::Corrupt(self.dir.clone(), format!("cannot encode checkpoint: {e}"))
        })?;
        fsutil::write_atomically(&self.dir, CHECKPOINT_FILE, &json)?;
        self.checkpointed_recovery_segment = self.segment_base_for(self.recovery_point);
        Ok(())
    }

    /// Under a `cleanup.policy` that deletes, deletes whole segments from the
    /// start of the log (never the active one, never one holding offsets at
    /// or above the high watermark) while the
    /// oldest is past `retention_ms` by its largest timestamp, or while the log
    /// without it would still be at least `retention_bytes`. Advances the log
    /// start offset. Also expires idle producers. Returns segments deleted.
    pub fn enforce_retention(&mut self, now_ms: i64) -> Result<usize, StorageError> {
        let mut total_size = self.size_bytes();
        let mut deleted = 0;
        while self.segments.len() > 1 {
            let Some((&base, oldest)) = self.segments.first_key_value() else {
                break;
            };
            if oldest.next_offset() > self.high_watermark {
                break;
            }
            if !self.config.cleanup_policy.deletes() {
                break;
            }
            let expired = self.config.retention_ms >= 0
                && now_ms.saturating_sub(oldest.largest_timestamp()) > self.config.retention_ms;
            let oversized = self.config.retention_bytes >= 0
                && total_size - oldest.size() >= self.config.retention_bytes as u64;
            if !(expired || oversized) {
                break;
            }
            let Some(segment) = self.segments.remove(&base) else {
                break;
            };
            total_size -= segment.size();
            let next = segment.next_offset();
            info!(path = %segment.log_path().display(), expired, oversized, "retention deletes segment");
            segment.remove_files(&self.dir)?;
            self.log_start_offset = self.log_start_offset.max(next);
            deleted += 1;
        }
        if deleted > 0 {
            self.after_log_start_moved()?;
        }
        self.producers.expire(now_ms);
        Ok(deleted)
    }

    /// DeleteRecords: moves the log start offset up to `offset`, which must
    /// not be above the high watermark (`OffsetOutOfRange`), and deletes the
    /// segments wholly below it (never the active one). The segment holding
    /// the new log start stays; reads below it are out of range. Producer
    /// state is kept (ids expire as usual). A lower or equal `offset`
    /// changes nothing. Returns the log start offset after it.
    pub fn delete_records_before(&mut self, offset: i64) -> Result<i64, StorageError> {
        if offset > self.high_watermark || offset < 0 {
            return Err(StorageError::OffsetOutOfRange {
                offset,
                log_start: self.log_start_offset,
                log_end: self.high_watermark,
            });
        }
        if offset <= self.log_start_offset {
            return Ok(self.log_start_offset);
        }
        while self.segments.len() > 1 {
            let Some((&base, oldest)) = self.segments.first_key_value() else {
                break;
            };
            if oldest.next_offset() > offset {
                break;
            }
            let Some(segment) = self.segments.remove(&base) else {
                break;
            };
            info!(path = %segment.log_path().display(), offset, "delete-records deletes segment");
            segment.remove_files(&self.dir)?;
        }
        self.log_start_offset = offset;
        self.after_log_start_moved()?;
        Ok(self.log_start_offset)
    }

    /// After the log start offset moved up: HW and recovery point not below
    /// it, producer snapshots below it gone, the move checkpointed.
    fn after_log_start_moved(&mut self) -> Result<(), StorageError> {
        self.high_watermark = self.high_watermark.max(self.log_start_offset);
        self.recovery_point = self.recovery_point.max(self.log_start_offset);
        self.cleaner_offset = self.cleaner_offset.max(self.log_start_offset);
        for offset in producer_state::list_snapshots(&self.dir)? {
            if offset < self.log_start_offset {
                fsutil::remove_if_exists(&producer_state::snapshot_path(&self.dir, offset))?;
            }
        }
        self.check_offsets()?;
        self.write_checkpoint()
    }

    /// Removes every batch at or after `offset`; the batch containing `offset`
    /// goes entirely, so the new log end may be below `offset`. Drops the
    /// aborted transactions whose markers went, rebuilds producer state
    /// (ongoing transactions included: one whose marker went is open again),
    /// lowers HW and recovery point. For replication
    /// (divergence): must not run while a [`FlushTarget`] taken earlier is
    /// still to be marked flushed.
    pub fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<(), StorageError> {
        if offset >= self.log_end_offset {
            return Ok(());
        }
        if offset <= self.log_start_offset {
            return self.truncate_fully_and_start_at(offset.max(0), now_ms);
        }
        let doomed: Vec<i64> = self
            .segments
            .range(offset..)
            .map(|(base, _)| *base)
            .collect();
        for base in doomed {
            if self.segments.len() == 1 {
                break;
            }
            if let Some(segment) = self.segments.remove(&base) {
                warn!(path = %segment.log_path().display(), offset, "truncation deletes segment");
                segment.remove_files(&self.dir)?;
            }
        }
        let interval = self.config.index_interval_bytes;
        let active = self.active_mut()?;
        active.hold_file()?;
        if let Some((position, _)) = active.locate(offset)? {
            active.truncate_to_position(position, interval)?;
        }
        let log_end_offset = active.next_offset();
        active.truncate_txn_index(log_end_offset)?;
        self.log_end_offset = log_end_offset;
        self.after_truncation(now_ms)
    }

    /// Deletes every segment and restarts the log, empty, at `offset` (a
    /// follower whose leader's log starts past this log's end).
    pub fn truncate_fully_and_start_at(
        &mut self,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        if offset < 0 {
            return Err(StorageError::InvalidRecord(format!(
                "cannot start a log at offset {offset}"
            )));
        }
        for (_, segment) in std::mem::take(&mut self.segments) {
            segment.remove_files(&self.dir)?;
        }
        self.segments
            .insert(offset, Segment::create(&self.dir, offset, now_ms)?);
        fsync_dir(&self.dir)?;
        if let Some(segment) = self.segments.get_mut(&offset) {
            segment.dir_entry_durable = true;
        }
        self.log_start_offset = offset;
        self.log_end_offset = offset;
        self.high_watermark = offset;
        self.recovery_point = offset;
        self.cleaner_offset = offset;
        for snapshot in producer_state::list_snapshots(&self.dir)? {
            fsutil::remove_if_exists(&producer_state::snapshot_path(&self.dir, snapshot))?;
        }
        self.producers.clear();
        self.generation = rand::random();
        self.check_offsets()?;
        self.write_checkpoint()
    }

    fn after_truncation(&mut self, now_ms: i64) -> Result<(), StorageError> {
        self.high_watermark = self.high_watermark.min(self.log_end_offset);
        self.recovery_point = self.recovery_point.min(self.log_end_offset);
        self.cleaner_offset = self.cleaner_offset.min(self.log_end_offset);
        let (mut producers, _, _) = rebuild_producer_state(
            &self.dir,
            &mut self.segments,
            &BTreeSet::new(),
            self.log_start_offset,
            self.log_end_offset,
            self.config.producer_id_expiration_ms,
        )?;
        producers.expire(now_ms);
        self.producers = producers;
        fsync_dir(&self.dir)?;
        self.generation = rand::random();
        self.check_offsets()?;
        self.write_checkpoint()
    }

    /// Clean shutdown: fsync everything, seal the active segment's indexes,
    /// snapshot producer state at the log end, write the checkpoint, and last
    /// the `clean_shutdown` marker. On error no marker is written and the next
    /// open recovers.
    pub fn close(mut self) -> Result<(), StorageError> {
        self.active_mut()?.trim_file()?;
        self.flush()?;
        self.active_mut()?.seal()?;
        self.producers
            .write_snapshot(&self.dir, self.log_end_offset)?;
        self.delete_old_snapshots()?;
        self.write_checkpoint()?;
        fsutil::write_atomically(&self.dir, CLEAN_SHUTDOWN_FILE, b"")?;
        Ok(())
    }

    pub fn producer_state(&self) -> &ProducerStateManager {
        &self.producers
    }

    /// Segments whose log file the log holds open: only the active one
    /// (`open_files`), whatever happened to the segment set.
    #[cfg(test)]
    pub(crate) fn held_segment_files(&self) -> Vec<i64> {
        self.segments
            .iter()
            .filter(|(_, s)| s.log_file().is_held())
            .map(|(base, _)| *base)
            .collect()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Bytes of batches in all segments (index and snapshot files not counted).
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(Segment::size).sum()
    }

    fn decompression_limit(&self) -> usize {
        compression::decompression_limit(self.config.max_message_bytes)
    }

    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// Takes a changed topic config (a dynamic config change). Every
    /// setting is read where it acts — the next append, roll, retention
    /// check or cleaning pass — so nothing else needs redoing; the log
    /// already written stays as it is (Kafka's behaviour: a new
    /// `segment.bytes` does not resize closed segments).
    pub fn set_config(&mut self, config: LogConfig) {
        self.config = config;
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.keys().copied().collect()
    }
}

/// Largest max timestamp among placements and the last offset of the first batch carrying it.
fn max_timestamp_of(placements: &[BatchPlacement]) -> (i64, i64) {
    let mut best = (NO_TIMESTAMP, -1);
    for p in placements {
        if p.max_timestamp > best.0 {
            best = (p.max_timestamp, p.last_offset);
        }
    }
    best
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;

#[path = "log_cleaning.rs"]
mod log_cleaning;

#[cfg(test)]
#[path = "disk_full_tests.rs"]
mod disk_full_tests;
