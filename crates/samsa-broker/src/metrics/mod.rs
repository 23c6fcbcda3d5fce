//! What `/metrics` computes when scraped, from the same state the Kafka
//! handlers and the controller read: partitions and replication
//! ([`partitions`]), the controller quorum ([`controller`]), the
//! coordinators' transactions and groups ([`coordinators`]). What is
//! recorded as it happens (requests, traffic, flushes, ISR changes,
//! rebalances, transaction ends, the process) lives in `samsa_metrics`,
//! reached through `Broker::metrics`.
//!
//! Invariants: a scrape only reads (locks are taken one at a time, never
//! while another is held), and a family is declared even when it has no
//! sample, so that dashboards and alert rules can be checked against a
//! fresh broker's page.

pub mod controller;
pub mod coordinators;
pub mod partitions;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use samsa_metrics::prometheus_client::encoding::DescriptorEncoder;
use samsa_metrics::{Collector, Registry};
use tracing::warn;

use crate::{now_ms, Broker};

pub use controller::ControllerView;

pub(crate) use samsa_metrics::encode::{counter, gauge, gauge_family, maybe_gauge};

/// Everything computed at scrape time.
struct AtScrape {
    ready: bool,
    broker: Option<Arc<Broker>>,
    controller: Option<Arc<ControllerView>>,
}

impl std::fmt::Debug for AtScrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtScrape")
            .field("ready", &self.ready)
            .finish()
    }
}

/// The whole `/metrics` page (OpenMetrics text): readiness only until the
/// broker is open.
pub fn render(
    ready: bool,
    broker: Option<Arc<Broker>>,
    controller: Option<Arc<ControllerView>>,
) -> String {
    let mut out = String::new();
    let mut at_scrape = Registry::default();
    let open = broker.clone();
    at_scrape.register_collector(Box::new(AtScrape {
        ready,
        broker,
        controller,
    }));
    let encoded = match &open {
        Some(broker) => broker.metrics.encode(&at_scrape, &mut out),
        None => samsa_metrics::prometheus_client::encoding::text::encode(&mut out, &at_scrape),
    };
    if let Err(e) = encoded {
        warn!(error = %e, "cannot encode the metrics");
    }
    out
}

impl Collector for AtScrape {
    fn encode(&self, mut out: DescriptorEncoder<'_>) -> std::fmt::Result {
        gauge(
            &mut out,
            "samsa_broker_ready",
            "1 once the broker serves Kafka requests (unfenced in cluster mode)",
            i64::from(self.ready),
        )?;
        let Some(broker) = &self.broker else {
            return Ok(());
        };
        let now = now_ms();
        partitions::encode(broker, now, &mut out)?;
        controller::encode(self.controller.as_deref(), now, &mut out)?;
        coordinators::encode(broker, now, &mut out)?;
        // DescribeLogDirs' figures: statvfs of the data directory.
        let space = crate::fsutil::disk_space(&broker.config.data_dir).ok();
        maybe_gauge(
            &mut out,
            "samsa_log_dir_total_bytes",
            "Size of the file system holding the data directory, in bytes (DescribeLogDirs TotalBytes)",
            space.map(|(total, _)| i64::try_from(total).unwrap_or(i64::MAX)),
        )?;
        maybe_gauge(
            &mut out,
            "samsa_log_dir_usable_bytes",
            "Bytes of the data directory's file system still available to the broker (DescribeLogDirs UsableBytes)",
            space.map(|(_, usable)| i64::try_from(usable).unwrap_or(i64::MAX)),
        )?;
        gauge(
            &mut out,
            "samsa_partitions_unopened",
            "Partitions this broker should host but could not open at the last try (too many open files, a full or failing disk); their clients get KAFKA_STORAGE_ERROR",
            i64::try_from(broker.replicas.unopened_count()).unwrap_or(i64::MAX),
        )?;
        let inactive = samsa_storage::open_files::inactive_files();
        gauge(
            &mut out,
            "samsa_segment_files_inactive_open",
            "Log files of inactive segments (all but each partition's last) open now, for reads",
            i64::try_from(inactive.open).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut out,
            "samsa_segment_files_inactive_max",
            "How many log files of inactive segments may stay open (log_inactive_segment_files_max)",
            i64::try_from(inactive.capacity).unwrap_or(i64::MAX),
        )?;
        counter(
            &mut out,
            "samsa_segment_file_opens",
            "Opens of an inactive segment's log file that was not open, since start (a fast-growing count: the budget is too small for the reads)",
            inactive.opens_total,
        )?;
        let producer_ids = broker.producer_ids.figures();
        counter(
            &mut out,
            "samsa_producer_id_blocks",
            "Blocks of producer ids this broker obtained (from the controller quorum, or its own file on a single node) since start",
            producer_ids.blocks,
        )?;
        counter(
            &mut out,
            "samsa_producer_ids_allocated",
            "Producer ids this broker handed out (InitProducerId) since start",
            producer_ids.ids,
        )?;
        let pipelining = &broker.pipelining;
        counter(
            &mut out,
            "samsa_produce_pipelined_batches",
            "produce batches that arrived while an earlier produce request of the same connection for the same partition was unanswered",
            pipelining.pipelined_batches.load(Ordering::Relaxed),
        )?;
        gauge(
            &mut out,
            "samsa_produce_partition_in_flight_max",
            "the most produce requests of one connection in flight for one partition at once, since start",
            i64::try_from(pipelining.partition_in_flight_max.load(Ordering::Relaxed))
                .unwrap_or(i64::MAX),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_before_the_broker_is_open_show_readiness_only() {
        assert!(render(false, None, None).contains("samsa_broker_ready 0"));
        let rendered = render(true, None, None);
        assert!(rendered.contains("samsa_broker_ready 1"));
        assert!(!rendered.contains("samsa_partitions_led"));
    }
}
