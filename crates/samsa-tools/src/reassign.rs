//! Moving partitions between brokers, as Kafka's
//! `kafka-reassign-partitions.sh` and `kafka-leader-election.sh` do, over
//! the Kafka protocol on the small client in [`crate::wire`]:
//!
//! - `samsa cluster reassign --plan FILE` executes a reassignment in
//!   Kafka's JSON (`--cancel` cancels the partitions it names);
//! - `samsa cluster reassignments` lists those in progress;
//! - `samsa cluster rebalance` plans ([`crate::balance`]) an even spread
//!   of replicas and preferred leaders over the brokers and executes it
//!   (`--dry-run` prints the plan as Kafka's reassignment JSON);
//! - `samsa cluster decommission ID[,ID…]` plans and executes moving
//!   every replica off those brokers, after which they can be stopped;
//! - `samsa cluster elect-leaders` runs PREFERRED (or `--unclean`)
//!   elections;
//! - `samsa cluster unregister ID[,ID…]` removes stopped brokers'
//!   registrations (UnregisterBroker).
//!
//! Executing = AlterPartitionReassignments, then ListPartitionReassignments
//! until none of the plan's partitions is moving (at most `--timeout`),
//! then a PREFERRED election for them, so the planned leaders lead. With
//! `--throttle BYTES` the cluster-wide `leader.replication.throttled.rate`
//! and `follower.replication.throttled.rate` are set while it runs and
//! removed after.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, BrokerId, ElectLeadersRequest,
    IncrementalAlterConfigsRequest, ListPartitionReassignmentsRequest, TopicName,
    UnregisterBrokerRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::balance::{self, Placement};
use crate::client::BootstrapArgs;
use crate::config::{OP_DELETE, OP_SET, RESOURCE_BROKER};
use crate::wire::{error_name, print_table, ClusterClient};

/// The dynamic broker configs of the reassignment throttle.
pub const THROTTLE_KEYS: [&str; 2] = [
    "leader.replication.throttled.rate",
    "follower.replication.throttled.rate",
];

#[derive(Debug, Clone, Args)]
pub struct ExecuteArgs {
    /// Replication throttle while moving, in bytes/s per broker (sets the
    /// cluster-wide `*.replication.throttled.rate` until the move ends).
    #[arg(long, value_name = "BYTES")]
    throttle: Option<u64>,
    /// How long to wait for the moves to finish.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    timeout: u64,
    /// Start the moves and return without waiting (a `--throttle` then
    /// stays set until removed with `samsa config delete --broker-defaults`).
    #[arg(long)]
    no_wait: bool,
}

#[derive(Debug, Args)]
pub struct ReassignArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
    /// Kafka's reassignment JSON: {"version":1,"partitions":[{"topic","partition","replicas"}]}.
    #[arg(long, value_name = "FILE")]
    plan: std::path::PathBuf,
    /// Cancel the reassignments of the plan's partitions instead.
    #[arg(long)]
    cancel: bool,
    #[command(flatten)]
    execute: ExecuteArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
}

#[derive(Debug, Args)]
pub struct RebalanceArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
    /// Print the plan (Kafka's reassignment JSON) and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Brokers that must hold no replica (repeatable or comma-separated).
    #[arg(long, value_name = "ID", value_delimiter = ',')]
    exclude: Vec<i32>,
    #[command(flatten)]
    execute: ExecuteArgs,
}

#[derive(Debug, Args)]
pub struct DecommissionArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
    /// The broker(s) to empty, comma-separated.
    #[arg(value_delimiter = ',', required = true)]
    ids: Vec<i32>,
    /// Print the plan and change nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    execute: ExecuteArgs,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
    /// UNCLEAN: give leaderless partitions a leader from outside the ISR
    /// (may lose acknowledged records). PREFERRED otherwise.
    #[arg(long)]
    unclean: bool,
    /// Only this topic's partitions (every partition otherwise).
    #[arg(long)]
    topic: Option<String>,
    /// Only this partition of `--topic`.
    #[arg(long, requires = "topic")]
    partition: Option<i32>,
}

#[derive(Debug, Subcommand)]
pub enum PlacementCommand {
    /// Execute (or --cancel) a reassignment given as Kafka's JSON.
    Reassign(ReassignArgs),
    /// List the reassignments in progress.
    Reassignments(ListArgs),
    /// Spread replicas and preferred leaders evenly over the brokers.
    Rebalance(RebalanceArgs),
    /// Move every replica off a broker before it is removed.
    Decommission(DecommissionArgs),
    /// Elect preferred (or unclean) leaders.
    ElectLeaders(ElectArgs),
    /// Remove stopped brokers' registrations (Kafka's UnregisterBroker),
    /// after `decommission` emptied them.
    Unregister(UnregisterArgs),
}

