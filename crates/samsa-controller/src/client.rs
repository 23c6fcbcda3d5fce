//! What a broker (or an admin tool) uses to talk to the controller quorum.
//!
//! - [`ControllerClient`]: typed calls for every broker-facing RPC. It keeps
//!   a list of controller addresses, remembers the leader, follows
//!   `NOT_CONTROLLER` leader hints and retries on other controllers when one
//!   is unreachable or has no leader, within a deadline. Failures come back
//!   as [`ControllerError`] with the Kafka code the controller chose.
//! - [`MetadataFollower`]: a task that keeps a local [`MetadataImage`] up to
//!   date from `SubscribeMetadata` on any controller, resuming from its offset
//!   after a disconnect.
//!
//! Retries: NOT_CONTROLLER and transport failures are retried; a timeout
//! (`REQUEST_TIMED_OUT`) is returned, because the write may still have been
//! committed. A transport failure can also come after the request reached a
//! controller that then failed, its write committed by the next leader: a
//! resend of CreateTopics carries the topic id of the first send, so the
//! controller recognises it and answers success (not TOPIC_ALREADY_EXISTS).
//! Other resent writes repeat harmlessly (configs, ACLs, reassignments; a
//! producer-id block is skipped) or are answered as a second request
//! would be, as Kafka's are: DeleteTopics (UNKNOWN_TOPIC_OR_PARTITION),
//! CreatePartitions (INVALID_PARTITIONS), ElectLeaders
//! (ELECTION_NOT_NEEDED).
//!
//! Invariant: no call outlives its deadline. Every attempt is bounded by
//! what is left of it, because a controller that is cut off (packets
//! dropped, process paused) keeps its TCP connection open and would never
//! answer: the call would hang until HTTP/2 keep-alive gives up, long after
//! the broker's session expired. An attempt that times out forgets the
//! remembered leader, so the next attempt or call asks another controller.
//! A client built [`ControllerClient::with_attempt_timeout`] (for calls that
//! are safe to repeat, such as heartbeats) retries elsewhere within the
//! same call.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use samsa_proto::controller as pb;
use samsa_proto::controller::controller_service_client::ControllerServiceClient;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Response, Status};
use uuid::Uuid;

use crate::convert;
use crate::error::ControllerError;
use crate::image::{MetadataImage, PartitionState};
use crate::logic::{
    AlterPartition, ControlledShutdownReply, CreatePartitions, CreatePartitionsReply, CreateTopic,
    CreateTopicReply, DeleteTopicReply, ElectLeaders, ElectionResult, Heartbeat, HeartbeatReply,
    ProducerIdBlock, Reassignment, ReassignmentResult, RegisterBroker, RegisterBrokerReply,
    TopicRef,
};
use crate::network::{lazy_channel, MAX_MESSAGE_BYTES};
use crate::records::{BrokerId, ConfigResource, MetadataRecord};

/// Responses that carry a `ControllerError`.
trait HasError {
    fn error(&self) -> Option<pb::ControllerError>;
}

macro_rules! has_error {
    ($($t:ty),* $(,)?) => {
        $(impl HasError for $t {
            fn error(&self) -> Option<pb::ControllerError> {
                self.error.clone()
            }
        })*
    };
}

has_error!(
    pb::RegisterBrokerResponse,
    pb::BrokerHeartbeatResponse,
    pb::ControlledShutdownResponse,
    pb::UnregisterBrokerResponse,
    pb::AllocateProducerIdsResponse,
    pb::CreateTopicsResponse,
    pb::DeleteTopicsResponse,
    pb::CreatePartitionsResponse,
    pb::AlterConfigsResponse,
    pb::AlterSecurityResponse,
    pb::AlterPartitionsResponse,
    pb::ElectLeadersResponse,
    pb::AlterPartitionReassignmentsResponse,
);

impl HasError for pb::DescribeQuorumResponse {
    fn error(&self) -> Option<pb::ControllerError> {
        // Only `leader_only` requests get one (NOT_CONTROLLER).
        self.error.clone()
    }
}

