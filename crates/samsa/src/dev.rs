//! `samsa dev --nodes N`: the supervisor of a local cluster of N `samsa
//! server` processes, one per node (the configurations come from
//! `server::dev_cluster_configs`), and the `ready` line every `samsa dev`
//! prints once it serves.
//!
//! It owns each node's process (spawned from this same binary), the
//! configuration file it generates for it (`<node data dir>/samsa-dev.toml`)
//! and the node's log file (`<node data dir>/samsa.log`, appended, stdout and
//! stderr). It reports on stderr every node that dies, starts a node killed
//! by a signal again with `--restart-killed`, and stops every node on
//! SIGTERM / SIGINT.
//!
//! Invariants:
//! - a node's process runs with exactly the configuration computed for it,
//!   explicitly configured keys included: the generated file holds the
//!   explicit keys only, and it is parsed back and compared before the node
//!   starts;
//! - no node outlives the supervisor: shutdown sends SIGTERM to each node
//!   (its controlled shutdown) and SIGKILLs one that has not exited within
//!   [`STOP_TIMEOUT`]; if the supervisor itself is killed, the kernel kills
//!   the nodes (`PR_SET_PDEATHSIG`);
//! - `ready` is printed once, and only when every node's Metadata answer has
//!   listed all N brokers;
//! - when every node has stopped on its own (none left to supervise) the
//!   supervisor exits with a failure; after a shutdown it exits successfully
//!   iff every node still running then stopped cleanly.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use samsa_broker::BrokerConfig;
use samsa_tools::signals;
use samsa_tools::wire::ClusterClient;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config;

/// The configuration file of a node, in its data directory.
pub const CONFIG_FILE: &str = "samsa-dev.toml";
/// The log file of a node (its stdout and stderr), in its data directory.
pub const LOG_FILE: &str = "samsa.log";
/// How long a node may take to stop after SIGTERM before it is SIGKILLed.
/// A controlled shutdown hands leaderships back within seconds; this bounds
/// a node stuck on a disk or on a controller that no longer answers.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two Metadata polls of a node that is not serving yet.
const READY_POLL: Duration = Duration::from_millis(50);
/// How long one Metadata poll may take. A node that is not unfenced yet has
/// its port open but does not accept: the poll waits rather than failing.
const READY_POLL_TIMEOUT: Duration = Duration::from_secs(2);

/// One node of the cluster: its configuration and where its files are.
struct Node {
    id: i32,
    cfg: BrokerConfig,
    config_path: PathBuf,
    log_path: PathBuf,
}

/// How a node's process ended.
enum Ending {
    /// It exited (or was killed) on its own.
    Died(std::io::Result<ExitStatus>),
    /// It was asked to stop; `forced` if it had to be SIGKILLed.
    Stopped {
        status: std::io::Result<ExitStatus>,
        forced: bool,
    },
}

/// What a supervising task returns: the node's index, its pid, how it ended.
type Exit = (usize, u32, Ending);

