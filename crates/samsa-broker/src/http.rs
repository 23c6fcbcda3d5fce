//! The broker's HTTP endpoint (`http_listen`, default port 9644): `/metrics`
//! in the OpenMetrics text format (what Prometheus scrapes natively), `/healthz` (the process runs)
//! and `/readyz` (the broker serves Kafka requests: its listener accepts
//! and, in cluster mode, the controller has unfenced it).
//!
//! The server is bound before anything else starts, so a port conflict
//! stops the broker at once, and `/healthz` answers during a long start-up.
//! Until the broker is open ([`HttpState::attach`]) `/metrics` shows only
//! the readiness gauge. The request metrics are recorded as requests are
//! served (`samsa_metrics`, `Broker::metrics`); the rest is computed when
//! scraped, from the same state the Kafka handlers read.

use std::convert::Infallible;
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

use samsa_metrics::prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use samsa_metrics::prometheus_client::metrics::counter::ConstCounter;
use samsa_metrics::prometheus_client::metrics::gauge::ConstGauge;
use samsa_metrics::prometheus_client::metrics::MetricType;
use samsa_metrics::{Collector, Registry};

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
                HeaderValue::from_static(samsa_metrics::CONTENT_TYPE),
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

/// What `/metrics` computes when scraped, from the same state the Kafka
/// handlers read (the recorded metrics live in `Broker::metrics`).
struct AtScrape {
    ready: bool,
    broker: Option<Arc<Broker>>,
}

impl std::fmt::Debug for AtScrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtScrape")
            .field("ready", &self.ready)
            .finish()
    }
}

/// Writes one unlabelled gauge.
fn gauge(out: &mut DescriptorEncoder<'_>, name: &str, help: &str, value: i64) -> std::fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(out.encode_descriptor(name, help, None, gauge.metric_type())?)
}

/// Writes one unlabelled counter (`name` without its `_total`).
fn counter(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let counter = ConstCounter::new(value);
    counter.encode(out.encode_descriptor(name, help, None, counter.metric_type())?)
}

/// Writes a gauge with one sample per partition.
fn partition_gauge(
    out: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (String, i64)>,
) -> std::fmt::Result {
    let mut family = out.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (partition, value) in rows {
        let labels = [("partition", partition.as_str())];
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
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

/// The whole `/metrics` page (OpenMetrics text).
fn render_metrics(state: &HttpState) -> String {
    let mut out = String::new();
    let mut at_scrape = Registry::default();
    let broker = state.broker.get().cloned();
    at_scrape.register_collector(Box::new(AtScrape {
        ready: state.is_ready(),
        broker: broker.clone(),
    }));
    let encoded = match &broker {
        Some(broker) => broker.metrics.encode(&at_scrape, &mut out),
        None => samsa_metrics::prometheus_client::encoding::text::encode(&mut out, &at_scrape),
    };
    if let Err(e) = encoded {
        warn!(error = %e, "cannot encode the metrics");
    }
    out
}

impl Collector for AtScrape {
    /// Long on purpose: the list of metrics computed at scrape time, one
    /// block each.
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
        let (summary, offsets) = summarize_leaders(broker, now);
        gauge(
            &mut out,
            "samsa_partitions_led",
            "partitions this broker leads",
            summary.partitions_led,
        )?;
        gauge(
            &mut out,
            "samsa_open_transactions",
            "transactions open on partitions this broker leads (one per producer and partition)",
            summary.open_transactions,
        )?;
        gauge(
            &mut out,
            "samsa_partitions_with_hanging_transactions",
            "led partitions with a transaction whose producer last wrote more than transaction_max_timeout_ms ago",
            summary.partitions_with_hanging_transactions,
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
            i64::try_from(pipelining.partition_in_flight_max.load(Ordering::Relaxed)).unwrap_or(i64::MAX),
        )?;
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
            gauge(
                &mut out,
                "samsa_coordinator_ongoing_transactions",
                "transactional ids this broker coordinates whose transaction is Ongoing",
                ongoing.transactions.len() as i64,
            )?;
        }
        let partitions = broker.replicas.all();
        gauge(
            &mut out,
            "samsa_partitions_with_failing_writes",
            "hosted partitions whose last log write failed (a full or failing disk); they answer KAFKA_STORAGE_ERROR to writes until one succeeds",
            partitions
                .iter()
                .filter(|p| p.write_failures.is_failing())
                .count() as i64,
        )?;
        counter(
            &mut out,
            "samsa_log_write_failures",
            "log writes (appends, replicated appends, fsyncs) that failed on the disk, over all hosted partitions, since start",
            partitions.iter().map(|p| p.write_failures.total()).sum(),
        )?;
        partition_gauge(
            &mut out,
            "samsa_partition_high_watermark",
            "high watermark of each led partition",
            offsets.iter().map(|(name, hw, _)| (name.clone(), *hw)),
        )?;
        partition_gauge(
            &mut out,
            "samsa_partition_lso_lag",
            "high watermark minus last stable offset of each led partition (what read_committed readers wait for)",
            offsets.iter().map(|(name, hw, lso)| (name.clone(), hw - lso)),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn metrics_before_the_broker_is_open_show_readiness_only() {
        let state = HttpState::default();
        assert!(render_metrics(&state).contains("samsa_broker_ready 0"));
        state.set_ready(true);
        let rendered = render_metrics(&state);
        assert!(rendered.contains("samsa_broker_ready 1"));
        assert!(!rendered.contains("samsa_partitions_led"));
        assert!(rendered.ends_with("# EOF\n"), "{rendered}");
    }
}
