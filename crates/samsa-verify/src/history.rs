//! The history of a run: every send, acknowledgement, transaction step,
//! poll, offset commit, group assignment and final read, in the order the
//! workloads observed them, as JSON Lines (one [`Event`] per line).
//!
//! The file is the interface between running and checking: a run writes it
//! and then checks what it reads back, `samsa verify check` checks it again
//! offline, and a history edited by hand is checked the same way.
//!
//! Invariants: times are Unix epoch milliseconds (`time_ms`); a record's
//! value is unique within a run (so a value names one send, and one
//! transaction); every event of one client is written from the thread that
//! drives that client, so per-client order in the file is the order the
//! client saw.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The workloads of `samsa verify`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// Idempotent producers, acks=all.
    Idempotent,
    /// Transactional producers writing multi-partition transactions, some aborted.
    Txn,
    /// Consume-transform-produce with send_offsets_to_transaction.
    Pipeline,
    /// Producers and a consumer group committing after processing.
    Queue,
    /// Keyed records and tombstones on a compacted topic, from an
    /// idempotent and a transactional producer.
    Compact,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Idempotent,
        Workload::Txn,
        Workload::Pipeline,
        Workload::Queue,
        Workload::Compact,
    ];

    /// What a run does without `--workload` (compact is opt-in).
    pub const DEFAULT: [Workload; 4] = [
        Workload::Idempotent,
        Workload::Txn,
        Workload::Pipeline,
        Workload::Queue,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Idempotent => "idempotent",
            Workload::Txn => "txn",
            Workload::Pipeline => "pipeline",
            Workload::Queue => "queue",
            Workload::Compact => "compact",
        }
    }
}

/// What a topic is for, so the checker knows which reads to relate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicRole {
    /// Written by producers, read back at the end (and by the queue group).
    Data,
    /// The pipeline's input (written by an idempotent producer).
    PipelineInput,
    /// The pipeline's output (written transactionally by the workers).
    PipelineOutput,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub topic: String,
    pub workload: Workload,
    pub role: TopicRole,
    pub partitions: i32,
    /// Set for a compacted topic (`cleanup.policy=compact`): its records
    /// are judged by the compaction checks, not for loss one by one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
}

/// What the compaction checks of a compacted topic go by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The topic's `max.compaction.lag.ms` (as the cluster describes it, or
    /// as requested if it cannot); `None`: unbounded, no time-based check.
    pub max_lag_ms: Option<i64>,
    /// The topic's `delete.retention.ms`; `None`: no tombstone deadline.
    pub delete_retention_ms: Option<i64>,
    /// `--compact-grace`: what the deadlines allow for the cleaner's
    /// scheduling and passes.
    pub grace_ms: i64,
}

/// A consumer group of a workload and the topic it consumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub group: String,
    pub workload: Workload,
    pub input_topic: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

