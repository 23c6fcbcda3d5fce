//! What the transaction and group coordinators' shells share: an internal
//! topic whose partitions this broker coordinates while it leads them.
//!
//! - [`InternalTopic::ensure`]: the topic (`__transaction_state`,
//!   `__consumer_offsets`) is created on first use with its partition count,
//!   replication factor (default min(3, live brokers)),
//!   `min.insync.replicas` 2 when RF ≥ 3, no time or size retention (its
//!   records are the coordinator's state) and no unclean election. Until it
//!   exists and the partition has a live leader, callers answer
//!   COORDINATOR_NOT_AVAILABLE, which clients retry.
//! - [`ownership_changes`]: the partitions this broker leads (and at which
//!   leader epoch) against what a coordinator holds: load what is newly
//!   led, unload what is not any more.
//! - [`read_log`]: a newly led partition replayed from its log start to its
//!   log end (a leader never truncates its own log), data records and
//!   transaction markers in order.
//! - [`append_durable`]: a coordinator write, appended as leader at the
//!   coordinator epoch (the leader epoch at load) and reported only once
//!   acks=all ([`Partition::wait_acks_all`]): fsync as configured, then the
//!   HW covering it in that epoch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tracing::{info, warn, Instrument};

use crate::error::{metadata_error_code, partition_error_code};
use crate::coordinator::group::LogEntry;
use crate::metadata::{BrokerInfo, NewTopic};
use crate::replica::Partition;
use crate::coordinator::placement::TRANSACTION_STATE_TOPIC;
use crate::coordinator::placement::LedByImage;
use crate::{now_ms, Broker, MetadataError};

/// How long a coordinator write may wait for the ISR before it fails
/// (retriable for the client: COORDINATOR_NOT_AVAILABLE).
pub const STATE_WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// How often ownership is reconciled even without a metadata change.
pub const RECONCILE_EVERY: Duration = Duration::from_millis(500);
/// Read size while replaying a partition.
const LOAD_READ_BYTES: usize = 4 * 1024 * 1024;

/// An internal topic of coordinator state.
pub struct InternalTopic {
    pub name: &'static str,
    pub partitions: i32,
    /// Unset: min(3, live brokers) at creation.
    pub replication_factor: Option<i16>,
    creating: Arc<AtomicBool>,
}

impl InternalTopic {
    pub fn new(name: &'static str, partitions: i32, replication_factor: Option<i16>) -> Self {
        InternalTopic {
            name,
            partitions,
            replication_factor,
            creating: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Ok if the topic exists; otherwise starts creating it (once, through
    /// `broker`, calling `created` after) and answers
    /// COORDINATOR_NOT_AVAILABLE.
    pub fn ensure(
        &self,
        existing: &Broker,
        broker: Option<Arc<Broker>>,
        created: fn(&Broker),
    ) -> Result<(), ResponseError> {
        if existing.metadata.image().topic(self.name).is_some() {
            return Ok(());
        }
        if let Some(broker) = broker {
            if !self.creating.swap(true, Ordering::AcqRel) {
                let creating = Arc::clone(&self.creating);
                let (name, partitions, rf) = (self.name, self.partitions, self.replication_factor);
                tokio::spawn(
                    async move {
                        create(&broker, name, partitions, rf).await;
                        creating.store(false, Ordering::Release);
                        created(&broker);
                    }
                    .in_current_span(),
                );
            }
        }
        Err(ResponseError::CoordinatorNotAvailable)
    }

    /// The partitions of the topic that the current metadata image (what
    /// FindCoordinator answers from) says this broker leads.
    pub fn led_by_image(&self, broker: &Broker) -> LedByImage {
        let image = broker.metadata.image();
        let me = broker.config.node_id;
        let led = image.topic(self.name).map_or_else(BTreeSet::new, |t| {
            (0..t.partitions)
                .filter(|&p| t.partition(p).is_some_and(|s| s.leader == me))
                .collect()
        });
        LedByImage::new(led)
    }

    /// Locks `coordinator` for a client request: it first learns (`learn`)
    /// which partitions the image says this broker leads, so one whose load
    /// has not begun answers COORDINATOR_LOAD_IN_PROGRESS; if there is one,
    /// `wake` the ownership loop to begin it.
    pub fn serving<'a, C>(
        &self,
        broker: Option<Arc<Broker>>,
        coordinator: &'a Mutex<C>,
        learn: fn(&mut C, LedByImage) -> bool,
        wake: impl FnOnce(),
    ) -> MutexGuard<'a, C> {
        // Read the image before locking: the coordinator's mutex is never
        // held while waiting for another lock.
        let led = broker.map(|b| self.led_by_image(&b));
        let mut guard = coordinator.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(led) = led {
            if learn(&mut guard, led) {
                wake();
            }
        }
        guard
    }

    /// The live leader of partition `p`: COORDINATOR_NOT_AVAILABLE without one.
    pub fn leader_of(&self, broker: &Broker, p: i32) -> Result<BrokerInfo, ResponseError> {
        let image = broker.metadata.image();
        let leader = image
            .partition(self.name, p)
            .map(|p| p.leader)
            .ok_or(ResponseError::CoordinatorNotAvailable)?;
        image
            .broker(leader)
            .filter(|b| !b.fenced)
            .cloned()
            .ok_or(ResponseError::CoordinatorNotAvailable)
    }
}

async fn create(broker: &Broker, name: &'static str, partitions: i32, rf: Option<i16>) {
    let replication_factor = broker.replication_factor_or_default(rf);
    let mut configs = BTreeMap::new();
    if replication_factor >= 3 {
        configs.insert("min.insync.replicas".to_string(), "2".to_string());
    }
    // The records are the coordinator's state: never delete them by age or size.
    configs.insert("retention.ms".to_string(), "-1".to_string());
    configs.insert("retention.bytes".to_string(), "-1".to_string());
    configs.insert(
        "unclean.leader.election.enable".to_string(),
        "false".to_string(),
    );
    // Kafka's choices; either way the batches stay as the coordinator
    // writes them, uncompressed, which is what its loader reads.
    let compression = if name == TRANSACTION_STATE_TOPIC {
        "uncompressed"
    } else {
        "producer"
    };
    configs.insert("compression.type".to_string(), compression.to_string());
    let topic = NewTopic {
        name: name.to_string(),
        partitions,
        replication_factor,
        configs,
        assignments: None,
    };
    match broker.create_topic(topic).await {
        Ok(t) => info!(
            partitions = t.partitions,
            replication_factor, "created {name}"
        ),
        Err(MetadataError::TopicAlreadyExists(_)) => {}
        Err(e) => {
            warn!(error = %e, code = ?metadata_error_code(&e), "cannot create {name}; the next request retries")
        }
    }
}

/// A change of which partitions a coordinator should hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Newly led (or led at a new epoch): load it at this epoch.
    Load { partition: i32, epoch: i32 },
    /// Held at `epoch` but no longer led here: unload it.
    Unload { partition: i32, epoch: i32 },
}

