#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::batch::{set_base_offset, BatchHeader};
use crate::compression::CompressionType;
use crate::testing::{
    build_batch, headers, idempotent_batch, simple_batch, transactional_batch,
    without_assigned_fields, BatchSpec,
};

const NOW: i64 = 1_700_000_000_000;

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

fn open(dir: &Path, config: &LogConfig) -> PartitionLog {
    PartitionLog::open(dir, config.clone(), NOW).unwrap().0
}

fn open_report(dir: &Path, config: &LogConfig) -> (PartitionLog, RecoveryReport) {
    PartitionLog::open(dir, config.clone(), NOW).unwrap()
}

/// Every batch from log start to log end, read in small steps; offsets
/// increase (gaps only where a test made them).
fn read_all(log: &PartitionLog) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 1000, i64::MAX).unwrap();
        assert!(
            !r.records.is_empty(),
            "empty read at {offset} below LEO {}",
            log.log_end_offset()
        );
        for item in batch::batches(&r.records) {
            let (h, bytes) = item.unwrap();
            verify_crc(bytes).unwrap();
            assert!(h.base_offset >= offset, "offsets increase");
            offset = h.last_offset() + 1;
            out.push(bytes.to_vec());
        }
    }
    out
}

fn batch_with(records: i32, value_len: usize, timestamp: i64) -> Vec<u8> {
    build_batch(&BatchSpec {
        record_count: records,
        value_len,
        base_timestamp: timestamp,
        timestamp_step: 0,
        ..BatchSpec::default()
    })
}

#[test]
fn log_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PartitionLog>();
    assert_send_sync::<FlushTarget>();
}

#[test]
fn new_log_is_empty_and_creates_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (log, report) = open_report(dir.path(), &small_config());
    assert_eq!(
        (
            log.log_start_offset(),
            log.log_end_offset(),
            log.high_watermark()
        ),
        (0, 0, 0)
    );
    assert!(!report.clean_shutdown);
    assert_eq!(log.segment_count(), 1);
    assert!(dir.path().join("00000000000000000000.log").exists());
    assert!(dir.path().join("00000000000000000000.index").exists());
    assert!(dir.path().join("00000000000000000000.timeindex").exists());
    assert!(dir.path().join("checkpoint").exists());
    assert_eq!(log.read(0, 100, i64::MAX).unwrap(), ReadResult::default());
    assert!(log.flush_target().is_none());
    assert_eq!(log.max_timestamp_and_offset(), None);
    assert_eq!(log.offset_for_timestamp(0).unwrap(), None);
}

#[test]
fn append_assigns_offsets_and_rewrites_only_offset_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let a = simple_batch(3, 100);
    let b = simple_batch(2, 200);
    let info_a = log.append_as_leader(&a, 5, NOW).unwrap();
    assert_eq!(
        info_a,
        AppendInfo {
            base_offset: 0,
            last_offset: 2,
            max_timestamp: 100,
            offset_of_max_timestamp: 2,
            record_count: 3,
            duplicate: false,
            log_append_time_ms: -1,
        }
    );
    let info_b = log.append_as_leader(&b, 6, NOW).unwrap();
    assert_eq!((info_b.base_offset, info_b.last_offset), (3, 4));
    assert_eq!(log.log_end_offset(), 5);
    assert_eq!(log.high_watermark(), 0, "the broker moves the HW");

    let stored = read_all(&log);
    assert_eq!(stored.len(), 2);
    let h = BatchHeader::parse(&stored[1]).unwrap();
    assert_eq!((h.base_offset, h.partition_leader_epoch), (3, 6));
    assert_eq!(
        without_assigned_fields(&stored[0]),
        without_assigned_fields(&a)
    );
    assert_eq!(
        without_assigned_fields(&stored[1]),
        without_assigned_fields(&b)
    );
    assert_eq!(log.size_bytes(), (a.len() + b.len()) as u64);
}

#[test]
fn multi_batch_request_is_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let mut request = simple_batch(2, 10);
    request.extend_from_slice(&simple_batch(4, 30));
    request.extend_from_slice(&simple_batch(1, 20));
    let info = log.append_as_leader(&request, 0, NOW).unwrap();
    assert_eq!(
        (info.base_offset, info.last_offset, info.record_count),
        (0, 6, 7)
    );
    assert_eq!((info.max_timestamp, info.offset_of_max_timestamp), (30, 5));
    let hs = headers(&log.read(0, 1 << 20, i64::MAX).unwrap().records);
    assert_eq!(
        hs.iter().map(|h| h.base_offset).collect::<Vec<_>>(),
        vec![0, 2, 6]
    );
}

#[test]
fn invalid_requests_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        max_message_bytes: 500,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&simple_batch(1, 1), 0, NOW).unwrap();
    let size = log.size_bytes();

    let good = simple_batch(2, 5);
    let mut bad_crc = good.clone();
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 1;
    let mut good_then_bad = good.clone();
    good_then_bad.extend_from_slice(&bad_crc);
    let mut v1 = good.clone();
    v1[16] = 1;
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0, 0, 0]);
    let mut count_mismatch = good.clone();
    count_mismatch[57..61].copy_from_slice(&5i32.to_be_bytes());
    crate::batch::recompute_crc(&mut count_mismatch).unwrap();
    let control = build_batch(&BatchSpec {
        control: true,
        ..BatchSpec::idempotent(1, 0, 0, 1)
    });
    let txn_without_pid = build_batch(&BatchSpec {
        transactional: true,
        ..BatchSpec::default()
    });
    let too_large = batch_with(1, 600, 5);

    type Expectation = fn(&StorageError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Expectation)> = vec![
        ("bad crc", bad_crc, |e| {
            matches!(
                e,
                StorageError::CorruptRecord(BatchError::CrcMismatch { .. })
            )
        }),
        ("good then bad", good_then_bad, |e| {
            matches!(e, StorageError::CorruptRecord(_))
        }),
        ("magic 1", v1, |e| {
            matches!(
                e,
                StorageError::CorruptRecord(BatchError::UnsupportedMagic(1))
            )
        }),
        ("trailing bytes", trailing, |e| {
            matches!(e, StorageError::CorruptRecord(BatchError::Truncated { .. }))
        }),
        ("count mismatch", count_mismatch, |e| {
            matches!(e, StorageError::InvalidRecord(_))
        }),
        ("control", control, |e| {
            matches!(e, StorageError::InvalidRecord(_))
        }),
        ("txn without pid", txn_without_pid, |e| {
            matches!(e, StorageError::InvalidRecord(_))
        }),
        ("too large", too_large, |e| {
            matches!(e, StorageError::RecordTooLarge { max: 500, .. })
        }),
        ("empty", Vec::new(), |e| {
            matches!(e, StorageError::InvalidRecord(_))
        }),
    ];
    for (name, request, expected) in cases {
        let err = log.append_as_leader(&request, 0, NOW).unwrap_err();
        assert!(expected(&err), "{name}: unexpected {err:?}");
        assert_eq!(log.log_end_offset(), 1, "{name}");
        assert_eq!(log.size_bytes(), size, "{name}");
        let file_len = std::fs::metadata(dir.path().join("00000000000000000000.log"))
            .unwrap()
            .len();
        assert_eq!(file_len, size, "{name}: nothing reached the file");
    }
    log.append_as_leader(&good, 0, NOW).unwrap();
    assert_eq!(read_all(&log).len(), 2);
}

#[test]
fn log_append_time_stamps_batches_and_keeps_crc_valid() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        message_timestamp_type_log_append: true,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let info = log.append_as_leader(&simple_batch(3, 5), 0, NOW).unwrap();
    assert_eq!(info.log_append_time_ms, NOW);
    assert_eq!(info.max_timestamp, NOW);
    let stored = read_all(&log);
    let h = BatchHeader::parse(&stored[0]).unwrap();
    assert!(h.timestamp_type_is_log_append());
    assert_eq!(h.max_timestamp, NOW);
    verify_crc(&stored[0]).unwrap();
    assert_eq!(log.max_timestamp_and_offset(), Some((0, NOW)));
    assert_eq!(log.offset_for_timestamp(NOW).unwrap(), Some((0, NOW)));
}

// ---- idempotence through the log ----

#[test]
fn duplicate_returns_original_offsets_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&simple_batch(2, 1), 0, NOW).unwrap();
    let first = idempotent_batch(77, 0, 0, 3, NOW);
    let info = log.append_as_leader(&first, 0, NOW).unwrap();
    assert_eq!(
        (info.base_offset, info.last_offset, info.duplicate),
        (2, 4, false)
    );
    log.append_as_leader(&idempotent_batch(77, 0, 3, 2, NOW), 0, NOW)
        .unwrap();
    let (size, leo) = (log.size_bytes(), log.log_end_offset());

    let retry = log.append_as_leader(&first, 0, NOW).unwrap();
    assert!(retry.duplicate);
    assert_eq!(
        (retry.base_offset, retry.last_offset, retry.record_count),
        (2, 4, 3)
    );
    assert_eq!((log.size_bytes(), log.log_end_offset()), (size, leo));
    assert_eq!(read_all(&log).len(), 3);
}

#[test]
fn sequence_and_epoch_violations_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&idempotent_batch(5, 2, 0, 2, NOW), 0, NOW)
        .unwrap();
    let leo = log.log_end_offset();
    match log.append_as_leader(&idempotent_batch(5, 2, 3, 1, NOW), 0, NOW) {
        Err(StorageError::OutOfOrderSequence {
            producer_id: 5,
            expected: 2,
            found: 3,
        }) => {}
        other => panic!("gap: {other:?}"),
    }
    match log.append_as_leader(&idempotent_batch(5, 1, 2, 1, NOW), 0, NOW) {
        Err(StorageError::InvalidProducerEpoch {
            producer_id: 5,
            current: 2,
            found: 1,
        }) => {}
        other => panic!("stale epoch: {other:?}"),
    }
    match log.append_as_leader(&idempotent_batch(5, 3, 2, 1, NOW), 0, NOW) {
        Err(StorageError::OutOfOrderSequence {
            expected: 0,
            found: 2,
            ..
        }) => {}
        other => panic!("bump without seq 0: {other:?}"),
    }
    assert_eq!(log.log_end_offset(), leo);
    log.append_as_leader(&idempotent_batch(5, 3, 0, 1, NOW), 0, NOW)
        .unwrap();
    assert_eq!(log.producer_state().get(5).unwrap().epoch, 3);
    // Unknown producer: any sequence.
    log.append_as_leader(&idempotent_batch(6, 0, 41, 1, NOW), 0, NOW)
        .unwrap();
    assert_eq!(log.producer_state().get(6).unwrap().last_sequence, 41);
}

