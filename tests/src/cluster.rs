//! `SamsaCluster`: N real `samsa server` processes forming a cluster of
//! combined (controller + broker) nodes on free ports, each with its own data
//! directory under one temporary directory.
//!
//! Every node is spawned with `controller_quorum_voters` naming all nodes and
//! `controller_listen` on its own free port. A node counts as ready when it
//! answers ApiVersions and its Metadata lists itself among the brokers (the
//! Kafka port only accepts once the broker is registered and unfenced).
//! Dropping the cluster SIGKILLs every process; if the thread is panicking,
//! the tail of every node's log is printed first.
//!
//! The controller quorum is inspected over gRPC with
//! `samsa_controller::client::ControllerClient` (DescribeQuorum), through a
//! small current-thread runtime owned by the cluster.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use samsa_controller::client::ControllerClient;
use samsa_proto::controller::DescribeQuorumResponse;
use tempfile::TempDir;

use crate::client::KafkaClient;
use crate::node::{free_port, has_setpriv, samsa_bin};
use crate::wait::try_wait_until;

/// How long a node may take to become ready after it was spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings every cluster test starts from: short sessions and timeouts so
/// failures are detected in seconds, not the production 9 s / 30 s.
pub const FAST_SETTINGS: &[&str] = &[
    "broker_session_timeout_ms=3000",
    "broker_heartbeat_interval_ms=500",
    "controller_request_timeout_ms=5000",
    "controller_startup_timeout_ms=30000",
    // See `node::TEST_NODE_SETTINGS`.
    "group_initial_rebalance_delay_ms=0",
];

/// One node of a [`SamsaCluster`].
pub struct ClusterNode {
    pub node_id: i32,
    pub kafka_port: u16,
    pub controller_port: u16,
    /// Port of the node's HTTP endpoint (`/metrics`, `/readyz`).
    pub http_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl ClusterNode {
    /// Node `id` under `cluster_dir`: its directory (with an empty data
    /// directory) and free ports; not started.
    fn prepare(cluster_dir: &Path, id: i32) -> ClusterNode {
        let dir = cluster_dir.join(format!("node-{id}"));
        std::fs::create_dir_all(dir.join("data")).expect("create node dir");
        ClusterNode {
            node_id: id,
            kafka_port: free_port(),
            controller_port: free_port(),
            http_port: free_port(),
            dir,
            child: None,
            starts: 0,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.kafka_port))
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.kafka_port)
    }

    /// The node's HTTP endpoint (`/metrics`, `/readyz`).
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http_port))
    }

    /// `http://127.0.0.1:PORT`, the base of the node's HTTP endpoint.
    pub fn http_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    pub fn controller_addr(&self) -> String {
        format!("127.0.0.1:{}", self.controller_port)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("samsa.log")
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }
}

/// A running (or partly stopped) cluster of real samsa processes.
pub struct SamsaCluster {
    dir: TempDir,
    bin: PathBuf,
    voters: String,
    settings: Vec<String>,
    /// Settings of one node only, applied after `settings`.
    node_settings: BTreeMap<i32, Vec<String>>,
    nodes: BTreeMap<i32, ClusterNode>,
    rt: tokio::runtime::Runtime,
}

impl SamsaCluster {
    /// Starts `n` nodes (ids 1..=n) with [`FAST_SETTINGS`] plus `settings`
    /// (`"key=value"`, applied after them) and waits until all are ready.
    pub fn start(n: i32, settings: &[&str]) -> SamsaCluster {
        let mut cluster = Self::new(n, settings);
        for id in 1..=n {
            cluster.spawn(id);
        }
        for id in 1..=n {
            cluster.wait_ready(id);
        }
        cluster
    }

