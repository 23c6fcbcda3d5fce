//! The leader side of replication: the `ReplicationService` gRPC server.
//!
//! A fetch is answered at once when any partition has records, an error or
//! a divergence; otherwise it is held (long poll) until one of those
//! happens or `max_wait_ms` passes. A HW newer than the follower knows is
//! answered too, but only after [`HW_ONLY_LINGER`], unless records come
//! first and carry it: under load nearly every HW move is followed by the
//! next batch within a few milliseconds, and answering each move at once
//! cost every follower an extra round trip per batch (the fetch that
//! reports a follower's new log end moves the HW itself, so it came back
//! empty at once). The leader's own HW, which acks=all waits for, does not
//! depend on this: followers report their log end with every fetch.
//! A held fetch waits on the broker-wide news board
//! ([`Partition::note_replication_news`](crate::replica::Partition::note_replication_news)),
//! subscribed before reading, so no wake-up is lost. A fetch of a session
//! looks only at partitions with news or not settled, and answers only
//! those with something to tell ([`super::session`]).

use kafka_protocol::error::ResponseError;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use samsa_proto::replication::replication_service_server::ReplicationService;
use samsa_proto::replication::{ReplicaFetchRequest, ReplicaFetchResponse};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::isr::IsrProposal;
use super::session::{FetchSessions, LeaderSession, LeaderThrottle, Look};
use crate::{now_ms, Broker};

/// Longest hold of a fetch, whatever the follower asks.
const MAX_WAIT_CAP: Duration = Duration::from_secs(10);
/// How long news of the HW alone waits for records to travel with.
const HW_ONLY_LINGER: Duration = Duration::from_millis(5);

/// What the service needs once the broker exists (the gRPC server starts
/// with the controller, before the broker is open).
pub struct ReplicationHub {
    pub broker: Arc<Broker>,
    pub isr_proposals: mpsc::UnboundedSender<IsrProposal>,
    /// Followers' fetch sessions with this broker as their leader.
    pub sessions: FetchSessions,
}

#[derive(Clone, Default)]
pub struct ReplicationGrpc {
    hub: Arc<OnceLock<Arc<ReplicationHub>>>,
}

impl ReplicationGrpc {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the service answer; until then it is UNAVAILABLE.
    pub fn attach(&self, hub: Arc<ReplicationHub>) {
        let _ = self.hub.set(hub);
    }
}

#[tonic::async_trait]
impl ReplicationService for ReplicationGrpc {
    async fn fetch(
        &self,
        request: Request<ReplicaFetchRequest>,
    ) -> Result<Response<ReplicaFetchResponse>, Status> {
        let Some(hub) = self.hub.get().cloned() else {
            return Err(Status::unavailable("the broker is starting"));
        };
        let mut req = request.into_inner();
        // Taken by the session: a new one, or the update of an open one.
        let mut named = Some(std::mem::take(&mut req.partitions));
        let deadline =
            Instant::now() + Duration::from_millis(u64::from(req.max_wait_ms)).min(MAX_WAIT_CAP);
        let replicas = &hub.broker.replicas;
        let now = now_ms();
        let full = req.session_id == 0;
        let session = if full {
            let id = if req.open_session {
                hub.sessions.new_id()
            } else {
                0
            };
            let session = Arc::new(tokio::sync::Mutex::new(LeaderSession::new(
                id,
                named.take().unwrap_or_default(),
                replicas,
                now,
            )));
            if id != 0 {
                hub.sessions.insert(req.replica_id, Arc::clone(&session));
            }
            session
        } else {
            let Some(session) = hub.sessions.get(req.replica_id) else {
                return Ok(session_error(ResponseError::FetchSessionIdNotFound));
            };
            session
        };
        // One fetch of a session at a time: a second one (the follower gave
        // up on the first) is refused and the follower starts over.
        let Ok(mut session) = session.try_lock_owned() else {
            return Ok(session_error(ResponseError::InvalidFetchSessionEpoch));
        };
        if !full {
            if session.id != req.session_id {
                return Ok(session_error(ResponseError::FetchSessionIdNotFound));
            }
            if !session.expects(req.session_epoch) {
                return Ok(session_error(ResponseError::InvalidFetchSessionEpoch));
            }
            session.update(
                named.take().unwrap_or_default(),
                &req.forgotten,
                req.replica_id,
                replicas,
            );
        }
        if let Some(clock) = &session.clock {
            clock.tick(now);
        }
        let news_board = Arc::clone(replicas.replication_news_board());
        // When this fetch first saw a HW newer than the follower's.
        let mut hw_news_since: Option<Instant> = None;
        loop {
            // Subscribed before looking, so no news is lost in between.
            let news = news_board.next_post();
            tokio::pin!(news);
            news.as_mut().enable();
            session.look_up_again_if_moved(replicas);
            let throttle_rate = hub
                .broker
                .effective_config()
                .leader_replication_throttled_rate;
            let look = session.look(
                req.replica_id,
                full,
                req.max_bytes as usize,
                LeaderThrottle {
                    rate: throttle_rate,
                    meter: &hub.broker.replication_throttles.leader,
                },
                now_ms(),
            );
            for (partition, new_isr) in look.expand_isr {
                let _ = hub.isr_proposals.send(IsrProposal {
                    partition,
                    new_isr,
                    leader_epoch: None,
                });
            }
            let Look {
                out,
                told,
                ready,
                hw_news,
                ..
            } = look;
            let looked_at = Instant::now();
            let mut wait_until = deadline;
            if hw_news {
                let since = *hw_news_since.get_or_insert(looked_at);
                wait_until = wait_until.min(since + HW_ONLY_LINGER);
            }
            // Waiting ends with news (look again) or at `wait_until`:
            // nothing moved, or news of the HW alone waited long enough,
            // and the answer goes with what there is (no records).
            let answer_now = ready
                || session.entries.is_empty()
                || looked_at >= wait_until
                || tokio::time::timeout_at(wait_until, news).await.is_err();
            if answer_now {
                session.answered(told);
                return Ok(Response::new(ReplicaFetchResponse {
                    partitions: out,
                    session_id: session.id,
                    error_code: 0,
                }));
            }
        }
    }
}

/// An answer refusing the session: the follower sends a full fetch next.
fn session_error(error: ResponseError) -> Response<ReplicaFetchResponse> {
    Response::new(ReplicaFetchResponse {
        partitions: Vec::new(),
        session_id: 0,
        error_code: i32::from(error.code()),
    })
}
