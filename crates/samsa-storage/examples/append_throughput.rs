//! Produce-path throughput of one partition log: ~1 MiB batches of 1 KiB
//! records appended as leader, then read back.
//!
//! `cargo run --release -p samsa-storage --example append_throughput -- [MiB] [dir]`
//! (default 2048 MiB in a temporary directory under the current directory).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use samsa_storage::testing::{build_batch, BatchSpec};
use samsa_storage::{LogConfig, PartitionLog};

fn main() {
    let mut args = std::env::args().skip(1);
    let total_mib: usize = args.next().map_or(2048, |a| a.parse().expect("MiB"));
    let base = args
        .next()
        .map_or_else(|| std::env::current_dir().unwrap(), Into::into);
    let dir = tempfile::tempdir_in(base).unwrap();

    let batch = build_batch(&BatchSpec {
        record_count: 1000,
        value_len: 1024 - 10,
        base_timestamp: 1_700_000_000_000,
        timestamp_step: 0,
        ..BatchSpec::default()
    });
    let batches = total_mib * 1024 * 1024 / batch.len();
    println!(
        "batch: {} bytes, {} records; {} batches",
        batch.len(),
        1000,
        batches
    );

    let now = 1_700_000_000_000;
    let (mut log, _) = PartitionLog::open(dir.path(), LogConfig::default(), now).unwrap();
    let started = Instant::now();
    for _ in 0..batches {
        log.append_as_leader(&batch, 0, now).unwrap();
    }
    let append = started.elapsed();
    log.flush().unwrap();
    let with_flush = started.elapsed();
    let bytes = (batches * batch.len()) as f64;
    let mb = |secs: f64| bytes / secs / 1e6;
    println!(
        "append: {:.0} MB/s ({:.2} s); including final fsync: {:.0} MB/s",
        mb(append.as_secs_f64()),
        append.as_secs_f64(),
        mb(with_flush.as_secs_f64())
    );

    let started = Instant::now();
    let mut offset = 0;
    let mut read = 0usize;
    while offset < log.log_end_offset() {
        let r = log.read(offset, 1024 * 1024, i64::MAX).unwrap();
        read += r.records.len();
        let last = samsa_storage::batch::batches(&r.records)
            .last()
            .unwrap()
            .unwrap()
            .0;
        offset = last.last_offset() + 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "read (1 MiB fetches, CRC checked): {:.0} MB/s",
        read as f64 / elapsed / 1e6
    );
    log.close().unwrap();
}
