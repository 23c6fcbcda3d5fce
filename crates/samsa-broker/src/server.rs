//! The Kafka listener: framing, pipelining and per-connection ordering.
//!
//! Each connection has a reader task that cuts the byte stream into frames
//! (4-byte big-endian length, then the request) and a writer loop that answers
//! them **in request order** while handlers run concurrently (Kafka clients
//! pipeline requests and match answers by order as well as correlation id).
//!
//! Group coordinator requests (JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
//! OffsetCommit, OffsetFetch, TxnOffsetCommit, …) are **barriers**: one
//! starts only once every earlier request of the connection has been
//! answered, and later ones wait for it. Kafka handles a connection's
//! requests one at a time, and clients rely on it for these: an
//! OffsetFetch sent right after an asynchronous OffsetCommit sees that
//! commit.
//!
//! Produce requests run concurrently too, but append in arrival order:
//! each is handed its turn ([`crate::produce_order`]) as it is dispatched,
//! which is the order the frames arrived.
//!
//! A frame that cannot be a Kafka request — negative or oversized length,
//! unknown API key, unsupported version (other than ApiVersions), a body that
//! does not decode — closes the connection with a log line, as Kafka does.
//! Nothing a peer sends can panic the broker.
//!
//! Security (docs/SECURITY.md): a listener's `security_protocol` decides
//! whether a connection first does a TLS handshake (SSL, SASL_SSL; its
//! client certificate, if any, names the principal) and whether it must
//! authenticate with SASL before anything but ApiVersions is served
//! (SASL_PLAINTEXT, SASL_SSL: `security::sasl`, run here in the
//! connection's loop, since it is the connection's state). Neither may
//! take longer than `authentication_timeout_ms`: a slow or half-done
//! handshake is closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use kafka_protocol::messages::ApiKey;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn, Instrument};

use crate::apis::ConnectionOrder;
use crate::config::KafkaListener;
use crate::dispatch::{dispatch, ClientConnection, DispatchError};
use crate::produce_order::{AppendTurn, ConnectionAppendOrder};
use crate::security::sasl::{Outcome, SaslSession};
use crate::security::tls::{certificate_principal, TlsListenerConfig};
use crate::security::Principal;
use crate::Broker;

/// How many requests of one connection may be in flight at once.
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

async fn accept_loop(
    listener: TcpListener,
    spec: KafkaListener,
    tls: Option<Arc<TlsListenerConfig>>,
    broker: Arc<Broker>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let name: Arc<str> = Arc::from(spec.name.as_str());
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let broker = broker.clone();
                    let span = tracing::info_span!("conn", node = broker.config.node_id, listener = &*name, %peer);
                    let client = ClientConnection {
                        peer,
                        listener: Arc::clone(&name),
                        principal: Arc::new(Principal::anonymous()),
                    };
                    let tls = tls.as_ref().map(|t| t.acceptor());
                    let sasl = spec.security_protocol.uses_sasl();
                    connections.spawn(accept_connection(stream, tls, sasl, client, broker).instrument(span));
                }
                Err(e) => {
                    warn!(error = %e, "accept failed");
                    // Running out of file descriptors must not spin the loop.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// A new connection: its TLS handshake first on a TLS listener (bounded by
/// `authentication_timeout_ms`; the client certificate names the
/// principal), then its requests.
async fn accept_connection(
    stream: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    sasl: bool,
    mut client: ClientConnection,
    broker: Arc<Broker>,
) {
    let timeout = Duration::from_millis(broker.config.authentication_timeout_ms.max(1));
    let Some(acceptor) = tls else {
        let (reader, writer) = stream.into_split();
        serve_connection(reader, writer, client, sasl, broker).await;
        return;
    };
    let tls_stream = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls_stream)) => tls_stream,
        Ok(Err(e)) => {
            info!(error = %e, "TLS handshake failed; connection closed");
            return;
        }
        Err(_) => {
            info!(
                timeout_ms = timeout.as_millis() as u64,
                "TLS handshake not done in time; connection closed"
            );
            return;
        }
    };
    if let Some(cert) = tls_stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
    {
        match certificate_principal(cert) {
            Some(principal) => {
                debug!(%principal, "TLS client certificate verified");
                client.principal = Arc::new(principal);
            }
            None => {
                warn!(
                    "a verified client certificate whose subject does not parse; connection closed"
                );
                return;
            }
        }
    }
    let (reader, writer) = tokio::io::split(tls_stream);
    serve_connection(reader, writer, client, sasl, broker).await;
}

