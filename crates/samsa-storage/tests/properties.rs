//! Property tests: random sequences of appends (plain and idempotent, with
//! retries), reads, flushes, clean and unclean reopens, checked against a
//! simple in-memory model of what the log must contain.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use samsa_storage::batch::{self, verify_crc, BatchHeader};
use samsa_storage::testing::{build_batch, without_assigned_fields, BatchSpec};
use samsa_storage::{LogConfig, PartitionLog, StorageError};

const NOW: i64 = 1_700_000_000_000;

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
    Read {
        at: prop::sample::Index,
        max_bytes: usize,
        bound: prop::sample::Index,
    },
    FindTimestamp(i64),
    Flush,
    CloseAndReopen,
    CrashAndReopen,
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
        4 => (any::<prop::sample::Index>(), 0..3000usize, any::<prop::sample::Index>())
            .prop_map(|(at, max_bytes, bound)| Op::Read { at, max_bytes, bound }),
        1 => (-10..10_020i64).prop_map(Op::FindTimestamp),
        1 => Just(Op::Flush),
        1 => Just(Op::CloseAndReopen),
        1 => Just(Op::CrashAndReopen),
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

fn check_everything(log: &PartitionLog, model: &Model) {
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
            Op::CrashAndReopen => {
                drop(log);
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
