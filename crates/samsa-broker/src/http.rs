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

use crate::{Broker, BrokerError};

/// What the HTTP handlers read: the broker once it is open, and whether it
/// is ready to serve Kafka clients.
#[derive(Default)]
pub struct HttpState {
    broker: OnceLock<Arc<Broker>>,
    controller: OnceLock<Arc<crate::metrics::ControllerView>>,
    ready: AtomicBool,
}

impl HttpState {
    /// Makes the open broker's metrics visible.
    pub fn attach(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    /// Makes this node's controller quorum visible (cluster mode).
    pub fn attach_controller(&self, controller: Arc<crate::metrics::ControllerView>) {
        let _ = self.controller.set(controller);
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

/// The whole `/metrics` page (OpenMetrics text).
fn render_metrics(state: &HttpState) -> String {
    crate::metrics::render(
        state.is_ready(),
        state.broker.get().cloned(),
        state.controller.get().cloned(),
    )
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
