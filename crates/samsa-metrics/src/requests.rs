//! Kafka requests as Kafka's `RequestMetrics` and `SocketServer` MBeans
//! count them: requests and errors per API, where each request's time went,
//! request and response sizes, and connections per listener and client
//! software.
//!
//! A request's time is split as Kafka splits it, all measured by the
//! connection that carried it:
//! - **queue**: from its frame being read to its handler starting (behind
//!   earlier requests of a connection that must run first, or the limit
//!   of requests in flight per connection);
//! - **remote**: inside the handler, waiting on other nodes or on a
//!   coordinator (followers for acks=all, a long-poll fetch waiting for
//!   data, a coordinator's state write or rebalance): the sections wrapped
//!   in [`waiting_remotely`];
//! - **local**: the rest of the handler's time;
//! - **send**: from the answer being ready to it being written to the
//!   socket, which includes waiting for earlier answers of the same
//!   connection (answers go out in request order).

use std::cell::Cell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::{latency_buckets, size_buckets};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ApiLabels {
    api: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    api: &'static str,
    error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    listener: String,
    client_software_name: String,
    client_software_version: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

fn size_histogram() -> Histogram {
    Histogram::new(size_buckets())
}

/// Every family of this module, registered once.
#[derive(Debug)]
pub struct RequestMetrics {
    requests: Family<ApiLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    total: HistogramFamily<ApiLabels>,
    queue: HistogramFamily<ApiLabels>,
    local: HistogramFamily<ApiLabels>,
    remote: HistogramFamily<ApiLabels>,
    send: HistogramFamily<ApiLabels>,
    request_bytes: HistogramFamily<ApiLabels>,
    response_bytes: HistogramFamily<ApiLabels>,
    connections: Family<ListenerLabels, Gauge>,
    connections_accepted: Family<ListenerLabels, Counter>,
    clients: ClientConnections,
}

/// Open connections by client software. A label set lives only while a
/// connection names it, so clients cannot grow the page (or the memory)
/// by naming new software; the counts are kept here, under a lock taken
/// only when a connection names its software or closes.
#[derive(Debug, Clone, Default)]
struct ClientConnections {
    gauges: Family<ClientLabels, Gauge>,
    open: Arc<Mutex<HashMap<ClientLabels, i64>>>,
}

impl ClientConnections {
    fn add(&self, labels: &ClientLabels, delta: i64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(labels.clone()).or_insert(0);
        *count += delta;
        if *count <= 0 {
            open.remove(labels);
            self.gauges.remove(labels);
        } else {
            self.gauges.get_or_create(labels).set(*count);
        }
    }
}

/// Kafka's rule for a client software name or version (KIP-511): letters,
/// digits, `-` and `.`, starting and ending with a letter or digit; a
/// broker answers INVALID_REQUEST to others. Longer than this is not a
/// label either.
fn valid_client_software(text: &str) -> bool {
    const MAX_LEN: usize = 128;
    let bytes = text.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= MAX_LEN
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
        && bytes.iter().all(|b| alnum(b) || *b == b'-' || *b == b'.')
}

/// One API's handles, resolved once ([`RequestMetrics::api`]).
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    api: &'static str,
    requests: Counter,
    total: Histogram,
    queue: Histogram,
    local: Histogram,
    remote: Histogram,
    send: Histogram,
    request_bytes: Histogram,
    response_bytes: Histogram,
}

/// When one request reached each stage, as its connection saw it.
#[derive(Debug, Clone, Copy)]
pub struct RequestTimes {
    /// Its frame was read.
    pub received: Instant,
    /// Its handler started.
    pub started: Instant,
    /// Its handler returned the answer.
    pub handled: Instant,
    /// Its answer was written (or dropped: acks=0, a closed connection).
    pub sent: Instant,
    /// Of the handler's time, what [`waiting_remotely`] sections took.
    pub remote: Duration,
}

