//! What the replication and storage paths record as they run: ISR shrinks
//! and expansions (Kafka: ReplicaManager IsrShrinksPerSec /
//! IsrExpandsPerSec), log flush (fsync) latency (Kafka: LogFlushStats
//! LogFlushRateAndTimeMs) and the requests parked until followers or new
//! data answer them (Kafka: DelayedOperationPurgatory PurgatorySize for
//! Produce and Fetch), and a follower's fetches from each leader (Kafka:
//! FetcherStats RequestsPerSec / BytesPerSec). The per-partition figures (offsets, sizes, ISR
//! state, follower lag) are read when scraped, not recorded here.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::latency_buckets;

/// Why the idempotence checks of a partition leader refused a batch.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Rejection {
    /// OUT_OF_ORDER_SEQUENCE_NUMBER: a gap after the producer's last sequence.
    OutOfOrderSequence,
    /// INVALID_PRODUCER_EPOCH: an epoch older than the partition's.
    InvalidProducerEpoch,
    /// A transaction marker from a coordinator epoch older than the last.
    CoordinatorFenced,
    /// A transactional batch whose transaction the coordinator did not
    /// confirm (KIP-890 verification).
    TxnNotVerified,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaderLabels {
    leader: String,
}

/// One follower fetch loop's meters (its leader's series), resolved once.
#[derive(Debug, Clone)]
pub struct ReplicaFetcherMeters {
    requests: Counter,
    bytes: Counter,
    failures: Counter,
}

impl ReplicaFetcherMeters {
    /// A fetch was answered with `bytes` bytes of records.
    pub fn fetched(&self, bytes: usize) {
        self.requests.inc();
        self.bytes.inc_by(bytes as u64);
    }

    /// A fetch got no answer (transport error, timeout, leader gone).
    pub fn failed(&self) {
        self.requests.inc();
        self.failures.inc();
    }
}

/// The replication and storage meters, registered once.
#[derive(Debug, Clone)]
pub struct PartitionMetrics {
    isr_shrinks: Counter,
    isr_expands: Counter,
    flush_seconds: Histogram,
    produce_purgatory: Gauge,
    fetch_purgatory: Gauge,
    fetch_sessions: Gauge,
    fetch_session_partitions: Gauge,
    fetch_session_evictions: Counter,
    rejections: Family<ReasonLabels, Counter>,
    replica_fetches: Family<LeaderLabels, Counter>,
    replica_fetch_bytes: Family<LeaderLabels, Counter>,
    replica_fetch_failures: Family<LeaderLabels, Counter>,
}

impl PartitionMetrics {
    pub fn register(registry: &mut Registry) -> PartitionMetrics {
        let metrics = PartitionMetrics {
            isr_shrinks: Counter::default(),
            isr_expands: Counter::default(),
            flush_seconds: Histogram::new(latency_buckets()),
            produce_purgatory: Gauge::default(),
            fetch_purgatory: Gauge::default(),
            fetch_sessions: Gauge::default(),
            fetch_session_partitions: Gauge::default(),
            fetch_session_evictions: Counter::default(),
            rejections: Family::default(),
            replica_fetches: Family::default(),
            replica_fetch_bytes: Family::default(),
            replica_fetch_failures: Family::default(),
        };
        registry.register(
            "samsa_isr_shrinks",
            "ISR changes the controller accepted that removed replicas from a partition this broker leads (Kafka: ReplicaManager IsrShrinksPerSec)",
            metrics.isr_shrinks.clone(),
        );
        registry.register(
            "samsa_isr_expands",
            "ISR changes the controller accepted that added replicas to a partition this broker leads (Kafka: ReplicaManager IsrExpandsPerSec)",
            metrics.isr_expands.clone(),
        );
        registry.register(
            "samsa_log_flush_duration_seconds",
            "Time of one log flush: the fdatasync of a partition's unflushed segments (Kafka: LogFlushStats LogFlushRateAndTimeMs)",
            metrics.flush_seconds.clone(),
        );
        registry.register(
            "samsa_produce_purgatory_size",
            "acks=all produce requests waiting for their partitions' followers (Kafka: DelayedOperationPurgatory PurgatorySize, Produce)",
            metrics.produce_purgatory.clone(),
        );
        registry.register(
            "samsa_fetch_purgatory_size",
            "Fetch requests waiting for new data or their max wait (Kafka: DelayedOperationPurgatory PurgatorySize, Fetch)",
            metrics.fetch_purgatory.clone(),
        );
        registry.register(
            "samsa_fetch_sessions",
            "Fetch sessions (KIP-227) this broker keeps for its clients (Kafka: FetchSessionCache NumIncrementalFetchSessions)",
            metrics.fetch_sessions.clone(),
        );
        registry.register(
            "samsa_fetch_session_partitions",
            "Partitions held by all fetch sessions (Kafka: FetchSessionCache NumIncrementalFetchPartitionsCached)",
            metrics.fetch_session_partitions.clone(),
        );
        registry.register(
            "samsa_fetch_session_evictions",
            "Fetch sessions evicted to give their slot to a new one (Kafka: FetchSessionCache IncrementalFetchSessionEvictionsPerSec)",
            metrics.fetch_session_evictions.clone(),
        );
        registry.register(
            "samsa_produce_sequence_rejections",
            "Produce batches the idempotence checks of a partition leader refused, by reason: out_of_order_sequence, invalid_producer_epoch, coordinator_fenced, txn_not_verified",
            metrics.rejections.clone(),
        );
        registry.register(
            "samsa_replica_fetch_requests",
            "Fetches this broker sent as a follower, by leader (Kafka: FetcherStats RequestsPerSec)",
            metrics.replica_fetches.clone(),
        );
        registry.register(
            "samsa_replica_fetch_bytes",
            "Record bytes this broker fetched as a follower, by leader (Kafka: FetcherStats BytesPerSec)",
            metrics.replica_fetch_bytes.clone(),
        );
        registry.register(
            "samsa_replica_fetch_failures",
            "Fetches this broker sent as a follower that got no answer (transport error, timeout), by leader",
            metrics.replica_fetch_failures.clone(),
        );
        metrics
    }

