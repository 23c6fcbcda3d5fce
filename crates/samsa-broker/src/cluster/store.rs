//! [`QuorumMetadataStore`]: the [`MetadataStore`] of cluster mode. Reads come
//! from the followed image; topic changes go to the active controller.
//!
//! Invariants: a change answered as successful was committed by the quorum
//! and — unless the bounded wait for it (`controller_request_timeout_ms`)
//! ran out, which is logged — is visible in this broker's image when the
//! call returns; no wait here is unbounded; DescribeQuorum is answered from
//! the Raft leader's view, as a Kafka broker forwards it to the controller.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use samsa_controller::client::ControllerClient;
use samsa_controller::logic::{
    CreatePartitions, CreateTopic, ElectLeaders, ElectionResult, Reassignment, ReassignmentResult,
    TopicRef,
};
use samsa_controller::ControllerError;
use tokio::sync::watch;
use tracing::warn;

use super::ClusterSettings;
use crate::error::{controller_error, MetadataError};
use crate::metadata::{
    ConfigResource, MetadataRecord, MetadataStore, MetadataView, NewTopic, QuorumDescription,
    QuorumVoter, TopicMetadata,
};

/// [`MetadataStore`] backed by the controller quorum: reads come from the
/// followed image, changes go to the active controller and return once this
/// broker's image shows them (or after `request_timeout`, trusting the
/// controller's answer).
pub struct QuorumMetadataStore {
    client: ControllerClient,
    image: watch::Receiver<Arc<MetadataView>>,
    request_timeout: Duration,
    voters: String,
}

impl QuorumMetadataStore {
    pub fn new(
        client: ControllerClient,
        image: watch::Receiver<Arc<MetadataView>>,
        settings: &ClusterSettings,
    ) -> Self {
        Self {
            client,
            image,
            request_timeout: settings.request_timeout,
            voters: settings.voters_text(),
        }
    }

    /// Waits (bounded) until the image satisfies `done`.
    async fn visible(
        &self,
        done: impl FnMut(&Arc<MetadataView>) -> bool,
    ) -> Option<Arc<MetadataView>> {
        let mut rx = self.image.clone();
        tokio::time::timeout(self.request_timeout, async move {
            rx.wait_for(done).await.map(|image| Arc::clone(&image)).ok()
        })
        .await
        .ok()
        .flatten()
    }

    /// Every partition's epoch in this broker's image.
    fn partition_epochs(&self) -> std::collections::HashMap<(String, i32), i32> {
        let image = self.image();
        image
            .topics
            .values()
            .flat_map(|t| {
                (0..t.partitions).filter_map(move |i| {
                    Some(((t.name.clone(), i), t.partition(i)?.partition_epoch))
                })
            })
            .collect()
    }

    /// Waits (bounded) until each of `changed` has a newer partition epoch
    /// than in `before`: a committed partition change is visible here when
    /// the call returns, as Kafka's controller answers after its commit.
    async fn visible_changes(
        &self,
        before: &std::collections::HashMap<(String, i32), i32>,
        changed: impl Iterator<Item = (String, i32)>,
    ) {
        let changed: Vec<((String, i32), i32)> = changed
            .map(|key| {
                let epoch = before.get(&key).copied().unwrap_or(-1);
                (key, epoch)
            })
            .collect();
        if changed.is_empty() {
            return;
        }
        let shown = self
            .visible(|image| {
                changed.iter().all(|((topic, p), epoch)| {
                    image
                        .partition(topic, *p)
                        .is_some_and(|s| s.partition_epoch > *epoch)
                })
            })
            .await;
        if shown.is_none() {
            warn!(partitions = changed.len(), timeout = ?self.request_timeout,
                "a committed partition change is not in this broker's metadata yet");
        }
    }

    /// A refused or failed change to `topic`, as the broker answers it
    /// (the translation is the error edge's, [`controller_error`]).
    fn error(&self, e: ControllerError, topic: &str) -> MetadataError {
        controller_error(e, topic, &self.voters, self.request_timeout)
    }
}

