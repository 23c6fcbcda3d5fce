//! Record batches (magic v2) built byte by byte, so tests control every field
//! (producer id/epoch/sequence, timestamps, CRC), and a decoder for fetched
//! record sets.

use anyhow::{bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};
use kafka_protocol::records::{Compression, RecordBatchDecoder};

/// Byte offsets of the fields of a v2 record batch header.
pub mod layout {
    pub const BASE_OFFSET: usize = 0;
    pub const BATCH_LENGTH: usize = 8;
    pub const PARTITION_LEADER_EPOCH: usize = 12;
    pub const MAGIC: usize = 16;
    pub const CRC: usize = 17;
    pub const ATTRIBUTES: usize = 21;
    pub const LAST_OFFSET_DELTA: usize = 23;
    pub const BASE_TIMESTAMP: usize = 27;
    pub const MAX_TIMESTAMP: usize = 35;
    pub const PRODUCER_ID: usize = 43;
    pub const PRODUCER_EPOCH: usize = 51;
    pub const BASE_SEQUENCE: usize = 53;
    pub const RECORDS_COUNT: usize = 57;
    /// Size of the header; records follow.
    pub const HEADER_LEN: usize = 61;
    /// baseOffset + batchLength: the bytes not counted by batchLength.
    pub const LOG_OVERHEAD: usize = 12;
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(d.as_millis()).expect("ms fit i64")
}

#[derive(Debug, Clone)]
struct RecordSpec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    timestamp: i64,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Builds one uncompressed magic-v2 record batch.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    transactional: bool,
    partition_leader_epoch: i32,
    compression: Compression,
    records: Vec<RecordSpec>,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    /// A non-idempotent batch (producer id -1, epoch -1, sequence -1).
    pub fn new() -> Self {
        BatchBuilder {
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            partition_leader_epoch: -1,
            compression: Compression::None,
            records: Vec::new(),
        }
    }

    /// Compresses the records with `codec` (kafka-protocol's codecs, which
    /// are not samsa's: an independent producer's bytes).
    pub fn compression(mut self, codec: Compression) -> Self {
        self.compression = codec;
        self
    }

    /// An idempotent batch of producer `pid` at `epoch` starting at `base_sequence`.
    pub fn idempotent(pid: i64, epoch: i16, base_sequence: i32) -> Self {
        Self::new().producer(pid, epoch, base_sequence)
    }

    pub fn producer(mut self, pid: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = pid;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, yes: bool) -> Self {
        self.transactional = yes;
        self
    }

    /// A record with this value, no key, timestamped now.
    pub fn record(self, value: impl AsRef<[u8]>) -> Self {
        self.record_full(None, Some(value.as_ref()), now_ms())
    }

    /// A record with key and value, timestamped now.
    pub fn record_kv(self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.record_full(Some(key.as_ref()), Some(value.as_ref()), now_ms())
    }

    /// A record with this value and timestamp.
    pub fn record_at(self, value: impl AsRef<[u8]>, timestamp: i64) -> Self {
        self.record_full(None, Some(value.as_ref()), timestamp)
    }

    /// Records with these values, timestamped now.
    pub fn values<I, V>(mut self, values: I) -> Self
    where
        I: IntoIterator<Item = V>,
        V: AsRef<[u8]>,
    {
        let ts = now_ms();
        for v in values {
            self = self.record_full(None, Some(v.as_ref()), ts);
        }
        self
    }

    pub fn record_full(mut self, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Self {
        self.records.push(RecordSpec {
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            timestamp,
            headers: Vec::new(),
        });
        self
    }

    /// Adds a header to the last record.
    pub fn header(mut self, key: &str, value: Option<&[u8]>) -> Self {
        let r = self
            .records
            .last_mut()
            .expect("header() needs a record first");
        r.headers.push((key.to_string(), value.map(<[u8]>::to_vec)));
        self
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Encodes the batch (base offset 0) with a correct CRC-32C.
    pub fn build(&self) -> Bytes {
        assert!(
            !self.records.is_empty(),
            "a batch needs at least one record"
        );
        let base_ts = self.records[0].timestamp;
        let max_ts = self
            .records
            .iter()
            .map(|r| r.timestamp)
            .max()
            .unwrap_or(base_ts);
        let mut body = BytesMut::new();
        for (i, r) in self.records.iter().enumerate() {
            let mut rec = BytesMut::new();
            rec.put_i8(0); // record attributes
            put_varlong(&mut rec, r.timestamp - base_ts);
            put_varint(&mut rec, i32::try_from(i).expect("offset delta fits"));
            put_bytes(&mut rec, r.key.as_deref());
            put_bytes(&mut rec, r.value.as_deref());
            put_varint(
                &mut rec,
                i32::try_from(r.headers.len()).expect("headers fit"),
            );
            for (k, v) in &r.headers {
                put_bytes(&mut rec, Some(k.as_bytes()));
                put_bytes(&mut rec, v.as_deref());
            }
            put_varint(&mut body, i32::try_from(rec.len()).expect("record fits"));
            body.put_slice(&rec);
        }

        let body = compress(self.compression, body);
        let mut attributes: i16 = self.compression as i16; // CreateTime
        if self.transactional {
            attributes |= 0x10;
        }
        let n = i32::try_from(self.records.len()).expect("count fits");
        let mut buf = BytesMut::with_capacity(layout::HEADER_LEN + body.len());
        buf.put_i64(0); // base offset
        buf.put_i32(0); // batch length, filled below
        buf.put_i32(self.partition_leader_epoch);
        buf.put_i8(2); // magic
        buf.put_u32(0); // crc, filled below
        buf.put_i16(attributes);
        buf.put_i32(n - 1); // last offset delta
        buf.put_i64(base_ts);
        buf.put_i64(max_ts);
        buf.put_i64(self.producer_id);
        buf.put_i16(self.producer_epoch);
        buf.put_i32(self.base_sequence);
        buf.put_i32(n);
        buf.put_slice(&body);

        let batch_len = i32::try_from(buf.len() - layout::LOG_OVERHEAD).expect("batch fits");
        buf[layout::BATCH_LENGTH..layout::BATCH_LENGTH + 4]
            .copy_from_slice(&batch_len.to_be_bytes());
        let crc = crc32c::crc32c(&buf[layout::ATTRIBUTES..]);
        buf[layout::CRC..layout::CRC + 4].copy_from_slice(&crc.to_be_bytes());
        buf.freeze()
    }
}

fn compress(codec: Compression, plain: BytesMut) -> BytesMut {
    let mut out = BytesMut::new();
    let copy = |tmp: &mut BytesMut| {
        tmp.put_slice(&plain);
        Ok::<(), anyhow::Error>(())
    };
    match codec {
        Compression::None => return plain,
        Compression::Gzip => Gzip::compress(&mut out, copy),
        Compression::Snappy => Snappy::compress(&mut out, copy),
        Compression::Lz4 => Lz4::compress(&mut out, copy),
        Compression::Zstd => Zstd::compress(&mut out, copy),
    }
    .expect("compress a test batch");
    out
}

/// `(base offset, codec bits)` of every complete batch in a record set, as
/// stored: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
pub fn batch_codecs(data: &[u8]) -> Vec<(i64, u8)> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= layout::HEADER_LEN {
        let base = i64::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
        let len = i32::from_be_bytes(rest[8..12].try_into().expect("4 bytes"));
        let total = usize::try_from(len).expect("batch length") + layout::LOG_OVERHEAD;
        if rest.len() < total {
            break;
        }
        out.push((base, rest[layout::ATTRIBUTES + 1] & 0x07));
        rest = &rest[total..];
    }
    out
}

