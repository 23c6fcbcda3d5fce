//! The broker-facing gRPC service (`samsa.controller.v1.ControllerService`)
//! and [`ControllerCore`], the write path that runs the sans-IO handlers of
//! [`crate::logic`] against the Raft leader's image.
//!
//! # Write path
//!
//! Every write RPC goes through [`ControllerCore::write`]:
//!
//! 1. take the single writer lock (handlers run one at a time);
//! 2. `ensure_linearizable`: confirm leadership with a quorum and wait until
//!    the local state machine has applied everything committed so far — a
//!    non-leader answers `NOT_CONTROLLER` with the leader's id and address;
//! 3. if the Raft term changed since the last write, this node just became
//!    leader: reset broker liveness (every broker gets a full session);
//! 4. run the handler on the current image with the current time;
//! 5. commit the records as one batch with `client_write`, which returns once
//!    the batch is applied here; a batch rejected by the image's guards
//!    becomes an internal error (it cannot happen while 1–2 hold);
//! 6. answer.
//!
//! Because of 1, 2 and 5 each handler sees every earlier write. Reads
//! (`SubscribeMetadata`, `DescribeQuorum`) are served by any controller from
//! its own applied state, which only ever contains committed records. The
//! leader adds its view of replication to `DescribeQuorum`
//! ([`crate::quorum`]); a `leader_only` DescribeQuorum reaching another
//! controller answers NOT_CONTROLLER with the leader, like a write.
//!
//! # Metadata subscription
//!
//! A subscriber names the last offset it has; it gets either the batches
//! after it (from the state machine's recent history) or, when that history
//! no longer reaches back, a snapshot of the image first — then live batches.
//! If it falls too far behind the live feed it gets a fresh snapshot.
//! Updates never go backwards: anything at or below the last offset sent is
//! skipped.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use openraft::{BasicNode, Raft};
use samsa_proto::controller as pb;
use samsa_proto::controller::controller_service_server::ControllerService;
use tokio::sync::{broadcast, mpsc, watch, Mutex};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;
use uuid::Uuid;

use crate::convert::{self, error_to_pb};
use crate::error::{ControllerError, LeaderHint};
use crate::image::MetadataImage;
use crate::logic::{
    AllocateProducerIds, AlterConfigs, ControlledShutdown, ControllerLogic, CreateTopic,
    ElectLeaders, Outcome, Reassignment, TopicRef,
};
use crate::quorum::ReplicationClock;
use crate::records::{ConfigResource, MetadataBatch, MetadataRecord};
use crate::store::{ApplyOutcome, CatchUp, FeedEvent, StateMachineStore};
use crate::{NodeId, TypeConfig};

struct WriterState {
    logic: ControllerLogic,
    /// Raft term in which `logic`'s liveness was last reset.
    term: Option<u64>,
}

/// Broker heartbeats as they arrive, before they wait for the writer:
/// (broker id, broker epoch) → arrival time (ms since start).
type Contacts = std::sync::Mutex<std::collections::HashMap<(i32, i64), i64>>;

/// Runs controller handlers on the Raft leader and commits their records.
pub struct ControllerCore {
    node_id: NodeId,
    raft: Raft<TypeConfig>,
    sm: StateMachineStore,
    writer: Mutex<WriterState>,
    /// Heartbeat arrivals not yet seen by a handler (see [`Self::write`]).
    contacts: Contacts,
    started: Instant,
    write_timeout: Duration,
    /// Voters' answer times, fed by this node's Raft network client.
    clock: Arc<ReplicationClock>,
}

impl ControllerCore {
    pub fn new(
        node_id: NodeId,
        raft: Raft<TypeConfig>,
        sm: StateMachineStore,
        logic: ControllerLogic,
        write_timeout: Duration,
        clock: Arc<ReplicationClock>,
    ) -> Self {
        Self {
            node_id,
            raft,
            sm,
            writer: Mutex::new(WriterState { logic, term: None }),
            contacts: Contacts::default(),
            started: Instant::now(),
            write_timeout,
            clock,
        }
    }

