//! Durable small-file writes for broker metadata: the new content is written to
//! a temporary file, fsynced, renamed over the old one, and the directory is
//! fsynced, so a crash leaves either the old or the new file, never a mix.

use std::io::Write;
use std::path::Path;

pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
