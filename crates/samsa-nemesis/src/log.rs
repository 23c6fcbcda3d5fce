//! The fault log: JSON Lines, one object per healed fault
//! (`{"fault","targets","detail","start_ms","end_ms"}`, times in Unix epoch
//! milliseconds), after an optional header `{"seed","schedule"}` that
//! readers skip (it has no `fault`). `samsa verify --faults FILE` reads it.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::NemesisError;

/// One healed fault, as a line of the fault log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    pub fault: String,
    pub targets: Vec<u32>,
    pub detail: String,
    pub start_ms: i64,
    pub end_ms: i64,
}

#[derive(Serialize)]
struct Header<'a> {
    seed: u64,
    schedule: &'a str,
}

/// Now, in Unix epoch milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A fault log file, flushed after every line (a run that is killed keeps
/// what it logged).
pub struct FaultLog {
    out: BufWriter<File>,
}

impl FaultLog {
    pub fn create(path: &Path) -> Result<FaultLog, NemesisError> {
        let file = File::create(path).map_err(|source| NemesisError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(FaultLog {
            out: BufWriter::new(file),
        })
    }

    pub fn header(&mut self, seed: u64, schedule: &str) -> Result<(), NemesisError> {
        self.line(&Header { seed, schedule })
    }

    pub fn write(&mut self, record: &FaultRecord) -> Result<(), NemesisError> {
        self.line(record)
    }

    fn line<T: Serialize>(&mut self, value: &T) -> Result<(), NemesisError> {
        let json = serde_json::to_string(value)
            .map_err(std::io::Error::other)
            .map_err(NemesisError::Log)?;
        writeln!(self.out, "{json}").map_err(NemesisError::Log)?;
        self.out.flush().map_err(NemesisError::Log)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lines_are_the_shared_format() {
        let dir = std::env::temp_dir().join(format!("samsa-nemesis-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("faults.jsonl");
        let mut log = FaultLog::create(&path).unwrap();
        log.header(7, "seed 7: 1 fault").unwrap();
        let r = FaultRecord {
            fault: "partition-leader".into(),
            targets: vec![2],
            detail: "node 2 cut off".into(),
            start_ms: 1_000,
            end_ms: 2_500,
        };
        log.write(&r).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["seed"], 7);
        assert!(lines[0].get("fault").is_none());
        assert_eq!(
            lines[1],
            serde_json::json!({"fault":"partition-leader","targets":[2],"detail":"node 2 cut off","start_ms":1000,"end_ms":2500})
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
