//! `ControllerNode`: one controller process — sled storage, openraft, the
//! gRPC server (Raft + broker-facing service on one port) and the active
//! controller's periodic duties.
//!
//! Start-up, in order:
//!
//! 1. parse the static voter set (`"1@host:port,2@host:port,3@host:port"`);
//!    this node must be in it;
//! 2. open the store in `<data_dir>/raft`; refuse to start if it belongs to
//!    another node id, or to another cluster than `cluster_id` (when both are
//!    known) — with an error that names both;
//! 3. start openraft and the gRPC server;
//! 4. a store that has never taken part in the quorum (no vote, no log, not
//!    marked joined) is new — or was lost: a wiped volume. A voter that
//!    acknowledged entries, lost them and votes again can make the quorum
//!    forget committed metadata (an election won by a voter that lacks
//!    them), so such a node refuses every Raft RPC until it has asked the
//!    other voters ([`decide_participation`]): if one of them has this
//!    node's broker registration, its store was lost and it stops with an
//!    error that says so; once voters that make a majority with it have
//!    answered without it, the quorum is new to it, it marks its store
//!    joined and takes part;
//! 5. if this node has the lowest id and its store has neither vote nor log,
//!    initialize the cluster with all voters once it takes part (every other
//!    node waits to be contacted);
//! 6. every `tick_interval`, if leader: record the cluster id if the metadata
//!    has none yet (the configured one, or a new UUID: the id is fixed at
//!    first formation), then run [`crate::logic::ControllerLogic::tick`]
//!    (fence brokers whose session expired, elect leaders for leaderless
//!    partitions).
//!
//! Every task the node spawns runs in a `controller` span carrying `node_id`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Raft, SnapshotPolicy};
use samsa_proto::controller::controller_service_server::ControllerServiceServer;
use samsa_proto::raft::raft_service_server::RaftServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tracing::Instrument;

use crate::image::MetadataImage;
use crate::logic::{ControllerLogic, LogicConfig};
use crate::network::{GrpcNetworkFactory, RaftRpcServer, MAX_MESSAGE_BYTES};
use crate::quorum::ReplicationClock;
use crate::service::{ControllerCore, ControllerGrpc};
use crate::store::{keys, open_sled, RaftStore, StateMachineStore, StoreError};
use crate::{NodeId, TypeConfig};

/// A controller's view of the Raft quorum at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftFigures {
    /// This node leads the quorum: it is the active controller.
    pub leading: bool,
    pub leader: Option<NodeId>,
    pub term: u64,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to the metadata image.
    pub last_applied: Option<u64>,
    /// Index the last snapshot covers.
    pub snapshot_index: Option<u64>,
    /// When the last snapshot was written (ms since the epoch), if known.
    pub snapshot_written_at_ms: Option<i64>,
}

/// Follows a controller's [`RaftFigures`].
#[derive(Clone)]
pub struct RaftFiguresWatch {
    metrics: watch::Receiver<openraft::RaftMetrics<NodeId, BasicNode>>,
    state_machine: StateMachineStore,
}

impl std::fmt::Debug for RaftFiguresWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftFiguresWatch").finish_non_exhaustive()
    }
}

impl RaftFiguresWatch {
    pub fn now(&self) -> RaftFigures {
        let m = self.metrics.borrow();
        RaftFigures {
            leading: m.state == openraft::ServerState::Leader && m.current_leader == Some(m.id),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            snapshot_written_at_ms: self.state_machine.snapshot_written_at_ms(),
        }
    }

    /// Waits for the figures to change; `Err` once the controller stopped.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.metrics.changed().await
    }
}

/// Raft timing and snapshot knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftTimings {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_after_entries: u64,
}

impl Default for RaftTimings {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 150,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 2_000,
            snapshot_after_entries: 5_000,
        }
    }
}

