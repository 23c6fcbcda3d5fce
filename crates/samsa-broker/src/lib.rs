//! samsa-broker: the Kafka protocol front end and everything a broker hosts.
//!
//! - [`server`]: TCP listener, framing, in-order pipelined answers;
//! - [`apis`]: the one declaration of every API served (key, versions, its
//!   ordering on a connection);
//! - [`dispatch`]: header decoding, version checks against [`apis`], routing;
//! - [`handlers`]: one module per Kafka API family;
//! - [`produce_order`]: a connection's produce requests append in arrival
//!   order while their acks=all waits overlap;
//! - [`replica`]: the partitions this broker hosts (logs, HW watch, group commit);
//! - [`replication`]: follower fetch loops, the leader's replication service,
//!   HW over the ISR, ISR changes, the leader-epoch cache;
//! - [`metadata`]: the broker's view of the cluster ([`metadata::MetadataView`]) behind the [`metadata::MetadataStore`] boundary;
//! - `apply`: makes the hosted partitions and their leadership match an image;
//! - [`controller_contact`]: when the controller last answered, and when a
//!   leader cut off from it and from its followers stops acting as leader;
//! - [`producer_ids`]: producer id blocks behind [`producer_ids::ProducerIdBlockSource`];
//! - [`coordinator`]: the transaction and group coordinators — sans-IO
//!   state machines over `__transaction_state` and `__consumer_offsets`
//!   (`coordinator::txn`, `coordinator::group`) driven by one runtime
//!   (`coordinator::runtime`: state topic, loading, acks=all state writes,
//!   timers), with what only one of them needs in its `service` (markers,
//!   KIP-890 verification and the `TxnService` gRPC; parked requests);
//! - [`topic_partition`]: a partition named by its topic;
//! - [`cluster`]: cluster mode — the embedded controller, registration,
//!   heartbeats and the metadata stream from the controller quorum;
//! - [`error`]: the one mapping from internal errors to Kafka error codes;
//! - [`http`]: `/metrics`, `/healthz`, `/readyz` on `http_listen`;
//! - [`alloc_guard`]: the process allocator every binary running a broker
//!   installs (absurd wire-length reservations cost address space, not an abort).
//!
//! [`run`] wires them together: for a single node (no
//! `controller_quorum_voters`), or as a cluster node ([`cluster::run`]).

// The module docs are contracts for whoever works on the broker, read with
// `cargo doc --document-private-items`: they link the private functions
// that keep the invariants they state.
#![allow(rustdoc::private_intra_doc_links)]

pub mod alloc_guard;
pub mod apis;
mod apply;
pub mod cluster;
mod codec;
pub mod config;
pub mod controller_contact;
pub mod coordinator;
pub mod data_dir_lock;
pub mod descriptors;
pub mod dispatch;
pub mod dynamic_config;
pub mod error;
pub mod fetch_sessions;
mod fsutil;
pub mod handlers;
pub mod http;
pub mod hw_checkpoint;
mod log_cleaner;
pub mod metadata;
pub mod metrics;
mod parallel;
pub mod produce_order;
pub mod producer_ids;
pub mod replica;
pub mod replication;
pub mod request_metrics;
pub mod security;
mod server;
pub mod topic_partition;
pub mod trace;
pub mod write_failures;

// The unit tests run brokers in-process: they get the allocator the `samsa`
// binary runs a broker with, so malformed-request tests exercise the same
// promise (see `alloc_guard`).
#[cfg(test)]
#[global_allocator]
static ALLOCATOR: alloc_guard::LazyHugeAllocator = alloc_guard::LazyHugeAllocator;

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use samsa_storage::FlushPolicy;
use tracing::{info, warn};

pub use config::BrokerConfig;
pub use error::{BrokerError, MetadataError};
use metadata::{
    BrokerInfo, KafkaEndpoint, LocalMetadataStore, MetadataStore, MetadataView, NewTopic,
    TopicMetadata,
};
use producer_ids::{LocalProducerIdBlockSource, ProducerIdBlockSource, ProducerIdManager};
use replica::{Partition, ReplicaManager};

