//! A file system that fills up under the log (`fsutil::disk_fault`): every
//! failed write leaves the log as it was, reads go on, appends work again once
//! there is room, and a torn write that could not be cut is cut by recovery.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::fsutil::disk_fault;
use crate::testing::{build_batch, idempotent_batch, simple_batch, BatchSpec};

const NOW: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        retention_ms: -1,
        ..LogConfig::default()
    }
}

fn batch(seed: u8) -> Vec<u8> {
    build_batch(&BatchSpec {
        record_count: 3,
        value_len: 200,
        value_seed: seed,
        base_timestamp: NOW,
        ..BatchSpec::default()
    })
}

/// Every batch from log start to log end, checked for contiguity and CRC.
fn read_all(log: &PartitionLog) -> Vec<(i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 100_000, i64::MAX).unwrap();
        assert!(!r.records.is_empty(), "empty read at {offset}");
        for item in batch::batches(&r.records) {
            let (h, bytes) = item.unwrap();
            verify_crc(bytes).unwrap();
            assert_eq!(h.base_offset, offset, "offsets are contiguous");
            offset = h.last_offset() + 1;
            out.push((h.base_offset, bytes.to_vec()));
        }
    }
    out
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn active_file_len(log: &PartitionLog) -> u64 {
    let active = log.segments.values().next_back().unwrap();
    std::fs::metadata(active.log_path()).unwrap().len()
}

/// Frees the disk when a test ends, whatever happened: the fault is per
/// thread and the test harness reuses threads.
struct Room;
impl Drop for Room {
    fn drop(&mut self) {
        disk_fault::free();
    }
}

fn is_storage_full(e: &StorageError) -> bool {
    matches!(e, StorageError::Io { source, .. } if source.kind() == io::ErrorKind::StorageFull)
}

#[test]
fn an_append_that_fills_the_disk_midway_leaves_the_log_as_before() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    for i in 0..3 {
        log.append_as_leader(&batch(i), 0, NOW).unwrap();
    }
    let before = read_all(&log);
    let leo = log.log_end_offset();
    let len = active_file_len(&log);

    // Room for half of the next batch: a torn write.
    disk_fault::fill_after(batch(9).len() as u64 / 2);
    for attempt in 0..3 {
        let err = log.append_as_leader(&batch(9), 0, NOW).unwrap_err();
        assert!(is_storage_full(&err), "attempt {attempt}: {err}");
    }
    assert_eq!(log.log_end_offset(), leo);
    assert_eq!(active_file_len(&log), len, "the torn bytes are cut");
    assert_eq!(read_all(&log), before, "reads go on");

    disk_fault::free();
    let info = log.append_as_leader(&batch(9), 0, NOW).unwrap();
    assert_eq!(info.base_offset, leo);
    let after = read_all(&log);
    assert_eq!(after.len(), before.len() + 1);
    drop(log);
    let (log, report) = PartitionLog::open(dir.path(), config(), NOW).unwrap();
    assert_eq!(report.bytes_truncated, 0);
    assert_eq!(read_all(&log), after);
}

#[test]
fn a_failed_idempotent_append_can_be_retried_with_the_same_sequence() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    log.append_as_leader(&idempotent_batch(7, 0, 0, 2, NOW), 0, NOW)
        .unwrap();
    let retried = idempotent_batch(7, 0, 2, 2, NOW);
    disk_fault::fill_after(10);
    assert!(is_storage_full(
        &log.append_as_leader(&retried, 0, NOW).unwrap_err()
    ));
    disk_fault::free();
    // Not a duplicate (nothing was stored) and not out of order (the
    // sequence did not move).
    let info = log.append_as_leader(&retried, 0, NOW).unwrap();
    assert!(!info.duplicate);
    assert_eq!(info.base_offset, 2);
    let dup = log.append_as_leader(&retried, 0, NOW).unwrap();
    assert!(dup.duplicate);
    assert_eq!(dup.base_offset, 2);
}

#[test]
fn a_roll_that_fails_adds_no_segment_and_leaves_no_files() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    // Producer state to snapshot at the roll.
    let mut sequence = 0;
    while log.segment_count() == 1 && log.log_end_offset() < 12 {
        log.append_as_leader(&idempotent_batch(7, 0, sequence, 3, NOW), 0, NOW)
            .unwrap();
        sequence += 3;
    }
    assert_eq!(log.segment_count(), 1);
    let files = file_names(dir.path());
    let leo = log.log_end_offset();
    let before = read_all(&log);

    // The next append rolls: seal (index writes), new segment files, a
    // producer snapshot, then the batch. The disk fills at every byte of
    // that in turn.
    let next = build_batch(&BatchSpec {
        value_len: 4000,
        ..BatchSpec::idempotent(7, 0, sequence, 1)
    });
    let mut room = 0;
    loop {
        disk_fault::fill_after(room);
        match log.append_as_leader(&next, 0, NOW) {
            Ok(info) => {
                assert_eq!(info.base_offset, leo);
                break;
            }
            Err(err) => {
                assert!(is_storage_full(&err), "room {room}: {err}");
                assert_eq!(log.log_end_offset(), leo);
                assert_eq!(read_all(&log), before);
                let names = file_names(dir.path());
                assert!(
                    !names.iter().any(|n| n.ends_with(TMP_SUFFIX)),
                    "room {room}: a temporary file is left: {names:?}"
                );
                if log.segment_count() == 1 {
                    assert_eq!(names, files, "room {room}: files of a failed roll are left");
                } else {
                    // The roll completed, snapshot included; the batch
                    // did not fit after it.
                    assert_eq!(log.segment_base_offsets(), vec![0, leo]);
                    let snapshot = producer_state::snapshot_path(dir.path(), leo);
                    assert!(
                        snapshot.exists(),
                        "room {room}: a roll without its snapshot"
                    );
                }
            }
        }
        // Every byte at first, where the small writes are; then faster.
        room += 1 + room / 64;
    }
    assert!(
        room > next.len() as u64,
        "every step of the roll was failed once"
    );
    disk_fault::free();
    assert_eq!(log.segment_count(), 2);
    assert_eq!(log.segment_base_offsets()[1], leo);
    let after = read_all(&log);
    drop(log);
    let log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    assert_eq!(read_all(&log), after);
}

