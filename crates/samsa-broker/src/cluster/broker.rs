//! The broker half of a cluster node, from opening to shutdown ([`serve`]),
//! as named steps: follow the controller's image into the broker's view,
//! open the broker on the quorum-backed stores, start up (register, catch
//! up, record the cluster id, host partitions), start replication and the
//! coordinators, wait to be unfenced, then serve Kafka until shutdown or a
//! fatal heartbeat error.
//!
//! Invariants: Kafka connections are accepted only once this broker is
//! registered, caught up to its registration and unfenced, and the metadata
//! it follows says so (so its Metadata answers list it); every later view
//! is applied to the hosted partitions in order; `/readyz` says ready only
//! while unfenced; every start-up wait is bounded by
//! `controller_startup_timeout_ms`; whatever way it stops, the partitions are
//! closed cleanly (except when start-up itself fails) and every task spawned
//! here is stopped or aborted.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use samsa_controller::client::{ControllerClient, MetadataFollower};
use samsa_controller::node::ControllerNode;
use samsa_controller::records::BrokerEndpoint;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{error, info, warn, Instrument};

use super::identity::DataDirIdentity;
use super::lifecycle::Lifecycle;
use super::producer_ids::ControllerProducerIdBlockSource;
use super::settings::config_error;
use super::store::QuorumMetadataStore;
use super::view::metadata_view;
use super::{ClusterSettings, PLAINTEXT};
use crate::error::BrokerError;
use crate::metadata::{MetadataStore, MetadataView};
use crate::replication::isr::{isr_loop, IsrProposal};
use crate::replication::service::{ReplicationGrpc, ReplicationHub};
use crate::{maintenance_loop, server, Broker, BrokerConfig};

/// The broker-to-broker gRPC services, served from start-up and attached to
/// the broker once it is open.
pub(super) struct BrokerServices {
    pub(super) replication: ReplicationGrpc,
    pub(super) txn: crate::coordinator::txn::grpc::TxnGrpc,
    /// What `/metrics` and `/readyz` read (the HTTP server runs from start-up).
    pub(super) http: Arc<crate::http::HttpState>,
}

/// Aborts the tasks it holds when dropped (start-up failures included).
#[derive(Default)]
struct Tasks(Vec<JoinHandle<()>>);

