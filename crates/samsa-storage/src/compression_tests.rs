//! Tests of `compression`: every codec pair through [`to_topic_codec`],
//! checked against kafka-protocol's independent encoder and decoder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::*;
use crate::batch::{self, EndTxnMarker};

const MAX: u32 = 1_048_588;

fn wire(codec: Codec) -> Compression {
    match codec {
        Codec::None => Compression::None,
        Codec::Gzip => Compression::Gzip,
        Codec::Snappy => Compression::Snappy,
        Codec::Lz4 => Compression::Lz4,
        Codec::Zstd => Compression::Zstd,
    }
}

fn target(codec: Codec) -> CompressionType {
    match codec {
        Codec::None => CompressionType::Uncompressed,
        Codec::Gzip => CompressionType::Gzip,
        Codec::Snappy => CompressionType::Snappy,
        Codec::Lz4 => CompressionType::Lz4,
        Codec::Zstd => CompressionType::Zstd,
    }
}

/// Records of a transactional producer (id 4711, epoch 3, sequences from
/// 100) with keys, null and non-null values, headers and timestamps out of
/// order, at leader epoch 7.
fn sample_records(count: usize) -> Vec<Record> {
    (0..count)
        .map(|i| {
            let mut headers = IndexMap::new();
            headers.insert(
                StrBytes::from_string(format!("h{i}")),
                Some(Bytes::from(format!("header value {i}"))),
            );
            headers.insert(StrBytes::from_static_str("empty"), None);
            Record {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 7,
                producer_id: 4711,
                producer_epoch: 3,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: 100 + i as i32,
                // Not monotonic: the max is not the last record.
                timestamp: 1_700_000_000_000 + ((i * 37) % 11) as i64,
                key: (i % 3 != 0).then(|| Bytes::from(format!("key-{i}"))),
                value: (i % 5 != 4).then(|| Bytes::from(format!("value {i} ").repeat(1 + i % 7))),
                headers,
            }
        })
        .collect()
}

fn encode(records: &[Record], codec: Codec) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: wire(codec),
        },
    )
    .unwrap();
    buf.to_vec()
}

fn decode(bytes: &[u8]) -> (Compression, Vec<Record>) {
    let set = RecordBatchDecoder::decode(&mut Bytes::copy_from_slice(bytes)).unwrap();
    (set.compression, set.records)
}

/// Header fields the rewrite must keep: all but batch length, attributes' codec bits and CRC.
fn kept_fields(h: &BatchHeader) -> impl PartialEq + std::fmt::Debug {
    (
        h.base_offset,
        h.partition_leader_epoch,
        h.magic,
        h.attributes & !0x07,
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        (h.producer_id, h.producer_epoch, h.base_sequence),
        h.records_count,
    )
}

#[test]
fn every_codec_pair_keeps_the_header_and_the_records() {
    let records = sample_records(40);
    for from in Codec::ALL {
        let input = encode(&records, from);
        let input_header = BatchHeader::parse(&input).unwrap();
        let plain_in = decompressed_records(&input, usize::MAX)
            .unwrap()
            .into_owned();
        for to in Codec::ALL {
            let out = to_topic_codec(&input, target(to), MAX).unwrap();
            if from == to {
                assert!(
                    matches!(out, Cow::Borrowed(b) if b.as_ptr() == input.as_ptr()),
                    "{from:?} → {to:?} must not be rewritten"
                );
                continue;
            }
            let out = out.into_owned();
            let header = BatchHeader::parse(&out).unwrap();
            assert_eq!(header.total_size(), out.len(), "{from:?} → {to:?}");
            assert_eq!(header.compression(), to.id(), "{from:?} → {to:?}");
            assert_eq!(
                kept_fields(&header),
                kept_fields(&input_header),
                "{from:?} → {to:?}"
            );
            assert!(header.is_transactional());
            batch::verify_crc(&out).unwrap();
            // The record bytes are the producer's, byte for byte.
            assert_eq!(
                decompressed_records(&out, usize::MAX).unwrap(),
                plain_in,
                "{from:?} → {to:?}"
            );
            // And an independent decoder reads the same records.
            let (compression, decoded) = decode(&out);
            assert_eq!(compression, wire(to));
            assert_eq!(decoded, records, "{from:?} → {to:?}");
        }
    }
}