    /// The Raft leader's view of replication (DescribeQuorum), `None`
    /// unless this node is the leader.
    pub fn replication_view(&self) -> Option<pb::QuorumReplication> {
        let metrics = self.raft.metrics().borrow().clone();
        crate::quorum::leader_view(&metrics, &self.clock, crate::quorum::wall_clock_ms())
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    pub fn state_machine(&self) -> &StateMachineStore {
        &self.sm
    }

    /// Notes that a heartbeat of `broker_id` at `broker_epoch` arrived now.
    /// Handlers run one at a time; the next one to run (a fencing tick
    /// included) counts this arrival even if the heartbeat's own handler is
    /// still queued behind a burst of other writes.
    pub fn note_heartbeat_arrival(&self, broker_id: i32, broker_epoch: i64) {
        let now = self.now_ms();
        let mut contacts = self.contacts.lock().unwrap_or_else(|p| p.into_inner());
        let slot = contacts.entry((broker_id, broker_epoch)).or_insert(now);
        *slot = (*slot).max(now);
    }

    /// Milliseconds since this process started the controller (monotonic).
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Current leader as this node sees it, with its address.
    pub fn leader_hint(&self) -> Option<LeaderHint> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let address = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        Some(LeaderHint {
            node_id: leader,
            address,
        })
    }

    fn forward(&self, f: &ForwardToLeader<NodeId, BasicNode>) -> ControllerError {
        let leader = match (f.leader_id, &f.leader_node) {
            (Some(node_id), Some(node)) => Some(LeaderHint {
                node_id,
                address: node.addr.clone(),
            }),
            _ => self.leader_hint().filter(|h| h.node_id != self.node_id),
        };
        ControllerError::NotController { leader }
    }

    /// Runs `handler` on the leader and commits its records (see the module
    /// docs). With `commit = false` the records are computed and dropped
    /// (`validate_only` requests).
    pub async fn write<R, F>(&self, commit: bool, handler: F) -> Result<R, ControllerError>
    where
        F: FnOnce(&mut ControllerLogic, &MetadataImage, i64) -> Outcome<R>,
    {
        let timeout = |what: &str| {
            ControllerError::Timeout(format!("{what} took longer than {:?}", self.write_timeout))
        };
        let mut writer = tokio::time::timeout(self.write_timeout, self.writer.lock())
            .await
            .map_err(|_| timeout("waiting for the writer lock"))?;
        tokio::time::timeout(self.write_timeout, self.raft.ensure_linearizable())
            .await
            .map_err(|_| timeout("confirming leadership"))?
            .map_err(|e| match e {
                RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => self.forward(&f),
                RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
                    tracing::warn!(node_id = self.node_id, error = %q, "no quorum");
                    ControllerError::NotController { leader: None }
                }
                RaftError::Fatal(f) => ControllerError::Internal(format!("raft stopped: {f}")),
            })?;
        let now = self.now_ms();
        let term = self.raft.metrics().borrow().current_term;
        if writer.term != Some(term) {
            tracing::info!(
                node_id = self.node_id,
                term,
                "active controller: broker sessions restart now"
            );
            writer.logic.reset_liveness(now);
            writer.term = Some(term);
        }
        let image = self.sm.image();
        let arrivals =
            std::mem::take(&mut *self.contacts.lock().unwrap_or_else(|p| p.into_inner()));
        for ((broker_id, broker_epoch), at) in arrivals {
            writer
                .logic
                .note_contact(&image, broker_id, broker_epoch, at);
        }
        let (records, reply) = handler(&mut writer.logic, &image, now)?;
        if records.is_empty() || !commit {
            return Ok(reply);
        }
        self.commit(records).await?;
        Ok(reply)
    }

    async fn commit(&self, records: Vec<MetadataRecord>) -> Result<u64, ControllerError> {
        let count = records.len();
        let response = tokio::time::timeout(
            self.write_timeout,
            self.raft.client_write(MetadataBatch { records }),
        )
        .await
        .map_err(|_| ControllerError::Timeout("committing metadata records".into()))?
        .map_err(|e| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => self.forward(&f),
            RaftError::APIError(other) => ControllerError::Internal(other.to_string()),
            RaftError::Fatal(f) => ControllerError::Internal(format!("raft stopped: {f}")),
        })?;
        match response.data {
            ApplyOutcome::Applied { offset } => {
                tracing::debug!(
                    node_id = self.node_id,
                    offset,
                    count,
                    "committed metadata batch"
                );
                Ok(offset)
            }
            ApplyOutcome::Rejected { offset, reason } => {
                tracing::error!(node_id = self.node_id, offset, %reason, "committed batch was rejected by the image");
                Err(ControllerError::Internal(format!(
                    "metadata batch at offset {offset} was rejected: {reason}"
                )))
            }
            ApplyOutcome::NoOp { offset } => Err(ControllerError::Internal(format!(
                "metadata batch at offset {offset} applied as a no-op"
            ))),
        }
    }
}

