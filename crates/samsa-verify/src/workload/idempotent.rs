//! The idempotent workload: a few idempotent producers (acks=all) writing
//! unique values round-robin over the partitions of one topic. Each value
//! is recorded when sent and when acknowledged (partition, offset) or
//! failed; the checker then looks for it in the final read.

use anyhow::Result;

use super::{produce_round_robin, Env};
use crate::history::Workload;

/// How many producers the workload runs.
pub const PRODUCERS: usize = 2;

/// Runs one producer of the workload until producing stops; then waits
/// for its outstanding acknowledgements.
pub fn run_producer(env: &Env, topic: &str, index: usize) -> Result<()> {
    let name = format!("idempotent-p{index}");
    produce_round_robin(
        env,
        Workload::Idempotent,
        &name,
        topic,
        env.rate / PRODUCERS as f64,
    )
}
