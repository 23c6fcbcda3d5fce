//! The faults themselves, on the containers of one Docker Compose project
//! laid out as `deploy/compose.yaml` (service `samsa-<i>` is node `i + 1`),
//! injected from the host:
//!
//! - `kill` / `pause`: `docker kill` / `docker pause`;
//! - partitions and loss: iptables rules in the container's network
//!   namespace (`nsenter -t <pid> -n iptables …`), all in one chain of
//!   their own, [`CHAIN`], jumped to from INPUT and OUTPUT. Only packets of
//!   the peer nodes' addresses are cut, so clients on the host still reach a
//!   cut-off node through its published port; loopback is never touched;
//! - `delay`: `tc netem` on the container's `eth0`; a kernel without netem
//!   gets a token bucket (`tbf`) instead — a slow link, not a fixed delay
//!   (the fault's detail says which);
//! - `disk-full`: a filler file written from the host into the directory
//!   mounted at `/var/lib/samsa`, until the filesystem is full. Refused on a
//!   filesystem larger than [`Nemesis::max_fill_bytes`].
//!
//! Invariant: [`Nemesis::heal_all`] undoes every fault this module can make
//! without knowing which were made (flush the chain, drop the root qdisc,
//! unpause, start exited containers, delete fillers), so it is idempotent
//! and also heals what a crashed run left. A [`Nemesis`] heals everything
//! when dropped unless [`Nemesis::keep_faults_on_drop`] was called.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::NemesisError;
use crate::log::{now_ms, FaultLog, FaultRecord};
use crate::schedule::FaultKind;

/// The iptables chain every nemesis rule lives in.
pub const CHAIN: &str = "SAMSA-NEMESIS";
/// The name of the filler file in a node's data directory.
pub const FILLER: &str = "nemesis-filler";
/// Where deploy/compose.yaml mounts a node's data.
pub const DATA_MOUNT: &str = "/var/lib/samsa";

