//! Builders of valid RecordBatch v2 bytes for tests (this crate's and, through
//! the `testing` feature, other crates').
//!
//! Records are encoded for real (varints, null key, a value, no headers), so
//! the bytes are what a Kafka client would send, and the CRC is computed over
//! them. Setting `compression` only sets the attribute bits: the body stays
//! uncompressed, which is enough for code that treats compressed batches as
//! opaque.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::batch::{put_varlong, BatchHeader, EndTxnMarker, BATCH_HEADER_LEN, MAGIC_V2};

/// Everything that varies between test batches. `Default` is a one-record,
/// non-idempotent CreateTime batch at offset 0 with timestamp 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSpec {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    /// Timestamp of the first record; record `i` gets `base_timestamp + i * timestamp_step`.
    pub base_timestamp: i64,
    pub timestamp_step: i64,
    pub record_count: i32,
    /// Length of every record's value.
    pub value_len: usize,
    /// Varies the value bytes so batches differ.
    pub value_seed: u8,
    pub transactional: bool,
    pub control: bool,
    pub log_append_time: bool,
    /// Compression codec bits (0..=4); the body is not actually compressed.
    pub compression: u8,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            base_offset: 0,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            base_timestamp: 0,
            timestamp_step: 1,
            record_count: 1,
            value_len: 16,
            value_seed: 0,
            transactional: false,
            control: false,
            log_append_time: false,
            compression: 0,
        }
    }
}

impl BatchSpec {
    /// An idempotent batch of `record_count` records.
    pub fn idempotent(
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
        record_count: i32,
    ) -> Self {
        BatchSpec {
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
            ..BatchSpec::default()
        }
    }

    /// A transactional batch of `record_count` records (idempotent too, as
    /// every transactional batch is).
    pub fn transactional(
        producer_id: i64,
        producer_epoch: i16,
        base_sequence: i32,
        record_count: i32,
    ) -> Self {
        BatchSpec {
            transactional: true,
            ..BatchSpec::idempotent(producer_id, producer_epoch, base_sequence, record_count)
        }
    }

    pub fn with_timestamp(mut self, base_timestamp: i64) -> Self {
        self.base_timestamp = base_timestamp;
        self
    }

    pub fn build(&self) -> Vec<u8> {
        build_batch(self)
    }
}

/// Encodes a complete, CRC-valid v2 batch.
pub fn build_batch(spec: &BatchSpec) -> Vec<u8> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut max_timestamp = i64::MIN;
    for i in 0..spec.record_count.max(0) {
        let timestamp_delta = i64::from(i) * spec.timestamp_step;
        max_timestamp = max_timestamp.max(spec.base_timestamp + timestamp_delta);
        record.clear();
        record.push(0); // attributes
        put_varlong(&mut record, timestamp_delta);
        put_varlong(&mut record, i64::from(i));
        put_varlong(&mut record, -1); // null key
        put_varlong(&mut record, spec.value_len as i64);
        record.extend(
            (0..spec.value_len)
                .map(|j| spec.value_seed.wrapping_add(i as u8).wrapping_add(j as u8)),
        );
        put_varlong(&mut record, 0); // no headers
        put_varlong(&mut records, record.len() as i64);
        records.extend_from_slice(&record);
    }
    if spec.record_count <= 0 {
        max_timestamp = spec.base_timestamp;
    }
    let mut attributes: i16 = i16::from(spec.compression & 0x07);
    if spec.log_append_time {
        attributes |= 0x08;
    }
    if spec.transactional {
        attributes |= 0x10;
    }
    if spec.control {
        attributes |= 0x20;
    }
    let last_offset_delta = (spec.record_count - 1).max(0);
    let batch_length = (BATCH_HEADER_LEN - 12 + records.len()) as i32;

    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + records.len());
    out.extend_from_slice(&spec.base_offset.to_be_bytes());
    out.extend_from_slice(&batch_length.to_be_bytes());
    out.extend_from_slice(&spec.partition_leader_epoch.to_be_bytes());
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, filled below
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&last_offset_delta.to_be_bytes());
    out.extend_from_slice(&spec.base_timestamp.to_be_bytes());
    out.extend_from_slice(&max_timestamp.to_be_bytes());
    out.extend_from_slice(&spec.producer_id.to_be_bytes());
    out.extend_from_slice(&spec.producer_epoch.to_be_bytes());
    out.extend_from_slice(&spec.base_sequence.to_be_bytes());
    out.extend_from_slice(&spec.record_count.to_be_bytes());
    debug_assert_eq!(out.len(), BATCH_HEADER_LEN);
    out.extend_from_slice(&records);
    crate::batch::recompute_crc(&mut out).expect("freshly built batch has a valid header");
    out
}

