//! Broker configuration: every setting a `samsa server` accepts, with Kafka's
//! defaults unless a comment says otherwise. `docs/OPERATIONS.md` documents each
//! key; the TOML file and `--set key=value` flags use these field names.

use std::collections::{BTreeMap, BTreeSet};
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
    /// Further Kafka listeners, by name, beside the main one (`listen`,
    /// named after its `security_protocol`, [`MAIN_LISTENER`] by default):
    /// `[listeners.host]` with its own `listen`
    /// and `advertised_listener`, e.g. one for clients on a container's
    /// host while the main one serves the container network. A client is
    /// told the addresses of the listener its connection came in on
    /// (Kafka's `listeners` / `advertised.listeners`); all are plaintext.
    pub listeners: BTreeMap<String, ListenerConfig>,
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
    /// `log.cleaner.enable`: whether compacted topics are compacted.
    pub log_cleaner_enable: bool,
    /// `log.cleaner.dedupe.buffer.size`: memory of the cleaner's offset map
    /// (24 bytes a key): how many distinct keys one pass can compact.
    pub log_cleaner_dedupe_buffer_size: u64,
    /// `log.cleaner.io.max.bytes.per.second`: the cleaner's read and write
    /// rate; unset, unthrottled.
    pub log_cleaner_io_max_bytes_per_second: Option<u64>,
    /// `leader.replication.throttled.rate`: bytes/s a leader sends to the
    /// replicas a reassignment is adding; unset, unthrottled
    /// (`replication::throttle`).
    #[serde(default)]
    pub leader_replication_throttled_rate: Option<u64>,
    /// `follower.replication.throttled.rate`: bytes/s a broker fetches for
    /// the partitions a reassignment is adding it to; unset, unthrottled.
    #[serde(default)]
    pub follower_replication_throttled_rate: Option<u64>,
    /// `log.cleaner.backoff.ms`: how long the cleaner sleeps when no log
    /// needs cleaning.
    pub log_cleaner_backoff_ms: u64,
    /// How many log files of inactive segments (all but each partition's
    /// last) stay open for reads, least recently used closed first
    /// (`samsa_storage::open_files`); unset, a quarter of the open-file
    /// limit, between 64 and 8192. No Kafka equivalent: Kafka keeps every
    /// segment's files open.
    #[serde(default)]
    pub log_inactive_segment_files_max: Option<usize>,
    /// `num.recovery.threads.per.data.dir` (Kafka's default is 1): how many
    /// partitions an apply opens at once, recovering them at start-up or
    /// creating them for CreateTopics, and how many a clean stop closes at
    /// once. Both are mostly waiting on fsyncs and reads, which a disk
    /// serves several at a time.
    pub log_open_threads: usize,
    /// `min.insync.replicas`: the default of topics that do not set their
    /// own. Unset (the default): 2 for topics of three or more replicas,
    /// else 1 (Kafka's default is 1).
    pub min_insync_replicas: Option<u32>,

    // --- security (docs/SECURITY.md) ---
    /// The main listener's security protocol (Kafka's
    /// `listener.security.protocol.map`); the listener is named after it.
    pub security_protocol: SecurityProtocol,
    /// `ssl.keystore.location` (PEM): the certificate chain TLS listeners
    /// present, leaf first. Reloaded when the file changes.
    pub ssl_cert_file: Option<PathBuf>,
    /// `ssl.keystore` key (PEM, PKCS#8, PKCS#1 or SEC1).
    pub ssl_key_file: Option<PathBuf>,
    /// `ssl.truststore.location` (PEM): the CAs client certificates must
    /// chain to.
    pub ssl_ca_file: Option<PathBuf>,
    /// `ssl.client.auth`: whether TLS listeners ask for a client
    /// certificate (`none`, `requested`, `required`).
    pub ssl_client_auth: SslClientAuth,
    /// `sasl.enabled.mechanisms` of the SASL listeners.
    pub sasl_enabled_mechanisms: Vec<String>,
    /// `connections.max.reauth.ms` (KIP-368): a SASL session lasts at most
    /// this long, then the client must authenticate again on the same
    /// connection or be disconnected; 0, sessions never expire.
    pub connections_max_reauth_ms: u64,
    /// How long a connection to a TLS or SASL listener may take to finish
    /// its TLS handshake, and then to authenticate, before it is closed.
    pub authentication_timeout_ms: u64,
    /// `authorizer.class.name` set: requests are authorized by ACLs (Kafka's
    /// StandardAuthorizer). Off (the default), everyone may do everything.
    pub authorizer_enable: bool,
    /// `super.users`: principals (`User:admin`) allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`: with the authorizer on, a resource
    /// no ACL names is open to everyone (else to super users only).
    pub allow_everyone_if_no_acl_found: bool,
    /// Users to ensure exist (`security::declared`): a directory with one
    /// file per user, the file's name the user, its content the password
    /// (the shape of a Kubernetes Secret mounted as a volume). Both SCRAM
    /// mechanisms are written; users are never deleted from here.
    pub scram_users_dir: Option<PathBuf>,
    /// ACL bindings to ensure exist (`[[acls]]`, `security::declared`);
    /// needs `authorizer_enable`. Never deleted from here.
    pub acls: Vec<DeclaredAcl>,

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
    /// `process.roles`: `"broker,controller"` (combined: this node is one of
    /// the voters) or `"broker"` (a broker only: its `node_id` is not a voter,
    /// it reaches the quorum as a client and joins a running cluster by
    /// registering; `controller_listen` then serves only replication and
    /// transaction markers), or `"from-voters"`: whichever of the two the
    /// voter list makes `node_id` (pods of one StatefulSet share a
    /// configuration).
    pub process_roles: String,
    /// The `host:port` other nodes reach this node's gRPC server
    /// (`controller_listen`) at, registered with the broker. Unset: the
    /// node's voter address, or for a broker-only node `controller_listen`
    /// (which must then not be a wildcard address).
    pub inter_node_advertised_address: Option<String>,
    /// Mutual TLS on the gRPC port (`controller_listen`) and to every peer:
    /// this node's certificate chain (PEM, leaf first), valid for the host
    /// names or addresses of the voter list. All three `inter_node_tls_*`
    /// files or none (plaintext). See docs/SECURITY.md.
    pub inter_node_tls_cert_file: Option<PathBuf>,
    /// The private key of `inter_node_tls_cert_file` (PEM).
    pub inter_node_tls_key_file: Option<PathBuf>,
    /// The cluster's CA (PEM): peers must present a certificate of it.
    pub inter_node_tls_ca_file: Option<PathBuf>,
    /// Expected cluster id. Unset: take the one fixed at first formation (a
    /// node whose data belongs to another cluster still refuses to start).
    pub cluster_id: Option<String>,
    /// `broker.heartbeat.interval.ms`: how often the broker heartbeats the
    /// active controller.
    pub broker_heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms`: a broker without heartbeat this long is
    /// fenced by the controller and its leaderships move.
    pub broker_session_timeout_ms: u64,
    /// `auto.leader.rebalance.enable`: the active controller moves
    /// leadership back to preferred replicas when a broker's share of
    /// preferred partitions it does not lead passes
    /// `leader_imbalance_per_broker_percentage`, checked every
    /// `leader_imbalance_check_interval_seconds`.
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`.
    pub leader_imbalance_check_interval_seconds: u64,
    /// `leader.imbalance.per.broker.percentage`.
    pub leader_imbalance_per_broker_percentage: u32,
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
    /// `max.incremental.fetch.session.cache.slots`: how many Kafka fetch
    /// sessions (KIP-227) the broker keeps for its clients; 0 turns them off.
    pub max_incremental_fetch_session_cache_slots: usize,

    // --- transactions ---
    /// `transaction.state.log.num.partitions`: partitions of
    /// `__transaction_state`, created on first use. Changing it after the
    /// topic exists moves transactional ids to other coordinators: don't.
    pub transaction_state_log_num_partitions: i32,
    /// `transaction.state.log.replication.factor`. Unset (the default):
    /// min(3, unfenced brokers) when the topic is created.
    pub transaction_state_log_replication_factor: Option<i16>,
    /// `transaction.state.log.segment.bytes`: the segment size
    /// `__transaction_state` is created with.
    pub transaction_state_log_segment_bytes: u64,
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
    /// `text` (default) or `json`: one JSON object per log line, with the
    /// fields of the event and of its enclosing spans.
    pub log_format: LogFormat,
    /// OpenTelemetry traces: the OTLP/gRPC endpoint spans are exported to
    /// (`http://collector:4317`). Unset (the default): no spans are built.
    pub otlp_endpoint: Option<String>,
    /// Share of traces kept, from 0.0 to 1.0: a trace a client request
    /// starts is kept with this probability; a span whose parent came from
    /// another node follows that node's decision.
    pub trace_sample_ratio: f64,

    // --- consumer groups ---
    /// `offsets.topic.num.partitions`: partitions of `__consumer_offsets`,
    /// created on first use; the `N` of group placement. Changing it after
    /// the topic exists moves groups to other coordinators: don't.
    pub offsets_topic_num_partitions: i32,
    /// `offsets.topic.replication.factor`. Unset (the default): min(3,
    /// unfenced brokers) when the topic is created.
    pub offsets_topic_replication_factor: Option<i16>,
    /// `offsets.topic.segment.bytes`: the segment size `__consumer_offsets`
    /// is created with (compaction never takes the active segment).
    pub offsets_topic_segment_bytes: u64,
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
            listeners: BTreeMap::new(),
            data_dir: PathBuf::from("./samsa-data"),
            num_partitions: 1,
            auto_create_topics_enable: true,
            default_replication_factor: None,
            max_request_bytes: 100 * 1024 * 1024,
            retention_check_interval_ms: 300_000,
            log: LogConfig::default(),
            log_cleaner_enable: true,
            log_cleaner_dedupe_buffer_size: 128 * 1024 * 1024,
            log_cleaner_io_max_bytes_per_second: None,
            leader_replication_throttled_rate: None,
            follower_replication_throttled_rate: None,
            log_cleaner_backoff_ms: 15_000,
            log_inactive_segment_files_max: None,
            log_open_threads: 8,
            min_insync_replicas: None,
            security_protocol: SecurityProtocol::Plaintext,
            ssl_cert_file: None,
            ssl_key_file: None,
            ssl_ca_file: None,
            ssl_client_auth: SslClientAuth::None,
            sasl_enabled_mechanisms: vec![
                "SCRAM-SHA-512".to_owned(),
                "SCRAM-SHA-256".to_owned(),
                "PLAIN".to_owned(),
            ],
            connections_max_reauth_ms: 0,
            authentication_timeout_ms: 10_000,
            authorizer_enable: false,
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: false,
            scram_users_dir: None,
            acls: Vec::new(),
            controller_quorum_voters: None,
            controller_listen: SocketAddr::from(([0, 0, 0, 0], 9093)),
            process_roles: "broker,controller".into(),
            inter_node_advertised_address: None,
            inter_node_tls_cert_file: None,
            inter_node_tls_key_file: None,
            inter_node_tls_ca_file: None,
            cluster_id: None,
            broker_heartbeat_interval_ms: 2_000,
            broker_session_timeout_ms: 9_000,
            auto_leader_rebalance_enable: true,
            leader_imbalance_check_interval_seconds: 300,
            leader_imbalance_per_broker_percentage: 10,
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
            max_incremental_fetch_session_cache_slots: 1_000,
            transaction_state_log_num_partitions: 50,
            transaction_state_log_replication_factor: None,
            transaction_state_log_segment_bytes: 100 * 1024 * 1024,
            transaction_max_timeout_ms: 900_000,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            transaction_partition_verification_enable: true,
            http_listen: SocketAddr::from(([0, 0, 0, 0], 9644)),
            log_format: LogFormat::Text,
            otlp_endpoint: None,
            trace_sample_ratio: 1.0,
            offsets_topic_num_partitions: 50,
            offsets_topic_replication_factor: None,
            offsets_topic_segment_bytes: 100 * 1024 * 1024,
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

    /// The segment size a coordinator's state topic is created with.
    pub fn state_topic_segment_bytes(&self, topic: &str) -> u64 {
        if topic == crate::coordinator::placement::TRANSACTION_STATE_TOPIC {
            self.transaction_state_log_segment_bytes
        } else {
            self.offsets_topic_segment_bytes
        }
    }

    /// The `(host, port)` clients of the main listener are told to connect to.
    pub fn advertised_host_port(&self) -> (String, i32) {
        advertised_or_bound(self.advertised_listener.as_deref(), self.listen)
    }

    /// `super_users` parsed; an entry that is not `Type:name` is a
    /// configuration error (Kafka would never match it).
    pub fn super_user_principals(
        &self,
    ) -> Result<Vec<crate::security::Principal>, crate::BrokerError> {
        self.super_users
            .iter()
            .map(|text| {
                crate::security::Principal::parse(text.trim()).ok_or_else(|| {
                    crate::BrokerError::Config(format!(
                        "super_users entry `{text}` is not a principal (`User:name`)"
                    ))
                })
            })
            .collect()
    }

    /// The main listener (`listen`, `advertised_listener`).
    pub fn main_listener(&self) -> KafkaListener {
        let (advertised_host, advertised_port) = self.advertised_host_port();
        KafkaListener {
            name: self.security_protocol.name().to_string(),
            listen: self.listen,
            advertised_host,
            advertised_port,
            security_protocol: self.security_protocol,
        }
    }

    /// Every Kafka listener this broker serves, the main one first, with
    /// the address it advertises; an error names the listener whose
    /// settings cannot work.
    pub fn kafka_listeners(&self) -> Result<Vec<KafkaListener>, String> {
        let mut out = vec![self.main_listener()];
        for (key, listener) in &self.listeners {
            let name = key.to_ascii_uppercase();
            let listen = listener
                .listen
                .ok_or_else(|| format!("listeners.{key}.listen is not set"))?;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!(
                    "listeners.{key}: a listener name is letters, digits, '_' and '-'"
                ));
            }
            // The gRPC address every node registers beside its Kafka
            // listeners takes this name.
            if name == crate::cluster::peers::INTER_NODE_LISTENER {
                return Err(format!(
                    "listeners.{key}: the name {name} is reserved for the address of the \
                     node's gRPC server (inter_node_advertised_address)"
                ));
            }
            if let Some(other) = out.iter().find(|l| l.name == name) {
                return Err(format!(
                    "listeners.{key}: the name {} is taken (the main listener, listen, is named after its security_protocol, {}; names ignore case)",
                    other.name,
                    self.security_protocol.name()
                ));
            }
            if let Some(other) = out
                .iter()
                .find(|l| l.listen.port() == listen.port() && listen.port() != 0)
            {
                return Err(format!(
                    "listeners.{key}.listen {listen} has the port of listener {} ({})",
                    other.name, other.listen
                ));
            }
            let advertised = match &listener.advertised_listener {
                None => None,
                Some(AdvertisedAddress::One(address)) => Some(address.as_str()),
                Some(AdvertisedAddress::PerNode(addresses)) => {
                    let index = usize::try_from(self.node_id - 1).ok();
                    let address = index.and_then(|i| addresses.get(i)).ok_or_else(|| {
                        format!(
                            "listeners.{key}.advertised_listener lists {} addresses, one per node id from 1, and has none for node {}",
                            addresses.len(),
                            self.node_id
                        )
                    })?;
                    Some(address.as_str())
                }
            };
            if let Some(address) = advertised {
                if parse_host_port(address).is_none() {
                    return Err(format!(
                        "listeners.{key}.advertised_listener {address:?} is not host:port"
                    ));
                }
            }
            let (advertised_host, advertised_port) = advertised_or_bound(advertised, listen);
            out.push(KafkaListener {
                name,
                listen,
                advertised_host,
                advertised_port,
                security_protocol: listener.security_protocol,
            });
        }
        Ok(out)
    }
}

