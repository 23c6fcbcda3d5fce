//! The spans exported as OpenTelemetry traces, and their context between
//! nodes.
//!
//! A span belongs to a trace when its target is [`TARGET`]: the process's
//! trace layer (`samsa` binary, `traces`) takes those and no other, so a
//! Kafka request's `request` span is the root of its trace (the connection
//! span around it is not exported) and what it causes — appends, fsyncs,
//! replication waits, coordinator writes, transaction markers — are its
//! children. Most of them are DEBUG spans: no log line shows them by
//! default, and without a trace layer no layer wants them, so they cost a
//! disabled callsite check (field values are not even computed).
//!
//! Sampling is decided when a trace's first span would be made (the trace
//! layer's filter, `trace_sample_ratio`): one of [`ROOT_SPANS`] with no
//! kept span above it starts a trace with that probability, a span below a
//! kept one is kept, a span serving another node's traced call
//! ([`served_span!`], [`TRACEPARENT`]) is kept, and any other is
//! not made. A request not sampled therefore builds no span at all, below
//! it included.
//!
//! Across nodes a span's context travels in the W3C `traceparent` header
//! of samsa's own gRPC calls ([`inject`] on the caller, [`follow_remote`]
//! on the callee), through the process's global propagator: the binary
//! installs the W3C one when traces are on; otherwise the no-op propagator
//! writes and reads nothing.
//!
//! A client's `traceparent` record header is not read: records are opaque
//! to the broker, and a produce request carries batches of many
//! producers' records, not one client operation.

use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every span that belongs to a trace.
pub const TARGET: &str = "samsa::trace";

/// The spans that may start a trace: a client's request, and the markers
/// of a transaction the coordinator aborts on its own (a timeout). Every
/// other trace span exists only below a kept one.
pub const ROOT_SPANS: [&str; 2] = ["request", "txn_markers"];

/// The W3C header a traced gRPC call carries, and the field of the span
/// that serves it ([`served_span!`]): a span with this field is kept
/// whatever the sampling, because the caller already decided to keep its
/// trace.
pub const TRACEPARENT: &str = "traceparent";

/// Whether an incoming gRPC call carries a trace context.
pub fn carries_context(metadata: &MetadataMap) -> bool {
    metadata.contains_key(TRACEPARENT)
}

/// The span of a gRPC call served for another node: in the caller's trace
/// (a server span with the caller's `traceparent`) when the call carries
/// one, otherwise a span for the log alone — a call from an untraced
/// request must not start a trace of its own.
macro_rules! served_span {
    ($metadata:expr, $name:literal, $($fields:tt)*) => {{
        let metadata: &tonic::metadata::MetadataMap = $metadata;
        if $crate::trace::carries_context(metadata) {
            let span = tracing::info_span!(
                target: $crate::trace::TARGET,
                $name,
                otel.kind = "server",
                // The field's name is `TRACEPARENT` (a macro needs it literal).
                traceparent = metadata
                    .get($crate::trace::TRACEPARENT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default(),
                $($fields)*
            );
            $crate::trace::follow_remote(&span, metadata);
            span
        } else {
            tracing::info_span!($name, $($fields)*)
        }
    }};
}
pub(crate) use served_span;

/// Writes the current span's trace context into an outgoing gRPC request.
pub fn inject<T>(request: &mut tonic::Request<T>) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut MetadataWriter(request.metadata_mut()))
    });
}

/// Makes `span` (not yet entered) a child of the trace context an incoming
/// gRPC request carries, if it carries one.
pub fn follow_remote(span: &tracing::Span, metadata: &MetadataMap) {
    if span.is_disabled() {
        return;
    }
    let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MetadataReader(metadata))
    });
    // Refused only for a span already started or one no trace layer takes:
    // it then stays a root, which is still a correct trace.
    let _ = span.set_parent(parent);
}

struct MetadataWriter<'a>(&'a mut MetadataMap);

impl Injector for MetadataWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        // The propagator's keys and values are ASCII; anything else is dropped.
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct MetadataReader<'a>(&'a MetadataMap);

impl Extractor for MetadataReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Fills in a `request` span's transaction fields.
pub fn note_transaction(
    span: &tracing::Span,
    transactional_id: Option<&str>,
    producer: Option<(i64, i16)>,
) {
    if span.is_disabled() {
        return;
    }
    if let Some(transactional_id) = transactional_id {
        span.record("transactional_id", transactional_id);
    }
    if let Some((producer_id, producer_epoch)) = producer {
        span.record("producer_id", producer_id);
        span.record("producer_epoch", producer_epoch);
    }
}

/// Fills in a `request` span's partition count.
pub fn note_partitions(span: &tracing::Span, per_topic: impl Iterator<Item = usize>) {
    if !span.is_disabled() {
        span.record("partitions", per_topic.sum::<usize>());
    }
}