struct ClientInner {
    endpoints: Vec<String>,
    leader: Mutex<Option<String>>,
    /// One lazily connected channel per address, reused across calls.
    channels: Mutex<HashMap<String, Channel>>,
    /// Which endpoint to ask next when no leader is known; shared by all
    /// calls so that one that gave up on a silent controller does not make
    /// the next call start at the same one.
    next_endpoint: AtomicUsize,
    deadline: Duration,
    /// Mutual TLS to the controllers (`crate::tls`).
    tls: Option<crate::tls::InterNodeTls>,
    /// Bound of one attempt when calls may be repeated (see the module doc);
    /// `None`: an attempt may use the whole remaining deadline and a timeout
    /// ends the call.
    attempt_timeout: Option<Duration>,
}

/// Client of the controller quorum; cheap to clone.
#[derive(Clone)]
pub struct ControllerClient {
    inner: Arc<ClientInner>,
}

fn topic_result_error(r: &pb::TopicResult) -> Result<(), ControllerError> {
    if r.error_code == 0 {
        return Ok(());
    }
    let code = i16::try_from(r.error_code)
        .unwrap_or(crate::error::ResponseError::UnknownServerError.code());
    Err(ControllerError::from_code(
        code,
        r.error_message.clone(),
        None,
    ))
}

impl ControllerClient {
    /// `endpoints`: controller gRPC addresses (`host:port`), e.g. the voter
    /// addresses. Calls give up after `deadline` of retrying.
    pub fn new<I, S>(endpoints: I, deadline: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::build(endpoints, deadline, None)
    }