/// Wall-clock milliseconds since the Unix epoch, the time base of Kafka timestamps.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs a log write (or anything else that may sleep in the kernel) from
/// async code without stalling the other tasks of this worker thread.
///
/// Why: a `pwrite` into the page cache normally takes microseconds, but on
/// ext4 it can wait for a journal commit that another partition's fsync
/// started, for milliseconds. On a two-core machine the runtime has two
/// workers; two such waits stopped every connection and replication stream
/// of the process. On a multi-threaded runtime the worker's other tasks move
/// to a fresh thread for the duration (`block_in_place`); elsewhere (unit
/// tests on a current-thread runtime) the call just runs.
pub fn blocking_io<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Everything one broker process owns; shared by all connections.
pub struct Broker {
    /// The static configuration (file, flags, environment). Settings that
    /// can change at run time are read from [`Broker::effective_config`].
    pub config: BrokerConfig,
    /// `config` with the metadata's dynamic broker configs applied
    /// (`dynamic_config`), replaced when an image with other dynamic
    /// values is applied.
    effective_config: std::sync::RwLock<Arc<BrokerConfig>>,
    pub metadata: Arc<dyn MetadataStore>,
    pub replicas: ReplicaManager,
    pub producer_ids: ProducerIdManager,
    /// Serializes topic creation/deletion so logs and metadata change together.
    admin_lock: tokio::sync::Mutex<()>,
    /// The reassignment throttle's buckets (`replication::throttle`).
    pub replication_throttles: replication::throttle::ReplicationThrottles,
    /// The image the hosted partitions were last made to match (see `apply`).
    applied: std::sync::Mutex<Arc<MetadataView>>,
    /// Single-node mode (local metadata file).
    single_node: bool,
    /// The transaction coordinator and its runtime.
    pub txn: coordinator::txn::TxnRuntime,
    /// The group coordinator and its runtime.
    pub groups: coordinator::group::GroupRuntime,
    /// The Kafka Fetch API's sessions (KIP-227).
    pub fetch_sessions: fetch_sessions::FetchSessionCache,
    /// How much clients pipeline produce requests (`/metrics`).
    pub pipelining: produce_order::PipeliningStats,
    /// The ACL authorizer over the last applied image's ACLs; `None` with
    /// `authorizer_enable` off.
    authorizer: std::sync::RwLock<Option<Arc<security::acl::Authorizer>>>,
    /// The users and ACLs the configuration declares, written once the
    /// broker serves (`security::declared`).
    pub declared: Arc<security::declared::Declared>,
    /// What this process records as it serves (`/metrics`).
    pub metrics: samsa_metrics::Metrics,
    /// The request metrics of each served API, resolved once.
    pub request_meters: request_metrics::RequestMeters,
}

/// This broker as it advertises itself.
pub fn local_broker_info(config: &BrokerConfig) -> BrokerInfo {
    // Unusable listener settings stop the start before this is asked
    // ([`server::bind_listeners`]); here they leave the broker with the
    // main listener only.
    let endpoints = config
        .kafka_listeners()
        .unwrap_or_else(|_| vec![config.main_listener()]);
    BrokerInfo {
        node_id: config.node_id,
        endpoints: endpoints
            .into_iter()
            .map(|l| KafkaEndpoint {
                listener: l.name,
                host: l.advertised_host,
                port: l.advertised_port,
            })
            .collect(),
        rack: None,
        fenced: false,
    }
}

/// Where a topic's new replicas go, for the descriptor headroom check.
enum Placement<'a> {
    /// Replica lists given by the request.
    Assigned(&'a [Vec<i32>]),
    /// Placed by the controller (or the single node): `replication_factor`
    /// of 0 or less means the default.
    Spread {
        partitions: i32,
        replication_factor: i16,
    },
}

