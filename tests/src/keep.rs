//! `SAMSA_KEEP_DIR`: where a test copies what it would otherwise delete
//! when it ends (a `samsa verify` history and report, every container's
//! full log), so a failing long run can be studied after the fact.

use std::path::{Path, PathBuf};

/// The directory named by `SAMSA_KEEP_DIR` (created), if set.
pub fn keep_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("SAMSA_KEEP_DIR")?);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create SAMSA_KEEP_DIR {}: {e}", dir.display());
        return None;
    }
    Some(dir)
}

/// Copies `file` into the keep directory as `name`, if one is set.
pub fn keep_file(file: &Path, name: &str) {
    if let Some(dir) = keep_dir() {
        let to = dir.join(name);
        match std::fs::copy(file, &to) {
            Ok(_) => eprintln!("kept {}", to.display()),
            Err(e) => eprintln!("cannot keep {} as {}: {e}", file.display(), to.display()),
        }
    }
}

/// Writes `text` into the keep directory as `name`, if one is set.
pub fn keep_text(text: &str, name: &str) {
    if let Some(dir) = keep_dir() {
        let to = dir.join(name);
        match std::fs::write(&to, text) {
            Ok(()) => eprintln!("kept {}", to.display()),
            Err(e) => eprintln!("cannot keep {}: {e}", to.display()),
        }
    }
}