impl Isolation {
    pub fn as_config(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "read_committed",
            Isolation::ReadUncommitted => "read_uncommitted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

/// An offset of a partition: a committed consumer position (the next
/// offset to read), or where a final read ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionOffset {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// How a final read of one partition ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalPartition {
    pub partition: i32,
    /// The offset the read had to reach (the high watermark after the drain).
    pub end_offset: i64,
    /// Whether it reached it before the settle deadline.
    pub complete: bool,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub time_ms: i64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Consumer polls (`Poll`) are always read_committed: every
/// group consumer of the workloads reads that way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventKind {
    RunStarted {
        seed: u64,
        bootstrap: String,
        workloads: Vec<Workload>,
        topics: Vec<TopicInfo>,
        groups: Vec<GroupInfo>,
    },
    /// A record handed to a producer (`txn`: inside that transaction).
    /// `key` only for keyed records; a `tombstone` has a null value, and
    /// `value` (its id) travels in its [`ID_HEADER`] header instead.
    Send {
        workload: Workload,
        producer: String,
        value: String,
        topic: String,
        partition: i32,
        txn: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "is_false")]
        tombstone: bool,
    },
    /// The broker acknowledged the record at `offset`.
    Ack {
        workload: Workload,
        producer: String,
        value: String,
        topic: String,
        partition: i32,
        offset: i64,
        txn: Option<String>,
    },
    /// The delivery failed: the record may or may not have been written.
    AckFailed {
        workload: Workload,
        producer: String,
        value: String,
        topic: String,
        partition: i32,
        txn: Option<String>,
        error: String,
    },
    TxnBegin {
        workload: Workload,
        producer: String,
        txn: String,
    },
    /// Consumer positions added to the transaction (send_offsets_to_transaction succeeded).
    TxnOffsets {
        workload: Workload,
        txn: String,
        group: String,
        offsets: Vec<PartitionOffset>,
    },
    /// commit_transaction is about to be called.
    TxnCommitIssued {
        workload: Workload,
        txn: String,
    },
    TxnCommitted {
        workload: Workload,
        txn: String,
    },
    /// commit_transaction failed: the outcome is unknown unless a
    /// `TxnAborted` of the same transaction follows.
    TxnCommitFailed {
        workload: Workload,
        txn: String,
        error: String,
    },
    /// abort_transaction succeeded (`intentional`: chosen by the workload,
    /// not forced by an error).
    TxnAborted {
        workload: Workload,
        txn: String,
        intentional: bool,
    },
    TxnAbortFailed {
        workload: Workload,
        txn: String,
        error: String,
    },
    /// A read_committed consumer of a group returned this record.
    Poll {
        workload: Workload,
        consumer: String,
        topic: String,
        partition: i32,
        offset: i64,
        value: String,
    },
    /// A group offset commit is about to be sent (`commit` numbers it within the run).
    OffsetCommitIssued {
        workload: Workload,
        consumer: String,
        group: String,
        commit: u64,
        offsets: Vec<PartitionOffset>,
    },
    OffsetCommitted {
        workload: Workload,
        consumer: String,
        group: String,
        commit: u64,
    },
    OffsetCommitFailed {
        workload: Workload,
        consumer: String,
        group: String,
        commit: u64,
        error: String,
    },
    Assigned {
        workload: Workload,
        consumer: String,
        group: String,
        partitions: Vec<TopicPartition>,
    },
    Revoked {
        workload: Workload,
        consumer: String,
        group: String,
        partitions: Vec<TopicPartition>,
        lost: bool,
    },
    /// The consumer was moved to `offset` (a rewind after an abort).
    Seek {
        workload: Workload,
        consumer: String,
        topic: String,
        partition: i32,
        offset: i64,
    },
    /// The producers stopped; what follows is the drain.
    ProducingStopped {},
    /// The groups caught up with their input (or the settle time ran out).
    Drained {
        complete: bool,
        detail: String,
    },
    /// One record of the final read of a topic from its beginning (`key`
    /// if it has one; a `tombstone`'s `value` is its [`ID_HEADER`]).
    FinalRead {
        isolation: Isolation,
        topic: String,
        partition: i32,
        offset: i64,
        value: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "is_false")]
        tombstone: bool,
    },
    /// `started_ms`: when the reader began fetching (every record of the
    /// read was fetched after it; what the time-based compaction checks
    /// compare with).
    FinalReadDone {
        isolation: Isolation,
        topic: String,
        partitions: Vec<FinalPartition>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        started_ms: Option<i64>,
    },
    RunEnded {},
}

/// The header carrying a tombstone's id (its `value` in the history): a
/// tombstone has no value of its own.
pub const ID_HEADER: &str = "samsa-verify-id";

fn is_false(b: &bool) -> bool {
    !*b
}

/// Wall-clock time as Unix epoch milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("cannot create the history file {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the history file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a history event: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// The history file being written, shared by every workload thread.
/// A write error is kept and returned by [`Recorder::finish`]: a run whose
/// history is incomplete cannot be checked.
pub struct Recorder {
    path: PathBuf,
    inner: Mutex<RecorderState>,
}

struct RecorderState {
    out: BufWriter<File>,
    error: Option<std::io::Error>,
}