/// A copy of `batch` whose stored CRC no longer matches its contents.
pub fn with_bad_crc(batch: &Bytes) -> Bytes {
    let mut b = batch.to_vec();
    b[layout::CRC] ^= 0x5a;
    Bytes::from(b)
}

/// A copy of `batch` with one byte of its last record flipped (the stored CRC
/// is left as it was, so it no longer matches).
pub fn with_corrupted_payload(batch: &Bytes) -> Bytes {
    let mut b = batch.to_vec();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    Bytes::from(b)
}

/// Concatenates batches into one record set.
pub fn concat(batches: &[Bytes]) -> Bytes {
    let mut b = BytesMut::new();
    for x in batches {
        b.put_slice(x);
    }
    b.freeze()
}

fn put_varint(buf: &mut BytesMut, v: i32) {
    let mut z = ((v << 1) ^ (v >> 31)) as u32;
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

fn put_varlong(buf: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        buf.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    buf.put_u8(z as u8);
}

fn put_bytes(buf: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        None => put_varint(buf, -1),
        Some(b) => {
            put_varint(buf, i32::try_from(b.len()).expect("bytes fit"));
            buf.put_slice(b);
        }
    }
}

/// One record read back from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    pub partition: i32,
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub sequence: i32,
    pub control: bool,
    pub transactional: bool,
}

/// Control record type of an ABORT transaction marker (control key bytes 2..4).
pub const CONTROL_ABORT: i16 = 0;
/// Control record type of a COMMIT transaction marker.
pub const CONTROL_COMMIT: i16 = 1;