#[derive(Debug, Args)]
pub struct UnregisterArgs {
    #[command(flatten)]
    bootstrap: BootstrapArgs,
    /// The broker(s) to unregister, comma-separated.
    #[arg(value_delimiter = ',', required = true)]
    ids: Vec<i32>,
}

pub async fn run(command: PlacementCommand) -> Result<ExitCode> {
    match command {
        PlacementCommand::Reassign(args) => {
            let text = std::fs::read_to_string(&args.plan)
                .with_context(|| format!("read {}", args.plan.display()))?;
            let plan = balance::parse_reassignment_json(&text).with_context(|| {
                format!("{} is not Kafka's reassignment JSON", args.plan.display())
            })?;
            let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
            if args.cancel {
                alter(&mut cluster, &plan, true).await?;
                println!("cancelled {} reassignment(s)", plan.len());
                return Ok(ExitCode::SUCCESS);
            }
            execute(&mut cluster, &plan, &args.execute).await
        }
        PlacementCommand::Reassignments(args) => {
            let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
            let moving = list(&mut cluster).await?;
            let rows: Vec<Vec<String>> = moving
                .iter()
                .map(|m| {
                    vec![
                        m.topic.clone(),
                        m.partition.to_string(),
                        format!("{:?}", m.replicas),
                        format!("{:?}", m.adding),
                        format!("{:?}", m.removing),
                    ]
                })
                .collect();
            print_table(
                &["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"],
                &rows,
            );
            Ok(ExitCode::SUCCESS)
        }
        PlacementCommand::Rebalance(args) => {
            let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
            let exclude: BTreeSet<i32> = args.exclude.iter().copied().collect();
            let plan = plan_for(&cluster, &exclude)?;
            finish_plan(&mut cluster, &plan, args.dry_run, &args.execute).await
        }
        PlacementCommand::Decommission(args) => {
            let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
            let leaving: BTreeSet<i32> = args.ids.iter().copied().collect();
            if let Some(id) = leaving.iter().find(|id| !cluster.brokers.contains_key(id)) {
                bail!("broker {id} is not in the cluster metadata");
            }
            let plan = plan_for(&cluster, &leaving)?;
            let code = finish_plan(&mut cluster, &plan, args.dry_run, &args.execute).await?;
            if !args.dry_run && !args.execute.no_wait {
                cluster.refresh().await?;
                let left = cluster
                    .partitions
                    .iter()
                    .filter(|p| p.replicas.iter().any(|b| leaving.contains(b)))
                    .count();
                if left > 0 {
                    bail!("brokers {leaving:?} still hold {left} replica(s)");
                }
                println!("brokers {leaving:?} hold no replica: they can be stopped and removed");
            }
            Ok(code)
        }
        PlacementCommand::ElectLeaders(args) => elect(args).await,
        PlacementCommand::Unregister(args) => unregister(args).await,
    }
}

