//! Crash-recovery under damage: a log spanning several segments is dropped
//! without close(), its active segment is truncated at a random point, has a
//! random byte flipped, or gets garbage appended; reopening must keep exactly
//! the valid prefix of batches, rebuild indexes, producer state and the
//! transactions (ongoing ones and the aborted-transaction index), and accept
//! (durably) new appends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use samsa_storage::batch::{self, verify_crc, BatchHeader};
use samsa_storage::testing::{build_batch, BatchSpec};
use samsa_storage::{AbortedTxn, EndTxnMarker, LogConfig, PartitionLog, StorageError};

const NOW: i64 = 1_700_000_000_000;
const CASES: u64 = 64;
/// The transactional producer; 0..3 are idempotent ones.
const TXN_PID: i64 = 7;

#[derive(Debug, Clone, Copy)]
enum Damage {
    Truncate,
    FlipByte,
    AppendGarbage,
    AppendBatchWithBadCrc,
    AppendBatchWithWrongOffset,
}

/// A batch as stored by the log (offsets assigned), and who sent it.
#[derive(Clone)]
struct Stored {
    bytes: Vec<u8>,
    producer: Option<(i64, i32)>, // (producer id, base sequence)
}

fn config(rng: &mut StdRng) -> LogConfig {
    LogConfig {
        segment_bytes: rng.gen_range(1500..5000),
        index_interval_bytes: rng.gen_range(1..400),
        retention_ms: -1,
        ..LogConfig::default()
    }
}

fn read_everything(log: &PartitionLog) -> Vec<Vec<u8>> {
    let r = log
        .read(log.log_start_offset(), usize::MAX, i64::MAX)
        .unwrap();
    batch::batches(&r.records)
        .map(|b| b.unwrap().1.to_vec())
        .collect()
}

fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// First unstable offset and aborted transactions of a list of stored
/// batches, by replaying them.
fn expected_transactions(stored: &[Stored]) -> (Option<i64>, Vec<AbortedTxn>) {
    let mut open = None;
    let mut aborted = Vec::new();
    for s in stored {
        let h = BatchHeader::parse(&s.bytes).unwrap();
        if h.producer_id != TXN_PID {
            continue;
        }
        if let Some(marker) = EndTxnMarker::parse(&s.bytes).unwrap() {
            if let Some(first_offset) = open.take() {
                if !marker.commit {
                    aborted.push(AbortedTxn {
                        producer_id: TXN_PID,
                        first_offset,
                    });
                }
            }
        } else if open.is_none() {
            open = Some(h.base_offset);
        }
    }
    (open, aborted)
}