impl MetadataStore for QuorumMetadataStore {
    fn elect_leaders(
        &self,
        request: ElectLeaders,
    ) -> BoxFuture<'_, Result<Vec<ElectionResult>, MetadataError>> {
        Box::pin(async move {
            let before = self.partition_epochs();
            let results = self
                .client
                .elect_leaders(&request)
                .await
                .map_err(|e| self.error(e, "(elect leaders)"))?;
            let changed = results
                .iter()
                .filter(|r| r.result.is_ok())
                .map(|r| (r.topic.clone(), r.partition));
            self.visible_changes(&before, changed).await;
            Ok(results)
        })
    }

    /// Answered once committed, without waiting to see it here: a broker
    /// that is still running registers again at once.
    fn unregister_broker(&self, broker_id: i32) -> BoxFuture<'_, Result<(), MetadataError>> {
        Box::pin(async move {
            self.client
                .unregister_broker(broker_id)
                .await
                .map_err(|e| self.error(e, "(unregister broker)"))
        })
    }

    fn alter_reassignments(
        &self,
        requests: Vec<Reassignment>,
    ) -> BoxFuture<'_, Result<Vec<ReassignmentResult>, MetadataError>> {
        Box::pin(async move {
            let before = self.partition_epochs();
            let results = self
                .client
                .alter_partition_reassignments(&requests)
                .await
                .map_err(|e| self.error(e, "(reassign partitions)"))?;
            // A target equal to the current replicas changes nothing: only
            // wait for partitions whose replica set the request changes.
            let image = self.image();
            let changed = results
                .iter()
                .zip(&requests)
                .filter(|(r, q)| {
                    r.result.is_ok()
                        && image.partition(&q.topic, q.partition).is_some_and(|p| {
                            q.target.is_none() || q.target.as_ref() != Some(&p.replicas)
                        })
                })
                .map(|(r, _)| (r.topic.clone(), r.partition));
            self.visible_changes(&before, changed).await;
            Ok(results)
        })
    }

    fn image(&self) -> Arc<MetadataView> {
        Arc::clone(&self.image.borrow())
    }

    fn create_topic(
        &self,
        topic: NewTopic,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let request = CreateTopic {
                name: topic.name.clone(),
                num_partitions: Some(topic.partitions),
                replication_factor: Some(i32::from(topic.replication_factor)),
                assignments: topic.assignments.clone(),
                configs: topic.configs.clone(),
            };
            let reply = self
                .client
                .create_topic(&request, false)
                .await
                .map_err(|e| self.error(e, &topic.name))?;
            let id = reply.topic_id;
            let name = topic.name.clone();
            let shown = self
                .visible(|image| image.topic(&name).is_some_and(|t| t.topic_id == id))
                .await
                .and_then(|image| image.topic(&topic.name).cloned());
            Ok(shown.unwrap_or_else(|| {
                warn!(topic = %topic.name, "topic created but not yet visible here");
                Arc::new(TopicMetadata {
                    name: topic.name,
                    topic_id: id,
                    partitions: reply.num_partitions,
                    replication_factor: i16::try_from(reply.replication_factor).unwrap_or(-1),
                    configs: topic.configs,
                    partition_states: Vec::new(),
                })
            }))
        })
    }

    fn delete_topic(
        &self,
        name: String,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let before = self.image().topic(&name).cloned();
            let reply = self
                .client
                .delete_topic(&TopicRef::Name(name.clone()))
                .await
                .map_err(|e| self.error(e, &name))?;
            let id = reply.topic_id;
            if self
                .visible(|image| image.topics.values().all(|t| t.topic_id != id))
                .await
                .is_none()
            {
                warn!(topic = %name, "topic deleted but still visible here");
            }
            Ok(before.filter(|t| t.topic_id == id).unwrap_or_else(|| {
                Arc::new(TopicMetadata {
                    name: reply.name,
                    topic_id: id,
                    partitions: 0,
                    replication_factor: 0,
                    configs: Default::default(),
                    partition_states: Vec::new(),
                })
            }))
        })
    }

    fn create_partitions(
        &self,
        name: String,
        new_count: i32,
        assignments: Option<Vec<Vec<i32>>>,
    ) -> BoxFuture<'_, Result<Arc<TopicMetadata>, MetadataError>> {
        Box::pin(async move {
            let request = CreatePartitions {
                topic: name.clone(),
                new_total_count: new_count,
                assignments,
            };
            let reply = self
                .client
                .create_partitions(&request, false)
                .await
                .map_err(|e| self.error(e, &name))?;
            let id = reply.topic_id;
            let shown = self
                .visible(|image| {
                    image
                        .topic(&name)
                        .is_some_and(|t| t.topic_id == id && t.partitions >= new_count)
                })
                .await
                .and_then(|image| image.topic(&name).cloned());
            shown
                .or_else(|| self.image().topic(&name).cloned())
                .ok_or(MetadataError::UnknownTopic(name))
        })
    }

    fn alter_configs(
        &self,
        resource: ConfigResource,
        changes: Vec<(String, Option<String>)>,
    ) -> BoxFuture<'_, Result<(), MetadataError>> {
        Box::pin(async move {
            let subject = match &resource {
                ConfigResource::Topic { name } => name.clone(),
                ConfigResource::Broker { id } => format!("broker {id}"),
                ConfigResource::Cluster => "cluster".to_owned(),
            };
            self.client
                .alter_configs(&resource, &changes)
                .await
                .map_err(|e| self.error(e, &subject))?;
            // Visible here once every key has its new value (a later
            // change of the same key by someone else also ends the wait).
            let shown = self
                .visible(|image| {
                    image.resource_configs(&resource).is_some_and(|configs| {
                        changes
                            .iter()
                            .all(|(name, value)| configs.get(name) == value.as_ref())
                    })
                })
                .await;
            if shown.is_none() {
                warn!(resource = %subject, "configs changed but not yet visible here");
            }
            Ok(())
        })
    }

    fn alter_security(
        &self,
        records: Vec<MetadataRecord>,
    ) -> BoxFuture<'_, Result<(), MetadataError>> {
        Box::pin(async move {
            self.client
                .alter_security(&records)
                .await
                .map_err(|e| self.error(e, "security"))?;
            // Visible here once the image holds what the last record says.
            let expected = records.last().cloned();
            let shown = self
                .visible(|image| match &expected {
                    Some(MetadataRecord::ScramCredentialChanged {
                        user,
                        mechanism,
                        credential,
                    }) => {
                        image
                            .scram_credentials
                            .get(user)
                            .and_then(|m| m.get(mechanism))
                            == credential.as_ref()
                    }
                    Some(MetadataRecord::AclCreated { binding }) => image.acls.contains(binding),
                    Some(MetadataRecord::AclDeleted { binding }) => !image.acls.contains(binding),
                    _ => true,
                })
                .await;
            if shown.is_none() {
                warn!("security change committed but not yet visible here");
            }
            Ok(())
        })
    }

    /// Asked of the active controller, as a Kafka broker forwards
    /// DescribeQuorum to it; the answer is the Raft leader's own view.
    fn describe_quorum(&self) -> BoxFuture<'_, Result<QuorumDescription, MetadataError>> {
        Box::pin(async move {
            let answer = self.client.describe_quorum_leader().await.map_err(|e| {
                MetadataError::ControllerUnavailable(format!(
                    "no active controller of {} described the quorum within {:?}: {e}",
                    self.voters, self.request_timeout
                ))
            })?;
            quorum_description(answer)
        })
    }
}

