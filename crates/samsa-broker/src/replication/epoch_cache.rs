//! The leader-epoch cache of one partition replica (KIP-101/KIP-279): for
//! every leader epoch that wrote to this log, the offset of its first batch.
//!
//! It answers "where does epoch E end in this log?" — the start of the next
//! epoch, or the log end for the latest — which is how a leader tells a
//! follower where their logs diverge.
//!
//! Invariants:
//! - epochs and start offsets both increase strictly along the entries;
//! - every entry starts below the log end offset once the log is open
//!   (entries at or past it are dropped on open and on truncation);
//! - the checkpoint file (`leader-epoch-checkpoint`, JSON, replaced
//!   atomically) is written whenever an entry is added or removed, *before*
//!   the batch that starts the new epoch is appended (when that write fails,
//!   on a full disk, the entry is not added and the append is refused), so
//!   after a crash the file may only be ahead of the log, never behind it.

use std::path::{Path, PathBuf};

use samsa_storage::{BatchHeader, PartitionLog};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::fsutil::write_atomic;

/// File in each partition directory holding the cache.
pub const LEADER_EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";

/// Bytes read per step when the cache is rebuilt from the log.
const REBUILD_CHUNK: usize = 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

/// Where a leader epoch ends in a log: the epoch asked about (or the
/// largest known one before it) and the offset after its last record. Sent
/// to a diverging follower as `EpochEndOffset` (`proto/replication.proto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEnd {
    pub epoch: i32,
    pub end_offset: i64,
}

impl EpochEnd {
    /// No epoch at or before the one asked about is known.
    pub const UNKNOWN: EpochEnd = EpochEnd {
        epoch: -1,
        end_offset: -1,
    };
}

#[derive(Serialize, Deserialize)]
struct CheckpointFile {
    version: u32,
    entries: Vec<EpochEntry>,
}