fn run_case(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = config(&mut rng);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW)
        .unwrap()
        .0;

    let mut next_sequence = [0i32; 3];
    let mut txn_sequence = 0;
    let batches = rng.gen_range(30..70);
    let mut appended = 0;
    while appended < batches || log.segment_count() < 3 {
        appended += 1;
        let records = rng.gen_range(1..5);
        let idempotent = rng.gen_bool(0.5);
        let pid = rng.gen_range(0..3i64);
        let mut spec = BatchSpec {
            record_count: records,
            value_len: rng.gen_range(0..400),
            base_timestamp: NOW + rng.gen_range(-5000..5000),
            timestamp_step: rng.gen_range(-2..3),
            value_seed: rng.gen(),
            ..BatchSpec::default()
        };
        if rng.gen_bool(0.15) {
            spec = BatchSpec {
                ..BatchSpec::transactional(TXN_PID, 0, txn_sequence, records)
                    .with_timestamp(spec.base_timestamp)
            };
            txn_sequence += records;
        } else if idempotent {
            spec = BatchSpec {
                ..BatchSpec::idempotent(pid, 0, next_sequence[pid as usize], records)
                    .with_timestamp(spec.base_timestamp)
            };
            next_sequence[pid as usize] += records;
        }
        log.append_as_leader(&build_batch(&spec), 3, NOW).unwrap();
        if rng.gen_bool(0.1) {
            let marker = EndTxnMarker {
                producer_id: TXN_PID,
                producer_epoch: 0,
                coordinator_epoch: 0,
                commit: rng.gen(),
            };
            log.append_txn_marker(&marker, 3, NOW).unwrap();
        }
        if rng.gen_bool(0.05) {
            log.flush().unwrap();
        }
    }
    let stored: Vec<Stored> = read_everything(&log)
        .into_iter()
        .map(|bytes| {
            let h = BatchHeader::parse(&bytes).unwrap();
            let producer = h
                .has_producer_id()
                .then_some((h.producer_id, h.base_sequence));
            Stored { bytes, producer }
        })
        .collect();
    assert!(
        log.segment_count() >= 3,
        "seed {seed}: want several segments"
    );
    drop(log); // crash: no close()

    // Damage the active (last) segment.
    let files = segment_files(dir.path());
    let active = files.last().unwrap().clone();
    let active_base: i64 = active
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let original = std::fs::read(&active).unwrap();
    let in_earlier_segments = stored
        .iter()
        .filter(|s| BatchHeader::parse(&s.bytes).unwrap().base_offset < active_base)
        .count();
    // Byte ranges of the active segment's batches.
    let mut ranges = Vec::new();
    let mut position = 0;
    for (h, bytes) in batch::batches(&original).map(|b| b.unwrap()) {
        assert_eq!(
            h.base_offset,
            BatchHeader::parse(&stored[in_earlier_segments + ranges.len()].bytes)
                .unwrap()
                .base_offset
        );
        ranges.push(position..position + bytes.len());
        position += bytes.len();
    }
    assert_eq!(position, original.len());

    let damage = match rng.gen_range(0..5) {
        0 => Damage::Truncate,
        1 => Damage::FlipByte,
        2 => Damage::AppendGarbage,
        3 => Damage::AppendBatchWithBadCrc,
        _ => Damage::AppendBatchWithWrongOffset,
    };
    let next_offset = stored
        .last()
        .map(|s| BatchHeader::parse(&s.bytes).unwrap().last_offset() + 1)
        .unwrap();
    // How many of the active segment's batches must survive, and whether one
    // batch survives with a changed leader epoch (the field is outside the
    // CRC in Kafka's format, so a flip there is undetectable by design).
    let (kept_in_active, epoch_flipped_batch, dropped_bytes) = match damage {
        Damage::Truncate => {
            let cut = rng.gen_range(0..original.len());
            std::fs::OpenOptions::new()
                .write(true)
                .open(&active)
                .unwrap()
                .set_len(cut as u64)
                .unwrap();
            let kept = ranges.iter().filter(|r| r.end <= cut).count();
            let valid_end = if kept == 0 { 0 } else { ranges[kept - 1].end };
            (kept, None, cut - valid_end)
        }
        Damage::FlipByte => {
            let at = rng.gen_range(0..original.len());
            let mut bytes = original.clone();
            bytes[at] ^= 1 << rng.gen_range(0..8);
            std::fs::write(&active, &bytes).unwrap();
            let hit = ranges.iter().position(|r| r.contains(&at)).unwrap();
            let within = at - ranges[hit].start;
            if (12..16).contains(&within) {
                (ranges.len(), Some(hit), 0)
            } else {
                (hit, None, original.len() - ranges[hit].start)
            }
        }
        Damage::AppendGarbage => {
            let garbage: Vec<u8> = (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect();
            std::fs::OpenOptions::new()
                .append(true)
                .open(&active)
                .unwrap()
                .write_all(&garbage)
                .unwrap();
            (ranges.len(), None, garbage.len())
        }
        Damage::AppendBatchWithBadCrc => {
            let mut b = build_batch(&BatchSpec {
                base_offset: next_offset,
                record_count: 2,
                ..BatchSpec::default()
            });
            let last = b.len() - 1;
            b[last] ^= 0x80;
            std::fs::OpenOptions::new()
                .append(true)
                .open(&active)
                .unwrap()
                .write_all(&b)
                .unwrap();
            (ranges.len(), None, b.len())
        }
        Damage::AppendBatchWithWrongOffset => {
            let b = build_batch(&BatchSpec {
                base_offset: next_offset + 1,
                record_count: 2,
                ..BatchSpec::default()
            });
            std::fs::OpenOptions::new()
                .append(true)
                .open(&active)
                .unwrap()
                .write_all(&b)
                .unwrap();
            (ranges.len(), None, b.len())
        }
    };
    let expected: Vec<Stored> = stored[..in_earlier_segments + kept_in_active].to_vec();

    let (mut log, report) = PartitionLog::open(dir.path(), config.clone(), NOW).unwrap();
    let context = format!("seed {seed}, {damage:?}, report {report:?}");
    assert!(!report.clean_shutdown, "{context}");
    let expected_leo = expected.last().map_or(active_base, |s| {
        BatchHeader::parse(&s.bytes).unwrap().last_offset() + 1
    });
    assert_eq!(log.log_end_offset(), expected_leo, "{context}");
    assert_eq!(report.bytes_truncated, dropped_bytes as u64, "{context}");
    assert_eq!(report.segments_deleted, 0, "{context}");

    // Exactly the valid prefix, every batch passing CRC.
    let read = read_everything(&log);
    assert_eq!(read.len(), expected.len(), "{context}");
    for (i, (got, want)) in read.iter().zip(&expected).enumerate() {
        verify_crc(got).unwrap();
        if epoch_flipped_batch.map(|b| b + in_earlier_segments) == Some(i) {
            let (mut g, mut w) = (got.clone(), want.bytes.clone());
            g[12..16].fill(0);
            w[12..16].fill(0);
            assert_eq!(g, w, "{context}: batch {i}");
        } else {
            assert_eq!(got, &want.bytes, "{context}: batch {i}");
        }
    }

    // Transactions as the survivors say.
    let (first_unstable, aborted) = expected_transactions(&expected);
    assert_eq!(log.first_unstable_offset(), first_unstable, "{context}");
    assert_eq!(
        log.aborted_transactions(0, expected_leo + 1),
        aborted,
        "{context}"
    );

    // Indexes rebuilt: every offset finds its batch, timestamps are found.
    for (i, s) in expected.iter().enumerate() {
        let h = BatchHeader::parse(&s.bytes).unwrap();
        for offset in [h.base_offset, h.last_offset()] {
            let r = log.read(offset, 1, i64::MAX).unwrap();
            assert_eq!(
                r.first_batch_offset,
                Some(h.base_offset),
                "{context}: offset {offset} (batch {i})"
            );
        }
    }
    if let Some(first) = expected.first() {
        let first_ts = BatchHeader::parse(&first.bytes).unwrap().max_timestamp;
        let found = log.offset_for_timestamp(first_ts).unwrap().unwrap();
        let containing = expected
            .iter()
            .map(|s| BatchHeader::parse(&s.bytes).unwrap())
            .find(|h| h.max_timestamp >= first_ts)
            .unwrap();
        assert!(
            found.0 >= containing.base_offset && found.0 <= containing.last_offset(),
            "{context}"
        );
    }

    // Producer state matches the survivors: the last surviving batch of each
    // producer is a duplicate; the sequence after it is accepted.
    for pid in 0..3i64 {
        let Some(last) = expected
            .iter()
            .rev()
            .find(|s| s.producer.is_some_and(|(p, _)| p == pid))
        else {
            continue;
        };
        let h = BatchHeader::parse(&last.bytes).unwrap();
        let retry = build_batch(&BatchSpec {
            base_timestamp: h.base_timestamp,
            ..BatchSpec::idempotent(pid, 0, h.base_sequence, h.records_count)
        });
        let info = log.append_as_leader(&retry, 3, NOW).unwrap();
        assert!(info.duplicate, "{context}: producer {pid}");
        assert_eq!(info.base_offset, h.base_offset, "{context}: producer {pid}");
        let next = build_batch(
            &BatchSpec::idempotent(pid, 0, h.last_sequence() + 1, 1).with_timestamp(NOW),
        );
        match log.append_as_leader(&next, 3, NOW) {
            Ok(info) => assert!(!info.duplicate, "{context}"),
            Err(e @ StorageError::OutOfOrderSequence { .. }) => {
                panic!("{context}: producer {pid}: {e}")
            }
            Err(e) => panic!("{context}: {e}"),
        }
    }

    // New appends work and survive another crash.
    let info = log
        .append_as_leader(
            &build_batch(&BatchSpec::default().with_timestamp(NOW)),
            3,
            NOW,
        )
        .unwrap();
    let after = read_everything(&log);
    let leo = log.log_end_offset();
    assert_eq!(info.last_offset + 1, leo);
    drop(log);
    let (log, report) = PartitionLog::open(dir.path(), config.clone(), NOW).unwrap();
    assert_eq!(report.bytes_truncated, 0, "{context}: {report:?}");
    assert_eq!(log.log_end_offset(), leo, "{context}");
    assert_eq!(read_everything(&log), after, "{context}");
    // And a clean close/open round trip trusts the rebuilt indexes.
    log.close().unwrap();
    let (log, report) = PartitionLog::open(dir.path(), config, NOW).unwrap();
    assert!(
        report.clean_shutdown
            && report.indexes_rebuilt == 0
            && report.segments_scanned == 0
            && report.transaction_indexes_rebuilt == 0,
        "{context}: {report:?}"
    );
    assert_eq!(
        log.aborted_transactions(0, leo + 1),
        aborted,
        "{context}: after reopening"
    );
    assert_eq!(read_everything(&log), after, "{context}");
}