#[test]
fn producer_keeps_everything_and_a_request_is_rewritten_batch_by_batch() {
    let a = encode(&sample_records(3), Codec::Lz4);
    let b = encode(&sample_records(5), Codec::Zstd);
    let c = EndTxnMarker {
        producer_id: 4711,
        producer_epoch: 3,
        coordinator_epoch: 1,
        commit: true,
    }
    .to_batch(1_000);
    let d = encode(&sample_records(2), Codec::None);
    let request: Vec<u8> = [&a[..], &b[..], &c[..], &d[..]].concat();

    let kept = to_topic_codec(&request, CompressionType::Producer, MAX).unwrap();
    assert!(matches!(kept, Cow::Borrowed(_)));

    let out = to_topic_codec(&request, CompressionType::Zstd, MAX).unwrap();
    let parts: Vec<_> = batch::batches(&out)
        .map(|item| item.unwrap().1.to_vec())
        .collect();
    assert_eq!(parts.len(), 4);
    assert_eq!(BatchHeader::parse(&parts[0]).unwrap().compression(), 4);
    // Already zstd, and a control batch: the very same bytes.
    assert_eq!(parts[1], b);
    assert_eq!(parts[2], c);
    assert_eq!(BatchHeader::parse(&parts[3]).unwrap().compression(), 4);
    assert_eq!(decode(&parts[0]).1, sample_records(3));
    assert_eq!(decode(&parts[3]).1, sample_records(2));
    for part in &parts {
        batch::verify_crc(part).unwrap();
    }
}

#[test]
fn log_append_time_and_single_record_batches_survive() {
    let mut input = encode(&sample_records(1), Codec::Snappy);
    batch::set_log_append_time(&mut input, 1_800_000_000_000).unwrap();
    let out = to_topic_codec(&input, CompressionType::Gzip, MAX).unwrap();
    let header = BatchHeader::parse(&out).unwrap();
    assert!(header.timestamp_type_is_log_append());
    assert_eq!(header.max_timestamp, 1_800_000_000_000);
    assert_eq!(header.compression(), Codec::Gzip.id());
    batch::verify_crc(&out).unwrap();
}

#[test]
fn raw_snappy_is_read_and_xerial_is_written() {
    let records = sample_records(10);
    let plain = encode(&records, Codec::None);
    let body = &plain[BATCH_HEADER_LEN..];
    // What librdkafka sends: one raw snappy block, no framing.
    let raw = snap::raw::Encoder::new().compress_vec(body).unwrap();
    let mut input = plain[..BATCH_HEADER_LEN].to_vec();
    input.extend_from_slice(&raw);
    let batch_length = (input.len() - LOG_OVERHEAD) as i32;
    input[8..12].copy_from_slice(&batch_length.to_be_bytes());
    input[22] |= Codec::Snappy.id();
    recompute_crc(&mut input).unwrap();
    assert_eq!(decompressed_records(&input, usize::MAX).unwrap(), body);

    let out = to_topic_codec(&input, CompressionType::Uncompressed, MAX).unwrap();
    assert_eq!(decode(&out).1, records);

    let mut xerial = Vec::new();
    let long = body.repeat(200); // several 32 KiB blocks
    compress_into(Codec::Snappy, &long, &mut xerial).unwrap();
    assert_eq!(&xerial[..16], XERIAL_HEADER);
    assert_eq!(
        decompress(Codec::Snappy, &xerial, usize::MAX).unwrap(),
        long
    );
}

#[test]
fn a_bad_crc_is_corrupt_and_nothing_is_decompressed() {
    let mut input = encode(&sample_records(4), Codec::Lz4);
    let last = input.len() - 1;
    input[last] ^= 0x55;
    let err = to_topic_codec(&input, CompressionType::Zstd, MAX).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::CorruptRecord(BatchError::CrcMismatch { .. })
        ),
        "{err:?}"
    );
}