/// `samsa dev --nodes N`: starts one process per configuration and
/// supervises them until SIGTERM / SIGINT or until none is left.
pub async fn run_cluster(configs: Vec<BrokerConfig>, restart_killed: bool) -> Result<ExitCode> {
    for cfg in &configs {
        for addr in [cfg.listen, cfg.controller_listen, cfg.http_listen] {
            drop(TcpListener::bind(addr).map_err(|err| {
                anyhow!(
                    "cannot listen on {addr}: {err} (is another samsa or Kafka running? \
                     try --port / --controller-port / --http-port)"
                )
            })?);
        }
    }
    let nodes = configs
        .into_iter()
        .map(prepare_node)
        .collect::<Result<Vec<_>>>()?;
    let exe = std::env::current_exe().context("cannot find the samsa binary to run the nodes")?;
    let shutdown = signals::shutdown_signal()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut running: JoinSet<Exit> = JoinSet::new();

    let mut pids = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        match start_node(&exe, node, index, &stop_rx, &mut running) {
            Ok(pid) => pids.push(pid),
            Err(err) => {
                let _ = stop_tx.send(true);
                while running.join_next().await.is_some() {}
                return Err(err);
            }
        }
    }
    println!("{}", cluster_banner(&nodes, &pids));
    let ready = tokio::spawn(announce_ready(
        nodes.iter().map(|n| (n.id, advertised(&n.cfg))).collect(),
    ));

    let mut shutdown = std::pin::pin!(shutdown);
    let mut stopping = false;
    let mut clean = true;
    loop {
        let joined = tokio::select! {
            () = &mut shutdown, if !stopping => {
                stopping = true;
                ready.abort();
                eprintln!("stopping {} node(s)", running.len());
                let _ = stop_tx.send(true);
                continue;
            }
            joined = running.join_next() => joined,
        };
        let (index, pid, ending) = match joined {
            None => break,
            Some(Ok(exit)) => exit,
            Some(Err(err)) => {
                eprintln!("a node's supervising task failed: {err}");
                clean = false;
                continue;
            }
        };
        let node = &nodes[index];
        match ending {
            Ending::Stopped { status, forced } => {
                if forced || !matches!(&status, Ok(s) if s.success()) {
                    eprintln!("{}", death_report(node, pid, &status));
                    clean = false;
                }
            }
            Ending::Died(status) => {
                eprintln!("{}", death_report(node, pid, &status));
                let killed = matches!(&status, Ok(s) if s.signal().is_some());
                if killed && restart_killed && !stopping {
                    match start_node(&exe, node, index, &stop_rx, &mut running) {
                        Ok(pid) => eprintln!("restarted node {} (pid {pid})", node.id),
                        Err(err) => eprintln!("cannot restart node {}: {err:#}", node.id),
                    }
                }
                // Ended by itself while the others were being stopped.
                if stopping && !matches!(&status, Ok(s) if s.success()) {
                    clean = false;
                }
            }
        }
        if running.is_empty() && !stopping {
            ready.abort();
            bail!("every node has stopped (their logs: <data dir>/node-<id>/{LOG_FILE})");
        }
    }
    if clean {
        tracing::info!("samsa dev cluster stopped cleanly");
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("not every node stopped cleanly (see above)")
    }
}

/// Prints `ready` on stdout once each node's Metadata lists every one of
/// `nodes` (id, advertised `host:port`). Each node is polled on its own.
pub async fn announce_ready(nodes: Vec<(i32, String)>) {
    let all: BTreeSet<i32> = nodes.iter().map(|(id, _)| *id).collect();
    let mut polls = JoinSet::new();
    for (_, addr) in nodes {
        let all = all.clone();
        polls.spawn(async move {
            while !lists_brokers(&addr, &all).await {
                tokio::time::sleep(READY_POLL).await;
            }
        });
    }
    while polls.join_next().await.is_some() {}
    println!("ready");
}

/// Whether the broker at `addr` answers Metadata with exactly the brokers `all`.
async fn lists_brokers(addr: &str, all: &BTreeSet<i32>) -> bool {
    match tokio::time::timeout(READY_POLL_TIMEOUT, ClusterClient::connect(addr)).await {
        Ok(Ok(cluster)) => cluster.brokers.keys().eq(all.iter()),
        _ => false,
    }
}

fn advertised(cfg: &BrokerConfig) -> String {
    let (host, port) = cfg.advertised_host_port();
    format!("{host}:{port}")
}

/// Creates the node's data directory and writes its configuration file.
fn prepare_node(cfg: BrokerConfig) -> Result<Node> {
    let dir = cfg.data_dir.clone();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    let config_path = dir.join(CONFIG_FILE);
    let text = config_file_text(&cfg)
        .with_context(|| format!("cannot write node {}'s configuration", cfg.node_id))?;
    std::fs::write(&config_path, text)
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    Ok(Node {
        id: cfg.node_id,
        log_path: dir.join(LOG_FILE),
        config_path,
        cfg,
    })
}

/// The node's configuration file: the explicitly configured keys and their
/// values, nothing else, so that `samsa server --config` reading it builds
/// the same configuration with the same explicit keys (what DescribeConfigs
/// reports as configured). Checked by parsing it back.
fn config_file_text(cfg: &BrokerConfig) -> Result<String> {
    let full = toml::Value::try_from(cfg).context("cannot represent it as TOML")?;
    let mut explicit = toml::Value::Table(toml::Table::new());
    for key in &cfg.explicit_keys {
        let path: Vec<&str> = key.split('.').collect();
        if let Some(value) = config::lookup(&full, &path) {
            config::set_path(&mut explicit, &path, value.clone());
        }
    }
    let body = toml::to_string_pretty(&explicit).context("cannot print it as TOML")?;
    let back = config::parse_toml(&body).map_err(|msg| anyhow!("it does not read back: {msg}"))?;
    let back_full = toml::Value::try_from(&back).context("cannot represent it as TOML")?;
    if back_full != full || back.explicit_keys != cfg.explicit_keys {
        bail!(
            "its settings do not survive a round trip through a file (explicit keys {:?})",
            cfg.explicit_keys
        );
    }
    Ok(format!(
        "# Node {}'s settings, written by `samsa dev` at each start (the addresses and\n\
         # data directory it fills in, its presets and the --set overrides).\n{body}",
        cfg.node_id
    ))
}