/// Runs `program args`; its stdout if it exits 0.
fn run(program: &str, args: &[&str]) -> Result<String, NemesisError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NemesisError::Spawn {
            program: program.to_string(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NemesisError::Command {
            command: format!("{program} {}", args.join(" ")),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// The containers of one compose project.
#[derive(Debug, Clone)]
pub struct ComposeProject {
    pub project: String,
    /// Node ids are `1..=nodes`.
    pub nodes: u32,
}

impl ComposeProject {
    pub fn new(project: &str, nodes: u32) -> ComposeProject {
        ComposeProject {
            project: project.to_string(),
            nodes,
        }
    }

    pub fn node_ids(&self) -> impl Iterator<Item = u32> {
        1..=self.nodes
    }

    fn check_node(&self, node: u32) -> Result<(), NemesisError> {
        if node == 0 || node > self.nodes {
            return Err(NemesisError::NoSuchNode {
                node,
                nodes: self.nodes,
            });
        }
        Ok(())
    }

    pub fn service(node: u32) -> String {
        format!("samsa-{}", node.saturating_sub(1))
    }

    /// The container id of `node`, running or not.
    pub fn container(&self, node: u32) -> Result<String, NemesisError> {
        self.check_node(node)?;
        let service = Self::service(node);
        let project = format!("label=com.docker.compose.project={}", self.project);
        let svc = format!("label=com.docker.compose.service={service}");
        let out = run(
            "docker",
            &["ps", "-a", "-q", "--filter", &project, "--filter", &svc],
        )?;
        out.lines()
            .next()
            .map(str::to_string)
            .ok_or(NemesisError::NoContainer {
                project: self.project.clone(),
                service,
            })
    }

    fn inspect(&self, node: u32, format: &str) -> Result<String, NemesisError> {
        let id = self.container(node)?;
        Ok(run("docker", &["inspect", "--format", format, &id])?
            .trim()
            .to_string())
    }

    /// `running`, `paused`, `exited`, … (Docker's container status).
    pub fn status(&self, node: u32) -> Result<String, NemesisError> {
        self.inspect(node, "{{.State.Status}}")
    }

    /// The container's address on the project network.
    pub fn ip(&self, node: u32) -> Result<String, NemesisError> {
        let ip = self.inspect(
            node,
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        )?;
        ip.split_whitespace()
            .next()
            .map(str::to_string)
            .ok_or(NemesisError::NotRunning(node))
    }

    /// The host directory mounted at [`DATA_MOUNT`].
    pub fn data_dir(&self, node: u32) -> Result<PathBuf, NemesisError> {
        let format = format!(
            "{{{{range .Mounts}}}}{{{{if eq .Destination \"{DATA_MOUNT}\"}}}}{{{{.Source}}}}{{{{end}}}}{{{{end}}}}"
        );
        let dir = self.inspect(node, &format)?;
        if dir.is_empty() {
            return Err(NemesisError::NoDataDir(node));
        }
        Ok(PathBuf::from(dir))
    }

    /// Runs `program args` in `node`'s network namespace.
    fn in_netns(&self, node: u32, program: &str, args: &[&str]) -> Result<String, NemesisError> {
        let pid = self.inspect(node, "{{.State.Pid}}")?;
        if pid.is_empty() || pid == "0" {
            return Err(NemesisError::NotRunning(node));
        }
        let mut all = vec!["-t", pid.as_str(), "-n", program];
        all.extend(args);
        run("nsenter", &all)
    }

    fn iptables(&self, node: u32, args: &[&str]) -> Result<String, NemesisError> {
        let mut all = vec!["-w"];
        all.extend(args);
        self.in_netns(node, "iptables", &all)
    }

    /// Creates [`CHAIN`] and the jumps to it in `node`'s namespace if missing.
    fn ensure_chain(&self, node: u32) -> Result<(), NemesisError> {
        if self.iptables(node, &["-L", CHAIN, "-n"]).is_err() {
            self.iptables(node, &["-N", CHAIN])?;
        }
        for hook in ["INPUT", "OUTPUT"] {
            if self.iptables(node, &["-C", hook, "-j", CHAIN]).is_err() {
                self.iptables(node, &["-I", hook, "1", "-j", CHAIN])?;
            }
        }
        Ok(())
    }

    fn docker_on(&self, verb: &str, node: u32) -> Result<(), NemesisError> {
        let id = self.container(node)?;
        run("docker", &[verb, &id]).map(drop)
    }
}

/// Which packets between two nodes a cut drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Both ways.
    Both,
    /// Only what the peer sends to the node.
    IntoNode,
}

/// One thing done to the cluster, and how to undo it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Killed(u32),
    Paused(u32),
    /// SIGSTOP of the main process.
    Stopped(u32),
    /// iptables rule arguments (after `-A CHAIN`) added in `node`'s namespace.
    Rule {
        node: u32,
        rule: Vec<String>,
    },
    Qdisc(u32),
    Filler(PathBuf),
}

/// A fault in place.
#[derive(Debug)]
pub struct ActiveFault {
    pub kind: FaultKind,
    pub targets: Vec<u32>,
    pub detail: String,
    pub start_ms: i64,
    actions: Vec<Action>,
}

/// Injects and heals faults on one project; see the module docs.
pub struct Nemesis {
    pub project: ComposeProject,
    pub log: Option<FaultLog>,
    /// The largest filesystem `disk-full` fills (default 4 GiB).
    pub max_fill_bytes: u64,
    heal_on_drop: bool,
}

impl Nemesis {
    pub fn new(project: ComposeProject, log: Option<FaultLog>) -> Nemesis {
        Nemesis {
            project,
            log,
            max_fill_bytes: 4 << 30,
            heal_on_drop: true,
        }
    }

    /// Leaves the faults in place when dropped (a one-shot CLI fault).
    pub fn keep_faults_on_drop(&mut self) {
        self.heal_on_drop = false;
    }

    /// `docker kill` of `node`; healed by `docker start`.
    pub fn kill(&mut self, node: u32) -> Result<ActiveFault, NemesisError> {
        let mut f = ActiveFault::new(FaultKind::Kill, vec![node], "docker kill (SIGKILL)");
        self.project.docker_on("kill", node)?;
        f.actions.push(Action::Killed(node));
        Ok(f)
    }

    /// `docker pause` of `node` (the cgroup freezer); where the freezer is
    /// unavailable (Docker answers "unable to freeze"), SIGSTOP of the
    /// container's main process (samsa is PID 1 of the image), healed by
    /// SIGCONT.
    pub fn pause(&mut self, node: u32) -> Result<ActiveFault, NemesisError> {
        let mut f = ActiveFault::new(FaultKind::Pause, vec![node], "docker pause");
        match self.project.docker_on("pause", node) {
            Ok(()) => f.actions.push(Action::Paused(node)),
            Err(NemesisError::Command { output, .. }) if output.contains("freeze") => {
                let id = self.project.container(node)?;
                run("docker", &["kill", "--signal", "SIGSTOP", &id])?;
                f.detail =
                    "SIGSTOP of the container's main process (no cgroup freezer here)".into();
                f.actions.push(Action::Stopped(node));
            }
            Err(e) => return Err(e),
        }
        Ok(f)
    }

    /// Cuts `node` off from every other node (both ways); `kind` is what
    /// the fault log calls it (`partition-leader`, `partition-controller`,
    /// `partition-majority` with one node in the minority).
    pub fn isolate(&mut self, kind: FaultKind, node: u32) -> Result<ActiveFault, NemesisError> {
        let others: Vec<u32> = self.project.node_ids().filter(|n| *n != node).collect();
        let detail = format!("node {node} cut off from nodes {others:?}; clients still reach it");
        self.split(kind, &[node], &others, detail)
    }

    /// Cuts every node of `a` off from every node of `b`, both ways; the
    /// fault's targets are `a`.
    pub fn split(
        &mut self,
        kind: FaultKind,
        a: &[u32],
        b: &[u32],
        detail: String,
    ) -> Result<ActiveFault, NemesisError> {
        // The fault log names the cut-off side (the isolated node, the minority).
        let mut targets = a.to_vec();
        targets.sort_unstable();
        let mut f = ActiveFault::new(kind, targets, &detail);
        for x in a {
            for y in b {
                if let Err(e) = self.cut(&mut f, *x, *y, Direction::Both) {
                    self.heal(f)?;
                    return Err(e);
                }
            }
        }
        Ok(f)
    }

    /// The bridge partition: the nodes other than `bridge` in two halves
    /// that cannot reach each other; `bridge` reaches both. With three
    /// nodes: A–B cut, the bridge C sees both.
    pub fn bridge(&mut self, bridge: u32) -> Result<ActiveFault, NemesisError> {
        let rest: Vec<u32> = self.project.node_ids().filter(|n| *n != bridge).collect();
        let (a, b) = rest.split_at(rest.len() / 2);
        let detail = format!("nodes {a:?} and {b:?} cut apart; node {bridge} bridges both");
        let mut f = self.split(FaultKind::PartitionBridge, a, b, detail)?;
        f.targets = rest;
        Ok(f)
    }

    /// `receiver` drops every packet `sender` sends it; the other way works.
    pub fn one_way(&mut self, receiver: u32, sender: u32) -> Result<ActiveFault, NemesisError> {
        let mut f = ActiveFault::new(
            FaultKind::PartitionOneWay,
            vec![receiver, sender],
            &format!("node {receiver} drops packets from node {sender}; node {sender} still hears node {receiver}"),
        );
        if let Err(e) = self.cut(&mut f, receiver, sender, Direction::IntoNode) {
            self.heal(f)?;
            return Err(e);
        }
        Ok(f)
    }

    fn cut(
        &mut self,
        f: &mut ActiveFault,
        node: u32,
        peer: u32,
        direction: Direction,
    ) -> Result<(), NemesisError> {
        let ip = self.project.ip(peer)?;
        self.project.ensure_chain(node)?;
        let mut rules = vec![vec![
            "-s".to_string(),
            ip.clone(),
            "-j".into(),
            "DROP".into(),
        ]];
        if direction == Direction::Both {
            rules.push(vec!["-d".to_string(), ip, "-j".into(), "DROP".into()]);
        }
        for rule in rules {
            self.add_rule(f, node, rule)?;
        }
        Ok(())
    }

    fn add_rule(
        &mut self,
        f: &mut ActiveFault,
        node: u32,
        rule: Vec<String>,
    ) -> Result<(), NemesisError> {
        let mut args = vec!["-A", CHAIN];
        args.extend(rule.iter().map(String::as_str));
        self.project.iptables(node, &args)?;
        f.actions.push(Action::Rule { node, rule });
        Ok(())
    }

    /// `percent`% of the packets `node` receives and sends (loopback
    /// excepted) dropped at random (iptables `statistic`).
    pub fn loss(&mut self, node: u32, percent: u32) -> Result<ActiveFault, NemesisError> {
        let p = format!("{:.2}", f64::from(percent.min(100)) / 100.0);
        let mut f = ActiveFault::new(
            FaultKind::Loss,
            vec![node],
            &format!("{percent}% of packets in and out dropped (iptables statistic)"),
        );
        self.project.ensure_chain(node)?;
        let rule: Vec<String> = [
            "!",
            "-i",
            "lo",
            "!",
            "-o",
            "lo",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &p,
            "-j",
            "DROP",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self.add_rule(&mut f, node, rule)?;
        Ok(f)
    }

    /// `ms` ± `ms / 2` milliseconds added to every packet `node` sends
    /// (`tc netem`); without netem in the kernel, its link limited to
    /// 1 Mbit/s with up to `ms` of queueing (`tbf`).
    pub fn delay(&mut self, node: u32, ms: u32) -> Result<ActiveFault, NemesisError> {
        let delay = format!("{ms}ms");
        let jitter = format!("{}ms", ms / 2);
        let netem = [
            "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &delay, &jitter,
        ];
        let detail = match self.project.in_netns(node, "tc", &netem) {
            Ok(_) => format!("tc netem delay {delay} {jitter} on eth0"),
            Err(NemesisError::Command { output, .. }) if output.contains("unknown") => {
                let tbf = [
                    "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "1mbit", "burst",
                    "16kb", "latency", &delay,
                ];
                self.project.in_netns(node, "tc", &tbf)?;
                format!(
                    "tc tbf rate 1mbit latency {delay} on eth0 (this kernel has no netem: a slow link, not a fixed delay)"
                )
            }
            Err(e) => return Err(e),
        };
        let mut f = ActiveFault::new(FaultKind::Delay, vec![node], &detail);
        f.actions.push(Action::Qdisc(node));
        Ok(f)
    }

    /// Fills the filesystem of `node`'s data directory with a filler file.
    pub fn disk_full(&mut self, node: u32) -> Result<ActiveFault, NemesisError> {
        let dir = self.project.data_dir(node)?;
        let st = nix::sys::statvfs::statvfs(&dir).map_err(|e| NemesisError::Io {
            path: dir.clone(),
            source: e.into(),
        })?;
        let size = st.blocks().saturating_mul(st.fragment_size());
        if size > self.max_fill_bytes {
            return Err(NemesisError::FilesystemTooLarge {
                path: dir,
                size_mib: size >> 20,
                max_mib: self.max_fill_bytes >> 20,
            });
        }
        let path = dir.join(FILLER);
        let written = fill(&path)?;
        let mut f = ActiveFault::new(
            FaultKind::DiskFull,
            vec![node],
            &format!(
                "{} filled with {} MiB (filesystem of {} MiB)",
                path.display(),
                written >> 20,
                size >> 20
            ),
        );
        f.actions.push(Action::Filler(path));
        Ok(f)
    }

    /// Undoes one fault (in reverse order of its actions) and logs it.
    pub fn heal(&mut self, fault: ActiveFault) -> Result<FaultRecord, NemesisError> {
        let mut first_error = None;
        for action in fault.actions.iter().rev() {
            if let Err(e) = self.undo(action) {
                tracing::warn!("healing {}: {e}", fault.kind);
                first_error.get_or_insert(e);
            }
        }
        let record = FaultRecord {
            fault: fault.kind.name().to_string(),
            targets: fault.targets.clone(),
            detail: fault.detail.clone(),
            start_ms: fault.start_ms,
            end_ms: now_ms(),
        };
        if let Some(log) = &mut self.log {
            log.write(&record)?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(record),
        }
    }

    fn undo(&self, action: &Action) -> Result<(), NemesisError> {
        let p = &self.project;
        match action {
            Action::Killed(n) => {
                // A "restarting" node is already coming back on its own.
                if matches!(p.status(*n)?.as_str(), "exited" | "created") {
                    p.docker_on("start", *n)?;
                }
                Ok(())
            }
            Action::Paused(n) => {
                if p.status(*n)? == "paused" {
                    p.docker_on("unpause", *n)?;
                }
                Ok(())
            }
            Action::Stopped(n) => {
                let id = p.container(*n)?;
                match run("docker", &["kill", "--signal", "SIGCONT", &id]) {
                    // Stopped processes that exited have nothing to continue.
                    Err(_) if p.status(*n)? != "running" => Ok(()),
                    other => other.map(drop),
                }
            }
            Action::Rule { node, rule } => {
                let mut args = vec!["-D", CHAIN];
                args.extend(rule.iter().map(String::as_str));
                match p.iptables(*node, &args) {
                    // A restarted container has a fresh namespace without the rule.
                    Err(NemesisError::NotRunning(_)) => Ok(()),
                    Err(NemesisError::Command { .. })
                        if p.iptables(*node, &["-L", CHAIN, "-n"]).is_err() =>
                    {
                        Ok(())
                    }
                    other => other.map(drop),
                }
            }
            Action::Qdisc(n) => {
                match p.in_netns(*n, "tc", &["qdisc", "del", "dev", "eth0", "root"]) {
                    Err(NemesisError::NotRunning(_)) => Ok(()),
                    other => other.map(drop),
                }
            }
            Action::Filler(path) => remove_filler(path),
        }
    }

    /// Undoes everything any nemesis could have done to the project (see
    /// the module docs); idempotent.
    pub fn heal_all(&self) -> Result<(), NemesisError> {
        let p = &self.project;
        let mut first_error = None;
        for n in p.node_ids() {
            let result = (|| -> Result<(), NemesisError> {
                match p.status(n)?.as_str() {
                    "paused" => p.docker_on("unpause", n).map(drop)?,
                    "exited" | "created" => p.docker_on("start", n).map(drop)?,
                    "running" => {
                        // A pause made with SIGSTOP (no freezer) leaves no
                        // trace in the status; SIGCONT to a running process
                        // is harmless. One that exits meanwhile (a full disk
                        // stops samsa) has nothing left to continue.
                        let id = p.container(n)?;
                        if let Err(e) = run("docker", &["kill", "--signal", "SIGCONT", &id]) {
                            if p.status(n)? == "running" {
                                return Err(e);
                            }
                        }
                    }
                    // "restarting" (Docker's restart policy brings back a
                    // node that stopped itself), "removing", "dead": no
                    // process to continue, and its next start gets a fresh
                    // network namespace without our rules.
                    _ => {}
                }
                match heal_network(p, n) {
                    Err(NemesisError::NotRunning(_)) => {}
                    other => other?,
                }
                match p.data_dir(n) {
                    Ok(dir) => remove_filler(&dir.join(FILLER)),
                    Err(NemesisError::NoDataDir(_)) => Ok(()),
                    Err(e) => Err(e),
                }
            })();
            if let Err(e) = result {
                tracing::warn!("healing node {n}: {e}");
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Nemesis {
    fn drop(&mut self) {
        if self.heal_on_drop {
            if let Err(e) = self.heal_all() {
                eprintln!("nemesis: healing {} on exit: {e}", self.project.project);
            }
        }
    }
}

impl ActiveFault {
    fn new(kind: FaultKind, targets: Vec<u32>, detail: &str) -> ActiveFault {
        ActiveFault {
            kind,
            targets,
            detail: detail.to_string(),
            start_ms: now_ms(),
            actions: Vec::new(),
        }
    }
}

/// Removes our iptables rules and qdisc from `node`'s network namespace;
/// [`NemesisError::NotRunning`] if it has none (nothing to heal there).
fn heal_network(p: &ComposeProject, node: u32) -> Result<(), NemesisError> {
    if p.iptables(node, &["-L", CHAIN, "-n"]).is_ok() {
        p.iptables(node, &["-F", CHAIN])?;
    }
    // Docker gives eth0 no root qdisc: one there is ours.
    let qdisc = p.in_netns(node, "tc", &["qdisc", "show", "dev", "eth0", "root"])?;
    if qdisc.contains("netem") || qdisc.contains("tbf") {
        p.in_netns(node, "tc", &["qdisc", "del", "dev", "eth0", "root"])?;
    }
    Ok(())
}

/// Writes zeros to `path` until the filesystem is full; returns the bytes written.
fn fill(path: &Path) -> Result<u64, NemesisError> {
    let io = |source| NemesisError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
            Err(e) => return Err(io(e)),
        }
    }
    // The last blocks: smaller writes until nothing fits.
    let mut small = 4096usize;
    while small > 0 {
        match file.write(&chunk[..small]) {
            Ok(n) if n > 0 => written += n as u64,
            _ => small /= 2,
        }
    }
    match file.sync_all() {
        Ok(()) => Ok(written),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => Ok(written),
        Err(e) => Err(io(e)),
    }
}

fn remove_filler(path: &Path) -> Result<(), NemesisError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NemesisError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}
