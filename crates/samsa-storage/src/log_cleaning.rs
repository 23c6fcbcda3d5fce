//! The log's side of compaction: what a cleaning pass may take
//! ([`PartitionLog::cleaning_plan`]), swapping its result in
//! ([`PartitionLog::install_cleaned`]), and finishing or discarding a swap
//! a crash interrupted ([`finish_interrupted_cleaning`]). The pass itself
//! is `cleaner::pass`.
//!
//! What a pass may take: whole segments from the log start, never the
//! active one, and none holding an offset at or past the first uncleanable
//! offset = min(last stable offset, recovery point, the base of the first
//! segment younger than `min.compaction.lag.ms`). So the pass never sees
//! an undecided transaction, a record not yet committed or not yet on disk.
//!
//! The swap of one cleaned segment, crash-safe at every step:
//! 1. its files are written and fsynced under `cleaning/` (a crash: the
//!    directory is deleted on open, the old segments stay);
//! 2. its log file is renamed to `{base}.log.swap` beside the segments and
//!    the directory fsynced: the commit point;
//! 3. the segments it replaces are deleted, its indexes moved in, and
//!    `.swap` renamed to `{base}.log`. A crash in 3 leaves the `.swap`,
//!    and opening the log finishes the swap: it deletes every segment the
//!    swap's offsets cover and the indexes of `base` (rebuilt from the log).
//!
//! So a crash leaves either the old segments or the cleaned one, never a
//! mix.

use std::collections::HashMap;

use tracing::{info, warn};

use super::{Listing, PartitionLog, SWAP_EXTENSION};
use crate::cleaner::pass::{
    remove_scratch, CleanedLog, CleaningPlan, SegmentToClean, CLEANING_DIR,
};
use crate::error::{IoContext, StorageError};
use crate::fsutil::{self, fsync_dir, offset_file_name};
use crate::scan::{BatchScanner, HEADER_SCAN_CHUNK};
use crate::segment::{
    remove_segment_files, Offsets, Segment, INDEX_EXTENSION, LOG_EXTENSION, TIME_INDEX_EXTENSION,
};
use crate::txn_index::TXN_INDEX_EXTENSION;

const INDEX_EXTENSIONS: [&str; 3] = [INDEX_EXTENSION, TIME_INDEX_EXTENSION, TXN_INDEX_EXTENSION];

/// The cleanable prefix of a log and how dirty it is.
struct Cleanable<'a> {
    segments: Vec<&'a Segment>,
    dirty_bytes: u64,
    total_bytes: u64,
    /// The max compaction lag or a delete horizon requires a pass now.
    due: bool,
}