/// Configuration of one controller node.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    pub node_id: NodeId,
    /// Static voter set: node id → gRPC address (`host:port`).
    pub voters: Vec<(NodeId, String)>,
    /// Address to bind; `None` binds this node's own voter address.
    pub listen_addr: Option<SocketAddr>,
    /// The store lives in `<data_dir>/raft`.
    pub data_dir: PathBuf,
    /// Expected cluster id. `None`: accept whatever the data says, and let
    /// the first leader generate one at first formation.
    pub cluster_id: Option<String>,
    pub logic: LogicConfig,
    pub raft: RaftTimings,
    /// How often the leader runs its periodic duties.
    pub tick_interval: Duration,
    /// Upper bound on one write (leadership check + commit).
    pub write_timeout: Duration,
    /// Mutual TLS on the gRPC port and to every peer (`crate::tls`);
    /// `None`: plaintext.
    pub inter_node_tls: Option<crate::tls::InterNodeTls>,
}

impl ControllerConfig {
    /// A configuration with defaults for everything but identity, voters and data dir.
    pub fn new(
        node_id: NodeId,
        voters: Vec<(NodeId, String)>,
        data_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            node_id,
            voters,
            listen_addr: None,
            data_dir: data_dir.into(),
            cluster_id: None,
            logic: LogicConfig::default(),
            raft: RaftTimings::default(),
            tick_interval: Duration::from_millis(500),
            write_timeout: Duration::from_secs(10),
            inter_node_tls: None,
        }
    }
}

/// Why a controller node could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid voter list {input:?}: {reason}")]
    InvalidVoters { input: String, reason: String },
    #[error("node {0} is not in the voter set")]
    NotAVoter(NodeId),
    #[error(
        "data directory {dir} belongs to controller node {stored}, not {configured}; \
         use that node's id or an empty directory"
    )]
    NodeIdMismatch {
        dir: PathBuf,
        stored: String,
        configured: NodeId,
    },
    #[error(
        "data directory {dir} belongs to cluster {stored}, but this node is configured for cluster \
         {configured}; refusing to start on another cluster's data"
    )]
    ClusterIdMismatch {
        dir: PathBuf,
        stored: String,
        configured: String,
    },
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("raft: {0}")]
    Raft(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Parses `"1@host:port,2@host:port,3@host:port"`.
pub fn parse_voters(input: &str) -> Result<Vec<(NodeId, String)>, NodeError> {
    let invalid = |reason: String| NodeError::InvalidVoters {
        input: input.to_owned(),
        reason,
    };
    let mut voters: BTreeMap<NodeId, String> = BTreeMap::new();
    for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('@')
            .ok_or_else(|| invalid(format!("{part:?} is not id@host:port")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| invalid(format!("{id:?} is not a node id")))?;
        let addr = addr.trim();
        if addr
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            return Err(invalid(format!("{addr:?} is not host:port")));
        }
        if voters.insert(id, addr.to_owned()).is_some() {
            return Err(invalid(format!("node id {id} appears twice")));
        }
    }
    if voters.is_empty() {
        return Err(invalid("no voters".into()));
    }
    Ok(voters.into_iter().collect())
}

/// A running controller node.
pub struct ControllerNode {
    core: Arc<ControllerCore>,
    local_addr: Option<SocketAddr>,
    voters: Vec<(NodeId, String)>,
    store: Arc<dyn RaftStore>,
    stop_tx: watch::Sender<bool>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
    ticker: JoinHandle<()>,
    /// Asks the other voters whether an empty store is new (module docs, 4).
    deciding: Option<JoinHandle<()>>,
    participating: watch::Receiver<bool>,
    refusal: watch::Receiver<Option<String>>,
}

impl ControllerNode {
    /// Binds the configured address (or this node's voter address) and starts.
    pub async fn start(config: ControllerConfig) -> Result<Self, NodeError> {
        let addr = match config.listen_addr {
            Some(addr) => addr.to_string(),
            None => config
                .voters
                .iter()
                .find(|(id, _)| *id == config.node_id)
                .map(|(_, addr)| addr.clone())
                .ok_or(NodeError::NotAVoter(config.node_id))?,
        };
        let listener = TcpListener::bind(&addr)
            .await
            .map_err(|source| NodeError::Bind { addr, source })?;
        Self::start_with_listener(config, listener).await
    }

    /// Starts on an already bound listener (tests bind port 0 first).
    pub async fn start_with_listener(
        config: ControllerConfig,
        listener: TcpListener,
    ) -> Result<Self, NodeError> {
        let node_id = config.node_id;
        let span = tracing::info_span!("controller", node_id);
        let (node, _) = Self::start_inner(config, Some(listener))
            .instrument(span)
            .await?;
        Ok(node)
    }