/// Compares the partitions of `topic` this broker leads with what a
/// coordinator holds (`held(p)`: the epoch it holds `p` at).
pub fn ownership_changes(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    held: impl Fn(i32) -> Option<i32>,
) -> Vec<Ownership> {
    let mut changes = Vec::new();
    for p in 0..partitions {
        let led = broker
            .replicas
            .get(topic, p)
            .map(|x| x.leadership())
            .filter(|l| l.is_leader)
            .map(|l| l.leader_epoch);
        match (led, held(p)) {
            (Some(e), Some(h)) if e == h => {}
            (Some(e), _) => changes.push(Ownership::Load {
                partition: p,
                epoch: e,
            }),
            (None, Some(h)) => changes.push(Ownership::Unload {
                partition: p,
                epoch: h,
            }),
            (None, None) => {}
        }
    }
    changes
}

/// Every entry of `topic`-`p` from its log start to its log end.
pub fn read_log(broker: &Broker, topic: &str, p: i32) -> Result<Vec<LogEntry>, String> {
    let partition = broker
        .replicas
        .get(topic, p)
        .ok_or_else(|| format!("partition {p} is not hosted"))?;
    let mut offset = partition
        .offsets()
        .map_err(|e| e.to_string())?
        .log_start_offset;
    let mut entries = Vec::new();
    loop {
        let (read, end) = partition
            .read_to_log_end(offset, LOAD_READ_BYTES)
            .map_err(|e| e.to_string())?;
        if read.records.is_empty() {
            break;
        }
        for item in samsa_storage::batch::batches(&read.records) {
            let (header, bytes) = item.map_err(|e| e.to_string())?;
            offset = header.last_offset() + 1;
            if header.is_control() {
                if let Some(marker) =
                    samsa_storage::EndTxnMarker::parse(bytes).map_err(|e| e.to_string())?
                {
                    entries.push(LogEntry::Marker {
                        producer_id: marker.producer_id,
                        commit: marker.commit,
                    });
                }
                continue;
            }
            let producer_id = header.is_transactional().then_some(header.producer_id);
            for record in samsa_storage::batch::records(bytes).map_err(|e| e.to_string())? {
                let record = record.map_err(|e| e.to_string())?;
                let Some(key) = record.key else { continue };
                entries.push(LogEntry::Record {
                    offset: header.base_offset + i64::from(record.offset_delta),
                    producer_id,
                    key: key.to_vec(),
                    value: record.value.map(<[u8]>::to_vec),
                });
            }
        }
        if offset >= end {
            break;
        }
    }
    Ok(entries)
}

/// The partition to write coordinator state to: led here at `epoch`, with
/// enough in-sync replicas.
pub fn writable_partition(
    broker: &Broker,
    topic: &str,
    p: i32,
    epoch: i32,
) -> Result<Arc<Partition>, ResponseError> {
    let partition = broker.leader_partition(topic, p)?;
    if partition.leader_epoch() != epoch {
        return Err(ResponseError::NotLeaderOrFollower);
    }
    let (isr, min_isr) = partition.isr_and_min();
    if isr < min_isr {
        return Err(ResponseError::NotEnoughReplicas);
    }
    Ok(partition)
}

/// Appends key/value `records` to `topic`-`p` as leader at `epoch` and
/// waits for acks=all.
pub async fn append_durable(
    broker: &Broker,
    topic: &str,
    p: i32,
    epoch: i32,
    records: &[(&[u8], Option<&[u8]>)],
) -> Result<(), ResponseError> {
    let partition = writable_partition(broker, topic, p, epoch)?;
    let now = now_ms();
    let batch = samsa_storage::batch::key_value_batch(records, now);
    let (info, _) = partition
        .append(&batch, now)
        .map_err(|e| partition_error_code(&e))?;
    wait_durable(&partition, info.last_offset + 1, epoch).await
}

/// acks=all for a coordinator write ending at `end_offset`.
pub async fn wait_durable(
    partition: &Partition,
    end_offset: i64,
    epoch: i32,
) -> Result<(), ResponseError> {
    let deadline = tokio::time::Instant::now() + STATE_WRITE_TIMEOUT;
    partition
        .wait_acks_all(end_offset, epoch, deadline)
        .await
        .map_err(|(code, _)| code)
}