impl Tasks {
    fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(task.in_current_span()));
    }

    fn push(&mut self, task: JoinHandle<()>) {
        self.0.push(task);
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// The broker once open, and what its later steps share.
struct OpenBroker {
    broker: Arc<Broker>,
    lifecycle: Arc<Lifecycle>,
    /// The controller's fenced / unfenced answers (fenced until the first).
    fenced: watch::Receiver<bool>,
}

/// What the ISR loop takes over: its `AlterPartitions` client and the ISR
/// expansions the replication service proposes.
struct IsrChannel {
    client: ControllerClient,
    proposals: mpsc::UnboundedReceiver<IsrProposal>,
}

/// How waiting to be unfenced ended.
enum Unfencing {
    Unfenced,
    /// Shutdown was asked for meanwhile.
    Stopped,
    Failed(BrokerError),
}

/// Runs the broker of this cluster node until `shutdown` resolves (after a
/// controlled shutdown) or a fatal error. Each step is a function below, in
/// this order; the early exits stay here so the teardown order is in one
/// place.
pub(super) async fn serve(
    config: BrokerConfig,
    settings: ClusterSettings,
    mut identity: DataDirIdentity,
    controller: Option<&ControllerNode>,
    services: BrokerServices,
    listener: server::BoundListeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    let me = config.node_id;
    let mut tasks = Tasks::default();
    let follower = MetadataFollower::spawn(
        ControllerClient::new(settings.endpoints(), settings.request_timeout)
            .with_inter_node_tls(settings.inter_node_tls.clone()),
        me,
    );
    let views = follow_views(&mut tasks, &follower, controller, me);
    let configured_cluster_id = config.cluster_id.clone();
    let stored_cluster_id = identity.cluster_id.clone();
    let (mut open, isr) = open_broker(
        config,
        &settings,
        stored_cluster_id,
        views.clone(),
        &services,
    )
    .await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);

    // A controller on an empty store first learns whether the quorum is
    // new to it, by looking for this node's registration: the broker must
    // not register before that (samsa-controller's node.rs, step 4).
    let mut participating = controller.map(ControllerNode::participating);
    let startup = async {
        // Bounded like registration: too few voters answer, and the
        // quorum is as unreachable as when registration fails. A
        // broker-only node has no controller to wait for.
        if let Some(participating) = participating.as_mut() {
            let deciding = participating.wait_for(|taking_part| *taking_part);
            match tokio::time::timeout(settings.startup_timeout, deciding).await {
                Ok(Ok(_)) => {}
                // The controller stopped deciding: it refused, and the node
                // stops on that (cluster/node.rs).
                Ok(Err(_)) => std::future::pending::<()>().await,
                Err(_) => {
                    return Err(open.lifecycle.quorum_unreachable(
                        "this node's controller, on an empty store, heard from too few voters",
                    ))
                }
            }
        }
        start_up(
            &open,
            &follower,
            &settings,
            &mut identity,
            configured_cluster_id.as_deref(),
        )
        .await
    };
    tokio::select! {
        result = startup => {
            if let Err(e) = result {
                close_partitions(&open.broker).await;
                return Err(e);
            }
        }
        _ = &mut shutdown => {
            info!("stopped during start-up");
            close_partitions(&open.broker).await;
            return Ok(());
        }
    }
    start_replication(
        &mut tasks,
        &open,
        &settings,
        &services,
        isr,
        views.clone(),
        &stop_rx,
    );
    tasks.spawn(apply_views(Arc::clone(&open.broker), views.clone()));
    let mut heartbeats = tokio::spawn(
        Arc::clone(&open.lifecycle)
            .heartbeat_loop(follower.watch(), stop_rx.clone())
            .in_current_span(),
    );
    match wait_unfenced(
        &mut open.fenced,
        views,
        me,
        &mut heartbeats,
        shutdown.as_mut(),
        &settings,
    )
    .await
    {
        Unfencing::Unfenced => {}
        Unfencing::Stopped => {
            heartbeats.abort();
            open.lifecycle.controlled_shutdown().await;
            close_partitions(&open.broker).await;
            return Ok(());
        }
        Unfencing::Failed(e) => {
            heartbeats.abort();
            close_partitions(&open.broker).await;
            return Err(e);
        }
    }

    let outcome = serve_kafka(
        &open, &services, listener, stop_tx, &mut tasks, heartbeats, shutdown,
    )
    .await;
    drop(tasks);
    drop(follower);
    close_partitions(&open.broker).await;
    if let Err(e) = &outcome {
        error!(error = %e, "broker stopped");
    } else {
        info!("shutdown complete");
    }
    outcome
}

