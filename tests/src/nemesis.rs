//! The nemesis (`samsa-nemesis`) on a [`ComposeCluster`], for the fault
//! tests of `tests/containers/faults.rs`:
//!
//! - [`nemesis`]: a `Nemesis` on the cluster's project (it heals every
//!   fault when dropped, also when a test panics; declare it after the
//!   cluster so that it drops first);
//! - [`ClusterRoles`]: the partition leader and the active controller as
//!   the harness sees them, for schedules aimed at roles;
//! - [`Probe`]: a plain acks=all producer pinned to one node's host port
//!   for one partition, every acknowledgement timed and fed to its own
//!   exactly-once checker: what an isolated or paused leader acknowledges;
//! - [`wait_replicas_agree`]: the same batches on every replica up to the
//!   high watermark, read from the segment files of each node's data
//!   directory on the host.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use samsa_nemesis::{ComposeProject, Nemesis, Roles};

use crate::batch::BatchBuilder;
use crate::checker::{EosChecker, EosReport, SharedChecker};
use crate::client::{produce_request, KafkaClient};
use crate::compose::ComposeCluster;
use crate::rdk;
use crate::wait::try_wait_until;

/// A nemesis on `c`'s compose project, without a fault log.
pub fn nemesis(c: &ComposeCluster) -> Nemesis {
    Nemesis::new(ComposeProject::new(c.project(), 3), None)
}

fn index_of(node_id: i32) -> usize {
    usize::try_from(node_id - 1).expect("node ids start at 1")
}

/// `topic`-`partition`'s leader by the Metadata of the nodes `observers`
/// (indexes), the first that answers.
pub fn leader_seen_by(
    c: &ComposeCluster,
    observers: &[usize],
    topic: &str,
    partition: i32,
) -> Option<i32> {
    observers.iter().find_map(|i| {
        let parts = c.partitions(*i, topic)?;
        let p = parts.iter().find(|p| p.partition == partition)?;
        (p.leader > 0).then_some(p.leader)
    })
}

/// The controller leader as the nodes `observers` report it (DescribeQuorum).
pub fn controller_seen_by(c: &ComposeCluster, observers: &[usize]) -> Option<i32> {
    observers.iter().find_map(|i| {
        let d = c.quick_client(*i)?.describe_quorum(1).ok()?;
        let leader = d.topics.first()?.partitions.first()?.leader_id.0;
        (leader > 0).then_some(leader)
    })
}

/// [`Roles`] through the harness: the leader of `topic`-`partition` and the
/// controller leader, by any node's answer.
pub struct ClusterRoles<'a> {
    pub cluster: &'a ComposeCluster,
    pub topic: String,
    pub partition: i32,
}

impl Roles for ClusterRoles<'_> {
    fn partition_leader(&mut self) -> Option<u32> {
        leader_seen_by(self.cluster, &[0, 1, 2], &self.topic, self.partition)
            .and_then(|l| u32::try_from(l).ok())
    }

    fn controller(&mut self) -> Option<u32> {
        self.cluster
            .controller_leader()
            .and_then(|l| u32::try_from(l).ok())
    }
}

