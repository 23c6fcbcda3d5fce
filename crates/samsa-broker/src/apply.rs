//! Applying a [`MetadataView`] to what this broker hosts: the one place
//! where metadata turns into open logs and leadership, for both modes.
//!
//! [`Broker::apply_image`] makes the hosted partitions match an image:
//!
//! - a topic that is gone from the image, or now has another topic id (it
//!   was deleted and re-created under the same name), has its partitions
//!   closed and their directories deleted;
//! - every partition whose replica set includes this broker is opened (or
//!   created) and given its [`Leadership`]: leader at the image's leader
//!   epoch if the image names this broker as leader, otherwise not serving;
//!   those not hosted yet are opened `log_open_threads` at a time, each
//!   serving as soon as it is open;
//! - a partition this broker hosts but no longer replicates (a
//!   reassignment moved it away) is closed and its directory deleted, and
//!   so is a directory of such a partition found at the first apply after
//!   a restart;
//! - the dynamic broker configs of the image become the broker's effective
//!   configuration (`dynamic_config::effective_broker_config`) before any
//!   partition is looked at, and a hosted partition whose topic configs or
//!   defaults changed takes its new log config.
//!
//! Invariants:
//!
//! - applies are serialized and each one diffs against the image applied
//!   before it, so an image is never half-applied while another starts;
//! - an image older than the applied one (a smaller offset: the background
//!   applier can lose a race with a request that applied a newer image) is
//!   ignored, so a topic never disappears because a stale image came late;
//! - a partition directory carries the id of the topic it belongs to
//!   ([`PARTITION_METADATA_FILE`]); a directory found with another topic's id
//!   where a partition is about to be opened is left over from a deleted
//!   topic of the same name and is removed first, so data never resurfaces
//!   under a new topic;
//! - a partition that fails to open is not hosted (requests for it get
//!   KAFKA_STORAGE_ERROR, as from a Kafka broker whose log directory
//!   failed; `ReplicaManager::failed_to_open`; the log says why) and is retried by the
//!   next apply; applying the
//!   same image again is such an apply (the cluster applier does it after a
//!   back-off, so a partition that could not be created on a full disk opens
//!   once space is freed).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use crate::dynamic_config::{effective_broker_config, min_insync_replicas, topic_log_config};
use crate::error::BrokerError;
use crate::fsutil::write_atomic;
use crate::metadata::{MetadataView, PartitionState, TopicMetadata};
use crate::parallel::for_each_in_parallel;
use crate::replica::{partition_dir, Leadership};
use crate::{now_ms, Broker};

/// File in each partition directory naming the topic id it belongs to.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

#[derive(Serialize, Deserialize)]
struct PartitionMetadataFile {
    version: u32,
    topic_id: Uuid,
}

/// The topic id recorded in `dir`, if any (an unreadable file counts as none).
fn recorded_topic_id(dir: &Path) -> Option<Uuid> {
    let bytes = std::fs::read(dir.join(PARTITION_METADATA_FILE)).ok()?;
    serde_json::from_slice::<PartitionMetadataFile>(&bytes)
        .ok()
        .map(|f| f.topic_id)
}

fn record_topic_id(dir: &Path, topic_id: Uuid) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(&PartitionMetadataFile {
        version: 0,
        topic_id,
    })
    .map_err(std::io::Error::other)?;
    write_atomic(&dir.join(PARTITION_METADATA_FILE), &bytes)
}