impl FetchedRecord {
    /// For a control record, its type from the control key (version i16,
    /// type i16): [`CONTROL_ABORT`], [`CONTROL_COMMIT`], … `None` for data
    /// records and malformed keys.
    pub fn control_type(&self) -> Option<i16> {
        if !self.control {
            return None;
        }
        let k = self.key.as_ref()?;
        let b: [u8; 2] = k.get(2..4)?.try_into().ok()?;
        Some(i16::from_be_bytes(b))
    }

    /// For a transaction marker, the coordinator epoch from its value
    /// (version i16, coordinator epoch i32).
    pub fn marker_coordinator_epoch(&self) -> Option<i32> {
        if !self.control {
            return None;
        }
        let v = self.value.as_ref()?;
        let b: [u8; 4] = v.get(2..6)?.try_into().ok()?;
        Some(i32::from_be_bytes(b))
    }

    /// `(offset, value)` with the value as UTF-8 (lossy; empty if null).
    pub fn offset_value(&self) -> (i64, String) {
        let v = self.value.as_deref().unwrap_or_default();
        (self.offset, String::from_utf8_lossy(v).into_owned())
    }
}

/// Decodes every complete batch in a fetched record set (a trailing partial
/// batch, which Kafka may send, is ignored). Verifies each batch's CRC.
/// Returns the records and the offset after the last complete batch.
pub fn decode_records(partition: i32, data: &[u8]) -> Result<(Vec<FetchedRecord>, Option<i64>)> {
    let mut out = Vec::new();
    let mut next = None;
    let mut pos = 0usize;
    while data.len() - pos >= layout::HEADER_LEN {
        let hdr = &data[pos..];
        let base_offset = i64::from_be_bytes(hdr[0..8].try_into()?);
        let batch_len = i32::from_be_bytes(hdr[8..12].try_into()?);
        let total = usize::try_from(batch_len)
            .with_context(|| format!("negative batch length at offset {base_offset}"))?
            + layout::LOG_OVERHEAD;
        if data.len() - pos < total {
            break; // partial batch at the end of the response
        }
        let magic = hdr[layout::MAGIC] as i8;
        if magic != 2 {
            bail!("batch at offset {base_offset} has magic {magic}, expected 2");
        }
        let last_delta = i32::from_be_bytes(
            hdr[layout::LAST_OFFSET_DELTA..layout::LAST_OFFSET_DELTA + 4].try_into()?,
        );
        let mut one = Bytes::copy_from_slice(&data[pos..pos + total]);
        let set = RecordBatchDecoder::decode(&mut one)
            .with_context(|| format!("decode batch at offset {base_offset}"))?;
        for r in set.records {
            out.push(FetchedRecord {
                partition,
                offset: r.offset,
                timestamp: r.timestamp,
                key: r.key,
                value: r.value,
                producer_id: r.producer_id,
                producer_epoch: r.producer_epoch,
                sequence: r.sequence,
                control: r.control,
                transactional: r.transactional,
            });
        }
        next = Some(base_offset + i64::from(last_delta) + 1);
        pos += total;
    }
    Ok((out, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batch_decodes_with_kafka_protocol() {
        let b = BatchBuilder::idempotent(7, 3, 10)
            .record_at("a", 1000)
            .record_kv("k", "b")
            .header("h", Some(b"v"))
            .build();
        let (recs, next) = decode_records(0, &b).unwrap();
        assert_eq!(next, Some(2));
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].value.as_deref(), Some(&b"a"[..]));
        assert_eq!(recs[0].timestamp, 1000);
        assert_eq!(recs[0].producer_id, 7);
        assert_eq!(recs[0].producer_epoch, 3);
        assert_eq!(recs[0].sequence, 10);
        assert_eq!(recs[1].sequence, 11);
        assert_eq!(recs[1].key.as_deref(), Some(&b"k"[..]));
        assert!(decode_records(0, &with_bad_crc(&b)).is_err());
        assert!(decode_records(0, &with_corrupted_payload(&b)).is_err());
        // A truncated trailing batch is ignored, not an error.
        let two = concat(&[b.clone(), b.slice(0..b.len() - 3)]);
        assert_eq!(decode_records(0, &two).unwrap().0.len(), 2);
    }

    #[test]
    fn varints_match_kafka_zigzag() {
        let mut b = BytesMut::new();
        put_varint(&mut b, -1);
        put_varint(&mut b, 0);
        put_varint(&mut b, 300);
        assert_eq!(&b[..], &[0x01, 0x00, 0xd8, 0x04]);
    }
}
