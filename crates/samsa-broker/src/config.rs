//! Broker configuration: every setting a `samsa server` accepts, with Kafka's
//! defaults unless a comment says otherwise. `docs/OPERATIONS.md` documents each
//! key; the TOML file and `--set key=value` flags use these field names.

use std::net::SocketAddr;
use std::path::PathBuf;

use samsa_storage::config::LogConfig;
use serde::{Deserialize, Serialize};

/// Configuration of one broker process.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// `node.id`: this broker's id, reported in Metadata and DescribeCluster.
    pub node_id: i32,
    /// Address the Kafka listener binds to.
    pub listen: SocketAddr,
    /// `host:port` advertised to clients in Metadata. Defaults to `listen`
    /// (with an unspecified bind address replaced by 127.0.0.1).
    pub advertised_listener: Option<String>,
    /// Directory holding partition logs and broker metadata.
    pub data_dir: PathBuf,
    /// `num.partitions`: partitions of auto-created topics and of CreateTopics
    /// requests that leave the count at -1.
    pub num_partitions: i32,
    /// `auto.create.topics.enable`.
    pub auto_create_topics_enable: bool,
    /// `default.replication.factor` (a single node can only host 1).
    pub default_replication_factor: i16,
    /// `socket.request.max.bytes`: a frame larger than this closes the connection.
    pub max_request_bytes: usize,
    /// `log.retention.check.interval.ms`.
    pub retention_check_interval_ms: u64,
    /// Defaults for every partition log (`log.*` settings).
    pub log: LogConfig,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            node_id: 1,
            listen: SocketAddr::from(([0, 0, 0, 0], 9092)),
            advertised_listener: None,
            data_dir: PathBuf::from("./samsa-data"),
            num_partitions: 1,
            auto_create_topics_enable: true,
            default_replication_factor: 1,
            max_request_bytes: 100 * 1024 * 1024,
            retention_check_interval_ms: 300_000,
            log: LogConfig::default(),
        }
    }
}

impl BrokerConfig {
    /// The `(host, port)` clients are told to connect to.
    pub fn advertised_host_port(&self) -> (String, i32) {
        if let Some(adv) = &self.advertised_listener {
            if let Some((host, port)) = adv.rsplit_once(':') {
                if let Ok(port) = port.parse::<i32>() {
                    return (host.trim_matches(['[', ']']).to_string(), port);
                }
            }
        }
        let host = if self.listen.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else {
            self.listen.ip().to_string()
        };
        (host, i32::from(self.listen.port()))
    }
}
