//! Kafka RecordBatch v2 framing: header parsing, CRC-32C, in-place rewrites of
//! the fields the log assigns, and iteration over buffers of whole batches.
//!
//! The log stores batches as opaque bytes and only ever reads their 61-byte
//! header; this module owns the byte layout of that header. Layout (big-endian):
//!
//! ```text
//!  0 base_offset i64        | 12 partition_leader_epoch i32 | 16 magic i8 | 17 crc u32
//! 21 attributes i16         | 23 last_offset_delta i32      | 27 base_timestamp i64
//! 35 max_timestamp i64      | 43 producer_id i64            | 51 producer_epoch i16
//! 53 base_sequence i32      | 57 records_count i32          | 61 records…
//!  8 batch_length i32 counts the bytes after itself: a batch is 12 + batch_length bytes.
//! ```
//!
//! The CRC covers bytes 21..end, so base offset and leader epoch can be rewritten
//! without recomputing it; max timestamp and attributes cannot.
//!
//! Records themselves are parsed only where the log needs a per-record answer
//! (ListOffsets by timestamp, in `record_time`; the type of a control
//! record) and where a batch is rewritten into its topic's codec:
//! [`records`] walks an uncompressed batch, [`records_in`] a records
//! section `compression` decompressed. This module knows no codec, so
//! `compression` can build on it.
//!
//! Transaction markers ([`EndTxnMarker`]) are the one kind of batch the log
//! builds itself: a control batch (attributes transactional | control, no
//! sequence) holding one record whose key is `version i16 = 0 | type i16`
//! (0 = ABORT, 1 = COMMIT) and whose value is `version i16 = 0 |
//! coordinator_epoch i32`.

/// Size of the fixed header of a v2 batch.
pub const BATCH_HEADER_LEN: usize = 61;
/// base_offset + batch_length: the bytes not counted by batch_length.
pub const LOG_OVERHEAD: usize = 12;
/// The only record format this log stores.
pub const MAGIC_V2: i8 = 2;
/// Smallest legal batch_length: a header with no records.
pub const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32;
/// `producer_id`, `producer_epoch` and `base_sequence` of non-idempotent batches.
pub const NO_PRODUCER_ID: i64 = -1;
pub const NO_SEQUENCE: i32 = -1;
/// A timestamp that is absent.
pub const NO_TIMESTAMP: i64 = -1;

const BASE_OFFSET_AT: usize = 0;
pub(crate) const BATCH_LENGTH_AT: usize = 8;
const PARTITION_LEADER_EPOCH_AT: usize = 12;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
/// First byte covered by the CRC.
pub const CRC_COVERED_FROM: usize = 21;
pub(crate) const ATTRIBUTES_AT: usize = 21;
const LAST_OFFSET_DELTA_AT: usize = 23;
pub(crate) const BASE_TIMESTAMP_AT: usize = 27;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;
pub(crate) const PRODUCER_ID_AT: usize = 43;
pub(crate) const PRODUCER_EPOCH_AT: usize = 51;
pub(crate) const BASE_SEQUENCE_AT: usize = 53;
pub(crate) const RECORDS_COUNT_AT: usize = 57;

const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_LOG_APPEND: i16 = 0x08;
pub(crate) const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;
/// Attribute bit of a batch whose base timestamp is its delete horizon
/// (KIP-534): the time after which the cleaner may remove its tombstones,
/// or the batch itself if it is a transaction marker.
pub const DELETE_HORIZON_FLAG: i16 = 0x40;