/// One request frame, cut from the stream.
struct Frame {
    body: Bytes,
    /// When its last byte was read (the start of its request time).
    received: Instant,
}

/// A request's answer and what its metrics need
/// (`samsa_metrics::requests`).
struct Answered {
    result: Result<Option<BytesMut>, DispatchError>,
    api: Option<ApiKey>,
    request_bytes: usize,
    received: Instant,
    started: Instant,
    handled: Instant,
    remote: Duration,
}

/// Kafka's `sasl.server.max.receive.size`: the largest frame a SASL
/// listener reads before the connection has authenticated, so that an
/// unauthenticated client cannot make the broker buffer
/// `socket.request.max.bytes` per connection.
const SASL_MAX_RECEIVE_BYTES: usize = 512 * 1024;

/// `unauthenticated`: while set, frames are limited to
/// [`SASL_MAX_RECEIVE_BYTES`].
async fn read_frames<R: AsyncRead + Unpin>(
    mut reader: R,
    frames: mpsc::Sender<Frame>,
    max_request_bytes: usize,
    unauthenticated: Arc<std::sync::atomic::AtomicBool>,
    peer: SocketAddr,
) {
    loop {
        let mut len_buf = [0u8; 4];
        match reader.read_exact(&mut len_buf).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return,
            Err(e) => {
                debug!(%peer, error = %e, "read failed");
                return;
            }
        }
        let len = i32::from_be_bytes(len_buf);
        if len >= 0
            && unauthenticated.load(std::sync::atomic::Ordering::Acquire)
            && len as usize > SASL_MAX_RECEIVE_BYTES
        {
            warn!(%peer, size = len, limit = SASL_MAX_RECEIVE_BYTES, "request before SASL authentication larger than sasl.server.max.receive.size; closing connection");
            return;
        }
        if len < 0 || len as usize > max_request_bytes {
            warn!(%peer, size = len, limit = max_request_bytes, "request size out of range (socket.request.max.bytes); closing connection");
            return;
        }
        // Read into uninitialised capacity: zeroing a buffer that is about to
        // be overwritten cost measurable CPU on 1 MB produce frames.
        let len = len as usize;
        let mut body = BytesMut::with_capacity(len);
        let mut frame_reader = (&mut reader).take(len as u64);
        while body.len() < len {
            match frame_reader.read_buf(&mut body).await {
                Ok(0) => {
                    debug!(%peer, size = len, received = body.len(), "connection closed mid-frame");
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    debug!(%peer, error = %e, size = len, "connection closed mid-frame");
                    return;
                }
            }
        }
        if frames
            .send(Frame {
                body: body.freeze(),
                received: Instant::now(),
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn serve_connection<R, W>(
    reader: R,
    writer: W,
    mut client: ClientConnection,
    sasl: bool,
    broker: Arc<Broker>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let peer = client.peer;
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let (frame_tx, mut frame_rx) = mpsc::channel::<Frame>(MAX_IN_FLIGHT_PER_CONNECTION);
    let unauthenticated = Arc::new(std::sync::atomic::AtomicBool::new(sasl));
    let reader_task = tokio::spawn(read_frames(
        reader,
        frame_tx,
        broker.config.max_request_bytes,
        Arc::clone(&unauthenticated),
        peer,
    ));
    let mut in_flight: FuturesOrdered<BoxFuture<'static, Answered>> = FuturesOrdered::new();
    // Counted among the listener's connections until it closes.
    let mut connection_metrics = broker.metrics.requests.connection(&client.listener);
    let mut reading = true;
    // A frame waiting for the requests before it (see the module docs), and
    // whether the request in flight is a barrier.
    let mut held: Option<Frame> = None;
    let mut barrier_in_flight = false;
    // Frames are dispatched in arrival order, so turns are handed out in it.
    let mut append_order = ConnectionAppendOrder::default();
    let mut session = sasl.then(|| broker.sasl_session());
    let auth_deadline = tokio::time::Instant::now()
        + Duration::from_millis(broker.config.authentication_timeout_ms.max(1));
    // After a SASL answer that ends the connection: no more frames.
    let mut closing: Option<String> = None;
    let mut answer = |body: Bytes,
                      session: &mut Option<SaslSession>,
                      client: &mut ClientConnection,
                      closing: &mut Option<String>|
     -> BoxFuture<'static, Result<Option<BytesMut>, DispatchError>> {
        if let Some(s) = session.as_mut() {
            let now = crate::now_ms();
            let key = api_key_of(&body);
            match key {
                Some(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate) => {
                    let answer = crate::dispatch::sasl_step(&body, s, now);
                    if let Ok((_, Outcome::Close(reason))) = &answer {
                        *closing = Some(reason.clone());
                    }
                    if let Some(principal) = s.principal() {
                        // Before the answer goes out: the client's next
                        // (possibly large) request is read without the
                        // pre-authentication limit.
                        unauthenticated.store(false, std::sync::atomic::Ordering::Release);
                        if *client.principal != *principal {
                            info!(principal = %principal, "authenticated");
                            client.principal = Arc::new(principal.clone());
                        }
                    }
                    return futures::future::ready(answer.map(|(bytes, _)| Some(bytes))).boxed();
                }
                Some(key) if !s.admits(key, now) => {
                    let reason = if s.principal().is_some() {
                        format!("{key:?} request after the SASL session expired (connections_max_reauth_ms) without re-authentication")
                    } else {
                        format!("unexpected {key:?} request before SASL authentication")
                    };
                    return futures::future::ready(Err(DispatchError::Close(reason))).boxed();
                }
                _ => {}
            }
        }
        let turn = is_produce(&body).then(|| append_order.next_turn());
        dispatch_owned(broker.clone(), body, client.clone(), turn).boxed()
    };
    // `answer`, with the times and sizes the request metrics need.
    let mut start = |frame: Frame,
                     session: &mut Option<SaslSession>,
                     client: &mut ClientConnection,
                     closing: &mut Option<String>,
                     connection_metrics: &mut samsa_metrics::requests::ConnectionGuard|
     -> BoxFuture<'static, Answered> {
        let api = api_key_of(&frame.body);
        if api == Some(ApiKey::ApiVersions) {
            if let Some((name, version)) = crate::dispatch::client_software(&frame.body) {
                connection_metrics.client_software(&name, &version);
            }
        }
        let request_bytes = frame.body.len();
        let received = frame.received;
        let started = Instant::now();
        let answering = answer(frame.body, session, client, closing);
        async move {
            let (result, remote) = samsa_metrics::requests::measure_remote(answering).await;
            Answered {
                result,
                api,
                request_bytes,
                received,
                started,
                handled: Instant::now(),
                remote,
            }
        }
        .boxed()
    };
    loop {
        if in_flight.is_empty() {
            barrier_in_flight = false;
            if let Some(frame) = held.take() {
                barrier_in_flight = is_barrier(&frame.body);
                in_flight.push_back(start(
                    frame,
                    &mut session,
                    &mut client,
                    &mut closing,
                    &mut connection_metrics,
                ));
            }
        }
        let authenticating = session.as_ref().is_some_and(|s| s.principal().is_none());
        tokio::select! {
            frame = frame_rx.recv(), if reading && closing.is_none() && held.is_none() && in_flight.len() < MAX_IN_FLIGHT_PER_CONNECTION => {
                match frame {
                    Some(frame) => {
                        let barrier = is_barrier(&frame.body);
                        if barrier_in_flight || (barrier && !in_flight.is_empty()) {
                            held = Some(frame);
                        } else {
                            barrier_in_flight = barrier;
                            in_flight.push_back(start(frame, &mut session, &mut client, &mut closing, &mut connection_metrics));
                        }
                    }
                    None => reading = false,
                }
            }
            Some(answered) = in_flight.next(), if !in_flight.is_empty() => {
                let response_bytes = match answered.result {
                    Ok(Some(response)) => {
                        let len = response.len();
                        if let Err(e) = write_response(&mut writer, response).await {
                            debug!(%peer, error = %e, "write failed; closing connection");
                            break;
                        }
                        len
                    }
                    Ok(None) => 0, // acks=0 produce: no answer by protocol
                    Err(DispatchError::Close(reason)) => {
                        warn!(%peer, %reason, "closing connection");
                        break;
                    }
                };
                if let Some(meter) = answered.api.and_then(|api| broker.request_meters.get(api)) {
                    meter.record(
                        &samsa_metrics::requests::RequestTimes {
                            received: answered.received,
                            started: answered.started,
                            handled: answered.handled,
                            sent: Instant::now(),
                            remote: answered.remote,
                        },
                        answered.request_bytes,
                        response_bytes,
                    );
                }
            }
            _ = tokio::time::sleep_until(auth_deadline), if authenticating && closing.is_none() => {
                info!(%peer, timeout_ms = broker.config.authentication_timeout_ms, "SASL authentication not done in time; closing connection");
                break;
            }
            else => break,
        }
        if let Some(reason) = &closing {
            if in_flight.is_empty() {
                info!(%peer, %reason, "closing connection after the SASL answer");
                break;
            }
        }
        if !reading && in_flight.is_empty() && held.is_none() {
            break;
        }
    }
    let _ = writer.flush().await;
    reader_task.abort();
    debug!(%peer, "connection closed");
}

/// The API key of a request frame, if it names one.
fn api_key_of(frame: &[u8]) -> Option<ApiKey> {
    let raw = i16::from_be_bytes([*frame.first()?, *frame.get(1)?]);
    ApiKey::try_from(raw).ok()
}

async fn dispatch_owned(
    broker: Arc<Broker>,
    body: Bytes,
    client: ClientConnection,
    turn: Option<AppendTurn>,
) -> Result<Option<BytesMut>, DispatchError> {
    dispatch(&broker, body, &client, turn).await
}

fn order_of(frame: &[u8]) -> ConnectionOrder {
    // A frame of an API samsa does not serve is refused by dispatch; until
    // then it is ordered like any other request.
    crate::apis::of_frame(frame).map_or(ConnectionOrder::Concurrent, |api| api.order)
}

fn is_produce(frame: &[u8]) -> bool {
    order_of(frame) == ConnectionOrder::AppendInOrder
}

/// Whether a request frame is a barrier on its connection (the group
/// coordinator's APIs, see the module docs and [`crate::apis`]).
fn is_barrier(frame: &[u8]) -> bool {
    order_of(frame) == ConnectionOrder::Barrier
}

async fn write_response<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    response: BytesMut,
) -> std::io::Result<()> {
    let len = i32::try_from(response.len()).map_err(std::io::Error::other)?;
    writer.write_all(&len.to_be_bytes()).await?;
    writer.write_all(&response).await?;
    // Flush every answer: the next one in order may be a fetch parked for
    // seconds, and what is ready must not wait behind it.
    writer.flush().await
}