impl Recorder {
    pub fn create(path: &Path) -> Result<Recorder, HistoryError> {
        let file = File::create(path).map_err(|source| HistoryError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Recorder {
            path: path.to_path_buf(),
            inner: Mutex::new(RecorderState {
                out: BufWriter::new(file),
                error: None,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends an event stamped now.
    pub fn record(&self, kind: EventKind) {
        let event = Event {
            time_ms: now_ms(),
            kind,
        };
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if state.error.is_some() {
            return;
        }
        let written = serde_json::to_writer(&mut state.out, &event)
            .map_err(std::io::Error::from)
            .and_then(|()| state.out.write_all(b"\n"));
        if let Err(e) = written {
            state.error = Some(e);
        }
    }

    /// Flushes the file; the first write error, if any.
    pub fn finish(&self) -> Result<(), HistoryError> {
        let mut state = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let flushed = state.out.flush();
        let error = state.error.take().or(flushed.err());
        match error {
            Some(source) => Err(HistoryError::Write {
                path: self.path.clone(),
                source,
            }),
            None => Ok(()),
        }
    }
}

/// Reads a history file (blank lines are skipped).
pub fn read(path: &Path) -> Result<Vec<Event>, HistoryError> {
    let file = File::open(path).map_err(|source| HistoryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut events = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| HistoryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|source| HistoryError::Parse {
            path: path.to_path_buf(),
            line: n + 1,
            source,
        })?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_round_trip_through_a_file() {
        let dir = std::env::temp_dir().join(format!("samsa-verify-history-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        let recorder = Recorder::create(&path).unwrap();
        let send = EventKind::Send {
            workload: Workload::Txn,
            producer: "p0".into(),
            value: "v".into(),
            topic: "t".into(),
            partition: 1,
            txn: Some("x".into()),
            key: None,
            tombstone: false,
        };
        recorder.record(send.clone());
        recorder.record(EventKind::RunEnded {});
        recorder.finish().unwrap();
        let events = read(&path).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].kind, send);
        let line = std::fs::read_to_string(&path).unwrap();
        assert!(line.starts_with("{\"time_ms\":"), "{line}");
        assert!(line.contains("\"type\":\"send\""), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn histories_without_keys_still_parse() {
        // Lines as runs before the compact workload wrote them.
        let old = [
            r#"{"time_ms":1,"type":"run_started","seed":1,"bootstrap":"b","workloads":["txn"],"topics":[{"topic":"t","workload":"txn","role":"data","partitions":1}],"groups":[]}"#,
            r#"{"time_ms":2,"type":"send","workload":"txn","producer":"p","value":"v","topic":"t","partition":0,"txn":null}"#,
            r#"{"time_ms":3,"type":"final_read","isolation":"read_committed","topic":"t","partition":0,"offset":0,"value":"v"}"#,
            r#"{"time_ms":4,"type":"final_read_done","isolation":"read_committed","topic":"t","partitions":[]}"#,
        ];
        let events: Vec<Event> = old
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(matches!(
            &events[0].kind,
            EventKind::RunStarted { topics, .. } if topics[0].compaction.is_none()
        ));
        assert!(matches!(
            &events[1].kind,
            EventKind::Send {
                key: None,
                tombstone: false,
                ..
            }
        ));
        assert!(matches!(
            &events[2].kind,
            EventKind::FinalRead {
                key: None,
                tombstone: false,
                ..
            }
        ));
        assert!(matches!(
            &events[3].kind,
            EventKind::FinalReadDone {
                started_ms: None,
                ..
            }
        ));
        // Unkeyed events are written as before; keyed ones carry both fields.
        assert_eq!(serde_json::to_string(&events[1]).unwrap(), old[1]);
        let keyed = EventKind::FinalRead {
            isolation: Isolation::ReadCommitted,
            topic: "t".into(),
            partition: 0,
            offset: 1,
            value: "w".into(),
            key: Some("k1".into()),
            tombstone: true,
        };
        let line = serde_json::to_string(&keyed).unwrap();
        assert!(line.contains(r#""key":"k1","tombstone":true"#), "{line}");
        assert_eq!(serde_json::from_str::<EventKind>(&line).unwrap(), keyed);
    }

    #[test]
    fn a_bad_line_is_named() {
        let dir = std::env::temp_dir().join(format!("samsa-verify-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.jsonl");
        std::fs::write(&path, "{\"time_ms\":1,\"type\":\"run_ended\"}\nnot json\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(":2:"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
