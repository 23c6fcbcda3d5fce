//! Record compression: the codecs of Kafka's v2 batches and the topic's
//! `compression.type`, which the leader enforces on append.
//!
//! A topic's [`CompressionType`] is `producer` (Kafka's default: batches are
//! kept as the producer compressed them) or one codec. With a codec, the
//! leader rewrites every produced batch that uses another one
//! ([`to_topic_codec`]): the records section is decompressed, checked to hold
//! exactly `records_count` well-framed records, and compressed again; the
//! 61-byte header is kept field for field (base offset, last offset delta,
//! timestamps and timestamp type, producer id and epoch, base sequence,
//! transactional flag, partition leader epoch) except `batch_length`, the
//! codec bits of `attributes` and the CRC-32C, which is recomputed. The
//! record bytes themselves are not touched, so a consumer decodes the same
//! records (offset and timestamp deltas, keys, values, headers) as from the
//! producer's batch. Control batches are never rewritten, and followers
//! store the leader's bytes as they come.
//!
//! Everything here is a pure function of the bytes, so the broker can run it
//! before taking a partition's lock. The wire formats are Kafka's: gzip
//! (RFC 1952; concatenated members are read), snappy (the xerial framing
//! Kafka's clients and brokers write, 32 KiB blocks; raw snappy is read too,
//! as librdkafka may send it), LZ4 frames (64 KiB independent blocks without
//! checksums, as Kafka writes them; any frame is read), zstd frames.
//! Compression levels are the codecs' defaults, as Kafka's are: gzip 6, LZ4's
//! fast mode (Kafka's level 9 maps to it), zstd 3.
//!
//! Decompression is bounded ([`decompression_limit`]): a small batch that
//! would inflate beyond it is refused rather than held in memory.

use std::borrow::Cow;
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::batch::{
    batches, recompute_crc, records_in, verify_crc, BatchError, BatchHeader, BATCH_HEADER_LEN,
    LOG_OVERHEAD,
};
use crate::error::StorageError;

const BATCH_LENGTH_AT: usize = 8;
const ATTRIBUTES_AT: usize = 21;
const COMPRESSION_MASK: i16 = 0x07;

/// A topic's `compression.type` (Kafka's `BrokerCompressionType`), also the
/// broker-wide default `log.compression_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressionType {
    /// Keep each batch as the producer compressed it.
    #[default]
    Producer,
    Uncompressed,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl CompressionType {
    /// Every value, in the order Kafka lists them.
    pub const ALL: [CompressionType; 6] = [
        CompressionType::Uncompressed,
        CompressionType::Zstd,
        CompressionType::Lz4,
        CompressionType::Snappy,
        CompressionType::Gzip,
        CompressionType::Producer,
    ];

    /// The config value: `producer`, `uncompressed`, `gzip`, `snappy`, `lz4`
    /// or `zstd` (case-sensitive, as Kafka's validator is).
    pub fn parse(value: &str) -> Option<CompressionType> {
        Self::ALL.into_iter().find(|t| t.name() == value)
    }

    pub fn name(self) -> &'static str {
        match self {
            CompressionType::Producer => "producer",
            CompressionType::Uncompressed => "uncompressed",
            CompressionType::Gzip => "gzip",
            CompressionType::Snappy => "snappy",
            CompressionType::Lz4 => "lz4",
            CompressionType::Zstd => "zstd",
        }
    }

    /// The codec the log stores, or `None` for `producer`.
    pub fn codec(self) -> Option<Codec> {
        match self {
            CompressionType::Producer => None,
            CompressionType::Uncompressed => Some(Codec::None),
            CompressionType::Gzip => Some(Codec::Gzip),
            CompressionType::Snappy => Some(Codec::Snappy),
            CompressionType::Lz4 => Some(Codec::Lz4),
            CompressionType::Zstd => Some(Codec::Zstd),
        }
    }
}

/// The codec of a batch: the low three bits of its attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    pub const ALL: [Codec; 5] = [
        Codec::None,
        Codec::Gzip,
        Codec::Snappy,
        Codec::Lz4,
        Codec::Zstd,
    ];

    /// The codec of attribute bits `id` (5–7 are not defined by Kafka).
    pub fn from_id(id: u8) -> Result<Codec, BatchError> {
        match id {
            0 => Ok(Codec::None),
            1 => Ok(Codec::Gzip),
            2 => Ok(Codec::Snappy),
            3 => Ok(Codec::Lz4),
            4 => Ok(Codec::Zstd),
            other => Err(BatchError::UnknownCodec(other)),
        }
    }

    pub fn id(self) -> u8 {
        self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// The most bytes a batch's records may decompress to: 64 times
/// `max.message.bytes`, at least 16 MiB (64 MiB with Kafka's default). Real
/// data compresses far less than 64:1; a batch beyond it is a decompression
/// bomb or a mistake, and is refused rather than held in memory.
pub fn decompression_limit(max_message_bytes: u32) -> usize {
    (max_message_bytes as usize)
        .saturating_mul(64)
        .max(16 * 1024 * 1024)
}

/// The records section of `batch`, decompressed (borrowed when the batch is
/// uncompressed). Checks the frame only, not the CRC or the records.
pub fn decompressed_records(batch: &[u8], limit: usize) -> Result<Cow<'_, [u8]>, BatchError> {
    let (header, batch) = crate::batch::whole_batch(batch)?;
    let codec = Codec::from_id(header.compression())?;
    decompress(codec, &batch[BATCH_HEADER_LEN..], limit)
}

