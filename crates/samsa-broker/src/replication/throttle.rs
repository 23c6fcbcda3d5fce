//! The reassignment throttle: `leader.replication.throttled.rate` (bytes/s
//! a leader sends to replicas a reassignment is adding) and
//! `follower.replication.throttled.rate` (bytes/s a broker fetches for
//! the partitions it is being added to), dynamic broker configs.
//!
//! Kafka applies the rates to the replicas named in the topic configs
//! `*.replication.throttled.replicas`, which `kafka-reassign-partitions.sh`
//! sets to the moving replicas; samsa throttles exactly those, the adding
//! replicas' catch-up traffic, without the topic configs. Replication of
//! in-sync replicas is never throttled, so acks=all latency does not
//! depend on a move.
//!
//! Each rate is a token bucket holding at most one second of bytes: a
//! fetch may take records while the bucket is not empty, and what it took
//! is debited after (it may go below zero), so the average stays at the
//! rate and a throttled replica still moves one batch at a time. As in
//! Kafka, a throttled partition is answered (or asked) without records
//! for that round; nothing waits.

use std::sync::Mutex;
use std::time::Instant;

/// One rate's bucket.
#[derive(Debug)]
pub struct ByteRate {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled: Instant,
    rate: Option<u64>,
}

impl Default for ByteRate {
    fn default() -> Self {
        Self {
            state: Mutex::new(Bucket {
                tokens: 0.0,
                refilled: Instant::now(),
                rate: None,
            }),
        }
    }
}

impl ByteRate {
    /// Whether a throttled transfer may take bytes now under `rate`
    /// (bytes/s; `None` is unthrottled).
    pub fn admits(&self, rate: Option<u64>, now: Instant) -> bool {
        let Some(rate) = rate else { return true };
        let mut bucket = self.state.lock().unwrap_or_else(|p| p.into_inner());
        bucket.refill(Some(rate), now);
        bucket.tokens > 0.0
    }

    /// Debits `bytes` a throttled transfer took.
    pub fn spend(&self, bytes: usize) {
        let mut bucket = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if bucket.rate.is_some() {
            bucket.tokens -= bytes as f64;
        }
    }
}

impl Bucket {
    fn refill(&mut self, rate: Option<u64>, now: Instant) {
        if rate != self.rate {
            // A new rate starts with a full second's worth.
            self.rate = rate;
            self.tokens = rate.map_or(0.0, |r| r as f64);
            self.refilled = now;
            return;
        }
        let Some(rate) = rate else { return };
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * rate as f64).min(rate as f64);
    }
}

/// The two rates of one broker.
#[derive(Debug, Default)]
pub struct ReplicationThrottles {
    /// What this broker sends, as leader, to adding replicas.
    pub leader: ByteRate,
    /// What this broker fetches for partitions it is being added to.
    pub follower: ByteRate,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_average_stays_at_the_rate() {
        let rate = ByteRate::default();
        let start = Instant::now();
        assert!(rate.admits(None, start), "unthrottled");
        let mut moved = 0usize;
        // 10 s of 100 KiB chunks against 1 MB/s, polled every 10 ms.
        for step in 0..1_000u64 {
            let now = start + Duration::from_millis(step * 10);
            if rate.admits(Some(1_000_000), now) {
                rate.spend(100 * 1024);
                moved += 100 * 1024;
            }
        }
        // One second's burst plus ten seconds at the rate, one chunk over at most.
        assert!(moved <= 11_000_000 + 100 * 1024, "{moved}");
        assert!(moved >= 10_000_000, "{moved}");
    }
}