/// The broker's view of every controller image the follower receives, and
/// again whenever the Raft leader changes (the view reports it as the Kafka
/// controller), published on the returned watch. A broker-only node does
/// not see the Raft leader: its views name the lowest live broker, as a
/// Kafka broker in KRaft mode names a broker, never a controller.
fn follow_views(
    tasks: &mut Tasks,
    follower: &MetadataFollower,
    controller: Option<&ControllerNode>,
    me: i32,
) -> watch::Receiver<Arc<MetadataView>> {
    let (views_tx, views_rx) = watch::channel(Arc::new(MetadataView::default()));
    let mut images = follower.watch();
    let mut metrics = controller.map(|c| c.raft().metrics());
    tasks.spawn(async move {
        let mut leader = metrics
            .as_mut()
            .and_then(|m| m.borrow_and_update().current_leader);
        loop {
            let image = Arc::clone(&images.borrow_and_update());
            views_tx.send_replace(Arc::new(metadata_view(&image, leader, me)));
            loop {
                let leader_changed = async {
                    match metrics.as_mut() {
                        Some(m) => m
                            .changed()
                            .await
                            .map(|()| m.borrow_and_update().current_leader),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = images.changed() => {
                        if changed.is_err() { return; }
                        break;
                    }
                    now = leader_changed => {
                        let Ok(now) = now else { return };
                        if now != leader {
                            leader = now;
                            break;
                        }
                    }
                }
            }
        }
    });
    views_rx
}

/// Opens the broker on the quorum-backed metadata store and producer-id
/// source (hosting nothing yet), and attaches it to the gRPC services and
/// `/metrics`.
async fn open_broker(
    config: BrokerConfig,
    settings: &ClusterSettings,
    cluster_id: Option<String>,
    views: watch::Receiver<Arc<MetadataView>>,
    services: &BrokerServices,
) -> Result<(OpenBroker, IsrChannel), BrokerError> {
    let admin_client = ControllerClient::new(settings.endpoints(), settings.request_timeout)
        .with_inter_node_tls(settings.inter_node_tls.clone());
    let store: Arc<dyn MetadataStore> = Arc::new(QuorumMetadataStore::new(
        admin_client.clone(),
        views,
        settings,
    ));
    let epoch = Arc::new(AtomicI64::new(-1));
    let ids = ControllerProducerIdBlockSource::new(
        admin_client.clone(),
        config.node_id,
        Arc::clone(&epoch),
    );
    let mut endpoints = kafka_endpoints(&config)?;
    endpoints.extend(super::peers::inter_node_endpoint(
        &settings.own_address,
        settings.inter_node_tls.is_some(),
    ));
    let broker =
        tokio::task::spawn_blocking(move || Broker::open_with(config, store, Box::new(ids)))
            .await
            .map_err(|e| BrokerError::Cluster(format!("opening the broker failed: {e}")))??;
    let broker = Arc::new(broker);
    services.http.attach(Arc::clone(&broker));
    let (isr_tx, isr_rx) = mpsc::unbounded_channel();
    services.replication.attach(Arc::new(ReplicationHub {
        broker: Arc::clone(&broker),
        isr_proposals: isr_tx,
        sessions: Default::default(),
    }));
    let (fenced_tx, fenced_rx) = watch::channel(true);
    let lifecycle = Arc::new(Lifecycle::new(
        settings,
        endpoints,
        cluster_id,
        epoch,
        fenced_tx,
        Arc::clone(broker.replicas.controller_contact()),
    ));
    let open = OpenBroker {
        broker,
        lifecycle,
        fenced: fenced_rx,
    };
    let isr = IsrChannel {
        client: admin_client,
        proposals: isr_rx,
    };
    Ok((open, isr))
}

/// The Kafka endpoints this broker registers: each listener's advertised
/// host and port (all plaintext).
fn kafka_endpoints(config: &BrokerConfig) -> Result<Vec<BrokerEndpoint>, BrokerError> {
    config
        .kafka_listeners()
        .map_err(config_error)?
        .into_iter()
        .map(|listener| {
            let port = listener.advertised_port;
            Ok(BrokerEndpoint {
                port: u16::try_from(port).map_err(|_| {
                    config_error(format!(
                        "listener {}: advertised port {port} is not a TCP port",
                        listener.name
                    ))
                })?,
                name: listener.name,
                host: listener.advertised_host,
                security_protocol: PLAINTEXT.into(),
            })
        })
        .collect()
}

/// Start-up steps 4–6 of the module docs, up to hosting partitions:
/// register, wait (bounded) until the followed image holds the registration
/// and a cluster id, check and record that id, apply the current view.
async fn start_up(
    open: &OpenBroker,
    follower: &MetadataFollower,
    settings: &ClusterSettings,
    identity: &mut DataDirIdentity,
    configured_cluster_id: Option<&str>,
) -> Result<(), BrokerError> {
    let deadline = Instant::now() + settings.startup_timeout;
    let broker_epoch = open.lifecycle.register(deadline).await?;
    let me = open.broker.config.node_id;
    let mut images = follower.watch();
    // The watch guard must not live across an await (the future is Send).
    let caught_up = async {
        let image = images
            .wait_for(|image| {
                image.cluster_id().is_some()
                    && image
                        .broker(me)
                        .is_some_and(|b| b.broker_epoch == broker_epoch)
            })
            .await
            .ok()?;
        image.cluster_id().map(str::to_owned)
    };
    let Ok(Some(cluster_id)) = tokio::time::timeout_at(deadline, caught_up).await else {
        return Err(BrokerError::Cluster(format!(
            "registered with the controller quorum but did not receive the metadata up to \
             the registration within {:?}",
            settings.startup_timeout
        )));
    };
    identity.check_and_record(&cluster_id, configured_cluster_id)?;
    match apply_view(&open.broker, open.broker.metadata.image()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(error = %e, "some partitions could not be opened; will retry"),
        Err(e) => warn!(error = %e, "applying metadata failed; will retry"),
    }
    Ok(())
}

/// Replication and the coordinators: follow the leaders of the partitions
/// this broker follows (one fetcher per other broker, as brokers join:
/// [`super::peers`]), keep the ISRs of those it leads, and start the
/// transaction and group coordinators (markers and verification reach other
/// brokers at the same gRPC addresses).
fn start_replication(
    tasks: &mut Tasks,
    open: &OpenBroker,
    settings: &ClusterSettings,
    services: &BrokerServices,
    isr: IsrChannel,
    views: watch::Receiver<Arc<MetadataView>>,
    stop: &watch::Receiver<bool>,
) {
    let broker = &open.broker;
    services.txn.attach(Arc::clone(broker));
    tasks.push(crate::coordinator::txn::TxnRuntime::start_with_peers(
        broker,
        Some(settings.inter_node_tls.clone()),
        stop.clone(),
    ));
    tasks.spawn(super::peers::follow_peers(
        Arc::clone(broker),
        views,
        settings.voters.clone(),
        settings.inter_node_tls.clone(),
        stop.clone(),
    ));
    tasks.push(crate::coordinator::group::GroupRuntime::start(
        broker,
        stop.clone(),
    ));
    tasks.spawn(
        isr_loop(
            Arc::clone(broker),
            isr.client,
            Arc::clone(&open.lifecycle.epoch),
            isr.proposals,
            stop.clone(),
        )
        .in_current_span(),
    );
}

/// Keeps the hosted partitions in line with every later view, in order. A
/// view some partitions of which could not be opened (a full disk) is
/// applied again after a back-off until they open or a newer view comes:
/// freed space must not wait for an unrelated metadata change.
async fn apply_views(broker: Arc<Broker>, mut views: watch::Receiver<Arc<MetadataView>>) {
    const FIRST_RETRY: Duration = Duration::from_millis(500);
    const MAX_RETRY: Duration = Duration::from_secs(10);
    let mut retry: Option<Duration> = None;
    loop {
        let next = match retry {
            None => views.changed().await.is_ok(),
            Some(pause) => tokio::select! {
                changed = views.changed() => changed.is_ok(),
                () = tokio::time::sleep(pause) => true,
            },
        };
        if !next {
            return;
        }
        let view = Arc::clone(&views.borrow_and_update());
        match apply_view(&broker, view).await {
            Ok(Ok(())) => {
                if retry.take().is_some() {
                    info!("applying metadata: every partition is open now");
                }
            }
            Ok(Err(e)) => {
                if retry.is_none() {
                    warn!(error = %e, "applying metadata: some partitions could not be opened; retrying until they open");
                }
                retry = Some(retry.map_or(FIRST_RETRY, |r| (r * 2).min(MAX_RETRY)));
            }
            Err(e) => error!(error = %e, "applying metadata panicked"),
        }
    }
}

/// `Broker::apply_image` off the async workers (it opens and recovers logs).
async fn apply_view(
    broker: &Arc<Broker>,
    view: Arc<MetadataView>,
) -> Result<Result<(), BrokerError>, tokio::task::JoinError> {
    let applying = Arc::clone(broker);
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(|| applying.apply_image(&view))).await
}

