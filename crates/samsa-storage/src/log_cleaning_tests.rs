#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use crate::batch::{self, BatchHeader, EndTxnMarker};
use crate::cleaner::offset_map::{OffsetMap, DEFAULT_LOAD_FACTOR};
use crate::cleaner::pass::{clean, CleanStats, CleanedLog, Throttle, CLEANING_DIR};
use crate::compression::decompressed_records;
use crate::config::{CleanupPolicy, LogConfig};
use crate::fsutil::offset_file_name;
use crate::log::{PartitionLog, SWAP_EXTENSION};
use crate::producer_state;
use crate::segment::{INDEX_EXTENSION, LOG_EXTENSION};
use crate::testing::{keyed_batch, KeyedProducer};

const NOW: i64 = 1_700_000_000_000;
const DAY: i64 = 86_400_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 128,
        retention_ms: -1,
        cleanup_policy: CleanupPolicy::Compact,
        min_cleanable_dirty_ratio: 0.01,
        ..LogConfig::default()
    }
}

fn open(dir: &Path) -> PartitionLog {
    PartitionLog::open(dir, config(), NOW).unwrap().0
}

fn put(log: &mut PartitionLog, key: &str, value: Option<&str>) -> i64 {
    let batch = keyed_batch(&[(key.as_bytes(), value.map(str::as_bytes))], None, NOW);
    log.append_as_leader(&batch, 0, NOW).unwrap().base_offset
}

/// `count` records over `keys` keys, each its own batch.
fn fill(log: &mut PartitionLog, keys: usize, count: usize, tag: &str) {
    for i in 0..count {
        put(log, &format!("k{}", i % keys), Some(&format!("{tag}{i}")));
    }
}

/// Makes everything appended committed and durable: what the cleaner may take.
fn commit_all(log: &mut PartitionLog) {
    log.set_high_watermark(log.log_end_offset()).unwrap();
    log.flush().unwrap();
}

fn pass(log: &PartitionLog, now: i64) -> CleanedLog {
    let plan = log.cleaning_plan(now).expect("a pass is due");
    let mut map = OffsetMap::with_memory(1 << 16, DEFAULT_LOAD_FACTOR);
    clean(&plan, &mut map, &mut Throttle::new(None)).unwrap()
}

fn compact(log: &mut PartitionLog, now: i64) -> CleanStats {
    let cleaned = pass(log, now);
    let stats = cleaned.stats;
    assert!(log.install_cleaned(cleaned, now).unwrap());
    stats
}

type Row = (i64, String, Option<String>);

/// Every batch header and bytes from log start to log end.
fn batches(log: &PartitionLog) -> Vec<(BatchHeader, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = log.log_start_offset();
    while offset < log.log_end_offset() {
        let r = log.read(offset, 4096, i64::MAX).unwrap();
        assert!(!r.records.is_empty(), "nothing read at {offset}");
        for item in batch::batches(&r.records) {
            let (h, bytes) = item.unwrap();
            assert!(h.base_offset >= offset, "offsets increase");
            offset = h.last_offset() + 1;
            out.push((h, bytes.to_vec()));
        }
    }
    out
}

/// What a read_committed consumer sees: data records, aborted transactions
/// skipped (as a Kafka consumer does with the fetch's aborted list).
fn committed_view(log: &PartitionLog) -> Vec<Row> {
    let mut aborted = log.aborted_transactions(log.log_start_offset(), log.log_end_offset());
    aborted.sort_by_key(|a| a.first_offset);
    let mut aborted = aborted.into_iter().peekable();
    let mut aborting = HashSet::new();
    let mut rows = Vec::new();
    for (h, bytes) in batches(log) {
        while let Some(a) = aborted.next_if(|a| a.first_offset <= h.last_offset()) {
            aborting.insert(a.producer_id);
        }
        if h.is_control() {
            if let Some(EndTxnMarker { commit: false, .. }) = EndTxnMarker::parse(&bytes).unwrap() {
                aborting.remove(&h.producer_id);
            }
            continue;
        }
        if h.is_transactional() && aborting.contains(&h.producer_id) {
            continue;
        }
        let body = decompressed_records(&bytes, 1 << 20).unwrap();
        for r in batch::records_in(&body, h.records_count) {
            let r = r.unwrap();
            let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
            rows.push((
                h.base_offset + i64::from(r.offset_delta),
                r.key.map(text).unwrap_or_default(),
                r.value.map(text),
            ));
        }
    }
    rows
}

