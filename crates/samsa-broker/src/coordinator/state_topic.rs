//! A coordinator's state topic: created on first use, read back to load a
//! partition, appended to durably.
//!
//! - [`StateTopic::ensure`]: the topic (`__transaction_state`,
//!   `__consumer_offsets`) is created on first use with its partition count,
//!   replication factor (default min(3, live brokers)),
//!   `min.insync.replicas` 2 when RF ≥ 3, `cleanup.policy=compact` with
//!   Kafka's 100 MiB segments (the coordinators write tombstones for what
//!   they forget, so the log holds about one record per live key and a load
//!   replays that, not the whole history), no time or size retention (its
//!   records are the coordinator's state) and no unclean election. Until it
//!   exists and the partition has a live leader, callers answer
//!   COORDINATOR_NOT_AVAILABLE, which clients retry.
//! - [`read_log`]: a newly led partition replayed from its log start to its
//!   log end (a leader never truncates its own log), data records and
//!   transaction markers in order.
//! - [`append`]: a coordinator [`Write`], appended as leader at the
//!   coordinator epoch (the leader epoch at load) — a transactional one as
//!   a batch of its producer, after KIP-890 verification; then
//!   [`Appended::wait_durable`] waits for acks=all
//!   ([`Partition::wait_acks_all`]): fsync as configured, then the HW
//!   covering it in that epoch. [`append_durable`] does both.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use tokio::sync::watch;
use tracing::{info, warn, Instrument};

use super::placement::{LedByImage, TRANSACTION_STATE_TOPIC};
use super::{AppendResult, LogEntry, Write};
use crate::error::{metadata_error_code, partition_error_code};
use crate::metadata::{BrokerInfo, NewTopic};
use crate::replica::{Partition, ReadToLogEnd};
use crate::topic_partition::TopicPartition;
use crate::{now_ms, Broker, MetadataError};

/// How long a coordinator write may wait for the ISR before it fails
/// (retriable for the client: COORDINATOR_NOT_AVAILABLE).
pub const STATE_WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// Read size while replaying a partition.
const LOAD_READ_BYTES: usize = 4 * 1024 * 1024;

/// The internal topic a coordinator keeps its state in.
pub struct StateTopic {
    pub name: &'static str,
    pub partitions: i32,
    /// Unset: min(3, live brokers) at creation.
    pub replication_factor: Option<i16>,
    /// True while this broker creates the topic.
    creating: Arc<watch::Sender<bool>>,
}

impl StateTopic {
    pub fn new(name: &'static str, partitions: i32, replication_factor: Option<i16>) -> Self {
        StateTopic {
            name,
            partitions,
            replication_factor,
            creating: Arc::new(watch::Sender::new(false)),
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
            let started = self
                .creating
                .send_if_modified(|creating| !std::mem::replace(creating, true));
            if started {
                let creating = Arc::clone(&self.creating);
                let (name, partitions, rf) = (self.name, self.partitions, self.replication_factor);
                tokio::spawn(
                    async move {
                        create(&broker, name, partitions, rf).await;
                        created(&broker);
                        creating.send_replace(false);
                    }
                    .in_current_span(),
                );
            }
        }
        Err(ResponseError::CoordinatorNotAvailable)
    }

    /// Waits up to `timeout` for a creation this broker began to end; true
    /// if one was under way and ended (the topic may exist now).
    pub async fn creation_ended(&self, timeout: Duration) -> bool {
        let mut creating = self.creating.subscribe();
        if !*creating.borrow_and_update() {
            return false;
        }
        let ended = tokio::time::timeout(timeout, creating.wait_for(|c| !*c))
            .await
            .is_ok_and(|waited| waited.is_ok());
        ended
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
    // The records are the coordinator's state: compacted (latest record
    // of a key), never deleted by age or size.
    configs.insert("cleanup.policy".to_string(), "compact".to_string());
    configs.insert(
        "segment.bytes".to_string(),
        broker.config.state_topic_segment_bytes(name).to_string(),
    );
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
        let ReadToLogEnd {
            read,
            log_end_offset,
        } = partition
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
        if offset >= log_end_offset {
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
    if partition.in_sync_replicas().below_min() {
        return Err(ResponseError::NotEnoughReplicas);
    }
    Ok(partition)
}

/// Appends `write` to its partition of `topic` as leader at its
/// coordinator epoch and waits for acks=all; the base offset of its batch.
pub async fn append_durable(broker: &Broker, topic: &str, write: &Write) -> AppendResult {
    let appended = append(broker, topic, write).await?;
    appended.wait_durable().await?;
    Ok(appended.base_offset)
}

/// A coordinator write appended to its partition's log, not yet known to
/// be durable.
pub struct Appended {
    partition: Arc<Partition>,
    coordinator_epoch: i32,
    pub base_offset: i64,
    /// The offset after its batch.
    end_offset: i64,
}

impl Appended {
    /// Waits for acks=all: fsync as configured, then the HW covering the
    /// batch in the coordinator epoch it was appended at.
    pub async fn wait_durable(&self) -> Result<(), ResponseError> {
        let deadline = tokio::time::Instant::now() + STATE_WRITE_TIMEOUT;
        self.partition
            .wait_acks_all(self.end_offset, self.coordinator_epoch, deadline)
            .await
            .map_err(|refusal| refusal.code)
    }
}

/// Appends `write` to its partition of `topic` as leader at its
/// coordinator epoch, without waiting for acks=all.
///
/// A transactional write (offsets in a transaction) is appended as a batch
/// of its producer; before the producer's first write to the partition in
/// this transaction, the partition is verified with (or, for TV2, added
/// to) the transaction by its coordinator (KIP-890).
pub async fn append(
    broker: &Broker,
    topic: &str,
    write: &Write,
) -> Result<Appended, ResponseError> {
    let partition = writable_partition(broker, topic, write.partition, write.coordinator_epoch)?;
    let records: Vec<(&[u8], Option<&[u8]>)> = write
        .records
        .iter()
        .map(|r| (r.key.as_slice(), r.value.as_deref()))
        .collect();
    let now = now_ms();
    let info = match &write.transactional {
        None => {
            let batch = samsa_storage::batch::key_value_batch(&records, now);
            partition
                .append(&batch, now)
                .map_err(|e| partition_error_code(&e))?
                .info
        }
        Some(t) => {
            let needs = partition
                .txn_needs_verification(t.producer_id, t.producer_epoch)
                .map_err(|e| partition_error_code(&e))?;
            if needs {
                // Boxed: verification may itself complete a transaction
                // state write, which comes back through this function.
                Box::pin(crate::coordinator::txn::verify::verify_partition(
                    broker,
                    &t.transactional_id,
                    t.producer_id,
                    t.producer_epoch,
                    TopicPartition::new(topic.to_string(), write.partition),
                    t.add_partition,
                ))
                .await?;
                partition.mark_txn_verified(t.producer_id, t.producer_epoch);
            }
            let batch = samsa_storage::batch::transactional_key_value_batch(
                &records,
                t.producer_id,
                t.producer_epoch,
                now,
            );
            partition
                .append_transactional(&batch, t.producer_id, t.producer_epoch, now)
                .map_err(|e| partition_error_code(&e))?
                .info
        }
    };
    Ok(Appended {
        partition,
        coordinator_epoch: write.coordinator_epoch,
        base_offset: info.base_offset,
        end_offset: info.last_offset + 1,
    })
}
