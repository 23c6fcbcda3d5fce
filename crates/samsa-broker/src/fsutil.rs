//! Durable small-file writes for broker metadata (topics, producer-id blocks,
//! node identity, epoch checkpoints): a crash leaves either the old or the new
//! file, never a mix. The mechanism is the storage crate's
//! [`samsa_storage::replace_file_durably`]; this adds creating the directory.
//!
//! Also the size of the file system a directory is on (DescribeLogDirs).

use std::path::Path;

pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    samsa_storage::replace_file_durably(path, contents)
}

/// Total and usable bytes of the file system holding `dir`, as Java's
/// `FileStore.getTotalSpace` / `getUsableSpace` give them to Kafka: all
/// blocks, and the blocks available to an unprivileged user.
pub(crate) fn disk_space(dir: &Path) -> std::io::Result<(u64, u64)> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    let fragment = to_u64(stat.fragment_size());
    Ok((
        to_u64(stat.blocks()).saturating_mul(fragment),
        to_u64(stat.blocks_available()).saturating_mul(fragment),
    ))
}

/// The statvfs field types differ between platforms.
fn to_u64<T: TryInto<u64>>(value: T) -> u64 {
    value.try_into().unwrap_or(u64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::disk_space;

    #[test]
    fn disk_space_of_a_directory_and_of_a_missing_one() {
        let dir = tempfile::tempdir().unwrap();
        let (total, usable) = disk_space(dir.path()).unwrap();
        assert!(total > 0 && usable <= total, "{total} {usable}");
        let gone = dir.path().join("missing");
        let err = disk_space(&gone).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
