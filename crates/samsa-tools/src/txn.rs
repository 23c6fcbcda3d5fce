//! `samsa txn`: operator tools for transactions, the equivalents of Kafka's
//! `kafka-transactions.sh` (KIP-664), on the raw protocol client in
//! [`crate::wire`] because librdkafka has no API for these requests.
//!
//! - `list`: ListTransactions on every broker (each answers for the
//!   transactional ids it coordinates), with state / producer-id / duration
//!   filters;
//! - `describe`: FindCoordinator + DescribeTransactions for one id;
//! - `describe-producers`: DescribeProducers on a partition's leader;
//! - `find-hanging`: transactions open on partitions for longer than the
//!   max transaction timeout whose coordinator does not count the partition
//!   in an ongoing transaction — nobody will ever end them, and they pin the
//!   partition's last stable offset;
//! - `abort`: writes an ABORT marker for such a transaction to the
//!   partition leader (WriteTxnMarkers), which releases the LSO.
//!
//! Tables go to stdout, one header line then one row per item, columns as
//! Kafka's tool prints them; diagnostics go to stderr.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_request::{
    DescribeProducersRequest, TopicRequest,
};
use kafka_protocol::messages::describe_producers_response::ProducerState;
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
};
use kafka_protocol::messages::{ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use samsa_broker::error::marker_error_is_retriable;
use samsa_broker::now_ms;

use crate::client::BootstrapArgs;
use crate::wire::{error_name, print_table, ClusterClient};

/// One partition, as `--topic T --partition P`.
#[derive(Debug, Clone, Args)]
pub struct PartitionArgs {
    #[arg(long)]
    topic: String,
    #[arg(long)]
    partition: i32,
}

#[derive(Debug, Subcommand)]
pub enum TxnCommand {
    /// List the transactions of every coordinator (ListTransactions on each broker).
    List(ListArgs),
    /// Describe the transaction of one transactional id (on its coordinator).
    Describe(DescribeArgs),
    /// Show the producer state of a partition (on its leader).
    DescribeProducers(DescribeProducersArgs),
    /// Find transactions open on partitions longer than the max transaction
    /// timeout that their coordinator does not know about (hanging).
    FindHanging(FindHangingArgs),
    /// Abort a (hanging) transaction on one partition by writing an ABORT
    /// marker to the partition leader.
    Abort(AbortArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    /// Only transactions in this state (Empty, Ongoing, PrepareCommit,
    /// PrepareAbort, CompleteCommit, CompleteAbort, ...; repeatable).
    #[arg(long = "state", value_name = "STATE")]
    states: Vec<String>,
    /// Only transactions of this producer id (repeatable).
    #[arg(long = "producer-id", value_name = "ID")]
    producer_ids: Vec<i64>,
    /// Only transactions running for longer than this many ms (< 0: all).
    #[arg(long, value_name = "MS")]
    duration_filter: Option<i64>,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[arg(long, value_name = "ID")]
    transactional_id: String,
}

#[derive(Debug, Args)]
pub struct DescribeProducersArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    target: PartitionArgs,
    /// Ask this broker instead of the partition leader.
    #[arg(long, value_name = "N")]
    broker_id: Option<i32>,
}

#[derive(Debug, Args)]
pub struct FindHangingArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    /// Search the partitions with a replica on this broker.
    #[arg(long, value_name = "N")]
    broker_id: Option<i32>,
    /// Search the partitions of this topic.
    #[arg(long)]
    topic: Option<String>,
    /// Search only this partition of --topic.
    #[arg(long, requires = "topic")]
    partition: Option<i32>,
    /// The brokers' transaction_max_timeout_ms, in minutes: a transaction
    /// whose producer wrote nothing for longer is a candidate.
    #[arg(long, value_name = "MIN", default_value_t = 15)]
    max_transaction_timeout: u64,
    /// The same in milliseconds (wins over --max-transaction-timeout), for
    /// brokers configured below a minute.
    #[arg(long, value_name = "MS")]
    max_transaction_timeout_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct AbortArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    target: PartitionArgs,
    /// First offset of the open transaction to abort (the producer's id and
    /// epochs are read from DescribeProducers).
    #[arg(long, value_name = "OFFSET", conflicts_with = "producer_id")]
    start_offset: Option<i64>,
    /// Producer id of the transaction (with --producer-epoch and --coordinator-epoch).
    #[arg(long, value_name = "ID", requires_all = ["producer_epoch", "coordinator_epoch"])]
    producer_id: Option<i64>,
    #[arg(long, value_name = "EPOCH")]
    producer_epoch: Option<i16>,
    /// Coordinator epoch of the marker; below 0 (none seen yet) means 0.
    #[arg(long, value_name = "EPOCH", allow_negative_numbers = true)]
    coordinator_epoch: Option<i32>,
}