#[derive(Debug)]
pub struct LeaderEpochCache {
    path: PathBuf,
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    /// Loads the checkpoint of `log`'s directory (or rebuilds the cache from
    /// the batch headers when there is none or it is unreadable) and drops
    /// entries the log does not reach.
    pub fn open(log: &PartitionLog) -> Self {
        let path = log.dir().join(LEADER_EPOCH_CHECKPOINT_FILE);
        let loaded = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<CheckpointFile>(&bytes).ok())
            .map(|f| f.entries)
            .filter(|entries| is_valid(entries));
        let mut cache = match loaded {
            Some(entries) => LeaderEpochCache { path, entries },
            None => {
                let mut cache = LeaderEpochCache {
                    path,
                    entries: Vec::new(),
                };
                cache.rebuild(log);
                cache
            }
        };
        cache.truncate_from_end(log.log_end_offset());
        cache.truncate_from_start(log.log_start_offset());
        cache
    }

    /// A cache that is never written to disk (tests).
    #[cfg(test)]
    pub fn in_memory(entries: Vec<EpochEntry>) -> Self {
        LeaderEpochCache {
            path: PathBuf::new(),
            entries,
        }
    }

    fn rebuild(&mut self, log: &PartitionLog) {
        let mut offset = log.log_start_offset();
        let end = log.log_end_offset();
        while offset < end {
            let read = match log.read(offset, REBUILD_CHUNK, end) {
                Ok(r) => r,
                Err(e) => {
                    warn!(dir = %log.dir().display(), offset, error = %e, "cannot rebuild the leader-epoch cache past this offset");
                    break;
                }
            };
            let mut next = offset;
            for item in samsa_storage::batch::batches(&read.records) {
                let Ok((header, _)) = item else { break };
                self.observe(&header);
                next = header.last_offset() + 1;
            }
            if next <= offset {
                break;
            }
            offset = next;
        }
        self.persist();
    }

    /// The latest epoch, if any batch was written.
    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// The epoch of the last batch of a log ending at `log_end_offset`
    /// (ignores an entry assigned for an append that has not happened).
    pub fn last_epoch_below(&self, log_end_offset: i64) -> Option<i32> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.start_offset < log_end_offset)
            .map(|e| e.epoch)
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// Records that `epoch` starts at `start_offset` if it is newer than
    /// every known epoch; persists the change. Returns whether it changed.
    /// When the checkpoint cannot be written (a full disk) nothing changes,
    /// in memory or on disk, and the caller must not append the batch that
    /// starts the epoch: the file is never behind the log.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> std::io::Result<bool> {
        if epoch < 0 || self.latest_epoch().is_some_and(|latest| latest >= epoch) {
            return Ok(false);
        }
        let mut entries = self.entries.clone();
        // A newer epoch cannot start before an older one's first batch.
        while entries
            .last()
            .is_some_and(|last| last.start_offset >= start_offset)
        {
            entries.pop();
        }
        entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.replace_durably(entries)?;
        Ok(true)
    }

    /// Notes the epoch of a batch already carrying its offsets (replication, rebuild).
    fn observe(&mut self, header: &BatchHeader) {
        observe_into(&mut self.entries, header);
    }

    /// Notes every batch of replicated `records` before they are appended;
    /// persists if an epoch was added. As for [`Self::assign`], a failed
    /// write changes nothing and the records must not be appended.
    pub fn observe_batches(&mut self, records: &[u8]) -> std::io::Result<()> {
        let mut entries = self.entries.clone();
        for (header, _) in samsa_storage::batch::batches(records).flatten() {
            observe_into(&mut entries, &header);
        }
        if entries != self.entries {
            self.replace_durably(entries)?;
        }
        Ok(())
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn replace_durably(&mut self, entries: Vec<EpochEntry>) -> std::io::Result<()> {
        if !self.path.as_os_str().is_empty() {
            write_checkpoint(&self.path, &entries)?;
        }
        self.entries = entries;
        Ok(())
    }

    /// Where the epoch of a follower's last batch (`requested`) ends here:
    /// the largest known epoch not newer than it, and its end (the next
    /// epoch's start, or `log_end_offset` for the latest).
    /// [`EpochEnd::UNKNOWN`] when no such epoch is known.
    pub fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> EpochEnd {
        let Some(pos) = self.entries.iter().rposition(|e| e.epoch <= requested) else {
            return EpochEnd::UNKNOWN;
        };
        EpochEnd {
            epoch: self.entries[pos].epoch,
            end_offset: self
                .entries
                .get(pos + 1)
                .map_or(log_end_offset, |next| next.start_offset),
        }
    }

    /// Drops entries starting at or after `end_offset` (after truncation).
    pub fn truncate_from_end(&mut self, end_offset: i64) {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        if self.entries.len() != before {
            self.persist();
        }
    }

    /// Moves the first entry up to the log start (retention, full truncation).
    pub fn truncate_from_start(&mut self, start_offset: i64) {
        let mut changed = false;
        while self.entries.len() > 1 && self.entries[1].start_offset <= start_offset {
            self.entries.remove(0);
            changed = true;
        }
        if let Some(first) = self.entries.first_mut() {
            if first.start_offset < start_offset {
                first.start_offset = start_offset;
                changed = true;
            }
        }
        if changed {
            self.persist();
        }
    }

    /// Empties the cache (the log restarted empty).
    pub fn clear(&mut self) {
        if !self.entries.is_empty() {
            self.entries.clear();
            self.persist();
        }
    }

    fn persist(&self) {
        if self.path.as_os_str().is_empty() {
            return;
        }
        if let Err(e) = write_checkpoint(&self.path, &self.entries) {
            // The cache in memory stays right; a stale file is repaired on
            // open (entries past the log end are dropped) or rewritten by
            // the next change.
            warn!(path = %self.path.display(), error = %e, "cannot write the leader-epoch checkpoint");
        }
    }
}

