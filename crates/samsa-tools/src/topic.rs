//! `samsa topic create|list|describe|delete`: topic administration through
//! librdkafka's AdminClient (CreateTopics/DeleteTopics) and Metadata requests.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::metadata::Metadata;

use crate::client::{self, CliContext, ConnectArgs, METADATA_TIMEOUT, REQUEST_TIMEOUT};

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create {
        /// Topic name.
        name: String,
        /// Number of partitions (default: the broker's num_partitions).
        #[arg(long, value_name = "N")]
        partitions: Option<i32>,
        /// Replication factor (default: the broker's default_replication_factor).
        #[arg(long, value_name = "R")]
        replication_factor: Option<i32>,
        /// Topic config, e.g. --config retention.ms=60000 (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE", value_parser = client::key_value)]
        configs: Vec<(String, String)>,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// List topic names.
    List {
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Show partitions with leader, replicas and in-sync replicas.
    Describe {
        /// Topic name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
    /// Delete a topic.
    Delete {
        /// Topic name.
        name: String,
        #[command(flatten)]
        connect: ConnectArgs,
    },
}

pub async fn run(command: TopicCommand) -> Result<ExitCode> {
    match command {
        TopicCommand::Create {
            name,
            partitions,
            replication_factor,
            configs,
            connect,
        } => create(&connect, &name, partitions, replication_factor, &configs).await,
        TopicCommand::List { connect } => list(connect).await,
        TopicCommand::Describe { name, connect } => describe(connect, name).await,
        TopicCommand::Delete { name, connect } => delete(&connect, &name).await,
    }
}

fn admin_client(connect: &ConnectArgs) -> Result<AdminClient<CliContext>> {
    connect
        .client_config(&[])?
        .create_with_context(CliContext)
        .context("cannot create the Kafka admin client")
}

fn admin_options() -> AdminOptions {
    AdminOptions::new()
        .request_timeout(Some(REQUEST_TIMEOUT))
        .operation_timeout(Some(REQUEST_TIMEOUT))
}

async fn create(
    connect: &ConnectArgs,
    name: &str,
    partitions: Option<i32>,
    replication_factor: Option<i32>,
    configs: &[(String, String)],
) -> Result<ExitCode> {
    let admin = admin_client(connect)?;
    // -1 asks the broker for its defaults (CreateTopics v4+, KIP-464).
    let mut topic = NewTopic::new(
        name,
        partitions.unwrap_or(-1),
        TopicReplication::Fixed(replication_factor.unwrap_or(-1)),
    );
    for (key, value) in configs {
        topic = topic.set(key, value);
    }
    let results = admin
        .create_topics([&topic], &admin_options())
        .await
        .with_context(|| format!("cannot create topic {name}"))?;
    for result in results {
        match result {
            Ok(topic) => println!("Created topic {topic}."),
            Err((topic, code)) => bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn delete(connect: &ConnectArgs, name: &str) -> Result<ExitCode> {
    let admin = admin_client(connect)?;
    let results = admin
        .delete_topics(&[name], &admin_options())
        .await
        .with_context(|| format!("cannot delete topic {name}"))?;
    for result in results {
        match result {
            Ok(topic) => println!("Deleted topic {topic}."),
            Err((topic, code)) => bail!("cannot delete topic {topic}: {code}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(connect: ConnectArgs) -> Result<ExitCode> {
    let names = client::blocking(move || {
        let admin = admin_client(&connect)?;
        let metadata = fetch_metadata(admin.inner(), None)?;
        let mut names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        names.sort();
        Ok(names)
    })
    .await?;
    for name in names {
        println!("{name}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn describe(connect: ConnectArgs, name: String) -> Result<ExitCode> {
    let text = client::blocking(move || {
        let admin = admin_client(&connect)?;
        let metadata = fetch_metadata(admin.inner(), Some(&name))?;
        format_description(&metadata, &name)
    })
    .await?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn fetch_metadata<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: Option<&str>,
) -> Result<Metadata> {
    client
        .fetch_metadata(topic, METADATA_TIMEOUT)
        .context("cannot fetch metadata (is the broker reachable?)")
}

/// `kafka-topics.sh --describe` layout: a topic line, then one line per partition.
fn format_description(metadata: &Metadata, name: &str) -> Result<String> {
    let Some(topic) = metadata.topics().iter().find(|t| t.name() == name) else {
        bail!("topic {name} does not exist");
    };
    if let Some(err) = topic.error() {
        let code = RDKafkaErrorCode::from(err);
        if code == RDKafkaErrorCode::UnknownTopicOrPartition {
            bail!("topic {name} does not exist");
        }
        bail!("topic {name}: {code}");
    }
    let mut partitions: Vec<_> = topic.partitions().iter().collect();
    partitions.sort_by_key(|p| p.id());
    let replication_factor = partitions.first().map_or(0, |p| p.replicas().len());
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(
        out,
        "Topic: {name}\tPartitionCount: {}\tReplicationFactor: {replication_factor}",
        partitions.len()
    );
    for p in partitions {
        let _ = write!(
            out,
            "\tTopic: {name}\tPartition: {}\tLeader: {}\tReplicas: {}\tIsr: {}",
            p.id(),
            p.leader(),
            join_ids(p.replicas()),
            join_ids(p.isr())
        );
        if let Some(err) = p.error() {
            let _ = write!(out, "\tError: {}", RDKafkaErrorCode::from(err));
        }
        out.push('\n');
    }
    Ok(out)
}

fn join_ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}
