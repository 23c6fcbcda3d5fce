//! Property tests: random sequences of appends (plain, idempotent with
//! retries, transactional with COMMIT/ABORT markers), reads, truncations,
//! flushes, clean and unclean reopens, checked against a simple in-memory
//! model of what the log must contain. The model derives the transactional
//! answers (ongoing transactions, aborted ones) from its list of batches
//! alone, so it knows nothing of producer state, snapshots or indexes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use samsa_storage::batch::{self, verify_crc, BatchHeader};
use samsa_storage::testing::{build_batch, without_assigned_fields, BatchSpec};
use samsa_storage::{AbortedTxn, EndTxnMarker, LogConfig, PartitionLog, StorageError};

const NOW: i64 = 1_700_000_000_000;
/// Transactional producers are 10 and 11; idempotent ones 0..3.
const TXN_PIDS: [i64; 2] = [10, 11];

#[derive(Debug, Clone)]
struct BatchShape {
    records: i32,
    value_len: usize,
    base_timestamp: i64,
    timestamp_step: i64,
    seed: u8,
}

#[derive(Debug, Clone)]
enum Op {
    /// One request of 1..=3 plain batches.
    Append(Vec<BatchShape>),
    /// One idempotent batch of producer `pid` with the next sequence.
    AppendIdempotent {
        pid: i64,
        shape: BatchShape,
    },
    /// Resend the `back`-th most recent batch of `pid`: a duplicate if it is in the window.
    Retry {
        pid: i64,
        back: usize,
    },
    /// One transactional batch of producer `TXN_PIDS[txn]` with the next sequence.
    AppendTransactional {
        txn: usize,
        shape: BatchShape,
    },
    /// A COMMIT or ABORT marker for producer `TXN_PIDS[txn]`, open transaction
    /// or not, written at `now` (in the range of the data's timestamps, so that
    /// markers do not roll segments by `segment.ms`).
    EndTxn {
        txn: usize,
        commit: bool,
        now: i64,
    },
    /// `aborted_transactions` over a random range.
    QueryAborted {
        fetch: prop::sample::Index,
        upper: prop::sample::Index,
    },
    /// `truncate_to` offset `n % (log end + 1)` (as a follower told of a divergence).
    Truncate(u32),
    Read {
        at: prop::sample::Index,
        max_bytes: usize,
        bound: prop::sample::Index,
    },
    FindTimestamp(i64),
    Flush,
    CloseAndReopen,
    /// Drop without close; with `lose_txn_index`, the active segment's
    /// transaction index (written, never fsynced) is lost as a power failure
    /// could lose it.
    CrashAndReopen {
        lose_txn_index: bool,
    },
}