/// A non-idempotent batch of `record_count` records, all stamped `timestamp`.
pub fn simple_batch(record_count: i32, timestamp: i64) -> Vec<u8> {
    build_batch(&BatchSpec {
        record_count,
        base_timestamp: timestamp,
        timestamp_step: 0,
        ..BatchSpec::default()
    })
}

/// An idempotent batch: producer `producer_id`/`producer_epoch`, sequences
/// `base_sequence..base_sequence+record_count`, all stamped `timestamp`.
pub fn idempotent_batch(
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    record_count: i32,
    timestamp: i64,
) -> Vec<u8> {
    build_batch(&BatchSpec {
        timestamp_step: 0,
        ..BatchSpec::idempotent(producer_id, producer_epoch, base_sequence, record_count)
            .with_timestamp(timestamp)
    })
}

/// A transactional batch: producer `producer_id`/`producer_epoch`, sequences
/// `base_sequence..base_sequence+record_count`, all stamped `timestamp`.
pub fn transactional_batch(
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    record_count: i32,
    timestamp: i64,
) -> Vec<u8> {
    build_batch(&BatchSpec {
        timestamp_step: 0,
        ..BatchSpec::transactional(producer_id, producer_epoch, base_sequence, record_count)
            .with_timestamp(timestamp)
    })
}

/// The control batch of a COMMIT (`commit`) or ABORT marker, stamped `timestamp`.
pub fn marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    commit: bool,
    timestamp: i64,
) -> Vec<u8> {
    EndTxnMarker {
        producer_id,
        producer_epoch,
        coordinator_epoch,
        commit,
    }
    .to_batch(timestamp)
}

/// Headers of every batch in a buffer of whole batches; panics on a malformed buffer.
pub fn headers(buf: &[u8]) -> Vec<BatchHeader> {
    crate::batch::batches(buf).map(|b| b.unwrap().0).collect()
}

/// The batch bytes with base offset and leader epoch zeroed: what a producer
/// sent, for comparing a batch read back from the log with the one appended.
pub fn without_assigned_fields(batch: &[u8]) -> Vec<u8> {
    let mut copy = batch.to_vec();
    crate::batch::set_base_offset(&mut copy, 0);
    crate::batch::set_partition_leader_epoch(&mut copy, 0);
    copy
}

/// The producer of a [`keyed_batch`].
#[derive(Debug, Clone, Copy)]
pub struct KeyedProducer {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
}

/// A batch of keyed records (`None` value: a tombstone) stamped
/// `timestamp`, from `producer` if given.
pub fn keyed_batch(
    records: &[(&[u8], Option<&[u8]>)],
    producer: Option<KeyedProducer>,
    timestamp: i64,
) -> Vec<u8> {
    use crate::batch::{
        ATTRIBUTES_AT, BASE_SEQUENCE_AT, PRODUCER_EPOCH_AT, PRODUCER_ID_AT, TRANSACTIONAL,
    };
    let mut batch = crate::batch::key_value_batch(records, timestamp);
    if let Some(p) = producer {
        batch[PRODUCER_ID_AT..PRODUCER_ID_AT + 8].copy_from_slice(&p.producer_id.to_be_bytes());
        batch[PRODUCER_EPOCH_AT..PRODUCER_EPOCH_AT + 2].copy_from_slice(&p.epoch.to_be_bytes());
        batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4]
            .copy_from_slice(&p.base_sequence.to_be_bytes());
        if p.transactional {
            let attributes = i16::from_be_bytes([batch[ATTRIBUTES_AT], batch[ATTRIBUTES_AT + 1]])
                | TRANSACTIONAL;
            batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
        }
        crate::batch::recompute_crc(&mut batch).unwrap();
    }
    batch
}