    /// Starts without a gRPC server of its own and returns the controller's
    /// services (Raft + `ControllerService`) as tonic [`Routes`], for a
    /// process that serves one gRPC port for several roles (combined mode):
    /// add them with `Server::builder().add_routes(routes)` next to the
    /// broker's services and serve on this node's voter address. Metadata
    /// streams end on [`ControllerNode::shutdown`]; the caller stops its server.
    pub async fn start_embedded(config: ControllerConfig) -> Result<(Self, Routes), NodeError> {
        let node_id = config.node_id;
        let span = tracing::info_span!("controller", node_id);
        let (node, routes) = Self::start_inner(config, None).instrument(span).await?;
        let routes = routes.ok_or_else(|| NodeError::Raft("no routes built".into()))?;
        Ok((node, routes))
    }

    async fn start_inner(
        config: ControllerConfig,
        listener: Option<TcpListener>,
    ) -> Result<(Self, Option<Routes>), NodeError> {
        let node_id = config.node_id;
        if !config.voters.iter().any(|(id, _)| *id == node_id) {
            return Err(NodeError::NotAVoter(node_id));
        }
        let dir = config.data_dir.join("raft");
        std::fs::create_dir_all(&dir)?;
        let (store, mut log, sm) = open_sled(&dir)?;
        check_identity(&*store, &dir, node_id, config.cluster_id.as_deref())?;

        let fresh = log
            .read_vote()
            .await
            .map_err(|e| NodeError::Raft(e.to_string()))?
            .is_none()
            && log
                .get_log_state()
                .await
                .map_err(|e| NodeError::Raft(e.to_string()))?
                .last_log_id
                .is_none();

        let raft_config = openraft::Config {
            cluster_name: "samsa-controller".into(),
            heartbeat_interval: config.raft.heartbeat_interval_ms,
            election_timeout_min: config.raft.election_timeout_min_ms,
            election_timeout_max: config.raft.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.raft.snapshot_after_entries),
            max_in_snapshot_log_to_keep: 1_000,
            // Chunks travel as JSON (a byte is up to 4 characters).
            snapshot_max_chunk_size: 1024 * 1024,
            install_snapshot_timeout: 5_000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::Raft(e.to_string()))?;

        let clock = Arc::new(ReplicationClock::default());
        let network = GrpcNetworkFactory::new(
            node_id,
            sm.watch_cluster_id(),
            Arc::clone(&clock),
            config.inter_node_tls.clone(),
        );
        let raft: Raft<TypeConfig> =
            Raft::new(node_id, Arc::new(raft_config), network, log, sm.clone())
                .await
                .map_err(|e| NodeError::Raft(e.to_string()))?;
        clock.attach(raft.metrics());

        let core = Arc::new(ControllerCore::new(
            node_id,
            raft.clone(),
            sm.clone(),
            ControllerLogic::new(config.logic.clone(), 0),
            config.write_timeout,
            clock,
        ));
        let (stop_tx, stop_rx) = watch::channel(false);

