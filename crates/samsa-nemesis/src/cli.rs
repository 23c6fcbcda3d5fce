//! `samsa nemesis`: the nemesis for users of `deploy/compose.yaml`
//! (docs/RELIABILITY.md, "The nemesis"): `run` a seeded schedule, inject one
//! fault (`kill`, `pause`, `isolate`, `split`, `bridge`, `one-way`, `delay`,
//! `loss`, `disk-full`; for `--for D`, or until `heal`), or `heal` the
//! project. Needs root and docker, nsenter, iptables and tc on the host.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::compose::{ComposeProject, Nemesis};
use crate::log::FaultLog;
use crate::roles::{KafkaRoles, Roles};
use crate::run::{inject, run_schedule};
use crate::schedule::{self, FaultKind, ScheduleParams};

#[derive(Debug, Subcommand)]
pub enum NemesisCommand {
    /// Run a random schedule of faults from a seed (printed; replay with --seed).
    Run(RunArgs),
    /// SIGKILL a node's container (heal: docker start).
    Kill(OneShot),
    /// Pause a node's container (SIGSTOP of every process).
    Pause(OneShot),
    /// Cut a node off from the other nodes (clients on the host still reach it).
    Isolate(OneShot),
    /// Cut the given nodes (the minority) off from the rest.
    Split(SplitArgs),
    /// Two halves cut apart, the node given reaching both (three nodes: the other two cut).
    Bridge(OneShot),
    /// The node drops every packet from --from; the other direction works.
    OneWay(OneWayArgs),
    /// Slow a node's link (tc netem delay; a rate limit if the kernel lacks netem).
    Delay(DelayArgs),
    /// Drop a share of a node's packets at random.
    Loss(LossArgs),
    /// Fill the filesystem of a node's data directory (it must be small).
    DiskFull(OneShot),
    /// Undo every fault the nemesis can make on the project (idempotent).
    Heal(ProjectArgs),
}

#[derive(Debug, Args)]
pub struct ProjectArgs {
    /// The compose project (`docker compose -p`; default: the directory name of the compose file, e.g. `deploy`).
    #[arg(long, short = 'p', default_value = "deploy")]
    pub project: String,
    /// Nodes samsa-0 … samsa-(N-1), node ids 1..=N.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
}