    /// Like [`ControllerClient::new`], for calls that are safe to repeat
    /// (heartbeats, registration with one incarnation id): an attempt that
    /// gets no answer within `attempt_timeout` is retried on another
    /// controller while the deadline lasts.
    pub fn with_attempt_timeout<I, S>(
        endpoints: I,
        deadline: Duration,
        attempt_timeout: Duration,
    ) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::build(endpoints, deadline, Some(attempt_timeout))
    }

    fn build<I, S>(endpoints: I, deadline: Duration, attempt_timeout: Option<Duration>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            inner: Arc::new(ClientInner {
                endpoints: endpoints.into_iter().map(Into::into).collect(),
                leader: Mutex::new(None),
                channels: Mutex::new(HashMap::new()),
                next_endpoint: AtomicUsize::new(0),
                deadline,
                tls: None,
                attempt_timeout,
            }),
        }
    }

    /// This client speaking mutual TLS to the controllers (`None`:
    /// plaintext). A fresh client: no channel or leader is carried over.
    pub fn with_inter_node_tls(self, tls: Option<crate::tls::InterNodeTls>) -> Self {
        let inner = &self.inner;
        Self {
            inner: Arc::new(ClientInner {
                endpoints: inner.endpoints.clone(),
                leader: Mutex::new(None),
                channels: Mutex::new(HashMap::new()),
                next_endpoint: AtomicUsize::new(0),
                deadline: inner.deadline,
                tls,
                attempt_timeout: inner.attempt_timeout,
            }),
        }
    }

    fn remembered_leader(&self) -> Option<String> {
        self.inner
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn remember_leader(&self, addr: Option<String>) {
        *self
            .inner
            .leader
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = addr;
    }

    fn connect(&self, addr: &str) -> Result<ControllerServiceClient<Channel>, ControllerError> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let channel = match channels.get(addr) {
            Some(channel) => channel.clone(),
            None => {
                let channel = lazy_channel(addr, self.inner.tls.as_ref()).map_err(|e| {
                    ControllerError::InvalidRequest(format!("bad controller address {addr:?}: {e}"))
                })?;
                channels.insert(addr.to_owned(), channel.clone());
                channel
            }
        };
        Ok(ControllerServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Sends `call` to the leader (or whoever may know it) until it is
    /// answered by the active controller or the deadline passes.
    async fn call<Resp, F, Fut>(&self, call: F) -> Result<Resp, ControllerError>
    where
        Resp: HasError,
        F: Fn(ControllerServiceClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let started = Instant::now();
        let mut attempt = 0u64;
        let mut last_error = ControllerError::NotController { leader: None };
        let endpoints = &self.inner.endpoints;
        if endpoints.is_empty() {
            return Err(ControllerError::InvalidRequest(
                "no controller endpoints".into(),
            ));
        }
        while let Some(remaining) = self
            .inner
            .deadline
            .checked_sub(started.elapsed())
            .filter(|left| !left.is_zero())
        {
            let addr = self.remembered_leader().unwrap_or_else(|| {
                let next = self.inner.next_endpoint.fetch_add(1, Ordering::Relaxed);
                endpoints[next % endpoints.len()].clone()
            });
            attempt += 1;
            let client = self.connect(&addr)?;
            let bound = self
                .inner
                .attempt_timeout
                .map_or(remaining, |t| t.min(remaining));
            let answer = match tokio::time::timeout(bound, call(client)).await {
                Ok(answer) => answer,
                Err(_) => {
                    tracing::debug!(%addr, ?bound, "controller did not answer in time");
                    self.remember_leader(None);
                    last_error =
                        ControllerError::Timeout(format!("{addr} did not answer within {bound:?}"));
                    if self.inner.attempt_timeout.is_none() {
                        return Err(last_error);
                    }
                    continue;
                }
            };
            match answer {
                Ok(response) => {
                    let response = response.into_inner();
                    match convert::error_from_pb(response.error()) {
                        Ok(()) => {
                            self.remember_leader(Some(addr));
                            return Ok(response);
                        }
                        Err(ControllerError::NotController { leader }) => {
                            let hint = leader
                                .as_ref()
                                .map(|l| l.address.clone())
                                .filter(|a| !a.is_empty() && *a != addr);
                            self.remember_leader(hint.clone());
                            last_error = ControllerError::NotController { leader };
                            if hint.is_some() {
                                continue;
                            }
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(status) => {
                    tracing::debug!(%addr, %status, "controller call failed");
                    self.remember_leader(None);
                    last_error = match status.code() {
                        tonic::Code::DeadlineExceeded => {
                            return Err(ControllerError::Timeout(status.message().to_owned()))
                        }
                        _ => ControllerError::Internal(format!("{addr}: {}", status.message())),
                    };
                }
            }
            // Nobody knows a leader yet (election in progress) or a node is down.
            let pause = Duration::from_millis(50 * attempt.min(8));
            tokio::time::sleep(pause.min(self.inner.deadline.saturating_sub(started.elapsed())))
                .await;
        }
        Err(last_error)
    }

    /// Cluster id, leader and metadata offset as the first reachable controller sees them.
    pub async fn describe_quorum(&self) -> Result<pb::DescribeQuorumResponse, ControllerError> {
        self.call(|mut c| async move {
            c.describe_quorum(pb::DescribeQuorumRequest { leader_only: false })
                .await
        })
        .await
    }

    /// DescribeQuorum answered by the Raft leader, with its view of
    /// replication (`replication` is set); follows leader hints and waits
    /// out elections like a write, until the deadline.
    pub async fn describe_quorum_leader(
        &self,
    ) -> Result<pb::DescribeQuorumResponse, ControllerError> {
        self.call(|mut c| async move {
            c.describe_quorum(pb::DescribeQuorumRequest { leader_only: true })
                .await
        })
        .await
    }

    /// (a) Registers this broker process; returns its broker epoch.
    pub async fn register_broker(
        &self,
        req: &RegisterBroker,
    ) -> Result<RegisterBrokerReply, ControllerError> {
        let msg = convert::register_to_pb(req);
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.register_broker(msg).await }
            })
            .await?;
        Ok(RegisterBrokerReply {
            broker_epoch: resp.broker_epoch,
        })
    }

    /// (a) One heartbeat.
    pub async fn heartbeat(&self, req: &Heartbeat) -> Result<HeartbeatReply, ControllerError> {
        let msg = convert::heartbeat_to_pb(req);
        let resp = self
            .call(|mut c| async move { c.broker_heartbeat(msg).await })
            .await?;
        Ok(HeartbeatReply {
            is_fenced: resp.is_fenced,
            is_caught_up: resp.is_caught_up,
            should_shut_down: resp.should_shut_down,
        })
    }

    /// (a) Controlled shutdown: returns once leaderships have moved.
    pub async fn controlled_shutdown(
        &self,
        broker_id: BrokerId,
        broker_epoch: i64,
    ) -> Result<ControlledShutdownReply, ControllerError> {
        let msg = pb::ControlledShutdownRequest {
            broker_id,
            broker_epoch,
        };
        let resp = self
            .call(|mut c| async move { c.controlled_shutdown(msg).await })
            .await?;
        Ok(ControlledShutdownReply {
            leaderships_moved: resp.leaderships_moved,
            partitions_offline: resp
                .partitions_offline
                .into_iter()
                .map(|tp| (tp.topic, tp.partition))
                .collect(),
            shutdown_ready: resp.shutdown_ready,
        })
    }

    /// Removes broker `broker_id`'s registration (Kafka's UnregisterBroker).
    pub async fn unregister_broker(&self, broker_id: BrokerId) -> Result<(), ControllerError> {
        let msg = pb::UnregisterBrokerRequest { broker_id };
        self.call(|mut c| async move { c.unregister_broker(msg).await })
            .await?;
        Ok(())
    }

    /// (d) The next block of producer ids for this broker.
    pub async fn allocate_producer_ids(
        &self,
        broker_id: BrokerId,
        broker_epoch: i64,
    ) -> Result<ProducerIdBlock, ControllerError> {
        let msg = pb::AllocateProducerIdsRequest {
            broker_id,
            broker_epoch,
        };
        let resp = self
            .call(|mut c| async move { c.allocate_producer_ids(msg).await })
            .await?;
        Ok(ProducerIdBlock {
            first: resp.producer_id_start,
            size: resp.producer_id_len,
        })
    }

    /// (c) Creates one topic.
    pub async fn create_topic(
        &self,
        req: &CreateTopic,
        validate_only: bool,
    ) -> Result<CreateTopicReply, ControllerError> {
        // One id for every attempt: an attempt whose answer was lost with a
        // failed controller may have created the topic, and the resend must
        // be recognised as the same request rather than answered
        // TOPIC_ALREADY_EXISTS.
        let msg = pb::CreateTopicsRequest {
            topics: vec![convert::create_topic_to_pb(req, Some(Uuid::new_v4()))],
            validate_only,
        };
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.create_topics(msg).await }
            })
            .await?;
        let result = resp
            .topics
            .into_iter()
            .next()
            .ok_or_else(|| ControllerError::Internal("empty CreateTopics response".into()))?;
        topic_result_error(&result)?;
        Ok(CreateTopicReply {
            topic_id: convert::parse_uuid(&result.topic_id, "topic id")?,
            num_partitions: result.num_partitions,
            replication_factor: result.replication_factor,
        })
    }

    /// (c) Deletes one topic.
    pub async fn delete_topic(
        &self,
        topic: &TopicRef,
    ) -> Result<DeleteTopicReply, ControllerError> {
        let msg = match topic {
            TopicRef::Name(name) => pb::DeleteTopicsRequest {
                names: vec![name.clone()],
                topic_ids: vec![],
            },
            TopicRef::Id(id) => pb::DeleteTopicsRequest {
                names: vec![],
                topic_ids: vec![id.to_string()],
            },
        };
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.delete_topics(msg).await }
            })
            .await?;
        let result = resp
            .topics
            .into_iter()
            .next()
            .ok_or_else(|| ControllerError::Internal("empty DeleteTopics response".into()))?;
        topic_result_error(&result)?;
        Ok(DeleteTopicReply {
            name: result.name,
            topic_id: convert::parse_uuid(&result.topic_id, "topic id")?,
        })
    }

    /// (c) Grows a topic's partition count.
    pub async fn create_partitions(
        &self,
        req: &CreatePartitions,
        validate_only: bool,
    ) -> Result<CreatePartitionsReply, ControllerError> {
        let msg = pb::CreatePartitionsRequest {
            topics: vec![convert::create_partitions_to_pb(req)],
            validate_only,
        };
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.create_partitions(msg).await }
            })
            .await?;
        let result =
            resp.topics.into_iter().next().ok_or_else(|| {
                ControllerError::Internal("empty CreatePartitions response".into())
            })?;
        topic_result_error(&result)?;
        Ok(CreatePartitionsReply {
            topic_id: convert::parse_uuid(&result.topic_id, "topic id")?,
            num_partitions: result.num_partitions,
        })
    }

    /// (c) SCRAM credential and ACL records, in one batch.
    pub async fn alter_security(&self, records: &[MetadataRecord]) -> Result<(), ControllerError> {
        let records_json = records
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ControllerError::Internal(e.to_string()))?;
        let msg = pb::AlterSecurityRequest { records_json };
        self.call(|mut c| {
            let msg = msg.clone();
            async move { c.alter_security(msg).await }
        })
        .await?;
        Ok(())
    }

    /// (c) Sets (`Some`) or removes (`None`) config keys.
    pub async fn alter_configs(
        &self,
        resource: &ConfigResource,
        changes: &[(String, Option<String>)],
    ) -> Result<(), ControllerError> {
        let (topic, broker_id) = match resource {
            ConfigResource::Cluster => (String::new(), None),
            ConfigResource::Broker { id } => (String::new(), Some(*id)),
            ConfigResource::Topic { name } => (name.clone(), None),
        };
        let msg = pb::AlterConfigsRequest {
            topic,
            broker_id,
            configs: changes
                .iter()
                .map(|(name, value)| pb::ConfigEntry {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
        };
        self.call(|mut c| {
            let msg = msg.clone();
            async move { c.alter_configs(msg).await }
        })
        .await?;
        Ok(())
    }

    /// ISR changes proposed by a partition leader, all of one broker, in
    /// one request committed as one metadata batch. Each is answered on its
    /// own, in order: the partition state after it (replicas left empty),
    /// or why it was refused.
    pub async fn alter_partitions(
        &self,
        changes: &[AlterPartition],
    ) -> Result<Vec<Result<PartitionState, ControllerError>>, ControllerError> {
        let msg = convert::alter_partitions_to_pb(changes);
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.alter_partitions(msg).await }
            })
            .await?;
        if resp.results.len() != changes.len() {
            return Err(ControllerError::Internal(format!(
                "{} answers to {} ISR changes",
                resp.results.len(),
                changes.len()
            )));
        }
        Ok(resp
            .results
            .iter()
            .map(|r| {
                convert::error_from_pb(r.error.clone())
                    .map(|()| convert::partition_from_alter_response(r))
            })
            .collect())
    }

    /// (c) Admin-triggered leader election.
    pub async fn elect_leaders(
        &self,
        req: &ElectLeaders,
    ) -> Result<Vec<ElectionResult>, ControllerError> {
        let msg = pb::ElectLeadersRequest {
            election_type: convert::election_type_to_pb(req.election_type).into(),
            partitions: req
                .partitions
                .iter()
                .flatten()
                .map(|(topic, partition)| pb::TopicPartition {
                    topic: topic.clone(),
                    partition: *partition,
                })
                .collect(),
        };
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.elect_leaders(msg).await }
            })
            .await?;
        Ok(resp
            .results
            .into_iter()
            .map(|r| ElectionResult {
                result: remote_result(r.error_code, r.error_message).map(|_| r.leader),
                topic: r.topic,
                partition: r.partition,
            })
            .collect())
    }

    /// (c) Starts, replaces or cancels partition reassignments (KIP-455);
    /// one result per partition, in request order.
    pub async fn alter_partition_reassignments(
        &self,
        requests: &[Reassignment],
    ) -> Result<Vec<ReassignmentResult>, ControllerError> {
        let msg = pb::AlterPartitionReassignmentsRequest {
            partitions: requests
                .iter()
                .map(|r| pb::PartitionReassignment {
                    topic: r.topic.clone(),
                    partition: r.partition,
                    replicas: r.target.clone().unwrap_or_default(),
                    cancel: r.target.is_none(),
                })
                .collect(),
        };
        let resp = self
            .call(|mut c| {
                let msg = msg.clone();
                async move { c.alter_partition_reassignments(msg).await }
            })
            .await?;
        Ok(resp
            .results
            .into_iter()
            .map(|r| ReassignmentResult {
                result: remote_result(r.error_code, r.error_message).map(|_| ()),
                topic: r.topic,
                partition: r.partition,
            })
            .collect())
    }

    /// (b) Raw metadata stream from one controller (any, not only the
    /// leader). Most callers want [`MetadataFollower`].
    pub async fn subscribe(
        &self,
        addr: &str,
        broker_id: BrokerId,
        after_offset: u64,
    ) -> Result<tonic::Streaming<pb::MetadataUpdate>, ControllerError> {
        let mut client = self.connect(addr)?;
        client
            .subscribe_metadata(pb::SubscribeMetadataRequest {
                broker_id,
                after_offset,
            })
            .await
            .map(Response::into_inner)
            .map_err(|s| ControllerError::Internal(format!("{addr}: {}", s.message())))
    }

    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }
}

