//! Python clients driven from Rust tests: the interpreter of the compat venv
//! (`tests/run-all.sh` creates it with `tests/compat/requirements.txt`), a
//! workload script from `tests/compat/` run as a child process, and the
//! JSON-lines history such a script writes, fed to the exactly-once checker.
//!
//! The history format is the one `tests/compat/pipelined_producer.py`
//! documents: `send`, `ack`, `fail`, `commit`, `abort`, `fatal`,
//! `ooos_retried`, `inflight` and `end` events, one JSON object per line,
//! every value unique in the run.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::checker::EosChecker;
use crate::cluster::tail;
use crate::node::has_setpriv;
use crate::wait::try_wait_until;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The compat venv's interpreter: `$SAMSA_COMPAT_PYTHON`, else
/// `<CARGO_TARGET_DIR or <workspace>/target>/compat-venv/bin/python`.
/// Panics with instructions when neither exists: the tests that need it
/// must not pass by skipping.
pub fn compat_python() -> PathBuf {
    if let Some(p) = std::env::var_os("SAMSA_COMPAT_PYTHON") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "SAMSA_COMPAT_PYTHON={} does not exist",
            p.display()
        );
        return p;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("compat-venv").join("bin").join("python");
    assert!(
        p.is_file(),
        "no Python with the compat clients at {}: `bash tests/run-all.sh` creates that venv \
         (python3 -m venv {0}/.. && pip install -r tests/compat/requirements.txt), or point \
         SAMSA_COMPAT_PYTHON at a python that has them",
        p.display()
    );
    p
}

/// Path of a script in `tests/compat/`.
pub fn compat_script(name: &str) -> PathBuf {
    repo_root().join("tests").join("compat").join(name)
}