    /// The meters of the fetch loop following `leader`.
    pub fn replica_fetcher(&self, leader: i32) -> ReplicaFetcherMeters {
        let labels = LeaderLabels {
            leader: leader.to_string(),
        };
        ReplicaFetcherMeters {
            requests: self.replica_fetches.get_or_create(&labels).clone(),
            bytes: self.replica_fetch_bytes.get_or_create(&labels).clone(),
            failures: self.replica_fetch_failures.get_or_create(&labels).clone(),
        }
    }

    /// The idempotence checks refused a batch.
    pub fn rejected(&self, why: Rejection) {
        let reason = match why {
            Rejection::OutOfOrderSequence => "out_of_order_sequence",
            Rejection::InvalidProducerEpoch => "invalid_producer_epoch",
            Rejection::CoordinatorFenced => "coordinator_fenced",
            Rejection::TxnNotVerified => "txn_not_verified",
        };
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The controller accepted an ISR change of a led partition from
    /// `before` to `after` members.
    pub fn isr_changed(&self, before: usize, after: usize) {
        if after < before {
            self.isr_shrinks.inc();
        } else if after > before {
            self.isr_expands.inc();
        }
    }

    /// One flush took `seconds`.
    pub fn flushed(&self, seconds: f64) {
        self.flush_seconds.observe(seconds);
    }

    /// Counts an acks=all produce request as parked while the guard lives.
    pub fn produce_waiting(&self) -> Parked {
        Parked::new(&self.produce_purgatory)
    }

    /// The fetch session cache now holds `sessions` sessions of
    /// `partitions` partitions in all.
    pub fn fetch_sessions_held(&self, sessions: usize, partitions: usize) {
        self.fetch_sessions
            .set(i64::try_from(sessions).unwrap_or(i64::MAX));
        self.fetch_session_partitions
            .set(i64::try_from(partitions).unwrap_or(i64::MAX));
    }

    /// A fetch session was evicted for a new one.
    pub fn fetch_session_evicted(&self) {
        self.fetch_session_evictions.inc();
    }

    /// Counts a fetch request as parked while the guard lives.
    pub fn fetch_waiting(&self) -> Parked {
        Parked::new(&self.fetch_purgatory)
    }
}

/// A request counted in a purgatory gauge until dropped (also when its
/// future is cancelled: a closed connection).
#[derive(Debug)]
pub struct Parked(Gauge);

impl Parked {
    fn new(gauge: &Gauge) -> Parked {
        gauge.inc();
        Parked(gauge.clone())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    #[test]
    fn isr_changes_and_parked_requests() {
        let mut registry = Registry::default();
        let m = PartitionMetrics::register(&mut registry);
        m.isr_changed(3, 2);
        m.isr_changed(2, 3);
        m.isr_changed(2, 3);
        m.isr_changed(3, 3);
        m.rejected(Rejection::OutOfOrderSequence);
        let parked = m.produce_waiting();
        let _fetch = m.fetch_waiting();
        let _fetch2 = m.fetch_waiting();
        m.fetch_sessions_held(2, 7);
        m.fetch_session_evicted();
        let text = exposition(&registry);
        assert!(text.contains("samsa_isr_shrinks_total 1\n"), "{text}");
        assert!(text.contains("samsa_isr_expands_total 2\n"), "{text}");
        assert!(text.contains("samsa_produce_purgatory_size 1\n"), "{text}");
        assert!(text.contains("samsa_fetch_purgatory_size 2\n"), "{text}");
        assert!(text.contains("samsa_fetch_sessions 2\n"), "{text}");
        assert!(
            text.contains("samsa_fetch_session_partitions 7\n"),
            "{text}"
        );
        assert!(
            text.contains("samsa_fetch_session_evictions_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "samsa_produce_sequence_rejections_total{reason=\"out_of_order_sequence\"} 1\n"
            ),
            "{text}"
        );
        drop(parked);
        assert!(exposition(&registry).contains("samsa_produce_purgatory_size 0\n"));
    }
}