fn latest_per_key(rows: &[Row]) -> BTreeMap<String, (i64, Option<String>)> {
    rows.iter()
        .map(|(o, k, v)| (k.clone(), (*o, v.clone())))
        .collect()
}

/// A cleaned view holds only rows of the original view, the latest of
/// every key among them, and below the cleaner checkpoint one row per key.
fn assert_compacted(before: &[Row], after: &[Row], cleaned_up_to: i64) {
    let original: HashSet<&Row> = before.iter().collect();
    assert!(
        after.iter().all(|r| original.contains(r)),
        "nothing invented"
    );
    let latest_before = latest_per_key(before);
    for (key, (offset, value)) in &latest_before {
        if value.is_some() {
            assert!(
                after.contains(&(*offset, key.clone(), value.clone())),
                "latest {key} at {offset} kept"
            );
        }
    }
    let mut seen = HashSet::new();
    for (offset, key, _) in after.iter().filter(|r| r.0 < cleaned_up_to) {
        assert!(
            seen.insert(key.clone()) || latest_before[key].0 == *offset,
            "superseded {key} at {offset} left in the cleaned part"
        );
    }
}

#[test]
fn compaction_keeps_the_latest_value_of_each_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 10, 300, "v");
    commit_all(&mut log);
    let before = committed_view(&log);
    let (leo, size, segments) = (log.log_end_offset(), log.size_bytes(), log.segment_count());
    assert!(segments > 4);

    let stats = compact(&mut log, NOW);
    assert!(stats.records_removed > 200, "{stats:?}");
    assert!(stats.bytes_written < stats.bytes_read);
    let after = committed_view(&log);
    assert_compacted(&before, &after, log.cleaner_offset());
    assert_eq!(log.log_end_offset(), leo);
    assert!(log.size_bytes() < size / 2);
    // Full segments each became a small one: the next pass merges them.
    assert_eq!(log.segment_count(), segments);
    // The cleaned segments hold no descriptor; the active one does.
    let active = *log.segment_base_offsets().last().unwrap();
    assert_eq!(log.held_segment_files(), vec![active]);
    assert!(log.cleaning_plan(NOW).is_none(), "nothing dirty is left");
    assert!(!dir.path().join(CLEANING_DIR).exists());

    // The same after a clean and after an unclean restart.
    log.close().unwrap();
    let log = open(dir.path());
    assert_eq!(committed_view(&log), after);
    drop(log);
    let (log, report) = PartitionLog::open(dir.path(), config(), NOW).unwrap();
    assert_eq!(report.bytes_truncated, 0);
    assert_eq!(committed_view(&log), after);
}

#[test]
fn new_writes_make_the_log_dirty_again_and_only_the_newest_survives() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 5, 100, "a");
    commit_all(&mut log);
    compact(&mut log, NOW);
    let first = log.cleaner_offset();
    fill(&mut log, 5, 100, "b");
    commit_all(&mut log);
    let before = committed_view(&log);
    let segments = log.segment_count();
    compact(&mut log, NOW);
    assert!(log.cleaner_offset() > first);
    assert!(
        log.segment_count() < segments,
        "small cleaned segments merge"
    );
    let after = committed_view(&log);
    assert_compacted(&before, &after, log.cleaner_offset());
    assert!(
        after
            .iter()
            .all(|(_, _, v)| !v.as_deref().unwrap().starts_with('a')),
        "every key was rewritten with b: no a value survives"
    );
}

