//! The file descriptors of segment log files.
//!
//! A partition's active segment keeps its log file open for as long as it is
//! active ([`SegmentFile::hold`]): every append and most reads go there.
//! Every other segment's log file is opened when it is read or synced and
//! kept in one process-wide cache of at most [`set_inactive_capacity`]
//! descriptors, the least recently used closed first. Index files hold no
//! descriptor at all: their entries live in memory and the files are opened
//! for the rare block write and for the fsync of a seal (see `index`,
//! `txn_index`). So a broker's descriptors grow with the partitions it
//! hosts (one each) plus a bounded number, not with the segments on disk.
//!
//! Invariants:
//! - a cached descriptor belongs to exactly one live [`SegmentFile`] (by its
//!   slot id) and leaves the cache when the last handle of that slot is
//!   dropped, so a deleted or replaced segment never keeps a descriptor, and
//!   its disk space, beyond the readers still holding its `Arc<File>`;
//! - a descriptor handed out is an `Arc<File>`: eviction only drops the
//!   cache's reference, a read or fsync in progress keeps its own;
//! - the capacity bounds cached descriptors only; held ones (active
//!   segments) and those still referenced by readers come on top.

use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lru::LruCache;

/// Inactive segment files kept open when no capacity was set.
pub const DEFAULT_INACTIVE_CAPACITY: usize = 1024;

struct Cache {
    files: LruCache<u64, Arc<File>>,
    /// Opens of a file not in the cache, since the process started.
    opens: u64,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| {
        Mutex::new(Cache {
            files: LruCache::new(capacity(DEFAULT_INACTIVE_CAPACITY)),
            opens: 0,
        })
    })
}

fn capacity(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    cache().lock().unwrap_or_else(|p| p.into_inner())
}

/// Sets how many inactive segment files stay open (at least one); closes
/// the least recently used beyond it.
pub fn set_inactive_capacity(n: usize) {
    lock().files.resize(capacity(n));
}

/// What the cache holds now, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InactiveFiles {
    pub open: usize,
    pub capacity: usize,
    /// Opens of an inactive segment file that was not cached, since start.
    pub opens_total: u64,
}

pub fn inactive_files() -> InactiveFiles {
    let cache = lock();
    InactiveFiles {
        open: cache.files.len(),
        capacity: cache.files.cap().get(),
        opens_total: cache.opens,
    }
}

/// A segment's log file, by path; dropping the last handle closes its
/// cached descriptor.
struct Slot {
    id: u64,
    path: PathBuf,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock().files.pop(&self.id);
    }
}

fn open_read_write(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// A handle on one segment's log file: held open while the segment is
/// active, otherwise opened through the cache. Clones share the slot.
#[derive(Clone)]
pub(crate) struct SegmentFile {
    slot: Arc<Slot>,
    held: Option<Arc<File>>,
}

impl std::fmt::Debug for SegmentFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentFile")
            .field("path", &self.slot.path)
            .field("held", &self.held.is_some())
            .finish()
    }
}

impl SegmentFile {
    /// A handle on `file`, just opened at `path`, held open.
    pub fn held(path: PathBuf, file: File) -> SegmentFile {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        SegmentFile {
            slot: Arc::new(Slot {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                path,
            }),
            held: Some(Arc::new(file)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.slot.path
    }

    /// The open file: the held one, a cached one, or a fresh open (cached).
    pub fn get(&self) -> io::Result<Arc<File>> {
        if let Some(file) = &self.held {
            return Ok(Arc::clone(file));
        }
        if let Some(file) = lock().files.get(&self.slot.id) {
            return Ok(Arc::clone(file));
        }
        // Opened outside the lock: an open can wait on the disk.
        let file = Arc::new(open_read_write(&self.slot.path)?);
        let mut cache = lock();
        cache.opens += 1;
        cache.files.put(self.slot.id, Arc::clone(&file));
        Ok(file)
    }

    /// Keeps the file open until [`SegmentFile::release`]: the segment is
    /// the active one.
    pub fn hold(&mut self) -> io::Result<()> {
        if self.held.is_none() {
            let file = self.get()?;
            lock().files.pop(&self.slot.id);
            self.held = Some(file);
        }
        Ok(())
    }

    /// Stops holding the file (the segment is no longer active); it stays
    /// open in the cache until evicted.
    pub fn release(&mut self) {
        if let Some(file) = self.held.take() {
            lock().files.put(self.slot.id, file);
        }
    }

    #[cfg(test)]
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn file_with(dir: &Path, name: &str, contents: &[u8]) -> (PathBuf, File) {
        let path = dir.join(name);
        let mut f = File::create(&path).unwrap();
        f.write_all(contents).unwrap();
        (path.clone(), open_read_write(&path).unwrap())
    }

    fn cached(file: &SegmentFile) -> bool {
        lock().files.contains(&file.slot.id)
    }

    #[test]
    fn a_released_file_is_cached_reopened_on_demand_and_forgotten_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (path, f) = file_with(dir.path(), "a", b"hello");
        let mut file = SegmentFile::held(path, f);
        assert!(file.is_held() && !cached(&file));
        file.release();
        assert!(!file.is_held() && cached(&file));
        // Evicted (as a full cache would), then read again: reopened.
        lock().files.pop(&file.slot.id);
        let mut buf = [0u8; 5];
        file.get().unwrap().read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(cached(&file));
        // A clone shares the slot; the slot leaves the cache with the last handle.
        let clone = file.clone();
        let id = file.slot.id;
        drop(file);
        assert!(lock().files.contains(&id));
        drop(clone);
        assert!(!lock().files.contains(&id));
    }

    #[test]
    fn holding_takes_the_file_out_of_the_cache_and_a_reader_outlives_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let (path, f) = file_with(dir.path(), "b", b"world");
        let mut file = SegmentFile::held(path, f);
        file.release();
        let reader = file.get().unwrap();
        lock().files.pop(&file.slot.id);
        let mut buf = [0u8; 5];
        reader.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"world");
        file.hold().unwrap();
        assert!(file.is_held() && !cached(&file));
    }

    #[test]
    fn a_missing_file_is_an_error_not_a_cached_entry() {
        let dir = tempfile::tempdir().unwrap();
        let (path, f) = file_with(dir.path(), "c", b"x");
        let mut file = SegmentFile::held(path.clone(), f);
        file.release();
        lock().files.pop(&file.slot.id);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.get().unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(!cached(&file));
    }
}
