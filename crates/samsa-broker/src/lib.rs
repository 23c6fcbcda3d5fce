//! samsa-broker: the Kafka protocol front end and everything a broker hosts.
//!
//! - [`server`]: TCP listener, framing, in-order pipelined answers;
//! - [`dispatch`]: header decoding, the table of supported API versions, routing;
//! - [`handlers`]: one module per Kafka API family;
//! - [`replica`]: the partitions this broker hosts (logs, HW watch, group commit);
//! - [`metadata`]: topic metadata behind the [`metadata::MetadataStore`] boundary;
//! - [`producer_ids`]: producer id blocks behind [`producer_ids::ProducerIdBlockSource`];
//! - [`error`]: the one mapping from internal errors to Kafka error codes.
//!
//! [`run`] wires them together for a single node.

pub mod config;
pub mod dispatch;
pub mod error;
mod fsutil;
pub mod handlers;
pub mod metadata;
pub mod producer_ids;
pub mod replica;
mod server;

use std::sync::Arc;
use std::time::Duration;

use samsa_storage::FlushPolicy;
use tracing::{info, warn};

pub use config::BrokerConfig;
pub use error::{BrokerError, MetadataError};
use metadata::{LocalMetadataStore, MetadataStore, NewTopic, TopicMetadata};
use producer_ids::{LocalProducerIdBlockSource, ProducerIdManager};
use replica::ReplicaManager;

/// Wall-clock milliseconds since the Unix epoch, the time base of Kafka timestamps.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Everything one broker process owns; shared by all connections.
pub struct Broker {
    pub config: BrokerConfig,
    pub metadata: Arc<dyn MetadataStore>,
    pub replicas: ReplicaManager,
    pub producer_ids: ProducerIdManager,
    /// Serializes topic creation/deletion so logs and metadata change together.
    admin_lock: tokio::sync::Mutex<()>,
}

impl Broker {
    /// Opens the data directory: metadata, producer-id store, and every
    /// partition log (recovering any that were not closed cleanly).
    pub fn open(config: BrokerConfig) -> Result<Broker, BrokerError> {
        let meta_dir = config.data_dir.join("meta");
        std::fs::create_dir_all(&meta_dir).map_err(|source| BrokerError::Io {
            path: meta_dir.clone(),
            source,
        })?;
        let metadata = LocalMetadataStore::open(meta_dir.join("topics.json"))?;
        let id_source = LocalProducerIdBlockSource::open(meta_dir.join("producer_ids.json"))
            .map_err(|e| BrokerError::Io {
                path: meta_dir.join("producer_ids.json"),
                source: std::io::Error::other(e.to_string()),
            })?;
        let replicas = ReplicaManager::new(config.data_dir.clone(), config.log.clone());
        replicas.purge_deleted_dirs()?;
        let image = metadata.image();
        let now = now_ms();
        for topic in image.topics.values() {
            replicas.ensure_topic(topic, now)?;
        }
        Ok(Broker {
            config,
            metadata: Arc::new(metadata),
            replicas,
            producer_ids: ProducerIdManager::new(Box::new(id_source)),
            admin_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Creates a topic: metadata first (durable), then its partition logs.
    pub async fn create_topic(&self, topic: NewTopic) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let created = self.metadata.create_topic(topic).await?;
        self.replicas.clear_stale_dirs(&created);
        self.open_partitions(&created);
        info!(topic = %created.name, partitions = created.partitions, "topic created");
        Ok(created)
    }

    pub async fn delete_topic(&self, name: String) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let deleted = self.metadata.delete_topic(name).await?;
        self.replicas.remove_topic(&deleted);
        info!(topic = %deleted.name, "topic deleted");
        Ok(deleted)
    }

    pub async fn create_partitions(
        &self,
        name: String,
        count: i32,
    ) -> Result<Arc<TopicMetadata>, MetadataError> {
        let _admin = self.admin_lock.lock().await;
        let topic = self.metadata.create_partitions(name, count).await?;
        self.open_partitions(&topic);
        Ok(topic)
    }

    fn open_partitions(&self, topic: &TopicMetadata) {
        if let Err(e) = self.replicas.ensure_topic(topic, now_ms()) {
            // The metadata is durable; the next start retries opening the logs.
            warn!(topic = %topic.name, error = %e, "cannot open partitions of topic");
        }
    }

    /// Auto-creation as Kafka does it for Metadata requests.
    pub async fn auto_create_topic(&self, name: &str) -> Result<Arc<TopicMetadata>, MetadataError> {
        let topic = NewTopic {
            name: name.to_string(),
            partitions: self.config.num_partitions,
            replication_factor: self.config.default_replication_factor,
            configs: Default::default(),
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
    let listen = config.listen;
    let broker = Arc::new(
        tokio::task::spawn_blocking(move || Broker::open(config))
            .await
            .map_err(|e| BrokerError::Io {
                path: listen.to_string().into(),
                source: std::io::Error::other(e),
            })??,
    );
    let listener = server::bind(listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let maintenance = tokio::spawn(maintenance_loop(broker.clone(), stop_rx.clone()));
    let accept = tokio::spawn(server::accept_loop(listener, broker.clone(), stop_rx));
    info!(node = broker.config.node_id, %listen, data_dir = %broker.config.data_dir.display(), "broker started");

    shutdown.await;
    info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = accept.await;
    let _ = maintenance.await;
    let closing = broker.clone();
    let _ = tokio::task::spawn_blocking(move || closing.replicas.close_all()).await;
    info!("shutdown complete");
    Ok(())
}

/// Retention and, under [`FlushPolicy::Interval`], periodic fsync.
async fn maintenance_loop(broker: Arc<Broker>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let retention_every = Duration::from_millis(broker.config.retention_check_interval_ms.max(1));
    let flush_every = match broker.config.log.flush {
        FlushPolicy::Interval { interval_ms } if interval_ms > 0 => {
            Some(Duration::from_millis(interval_ms))
        }
        _ => None,
    };
    let mut retention = tokio::time::interval(retention_every);
    let mut flush = tokio::time::interval(flush_every.unwrap_or(Duration::from_secs(3600)));
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
            _ = stop.changed() => return,
        }
    }
}
