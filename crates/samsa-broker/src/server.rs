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

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::stream::FuturesOrdered;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, info, warn, Instrument};

use crate::apis::ConnectionOrder;
use crate::dispatch::{dispatch, ClientConnection, DispatchError};
use crate::produce_order::{AppendTurn, ConnectionAppendOrder};
use crate::Broker;

/// How many requests of one connection may be in flight at once.
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;

async fn accept_loop(
    listener: TcpListener,
    name: Arc<str>,
    broker: Arc<Broker>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let broker = broker.clone();
                    let span = tracing::info_span!("conn", node = broker.config.node_id, listener = &*name, %peer);
                    let client = ClientConnection { peer, listener: Arc::clone(&name) };
                    connections.spawn(serve_connection(stream, client, broker).instrument(span));
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

/// One request frame, cut from the stream.
struct Frame {
    body: Bytes,
}

async fn read_frames(
    mut reader: tokio::net::tcp::OwnedReadHalf,
    frames: mpsc::Sender<Frame>,
    max_request_bytes: usize,
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
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

async fn serve_connection(stream: TcpStream, client: ClientConnection, broker: Arc<Broker>) {
    let peer = client.peer;
    let (reader, writer) = stream.into_split();
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    let (frame_tx, mut frame_rx) = mpsc::channel::<Frame>(MAX_IN_FLIGHT_PER_CONNECTION);
    let reader_task = tokio::spawn(read_frames(
        reader,
        frame_tx,
        broker.config.max_request_bytes,
        peer,
    ));
    let mut in_flight = FuturesOrdered::new();
    let mut reading = true;
    // A frame waiting for the requests before it (see the module docs), and
    // whether the request in flight is a barrier.
    let mut held: Option<Frame> = None;
    let mut barrier_in_flight = false;
    // Frames are dispatched in arrival order, so turns are handed out in it.
    let mut append_order = ConnectionAppendOrder::default();
    let mut start = |body: Bytes| {
        let turn = is_produce(&body).then(|| append_order.next_turn());
        dispatch_owned(broker.clone(), body, client.clone(), turn)
    };
    loop {
        if in_flight.is_empty() {
            barrier_in_flight = false;
            if let Some(frame) = held.take() {
                barrier_in_flight = is_barrier(&frame.body);
                in_flight.push_back(start(frame.body));
            }
        }
        tokio::select! {
            frame = frame_rx.recv(), if reading && held.is_none() && in_flight.len() < MAX_IN_FLIGHT_PER_CONNECTION => {
                match frame {
                    Some(frame) => {
                        let barrier = is_barrier(&frame.body);
                        if barrier_in_flight || (barrier && !in_flight.is_empty()) {
                            held = Some(frame);
                        } else {
                            barrier_in_flight = barrier;
                            in_flight.push_back(start(frame.body));
                        }
                    }
                    None => reading = false,
                }
            }
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                match answer {
                    Ok(Some(response)) => {
                        if let Err(e) = write_response(&mut writer, response).await {
                            debug!(%peer, error = %e, "write failed; closing connection");
                            break;
                        }
                    }
                    Ok(None) => {} // acks=0 produce: no answer by protocol
                    Err(DispatchError::Close(reason)) => {
                        warn!(%peer, %reason, "closing connection");
                        break;
                    }
                }
            }
            else => break,
        }
        if !reading && in_flight.is_empty() && held.is_none() {
            break;
        }
    }
    let _ = writer.flush().await;
    reader_task.abort();
    debug!(%peer, "connection closed");
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

async fn write_response(
    writer: &mut BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    response: BytesMut,
) -> std::io::Result<()> {
    let len = i32::try_from(response.len()).map_err(std::io::Error::other)?;
    writer.write_all(&len.to_be_bytes()).await?;
    writer.write_all(&response).await?;
    // Flush every answer: the next one in order may be a fetch parked for
    // seconds, and what is ready must not wait behind it.
    writer.flush().await
}

/// A broker's Kafka listeners, bound, each with its name.
pub(crate) struct BoundListeners(Vec<(Arc<str>, TcpListener)>);

/// Binds every Kafka listener of `config` (the main one and
/// `[listeners.*]`); an error names the listener that cannot work.
pub(crate) async fn bind_listeners(
    config: &crate::config::BrokerConfig,
) -> Result<BoundListeners, crate::BrokerError> {
    let mut bound = Vec::new();
    for listener in config
        .kafka_listeners()
        .map_err(crate::BrokerError::Config)?
    {
        let addr = listener.listen;
        let socket = TcpListener::bind(addr)
            .await
            .map_err(|source| crate::BrokerError::Bind { addr, source })?;
        info!(
            listener = %listener.name,
            %addr,
            advertised = %format!("{}:{}", listener.advertised_host, listener.advertised_port),
            "kafka listener bound"
        );
        bound.push((Arc::from(listener.name), socket));
    }
    Ok(BoundListeners(bound))
}

/// Accepts Kafka connections on every listener until `shutdown`.
pub(crate) async fn accept_all(
    listeners: BoundListeners,
    broker: Arc<Broker>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    futures::future::join_all(
        listeners
            .0
            .into_iter()
            .map(|(name, socket)| accept_loop(socket, name, Arc::clone(&broker), shutdown.clone())),
    )
    .await;
}
