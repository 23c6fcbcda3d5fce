//! What the group and transaction coordinators and the idempotence checks
//! record as they run. Counts of groups and transactions by state, members
//! and committed offsets are read from the coordinators when scraped.
//!
//! The coordinators are sans-IO state machines; these meters are
//! write-only atomics handed to them, so recording neither reads the clock
//! nor changes what a step returns.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::latency_buckets;

/// How a transaction ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    Commit,
    Abort,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl Outcome {
    fn labels(self) -> OutcomeLabels {
        OutcomeLabels {
            outcome: match self {
                Outcome::Commit => "commit",
                Outcome::Abort => "abort",
            },
        }
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// The group coordinator's meters (Kafka: GroupMetadataManager and
/// group-coordinator-metrics).
#[derive(Debug, Clone)]
pub struct GroupMeters {
    rebalances: Counter,
    rebalance_seconds: Histogram,
    offset_commits: Counter,
}

/// The transaction coordinator's and the partition leaders' transaction
/// meters.
#[derive(Debug, Clone)]
pub struct TxnMeters {
    ended: Family<OutcomeLabels, Counter>,
    end_seconds: HistogramFamily<OutcomeLabels>,
    timed_out: Counter,
    markers_pending: Gauge,
    markers_written: Counter,
}

impl GroupMeters {
    pub fn register(registry: &mut Registry) -> GroupMeters {
        let meters = GroupMeters {
            rebalances: Counter::default(),
            rebalance_seconds: latency_histogram(),
            offset_commits: Counter::default(),
        };
        registry.register(
            "samsa_consumer_group_rebalances",
            "Rebalances completed (a group reaching Stable again) by the groups this broker coordinates (Kafka: group-coordinator-metrics rebalance-rate)",
            meters.rebalances.clone(),
        );
        registry.register(
            "samsa_consumer_group_rebalance_duration_seconds",
            "Time from a group starting to rebalance to it being Stable again",
            meters.rebalance_seconds.clone(),
        );
        registry.register(
            "samsa_consumer_group_offset_commits",
            "Partition offsets committed to groups this broker coordinates, plain and transactional (Kafka: GroupMetadataManager offset-commit-rate)",
            meters.offset_commits.clone(),
        );
        meters
    }

    /// A rebalance that took `millis` completed.
    pub fn rebalanced(&self, millis: i64) {
        self.rebalances.inc();
        self.rebalance_seconds
            .observe(millis.max(0) as f64 / 1000.0);
    }

    /// `partitions` offsets were committed.
    pub fn offsets_committed(&self, partitions: usize) {
        self.offset_commits.inc_by(partitions as u64);
    }
}

impl TxnMeters {
    pub fn register(registry: &mut Registry) -> TxnMeters {
        let meters = TxnMeters {
            ended: Family::default(),
            end_seconds: HistogramFamily::new_with_constructor(latency_histogram as _),
            timed_out: Counter::default(),
            markers_pending: Gauge::default(),
            markers_written: Counter::default(),
        };
        registry.register(
            "samsa_transactions_ended",
            "Transactions this broker's coordinator completed, by outcome: markers written on every partition (Kafka: transaction-coordinator-metrics)",
            meters.ended.clone(),
        );
        registry.register(
            "samsa_transaction_end_duration_seconds",
            "Time from the coordinator deciding to end a transaction (EndTxn or timeout) to its last marker written, by outcome",
            meters.end_seconds.clone(),
        );
        registry.register(
            "samsa_transactions_timed_out",
            "Transactions this broker's coordinator aborted because they passed their transaction timeout",
            meters.timed_out.clone(),
        );
        registry.register(
            "samsa_transaction_markers_pending",
            "Partitions whose COMMIT/ABORT marker this broker's coordinator has decided but not yet seen written (Kafka: TransactionMarkerChannelManager queue sizes)",
            meters.markers_pending.clone(),
        );
        registry.register(
            "samsa_transaction_markers_written",
            "COMMIT/ABORT markers this broker's coordinator saw written, one per partition and transaction",
            meters.markers_written.clone(),
        );
        meters
    }

    /// Markers for `partitions` partitions are to be written; they stay
    /// pending until [`PendingMarkers::written`] or the guard is dropped.
    pub fn markers_pending(&self, partitions: usize) -> PendingMarkers {
        self.markers_pending.inc_by(partitions as i64);
        PendingMarkers {
            pending: self.markers_pending.clone(),
            written: self.markers_written.clone(),
            left: partitions,
        }
    }

    /// A transaction ended with `outcome`, `millis` after it was decided.
    pub fn ended(&self, outcome: Outcome, millis: i64) {
        let labels = outcome.labels();
        self.ended.get_or_create(&labels).inc();
        self.end_seconds
            .get_or_create(&labels)
            .observe(millis.max(0) as f64 / 1000.0);
    }

    pub fn timed_out(&self) {
        self.timed_out.inc();
    }
}

/// A transaction's markers not yet written; those left stop counting as
/// pending when dropped (written, or given up because fenced or no longer
/// coordinated).
#[derive(Debug)]
pub struct PendingMarkers {
    pending: Gauge,
    written: Counter,
    left: usize,
}

impl PendingMarkers {
    /// One partition's marker was written.
    pub fn written(&mut self) {
        if self.left > 0 {
            self.left -= 1;
            self.pending.dec();
            self.written.inc();
        }
    }

    /// One partition needs no marker after all (its topic is gone).
    pub fn not_needed(&mut self) {
        if self.left > 0 {
            self.left -= 1;
            self.pending.dec();
        }
    }
}

impl Drop for PendingMarkers {
    fn drop(&mut self) {
        self.pending.dec_by(self.left as i64);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn meters_expose_their_samples() {
        let mut registry = Registry::default();
        let groups = GroupMeters::register(&mut registry);
        let txns = TxnMeters::register(&mut registry);
        groups.rebalanced(1500);
        groups.offsets_committed(3);
        txns.ended(Outcome::Commit, 20);
        txns.ended(Outcome::Abort, 30);
        txns.ended(Outcome::Commit, 10);
        txns.timed_out();
        let mut markers = txns.markers_pending(3);
        markers.written();
        let other = txns.markers_pending(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for expected in [
            "samsa_consumer_group_rebalances_total 1\n",
            "samsa_consumer_group_rebalance_duration_seconds_count 1\n",
            "samsa_consumer_group_offset_commits_total 3\n",
            "samsa_transactions_ended_total{outcome=\"commit\"} 2\n",
            "samsa_transactions_ended_total{outcome=\"abort\"} 1\n",
            "samsa_transactions_timed_out_total 1\n",
            "samsa_transaction_markers_pending 4\n",
            "samsa_transaction_markers_written_total 1\n",
        ] {
            assert!(text.contains(expected), "{expected} missing in\n{text}");
        }
        drop(markers);
        drop(other);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("samsa_transaction_markers_pending 0\n"),
            "{text}"
        );
    }
}