        let joined = !fresh || store.get_meta(keys::JOINED)?.is_some();
        let (participating_tx, participating_rx) = watch::channel(joined);
        let (refusal_tx, refusal_rx) = watch::channel(None);
        let raft_service = RaftServiceServer::new(RaftRpcServer::new(
            raft.clone(),
            sm.watch_cluster_id(),
            participating_rx.clone(),
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let controller_service = ControllerServiceServer::new(ControllerGrpc::new(
            Arc::clone(&core),
            config.voters.clone(),
            stop_rx.clone(),
        ))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let routes = Routes::new(raft_service).add_service(controller_service);
        let (local_addr, server, routes) = match listener {
            Some(listener) => {
                let local_addr = listener.local_addr()?;
                let mut server_stop = stop_rx.clone();
                let mut builder = tonic::transport::Server::builder();
                if let Some(tls) = &config.inter_node_tls {
                    builder = builder
                        .tls_config(tls.server_config())
                        .map_err(|e| NodeError::Raft(format!("inter-node TLS: {e}")))?;
                }
                let server = tokio::spawn(
                    builder
                        .add_routes(routes)
                        .serve_with_incoming_shutdown(
                            crate::network::peer_connections(listener),
                            async move {
                                let _ = server_stop.wait_for(|stopped| *stopped).await;
                            },
                        )
                        .in_current_span(),
                );
                tracing::info!(%local_addr, fresh, "controller listening");
                (Some(local_addr), Some(server), None)
            }
            None => {
                tracing::info!(fresh, "controller started (embedded: caller serves gRPC)");
                (None, None, Some(routes))
            }
        };

        let initializer = fresh && config.voters.iter().map(|(id, _)| *id).min() == Some(node_id);
        let start = Participation {
            node_id,
            voters: config.voters.clone(),
            inter_node_tls: config.inter_node_tls.clone(),
            data_dir: config.data_dir.clone(),
            store: Arc::clone(&store),
            raft: raft.clone(),
            initializer,
        };
        let deciding = if joined {
            start.take_part().await;
            None
        } else {
            tracing::info!(
                "empty controller store: asking the other voters whether the quorum is new \
                 before taking part"
            );
            Some(tokio::spawn(
                decide_participation(start, participating_tx, refusal_tx, stop_rx.clone())
                    .in_current_span(),
            ))
        };

        let stored_cluster_id = sm.watch_cluster_id().borrow().clone();
        let cluster_id = config
            .cluster_id
            .clone()
            .or(stored_cluster_id)
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let ticker = tokio::spawn(
            run_duties(Arc::clone(&core), cluster_id, config.tick_interval, stop_rx)
                .in_current_span(),
        );

        let node = Self {
            core,
            local_addr,
            voters: config.voters,
            store,
            stop_tx,
            server,
            ticker,
            deciding,
            participating: participating_rx,
            refusal: refusal_rx,
        };
        Ok((node, routes))
    }

    pub fn node_id(&self) -> NodeId {
        self.core.node_id()
    }

    /// True once this node takes part in the quorum (at once for a store
    /// that already did; module docs, 4). Its broker registers only then:
    /// its own registration is the evidence a lost store is judged by.
    pub fn participating(&self) -> watch::Receiver<bool> {
        self.participating.clone()
    }

    /// Set (once) when this node must not run: it started on an empty store
    /// that the quorum knows was not empty (module docs, 4); the text says
    /// why and what to do. The node takes no part in the quorum; its
    /// process should stop with this as its error.
    pub fn refusal(&self) -> watch::Receiver<Option<String>> {
        self.refusal.clone()
    }

    /// The address the node's own gRPC server listens on (`None` when embedded).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    pub fn voters(&self) -> &[(NodeId, String)] {
        &self.voters
    }

    /// The write path (for in-process callers, e.g. combined mode).
    pub fn core(&self) -> &Arc<ControllerCore> {
        &self.core
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        self.core.raft()
    }

    /// This node's view of the quorum, as `/metrics` reports it; follow
    /// it with [`RaftFiguresWatch::changed`].
    pub fn raft_figures(&self) -> RaftFiguresWatch {
        RaftFiguresWatch {
            metrics: self.core.raft().metrics(),
            state_machine: self.core.state_machine().clone(),
        }
    }

    /// This node's current metadata image (committed state only).
    pub fn image(&self) -> Arc<MetadataImage> {
        self.core.state_machine().image()
    }