/// Rewrites the batches of a produce request's `records` whose codec is not
/// the topic's (`target`); batches already in it, control batches and
/// everything under `producer` are kept as they are, and when nothing needs
/// rewriting the input is returned borrowed. A rewritten batch must first be
/// at most `max_message_bytes` (`RecordTooLarge`) and pass its CRC check
/// (`CorruptRecord`); data that does not decompress, or does not hold exactly
/// `records_count` records, is `CorruptRecord`; inflating beyond
/// [`decompression_limit`] is `DecompressedTooLarge`. The result's sizes
/// are checked again by the append.
pub fn to_topic_codec(
    records: &[u8],
    target: CompressionType,
    max_message_bytes: u32,
) -> Result<Cow<'_, [u8]>, StorageError> {
    let Some(to) = target.codec() else {
        return Ok(Cow::Borrowed(records));
    };
    let needs_rewrite = |h: &BatchHeader| !h.is_control() && h.compression() != to.id();
    let mut any = false;
    for item in batches(records) {
        let (header, _) = item?;
        if needs_rewrite(&header) {
            any = true;
            break;
        }
    }
    if !any {
        return Ok(Cow::Borrowed(records));
    }
    let limit = decompression_limit(max_message_bytes);
    let mut out = Vec::with_capacity(records.len());
    for item in batches(records) {
        let (header, bytes) = item?;
        if !needs_rewrite(&header) {
            out.extend_from_slice(bytes);
            continue;
        }
        if header.total_size() > max_message_bytes as usize {
            return Err(StorageError::RecordTooLarge {
                size: header.total_size(),
                max: max_message_bytes,
            });
        }
        rewrite_batch(bytes, &header, to, limit, &mut out)?;
    }
    Ok(Cow::Owned(out))
}

/// Appends to `out` the batch `bytes` (whose parsed header is `header`) with
/// its records compressed by `to`.
fn rewrite_batch(
    bytes: &[u8],
    header: &BatchHeader,
    to: Codec,
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), StorageError> {
    verify_crc(bytes)?;
    let from = Codec::from_id(header.compression())?;
    let plain = decompress(from, &bytes[BATCH_HEADER_LEN..header.total_size()], limit).map_err(
        |e| match e {
            BatchError::DecompressedTooLarge { limit } => {
                StorageError::DecompressedTooLarge { limit }
            }
            other => StorageError::CorruptRecord(other),
        },
    )?;
    check_records(&plain, header.records_count)?;
    let start = out.len();
    out.extend_from_slice(&bytes[..BATCH_HEADER_LEN]);
    compress_into(to, &plain, out).map_err(|e| {
        warn!(codec = to.name(), error = %e, "cannot compress records for the topic's compression.type");
        StorageError::Compression {
            codec: to.name(),
            reason: e.to_string(),
        }
    })?;
    let batch = &mut out[start..];
    let batch_length =
        i32::try_from(batch.len() - LOG_OVERHEAD).map_err(|_| StorageError::RecordTooLarge {
            size: batch.len(),
            max: i32::MAX as u32,
        })?;
    batch[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    let attributes = (header.attributes & !COMPRESSION_MASK) | i16::from(to.id());
    batch[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    recompute_crc(batch)?;
    Ok(())
}

/// `body` must be exactly `count` length-prefixed records, each of which parses.
fn check_records(body: &[u8], count: i32) -> Result<(), BatchError> {
    if count < 0 {
        return Err(BatchError::MalformedRecord("negative record count"));
    }
    let mut iter = records_in(body, count);
    let mut seen = 0;
    for record in iter.by_ref() {
        record?;
        seen += 1;
    }
    if seen != count {
        return Err(BatchError::MalformedRecord(
            "fewer records than the batch's count",
        ));
    }
    if !iter.rest().is_empty() {
        return Err(BatchError::MalformedRecord("bytes after the last record"));
    }
    Ok(())
}

/// Decompresses a batch's records section, at most `limit` bytes of output.
pub fn decompress(codec: Codec, data: &[u8], limit: usize) -> Result<Cow<'_, [u8]>, BatchError> {
    let failed = |e: &dyn std::fmt::Display| BatchError::Decompression {
        codec: codec.name(),
        reason: e.to_string(),
    };
    match codec {
        Codec::None => Ok(Cow::Borrowed(data)),
        Codec::Gzip => read_bounded(flate2::read::MultiGzDecoder::new(data), codec, limit),
        Codec::Snappy => snappy_decompress(data, limit).map(Cow::Owned),
        Codec::Lz4 => {
            let decoder = lz4::Decoder::new(data).map_err(|e| failed(&e))?;
            read_bounded(decoder, codec, limit)
        }
        Codec::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(data).map_err(|e| failed(&e))?;
            read_bounded(decoder, codec, limit)
        }
    }
}