/// Spawns the node's process and the task that waits for it; returns its pid.
fn start_node(
    exe: &Path,
    node: &Node,
    index: usize,
    stop: &watch::Receiver<bool>,
    running: &mut JoinSet<Exit>,
) -> Result<u32> {
    let mut log = File::options()
        .create(true)
        .append(true)
        .open(&node.log_path)
        .with_context(|| format!("cannot open {}", node.log_path.display()))?;
    writeln!(log, "===== samsa dev starts node {} =====", node.id)
        .with_context(|| format!("cannot write {}", node.log_path.display()))?;
    let stderr = log
        .try_clone()
        .with_context(|| format!("cannot open {}", node.log_path.display()))?;
    let mut cmd = Command::new(exe);
    cmd.arg("server")
        .arg("--config")
        .arg(&node.config_path)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr)
        // Its own process group: Ctrl-C in the terminal reaches the
        // supervisor only, which then stops each node once (a second
        // signal would make a node exit without its controlled shutdown).
        .process_group(0)
        // Error paths that drop the child must not leave it running.
        .kill_on_drop(true);
    die_with_supervisor(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start node {} ({})", node.id, exe.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| anyhow!("node {} exited before its pid was read", node.id))?;
    let id = node.id;
    let stop = stop.clone();
    running.spawn(async move { (index, pid, supervise(child, id, pid, stop).await) });
    Ok(pid)
}

/// Waits for the child to exit, or for `stop`: then SIGTERM, and SIGKILL
/// after [`STOP_TIMEOUT`]. The child is owned here until it is reaped, so a
/// signal never reaches a reused pid.
async fn supervise(mut child: Child, id: i32, pid: u32, mut stop: watch::Receiver<bool>) -> Ending {
    tokio::select! {
        status = child.wait() => return Ending::Died(status),
        _ = stop.wait_for(|stop| *stop) => {}
    }
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
        Ok(status) => Ending::Stopped {
            status,
            forced: false,
        },
        Err(_) => {
            eprintln!(
                "node {id} (pid {pid}) did not stop within {}s of SIGTERM: killing it (SIGKILL)",
                STOP_TIMEOUT.as_secs()
            );
            let _ = child.start_kill();
            Ending::Stopped {
                status: child.wait().await,
                forced: true,
            }
        }
    }
}

/// The line that says how a node's process ended.
fn death_report(node: &Node, pid: u32, status: &std::io::Result<ExitStatus>) -> String {
    let log = std::path::absolute(&node.log_path).unwrap_or_else(|_| node.log_path.clone());
    let id = node.id;
    match status {
        Ok(s) => match (s.signal(), s.code()) {
            (Some(sig), _) => {
                let name = nix::sys::signal::Signal::try_from(sig)
                    .map(|s| format!(" ({s})"))
                    .unwrap_or_default();
                format!("node {id} (pid {pid}) was killed by signal {sig}{name}")
            }
            (None, Some(0)) => format!("node {id} (pid {pid}) exited with status 0"),
            (None, Some(code)) => format!(
                "node {id} (pid {pid}) exited with status {code}; its log: {}",
                log.display()
            ),
            (None, None) => format!("node {id} (pid {pid}) ended with {s}"),
        },
        Err(err) => format!("cannot wait for node {id} (pid {pid}): {err}"),
    }
}

/// Makes the kernel SIGKILL the child when the thread that spawned it ends
/// (`PR_SET_PDEATHSIG`), so that a supervisor killed with SIGKILL leaves no
/// node behind. Every node is spawned by [`run_cluster`], which runs on the
/// thread that called `block_on` (the main thread), so the signal comes
/// only when the process ends, never when some worker thread exits.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_supervisor(cmd: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two system calls (prctl, getppid), which are async-signal-safe;
    // it allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The supervisor may have died before the prctl: then no
            // signal will come, so do not start at all.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_supervisor(_cmd: &mut Command) {}