#[test]
fn a_tombstone_stays_for_delete_retention_then_goes() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 5, 50, "v");
    let tombstone = put(&mut log, "k1", None);
    fill(&mut log, 1, 60, "x");
    commit_all(&mut log);
    compact(&mut log, NOW);
    let view = committed_view(&log);
    assert!(
        view.contains(&(tombstone, "k1".into(), None)),
        "tombstone kept"
    );
    assert!(
        view.iter().all(|(o, k, _)| k != "k1" || *o == tombstone),
        "k1's values are gone"
    );
    // Within delete.retention.ms nothing is due; after it, the tombstone goes.
    assert!(log.cleaning_plan(NOW + DAY / 2).is_none());
    compact(&mut log, NOW + DAY + 1);
    let view = committed_view(&log);
    assert!(view.iter().all(|(_, k, _)| k != "k1"), "{view:?}");
    assert!(view.iter().any(|(_, k, _)| k == "k2"));
}

fn txn(producer_id: i64, base_sequence: i32) -> Option<KeyedProducer> {
    Some(KeyedProducer {
        producer_id,
        epoch: 0,
        base_sequence,
        transactional: true,
    })
}

fn marker(log: &mut PartitionLog, producer_id: i64, commit: bool) -> i64 {
    let marker = EndTxnMarker {
        producer_id,
        producer_epoch: 0,
        coordinator_epoch: 0,
        commit,
    };
    log.append_txn_marker(&marker, 0, NOW).unwrap().base_offset
}

#[test]
fn aborted_records_go_and_read_committed_sees_the_same_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 4, 20, "v");
    // Producer 7 commits k1 = committed; producer 8 aborts k1 = aborted and
    // k9 = aborted-only; both are later superseded or not.
    let b = keyed_batch(&[(b"k1", Some(b"committed"))], txn(7, 0), NOW);
    log.append_as_leader(&b, 0, NOW).unwrap();
    let b = keyed_batch(
        &[(b"k1", Some(b"aborted")), (b"k9", Some(b"aborted-only"))],
        txn(8, 0),
        NOW,
    );
    log.append_as_leader(&b, 0, NOW).unwrap();
    marker(&mut log, 7, true);
    let abort_marker = marker(&mut log, 8, false);
    fill(&mut log, 4, 60, "w");
    commit_all(&mut log);
    let before = committed_view(&log);
    assert!(before
        .iter()
        .all(|(_, _, v)| v.as_deref() != Some("aborted")));

    compact(&mut log, NOW);
    let after = committed_view(&log);
    assert_compacted(&before, &after, log.cleaner_offset());
    // No record of the aborted transaction is stored any more, though its
    // batch stays (empty) as producer 8's last: it holds its sequence.
    let mut stored_k9 = false;
    for (h, bytes) in batches(&log) {
        if h.producer_id == 8 && !h.is_control() {
            assert_eq!(h.records_count, 0);
            let body = decompressed_records(&bytes, 1 << 20).unwrap();
            stored_k9 |= batch::records_in(&body, h.records_count).count() > 0;
        }
    }
    assert!(!stored_k9);
    // Its marker stays while that batch does, with its index entry.
    let markers: Vec<i64> = batches(&log)
        .iter()
        .filter(|(h, _)| h.is_control())
        .map(|(h, _)| h.base_offset)
        .collect();
    assert!(markers.contains(&abort_marker));
    assert_eq!(log.producer_state().get(8).unwrap().last_sequence, 1);
}

#[test]
fn a_marker_outlives_its_records_by_a_pass_then_goes_after_its_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    let b = keyed_batch(&[(b"k1", Some(b"t"))], txn(7, 0), NOW);
    log.append_as_leader(&b, 0, NOW).unwrap();
    let commit = marker(&mut log, 7, true);
    // Producer 7 writes on, so the transaction's batch is not its last.
    let b = keyed_batch(
        &[(b"k2", Some(b"t2"))],
        Some(KeyedProducer {
            transactional: false,
            ..txn(7, 1).unwrap()
        }),
        NOW,
    );
    log.append_as_leader(&b, 0, NOW).unwrap();
    fill(&mut log, 1, 80, "x");
    fill(&mut log, 3, 80, "y");
    put(&mut log, "k1", Some("superseded"));
    fill(&mut log, 3, 80, "z");
    commit_all(&mut log);
    let has_marker = |log: &PartitionLog| batches(log).iter().any(|(h, _)| h.base_offset == commit);

    compact(&mut log, NOW);
    assert!(has_marker(&log), "the pass met the transaction's batch");
    fill(&mut log, 3, 80, "again");
    commit_all(&mut log);
    compact(&mut log, NOW);
    assert!(
        has_marker(&log),
        "no records left, but the horizon has not passed"
    );
    fill(&mut log, 3, 80, "later");
    commit_all(&mut log);
    compact(&mut log, NOW + DAY + 1);
    assert!(!has_marker(&log), "gone after delete.retention.ms");
}