#[test]
fn rejected_request_leaves_producer_state_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let mut request = idempotent_batch(9, 0, 0, 1, NOW);
    let mut corrupt = simple_batch(1, 1);
    corrupt[70] ^= 0xff;
    request.extend_from_slice(&corrupt);
    assert!(matches!(
        log.append_as_leader(&request, 0, NOW),
        Err(StorageError::CorruptRecord(BatchError::CrcMismatch { .. }))
    ));
    assert!(log.producer_state().get(9).is_none());
    let info = log
        .append_as_leader(&idempotent_batch(9, 0, 0, 1, NOW), 0, NOW)
        .unwrap();
    assert!(!info.duplicate);
}

#[test]
fn same_batch_twice_in_one_request_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let mut request = idempotent_batch(9, 0, 0, 1, NOW);
    request.extend_from_slice(&idempotent_batch(9, 0, 0, 1, NOW));
    assert!(matches!(
        log.append_as_leader(&request, 0, NOW),
        Err(StorageError::InvalidRecord(_))
    ));
    // Two consecutive batches of one producer in one request are fine.
    let mut request = idempotent_batch(9, 0, 0, 1, NOW);
    request.extend_from_slice(&idempotent_batch(9, 0, 1, 2, NOW));
    let info = log.append_as_leader(&request, 0, NOW).unwrap();
    assert_eq!((info.base_offset, info.last_offset), (0, 2));
}

/// Appends batches of producers 1 and 2 across several segments.
fn idempotent_history(log: &mut PartitionLog) -> Vec<(Vec<u8>, i64)> {
    let mut sent = Vec::new();
    for i in 0..30 {
        let pid = 1 + (i % 2) as i64;
        let seq = (i / 2) * 3;
        let batch = build_batch(&BatchSpec {
            value_len: 100,
            base_timestamp: NOW,
            ..BatchSpec::idempotent(pid, 0, seq, 3)
        });
        let info = log.append_as_leader(&batch, 0, NOW).unwrap();
        sent.push((batch, info.base_offset));
    }
    sent
}

#[test]
fn deduplication_survives_clean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let sent = idempotent_history(&mut log);
    assert!(log.segment_count() > 2);
    log.close().unwrap();
    let (mut log, report) = open_report(dir.path(), &config);
    assert!(report.clean_shutdown);
    assert_eq!(report.segments_scanned, 0);
    assert_eq!(
        report.batches_replayed, 0,
        "snapshot at the log end covers everything"
    );
    let size = log.size_bytes();
    for (batch, offset) in &sent[sent.len() - 10..] {
        let info = log.append_as_leader(batch, 0, NOW).unwrap();
        assert!(info.duplicate);
        assert_eq!(info.base_offset, *offset);
    }
    assert_eq!(log.size_bytes(), size);
    assert!(matches!(
        log.append_as_leader(&idempotent_batch(1, 0, 999, 1, NOW), 0, NOW),
        Err(StorageError::OutOfOrderSequence { expected: 45, .. })
    ));
}

#[test]
fn deduplication_survives_unclean_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let sent = idempotent_history(&mut log);
    let segments = log.segment_count();
    assert!(segments > 2);
    let leo = log.log_end_offset();
    // The recovery point moves into the last segment, so recovery validates
    // only that one and replays from the snapshot at its base. (Without a
    // flush every segment is validated and the replay starts at the log start.)
    log.flush().unwrap();
    drop(log); // no close(): a crash as far as the directory can tell

    let (mut log, report) = open_report(dir.path(), &config);
    assert!(!report.clean_shutdown);
    assert!(report.segments_scanned >= 1);
    assert!(report.snapshot_offset.is_some(), "roll-time snapshot used");
    assert!(
        report.batches_replayed > 0,
        "batches after the snapshot replayed"
    );
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(log.segment_count(), segments);
    for (batch, offset) in &sent[sent.len() - 10..] {
        let info = log.append_as_leader(batch, 0, NOW).unwrap();
        assert!(info.duplicate, "batch at {offset} not recognised");
        assert_eq!(info.base_offset, *offset);
    }
    assert_eq!(log.log_end_offset(), leo);
    log.append_as_leader(&idempotent_batch(1, 0, 45, 1, NOW), 0, NOW)
        .unwrap();
}

#[test]
fn deduplication_survives_losing_every_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let sent = idempotent_history(&mut log);
    drop(log);
    for offset in producer_state::list_snapshots(dir.path()).unwrap() {
        std::fs::remove_file(producer_state::snapshot_path(dir.path(), offset)).unwrap();
    }
    let (mut log, report) = open_report(dir.path(), &config);
    assert_eq!(report.snapshot_offset, None);
    assert_eq!(report.batches_replayed, 30);
    let (batch, offset) = &sent[29];
    let info = log.append_as_leader(batch, 0, NOW).unwrap();
    assert!(info.duplicate);
    assert_eq!(info.base_offset, *offset);
}

#[test]
fn damaged_snapshot_falls_back_to_an_older_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let sent = idempotent_history(&mut log);
    log.close().unwrap();
    let snapshots = producer_state::list_snapshots(dir.path()).unwrap();
    let newest = *snapshots.last().unwrap();
    let path = producer_state::snapshot_path(dir.path(), newest);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[20] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    let (mut log, report) = open_report(dir.path(), &config);
    assert!(report.snapshot_offset.unwrap() < newest);
    assert!(report.batches_replayed > 0);
    assert!(!path.exists(), "damaged snapshot deleted");
    let info = log.append_as_leader(&sent[29].0, 0, NOW).unwrap();
    assert!(info.duplicate);
}

#[test]
fn idle_producers_expire_and_then_restart_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        producer_id_expiration_ms: 1000,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&idempotent_batch(1, 0, 0, 1, NOW), 0, NOW)
        .unwrap();
    log.append_as_leader(&idempotent_batch(2, 0, 0, 1, NOW + 800), 0, NOW)
        .unwrap();
    log.enforce_retention(NOW + 999).unwrap();
    assert_eq!(log.producer_state().len(), 2);
    log.enforce_retention(NOW + 1000).unwrap();
    assert!(log.producer_state().get(1).is_none());
    assert!(log.producer_state().get(2).is_some());
    // Expired: its sequence is no longer checked.
    log.append_as_leader(&idempotent_batch(1, 0, 500, 1, NOW + 1000), 0, NOW)
        .unwrap();
}

// ---- rolling and retention ----

#[test]
fn rolls_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let batch = batch_with(1, 900, NOW);
    for _ in 0..10 {
        log.append_as_leader(&batch, 0, NOW).unwrap();
    }
    let per_segment = 4096 / batch.len();
    assert_eq!(log.segment_count(), 10usize.div_ceil(per_segment));
    for segment in log.segments.values() {
        assert!(segment.size() <= 4096);
        assert_eq!(segment.size() % batch.len() as u64, 0);
    }
    assert_eq!(log.segment_base_offsets()[1], per_segment as i64);
    assert_eq!(read_all(&log).len(), 10);
    // A batch larger than a segment still goes in (alone).
    let big = batch_with(1, 5000, NOW);
    let config = LogConfig {
        max_message_bytes: 10_000,
        ..config
    };
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&big, 0, NOW).unwrap();
    log.append_as_leader(&big, 0, NOW).unwrap();
    assert_eq!(log.segment_count(), 2);
}

#[test]
fn rolls_by_age_of_first_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_ms: 100,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&simple_batch(1, 1_000), 0, 1_000)
        .unwrap();
    log.append_as_leader(&simple_batch(1, 1_050), 0, 1_050)
        .unwrap();
    log.append_as_leader(&simple_batch(1, 1_100), 0, 1_100)
        .unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append_as_leader(&simple_batch(1, 1_101), 0, 1_101)
        .unwrap();
    assert_eq!(log.segment_count(), 2);
    assert_eq!(log.segment_base_offsets(), vec![0, 3]);
    // Data with old timestamps does not roll on every append: timestamps are
    // compared with timestamps, not with the wall clock.
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &config);
    for ts in [1_000, 1_020, 1_040] {
        log.append_as_leader(&simple_batch(1, ts), 0, NOW).unwrap();
    }
    assert_eq!(log.segment_count(), 1);
    // Without timestamps, wall time since the segment was created counts.
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config.clone(), 1_000)
        .unwrap()
        .0;
    log.append_as_leader(&simple_batch(1, -1), 0, 1_000)
        .unwrap();
    log.append_as_leader(&simple_batch(1, -1), 0, 1_100)
        .unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append_as_leader(&simple_batch(1, -1), 0, 1_101)
        .unwrap();
    assert_eq!(log.segment_count(), 2);
}

#[test]
fn retention_by_size_deletes_oldest_segments_and_moves_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: 8192,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let batch = batch_with(2, 900, NOW);
    for _ in 0..20 {
        log.append_as_leader(&batch, 0, NOW).unwrap();
    }
    let segments = log.segment_count();
    assert_eq!(
        log.enforce_retention(NOW).unwrap(),
        0,
        "nothing below the HW yet"
    );
    log.set_high_watermark(log.log_end_offset()).unwrap();
    let deleted = log.enforce_retention(NOW).unwrap();
    assert!(deleted > 0);
    assert_eq!(log.segment_count(), segments - deleted);
    assert!(log.size_bytes() >= 8192 - 4096 && log.size_bytes() < 8192 + 4096);
    let start = log.log_start_offset();
    assert_eq!(start, log.segment_base_offsets()[0]);
    assert!(start > 0);
    assert!(matches!(
        log.read(start - 1, 100, i64::MAX),
        Err(StorageError::OffsetOutOfRange { offset, log_start, .. }) if offset == start - 1 && log_start == start
    ));
    assert!(!dir.path().join("00000000000000000000.log").exists());
    assert!(!dir.path().join("00000000000000000000.index").exists());
    let remaining = read_all(&log).len();
    // Retention is persisted.
    drop(log);
    let log = open(dir.path(), &config);
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(read_all(&log).len(), remaining);
}