pub async fn run(command: TxnCommand) -> Result<ExitCode> {
    match command {
        TxnCommand::List(args) => list(args).await,
        TxnCommand::Describe(args) => describe(args).await,
        TxnCommand::DescribeProducers(args) => describe_producers(args).await,
        TxnCommand::FindHanging(args) => find_hanging(args).await,
        TxnCommand::Abort(args) => abort(args).await,
    }?;
    Ok(ExitCode::SUCCESS)
}

/// One transaction as a coordinator lists it.
#[derive(Debug, Clone)]
struct Listed {
    transactional_id: String,
    coordinator: i32,
    producer_id: i64,
    state: String,
}

/// ListTransactions on every broker of the cluster.
async fn list_everywhere(
    cluster: &mut ClusterClient,
    states: &[String],
    producer_ids: &[i64],
    duration_filter: i64,
) -> Result<Vec<Listed>> {
    let request = ListTransactionsRequest::default()
        .with_state_filters(
            states
                .iter()
                .map(|s| StrBytes::from_string(s.clone()))
                .collect(),
        )
        .with_producer_id_filters(producer_ids.iter().map(|p| ProducerId(*p)).collect())
        .with_duration_filter(duration_filter);
    let mut listed = Vec::new();
    let node_ids: Vec<i32> = cluster.brokers.keys().copied().collect();
    for node_id in node_ids {
        let conn = cluster.broker(node_id).await?;
        // v1 adds the duration filter; v2 (id pattern) is not used.
        let needed = if duration_filter >= 0 { 1 } else { 0 };
        let version = conn.version::<ListTransactionsRequest>(1)?;
        if version < needed {
            bail!("broker {node_id} does not support ListTransactions v1 (--duration-filter)");
        }
        let response = conn.send_at(&request, version).await?;
        if response.error_code != 0 {
            bail!(
                "ListTransactions on broker {node_id}: {}",
                error_name(response.error_code)
            );
        }
        for unknown in &response.unknown_state_filters {
            eprintln!("warning: broker {node_id} does not know the state {unknown}");
        }
        listed.extend(response.transaction_states.iter().map(|t| Listed {
            transactional_id: t.transactional_id.0.to_string(),
            coordinator: node_id,
            producer_id: t.producer_id.0,
            state: t.transaction_state.to_string(),
        }));
    }
    listed.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
    Ok(listed)
}

async fn list(args: ListArgs) -> Result<()> {
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;
    let listed = list_everywhere(
        &mut cluster,
        &args.states,
        &args.producer_ids,
        args.duration_filter.unwrap_or(-1),
    )
    .await?;
    let rows: Vec<Vec<String>> = listed
        .into_iter()
        .map(|t| {
            vec![
                t.transactional_id,
                t.coordinator.to_string(),
                t.producer_id.to_string(),
                t.state,
            ]
        })
        .collect();
    print_table(
        &[
            "TransactionalId",
            "Coordinator",
            "ProducerId",
            "TransactionState",
        ],
        &rows,
    );
    Ok(())
}