    pub fn watch_image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.core.state_machine().watch_image()
    }

    pub fn cluster_id(&self) -> Option<String> {
        self.core
            .state_machine()
            .watch_cluster_id()
            .borrow()
            .clone()
    }

    pub fn current_leader(&self) -> Option<NodeId> {
        self.core.raft().metrics().borrow().current_leader
    }

    pub fn is_leader(&self) -> bool {
        self.current_leader() == Some(self.node_id())
    }

    /// Stops duties, Raft and the server, then flushes the store.
    pub async fn shutdown(self) -> Result<(), NodeError> {
        let node_id = self.node_id();
        async move {
            self.ticker.abort();
            if let Some(deciding) = &self.deciding {
                deciding.abort();
            }
            let _ = self.stop_tx.send(true);
            let raft_result = self.core.raft().shutdown().await;
            if let Some(server) = self.server {
                match tokio::time::timeout(Duration::from_secs(5), server).await {
                    Ok(Ok(Ok(()))) => {}
                    Ok(Ok(Err(e))) => tracing::warn!(error = %e, "grpc server ended with an error"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "grpc server task failed"),
                    Err(_) => tracing::warn!("grpc server did not stop within 5 s"),
                }
            }
            let store = Arc::clone(&self.store);
            tokio::task::spawn_blocking(move || store.flush())
                .await
                .map_err(|e| NodeError::Raft(e.to_string()))??;
            raft_result.map_err(|e| NodeError::Raft(e.to_string()))?;
            tracing::info!("controller stopped");
            Ok(())
        }
        .instrument(tracing::info_span!("controller", node_id))
        .await
    }
}

/// What taking part in the quorum needs, for a node that may have to wait
/// for it.
struct Participation {
    node_id: NodeId,
    voters: Vec<(NodeId, String)>,
    inter_node_tls: Option<crate::tls::InterNodeTls>,
    data_dir: PathBuf,
    store: Arc<dyn RaftStore>,
    raft: Raft<TypeConfig>,
    /// The lowest voter on an empty store: it initializes the quorum.
    initializer: bool,
}

impl Participation {
    async fn take_part(&self) {
        if !self.initializer {
            return;
        }
        let members: BTreeMap<NodeId, BasicNode> = self
            .voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect();
        match self.raft.initialize(members).await {
            Ok(()) => tracing::info!("initialized the controller quorum"),
            Err(e) => tracing::warn!(error = %e, "quorum initialization refused"),
        }
    }
}

/// How long one voter may take to answer [`decide_participation`]'s question.
const PARTICIPATION_PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the question is asked again while too few voters answer.
const PARTICIPATION_PROBE_INTERVAL: Duration = Duration::from_millis(300);