#[test]
fn delete_records_moves_log_start_inside_a_segment_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let batch = batch_with(2, 900, NOW);
    for _ in 0..20 {
        log.append_as_leader(&batch, 0, NOW).unwrap();
    }
    let bases = log.segment_base_offsets();
    assert!(bases.len() > 2, "{bases:?}");
    let end = log.log_end_offset();
    assert!(
        matches!(
            log.delete_records_before(1),
            Err(StorageError::OffsetOutOfRange { .. })
        ),
        "above the high watermark"
    );
    log.set_high_watermark(end).unwrap();
    // Inside the third segment: the two before it go, it stays.
    let target = bases[2] + 1;
    assert_eq!(log.delete_records_before(target).unwrap(), target);
    assert_eq!(log.log_start_offset(), target);
    assert_eq!(log.segment_base_offsets()[0], bases[2]);
    assert!(matches!(
        log.read(target - 1, 100, i64::MAX),
        Err(StorageError::OffsetOutOfRange { offset, log_start, .. }) if offset == target - 1 && log_start == target
    ));
    // The batch holding the new log start is still served whole.
    let first = log.read(target, 100, i64::MAX).unwrap();
    assert_eq!(first.first_batch_offset, Some(bases[2]));
    // Lower offsets change nothing; persisted across a reopen.
    assert_eq!(log.delete_records_before(2).unwrap(), target);
    drop(log);
    let mut log = open(dir.path(), &config);
    assert_eq!(log.log_start_offset(), target);
    assert_eq!(log.log_end_offset(), end);
    // Up to the log end: everything is gone but the active segment.
    log.set_high_watermark(end).unwrap();
    assert_eq!(log.delete_records_before(end).unwrap(), end);
    assert_eq!(log.segment_count(), 1);
    assert!(log.read(end, 100, i64::MAX).unwrap().records.is_empty());
}

#[test]
fn retention_by_time_uses_the_newest_timestamp_of_each_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_ms: 10_000,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    // Four segments with newest timestamps 1000, 2000, 3000, 4000 (each one
    // has an older batch first, so the newest timestamp is what counts).
    for s in 1..=4 {
        log.append_as_leader(&batch_with(1, 1900, s * 1000 - 500), 0, NOW)
            .unwrap();
        log.append_as_leader(&batch_with(1, 1900, s * 1000), 0, NOW)
            .unwrap();
    }
    assert_eq!(log.segment_count(), 4);
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert_eq!(log.enforce_retention(11_000).unwrap(), 0);
    assert_eq!(log.enforce_retention(12_001).unwrap(), 2);
    assert_eq!(log.log_start_offset(), 4);
    // The active segment is never deleted, however old.
    assert_eq!(log.enforce_retention(1_000_000).unwrap(), 1);
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_start_offset(), 6);
}

#[test]
fn retention_stops_at_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: 0,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    for _ in 0..12 {
        log.append_as_leader(&batch_with(1, 1500, NOW), 0, NOW)
            .unwrap();
    }
    let bases = log.segment_base_offsets();
    log.set_high_watermark(bases[2]).unwrap();
    assert_eq!(log.enforce_retention(NOW).unwrap(), 2);
    assert_eq!(log.log_start_offset(), bases[2]);
}

// ---- reads ----

fn log_with_sized_batches(
    dir: &Path,
    config: &LogConfig,
    n: usize,
) -> (PartitionLog, Vec<Vec<u8>>) {
    let mut log = open(dir, config);
    let mut batches = Vec::new();
    for i in 0..n {
        let b = build_batch(&BatchSpec {
            record_count: 1 + (i % 4) as i32,
            value_len: 50,
            base_timestamp: 1000 + i as i64 * 10,
            value_seed: i as u8,
            ..BatchSpec::default()
        });
        log.append_as_leader(&b, 0, NOW).unwrap();
        batches.push(b);
    }
    (log, batches)
}

#[test]
fn read_respects_max_bytes_but_returns_the_first_batch_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = log_with_sized_batches(dir.path(), &LogConfig::default(), 10);
    let two_and_a_half = batches[0].len() + batches[1].len() + batches[2].len() / 2;
    let r = log.read(0, two_and_a_half, i64::MAX).unwrap();
    assert_eq!(headers(&r.records).len(), 2);
    assert_eq!(r.first_batch_offset, Some(0));
    let r = log.read(0, 1, i64::MAX).unwrap();
    assert_eq!(
        r.records.len(),
        batches[0].len(),
        "KIP-74: first batch whole"
    );
    let r = log.read(0, 0, i64::MAX).unwrap();
    assert_eq!(headers(&r.records).len(), 1);
    let r = log.read(0, usize::MAX, i64::MAX).unwrap();
    assert_eq!(headers(&r.records).len(), 10);
}

#[test]
fn read_stops_before_max_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = log_with_sized_batches(dir.path(), &small_config(), 10);
    let all = headers(&log.read(0, usize::MAX, i64::MAX).unwrap().records);
    let bound = all[4].base_offset;
    let r = log.read(0, usize::MAX, bound).unwrap();
    let hs = headers(&r.records);
    assert!(!hs.is_empty());
    assert!(hs.iter().all(|h| h.last_offset() < bound));
    assert_eq!(hs.last().unwrap().last_offset() + 1, bound);
    assert_eq!(log.read(bound, 1000, bound).unwrap(), ReadResult::default());
    // A bound inside a batch (batch 5 has two records) excludes that batch.
    assert_eq!(all[5].records_count, 2);
    let r = log.read(0, usize::MAX, all[5].base_offset + 1).unwrap();
    assert_eq!(headers(&r.records).len(), 5);
    // Even when it is the first one.
    let r = log
        .read(all[5].base_offset, usize::MAX, all[5].last_offset())
        .unwrap();
    assert!(r.records.is_empty());
}

#[test]
fn read_from_the_middle_of_a_batch_returns_the_containing_batch() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        index_interval_bytes: 1,
        ..small_config()
    };
    let (log, _) = log_with_sized_batches(dir.path(), &config, 40);
    assert!(log.segment_count() > 1);
    let all: Vec<BatchHeader> = read_all(&log)
        .iter()
        .map(|b| BatchHeader::parse(b).unwrap())
        .collect();
    for h in &all {
        for offset in h.base_offset..=h.last_offset() {
            let r = log.read(offset, 1, i64::MAX).unwrap();
            let got = headers(&r.records);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].base_offset, h.base_offset, "offset {offset}");
            assert_eq!(r.first_batch_offset, Some(h.base_offset));
        }
    }
}

#[test]
fn read_continues_into_the_next_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = log_with_sized_batches(dir.path(), &small_config(), 60);
    assert!(log.segment_count() >= 3);
    let r = log.read(0, usize::MAX, i64::MAX).unwrap();
    let got: Vec<_> = batch::batches(&r.records)
        .map(|b| b.unwrap().1.to_vec())
        .collect();
    assert_eq!(got.len(), batches.len());
    for (g, b) in got.iter().zip(&batches) {
        assert_eq!(without_assigned_fields(g), without_assigned_fields(b));
    }
}

#[test]
fn read_offsets_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = log_with_sized_batches(dir.path(), &small_config(), 3);
    let leo = log.log_end_offset();
    assert_eq!(log.read(leo, 100, i64::MAX).unwrap(), ReadResult::default());
    assert!(matches!(
        log.read(leo + 1, 100, i64::MAX),
        Err(StorageError::OffsetOutOfRange { offset, log_start: 0, log_end }) if offset == leo + 1 && log_end == leo
    ));
    assert!(matches!(
        log.read(-1, 100, i64::MAX),
        Err(StorageError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn read_detects_corruption_behind_the_logs_back() {
    let dir = tempfile::tempdir().unwrap();
    let (log, batches) = log_with_sized_batches(dir.path(), &small_config(), 3);
    let path = dir.path().join("00000000000000000000.log");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = batches[0].len() + 70;
    bytes[at] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(log.read(0, 100, i64::MAX).is_ok(), "first batch intact");
    assert!(matches!(
        log.read(0, usize::MAX, i64::MAX),
        Err(StorageError::Corrupt(..))
    ));
}

// ---- timestamps ----

#[test]
fn offset_for_timestamp_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        index_interval_bytes: 100,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    // Batch i: 4 records at 1000*i + {0, 10, 20, 30}; offsets 4i..4i+3.
    for i in 1..=40i64 {
        let b = build_batch(&BatchSpec {
            record_count: 4,
            base_timestamp: 1000 * i,
            timestamp_step: 10,
            value_len: 60,
            ..BatchSpec::default()
        });
        log.append_as_leader(&b, 0, NOW).unwrap();
    }
    assert!(log.segment_count() > 2);
    let check = |log: &PartitionLog| {
        assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((0, 1000)));
        assert_eq!(log.offset_for_timestamp(1000).unwrap(), Some((0, 1000)));
        assert_eq!(log.offset_for_timestamp(1001).unwrap(), Some((1, 1010)));
        assert_eq!(log.offset_for_timestamp(1031).unwrap(), Some((4, 2000)));
        assert_eq!(
            log.offset_for_timestamp(25_015).unwrap(),
            Some((24 * 4 + 2, 25_020))
        );
        assert_eq!(
            log.offset_for_timestamp(40_030).unwrap(),
            Some((159, 40_030))
        );
        assert_eq!(log.offset_for_timestamp(40_031).unwrap(), None);
        assert_eq!(log.max_timestamp_and_offset(), Some((159, 40_030)));
    };
    check(&log);
    log.close().unwrap();
    let log = open(dir.path(), &config);
    check(&log);
    drop(log);
    std::fs::write(dir.path().join("checkpoint"), b"garbage").unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(
        report.segments_scanned,
        log.segment_count(),
        "no checkpoint: everything validated"
    );
    check(&log);
}

#[test]
fn timestamps_out_of_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    for ts in [5000, 3000, 9000, 1000, 9000, 7000] {
        log.append_as_leader(&simple_batch(2, ts), 0, NOW).unwrap();
    }
    assert_eq!(log.offset_for_timestamp(4000).unwrap(), Some((0, 5000)));
    assert_eq!(log.offset_for_timestamp(6000).unwrap(), Some((4, 9000)));
    assert_eq!(log.offset_for_timestamp(9001).unwrap(), None);
    assert_eq!(
        log.max_timestamp_and_offset(),
        Some((4, 9000)),
        "first record with the max"
    );
}