impl Broker {
    /// Makes the hosted partitions match `image` (see the module docs).
    /// Every partition is attempted; the first failure is returned.
    pub fn apply_image(&self, image: &Arc<MetadataView>) -> Result<(), BrokerError> {
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        if image.offset < applied.offset {
            return Ok(());
        }
        let me = self.config.node_id;
        let now = now_ms();

        // Dynamic broker configs first: partitions opened or changed below
        // take the new defaults.
        let dynamic_changed = image.cluster_configs != applied.cluster_configs
            || image.broker_configs.get(&me) != applied.broker_configs.get(&me);
        if dynamic_changed {
            let effective = Arc::new(effective_broker_config(&self.config, image));
            self.replicas.set_defaults(effective.log.clone());
            *self
                .effective_config
                .write()
                .unwrap_or_else(|p| p.into_inner()) = effective;
            info!(
                cluster = ?image.cluster_configs,
                broker = ?image.broker_configs.get(&me),
                "dynamic broker configs in force"
            );
        }
        let effective = self.effective_config();
        self.apply_acls(&image.acls);

        for (name, old) in &applied.topics {
            let same = image
                .topic(name)
                .is_some_and(|t| t.topic_id == old.topic_id);
            if !same {
                info!(topic = %name, topic_id = %old.topic_id, "topic deleted; removing its partitions");
                self.replicas.remove_topic(old);
            }
        }

        let mut first_error = None;
        let mut to_open = Vec::new();
        for topic in image.topics.values() {
            for index in 0..topic.partitions {
                let Some(state) = topic.partition(index) else {
                    continue;
                };
                let hosted = self.replicas.get(&topic.name, index);
                if !state.is_replica(me) {
                    // Reassigned away: the new replicas hold everything
                    // committed (the controller removes a replica only once
                    // every target replica is in sync). A copy left on disk
                    // by a removal this broker missed while it was down is
                    // found at its first apply.
                    let dir = partition_dir(&self.config.data_dir, &topic.name, index);
                    let leftover =
                        || applied.offset == 0 && recorded_topic_id(&dir) == Some(topic.topic_id);
                    if hosted.is_some() || leftover() {
                        info!(partition = %format!("{}-{index}", topic.name), replicas = ?state.replicas,
                            "no longer a replica; deleting this broker's copy");
                        self.replicas
                            .remove_partition(&topic.name, index, topic.topic_id);
                    }
                    continue;
                }
                let leadership = Leadership {
                    is_leader: state.leader == me,
                    leader_epoch: state.leader_epoch,
                };
                let min_isr = min_insync_replicas(&effective, topic);
                if let Some(partition) = hosted {
                    let configs_changed = applied
                        .topic(&topic.name)
                        .is_none_or(|before| before.configs != topic.configs);
                    if dynamic_changed || configs_changed {
                        let config = topic_log_config(&effective.log, topic);
                        if partition.log_config().is_some_and(|c| c != config) {
                            info!(partition = %partition.name(), configs = ?topic.configs, "topic config changed");
                            partition.set_log_config(config);
                        }
                    }
                    // Replica set first: a new leader must know its ISR
                    // before it serves its first produce.
                    partition.set_replica_set(me, topic.topic_id, state, min_isr, now);
                    let before = partition.set_leadership(leadership);
                    if before != leadership {
                        info!(
                            partition = %partition.name(),
                            leader = state.leader,
                            leader_epoch = state.leader_epoch,
                            serving = leadership.is_leader,
                            "leadership changed"
                        );
                    }
                    continue;
                }
                to_open.push(Opening {
                    topic,
                    index,
                    state,
                    leadership,
                    min_isr,
                });
            }
        }
        // Partitions not hosted yet open several at a time: opening one is
        // mostly fsyncs (creating) or reads (recovering), and a broker
        // restarting with thousands of partitions serves none until all
        // are open.
        let threads = self.config.log_open_threads.max(1);
        if let Some(e) = for_each_in_parallel(&to_open, threads, |opening| {
            self.open_replica(opening, me, now)
        }) {
            first_error.get_or_insert(e);
        }
        *applied = Arc::clone(image);
        // Leadership of __transaction_state partitions may have moved.
        self.txn.poke();
        self.groups.poke();
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Opens (or creates) a partition this broker replicates but does not
    /// host yet, and gives it its replica set and leadership. A failure is
    /// counted and logged here, once per partition until it opens.
    fn open_replica(&self, opening: &Opening<'_>, me: i32, now: i64) -> Result<(), BrokerError> {
        let Opening {
            topic,
            index,
            state,
            leadership,
            min_isr,
        } = *opening;
        let dir = partition_dir(&self.config.data_dir, &topic.name, index);
        if let Some(recorded) = recorded_topic_id(&dir) {
            if recorded != topic.topic_id {
                warn!(dir = %dir.display(), %recorded, current = %topic.topic_id,
                    "removing the directory of an earlier topic with the same name");
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    warn!(dir = %dir.display(), error = %e, "cannot remove stale partition directory");
                }
            }
        }
        // Opened not serving; it serves only once its replica set is known.
        let not_serving = Leadership {
            is_leader: false,
            leader_epoch: state.leader_epoch,
        };
        match self
            .replicas
            .ensure_partition(topic, index, not_serving, now)
        {
            Ok(partition) => {
                partition.set_replica_set(me, topic.topic_id, state, min_isr, now);
                partition.set_leadership(leadership);
                if recorded_topic_id(&dir) != Some(topic.topic_id) {
                    if let Err(e) = record_topic_id(&dir, topic.topic_id) {
                        warn!(dir = %dir.display(), error = %e, "cannot record the topic id of a partition");
                    }
                }
                Ok(())
            }
            Err(e) => {
                let partition = format!("{}-{index}", topic.name);
                if self.replicas.record_open_failure(&topic.name, index, &e) {
                    error!(%partition, error = %e, "cannot open partition: its clients get KAFKA_STORAGE_ERROR until it opens (tried again at each metadata apply)");
                } else {
                    debug!(%partition, error = %e, "partition still cannot open");
                }
                Err(e)
            }
        }
    }
}