/// A batch whose records section is `body`, with codec bits `codec` and a valid CRC.
fn batch_with_body(codec: u8, records_count: i32, body: &[u8]) -> Vec<u8> {
    let mut out = encode(&sample_records(1), Codec::None)[..BATCH_HEADER_LEN].to_vec();
    out.extend_from_slice(body);
    let batch_length = (out.len() - LOG_OVERHEAD) as i32;
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    out[22] = (out[22] & !0x07) | codec;
    out[23..27].copy_from_slice(&(records_count - 1).to_be_bytes());
    out[57..61].copy_from_slice(&records_count.to_be_bytes());
    recompute_crc(&mut out).unwrap();
    out
}

#[test]
fn data_that_does_not_decompress_is_corrupt() {
    for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
        let input = batch_with_body(codec.id(), 1, b"this is not compressed data at all");
        let err = to_topic_codec(&input, CompressionType::Uncompressed, MAX).unwrap_err();
        assert!(
            matches!(
                err,
                StorageError::CorruptRecord(BatchError::Decompression { .. })
            ),
            "{codec:?}: {err:?}"
        );
    }
    let unknown = batch_with_body(5, 1, b"whatever");
    let err = to_topic_codec(&unknown, CompressionType::Lz4, MAX).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::CorruptRecord(BatchError::UnknownCodec(5))
        ),
        "{err:?}"
    );
}

#[test]
fn records_that_disagree_with_the_header_are_corrupt() {
    let plain = encode(&sample_records(3), Codec::None);
    let body = &plain[BATCH_HEADER_LEN..];
    let mut packed = Vec::new();
    compress_into(Codec::Zstd, body, &mut packed).unwrap();
    // Claims four records, holds three.
    let short = batch_with_body(Codec::Zstd.id(), 4, &packed);
    let err = to_topic_codec(&short, CompressionType::Gzip, MAX).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::CorruptRecord(BatchError::MalformedRecord(_))
        ),
        "{err:?}"
    );
    // Claims two, holds three: trailing bytes.
    let long = batch_with_body(Codec::Zstd.id(), 2, &packed);
    let err = to_topic_codec(&long, CompressionType::Gzip, MAX).unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::CorruptRecord(BatchError::MalformedRecord(_))
        ),
        "{err:?}"
    );
}

#[test]
fn decompression_is_bounded_and_size_is_checked_first() {
    let zeros = vec![0u8; 4 * 1024 * 1024];
    for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
        let mut packed = Vec::new();
        compress_into(codec, &zeros, &mut packed).unwrap();
        assert_eq!(
            decompress(codec, &packed, 1024 * 1024).unwrap_err(),
            BatchError::DecompressedTooLarge { limit: 1024 * 1024 },
            "{codec:?}"
        );
        assert_eq!(decompress(codec, &packed, zeros.len()).unwrap(), zeros);
    }
    // Through the append path: a 100 kB limit on batches gives the 16 MiB
    // floor, and 20 MiB of zeros compress to well under 100 kB.
    let zeros = vec![0u8; 20 * 1024 * 1024];
    for codec in [Codec::Gzip, Codec::Lz4, Codec::Zstd] {
        let mut packed = Vec::new();
        compress_into(codec, &zeros, &mut packed).unwrap();
        let bomb = batch_with_body(codec.id(), 1, &packed);
        assert!(bomb.len() < 100_000, "{codec:?}: {}", bomb.len());
        let err = to_topic_codec(&bomb, CompressionType::Uncompressed, 100_000).unwrap_err();
        assert!(
            matches!(err, StorageError::DecompressedTooLarge { limit } if limit == 16 * 1024 * 1024),
            "{codec:?}: {err:?}"
        );
    }
    let input = encode(&sample_records(40), Codec::None);
    let err = to_topic_codec(&input, CompressionType::Zstd, 100).unwrap_err();
    assert!(
        matches!(err, StorageError::RecordTooLarge { max: 100, .. }),
        "{err:?}"
    );
    assert_eq!(decompression_limit(1_048_588), 1_048_588 * 64);
    assert_eq!(decompression_limit(1000), 16 * 1024 * 1024);
}

#[test]
fn config_values_are_kafkas() {
    for value in ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"] {
        assert_eq!(CompressionType::parse(value).unwrap().name(), value);
    }
    for value in ["none", "GZIP", "", "zstd "] {
        assert_eq!(CompressionType::parse(value), None, "{value:?}");
    }
    assert_eq!(CompressionType::default(), CompressionType::Producer);
    assert_eq!(CompressionType::Producer.codec(), None);
}