impl RequestMetrics {
    pub fn register(registry: &mut Registry) -> RequestMetrics {
        let latency = || HistogramFamily::<ApiLabels>::new_with_constructor(latency_histogram as _);
        let size = || HistogramFamily::<ApiLabels>::new_with_constructor(size_histogram as _);
        let metrics = RequestMetrics {
            requests: Family::default(),
            errors: Family::default(),
            total: latency(),
            queue: latency(),
            local: latency(),
            remote: latency(),
            send: latency(),
            request_bytes: size(),
            response_bytes: size(),
            connections: Family::default(),
            connections_accepted: Family::default(),
            clients: ClientConnections::default(),
        };
        let r = registry;
        r.register(
            "samsa_kafka_requests",
            "Kafka requests handled, by API (Kafka: RequestMetrics RequestsPerSec)",
            metrics.requests.clone(),
        );
        r.register(
            "samsa_kafka_request_errors",
            "Error codes in Kafka answers, by API and error (Kafka: RequestMetrics ErrorsPerSec)",
            metrics.errors.clone(),
        );
        r.register(
            "samsa_kafka_request_duration_seconds",
            "A request's time from its frame read to its answer written (Kafka: TotalTimeMs)",
            metrics.total.clone(),
        );
        r.register(
            "samsa_kafka_request_queue_seconds",
            "A request's time before its handler started (Kafka: RequestQueueTimeMs)",
            metrics.queue.clone(),
        );
        r.register(
            "samsa_kafka_request_local_seconds",
            "A request's handler time not spent waiting on other nodes or a coordinator (Kafka: LocalTimeMs)",
            metrics.local.clone(),
        );
        r.register(
            "samsa_kafka_request_remote_seconds",
            "A request's handler time spent waiting on followers, new data or a coordinator (Kafka: RemoteTimeMs)",
            metrics.remote.clone(),
        );
        r.register(
            "samsa_kafka_response_send_seconds",
            "From an answer being ready to it being written, behind earlier answers of its connection (Kafka: ResponseQueueTimeMs + ResponseSendTimeMs)",
            metrics.send.clone(),
        );
        r.register(
            "samsa_kafka_request_size_bytes",
            "Request sizes (Kafka: RequestBytes)",
            metrics.request_bytes.clone(),
        );
        r.register(
            "samsa_kafka_response_size_bytes",
            "Answer sizes (Kafka counts only requests: RequestBytes)",
            metrics.response_bytes.clone(),
        );
        r.register(
            "samsa_kafka_connections",
            "Open Kafka connections, by listener (Kafka: socket-server-metrics connection-count)",
            metrics.connections.clone(),
        );
        r.register(
            "samsa_kafka_connections_accepted",
            "Kafka connections accepted, by listener (Kafka: socket-server-metrics connection-creation-total)",
            metrics.connections_accepted.clone(),
        );
        r.register(
            "samsa_kafka_client_connections",
            "Open Kafka connections by the client software they named in ApiVersions v3+ (Kafka: socket-server-metrics connections, KIP-511)",
            metrics.clients.gauges.clone(),
        );
        metrics
    }

    /// The handles of `api` (Kafka's name of the API, `Produce`).
    pub fn api(&self, api: &'static str) -> ApiMetrics {
        let labels = ApiLabels { api };
        ApiMetrics {
            api,
            requests: self.requests.get_or_create_owned(&labels),
            total: self.total.get_or_create_owned(&labels),
            queue: self.queue.get_or_create_owned(&labels),
            local: self.local.get_or_create_owned(&labels),
            remote: self.remote.get_or_create_owned(&labels),
            send: self.send.get_or_create_owned(&labels),
            request_bytes: self.request_bytes.get_or_create_owned(&labels),
            response_bytes: self.response_bytes.get_or_create_owned(&labels),
        }
    }

    /// Counts one `error` (Kafka's name, `NOT_LEADER_OR_FOLLOWER`) in an
    /// answer of `api`.
    pub fn error(&self, api: &'static str, error: &'static str) {
        self.errors.get_or_create(&ErrorLabels { api, error }).inc();
    }

    /// A connection to `listener` opened; dropping the guard closes it.
    pub fn connection(&self, listener: &str) -> ConnectionGuard {
        let labels = ListenerLabels {
            listener: listener.to_owned(),
        };
        self.connections_accepted.get_or_create(&labels).inc();
        let open = self.connections.get_or_create_owned(&labels);
        open.inc();
        ConnectionGuard {
            open,
            client: None,
            clients: self.clients.clone(),
            listener: labels.listener,
        }
    }
}

impl ApiMetrics {
    pub fn name(&self) -> &'static str {
        self.api
    }

    /// Records one request of this API.
    pub fn record(&self, times: &RequestTimes, request_bytes: usize, response_bytes: usize) {
        let seconds = |d: Duration| d.as_secs_f64();
        let handler = times.handled.saturating_duration_since(times.started);
        let remote = times.remote.min(handler);
        self.requests.inc();
        self.total.observe(seconds(
            times.sent.saturating_duration_since(times.received),
        ));
        self.queue.observe(seconds(
            times.started.saturating_duration_since(times.received),
        ));
        self.local.observe(seconds(handler - remote));
        self.remote.observe(seconds(remote));
        self.send
            .observe(seconds(times.sent.saturating_duration_since(times.handled)));
        self.request_bytes.observe(request_bytes as f64);
        self.response_bytes.observe(response_bytes as f64);
    }
}

/// One open connection in the connection gauges, until dropped.
#[derive(Debug)]
pub struct ConnectionGuard {
    open: Gauge,
    listener: String,
    /// The client software it named, counted in `clients`.
    client: Option<ClientLabels>,
    clients: ClientConnections,
}

impl ConnectionGuard {
    /// The client software the connection named (ApiVersions v3+); a
    /// second naming (a client may send ApiVersions again) replaces the
    /// first. Names Kafka would refuse are not counted.
    pub fn client_software(&mut self, name: &str, version: &str) {
        if let Some(previous) = self.client.take() {
            self.clients.add(&previous, -1);
        }
        if !valid_client_software(name) || !valid_client_software(version) {
            return;
        }
        let labels = ClientLabels {
            listener: self.listener.clone(),
            client_software_name: name.to_owned(),
            client_software_version: version.to_owned(),
        };
        self.clients.add(&labels, 1);
        self.client = Some(labels);
    }
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.open.dec();
        if let Some(client) = self.client.take() {
            self.clients.add(&client, -1);
        }
    }
}

