//! `SamsaNode`: one real `samsa server` (or `samsa dev`) process on a free
//! port with its own temporary data directory.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::client::KafkaClient;
use crate::wait::try_wait_until;

/// How long a node may take to answer ApiVersions after it was spawned.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a clean shutdown may take after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Path of the `samsa` binary under test: `$SAMSA_BIN`, else
/// `<CARGO_TARGET_DIR or <workspace>/target>/debug/samsa`.
pub fn samsa_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SAMSA_BIN") {
        return PathBuf::from(p);
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ has a parent")
            .join("target"),
    };
    target.join("debug").join("samsa")
}

/// Sends SIGTERM to `child` and waits up to `timeout` for it to exit: its
/// exit status, or `None` if it still ran (it is then SIGKILLed and reaped).
pub fn sigterm_and_reap(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    signal::kill(pid, Signal::SIGTERM).expect("kill(SIGTERM)");
    let status = try_wait_until(timeout, || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// A free TCP port on 127.0.0.1 for a node to listen on.
///
/// Chosen below the kernel's ephemeral range (32768–60999 here): a port the
/// kernel hands out with `bind(0)` is also what it uses for the local side of
/// outgoing connections, and with many tests connecting concurrently such a
/// port was taken between our check and the node's bind. Ports here are only
/// ever taken by listeners, so a bind check right before use is reliable
/// unless two tests draw the same port at the same moment.
pub fn free_port() -> u16 {
    use rand::Rng;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(20_000..32_000);
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free port in 20000..32000 on 127.0.0.1")
}

/// Ports handed out by [`free_port`] and [`free_dev_ports`]. A port is
/// handed out once per test process: a cluster asks for all its ports
/// before any node binds one, so the bind check alone let two nodes of one
/// cluster get the same port (seen in CI: two controllers on one address,
/// and openraft's core panicked).
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Base ports `(kafka, controller, http)` for `samsa dev --nodes N`, which
/// puts node n on base + 100 × (n − 1): all 3 × N ports are free and handed
/// out, in the range [`free_port`] uses.
pub fn free_dev_ports(nodes: u16) -> (u16, u16, u16) {
    use rand::Rng;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let kafka = rng.gen_range(20_000..(32_000 - 100 * nodes - 3));
        let all: Vec<u16> = (0..nodes)
            .flat_map(|n| (0..3).map(move |k| kafka + k + 100 * n))
            .collect();
        if all
            .iter()
            .all(|p| !handed_out.contains(p) && TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            handed_out.extend(all);
            return (kafka, kafka + 1, kafka + 2);
        }
    }
    panic!("no free port range for samsa dev --nodes {nodes} in 20000..32000")
}

/// Settings every test node starts with, before the test's own. Like
/// Kafka's test configurations, the first rebalance of an empty group does
/// not wait `group.initial.rebalance.delay.ms` (3 s by default) for more
/// members, so group tests are not slowed by it.
pub const TEST_NODE_SETTINGS: &[&str] = &["group_initial_rebalance_delay_ms=0"];

/// How the node's process is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `samsa server` with this node's flags and [`TEST_NODE_SETTINGS`].
    Server,
    /// `samsa dev` on this node's ports: its own presets, no test settings.
    Dev,
}

/// A running (or stopped) samsa broker. Dropping it SIGKILLs the process; if
/// the thread is panicking, the node's log is printed first.
pub struct SamsaNode {
    bin: PathBuf,
    mode: Mode,
    port: u16,
    /// Port of the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`).
    http_port: u16,
    node_id: i32,
    settings: Vec<String>,
    dir: TempDir,
    /// The data directory when it is not `dir/data` (a small file system
    /// mounted elsewhere, see [`SamsaNode::start_with_data_dir`]).
    data_dir: Option<PathBuf>,
    child: Option<Child>,
    /// Number of times the process was started (1 after `start`).
    starts: u32,
    /// The open-file limit (soft and hard) the process starts with, if
    /// not inherited.
    open_file_limit: Option<u64>,
}

