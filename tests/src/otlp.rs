//! A real OTLP/gRPC trace receiver (the collector's `TraceService`, served
//! by the generated server of the `opentelemetry-proto` crate) on a free
//! loopback port: what samsa nodes export to it is kept for the test to
//! read, span by span, with the node each span came from.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use tokio_stream::wrappers::TcpListenerStream;

/// One span as received.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Hex, as trace viewers show them.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a trace's root.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind` (2 server, 3 client).
    pub kind: i32,
    /// The exporting node (`samsa.node_id` of the span's resource).
    pub node_id: Option<i64>,
    /// The span's attributes, as strings.
    pub attributes: BTreeMap<String, String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// OTLP's `SPAN_KIND_SERVER`.
pub const SPAN_KIND_SERVER: i32 = 2;
/// OTLP's `SPAN_KIND_CLIENT`.
pub const SPAN_KIND_CLIENT: i32 = 3;

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    /// Spans received, kept or not.
    count: Arc<AtomicUsize>,
    /// Only count (the benchmark's sink): a long run would hold gigabytes.
    count_only: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
            )
        })
        .collect()
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        let spans: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.count.fetch_add(spans, Ordering::Relaxed);
        if self.count_only {
            return Ok(tonic::Response::new(ExportTraceServiceResponse::default()));
        }
        let mut received = Vec::new();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            let node_id = resource.get("samsa.node_id").and_then(|n| n.parse().ok());
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push(ReceivedSpan {
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        kind: span.kind,
                        node_id,
                        attributes: attributes(&span.attributes),
                    });
                }
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The receiver; stops when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    collector: Collector,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OtlpReceiver {
    /// Serves on a free port of 127.0.0.1, keeping every span.
    pub fn start() -> anyhow::Result<OtlpReceiver> {
        Self::serve(false)
    }

    /// Serves on a free port of 127.0.0.1, only counting spans.
    pub fn start_counting() -> anyhow::Result<OtlpReceiver> {
        Self::serve(true)
    }

    fn serve(count_only: bool) -> anyhow::Result<OtlpReceiver> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let collector = Collector {
            count_only,
            ..Collector::default()
        };
        let service = TraceServiceServer::new(collector.clone());
        runtime.spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        Ok(OtlpReceiver {
            addr,
            collector,
            runtime: Some(runtime),
        })
    }

    /// What a node's `otlp_endpoint` names.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.collector
            .spans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How many spans were received so far.
    pub fn span_count(&self) -> usize {
        self.collector.count.load(Ordering::Relaxed)
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
