//! Durable small-file writes for broker metadata (topics, producer-id blocks,
//! node identity, epoch checkpoints): a crash leaves either the old or the new
//! file, never a mix. The mechanism is the storage crate's
//! [`samsa_storage::replace_file_durably`]; this adds creating the directory.

use std::path::Path;

pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    samsa_storage::replace_file_durably(path, contents)
}