/// UnregisterBroker for each id; a broker that still runs registers again
/// at once, so stop it first.
async fn unregister(args: UnregisterArgs) -> Result<ExitCode> {
    let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
    let mut failed = false;
    for id in args.ids {
        let request = UnregisterBrokerRequest::default().with_broker_id(BrokerId(id));
        let (answer, _) = cluster.bootstrap().send(&request, 0).await?;
        if answer.error_code == 0 {
            println!("broker {id} unregistered");
        } else {
            failed = true;
            let message = answer
                .error_message
                .map(|m| m.to_string())
                .unwrap_or_default();
            eprintln!("broker {id}: {} {message}", error_name(answer.error_code));
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The rebalance plan for the cluster's current placement, with the
/// brokers in `exclude` holding nothing.
fn plan_for(cluster: &ClusterClient, exclude: &BTreeSet<i32>) -> Result<Vec<Placement>> {
    let brokers: Vec<balance::Broker> = cluster
        .brokers
        .values()
        .filter(|b| !exclude.contains(&b.node_id))
        .map(|b| balance::Broker {
            id: b.node_id,
            rack: b.rack.clone(),
        })
        .collect();
    let current: Vec<Placement> = cluster
        .partitions
        .iter()
        .map(|p| Placement {
            topic: p.topic.clone(),
            partition: p.partition,
            replicas: p.replicas.clone(),
        })
        .collect();
    balance::plan(&brokers, &current)
}

async fn finish_plan(
    cluster: &mut ClusterClient,
    plan: &[Placement],
    dry_run: bool,
    execute_args: &ExecuteArgs,
) -> Result<ExitCode> {
    if dry_run {
        println!(
            "{}",
            serde_json::to_string_pretty(&balance::reassignment_json(plan))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if plan.is_empty() {
        println!("nothing to move: replicas and leaders are spread already");
        return Ok(ExitCode::SUCCESS);
    }
    execute(cluster, plan, execute_args).await
}

/// Starts the plan's reassignments, waits for them, elects the planned
/// leaders (see the module docs).
async fn execute(
    cluster: &mut ClusterClient,
    plan: &[Placement],
    args: &ExecuteArgs,
) -> Result<ExitCode> {
    if let Some(rate) = args.throttle {
        set_throttle(cluster, Some(rate)).await?;
    }
    let outcome = async {
        alter(cluster, plan, false).await?;
        println!("started {} reassignment(s)", plan.len());
        if args.no_wait {
            return Ok(());
        }
        wait_done(cluster, plan, Duration::from_secs(args.timeout)).await?;
        elect_planned(cluster, plan).await
    }
    .await;
    if args.throttle.is_some() && !args.no_wait {
        set_throttle(cluster, None).await?;
    }
    outcome?;
    Ok(ExitCode::SUCCESS)
}

/// AlterPartitionReassignments for every partition of `plan` (or their
/// cancellation); fails naming each partition the cluster refused.
async fn alter(cluster: &mut ClusterClient, plan: &[Placement], cancel: bool) -> Result<()> {
    let mut topics: Vec<ReassignableTopic> = Vec::new();
    for p in plan {
        let partition = ReassignablePartition::default()
            .with_partition_index(p.partition)
            .with_replicas((!cancel).then(|| p.replicas.iter().copied().map(BrokerId).collect()));
        match topics.iter_mut().find(|t| t.name.0.as_str() == p.topic) {
            Some(t) => t.partitions.push(partition),
            None => topics.push(
                ReassignableTopic::default()
                    .with_name(TopicName(StrBytes::from_string(p.topic.clone())))
                    .with_partitions(vec![partition]),
            ),
        }
    }
    let request = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(30_000)
        .with_allow_replication_factor_change(true)
        .with_topics(topics);
    let (answer, _) = cluster.bootstrap().send(&request, 1).await?;
    if answer.error_code != 0 {
        bail!(
            "AlterPartitionReassignments: {}: {}",
            error_name(answer.error_code),
            answer.error_message.as_deref().unwrap_or("")
        );
    }
    let refused: Vec<String> = answer
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .filter(|p| p.error_code != 0)
                .map(move |p| {
                    format!(
                        "{}-{}: {} {}",
                        t.name.0.as_str(),
                        p.partition_index,
                        error_name(p.error_code),
                        p.error_message.as_deref().unwrap_or("")
                    )
                })
        })
        .collect();
    if !refused.is_empty() {
        bail!("reassignment refused for {}", refused.join("; "));
    }
    Ok(())
}

/// One reassignment in progress.
pub struct Moving {
    pub topic: String,
    pub partition: i32,
    pub replicas: Vec<i32>,
    pub adding: Vec<i32>,
    pub removing: Vec<i32>,
}

async fn list(cluster: &mut ClusterClient) -> Result<Vec<Moving>> {
    let request = ListPartitionReassignmentsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(None);
    let (answer, _) = cluster.bootstrap().send(&request, 0).await?;
    if answer.error_code != 0 {
        bail!(
            "ListPartitionReassignments: {}",
            error_name(answer.error_code)
        );
    }
    let ids = |list: &[BrokerId]| list.iter().map(|b| b.0).collect::<Vec<i32>>();
    Ok(answer
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| Moving {
                topic: t.name.0.to_string(),
                partition: p.partition_index,
                replicas: ids(&p.replicas),
                adding: ids(&p.adding_replicas),
                removing: ids(&p.removing_replicas),
            })
        })
        .collect())
}