#[test]
fn max_timestamp_finds_the_record_inside_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&simple_batch(3, 100), 0, NOW).unwrap();
    let b = build_batch(&BatchSpec {
        record_count: 5,
        base_timestamp: 900,
        timestamp_step: -100,
        ..BatchSpec::default()
    });
    log.append_as_leader(&b, 0, NOW).unwrap();
    log.append_as_leader(&simple_batch(3, 200), 0, NOW).unwrap();
    assert_eq!(log.max_timestamp_and_offset(), Some((3, 900)));
    let compressed = build_batch(&BatchSpec {
        record_count: 4,
        base_timestamp: 1000,
        compression: 1,
        ..BatchSpec::default()
    });
    log.append_as_leader(&compressed, 0, NOW).unwrap();
    // Codec bits over plain records (a producer topic stores what it gets):
    // they do not decompress, so the batch's last / base offset.
    assert_eq!(log.max_timestamp_and_offset(), Some((14, 1003)));
    assert_eq!(log.offset_for_timestamp(1001).unwrap(), Some((11, 1003)));
    // Really compressed: the record itself, as Kafka answers.
    let zstd = with_codec(
        &build_batch(&BatchSpec {
            record_count: 4,
            base_timestamp: 2000,
            timestamp_step: -10,
            ..BatchSpec::default()
        }),
        CompressionType::Zstd,
    );
    log.append_as_leader(&zstd, 0, NOW).unwrap();
    assert_eq!(log.max_timestamp_and_offset(), Some((15, 2000)));
    let lz4 = with_codec(
        &build_batch(&BatchSpec {
            record_count: 4,
            base_timestamp: 3000,
            timestamp_step: 10,
            ..BatchSpec::default()
        }),
        CompressionType::Lz4,
    );
    log.append_as_leader(&lz4, 0, NOW).unwrap();
    assert_eq!(log.offset_for_timestamp(3015).unwrap(), Some((21, 3020)));
    assert_eq!(log.max_timestamp_and_offset(), Some((22, 3030)));
}

// ---- flushing and the high watermark ----

#[test]
fn flush_target_covers_unflushed_segments_and_advances_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    assert!(log.flush_target().is_none());
    for _ in 0..6 {
        log.append_as_leader(&batch_with(1, 1500, NOW), 0, NOW)
            .unwrap();
    }
    assert_eq!(log.segment_count(), 3);
    let target = log.flush_target().unwrap();
    assert_eq!(target.up_to_offset(), 6);
    assert_eq!(target.files.len(), 3);
    assert!(
        target.dir.is_some(),
        "new segment files need a directory fsync"
    );
    // Appends continue while the target is synced.
    log.append_as_leader(&batch_with(1, 10, NOW), 0, NOW)
        .unwrap();
    target.sync().unwrap();
    log.mark_flushed(target.up_to_offset()).unwrap();
    assert_eq!(log.flushed_offset(), 6);
    let next = log.flush_target().unwrap();
    assert_eq!(next.up_to_offset(), 7);
    assert_eq!(next.files.len(), 1);
    log.mark_flushed(3).unwrap();
    assert_eq!(log.flushed_offset(), 6, "never backwards");
    log.mark_flushed(100).unwrap();
    assert_eq!(log.flushed_offset(), 7, "never past the log end");
    assert!(log.flush_target().is_none());
    let checkpoint: Checkpoint =
        serde_json::from_slice(&std::fs::read(dir.path().join("checkpoint")).unwrap()).unwrap();
    // Checkpointed when the recovery point entered segment 4 (at 6), not again within it.
    assert_eq!(checkpoint.recovery_point, 6);
}

#[test]
fn flush_interval_zero_syncs_on_roll() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        flush: FlushPolicy::Interval { interval_ms: 0 },
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    for _ in 0..3 {
        log.append_as_leader(&batch_with(1, 1500, NOW), 0, NOW)
            .unwrap();
    }
    assert_eq!(log.segment_count(), 2);
    assert_eq!(log.flushed_offset(), 2);
}

#[test]
fn high_watermark_moves_forward_only_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&simple_batch(5, 1), 0, NOW).unwrap();
    log.set_high_watermark(3).unwrap();
    assert_eq!(log.high_watermark(), 3);
    log.set_high_watermark(2).unwrap();
    assert_eq!(log.high_watermark(), 3, "a lower HW changes nothing");
    // Beyond the log end: refused with its own error, not clamped.
    let refused = log.set_high_watermark(100).unwrap_err();
    assert!(
        matches!(
            refused,
            StorageError::HighWatermarkBeyondLogEnd {
                high_watermark: 100,
                log_end_offset: 5,
                ..
            }
        ),
        "{refused}"
    );
    assert!(refused.is_invariant_violation());
    assert_eq!(log.high_watermark(), 3);
    log.set_high_watermark(5).unwrap();
    assert_eq!(log.high_watermark(), 5);
    assert_eq!(log.last_stable_offset(), 5);
    log.close().unwrap();
    let log = open(dir.path(), &config);
    assert_eq!(log.high_watermark(), 5);
}

// ---- recovery ----

#[test]
fn clean_reopen_trusts_indexes_and_finds_everything() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (mut log, _) = log_with_sized_batches(dir.path(), &config, 50);
    let before = read_all(&log);
    let indexes: Vec<_> = log
        .segments
        .values()
        .map(|s| {
            (
                s.offset_index_entries().to_vec(),
                s.time_index_entries().to_vec(),
            )
        })
        .collect();
    let (max_timestamp, max_offset) = {
        let active = log.segments.values().next_back().unwrap();
        (active.max_timestamp(), active.offset_of_max_timestamp())
    };
    let leo = log.log_end_offset();
    log.set_high_watermark(leo).unwrap();
    log.close().unwrap();
    assert!(dir.path().join("clean_shutdown").exists());
    let (log, report) = open_report(dir.path(), &config);
    assert!(
        !dir.path().join("clean_shutdown").exists(),
        "marker removed on open"
    );
    assert!(report.clean_shutdown);
    assert_eq!(
        (
            report.segments_scanned,
            report.indexes_rebuilt,
            report.bytes_truncated
        ),
        (0, 0, 0)
    );
    assert_eq!(log.log_end_offset(), leo);
    let mut reopened: Vec<_> = log
        .segments
        .values()
        .map(|s| {
            (
                s.offset_index_entries().to_vec(),
                s.time_index_entries().to_vec(),
            )
        })
        .collect();
    // close() sealed the active segment's time index with its max timestamp.
    let active = log.segments.values().next_back().unwrap();
    let sealed = reopened.last_mut().unwrap().1.pop().unwrap();
    assert_eq!(
        (
            sealed.timestamp,
            active.base_offset() + i64::from(sealed.relative_offset)
        ),
        (max_timestamp, max_offset)
    );
    assert_eq!(reopened, indexes);
    assert_eq!(read_all(&log), before);
}

#[test]
fn recovered_indexes_equal_the_ones_built_by_appending() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 50);
    let offset_indexes: Vec<_> = log
        .segments
        .values()
        .map(|s| s.offset_index_entries().to_vec())
        .collect();
    assert!(offset_indexes.iter().any(|i| !i.is_empty()));
    drop(log);
    std::fs::remove_file(dir.path().join("checkpoint")).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.segments_scanned, log.segment_count());
    let rebuilt: Vec<_> = log
        .segments
        .values()
        .map(|s| s.offset_index_entries().to_vec())
        .collect();
    assert_eq!(rebuilt, offset_indexes);
}

#[test]
fn unclean_reopen_cuts_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, batches) = log_with_sized_batches(dir.path(), &config, 5);
    let leo = log.log_end_offset();
    drop(log);
    let path = dir.path().join("00000000000000000000.log");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, &batches[0][..40]).unwrap();
    drop(file);
    let (mut log, report) = open_report(dir.path(), &config);
    assert_eq!(report.bytes_truncated, 40);
    assert_eq!(report.truncated_at_offset, Some(leo));
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(read_all(&log).len(), 5);
    log.append_as_leader(&simple_batch(1, 1), 0, NOW).unwrap();
    assert_eq!(read_all(&log).len(), 6);
}

#[test]
fn damaged_index_on_clean_open_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 30);
    let before = read_all(&log);
    log.close().unwrap();
    let index = dir.path().join("00000000000000000000.index");
    let mut bytes = std::fs::read(&index).unwrap();
    assert!(bytes.len() >= 16);
    bytes[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
    std::fs::write(&index, bytes).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.indexes_rebuilt, 1);
    assert_eq!(read_all(&log), before);
}

#[test]
fn clean_marker_with_torn_tail_still_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 3);
    let leo = log.log_end_offset();
    log.close().unwrap();
    let path = dir.path().join("00000000000000000000.log");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, &[2u8; 100]).unwrap();
    drop(file);
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.indexes_rebuilt, 1);
    assert_eq!(report.bytes_truncated, 100);
    assert_eq!(log.log_end_offset(), leo);
}

#[test]
fn gap_between_segments_drops_what_follows() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 150);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 4);
    log.close().unwrap();
    // Lose the second segment entirely.
    std::fs::remove_file(dir.path().join(format!("{:020}.log", bases[1]))).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(log.segment_count(), 1);
    assert_eq!(log.log_end_offset(), bases[1]);
    assert_eq!(report.segments_deleted, bases.len() - 2);
    assert_eq!(report.truncated_at_offset, Some(bases[1]));
    assert!(
        !dir.path().join(format!("{:020}.index", bases[1])).exists(),
        "orphan index deleted"
    );
}

#[test]
fn snapshots_beyond_the_recovered_end_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    idempotent_history(&mut log);
    let bases = log.segment_base_offsets();
    drop(log);
    // Lose the last two segments, as if never written back before a crash.
    for base in &bases[bases.len() - 2..] {
        std::fs::remove_file(dir.path().join(format!("{base:020}.log"))).unwrap();
    }
    let (log, report) = open_report(dir.path(), &config);
    let leo = log.log_end_offset();
    assert_eq!(leo, bases[bases.len() - 2]);
    assert!(producer_state::list_snapshots(dir.path())
        .unwrap()
        .iter()
        .all(|&s| s <= leo));
    // Nothing was flushed: every segment was validated, and the replay that
    // rebuilds their transaction indexes starts at the log start.
    assert_eq!(report.snapshot_offset, None);
    assert_eq!(report.transaction_indexes_rebuilt, log.segment_count());
    // State reflects only what survived: the last surviving batch of producer 2 is a duplicate.
    let last = log.producer_state().get(2).unwrap();
    assert!(last.last_offset < leo);
}