impl Broker {
    /// Opens a single-node data directory: metadata, producer-id store, and
    /// every partition log (recovering any that were not closed cleanly).
    pub fn open(config: BrokerConfig) -> Result<Broker, BrokerError> {
        let meta_dir = config.data_dir.join("meta");
        std::fs::create_dir_all(&meta_dir).map_err(|source| BrokerError::Io {
            path: meta_dir.clone(),
            source,
        })?;
        if meta_dir.join(cluster::CLUSTER_FILE).exists() {
            return Err(BrokerError::Config(format!(
                "data directory {} belongs to a cluster node ({}); start it with its                  controller_quorum_voters, or use another data_dir for a single node",
                config.data_dir.display(),
                meta_dir.join(cluster::CLUSTER_FILE).display()
            )));
        }
        let metadata =
            LocalMetadataStore::open(meta_dir.join("topics.json"), local_broker_info(&config))?;
        let id_source = LocalProducerIdBlockSource::open(meta_dir.join("producer_ids.json"))
            .map_err(|e| BrokerError::Io {
                path: meta_dir.join("producer_ids.json"),
                source: std::io::Error::other(e.to_string()),
            })?;
        let broker = Self::open_with(config, Arc::new(metadata), Box::new(id_source))?;
        let image = broker.metadata.image();
        broker.apply_image(&image)?;
        Ok(broker)
    }

    /// A broker over the given metadata store and producer-id source, hosting
    /// nothing yet: partitions open when an image is applied.
    pub fn open_with(
        config: BrokerConfig,
        metadata: Arc<dyn MetadataStore>,
        id_source: Box<dyn ProducerIdBlockSource>,
    ) -> Result<Broker, BrokerError> {
        samsa_storage::open_files::set_inactive_capacity(descriptors::inactive_budget(
            config.log_inactive_segment_files_max,
            descriptors::limit(),
        ));
        let metrics = samsa_metrics::Metrics::new();
        let replicas = ReplicaManager::new(
            config.data_dir.clone(),
            config.log.clone(),
            metrics.topics.clone(),
            metrics.partitions.clone(),
        );
        replicas.purge_deleted_dirs()?;
        let authorizer = if config.authorizer_enable {
            Some(Arc::new(security::acl::Authorizer::new(
                Vec::<security::acl::AclBinding>::new(),
                config.super_user_principals()?,
                config.allow_everyone_if_no_acl_found,
            )))
        } else {
            None
        };
        let declared = Arc::new(security::declared::Declared::load(&config)?);
        let request_meters = request_metrics::RequestMeters::new(&metrics.requests);
        let txn = coordinator::txn::TxnRuntime::for_config(&config, metrics.txns.clone());
        let groups = coordinator::group::GroupRuntime::for_config(&config, metrics.groups.clone());
        let fetch_sessions = fetch_sessions::FetchSessionCache::new(
            config.max_incremental_fetch_session_cache_slots,
            metrics.partitions.clone(),
        );
        Ok(Broker {
            fetch_sessions,
            metrics,
            request_meters,
            authorizer: std::sync::RwLock::new(authorizer),
            declared,
            txn,
            groups,
            pipelining: Default::default(),
            single_node: config.controller_quorum_voters.is_none(),
            effective_config: std::sync::RwLock::new(Arc::new(config.clone())),
            config,
            metadata,
            replicas,
            producer_ids: ProducerIdManager::new(id_source),
            admin_lock: tokio::sync::Mutex::new(()),
            replication_throttles: Default::default(),
            applied: std::sync::Mutex::new(Arc::new(MetadataView::default())),
        })
    }