impl SamsaNode {
    /// Starts a node with default settings and waits until it answers.
    pub fn start() -> SamsaNode {
        Self::start_with(&[])
    }

    /// Starts a node with extra `--set key=value` settings (given as
    /// `"key=value"`) and waits until it answers ApiVersions.
    pub fn start_with(settings: &[&str]) -> SamsaNode {
        let settings: Vec<&str> = TEST_NODE_SETTINGS.iter().chain(settings).copied().collect();
        Self::start_mode(Mode::Server, &settings)
    }

    /// Starts `samsa dev` (a single node, with the development presets and
    /// none of [`TEST_NODE_SETTINGS`]) on free ports, with extra `--set`
    /// settings, and waits until it answers ApiVersions.
    pub fn start_dev(settings: &[&str]) -> SamsaNode {
        Self::start_mode(Mode::Dev, settings)
    }

    /// [`SamsaNode::start_with`], keeping the data in `data_dir` (which must
    /// exist) instead of the node's temporary directory; the caller owns
    /// and removes it.
    pub fn start_with_data_dir(data_dir: &Path, settings: &[&str]) -> SamsaNode {
        let settings: Vec<&str> = TEST_NODE_SETTINGS.iter().chain(settings).copied().collect();
        Self::start_mode_in(Mode::Server, &settings, Some(data_dir.to_path_buf()))
    }

    /// [`SamsaNode::start_with`] under an open-file limit of `limit`
    /// descriptors, soft and hard (`prlimit`, util-linux).
    pub fn start_with_open_file_limit(limit: u64, settings: &[&str]) -> SamsaNode {
        let settings: Vec<&str> = TEST_NODE_SETTINGS.iter().chain(settings).copied().collect();
        Self::start_mode_limited(Mode::Server, &settings, None, Some(limit))
    }

    fn start_mode(mode: Mode, settings: &[&str]) -> SamsaNode {
        Self::start_mode_in(mode, settings, None)
    }

    fn start_mode_in(mode: Mode, settings: &[&str], data_dir: Option<PathBuf>) -> SamsaNode {
        Self::start_mode_limited(mode, settings, data_dir, None)
    }

