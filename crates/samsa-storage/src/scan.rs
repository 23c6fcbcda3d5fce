//! Sequential scanning of the batches in a segment file with few, large reads.
//!
//! Used by recovery (full batches, CRC checked by the caller), by index
//! positioning on reads and by producer-state replay (headers only). The
//! scanner frames batches and reports where framing fails; it never judges
//! contents: offset continuity and CRC are the caller's rules.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::batch::{BatchError, BatchHeader, BATCH_HEADER_LEN};

/// Read size for header-only scans: a few index intervals of small batches.
pub(crate) const HEADER_SCAN_CHUNK: usize = 16 * 1024;
/// Read size for full-batch scans.
pub(crate) const BATCH_SCAN_CHUNK: usize = 1024 * 1024;

/// Where framing stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FramingError {
    pub position: u64,
    pub error: BatchError,
}

pub(crate) struct BatchScanner<'f> {
    file: &'f File,
    /// Position of the next batch.
    position: u64,
    /// Scan limit: the segment's valid size, or the file length in recovery.
    end: u64,
    chunk: usize,
    buf: Vec<u8>,
    /// File position of `buf[0]`.
    buf_start: u64,
}

impl<'f> BatchScanner<'f> {
    pub fn new(file: &'f File, start: u64, end: u64, chunk: usize) -> Self {
        BatchScanner {
            file,
            position: start,
            end,
            chunk,
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    /// Position of the next batch: after a framing error, where it happened.
    #[cfg(test)]
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Makes `buf` cover `[position, position + len)`; `len <= end - position`.
    fn fill(&mut self, position: u64, len: usize) -> io::Result<()> {
        let covered_end = self.buf_start + self.buf.len() as u64;
        if position >= self.buf_start && position + len as u64 <= covered_end {
            return Ok(());
        }
        let available = self.end - position;
        let read_len = (len.max(self.chunk) as u64).min(available) as usize;
        self.buf.resize(read_len, 0);
        self.file.read_exact_at(&mut self.buf, position)?;
        self.buf_start = position;
        Ok(())
    }

    fn frame(&mut self) -> io::Result<Option<Result<BatchHeader, FramingError>>> {
        if self.position >= self.end {
            return Ok(None);
        }
        let available = self.end - self.position;
        let position = self.position;
        let fail = |error| Ok(Some(Err(FramingError { position, error })));
        if available < BATCH_HEADER_LEN as u64 {
            return fail(BatchError::Truncated {
                needed: BATCH_HEADER_LEN,
                available: available as usize,
            });
        }
        self.fill(self.position, BATCH_HEADER_LEN)?;
        let at = (self.position - self.buf_start) as usize;
        let header = match BatchHeader::parse(&self.buf[at..]) {
            Ok(header) => header,
            Err(error) => return fail(error),
        };
        if header.total_size() as u64 > available {
            return fail(BatchError::Truncated {
                needed: header.total_size(),
                available: available as usize,
            });
        }
        Ok(Some(Ok(header)))
    }

    /// The next batch's position and header, reading as little as possible.
    pub fn next_header(&mut self) -> io::Result<Option<Result<(u64, BatchHeader), FramingError>>> {
        Ok(self.frame()?.map(|framed| {
            framed.map(|header| {
                let position = self.position;
                self.position += header.total_size() as u64;
                (position, header)
            })
        }))
    }

    /// The next batch's position, header and bytes.
    #[allow(clippy::type_complexity)]
    pub fn next_batch(
        &mut self,
    ) -> io::Result<Option<Result<(u64, BatchHeader, &[u8]), FramingError>>> {
        let header = match self.frame()? {
            None => return Ok(None),
            Some(Err(e)) => return Ok(Some(Err(e))),
            Some(Ok(header)) => header,
        };
        let position = self.position;
        let total = header.total_size();
        self.fill(position, total)?;
        self.position += total as u64;
        let at = (position - self.buf_start) as usize;
        Ok(Some(Ok((position, header, &self.buf[at..at + total]))))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::testing::{build_batch, BatchSpec};
    use std::io::Write;

    fn file_with(batches: &[Vec<u8>], tail: &[u8]) -> (tempfile::NamedTempFile, u64) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for b in batches {
            f.write_all(b).unwrap();
        }
        f.write_all(tail).unwrap();
        f.flush().unwrap();
        let len = f.as_file().metadata().unwrap().len();
        (f, len)
    }

    fn sample(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                build_batch(&BatchSpec {
                    base_offset: i as i64 * 2,
                    record_count: 2,
                    value_len: 10 + i * 37,
                    ..BatchSpec::default()
                })
            })
            .collect()
    }

    #[test]
    fn scans_all_batches_with_tiny_chunks() {
        let batches = sample(20);
        let (f, len) = file_with(&batches, &[]);
        for chunk in [1, 61, 100, 4096] {
            let mut s = BatchScanner::new(f.as_file(), 0, len, chunk);
            let mut seen = Vec::new();
            while let Some(item) = s.next_batch().unwrap() {
                let (_, h, bytes) = item.unwrap();
                assert_eq!(h.total_size(), bytes.len());
                seen.push(bytes.to_vec());
            }
            assert_eq!(seen, batches);
            let mut s = BatchScanner::new(f.as_file(), 0, len, chunk);
            let mut count = 0;
            while let Some(item) = s.next_header().unwrap() {
                let (pos, h) = item.unwrap();
                assert_eq!(h.base_offset, count * 2);
                assert!(pos < len);
                count += 1;
            }
            assert_eq!(count, 20);
        }
    }

    #[test]
    fn reports_torn_tail_and_garbage_with_position() {
        let batches = sample(3);
        let good: u64 = batches.iter().map(|b| b.len() as u64).sum();
        let (f, len) = file_with(&batches, &batches[0][..70]);
        let mut s = BatchScanner::new(f.as_file(), 0, len, 64);
        for _ in 0..3 {
            s.next_batch().unwrap().unwrap().unwrap();
        }
        let err = s.next_batch().unwrap().unwrap().unwrap_err();
        assert_eq!(err.position, good);
        assert!(matches!(err.error, BatchError::Truncated { .. }));
        assert_eq!(s.position(), good);

        let (f, len) = file_with(&batches, &[0u8; 100]);
        let mut s = BatchScanner::new(f.as_file(), 0, len, 64);
        for _ in 0..3 {
            s.next_header().unwrap().unwrap().unwrap();
        }
        let err = s.next_header().unwrap().unwrap().unwrap_err();
        assert_eq!(err.position, good);
        assert_eq!(err.error, BatchError::UnsupportedMagic(0));
    }
}