#[test]
fn a_torn_write_that_cannot_be_cut_stops_appends_until_it_is() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    log.append_as_leader(&batch(1), 0, NOW).unwrap();
    let before = read_all(&log);
    let len = active_file_len(&log);

    disk_fault::fill_after(100);
    disk_fault::fail_truncations();
    assert!(is_storage_full(
        &log.append_as_leader(&batch(2), 0, NOW).unwrap_err()
    ));
    assert_eq!(active_file_len(&log), len + 100, "the torn bytes stay");
    // Room again, but the tail still cannot be cut: nothing may be written
    // after it.
    disk_fault::fill_after(1 << 20);
    let refused = log.append_as_leader(&batch(3), 0, NOW).unwrap_err();
    assert!(matches!(refused, StorageError::Io { .. }), "{refused}");
    assert_eq!(active_file_len(&log), len + 100);
    assert_eq!(read_all(&log), before);

    disk_fault::free();
    let info = log.append_as_leader(&batch(3), 0, NOW).unwrap();
    assert_eq!(info.base_offset, before.len() as i64 * 3);
    assert_eq!(
        active_file_len(&log),
        len + batch(3).len() as u64,
        "the tail was cut before the write"
    );
}

#[test]
fn a_torn_write_left_by_a_crash_on_a_full_disk_is_cut_by_recovery() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config(), NOW).unwrap().0;
    log.append_as_leader(&idempotent_batch(7, 0, 0, 3, NOW), 0, NOW)
        .unwrap();
    log.flush().unwrap();
    let acked = read_all(&log);
    let len = active_file_len(&log);
    // The disk fills in the middle of the next write and the process dies
    // before it can cut the torn bytes (no close).
    disk_fault::fill_after(37);
    disk_fault::fail_truncations();
    let torn = idempotent_batch(7, 0, 3, 3, NOW);
    assert!(log.append_as_leader(&torn, 0, NOW).is_err());
    std::mem::forget(log);
    disk_fault::free();
    assert_eq!(
        std::fs::metadata(dir.path().join("00000000000000000000.log"))
            .unwrap()
            .len(),
        len + 37
    );

    let (mut log, report) = PartitionLog::open(dir.path(), config(), NOW).unwrap();
    assert_eq!(report.bytes_truncated, 37);
    assert_eq!(report.truncated_at_offset, Some(3));
    assert_eq!(read_all(&log), acked);
    // The producer's next sequence is the torn batch's: it was never stored.
    let info = log.append_as_leader(&torn, 0, NOW).unwrap();
    assert!(!info.duplicate);
    assert_eq!(info.base_offset, 3);
}

#[test]
fn index_writes_that_fail_are_retried_and_recovery_rebuilds_what_was_lost() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes: 1 << 30,
        index_interval_bytes: 1,
        ..config()
    };
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW)
        .unwrap()
        .0;
    let small = simple_batch(1, NOW);
    // Enough index entries that blocks are written while the disk is full:
    // the log's writes fit (room for them is given per append), the
    // index's block writes do not.
    for _ in 0..1200 {
        disk_fault::fill_after(small.len() as u64);
        log.append_as_leader(&small, 0, NOW).unwrap();
    }
    disk_fault::free();
    for _ in 0..600 {
        log.append_as_leader(&small, 0, NOW).unwrap();
    }
    let all = read_all(&log);
    assert_eq!(all.len(), 1800);
    log.close().unwrap();
    let (log, report) = PartitionLog::open(dir.path(), config, NOW).unwrap();
    assert_eq!(
        report.indexes_rebuilt, 0,
        "the retried writes made the index whole"
    );
    assert_eq!(read_all(&log), all);
}

#[test]
fn a_failed_atomic_write_leaves_no_temporary_file() {
    let _room = Room;
    let dir = tempfile::tempdir().unwrap();
    fsutil::write_atomically(dir.path(), "checkpoint", b"old").unwrap();
    disk_fault::fill_after(2);
    let err = fsutil::write_atomically(dir.path(), "checkpoint", b"new content").unwrap_err();
    assert!(is_storage_full(&err), "{err}");
    disk_fault::free();
    assert_eq!(file_names(dir.path()), vec!["checkpoint".to_string()]);
    assert_eq!(
        std::fs::read(dir.path().join("checkpoint")).unwrap(),
        b"old"
    );
}