/// Control record key: version (always 0 so far) and type.
const CONTROL_KEY_VERSION: i16 = 0;
const CONTROL_TYPE_ABORT: i16 = 0;
const CONTROL_TYPE_COMMIT: i16 = 1;
/// Value of an ABORT/COMMIT control record: version and coordinator epoch.
const END_TXN_MARKER_VALUE_VERSION: i16 = 0;
const END_TXN_MARKER_VALUE_LEN: usize = 6;

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    #[error("truncated batch: {needed} bytes needed, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("unsupported magic {0} (only v2 record batches are accepted)")]
    UnsupportedMagic(i8),
    #[error("invalid batch length {0}")]
    InvalidLength(i32),
    #[error("crc mismatch: header says {expected:#010x}, data has {actual:#010x}")]
    CrcMismatch { expected: u32, actual: u32 },
    #[error("records of a batch compressed with codec {0} cannot be read without decompression")]
    Compressed(u8),
    #[error("unknown compression codec {0}")]
    UnknownCodec(u8),
    #[error("cannot decompress {codec} records: {reason}")]
    Decompression { codec: &'static str, reason: String },
    #[error("records decompress to more than {limit} bytes")]
    DecompressedTooLarge { limit: usize },
    #[error("malformed record in batch: {0}")]
    MalformedRecord(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

fn be_i64(buf: &[u8], at: usize) -> i64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    i64::from_be_bytes(b)
}

fn be_i32(buf: &[u8], at: usize) -> i32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    i32::from_be_bytes(b)
}

fn be_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_be_bytes(b)
}

fn be_i16(buf: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([buf[at], buf[at + 1]])
}

impl BatchHeader {
    /// Parses the fixed header at the start of `buf`; `buf` may hold more than one batch.
    /// Checks only what is needed to frame the batch: magic 2 and batch_length >= 49.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < BATCH_HEADER_LEN {
            return Err(BatchError::Truncated {
                needed: BATCH_HEADER_LEN,
                available: buf.len(),
            });
        }
        let magic = buf[MAGIC_AT] as i8;
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        let batch_length = be_i32(buf, BATCH_LENGTH_AT);
        if batch_length < MIN_BATCH_LENGTH {
            return Err(BatchError::InvalidLength(batch_length));
        }
        Ok(BatchHeader {
            base_offset: be_i64(buf, BASE_OFFSET_AT),
            batch_length,
            partition_leader_epoch: be_i32(buf, PARTITION_LEADER_EPOCH_AT),
            magic,
            crc: be_u32(buf, CRC_AT),
            attributes: be_i16(buf, ATTRIBUTES_AT),
            last_offset_delta: be_i32(buf, LAST_OFFSET_DELTA_AT),
            base_timestamp: be_i64(buf, BASE_TIMESTAMP_AT),
            max_timestamp: be_i64(buf, MAX_TIMESTAMP_AT),
            producer_id: be_i64(buf, PRODUCER_ID_AT),
            producer_epoch: be_i16(buf, PRODUCER_EPOCH_AT),
            base_sequence: be_i32(buf, BASE_SEQUENCE_AT),
            records_count: be_i32(buf, RECORDS_COUNT_AT),
        })
    }

    /// Bytes the whole batch occupies: 12 + batch_length.
    pub fn total_size(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.max(0) as usize
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta)
    }

    pub fn compression(&self) -> u8 {
        (self.attributes & COMPRESSION_MASK) as u8
    }

    pub fn timestamp_type_is_log_append(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_LOG_APPEND != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL != 0
    }

    /// The batch's delete horizon, if the cleaner set one.
    pub fn delete_horizon_ms(&self) -> Option<i64> {
        (self.attributes & DELETE_HORIZON_FLAG != 0).then_some(self.base_timestamp)
    }

    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// Sequence number of the last record, wrapping past i32::MAX to 0 like
    /// Kafka's `DefaultRecordBatch.incrementSequence`.
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence == NO_SEQUENCE {
            return NO_SEQUENCE;
        }
        increment_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// `sequence + increment`, wrapping past i32::MAX to 0 (Kafka's rule, not two's complement).
pub fn increment_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment {
        increment - (i32::MAX - sequence) - 1
    } else {
        sequence + increment
    }
}

/// The header of the batch `bytes` starts with and the batch's bytes
/// (`total_size` of them), or Truncated when `bytes` holds less.
pub(crate) fn whole_batch(bytes: &[u8]) -> Result<(BatchHeader, &[u8]), BatchError> {
    let header = BatchHeader::parse(bytes)?;
    let total = header.total_size();
    match bytes.get(..total) {
        Some(batch) => Ok((header, batch)),
        None => Err(BatchError::Truncated {
            needed: total,
            available: bytes.len(),
        }),
    }
}

/// CRC-32C of a batch's covered bytes (21..total_size). `batch` must start at a batch.
pub fn compute_crc(batch: &[u8]) -> Result<u32, BatchError> {
    let (_, batch) = whole_batch(batch)?;
    Ok(crc32c::crc32c(&batch[CRC_COVERED_FROM..]))
}

