//! `samsa dump-log`: print the record batches of segment files the way
//! `kafka-dump-log.sh` does, straight from disk (no broker involved). Also
//! dumps the sparse `.index` and `.timeindex` files next to a segment, and
//! the `.txnindex` (the segment's aborted transactions).
//!
//! Batch headers are read and checked with `samsa_storage::batch` (the same
//! code the broker trusts), records are decoded with kafka-protocol's
//! `RecordBatchDecoder` (which handles compression). A torn or corrupt batch
//! ends the dump of that file with a `corrupt batch at position …` line and
//! exit status 1; nothing here panics on bad input.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Args;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use samsa_storage::batch::{self, BatchHeader, BATCH_HEADER_LEN};
use samsa_storage::txn_index::{TxnIndexCrcMismatch, TxnIndexEntries};

#[derive(Debug, Args)]
pub struct DumpLogArgs {
    /// Segment files (`.log`); `.index`, `.timeindex` and `.txnindex` files are dumped as entries.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Also print every record: offsets, sizes, header keys, key and payload, transaction markers.
    #[arg(long)]
    print_data_log: bool,
}

pub fn run(args: &DumpLogArgs) -> Result<ExitCode> {
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    match dump_files(args, &mut out).and_then(|clean| out.flush().map(|()| clean)) {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::FAILURE),
        // `samsa dump-log … | head` closing the pipe is not a failure.
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(err) => Err(err).context("dump-log failed"),
    }
}

/// Dumps every file; a corrupt file does not stop the others. Returns whether
/// all of them were clean.
fn dump_files<W: Write>(args: &DumpLogArgs, out: &mut W) -> io::Result<bool> {
    let mut all_clean = true;
    for path in &args.files {
        writeln!(out, "Dumping {}", path.display())?;
        let clean = match dump_file(path, out, args.print_data_log) {
            Ok(clean) => clean,
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => return Err(err),
            Err(err) => {
                // Reported in the dump itself so it lines up with the file header.
                out.flush()?;
                eprintln!("error: cannot read {}: {err}", path.display());
                false
            }
        };
        all_clean &= clean;
    }
    Ok(all_clean)
}

fn dump_file<W: Write>(path: &Path, out: &mut W, print_data_log: bool) -> io::Result<bool> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("index") => dump_offset_index(&std::fs::read(path)?, base_offset_of(path), out),
        Some("timeindex") => dump_time_index(&std::fs::read(path)?, base_offset_of(path), out),
        Some("txnindex") => dump_txn_index(&std::fs::read(path)?, out),
        Some("snapshot") => {
            writeln!(
                out,
                "producer state snapshots are storage-internal; dump-log reads .log, .index, .timeindex and .txnindex files"
            )?;
            Ok(false)
        }
        _ => {
            let file = File::open(path)?;
            let len = file.metadata()?.len();
            dump_segment(file, len, out, print_data_log)
        }
    }
}

/// Reads a segment of `len` bytes batch by batch (a segment can be a
/// gigabyte, so it is never loaded whole) and writes one entry per batch.
/// Returns `Ok(false)` after writing a `corrupt batch` line.
pub fn dump_segment<R: Read, W: Write>(
    reader: R,
    len: u64,
    out: &mut W,
    print_data_log: bool,
) -> io::Result<bool> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut position: u64 = 0;
    let mut buf = Vec::new();
    let header_len = BATCH_HEADER_LEN as u64;
    while position < len {
        let remaining = len - position;
        if remaining < header_len {
            corrupt(
                out,
                position,
                &format!(
                    "truncated: {remaining} bytes left, a batch header needs {BATCH_HEADER_LEN}"
                ),
            )?;
            return Ok(false);
        }
        buf.resize(BATCH_HEADER_LEN, 0);
        if !read_or_report(&mut reader, &mut buf, out, position)? {
            return Ok(false);
        }
        let header = match BatchHeader::parse(&buf) {
            Ok(header) => header,
            Err(err) => {
                corrupt(out, position, &err.to_string())?;
                return Ok(false);
            }
        };
        let size = header.total_size() as u64;
        if size > remaining {
            corrupt(
                out,
                position,
                &format!(
                    "truncated: the batch is {size} bytes but only {remaining} remain in the file"
                ),
            )?;
            return Ok(false);
        }
        // `size` <= `remaining` <= the file length, so it fits in memory terms
        // of what the file holds; it is at least the header length by parse().
        let size_usize = header.total_size();
        buf.resize(size_usize, 0);
        if !read_or_report(&mut reader, &mut buf[BATCH_HEADER_LEN..], out, position)? {
            return Ok(false);
        }
        match format_batch(&buf, position, print_data_log) {
            Ok(text) => out.write_all(text.as_bytes())?,
            Err(reason) => {
                corrupt(out, position, &reason)?;
                return Ok(false);
            }
        }
        position += size;
    }
    Ok(true)
}

