//! The broker's HTTP endpoint (`http_listen`, default port 9644): `/metrics`
//! in the Prometheus text exposition format, `/healthz` (the process runs)
//! and `/readyz` (the broker serves Kafka requests: its listener accepts
//! and, in cluster mode, the controller has unfenced it).
//!
//! The server is bound before anything else starts, so a port conflict
//! stops the broker at once, and `/healthz` answers during a long start-up.
//! Until the broker is open ([`HttpState::attach`]) `/metrics` shows only
//! the readiness gauge. Metrics are computed when scraped, from the same
//! state the Kafka handlers read; nothing is counted on the hot paths.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::coordinator::txn::ListTransactionsFilter;
use crate::{now_ms, Broker, BrokerError};

/// What the HTTP handlers read: the broker once it is open, and whether it
/// is ready to serve Kafka clients.
#[derive(Default)]
pub struct HttpState {
    broker: OnceLock<Arc<Broker>>,
    ready: AtomicBool,
}

impl HttpState {
    /// Makes the open broker's metrics visible.
    pub fn attach(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    pub fn set_ready(&self, ready: bool) {
        let was = self.ready.swap(ready, Ordering::AcqRel);
        if was != ready {
            debug!(ready, "readiness changed");
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Binds the HTTP listener; a failure is fatal to the broker, like the
/// Kafka listener's.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BrokerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BrokerError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    info!(addr = %bound, "http listener bound (/metrics, /healthz, /readyz)");
    Ok(listener)
}

/// Serves HTTP/1.1 on `listener` until `stop` changes.
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let state = Arc::clone(&state);
                    connections.spawn(async move {
                        let service = service_fn(move |request| {
                            let state = Arc::clone(&state);
                            async move { Ok::<_, Infallible>(route(&state, &request)) }
                        });
                        if let Err(e) = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                        {
                            debug!(%peer, error = %e, "http connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "http accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

fn route(state: &HttpState, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if state.is_ready() => text(StatusCode::OK, "ready\n".into()),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
        "/metrics" => {
            let mut response = text(StatusCode::OK, render_metrics(state));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// One gauge in the exposition format: HELP, TYPE, then its samples.
struct Gauge<'a> {
    out: &'a mut String,
}

impl<'a> Gauge<'a> {
    fn new(out: &'a mut String, name: &str, help: &str) -> Self {
        Self::of_type(out, name, help, "gauge")
    }

    /// A metric that only grows (Prometheus `counter`, name ending `_total`).
    fn counter(out: &'a mut String, name: &str, help: &str) -> Self {
        Self::of_type(out, name, help, "counter")
    }

    fn of_type(out: &'a mut String, name: &str, help: &str, kind: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Gauge { out }
    }

    fn sample(&mut self, name: &str, labels: &str, value: i64) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {value}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {value}");
        }
    }
}

fn counter_value(counter: &std::sync::atomic::AtomicU64) -> i64 {
    i64::try_from(counter.load(Ordering::Relaxed)).unwrap_or(i64::MAX)
}

/// Escapes a label value (backslash, double quote, newline).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// What the partitions this broker leads say about their transactions.
#[derive(Debug, Default, PartialEq, Eq)]
struct LeaderSummary {
    partitions_led: i64,
    /// Transactions open on led partitions (one per producer and partition).
    open_transactions: i64,
    /// Led partitions with a transaction whose producer last wrote more
    /// than `transaction_max_timeout_ms` ago: the coordinator would have
    /// aborted it by now, so nobody is going to end it (a hanging
    /// transaction, see `samsa txn find-hanging`).
    partitions_with_hanging_transactions: i64,
}

/// The per-partition side of [`LeaderSummary`], `(partition, hw, lso)` rows
/// for the lag gauges.
fn summarize_leaders(broker: &Broker, now_ms: i64) -> (LeaderSummary, Vec<(String, i64, i64)>) {
    let max_timeout = i64::from(broker.config.transaction_max_timeout_ms);
    let mut summary = LeaderSummary::default();
    let mut offsets = Vec::new();
    for partition in broker.replicas.all() {
        if !partition.is_leader() {
            continue;
        }
        let Ok((producers, hw, lso)) = partition.with_log(|log| {
            Ok((
                log.describe_producers(),
                log.high_watermark(),
                log.last_stable_offset(),
            ))
        }) else {
            continue; // closed meanwhile
        };
        summary.partitions_led += 1;
        let open: Vec<_> = producers
            .iter()
            .filter(|p| p.current_txn_start_offset >= 0)
            .collect();
        summary.open_transactions += open.len() as i64;
        if open
            .iter()
            .any(|p| now_ms.saturating_sub(p.last_timestamp) > max_timeout)
        {
            summary.partitions_with_hanging_transactions += 1;
        }
        offsets.push((partition.name(), hw, lso));
    }
    offsets.sort();
    (summary, offsets)
}

/// Long on purpose: the list of exported metrics, one block each.
fn render_metrics(state: &HttpState) -> String {
    let mut out = String::new();
    Gauge::new(
        &mut out,
        "samsa_broker_ready",
        "1 once the broker serves Kafka requests (unfenced in cluster mode)",
    )
    .sample("samsa_broker_ready", "", i64::from(state.is_ready()));
    let Some(broker) = state.broker.get() else {
        return out;
    };
    let now = now_ms();
    let (summary, offsets) = summarize_leaders(broker, now);
    Gauge::new(
        &mut out,
        "samsa_partitions_led",
        "partitions this broker leads",
    )
    .sample("samsa_partitions_led", "", summary.partitions_led);
    Gauge::new(
        &mut out,
        "samsa_open_transactions",
        "transactions open on partitions this broker leads (one per producer and partition)",
    )
    .sample("samsa_open_transactions", "", summary.open_transactions);
    Gauge::new(
        &mut out,
        "samsa_partitions_with_hanging_transactions",
        "led partitions with a transaction whose producer last wrote more than transaction_max_timeout_ms ago",
    )
    .sample(
        "samsa_partitions_with_hanging_transactions",
        "",
        summary.partitions_with_hanging_transactions,
    );
    let pipelining = &broker.pipelining;
    Gauge::counter(
        &mut out,
        "samsa_produce_pipelined_batches_total",
        "produce batches that arrived while an earlier produce request of the same connection for the same partition was unanswered",
    )
    .sample(
        "samsa_produce_pipelined_batches_total",
        "",
        counter_value(&pipelining.pipelined_batches),
    );
    Gauge::new(
        &mut out,
        "samsa_produce_partition_in_flight_max",
        "the most produce requests of one connection in flight for one partition at once, since start",
    )
    .sample(
        "samsa_produce_partition_in_flight_max",
        "",
        counter_value(&pipelining.partition_in_flight_max),
    );
    // Coordinator side: the transactions of the ids this broker coordinates.
    let ongoing = broker.txn.lock().list_transactions(
        &ListTransactionsFilter {
            states: vec!["Ongoing".to_string()],
            producer_ids: Vec::new(),
            duration_filter_ms: -1,
        },
        now,
    );
    if ongoing.error.is_none() {
        Gauge::new(
            &mut out,
            "samsa_coordinator_ongoing_transactions",
            "transactional ids this broker coordinates whose transaction is Ongoing",
        )
        .sample(
            "samsa_coordinator_ongoing_transactions",
            "",
            ongoing.transactions.len() as i64,
        );
    }
    let partitions = broker.replicas.all();
    Gauge::new(
        &mut out,
        "samsa_partitions_with_failing_writes",
        "hosted partitions whose last log write failed (a full or failing disk); they answer KAFKA_STORAGE_ERROR to writes until one succeeds",
    )
    .sample(
        "samsa_partitions_with_failing_writes",
        "",
        partitions
            .iter()
            .filter(|p| p.write_failures.is_failing())
            .count() as i64,
    );
    Gauge::counter(
        &mut out,
        "samsa_log_write_failures_total",
        "log writes (appends, replicated appends, fsyncs) that failed on the disk, over all hosted partitions, since start",
    )
    .sample(
        "samsa_log_write_failures_total",
        "",
        partitions
            .iter()
            .map(|p| i64::try_from(p.write_failures.total()).unwrap_or(i64::MAX))
            .sum(),
    );
    let mut hw = Gauge::new(
        &mut out,
        "samsa_partition_high_watermark",
        "high watermark of each led partition",
    );
    for (name, high_watermark, _) in &offsets {
        hw.sample(
            "samsa_partition_high_watermark",
            &format!("partition=\"{}\"", label(name)),
            *high_watermark,
        );
    }
    let mut lag = Gauge::new(
        &mut out,
        "samsa_partition_lso_lag",
        "high watermark minus last stable offset of each led partition (what read_committed readers wait for)",
    );
    for (name, high_watermark, lso) in &offsets {
        lag.sample(
            "samsa_partition_lso_lag",
            &format!("partition=\"{}\"", label(name)),
            high_watermark - lso,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn gauges_follow_the_exposition_format() {
        let mut out = String::new();
        Gauge::new(&mut out, "g", "help text").sample("g", "partition=\"a-0\"", 3);
        assert_eq!(
            out,
            "# HELP g help text\n# TYPE g gauge\ng{partition=\"a-0\"} 3\n"
        );
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn metrics_before_the_broker_is_open_show_readiness_only() {
        let state = HttpState::default();
        assert!(render_metrics(&state).contains("samsa_broker_ready 0"));
        state.set_ready(true);
        let rendered = render_metrics(&state);
        assert!(rendered.contains("samsa_broker_ready 1"));
        assert!(!rendered.contains("samsa_partitions_led"));
    }
}
