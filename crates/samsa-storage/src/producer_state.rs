//! Idempotent- and transactional-producer state of one partition, and its
//! snapshot files.
//!
//! Per producer id the manager keeps the current epoch and the metadata of the
//! last five batches (sequence range, offsets, timestamp), which is what Kafka
//! needs to recognise a retried batch and to reject gaps. Rules applied to a
//! batch with `producer_id >= 0` before anything of its request is written:
//!
//! | state                              | batch                                  | outcome                   |
//! |------------------------------------|----------------------------------------|---------------------------|
//! | no entry (new or expired producer) | any sequence                           | append (KIP-360)          |
//! | epoch E                            | epoch < E                              | `InvalidProducerEpoch`    |
//! | epoch E                            | epoch > E, base sequence 0             | append, window resets     |
//! | epoch E                            | epoch > E, base sequence != 0          | `OutOfOrderSequence`      |
//! | epoch E, batch cached              | same epoch, same (first, last) seq     | duplicate: original offsets, nothing written |
//! | epoch E, last seq L                | same epoch, base seq == L+1 (wraps)    | append                    |
//! | epoch E, no batch yet              | same epoch, base seq 0                 | append                    |
//! | otherwise                          |                                        | `OutOfOrderSequence`      |
//!
//! Transactions: the first transactional batch a producer appends while it
//! has no ongoing transaction opens one, at that batch's first offset; the
//! manager keeps every ongoing transaction by first offset, so the smallest
//! is the partition's first unstable offset (what bounds the last stable
//! offset). A transaction marker (ABORT or COMMIT control batch) closes the
//! producer's ongoing transaction, if it has one, and is checked first when a
//! leader writes it:
//!
//! | state                              | marker                                 | outcome                   |
//! |------------------------------------|----------------------------------------|---------------------------|
//! | no entry                           | any                                    | append                    |
//! | epoch E                            | epoch < E                              | `InvalidProducerEpoch`    |
//! | coordinator epoch C                | coordinator epoch < C                  | `TransactionCoordinatorFenced` |
//! | otherwise (ongoing txn or none)    |                                        | append; epoch := max(E, marker's) (a higher one resets the sequence window), coordinator epoch := marker's, no ongoing txn |
//!
//! A marker for a producer without an ongoing transaction is appended all the
//! same: the coordinator retries markers until every partition acknowledged,
//! so a repeated one must succeed and change nothing but epochs. A producer
//! with an ongoing transaction never expires (its coordinator's timeout ends
//! the transaction with a marker).
//!
//! The state is derived from the log: replaying every batch with a producer id
//! rebuilds it (`ProducerStateManager::apply_replicated`), without the checks
//! (the log is the truth). Snapshots (`{offset:020}.snapshot`, the state after
//! every batch below `offset`) bound that replay. A snapshot file is written
//! atomically; a damaged one is ignored (and deleted) by recovery. Layout,
//! big-endian (version 2; version 1, written before transactions existed, had
//! neither coordinator epoch nor transaction offset and is still read, as a
//! state with no ongoing transaction, which is what it described: that
//! version of samsa refused transactional batches):
//!
//! ```text
//! "SPST" | version u16 = 2 | crc32c u32 of everything after it | offset i64 | producer count u32
//! per producer: producer_id i64 | epoch i16 | last_sequence i32 | last_offset i64 | last_timestamp i64
//!               | coordinator_epoch i32 | ongoing transaction's first offset i64 (-1: none)
//!               | batch count u8 (<= 5) | per batch: first_seq i32 | last_seq i32 | first_offset i64
//!               | last_offset i64 | timestamp i64
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use crate::batch::{increment_sequence, BatchHeader, EndTxnMarker, NO_SEQUENCE};
use crate::error::{IoContext, StorageError};
use crate::fsutil;

/// How many recent batches per producer are remembered for duplicate detection.
pub const MAX_CACHED_BATCHES: usize = 5;

pub(crate) const SNAPSHOT_EXTENSION: &str = "snapshot";
const SNAPSHOT_MAGIC: &[u8; 4] = b"SPST";
const SNAPSHOT_VERSION: u16 = 2;
/// The version before transactions: no coordinator epoch, no ongoing transaction.
const SNAPSHOT_VERSION_NO_TXN: u16 = 1;
/// `coordinator_epoch` of a producer no marker was seen for.
pub const NO_COORDINATOR_EPOCH: i32 = -1;
/// magic(4) version(2) crc(4): the CRC covers everything after it.
const SNAPSHOT_CRC_COVERED_FROM: usize = 10;

/// One appended batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMetadata {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    /// The batch's max timestamp.
    pub timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStateEntry {
    pub producer_id: i64,
    pub epoch: i16,
    /// Sequence of the last record appended in this epoch; -1 if none.
    pub last_sequence: i32,
    /// Max timestamp of the last batch (data or control); drives expiration.
    pub last_timestamp: i64,
    /// Last offset of the last data batch; -1 if none.
    pub last_offset: i64,
    /// Coordinator epoch of the last transaction marker; -1 if none.
    pub coordinator_epoch: i32,
    /// First offset of the producer's ongoing transaction, if one is open.
    pub current_txn_first_offset: Option<i64>,
    /// Newest at the back; only batches of the current epoch.
    batches: VecDeque<BatchMetadata>,
}

