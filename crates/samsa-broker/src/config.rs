//! Broker configuration: every setting a `samsa server` accepts, with Kafka's
//! defaults unless a comment says otherwise. `docs/OPERATIONS.md` documents each
//! key; the TOML file and `--set key=value` flags use these field names.

use std::collections::BTreeSet;
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
    /// `default.replication.factor` for auto-created topics and CreateTopics
    /// requests that leave it at -1. Unset (the default): min(3, unfenced
    /// brokers) — 3 on a cluster of three or more, 1 on a single node.
    pub default_replication_factor: Option<i16>,
    /// `socket.request.max.bytes`: a frame larger than this closes the connection.
    pub max_request_bytes: usize,
    /// `log.retention.check.interval.ms`.
    pub retention_check_interval_ms: u64,
    /// Defaults for every partition log (`log.*` settings).
    pub log: LogConfig,

    // --- cluster mode (all ignored while `controller_quorum_voters` is unset) ---
    /// `controller.quorum.voters`: the static controller quorum,
    /// `"1@host:9093,2@host:9093,3@host:9093"`. Unset: single-node mode with
    /// local metadata files. Set: this process runs the controller and the
    /// broker role (combined mode); `node_id` must be one of the voters.
    pub controller_quorum_voters: Option<String>,
    /// Address the controller's gRPC server binds to (Raft between
    /// controllers, broker ⇄ controller). Must be reachable at this node's
    /// address in `controller_quorum_voters`.
    pub controller_listen: SocketAddr,
    /// Expected cluster id. Unset: take the one fixed at first formation (a
    /// node whose data belongs to another cluster still refuses to start).
    pub cluster_id: Option<String>,
    /// `broker.heartbeat.interval.ms`: how often the broker heartbeats the
    /// active controller.
    pub broker_heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms`: a broker without heartbeat this long is
    /// fenced by the controller and its leaderships move.
    pub broker_session_timeout_ms: u64,
    /// `controller.quorum.election.timeout.ms`: the base election timeout.
    /// A controller that hears nothing from the leader waits a leader lease
    /// (1.5 × this) plus a random 1–1.5 × this before it campaigns, so a
    /// failover takes about 2.5–3 × this.
    pub controller_quorum_election_timeout_ms: u64,
    /// How often the controller leader sends Raft heartbeats; must be well
    /// below the election timeout.
    pub controller_quorum_heartbeat_interval_ms: u64,
    /// How long a metadata change (CreateTopics, DeleteTopics,
    /// CreatePartitions, producer-id blocks) may wait for the active
    /// controller before it fails with a retriable REQUEST_TIMED_OUT.
    pub controller_request_timeout_ms: u64,
    /// How long a starting node waits to register with an active controller
    /// (i.e. for a quorum to form) before it gives up with an error.
    pub controller_startup_timeout_ms: u64,
    /// Metadata log entries between two controller snapshots.
    pub metadata_snapshot_interval_entries: u64,
    /// Producer ids per block the controller hands to a broker.
    pub producer_id_block_size: i32,
    /// `replica.lag.time.max.ms`: a follower that has not caught up with the
    /// leader's log end for this long leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `replica.fetch.wait.max.ms`: how long a leader holds a follower's
    /// fetch when it has nothing new for it.
    pub replica_fetch_wait_max_ms: u64,
    /// `replica.fetch.max.bytes`-like budget of one follower fetch over all
    /// its partitions (the first batch is always sent whole).
    pub replica_fetch_max_bytes: u32,
    /// `replica.high.watermark.checkpoint.interval.ms`: how often every
    /// partition whose high watermark moved writes it to its checkpoint, so
    /// a restarted replica serves from (nearly) where it was.
    pub replica_high_watermark_checkpoint_interval_ms: u64,

    // --- transactions ---
    /// `transaction.state.log.num.partitions`: partitions of
    /// `__transaction_state`, created on first use. Changing it after the
    /// topic exists moves transactional ids to other coordinators: don't.
    pub transaction_state_log_num_partitions: i32,
    /// `transaction.state.log.replication.factor`. Unset (the default):
    /// min(3, unfenced brokers) when the topic is created.
    pub transaction_state_log_replication_factor: Option<i16>,
    /// `transaction.max.timeout.ms`: the largest `transaction.timeout.ms` a
    /// producer may ask for (INVALID_TRANSACTION_TIMEOUT above it).
    pub transaction_max_timeout_ms: i32,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how
    /// often the coordinator aborts transactions older than their timeout.
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: u64,
    /// `transactional.id.expiration.ms`: an idle transactional id unused this
    /// long is forgotten.
    pub transactional_id_expiration_ms: i64,
    /// `transaction.partition.verification.enable` (KIP-890): a partition
    /// leader checks with the coordinator before a producer's first
    /// transactional write to the partition. Off, such a write is appended
    /// unchecked, so a late write can open a transaction the coordinator
    /// does not know (a hanging transaction); kept for parity with Kafka
    /// and for tests that need one.
    pub transaction_partition_verification_enable: bool,

    // --- observability ---
    /// Address of the HTTP server (`/metrics`, `/healthz`, `/readyz`).
    /// Port 0 picks a free port (logged at start).
    pub http_listen: SocketAddr,

    // --- consumer groups ---
    /// `offsets.topic.num.partitions`: partitions of `__consumer_offsets`,
    /// created on first use; the `N` of group placement. Changing it after
    /// the topic exists moves groups to other coordinators: don't.
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.replication.factor`. Unset (the default): min(3,
    /// unfenced brokers) when the topic is created.
    pub offsets_topic_replication_factor: Option<i16>,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of
    /// an empty group waits for more members (extended while they keep
    /// coming, up to the rebalance timeout).
    pub group_initial_rebalance_delay_ms: i32,
    /// `group.min.session.timeout.ms`: the smallest session timeout a
    /// member may ask for (INVALID_SESSION_TIMEOUT below it).
    pub group_min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`: the largest session timeout.
    pub group_max_session_timeout_ms: i32,
    /// `offsets.retention.minutes`: how long a group's committed offsets
    /// outlive its last member (for a Stable group: offsets of topics it no
    /// longer subscribes to, counted from their commit).
    pub offsets_retention_minutes: i64,
    /// `offsets.retention.check.interval.ms`: how often expired offsets are
    /// looked for.
    pub offsets_retention_check_interval_ms: i64,

    /// The keys given explicitly — in the config file, by a flag, by
    /// `--set`, or by `samsa dev`'s presets — as dotted field names
    /// (`num_partitions`, `log.segment_bytes`). Not a setting itself: the
    /// process that builds the configuration fills it in, and DescribeConfigs
    /// reports these keys as STATIC_BROKER_CONFIG and all others as
    /// DEFAULT_CONFIG, as Kafka does for keys in or missing from
    /// `server.properties`.
    #[serde(skip)]
    pub explicit_keys: BTreeSet<String>,
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
            default_replication_factor: None,
            max_request_bytes: 100 * 1024 * 1024,
            retention_check_interval_ms: 300_000,
            log: LogConfig::default(),
            controller_quorum_voters: None,
            controller_listen: SocketAddr::from(([0, 0, 0, 0], 9093)),
            cluster_id: None,
            broker_heartbeat_interval_ms: 2_000,
            broker_session_timeout_ms: 9_000,
            controller_quorum_election_timeout_ms: 1_000,
            controller_quorum_heartbeat_interval_ms: 150,
            controller_request_timeout_ms: 30_000,
            controller_startup_timeout_ms: 300_000,
            metadata_snapshot_interval_entries: 5_000,
            producer_id_block_size: 1_000,
            replica_lag_time_max_ms: 30_000,
            replica_fetch_wait_max_ms: 500,
            replica_fetch_max_bytes: 1024 * 1024,
            replica_high_watermark_checkpoint_interval_ms: 5_000,
            transaction_state_log_num_partitions: 50,
            transaction_state_log_replication_factor: None,
            transaction_max_timeout_ms: 900_000,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            transaction_partition_verification_enable: true,
            http_listen: SocketAddr::from(([0, 0, 0, 0], 9644)),
            offsets_topic_num_partitions: 50,
            offsets_topic_replication_factor: None,
            group_initial_rebalance_delay_ms: 3_000,
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            offsets_retention_minutes: 7 * 24 * 60,
            offsets_retention_check_interval_ms: 600_000,
            explicit_keys: BTreeSet::new(),
        }
    }
}

impl BrokerConfig {
    /// Whether `key` (a dotted field name) was given explicitly: the key
    /// itself, or a key below it (`log.flush` when
    /// `log.flush.interval.interval_ms` was set).
    pub fn is_explicit(&self, key: &str) -> bool {
        self.explicit_keys.iter().any(|k| {
            k == key
                || k.strip_prefix(key)
                    .is_some_and(|rest| rest.starts_with('.'))
        })
    }

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