/// Waits (bounded by `controller_startup_timeout_ms`) until the controller
/// unfences this broker and the broker's view — what Metadata answers
/// from — has the unfencing; a heartbeat failure or a shutdown ends the
/// wait. The controller answers a heartbeat with "unfenced" before this
/// broker's follower has the record, and the view follows the follower's
/// image a task later: serving before the view has it, a Metadata answer
/// would leave this broker out.
async fn wait_unfenced<S: Future<Output = ()>>(
    fenced: &mut watch::Receiver<bool>,
    mut views: watch::Receiver<Arc<MetadataView>>,
    me: i32,
    heartbeats: &mut JoinHandle<Option<BrokerError>>,
    shutdown: Pin<&mut S>,
    settings: &ClusterSettings,
) -> Unfencing {
    let unfenced = tokio::time::timeout_at(Instant::now() + settings.startup_timeout, async {
        fenced.wait_for(|fenced| !*fenced).await.is_ok()
            && views.wait_for(|view| view.is_live_broker(me)).await.is_ok()
    });
    tokio::select! {
        result = unfenced => match result {
            Ok(true) => Unfencing::Unfenced,
            _ => Unfencing::Failed(BrokerError::Cluster(format!(
                "registered, but the controller did not unfence this broker within {:?}",
                settings.startup_timeout
            ))),
        },
        result = heartbeats => Unfencing::Failed(result.ok().flatten().unwrap_or_else(|| {
            BrokerError::Cluster("heartbeats stopped during start-up".into())
        })),
        _ = shutdown => Unfencing::Stopped,
    }
}