fn read_bounded(
    reader: impl Read,
    codec: Codec,
    limit: usize,
) -> Result<Cow<'static, [u8]>, BatchError> {
    let mut out = Vec::new();
    reader
        .take((limit as u64).saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| BatchError::Decompression {
            codec: codec.name(),
            reason: e.to_string(),
        })?;
    if out.len() > limit {
        return Err(BatchError::DecompressedTooLarge { limit });
    }
    Ok(Cow::Owned(out))
}

/// The header of snappy-java's stream format: magic, then version 1 and
/// minimum compatible version 1 (big-endian i32s). Blocks follow, each a
/// big-endian u32 length and a raw snappy block.
const XERIAL_HEADER: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";
const XERIAL_MAGIC_LEN: usize = 8;
/// snappy-java's default block size, which Kafka's clients and brokers use.
const XERIAL_BLOCK: usize = 32 * 1024;

fn snappy_decompress(data: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    let failed = |reason: String| BatchError::Decompression {
        codec: "snappy",
        reason,
    };
    let mut decoder = snap::raw::Decoder::new();
    let mut block = |compressed: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let len = snap::raw::decompress_len(compressed).map_err(|e| failed(e.to_string()))?;
        if out.len().saturating_add(len) > limit {
            return Err(BatchError::DecompressedTooLarge { limit });
        }
        let at = out.len();
        out.resize(at + len, 0);
        let written = decoder
            .decompress(compressed, &mut out[at..])
            .map_err(|e| failed(e.to_string()))?;
        out.truncate(at + written);
        Ok(())
    };
    let mut out = Vec::new();
    // Like snappy-java, anything without the magic is one raw snappy block.
    if data.len() < XERIAL_HEADER.len()
        || data[..XERIAL_MAGIC_LEN] != XERIAL_HEADER[..XERIAL_MAGIC_LEN]
    {
        block(data, &mut out)?;
        return Ok(out);
    }
    let mut rest = &data[XERIAL_HEADER.len()..];
    while !rest.is_empty() {
        let Some((len, after)) = rest.split_first_chunk::<4>() else {
            return Err(failed("truncated block length".into()));
        };
        let len = u32::from_be_bytes(*len) as usize;
        if after.len() < len {
            return Err(failed(format!(
                "block of {len} bytes, {} left",
                after.len()
            )));
        }
        let (compressed, next) = after.split_at(len);
        block(compressed, &mut out)?;
        rest = next;
    }
    Ok(out)
}

/// Compresses `data` with `codec`, appending to `out`.
pub fn compress_into(codec: Codec, data: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    match codec {
        Codec::None => {
            out.extend_from_slice(data);
            Ok(())
        }
        Codec::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            encoder.write_all(data)?;
            encoder.finish().map(|_| ())
        }
        Codec::Snappy => {
            out.extend_from_slice(XERIAL_HEADER);
            let mut encoder = snap::raw::Encoder::new();
            for chunk in data.chunks(XERIAL_BLOCK) {
                let len_at = out.len();
                out.extend_from_slice(&[0; 4]);
                let at = out.len();
                out.resize(at + snap::raw::max_compress_len(chunk.len()), 0);
                let written = encoder
                    .compress(chunk, &mut out[at..])
                    .map_err(std::io::Error::other)?;
                out.truncate(at + written);
                let len = u32::try_from(written).map_err(std::io::Error::other)?;
                out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
            }
            Ok(())
        }
        Codec::Lz4 => {
            let mut encoder = lz4::EncoderBuilder::new()
                .block_size(lz4::BlockSize::Max64KB)
                .block_mode(lz4::BlockMode::Independent)
                .checksum(lz4::ContentChecksum::NoChecksum)
                .level(0)
                .build(out)?;
            encoder.write_all(data)?;
            let (_, finished) = encoder.finish();
            finished
        }
        Codec::Zstd => {
            let mut encoder = zstd::stream::write::Encoder::new(out, 3)?;
            encoder.write_all(data)?;
            encoder.finish().map(|_| ())
        }
    }
}

#[cfg(test)]
#[path = "compression_tests.rs"]
mod tests;