/// The name of the main Kafka listener (`listen`, `advertised_listener`)
/// with the default `security_protocol`, as brokers register it and
/// DescribeConfigs reports it.
pub const MAIN_LISTENER: &str = "PLAINTEXT";

/// One ACL binding of `[[acls]]`, named as `samsa acl add` and
/// `kafka-acls.sh` name its parts (names are case-insensitive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeclaredAcl {
    /// `User:alice`, or `User:*` for everyone.
    pub principal: String,
    /// `TOPIC`, `GROUP`, `CLUSTER` or `TRANSACTIONAL_ID`.
    pub resource_type: String,
    /// The resource's name or prefix; a CLUSTER ACL may leave it out.
    pub resource_name: Option<String>,
    /// `LITERAL` (default) or `PREFIXED`.
    pub pattern_type: String,
    /// `READ`, `WRITE`, `CREATE`, `DELETE`, `ALTER`, `DESCRIBE`, `ALL`, …
    pub operation: String,
    /// `ALLOW` (default) or `DENY`.
    pub permission: String,
    /// The client address it applies to; `*` (default) for any.
    pub host: String,
}

impl Default for DeclaredAcl {
    fn default() -> Self {
        DeclaredAcl {
            principal: String::new(),
            resource_type: String::new(),
            resource_name: None,
            pattern_type: "LITERAL".into(),
            operation: String::new(),
            permission: "ALLOW".into(),
            host: "*".into(),
        }
    }
}