#[derive(Debug, Args)]
pub struct OneShot {
    #[command(flatten)]
    pub project: ProjectArgs,
    /// The node id (samsa-0 is node 1).
    #[arg(long)]
    pub node: u32,
    /// Heal after this long (`30s`); without it the fault stays until `samsa nemesis heal`.
    #[arg(long = "for", value_parser = parse_duration)]
    pub length: Option<Duration>,
    /// Append the healed fault to this fault log (JSON Lines; with --for).
    #[arg(long)]
    pub log: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SplitArgs {
    #[command(flatten)]
    pub shot: OneShotNodes,
}

#[derive(Debug, Args)]
pub struct OneShotNodes {
    #[command(flatten)]
    pub project: ProjectArgs,
    /// The minority's node ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub nodes_cut: Vec<u32>,
    #[arg(long = "for", value_parser = parse_duration)]
    pub length: Option<Duration>,
    #[arg(long)]
    pub log: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct OneWayArgs {
    #[command(flatten)]
    pub shot: OneShot,
    /// The node whose packets `--node` drops.
    #[arg(long)]
    pub from: u32,
}

#[derive(Debug, Args)]
pub struct DelayArgs {
    #[command(flatten)]
    pub shot: OneShot,
    /// Added latency in ms (± half of it).
    #[arg(long, default_value_t = 100)]
    pub ms: u32,
}

#[derive(Debug, Args)]
pub struct LossArgs {
    #[command(flatten)]
    pub shot: OneShot,
    #[arg(long, default_value_t = 20)]
    pub percent: u32,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub project: ProjectArgs,
    /// The schedule's seed; random if not given (always printed).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, default_value = "3m", value_parser = parse_duration)]
    pub duration: Duration,
    /// Fault kinds, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Mean pause between one fault's heal and the next fault.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Mean length of a fault.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub fault_length: Duration,
    /// The topic whose partition leader `partition-leader` (and role-aimed kills) hit.
    #[arg(long)]
    pub topic: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub partition: i32,
    /// Write the fault log (JSON Lines) here.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Print the schedule and exit.
    #[arg(long)]
    pub dry_run: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    schedule::parse_duration(s).map_err(|e| e.to_string())
}

pub async fn run(command: NemesisCommand) -> Result<ExitCode> {
    match command {
        NemesisCommand::Run(args) => run_command(args).await,
        NemesisCommand::Heal(p) => {
            blocking(move || {
                let mut n = Nemesis::new(ComposeProject::new(&p.project, p.nodes), None);
                n.keep_faults_on_drop();
                n.heal_all()?;
                println!("healed every node of {}", p.project);
                Ok(ExitCode::SUCCESS)
            })
            .await
        }
        NemesisCommand::Kill(s) => one_shot(s, FaultKind::Kill, Vec::new(), 0).await,
        NemesisCommand::Pause(s) => one_shot(s, FaultKind::Pause, Vec::new(), 0).await,
        NemesisCommand::Isolate(s) => one_shot(s, FaultKind::PartitionLeader, Vec::new(), 0).await,
        NemesisCommand::Bridge(s) => one_shot(s, FaultKind::PartitionBridge, Vec::new(), 0).await,
        NemesisCommand::DiskFull(s) => one_shot(s, FaultKind::DiskFull, Vec::new(), 0).await,
        NemesisCommand::OneWay(a) => {
            one_shot(a.shot, FaultKind::PartitionOneWay, vec![a.from], 0).await
        }
        NemesisCommand::Delay(a) => one_shot(a.shot, FaultKind::Delay, Vec::new(), a.ms).await,
        NemesisCommand::Loss(a) => one_shot(a.shot, FaultKind::Loss, Vec::new(), a.percent).await,
        NemesisCommand::Split(a) => {
            let first = a.shot.nodes_cut.first().copied().unwrap_or(0);
            let shot = OneShot {
                project: a.shot.project,
                node: first,
                length: a.shot.length,
                log: a.shot.log,
            };
            one_shot(shot, FaultKind::PartitionMajority, a.shot.nodes_cut, 0).await
        }
    }
}

async fn blocking<F>(job: F) -> Result<ExitCode>
where
    F: FnOnce() -> Result<ExitCode> + Send + 'static,
{
    tokio::task::spawn_blocking(job)
        .await
        .context("the nemesis thread panicked")?
}

/// One fault: for `--for`, then healed; else left in place.
async fn one_shot(s: OneShot, kind: FaultKind, extra: Vec<u32>, strength: u32) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let signal = samsa_tools::signals::shutdown_signal()?;
    let flag = Arc::clone(&stop);
    tokio::spawn(async move {
        signal.await;
        flag.store(true, Ordering::Relaxed);
    });
    blocking(move || {
        let log = s.log.as_deref().map(FaultLog::create).transpose()?;
        let mut n = Nemesis::new(
            ComposeProject::new(&s.project.project, s.project.nodes),
            log,
        );
        // A failed injection undoes its own part; the one fault made here
        // is healed below (or left on purpose), never everything on exit.
        n.keep_faults_on_drop();
        // Split lists the minority itself; one-way adds the sender.
        let nodes: Vec<u32> = if kind == FaultKind::PartitionMajority {
            extra
        } else {
            std::iter::once(s.node).chain(extra).collect()
        };
        let fault = inject(&mut n, kind, &nodes, strength)?;
        println!(
            "start {} on {:?}: {}",
            fault.kind, fault.targets, fault.detail
        );
        let Some(length) = s.length else {
            println!(
                "left in place: undo with `samsa nemesis heal --project {}`",
                s.project.project
            );
            return Ok(ExitCode::SUCCESS);
        };
        let until = Instant::now() + length;
        while Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let r = n.heal(fault)?;
        println!("healed {} after {} ms", r.fault, r.end_ms - r.start_ms);
        Ok(ExitCode::SUCCESS)
    })
    .await
}

async fn run_command(args: RunArgs) -> Result<ExitCode> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let params = ScheduleParams {
        duration: args.duration,
        kinds: schedule::parse_kinds(&args.faults)?,
        mean_interval: args.interval,
        mean_length: args.fault_length,
        nodes: args.project.nodes,
    };
    let steps = schedule::generate(seed, &params);
    let summary = schedule::summary(seed, &params, &steps);
    println!("nemesis {summary}");
    for s in &steps {
        println!("  {s}");
    }
    if args.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let signal = samsa_tools::signals::shutdown_signal()?;
    let flag = Arc::clone(&stop);
    tokio::spawn(async move {
        signal.await;
        eprintln!("nemesis: stopping; healing every fault");
        flag.store(true, Ordering::Relaxed);
    });
    let handle = tokio::runtime::Handle::current();
    blocking(move || {
        let mut log = args.log.as_deref().map(FaultLog::create).transpose()?;
        if let Some(l) = &mut log {
            l.header(seed, &summary)?;
        }
        let project = ComposeProject::new(&args.project.project, args.project.nodes);
        let bootstrap = project
            .node_ids()
            .filter_map(|n| project.ip(n).ok().map(|ip| format!("{ip}:9092")))
            .collect();
        let mut roles = KafkaRoles {
            bootstrap,
            topic: args.topic.clone().unwrap_or_default(),
            partition: args.partition,
            handle,
        };
        let mut roles_ref: Box<dyn Roles> = if args.topic.is_some() {
            Box::new(roles)
        } else {
            // Without a topic only the controller role can be resolved.
            roles.topic = String::new();
            Box::new(NoTopic(roles))
        };
        let mut n = Nemesis::new(project, log);
        let out = run_schedule(&mut n, roles_ref.as_mut(), &steps, &stop, |line| {
            println!("{line}")
        })?;
        println!(
            "nemesis seed {seed}: {} faults healed, {} skipped{}",
            out.healed.len(),
            out.skipped.len(),
            if out.stopped { " (stopped early)" } else { "" }
        );
        Ok(ExitCode::SUCCESS)
    })
    .await
}

/// Roles without `--topic`: no partition leader to aim at.
struct NoTopic(KafkaRoles);

impl Roles for NoTopic {
    fn partition_leader(&mut self) -> Option<u32> {
        None
    }
    fn controller(&mut self) -> Option<u32> {
        self.0.controller()
    }
}