fn is_valid(entries: &[EpochEntry]) -> bool {
    entries
        .windows(2)
        .all(|w| w[0].epoch < w[1].epoch && w[0].start_offset < w[1].start_offset)
}

/// Adds `header`'s epoch to `entries` if it is newer than every known one.
fn observe_into(entries: &mut Vec<EpochEntry>, header: &BatchHeader) {
    let epoch = header.partition_leader_epoch;
    let latest = entries.last().map(|e| e.epoch);
    if epoch >= 0 && latest.is_none_or(|latest| epoch > latest) {
        while entries
            .last()
            .is_some_and(|last| last.start_offset >= header.base_offset)
        {
            entries.pop();
        }
        entries.push(EpochEntry {
            epoch,
            start_offset: header.base_offset,
        });
    }
}

fn write_checkpoint(path: &Path, entries: &[EpochEntry]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(&CheckpointFile {
        version: 0,
        entries: entries.to_vec(),
    })
    .map_err(std::io::Error::other)?;
    write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn e(epoch: i32, start_offset: i64) -> EpochEntry {
        EpochEntry {
            epoch,
            start_offset,
        }
    }

    #[test]
    fn end_offsets_follow_the_next_epoch() {
        let cache = LeaderEpochCache::in_memory(vec![e(0, 0), e(2, 10), e(5, 20)]);
        let end = |epoch, end_offset| EpochEnd { epoch, end_offset };
        assert_eq!(cache.end_offset_for(0, 30), end(0, 10));
        assert_eq!(cache.end_offset_for(1, 30), end(0, 10));
        assert_eq!(cache.end_offset_for(2, 30), end(2, 20));
        assert_eq!(cache.end_offset_for(7, 30), end(5, 30));
        let empty = LeaderEpochCache::in_memory(vec![]);
        assert_eq!(empty.end_offset_for(3, 0), EpochEnd::UNKNOWN);
    }

    #[test]
    fn assign_and_truncate() {
        let mut cache = LeaderEpochCache::in_memory(vec![e(0, 0)]);
        assert!(!cache.assign(0, 5).unwrap());
        assert!(cache.assign(3, 5).unwrap());
        assert!(cache.assign(4, 9).unwrap());
        cache.truncate_from_end(9);
        assert_eq!(cache.entries(), &[e(0, 0), e(3, 5)]);
        cache.truncate_from_start(7);
        assert_eq!(cache.entries(), &[e(3, 7)]);
        // A newer epoch starting where an older one did replaces it.
        assert!(cache.assign(6, 7).unwrap());
        assert_eq!(cache.entries(), &[e(6, 7)]);
    }

    /// A checkpoint that cannot be written (a full disk) must not leave the
    /// cache ahead of its file: the append that starts the epoch is then
    /// refused, and after a crash the file would otherwise be behind the
    /// log and answer divergence checks with a too-late end offset.
    #[test]
    fn a_checkpoint_that_cannot_be_written_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The checkpoint's directory cannot be created: a file is in the way.
        let blocked = dir.path().join("blocked");
        std::fs::write(&blocked, b"").unwrap();
        let mut cache = LeaderEpochCache {
            path: blocked.join(LEADER_EPOCH_CHECKPOINT_FILE),
            entries: vec![e(1, 0)],
        };
        assert!(cache.assign(3, 10).is_err());
        assert_eq!(cache.entries(), &[e(1, 0)]);
        let mut batch = samsa_storage::testing::simple_batch(1, 0);
        samsa_storage::batch::set_base_offset(&mut batch, 10);
        samsa_storage::batch::set_partition_leader_epoch(&mut batch, 3);
        assert!(cache.observe_batches(&batch).is_err());
        assert_eq!(cache.entries(), &[e(1, 0)]);
        // Writable again: the change goes in.
        std::fs::remove_file(&blocked).unwrap();
        assert!(cache.assign(3, 10).unwrap());
        assert_eq!(cache.entries(), &[e(1, 0), e(3, 10)]);
        assert!(cache.path().exists());
    }
}