    /// The configuration in force now: the static one with the dynamic
    /// broker configs of the last applied image (`dynamic_config`).
    pub fn effective_config(&self) -> Arc<BrokerConfig> {
        Arc::clone(
            &self
                .effective_config
                .read()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// What a request of `client`'s may do: its principal judged by the
    /// ACLs in force now.
    pub fn access(&self, client: &dispatch::ClientConnection) -> security::access::Access {
        let authorizer = self
            .authorizer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        security::access::Access::new(authorizer, Arc::clone(&client.principal), client.peer.ip())
    }

    /// Rebuilds the authorizer when `acls` differ from the ones it holds.
    fn apply_acls(&self, acls: &std::collections::BTreeSet<security::acl::AclBinding>) {
        let mut slot = self.authorizer.write().unwrap_or_else(|p| p.into_inner());
        let Some(current) = slot.as_ref() else {
            return;
        };
        if current.holds_exactly(acls) {
            return;
        }
        *slot = Some(Arc::new(current.with_bindings(acls)));
        info!(acls = acls.len(), "ACLs in force");
    }

    /// Applies SCRAM credential and ACL changes (checked by the caller)
    /// through the metadata; in force here when this returns.
    pub async fn alter_security(
        &self,
        records: Vec<metadata::MetadataRecord>,
    ) -> Result<(), MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let summary: Vec<String> = records.iter().map(ToString::to_string).collect();
        self.metadata.alter_security(records).await?;
        self.apply_current();
        info!(changes = ?summary, "security changed");
        Ok(())
    }

    /// A new connection's SASL side: the enabled mechanisms, checking
    /// passwords against the credentials of the metadata as it is when a
    /// client authenticates.
    pub fn sasl_session(&self) -> security::sasl::SaslSession {
        let metadata = Arc::clone(&self.metadata);
        security::sasl::SaslSession::new(
            Arc::new(self.config.sasl_enabled_mechanisms.clone()),
            Arc::new(
                move |user: &str, mechanism: security::scram::ScramMechanism| {
                    metadata
                        .image()
                        .scram_credentials
                        .get(user)?
                        .get(mechanism.name())
                        .cloned()
                },
            ),
            self.config.connections_max_reauth_ms,
        )
    }

    /// Sets (`Some`) or removes (`None`) dynamic configs of one resource,
    /// validated by the caller; they are in force here when this returns.
    pub async fn alter_configs(
        &self,
        resource: metadata::ConfigResource,
        changes: Vec<(String, Option<String>)>,
    ) -> Result<(), MetadataError> {
        let _admin = self.admin_lock.lock().await;
        self.metadata
            .alter_configs(resource.clone(), changes.clone())
            .await?;
        self.apply_current();
        info!(?resource, ?changes, "configs changed");
        Ok(())
    }

    /// Whether this broker hosts `topic`-`index` and may act on its
    /// leadership: Metadata and leader hints name this broker as the leader
    /// the image gives it only then.
    pub fn leads_usably(&self, topic: &str, index: i32) -> bool {
        self.replicas
            .get(topic, index)
            .is_some_and(|partition| !partition.leadership_in_doubt_now())
    }

    /// The partition `topic`-`index` if this broker leads it; otherwise the
    /// error Kafka answers: NOT_LEADER_OR_FOLLOWER for a partition that
    /// exists (led elsewhere, by no one, or by this broker while its
    /// leadership is in doubt), KAFKA_STORAGE_ERROR for one this broker
    /// should host but could not open, UNKNOWN_TOPIC_OR_PARTITION for one
    /// the metadata does not know.
    pub fn leader_partition(
        &self,
        topic: &str,
        index: i32,
    ) -> Result<Arc<Partition>, ResponseError> {
        match self.replicas.get(topic, index) {
            Some(partition) if partition.is_leader() && !partition.leadership_in_doubt_now() => {
                Ok(partition)
            }
            Some(_) => Err(ResponseError::NotLeaderOrFollower),
            None if self.replicas.failed_to_open(topic, index) => {
                Err(ResponseError::KafkaStorageError)
            }
            None if self.metadata.image().partition(topic, index).is_some() => {
                Err(ResponseError::NotLeaderOrFollower)
            }
            None => Err(ResponseError::UnknownTopicOrPartition),
        }
    }

    /// Creates a topic: metadata first (durable), then its partition logs.
    pub async fn create_topic(&self, topic: NewTopic) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let replicas = match &topic.assignments {
            Some(assignments) => Placement::Assigned(assignments),
            None => Placement::Spread {
                partitions: topic.partitions,
                replication_factor: topic.replication_factor,
            },
        };
        self.check_descriptor_headroom(replicas)?;
        let created = self.metadata.create_topic(topic).await?;
        if self.single_node {
            // A brand-new topic on the only node: whatever sits in its
            // directories is left over from before. (In cluster mode the
            // applier decides by the topic id stored in each directory.)
            self.replicas.clear_stale_dirs(&created);
        }
        self.apply_current();
        info!(topic = %created.name, partitions = created.partitions, "topic created");
        Ok(created)
    }