/// The tonic service brokers and admin tools talk to.
pub struct ControllerGrpc {
    core: Arc<ControllerCore>,
    voters: Vec<(NodeId, String)>,
    /// Becomes `true` when the node stops; ends metadata streams.
    stop: watch::Receiver<bool>,
}

impl ControllerGrpc {
    pub fn new(
        core: Arc<ControllerCore>,
        voters: Vec<(NodeId, String)>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self { core, voters, stop }
    }
}

fn err<T: Default>(e: &ControllerError, set: impl FnOnce(&mut T, pb::ControllerError)) -> T {
    let mut resp = T::default();
    set(&mut resp, error_to_pb(e));
    resp
}

/// One CreateTopics entry: the topic id it asks for (a resend carries its
/// first send's, see `CreatableTopic.topic_id`), else a new one, and the
/// request.
fn topic_to_create(topic: pb::CreatableTopic) -> Result<(Uuid, CreateTopic), ControllerError> {
    let topic_id = if topic.topic_id.is_empty() {
        Uuid::new_v4()
    } else {
        convert::parse_uuid(&topic.topic_id, "topic id")?
    };
    Ok((topic_id, convert::create_topic_from_pb(topic)?))
}

fn topic_error(name: String, e: &ControllerError) -> pb::TopicResult {
    pb::TopicResult {
        name,
        error_code: i32::from(e.code()),
        error_message: e.to_string(),
        ..Default::default()
    }
}

type UpdateStream =
    Pin<Box<dyn Stream<Item = Result<pb::MetadataUpdate, Status>> + Send + 'static>>;

fn snapshot_update(image: &MetadataImage) -> Result<pb::MetadataUpdate, Status> {
    Ok(pb::MetadataUpdate {
        offset: image.offset(),
        kind: Some(pb::metadata_update::Kind::Snapshot(
            serde_json::to_vec(image).map_err(|e| Status::internal(e.to_string()))?,
        )),
    })
}

fn batch_update(offset: u64, records: &[MetadataRecord]) -> Result<pb::MetadataUpdate, Status> {
    Ok(pb::MetadataUpdate {
        offset,
        kind: Some(pb::metadata_update::Kind::Records(
            serde_json::to_vec(records).map_err(|e| Status::internal(e.to_string()))?,
        )),
    })
}

