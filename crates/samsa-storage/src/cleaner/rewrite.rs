//! Rewrites one batch with the records a cleaning pass keeps.
//!
//! What must not change, so that offsets, idempotence and consumers are
//! as before: the base offset, the producer id, epoch and base sequence,
//! the partition leader epoch, the codec and the **last offset delta** (a
//! batch keeps covering its offsets, so its last offset and the producer's
//! last sequence, `base_sequence + last_offset_delta`, survive the
//! removal of its last records). `records_count` becomes the number of
//! records kept, so a cleaned batch may hold fewer records than it covers
//! offsets, or none.
//!
//! Kept records are copied byte for byte, except when the pass sets the
//! batch's delete horizon (KIP-534: attribute [`DELETE_HORIZON_FLAG`],
//! base timestamp = horizon): record timestamps are deltas from the base
//! timestamp, so each kept record's delta is rewritten to keep its
//! timestamp.

use super::retention::BatchFate;
use crate::batch::{
    self, put_varlong, read_varlong, recompute_crc, BatchError, RecordView, ATTRIBUTES_AT,
    BASE_TIMESTAMP_AT, BATCH_HEADER_LEN, BATCH_LENGTH_AT, DELETE_HORIZON_FLAG, LOG_OVERHEAD,
    MAX_TIMESTAMP_AT, RECORDS_COUNT_AT,
};
use crate::compression::{self, Codec};

#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("cannot compress the cleaned records with {codec}: {source}")]
    Compress {
        codec: &'static str,
        source: std::io::Error,
    },
    #[error("the cleaned batch would be {0} bytes long")]
    TooLong(usize),
}

/// What became of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rewritten {
    /// Every record kept and nothing to mark: copy the original.
    Unchanged,
    /// The batch as the cleaned log holds it.
    Replaced(Vec<u8>),
    /// Nothing of the batch remains.
    Removed,
}