/// Fills `buf`; a file that shrank under us (a segment being truncated)
/// is reported like a torn batch.
fn read_or_report<R: Read, W: Write>(
    reader: &mut R,
    buf: &mut [u8],
    out: &mut W,
    position: u64,
) -> io::Result<bool> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
            corrupt(out, position, "truncated: the file ended inside the batch")?;
            Ok(false)
        }
        Err(err) => Err(err),
    }
}

fn corrupt<W: Write>(out: &mut W, position: u64, reason: &str) -> io::Result<()> {
    writeln!(out, "corrupt batch at position {position}: {reason}")
}

/// Formats one whole batch (header line, plus one line per record with
/// `print_data_log`), each line ending in `\n`. `Err` carries the reason the
/// batch is corrupt: bad header, size mismatch, CRC mismatch, undecodable records.
pub fn format_batch(batch: &[u8], position: u64, print_data_log: bool) -> Result<String, String> {
    let header = BatchHeader::parse(batch).map_err(|err| err.to_string())?;
    if batch.len() != header.total_size() {
        return Err(format!(
            "the batch is {} bytes but its header says {}",
            batch.len(),
            header.total_size()
        ));
    }
    batch::verify_crc(batch).map_err(|err| err.to_string())?;

    let mut out = batch_line(&header, position);
    out.push('\n');
    if print_data_log {
        let mut bytes = Bytes::copy_from_slice(batch);
        let set = RecordBatchDecoder::decode(&mut bytes)
            .map_err(|err| format!("cannot decode the records: {err}"))?;
        if i32::try_from(set.records.len()).ok() != Some(header.records_count) {
            return Err(format!(
                "the header counts {} records but {} were decoded",
                header.records_count,
                set.records.len()
            ));
        }
        for record in &set.records {
            out.push_str(&record_line(&header, record));
            out.push('\n');
        }
    }
    Ok(out)
}

fn batch_line(h: &BatchHeader, position: u64) -> String {
    // Attribute bit 6: the batch carries a delete horizon (compaction), stored
    // in base_timestamp. Printed the way Java prints an OptionalLong.
    let delete_horizon = if h.attributes & 0x40 != 0 {
        format!("OptionalLong[{}]", h.base_timestamp)
    } else {
        "OptionalLong.empty".to_string()
    };
    format!(
        "baseOffset: {} lastOffset: {} count: {} baseSequence: {} lastSequence: {} \
         producerId: {} producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} \
         isControl: {} deleteHorizonMs: {delete_horizon} position: {position} {}: {} size: {} \
         magic: {} compresscodec: {} crc: {} isvalid: true",
        h.base_offset,
        h.last_offset(),
        h.records_count,
        h.base_sequence,
        h.last_sequence(),
        h.producer_id,
        h.producer_epoch,
        h.partition_leader_epoch,
        h.is_transactional(),
        h.is_control(),
        timestamp_type(h),
        h.max_timestamp,
        h.total_size(),
        h.magic,
        codec_name(h.compression()),
        h.crc,
    )
}

