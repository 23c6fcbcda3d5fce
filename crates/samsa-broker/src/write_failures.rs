//! Whether a partition's log writes are failing (a full or failing disk).
//!
//! A full disk makes every write fail, and a busy producer or a follower
//! retries at once; three things must then not happen once per failed
//! write: the log line (one when writes start failing, one when they work
//! again), a follower's retries (exponential back-off between attempts),
//! and what the metrics count. [`WriteFailures`] keeps that state; time is
//! passed in.
//!
//! It also remembers when a write last failed, for the produce path's
//! answer to a batch that skips ahead of its producer's sequence just after
//! a refused write ([`WriteFailures::failed_within`]): the skipped batch is
//! most likely the one the disk refused, still to be retried.
//!
//! Invariant: `failing` is `Some` exactly from a failed write to the next
//! write that succeeds; `last_failure` is the time of the latest failed
//! write and outlives the recovery.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use samsa_storage::StorageError;
use tokio::time::Instant;

use crate::error::PartitionError;

/// First pause of a follower after a failed write; doubled per failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest pause: how long a follower may take to notice freed space.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
struct Failing {
    since: Instant,
    failed_writes: u64,
    retry_at: Instant,
}

/// What a write did to the state, for the caller to log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The first failure after working writes.
    StartedFailing,
    StillFailing,
    /// The first success after failures.
    Recovered {
        failed_writes: u64,
        failing_for: Duration,
    },
    Working,
}

#[derive(Debug, Default)]
pub struct WriteFailures {
    failing: Mutex<Option<Failing>>,
    last_failure: Mutex<Option<Instant>>,
    /// Failed writes since the broker started.
    total: AtomicU64,
}

/// Whether an error says the disk refused a write (as opposed to a refused
/// request, a role change or corruption).
pub fn is_write_failure(error: &PartitionError) -> bool {
    matches!(
        error,
        PartitionError::Storage(StorageError::Io { .. }) | PartitionError::Flush(_)
    )
}

impl WriteFailures {
    pub fn failed(&self, now: Instant) -> WriteOutcome {
        self.total.fetch_add(1, Ordering::Relaxed);
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let (outcome, since, failed_writes) = match *failing {
            Some(f) => (WriteOutcome::StillFailing, f.since, f.failed_writes + 1),
            None => (WriteOutcome::StartedFailing, now, 1),
        };
        let exponent = u32::try_from(failed_writes - 1).unwrap_or(u32::MAX).min(16);
        let backoff = FIRST_BACKOFF.saturating_mul(1 << exponent).min(MAX_BACKOFF);
        *failing = Some(Failing {
            since,
            failed_writes,
            retry_at: now + backoff,
        });
        outcome
    }

    pub fn succeeded(&self, now: Instant) -> WriteOutcome {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        match failing.take() {
            Some(f) => WriteOutcome::Recovered {
                failed_writes: f.failed_writes,
                failing_for: now.saturating_duration_since(f.since),
            },
            None => WriteOutcome::Working,
        }
    }

    /// Until when a follower should wait before its next write attempt.
    pub fn retry_at(&self) -> Option<Instant> {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|f| f.retry_at)
    }

    /// Whether writes are failing still, or the last failed within
    /// `window` before `now`.
    pub fn failed_within(&self, now: Instant, window: Duration) -> bool {
        self.is_failing()
            || self
                .last_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|at| now.saturating_duration_since(at) <= window)
    }

    pub fn is_failing(&self) -> bool {
        self.retry_at().is_some()
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_state_changes_once_and_backs_off_exponentially() {
        let w = WriteFailures::default();
        let t0 = Instant::now();
        assert_eq!(w.succeeded(t0), WriteOutcome::Working);
        assert!(!w.is_failing());
        assert_eq!(w.failed(t0), WriteOutcome::StartedFailing);
        assert_eq!(w.retry_at(), Some(t0 + FIRST_BACKOFF));
        assert_eq!(w.failed(t0), WriteOutcome::StillFailing);
        assert_eq!(w.retry_at(), Some(t0 + FIRST_BACKOFF * 2));
        for _ in 0..100 {
            assert_eq!(w.failed(t0), WriteOutcome::StillFailing);
        }
        assert_eq!(w.retry_at(), Some(t0 + MAX_BACKOFF));
        let later = t0 + Duration::from_secs(7);
        assert_eq!(
            w.succeeded(later),
            WriteOutcome::Recovered {
                failed_writes: 102,
                failing_for: Duration::from_secs(7)
            }
        );
        assert_eq!(w.retry_at(), None);
        assert_eq!(w.succeeded(later), WriteOutcome::Working);
        assert_eq!(w.failed(later), WriteOutcome::StartedFailing);
        assert_eq!(w.total(), 103);
    }

    #[test]
    fn remembers_the_last_failure_past_the_recovery() {
        let w = WriteFailures::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(30);
        assert!(!w.failed_within(t0, window));
        w.failed(t0);
        assert!(
            w.failed_within(t0 + window * 10, window),
            "still failing: no write has worked since"
        );
        w.succeeded(t0 + Duration::from_secs(1));
        assert!(w.failed_within(t0 + window, window));
        assert!(!w.failed_within(t0 + window + Duration::from_millis(1), window));
    }

    #[test]
    fn only_disk_errors_count_as_write_failures() {
        let io = PartitionError::Storage(StorageError::Io {
            path: "/d".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert!(is_write_failure(&io));
        assert!(is_write_failure(&PartitionError::Flush(
            std::io::Error::other("x")
        )));
        assert!(!is_write_failure(&PartitionError::Closed("t-0".into())));
        assert!(!is_write_failure(&PartitionError::Storage(
            StorageError::InvalidRecord("x".into())
        )));
    }
}