/// See the module docs.
pub struct Probe {
    pub topic: String,
    pub partition: i32,
    pub node: i32,
    checker: SharedChecker,
    acks: Arc<Mutex<Vec<(Instant, i64)>>>,
    /// Error codes of the produce answers that were not acknowledgements.
    pub errors: Arc<Mutex<BTreeMap<i16, u64>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

impl Probe {
    /// Starts producing one record at a time to `topic`-`partition` through
    /// node `node`'s host listener (acks=all, 3 s produce timeout, a new
    /// connection after any error) and waits for its first acknowledgement.
    pub fn start(c: &ComposeCluster, topic: &str, partition: i32, node: i32) -> Probe {
        let checker = EosChecker::shared();
        let acks = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let addr = c.addr(index_of(node));
        let worker = {
            let (checker, acks, errors, stop, topic) = (
                Arc::clone(&checker),
                Arc::clone(&acks),
                Arc::clone(&errors),
                Arc::clone(&stop),
                topic.to_string(),
            );
            // Values name the node: probes of two nodes may share a partition.
            let prefix = format!("probe-{node}-");
            std::thread::spawn(move || {
                let mut client: Option<KafkaClient> = None;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if client.is_none() {
                        client = KafkaClient::connect_with_timeout(addr, Duration::from_secs(1))
                            .ok()
                            .and_then(|mut c| {
                                c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
                                c.api_versions().ok()?;
                                Some(c)
                            });
                        if client.is_none() {
                            // Back-off between reconnects, not synchronisation.
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    }
                    let Some(conn) = client.as_mut() else {
                        continue;
                    };
                    n += 1;
                    let value = format!("{prefix}{n:07}");
                    checker.lock().unwrap().send("probe", value.as_bytes());
                    let req = produce_request(
                        &topic,
                        partition,
                        BatchBuilder::new().record(&value).build(),
                        -1,
                    )
                    .with_timeout_ms(3_000);
                    let answer = conn.call(&req).ok().and_then(|r| {
                        let p = r.responses.first()?.partition_responses.first()?.clone();
                        Some(p)
                    });
                    match answer {
                        Some(p) if p.error_code == 0 => {
                            checker
                                .lock()
                                .unwrap()
                                .ack(value.as_bytes(), partition, p.base_offset);
                            acks.lock().unwrap().push((Instant::now(), p.base_offset));
                        }
                        Some(p) => {
                            // Not acknowledged: the record may or may not be
                            // written (a timeout), so it is neither acked nor failed.
                            *errors.lock().unwrap().entry(p.error_code).or_default() += 1;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        None => {
                            client = None;
                            // Back-off before reconnecting, not synchronisation.
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
        };
        let probe = Probe {
            topic: topic.to_string(),
            partition,
            node,
            checker,
            acks,
            errors,
            stop,
            worker: Some(worker),
        };
        let first = try_wait_until(Duration::from_secs(60), || {
            (!probe.acks.lock().unwrap().is_empty()).then_some(())
        });
        assert!(
            first.is_some(),
            "the probe to node {node} got no ack in 60 s; produce answers (code → count): {:?}",
            probe.errors.lock().unwrap()
        );
        probe
    }

    /// Every acknowledgement so far: when it arrived and its offset.
    pub fn acks(&self) -> Vec<(Instant, i64)> {
        self.acks.lock().unwrap().clone()
    }

    /// The last acknowledgement before `t`, if any.
    pub fn last_ack_before(&self, t: Instant) -> Option<Instant> {
        self.acks()
            .into_iter()
            .map(|(at, _)| at)
            .filter(|at| *at <= t)
            .max()
    }

    /// Acknowledgements that arrived after `t`.
    pub fn acks_after(&self, t: Instant) -> Vec<(Instant, i64)> {
        self.acks().into_iter().filter(|(at, _)| *at > t).collect()
    }

    /// Stops, reads the partition back through `bootstrap` and returns the
    /// checker's report: every acknowledged probe record at its offset once.
    pub fn finish(mut self, bootstrap: &str) -> EosReport {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            w.join().expect("the probe panicked");
        }
        let partitions = self.partition + 1;
        rdk::consume_to_end(
            bootstrap,
            &self.topic,
            partitions,
            Duration::from_secs(120),
            |p, o, v| {
                // Only this probe's records (a probe may share its partition).
                if p == self.partition && v.starts_with(format!("probe-{}-", self.node).as_bytes())
                {
                    self.checker.lock().unwrap().read(p, o, v);
                }
            },
        )
        .expect("read the probe topic back");
        let report = self.checker.lock().unwrap().check();
        report
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One batch of a segment file: base offset, last offset, CRC.
type BatchId = (i64, i64, u32);

/// The batches of a partition directory's segment files with a base offset
/// below `below`, in offset order. A torn tail (a batch longer than the
/// file) ends the list.
fn replica_batches(dir: &Path, below: i64) -> Vec<BatchId> {
    let mut out = Vec::new();
    for_each_batch_header(dir, |h| {
        if h.base_offset >= below {
            return false;
        }
        out.push((h.base_offset, h.last_offset, h.crc));
        true
    });
    out
}

/// What the v2 batch header of a stored batch says (the fields a
/// duplicate's diagnosis needs).
struct StoredBatch {
    base_offset: i64,
    last_offset: i64,
    partition_leader_epoch: i32,
    crc: u32,
    attributes: i16,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
}

/// Walks the batch headers of a partition directory's segment files in
/// offset order, until `visit` returns false or a torn tail (a batch longer
/// than the file).
fn for_each_batch_header(dir: &Path, mut visit: impl FnMut(&StoredBatch) -> bool) {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    segments.sort();
    for seg in segments {
        let Ok(data) = std::fs::read(&seg) else {
            continue;
        };
        let mut pos = 0usize;
        while pos + 61 <= data.len() {
            let h = &data[pos..pos + 61];
            let be = |at: usize, n: usize| -> i64 {
                h[at..at + n]
                    .iter()
                    .fold(0i64, |v, b| (v << 8) | i64::from(*b))
            };
            let Ok(len) = usize::try_from(be(8, 4) as i32) else {
                break;
            };
            if len < 49 || pos + 12 + len > data.len() {
                break;
            }
            let base_offset = be(0, 8);
            let batch = StoredBatch {
                base_offset,
                last_offset: base_offset + be(23, 4) as i32 as i64,
                partition_leader_epoch: be(12, 4) as i32,
                crc: be(17, 4) as u32,
                attributes: be(21, 2) as i16,
                producer_id: be(43, 8),
                producer_epoch: be(51, 2) as i16,
                base_sequence: be(53, 4) as i32,
            };
            if !visit(&batch) {
                return;
            }
            pos += 12 + len;
        }
    }
}

/// Every node's stored batches of `topic`-`partition` that hold one of
/// `offsets`, one line each: what tells a duplicate a broker failed to
/// recognise (the same producer epoch and sequence stored twice) from one
/// a client sent again under a new epoch or sequence.
pub fn describe_stored_batches(
    c: &ComposeCluster,
    topic: &str,
    partition: i32,
    offsets: &[i64],
) -> String {
    let project = ComposeProject::new(c.project(), 3);
    let mut lines = Vec::new();
    for node in 1..=3 {
        let Ok(dir) = project.data_dir(node) else {
            lines.push(format!("node {node}: no data directory"));
            continue;
        };
        for_each_batch_header(&dir.join(format!("{topic}-{partition}")), |b| {
            if offsets
                .iter()
                .any(|o| (b.base_offset..=b.last_offset).contains(o))
            {
                lines.push(format!(
                    "node {node}: {topic}-{partition} offsets {}..={} leader epoch {} crc {:#010x} \
                     attributes {:#06x} producer {} epoch {} base sequence {}",
                    b.base_offset,
                    b.last_offset,
                    b.partition_leader_epoch,
                    b.crc,
                    b.attributes,
                    b.producer_id,
                    b.producer_epoch,
                    b.base_sequence
                ));
            }
            true
        });
    }
    lines.join("\n")
}

/// Waits until every node's copy of each partition of `topic` holds the
/// same batches (offsets and CRCs) below the partition's high watermark,
/// read from the segment files in the nodes' data directories; returns the
/// batch count compared, or a description of the first difference at the
/// deadline.
pub fn wait_replicas_agree(
    c: &ComposeCluster,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> Result<usize, String> {
    let project = ComposeProject::new(c.project(), 3);
    let dirs: Vec<_> = (1..=3)
        .map(|n| project.data_dir(n).expect("a node's data directory"))
        .collect();
    let mut last = String::new();
    let compared = try_wait_until(timeout, || {
        let mut total = 0;
        for p in 0..partitions {
            let Some(hw) = c
                .any_client()
                .and_then(|mut k| leader_hw(c, &mut k, topic, p))
            else {
                last = format!("{topic}-{p}: no high watermark");
                return None;
            };
            let copies: BTreeMap<usize, Vec<BatchId>> = dirs
                .iter()
                .enumerate()
                .map(|(i, d)| (i + 1, replica_batches(&d.join(format!("{topic}-{p}")), hw)))
                .collect();
            let first = &copies[&1];
            if first.last().map(|b| b.1 + 1) != Some(hw) && hw > 0 {
                last = format!(
                    "{topic}-{p}: node 1 holds batches to {:?}, high watermark {hw}",
                    first.last()
                );
                return None;
            }
            for (node, batches) in &copies {
                if batches != first {
                    let at = batches.iter().zip(first).position(|(a, b)| a != b);
                    last = format!(
                        "{topic}-{p}: node {node} differs from node 1 below HW {hw}: {} vs {} \
                         batches, first difference at batch {at:?}",
                        batches.len(),
                        first.len()
                    );
                    return None;
                }
            }
            total += first.len();
        }
        Some(total)
    });
    compared.ok_or(last)
}

/// The high watermark of `topic`-`partition` from its leader.
fn leader_hw(
    c: &ComposeCluster,
    any: &mut KafkaClient,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let t = any.topic_metadata(topic)?;
    let leader = t
        .partitions
        .iter()
        .find(|p| p.partition_index == partition)?
        .leader_id
        .0;
    let mut k = c.quick_client(usize::try_from(leader - 1).ok()?)?;
    k.log_end_offset(topic, partition).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_batch_headers_are_read_back_with_their_producer_fields() {
        let dir = tempfile::tempdir().unwrap();
        let mut segment = Vec::new();
        for (base, sequence) in [(0i64, 7), (2, 9)] {
            let mut batch = BatchBuilder::idempotent(42, 3, sequence)
                .values(["a", "b"])
                .build()
                .to_vec();
            batch[..8].copy_from_slice(&base.to_be_bytes());
            segment.extend_from_slice(&batch);
        }
        // A torn tail: a header whose batch runs past the file's end.
        segment.extend_from_within(..61);
        std::fs::write(dir.path().join("00000000000000000000.log"), &segment).unwrap();
        let mut seen = Vec::new();
        for_each_batch_header(dir.path(), |b| {
            seen.push((
                b.base_offset,
                b.last_offset,
                b.producer_id,
                b.producer_epoch,
                b.base_sequence,
            ));
            true
        });
        assert_eq!(seen, [(0, 1, 42, 3, 7), (2, 3, 42, 3, 9)]);
        assert_eq!(replica_batches(dir.path(), 2).len(), 1);
    }
}
