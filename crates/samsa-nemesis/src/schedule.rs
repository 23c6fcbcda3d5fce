//! The fault schedule: a pure function of a seed and the schedule's
//! parameters ([`generate`]). Nothing here touches a cluster; the same seed
//! with the same parameters gives the same steps on every machine (rand's
//! `StdRng` of one rand version), which is what makes a run replayable.
//!
//! Invariants: steps are ordered by `at`, never overlap (a fault is healed
//! before the next one starts), all fit in the duration, and when the
//! duration allows it every requested kind occurs at least once (the first
//! round is a shuffled list of all kinds, later ones are drawn at random).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::error::NemesisError;

/// One kind of fault; [`FaultKind::name`] is its name in the fault log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the container (`docker kill`), started again at heal.
    Kill,
    /// SIGSTOP of every process of the container (`docker pause`).
    Pause,
    /// The leader of a chosen topic partition cut off from the other nodes;
    /// clients on the host still reach it.
    PartitionLeader,
    /// The active controller (Raft leader of the metadata quorum) cut off.
    PartitionController,
    /// The nodes split into a minority and a majority.
    PartitionMajority,
    /// Two halves that cannot reach each other, and a bridge node that
    /// reaches both (with three nodes: A–B cut, C sees both).
    PartitionBridge,
    /// One node drops every packet from one other node; the other direction works.
    PartitionOneWay,
    /// A slow link: added latency on every packet a node sends.
    Delay,
    /// A lossy link: a share of the packets a node receives and sends dropped.
    Loss,
    /// The node's data directory's filesystem filled up.
    DiskFull,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::PartitionLeader,
        FaultKind::PartitionController,
        FaultKind::PartitionMajority,
        FaultKind::PartitionBridge,
        FaultKind::PartitionOneWay,
        FaultKind::Delay,
        FaultKind::Loss,
        FaultKind::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionController => "partition-controller",
            FaultKind::PartitionMajority => "partition-majority",
            FaultKind::PartitionBridge => "partition-bridge",
            FaultKind::PartitionOneWay => "partition-one-way",
            FaultKind::Delay => "delay",
            FaultKind::Loss => "loss",
            FaultKind::DiskFull => "disk-full",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FaultKind {
    type Err = NemesisError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| NemesisError::UnknownFault(s.to_string()))
    }
}

/// A comma-separated list of fault kinds; `all` (or an empty list) is every kind.
pub fn parse_kinds(s: &str) -> Result<Vec<FaultKind>, NemesisError> {
    let parts: Vec<&str> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() || parts == ["all"] {
        return Ok(FaultKind::ALL.to_vec());
    }
    let mut kinds = Vec::new();
    for p in parts {
        let k: FaultKind = p.parse()?;
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    Ok(kinds)
}

/// Parses `500ms`, `20s`, `3m`, `1h` (a number and a unit; a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, NemesisError> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| NemesisError::BadDuration(s.to_string()))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1_000),
        "m" | "min" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| NemesisError::BadDuration(s.to_string()))?;
    Ok(Duration::from_millis(ms))
}

/// Whom a step hits. Roles are resolved when the step runs (the leader
/// moves during a run); node ids are fixed by the schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Nodes by id. For `partition-majority` the minority; for
    /// `partition-bridge` the bridge; for `partition-one-way` `[receiver,
    /// sender]`: the receiver drops what the sender sends it.
    Nodes(Vec<u32>),
    /// The leader of the run's topic partition (`--topic`, `--partition`).
    PartitionLeader,
    /// The active controller.
    Controller,
}

/// One fault of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// From the start of the run.
    pub at: Duration,
    pub kind: FaultKind,
    pub target: Target,
    /// How long the fault lasts before it is healed.
    pub length: Duration,
    /// Strength of `delay` (milliseconds) and `loss` (percent); 0 otherwise.
    pub strength: u32,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Nodes(ids) => format!("nodes {ids:?}"),
            Target::PartitionLeader => "the partition leader".to_string(),
            Target::Controller => "the active controller".to_string(),
        };
        write!(
            f,
            "+{:>6.1}s {} on {target} for {:.1}s",
            self.at.as_secs_f64(),
            self.kind,
            self.length.as_secs_f64()
        )?;
        match self.kind {
            FaultKind::Delay => write!(f, " ({} ms)", self.strength),
            FaultKind::Loss => write!(f, " ({}%)", self.strength),
            _ => Ok(()),
        }
    }
}

/// What a schedule is made from (besides the seed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleParams {
    pub duration: Duration,
    pub kinds: Vec<FaultKind>,
    /// Mean pause between the heal of one fault and the start of the next.
    pub mean_interval: Duration,
    /// Mean length of a fault.
    pub mean_length: Duration,
    /// Node ids are `1..=nodes`.
    pub nodes: u32,
}

/// The steps of a run: see the module docs for the invariants.
pub fn generate(seed: u64, p: &ScheduleParams) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    if p.kinds.is_empty() || p.nodes == 0 {
        return steps;
    }
    let mut round: Vec<FaultKind> = Vec::new();
    let mut first_round = true;
    let mut cursor = Duration::ZERO;
    loop {
        if round.is_empty() {
            if first_round {
                round = p.kinds.clone();
                round.shuffle(&mut rng);
                round.reverse(); // popped from the back
                first_round = false;
            } else {
                round.push(p.kinds[rng.gen_range(0..p.kinds.len())]);
            }
        }
        let gap = jitter(&mut rng, p.mean_interval);
        let length = jitter(&mut rng, p.mean_length).max(Duration::from_millis(100));
        let at = cursor + gap;
        if at + length > p.duration {
            break;
        }
        let Some(kind) = round.pop() else { break };
        let (target, strength) = pick_target(&mut rng, kind, p.nodes);
        steps.push(Step {
            at,
            kind,
            target,
            length,
            strength,
        });
        cursor = at + length;
    }
    steps
}

