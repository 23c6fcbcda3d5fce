//! `samsa verify` as a background process of a test: started with the
//! arguments a user would give it, its history read while it runs (to know
//! its topics and when it started producing), its JSON report read when it
//! exits. Dropping a [`VerifyRun`] kills the process.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use samsa_verify::history::{Event, EventKind, TopicInfo};
use serde_json::Value;
use tempfile::TempDir;

use crate::cluster::last_lines;
use crate::node::samsa_bin;
use crate::wait::wait_until;

/// A running `samsa verify`.
pub struct VerifyRun {
    child: Option<Child>,
    dir: TempDir,
}

/// How a run ended.
pub struct VerifyOutcome {
    pub status: ExitStatus,
    /// The JSON report (`--json`); `Value::Null` if stdout held none.
    pub report: Value,
    pub stdout: String,
    pub stderr: String,
}

impl VerifyOutcome {
    /// The last `n` lines of stderr, for a failure message.
    pub fn stderr_tail(&self, n: usize) -> String {
        last_lines(&self.stderr, n)
    }

    /// The first `max` lines of stderr that contain one of `needles`, for a
    /// failure message (librdkafka's `eos` lines out of a long debug log).
    pub fn stderr_lines_with(&self, needles: &[&str], max: usize) -> String {
        self.stderr
            .lines()
            .filter(|line| needles.iter().any(|n| line.contains(n)))
            .take(max)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl VerifyRun {
    /// Starts `samsa verify <args> --history <dir>/history.jsonl --json`.
    /// librdkafka's debug lines go to its stderr when `args` ask for them
    /// (`-X debug=eos`).
    pub fn start(args: &[String]) -> VerifyRun {
        let dir = TempDir::new().expect("a temporary directory");
        let history = dir.path().join("history.jsonl");
        let stdout = File::create(dir.path().join("stdout")).expect("stdout file");
        let stderr = File::create(dir.path().join("stderr")).expect("stderr file");
        let child = Command::new(samsa_bin())
            .arg("verify")
            .args(args)
            .arg("--history")
            .arg(&history)
            .arg("--json")
            .env("RUST_LOG", "info,librdkafka=debug")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", samsa_bin().display()));
        VerifyRun {
            child: Some(child),
            dir,
        }
    }

    pub fn history_path(&self) -> PathBuf {
        self.dir.path().join("history.jsonl")
    }

    /// The events written so far (a line still being written is skipped).
    pub fn events(&self) -> Vec<Event> {
        read_events(&self.history_path())
    }

    /// Waits until the run recorded its first acknowledgement (its clients
    /// are set up and producing); returns the topics of its `run_started`.
    pub fn wait_producing(&self, timeout: Duration) -> Vec<TopicInfo> {
        wait_until("samsa verify to start producing", timeout, || {
            let events = self.events();
            let topics = events.iter().find_map(|e| match &e.kind {
                EventKind::RunStarted { topics, .. } => Some(topics.clone()),
                _ => None,
            })?;
            events
                .iter()
                .any(|e| matches!(e.kind, EventKind::Ack { .. }))
                .then_some(topics)
        })
    }

    /// Waits for the process to exit (at most `timeout`, then it is killed
    /// and the test fails) and reads its report.
    pub fn finish(mut self, timeout: Duration) -> VerifyOutcome {
        let mut child = self.child.take().expect("finish is called once");
        let started = Instant::now();
        let status = wait_until(
            "samsa verify to exit",
            timeout + Duration::from_secs(1),
            || match child.try_wait() {
                Ok(Some(status)) => Some(status),
                Ok(None) if started.elapsed() > timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "samsa verify still ran after {timeout:?}; its stderr ends:\n{}",
                        last_lines(&read_text(&self.dir.path().join("stderr")), 200)
                    );
                }
                Ok(None) => None,
                Err(e) => panic!("waiting for samsa verify: {e}"),
            },
        );
        let stdout = read_text(&self.dir.path().join("stdout"));
        let stderr = read_text(&self.dir.path().join("stderr"));
        VerifyOutcome {
            status,
            report: serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
            stdout,
            stderr,
        }
    }
}

impl Drop for VerifyRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for name in ["history.jsonl", "stdout", "stderr"] {
            crate::keep::keep_file(&self.dir.path().join(name), &format!("verify-{name}"));
        }
    }
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn read_events(path: &Path) -> Vec<Event> {
    read_text(path)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}