/// Rewrites `batch` (one whole v2 batch, its records decompressing to at
/// most `limit` bytes). Unless the fate decides records one by one
/// ([`BatchFate::decides_records`]) no record is kept; otherwise
/// `keep(offset, record)` decides each. `delete_horizon_ms` becomes the
/// batch's horizon if the batch has none and it is a control batch or
/// keeps a tombstone: the horizon is when those may go.
pub fn rewrite_batch(
    batch: &[u8],
    limit: usize,
    fate: BatchFate,
    delete_horizon_ms: Option<i64>,
    mut keep: impl FnMut(i64, &RecordView<'_>) -> bool,
) -> Result<Rewritten, RewriteError> {
    let (header, batch) = batch::whole_batch(batch)?;
    let codec = Codec::from_id(header.compression())?;
    let body = compression::decompress(codec, &batch[BATCH_HEADER_LEN..], limit)?;
    let mut kept = Vec::new();
    for record in batch::records_in(&body, header.records_count) {
        let record = record?;
        let offset = header.base_offset + i64::from(record.offset_delta);
        if fate.decides_records() && keep(offset, &record) {
            kept.push(record);
        }
    }
    let needs_horizon = header.is_control() || kept.iter().any(|r| r.value.is_none());
    let new_horizon =
        delete_horizon_ms.filter(|_| needs_horizon && header.delete_horizon_ms().is_none());
    // First: a batch already emptied by an earlier pass goes once nothing
    // needs it any more.
    if kept.is_empty() && !fate.stays_empty() {
        return Ok(Rewritten::Removed);
    }
    let all_kept = i32::try_from(kept.len()).is_ok_and(|n| n == header.records_count);
    if all_kept && new_horizon.is_none() {
        return Ok(Rewritten::Unchanged);
    }
    let base_timestamp = new_horizon.unwrap_or(header.base_timestamp);
    let mut records = Vec::with_capacity(body.len());
    let mut record = Vec::new();
    for r in &kept {
        match new_horizon {
            None => {
                put_varlong(&mut records, r.raw.len() as i64);
                records.extend_from_slice(r.raw);
            }
            Some(horizon) => {
                let timestamp = header.base_timestamp + r.timestamp_delta;
                let Some((&attributes, mut after)) = r.raw.split_first() else {
                    return Err(BatchError::MalformedRecord("record too short").into());
                };
                read_varlong(&mut after)?;
                record.clear();
                record.push(attributes);
                put_varlong(&mut record, timestamp - horizon);
                record.extend_from_slice(after);
                put_varlong(&mut records, record.len() as i64);
                records.extend_from_slice(&record);
            }
        }
    }
    let max_timestamp = if kept.is_empty() || header.timestamp_type_is_log_append() {
        header.max_timestamp
    } else {
        kept.iter()
            .map(|r| header.base_timestamp + r.timestamp_delta)
            .max()
            .unwrap_or(header.max_timestamp)
    };
    let mut out = Vec::with_capacity(BATCH_HEADER_LEN + records.len());
    out.extend_from_slice(&batch[..BATCH_HEADER_LEN]);
    compression::compress_into(codec, &records, &mut out).map_err(|source| {
        RewriteError::Compress {
            codec: codec.name(),
            source,
        }
    })?;
    let batch_length =
        i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| RewriteError::TooLong(out.len()))?;
    out[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].copy_from_slice(&batch_length.to_be_bytes());
    let attributes = if new_horizon.is_some() {
        header.attributes | DELETE_HORIZON_FLAG
    } else {
        header.attributes
    };
    out[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
    out[BASE_TIMESTAMP_AT..BASE_TIMESTAMP_AT + 8].copy_from_slice(&base_timestamp.to_be_bytes());
    out[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&max_timestamp.to_be_bytes());
    // kept.len() <= records_count, an i32.
    let count = kept.len() as i32;
    out[RECORDS_COUNT_AT..RECORDS_COUNT_AT + 4].copy_from_slice(&count.to_be_bytes());
    recompute_crc(&mut out)?;
    Ok(Rewritten::Replaced(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::batch::{key_value_batch, records, set_base_offset, verify_crc, BatchHeader};
    use crate::compression::{decompressed_records, to_topic_codec, CompressionType};

    const LIMIT: usize = 1 << 20;

    /// Keys k0..kN with values v0..vN (None = tombstone) at offset 100.
    fn batch(values: &[Option<&str>]) -> Vec<u8> {
        let keys: Vec<String> = (0..values.len()).map(|i| format!("k{i}")).collect();
        let records: Vec<(&[u8], Option<&[u8]>)> = keys
            .iter()
            .zip(values)
            .map(|(k, v)| (k.as_bytes(), v.map(str::as_bytes)))
            .collect();
        let mut b = key_value_batch(&records, 5_000);
        set_base_offset(&mut b, 100);
        recompute_crc(&mut b).unwrap();
        b
    }

    fn keys_and_offsets(batch: &[u8]) -> Vec<(String, i64)> {
        let header = BatchHeader::parse(batch).unwrap();
        let body = decompressed_records(batch, LIMIT).unwrap();
        batch::records_in(&body, header.records_count)
            .map(|r| {
                let r = r.unwrap();
                (
                    String::from_utf8(r.key.unwrap().to_vec()).unwrap(),
                    header.base_offset + i64::from(r.offset_delta),
                )
            })
            .collect()
    }

    fn replaced(r: Rewritten) -> Vec<u8> {
        match r {
            Rewritten::Replaced(b) => b,
            other => panic!("expected a replacement, got {other:?}"),
        }
    }

    #[test]
    fn a_batch_that_keeps_everything_is_unchanged() {
        let b = batch(&[Some("a"), Some("b")]);
        let r = rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, None, |_, _| true).unwrap();
        assert_eq!(r, Rewritten::Unchanged);
    }

    #[test]
    fn kept_records_keep_their_offsets_and_the_batch_its_range() {
        let b = batch(&[Some("a"), Some("b"), Some("c"), Some("d")]);
        let original = BatchHeader::parse(&b).unwrap();
        let r = rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, None, |o, _| o == 101).unwrap();
        let cleaned = replaced(r);
        verify_crc(&cleaned).unwrap();
        let h = BatchHeader::parse(&cleaned).unwrap();
        assert_eq!(h.base_offset, 100);
        assert_eq!(h.last_offset(), original.last_offset());
        assert_eq!(h.last_sequence(), original.last_sequence());
        assert_eq!(h.records_count, 1);
        assert_eq!(keys_and_offsets(&cleaned), vec![("k1".to_string(), 101)]);
    }

    #[test]
    fn an_emptied_batch_goes_unless_it_must_stay() {
        let b = batch(&[Some("a"), Some("b")]);
        let gone = rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, None, |_, _| false).unwrap();
        assert_eq!(gone, Rewritten::Removed);
        let dropped = rewrite_batch(&b, LIMIT, BatchFate::Drop, None, |_, _| true).unwrap();
        assert_eq!(dropped, Rewritten::Removed);
        // Kept for a live producer's sequence, its records gone anyway.
        let held =
            replaced(rewrite_batch(&b, LIMIT, BatchFate::KeepEmpty, None, |_, _| true).unwrap());
        assert_eq!(BatchHeader::parse(&held).unwrap().records_count, 0);
        let empty = replaced(
            rewrite_batch(&b, LIMIT, BatchFate::KeepEvenIfEmpty, None, |_, _| false).unwrap(),
        );
        verify_crc(&empty).unwrap();
        let h = BatchHeader::parse(&empty).unwrap();
        assert_eq!(
            (h.records_count, h.base_offset, h.last_offset()),
            (0, 100, 101)
        );
        assert_eq!(records(&empty).unwrap().count(), 0);
    }

    #[test]
    fn setting_a_delete_horizon_keeps_every_record_timestamp() {
        let b = batch(&[Some("a"), None]);
        let cleaned = replaced(
            rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, Some(90_000), |_, _| true).unwrap(),
        );
        verify_crc(&cleaned).unwrap();
        let h = BatchHeader::parse(&cleaned).unwrap();
        assert_eq!(h.delete_horizon_ms(), Some(90_000));
        assert_eq!(h.max_timestamp, 5_000);
        let stamps: Vec<i64> = records(&cleaned)
            .unwrap()
            .map(|r| h.base_timestamp + r.unwrap().timestamp_delta)
            .collect();
        assert_eq!(stamps, vec![5_000, 5_000]);
        // A horizon, once set, stays: a later pass does not move it.
        let again = rewrite_batch(
            &cleaned,
            LIMIT,
            BatchFate::DropIfEmpty,
            Some(99_000),
            |_, _| true,
        )
        .unwrap();
        assert_eq!(again, Rewritten::Unchanged);
    }

    #[test]
    fn an_empty_batch_goes_once_nothing_keeps_it() {
        let b = batch(&[Some("a")]);
        let empty = replaced(
            rewrite_batch(&b, LIMIT, BatchFate::KeepEvenIfEmpty, None, |_, _| false).unwrap(),
        );
        assert_eq!(BatchHeader::parse(&empty).unwrap().records_count, 0);
        let again = rewrite_batch(&empty, LIMIT, BatchFate::KeepEvenIfEmpty, None, |_, _| true);
        assert_eq!(again.unwrap(), Rewritten::Unchanged);
        let later = rewrite_batch(&empty, LIMIT, BatchFate::DropIfEmpty, None, |_, _| true);
        assert_eq!(later.unwrap(), Rewritten::Removed);
    }

    #[test]
    fn a_batch_without_tombstones_gets_no_horizon() {
        let b = batch(&[Some("a"), Some("b")]);
        let r = rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, Some(90_000), |_, _| true);
        assert_eq!(r.unwrap(), Rewritten::Unchanged);
        // Its tombstone superseded, a batch has nothing left to delete later.
        let b = batch(&[Some("a"), None]);
        let cleaned = replaced(
            rewrite_batch(&b, LIMIT, BatchFate::DropIfEmpty, Some(90_000), |o, _| {
                o == 100
            })
            .unwrap(),
        );
        assert_eq!(
            BatchHeader::parse(&cleaned).unwrap().delete_horizon_ms(),
            None
        );
    }

    #[test]
    fn compressed_batches_are_cleaned_in_their_codec() {
        let plain = batch(&[Some("a"), Some("b"), Some("c")]);
        let gzip = to_topic_codec(&plain, CompressionType::Gzip, 1 << 20)
            .unwrap()
            .into_owned();
        let codec = BatchHeader::parse(&gzip).unwrap().compression();
        assert_ne!(codec, 0);
        let cleaned = replaced(
            rewrite_batch(&gzip, LIMIT, BatchFate::DropIfEmpty, None, |o, _| o != 101).unwrap(),
        );
        verify_crc(&cleaned).unwrap();
        assert_eq!(BatchHeader::parse(&cleaned).unwrap().compression(), codec);
        assert_eq!(
            keys_and_offsets(&cleaned),
            vec![("k0".to_string(), 100), ("k2".to_string(), 102)]
        );
    }
}