impl PartitionLog {
    fn cleanable(&self, now_ms: i64) -> Option<Cleanable<'_>> {
        if !self.config.cleanup_policy.compacts() {
            return None;
        }
        let active_base = self.active().ok()?.base_offset();
        let mut first_uncleanable = active_base
            .min(self.last_stable_offset())
            .min(self.recovery_point);
        let min_lag = self.config.min_compaction_lag_ms;
        if min_lag > 0 {
            let young_from = now_ms.saturating_sub(min_lag);
            if let Some(young) = self
                .segments
                .values()
                .find(|s| s.largest_timestamp() > young_from)
            {
                first_uncleanable = first_uncleanable.min(young.base_offset());
            }
        }
        let segments: Vec<&Segment> = self
            .segments
            .values()
            .take_while(|s| s.base_offset() != active_base && s.next_offset() <= first_uncleanable)
            .collect();
        let total_bytes: u64 = segments.iter().map(|s| s.size()).sum();
        let dirty: Vec<&&Segment> = segments
            .iter()
            .filter(|s| s.next_offset() > self.cleaner_offset)
            .collect();
        let dirty_bytes = dirty.iter().map(|s| s.size()).sum();
        let max_lag = self.config.max_compaction_lag_ms;
        let lagging = max_lag < i64::MAX
            && dirty
                .first()
                .and_then(|s| s.first_batch_timestamp())
                .is_some_and(|t| t <= now_ms.saturating_sub(max_lag));
        let horizon_due = self.cleaner_horizon_due_ms.is_some_and(|h| h <= now_ms);
        Some(Cleanable {
            segments,
            dirty_bytes,
            total_bytes,
            due: (lagging && dirty_bytes > 0) || (horizon_due && total_bytes > 0),
        })
    }

    /// The share of this log's cleanable bytes a pass would compact, if it
    /// is worth one now (`min.cleanable.dirty.ratio`, or overdue by
    /// `max.compaction.lag.ms` or a delete horizon: then at least the
    /// ratio, so overdue logs go first); `None` if not compacted or nothing
    /// to do. A cleaner takes the dirtiest log first.
    pub fn cleaning_priority(&self, now_ms: i64) -> Option<f64> {
        let c = self.cleanable(now_ms)?;
        if c.total_bytes == 0 {
            return None;
        }
        let ratio = c.dirty_bytes as f64 / c.total_bytes as f64;
        if c.due {
            Some(
                ratio
                    .max(self.config.min_cleanable_dirty_ratio)
                    .max(f64::MIN_POSITIVE),
            )
        } else if c.dirty_bytes > 0 && ratio >= self.config.min_cleanable_dirty_ratio {
            Some(ratio)
        } else {
            None
        }
    }

    /// Step 1 of a pass (see `cleaner::pass`): what [`cleaner::pass::clean`]
    /// reads, with the segment files held open. `None` when
    /// [`PartitionLog::cleaning_priority`] says there is nothing to do.
    ///
    /// [`cleaner::pass::clean`]: crate::cleaner::pass::clean
    pub fn cleaning_plan(&self, now_ms: i64) -> Option<CleaningPlan> {
        self.cleaning_priority(now_ms)?;
        let c = self.cleanable(now_ms)?;
        let live_producers: HashMap<i64, i64> = self
            .producers
            .iter()
            .filter(|p| p.last_offset >= 0)
            .map(|p| (p.producer_id, p.last_offset))
            .collect();
        let segments = c
            .segments
            .iter()
            .map(|s| {
                Ok(SegmentToClean {
                    base_offset: s.base_offset(),
                    next_offset: s.next_offset(),
                    size: s.size(),
                    file: s.log_file().get().at(s.log_path())?,
                    path: s.log_path().to_path_buf(),
                    aborted: s.aborted_txns().to_vec(),
                })
            })
            .collect::<Result<Vec<_>, StorageError>>();
        let segments = match segments {
            Ok(segments) => segments,
            Err(e) => {
                // No descriptor to spare (or the file is gone): this pass
                // waits for the cleaner's next round.
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot open segments to clean; trying again later");
                return None;
            }
        };
        Some(CleaningPlan {
            dir: self.dir.clone(),
            segments,
            first_dirty_offset: self.cleaner_offset,
            live_producers,
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            decompression_limit: self.decompression_limit(),
            delete_retention_ms: self.config.delete_retention_ms,
            now_ms,
            dirty_ratio: if c.total_bytes == 0 {
                0.0
            } else {
                c.dirty_bytes as f64 / c.total_bytes as f64
            },
        })
    }

    /// Step 3 of a pass: swaps the cleaned segments in (see the module
    /// docs). If the log changed under the pass (a segment it read was
    /// deleted, truncated or became the active one), nothing is swapped,
    /// the pass's files are deleted and the result is `false`.
    pub fn install_cleaned(
        &mut self,
        cleaned: CleanedLog,
        now_ms: i64,
    ) -> Result<bool, StorageError> {
        let scratch = self.dir.join(CLEANING_DIR);
        if cleaned.dir != self.dir {
            return Err(StorageError::Corrupt(
                self.dir.clone(),
                format!("a cleaning pass of {} offered here", cleaned.dir.display()),
            ));
        }
        let active_base = self.active()?.base_offset();
        let unchanged =
            cleaned
                .segments
                .iter()
                .flat_map(|c| c.replaces.iter())
                .all(|&(base, size, next)| {
                    base != active_base
                        && self
                            .segments
                            .get(&base)
                            .is_some_and(|s| s.size() == size && s.next_offset() == next)
                });
        if !unchanged {
            drop(cleaned.segments);
            remove_scratch(&scratch)?;
            return Ok(false);
        }
        let interval = self.config.index_interval_bytes;
        for cleaned_segment in cleaned.segments {
            let base = cleaned_segment.segment.base_offset();
            // Its files are synced; close them before they move.
            drop(cleaned_segment.segment);
            let swap = offset_file_name(&self.dir, base, SWAP_EXTENSION);
            let scratch_log = offset_file_name(&scratch, base, LOG_EXTENSION);
            std::fs::rename(&scratch_log, &swap).at(&swap)?;
            fsync_dir(&self.dir)?;
            for &(old, ..) in &cleaned_segment.replaces {
                if old != base {
                    if let Some(segment) = self.segments.remove(&old) {
                        segment.remove_files(&self.dir)?;
                    }
                }
            }
            for extension in INDEX_EXTENSIONS {
                let to = offset_file_name(&self.dir, base, extension);
                std::fs::rename(offset_file_name(&scratch, base, extension), &to).at(&to)?;
            }
            let log_path = offset_file_name(&self.dir, base, LOG_EXTENSION);
            std::fs::rename(&swap, &log_path).at(&log_path)?;
            fsync_dir(&self.dir)?;
            let mut segment = Segment::open(&self.dir, base, now_ms)?;
            if let Err(reason) = segment.load_trusted(Offsets::MayGap)? {
                warn!(path = %log_path.display(), reason, "cleaned segment's indexes untrusted; rebuilding");
                segment.recover(interval, Offsets::MayGap)?;
                segment.sync_all()?;
            }
            self.segments.insert(base, segment);
        }
        self.cleaner_offset = cleaned
            .cleaned_up_to
            .clamp(self.log_start_offset, self.log_end_offset)
            .max(self.cleaner_offset);
        self.cleaner_horizon_due_ms = cleaned.earliest_horizon_ms;
        remove_scratch(&scratch)?;
        self.check_offsets()?;
        self.write_checkpoint()?;
        Ok(true)
    }

    /// The cleaner checkpoint: everything below is compacted.
    pub fn cleaner_offset(&self) -> i64 {
        self.cleaner_offset
    }
}