impl ProducerStateEntry {
    fn new(producer_id: i64, epoch: i16) -> Self {
        ProducerStateEntry {
            producer_id,
            epoch,
            last_sequence: -1,
            last_timestamp: -1,
            last_offset: -1,
            coordinator_epoch: NO_COORDINATOR_EPOCH,
            current_txn_first_offset: None,
            batches: VecDeque::with_capacity(MAX_CACHED_BATCHES),
        }
    }

    /// First offset of the ongoing transaction, or -1 (DescribeProducers'
    /// `current_txn_start_offset`).
    pub fn current_txn_start_offset(&self) -> i64 {
        self.current_txn_first_offset.unwrap_or(-1)
    }

    /// The cached batches of the current epoch, oldest first.
    pub fn batches(&self) -> impl Iterator<Item = &BatchMetadata> {
        self.batches.iter()
    }

    /// A data batch; a transactional one opens a transaction unless one is open.
    fn record_data(&mut self, epoch: i16, batch: BatchMetadata, transactional: bool) {
        if transactional && self.current_txn_first_offset.is_none() {
            self.current_txn_first_offset = Some(batch.first_offset);
        }
        if epoch != self.epoch {
            self.epoch = epoch;
            self.batches.clear();
        }
        if self.batches.len() == MAX_CACHED_BATCHES {
            self.batches.pop_front();
        }
        self.batches.push_back(batch);
        self.last_sequence = batch.last_sequence;
        self.last_offset = batch.last_offset;
        self.last_timestamp = batch.timestamp;
    }

    /// A transaction marker carries the producer's epoch; a newer one fences
    /// the old epoch and restarts sequences.
    fn record_control(&mut self, epoch: i16, timestamp: i64) {
        if epoch > self.epoch {
            self.epoch = epoch;
            self.batches.clear();
            self.last_sequence = -1;
        }
        self.last_timestamp = self.last_timestamp.max(timestamp);
    }

    /// A transaction marker: closes the ongoing transaction, whose first
    /// offset is returned.
    fn record_marker(&mut self, epoch: i16, coordinator_epoch: i32, timestamp: i64) -> Option<i64> {
        self.record_control(epoch, timestamp);
        self.coordinator_epoch = coordinator_epoch;
        self.current_txn_first_offset.take()
    }
}

/// One producer as DescribeProducers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerDescription {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// -1 if the producer appended no data in its current epoch.
    pub last_sequence: i32,
    pub last_timestamp: i64,
    /// -1 if no marker was seen.
    pub coordinator_epoch: i32,
    /// First offset of the ongoing transaction, -1 if none.
    pub current_txn_start_offset: i64,
}

impl From<&ProducerStateEntry> for ProducerDescription {
    fn from(e: &ProducerStateEntry) -> Self {
        ProducerDescription {
            producer_id: e.producer_id,
            producer_epoch: e.epoch,
            last_sequence: e.last_sequence,
            last_timestamp: e.last_timestamp,
            coordinator_epoch: e.coordinator_epoch,
            current_txn_start_offset: e.current_txn_start_offset(),
        }
    }
}

/// A transaction a marker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
}

enum Verdict {
    Append,
    Duplicate(BatchMetadata),
}

/// The producer-state rules of the module docs, for one batch against the
/// producer's current entry.
fn check(
    entry: Option<&ProducerStateEntry>,
    producer_id: i64,
    epoch: i16,
    first_sequence: i32,
    last_sequence: i32,
) -> Result<Verdict, StorageError> {
    let Some(entry) = entry else {
        if first_sequence != 0 {
            // Legal (the producer's state expired or was never seen here),
            // but after a failover it also means a retried batch cannot be
            // recognised as one: worth a line.
            tracing::info!(
                producer_id,
                epoch,
                first_sequence,
                "batch from a producer without state here; appending at its sequence"
            );
        }
        return Ok(Verdict::Append);
    };
    if epoch < entry.epoch {
        return Err(StorageError::InvalidProducerEpoch {
            producer_id,
            current: entry.epoch,
            found: epoch,
        });
    }
    if epoch > entry.epoch {
        if first_sequence != 0 {
            return Err(StorageError::OutOfOrderSequence {
                producer_id,
                expected: 0,
                found: first_sequence,
            });
        }
        return Ok(Verdict::Append);
    }
    if let Some(duplicate) = entry
        .batches
        .iter()
        .find(|b| b.first_sequence == first_sequence && b.last_sequence == last_sequence)
    {
        return Ok(Verdict::Duplicate(*duplicate));
    }
    let expected = match entry.batches.back() {
        Some(latest) => increment_sequence(latest.last_sequence, 1),
        None => 0,
    };
    if first_sequence != expected {
        return Err(StorageError::OutOfOrderSequence {
            producer_id,
            expected,
            found: first_sequence,
        });
    }
    Ok(Verdict::Append)
}

/// Entries changed by an append that is validated but not yet written: the
/// log commits them only after the write succeeded, so a failed or rejected
/// request leaves the state untouched.
#[derive(Debug, Default)]
pub(crate) struct StagedProducers {
    entries: Vec<ProducerStateEntry>,
}