// ---- truncation and followers ----

#[test]
fn truncate_to_removes_the_containing_batch_and_rebuilds_state() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    idempotent_history(&mut log);
    let leo = log.log_end_offset();
    log.set_high_watermark(leo).unwrap();
    let bases = log.segment_base_offsets();
    // Offset 43 is inside a batch of producer 2 (offsets 42..44, sequences 21..23).
    let target = 43;
    log.truncate_to(target, NOW).unwrap();
    assert_eq!(log.log_end_offset(), 42);
    assert_eq!(log.high_watermark(), 42);
    assert!(log.flushed_offset() <= 42);
    assert!(log.segment_count() < bases.len());
    assert_eq!(read_all(&log).len(), 14);
    let p2 = log.producer_state().get(2).unwrap();
    assert_eq!(p2.last_sequence, 20);
    // The truncated batch can be appended again, at the same offset.
    let again = log
        .append_as_leader(&idempotent_batch(2, 0, 21, 3, NOW), 0, NOW)
        .unwrap();
    assert_eq!((again.base_offset, again.duplicate), (42, false));
    drop(log);
    let log = open(dir.path(), &config);
    assert_eq!(log.log_end_offset(), 45);
    assert_eq!(read_all(&log).len(), 15);
}

#[test]
fn generation_survives_reopen_changes_when_the_end_is_cut_and_gates_a_restored_hw() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    idempotent_history(&mut log);
    let first = log.generation();
    let leo = log.log_end_offset();
    log.set_high_watermark(10).unwrap();
    // An unclean reopen (no close): the HW of the log's own checkpoint,
    // written at open, and the same generation.
    drop(log);
    let mut log = open(dir.path(), &config);
    assert_eq!(log.generation(), first);
    assert_eq!(log.high_watermark(), 0);
    // A line recorded under another generation says nothing.
    assert!(!log
        .restore_high_watermark(first.wrapping_add(1), 20)
        .unwrap());
    assert_eq!(log.high_watermark(), 0);
    // Under this one it is a lower bound: taken when higher, capped at the log end.
    assert!(log.restore_high_watermark(first, 20).unwrap());
    assert_eq!(log.high_watermark(), 20);
    assert!(!log.restore_high_watermark(first, 15).unwrap());
    assert_eq!(log.high_watermark(), 20);
    assert!(log.restore_high_watermark(first, leo + 100).unwrap());
    assert_eq!(log.high_watermark(), leo);

    // Cutting the end draws a new generation, durably before returning.
    log.truncate_to(30, NOW).unwrap();
    let after_truncation = log.generation();
    assert_ne!(after_truncation, first);
    drop(log);
    let mut log = open(dir.path(), &config);
    assert_eq!(log.generation(), after_truncation);
    assert!(!log.restore_high_watermark(first, 30).unwrap());
    log.truncate_fully_and_start_at(100, NOW).unwrap();
    assert_ne!(log.generation(), after_truncation);

    // A checkpoint from before generations existed opens with a new one.
    log.close().unwrap();
    let path = dir.path().join(CHECKPOINT_FILE);
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("generation");
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let log = open(dir.path(), &config);
    let drawn = log.generation();
    drop(log);
    assert_eq!(open(dir.path(), &config).generation(), drawn);
}

#[test]
fn follower_appends_may_skip_offsets_but_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let mut leader = open(&dir.path().join("leader"), &small_config());
    // Only a compacted leader's log has gaps.
    let config = LogConfig {
        cleanup_policy: crate::config::CleanupPolicy::Compact,
        ..small_config()
    };
    idempotent_history(&mut leader);
    let data = leader.read(0, usize::MAX, i64::MAX).unwrap().records;
    let batches: Vec<Vec<u8>> = batch::batches(&data)
        .map(|b| b.unwrap().1.to_vec())
        .collect();
    let base_of = |b: &[u8]| BatchHeader::parse(b).unwrap().base_offset;

    let mut follower = open(&dir.path().join("follower"), &config);
    follower.append_as_follower(&batches[0], NOW).unwrap();
    // A compacted leader's log has gaps: batch 1 was cleaned away.
    let mut rest = Vec::new();
    for b in &batches[2..] {
        rest.extend_from_slice(b);
    }
    let info = follower.append_as_follower(&rest, NOW).unwrap();
    assert_eq!(info.base_offset, base_of(&batches[2]));
    assert_eq!(info.last_offset + 1, leader.log_end_offset());
    let mut expected = batches.clone();
    expected.remove(1);
    assert_eq!(read_all(&follower), expected);
    // A read at an offset inside the gap returns the batch after it.
    let in_gap = follower.read(base_of(&batches[1]), 1, i64::MAX).unwrap();
    assert_eq!(in_gap.first_batch_offset, Some(base_of(&batches[2])));
    assert_eq!(
        follower.producer_state().get(1).unwrap().last_sequence,
        leader.producer_state().get(1).unwrap().last_sequence
    );
    // Overlapping is refused, before and at the log end.
    for overlapping in [&batches[1], &batches[3]] {
        assert!(matches!(
            follower.append_as_follower(overlapping, NOW),
            Err(StorageError::InvalidRecord(_))
        ));
    }
    // Gaps survive an unclean restart, which validates every segment.
    let segments = follower.segment_count();
    drop(follower);
    let (follower, report) = open_report(&dir.path().join("follower"), &config);
    assert_eq!(report.bytes_truncated, 0);
    assert_eq!(report.segments_scanned, segments);
    assert_eq!(read_all(&follower), expected);
}

#[test]
fn empty_follower_restarts_at_the_leaders_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut follower = open(dir.path(), &config);
    let mut b = simple_batch(2, 5);
    set_base_offset(&mut b, 1000);
    follower.append_as_follower(&b, NOW).unwrap();
    assert_eq!(follower.log_start_offset(), 1000);
    assert_eq!(follower.log_end_offset(), 1002);
    assert_eq!(follower.segment_base_offsets(), vec![1000]);
    assert!(matches!(
        follower.read(0, 10, i64::MAX),
        Err(StorageError::OffsetOutOfRange { .. })
    ));
    follower.close().unwrap();
    let follower = open(dir.path(), &config);
    assert_eq!(
        (follower.log_start_offset(), follower.log_end_offset()),
        (1000, 1002)
    );
    assert_eq!(read_all(&follower).len(), 1);
}

#[test]
fn unclean_reopen_drops_a_batch_whose_crc_fails_and_everything_after() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, batches) = log_with_sized_batches(dir.path(), &config, 6);
    assert_eq!(log.segment_count(), 1);
    let stored = read_all(&log);
    drop(log);
    let path = dir.path().join("00000000000000000000.log");
    let mut bytes = std::fs::read(&path).unwrap();
    // A payload byte of the fourth batch: framing and offsets stay valid.
    let fourth: usize = batches[..3].iter().map(Vec::len).sum();
    bytes[fourth + 80] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.bytes_truncated, (bytes.len() - fourth) as u64);
    assert_eq!(read_all(&log), stored[..3].to_vec());
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        fourth as u64,
        "file cut"
    );
}

#[test]
fn a_crash_after_a_clean_open_is_recovered_as_unclean() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, batches) = log_with_sized_batches(dir.path(), &config, 4);
    log.close().unwrap();
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&batches[0], 0, NOW).unwrap();
    drop(log);
    let path = dir.path().join("00000000000000000000.log");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(&mut file, &[0u8; 30]).unwrap();
    drop(file);
    let (log, report) = open_report(dir.path(), &config);
    assert!(!report.clean_shutdown);
    assert_eq!(report.segments_scanned, 1);
    assert_eq!(report.bytes_truncated, 30);
    assert_eq!(read_all(&log).len(), 5);
}

#[test]
fn directory_fsync_is_requested_only_for_new_segment_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&simple_batch(1, 1), 0, NOW).unwrap();
    let target = log.flush_target().unwrap();
    assert!(
        target.dir.is_none(),
        "segment existed at open, and open fsyncs the directory"
    );
    log.flush().unwrap();
    for _ in 0..4 {
        log.append_as_leader(&batch_with(1, 1500, NOW), 0, NOW)
            .unwrap();
    }
    assert!(log.flush_target().unwrap().dir.is_some());
    log.flush().unwrap();
    log.append_as_leader(&simple_batch(1, 1), 0, NOW).unwrap();
    assert!(log.flush_target().unwrap().dir.is_none());
}

#[test]
fn truncate_fully_restarts_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    idempotent_history(&mut log);
    log.truncate_fully_and_start_at(500, NOW).unwrap();
    assert_eq!(
        (
            log.log_start_offset(),
            log.log_end_offset(),
            log.high_watermark(),
            log.segment_count()
        ),
        (500, 500, 500, 1)
    );
    assert!(log.producer_state().is_empty());
    assert!(producer_state::list_snapshots(dir.path())
        .unwrap()
        .is_empty());
    let info = log.append_as_leader(&simple_batch(2, 1), 0, NOW).unwrap();
    assert_eq!(info.base_offset, 500);
    drop(log);
    let log = open(dir.path(), &config);
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (500, 502));
    assert_eq!(log.segment_base_offsets(), vec![500]);
}

#[test]
fn leftover_temporary_files_are_removed_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 2);
    log.close().unwrap();
    std::fs::write(dir.path().join("checkpoint.tmp"), b"{half").unwrap();
    std::fs::write(dir.path().join("00000000000000000099.snapshot.tmp"), b"x").unwrap();
    let log = open(dir.path(), &config);
    assert!(!dir.path().join("checkpoint.tmp").exists());
    assert!(!dir
        .path()
        .join("00000000000000000099.snapshot.tmp")
        .exists());
    assert_eq!(read_all(&log).len(), 2);
}

#[test]
fn missing_time_index_on_clean_open_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let (log, _) = log_with_sized_batches(dir.path(), &config, 20);
    let max = log.max_timestamp_and_offset();
    assert!(max.is_some());
    log.close().unwrap();
    std::fs::remove_file(dir.path().join("00000000000000000000.timeindex")).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.indexes_rebuilt, 1);
    assert_eq!(log.max_timestamp_and_offset(), max);
}

// ---- transactions ----

