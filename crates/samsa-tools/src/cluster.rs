//! `samsa cluster status` (the partition moves, `reassign`, `rebalance`,
//! `decommission`, `elect-leaders`, `unregister`, are [`crate::reassign`]'s): the controller quorum as its voters see it (the
//! leader, each voter's applied metadata offset and lag), and the committed
//! metadata (brokers with their fenced state, partition leaders). It talks
//! gRPC to the controllers, not Kafka to the brokers, so it also works while
//! brokers are fenced or the quorum has no leader.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use samsa_controller::client::{ControllerClient, MetadataFollower};
use samsa_controller::tls::InterNodeTls;
use samsa_controller::{MetadataImage, NodeId};
use samsa_proto::controller::DescribeQuorumResponse;

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Show the controller leader, voters and their lag, brokers and their
    /// fenced state, and partition leaders.
    Status(StatusArgs),
    #[command(flatten)]
    Placement(crate::reassign::PlacementCommand),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Controller addresses (any voter will do; the others are found from it).
    #[arg(
        long = "controller",
        value_name = "HOST:PORT[,…]",
        value_delimiter = ',',
        env = "SAMSA_CONTROLLERS",
        default_value = "127.0.0.1:9093,127.0.0.1:9193,127.0.0.1:9293"
    )]
    controllers: Vec<String>,
    /// How long to wait for answers.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    timeout_ms: u64,
    /// With mutual TLS between nodes (`inter_node_tls_*`): a certificate
    /// (PEM) of the cluster's CA to present. With `--tls-key` and `--tls-ca`.
    #[arg(long, value_name = "PEM", env = "SAMSA_INTER_NODE_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<std::path::PathBuf>,
    /// The key of `--tls-cert` (PEM).
    #[arg(long, value_name = "PEM", env = "SAMSA_INTER_NODE_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,
    /// The cluster's CA (PEM).
    #[arg(long, value_name = "PEM", env = "SAMSA_INTER_NODE_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
}

pub async fn run(command: ClusterCommand) -> Result<ExitCode> {
    match command {
        ClusterCommand::Status(args) => status(args).await,
        ClusterCommand::Placement(command) => crate::reassign::run(command).await,
    }
}

/// What one voter said, or why it did not answer.
type Answer = std::result::Result<DescribeQuorumResponse, String>;