/// Uniform in [mean / 2, 3 mean / 2].
fn jitter(rng: &mut StdRng, mean: Duration) -> Duration {
    let ms = u64::try_from(mean.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rng.gen_range(ms / 2..=ms.saturating_add(ms / 2)))
}

fn pick_target(rng: &mut StdRng, kind: FaultKind, nodes: u32) -> (Target, u32) {
    let any = |rng: &mut StdRng| rng.gen_range(1..=nodes);
    match kind {
        // A kill or pause aims at a role two times in three: faults of the
        // leader and the controller are the interesting ones.
        FaultKind::Kill | FaultKind::Pause => {
            let target = match rng.gen_range(0..3) {
                0 => Target::PartitionLeader,
                1 => Target::Controller,
                _ => Target::Nodes(vec![any(rng)]),
            };
            (target, 0)
        }
        FaultKind::PartitionLeader => (Target::PartitionLeader, 0),
        FaultKind::PartitionController => (Target::Controller, 0),
        FaultKind::PartitionMajority => {
            let mut ids: Vec<u32> = (1..=nodes).collect();
            ids.shuffle(rng);
            ids.truncate(usize::try_from((nodes - 1) / 2).unwrap_or(0).max(1));
            ids.sort_unstable();
            (Target::Nodes(ids), 0)
        }
        FaultKind::PartitionBridge => (Target::Nodes(vec![any(rng)]), 0),
        FaultKind::PartitionOneWay => {
            let receiver = any(rng);
            let mut sender = any(rng);
            if nodes > 1 {
                while sender == receiver {
                    sender = any(rng);
                }
            }
            (Target::Nodes(vec![receiver, sender]), 0)
        }
        FaultKind::Delay => (Target::Nodes(vec![any(rng)]), rng.gen_range(50..=200)),
        FaultKind::Loss => (Target::Nodes(vec![any(rng)]), rng.gen_range(10..=30)),
        FaultKind::DiskFull => (Target::Nodes(vec![any(rng)]), 0),
    }
}

/// One line saying what a schedule holds, for the fault log's header.
pub fn summary(seed: u64, p: &ScheduleParams, steps: &[Step]) -> String {
    let kinds: Vec<&str> = p.kinds.iter().map(|k| k.name()).collect();
    format!(
        "seed {seed}: {} faults in {} s (kinds {}; mean interval {} ms, mean length {} ms, {} nodes)",
        steps.len(),
        p.duration.as_secs(),
        kinds.join(","),
        p.mean_interval.as_millis(),
        p.mean_length.as_millis(),
        p.nodes
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn params() -> ScheduleParams {
        ScheduleParams {
            duration: Duration::from_secs(240),
            kinds: FaultKind::ALL.to_vec(),
            mean_interval: Duration::from_secs(6),
            mean_length: Duration::from_secs(10),
            nodes: 3,
        }
    }

    #[test]
    fn same_seed_same_schedule_other_seed_other_schedule() {
        let p = params();
        assert_eq!(generate(42, &p), generate(42, &p));
        assert_ne!(generate(42, &p), generate(43, &p));
        // A changed parameter changes the schedule too.
        let mut q = p.clone();
        q.mean_length = Duration::from_secs(11);
        assert_ne!(generate(42, &p), generate(42, &q));
    }

    #[test]
    fn steps_are_ordered_apart_within_the_duration_and_cover_every_kind() {
        let p = params();
        for seed in 0..200 {
            let steps = generate(seed, &p);
            let mut end = Duration::ZERO;
            for s in &steps {
                assert!(s.at >= end, "seed {seed}: {s} overlaps the step before");
                end = s.at + s.length;
                assert!(end <= p.duration, "seed {seed}: {s} ends after the run");
                if let Target::Nodes(ids) = &s.target {
                    assert!(!ids.is_empty() && ids.iter().all(|id| (1..=3).contains(id)));
                }
            }
            for k in FaultKind::ALL {
                assert!(
                    steps.iter().any(|s| s.kind == k),
                    "seed {seed}: no {k} in {steps:#?}"
                );
            }
        }
    }

    #[test]
    fn one_way_has_two_different_nodes_and_majority_a_minority() {
        for seed in 0..100 {
            for s in generate(seed, &params()) {
                match (s.kind, &s.target) {
                    (FaultKind::PartitionOneWay, Target::Nodes(ids)) => {
                        assert_eq!(ids.len(), 2);
                        assert_ne!(ids[0], ids[1]);
                    }
                    (FaultKind::PartitionMajority, Target::Nodes(ids)) => assert_eq!(ids.len(), 1),
                    (FaultKind::Loss, _) => assert!((10..=30).contains(&s.strength)),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_short_run_holds_fewer_steps_and_nothing_is_empty_input() {
        let mut p = params();
        p.duration = Duration::from_secs(5);
        assert!(generate(1, &p).is_empty());
        p.kinds.clear();
        p.duration = Duration::from_secs(600);
        assert!(generate(1, &p).is_empty());
    }

    #[test]
    fn kinds_and_durations_parse() {
        assert_eq!(parse_kinds("all").unwrap().len(), 10);
        assert_eq!(
            parse_kinds("kill, pause,kill").unwrap(),
            vec![FaultKind::Kill, FaultKind::Pause]
        );
        assert!(matches!(
            parse_kinds("kill,nuke"),
            Err(NemesisError::UnknownFault(s)) if s == "nuke"
        ));
        for k in FaultKind::ALL {
            assert_eq!(k.name().parse::<FaultKind>().unwrap(), k);
        }
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert!(parse_duration("3 weeks").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("99999999999999999999h").is_err());
    }
}