/// Applies one stream update to a local image. `Err` means the update does
/// not fit (corrupt or out of order); the follower then resubscribes.
pub fn apply_update(
    image: &mut MetadataImage,
    update: pb::MetadataUpdate,
) -> Result<(), ControllerError> {
    let bad = |e: serde_json::Error| ControllerError::Internal(format!("bad metadata update: {e}"));
    match update.kind {
        Some(pb::metadata_update::Kind::Snapshot(bytes)) => {
            let next: MetadataImage = serde_json::from_slice(&bytes).map_err(bad)?;
            if next.offset() != update.offset {
                return Err(ControllerError::Internal(format!(
                    "snapshot says offset {} but carries an image at {}",
                    update.offset,
                    next.offset()
                )));
            }
            *image = next;
            Ok(())
        }
        Some(pb::metadata_update::Kind::Records(bytes)) => {
            if update.offset <= image.offset() {
                return Ok(());
            }
            let records: Vec<MetadataRecord> = serde_json::from_slice(&bytes).map_err(bad)?;
            // The controller only sends batches it applied successfully, so a
            // failure here means this image diverged: resubscribe from scratch.
            image.apply_batch(update.offset, &records).map_err(|e| {
                ControllerError::Internal(format!("batch at {} does not apply: {e}", update.offset))
            })
        }
        None => Err(ControllerError::Internal(
            "metadata update without content".into(),
        )),
    }
}

