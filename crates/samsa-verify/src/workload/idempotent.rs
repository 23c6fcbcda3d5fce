//! The idempotent workload: a few idempotent producers (acks=all) writing
//! unique values round-robin over the partitions of one topic. Each value
//! is recorded when sent and when acknowledged (partition, offset) or
//! failed; the checker then looks for it in the final read.

use anyhow::{Context, Result};
use rdkafka::producer::Producer;

use super::{producer_settings, recording_producer, send, Env, Pacer, Pending, MESSAGE_TIMEOUT};
use crate::history::Workload;

/// How many producers the workload runs.
pub const PRODUCERS: usize = 2;

/// Runs one producer of the workload until producing stops; then waits
/// for its outstanding acknowledgements.
pub fn run_producer(env: &Env, topic: &str, index: usize) -> Result<()> {
    let name = format!("idempotent-p{index}");
    let producer = recording_producer(env, Workload::Idempotent, &name, &producer_settings(&name))
        .context("cannot create an idempotent producer")?;
    if !env.gate.arrive_and_wait() {
        return Ok(());
    }
    let mut pacer = Pacer::new(env.rate / PRODUCERS as f64);
    let mut n: u64 = 0;
    while pacer.wait(|| env.producing()) {
        let partition =
            i32::try_from(n % u64::try_from(env.partitions.max(1)).unwrap_or(1)).unwrap_or(0);
        let pending = Pending {
            value: format!("{name}-{n}"),
            topic: topic.to_string(),
            partition,
            txn: None,
        };
        n += 1;
        if let Err(e) = send(&producer, Workload::Idempotent, &name, pending) {
            tracing::warn!(producer = %name, "send failed: {e}");
        }
        if let Some((code, reason)) = producer.client().fatal_error() {
            tracing::warn!(producer = %name, "fatal producer error {code:?}: {reason}; stopping it");
            break;
        }
    }
    // Every outstanding record is acknowledged or fails by its message timeout.
    if let Err(e) = producer.flush(MESSAGE_TIMEOUT * 2) {
        tracing::warn!(producer = %name, "flush: {e}");
    }
    Ok(())
}
