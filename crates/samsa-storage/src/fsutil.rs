//! Small file-system helpers whose ordering of syscalls is the point, and
//! the two calls every data write of the crate goes through
//! ([`write_all_at`], [`set_len`]), which is where tests make the disk fill up
//! (`disk_fault`).
//!
//! Invariant: a file written with [`write_atomically`] is, after a crash at any
//! moment, either its old content or its new content, never a mix, and once
//! the call returns the new content survives a crash. A failed atomic write
//! leaves no temporary file behind (on a full disk it would hold the space
//! the next attempt needs).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, StorageError};

/// Suffix of the temporary files of atomic writes; leftovers are deleted on open.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Makes directory entries (creations, renames, deletions) in `dir` durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).at(dir)
}

/// Replaces `dir/name` with `contents`: write `name.tmp`, fsync it, rename over
/// `name`, fsync the directory.
pub(crate) fn write_atomically(
    dir: &Path,
    name: &str,
    contents: &[u8],
) -> Result<(), StorageError> {
    let target = dir.join(name);
    replace_file_durably(&target, contents).at(&target)
}

/// Replaces the file at `path` with `contents` so that a crash at any moment
/// leaves the old or the new content: write `<path>.tmp`, fsync it, rename it
/// over `path`, fsync the directory. Shared with the broker's small
/// metadata files, which need the same guarantee.
pub fn replace_file_durably(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(TMP_SUFFIX);
    let tmp = dir.join(tmp_name);
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .and_then(|file| {
            write_all_at(&file, contents, 0)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        // Best effort: what matters is the error of the write itself.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir).and_then(|d| d.sync_all())
}

/// Opens an index file for a write or a sync, creating it if missing:
/// index files keep no descriptor between writes (see `open_files`).
pub(crate) fn open_for_writes(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// Writes all of `bytes` at `position`. Every write of log data, index
/// entries and state files goes through here.
pub(crate) fn write_all_at(file: &File, bytes: &[u8], position: u64) -> io::Result<()> {
    #[cfg(test)]
    if let Some(fits) = disk_fault::claim(bytes.len()) {
        file.write_all_at(&bytes[..fits], position)?;
        return Err(io::Error::from(io::ErrorKind::StorageFull));
    }
    file.write_all_at(bytes, position)
}

/// Sets a file's length; the cut of a failed append goes through here.
pub(crate) fn set_len(file: &File, len: u64) -> io::Result<()> {
    #[cfg(test)]
    if disk_fault::truncation_fails() {
        return Err(io::Error::other("injected truncation failure"));
    }
    file.set_len(len)
}

/// A file system that fills up, for this thread's writes: after
/// [`disk_fault::fill_after`]`(n)` the next `n` bytes are written and the
/// write that crosses that limit stores its part below it and fails with
/// `StorageFull` (ENOSPC), as a real file system does; [`disk_fault::free`]
/// makes room again. The bytes really are written, so the files show what a
/// full disk leaves.
#[cfg(test)]
pub(crate) mod disk_fault {
    use std::cell::Cell;

    thread_local! {
        static ROOM: Cell<Option<u64>> = const { Cell::new(None) };
        static TRUNCATION_FAILS: Cell<bool> = const { Cell::new(false) };
    }

    /// The disk holds `bytes` more bytes of writes, then is full.
    pub fn fill_after(bytes: u64) {
        ROOM.with(|r| r.set(Some(bytes)));
    }

    /// Room again, and truncations work.
    pub fn free() {
        ROOM.with(|r| r.set(None));
        TRUNCATION_FAILS.with(|t| t.set(false));
    }

    /// Cutting files fails too (`set_len`), as when the process dies right
    /// after a torn write, before it could cut it.
    pub fn fail_truncations() {
        TRUNCATION_FAILS.with(|t| t.set(true));
    }

    /// `Some(bytes that fit)` when a write of `len` bytes does not fit.
    pub(super) fn claim(len: usize) -> Option<usize> {
        ROOM.with(|r| {
            let room = r.get()?;
            let len = len as u64;
            if len <= room {
                r.set(Some(room - len));
                None
            } else {
                r.set(Some(0));
                Some(room as usize)
            }
        })
    }

    pub(super) fn truncation_fails() -> bool {
        TRUNCATION_FAILS.with(Cell::get)
    }
}

/// Deletes a file; a file that is already gone is not an error.
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), StorageError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).at(path),
    }
}

/// `{offset:020}.{extension}`: the name of every per-offset file in a partition directory.
pub(crate) fn offset_file_name(dir: &Path, offset: i64, extension: &str) -> PathBuf {
    dir.join(format!("{offset:020}.{extension}"))
}

/// Parses `{offset:020}.{extension}` back into the offset.
pub(crate) fn parse_offset_file_name(name: &str, extension: &str) -> Option<i64> {
    let stem = name.strip_suffix(extension)?.strip_suffix('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_tmp() {
        let dir = tempfile::tempdir().unwrap();
        write_atomically(dir.path(), "checkpoint", b"one").unwrap();
        write_atomically(dir.path(), "checkpoint", b"two").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("checkpoint")).unwrap(),
            b"two"
        );
        assert!(!dir.path().join("checkpoint.tmp").exists());
    }

    #[test]
    fn offset_file_names_round_trip() {
        let p = offset_file_name(Path::new("/d"), 42, "log");
        assert_eq!(p, Path::new("/d/00000000000000000042.log"));
        assert_eq!(
            parse_offset_file_name("00000000000000000042.log", "log"),
            Some(42)
        );
        assert_eq!(
            parse_offset_file_name("00000000000000000042.index", "log"),
            None
        );
        assert_eq!(parse_offset_file_name("42.log", "log"), None);
        assert_eq!(
            parse_offset_file_name("0000000000000000004x.log", "log"),
            None
        );
        assert_eq!(
            parse_offset_file_name("00000000000000000042.timeindex", "index"),
            None
        );
    }

    #[test]
    fn remove_if_exists_tolerates_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        remove_if_exists(&p).unwrap();
        std::fs::write(&p, b"x").unwrap();
        remove_if_exists(&p).unwrap();
        assert!(!p.exists());
    }
}