async fn wait_done(
    cluster: &mut ClusterClient,
    plan: &[Placement],
    timeout: Duration,
) -> Result<()> {
    let started = Instant::now();
    let mut reported = usize::MAX;
    loop {
        let moving = list(cluster).await?;
        let pending = plan
            .iter()
            .filter(|p| {
                moving
                    .iter()
                    .any(|m| m.topic == p.topic && m.partition == p.partition)
            })
            .count();
        if pending == 0 {
            println!(
                "all {} reassignment(s) done in {:.1} s",
                plan.len(),
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if pending != reported {
            eprintln!("{pending} of {} reassignment(s) in progress", plan.len());
            reported = pending;
        }
        if started.elapsed() > timeout {
            bail!(
                "{pending} reassignment(s) still in progress after {timeout:?}; \
                 `samsa cluster reassignments` shows them (they go on)"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// PREFERRED elections for the partitions of `plan` (asked for every one:
/// a broker's metadata may lag the moves, and ELECTION_NOT_NEEDED is
/// success).
async fn elect_planned(cluster: &mut ClusterClient, plan: &[Placement]) -> Result<()> {
    let mut topics: Vec<TopicPartitions> = Vec::new();
    for p in plan {
        match topics.iter_mut().find(|t| t.topic.0.as_str() == p.topic) {
            Some(t) => t.partitions.push(p.partition),
            None => topics.push(
                TopicPartitions::default()
                    .with_topic(TopicName(StrBytes::from_string(p.topic.clone())))
                    .with_partitions(vec![p.partition]),
            ),
        }
    }
    let failures = send_election(cluster, 0, Some(topics)).await?;
    for f in &failures {
        eprintln!("preferred leader not elected for {f}");
    }
    Ok(())
}

/// ElectLeaders; the partitions that failed (ELECTION_NOT_NEEDED is not a
/// failure), as `topic-partition: ERROR`.
async fn send_election(
    cluster: &mut ClusterClient,
    election_type: i8,
    partitions: Option<Vec<TopicPartitions>>,
) -> Result<Vec<String>> {
    const ELECTION_NOT_NEEDED: i16 = ResponseError::ElectionNotNeeded.code();
    let request = ElectLeadersRequest::default()
        .with_election_type(election_type)
        .with_topic_partitions(partitions)
        .with_timeout_ms(30_000);
    let (answer, version) = cluster.bootstrap().send(&request, 2).await?;
    if version >= 1 && answer.error_code != 0 {
        bail!("ElectLeaders: {}", error_name(answer.error_code));
    }
    Ok(answer
        .replica_election_results
        .iter()
        .flat_map(|t| {
            t.partition_result
                .iter()
                .filter(|p| p.error_code != 0 && p.error_code != ELECTION_NOT_NEEDED)
                .map(move |p| {
                    format!(
                        "{}-{}: {}",
                        t.topic.0.as_str(),
                        p.partition_id,
                        error_name(p.error_code)
                    )
                })
        })
        .collect())
}

async fn elect(args: ElectArgs) -> Result<ExitCode> {
    let mut cluster = ClusterClient::connect(&args.bootstrap.bootstrap_server).await?;
    let partitions = match (&args.topic, args.partition) {
        (None, _) => None,
        (Some(topic), partition) => {
            let indexes: Vec<i32> = match partition {
                Some(p) => vec![p],
                None => cluster
                    .partitions
                    .iter()
                    .filter(|p| &p.topic == topic)
                    .map(|p| p.partition)
                    .collect(),
            };
            if indexes.is_empty() {
                bail!("topic {topic} does not exist");
            }
            Some(vec![TopicPartitions::default()
                .with_topic(TopicName(StrBytes::from_string(topic.clone())))
                .with_partitions(indexes)])
        }
    };
    let failures = send_election(&mut cluster, i8::from(args.unclean), partitions).await?;
    if failures.is_empty() {
        println!("leaders elected");
        return Ok(ExitCode::SUCCESS);
    }
    for f in &failures {
        println!("{f}");
    }
    Ok(ExitCode::FAILURE)
}

/// Sets (or with `None` removes) the cluster-wide replication throttle.
async fn set_throttle(cluster: &mut ClusterClient, rate: Option<u64>) -> Result<()> {
    let configs = THROTTLE_KEYS
        .iter()
        .map(|key| {
            AlterableConfig::default()
                .with_name(StrBytes::from_static_str(key))
                .with_config_operation(if rate.is_some() { OP_SET } else { OP_DELETE })
                .with_value(rate.map(|r| StrBytes::from_string(r.to_string())))
        })
        .collect();
    let request = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_BROKER)
            .with_resource_name(StrBytes::from_static_str(""))
            .with_configs(configs),
    ]);
    let (answer, _) = cluster.bootstrap().send(&request, 1).await?;
    for r in &answer.responses {
        if r.error_code != 0 {
            bail!(
                "setting the replication throttle: {}: {}",
                error_name(r.error_code),
                r.error_message.as_deref().unwrap_or("")
            );
        }
    }
    Ok(())
}