/// One further Kafka listener (`[listeners.<name>]`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Address it binds to. Required; optional here only so that its keys
    /// can be set one at a time (`SAMSA_LISTENERS__HOST__…` variables apply
    /// in name order, `advertised_listener` before `listen`).
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// What clients connected to it are told; unset, `listen` (an
    /// unspecified address read as 127.0.0.1).
    #[serde(default)]
    pub advertised_listener: Option<AdvertisedAddress>,
    /// Its security protocol (Kafka's `listener.security.protocol.map`
    /// entry).
    #[serde(default)]
    pub security_protocol: SecurityProtocol,
}

/// Kafka's security protocols of a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SecurityProtocol {
    #[default]
    #[serde(rename = "PLAINTEXT")]
    Plaintext,
    #[serde(rename = "SSL")]
    Ssl,
    #[serde(rename = "SASL_PLAINTEXT")]
    SaslPlaintext,
    #[serde(rename = "SASL_SSL")]
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people: time, level, spans, message and fields on one line.
    #[default]
    Text,
    /// For log pipelines: one JSON object per line.
    Json,
}

/// Kafka's `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SslClientAuth {
    #[default]
    None,
    Requested,
    Required,
}

impl SslClientAuth {
    /// Kafka's value of `ssl.client.auth`.
    pub fn name(self) -> &'static str {
        match self {
            SslClientAuth::None => "none",
            SslClientAuth::Requested => "requested",
            SslClientAuth::Required => "required",
        }
    }
}

