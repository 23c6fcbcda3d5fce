//! Running a schedule ([`crate::schedule`]) against a cluster: each step
//! waits for its time, resolves its target ([`Roles`]), injects the fault
//! ([`Nemesis`]), waits its length and heals it; every start and end is
//! printed, every healed fault logged. Whatever happens, everything is
//! healed before [`run_schedule`] returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::compose::{ActiveFault, Nemesis};
use crate::error::NemesisError;
use crate::log::FaultRecord;
use crate::roles::Roles;
use crate::schedule::{FaultKind, Step, Target};

/// What a run did.
#[derive(Debug, Default)]
pub struct RunOutcome {
    pub healed: Vec<FaultRecord>,
    /// Steps not run, with why (a role nobody held, a node not running, …).
    pub skipped: Vec<String>,
    /// True if the stop flag ended the run early.
    pub stopped: bool,
}

/// Sleeps until `until` or until `stop` is set; false if stopped.
fn sleep_until(until: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= until {
            return true;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(100)));
    }
}

/// The node ids a step's target names now.
fn resolve(step: &Step, roles: &mut dyn Roles) -> Result<Vec<u32>, NemesisError> {
    match &step.target {
        Target::Nodes(ids) => Ok(ids.clone()),
        Target::PartitionLeader => roles
            .partition_leader()
            .map(|n| vec![n])
            .ok_or(NemesisError::RoleUnknown("partition leader")),
        Target::Controller => roles
            .controller()
            .map(|n| vec![n])
            .ok_or(NemesisError::RoleUnknown("active controller")),
    }
}

/// Injects the fault of `kind` on `nodes` (as [`Target::Nodes`] documents them).
pub fn inject(
    nemesis: &mut Nemesis,
    kind: FaultKind,
    nodes: &[u32],
    strength: u32,
) -> Result<ActiveFault, NemesisError> {
    let first = *nodes
        .first()
        .ok_or(NemesisError::RoleUnknown("target node"))?;
    match kind {
        FaultKind::Kill => nemesis.kill(first),
        FaultKind::Pause => nemesis.pause(first),
        FaultKind::PartitionLeader | FaultKind::PartitionController => nemesis.isolate(kind, first),
        FaultKind::PartitionMajority => {
            let rest: Vec<u32> = nemesis
                .project
                .node_ids()
                .filter(|n| !nodes.contains(n))
                .collect();
            let detail = format!("minority {nodes:?} cut off from majority {rest:?}");
            nemesis.split(kind, nodes, &rest, detail)
        }
        FaultKind::PartitionBridge => nemesis.bridge(first),
        FaultKind::PartitionOneWay => {
            let sender = *nodes
                .get(1)
                .ok_or(NemesisError::RoleUnknown("sender node"))?;
            nemesis.one_way(first, sender)
        }
        FaultKind::Delay => nemesis.delay(first, strength.max(1)),
        FaultKind::Loss => nemesis.loss(first, strength),
        FaultKind::DiskFull => nemesis.disk_full(first),
    }
}

/// Runs `steps` from now; see the module docs. `stop` ends it early (Ctrl-C).
pub fn run_schedule(
    nemesis: &mut Nemesis,
    roles: &mut dyn Roles,
    steps: &[Step],
    stop: &AtomicBool,
    mut say: impl FnMut(&str),
) -> Result<RunOutcome, NemesisError> {
    let start = Instant::now();
    let mut out = RunOutcome::default();
    for step in steps {
        if !sleep_until(start + step.at, stop) {
            out.stopped = true;
            break;
        }
        let nodes = match resolve(step, roles) {
            Ok(n) => n,
            Err(e) => {
                let why = format!("{step}: skipped: {e}");
                say(&why);
                out.skipped.push(why);
                continue;
            }
        };
        let fault = match inject(nemesis, step.kind, &nodes, step.strength) {
            Ok(f) => f,
            Err(e) => {
                let why = format!("{step}: skipped: {e}");
                say(&why);
                out.skipped.push(why);
                // Half-made faults must not linger into the next step.
                nemesis.heal_all()?;
                continue;
            }
        };
        say(&format!(
            "+{:>6.1}s start {} on {:?}: {}",
            start.elapsed().as_secs_f64(),
            fault.kind,
            fault.targets,
            fault.detail
        ));
        let completed = sleep_until(Instant::now() + step.length, stop);
        let record = nemesis.heal(fault)?;
        say(&format!(
            "+{:>6.1}s healed {} on {:?} after {} ms",
            start.elapsed().as_secs_f64(),
            record.fault,
            record.targets,
            record.end_ms - record.start_ms
        ));
        out.healed.push(record);
        if !completed {
            out.stopped = true;
            break;
        }
    }
    nemesis.heal_all()?;
    Ok(out)
}