fn record_line(h: &BatchHeader, record: &kafka_protocol::records::Record) -> String {
    let offset_delta = record.offset.wrapping_sub(h.base_offset);
    let sequence = if h.base_sequence < 0 {
        -1
    } else {
        batch::increment_sequence(h.base_sequence, i32::try_from(offset_delta).unwrap_or(0))
    };
    // With log-append time the broker's time is the batch's max timestamp,
    // whatever the record says (Kafka's DefaultRecord.timestamp()).
    let timestamp = if h.timestamp_type_is_log_append() {
        h.max_timestamp
    } else {
        record.timestamp
    };
    let size = |b: &Option<Bytes>| b.as_ref().map_or(-1, |b| b.len() as i64);
    // kafka-protocol keeps headers in a map, so a repeated header key is shown once.
    let header_keys: Vec<&str> = record.headers.keys().map(|k| k.as_str()).collect();
    let mut line = format!(
        "| offset: {} {}: {timestamp} keySize: {} valueSize: {} sequence: {sequence} headerKeys: [{}]",
        record.offset,
        timestamp_type(h),
        size(&record.key),
        size(&record.value),
        header_keys.join(","),
    );
    if h.is_control() {
        line.push_str(&control_marker(
            record.key.as_deref(),
            record.value.as_deref(),
        ));
    } else {
        if let Some(key) = &record.key {
            let _ = write!(line, " key: {}", printable(key));
        }
        if let Some(value) = &record.value {
            let _ = write!(line, " payload: {}", printable(value));
        }
    }
    line
}

/// Control record key: version i16, type i16 (0 = ABORT, 1 = COMMIT);
/// end-transaction marker value: version i16, coordinator epoch i32.
fn control_marker(key: Option<&[u8]>, value: Option<&[u8]>) -> String {
    let be_i16 = |b: &[u8], at: usize| {
        b.get(at..at + 2)
            .and_then(|s| s.try_into().ok())
            .map(i16::from_be_bytes)
    };
    let be_i32 = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .and_then(|s| s.try_into().ok())
            .map(i32::from_be_bytes)
    };
    let Some(kind) = key.and_then(|k| be_i16(k, 2)) else {
        return " controlType: invalid (control key shorter than 4 bytes)".to_string();
    };
    let marker = match kind {
        0 => "ABORT",
        1 => "COMMIT",
        2 => return " controlType: LEADER_CHANGE(2)".to_string(),
        other => return format!(" controlType: UNKNOWN({other})"),
    };
    match value.and_then(|v| be_i32(v, 2)) {
        Some(epoch) => format!(" endTxnMarker: {marker} coordinatorEpoch: {epoch}"),
        None => format!(
            " endTxnMarker: {marker} coordinatorEpoch: invalid (marker value shorter than 6 bytes)"
        ),
    }
}

fn timestamp_type(h: &BatchHeader) -> &'static str {
    if h.timestamp_type_is_log_append() {
        "LogAppendTime"
    } else {
        "CreateTime"
    }
}

fn codec_name(codec: u8) -> String {
    let known = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];
    match known.iter().find(|c| **c as u8 == codec) {
        Some(Compression::None) => "none".into(),
        Some(Compression::Gzip) => "gzip".into(),
        Some(Compression::Snappy) => "snappy".into(),
        Some(Compression::Lz4) => "lz4".into(),
        Some(Compression::Zstd) => "zstd".into(),
        None => format!("unknown({codec})"),
    }
}

/// Keys and payloads are shown as UTF-8 (lossily, as Kafka's string decoder
/// does), with line breaks escaped so each record stays on one line.
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .replace('\\', "\\\\")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// Segment files are named by their base offset (`00000000000000000042.index`).
fn base_offset_of(path: &Path) -> i64 {
    path.file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Offset index: (relative offset u32 BE, file position u32 BE) entries.
fn dump_offset_index<W: Write>(data: &[u8], base: i64, out: &mut W) -> io::Result<bool> {
    let mut chunks = data.chunks_exact(8);
    for (i, entry) in chunks.by_ref().enumerate() {
        let relative = u32::from_be_bytes([entry[0], entry[1], entry[2], entry[3]]);
        let position = u32::from_be_bytes([entry[4], entry[5], entry[6], entry[7]]);
        // Like Kafka: an all-zero entry after the first is preallocated space.
        if i > 0 && relative == 0 && position == 0 {
            return Ok(true);
        }
        writeln!(
            out,
            "offset: {} position: {position}",
            base + i64::from(relative)
        )?;
    }
    if !chunks.remainder().is_empty() {
        writeln!(
            out,
            "corrupt index: {} trailing bytes are not a whole entry",
            chunks.remainder().len()
        )?;
        return Ok(false);
    }
    Ok(true)
}

/// Time index: (timestamp i64 BE, relative offset u32 BE) entries.
fn dump_time_index<W: Write>(data: &[u8], base: i64, out: &mut W) -> io::Result<bool> {
    let mut chunks = data.chunks_exact(12);
    for (i, entry) in chunks.by_ref().enumerate() {
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&entry[..8]);
        let timestamp = i64::from_be_bytes(ts);
        let relative = u32::from_be_bytes([entry[8], entry[9], entry[10], entry[11]]);
        if i > 0 && timestamp == 0 && relative == 0 {
            return Ok(true);
        }
        writeln!(
            out,
            "timestamp: {timestamp} offset: {}",
            base + i64::from(relative)
        )?;
    }
    if !chunks.remainder().is_empty() {
        writeln!(
            out,
            "corrupt time index: {} trailing bytes are not a whole entry",
            chunks.remainder().len()
        )?;
        return Ok(false);
    }
    Ok(true)
}