tokio::task_local! {
    static REMOTE_WAIT: Cell<Duration>;
}

/// Runs a request's handler, returning its output and how long it spent
/// in [`waiting_remotely`] sections.
pub async fn measure_remote<F: Future>(handler: F) -> (F::Output, Duration) {
    REMOTE_WAIT
        .scope(Cell::new(Duration::ZERO), async move {
            let output = handler.await;
            (output, REMOTE_WAIT.with(Cell::get))
        })
        .await
}

/// `wait`, counted as the current request's time waiting on other nodes
/// or a coordinator (nothing is counted outside [`measure_remote`]).
/// Sections must not overlap: wrap the one await that waits for all.
pub async fn waiting_remotely<F: Future>(wait: F) -> F::Output {
    let start = Instant::now();
    let output = wait.await;
    let _ = REMOTE_WAIT.try_with(|spent| spent.set(spent.get() + start.elapsed()));
    output
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::Metrics;

    fn exposition(metrics: &Metrics) -> String {
        let mut out = String::new();
        metrics.encode(&Registry::default(), &mut out).unwrap();
        out
    }

    #[test]
    fn a_request_is_split_into_queue_local_remote_and_send() {
        let metrics = Metrics::new();
        let produce = metrics.requests.api("Produce");
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        produce.record(
            &RequestTimes {
                received: t0,
                started: t0 + ms(2),
                handled: t0 + ms(12),
                sent: t0 + ms(13),
                remote: ms(8),
            },
            1000,
            60,
        );
        metrics.requests.error("Produce", "NOT_LEADER_OR_FOLLOWER");
        let out = exposition(&metrics);
        assert!(
            out.contains("samsa_kafka_requests_total{api=\"Produce\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("samsa_kafka_request_errors_total{api=\"Produce\",error=\"NOT_LEADER_OR_FOLLOWER\"} 1"),
            "{out}"
        );
        let sum = |name: &str| -> f64 {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{name}_sum{{api=\"Produce\"}}")))
                .unwrap_or_else(|| panic!("{name} in {out}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(sum("samsa_kafka_request_duration_seconds"), 0.013));
        assert!(close(sum("samsa_kafka_request_queue_seconds"), 0.002));
        assert!(close(sum("samsa_kafka_request_remote_seconds"), 0.008));
        assert!(close(sum("samsa_kafka_request_local_seconds"), 0.002));
        assert!(close(sum("samsa_kafka_response_send_seconds"), 0.001));
        assert!(close(sum("samsa_kafka_request_size_bytes"), 1000.0));
        assert!(out.ends_with("# EOF\n"));
    }

    #[test]
    fn connections_are_counted_until_dropped_with_their_client_software() {
        let metrics = Metrics::new();
        let mut first = metrics.requests.connection("PLAINTEXT");
        let second = metrics.requests.connection("PLAINTEXT");
        first.client_software("librdkafka", "2.12.1");
        let out = exposition(&metrics);
        assert!(
            out.contains("samsa_kafka_connections{listener=\"PLAINTEXT\"} 2"),
            "{out}"
        );
        assert!(
            out.contains("samsa_kafka_client_connections{listener=\"PLAINTEXT\",client_software_name=\"librdkafka\",client_software_version=\"2.12.1\"} 1"),
            "{out}"
        );
        drop(first);
        drop(second);
        let out = exposition(&metrics);
        assert!(
            out.contains("samsa_kafka_connections{listener=\"PLAINTEXT\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("samsa_kafka_connections_accepted_total{listener=\"PLAINTEXT\"} 2"),
            "{out}"
        );
        // Closed, the client software leaves the page.
        assert!(!out.contains("librdkafka"), "{out}");
    }

    #[test]
    fn client_software_names_kafka_refuses_are_not_labels() {
        let metrics = Metrics::new();
        let mut c = metrics.requests.connection("PLAINTEXT");
        let long = "x".repeat(200);
        for (name, version) in [
            ("", "1"),
            ("-lead", "1"),
            ("trail.", "1"),
            ("spa ce", "1"),
            ("ok", "1\n"),
            (long.as_str(), "1"),
        ] {
            c.client_software(name, version);
        }
        let out = exposition(&metrics);
        assert!(!out.contains("client_software_name="), "{out}");
        c.client_software("confluent-kafka-python", "2.6.1-rdkafka-2.6.1");
        let out = exposition(&metrics);
        assert!(
            out.contains("client_software_name=\"confluent-kafka-python\""),
            "{out}"
        );
    }

    #[tokio::test]
    async fn remote_time_is_what_the_wrapped_waits_took() {
        let ((), remote) = measure_remote(async {
            waiting_remotely(tokio::time::sleep(Duration::from_millis(20))).await;
        })
        .await;
        assert!(remote >= Duration::from_millis(20), "{remote:?}");
        // Outside a measured request nothing is recorded, and nothing fails.
        waiting_remotely(async {}).await;
    }
}