async fn describe(addr: &str, timeout: Duration, tls: Option<InterNodeTls>) -> Answer {
    let client = ControllerClient::new([addr.to_owned()], timeout).with_inter_node_tls(tls);
    match tokio::time::timeout(timeout, client.describe_quorum()).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

/// Asks every address at once; answers in the order of `addrs`.
async fn describe_all(
    addrs: &[String],
    timeout: Duration,
    tls: &Option<InterNodeTls>,
) -> Vec<(String, Answer)> {
    let handles: Vec<_> = addrs
        .iter()
        .cloned()
        .map(|addr| {
            let tls = tls.clone();
            tokio::spawn(async move { describe(&addr, timeout, tls).await })
        })
        .collect();
    let mut out = Vec::with_capacity(addrs.len());
    for (addr, handle) in addrs.iter().cloned().zip(handles) {
        let answer = handle
            .await
            .unwrap_or_else(|e| Err(format!("query failed: {e}")));
        out.push((addr, answer));
    }
    out
}

async fn status(args: StatusArgs) -> Result<ExitCode> {
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    if args.controllers.is_empty() {
        bail!("no controller addresses given (--controller HOST:PORT)");
    }
    let tls = match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
        (Some(cert), Some(key), Some(ca)) => {
            Some(InterNodeTls::load(cert, key, ca).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    let first = describe_all(&args.controllers, timeout, &tls).await;
    let Some(seen) = first.iter().find_map(|(_, a)| a.as_ref().ok()) else {
        let why: Vec<String> = first
            .iter()
            .map(|(addr, a)| format!("{addr}: {}", a.as_ref().err().map_or("", String::as_str)))
            .collect();
        bail!("no controller answered ({})", why.join("; "));
    };
    // Ask every voter the quorum knows about, not just the addresses given.
    let voters: BTreeMap<NodeId, String> = seen
        .voters
        .iter()
        .map(|v| (v.node_id, v.address.clone()))
        .collect();
    let addrs: Vec<String> = voters.values().cloned().collect();
    let answers: BTreeMap<NodeId, Answer> = voters
        .keys()
        .copied()
        .zip(
            describe_all(&addrs, timeout, &tls)
                .await
                .into_iter()
                .map(|(_, a)| a),
        )
        .collect();
    let leader = answers
        .values()
        .filter_map(|a| a.as_ref().ok())
        .find_map(|a| a.leader_id.map(|id| (id, a.leader_address.clone())));
    let leader_offset = match leader {
        Some((id, _)) => answers
            .get(&id)
            .and_then(|a| a.as_ref().ok())
            .map(|a| a.metadata_offset),
        None => None,
    };
    let best_offset = answers
        .values()
        .filter_map(|a| a.as_ref().ok())
        .map(|a| a.metadata_offset)
        .max()
        .unwrap_or(0);
    let target = leader_offset.unwrap_or(best_offset);

    // The committed metadata, from whichever voter serves it (leader first).
    let mut endpoints: Vec<String> = Vec::new();
    if let Some((_, addr)) = &leader {
        endpoints.push(addr.clone());
    }
    endpoints.extend(
        answers
            .iter()
            .filter(|(_, a)| a.is_ok())
            .filter_map(|(id, _)| voters.get(id).cloned()),
    );
    endpoints.dedup();
    let follower = MetadataFollower::spawn(
        ControllerClient::new(endpoints, timeout).with_inter_node_tls(tls.clone()),
        -1,
    );
    let image = tokio::time::timeout(timeout, follower.wait_for_offset(target))
        .await
        .unwrap_or_else(|_| follower.image());

    print!(
        "{}",
        render(
            seen.cluster_id.as_str(),
            leader.as_ref(),
            &voters,
            &answers,
            leader_offset,
            &image,
            target
        )
    );
    Ok(if leader.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn list(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

fn render(
    cluster_id: &str,
    leader: Option<&(NodeId, String)>,
    voters: &BTreeMap<NodeId, String>,
    answers: &BTreeMap<NodeId, Answer>,
    leader_offset: Option<u64>,
    image: &MetadataImage,
    target: u64,
) -> String {
    let mut out = String::new();
    let cluster_id = if cluster_id.is_empty() {
        "(not assigned yet)"
    } else {
        cluster_id
    };
    let _ = writeln!(out, "Cluster ID:         {cluster_id}");
    match leader {
        Some((id, addr)) => {
            let _ = writeln!(out, "Controller leader:  {id} ({addr})");
        }
        None => {
            let _ = writeln!(
                out,
                "Controller leader:  none (no quorum: fewer than {} of {} voters agree)",
                voters.len() / 2 + 1,
                voters.len()
            );
        }
    }
    let _ = writeln!(
        out,
        "Metadata offset:    {}",
        leader_offset.map_or_else(|| "unknown".to_owned(), |o| o.to_string())
    );
    let _ = writeln!(out, "\nVoters:");
    let _ = writeln!(
        out,
        "  {:<4} {:<24} {:<12} {:>8} {:>6}",
        "ID", "ADDRESS", "ROLE", "OFFSET", "LAG"
    );
    for (id, addr) in voters {
        let (role, offset, lag) = match answers.get(id) {
            Some(Ok(a)) => {
                let role = if leader.is_some_and(|(l, _)| l == id) {
                    "leader"
                } else if a.leader_id.is_some() {
                    "follower"
                } else {
                    "no-leader"
                };
                let lag = leader_offset.map_or_else(
                    || "-".to_owned(),
                    |l| l.saturating_sub(a.metadata_offset).to_string(),
                );
                (role.to_owned(), a.metadata_offset.to_string(), lag)
            }
            _ => ("unreachable".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        let _ = writeln!(out, "  {id:<4} {addr:<24} {role:<12} {offset:>8} {lag:>6}");
    }

    let _ = writeln!(out, "\nBrokers:");
    if image.offset() < target {
        let _ = writeln!(
            out,
            "  (metadata as of offset {}, behind {target})",
            image.offset()
        );
    }
    let _ = writeln!(
        out,
        "  {:<4} {:<24} {:>6} {:<14}",
        "ID", "ENDPOINT", "EPOCH", "STATE"
    );
    for b in image.brokers() {
        let endpoint = b
            .endpoints
            .first()
            .map_or_else(|| "-".to_owned(), |e| format!("{}:{}", e.host, e.port));
        let state = if b.in_controlled_shutdown {
            "shut down"
        } else if b.fenced {
            "fenced"
        } else {
            "active"
        };
        let _ = writeln!(
            out,
            "  {:<4} {:<24} {:>6} {:<14}",
            b.broker_id, endpoint, b.broker_epoch, state
        );
    }

    let _ = writeln!(out, "\nPartitions:");
    let _ = writeln!(
        out,
        "  {:<32} {:>9} {:>7} {:>6}  {:<12} {:<12}",
        "TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR"
    );
    for topic in image.topics() {
        for (index, p) in topic.partitions.iter().enumerate() {
            let leader = if p.has_leader() {
                p.leader.to_string()
            } else {
                "none".to_owned()
            };
            let _ = writeln!(
                out,
                "  {:<32} {:>9} {:>7} {:>6}  {:<12} {:<12}",
                topic.name,
                index,
                leader,
                p.leader_epoch,
                list(&p.replicas),
                list(&p.isr)
            );
        }
    }
    // Columns are padded; the last one needs no trailing blanks.
    out.lines().map(|l| format!("{}\n", l.trim_end())).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn render_without_leader_says_so() {
        let voters: BTreeMap<NodeId, String> = [
            (1, "127.0.0.1:9093".to_owned()),
            (2, "127.0.0.1:9193".to_owned()),
        ]
        .into_iter()
        .collect();
        let answers: BTreeMap<NodeId, Answer> = [
            (
                1,
                Ok(DescribeQuorumResponse {
                    cluster_id: "c".into(),
                    node_id: 1,
                    leader_id: None,
                    leader_address: String::new(),
                    metadata_offset: 7,
                    voters: vec![],
                    ..Default::default()
                }),
            ),
            (2, Err("refused".into())),
        ]
        .into_iter()
        .collect();
        let text = render("c", None, &voters, &answers, None, &MetadataImage::new(), 0);
        assert!(text.contains("Controller leader:  none"), "{text}");
        assert!(text.contains("unreachable"), "{text}");
        assert!(text.contains("no-leader"), "{text}");
    }
}