/// Kafka's DescribeQuorum view of a leader's `DescribeQuorum` gRPC answer.
fn quorum_description(
    answer: samsa_proto::controller::DescribeQuorumResponse,
) -> Result<QuorumDescription, MetadataError> {
    let unavailable = |why: &str| MetadataError::ControllerUnavailable(why.to_owned());
    let replication = answer
        .replication
        .ok_or_else(|| unavailable("the controller that answered is no longer the leader"))?;
    let node_id = |id: u64| {
        i32::try_from(id).map_err(|_| unavailable(&format!("controller id {id} is not a node id")))
    };
    let endpoint = |id: u64| {
        let address = &answer.voters.iter().find(|v| v.node_id == id)?.address;
        let (host, port) = address.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    };
    let voters = replication
        .voters
        .iter()
        .map(|v| {
            Ok(QuorumVoter {
                node_id: node_id(v.node_id)?,
                log_end_offset: v.log_end_offset,
                last_fetch_timestamp: v.last_fetch_timestamp,
                last_caught_up_timestamp: v.last_caught_up_timestamp,
                endpoint: endpoint(v.node_id),
            })
        })
        .collect::<Result<Vec<_>, MetadataError>>()?;
    Ok(QuorumDescription {
        leader_id: node_id(answer.node_id)?,
        leader_epoch: i32::try_from(replication.term).unwrap_or(i32::MAX),
        high_watermark: replication.high_watermark,
        voters,
    })
}
