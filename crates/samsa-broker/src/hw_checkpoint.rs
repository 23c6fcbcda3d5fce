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
//! Format: JSON `{version, partitions: [{topic, partition, generation,
//! high_watermark}]}`, as the log's own `checkpoint` and the leader-epoch
//! checkpoint are.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Name of the file in the data directory.
pub const FILE_NAME: &str = "replication-offset-checkpoint";
const VERSION: u32 = 1;

/// One partition's line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub topic: String,
    pub partition: i32,
    pub generation: u64,
    pub high_watermark: i64,
}

#[derive(Serialize, Deserialize)]
struct CheckpointFile<P> {
    version: u32,
    partitions: P,
}

/// What the file held at start: (topic, partition) → (generation, HW).
pub type Saved = HashMap<(String, i32), (u64, i64)>;

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Replaces the file with `entries` (write, fsync, rename, fsync the directory).
pub fn write(data_dir: &Path, entries: &[Entry]) -> io::Result<()> {
    let json = serde_json::to_vec(&CheckpointFile {
        version: VERSION,
        partitions: entries,
    })
    .map_err(io::Error::other)?;
    samsa_storage::replace_file_durably(&path(data_dir), &json)
}

/// Reads the file; a missing file is empty. A malformed one is an error
/// saying what is wrong (the caller logs it and goes on without).
pub fn read(data_dir: &Path) -> Result<Saved, String> {
    let path = path(data_dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Saved::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(bytes: &[u8]) -> Result<Saved, String> {
    let file: CheckpointFile<Vec<Entry>> =
        serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!("unknown version {}", file.version));
    }
    let mut saved = Saved::new();
    for e in file.partitions {
        if e.topic.is_empty() || e.partition < 0 || e.high_watermark < 0 {
            return Err(format!("invalid entry {e:?}"));
        }
        saved.insert((e.topic, e.partition), (e.generation, e.high_watermark));
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
    fn a_malformed_file_is_an_error_saying_what_is_wrong() {
        let one = r#"{"version":1,"partitions":[{"topic":"t","partition":0,"generation":1,"high_watermark":5}]}"#;
        for (text, expected) in [
            ("", "EOF"),
            ("0\n1\nt 0 5\n", "expected"),
            (r#"{"version":2,"partitions":[]}"#, "unknown version 2"),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":0,"generation":1}]}"#,
                "high_watermark",
            ),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":"x","generation":1,"high_watermark":5}]}"#,
                "invalid type",
            ),
            (
                r#"{"version":1,"partitions":[{"topic":"t","partition":0,"generation":1,"high_watermark":-5}]}"#,
                "invalid entry",
            ),
            (
                r#"{"version":1,"partitions":[{"topic":"","partition":0,"generation":1,"high_watermark":5}]}"#,
                "invalid entry",
            ),
            (one, ""),
        ] {
            match parse(text.as_bytes()) {
                Ok(saved) => assert!(expected.is_empty() && saved.len() == 1, "{text:?}"),
                Err(e) => assert!(
                    !expected.is_empty() && e.contains(expected),
                    "{text:?}: {e}"
                ),
            }
        }
    }
}