/// DescribeTransactions of `transactional_id` on its coordinator:
/// `(coordinator, state)`, or `None` for TRANSACTIONAL_ID_NOT_FOUND.
/// Retries coordinator errors that clear by themselves (the state topic
/// being created on first use, a coordinator loading or moving) for this long.
const COORDINATOR_RETRY_FOR: Duration = Duration::from_secs(15);

fn coordinator_error_is_retriable(error: ResponseError) -> bool {
    matches!(
        error,
        ResponseError::CoordinatorNotAvailable
            | ResponseError::CoordinatorLoadInProgress
            | ResponseError::NotCoordinator
    )
}

async fn describe_one(
    cluster: &mut ClusterClient,
    transactional_id: &str,
) -> Result<Option<(i32, TransactionState)>> {
    let deadline = tokio::time::Instant::now() + COORDINATOR_RETRY_FOR;
    let mut backoff = Duration::from_millis(50);
    loop {
        let (coordinator, code, state) = match cluster
            .transaction_coordinator(transactional_id)
            .await?
        {
            Ok(coordinator) => {
                let request = DescribeTransactionsRequest::default().with_transactional_ids(vec![
                    TransactionalId(StrBytes::from_string(transactional_id.to_string())),
                ]);
                let (response, _) = cluster.broker(coordinator).await?.send(&request, 0).await?;
                let state = response
                    .transaction_states
                    .into_iter()
                    .find(|s| s.transactional_id.0.as_str() == transactional_id)
                    .ok_or_else(|| {
                        anyhow!("DescribeTransactions answered without {transactional_id}")
                    })?;
                (coordinator, state.error_code, Some(state))
            }
            Err(code) => (-1, code, None),
        };
        match (ResponseError::try_from_code(code), state) {
            (None, Some(state)) => return Ok(Some((coordinator, state))),
            (Some(ResponseError::TransactionalIdNotFound), _) => return Ok(None),
            (Some(e), _)
                if coordinator_error_is_retriable(e)
                    && tokio::time::Instant::now() + backoff < deadline =>
            {
                tracing::debug!(error = ?e, transactional_id, "coordinator not ready; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
            _ => bail!(
                "describing transactional id {transactional_id} (coordinator {coordinator}): {}",
                error_name(code)
            ),
        }
    }
}

fn partitions_of(state: &TransactionState) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = state
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p)))
        .collect();
    out.sort();
    out
}

async fn describe(args: DescribeArgs) -> Result<()> {
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;
    let Some((coordinator, state)) = describe_one(&mut cluster, &args.transactional_id).await?
    else {
        bail!(
            "transactional id {} is not known to its coordinator (TransactionalIdNotFound)",
            args.transactional_id
        );
    };
    let (start, duration) = if state.transaction_start_time_ms >= 0 {
        (
            state.transaction_start_time_ms.to_string(),
            (now_ms() - state.transaction_start_time_ms).to_string(),
        )
    } else {
        ("None".to_string(), "None".to_string())
    };
    let partitions = partitions_of(&state)
        .into_iter()
        .map(|(t, p)| format!("{t}-{p}"))
        .collect::<Vec<_>>()
        .join(",");
    print_table(
        &[
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ],
        &[vec![
            coordinator.to_string(),
            args.transactional_id,
            state.producer_id.0.to_string(),
            state.producer_epoch.to_string(),
            state.transaction_state.to_string(),
            state.transaction_timeout_ms.to_string(),
            start,
            duration,
            partitions,
        ]],
    );
    Ok(())
}

/// DescribeProducers of `partitions` (one topic-partition list per call)
/// on broker `node_id`: the active producers per partition, or the
/// partition's error code.
async fn describe_producers_on(
    cluster: &mut ClusterClient,
    node_id: i32,
    partitions: &[(String, i32)],
) -> Result<Vec<((String, i32), Result<Vec<ProducerState>, i16>)>> {
    let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in partitions {
        by_topic.entry(topic).or_default().push(*partition);
    }
    let request = DescribeProducersRequest::default().with_topics(
        by_topic
            .into_iter()
            .map(|(topic, indexes)| {
                TopicRequest::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_indexes(indexes)
            })
            .collect(),
    );
    let (response, _) = cluster.broker(node_id).await?.send(&request, 0).await?;
    let mut out = Vec::new();
    for topic in response.topics {
        for p in topic.partitions {
            let tp = (topic.name.0.to_string(), p.partition_index);
            let result = if p.error_code == 0 {
                Ok(p.active_producers)
            } else {
                Err(p.error_code)
            };
            out.push((tp, result));
        }
    }
    Ok(out)
}