/// Feeds one subscriber until it goes away or the state machine stops.
async fn run_subscription(
    sm: StateMachineStore,
    broker_id: i32,
    after_offset: u64,
    tx: mpsc::Sender<Result<pb::MetadataUpdate, Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let feed = sm.subscribe(after_offset);
    let mut events = feed.events;
    let mut last = after_offset;
    let mut pending = Vec::new();
    match feed.catch_up {
        CatchUp::Batches(batches) => {
            for b in batches {
                pending.push((b.offset, batch_update(b.offset, &b.records)));
            }
        }
        CatchUp::Snapshot(image) => pending.push((image.offset(), snapshot_update(&image))),
    }
    for (offset, update) in pending {
        if offset <= last {
            continue;
        }
        if tx.send(update).await.is_err() {
            return;
        }
        last = offset;
    }
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        let update = match event {
            Ok(FeedEvent::Batch(b)) if b.offset > last => {
                (b.offset, batch_update(b.offset, &b.records))
            }
            Ok(FeedEvent::Batch(_)) => continue,
            Ok(FeedEvent::Reset(image)) if image.offset() > last => {
                (image.offset(), snapshot_update(&image))
            }
            Ok(FeedEvent::Reset(_)) => continue,
            Err(broadcast::error::RecvError::Lagged(skipped)) => {
                tracing::info!(
                    broker_id,
                    skipped,
                    "metadata subscriber lagged; sending a snapshot"
                );
                let image = sm.image();
                (image.offset(), snapshot_update(&image))
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(update.1).await.is_err() {
            return;
        }
        last = last.max(update.0);
    }
}

#[tonic::async_trait]
impl ControllerService for ControllerGrpc {
    async fn describe_quorum(
        &self,
        request: Request<pb::DescribeQuorumRequest>,
    ) -> Result<Response<pb::DescribeQuorumResponse>, Status> {
        let image = self.core.sm.image();
        let hint = self.core.leader_hint();
        let replication = self.core.replication_view();
        if request.get_ref().leader_only && replication.is_none() {
            let leader = hint.clone().filter(|h| h.node_id != self.core.node_id);
            return Ok(Response::new(pb::DescribeQuorumResponse {
                node_id: self.core.node_id,
                error: Some(error_to_pb(&ControllerError::NotController { leader })),
                ..Default::default()
            }));
        }
        let cluster_id = self
            .core
            .sm
            .watch_cluster_id()
            .borrow()
            .clone()
            .unwrap_or_default();
        Ok(Response::new(pb::DescribeQuorumResponse {
            cluster_id,
            node_id: self.core.node_id,
            leader_id: hint.as_ref().map(|h| h.node_id),
            leader_address: hint.map(|h| h.address).unwrap_or_default(),
            metadata_offset: image.offset(),
            voters: self
                .voters
                .iter()
                .map(|(id, addr)| pb::Voter {
                    node_id: *id,
                    address: addr.clone(),
                })
                .collect(),
            error: None,
            replication,
            registered_brokers: image.brokers().map(|b| b.broker_id).collect(),
        }))
    }

    async fn register_broker(
        &self,
        request: Request<pb::RegisterBrokerRequest>,
    ) -> Result<Response<pb::RegisterBrokerResponse>, Status> {
        let result = match convert::register_from_pb(request.into_inner()) {
            Ok(req) => {
                self.core
                    .write(true, move |logic, image, now| {
                        logic.register_broker(image, req, now)
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        let cluster_id = self
            .core
            .sm
            .image()
            .cluster_id()
            .unwrap_or_default()
            .to_owned();
        Ok(Response::new(match result {
            Ok(reply) => pb::RegisterBrokerResponse {
                error: None,
                broker_epoch: reply.broker_epoch,
                cluster_id,
            },
            Err(e) => err(&e, |r: &mut pb::RegisterBrokerResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    async fn broker_heartbeat(
        &self,
        request: Request<pb::BrokerHeartbeatRequest>,
    ) -> Result<Response<pb::BrokerHeartbeatResponse>, Status> {
        let req = convert::heartbeat_from_pb(request.into_inner());
        self.core
            .note_heartbeat_arrival(req.broker_id, req.broker_epoch);
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.heartbeat(image, req, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(reply) => pb::BrokerHeartbeatResponse {
                error: None,
                is_fenced: reply.is_fenced,
                is_caught_up: reply.is_caught_up,
                should_shut_down: reply.should_shut_down,
            },
            Err(e) => err(&e, |r: &mut pb::BrokerHeartbeatResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    async fn controlled_shutdown(
        &self,
        request: Request<pb::ControlledShutdownRequest>,
    ) -> Result<Response<pb::ControlledShutdownResponse>, Status> {
        let req = request.into_inner();
        let req = ControlledShutdown {
            broker_id: req.broker_id,
            broker_epoch: req.broker_epoch,
        };
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.controlled_shutdown(image, req, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(reply) => pb::ControlledShutdownResponse {
                error: None,
                leaderships_moved: reply.leaderships_moved,
                partitions_offline: reply
                    .partitions_offline
                    .into_iter()
                    .map(|(topic, partition)| pb::TopicPartition { topic, partition })
                    .collect(),
                shutdown_ready: reply.shutdown_ready,
            },
            Err(e) => err(&e, |r: &mut pb::ControlledShutdownResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    async fn unregister_broker(
        &self,
        request: Request<pb::UnregisterBrokerRequest>,
    ) -> Result<Response<pb::UnregisterBrokerResponse>, Status> {
        let broker_id = request.into_inner().broker_id;
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.unregister_broker(image, broker_id, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(()) => pb::UnregisterBrokerResponse { error: None },
            Err(e) => err(&e, |r: &mut pb::UnregisterBrokerResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    type SubscribeMetadataStream = UpdateStream;

    async fn subscribe_metadata(
        &self,
        request: Request<pb::SubscribeMetadataRequest>,
    ) -> Result<Response<Self::SubscribeMetadataStream>, Status> {
        let req = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let sm = self.core.sm.clone();
        tracing::debug!(
            node_id = self.core.node_id,
            broker_id = req.broker_id,
            after = req.after_offset,
            "metadata subscription"
        );
        let span = tracing::info_span!(
            "metadata_feed",
            node_id = self.core.node_id,
            broker_id = req.broker_id
        );
        tokio::spawn(
            run_subscription(sm, req.broker_id, req.after_offset, tx, self.stop.clone())
                .instrument(span),
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn allocate_producer_ids(
        &self,
        request: Request<pb::AllocateProducerIdsRequest>,
    ) -> Result<Response<pb::AllocateProducerIdsResponse>, Status> {
        let req = request.into_inner();
        let req = AllocateProducerIds {
            broker_id: req.broker_id,
            broker_epoch: req.broker_epoch,
        };
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.allocate_producer_ids(image, req, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(block) => pb::AllocateProducerIdsResponse {
                error: None,
                producer_id_start: block.first,
                producer_id_len: block.size,
            },
            Err(e) => err(&e, |r: &mut pb::AllocateProducerIdsResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    async fn create_topics(
        &self,
        request: Request<pb::CreateTopicsRequest>,
    ) -> Result<Response<pb::CreateTopicsResponse>, Status> {
        let req = request.into_inner();
        let mut results = Vec::with_capacity(req.topics.len());
        for topic in req.topics {
            let name = topic.name.clone();
            let result = match topic_to_create(topic) {
                Ok((topic_id, create)) => {
                    self.core
                        .write(!req.validate_only, move |logic, image, now| {
                            logic.create_topic(image, create, topic_id, now)
                        })
                        .await
                }
                Err(e) => Err(e),
            };
            results.push(match result {
                Ok(reply) => pb::TopicResult {
                    name,
                    topic_id: reply.topic_id.to_string(),
                    error_code: 0,
                    error_message: String::new(),
                    num_partitions: reply.num_partitions,
                    replication_factor: reply.replication_factor,
                },
                // The whole call goes elsewhere, but only while nothing of
                // it was done here: resent, a topic created above would be
                // answered TOPIC_ALREADY_EXISTS. Later topics answer
                // NOT_CONTROLLER each, and the client resends only them.
                Err(e @ ControllerError::NotController { .. }) if results.is_empty() => {
                    return Ok(Response::new(pb::CreateTopicsResponse {
                        error: Some(error_to_pb(&e)),
                        topics: Vec::new(),
                    }));
                }
                Err(e) => topic_error(name, &e),
            });
        }
        Ok(Response::new(pb::CreateTopicsResponse {
            error: None,
            topics: results,
        }))
    }

    async fn delete_topics(
        &self,
        request: Request<pb::DeleteTopicsRequest>,
    ) -> Result<Response<pb::DeleteTopicsResponse>, Status> {
        let req = request.into_inner();
        let mut targets: Vec<(String, Result<TopicRef, ControllerError>)> = req
            .names
            .into_iter()
            .map(|n| (n.clone(), Ok(TopicRef::Name(n))))
            .collect();
        for id in req.topic_ids {
            let parsed = convert::parse_uuid(&id, "topic id").map(TopicRef::Id);
            targets.push((id, parsed));
        }
        let mut results = Vec::with_capacity(targets.len());
        for (label, target) in targets {
            let result = match target {
                Ok(target) => {
                    self.core
                        .write(true, move |logic, image, now| {
                            logic.delete_topic(image, target, now)
                        })
                        .await
                }
                Err(e) => Err(e),
            };
            results.push(match result {
                Ok(reply) => pb::TopicResult {
                    name: reply.name,
                    topic_id: reply.topic_id.to_string(),
                    ..Default::default()
                },
                // As for CreateTopics: redirected only while nothing was done.
                Err(e @ ControllerError::NotController { .. }) if results.is_empty() => {
                    return Ok(Response::new(pb::DeleteTopicsResponse {
                        error: Some(error_to_pb(&e)),
                        topics: Vec::new(),
                    }));
                }
                Err(e) => topic_error(label, &e),
            });
        }
        Ok(Response::new(pb::DeleteTopicsResponse {
            error: None,
            topics: results,
        }))
    }

    async fn create_partitions(
        &self,
        request: Request<pb::CreatePartitionsRequest>,
    ) -> Result<Response<pb::CreatePartitionsResponse>, Status> {
        let req = request.into_inner();
        let mut results = Vec::with_capacity(req.topics.len());
        for topic in req.topics {
            let name = topic.name.clone();
            let create = convert::create_partitions_from_pb(topic);
            let result = self
                .core
                .write(!req.validate_only, move |logic, image, now| {
                    logic.create_partitions(image, create, now)
                })
                .await;
            results.push(match result {
                Ok(reply) => pb::TopicResult {
                    name,
                    topic_id: reply.topic_id.to_string(),
                    num_partitions: reply.num_partitions,
                    ..Default::default()
                },
                // As for CreateTopics: redirected only while nothing was done.
                Err(e @ ControllerError::NotController { .. }) if results.is_empty() => {
                    return Ok(Response::new(pb::CreatePartitionsResponse {
                        error: Some(error_to_pb(&e)),
                        topics: Vec::new(),
                    }));
                }
                Err(e) => topic_error(name, &e),
            });
        }
        Ok(Response::new(pb::CreatePartitionsResponse {
            error: None,
            topics: results,
        }))
    }

    async fn alter_configs(
        &self,
        request: Request<pb::AlterConfigsRequest>,
    ) -> Result<Response<pb::AlterConfigsResponse>, Status> {
        let req = request.into_inner();
        let resource = match (req.topic.is_empty(), req.broker_id) {
            (false, _) => ConfigResource::Topic { name: req.topic },
            (true, Some(id)) => ConfigResource::Broker { id },
            (true, None) => ConfigResource::Cluster,
        };
        let alter = AlterConfigs {
            resource,
            changes: req.configs.into_iter().map(|c| (c.name, c.value)).collect(),
        };
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.alter_configs(image, alter, now)
            })
            .await;
        Ok(Response::new(pb::AlterConfigsResponse {
            error: result.err().map(|e| error_to_pb(&e)),
        }))
    }

    async fn alter_security(
        &self,
        request: Request<pb::AlterSecurityRequest>,
    ) -> Result<Response<pb::AlterSecurityResponse>, Status> {
        let parsed: Result<Vec<MetadataRecord>, _> = request
            .into_inner()
            .records_json
            .iter()
            .map(|json| serde_json::from_str::<MetadataRecord>(json))
            .collect();
        let result = match parsed {
            Ok(records) => {
                self.core
                    .write(true, move |logic, image, now| {
                        logic.alter_security(image, records, now)
                    })
                    .await
            }
            Err(e) => Err(ControllerError::InvalidRequest(format!(
                "undecodable security record: {e}"
            ))),
        };
        Ok(Response::new(pb::AlterSecurityResponse {
            error: result.err().map(|e| error_to_pb(&e)),
        }))
    }

    async fn alter_partition(
        &self,
        request: Request<pb::AlterPartitionRequest>,
    ) -> Result<Response<pb::AlterPartitionResponse>, Status> {
        let result = match convert::alter_partition_from_pb(request.into_inner()) {
            Ok(req) => {
                self.core
                    .write(true, move |logic, image, now| {
                        logic.alter_partition(image, req, now)
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        Ok(Response::new(convert::alter_partition_response(&result)))
    }

    async fn alter_partitions(
        &self,
        request: Request<pb::AlterPartitionsRequest>,
    ) -> Result<Response<pb::AlterPartitionsResponse>, Status> {
        let result = match convert::alter_partitions_from_pb(request.into_inner()) {
            Ok(reqs) => {
                self.core
                    .write(true, move |logic, image, now| {
                        logic.alter_partitions(image, reqs, now)
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        Ok(Response::new(match result {
            Ok(results) => pb::AlterPartitionsResponse {
                error: None,
                results: results
                    .iter()
                    .map(convert::alter_partition_response)
                    .collect(),
            },
            Err(e) => err(&e, |r: &mut pb::AlterPartitionsResponse, e| {
                r.error = Some(e)
            }),
        }))
    }

    async fn elect_leaders(
        &self,
        request: Request<pb::ElectLeadersRequest>,
    ) -> Result<Response<pb::ElectLeadersResponse>, Status> {
        let req = request.into_inner();
        let elect = ElectLeaders {
            election_type: convert::election_type_from_pb(req.election_type),
            partitions: (!req.partitions.is_empty()).then(|| {
                req.partitions
                    .into_iter()
                    .map(|tp| (tp.topic, tp.partition))
                    .collect()
            }),
        };
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.elect_leaders(image, elect, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(results) => pb::ElectLeadersResponse {
                error: None,
                results: results
                    .into_iter()
                    .map(|r| match r.result {
                        Ok(leader) => pb::PartitionElectionResult {
                            topic: r.topic,
                            partition: r.partition,
                            leader,
                            ..Default::default()
                        },
                        Err(e) => pb::PartitionElectionResult {
                            topic: r.topic,
                            partition: r.partition,
                            error_code: i32::from(e.code()),
                            error_message: e.to_string(),
                            leader: crate::records::NO_LEADER,
                        },
                    })
                    .collect(),
            },
            Err(e) => err(&e, |r: &mut pb::ElectLeadersResponse, e| r.error = Some(e)),
        }))
    }

    async fn alter_partition_reassignments(
        &self,
        request: Request<pb::AlterPartitionReassignmentsRequest>,
    ) -> Result<Response<pb::AlterPartitionReassignmentsResponse>, Status> {
        let requests: Vec<Reassignment> = request
            .into_inner()
            .partitions
            .into_iter()
            .map(|p| Reassignment {
                topic: p.topic,
                partition: p.partition,
                target: (!p.cancel).then_some(p.replicas),
            })
            .collect();
        let result = self
            .core
            .write(true, move |logic, image, now| {
                logic.alter_reassignments(image, requests, now)
            })
            .await;
        Ok(Response::new(match result {
            Ok(results) => pb::AlterPartitionReassignmentsResponse {
                error: None,
                results: results
                    .into_iter()
                    .map(|r| {
                        let (error_code, error_message) = match r.result {
                            Ok(()) => (0, String::new()),
                            Err(e) => (i32::from(e.code()), e.to_string()),
                        };
                        pb::PartitionReassignmentResult {
                            topic: r.topic,
                            partition: r.partition,
                            error_code,
                            error_message,
                        }
                    })
                    .collect(),
            },
            Err(e) => err(&e, |r: &mut pb::AlterPartitionReassignmentsResponse, e| {
                r.error = Some(e)
            }),
        }))
    }
}