/// Step 4 of the module docs: asks every other voter (DescribeQuorum)
/// until one of them knows this node as a registered broker — then its
/// store was lost: refuse — or voters that make a majority with this one
/// have answered without it: mark the store joined and take part.
///
/// The registration is the evidence because a node registers its broker
/// seconds after its controller first joins; a store wiped in those first
/// seconds goes undetected (docs/DEPLOY.md says so).
async fn decide_participation(
    start: Participation,
    participating: watch::Sender<bool>,
    refusal: watch::Sender<Option<String>>,
    mut stop: watch::Receiver<bool>,
) {
    let me = start.node_id;
    let majority = start.voters.len() / 2 + 1;
    let peers: Vec<(NodeId, String)> = start
        .voters
        .iter()
        .filter(|(id, _)| *id != me)
        .cloned()
        .collect();
    let mut asked = 0u32;
    loop {
        let mut answered = 1; // this node
        for (peer, addr) in &peers {
            let client =
                crate::client::ControllerClient::new([addr.clone()], PARTICIPATION_PROBE_TIMEOUT)
                    .with_inter_node_tls(start.inter_node_tls.clone());
            let answer =
                tokio::time::timeout(PARTICIPATION_PROBE_TIMEOUT, client.describe_quorum()).await;
            let Ok(Ok(quorum)) = answer else { continue };
            if i32::try_from(me).is_ok_and(|id| quorum.registered_brokers.contains(&id)) {
                let message = format!(
                    "node {me} started on an empty controller store, but the quorum knows this \
                     node: voter {peer} has its broker registration (cluster {}), so the data \
                     directory {} was lost or replaced. A voter that lost its log and votes \
                     again can make the quorum forget committed metadata, so this node does \
                     not start. Restore its data directory (the volume) if you can; otherwise \
                     the cluster runs on the other voters, and replacing a lost voter needs a \
                     quorum membership change, which samsa does not support yet \
                     (docs/DEPLOY.md, \"A node that lost its volume\")",
                    if quorum.cluster_id.is_empty() {
                        "not known yet"
                    } else {
                        quorum.cluster_id.as_str()
                    },
                    start.data_dir.display()
                );
                tracing::error!("{message}");
                let _ = refusal.send(Some(message));
                return;
            }
            answered += 1;
        }
        if answered >= majority {
            if let Err(e) = start
                .store
                .put_meta(&[(keys::JOINED, b"1")])
                .and_then(|()| start.store.flush())
            {
                let message = format!("cannot mark the controller store joined: {e}");
                tracing::error!("{message}");
                let _ = refusal.send(Some(message));
                return;
            }
            tracing::info!(
                answered,
                "the quorum is new to this node: taking part in it"
            );
            let _ = participating.send(true);
            start.take_part().await;
            return;
        }
        asked += 1;
        if asked % 30 == 0 {
            tracing::info!(
                answered,
                majority,
                "empty controller store: still waiting for a majority of the voters to answer"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(PARTICIPATION_PROBE_INTERVAL) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

/// Refuses a data directory that belongs to another node or cluster, and
/// stamps a new one with this node's id.
fn check_identity(
    store: &dyn RaftStore,
    dir: &std::path::Path,
    node_id: NodeId,
    cluster_id: Option<&str>,
) -> Result<(), NodeError> {
    match store.get_meta(keys::NODE_ID)? {
        Some(stored) => {
            let stored = String::from_utf8_lossy(&stored).into_owned();
            if stored != node_id.to_string() {
                return Err(NodeError::NodeIdMismatch {
                    dir: dir.to_owned(),
                    stored,
                    configured: node_id,
                });
            }
        }
        None => {
            store.put_meta(&[(keys::NODE_ID, node_id.to_string().as_bytes())])?;
            store.flush()?;
        }
    }
    if let (Some(stored), Some(configured)) = (store.get_meta(keys::CLUSTER_ID)?, cluster_id) {
        let stored = String::from_utf8_lossy(&stored).into_owned();
        if stored != configured {
            return Err(NodeError::ClusterIdMismatch {
                dir: dir.to_owned(),
                stored,
                configured: configured.to_owned(),
            });
        }
    }
    Ok(())
}

/// The active controller's periodic work.
async fn run_duties(
    core: Arc<ControllerCore>,
    cluster_id: String,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        if core.raft().metrics().borrow().current_leader != Some(core.node_id()) {
            continue;
        }
        if core.state_machine().image().cluster_id().is_none() {
            let id = cluster_id.clone();
            match core
                .write(true, move |logic, image, _| {
                    logic.assign_cluster_id(image, &id)
                })
                .await
            {
                Ok(id) => tracing::info!(cluster_id = %id, "cluster id recorded"),
                Err(e) => tracing::debug!(error = %e, "could not record the cluster id yet"),
            }
        }
        match core
            .write(true, |logic, image, now| logic.tick(image, now))
            .await
        {
            Ok(report) if !report.fenced.is_empty() || report.partitions_changed > 0 => {
                tracing::info!(fenced = ?report.fenced, partitions_changed = report.partitions_changed, "controller tick");
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "controller tick skipped"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn voters_parse_and_reject_garbage() {
        let v = parse_voters("2@127.0.0.1:9093, 1@localhost:9094,3@[::1]:9095").unwrap();
        assert_eq!(
            v,
            vec![
                (1, "localhost:9094".to_owned()),
                (2, "127.0.0.1:9093".to_owned()),
                (3, "[::1]:9095".to_owned())
            ]
        );
        for bad in ["", "1", "x@h:1", "1@h", "1@h:port", "1@h:1,1@h:2", "1@:9"] {
            assert!(parse_voters(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn data_of_another_node_or_cluster_is_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let (store, _, _) = open_sled(dir.path()).unwrap();
        check_identity(&*store, dir.path(), 1, Some("c1")).unwrap();
        store.put_meta(&[(keys::CLUSTER_ID, b"c1")]).unwrap();
        check_identity(&*store, dir.path(), 1, Some("c1")).unwrap();
        check_identity(&*store, dir.path(), 1, None).unwrap();
        let err = check_identity(&*store, dir.path(), 2, None).unwrap_err();
        assert!(matches!(err, NodeError::NodeIdMismatch { .. }), "{err}");
        let err = check_identity(&*store, dir.path(), 1, Some("c2")).unwrap_err();
        assert!(err.to_string().contains("another cluster"), "{err}");
    }
}