/// What the transactional part of a log must hold: the ongoing transaction of
/// each producer (first offset), and every aborted one (producer, first
/// offset, marker offset). Drives producers 1..=9 at epoch 0 with coordinator
/// epoch 0.
#[derive(Debug, Clone, Default)]
struct TxnModel {
    open: BTreeMap<i64, i64>,
    aborted: Vec<(i64, i64, i64)>,
    next_sequence: BTreeMap<i64, i32>,
}

impl TxnModel {
    /// A transactional batch of three 100-byte records from `pid`.
    fn data(&mut self, log: &mut PartitionLog, pid: i64) -> AppendInfo {
        let sequence = self.next_sequence.entry(pid).or_insert(0);
        let batch = build_batch(&BatchSpec {
            value_len: 100,
            base_timestamp: NOW,
            ..BatchSpec::transactional(pid, 0, *sequence, 3)
        });
        let info = log.append_as_leader(&batch, 0, NOW).unwrap();
        *sequence += 3;
        self.open.entry(pid).or_insert(info.base_offset);
        info
    }

    fn end(&mut self, log: &mut PartitionLog, pid: i64, commit: bool) -> AppendInfo {
        let info = log
            .append_txn_marker(&marker(pid, 0, 0, commit), 0, NOW)
            .unwrap();
        if let Some(first) = self.open.remove(&pid) {
            if !commit {
                self.aborted.push((pid, first, info.base_offset));
            }
        }
        info
    }

    fn expected(&self, fetch: i64, upper: i64) -> Vec<AbortedTxn> {
        self.aborted
            .iter()
            .filter(|(_, first, last)| *last >= fetch && *first < upper && fetch < upper)
            .map(|&(producer_id, first_offset, _)| AbortedTxn {
                producer_id,
                first_offset,
            })
            .collect()
    }

    /// Every query over the log's offsets, the first unstable offset and the
    /// producers' transactions agree with the model.
    fn check(&self, log: &PartitionLog) {
        let leo = log.log_end_offset();
        for fetch in log.log_start_offset()..=leo {
            for upper in fetch..=leo + 1 {
                assert_eq!(
                    log.aborted_transactions(fetch, upper),
                    self.expected(fetch, upper),
                    "aborted_transactions({fetch}, {upper})"
                );
            }
        }
        assert_eq!(
            log.first_unstable_offset(),
            self.open.values().min().copied()
        );
        for (pid, first) in &self.open {
            let entry = log.producer_state().get(*pid).unwrap();
            assert_eq!(entry.current_txn_first_offset, Some(*first));
        }
        for d in log.describe_producers() {
            if !self.open.contains_key(&d.producer_id) {
                assert_eq!(d.current_txn_start_offset, -1, "{d:?}");
            }
        }
    }
}

fn marker(pid: i64, epoch: i16, coordinator_epoch: i32, commit: bool) -> EndTxnMarker {
    EndTxnMarker {
        producer_id: pid,
        producer_epoch: epoch,
        coordinator_epoch,
        commit,
    }
}

/// Transactions of producers 1 and 2 interleaved with plain batches over
/// several segments: producer 1 alternately commits and aborts every round,
/// producer 2's transactions span three rounds (so segments) and abort, and
/// producer 3's last transaction stays open.
fn transactional_history(log: &mut PartitionLog) -> TxnModel {
    let mut model = TxnModel::default();
    for round in 0..12 {
        model.data(log, 1);
        model.data(log, 2);
        log.append_as_leader(&batch_with(2, 100, NOW), 0, NOW)
            .unwrap();
        model.end(log, 1, round % 2 == 0);
        if round % 3 == 2 {
            model.end(log, 2, false);
        }
    }
    model.data(log, 3);
    model.data(log, 1);
    model
}

fn txn_index_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.txnindex"))
}

#[test]
fn last_stable_offset_follows_transactions_and_the_high_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let mut model = TxnModel::default();
    log.append_as_leader(&simple_batch(2, NOW), 0, NOW).unwrap();
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert_eq!(
        (log.first_unstable_offset(), log.last_stable_offset()),
        (None, 2)
    );

    assert_eq!(model.data(&mut log, 1).base_offset, 2);
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert_eq!(log.first_unstable_offset(), Some(2));
    assert_eq!(log.last_stable_offset(), 2);
    // Another producer's plain records after it stay unstable too.
    log.append_as_leader(&simple_batch(1, NOW), 0, NOW).unwrap();
    assert_eq!(model.data(&mut log, 2).base_offset, 6);
    model.data(&mut log, 1);
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert_eq!(log.last_stable_offset(), 2);

    let commit = model.end(&mut log, 1, true);
    assert_eq!(commit.base_offset, 12);
    assert_eq!((commit.last_offset, commit.record_count), (12, 1));
    assert_eq!(log.log_end_offset(), 13);
    // The HW has not covered the marker yet; the LSO is bounded by both.
    assert_eq!(log.last_stable_offset(), 6);
    log.set_high_watermark(13).unwrap();
    assert_eq!(log.last_stable_offset(), 6);
    model.end(&mut log, 2, false);
    assert_eq!(log.first_unstable_offset(), None);
    assert_eq!(
        log.last_stable_offset(),
        13,
        "the HW, until it covers the marker"
    );
    log.set_high_watermark(14).unwrap();
    assert_eq!(log.last_stable_offset(), 14);
    model.check(&log);

    // The marker is a valid control batch carrying the partition leader epoch.
    let read = log.read(12, 1000, i64::MAX).unwrap();
    let (header, bytes) = batch::batches(&read.records).next().unwrap().unwrap();
    verify_crc(bytes).unwrap();
    assert!(header.is_control() && header.is_transactional());
    assert_eq!((header.base_offset, header.partition_leader_epoch), (12, 0));
    assert_eq!(header.max_timestamp, NOW);
    assert_eq!(
        EndTxnMarker::parse(bytes).unwrap(),
        Some(marker(1, 0, 0, true))
    );
    // A HW below the first unstable offset is the LSO.
    let dir2 = tempfile::tempdir().unwrap();
    let mut lagging = open(dir2.path(), &small_config());
    lagging
        .append_as_leader(&simple_batch(3, NOW), 0, NOW)
        .unwrap();
    TxnModel::default().data(&mut lagging, 1);
    lagging.set_high_watermark(1).unwrap();
    assert_eq!(lagging.last_stable_offset(), 1);
}

#[test]
fn aborted_transactions_are_indexed_in_the_segment_of_their_marker() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let model = transactional_history(&mut log);
    assert!(log.segment_count() >= 4);
    assert_eq!(model.aborted.len(), 10);
    model.check(&log);
    for segment in log.segments.values() {
        for e in segment.aborted_txns() {
            assert!(
                e.last_offset >= segment.base_offset() && e.last_offset < segment.next_offset()
            );
            assert!(model
                .aborted
                .contains(&(e.producer_id, e.first_offset, e.last_offset)));
        }
    }
    // Some of producer 2's transactions start in an earlier segment than
    // their marker; a fetch starting in the marker's segment still reports it.
    let &(_, first, last) = model
        .aborted
        .iter()
        .find(|(pid, first, last)| {
            *pid == 2 && log.segment_base_for(*first) != log.segment_base_for(*last)
        })
        .unwrap();
    let base = log.segment_base_for(last).unwrap();
    assert!(first < base);
    assert!(log
        .aborted_transactions(base, last + 1)
        .contains(&AbortedTxn {
            producer_id: 2,
            first_offset: first
        }));
}

#[test]
fn markers_without_a_transaction_are_written_but_not_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    let info = log
        .append_txn_marker(&marker(5, 2, 1, false), 0, NOW)
        .unwrap();
    assert_eq!(info.base_offset, 0);
    // Retried, and a newer epoch: appended too.
    log.append_txn_marker(&marker(5, 2, 1, false), 0, NOW)
        .unwrap();
    log.append_txn_marker(&marker(5, 3, 1, true), 0, NOW)
        .unwrap();
    assert_eq!(log.log_end_offset(), 3);
    assert!(log.aborted_transactions(0, 3).is_empty());
    assert_eq!(log.first_unstable_offset(), None);
    let d = log.describe_producers();
    assert_eq!(
        d,
        vec![ProducerDescription {
            producer_id: 5,
            producer_epoch: 3,
            last_sequence: -1,
            last_timestamp: NOW,
            coordinator_epoch: 1,
            current_txn_start_offset: -1,
        }]
    );
    assert!(matches!(
        log.append_txn_marker(&marker(-1, 0, 0, true), 0, NOW),
        Err(StorageError::InvalidRecord(_))
    ));
}

#[test]
fn markers_from_old_producer_or_coordinator_epochs_are_fenced_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&transactional_batch(1, 3, 0, 2, NOW), 0, NOW)
        .unwrap();
    log.append_txn_marker(&marker(1, 3, 5, true), 0, NOW)
        .unwrap();
    log.append_as_leader(&transactional_batch(1, 3, 2, 1, NOW), 0, NOW)
        .unwrap();
    let (leo, size) = (log.log_end_offset(), log.size_bytes());
    assert!(matches!(
        log.append_txn_marker(&marker(1, 2, 5, false), 0, NOW),
        Err(StorageError::InvalidProducerEpoch {
            producer_id: 1,
            current: 3,
            found: 2
        })
    ));
    assert!(matches!(
        log.append_txn_marker(&marker(1, 3, 4, false), 0, NOW),
        Err(StorageError::TransactionCoordinatorFenced {
            producer_id: 1,
            current: 5,
            found: 4
        })
    ));
    assert_eq!((log.log_end_offset(), log.size_bytes()), (leo, size));
    assert_eq!(log.first_unstable_offset(), Some(3));
    // The coordinator fences the producer: a newer epoch aborts its transaction.
    log.append_txn_marker(&marker(1, 4, 6, false), 0, NOW)
        .unwrap();
    assert_eq!(
        log.aborted_transactions(0, 10),
        vec![AbortedTxn {
            producer_id: 1,
            first_offset: 3
        }]
    );
    // The zombie's writes are refused.
    assert!(matches!(
        log.append_as_leader(&transactional_batch(1, 3, 3, 1, NOW), 0, NOW),
        Err(StorageError::InvalidProducerEpoch { .. })
    ));
    let d = log.describe_producers();
    assert_eq!(
        (
            d[0].producer_epoch,
            d[0].coordinator_epoch,
            d[0].current_txn_start_offset
        ),
        (4, 6, -1)
    );
}