#[test]
fn a_live_producers_last_batch_survives_so_does_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    let idempotent = |seq| {
        Some(KeyedProducer {
            producer_id: 5,
            epoch: 0,
            base_sequence: seq,
            transactional: false,
        })
    };
    let mut last = Vec::new();
    for seq in 0..5 {
        last = keyed_batch(&[(b"k0", Some(b"p"))], idempotent(seq), NOW);
        log.append_as_leader(&last, 0, NOW).unwrap();
    }
    fill(&mut log, 1, 200, "later");
    commit_all(&mut log);
    compact(&mut log, NOW);
    assert!(
        committed_view(&log)
            .iter()
            .all(|(_, _, v)| v.as_deref() != Some("p")),
        "every value of producer 5 is superseded"
    );
    // Rebuilt from the cleaned log alone, producer state still knows the
    // last sequence, and a retry of the last batch is a duplicate.
    log.close().unwrap();
    for snapshot in producer_state::list_snapshots(dir.path()).unwrap() {
        std::fs::remove_file(producer_state::snapshot_path(dir.path(), snapshot)).unwrap();
    }
    let mut log = open(dir.path());
    assert_eq!(log.producer_state().get(5).unwrap().last_sequence, 4);
    assert!(log.append_as_leader(&last, 0, NOW).unwrap().duplicate);
}

#[test]
fn a_pass_whose_segments_changed_meanwhile_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 10, 300, "v");
    commit_all(&mut log);
    let before = committed_view(&log);
    let cleaned = pass(&log, NOW);
    let second = log.segment_base_offsets()[1];
    log.delete_records_before(second).unwrap();
    assert!(!log.install_cleaned(cleaned, NOW).unwrap());
    assert!(!dir.path().join(CLEANING_DIR).exists());
    let after = committed_view(&log);
    assert_eq!(after[..], before[before.len() - after.len()..]);
}

#[test]
fn a_follower_copies_a_cleaned_log_with_its_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let mut leader = open(&dir.path().join("leader"));
    fill(&mut leader, 10, 300, "v");
    commit_all(&mut leader);
    compact(&mut leader, NOW);
    let mut follower = open(&dir.path().join("follower"));
    while follower.log_end_offset() < leader.log_end_offset() {
        let r = leader
            .read(follower.log_end_offset(), 700, i64::MAX)
            .unwrap();
        follower.append_as_follower(&r.records, NOW).unwrap();
    }
    assert_eq!(committed_view(&follower), committed_view(&leader));
}

/// Where a crash interrupts a swap, emulated with the swap's own steps.
#[derive(Debug, Clone, Copy)]
enum CrashAt {
    BeforeCommit,
    AfterCommit,
    AfterOldSegmentsDeleted,
    AfterIndexesMoved,
}