impl StagedProducers {
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[derive(Debug, Clone)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerStateEntry>,
    /// First offset -> producer id of every ongoing transaction: exactly the
    /// entries' `current_txn_first_offset`s (two transactions cannot start at
    /// the same offset).
    ongoing_txns: BTreeMap<i64, i64>,
    expiration_ms: i64,
}

impl ProducerStateManager {
    pub fn new(expiration_ms: i64) -> Self {
        ProducerStateManager {
            producers: HashMap::new(),
            ongoing_txns: BTreeMap::new(),
            expiration_ms,
        }
    }

    /// Inserts or replaces an entry, keeping `ongoing_txns` in step.
    fn insert(&mut self, entry: ProducerStateEntry) {
        let producer_id = entry.producer_id;
        let started = entry.current_txn_first_offset;
        if let Some(old) = self.producers.insert(producer_id, entry) {
            if let Some(first) = old.current_txn_first_offset.filter(|&f| Some(f) != started) {
                self.ongoing_txns.remove(&first);
            }
        }
        if let Some(first) = started {
            self.ongoing_txns.insert(first, producer_id);
        }
    }

    /// Changes the entry of `producer_id` (created at `epoch` if missing),
    /// keeping `ongoing_txns` in step.
    fn update<R>(
        &mut self,
        producer_id: i64,
        epoch: i16,
        change: impl FnOnce(&mut ProducerStateEntry) -> R,
    ) -> R {
        let entry = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| ProducerStateEntry::new(producer_id, epoch));
        let before = entry.current_txn_first_offset;
        let result = change(entry);
        let after = entry.current_txn_first_offset;
        if before != after {
            if let Some(first) = before {
                self.ongoing_txns.remove(&first);
            }
            if let Some(first) = after {
                self.ongoing_txns.insert(first, producer_id);
            }
        }
        result
    }