impl PartitionArgs {
    fn name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }
}

/// The active producers of one partition, from its leader or `broker_id`.
async fn producers_of(
    cluster: &mut ClusterClient,
    target: &PartitionArgs,
    broker_id: Option<i32>,
) -> Result<Vec<ProducerState>> {
    let leader = cluster.partition(&target.topic, target.partition)?.leader;
    let node_id = match broker_id {
        Some(id) => id,
        None if leader >= 0 => leader,
        None => bail!("{} has no leader", target.name()),
    };
    let tp = (target.topic.clone(), target.partition);
    let answers = describe_producers_on(cluster, node_id, std::slice::from_ref(&tp)).await?;
    match answers.into_iter().find(|(p, _)| *p == tp) {
        Some((_, Ok(producers))) => Ok(producers),
        Some((_, Err(code))) => bail!(
            "DescribeProducers of {} on broker {node_id}: {}",
            target.name(),
            error_name(code)
        ),
        None => bail!("DescribeProducers answered without {}", target.name()),
    }
}

async fn describe_producers(args: DescribeProducersArgs) -> Result<()> {
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;
    let producers = producers_of(&mut cluster, &args.target, args.broker_id).await?;
    let rows: Vec<Vec<String>> = producers
        .iter()
        .map(|p| {
            vec![
                p.producer_id.0.to_string(),
                p.producer_epoch.to_string(),
                p.coordinator_epoch.to_string(),
                p.last_sequence.to_string(),
                p.last_timestamp.to_string(),
                if p.current_txn_start_offset >= 0 {
                    p.current_txn_start_offset.to_string()
                } else {
                    "None".to_string()
                },
            ]
        })
        .collect();
    print_table(
        &[
            "ProducerId",
            "ProducerEpoch",
            "LatestCoordinatorEpoch",
            "LastSequence",
            "LastTimestamp",
            "CurrentTransactionStartOffset",
        ],
        &rows,
    );
    Ok(())
}

/// A transaction open on a partition, as its leader describes it.
#[derive(Debug, Clone)]
struct OpenTransaction {
    topic: String,
    partition: i32,
    producer: ProducerState,
}

/// How often `find-hanging` asks again for partitions whose leader moved
/// or is being elected, and how long it waits in between (10 s in all).
const LEADER_SEARCH_ATTEMPTS: u32 = 20;
const LEADER_SEARCH_BACKOFF: Duration = Duration::from_millis(500);

/// A partition error that a metadata refresh may cure.
fn leadership_moved(code: i16) -> bool {
    matches!(
        ResponseError::try_from_code(code),
        Some(ResponseError::NotLeaderOrFollower | ResponseError::LeaderNotAvailable)
    )
}