#[test]
fn describe_producers_reports_sequences_and_open_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&idempotent_batch(9, 1, 0, 4, NOW + 5), 0, NOW)
        .unwrap();
    log.append_as_leader(&transactional_batch(4, 0, 0, 2, NOW + 7), 0, NOW)
        .unwrap();
    let d = log.describe_producers();
    assert_eq!(
        d,
        vec![
            ProducerDescription {
                producer_id: 4,
                producer_epoch: 0,
                last_sequence: 1,
                last_timestamp: NOW + 7,
                coordinator_epoch: -1,
                current_txn_start_offset: 4,
            },
            ProducerDescription {
                producer_id: 9,
                producer_epoch: 1,
                last_sequence: 3,
                last_timestamp: NOW + 5,
                coordinator_epoch: -1,
                current_txn_start_offset: -1,
            },
        ]
    );
}

#[test]
fn transactions_survive_a_clean_reopen_without_rebuilding() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let model = transactional_history(&mut log);
    let described = log.describe_producers();
    let bases = log.segment_base_offsets();
    log.close().unwrap();
    for base in &bases {
        assert!(txn_index_path(dir.path(), *base).exists());
    }
    let (log, report) = open_report(dir.path(), &config);
    assert!(report.clean_shutdown);
    assert_eq!(report.transaction_indexes_rebuilt, 0);
    assert_eq!(
        report.batches_replayed, 0,
        "the snapshot holds the open transactions"
    );
    model.check(&log);
    assert_eq!(log.describe_producers(), described);
}

#[test]
fn missing_or_damaged_transaction_indexes_are_rebuilt_on_a_clean_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let model = transactional_history(&mut log);
    let with_entries: Vec<i64> = log
        .segments
        .values()
        .filter(|s| !s.aborted_txns().is_empty())
        .map(Segment::base_offset)
        .collect();
    assert!(with_entries.len() >= 3);
    log.close().unwrap();
    let [missing, damaged, foreign] =
        [0, 1, 2].map(|i| txn_index_path(dir.path(), with_entries[i]));
    // Entries that pass their CRC but belong to another segment.
    std::fs::copy(&damaged, &foreign).unwrap();
    std::fs::remove_file(missing).unwrap();
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[12] ^= 0x20;
    std::fs::write(&damaged, bytes).unwrap();

    let (log, report) = open_report(dir.path(), &config);
    assert!(report.clean_shutdown);
    assert_eq!(
        report.segments_scanned, 0,
        "only the transaction indexes were untrusted"
    );
    assert_eq!(report.transaction_indexes_rebuilt, 3);
    model.check(&log);
    drop(log);
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(
        report.transaction_indexes_rebuilt, 1,
        "only the active segment after a crash"
    );
    model.check(&log);
}

#[test]
fn unclean_reopen_rebuilds_transactions_from_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let mut model = transactional_history(&mut log);
    // Producer 2 opens a transaction now; the recovery point moves past it and
    // into a later segment; its ABORT marker comes after.
    let first = model.data(&mut log, 2).base_offset;
    for _ in 0..12 {
        log.append_as_leader(&batch_with(2, 100, NOW), 0, NOW)
            .unwrap();
    }
    log.flush().unwrap();
    let recovery_base = log.segment_base_for(log.flushed_offset()).unwrap();
    assert!(log.segment_base_for(first).unwrap() < recovery_base);
    model.end(&mut log, 2, false);
    model.data(&mut log, 4);
    model.end(&mut log, 4, false);
    drop(log);

    let (log, report) = open_report(dir.path(), &config);
    assert!(!report.clean_shutdown);
    assert_eq!(report.transaction_indexes_rebuilt, 1);
    assert!(report.snapshot_offset.unwrap() <= recovery_base);
    model.check(&log);
    assert!(log
        .aborted_transactions(recovery_base, log.log_end_offset())
        .contains(&AbortedTxn {
            producer_id: 2,
            first_offset: first
        }));
}

#[test]
fn a_torn_abort_marker_reopens_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let mut model = transactional_history(&mut log);
    model.data(&mut log, 5);
    let before_abort = model.clone();
    let abort = model.end(&mut log, 5, false);
    model.check(&log);
    let active = log.segment_base_for(abort.base_offset).unwrap();
    drop(log);
    // Cut the marker in the middle, as a crash during its write could.
    let path = dir.path().join(format!("{active:020}.log"));
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 30)
        .unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert_eq!(report.truncated_at_offset, Some(abort.base_offset));
    assert_eq!(log.log_end_offset(), abort.base_offset);
    before_abort.check(&log);
    assert_eq!(
        log.producer_state()
            .get(5)
            .unwrap()
            .current_txn_first_offset,
        before_abort.open.get(&5).copied()
    );
}

#[test]
fn a_missing_clean_shutdown_marker_rebuilds_the_active_segment_alike() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let model = transactional_history(&mut log);
    log.close().unwrap();
    std::fs::remove_file(dir.path().join(CLEAN_SHUTDOWN_FILE)).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert!(!report.clean_shutdown);
    assert_eq!(report.transaction_indexes_rebuilt, 1);
    model.check(&log);
}

#[test]
fn truncation_drops_aborted_entries_and_reopens_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    let mut model = transactional_history(&mut log);
    model.data(&mut log, 6);
    let expected = model.clone();
    let abort = model.end(&mut log, 6, false);
    model.data(&mut log, 7);
    model.end(&mut log, 7, false);
    model.check(&log);
    log.set_high_watermark(log.log_end_offset()).unwrap();

    log.truncate_to(abort.base_offset, NOW).unwrap();
    assert_eq!(log.log_end_offset(), abort.base_offset);
    expected.check(&log);
    assert_eq!(
        log.last_stable_offset(),
        expected.open.values().min().copied().unwrap()
    );
    // Further back: cut inside producer 2's transaction that spans segments.
    let &(_, first, last) = expected
        .aborted
        .iter()
        .rev()
        .find(|(pid, _, _)| *pid == 2)
        .unwrap();
    log.truncate_to(last, NOW).unwrap();
    assert!(log
        .aborted_transactions(0, log.log_end_offset() + 1)
        .iter()
        .all(|a| !(a.producer_id == 2 && a.first_offset == first)));
    assert_eq!(
        log.producer_state()
            .get(2)
            .unwrap()
            .current_txn_first_offset,
        Some(first),
        "open again"
    );
    let reopened_state: Vec<_> = log.describe_producers();
    let aborted = log.aborted_transactions(0, log.log_end_offset() + 1);
    drop(log);
    let log = open(dir.path(), &config);
    assert_eq!(log.describe_producers(), reopened_state);
    assert_eq!(
        log.aborted_transactions(0, log.log_end_offset() + 1),
        aborted
    );

    let mut log = log;
    log.truncate_fully_and_start_at(1000, NOW).unwrap();
    assert_eq!(log.first_unstable_offset(), None);
    assert!(log.aborted_transactions(0, 2000).is_empty());
}

#[test]
fn follower_tracks_transactions_and_aborts_like_its_leader() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut leader = open(&dir.path().join("leader"), &config);
    let model = transactional_history(&mut leader);
    let data = leader.read(0, usize::MAX, i64::MAX).unwrap().records;
    let batches: Vec<Vec<u8>> = batch::batches(&data)
        .map(|b| b.unwrap().1.to_vec())
        .collect();
    let mut follower = open(&dir.path().join("follower"), &config);
    for chunk in batches.chunks(3) {
        follower.append_as_follower(&chunk.concat(), NOW).unwrap();
    }
    assert_eq!(read_all(&follower), read_all(&leader));
    model.check(&follower);
    assert_eq!(follower.describe_producers(), leader.describe_producers());
    follower.close().unwrap();
    let follower = open(&dir.path().join("follower"), &config);
    model.check(&follower);
}

#[test]
fn retention_deletes_transaction_indexes_and_bounds_the_first_unstable_offset() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: 5000,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let mut model = TxnModel::default();
    model.data(&mut log, 1);
    model.data(&mut log, 2);
    model.end(&mut log, 2, false);
    let first_base = log.segment_base_offsets()[0];
    for _ in 0..40 {
        log.append_as_leader(&batch_with(2, 100, NOW), 0, NOW)
            .unwrap();
    }
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert!(log.enforce_retention(NOW).unwrap() > 0);
    assert!(!txn_index_path(dir.path(), first_base).exists());
    assert!(log.log_start_offset() > 0);
    assert_eq!(log.first_unstable_offset(), Some(log.log_start_offset()));
    assert_eq!(log.last_stable_offset(), log.log_start_offset());
    assert!(log
        .aborted_transactions(log.log_start_offset(), log.log_end_offset())
        .is_empty());
}

#[test]
fn markers_follow_the_log_append_time_setting() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        message_timestamp_type_log_append: true,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let info = log
        .append_txn_marker(&marker(1, 0, 0, true), 3, NOW + 9)
        .unwrap();
    assert_eq!(info.log_append_time_ms, NOW + 9);
    let read = log.read(0, 1000, i64::MAX).unwrap();
    let h = headers(&read.records)[0];
    assert!(h.timestamp_type_is_log_append() && h.is_control());
    assert_eq!(h.max_timestamp, NOW + 9);
    verify_crc(&read.records).unwrap();
}

// ---- compression.type ----

fn with_codec(batch: &[u8], codec: CompressionType) -> Vec<u8> {
    compression::to_topic_codec(batch, codec, u32::MAX)
        .unwrap()
        .into_owned()
}

/// Header fields that recompression keeps (everything but length, codec bits and CRC).
fn kept(h: &BatchHeader) -> (i32, i16, i32, i64, i64, i64, i16, i32, i32) {
    (
        h.partition_leader_epoch,
        h.attributes & !0x07,
        h.last_offset_delta,
        h.base_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        h.records_count,
    )
}

