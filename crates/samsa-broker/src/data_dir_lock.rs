//! One broker process per data directory.
//!
//! Two brokers writing the same partition logs would interleave their
//! appends in the same segment files and lose or garble acknowledged
//! records. A cluster node's controller store (sled) locks its own files,
//! but the partition logs and a single node's metadata had no such guard.
//! A broker takes an exclusive `flock` on `<data_dir>/.lock` (Kafka's
//! name) before it opens anything there, and holds it while it runs. The
//! kernel releases the lock with the descriptor, so a SIGKILLed broker
//! leaves nothing to clean up; the file itself stays, empty.

use std::fs::File;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::error::BrokerError;

/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = ".lock";

/// The data directory's lock, released when dropped.
#[derive(Debug)]
pub struct DataDirLock {
    _lock: Flock<File>,
}

/// Takes the lock of `data_dir` (created if missing), or says which
/// directory another process is using.
pub fn lock(data_dir: &Path) -> Result<DataDirLock, BrokerError> {
    std::fs::create_dir_all(data_dir).map_err(|source| BrokerError::Io {
        path: data_dir.to_path_buf(),
        source,
    })?;
    let path = data_dir.join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| BrokerError::Io {
            path: path.clone(),
            source,
        })?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(DataDirLock { _lock: lock }),
        Err((_, Errno::EWOULDBLOCK)) => Err(BrokerError::DataDirInUse { path }),
        Err((_, errno)) => Err(BrokerError::Io {
            path,
            source: errno.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = lock(&data).unwrap();
        match lock(&data) {
            Err(BrokerError::DataDirInUse { path }) => assert_eq!(path, data.join(LOCK_FILE)),
            other => panic!("expected DataDirInUse, got {other:?}"),
        }
        drop(first);
        lock(&data).unwrap();
    }
}
