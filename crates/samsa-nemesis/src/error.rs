//! What can go wrong injecting or healing a fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NemesisError {
    #[error("unknown fault kind {0:?} (kinds: kill, pause, partition-leader, partition-controller, partition-majority, partition-bridge, partition-one-way, delay, loss, disk-full)")]
    UnknownFault(String),
    #[error("bad duration {0:?} (a number and ms, s, m or h: 500ms, 20s, 3m)")]
    BadDuration(String),
    #[error("cannot run {program}: {source} (the nemesis needs docker, nsenter, iptables and tc on the host, and root)")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {output}")]
    Command { command: String, output: String },
    #[error("compose project {project} has no container for service {service}")]
    NoContainer { project: String, service: String },
    #[error("node {0} is not running (no process to enter the network namespace of)")]
    NotRunning(u32),
    #[error("node {node} is not a node of this cluster (1..={nodes})")]
    NoSuchNode { node: u32, nodes: u32 },
    #[error("could not find the {0} (no node answered)")]
    RoleUnknown(&'static str),
    #[error("node {0} has no data directory mounted at /var/lib/samsa")]
    NoDataDir(u32),
    #[error("{path}: the filesystem holds {size_mib} MiB, more than the {max_mib} MiB the nemesis fills (put the node's data directory on a small filesystem; docs/RELIABILITY.md)")]
    FilesystemTooLarge {
        path: PathBuf,
        size_mib: u64,
        max_mib: u64,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the fault log: {0}")]
    Log(std::io::Error),
}