/// On open, before segments load: deletes an unfinished pass's files and
/// finishes every swap past its commit point (see the module docs).
/// Returns the listing as the directory now is.
pub(super) fn finish_interrupted_cleaning(
    dir: &std::path::Path,
    mut listing: Listing,
) -> Result<Listing, StorageError> {
    remove_scratch(&dir.join(CLEANING_DIR))?;
    for &base in &listing.swap_bases {
        let swap = offset_file_name(dir, base, SWAP_EXTENSION);
        let end = end_offset_of(&swap)?;
        let replaced: Vec<i64> = listing
            .segment_bases
            .iter()
            .copied()
            .filter(|&b| b > base && b < end)
            .collect();
        for &old in &replaced {
            remove_segment_files(dir, old)?;
        }
        // Whether these are the old segment's or the cleaned one's depends
        // on where the crash came: rebuilt from the log either way.
        for extension in INDEX_EXTENSIONS {
            fsutil::remove_if_exists(&offset_file_name(dir, base, extension))?;
        }
        let log_path = offset_file_name(dir, base, LOG_EXTENSION);
        std::fs::rename(&swap, &log_path).at(&log_path)?;
        fsync_dir(dir)?;
        info!(path = %log_path.display(), replaced = replaced.len() + 1, end_offset = end,
            "finished the swap of a cleaned segment a crash interrupted");
        listing.segment_bases.retain(|b| !replaced.contains(b));
        if !listing.segment_bases.contains(&base) {
            listing.segment_bases.push(base);
            listing.segment_bases.sort_unstable();
        }
        listing.index_bases.retain(|&b| b != base);
    }
    listing.swap_bases.clear();
    Ok(listing)
}

/// The offset after the last batch of a cleaned segment's file. It was
/// fsynced whole before its commit point, so any damage is outside damage.
fn end_offset_of(path: &std::path::Path) -> Result<i64, StorageError> {
    let file = std::fs::File::open(path).at(path)?;
    let len = file.metadata().at(path)?.len();
    let mut scanner = BatchScanner::new(&file, 0, len, HEADER_SCAN_CHUNK);
    let mut end = None;
    while let Some(item) = scanner.next_header().at(path)? {
        let (_, header) = item.map_err(|f| {
            StorageError::Corrupt(
                path.to_path_buf(),
                format!("cleaned segment at position {}: {}", f.position, f.error),
            )
        })?;
        end = Some(header.last_offset() + 1);
    }
    end.ok_or_else(|| {
        StorageError::Corrupt(
            path.to_path_buf(),
            "a cleaned segment without a batch".into(),
        )
    })
}

#[cfg(test)]
#[path = "log_cleaning_tests.rs"]
mod tests;
