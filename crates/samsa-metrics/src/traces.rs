//! Spans leaving the process for the OTLP collector (`otlp_endpoint`):
//! how many were exported and how many were lost because an export failed.
//! The exporter is the process's, built before any broker, so its counts
//! are process-wide ([`TRACE_EXPORTS`]); read when scraped.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use crate::encode::counter;

/// The export counts of this process.
#[derive(Debug, Default)]
pub struct TraceExports {
    exported: AtomicU64,
    lost: AtomicU64,
}

/// The process's exporter records here.
pub static TRACE_EXPORTS: TraceExports = TraceExports {
    exported: AtomicU64::new(0),
    lost: AtomicU64::new(0),
};

impl TraceExports {
    /// A batch of `spans` reached the collector.
    pub fn exported(&self, spans: usize) {
        self.exported.fetch_add(spans as u64, Ordering::Relaxed);
    }

    /// A batch of `spans` could not be exported; the spans are gone.
    pub fn lost(&self, spans: usize) {
        self.lost.fetch_add(spans as u64, Ordering::Relaxed);
    }
}

/// Encodes [`TRACE_EXPORTS`] when scraped.
#[derive(Debug, Default)]
pub struct TraceExportCollector;

impl Collector for TraceExportCollector {
    fn encode(&self, mut out: DescriptorEncoder<'_>) -> std::fmt::Result {
        counter(
            &mut out,
            "samsa_trace_spans_exported",
            "Spans exported to the OTLP collector",
            TRACE_EXPORTS.exported.load(Ordering::Relaxed),
        )?;
        counter(
            &mut out,
            "samsa_trace_spans_lost",
            "Spans lost because their export to the OTLP collector failed",
            TRACE_EXPORTS.lost.load(Ordering::Relaxed),
        )
    }
}