/// A listener's advertised address: one `host:port`, or one per node, the
/// node with id `n` taking element `n - 1`, so that every node of a
/// StatefulSet can share one configuration and still advertise its own
/// external address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AdvertisedAddress {
    One(String),
    PerNode(Vec<String>),
}

/// A Kafka listener as the broker runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaListener {
    /// Upper case, as Kafka normalises listener names.
    pub name: String,
    pub listen: SocketAddr,
    pub advertised_host: String,
    pub advertised_port: i32,
    pub security_protocol: SecurityProtocol,
}

fn parse_host_port(address: &str) -> Option<(String, i32)> {
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse::<i32>().ok()?;
    Some((host.trim_matches(['[', ']']).to_string(), port))
}

/// `advertised` as `(host, port)` if it is one; else the bound address,
/// an unspecified one read as 127.0.0.1.
fn advertised_or_bound(advertised: Option<&str>, listen: SocketAddr) -> (String, i32) {
    if let Some(pair) = advertised.and_then(parse_host_port) {
        return pair;
    }
    let host = if listen.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        listen.ip().to_string()
    };
    (host, i32::from(listen.port()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn with_listener(node_id: i32, listener: ListenerConfig) -> BrokerConfig {
        BrokerConfig {
            node_id,
            advertised_listener: Some("samsa-0:9092".into()),
            listeners: BTreeMap::from([("host".to_string(), listener)]),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn main_listener_first_then_named_ones_upper_case() {
        let config = with_listener(
            1,
            ListenerConfig {
                listen: Some("0.0.0.0:19092".parse().unwrap()),
                advertised_listener: Some(AdvertisedAddress::One("127.0.0.1:9192".into())),
                ..Default::default()
            },
        );
        let listeners = config.kafka_listeners().unwrap();
        let summary: Vec<_> = listeners
            .iter()
            .map(|l| {
                (
                    l.name.as_str(),
                    l.advertised_host.as_str(),
                    l.advertised_port,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [("PLAINTEXT", "samsa-0", 9092), ("HOST", "127.0.0.1", 9192)]
        );
    }

    #[test]
    fn per_node_addresses_are_picked_by_node_id() {
        let listener = ListenerConfig {
            listen: Some("0.0.0.0:9094".parse().unwrap()),
            advertised_listener: Some(AdvertisedAddress::PerNode(vec![
                "203.0.113.5:31090".into(),
                "203.0.113.5:31091".into(),
            ])),
            ..Default::default()
        };
        let second = with_listener(2, listener.clone())
            .kafka_listeners()
            .unwrap();
        assert_eq!(second[1].advertised_port, 31091);
        let err = with_listener(3, listener).kafka_listeners().unwrap_err();
        assert!(err.contains("none for node 3"), "{err}");
    }

    #[test]
    fn unset_advertised_address_is_the_bound_one() {
        let config = with_listener(
            1,
            ListenerConfig {
                listen: Some("0.0.0.0:19092".parse().unwrap()),
                advertised_listener: None,
                ..Default::default()
            },
        );
        let listeners = config.kafka_listeners().unwrap();
        assert_eq!(
            (
                listeners[1].advertised_host.as_str(),
                listeners[1].advertised_port
            ),
            ("127.0.0.1", 19092)
        );
    }

    #[test]
    fn clashing_names_ports_and_bad_addresses_are_refused() {
        let listen = Some("0.0.0.0:19092".parse().unwrap());
        let mut config = with_listener(
            1,
            ListenerConfig {
                listen,
                advertised_listener: None,
                ..Default::default()
            },
        );
        config.listeners = BTreeMap::from([(
            "plaintext".to_string(),
            ListenerConfig {
                listen,
                advertised_listener: None,
                ..Default::default()
            },
        )]);
        assert!(config.kafka_listeners().unwrap_err().contains("is taken"));
        config.listeners = BTreeMap::from([(
            "host".to_string(),
            ListenerConfig {
                listen: Some("0.0.0.0:9092".parse().unwrap()),
                advertised_listener: None,
                ..Default::default()
            },
        )]);
        assert!(config
            .kafka_listeners()
            .unwrap_err()
            .contains("has the port of"));
        config.listeners = BTreeMap::from([(
            "host".to_string(),
            ListenerConfig {
                listen,
                advertised_listener: Some(AdvertisedAddress::One("no-port".into())),
                ..Default::default()
            },
        )]);
        assert!(config
            .kafka_listeners()
            .unwrap_err()
            .contains("is not host:port"));
        config.listeners = BTreeMap::from([(
            "a b".to_string(),
            ListenerConfig {
                listen,
                advertised_listener: None,
                ..Default::default()
            },
        )]);
        assert!(config
            .kafka_listeners()
            .unwrap_err()
            .contains("listener name"));
        config.listeners = BTreeMap::from([(
            "host".to_string(),
            ListenerConfig {
                listen: None,
                advertised_listener: None,
                ..Default::default()
            },
        )]);
        assert!(config
            .kafka_listeners()
            .unwrap_err()
            .contains("listen is not set"));
    }
}
