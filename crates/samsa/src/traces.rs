//! OpenTelemetry traces: the OTLP/gRPC exporter of the spans
//! `samsa_broker::trace` marks, built when `otlp_endpoint` is set.
//!
//! Spans go through the SDK's batch processor (its own thread, a queue of
//! 2,048 spans, a batch at least every second): a request never waits for
//! the collector, and when the queue is full spans are dropped, not
//! requests slowed. Sampling is decided where a trace starts, before its
//! first span is made (`trace_sample_ratio`; `crate::logging`'s trace
//! filter), and followed by every span below it, on this node and on the
//! nodes its context reaches over gRPC. Every span carries the node in its resource
//! (`service.instance.id`, `samsa.node_id`).
//!
//! An unreachable collector costs the spans of the failed exports, never a
//! request: the failures are counted (`samsa_trace_spans_lost_total`) and
//! logged when they start and when exports work again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use samsa_broker::BrokerConfig;
use samsa_metrics::traces::TRACE_EXPORTS;

use crate::logging::TraceOutput;

/// How long one export to the collector may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the batch processor exports what it holds.
const EXPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a stopping broker waits for its last spans to leave.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The exporter of a process whose traces are on.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts the exporter `cfg` asks for (none without `otlp_endpoint`).
    /// Must run inside the tokio runtime: the gRPC channel lives on it.
    pub fn start(cfg: &BrokerConfig) -> Result<Option<(Traces, TraceOutput)>> {
        let Some(endpoint) = &cfg.otlp_endpoint else {
            return Ok(None);
        };
        if !endpoint.starts_with("http://") {
            bail!(
                "otlp_endpoint {endpoint:?}: expected http://host:port (OTLP over gRPC \
                 without TLS; run a collector beside the broker for TLS)"
            );
        }
        let ratio = cfg.trace_sample_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            bail!("trace_sample_ratio {ratio}: expected a number from 0.0 to 1.0");
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("otlp_endpoint {endpoint:?}"))?;
        let exporter = Reporting {
            inner: exporter,
            endpoint: endpoint.clone(),
            failing: AtomicBool::new(false),
        };
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_INTERVAL)
                    .build(),
            )
            .build();
        let resource = Resource::builder()
            .with_service_name("samsa")
            .with_attributes([
                KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("service.instance.id", cfg.node_id.to_string()),
                KeyValue::new("samsa.node_id", i64::from(cfg.node_id)),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            // The ratio is applied before a trace's first span exists (the
            // trace layer's filter, `crate::logging`); what reaches the SDK is
            // kept, a span with a remote parent as its parent decided.
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let tracer = provider.tracer("samsa");
        Ok(Some((
            Traces { provider },
            TraceOutput {
                tracer,
                sample_ratio: ratio,
            },
        )))
    }

    /// Exports the spans still queued, then stops the exporter.
    pub async fn stop(self) {
        let provider = self.provider;
        // The processor's thread exports through the runtime's gRPC
        // channel: wait for it off the runtime's workers.
        let stopped =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT))
                .await;
        match stopped {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the last spans were not all exported"),
            Err(error) => tracing::warn!(%error, "the trace exporter did not stop"),
        }
    }
}

/// The OTLP exporter, counting what it exports and loses and logging when
/// exports start and stop failing (the SDK drops a failed batch silently).
#[derive(Debug)]
struct Reporting<E> {
    inner: E,
    endpoint: String,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Reporting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        let outcome = self.inner.export(batch).await;
        match &outcome {
            Ok(()) => {
                TRACE_EXPORTS.exported(spans);
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "spans are exported again");
                }
            }
            Err(error) => {
                TRACE_EXPORTS.lost(spans);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(endpoint = %self.endpoint, %error, spans, "cannot export spans to the OTLP collector; they are dropped (logged again when exports work)");
                }
            }
        }
        outcome
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
