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
//! Watches are subscribed before reading, so no wake-up is lost.

use kafka_protocol::error::ResponseError;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::select_all;
use samsa_proto::replication::replication_service_server::ReplicationService;
use samsa_proto::replication::{
    EpochEndOffset, PartitionData, ReplicaFetchRequest, ReplicaFetchResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::isr::IsrProposal;
use super::state::ReplicaFetch;
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
        let req = request.into_inner();
        let deadline =
            Instant::now() + Duration::from_millis(u64::from(req.max_wait_ms)).min(MAX_WAIT_CAP);
        let partitions: Vec<_> = req
            .partitions
            .iter()
            .map(|p| hub.broker.replicas.get(&p.topic, p.partition))
            .collect();
        // When this fetch first saw a HW newer than the follower's.
        let mut hw_news_since: Option<Instant> = None;
        loop {
            let mut watches = Vec::new();
            for p in partitions.iter().flatten() {
                watches.push(p.watch_log_end());
                let hw = p.watch_high_watermark();
                watches.push(hw);
            }
            for w in &mut watches {
                w.borrow_and_update();
            }
            let mut budget = req.max_bytes as usize;
            let mut ready = false;
            let mut hw_news = false;
            let mut out = Vec::with_capacity(req.partitions.len());
            let now = now_ms();
            let throttle_rate = hub
                .broker
                .effective_config()
                .leader_replication_throttled_rate;
            let throttles = &hub.broker.replication_throttles;
            for (fp, partition) in req.partitions.iter().zip(&partitions) {
                let mut data = PartitionData {
                    topic: fp.topic.clone(),
                    partition: fp.partition,
                    ..PartitionData::default()
                };
                let Some(partition) = partition else {
                    data.error_code = i32::from(ResponseError::NotLeaderOrFollower.code());
                    ready = true;
                    out.push(data);
                    continue;
                };
                let reassigning = throttle_rate.is_some() && partition.is_adding(req.replica_id);
                let answer = partition.serve_replica_fetch(
                    ReplicaFetch {
                        replica_id: req.replica_id,
                        current_leader_epoch: fp.current_leader_epoch,
                        fetch_offset: fp.fetch_offset,
                        last_fetched_epoch: fp.last_fetched_epoch,
                        max_bytes: budget,
                        throttled: reassigning
                            && !throttles
                                .leader
                                .admits(throttle_rate, std::time::Instant::now()),
                    },
                    now,
                );
                if reassigning {
                    throttles.leader.spend(answer.records.len());
                }
                if let Some(isr) = answer.expand_isr_to {
                    let _ = hub.isr_proposals.send(IsrProposal {
                        partition: Arc::clone(partition),
                        new_isr: isr,
                        leader_epoch: None,
                    });
                }
                budget = budget.saturating_sub(answer.records.len());
                ready |= !answer.records.is_empty()
                    || answer.error_code != 0
                    || answer.diverging.is_some();
                hw_news |= answer.high_watermark > fp.high_watermark;
                data.error_code = i32::from(answer.error_code);
                data.high_watermark = answer.high_watermark;
                data.log_start_offset = answer.log_start_offset;
                data.log_end_offset = answer.log_end_offset;
                data.diverging_epoch = answer.diverging.map(|end| EpochEndOffset {
                    epoch: end.epoch,
                    end_offset: end.end_offset,
                });
                data.records = answer.records;
                out.push(data);
            }
            let looked_at = Instant::now();
            let mut wait_until = deadline;
            if hw_news {
                let since = *hw_news_since.get_or_insert(looked_at);
                wait_until = wait_until.min(since + HW_ONLY_LINGER);
            }
            if ready || watches.is_empty() || looked_at >= wait_until {
                return Ok(Response::new(ReplicaFetchResponse { partitions: out }));
            }
            let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
            if tokio::time::timeout_at(wait_until, changed).await.is_err() {
                // Nothing moved, or news of the HW alone waited long
                // enough: answer with what there is (no records).
                return Ok(Response::new(ReplicaFetchResponse { partitions: out }));
            }
        }
    }
}