fn cluster_banner(nodes: &[Node], pids: &[u32]) -> String {
    let mut rows = String::new();
    for (node, pid) in nodes.iter().zip(pids) {
        let cfg = &node.cfg;
        let data_dir = std::path::absolute(&cfg.data_dir).unwrap_or_else(|_| cfg.data_dir.clone());
        rows.push_str(&format!(
            "  {:<5} {:<8} {:<17} {:<17} {:<17} {}\n",
            cfg.node_id,
            pid,
            advertised(cfg),
            cfg.controller_listen,
            cfg.http_listen,
            data_dir.display()
        ));
    }
    let bootstrap = nodes
        .iter()
        .map(|n| advertised(&n.cfg))
        .collect::<Vec<_>>()
        .join(",");
    let controllers = nodes
        .iter()
        .map(|n| n.cfg.controller_listen.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let default_controllers = "127.0.0.1:9093,127.0.0.1:9193,127.0.0.1:9293";
    let status_flags = if controllers == default_controllers {
        String::new()
    } else {
        format!(" --controller {controllers}")
    };
    format!(
        "\
samsa {version} - development cluster ({n} nodes, each a controller and a broker process)

  Node  PID      Kafka             Controller        HTTP (/metrics)   Data directory
{rows}
  Bootstrap       {bootstrap}
  Node logs       <data directory>/{LOG_FILE}

  Create a topic  samsa topic create demo --partitions 3 -b {bootstrap}
  Produce         seq 10 | samsa produce demo -b {bootstrap}
  Consume         samsa consume demo --from-beginning --print-offsets -b {bootstrap}
  Cluster status  samsa cluster status{status_flags}
  Transactions    samsa txn list -b {bootstrap}

  A node killed (kill -9 <PID>) stays down; with --restart-killed it is started again.
  Press Ctrl-C to stop all nodes (data is kept in the data directories).
  `ready` follows once every node lists all {n} brokers.
",
        version = env!("CARGO_PKG_VERSION"),
        n = nodes.len(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn node(cfg: BrokerConfig) -> Node {
        Node {
            id: cfg.node_id,
            config_path: cfg.data_dir.join(CONFIG_FILE),
            log_path: cfg.data_dir.join(LOG_FILE),
            cfg,
        }
    }

    fn three_nodes(sets: &[&str]) -> Vec<BrokerConfig> {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            dev: crate::server::DevArgs,
        }
        let mut argv = vec!["dev", "--nodes", "3", "--data-dir", "/tmp/d"];
        for set in sets {
            argv.extend(["--set", set]);
        }
        let cli = <Cli as clap::Parser>::parse_from(argv);
        crate::server::dev_cluster_configs(&cli.dev).unwrap()
    }

    #[test]
    fn config_file_round_trips_values_and_explicit_keys() {
        let configs = three_nodes(&[
            "broker_session_timeout_ms=3000",
            "log.segment_bytes=1048576",
            "log.flush.interval.interval_ms=500",
            "group_initial_rebalance_delay_ms=100",
        ]);
        for cfg in &configs {
            let text = config_file_text(cfg).unwrap();
            let back = config::parse_toml(&text).unwrap();
            assert_eq!(
                toml::Value::try_from(&back).unwrap(),
                toml::Value::try_from(cfg).unwrap()
            );
            assert_eq!(back.explicit_keys, cfg.explicit_keys);
            assert!(back.is_explicit("controller_quorum_voters"));
            assert!(back.is_explicit("log.flush"));
            assert!(!back.is_explicit("num_partitions"));
            assert!(!text.contains("num_partitions"), "{text}");
            assert_eq!(back.group_initial_rebalance_delay_ms, 100);
        }
    }

    #[test]
    fn banner_lists_pids_and_bootstrap() {
        let nodes: Vec<Node> = three_nodes(&[]).into_iter().map(node).collect();
        let text = cluster_banner(&nodes, &[101, 202, 303]);
        assert!(
            text.contains("127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292"),
            "{text}"
        );
        assert!(text.contains("samsa cluster status\n"), "{text}");
        assert!(text.contains("  2     202      127.0.0.1:9192"), "{text}");
    }

    #[test]
    fn death_reports() {
        let n = node(three_nodes(&[]).remove(1));
        let killed = ExitStatus::from_raw(9);
        assert_eq!(
            death_report(&n, 1234, &Ok(killed)),
            "node 2 (pid 1234) was killed by signal 9 (SIGKILL)"
        );
        let failed = ExitStatus::from_raw(1 << 8);
        assert_eq!(
            death_report(&n, 1234, &Ok(failed)),
            "node 2 (pid 1234) exited with status 1; its log: /tmp/d/node-2/samsa.log"
        );
    }
}
