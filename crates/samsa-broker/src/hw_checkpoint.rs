//! The broker's high-watermark checkpoint: one file in the data directory,
//! `replication-offset-checkpoint` (Kafka's name), holding every hosted
//! partition's high watermark, replaced atomically every
//! `replica_high_watermark_checkpoint_interval_ms` when some HW moved.
//!
//! Why one file: writing each partition's own `checkpoint` instead costs a
//! file creation, two fsyncs and a rename per partition per interval, which
//! at 10,000 partitions is more fsyncs than the acknowledgements themselves
//! get (`docs/BENCHMARKS.md`, "Partitions on one node"). One file costs one
//! write and two fsyncs per interval, whatever the partition count.
//!
//! Invariant: a line applies to a partition only under the generation it
//! was recorded with (`samsa_storage::PartitionLog::generation`). A log's
//! generation changes whenever its end is cut back, and its HW only moves
//! forward within one, so a line is either a lower bound of the log's HW
//! (taken at open when above the log's own checkpoint) or ignored: a stale
//! file, a partition deleted and created again, a truncation after the
//! last write all fall back to the log's own `checkpoint`, which the log
//! writes at open, close, truncation and roll. An unreadable file is logged
//! and ignored for the same reason; it costs HW precision, never safety.
//!
//! Format (text, one partition a line; topic names hold no whitespace):
//!
//! ```text
//! samsa high watermarks 1
//! <topic> <partition> <generation> <high watermark>
//! ```

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

/// Name of the file in the data directory.
pub const FILE_NAME: &str = "replication-offset-checkpoint";
const HEADER: &str = "samsa high watermarks 1";

/// One partition's line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub topic: String,
    pub partition: i32,
    pub generation: u64,
    pub high_watermark: i64,
}

/// What the file held at start: (topic, partition) → (generation, HW).
pub type Saved = HashMap<(String, i32), (u64, i64)>;

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Replaces the file with `entries` (write, fsync, rename, fsync the directory).
pub fn write(data_dir: &Path, entries: &[Entry]) -> io::Result<()> {
    let mut text = String::with_capacity(HEADER.len() + 1 + entries.len() * 48);
    text.push_str(HEADER);
    text.push('\n');
    for e in entries {
        use std::fmt::Write as _;
        let _ = writeln!(
            text,
            "{} {} {} {}",
            e.topic, e.partition, e.generation, e.high_watermark
        );
    }
    samsa_storage::replace_file_durably(&path(data_dir), text.as_bytes())
}

/// Reads the file; a missing file is empty. A malformed one is an error
/// naming the first bad line (the caller logs it and goes on without).
pub fn read(data_dir: &Path) -> Result<Saved, String> {
    let path = path(data_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Saved::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str) -> Result<Saved, String> {
    let mut lines = text.lines();
    match lines.next() {
        Some(HEADER) => {}
        other => return Err(format!("unknown header {other:?}")),
    }
    let mut saved = Saved::new();
    for (number, line) in lines.enumerate() {
        let bad = || {
            format!(
                "line {}: {line:?} is not `topic partition generation hw`",
                number + 2
            )
        };
        let mut fields = line.split(' ');
        let (Some(topic), Some(partition), Some(generation), Some(hw), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(bad());
        };
        let (Ok(partition), Ok(generation), Ok(hw)) = (
            partition.parse::<i32>(),
            generation.parse::<u64>(),
            hw.parse::<i64>(),
        ) else {
            return Err(bad());
        };
        if topic.is_empty() || partition < 0 || hw < 0 {
            return Err(bad());
        }
        saved.insert((topic.to_string(), partition), (generation, hw));
    }
    Ok(saved)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn entry(topic: &str, partition: i32, generation: u64, hw: i64) -> Entry {
        Entry {
            topic: topic.into(),
            partition,
            generation,
            high_watermark: hw,
        }
    }

    #[test]
    fn what_is_written_reads_back_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), Saved::new());
        write(
            dir.path(),
            &[entry("orders", 0, 7, 120), entry("orders", 1, u64::MAX, 0)],
        )
        .unwrap();
        let saved = read(dir.path()).unwrap();
        assert_eq!(saved.len(), 2);
        assert_eq!(saved[&("orders".to_string(), 0)], (7, 120));
        assert_eq!(saved[&("orders".to_string(), 1)], (u64::MAX, 0));
        // Replaced whole, not appended to.
        write(dir.path(), &[entry("t", 3, 1, 5)]).unwrap();
        let saved = read(dir.path()).unwrap();
        assert_eq!(saved.len(), 1);
        assert_eq!(saved[&("t".to_string(), 3)], (1, 5));
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_the_line() {
        for (text, expected) in [
            ("", "unknown header"),
            ("0\n1\nt 0 5\n", "unknown header"),
            ("samsa high watermarks 1\nt 0 5\n", "line 2"),
            ("samsa high watermarks 1\nt 0 1 5\nt x 1 5\n", "line 3"),
            ("samsa high watermarks 1\nt 0 1 -5\n", "line 2"),
            ("samsa high watermarks 1\nt 0 1 5 6\n", "line 2"),
            ("samsa high watermarks 1\nt 0 1 5", ""),
        ] {
            match parse(text) {
                Ok(saved) => assert!(expected.is_empty() && saved.len() == 1, "{text:?}"),
                Err(e) => assert!(
                    !expected.is_empty() && e.contains(expected),
                    "{text:?}: {e}"
                ),
            }
        }
    }
}