    pub async fn delete_topic(&self, name: String) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let deleted = self.metadata.delete_topic(name).await?;
        self.apply_current();
        info!(topic = %deleted.name, "topic deleted");
        Ok(deleted)
    }

    pub async fn create_partitions(
        &self,
        name: String,
        count: i32,
        assignments: Option<Vec<Vec<i32>>>,
    ) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        if let Some(existing) = self.metadata.image().topic(&name) {
            let replicas = match &assignments {
                Some(assignments) => Placement::Assigned(assignments),
                None => Placement::Spread {
                    partitions: count.saturating_sub(existing.partitions),
                    replication_factor: existing.replication_factor,
                },
            };
            self.check_descriptor_headroom(replicas)?;
        }
        let topic = self
            .metadata
            .create_partitions(name, count, assignments)
            .await?;
        self.apply_current();
        Ok(topic)
    }

    /// Refuses new partitions this broker could not open for want of file
    /// descriptors (`descriptors`), before the topic exists: KAFKA_STORAGE_ERROR
    /// with what to raise. Where the controller places replicas, this
    /// broker's share is estimated as an even spread over the live brokers.
    fn check_descriptor_headroom(&self, replicas: Placement<'_>) -> Result<(), MetadataError> {
        let me = self.config.node_id;
        let here = match replicas {
            Placement::Assigned(assignments) => assignments
                .iter()
                .filter(|replicas| replicas.contains(&me))
                .count() as u64,
            Placement::Spread {
                partitions,
                replication_factor,
            } => {
                let replication_factor = if replication_factor > 0 {
                    replication_factor
                } else {
                    self.default_replication_factor()
                };
                let replicas = u64::try_from(partitions).unwrap_or(0)
                    * u64::try_from(replication_factor).unwrap_or(1);
                let brokers = self.metadata.image().live_brokers().count().max(1) as u64;
                replicas.div_ceil(brokers)
            }
        };
        match descriptors::refuse_new_partitions(here) {
            None => Ok(()),
            Some(message) => {
                warn!(partitions = here, "refusing new partitions: {message}");
                Err(MetadataError::Rejected {
                    error: ResponseError::KafkaStorageError,
                    message,
                })
            }
        }
    }

    /// Applies the store's current image right away, so the change a request
    /// just made is hosted before it is answered.
    fn apply_current(&self) {
        let image = self.metadata.image();
        if let Err(e) = self.apply_image(&image) {
            // The metadata is durable; the next apply (or start) retries.
            warn!(error = %e, "cannot apply metadata to hosted partitions");
        }
    }

    /// The replication factor of a new topic that does not name one:
    /// `default_replication_factor` if set, else min(3, unfenced brokers)
    /// (1 on a single node).
    pub fn default_replication_factor(&self) -> i16 {
        self.replication_factor_or_default(self.config.default_replication_factor)
    }

    /// `configured`, or when a replication-factor setting is unset, what
    /// samsa uses instead: min(3, unfenced brokers), at least 1.
    pub fn replication_factor_or_default(&self, configured: Option<i16>) -> i16 {
        configured.unwrap_or_else(|| {
            let live = self.metadata.image().live_brokers().count();
            i16::try_from(live.clamp(1, 3)).unwrap_or(1)
        })
    }

    /// Auto-creation as Kafka does it for Metadata requests.
    pub async fn auto_create_topic(&self, name: &str) -> Result<Arc<TopicMetadata>, MetadataError> {
        let topic = NewTopic {
            name: name.to_string(),
            partitions: self.config.num_partitions,
            replication_factor: self.default_replication_factor(),
            configs: Default::default(),
            assignments: None,
        };
        match self.create_topic(topic).await {
            Err(MetadataError::TopicAlreadyExists(_)) => self
                .metadata
                .image()
                .topic(name)
                .cloned()
                .ok_or_else(|| MetadataError::UnknownTopic(name.to_string())),
            other => other,
        }
    }
}