/// Keeps a local [`MetadataImage`] in sync with the controller quorum.
pub struct MetadataFollower {
    image: watch::Receiver<Arc<MetadataImage>>,
    task: JoinHandle<()>,
}

impl MetadataFollower {
    /// Starts following; the image starts empty (offset 0).
    pub fn spawn(client: ControllerClient, broker_id: BrokerId) -> Self {
        let (tx, rx) = watch::channel(Arc::new(MetadataImage::new()));
        let task = tokio::spawn(follow(client, broker_id, tx));
        Self { image: rx, task }
    }

    /// The latest image.
    pub fn image(&self) -> Arc<MetadataImage> {
        Arc::clone(&self.image.borrow())
    }

    /// Changes whenever a new image is published.
    pub fn watch(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.image.clone()
    }

    /// Waits until the image reaches `offset`.
    pub async fn wait_for_offset(&self, offset: u64) -> Arc<MetadataImage> {
        let mut rx = self.image.clone();
        let result = rx.wait_for(|image| image.offset() >= offset).await;
        match result {
            Ok(image) => Arc::clone(&image),
            Err(_) => self.image(),
        }
    }
}

impl Drop for MetadataFollower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn follow(
    client: ControllerClient,
    broker_id: BrokerId,
    tx: watch::Sender<Arc<MetadataImage>>,
) {
    let endpoints = client.endpoints().to_vec();
    if endpoints.is_empty() {
        return;
    }
    let mut attempt = 0usize;
    let mut resync = false;
    loop {
        let addr = &endpoints[attempt % endpoints.len()];
        attempt += 1;
        // After a rejected update, start over from nothing (the controller
        // then sends a snapshot or the full history); the published image
        // stays as it was until the new one is complete enough to replace it.
        let mut image = if resync {
            MetadataImage::new()
        } else {
            (**tx.borrow()).clone()
        };
        match client.subscribe(addr, broker_id, image.offset()).await {
            Ok(mut stream) => loop {
                match stream.message().await {
                    Ok(Some(update)) => {
                        if let Err(e) = apply_update(&mut image, update) {
                            tracing::warn!(broker_id, error = %e, "metadata update rejected; resubscribing");
                            resync = true;
                            break;
                        }
                        if image.offset() >= tx.borrow().offset() {
                            resync = false;
                            tx.send_replace(Arc::new(image.clone()));
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(broker_id, %addr, %status, "metadata stream ended");
                        break;
                    }
                }
            },
            Err(e) => tracing::debug!(broker_id, %addr, error = %e, "cannot subscribe to metadata"),
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A per-partition outcome received over the wire: code 0 is success.
fn remote_result(error_code: i32, message: String) -> Result<(), ControllerError> {
    if error_code == 0 {
        return Ok(());
    }
    let code =
        i16::try_from(error_code).unwrap_or(crate::error::ResponseError::UnknownServerError.code());
    Err(ControllerError::from_code(code, message, None))
}