#[test]
fn leader_stores_the_topic_codec_and_idempotence_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        compression_type: CompressionType::Zstd,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let sent = build_batch(&BatchSpec {
        timestamp_step: 3,
        ..BatchSpec::idempotent(77, 2, 0, 5).with_timestamp(NOW)
    });
    let info = log.append_as_leader(&sent, 4, NOW).unwrap();
    assert_eq!((info.base_offset, info.last_offset), (0, 4));
    assert_eq!(
        (info.max_timestamp, info.offset_of_max_timestamp),
        (NOW + 12, 4)
    );

    let stored = read_all(&log);
    assert_eq!(stored.len(), 1);
    let (h, want) = (
        BatchHeader::parse(&stored[0]).unwrap(),
        BatchHeader::parse(&sent).unwrap(),
    );
    assert_eq!(h.compression(), 4);
    assert_eq!(h.base_offset, 0);
    let mut expected = kept(&want);
    expected.0 = 4; // the leader epoch the append stamps
    assert_eq!(kept(&h), expected);
    assert_eq!(
        compression::decompressed_records(&stored[0], usize::MAX).unwrap(),
        &sent[BATCH_HEADER_LEN..]
    );

    // The same batch again: its original offsets, nothing written.
    let (size, leo) = (log.size_bytes(), log.log_end_offset());
    let retry = log.append_as_leader(&sent, 4, NOW).unwrap();
    assert!(retry.duplicate);
    assert_eq!((retry.base_offset, retry.last_offset), (0, 4));
    assert_eq!((log.size_bytes(), log.log_end_offset()), (size, leo));
    // A retry that the client compressed differently is the same batch too.
    let retry = log
        .append_as_leader(&with_codec(&sent, CompressionType::Gzip), 4, NOW)
        .unwrap();
    assert!(retry.duplicate);
    // The next sequence goes on; a gap is still a gap.
    let next = idempotent_batch(77, 2, 5, 2, NOW);
    assert_eq!(log.append_as_leader(&next, 4, NOW).unwrap().base_offset, 5);
    assert!(matches!(
        log.append_as_leader(&idempotent_batch(77, 2, 9, 1, NOW), 4, NOW),
        Err(StorageError::OutOfOrderSequence { .. })
    ));

    // Stored compressed batches survive recovery.
    drop(log);
    let log = open(dir.path(), &config);
    assert_eq!(log.log_end_offset(), 7);
    assert_eq!(
        log.producer_state().get(77).unwrap().last_sequence,
        6,
        "producer state rebuilt from the recompressed batches"
    );
    assert!(read_all(&log)
        .iter()
        .all(|b| BatchHeader::parse(b).unwrap().compression() == 4));
}

#[test]
fn transactions_markers_and_log_append_time_under_a_topic_codec() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        compression_type: CompressionType::Lz4,
        message_timestamp_type_log_append: true,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    let sent = with_codec(&transactional_batch(9, 0, 0, 3, 5), CompressionType::Snappy);
    log.append_as_leader(&sent, 0, NOW).unwrap();
    assert_eq!(log.first_unstable_offset(), Some(0));
    log.append_txn_marker(&marker(9, 0, 1, true), 0, NOW)
        .unwrap();
    assert_eq!(log.first_unstable_offset(), None);
    let stored = read_all(&log);
    let data = BatchHeader::parse(&stored[0]).unwrap();
    assert_eq!(data.compression(), 3);
    assert!(data.is_transactional() && data.timestamp_type_is_log_append());
    assert_eq!(data.max_timestamp, NOW);
    let control = BatchHeader::parse(&stored[1]).unwrap();
    assert!(control.is_control());
    assert_eq!(control.compression(), 0, "markers are never compressed");
}

#[test]
fn a_compressed_batch_that_does_not_decompress_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        compression_type: CompressionType::Uncompressed,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    log.append_as_leader(&simple_batch(1, 5), 0, NOW).unwrap();
    let mut bad = simple_batch(2, 5);
    bad[22] |= 4; // claims zstd; the body is plain records
    batch::recompute_crc(&mut bad).unwrap();
    let good = simple_batch(1, 6);
    let request = [&good[..], &bad[..]].concat();
    assert!(matches!(
        log.append_as_leader(&request, 0, NOW),
        Err(StorageError::CorruptRecord(
            BatchError::Decompression { .. }
        ))
    ));
    assert_eq!(log.log_end_offset(), 1);
    assert_eq!(read_all(&log).len(), 1);
}

#[test]
fn followers_store_the_leaders_bytes_whatever_their_codec() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        compression_type: CompressionType::Zstd,
        ..small_config()
    };
    let mut follower = open(dir.path(), &config);
    let plain = simple_batch(2, 5);
    let lz4 = with_codec(&simple_batch(3, 6), CompressionType::Lz4);
    let mut lz4_at_2 = lz4.clone();
    set_base_offset(&mut lz4_at_2, 2);
    let request = [&plain[..], &lz4_at_2[..]].concat();
    follower.append_as_follower(&request, NOW).unwrap();
    assert_eq!(read_all(&follower), vec![plain, lz4_at_2]);
}

// Assertions at the storage boundary: an impossible value stops the
// operation with its own error instead of being clamped or served.

#[test]
fn an_append_that_does_not_continue_the_segment_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&simple_batch(3, NOW), 0, NOW).unwrap();
    let size = log.size_bytes();
    let mut batch = simple_batch(2, NOW);
    for (base, last) in [(5, 6), (2, 3), (3, 2)] {
        set_base_offset(&mut batch, base);
        let placement = BatchPlacement {
            offset_in_buffer: 0,
            size: batch.len(),
            base_offset: base,
            last_offset: last,
            max_timestamp: NOW,
        };
        let refused = log
            .active_mut()
            .unwrap()
            .append(&batch, &[placement], Offsets::Contiguous, 1, NOW)
            .unwrap_err();
        assert!(
            matches!(
                refused,
                StorageError::OffsetsOutOfOrder {
                    base_offset,
                    last_offset,
                    expected: 3,
                    ..
                } if (base_offset, last_offset) == (base, last)
            ),
            "{base}..={last}: {refused}"
        );
        assert!(refused.is_invariant_violation());
    }
    assert_eq!(log.size_bytes(), size, "nothing written");
    assert_eq!(read_all(&log).len(), 1);
}

#[test]
fn broken_offset_orderings_stop_the_next_operation() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), &small_config());
    log.append_as_leader(&simple_batch(3, NOW), 0, NOW).unwrap();
    log.check_offsets().unwrap();

    // HW beyond the LEO (a bug elsewhere in the log): the next append says so.
    log.high_watermark = 10;
    let refused = log
        .append_as_leader(&simple_batch(1, NOW), 0, NOW)
        .unwrap_err();
    assert!(
        matches!(&refused, StorageError::OffsetsInconsistent { reason, .. } if reason.contains("HW 10")),
        "{refused}"
    );
    assert!(refused.is_invariant_violation());
    log.high_watermark = 3;

    // A recovery point beyond the LEO, and an active segment that does not
    // end at the LEO, are caught the same way.
    let leo = log.log_end_offset();
    log.recovery_point = leo + 1;
    assert!(matches!(
        log.check_offsets(),
        Err(StorageError::OffsetsInconsistent { ref reason, .. }) if reason.contains("recovery point")
    ));
    log.recovery_point = leo;
    log.log_end_offset = leo + 1;
    log.high_watermark = leo;
    assert!(matches!(
        log.check_offsets(),
        Err(StorageError::OffsetsInconsistent { ref reason, .. }) if reason.contains("active segment")
    ));
    log.log_end_offset = leo;
    log.check_offsets().unwrap();
    // LSO <= HW holds by construction; an open transaction below the HW is the LSO.
    TxnModel::default().data(&mut log, 1);
    log.set_high_watermark(log.log_end_offset()).unwrap();
    assert_eq!(log.last_stable_offset(), leo);
    log.check_offsets().unwrap();
}

#[test]
fn an_index_entry_naming_another_batch_is_corruption_not_a_wrong_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        index_interval_bytes: 1,
        ..small_config()
    };
    let mut log = open(dir.path(), &config);
    for _ in 0..5 {
        log.append_as_leader(&simple_batch(2, NOW), 0, NOW).unwrap();
    }
    // Batches at 0, 2, 4, 6, 8; the first is not indexed (nothing before it).
    let entries = log.segments[&0].offset_index_entries().to_vec();
    assert_eq!(
        entries
            .iter()
            .map(|e| e.relative_offset)
            .collect::<Vec<_>>(),
        [2, 4, 6, 8]
    );
    log.close().unwrap();

    // A well-formed index (increasing, inside the file, a correct last
    // entry: it passes the open's sanity check) whose second entry says
    // offset 3 is where the batch of offsets 4..=5 starts. Scanning from
    // there would answer a read of 3 with offsets 4 and 5.
    let index = dir.path().join("00000000000000000000.index");
    let mut bytes = std::fs::read(&index).unwrap();
    bytes[8..12].copy_from_slice(&3u32.to_be_bytes());
    std::fs::write(&index, &bytes).unwrap();
    let (log, report) = open_report(dir.path(), &config);
    assert!(report.clean_shutdown);
    let refused = log.read(3, 1000, i64::MAX).unwrap_err();
    assert!(
        matches!(&refused, StorageError::Corrupt(_, reason) if reason.contains("the offset index puts offset 3 here")),
        "{refused}"
    );
    // Offsets the damaged entry does not cover still read.
    assert_eq!(
        log.read(0, 1000, i64::MAX).unwrap().first_batch_offset,
        Some(0)
    );
}

#[test]
fn only_the_active_segment_holds_its_file_open_through_rolls_truncation_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut log = open(dir.path(), &config);
    for _ in 0..40 {
        log.append_as_leader(&batch_with(5, 200, NOW), 0, NOW)
            .unwrap();
    }
    assert!(log.segment_count() >= 5, "{} segments", log.segment_count());
    let last = *log.segments.keys().last().unwrap();
    assert_eq!(log.held_segment_files(), vec![last]);
    // Every batch reads back through files opened on demand.
    let batches = read_all(&log);
    assert_eq!(batches.len(), 40);

    // Truncation into an earlier segment makes it the active one again.
    let into_second = *log.segments.keys().nth(1).unwrap() + 1;
    log.truncate_to(into_second, NOW).unwrap();
    let active = *log.segments.keys().last().unwrap();
    assert_eq!(log.held_segment_files(), vec![active]);
    log.append_as_leader(&batch_with(5, 200, NOW), 0, NOW)
        .unwrap();

    log.close().unwrap();
    let log = open(dir.path(), &config);
    let last = *log.segments.keys().last().unwrap();
    assert_eq!(log.held_segment_files(), vec![last]);
    assert_eq!(read_all(&log).len() as i64, log.log_end_offset() / 5);
}
