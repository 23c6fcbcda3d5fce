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
//!   the batch that starts the new epoch is appended, so after a crash the
//!   file may only be ahead of the log, never behind it.

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
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 || self.latest_epoch().is_some_and(|latest| latest >= epoch) {
            return false;
        }
        // A newer epoch cannot start before an older one's first batch.
        while self
            .entries
            .last()
            .is_some_and(|last| last.start_offset >= start_offset)
        {
            self.entries.pop();
        }
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.persist();
        true
    }

    /// Notes the epoch of a batch already carrying its offsets (replication, rebuild).
    fn observe(&mut self, header: &BatchHeader) {
        let epoch = header.partition_leader_epoch;
        if epoch >= 0 && self.latest_epoch().is_none_or(|latest| epoch > latest) {
            while self
                .entries
                .last()
                .is_some_and(|last| last.start_offset >= header.base_offset)
            {
                self.entries.pop();
            }
            self.entries.push(EpochEntry {
                epoch,
                start_offset: header.base_offset,
            });
        }
    }

    /// Notes every batch of replicated `records` before they are appended;
    /// persists if an epoch was added.
    pub fn observe_batches(&mut self, records: &[u8]) {
        let before = self.entries.len();
        for (header, _) in samsa_storage::batch::batches(records).flatten() {
            self.observe(&header);
        }
        if self.entries.len() != before {
            self.persist();
        }
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
        assert!(!cache.assign(0, 5));
        assert!(cache.assign(3, 5));
        assert!(cache.assign(4, 9));
        cache.truncate_from_end(9);
        assert_eq!(cache.entries(), &[e(0, 0), e(3, 5)]);
        cache.truncate_from_start(7);
        assert_eq!(cache.entries(), &[e(3, 7)]);
        // A newer epoch starting where an older one did replaces it.
        assert!(cache.assign(6, 7));
        assert_eq!(cache.entries(), &[e(6, 7)]);
    }
}