fn shape() -> impl Strategy<Value = BatchShape> {
    (1..6i32, 0..300usize, 0..10_000i64, -3..4i64, any::<u8>()).prop_map(
        |(records, value_len, base_timestamp, timestamp_step, seed)| BatchShape {
            records,
            value_len,
            base_timestamp,
            timestamp_step,
            seed,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop::collection::vec(shape(), 1..4).prop_map(Op::Append),
        4 => (0..3i64, shape()).prop_map(|(pid, shape)| Op::AppendIdempotent { pid, shape }),
        2 => (0..3i64, 0..7usize).prop_map(|(pid, back)| Op::Retry { pid, back }),
        3 => (0..2usize, shape()).prop_map(|(txn, shape)| Op::AppendTransactional { txn, shape }),
        2 => (0..2usize, any::<bool>(), 0..10_000i64)
            .prop_map(|(txn, commit, now)| Op::EndTxn { txn, commit, now }),
        1 => (any::<prop::sample::Index>(), any::<prop::sample::Index>())
            .prop_map(|(fetch, upper)| Op::QueryAborted { fetch, upper }),
        1 => any::<u32>().prop_map(Op::Truncate),
        4 => (any::<prop::sample::Index>(), 0..3000usize, any::<prop::sample::Index>())
            .prop_map(|(at, max_bytes, bound)| Op::Read { at, max_bytes, bound }),
        1 => (-10..10_020i64).prop_map(Op::FindTimestamp),
        1 => Just(Op::Flush),
        1 => Just(Op::CloseAndReopen),
        1 => any::<bool>().prop_map(|lose_txn_index| Op::CrashAndReopen { lose_txn_index }),
    ]
}

fn config() -> impl Strategy<Value = LogConfig> {
    (1024..6000u64, 1..600u32).prop_map(|(segment_bytes, index_interval_bytes)| LogConfig {
        segment_bytes,
        index_interval_bytes,
        retention_ms: -1,
        // Record timestamps are small numbers, far behind NOW: keep producers.
        producer_id_expiration_ms: i64::MAX,
        ..LogConfig::default()
    })
}

/// What the log must hold: every stored batch (as the producer sent it) with
/// its assigned base offset, and per producer the batches it sent.
#[derive(Default)]
struct Model {
    batches: Vec<(i64, Vec<u8>)>,
    next_offset: i64,
    sent: [Vec<(Vec<u8>, i64)>; 3],
    next_sequence: [i32; 3],
    txn_next_sequence: [i32; 2],
}

/// Ongoing transactions (producer -> first offset) and aborted ones
/// (producer, first offset, marker offset), replayed from the batches.
#[derive(Debug, Default)]
struct TxnView {
    open: BTreeMap<i64, i64>,
    aborted: Vec<(i64, i64, i64)>,
}

impl Model {
    fn build(shape: &BatchShape, spec: BatchSpec) -> Vec<u8> {
        build_batch(&BatchSpec {
            record_count: shape.records,
            value_len: shape.value_len,
            base_timestamp: shape.base_timestamp,
            timestamp_step: shape.timestamp_step,
            value_seed: shape.seed,
            ..spec
        })
    }

    fn push(&mut self, batch: Vec<u8>) -> i64 {
        let base = self.next_offset;
        self.next_offset += i64::from(BatchHeader::parse(&batch).unwrap().records_count);
        self.batches.push((base, batch));
        base
    }

    fn txn_view(&self) -> TxnView {
        let mut view = TxnView::default();
        for (base, bytes) in &self.batches {
            let h = BatchHeader::parse(bytes).unwrap();
            if !h.has_producer_id() {
                continue;
            }
            if let Some(marker) = EndTxnMarker::parse(bytes).unwrap() {
                if let Some(first) = view.open.remove(&marker.producer_id) {
                    if !marker.commit {
                        view.aborted.push((marker.producer_id, first, *base));
                    }
                }
            } else if h.is_transactional() {
                view.open.entry(h.producer_id).or_insert(*base);
            }
        }
        view
    }
}

impl TxnView {
    fn expected_aborted(&self, fetch: i64, upper: i64) -> Vec<AbortedTxn> {
        if upper <= fetch {
            return Vec::new();
        }
        self.aborted
            .iter()
            .copied()
            .filter(|&(_, first, last)| last >= fetch && first < upper)
            .map(|(producer_id, first_offset, _)| AbortedTxn {
                producer_id,
                first_offset,
            })
            .collect()
    }
}

impl Model {
    /// Keeps the batches wholly below `offset`, and the producers' next
    /// sequences and sent batches with them.
    fn truncate(&mut self, offset: i64) {
        self.batches.retain(|(base, bytes)| {
            base + i64::from(BatchHeader::parse(bytes).unwrap().last_offset_delta) < offset
        });
        self.next_offset = self.batches.last().map_or(0, |(base, bytes)| {
            base + i64::from(BatchHeader::parse(bytes).unwrap().last_offset_delta) + 1
        });
        let next = self.next_offset;
        let next_sequence_of = |pid: i64| {
            self.batches
                .iter()
                .rev()
                .map(|(_, bytes)| BatchHeader::parse(bytes).unwrap())
                .find(|h| h.producer_id == pid && !h.is_control())
                .map_or(0, |h| h.last_sequence() + 1)
        };
        let sequences: Vec<i32> = (0..3).map(next_sequence_of).collect();
        let txn_sequences: Vec<i32> = TXN_PIDS.iter().map(|&p| next_sequence_of(p)).collect();
        self.next_sequence.copy_from_slice(&sequences);
        self.txn_next_sequence.copy_from_slice(&txn_sequences);
        for sent in &mut self.sent {
            sent.retain(|(_, base)| *base < next);
        }
    }

    /// (offset, timestamp) of every record, in offset order.
    fn records(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        for (base, bytes) in &self.batches {
            let h = BatchHeader::parse(bytes).unwrap();
            for r in batch::records(bytes).unwrap() {
                let r = r.unwrap();
                out.push((
                    base + i64::from(r.offset_delta),
                    h.base_timestamp + r.timestamp_delta,
                ));
            }
        }
        out
    }
}

fn assert_batch_matches(stored: &[u8], expected_base: i64, original: &[u8]) {
    verify_crc(stored).unwrap();
    let h = BatchHeader::parse(stored).unwrap();
    assert_eq!(h.base_offset, expected_base);
    assert_eq!(h.partition_leader_epoch, 7);
    assert_eq!(
        without_assigned_fields(stored),
        without_assigned_fields(original)
    );
}

fn check_transactions(log: &PartitionLog, model: &Model) {
    let view = model.txn_view();
    assert_eq!(
        log.first_unstable_offset(),
        view.open.values().min().copied()
    );
    for &pid in &TXN_PIDS {
        if let Some(entry) = log.producer_state().get(pid) {
            assert_eq!(entry.current_txn_first_offset, view.open.get(&pid).copied());
        } else {
            assert!(!view.open.contains_key(&pid));
        }
    }
    let leo = model.next_offset;
    for fetch in (0..=leo).step_by(5) {
        for upper in (fetch..=leo + 1).step_by(3) {
            assert_eq!(
                log.aborted_transactions(fetch, upper),
                view.expected_aborted(fetch, upper),
                "aborted_transactions({fetch}, {upper})"
            );
        }
    }
}

fn check_everything(log: &PartitionLog, model: &Model) {
    check_transactions(log, model);
    assert_eq!(log.log_end_offset(), model.next_offset);
    let all = log.read(0, usize::MAX, i64::MAX).unwrap();
    let stored: Vec<&[u8]> = batch::batches(&all.records).map(|b| b.unwrap().1).collect();
    assert_eq!(stored.len(), model.batches.len());
    let mut expected_offset = 0;
    for (s, (base, original)) in stored.iter().zip(&model.batches) {
        assert_eq!(*base, expected_offset, "offsets contiguous");
        assert_batch_matches(s, *base, original);
        expected_offset = BatchHeader::parse(s).unwrap().last_offset() + 1;
    }
}

fn run(config: LogConfig, ops: Vec<Op>) {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), config.clone(), NOW)
        .unwrap()
        .0;
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Append(shapes) => {
                let mut request = Vec::new();
                let mut built = Vec::new();
                for s in &shapes {
                    let b = Model::build(s, BatchSpec::default());
                    request.extend_from_slice(&b);
                    built.push(b);
                }
                let info = log.append_as_leader(&request, 7, NOW).unwrap();
                assert_eq!(info.base_offset, model.next_offset);
                for b in built {
                    model.push(b);
                }
                assert_eq!(info.last_offset + 1, model.next_offset);
            }
            Op::AppendIdempotent { pid, shape } => {
                let i = pid as usize;
                let b = Model::build(
                    &shape,
                    BatchSpec::idempotent(pid, 0, model.next_sequence[i], shape.records),
                );
                let info = log.append_as_leader(&b, 7, NOW).unwrap();
                assert!(!info.duplicate);
                let base = model.push(b.clone());
                assert_eq!(info.base_offset, base);
                model.next_sequence[i] += shape.records;
                model.sent[i].push((b, base));
            }
            Op::Retry { pid, back } => {
                let sent = &model.sent[pid as usize];
                if back >= sent.len() {
                    continue;
                }
                let (b, base) = &sent[sent.len() - 1 - back];
                match log.append_as_leader(b, 7, NOW) {
                    Ok(info) => {
                        assert!(back < 5, "batch {back} back is outside the window");
                        assert!(info.duplicate);
                        assert_eq!(info.base_offset, *base);
                    }
                    Err(StorageError::OutOfOrderSequence { .. }) => assert!(back >= 5),
                    Err(e) => panic!("retry: {e}"),
                }
            }
            Op::AppendTransactional { txn, shape } => {
                let pid = TXN_PIDS[txn];
                let b = Model::build(
                    &shape,
                    BatchSpec::transactional(pid, 0, model.txn_next_sequence[txn], shape.records),
                );
                let info = log.append_as_leader(&b, 7, NOW).unwrap();
                assert_eq!(info.base_offset, model.push(b));
                model.txn_next_sequence[txn] += shape.records;
            }
            Op::EndTxn { txn, commit, now } => {
                let marker = EndTxnMarker {
                    producer_id: TXN_PIDS[txn],
                    producer_epoch: 0,
                    coordinator_epoch: 0,
                    commit,
                };
                let info = log.append_txn_marker(&marker, 7, now).unwrap();
                assert_eq!(info.base_offset, model.push(marker.to_batch(now)));
                check_transactions(&log, &model);
            }
            Op::QueryAborted { fetch, upper } => {
                let leo = model.next_offset as usize;
                let fetch = fetch.index(leo + 1) as i64;
                let upper = upper.index(leo + 2) as i64;
                assert_eq!(
                    log.aborted_transactions(fetch, upper),
                    model.txn_view().expected_aborted(fetch, upper),
                    "aborted_transactions({fetch}, {upper})"
                );
            }
            Op::Truncate(n) => {
                let offset = i64::from(n) % (model.next_offset + 1);
                log.truncate_to(offset, NOW).unwrap();
                model.truncate(offset);
                check_everything(&log, &model);
            }
            Op::Read {
                at,
                max_bytes,
                bound,
            } => {
                let leo = model.next_offset;
                let offset = at.index(leo as usize + 1) as i64;
                let max_offset = bound.index(leo as usize + 2) as i64;
                let r = log.read(offset, max_bytes, max_offset).unwrap();
                // Expected: from the batch containing `offset`, whole batches below
                // max_offset, within max_bytes except that the first always fits.
                let mut expected = Vec::new();
                let mut total = 0;
                for (base, b) in &model.batches {
                    let last = base + i64::from(BatchHeader::parse(b).unwrap().last_offset_delta);
                    if last < offset {
                        continue;
                    }
                    if last >= max_offset || (!expected.is_empty() && total + b.len() > max_bytes) {
                        break;
                    }
                    total += b.len();
                    expected.push((*base, b));
                }
                let got: Vec<&[u8]> = batch::batches(&r.records).map(|b| b.unwrap().1).collect();
                assert_eq!(
                    got.len(),
                    expected.len(),
                    "read({offset}, {max_bytes}, {max_offset})"
                );
                for (g, (base, b)) in got.iter().zip(&expected) {
                    assert_batch_matches(g, *base, b);
                }
                assert_eq!(
                    r.first_batch_offset,
                    expected.first().map(|(base, _)| *base)
                );
            }
            Op::FindTimestamp(target) => {
                let records = model.records();
                let expected = records.iter().find(|(_, ts)| *ts >= target).copied();
                assert_eq!(
                    log.offset_for_timestamp(target).unwrap(),
                    expected,
                    "timestamp {target}"
                );
                let max = records.iter().map(|(_, ts)| *ts).max();
                let expected_max =
                    max.and_then(|m| records.iter().find(|(_, ts)| *ts == m).copied());
                assert_eq!(log.max_timestamp_and_offset(), expected_max);
            }
            Op::Flush => {
                log.flush().unwrap();
                assert_eq!(log.flushed_offset(), model.next_offset);
                assert!(log.flush_target().is_none());
            }
            Op::CloseAndReopen => {
                log.close().unwrap();
                let (reopened, report) =
                    PartitionLog::open(dir.path(), config.clone(), NOW).unwrap();
                assert!(report.clean_shutdown);
                assert_eq!(report.bytes_truncated, 0);
                log = reopened;
                check_everything(&log, &model);
            }
            Op::CrashAndReopen { lose_txn_index } => {
                drop(log);
                if lose_txn_index {
                    let active = std::fs::read_dir(dir.path())
                        .unwrap()
                        .map(|e| e.unwrap().path())
                        .filter(|p| p.extension().is_some_and(|e| e == "txnindex"))
                        .max()
                        .unwrap();
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(active)
                        .unwrap()
                        .set_len(0)
                        .unwrap();
                }
                let (reopened, report) =
                    PartitionLog::open(dir.path(), config.clone(), NOW).unwrap();
                assert!(!report.clean_shutdown);
                assert_eq!(report.bytes_truncated, 0, "nothing was damaged");
                log = reopened;
                check_everything(&log, &model);
            }
        }
    }
    check_everything(&log, &model);
    drop(log);
    let log = PartitionLog::open(dir.path(), config, NOW).unwrap().0;
    check_everything(&log, &model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn log_holds_exactly_what_was_appended(config in config(), ops in prop::collection::vec(op(), 1..70)) {
        run(config, ops);
    }
}

/// A truncation that cuts an ABORT marker in the middle of its segment: its
/// transaction is open again and no longer reported as aborted.
#[test]
fn truncating_an_abort_marker_reopens_its_transaction() {
    let shape = BatchShape {
        records: 2,
        value_len: 10,
        base_timestamp: 5,
        timestamp_step: 1,
        seed: 0,
    };
    let config = LogConfig {
        segment_bytes: 4000,
        index_interval_bytes: 100,
        retention_ms: -1,
        producer_id_expiration_ms: i64::MAX,
        ..LogConfig::default()
    };
    let ops = vec![
        Op::AppendTransactional {
            txn: 0,
            shape: shape.clone(),
        },
        Op::Append(vec![shape.clone()]),
        Op::EndTxn {
            txn: 0,
            commit: false,
            now: 6,
        },
        // The marker is at offset 4.
        Op::Truncate(4),
        Op::CrashAndReopen {
            lose_txn_index: true,
        },
    ];
    run(config, ops);
}