/// Checks the CRC-32C stored in the header against bytes 21..total_size.
pub fn verify_crc(batch: &[u8]) -> Result<(), BatchError> {
    let actual = compute_crc(batch)?;
    let expected = be_u32(batch, CRC_AT);
    if expected != actual {
        return Err(BatchError::CrcMismatch { expected, actual });
    }
    Ok(())
}

/// Recomputes and stores the CRC (needed after changing attributes or max timestamp).
pub fn recompute_crc(batch: &mut [u8]) -> Result<(), BatchError> {
    let crc = compute_crc(batch)?;
    batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// Rewrites bytes 0..8. Not covered by the CRC. `batch` must hold at least a header.
pub fn set_base_offset(batch: &mut [u8], base_offset: i64) {
    batch[BASE_OFFSET_AT..BASE_OFFSET_AT + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites bytes 12..16. Not covered by the CRC.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[PARTITION_LEADER_EPOCH_AT..PARTITION_LEADER_EPOCH_AT + 4]
        .copy_from_slice(&epoch.to_be_bytes());
}

/// Marks the batch as LogAppendTime with `timestamp` as its max timestamp and
/// recomputes the CRC (both fields are covered by it). Like Kafka, base
/// timestamp and record deltas are left alone: readers of a LogAppendTime batch
/// use max_timestamp for every record.
pub fn set_log_append_time(batch: &mut [u8], timestamp: i64) -> Result<(), BatchError> {
    let header = BatchHeader::parse(batch)?;
    let attributes = header.attributes | TIMESTAMP_TYPE_LOG_APPEND;
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    batch[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&timestamp.to_be_bytes());
    recompute_crc(batch)
}

/// Iterates the batches in a buffer that holds whole batches back to back (a
/// produce request's `records`, or a segment read). Each item is the parsed
/// header and the batch's bytes. A header that does not parse, or a trailing
/// partial batch, is yielded as one error item, after which iteration stops.
/// CRCs are not checked here.
pub fn batches(buf: &[u8]) -> BatchIter<'_> {
    BatchIter {
        buf,
        position: 0,
        failed: false,
    }
}

pub struct BatchIter<'a> {
    buf: &'a [u8],
    position: usize,
    failed: bool,
}

impl<'a> BatchIter<'a> {
    /// Byte position in the buffer of the next batch (after the last one yielded).
    pub fn position(&self) -> usize {
        self.position
    }
}