/// A partition of the image this broker replicates and does not host yet.
#[derive(Clone, Copy)]
struct Opening<'a> {
    topic: &'a TopicMetadata,
    index: i32,
    state: &'a PartitionState,
    leadership: Leadership,
    min_isr: usize,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::metadata::{
        BrokerInfo, KafkaEndpoint, LocalMetadataStore, PartitionState, TopicMetadata, NO_LEADER,
    };
    use crate::producer_ids::LocalProducerIdBlockSource;
    use crate::BrokerConfig;
    use kafka_protocol::error::ResponseError;

    fn broker(dir: &Path) -> Broker {
        let config = BrokerConfig {
            data_dir: dir.to_path_buf(),
            ..BrokerConfig::default()
        };
        let me = crate::local_broker_info(&config);
        let store = LocalMetadataStore::open(dir.join("topics.json"), me).unwrap();
        let ids = LocalProducerIdBlockSource::open(dir.join("ids.json")).unwrap();
        Broker::open_with(config, Arc::new(store), Box::new(ids)).unwrap()
    }

    fn image(offset: u64, topic_id: Uuid, states: Vec<PartitionState>) -> Arc<MetadataView> {
        let brokers = (1..=2)
            .map(|id| BrokerInfo {
                node_id: id,
                endpoints: vec![KafkaEndpoint {
                    listener: "PLAINTEXT".into(),
                    host: "127.0.0.1".into(),
                    port: 9092,
                }],
                rack: None,
                fenced: false,
            })
            .collect();
        let topic = TopicMetadata {
            name: "t".into(),
            topic_id,
            partitions: i32::try_from(states.len()).unwrap(),
            replication_factor: 1,
            configs: Default::default(),
            partition_states: states,
        };
        Arc::new(MetadataView::from_parts(
            offset,
            "c".into(),
            1,
            brokers,
            [topic],
        ))
    }

    fn state(replica: i32, leader: i32, leader_epoch: i32) -> PartitionState {
        PartitionState::new(vec![replica], vec![replica], leader, leader_epoch, 0)
    }

    #[test]
    fn leadership_follows_images_and_stale_images_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        let a = Uuid::from_u128(1);
        broker
            .apply_image(&image(1, a, vec![state(1, 1, 0), state(2, 2, 0)]))
            .unwrap();
        let p0 = broker.leader_partition("t", 0).unwrap();
        assert_eq!(p0.leader_epoch(), 0);
        assert!(
            broker.replicas.get("t", 1).is_none(),
            "not a replica of t-1"
        );
        assert_eq!(
            recorded_topic_id(&partition_dir(dir.path(), "t", 0)),
            Some(a)
        );

        // Fenced: no leader; the log stays open but is not served.
        broker
            .apply_image(&image(2, a, vec![state(1, NO_LEADER, 1), state(2, 2, 0)]))
            .unwrap();
        assert_eq!(
            broker.leader_partition("t", 0).err(),
            Some(ResponseError::NotLeaderOrFollower)
        );
        // A late, older image changes nothing.
        broker
            .apply_image(&image(1, a, vec![state(1, 1, 0), state(2, 2, 0)]))
            .unwrap();
        assert!(broker.leader_partition("t", 0).is_err());
        // Back, at a newer epoch.
        broker
            .apply_image(&image(3, a, vec![state(1, 1, 2), state(2, 2, 0)]))
            .unwrap();
        assert_eq!(broker.leader_partition("t", 0).unwrap().leader_epoch(), 2);

        // Deleted and re-created under the same name: a fresh partition.
        let b = Uuid::from_u128(2);
        broker
            .apply_image(&image(4, b, vec![state(1, 1, 0)]))
            .unwrap();
        let fresh = broker.leader_partition("t", 0).unwrap();
        assert!(!Arc::ptr_eq(&fresh, &p0));
        assert_eq!(
            recorded_topic_id(&partition_dir(dir.path(), "t", 0)),
            Some(b)
        );
    }

    #[test]
    fn a_directory_of_an_earlier_topic_is_not_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let stale = partition_dir(dir.path(), "t", 0);
        std::fs::create_dir_all(&stale).unwrap();
        record_topic_id(&stale, Uuid::from_u128(9)).unwrap();
        std::fs::write(stale.join("junk"), b"old data").unwrap();
        let broker = broker(dir.path());
        broker
            .apply_image(&image(1, Uuid::from_u128(1), vec![state(1, 1, 0)]))
            .unwrap();
        assert!(!stale.join("junk").exists(), "stale directory was adopted");
        assert_eq!(recorded_topic_id(&stale), Some(Uuid::from_u128(1)));
    }

    #[test]
    fn a_partition_that_could_not_open_opens_when_the_same_image_is_applied_again() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        // Something in the way of the partition's directory, as a full disk
        // refuses creating it.
        let blocked = partition_dir(dir.path(), "t", 0);
        std::fs::write(&blocked, b"in the way").unwrap();
        let view = image(1, Uuid::from_u128(1), vec![state(1, 1, 0)]);
        assert!(broker.apply_image(&view).is_err());
        assert!(broker.replicas.get("t", 0).is_none());
        // Its clients are told the storage failed, not sent looking for
        // another leader.
        assert_eq!(
            broker.leader_partition("t", 0).err(),
            Some(ResponseError::KafkaStorageError)
        );
        assert_eq!(broker.replicas.unopened_count(), 1);
        assert!(broker.replicas.failed_to_open("t", 0));
        std::fs::remove_file(&blocked).unwrap();
        broker.apply_image(&view).unwrap();
        assert_eq!(broker.leader_partition("t", 0).unwrap().leader_epoch(), 0);
        assert_eq!(broker.replicas.unopened_count(), 0);
    }

    #[test]
    fn partitions_opened_on_several_threads_all_open_and_one_that_cannot_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        assert!(broker.config.log_open_threads > 1);
        let blocked = partition_dir(dir.path(), "t", 17);
        std::fs::write(&blocked, b"in the way").unwrap();
        let view = image(
            1,
            Uuid::from_u128(1),
            (0..40).map(|_| state(1, 1, 3)).collect(),
        );
        assert!(matches!(
            broker.apply_image(&view),
            Err(BrokerError::OpenPartition { partition, .. }) if partition == "t-17"
        ));
        for index in (0..40).filter(|&i| i != 17) {
            let partition = broker.leader_partition("t", index).unwrap();
            assert_eq!(partition.leader_epoch(), 3);
            assert_eq!(
                recorded_topic_id(&partition_dir(dir.path(), "t", index)),
                Some(Uuid::from_u128(1))
            );
        }
        assert!(broker.replicas.failed_to_open("t", 17));
        assert_eq!(broker.replicas.unopened_count(), 1);
    }

    #[tokio::test]
    async fn an_acks_all_produce_parked_on_a_deleted_topic_is_answered_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let broker = broker(dir.path());
        // Replicas 1 and 2, both in sync; follower 2 never fetches, as
        // when it deleted the topic first.
        let replicated = PartitionState::new(vec![1, 2], vec![1, 2], 1, 0, 0);
        broker
            .apply_image(&image(1, Uuid::from_u128(1), vec![replicated]))
            .unwrap();
        let partition = broker.leader_partition("t", 0).unwrap();
        let appended = partition
            .append(&samsa_storage::testing::simple_batch(1, 0), crate::now_ms())
            .unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let waiting = tokio::spawn(async move {
            partition
                .wait_replicated(appended.info.last_offset + 1, 0, deadline)
                .await
        });
        let mut deleted = (*image(2, Uuid::from_u128(1), vec![])).clone();
        deleted.topics.clear();
        broker.apply_image(&Arc::new(deleted)).unwrap();
        let answer = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("answered long before the request's 30 s timeout")
            .unwrap();
        assert_eq!(answer, Err(ResponseError::NotLeaderOrFollower));
    }

    #[test]
    fn topic_id_marker_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded_topic_id(dir.path()), None);
        let id = Uuid::new_v4();
        record_topic_id(dir.path(), id).unwrap();
        assert_eq!(recorded_topic_id(dir.path()), Some(id));
        std::fs::write(dir.path().join(PARTITION_METADATA_FILE), b"junk").unwrap();
        assert_eq!(recorded_topic_id(dir.path()), None);
    }
}