async fn find_hanging(args: FindHangingArgs) -> Result<()> {
    if args.topic.is_none() && args.broker_id.is_none() {
        bail!("find-hanging needs --topic or --broker-id to limit the search");
    }
    let max_timeout_ms = args
        .max_transaction_timeout_ms
        .unwrap_or(args.max_transaction_timeout.saturating_mul(60_000));
    let max_timeout_ms = i64::try_from(max_timeout_ms).unwrap_or(i64::MAX);
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;

    // The partitions to search (of --topic, of --partition, with a replica
    // on --broker-id: every filter given), grouped by their leader.
    if let Some(topic) = &args.topic {
        match args.partition {
            Some(partition) => {
                cluster.partition(topic, partition)?;
            }
            None if !cluster.partitions.iter().any(|p| &p.topic == topic) => {
                bail!("topic {topic} does not exist")
            }
            None => {}
        }
    }
    let mut remaining: Vec<(String, i32)> = cluster
        .partitions
        .iter()
        .filter(|p| {
            args.topic.as_ref().is_none_or(|t| &p.topic == t)
                && args.partition.is_none_or(|i| p.partition == i)
                && args.broker_id.is_none_or(|b| p.replicas.contains(&b))
        })
        .map(|p| (p.topic.clone(), p.partition))
        .collect();

    // Candidates: open transactions whose producer has been silent for
    // longer than the max timeout (the coordinator would have aborted a
    // transaction it knows by then). Leadership may move while we ask (a
    // cluster electing leaders, a broker restarting): partitions without a
    // leader or answered NOT_LEADER_OR_FOLLOWER are asked again after a
    // metadata refresh, until LEADER_SEARCH_ATTEMPTS run out.
    let now = now_ms();
    let mut candidates: Vec<OpenTransaction> = Vec::new();
    for attempt in 1..=LEADER_SEARCH_ATTEMPTS {
        let last_attempt = attempt == LEADER_SEARCH_ATTEMPTS;
        let mut by_leader: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
        for (topic, partition) in remaining.drain(..) {
            let leader = cluster.partition(&topic, partition)?.leader;
            by_leader
                .entry(leader)
                .or_default()
                .push((topic, partition));
        }
        if let Some(leaderless) = by_leader.remove(&-1) {
            if last_attempt {
                for (topic, partition) in &leaderless {
                    eprintln!("warning: {topic}-{partition} has no leader; not searched");
                }
            } else {
                remaining.extend(leaderless);
            }
        }
        for (leader, partitions) in by_leader {
            for ((topic, partition), answer) in
                describe_producers_on(&mut cluster, leader, &partitions).await?
            {
                match answer {
                    Ok(producers) => candidates.extend(
                        producers
                            .into_iter()
                            .filter(|p| {
                                p.current_txn_start_offset >= 0
                                    && now.saturating_sub(p.last_timestamp) > max_timeout_ms
                            })
                            .map(|producer| OpenTransaction {
                                topic: topic.clone(),
                                partition,
                                producer,
                            }),
                    ),
                    Err(code) if !last_attempt && leadership_moved(code) => {
                        remaining.push((topic, partition));
                    }
                    Err(code) => bail!(
                        "DescribeProducers of {topic}-{partition} on broker {leader}: {}",
                        error_name(code)
                    ),
                }
            }
        }
        if remaining.is_empty() {
            break;
        }
        tokio::time::sleep(LEADER_SEARCH_BACKOFF).await;
        cluster.refresh().await?;
    }

    // Cross-check with the coordinators: a candidate is hanging unless its
    // producer's transactional id has the partition in its transaction.
    let mut hanging = Vec::new();
    if !candidates.is_empty() {
        let producer_ids: BTreeSet<i64> = candidates
            .iter()
            .map(|c| c.producer.producer_id.0)
            .collect();
        let producer_ids: Vec<i64> = producer_ids.into_iter().collect();
        let listed = list_everywhere(&mut cluster, &[], &producer_ids, -1).await?;
        let mut ids: BTreeMap<i64, String> = BTreeMap::new();
        for t in listed {
            ids.insert(t.producer_id, t.transactional_id);
        }
        let mut described: BTreeMap<String, Option<Vec<(String, i32)>>> = BTreeMap::new();
        for id in ids.values() {
            if !described.contains_key(id) {
                let partitions = describe_one(&mut cluster, id)
                    .await?
                    .map(|(_, state)| partitions_of(&state));
                described.insert(id.clone(), partitions);
            }
        }
        for candidate in candidates {
            let known = ids
                .get(&candidate.producer.producer_id.0)
                .and_then(|id| described.get(id))
                .and_then(Option::as_ref)
                .is_some_and(|partitions| {
                    partitions.contains(&(candidate.topic.clone(), candidate.partition))
                });
            if !known {
                hanging.push(candidate);
            }
        }
    }
    hanging.sort_by(|a, b| {
        (&a.topic, a.partition, a.producer.producer_id.0).cmp(&(
            &b.topic,
            b.partition,
            b.producer.producer_id.0,
        ))
    });
    let rows: Vec<Vec<String>> = hanging
        .iter()
        .map(|t| {
            vec![
                t.topic.clone(),
                t.partition.to_string(),
                t.producer.producer_id.0.to_string(),
                t.producer.producer_epoch.to_string(),
                t.producer.coordinator_epoch.to_string(),
                t.producer.current_txn_start_offset.to_string(),
                t.producer.last_timestamp.to_string(),
                (now.saturating_sub(t.producer.last_timestamp) / 60_000).to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "LastTimestamp",
            "Duration(min)",
        ],
        &rows,
    );
    Ok(())
}

async fn abort(args: AbortArgs) -> Result<()> {
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;
    let target = &args.target;
    let (producer_id, producer_epoch, coordinator_epoch) = match args.start_offset {
        Some(start_offset) => {
            let producers = producers_of(&mut cluster, target, None).await?;
            let producer = producers
                .iter()
                .find(|p| p.current_txn_start_offset == start_offset)
                .ok_or_else(|| {
                    anyhow!(
                        "no open transaction starts at offset {start_offset} on {}",
                        target.name()
                    )
                })?;
            let epoch = i16::try_from(producer.producer_epoch)
                .with_context(|| format!("producer epoch {}", producer.producer_epoch))?;
            (producer.producer_id.0, epoch, producer.coordinator_epoch)
        }
        None => match (
            args.producer_id,
            args.producer_epoch,
            args.coordinator_epoch,
        ) {
            (Some(id), Some(epoch), Some(coordinator_epoch)) => (id, epoch, coordinator_epoch),
            _ => bail!(
                "name the transaction with --start-offset, or with --producer-id, \
                 --producer-epoch and --coordinator-epoch"
            ),
        },
    };
    // A producer that never saw a marker has coordinator epoch -1; 0 is at
    // or below every epoch a coordinator can have written since.
    let coordinator_epoch = coordinator_epoch.max(0);
    let request =
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_transaction_result(false)
            .with_coordinator_epoch(coordinator_epoch)
            .with_topics(vec![WritableTxnMarkerTopic::default()
                .with_name(TopicName(StrBytes::from_string(target.topic.clone())))
                .with_partition_indexes(vec![target.partition])])]);

    const ATTEMPTS: u32 = 10;
    for attempt in 1..=ATTEMPTS {
        let leader = cluster.partition(&target.topic, target.partition)?.leader;
        let outcome = if leader < 0 {
            Some(ResponseError::LeaderNotAvailable)
        } else {
            let (response, _) = cluster.broker(leader).await?.send(&request, 1).await?;
            let code = response
                .markers
                .iter()
                .filter(|m| m.producer_id.0 == producer_id)
                .flat_map(|m| &m.topics)
                .filter(|t| t.name.0.as_str() == target.topic)
                .flat_map(|t| &t.partitions)
                .find(|p| p.partition_index == target.partition)
                .map(|p| p.error_code)
                .ok_or_else(|| anyhow!("WriteTxnMarkers answered without {}", target.name()))?;
            ResponseError::try_from_code(code)
        };
        match outcome {
            None => {
                println!(
                    "Aborted the transaction of producer {producer_id} (epoch {producer_epoch}, \
                     coordinator epoch {coordinator_epoch}) on {}",
                    target.name()
                );
                return Ok(());
            }
            Some(e) if attempt < ATTEMPTS && marker_error_is_retriable(e) => {
                tracing::info!(error = ?e, attempt, "marker not written yet; retrying");
                tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                cluster.refresh().await?;
            }
            Some(e) => bail!(
                "aborting the transaction of producer {producer_id} on {} failed: {}",
                target.name(),
                error_name(e.code())
            ),
        }
    }
    bail!(
        "aborting the transaction of producer {producer_id} on {}: no attempt left",
        target.name()
    )
}