impl<'a> Iterator for BatchIter<'a> {
    type Item = Result<(BatchHeader, &'a [u8]), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.position >= self.buf.len() {
            return None;
        }
        match whole_batch(&self.buf[self.position..]) {
            Ok((header, batch)) => {
                self.position += batch.len();
                Some(Ok((header, batch)))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// Appends `value` as a zigzag varint (the encoding of record fields).
pub(crate) fn put_varlong(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    loop {
        let byte = (zigzag & 0x7f) as u8;
        zigzag >>= 7;
        if zigzag == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A v2 batch of plain key/value records, as a broker writes its own
/// internal records (the transaction coordinator's `__transaction_state`):
/// no producer id, uncompressed, CreateTime `timestamp` for every record, base
/// offset 0 and leader epoch -1 (the log assigns both), CRC computed. A
/// `None` value is a tombstone.
pub fn key_value_batch(records: &[(&[u8], Option<&[u8]>)], timestamp: i64) -> Vec<u8> {
    build_key_value_batch(records, None, timestamp)
}

/// Like [`key_value_batch`], but a transactional batch of producer
/// `(producer_id, producer_epoch)` without a sequence (-1): what a group
/// coordinator writes for offsets committed in a transaction. The log
/// checks its epoch, and it opens (or joins) the producer's transaction
/// on the partition like any transactional batch.
pub fn transactional_key_value_batch(
    records: &[(&[u8], Option<&[u8]>)],
    producer_id: i64,
    producer_epoch: i16,
    timestamp: i64,
) -> Vec<u8> {
    build_key_value_batch(records, Some((producer_id, producer_epoch)), timestamp)
}

fn build_key_value_batch(
    records: &[(&[u8], Option<&[u8]>)],
    producer: Option<(i64, i16)>,
    timestamp: i64,
) -> Vec<u8> {
    let mut body = Vec::new();
    let mut record = Vec::new();
    for (i, (key, value)) in records.iter().enumerate() {
        record.clear();
        record.push(0); // attributes
        put_varlong(&mut record, 0); // timestamp delta
        put_varlong(&mut record, i as i64); // offset delta
        put_varlong(&mut record, key.len() as i64);
        record.extend_from_slice(key);
        match value {
            Some(v) => {
                put_varlong(&mut record, v.len() as i64);
                record.extend_from_slice(v);
            }
            None => put_varlong(&mut record, -1),
        }
        put_varlong(&mut record, 0); // no headers
        put_varlong(&mut body, record.len() as i64);
        body.extend_from_slice(&record);
    }
    let count = i32::try_from(records.len()).unwrap_or(i32::MAX);
    let last_offset_delta = (count - 1).max(0);
    let batch_length = i32::try_from(BATCH_HEADER_LEN - 12 + body.len()).unwrap_or(i32::MAX);
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + body.len());
    out.extend_from_slice(&0i64.to_be_bytes()); // base offset
    out.extend_from_slice(&batch_length.to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    out.push(MAGIC_V2 as u8);
    out.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    let (attributes, producer_id, producer_epoch) = match producer {
        Some((id, epoch)) => (TRANSACTIONAL, id, epoch),
        None => (0, -1, -1),
    };
    out.extend_from_slice(&attributes.to_be_bytes());
    out.extend_from_slice(&last_offset_delta.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&timestamp.to_be_bytes());
    out.extend_from_slice(&producer_id.to_be_bytes());
    out.extend_from_slice(&producer_epoch.to_be_bytes());
    out.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    out.extend_from_slice(&count.to_be_bytes());
    out.extend_from_slice(&body);
    // The header was just written whole, so the CRC can always be computed.
    let _ = recompute_crc(&mut out);
    out
}

/// The control record that ends a producer's transaction on a partition
/// (Kafka's end-transaction marker), as written by the transaction
/// coordinator through `WriteTxnMarkers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Epoch of the coordinator that wrote the marker; a marker from an older
    /// coordinator than the last one seen for the producer is fenced.
    pub coordinator_epoch: i32,
    /// COMMIT when true, ABORT when false (`WriteTxnMarkers`' `transaction_result`).
    pub commit: bool,
}

impl EndTxnMarker {
    /// The v2 control batch carrying this marker: base offset 0 and leader
    /// epoch -1 (the log assigns both), `timestamp` as base and max timestamp,
    /// attributes transactional | control, base sequence -1, one record, CRC
    /// computed.
    pub fn to_batch(&self, timestamp: i64) -> Vec<u8> {
        let control_type = if self.commit {
            CONTROL_TYPE_COMMIT
        } else {
            CONTROL_TYPE_ABORT
        };
        let mut record = Vec::with_capacity(16);
        record.push(0); // record attributes
        put_varlong(&mut record, 0); // timestamp delta
        put_varlong(&mut record, 0); // offset delta
        put_varlong(&mut record, 4);
        record.extend_from_slice(&CONTROL_KEY_VERSION.to_be_bytes());
        record.extend_from_slice(&control_type.to_be_bytes());
        put_varlong(&mut record, END_TXN_MARKER_VALUE_LEN as i64);
        record.extend_from_slice(&END_TXN_MARKER_VALUE_VERSION.to_be_bytes());
        record.extend_from_slice(&self.coordinator_epoch.to_be_bytes());
        put_varlong(&mut record, 0); // no headers

        let mut out = Vec::with_capacity(BATCH_HEADER_LEN + record.len() + 2);
        out.extend_from_slice(&0i64.to_be_bytes()); // base offset
        out.extend_from_slice(&0i32.to_be_bytes()); // batch length, set below
        out.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
        out.push(MAGIC_V2 as u8);
        out.extend_from_slice(&0u32.to_be_bytes()); // crc, set below
        out.extend_from_slice(&(TRANSACTIONAL | CONTROL).to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
        out.extend_from_slice(&timestamp.to_be_bytes());
        out.extend_from_slice(&timestamp.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&NO_SEQUENCE.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes()); // records count
        put_varlong(&mut out, record.len() as i64);
        out.extend_from_slice(&record);
        let batch_length = (out.len() - LOG_OVERHEAD) as i32;
        out[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
        let crc = crc32c::crc32c(&out[CRC_COVERED_FROM..]);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        out
    }

    /// Reads the marker of a control batch. `Ok(None)`: not a control batch,
    /// or a control record of another type (Kafka defines more, none of which
    /// end a transaction). A control batch whose record cannot be read, or an
    /// ABORT/COMMIT record without its value, is an error. Producer id and
    /// epoch come from the header, whatever they are.
    pub fn parse(batch: &[u8]) -> Result<Option<EndTxnMarker>, BatchError> {
        let header = BatchHeader::parse(batch)?;
        if !header.is_control() {
            return Ok(None);
        }
        let record = records(batch)?.next().ok_or(BatchError::MalformedRecord(
            "control batch without a record",
        ))??;
        let key = record
            .key
            .filter(|k| k.len() >= 4)
            .ok_or(BatchError::MalformedRecord(
                "control record key shorter than 4 bytes",
            ))?;
        // Any key version: later ones may only add fields after the type.
        let commit = match be_i16(key, 2) {
            CONTROL_TYPE_ABORT => false,
            CONTROL_TYPE_COMMIT => true,
            _ => return Ok(None),
        };
        let value = record
            .value
            .filter(|v| v.len() >= END_TXN_MARKER_VALUE_LEN)
            .ok_or(BatchError::MalformedRecord(
                "transaction marker value shorter than 6 bytes",
            ))?;
        Ok(Some(EndTxnMarker {
            producer_id: header.producer_id,
            producer_epoch: header.producer_epoch,
            coordinator_epoch: be_i32(value, 2),
            commit,
        }))
    }
}

/// What [`records`] yields for each record of an uncompressed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The whole record after its length prefix (attributes, timestamp
    /// delta, offset delta, key, value, headers), for copying it.
    pub raw: &'a [u8],
}

/// Walks the records of an uncompressed batch (headers of records are skipped).
/// A compressed batch yields [`BatchError::Compressed`]: decompress its
/// records first (`compression::decompressed_records`).
pub fn records(batch: &[u8]) -> Result<RecordIter<'_>, BatchError> {
    let (header, batch) = whole_batch(batch)?;
    if header.compression() != 0 {
        return Err(BatchError::Compressed(header.compression()));
    }
    Ok(records_in(&batch[BATCH_HEADER_LEN..], header.records_count))
}

/// Walks `count` records of an uncompressed records section (a batch's
/// bytes after its header, decompressed if need be).
pub fn records_in(body: &[u8], count: i32) -> RecordIter<'_> {
    RecordIter {
        body,
        remaining: count.max(0),
    }
}

pub struct RecordIter<'a> {
    body: &'a [u8],
    remaining: i32,
}

impl<'a> RecordIter<'a> {
    /// The bytes after the records read so far.
    pub fn rest(&self) -> &'a [u8] {
        self.body
    }
}

pub(crate) fn read_varlong(buf: &mut &[u8]) -> Result<i64, BatchError> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        let (&byte, rest) = buf
            .split_first()
            .ok_or(BatchError::MalformedRecord("varint runs past the batch"))?;
        *buf = rest;
        raw |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            // zigzag
            return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    Err(BatchError::MalformedRecord("varint longer than 10 bytes"))
}