    /// Prepares `n` nodes without starting any.
    pub fn new(n: i32, settings: &[&str]) -> SamsaCluster {
        let bin = samsa_bin();
        assert!(
            bin.is_file(),
            "samsa binary not found at {} — build it with `cargo build -p samsa` \
             or point SAMSA_BIN at it",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("samsa-cluster-")
            .tempdir()
            .expect("create temp dir");
        let nodes: BTreeMap<i32, ClusterNode> = (1..=n)
            .map(|id| (id, ClusterNode::prepare(dir.path(), id)))
            .collect();
        let voters = nodes
            .values()
            .map(|n| format!("{}@{}", n.node_id, n.controller_addr()))
            .collect::<Vec<_>>()
            .join(",");
        let settings = FAST_SETTINGS
            .iter()
            .chain(settings)
            .map(|s| s.to_string())
            .collect();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        SamsaCluster {
            dir,
            bin,
            voters,
            settings,
            node_settings: BTreeMap::new(),
            nodes,
            rt,
        }
    }

    /// Prepares a broker-only node (`process_roles = "broker"`, not in the
    /// voter list) with the next free id, without starting it; returns its
    /// id.
    pub fn add_broker_only(&mut self) -> i32 {
        let id = self.nodes.keys().max().map_or(1, |max| max + 1);
        self.nodes
            .insert(id, ClusterNode::prepare(self.dir.path(), id));
        self.set_for_node(id, "process_roles=broker");
        id
    }

    pub fn voters(&self) -> &str {
        &self.voters
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn ids(&self) -> Vec<i32> {
        self.nodes.keys().copied().collect()
    }

    pub fn node(&self, id: i32) -> &ClusterNode {
        self.nodes
            .get(&id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    fn node_mut(&mut self, id: i32) -> &mut ClusterNode {
        self.nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id}"))
    }

    /// Ids of the nodes whose process is running.
    pub fn running(&mut self) -> Vec<i32> {
        self.nodes
            .values_mut()
            .filter_map(|n| n.is_running().then_some(n.node_id))
            .collect()
    }

    /// Every node's Kafka address, comma-separated.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .values()
            .map(ClusterNode::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A raw protocol client connected to node `id` (ApiVersions done).
    pub fn client(&self, id: i32) -> KafkaClient {
        let addr = self.node(id).addr();
        KafkaClient::connect(addr)
            .unwrap_or_else(|e| panic!("connect to node {id} at {addr}: {e:#}"))
    }

    /// The `samsa server` arguments node `id` runs with (without the binary).
    pub fn server_args(&self, id: i32) -> Vec<String> {
        let node = self.node(id);
        let mut args = vec![
            "server".to_string(),
            "--node-id".into(),
            id.to_string(),
            "--listen".into(),
            node.bootstrap(),
            "--advertised-listener".into(),
            node.bootstrap(),
            "--data-dir".into(),
            node.data_dir().display().to_string(),
            "--set".into(),
            format!("controller_quorum_voters={}", self.voters),
            "--set".into(),
            format!("controller_listen={}", node.controller_addr()),
            "--set".into(),
            format!("http_listen=127.0.0.1:{}", node.http_port),
        ];
        for s in self
            .settings
            .iter()
            .chain(self.node_settings.get(&id).into_iter().flatten())
        {
            args.push("--set".into());
            args.push(s.clone());
        }
        args
    }

    /// Adds a `"key=value"` setting for node `id` alone (after the
    /// cluster's), used from its next start on.
    pub fn set_for_node(&mut self, id: i32, setting: &str) {
        self.node_settings
            .entry(id)
            .or_default()
            .push(setting.to_string());
    }

    /// Starts node `id`'s process without waiting for it.
    pub fn spawn(&mut self, id: i32) {
        let args = self.server_args(id);
        let bin = self.bin.clone();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is already running");
        node.starts += 1;
        let log = File::options()
            .create(true)
            .append(true)
            .open(node.log_path())
            .expect("open node log");
        {
            use std::io::Write;
            let mut l = &log;
            let _ = writeln!(l, "===== samsa node {id} start #{} =====", node.starts);
        }
        let log2 = log.try_clone().expect("clone log fd");
        let mut cmd = command(&bin);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        node.child = Some(child);
    }

    /// Waits until node `id` is ready (see the module docs); panics with its
    /// log if it exits or is not ready within [`START_TIMEOUT`].
    pub fn wait_ready(&mut self, id: i32) {
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = self.node(id).addr();
        loop {
            let exited = self
                .node_mut(id)
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.node_mut(id).child = None;
                panic!(
                    "node {id} exited during start-up with {status}\n{}",
                    self.log_tail(id, 100)
                );
            }
            if lists_itself(addr, id) {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "node {id} was not ready within {START_TIMEOUT:?}\n{}",
                    self.log_tail(id, 100)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts node `id` again (same ports, data and settings) and waits.
    pub fn restart(&mut self, id: i32) {
        self.spawn(id);
        self.wait_ready(id);
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: i32) -> Option<u32> {
        self.node(id).child.as_ref().map(Child::id)
    }

    /// SIGKILLs node `id` and reaps it; returns when the process is gone.
    pub fn sigkill(&mut self, id: i32) {
        if let Some(mut c) = self.node_mut(id).child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERMs node `id` and waits up to `timeout` for it to exit: its
    /// exit status, or `None` if it still ran (it is then SIGKILLed).
    pub fn sigterm(&mut self, id: i32, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.node_mut(id).child.take()?;
        crate::node::sigterm_and_reap(&mut child, timeout)
    }

    /// DescribeQuorum answered by node `id`'s controller (`None` if it does
    /// not answer within a second).
    pub fn describe_quorum(&self, id: i32) -> Option<DescribeQuorumResponse> {
        let client =
            ControllerClient::new([self.node(id).controller_addr()], Duration::from_secs(1));
        self.rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(2), client.describe_quorum()).await
            })
            .ok()?
            .ok()
    }

    /// The node that is leader by its own account, among the running nodes.
    pub fn self_declared_leader(&mut self) -> Option<i32> {
        self.running().into_iter().find(|&id| {
            self.describe_quorum(id)
                .and_then(|d| d.leader_id)
                .is_some_and(|l| i64::try_from(l).ok() == Some(i64::from(id)))
        })
    }

    /// Waits until a running node declares itself leader; returns its id.
    pub fn wait_leader(&mut self, timeout: Duration) -> i32 {
        try_wait_until(timeout, || self.self_declared_leader()).unwrap_or_else(|| {
            panic!(
                "no controller leader within {timeout:?}\n{}",
                self.all_logs(60)
            )
        })
    }

    /// Metadata offsets applied by each running node's controller.
    pub fn metadata_offsets(&mut self) -> BTreeMap<i32, u64> {
        self.running()
            .into_iter()
            .filter_map(|id| Some((id, self.describe_quorum(id)?.metadata_offset)))
            .collect()
    }

    /// Runs `samsa` with `args` to completion (it must exit within
    /// `timeout`, else the test fails: a hang is a bug) and returns its output.
    pub fn run_to_exit(&self, args: &[String], timeout: Duration) -> (ExitStatus, String) {
        run_to_exit(&self.bin, args, timeout)
    }

    /// The last `lines` lines of node `id`'s log.
    pub fn log_tail(&self, id: i32, lines: usize) -> String {
        let path = self.node(id).log_path();
        let text = tail(&path, lines);
        // A node that fails prints `error: …` as it exits, while its
        // threads may still log for a moment: the line can be above the
        // tail, so errors and warnings of the last start are listed too.
        let marker = format!("===== samsa node {id} start");
        let last_start = std::fs::read_to_string(&path)
            .map(|all| {
                let from = all.rfind(&marker).unwrap_or(0);
                all[from..]
                    .lines()
                    .filter(|l| {
                        l.starts_with("error:") || l.contains(" ERROR ") || l.contains(" WARN ")
                    })
                    .take(50)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        format!(
            "----- node {id} log ({}) -----\n{text}\n----- errors and warnings of its last start -----\n{last_start}\n----- end of node {id} log -----",
            path.display(),
        )
    }

    /// With `SAMSA_TEST_KEEP_LOGS=<dir>` set, copies every node's whole log
    /// into `<dir>/<pid>-<n>/node-<id>.log` (called for a failed test, whose
    /// temporary directories are about to be removed).
    pub fn keep_logs(&self) {
        let Some(dir) = std::env::var_os("SAMSA_TEST_KEEP_LOGS") else {
            return;
        };
        static KEPT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = KEPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dest = PathBuf::from(dir).join(format!("{}-{n}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&dest) {
            eprintln!("could not keep logs in {}: {e}", dest.display());
            return;
        }
        for id in self.nodes.keys() {
            let to = dest.join(format!("node-{id}.log"));
            if let Err(e) = std::fs::copy(self.node(*id).log_path(), &to) {
                eprintln!("could not keep {}: {e}", to.display());
            }
        }
        eprintln!("node logs kept in {}", dest.display());
    }

    /// Log tails of every node.
    pub fn all_logs(&self, lines: usize) -> String {
        self.nodes
            .keys()
            .map(|id| self.log_tail(*id, lines))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SamsaCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.all_logs(150));
            self.keep_logs();
        }
        for node in self.nodes.values_mut() {
            if let Some(mut c) = node.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Whether the broker at `addr` answers and lists broker `id` in Metadata.
fn lists_itself(addr: SocketAddr, id: i32) -> bool {
    let Ok(mut client) = KafkaClient::connect_with_timeout(addr, Duration::from_secs(1)) else {
        return false;
    };
    // The port is bound before the broker accepts: don't wait 30 s on it.
    if client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .is_err()
        || client.api_versions().is_err()
    {
        return false;
    }
    client
        .metadata(Some(&[]))
        .is_ok_and(|m| m.brokers.iter().any(|b| b.node_id.0 == id))
}

/// `samsa` behind `setpriv --pdeathsig KILL` when available, so a test
/// process that dies without running Drop takes its nodes with it.
pub(crate) fn command(bin: &Path) -> Command {
    let mut cmd = if has_setpriv() {
        let mut c = Command::new("setpriv");
        c.arg("--pdeathsig").arg("KILL").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info,openraft=warn");
    }
    cmd
}

/// Runs `samsa <args>` to its exit (panics if it runs longer than
/// `timeout`) and returns its status with stdout and stderr apart, for
/// tests that parse what a CLI tool prints.
pub fn run_cli(bin: &Path, args: &[String], timeout: Duration) -> CliOutput {
    let mut child = command(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    // Drain the pipes on threads so a chatty process cannot block on them.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = try_wait_until(timeout, || child.try_wait().ok().flatten());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "`samsa {}` did not exit within {timeout:?} (a hang)\n{}{}",
            args.join(" "),
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default()
        );
    };
    CliOutput {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// What [`run_cli`] saw.
#[derive(Debug)]
pub struct CliOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `bin args` to completion within `timeout` (killing it and failing
/// the test otherwise); returns the status and stdout+stderr.
pub fn run_to_exit(bin: &Path, args: &[String], timeout: Duration) -> (ExitStatus, String) {
    let out = run_cli(bin, args, timeout);
    (out.status, format!("{}{}", out.stdout, out.stderr))
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let from = len.saturating_sub(256 * 1024);
        let _ = f.seek(SeekFrom::Start(from));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        s = String::from_utf8_lossy(&buf).into_owned();
    }
    last_lines(&s, lines)
}

/// The last `n` lines of `text`.
pub(crate) fn last_lines(text: &str, n: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(n)..].join("\n")
}

/// Median and maximum of `samples` (which must not be empty).
pub fn median_and_max(samples: &[Duration]) -> (Duration, Duration) {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2
    };
    (median, *sorted.last().expect("samples"))
}
