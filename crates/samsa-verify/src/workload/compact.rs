//! The compact workload: keyed records on a compacted topic
//! (`cleanup.policy=compact`, small segments, a short
//! `max.compaction.lag.ms`), so the cluster's log cleaner works while the
//! run reads and writes. An idempotent producer (acks=all) and a
//! transactional one (aborting `--abort-ratio` of its transactions on
//! purpose, once their records are acknowledged, so that aborted records
//! are in the log for the cleaner to deal with) write over one bounded key space (`--compact-keys`), every
//! value unique; about one write in ten ([`TOMBSTONE_RATIO`], seeded) is a
//! tombstone (a null value, its id in a header). A key always goes to the
//! same partition (key number modulo the partitions), so "the latest write
//! of a key" is one partition's notion, as compaction's is. The upper half
//! of the key space retires: such a key is not written again after its
//! first tombstone ([`KeySpace`]), so some keys stay deleted for most of
//! the run, and their tombstones (and the values they delete) must go by
//! their deadlines.
//!
//! Recorded like the idempotent and txn workloads (sends with their key
//! and whether they are tombstones, acknowledgements, transaction steps);
//! the checker then asks what compaction may and may not have removed.

use std::sync::Mutex;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::producer::Producer;

use super::txn::Transactional;
use super::{producer_settings, recording_producer, send, Env, Pacer, Pending, MESSAGE_TIMEOUT};
use crate::history::Workload;

const W: Workload = Workload::Compact;
/// Share of writes that are tombstones.
pub const TOMBSTONE_RATIO: f64 = 0.1;
/// Records per transaction of the transactional producer.
pub const RECORDS_PER_TXN: usize = 3;
/// The idempotent producer's name (and value prefix).
pub const IDEMPOTENT_PRODUCER: &str = "compact-p0";
/// The transactional producer's name.
pub const TXN_PRODUCER: &str = "compact-t0";

/// A key's name: `k<n>`, zero-padded.
pub fn key_name(n: u32) -> String {
    format!("k{n:04}")
}

/// The keys of a run, shared by its producers: `keys` of them; the lower
/// half is written all along, a key of the upper half retires at its
/// first tombstone.
pub struct KeySpace {
    keys: u32,
    partitions: u32,
    retired: Mutex<Vec<bool>>,
}

impl KeySpace {
    pub fn new(keys: u32, partitions: i32) -> KeySpace {
        let keys = keys.max(1);
        KeySpace {
            keys,
            partitions: u32::try_from(partitions.max(1)).unwrap_or(1),
            retired: Mutex::new(vec![false; keys as usize]),
        }
    }

    /// The first key that retires.
    fn retiring_from(&self) -> u32 {
        self.keys.div_ceil(2)
    }

    /// A write's key, its partition and whether it is a tombstone (seeded
    /// choices among the keys not retired).
    fn next_write(&self, rng: &mut StdRng) -> (String, i32, bool) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        // At least half the keys never retire: a few tries find a live one.
        let mut n = rng.gen_range(0..self.keys);
        for _ in 0..64 {
            if !retired.get(n as usize).copied().unwrap_or(false) {
                break;
            }
            n = rng.gen_range(0..self.keys);
        }
        if retired.get(n as usize).copied().unwrap_or(false) {
            n %= self.retiring_from();
        }
        let tombstone = rng.gen_bool(TOMBSTONE_RATIO);
        if tombstone && n >= self.retiring_from() {
            if let Some(r) = retired.get_mut(n as usize) {
                *r = true;
            }
        }
        let partition = i32::try_from(n % self.partitions).unwrap_or(0);
        (key_name(n), partition, tombstone)
    }
}

/// The idempotent producer: half of the workload's rate, until producing
/// stops; then waits for its outstanding acknowledgements.
pub fn run_producer(env: &Env, topic: &str, keys: &KeySpace) -> Result<()> {
    let name = IDEMPOTENT_PRODUCER;
    let producer = recording_producer(env, W, name, &producer_settings(name))
        .with_context(|| format!("cannot create producer {name}"))?;
    if !env.gate.arrive_and_wait() {
        return Ok(());
    }
    let mut rng = StdRng::seed_from_u64(env.seed ^ 0x636f_6d70_0000);
    let mut pacer = Pacer::new(env.rate / 2.0);
    let mut n: u64 = 0;
    while pacer.wait(|| env.producing()) {
        let (key, partition, tombstone) = keys.next_write(&mut rng);
        let pending = Pending {
            value: format!("{name}-{n}"),
            topic: topic.to_string(),
            partition,
            txn: None,
            key: Some(key),
            tombstone,
        };
        n += 1;
        if let Err(e) = send(&producer, W, name, pending) {
            tracing::warn!(producer = %name, "send failed: {e}");
        }
        if let Some((code, reason)) = producer.client().fatal_error() {
            tracing::warn!(producer = %name, "fatal producer error {code:?}: {reason}; stopping it");
            break;
        }
    }
    if let Err(e) = producer.flush(MESSAGE_TIMEOUT + std::time::Duration::from_secs(10)) {
        tracing::warn!(producer = %name, "flush: {e}");
    }
    Ok(())
}

/// The transactional producer: the other half of the rate, in
/// transactions of [`RECORDS_PER_TXN`] keyed records, `abort_ratio` of
/// them aborted on purpose.
pub fn run_txn_producer(
    env: &Env,
    topic: &str,
    transactional_id: &str,
    keys: &KeySpace,
    abort_ratio: f64,
) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(env.seed ^ 0x636f_6d74_0000);
    let producer = Transactional {
        workload: W,
        name: TXN_PRODUCER,
        transactional_id,
        txns_per_sec: env.rate / 2.0 / RECORDS_PER_TXN as f64,
        abort_ratio,
        // Aborted records in the log: the cleaner must drop them, never
        // let them hide an older value, and read_committed never see them.
        land_aborted: true,
    };
    producer.run(env, &mut rng, |id, rng| {
        (0..RECORDS_PER_TXN)
            .map(|j| {
                let (key, partition, tombstone) = keys.next_write(rng);
                Pending {
                    value: format!("{id}-r{j}"),
                    topic: topic.to_string(),
                    partition,
                    txn: Some(id.to_string()),
                    key: Some(key),
                    tombstone,
                }
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_of_the_upper_half_retire_at_their_tombstone() {
        let keys = KeySpace::new(10, 3);
        let mut rng = StdRng::seed_from_u64(1);
        let mut deleted = std::collections::HashSet::new();
        for _ in 0..5_000 {
            let (key, partition, tombstone) = keys.next_write(&mut rng);
            let n: u32 = key[1..].parse().unwrap();
            assert_eq!(partition, i32::try_from(n % 3).unwrap());
            assert!(!deleted.contains(&n), "{key} written after it retired");
            if tombstone && n >= 5 {
                deleted.insert(n);
            }
        }
        // Every retiring key retired; the others are still written.
        assert_eq!(deleted.len(), 5);
    }
}