fn read_varint(buf: &mut &[u8]) -> Result<i32, BatchError> {
    i32::try_from(read_varlong(buf)?)
        .map_err(|_| BatchError::MalformedRecord("varint out of i32 range"))
}

fn read_bytes<'a>(buf: &mut &'a [u8]) -> Result<Option<&'a [u8]>, BatchError> {
    let len = read_varint(buf)?;
    if len < 0 {
        return Ok(None);
    }
    let len = len as usize;
    if buf.len() < len {
        return Err(BatchError::MalformedRecord("field runs past its record"));
    }
    let (bytes, rest) = buf.split_at(len);
    *buf = rest;
    Ok(Some(bytes))
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining <= 0 {
            return None;
        }
        self.remaining -= 1;
        let result = (|| {
            let length = read_varint(&mut self.body)?;
            if length < 0 || length as usize > self.body.len() {
                return Err(BatchError::MalformedRecord(
                    "record length runs past the batch",
                ));
            }
            let (mut record, rest) = self.body.split_at(length as usize);
            self.body = rest;
            let raw = record;
            let Some((_attributes, after_attributes)) = record.split_first() else {
                return Err(BatchError::MalformedRecord("record too short"));
            };
            record = after_attributes;
            let timestamp_delta = read_varlong(&mut record)?;
            let offset_delta = read_varint(&mut record)?;
            let key = read_bytes(&mut record)?;
            let value = read_bytes(&mut record)?;
            Ok(RecordView {
                offset_delta,
                timestamp_delta,
                key,
                value,
                raw,
            })
        })();
        if result.is_err() {
            self.remaining = 0;
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::testing::{build_batch, BatchSpec};

    fn spec(records: i32) -> BatchSpec {
        BatchSpec {
            record_count: records,
            base_timestamp: 1_000,
            ..BatchSpec::default()
        }
    }

    #[test]
    fn parses_every_header_field() {
        let bytes = build_batch(&BatchSpec {
            base_offset: 42,
            partition_leader_epoch: 7,
            producer_id: 9001,
            producer_epoch: 3,
            base_sequence: 17,
            base_timestamp: 5_000,
            timestamp_step: 10,
            record_count: 4,
            transactional: true,
            compression: 0,
            ..BatchSpec::default()
        });
        let h = BatchHeader::parse(&bytes).unwrap();
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.partition_leader_epoch, 7);
        assert_eq!(h.magic, 2);
        assert_eq!(h.total_size(), bytes.len());
        assert_eq!(h.batch_length as usize, bytes.len() - 12);
        assert_eq!(h.last_offset_delta, 3);
        assert_eq!(h.last_offset(), 45);
        assert_eq!(h.base_timestamp, 5_000);
        assert_eq!(h.max_timestamp, 5_030);
        assert_eq!(h.producer_id, 9001);
        assert_eq!(h.producer_epoch, 3);
        assert_eq!(h.base_sequence, 17);
        assert_eq!(h.last_sequence(), 20);
        assert_eq!(h.records_count, 4);
        assert!(h.is_transactional());
        assert!(!h.is_control());
        assert!(h.has_producer_id());
        assert!(!h.timestamp_type_is_log_append());
        assert_eq!(h.compression(), 0);
        verify_crc(&bytes).unwrap();
    }

    #[test]
    fn attribute_bits() {
        let h = BatchHeader::parse(&build_batch(&BatchSpec {
            control: true,
            compression: 3,
            log_append_time: true,
            ..spec(1)
        }))
        .unwrap();
        assert!(h.is_control());
        assert_eq!(h.compression(), 3);
        assert!(h.timestamp_type_is_log_append());
        assert!(!h.is_transactional());
        assert!(!h.has_producer_id());
    }

    #[test]
    fn rejects_short_buffer_bad_magic_and_bad_length() {
        let bytes = build_batch(&spec(1));
        assert_eq!(
            BatchHeader::parse(&bytes[..60]),
            Err(BatchError::Truncated {
                needed: 61,
                available: 60
            })
        );
        let mut v1 = bytes.clone();
        v1[16] = 1;
        assert_eq!(
            BatchHeader::parse(&v1),
            Err(BatchError::UnsupportedMagic(1))
        );
        let mut short = bytes.clone();
        short[8..12].copy_from_slice(&48i32.to_be_bytes());
        assert_eq!(
            BatchHeader::parse(&short),
            Err(BatchError::InvalidLength(48))
        );
        let mut negative = bytes;
        negative[8..12].copy_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(
            BatchHeader::parse(&negative),
            Err(BatchError::InvalidLength(-5))
        );
    }

    #[test]
    fn crc_detects_any_flipped_covered_byte_and_ignores_offset_and_epoch() {
        let bytes = build_batch(&BatchSpec {
            value_len: 20,
            ..spec(3)
        });
        verify_crc(&bytes).unwrap();
        for i in CRC_COVERED_FROM..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(
                matches!(verify_crc(&bad), Err(BatchError::CrcMismatch { .. })),
                "flip at {i} undetected"
            );
        }
        let mut stored_crc_flipped = bytes.clone();
        stored_crc_flipped[CRC_AT] ^= 1;
        assert!(verify_crc(&stored_crc_flipped).is_err());

        let mut rewritten = bytes;
        set_base_offset(&mut rewritten, 123_456);
        set_partition_leader_epoch(&mut rewritten, 99);
        verify_crc(&rewritten).unwrap();
        let h = BatchHeader::parse(&rewritten).unwrap();
        assert_eq!((h.base_offset, h.partition_leader_epoch), (123_456, 99));
    }

    #[test]
    fn crc_is_crc32c_of_the_covered_range() {
        let bytes = build_batch(&spec(2));
        let expected = crc32c::crc32c(&bytes[21..]);
        assert_eq!(BatchHeader::parse(&bytes).unwrap().crc, expected);
        // CRC-32C("123456789") is the standard check value 0xE3069283.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn verify_crc_on_truncated_batch() {
        let bytes = build_batch(&spec(2));
        assert!(matches!(
            verify_crc(&bytes[..bytes.len() - 1]),
            Err(BatchError::Truncated { .. })
        ));
    }

    #[test]
    fn log_append_time_rewrite_keeps_crc_valid() {
        let mut bytes = build_batch(&spec(3));
        set_log_append_time(&mut bytes, 77_777).unwrap();
        verify_crc(&bytes).unwrap();
        let h = BatchHeader::parse(&bytes).unwrap();
        assert!(h.timestamp_type_is_log_append());
        assert_eq!(h.max_timestamp, 77_777);
    }

    #[test]
    fn last_sequence_wraps_like_kafka() {
        let mut h = BatchHeader::parse(&build_batch(&spec(5))).unwrap();
        h.base_sequence = i32::MAX - 1;
        h.last_offset_delta = 4;
        // MAX-1, MAX, 0, 1, 2
        assert_eq!(h.last_sequence(), 2);
        h.base_sequence = i32::MAX;
        h.last_offset_delta = 0;
        assert_eq!(h.last_sequence(), i32::MAX);
        h.base_sequence = NO_SEQUENCE;
        assert_eq!(h.last_sequence(), NO_SEQUENCE);
        assert_eq!(increment_sequence(i32::MAX, 1), 0);
        assert_eq!(increment_sequence(10, 5), 15);
    }

    #[test]
    fn iterates_back_to_back_batches_and_reports_trailing_partial() {
        let a = build_batch(&spec(1));
        let b = build_batch(&BatchSpec {
            base_offset: 1,
            ..spec(3)
        });
        let mut buf = a.clone();
        buf.extend_from_slice(&b);
        let items: Vec<_> = batches(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].1, &a[..]);
        assert_eq!(items[1].1, &b[..]);
        assert_eq!(items[1].0.records_count, 3);

        let cut = &buf[..buf.len() - 5];
        let mut it = batches(cut);
        assert!(it.next().unwrap().is_ok());
        assert_eq!(
            it.next().unwrap(),
            Err(BatchError::Truncated {
                needed: b.len(),
                available: b.len() - 5
            })
        );
        assert!(it.next().is_none(), "iteration stops after an error");

        let mut garbage = a.clone();
        garbage.extend_from_slice(&[0u8; 10]);
        let mut it = batches(&garbage);
        assert!(it.next().unwrap().is_ok());
        assert!(matches!(it.next(), Some(Err(BatchError::Truncated { .. }))));
        assert_eq!(batches(&[]).count(), 0);
    }

    #[test]
    fn walks_records_of_uncompressed_batches() {
        let bytes = build_batch(&BatchSpec {
            base_timestamp: 1_000,
            timestamp_step: 5,
            record_count: 4,
            value_len: 3,
            value_seed: 10,
            ..BatchSpec::default()
        });
        let recs: Vec<_> = records(&bytes).unwrap().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs.len(), 4);
        for (i, r) in recs.iter().enumerate() {
            assert_eq!(r.offset_delta, i as i32);
            assert_eq!(r.timestamp_delta, 5 * i as i64);
            assert_eq!(r.key, None);
            assert_eq!(r.value.unwrap().len(), 3);
        }
        let compressed = build_batch(&BatchSpec {
            compression: 1,
            ..spec(2)
        });
        assert!(matches!(
            records(&compressed),
            Err(BatchError::Compressed(1))
        ));
    }

    #[test]
    fn malformed_records_are_errors_not_panics() {
        let mut bytes = build_batch(&BatchSpec {
            value_len: 4,
            ..spec(2)
        });
        // Claim a huge first record length.
        bytes[61] = 0xfe;
        bytes[62] = 0xff;
        bytes[63] = 0x7f;
        let first = records(&bytes).unwrap().next().unwrap();
        assert!(first.is_err());
    }

    #[test]
    fn end_txn_markers_round_trip_as_valid_control_batches() {
        for commit in [false, true] {
            let marker = EndTxnMarker {
                producer_id: 4_000_000_001,
                producer_epoch: 7,
                coordinator_epoch: 12,
                commit,
            };
            let bytes = marker.to_batch(1_234);
            verify_crc(&bytes).unwrap();
            let h = BatchHeader::parse(&bytes).unwrap();
            assert_eq!(h.total_size(), bytes.len());
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(h.compression(), 0);
            assert_eq!((h.base_offset, h.partition_leader_epoch), (0, -1));
            assert_eq!((h.last_offset_delta, h.records_count), (0, 1));
            assert_eq!((h.base_timestamp, h.max_timestamp), (1_234, 1_234));
            assert_eq!((h.producer_id, h.producer_epoch), (4_000_000_001, 7));
            assert_eq!(h.base_sequence, NO_SEQUENCE);
            let record = records(&bytes).unwrap().next().unwrap().unwrap();
            let control_type: i16 = if commit { 1 } else { 0 };
            let mut key = 0i16.to_be_bytes().to_vec();
            key.extend_from_slice(&control_type.to_be_bytes());
            assert_eq!(record.key, Some(&key[..]));
            let mut value = 0i16.to_be_bytes().to_vec();
            value.extend_from_slice(&12i32.to_be_bytes());
            assert_eq!(record.value, Some(&value[..]));
            assert_eq!(EndTxnMarker::parse(&bytes).unwrap(), Some(marker));
        }
    }

    #[test]
    fn marker_parsing_ignores_data_and_other_control_types_and_rejects_damage() {
        assert_eq!(EndTxnMarker::parse(&build_batch(&spec(2))).unwrap(), None);
        let marker = EndTxnMarker {
            producer_id: 1,
            producer_epoch: 0,
            coordinator_epoch: 3,
            commit: true,
        }
        .to_batch(5);
        // Record layout: length(1) attributes(1) ts(1) offset(1) key len(1) key(4) ...
        let type_at = BATCH_HEADER_LEN + 5 + 2;
        let mut leader_change = marker.clone();
        leader_change[type_at + 1] = 2;
        recompute_crc(&mut leader_change).unwrap();
        assert_eq!(EndTxnMarker::parse(&leader_change).unwrap(), None);

        let mut short_value = marker.clone();
        // value length varint 6 (zigzag 12) -> 2 (zigzag 4): the record runs short.
        short_value[type_at + 2] = 4;
        recompute_crc(&mut short_value).unwrap();
        assert!(EndTxnMarker::parse(&short_value).is_err());

        let mut compressed = marker;
        compressed[ATTRIBUTES_AT + 1] |= 1;
        assert!(matches!(
            EndTxnMarker::parse(&compressed),
            Err(BatchError::Compressed(1))
        ));
    }
}

#[cfg(test)]
mod key_value_batch_tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn key_value_batch_reads_back_with_tombstones() {
        let batch = key_value_batch(&[(b"a", Some(b"1")), (b"bb", None)], 42);
        verify_crc(&batch).unwrap();
        let header = BatchHeader::parse(&batch).unwrap();
        assert_eq!(header.records_count, 2);
        assert!(!header.has_producer_id());
        let got: Vec<_> = records(&batch)
            .unwrap()
            .map(|r| {
                let r = r.unwrap();
                (r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec))
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (Some(b"a".to_vec()), Some(b"1".to_vec())),
                (Some(b"bb".to_vec()), None)
            ]
        );
    }
}