/// Runs a single-node broker until `shutdown` resolves, then shuts down
/// cleanly: stops accepting, closes connections, flushes and closes every
/// partition log (producer-state snapshot, checkpoint, clean-shutdown marker).
pub async fn run(
    config: BrokerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    // Held until this function returns: the broker's whole life.
    let _data_dir_lock = data_dir_lock::lock(&config.data_dir)?;
    if config.controller_quorum_voters.is_some() {
        return cluster::run(config, shutdown).await;
    }
    let listen = config.listen;
    // The Kafka listeners' ports are named; `http_listen` may be port 0.
    // Binding the named ones first keeps the kernel from handing a named
    // port to the HTTP listener (as a cluster node does, cluster/node.rs).
    let listeners = server::bind_listeners(&config).await?;
    let http_state = Arc::new(http::HttpState::default());
    let http_listener = http::bind(config.http_listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http_server = tokio::spawn(http::serve(
        http_listener,
        Arc::clone(&http_state),
        stop_rx.clone(),
    ));
    let broker = Arc::new(
        tokio::task::spawn_blocking(move || Broker::open(config))
            .await
            .map_err(|e| BrokerError::Io {
                path: listen.to_string().into(),
                source: std::io::Error::other(e),
            })??,
    );
    http_state.attach(Arc::clone(&broker));

    let maintenance = tokio::spawn(maintenance_loop(broker.clone(), stop_rx.clone()));
    let coordinator =
        coordinator::txn::TxnRuntime::start_with_peers(&broker, None, stop_rx.clone());
    let group_coordinator = coordinator::group::GroupRuntime::start(&broker, stop_rx.clone());
    tokio::spawn(Arc::clone(&broker.declared).ensure(broker.clone(), stop_rx.clone()));
    let accept = tokio::spawn(server::accept_all(listeners, broker.clone(), stop_rx));
    http_state.set_ready(true);
    info!(node = broker.config.node_id, %listen, data_dir = %broker.config.data_dir.display(), "broker started");

    shutdown.await;
    info!("shutting down");
    http_state.set_ready(false);
    let _ = stop_tx.send(true);
    let _ = accept.await;
    let _ = http_server.await;
    let _ = maintenance.await;
    let _ = coordinator.await;
    let _ = group_coordinator.await;
    let closing = broker.clone();
    let _ = tokio::task::spawn_blocking(move || {
        closing.replicas.close_all(closing.config.log_open_threads)
    })
    .await;
    info!("shutdown complete");
    Ok(())
}

/// How soon after a roll the closed segment is fsynced (Kafka schedules
/// that flush at once; a second bounds how much a crash right after a roll
/// replays, and batches the rolls of many partitions into one pass).
const ROLLED_SEGMENT_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Retention, high-watermark checkpoints, the fsync of rolled segments
/// and, under [`FlushPolicy::Interval`], periodic fsync.
async fn maintenance_loop(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let retention_every = Duration::from_millis(broker.config.retention_check_interval_ms.max(1));
    let flush_every = match broker.config.log.flush {
        FlushPolicy::Interval { interval_ms } if interval_ms > 0 => {
            Some(Duration::from_millis(interval_ms))
        }
        _ => None,
    };
    let hw_checkpoint_every = Duration::from_millis(
        broker
            .config
            .replica_high_watermark_checkpoint_interval_ms
            .max(1),
    );
    let mut hw_checkpoint = tokio::time::interval(hw_checkpoint_every);
    let mut retention = tokio::time::interval(retention_every);
    let mut flush = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
    let mut rolled_flush = tokio::time::interval(ROLLED_SEGMENT_FLUSH_INTERVAL);
    // Not awaited at shutdown: a pass in progress is abandoned, and its
    // files are deleted when the partition next opens.
    tokio::spawn(log_cleaner::run(broker.clone(), stop.clone()));
    loop {
        tokio::select! {
            _ = retention.tick() => {
                let b = broker.clone();
                let _ = tokio::task::spawn_blocking(move || b.replicas.enforce_retention(now_ms())).await;
            }
            _ = flush.tick(), if flush_every.is_some() => {
                let b = broker.clone();
                let _ = tokio::task::spawn_blocking(move || b.replicas.flush_all()).await;
            }
            _ = rolled_flush.tick() => {
                broker.replicas.flush_rolled_segments().await;
            }
            _ = hw_checkpoint.tick() => {
                let b = broker.clone();
                let _ = tokio::task::spawn_blocking(move || b.replicas.checkpoint_high_watermarks()).await;
            }
            _ = stop.changed() => return,
        }
    }
}