    fn start_mode_limited(
        mode: Mode,
        settings: &[&str],
        data_dir: Option<PathBuf>,
        open_file_limit: Option<u64>,
    ) -> SamsaNode {
        let bin = samsa_bin();
        assert!(
            bin.is_file(),
            "samsa binary not found at {} — build it with `cargo build -p samsa` \
             or point SAMSA_BIN at it",
            bin.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("samsa-test-")
            .tempdir()
            .expect("create temp dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("create data dir");
        let mut node = SamsaNode {
            bin,
            mode,
            port: free_port(),
            http_port: free_port(),
            node_id: 1,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            dir,
            data_dir,
            child: None,
            starts: 0,
            open_file_limit,
        };
        node.spawn_and_wait();
        node
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT` of the node's HTTP endpoint.
    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http_port))
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| self.dir.path().join("data"))
    }

    /// The file that collects the node's stdout and stderr (all starts).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("samsa.log")
    }

    /// A raw protocol client connected to this node (ApiVersions done).
    pub fn client(&self) -> KafkaClient {
        KafkaClient::connect(self.addr())
            .unwrap_or_else(|e| panic!("connect to samsa at {}: {e:#}", self.addr()))
    }

    /// Whether the process is running (it has not exited).
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn sigkill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and waits for the process to exit; panics (after a
    /// SIGKILL) if it does not exit within 30 s. Returns the exit status.
    pub fn sigterm_and_wait(&mut self) -> ExitStatus {
        let mut c = self
            .child
            .take()
            .expect("sigterm_and_wait: node is not running");
        match sigterm_and_reap(&mut c, STOP_TIMEOUT) {
            Some(s) => s,
            None => panic!(
                "samsa did not exit within {STOP_TIMEOUT:?} after SIGTERM\n{}",
                self.log_tail(200)
            ),
        }
    }

    /// Starts the process again on the same port with the same data dir and
    /// settings, and waits until it answers. The node must be stopped.
    pub fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart: node is still running; call sigkill() or sigterm_and_wait() first"
        );
        self.spawn_and_wait();
    }

    fn spawn_and_wait(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open node log");
        let log2 = log.try_clone().expect("clone log fd");
        self.starts += 1;
        {
            use std::io::Write;
            let mut l = &log;
            let _ = writeln!(l, "===== samsa start #{} =====", self.starts);
        }
        let listen = self.bootstrap();
        // If the test process dies without running Drop (killed by a test
        // timeout), the kernel kills the broker too: `setpriv --pdeathsig`
        // sets PR_SET_PDEATHSIG and execs samsa in the same process (so the
        // pid we signal is samsa's). Without setpriv, spawn samsa directly.
        // `prlimit` (util-linux) also execs in place: the pid stays samsa's.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(limit) = self.open_file_limit {
            argv.extend(["prlimit".into(), format!("--nofile={limit}:{limit}").into()]);
        }
        if has_setpriv() {
            argv.extend(["setpriv".into(), "--pdeathsig".into(), "KILL".into()]);
        }
        argv.push(self.bin.clone().into_os_string());
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        match self.mode {
            Mode::Server => cmd
                .arg("server")
                .arg("--node-id")
                .arg(self.node_id.to_string())
                .arg("--listen")
                .arg(&listen)
                .arg("--advertised-listener")
                .arg(&listen)
                .arg("--data-dir")
                .arg(self.data_dir())
                .arg("--set")
                .arg(format!("http_listen={}", self.http_addr())),
            // `dev` binds and advertises 127.0.0.1:<port>, as `bootstrap()` says.
            Mode::Dev => cmd
                .arg("dev")
                .arg("--port")
                .arg(self.port.to_string())
                .arg("--http-port")
                .arg(self.http_port.to_string())
                .arg("--data-dir")
                .arg(self.data_dir()),
        };
        for s in &self.settings {
            cmd.arg("--set").arg(s);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_ready();
    }

    /// Polls until the node answers ApiVersions, or panics with its log if it
    /// exits or does not answer within the start timeout.
    fn wait_ready(&mut self) {
        let addr = self.addr();
        let started = Instant::now();
        let deadline = started + START_TIMEOUT;
        let mut pause = Duration::from_millis(5);
        loop {
            if let Some(c) = &mut self.child {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    panic!(
                        "samsa exited during startup with {status}\n{}",
                        self.log_tail(200)
                    );
                }
            }
            if let Ok(mut c) = KafkaClient::connect_with_timeout(addr, Duration::from_secs(2)) {
                if c.api_versions().is_ok() {
                    return;
                }
            }
            if Instant::now() >= deadline {
                self.sigkill();
                panic!(
                    "samsa did not answer ApiVersions on {addr} within {START_TIMEOUT:?}\n{}",
                    self.log_tail(200)
                );
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// The last `lines` lines of the node's log, framed for a panic message.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(self.log_path()) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            // Read at most the last 256 KiB.
            let from = len.saturating_sub(256 * 1024);
            let _ = f.seek(SeekFrom::Start(from));
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            s = String::from_utf8_lossy(&buf).into_owned();
        }
        let all: Vec<&str> = s.lines().collect();
        let tail = &all[all.len().saturating_sub(lines)..];
        format!(
            "----- samsa log ({}, last {} lines) -----\n{}\n----- end of samsa log -----",
            self.log_path().display(),
            tail.len(),
            tail.join("\n")
        )
    }
}

impl Drop for SamsaNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(300));
        }
        self.sigkill();
    }
}

/// Whether `setpriv` (util-linux) is available to set `PR_SET_PDEATHSIG`.
pub fn has_setpriv() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("setpriv")
            .arg("--help")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}