/// Accepts Kafka connections and runs maintenance until `shutdown` (after a
/// controlled shutdown) or a fatal heartbeat error, then stops every loop
/// that reads `stop` and waits for the listener and maintenance to end.
async fn serve_kafka<S: Future<Output = ()>>(
    open: &OpenBroker,
    services: &BrokerServices,
    listener: server::BoundListeners,
    stop: watch::Sender<bool>,
    tasks: &mut Tasks,
    mut heartbeats: JoinHandle<Option<BrokerError>>,
    shutdown: Pin<&mut S>,
) -> Result<(), BrokerError> {
    let broker = &open.broker;
    let accept = tokio::spawn(
        server::accept_all(listener, Arc::clone(broker), stop.subscribe()).in_current_span(),
    );
    let maintenance =
        tokio::spawn(maintenance_loop(Arc::clone(broker), stop.subscribe()).in_current_span());
    // Unfenced: the image holds every earlier user and ACL record.
    tasks.spawn(Arc::clone(&broker.declared).ensure(Arc::clone(broker), stop.subscribe()));
    tasks.spawn(report_readiness(
        Arc::clone(&services.http),
        open.fenced.clone(),
        stop.subscribe(),
    ));
    let (host, port) = broker.config.advertised_host_port();
    info!(listen = %broker.config.listen, advertised = %format!("{host}:{port}"), "broker started (cluster mode)");
    let outcome = tokio::select! {
        _ = shutdown => {
            info!("shutting down");
            open.lifecycle.controlled_shutdown().await;
            Ok(())
        }
        result = &mut heartbeats => Err(result.ok().flatten().unwrap_or_else(|| {
            BrokerError::Cluster("heartbeats stopped unexpectedly".into())
        })),
    };
    services.http.set_ready(false);
    let _ = stop.send(true);
    heartbeats.abort();
    let _ = accept.await;
    let _ = maintenance.await;
    outcome
}

/// `/readyz` follows the fenced state until stop: a fenced broker leads
/// nothing and clients should go elsewhere.
async fn report_readiness(
    http: Arc<crate::http::HttpState>,
    mut fenced: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        http.set_ready(!*fenced.borrow_and_update());
        tokio::select! {
            changed = fenced.changed() => if changed.is_err() { break },
            _ = stop.changed() => break,
        }
    }
    http.set_ready(false);
}

/// Closes every hosted log cleanly (flush, snapshots, checkpoints), off the
/// async workers.
async fn close_partitions(broker: &Arc<Broker>) {
    let closing = Arc::clone(broker);
    let span = tracing::Span::current();
    let _ = tokio::task::spawn_blocking(move || {
        span.in_scope(|| closing.replicas.close_all(closing.config.log_open_threads))
    })
    .await;
}