#[test]
fn recovery_keeps_exactly_the_valid_prefix() {
    for seed in 0..CASES {
        run_case(seed);
    }
}

#[test]
fn damage_in_an_older_unflushed_segment_drops_everything_after_it() {
    let mut rng = StdRng::seed_from_u64(99);
    let dir = tempfile::tempdir().unwrap();
    let config = config(&mut rng);
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW)
        .unwrap()
        .0;
    for i in 0..60 {
        let b = build_batch(&BatchSpec {
            record_count: 2,
            value_len: 200,
            value_seed: i,
            ..BatchSpec::default()
        });
        log.append_as_leader(&b, 0, NOW).unwrap();
    }
    let all = read_everything(&log);
    drop(log);
    let files = segment_files(dir.path());
    assert!(files.len() >= 4);
    let victim = &files[1];
    let victim_base: i64 = victim
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[100] ^= 0xff; // inside its first batch
    std::fs::write(victim, &bytes).unwrap();

    let (log, report) = PartitionLog::open(dir.path(), config, NOW).unwrap();
    assert_eq!(log.log_end_offset(), victim_base);
    assert_eq!(
        log.segment_count(),
        2,
        "the damaged segment stays, emptied, as the active one"
    );
    assert_eq!(report.segments_deleted, files.len() - 2);
    let kept = read_everything(&log);
    assert_eq!(kept[..], all[..kept.len()]);
    assert_eq!(
        BatchHeader::parse(kept.last().unwrap())
            .unwrap()
            .last_offset()
            + 1,
        victim_base
    );
}