/// Transaction index: one line per aborted transaction, in marker order,
/// read with the storage crate's reader (the one owner of the layout). A
/// torn tail or an entry whose CRC does not match ends the dump with a
/// `corrupt transaction index` line.
fn dump_txn_index<W: Write>(data: &[u8], out: &mut W) -> io::Result<bool> {
    let mut entries = TxnIndexEntries::new(data);
    for (i, entry) in entries.by_ref().enumerate() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(TxnIndexCrcMismatch { stored, computed }) => {
                writeln!(
                    out,
                    "corrupt transaction index: entry {i} has crc {stored:#010x}, computed {computed:#010x}"
                )?;
                return Ok(false);
            }
        };
        writeln!(
            out,
            "version: {} producerId: {} firstOffset: {} lastOffset: {} lastStableOffset: {}",
            entry.version,
            entry.producer_id,
            entry.first_offset,
            entry.last_offset,
            entry.last_stable_offset,
        )?;
    }
    if entries.trailing_bytes() != 0 {
        writeln!(
            out,
            "corrupt transaction index: {} trailing bytes are not a whole entry",
            entries.trailing_bytes()
        )?;
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    /// A record as the encoder wants it. The encoder starts a new batch when
    /// `offset - sequence` changes, so non-idempotent records (base sequence
    /// -1) carry `sequence = offset_delta - 1`, which encodes base sequence -1.
    fn record(offset: i64, base_offset: i64, base_sequence: i32) -> Record {
        let delta = (offset - base_offset) as i32;
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 3,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: if base_sequence < 0 {
                delta - 1
            } else {
                base_sequence + delta
            },
            timestamp: 1_700_000_000_000 + offset,
            key: None,
            value: None,
            headers: Default::default(),
        }
    }

    fn encode(records: &[Record]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        buf.to_vec()
    }

    fn plain_batch() -> Vec<u8> {
        let mut a = record(0, 0, -1);
        a.key = Some(Bytes::from_static(b"k0"));
        a.value = Some(Bytes::from_static(b"hello"));
        a.headers.insert(
            StrBytes::from_static_str("h1"),
            Some(Bytes::from_static(b"x")),
        );
        let mut b = record(1, 0, -1);
        b.value = Some(Bytes::from_static(b"line\nbreak"));
        let c = record(2, 0, -1);
        encode(&[a, b, c])
    }

    fn transactional_batches() -> (Vec<u8>, Vec<u8>) {
        let data: Vec<Record> = (10..13)
            .map(|o| {
                let mut r = record(o, 10, 5);
                r.transactional = true;
                r.producer_id = 1000;
                r.producer_epoch = 2;
                r.value = Some(Bytes::from(format!("v{o}")));
                r
            })
            .collect();
        let mut marker = record(13, 13, -1);
        marker.transactional = true;
        marker.control = true;
        marker.producer_id = 1000;
        marker.producer_epoch = 2;
        marker.key = Some(Bytes::from_static(&[0, 0, 0, 1]));
        marker.value = Some(Bytes::from_static(&[0, 0, 0, 0, 0, 7]));
        (encode(&data), encode(&[marker]))
    }

    #[test]
    fn plain_batch_header_line() {
        let batch = plain_batch();
        let text = format_batch(&batch, 0, false).unwrap();
        let crc = BatchHeader::parse(&batch).unwrap().crc;
        assert_eq!(
            text,
            format!(
                "baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 \
                 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 3 isTransactional: false \
                 isControl: false deleteHorizonMs: OptionalLong.empty position: 0 \
                 CreateTime: 1700000000002 size: {} magic: 2 compresscodec: none crc: {crc} \
                 isvalid: true\n",
                batch.len()
            )
        );
    }

    #[test]
    fn plain_batch_records() {
        let batch = plain_batch();
        let text = format_batch(&batch, 128, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains("position: 128 "));
        assert_eq!(
            lines[1],
            "| offset: 0 CreateTime: 1700000000000 keySize: 2 valueSize: 5 sequence: -1 \
             headerKeys: [h1] key: k0 payload: hello"
        );
        assert_eq!(
            lines[2],
            "| offset: 1 CreateTime: 1700000000001 keySize: -1 valueSize: 10 sequence: -1 \
             headerKeys: [] payload: line\\nbreak"
        );
        assert_eq!(
            lines[3],
            "| offset: 2 CreateTime: 1700000000002 keySize: -1 valueSize: -1 sequence: -1 headerKeys: []"
        );
    }

    #[test]
    fn transactional_batch_and_commit_marker() {
        let (data, marker) = transactional_batches();
        let text = format_batch(&data, 0, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with(
                "baseOffset: 10 lastOffset: 12 count: 3 baseSequence: 5 lastSequence: 7 \
                 producerId: 1000 producerEpoch: 2 partitionLeaderEpoch: 3 isTransactional: true \
                 isControl: false "
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[2].contains("sequence: 6 headerKeys: [] payload: v11"),
            "{}",
            lines[2]
        );

        let text = format_batch(&marker, data.len() as u64, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("isTransactional: true isControl: true"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].ends_with("keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 7"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn control_markers() {
        assert_eq!(
            control_marker(Some(&[0, 0, 0, 0]), Some(&[0, 0, 0, 0, 0, 1])),
            " endTxnMarker: ABORT coordinatorEpoch: 1"
        );
        assert!(control_marker(Some(&[0]), None).contains("invalid"));
        assert!(control_marker(Some(&[0, 0, 0, 1]), Some(&[0])).contains("invalid"));
        assert_eq!(
            control_marker(Some(&[0, 0, 0, 9]), None),
            " controlType: UNKNOWN(9)"
        );
    }

    #[test]
    fn segment_with_torn_tail() {
        let a = plain_batch();
        let (b, c) = transactional_batches();
        let mut segment = [a.clone(), b.clone(), c.clone()].concat();
        let clean_len = segment.len();
        segment.extend_from_slice(&c[..30]);

        let mut out = Vec::new();
        let clean = dump_segment(&segment[..clean_len], clean_len as u64, &mut out, false).unwrap();
        assert!(clean);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .contains(&format!("position: {} ", a.len())));

        let mut out = Vec::new();
        let clean = dump_segment(&segment[..], segment.len() as u64, &mut out, true).unwrap();
        assert!(!clean);
        let text = String::from_utf8(out).unwrap();
        let last = text.lines().last().unwrap();
        assert_eq!(
            last,
            format!("corrupt batch at position {clean_len}: truncated: 30 bytes left, a batch header needs 61")
        );

        // A whole header whose batch runs past the end of the file.
        let torn = [a.clone(), b[..b.len() - 1].to_vec()].concat();
        let mut out = Vec::new();
        assert!(!dump_segment(&torn[..], torn.len() as u64, &mut out, false).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.lines()
                .last()
                .unwrap()
                .starts_with(&format!("corrupt batch at position {}: truncated", a.len())),
            "{text}"
        );
    }

    #[test]
    fn crc_mismatch_stops_the_dump() {
        let a = plain_batch();
        let mut b = plain_batch();
        let last = b.len() - 1;
        b[last] ^= 0xff;
        let segment = [a.clone(), b, a.clone()].concat();
        let mut out = Vec::new();
        assert!(!dump_segment(&segment[..], segment.len() as u64, &mut out, false).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines()
                .last()
                .unwrap()
                .starts_with(&format!("corrupt batch at position {}: ", a.len())),
            "{text}"
        );
    }

    #[test]
    fn garbage_is_reported_not_panicked_on() {
        let garbage = [0xA5u8; 200];
        let mut out = Vec::new();
        assert!(!dump_segment(&garbage[..], 200, &mut out, true).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("corrupt batch at position 0: "), "{text}");
    }

    #[test]
    fn storage_built_batches() {
        use samsa_storage::testing::BatchSpec;
        // Idempotent, log-append-time, sequence wrapping past i32::MAX.
        let idempotent = BatchSpec {
            base_offset: 40,
            partition_leader_epoch: 9,
            log_append_time: true,
            base_timestamp: 1_000,
            ..BatchSpec::idempotent(77, 4, i32::MAX - 1, 3)
        }
        .build();
        let text = format_batch(&idempotent, 0, true).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[0].starts_with(&format!(
                "baseOffset: 40 lastOffset: 42 count: 3 baseSequence: {} lastSequence: 0 \
                 producerId: 77 producerEpoch: 4 partitionLeaderEpoch: 9 isTransactional: false \
                 isControl: false deleteHorizonMs: OptionalLong.empty position: 0 LogAppendTime: 1002 ",
                i32::MAX - 1
            )),
            "{}",
            lines[0]
        );
        // With log-append time every record shows the batch's timestamp.
        assert!(lines[1].starts_with(
            "| offset: 40 LogAppendTime: 1002 keySize: -1 valueSize: 16 sequence: 2147483646 "
        ));
        assert!(lines[2].contains(" sequence: 2147483647 "), "{}", lines[2]);
        assert!(lines[3].contains(" sequence: 0 "), "{}", lines[3]);

        // A segment of builder batches back to back: positions add up.
        let first = BatchSpec::default().build();
        let second = BatchSpec {
            base_offset: 1,
            record_count: 5,
            ..BatchSpec::default()
        }
        .build();
        let segment = [first.clone(), second].concat();
        let mut out = Vec::new();
        assert!(dump_segment(&segment[..], segment.len() as u64, &mut out, false).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.lines().nth(1).unwrap().starts_with(&format!(
            "baseOffset: 1 lastOffset: 5 count: 5 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: -1 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty position: {} ",
            first.len()
        )));
    }

    #[test]
    fn transaction_index() {
        // Built by hand from the documented format (`samsa_storage::txn_index`),
        // so the test also checks that the reader reads that format.
        let mut entry = Vec::new();
        entry.extend_from_slice(&0i16.to_be_bytes());
        for v in [1000i64, 4, 5, 6] {
            entry.extend_from_slice(&v.to_be_bytes());
        }
        let crc = crc32c::crc32c(&entry);
        entry.extend_from_slice(&crc.to_be_bytes());
        let mut two = entry.clone();
        two.extend_from_slice(&entry);
        let mut out = Vec::new();
        assert!(dump_txn_index(&two, &mut out).unwrap());
        let line = "version: 0 producerId: 1000 firstOffset: 4 lastOffset: 5 lastStableOffset: 6\n";
        assert_eq!(String::from_utf8(out).unwrap(), line.repeat(2));

        let mut bad = entry.clone();
        bad[12] ^= 1;
        let mut out = Vec::new();
        assert!(!dump_txn_index(&bad, &mut out).unwrap());
        assert!(String::from_utf8(out)
            .unwrap()
            .starts_with("corrupt transaction index: entry 0 has crc"));

        let mut out = Vec::new();
        assert!(!dump_txn_index(&two[..50], &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("version: 0 producerId: 1000"), "{text}");
        assert!(
            text.ends_with("corrupt transaction index: 12 trailing bytes are not a whole entry\n")
        );
    }

    #[test]
    fn indexes() {
        let mut index = Vec::new();
        for (rel, pos) in [(0u32, 0u32), (40, 4096), (0, 0)] {
            index.extend_from_slice(&rel.to_be_bytes());
            index.extend_from_slice(&pos.to_be_bytes());
        }
        let mut out = Vec::new();
        assert!(dump_offset_index(&index, 100, &mut out).unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "offset: 100 position: 0\noffset: 140 position: 4096\n"
        );

        let mut time = Vec::new();
        time.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        time.extend_from_slice(&7u32.to_be_bytes());
        time.push(1);
        let mut out = Vec::new();
        assert!(!dump_time_index(&time, 100, &mut out).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("timestamp: 1700000000000 offset: 107\ncorrupt time index"));
        assert_eq!(
            base_offset_of(Path::new("/x/00000000000000000042.index")),
            42
        );
    }
}