/// A workload script running as a child process; its stdout and stderr go
/// to files in `dir`. Killed (SIGKILL) on drop if still running, and with
/// `setpriv --pdeathsig` when the test process dies first.
pub struct PyScript {
    child: Option<Child>,
    dir: PathBuf,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl PyScript {
    /// Starts `python <script> <args>`.
    pub fn spawn(script: &Path, args: &[String], dir: &Path) -> PyScript {
        let python = compat_python();
        let stdout = dir.join("script.out");
        let stderr = dir.join("script.err");
        let mut cmd = if has_setpriv() {
            let mut c = Command::new("setpriv");
            c.arg("--pdeathsig").arg("KILL").arg(&python);
            c
        } else {
            Command::new(&python)
        };
        cmd.arg(script)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).expect("create script stdout"))
            .stderr(File::create(&stderr).expect("create script stderr"));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {} {}: {e}", python.display(), script.display()));
        PyScript {
            child: Some(child),
            dir: dir.to_path_buf(),
            stdout,
            stderr,
        }
    }

    /// Whether the script has exited (or been waited for).
    pub fn has_exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Waits for the script to exit; kills it and fails after `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("script already waited for");
        let status = try_wait_until(timeout, || child.try_wait().ok().flatten());
        match status {
            Some(s) => {
                self.child = None;
                s
            }
            None => {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!(
                    "the workload script did not finish within {timeout:?}\n{}",
                    self.output(60)
                );
            }
        }
    }

    /// The last `lines` lines of the script's stdout and stderr.
    pub fn output(&self, lines: usize) -> String {
        format!(
            "----- script stdout -----\n{}\n----- script stderr -----\n{}\n----- end of script output -----",
            tail(&self.stdout, lines),
            tail(&self.stderr, lines)
        )
    }
}

impl Drop for PyScript {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            self.keep_files();
        }
    }
}

impl PyScript {
    /// With `SAMSA_TEST_KEEP_LOGS=<dir>` set (see `SamsaCluster::keep_logs`),
    /// copies the script's files (history, stdout, stderr) into
    /// `<dir>/<pid>-script-<n>/` before a failed test removes them.
    fn keep_files(&self) {
        let Some(keep) = std::env::var_os("SAMSA_TEST_KEEP_LOGS") else {
            return;
        };
        static KEPT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = KEPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dest = PathBuf::from(keep).join(format!("{}-script-{n}", std::process::id()));
        let copied = std::fs::create_dir_all(&dest).and_then(|()| {
            for entry in std::fs::read_dir(&self.dir)? {
                let path = entry?.path();
                if let Some(name) = path.file_name().filter(|_| path.is_file()) {
                    std::fs::copy(&path, dest.join(name))?;
                }
            }
            Ok(())
        });
        match copied {
            Ok(()) => eprintln!("workload files kept in {}", dest.display()),
            Err(e) => eprintln!(
                "could not keep the workload files in {}: {e}",
                dest.display()
            ),
        }
    }
}

/// What one producer's `inflight` event said: how much it pipelined.
#[derive(Debug, Clone, Default)]
pub struct Inflight {
    pub requests: u64,
    /// Batches sent while an earlier batch of the same partition was unanswered.
    pub pipelined_batches: u64,
    pub max_batches_per_partition: u64,
    pub max_requests_per_connection: u64,
}

/// A parsed history (see the module docs).
#[derive(Debug, Default)]
pub struct History {
    /// Every event, in file order.
    events: Vec<Value>,
    /// `fail` events with OUT_OF_ORDER_SEQUENCE_NUMBER: (value, error).
    pub out_of_order: Vec<(String, String)>,
    /// Values with an `ack` event.
    pub acked: Vec<String>,
    /// Every `fail` event: (value, error).
    pub failures: Vec<(String, String)>,
    /// `fatal` events: (producer, error).
    pub fatal: Vec<(String, String)>,
    /// Committed transactions: id -> values.
    pub committed: BTreeMap<String, Vec<String>>,
    /// Aborted transactions: id -> (reason, values).
    pub aborted: BTreeMap<String, (String, Vec<String>)>,
    /// Per producer.
    pub inflight: BTreeMap<String, Inflight>,
    /// `ooos_retried` events: OUT_OF_ORDER_SEQUENCE_NUMBER answers the
    /// client retried because an earlier batch of the partition was
    /// unresolved (what any broker answers then): (producer, partition).
    pub retried_out_of_order: Vec<(String, i64)>,
    /// The closing `end` event, if the script got that far.
    pub end: Option<Value>,
}

fn field<'a>(e: &'a Value, name: &str) -> Result<&'a Value> {
    e.get(name)
        .ok_or_else(|| anyhow!("history event without {name:?}: {e}"))
}

fn str_field(e: &Value, name: &str) -> Result<String> {
    field(e, name)?
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("history field {name:?} is not a string: {e}"))
}

fn int_field(e: &Value, name: &str) -> Result<i64> {
    field(e, name)?
        .as_i64()
        .ok_or_else(|| anyhow!("history field {name:?} is not an integer: {e}"))
}

fn values_field(e: &Value) -> Result<Vec<String>> {
    field(e, "values")?
        .as_array()
        .ok_or_else(|| anyhow!("history field \"values\" is not a list: {e}"))?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| anyhow!("a value is not a string: {e}"))
        })
        .collect()
}

impl History {
    /// Reads and parses `path`. A truncated last line (a script killed
    /// mid-write) is an error: the tests let their scripts finish.
    pub fn read(path: &Path) -> Result<History> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        let mut h = History::default();
        for (n, line) in text.lines().enumerate() {
            let e: Value = serde_json::from_str(line)
                .with_context(|| format!("{} line {}: {line:?}", path.display(), n + 1))?;
            h.note(&e)?;
            h.events.push(e);
        }
        Ok(h)
    }

    fn note(&mut self, e: &Value) -> Result<()> {
        match str_field(e, "ev")?.as_str() {
            "fail" => {
                let (v, err) = (str_field(e, "value")?, str_field(e, "error")?);
                if err.contains("OutOfOrderSequenceNumber") {
                    self.out_of_order.push((v.clone(), err.clone()));
                }
                self.failures.push((v, err));
            }
            "fatal" => self
                .fatal
                .push((str_field(e, "producer")?, str_field(e, "error")?)),
            "commit" => {
                self.committed
                    .insert(str_field(e, "txn")?, values_field(e)?);
            }
            "abort" => {
                self.aborted.insert(
                    str_field(e, "txn")?,
                    (str_field(e, "reason")?, values_field(e)?),
                );
            }
            "inflight" => {
                let get = |k| int_field(e, k).map(|n| u64::try_from(n).unwrap_or(0));
                self.inflight.insert(
                    str_field(e, "producer")?,
                    Inflight {
                        requests: get("requests")?,
                        pipelined_batches: get("pipelined_batches")?,
                        max_batches_per_partition: get("max_batches_per_partition")?,
                        max_requests_per_connection: get("max_requests_per_connection")?,
                    },
                );
            }
            "end" => self.end = Some(e.clone()),
            "ack" => self.acked.push(str_field(e, "value")?),
            "ooos_retried" => self
                .retried_out_of_order
                .push((str_field(e, "producer")?, int_field(e, "partition")?)),
            "send" => {}
            other => bail!("unknown history event {other:?}: {e}"),
        }
        Ok(())
    }

    /// Feeds every send, acknowledgement and failure to `checker`, and
    /// marks the values of every aborted transaction as aborted.
    pub fn feed(&self, checker: &mut EosChecker) -> Result<()> {
        for e in &self.events {
            match str_field(e, "ev")?.as_str() {
                "send" => checker.send(
                    &str_field(e, "producer")?,
                    str_field(e, "value")?.as_bytes(),
                ),
                "ack" => {
                    let p = i32::try_from(int_field(e, "partition")?)?;
                    checker.ack(
                        str_field(e, "value")?.as_bytes(),
                        p,
                        int_field(e, "offset")?,
                    );
                }
                "fail" => checker.fail(str_field(e, "value")?.as_bytes(), str_field(e, "error")?),
                _ => {}
            }
        }
        for (_, values) in self.aborted.values() {
            for v in values {
                checker.abort(v.as_bytes());
            }
        }
        Ok(())
    }

    /// Values of every committed transaction.
    pub fn committed_values(&self) -> impl Iterator<Item = &String> {
        self.committed.values().flatten()
    }

    /// The summed pipelining of every producer.
    pub fn total_inflight(&self) -> Inflight {
        self.inflight
            .values()
            .fold(Inflight::default(), |acc, i| Inflight {
                requests: acc.requests + i.requests,
                pipelined_batches: acc.pipelined_batches + i.pipelined_batches,
                max_batches_per_partition: acc
                    .max_batches_per_partition
                    .max(i.max_batches_per_partition),
                max_requests_per_connection: acc
                    .max_requests_per_connection
                    .max(i.max_requests_per_connection),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_feeds_the_checker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let lines = [
            r#"{"ev":"send","producer":"p0","txn":"t1","value":"a","partition":0,"t":1.0}"#,
            r#"{"ev":"send","producer":"p0","txn":"t1","value":"b","partition":1,"t":1.0}"#,
            r#"{"ev":"ack","value":"a","partition":0,"offset":0,"t":1.1}"#,
            r#"{"ev":"ack","value":"b","partition":1,"offset":0,"t":1.1}"#,
            r#"{"ev":"abort","producer":"p0","txn":"t1","reason":"random","values":["a","b"],"t":1.2}"#,
            r#"{"ev":"send","producer":"p0","txn":"t2","value":"c","partition":0,"t":1.3}"#,
            r#"{"ev":"ack","value":"c","partition":0,"offset":2,"t":1.4}"#,
            r#"{"ev":"commit","producer":"p0","txn":"t2","values":["c"],"t":1.5}"#,
            r#"{"ev":"ooos_retried","producer":"p0","partition":0,"sequence":7,"t":1.5}"#,
            r#"{"ev":"fail","value":"x","error":"OutOfOrderSequenceNumberError: [Error 45]","t":1.6}"#,
            r#"{"ev":"inflight","producer":"p0","requests":3,"pipelined_batches":2,"max_batches_per_partition":2,"max_requests_per_connection":3,"t":2.0}"#,
            r#"{"ev":"end","ok":false,"t":2.0}"#,
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let h = History::read(&path).unwrap();
        assert_eq!(h.committed.len(), 1);
        assert_eq!(h.aborted.len(), 1);
        assert_eq!(h.out_of_order.len(), 1);
        assert_eq!(h.retried_out_of_order, vec![("p0".to_string(), 0)]);
        assert_eq!(h.acked.len(), 3);
        assert_eq!(h.total_inflight().max_batches_per_partition, 2);
        assert!(h.end.is_some());

        // "x" failed but was never sent: the checker refuses such a history.
        let mut h2 = History::read(&path).unwrap();
        h2.events.retain(|e| e["ev"] != "fail");
        let mut checker = EosChecker::new();
        h2.feed(&mut checker).unwrap();
        checker.read(0, 0, b"a"); // an aborted record seen
        checker.read(0, 2, b"c");
        let r = checker.check();
        assert_eq!(r.aborted_read.len(), 1, "{r}");
        assert!(r.lost.is_empty(), "{r}");
    }

    #[test]
    fn an_unknown_event_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        std::fs::write(&path, r#"{"ev":"what","t":1.0}"#).unwrap();
        assert!(History::read(&path).is_err());
    }
}