/// A broker's Kafka listeners, bound, each with how it runs, and the TLS
/// configuration of the TLS ones (loaded once, shared, reloaded on change).
pub(crate) struct BoundListeners {
    sockets: Vec<(KafkaListener, TcpListener)>,
    tls: Option<Arc<TlsListenerConfig>>,
}

/// Binds every Kafka listener of `config` (the main one and
/// `[listeners.*]`) and loads the TLS configuration if one of them needs
/// it; an error names the listener or file that cannot work.
pub(crate) async fn bind_listeners(
    config: &crate::config::BrokerConfig,
) -> Result<BoundListeners, crate::BrokerError> {
    let listeners = config
        .kafka_listeners()
        .map_err(crate::BrokerError::Config)?;
    let tls = if listeners.iter().any(|l| l.security_protocol.uses_tls()) {
        Some(
            TlsListenerConfig::load(config)
                .map_err(|e| crate::BrokerError::Config(e.to_string()))?,
        )
    } else {
        None
    };
    let mut sockets = Vec::new();
    for listener in listeners {
        let addr = listener.listen;
        let socket = TcpListener::bind(addr)
            .await
            .map_err(|source| crate::BrokerError::Bind { addr, source })?;
        info!(
            listener = %listener.name,
            %addr,
            advertised = %format!("{}:{}", listener.advertised_host, listener.advertised_port),
            security_protocol = listener.security_protocol.name(),
            "kafka listener bound"
        );
        sockets.push((listener, socket));
    }
    Ok(BoundListeners { sockets, tls })
}

/// Accepts Kafka connections on every listener until `shutdown` (and
/// watches the TLS files for changes meanwhile).
pub(crate) async fn accept_all(
    listeners: BoundListeners,
    broker: Arc<Broker>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let BoundListeners { sockets, tls } = listeners;
    if let Some(tls) = &tls {
        tokio::spawn(Arc::clone(tls).watch(shutdown.clone()).in_current_span());
    }
    futures::future::join_all(sockets.into_iter().map(|(spec, socket)| {
        let tls = spec
            .security_protocol
            .uses_tls()
            .then(|| tls.clone())
            .flatten();
        accept_loop(socket, spec, tls, Arc::clone(&broker), shutdown.clone())
    }))
    .await;
}
