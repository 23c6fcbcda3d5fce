//! samsa's metrics: what is measured, under which Prometheus name, and the
//! cheap recording the request path does. `docs/OPERATIONS.md` maps every
//! metric to the Kafka MBean it corresponds to.
//!
//! The registry is the Prometheus project's own Rust client
//! (`prometheus-client`): typed label sets, the OpenMetrics text format
//! that Prometheus parses natively, and collectors for values computed
//! when scraped (partition offsets, process figures). The OpenTelemetry
//! metrics SDK would put an export pipeline (readers, temporality, views)
//! and a separately released Prometheus exporter between the same
//! counters and the same `/metrics` page; OpenTelemetry is used where it
//! has no alternative, for traces.
//!
//! Invariants:
//! - the request path never allocates, hashes a label set or takes a lock
//!   to record: each API's handles are resolved once
//!   ([`requests::RequestMetrics::api`]) and recording is atomic adds (a
//!   histogram also searches its ~20 bucket bounds); only error counts,
//!   rare by definition, go through a label lookup;
//! - names follow Prometheus's conventions: a `samsa_` prefix, base units
//!   in the name (`_seconds`, `_bytes`), counters exposed with `_total`.

use std::fmt;

pub mod coordinators;
pub mod encode;
pub mod partitions;
pub mod process;
pub mod requests;
pub mod topics;
pub mod traces;

pub use prometheus_client;
pub use prometheus_client::collector::Collector;
pub use prometheus_client::registry::Registry;

use prometheus_client::metrics::histogram::exponential_buckets;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bucket bounds of latency histograms, in seconds: 100 µs doubling to
/// about 52 s (a produce on a local disk takes well under a millisecond,
/// a long-poll fetch or a JoinGroup may take tens of seconds).
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_1, 2.0, 20)
}

/// Bucket bounds of size histograms, in bytes: 64 B, quadrupling to 256 MiB.
pub fn size_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(64.0, 4.0, 12)
}

/// The metrics a process records as it runs (those computed at scrape time
/// come in through [`Metrics::encode`]'s `at_scrape`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: requests::RequestMetrics,
    pub topics: topics::TopicMetrics,
    pub partitions: partitions::PartitionMetrics,
    pub groups: coordinators::GroupMeters,
    pub txns: coordinators::TxnMeters,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = requests::RequestMetrics::register(&mut registry);
        let topics = topics::TopicMetrics::register(&mut registry);
        let partitions = partitions::PartitionMetrics::register(&mut registry);
        let groups = coordinators::GroupMeters::register(&mut registry);
        let txns = coordinators::TxnMeters::register(&mut registry);
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        registry.register_collector(Box::new(traces::TraceExportCollector));
        Metrics {
            registry,
            requests,
            topics,
            partitions,
            groups,
            txns,
        }
    }

    /// The whole exposition: the recorded metrics, then those of
    /// `at_scrape` (collectors reading state now), then the EOF marker.
    pub fn encode(&self, at_scrape: &Registry, out: &mut String) -> fmt::Result {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        encode_registry(out, &self.registry)?;
        encode_registry(out, at_scrape)?;
        encode_eof(out)
    }
}
