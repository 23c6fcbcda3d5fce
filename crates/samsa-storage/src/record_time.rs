//! Timestamp lookups inside one batch, for ListOffsets by time and a
//! segment's offset of its max timestamp: the answers that need a batch's
//! records, decompressed first when the batch is compressed (at most
//! `limit` bytes). A compressed batch whose records cannot be read is
//! answered at batch granularity (base offset and max timestamp), as such a
//! batch may be stored: a `producer` topic keeps batches as sent.

use crate::batch::{records, records_in, BatchError, BatchHeader, BATCH_HEADER_LEN};

/// The records section of `batch` uncompressed, for the per-record answers
/// below; `None` for a compressed batch that does not decompress (they
/// then answer at batch granularity: such a batch may be stored, as a
/// `producer` topic keeps batches as sent).
fn plain_records<'a>(
    batch: &'a [u8],
    header: &BatchHeader,
    limit: usize,
) -> Result<Option<std::borrow::Cow<'a, [u8]>>, BatchError> {
    if header.compression() == 0 {
        records(batch)?;
        return Ok(Some(std::borrow::Cow::Borrowed(
            &batch[BATCH_HEADER_LEN..header.total_size()],
        )));
    }
    Ok(crate::compression::decompressed_records(batch, limit).ok())
}

/// Offset and timestamp of the first record whose timestamp is >= `target`,
/// for ListOffsets. LogAppendTime batches give every record the batch's max
/// timestamp. Compressed batches are decompressed (at most `limit` bytes);
/// one whose records cannot be read is answered at batch granularity (base
/// offset, max timestamp).
pub fn first_record_at_or_after(
    batch: &[u8],
    target: i64,
    limit: usize,
) -> Result<Option<(i64, i64)>, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if header.max_timestamp < target {
        return Ok(None);
    }
    let coarse = Some((header.base_offset, header.max_timestamp));
    if header.timestamp_type_is_log_append() {
        return Ok(coarse);
    }
    let Some(body) = plain_records(batch, &header, limit)? else {
        return Ok(coarse);
    };
    for record in records_in(&body, header.records_count) {
        let record = match record {
            Ok(record) => record,
            Err(_) if header.compression() != 0 => return Ok(coarse),
            Err(e) => return Err(e),
        };
        let timestamp = header.base_timestamp + record.timestamp_delta;
        if timestamp >= target {
            return Ok(Some((
                header.base_offset + i64::from(record.offset_delta),
                timestamp,
            )));
        }
    }
    // max_timestamp promised a record that is not there; answer at batch granularity.
    Ok(coarse)
}

/// Offset of the first record carrying the batch's max timestamp (Kafka's
/// `RecordBatch.offsetOfMaxTimestamp`): base offset for LogAppendTime, the
/// record found by walking the (decompressed) records, else the last offset.
pub fn offset_of_max_timestamp(batch: &[u8], limit: usize) -> Result<i64, BatchError> {
    let header = BatchHeader::parse(batch)?;
    if header.timestamp_type_is_log_append() {
        return Ok(header.base_offset);
    }
    let Some(body) = plain_records(batch, &header, limit)? else {
        return Ok(header.last_offset());
    };
    for record in records_in(&body, header.records_count) {
        let record = match record {
            Ok(record) => record,
            Err(_) if header.compression() != 0 => return Ok(header.last_offset()),
            Err(e) => return Err(e),
        };
        if header.base_timestamp + record.timestamp_delta == header.max_timestamp {
            return Ok(header.base_offset + i64::from(record.offset_delta));
        }
    }
    Ok(header.last_offset())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::compression::{to_topic_codec, CompressionType};
    use crate::testing::{build_batch, BatchSpec};

    const LIMIT: usize = 1 << 20;

    #[test]
    fn timestamp_lookups_inside_a_batch() {
        let bytes = build_batch(&BatchSpec {
            base_offset: 100,
            base_timestamp: 1_000,
            timestamp_step: 10,
            record_count: 5,
            ..BatchSpec::default()
        });
        // records at 1000, 1010, 1020, 1030, 1040
        assert_eq!(
            first_record_at_or_after(&bytes, 0, LIMIT).unwrap(),
            Some((100, 1_000))
        );
        assert_eq!(
            first_record_at_or_after(&bytes, 1_011, LIMIT).unwrap(),
            Some((102, 1_020))
        );
        assert_eq!(
            first_record_at_or_after(&bytes, 1_040, LIMIT).unwrap(),
            Some((104, 1_040))
        );
        assert_eq!(
            first_record_at_or_after(&bytes, 1_041, LIMIT).unwrap(),
            None
        );
        assert_eq!(offset_of_max_timestamp(&bytes, LIMIT).unwrap(), 104);

        let descending = build_batch(&BatchSpec {
            base_offset: 10,
            base_timestamp: 1_000,
            timestamp_step: -10,
            record_count: 3,
            ..BatchSpec::default()
        });
        assert_eq!(offset_of_max_timestamp(&descending, LIMIT).unwrap(), 10);

        // Codec bits on plain records: does not decompress, so batch granularity.
        let unreadable = build_batch(&BatchSpec {
            base_offset: 7,
            compression: 2,
            base_timestamp: 1_000,
            record_count: 3,
            ..BatchSpec::default()
        });
        assert_eq!(
            first_record_at_or_after(&unreadable, 1_001, LIMIT).unwrap(),
            Some((7, 1_002))
        );
        assert_eq!(offset_of_max_timestamp(&unreadable, LIMIT).unwrap(), 9);

        // Really compressed: the records are found as in a plain batch.
        for codec in [CompressionType::Gzip, CompressionType::Zstd] {
            let compressed = to_topic_codec(&descending, codec, u32::MAX).unwrap();
            assert_ne!(BatchHeader::parse(&compressed).unwrap().compression(), 0);
            assert_eq!(offset_of_max_timestamp(&compressed, LIMIT).unwrap(), 10);
            let rising = to_topic_codec(&bytes, codec, u32::MAX).unwrap();
            assert_eq!(
                first_record_at_or_after(&rising, 1_011, LIMIT).unwrap(),
                Some((102, 1_020)),
                "{codec:?}"
            );
            assert_eq!(offset_of_max_timestamp(&rising, LIMIT).unwrap(), 104);
        }
    }
}