fn crash_during_swap(at: CrashAt) {
    let dir = tempfile::tempdir().unwrap();
    let twin = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    fill(&mut log, 10, 300, "v");
    commit_all(&mut log);
    // Once cleaned, segments are small: the next pass merges them.
    compact(&mut log, NOW);
    fill(&mut log, 10, 300, "w");
    commit_all(&mut log);
    let before = committed_view(&log);
    log.close().unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), twin.path().join(entry.file_name())).unwrap();
    }
    let mut reference = open(twin.path());
    compact(&mut reference, NOW);
    let expected = committed_view(&reference);

    let log = open(dir.path());
    let cleaned = pass(&log, NOW);
    let first = &cleaned.segments[0];
    let base = first.segment.base_offset();
    let replaced: Vec<i64> = first.replaces.iter().map(|r| r.0).collect();
    assert!(
        replaced.len() > 1,
        "the first cleaned segment replaces several"
    );
    drop(cleaned);
    drop(log);
    let scratch = dir.path().join(CLEANING_DIR);
    let swap = offset_file_name(dir.path(), base, SWAP_EXTENSION);
    if !matches!(at, CrashAt::BeforeCommit) {
        std::fs::rename(offset_file_name(&scratch, base, LOG_EXTENSION), &swap).unwrap();
    }
    if matches!(
        at,
        CrashAt::AfterOldSegmentsDeleted | CrashAt::AfterIndexesMoved
    ) {
        for &old in &replaced[1..] {
            crate::segment::remove_segment_files(dir.path(), old).unwrap();
        }
    }
    if matches!(at, CrashAt::AfterIndexesMoved) {
        let index = offset_file_name(dir.path(), base, INDEX_EXTENSION);
        std::fs::rename(offset_file_name(&scratch, base, INDEX_EXTENSION), index).unwrap();
    }

    let (log, _) = PartitionLog::open(dir.path(), config(), NOW).unwrap();
    assert!(!scratch.exists() && !swap.exists(), "{at:?}");
    let view = committed_view(&log);
    match at {
        CrashAt::BeforeCommit => assert_eq!(view, before, "old segments kept"),
        _ => {
            // The first cleaned segment is in, the rest of the log as it was.
            let first_end = log.segment_base_offsets()[1];
            let cleaned: Vec<&Row> = view.iter().filter(|r| r.0 < first_end).collect();
            let reference: Vec<&Row> = expected.iter().filter(|r| r.0 < first_end).collect();
            assert_eq!(cleaned, reference, "{at:?}");
            let rest: Vec<&Row> = view.iter().filter(|r| r.0 >= first_end).collect();
            let original: Vec<&Row> = before.iter().filter(|r| r.0 >= first_end).collect();
            assert_eq!(rest, original, "{at:?}");
        }
    }
}

#[test]
fn a_crash_during_a_swap_leaves_the_old_segments_or_the_cleaned_one() {
    for at in [
        CrashAt::BeforeCommit,
        CrashAt::AfterCommit,
        CrashAt::AfterOldSegmentsDeleted,
        CrashAt::AfterIndexesMoved,
    ] {
        crash_during_swap(at);
    }
}

#[test]
fn a_deleting_policy_is_never_cleaned_and_compact_only_never_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(
        dir.path(),
        LogConfig {
            cleanup_policy: CleanupPolicy::Delete,
            ..config()
        },
        NOW,
    )
    .unwrap()
    .0;
    fill(&mut log, 10, 300, "v");
    commit_all(&mut log);
    assert!(log.cleaning_priority(NOW).is_none());

    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(
        dir.path(),
        LogConfig {
            retention_ms: 1,
            ..config()
        },
        NOW,
    )
    .unwrap()
    .0;
    fill(&mut log, 10, 300, "v");
    commit_all(&mut log);
    assert_eq!(log.enforce_retention(NOW + DAY).unwrap(), 0);
}

#[test]
fn a_compacted_log_refuses_records_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    put(&mut log, "k", Some("v"));
    let keyless = crate::testing::simple_batch(2, NOW);
    match log.append_as_leader(&keyless, 0, NOW) {
        Err(crate::StorageError::KeylessRecords { record_indexes }) => {
            assert_eq!(record_indexes, [0, 1], "every keyless record, by index")
        }
        other => panic!("{other:?}"),
    }
    // Nothing of the request was written; keyed records still go in.
    assert_eq!(log.log_end_offset(), 1);
    put(&mut log, "k", None);
    assert_eq!(log.log_end_offset(), 2);
}

#[test]
fn repeated_passes_keep_a_one_key_log_small() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path());
    let mut cleaned_sizes = Vec::new();
    for _ in 0..30 {
        fill(&mut log, 1, 60, "v");
        commit_all(&mut log);
        cleaned_sizes.push(compact(&mut log, NOW).bytes_written);
    }
    // One record and a few emptied batches ending cleaned segments, not
    // one more empty batch per pass.
    let worst = cleaned_sizes[10..].iter().max().copied().unwrap();
    assert!(worst < 400, "{cleaned_sizes:?}");
}