    /// Smallest first offset of the ongoing transactions.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing_txns.keys().next().copied()
    }

    /// `(producer id, first offset)` of every ongoing transaction, by first offset.
    pub fn ongoing_transactions(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ongoing_txns
            .iter()
            .map(|(&first, &producer_id)| (producer_id, first))
    }

    pub fn get(&self, producer_id: i64) -> Option<&ProducerStateEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ProducerStateEntry> {
        self.producers.values()
    }

    /// Drops producers whose last batch is `producer_id_expiration_ms` or more
    /// older than `now_ms`, except those with an ongoing transaction (only a
    /// marker may end it). Returns how many were dropped.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let before = self.producers.len();
        let expiration_ms = self.expiration_ms;
        self.producers.retain(|_, e| {
            e.current_txn_first_offset.is_some()
                || now_ms.saturating_sub(e.last_timestamp) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Checks a leader-appended batch (offsets `first_offset..=last_offset`,
    /// max timestamp `timestamp`) against the state as changed by the earlier
    /// batches of the same request, and stages its effect. Returns the cached
    /// batch if this one is a retried duplicate.
    pub(crate) fn stage(
        &self,
        staged: &mut StagedProducers,
        header: &BatchHeader,
        first_offset: i64,
        last_offset: i64,
        timestamp: i64,
    ) -> Result<Option<BatchMetadata>, StorageError> {
        let producer_id = header.producer_id;
        let first_sequence = header.base_sequence;
        let last_sequence = header.last_sequence();
        let staged_index = staged
            .entries
            .iter()
            .position(|e| e.producer_id == producer_id);
        let current = match staged_index {
            Some(i) => Some(&staged.entries[i]),
            None => self.producers.get(&producer_id),
        };
        if first_sequence == NO_SEQUENCE && header.is_transactional() {
            // A group coordinator's write of offsets committed in the
            // producer's transaction: it carries the producer's epoch but no
            // sequence of its own (produce refuses such batches from
            // clients), so only the epoch is checked.
            if let Some(entry) = current.filter(|e| header.producer_epoch < e.epoch) {
                return Err(StorageError::InvalidProducerEpoch {
                    producer_id,
                    current: entry.epoch,
                    found: header.producer_epoch,
                });
            }
        } else if let Verdict::Duplicate(original) = check(
            current,
            producer_id,
            header.producer_epoch,
            first_sequence,
            last_sequence,
        )? {
            return Ok(Some(original));
        }
        let entry = match staged_index {
            Some(i) => &mut staged.entries[i],
            None => {
                let entry = self
                    .producers
                    .get(&producer_id)
                    .cloned()
                    .unwrap_or_else(|| ProducerStateEntry::new(producer_id, header.producer_epoch));
                staged.entries.push(entry);
                let last = staged.entries.len() - 1;
                &mut staged.entries[last]
            }
        };
        entry.record_data(
            header.producer_epoch,
            BatchMetadata {
                first_sequence,
                last_sequence,
                first_offset,
                last_offset,
                timestamp,
            },
            header.is_transactional(),
        );
        Ok(None)
    }

    /// Makes staged changes current (after their batches were written).
    pub(crate) fn commit(&mut self, staged: &mut StagedProducers) {
        for entry in staged.entries.drain(..) {
            self.insert(entry);
        }
    }

    /// The marker rules of the module docs, for a marker a leader is about to write.
    pub(crate) fn check_marker(&self, marker: &EndTxnMarker) -> Result<(), StorageError> {
        let Some(entry) = self.producers.get(&marker.producer_id) else {
            return Ok(());
        };
        if marker.producer_epoch < entry.epoch {
            return Err(StorageError::InvalidProducerEpoch {
                producer_id: marker.producer_id,
                current: entry.epoch,
                found: marker.producer_epoch,
            });
        }
        if marker.coordinator_epoch < entry.coordinator_epoch {
            return Err(StorageError::TransactionCoordinatorFenced {
                producer_id: marker.producer_id,
                current: entry.coordinator_epoch,
                found: marker.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Applies a marker written at `offset` (checked by the leader, or
    /// replicated). Returns the transaction it ended, if one was ongoing.
    pub(crate) fn apply_marker(
        &mut self,
        marker: &EndTxnMarker,
        offset: i64,
        timestamp: i64,
    ) -> Option<CompletedTxn> {
        let first_offset = self.update(marker.producer_id, marker.producer_epoch, |entry| {
            entry.record_marker(marker.producer_epoch, marker.coordinator_epoch, timestamp)
        })?;
        Some(CompletedTxn {
            producer_id: marker.producer_id,
            first_offset,
            last_offset: offset,
            aborted: !marker.commit,
        })
    }

    /// Applies a batch that is already in the log (replay on open, follower
    /// append) without checking it: the log is the truth. `marker` is the
    /// batch's transaction marker if it is a control batch that holds one; a
    /// control batch without one only moves the producer's epoch. Returns the
    /// transaction a marker ended.
    pub(crate) fn apply_replicated(
        &mut self,
        header: &BatchHeader,
        marker: Option<&EndTxnMarker>,
    ) -> Option<CompletedTxn> {
        if !header.has_producer_id() {
            return None;
        }
        let timestamp = header.max_timestamp;
        if header.is_control() {
            if let Some(marker) = marker {
                return self.apply_marker(marker, header.base_offset, timestamp);
            }
            self.update(header.producer_id, header.producer_epoch, |entry| {
                entry.record_control(header.producer_epoch, timestamp)
            });
            return None;
        }
        self.update(header.producer_id, header.producer_epoch, |entry| {
            entry.record_data(
                header.producer_epoch,
                BatchMetadata {
                    first_sequence: header.base_sequence,
                    last_sequence: header.last_sequence(),
                    first_offset: header.base_offset,
                    last_offset: header.last_offset(),
                    timestamp,
                },
                header.is_transactional(),
            )
        });
        None
    }

    pub(crate) fn clear(&mut self) {
        self.producers.clear();
        self.ongoing_txns.clear();
    }

    fn encode(&self, offset: i64) -> Vec<u8> {
        let mut out = Vec::with_capacity(22 + self.producers.len() * 64);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        let mut ids: Vec<&i64> = self.producers.keys().collect();
        ids.sort_unstable();
        for id in ids {
            let e = &self.producers[id];
            out.extend_from_slice(&e.producer_id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_sequence.to_be_bytes());
            out.extend_from_slice(&e.last_offset.to_be_bytes());
            out.extend_from_slice(&e.last_timestamp.to_be_bytes());
            out.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            out.extend_from_slice(&e.current_txn_start_offset().to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_sequence.to_be_bytes());
                out.extend_from_slice(&b.last_sequence.to_be_bytes());
                out.extend_from_slice(&b.first_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
                out.extend_from_slice(&b.timestamp.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out[SNAPSHOT_CRC_COVERED_FROM..]);
        out[6..10].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8], expiration_ms: i64) -> Result<(ProducerStateManager, i64), String> {
        let mut r = Reader { bytes, at: 0 };
        if r.take(4)? != SNAPSHOT_MAGIC {
            return Err("bad magic".into());
        }
        let version = r.u16()?;
        if version != SNAPSHOT_VERSION && version != SNAPSHOT_VERSION_NO_TXN {
            return Err(format!("unsupported version {version}"));
        }
        let stored_crc = r.u32()?;
        let actual_crc = crc32c::crc32c(&bytes[SNAPSHOT_CRC_COVERED_FROM..]);
        if stored_crc != actual_crc {
            return Err(format!(
                "crc mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}"
            ));
        }
        let offset = r.i64()?;
        let count = r.u32()?;
        let mut manager = ProducerStateManager::new(expiration_ms);
        for _ in 0..count {
            let mut entry = ProducerStateEntry::new(r.i64()?, r.i16()?);
            entry.last_sequence = r.i32()?;
            entry.last_offset = r.i64()?;
            entry.last_timestamp = r.i64()?;
            if version >= SNAPSHOT_VERSION {
                entry.coordinator_epoch = r.i32()?;
                let first = r.i64()?;
                if first >= 0 {
                    if first >= offset || manager.ongoing_txns.contains_key(&first) {
                        return Err(format!(
                            "producer {} has a transaction at {first} that cannot be ongoing at {offset}",
                            entry.producer_id
                        ));
                    }
                    entry.current_txn_first_offset = Some(first);
                } else if first != -1 {
                    return Err(format!(
                        "producer {} has transaction offset {first}",
                        entry.producer_id
                    ));
                }
            }
            let batches = r.take(1)?[0] as usize;
            if batches > MAX_CACHED_BATCHES {
                return Err(format!(
                    "producer {} has {batches} cached batches",
                    entry.producer_id
                ));
            }
            for _ in 0..batches {
                entry.batches.push_back(BatchMetadata {
                    first_sequence: r.i32()?,
                    last_sequence: r.i32()?,
                    first_offset: r.i64()?,
                    last_offset: r.i64()?,
                    timestamp: r.i64()?,
                });
            }
            if manager.producers.contains_key(&entry.producer_id) {
                return Err(format!("producer {} appears twice", entry.producer_id));
            }
            manager.insert(entry);
        }
        if r.at != bytes.len() {
            return Err("trailing bytes".into());
        }
        Ok((manager, offset))
    }

    /// Writes the state as of `offset` (every batch below it applied) to
    /// `{offset:020}.snapshot`, atomically.
    pub(crate) fn write_snapshot(&self, dir: &Path, offset: i64) -> Result<(), StorageError> {
        let path = snapshot_path(dir, offset);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| StorageError::Corrupt(path.clone(), "unnamed snapshot path".into()))?
            .to_owned();
        fsutil::write_atomically(dir, &name, &self.encode(offset))
    }

    /// Reads a snapshot file. `Ok(Err(reason))` means the file exists but is damaged.
    pub(crate) fn read_snapshot(
        path: &Path,
        offset: i64,
        expiration_ms: i64,
    ) -> Result<Result<ProducerStateManager, String>, StorageError> {
        let bytes = std::fs::read(path).at(path)?;
        Ok(match Self::decode(&bytes, expiration_ms) {
            Ok((manager, stored)) if stored == offset => Ok(manager),
            Ok((_, stored)) => Err(format!(
                "file is named for offset {offset} but holds offset {stored}"
            )),
            Err(reason) => Err(reason),
        })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or("truncated")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }
    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn i16(&mut self) -> Result<i16, String> {
        Ok(self.u16()? as i16)
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self) -> Result<i32, String> {
        Ok(self.u32()? as i32)
    }
    fn i64(&mut self) -> Result<i64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }
}

pub(crate) fn snapshot_path(dir: &Path, offset: i64) -> PathBuf {
    fsutil::offset_file_name(dir, offset, SNAPSHOT_EXTENSION)
}

/// Offsets of the snapshot files in `dir`, ascending.
pub(crate) fn list_snapshots(dir: &Path) -> Result<Vec<i64>, StorageError> {
    let mut offsets = Vec::new();
    for entry in std::fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        if let Some(offset) = entry
            .file_name()
            .to_str()
            .and_then(|n| fsutil::parse_offset_file_name(n, SNAPSHOT_EXTENSION))
        {
            offsets.push(offset);
        }
    }
    offsets.sort_unstable();
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::batch::BatchHeader;
    use crate::testing::{build_batch, marker_batch, BatchSpec};

    fn header(pid: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        BatchHeader::parse(&build_batch(&BatchSpec::idempotent(pid, epoch, seq, count))).unwrap()
    }

    /// Stages and commits one batch at `offset`; returns the duplicate if any.
    fn append(
        m: &mut ProducerStateManager,
        h: &BatchHeader,
        offset: i64,
    ) -> Result<Option<BatchMetadata>, StorageError> {
        let mut staged = StagedProducers::default();
        let dup = m.stage(
            &mut staged,
            h,
            offset,
            offset + i64::from(h.last_offset_delta),
            100,
        )?;
        m.commit(&mut staged);
        Ok(dup)
    }

    #[test]
    fn sequences_must_follow_and_retries_are_duplicates() {
        let mut m = ProducerStateManager::new(1000);
        assert!(append(&mut m, &header(1, 0, 0, 5), 0).unwrap().is_none());
        assert!(append(&mut m, &header(1, 0, 5, 5), 5).unwrap().is_none());
        let e = m.get(1).unwrap();
        assert_eq!((e.epoch, e.last_sequence, e.last_offset), (0, 9, 9));
        let dup = append(&mut m, &header(1, 0, 0, 5), 99).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (0, 4));
        match append(&mut m, &header(1, 0, 11, 1), 10) {
            Err(StorageError::OutOfOrderSequence {
                producer_id: 1,
                expected: 10,
                found: 11,
            }) => {}
            other => panic!("{other:?}"),
        }
        // A batch overlapping but not equal to a cached one is out of order, not a duplicate.
        assert!(matches!(
            append(&mut m, &header(1, 0, 5, 3), 10),
            Err(StorageError::OutOfOrderSequence { .. })
        ));
    }

    #[test]
    fn only_the_last_five_batches_are_deduplicated() {
        let mut m = ProducerStateManager::new(1000);
        for i in 0..7 {
            append(&mut m, &header(1, 0, i, 1), i64::from(i)).unwrap();
        }
        assert_eq!(m.get(1).unwrap().batches().count(), MAX_CACHED_BATCHES);
        assert!(append(&mut m, &header(1, 0, 2, 1), 50).unwrap().is_some());
        // Sequence 1 fell out of the window: now it is just out of order.
        assert!(matches!(
            append(&mut m, &header(1, 0, 1, 1), 50),
            Err(StorageError::OutOfOrderSequence { expected: 7, .. })
        ));
    }

    #[test]
    fn epochs_fence_and_bump() {
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &header(7, 3, 0, 2), 0).unwrap();
        assert!(matches!(
            append(&mut m, &header(7, 2, 2, 1), 2),
            Err(StorageError::InvalidProducerEpoch {
                producer_id: 7,
                current: 3,
                found: 2
            })
        ));
        assert!(matches!(
            append(&mut m, &header(7, 4, 5, 1), 2),
            Err(StorageError::OutOfOrderSequence {
                expected: 0,
                found: 5,
                ..
            })
        ));
        append(&mut m, &header(7, 4, 0, 1), 2).unwrap();
        let e = m.get(7).unwrap();
        assert_eq!(e.epoch, 4);
        assert_eq!(e.batches().count(), 1, "window reset on epoch bump");
        // The old epoch's batch is no longer a duplicate: it is fenced.
        assert!(matches!(
            append(&mut m, &header(7, 3, 0, 2), 3),
            Err(StorageError::InvalidProducerEpoch { .. })
        ));
    }

    #[test]
    fn unknown_producers_start_anywhere() {
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &header(5, 0, 1234, 3), 0).unwrap();
        assert_eq!(m.get(5).unwrap().last_sequence, 1236);
        append(&mut m, &header(5, 0, 1237, 1), 3).unwrap();
    }

    #[test]
    fn sequence_wraps_after_i32_max() {
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &header(5, 0, i32::MAX - 1, 2), 0).unwrap();
        assert_eq!(m.get(5).unwrap().last_sequence, i32::MAX);
        append(&mut m, &header(5, 0, 0, 1), 2).unwrap();
    }

    #[test]
    fn staging_sees_earlier_batches_of_the_same_request_and_commits_nothing_on_error() {
        let m = ProducerStateManager::new(1000);
        let mut staged = StagedProducers::default();
        m.stage(&mut staged, &header(1, 0, 0, 2), 0, 1, 5).unwrap();
        m.stage(&mut staged, &header(1, 0, 2, 2), 2, 3, 5).unwrap();
        assert!(m.stage(&mut staged, &header(1, 0, 9, 1), 4, 4, 5).is_err());
        assert!(m.is_empty(), "nothing committed yet");
    }

    #[test]
    fn control_batches_bump_epoch_and_reset_sequences() {
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &header(3, 0, 0, 2), 0).unwrap();
        let marker = BatchHeader::parse(&build_batch(&BatchSpec {
            control: true,
            transactional: true,
            ..BatchSpec::idempotent(3, 1, -1, 1)
        }))
        .unwrap();
        m.apply_replicated(&marker, None);
        let e = m.get(3).unwrap();
        assert_eq!(e.epoch, 1);
        assert_eq!(e.last_offset, 1, "markers are not data");
        assert!(matches!(
            append(&mut m, &header(3, 1, 5, 1), 3),
            Err(StorageError::OutOfOrderSequence { expected: 0, .. })
        ));
        append(&mut m, &header(3, 1, 0, 1), 3).unwrap();
    }

    #[test]
    fn expiration_drops_idle_producers() {
        let mut m = ProducerStateManager::new(1000);
        let mut staged = StagedProducers::default();
        m.stage(&mut staged, &header(1, 0, 0, 1), 0, 0, 10_000)
            .unwrap();
        m.stage(&mut staged, &header(2, 0, 0, 1), 1, 1, 10_500)
            .unwrap();
        m.commit(&mut staged);
        assert_eq!(m.expire(10_999), 0);
        assert_eq!(m.expire(11_000), 1);
        assert!(m.get(1).is_none() && m.get(2).is_some());
        assert_eq!(m.expire(11_500), 1);
        assert!(m.is_empty());
    }

    #[test]
    fn snapshot_round_trip_and_damage_detection() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(1000);
        for pid in 0..20 {
            for s in 0..(pid % 7) {
                append(
                    &mut m,
                    &header(pid, (pid % 3) as i16, (s * 2) as i32, 2),
                    pid * 100 + s * 2,
                )
                .unwrap();
            }
        }
        m.write_snapshot(dir.path(), 1234).unwrap();
        let path = snapshot_path(dir.path(), 1234);
        let loaded = ProducerStateManager::read_snapshot(&path, 1234, 1000)
            .unwrap()
            .unwrap();
        assert_eq!(loaded.len(), m.len());
        for e in m.iter() {
            let l = loaded.get(e.producer_id).unwrap();
            assert_eq!(l, e);
        }
        assert_eq!(list_snapshots(dir.path()).unwrap(), vec![1234]);

        let good = std::fs::read(&path).unwrap();
        for at in [0, 5, 8, 12, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                ProducerStateManager::read_snapshot(&path, 1234, 1000)
                    .unwrap()
                    .is_err(),
                "flip at {at} undetected"
            );
        }
        std::fs::write(&path, &good[..good.len() - 3]).unwrap();
        assert!(ProducerStateManager::read_snapshot(&path, 1234, 1000)
            .unwrap()
            .is_err());
        std::fs::write(&path, &good).unwrap();
        assert!(ProducerStateManager::read_snapshot(&path, 999, 1000)
            .unwrap()
            .is_err());
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        BatchHeader::parse(&build_batch(&BatchSpec::transactional(
            pid, epoch, seq, count,
        )))
        .unwrap()
    }

    fn marker(pid: i64, epoch: i16, coordinator_epoch: i32, commit: bool) -> EndTxnMarker {
        EndTxnMarker {
            producer_id: pid,
            producer_epoch: epoch,
            coordinator_epoch,
            commit,
        }
    }

    /// Checks and applies a marker at `offset`, as a leader does.
    fn end_txn(
        m: &mut ProducerStateManager,
        marker: EndTxnMarker,
        offset: i64,
    ) -> Result<Option<CompletedTxn>, StorageError> {
        m.check_marker(&marker)?;
        Ok(m.apply_marker(&marker, offset, 100))
    }

    #[test]
    fn transactional_batches_open_a_transaction_at_their_first_offset() {
        let mut m = ProducerStateManager::new(1000);
        assert_eq!(m.first_unstable_offset(), None);
        append(&mut m, &header(1, 0, 0, 2), 0).unwrap();
        assert_eq!(
            m.first_unstable_offset(),
            None,
            "idempotent is not transactional"
        );
        append(&mut m, &txn_header(2, 0, 0, 3), 2).unwrap();
        append(&mut m, &txn_header(3, 0, 0, 1), 5).unwrap();
        append(&mut m, &txn_header(2, 0, 3, 1), 6).unwrap();
        assert_eq!(m.get(2).unwrap().current_txn_first_offset, Some(2));
        assert_eq!(m.get(3).unwrap().current_txn_start_offset(), 5);
        assert_eq!(m.get(1).unwrap().current_txn_start_offset(), -1);
        assert_eq!(m.first_unstable_offset(), Some(2));
        assert_eq!(
            m.ongoing_transactions().collect::<Vec<_>>(),
            vec![(2, 2), (3, 5)]
        );

        let done = end_txn(&mut m, marker(2, 0, 0, false), 7).unwrap().unwrap();
        assert_eq!(
            done,
            CompletedTxn {
                producer_id: 2,
                first_offset: 2,
                last_offset: 7,
                aborted: true
            }
        );
        assert_eq!(m.first_unstable_offset(), Some(5));
        let done = end_txn(&mut m, marker(3, 0, 0, true), 8).unwrap().unwrap();
        assert!(!done.aborted);
        assert_eq!(m.first_unstable_offset(), None);
        // The next transaction of producer 2 continues its sequence (same epoch).
        append(&mut m, &txn_header(2, 0, 4, 1), 9).unwrap();
        assert_eq!(m.first_unstable_offset(), Some(9));
    }

    #[test]
    fn markers_are_fenced_by_producer_and_coordinator_epochs() {
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &txn_header(1, 5, 0, 1), 0).unwrap();
        end_txn(&mut m, marker(1, 5, 3, true), 1).unwrap();
        assert_eq!(m.get(1).unwrap().coordinator_epoch, 3);
        append(&mut m, &txn_header(1, 5, 1, 1), 2).unwrap();
        assert!(matches!(
            end_txn(&mut m, marker(1, 4, 3, false), 3),
            Err(StorageError::InvalidProducerEpoch {
                producer_id: 1,
                current: 5,
                found: 4
            })
        ));
        assert!(matches!(
            end_txn(&mut m, marker(1, 5, 2, false), 3),
            Err(StorageError::TransactionCoordinatorFenced {
                producer_id: 1,
                current: 3,
                found: 2
            })
        ));
        assert_eq!(
            m.first_unstable_offset(),
            Some(2),
            "rejected markers change nothing"
        );
        // A newer coordinator and a bumped epoch (what ending a transaction
        // with an epoch bump writes): accepted, sequences restart.
        let done = end_txn(&mut m, marker(1, 6, 4, false), 3).unwrap().unwrap();
        assert_eq!(done.first_offset, 2);
        let e = m.get(1).unwrap();
        assert_eq!((e.epoch, e.coordinator_epoch, e.last_sequence), (6, 4, -1));
        assert!(matches!(
            append(&mut m, &txn_header(1, 6, 2, 1), 4),
            Err(StorageError::OutOfOrderSequence { expected: 0, .. })
        ));
        append(&mut m, &txn_header(1, 6, 0, 1), 4).unwrap();
    }

    #[test]
    fn markers_without_a_transaction_are_harmless_and_may_bump_the_epoch() {
        let mut m = ProducerStateManager::new(1000);
        assert_eq!(end_txn(&mut m, marker(9, 2, 1, true), 0).unwrap(), None);
        let e = m.get(9).unwrap();
        assert_eq!((e.epoch, e.coordinator_epoch), (2, 1));
        // A retried marker: same epochs, nothing ongoing, nothing changes.
        assert_eq!(end_txn(&mut m, marker(9, 2, 1, true), 1).unwrap(), None);
        assert_eq!(end_txn(&mut m, marker(9, 3, 1, false), 2).unwrap(), None);
        assert_eq!(m.get(9).unwrap().epoch, 3);
        assert_eq!(m.first_unstable_offset(), None);
    }

    #[test]
    fn replicated_batches_track_transactions_like_leader_appends() {
        let mut m = ProducerStateManager::new(1000);
        let mut data = build_batch(&BatchSpec::transactional(4, 1, 0, 2));
        crate::batch::set_base_offset(&mut data, 10);
        m.apply_replicated(&BatchHeader::parse(&data).unwrap(), None);
        assert_eq!(m.first_unstable_offset(), Some(10));
        let mut abort = marker_batch(4, 1, 7, false, 50);
        crate::batch::set_base_offset(&mut abort, 12);
        let parsed = EndTxnMarker::parse(&abort).unwrap();
        let done = m
            .apply_replicated(&BatchHeader::parse(&abort).unwrap(), parsed.as_ref())
            .unwrap();
        assert_eq!(
            (done.first_offset, done.last_offset, done.aborted),
            (10, 12, true)
        );
        assert_eq!(m.get(4).unwrap().coordinator_epoch, 7);
        assert_eq!(m.first_unstable_offset(), None);
        // Replication does not check: an older coordinator epoch is taken as is.
        let mut late = marker_batch(4, 1, 6, true, 60);
        crate::batch::set_base_offset(&mut late, 13);
        let parsed = EndTxnMarker::parse(&late).unwrap();
        assert_eq!(
            m.apply_replicated(&BatchHeader::parse(&late).unwrap(), parsed.as_ref()),
            None
        );
        assert_eq!(m.get(4).unwrap().coordinator_epoch, 6);
    }

    #[test]
    fn a_rejected_request_opens_no_transaction() {
        let m = ProducerStateManager::new(1000);
        let mut staged = StagedProducers::default();
        m.stage(&mut staged, &txn_header(1, 0, 0, 1), 0, 0, 5)
            .unwrap();
        assert!(m
            .stage(&mut staged, &txn_header(1, 0, 5, 1), 1, 1, 5)
            .is_err());
        assert_eq!(m.first_unstable_offset(), None);
    }

    #[test]
    fn producers_with_an_ongoing_transaction_do_not_expire() {
        let mut m = ProducerStateManager::new(1000);
        let mut staged = StagedProducers::default();
        m.stage(&mut staged, &txn_header(1, 0, 0, 1), 0, 0, 10_000)
            .unwrap();
        m.stage(&mut staged, &header(2, 0, 0, 1), 1, 1, 10_000)
            .unwrap();
        m.commit(&mut staged);
        assert_eq!(m.expire(1_000_000), 1);
        assert!(m.get(1).is_some() && m.get(2).is_none());
        m.check_marker(&marker(1, 0, 0, true)).unwrap();
        m.apply_marker(&marker(1, 0, 0, true), 2, 10_000);
        assert_eq!(m.expire(1_000_000), 1);
        assert!(m.is_empty());
    }

    #[test]
    fn snapshots_keep_transactions_and_coordinator_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &txn_header(1, 0, 0, 2), 0).unwrap();
        append(&mut m, &txn_header(2, 3, 0, 1), 2).unwrap();
        end_txn(&mut m, marker(2, 3, 9, true), 3).unwrap();
        append(&mut m, &txn_header(2, 3, 1, 1), 4).unwrap();
        append(&mut m, &header(3, 0, 0, 1), 5).unwrap();
        m.write_snapshot(dir.path(), 6).unwrap();
        let loaded = ProducerStateManager::read_snapshot(&snapshot_path(dir.path(), 6), 6, 1000)
            .unwrap()
            .unwrap();
        for e in m.iter() {
            assert_eq!(loaded.get(e.producer_id).unwrap(), e);
        }
        assert_eq!(loaded.get(2).unwrap().coordinator_epoch, 9);
        assert_eq!(
            loaded.ongoing_transactions().collect::<Vec<_>>(),
            vec![(1, 0), (2, 4)]
        );
        // A transaction cannot be ongoing from the snapshot's offset or later.
        m.write_snapshot(dir.path(), 4).unwrap();
        assert!(
            ProducerStateManager::read_snapshot(&snapshot_path(dir.path(), 4), 4, 1000)
                .unwrap()
                .is_err()
        );
    }

    /// A snapshot as the version before transactions wrote it.
    fn encode_version_1(m: &ProducerStateManager, offset: i64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&1u16.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(m.len() as u32).to_be_bytes());
        for e in m.iter() {
            out.extend_from_slice(&e.producer_id.to_be_bytes());
            out.extend_from_slice(&e.epoch.to_be_bytes());
            out.extend_from_slice(&e.last_sequence.to_be_bytes());
            out.extend_from_slice(&e.last_offset.to_be_bytes());
            out.extend_from_slice(&e.last_timestamp.to_be_bytes());
            out.push(e.batches.len() as u8);
            for b in &e.batches {
                out.extend_from_slice(&b.first_sequence.to_be_bytes());
                out.extend_from_slice(&b.last_sequence.to_be_bytes());
                out.extend_from_slice(&b.first_offset.to_be_bytes());
                out.extend_from_slice(&b.last_offset.to_be_bytes());
                out.extend_from_slice(&b.timestamp.to_be_bytes());
            }
        }
        let crc = crc32c::crc32c(&out[SNAPSHOT_CRC_COVERED_FROM..]);
        out[6..10].copy_from_slice(&crc.to_be_bytes());
        out
    }

    #[test]
    fn version_1_snapshots_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = ProducerStateManager::new(1000);
        append(&mut m, &header(1, 0, 0, 2), 0).unwrap();
        append(&mut m, &header(2, 4, 0, 1), 2).unwrap();
        append(&mut m, &header(1, 0, 2, 2), 3).unwrap();
        let path = snapshot_path(dir.path(), 5);
        std::fs::write(&path, encode_version_1(&m, 5)).unwrap();
        let loaded = ProducerStateManager::read_snapshot(&path, 5, 1000)
            .unwrap()
            .unwrap();
        for e in m.iter() {
            let l = loaded.get(e.producer_id).unwrap();
            assert_eq!(l, e);
            assert_eq!(l.coordinator_epoch, NO_COORDINATOR_EPOCH);
        }
        assert_eq!(loaded.first_unstable_offset(), None);
        let mut unknown = std::fs::read(&path).unwrap();
        unknown[5] = 3;
        std::fs::write(&path, unknown).unwrap();
        assert!(ProducerStateManager::read_snapshot(&path, 5, 1000)
            .unwrap()
            .is_err());
    }
}
