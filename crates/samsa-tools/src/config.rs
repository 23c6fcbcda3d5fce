//! `samsa config`: read and change topic and broker configs of a running
//! cluster, the equivalent of Kafka's `kafka-configs.sh`, over the Kafka
//! protocol (DescribeConfigs, IncrementalAlterConfigs) on the small client
//! in [`crate::wire`].
//!
//! - `get`: every config of the resource with its value and source
//!   (`--key` narrows it);
//! - `set key=value ...`: IncrementalAlterConfigs SET, all keys in one
//!   request (all or none change), `--validate-only` to check only;
//! - `delete key ...`: IncrementalAlterConfigs DELETE: back to the value of
//!   the next level.
//!
//! The resource is `--topic T`, `--broker ID` (that broker's own dynamic
//! configs; the request goes to that broker, as Kafka's tool sends it) or
//! `--broker-defaults` (the cluster-wide defaults of every broker).

use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use kafka_protocol::messages::describe_configs_request::{
    DescribeConfigsRequest, DescribeConfigsResource,
};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig, IncrementalAlterConfigsRequest,
};
use kafka_protocol::protocol::StrBytes;

use crate::client::BootstrapArgs;
use crate::wire::{error_name, print_table, ClusterClient, Connection};

const RESOURCE_TOPIC: i8 = 2;
pub(crate) const RESOURCE_BROKER: i8 = 4;
pub(crate) const OP_SET: i8 = 0;
pub(crate) const OP_DELETE: i8 = 1;

/// Which configs: one of `--topic`, `--broker`, `--broker-defaults`.
#[derive(Debug, Clone, Args)]
#[group(required = true, multiple = false)]
pub struct ResourceArgs {
    /// A topic's configs.
    #[arg(long)]
    topic: Option<String>,
    /// One broker's own configs (by node id).
    #[arg(long, value_name = "ID")]
    broker: Option<i32>,
    /// The cluster-wide defaults of every broker.
    #[arg(long)]
    broker_defaults: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print the configs of a topic or broker: name, value, source.
    Get(GetArgs),
    /// Set configs (KEY=VALUE ...), all in one request.
    Set(SetArgs),
    /// Remove configs (KEY ...): each falls back to the next level.
    Delete(DeleteArgs),
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    /// Only this key (repeatable).
    #[arg(long = "key", value_name = "KEY")]
    keys: Vec<String>,
    /// Also print each config's synonyms (every level with a value).
    #[arg(long)]
    synonyms: bool,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    /// KEY=VALUE pairs.
    #[arg(required = true, value_name = "KEY=VALUE")]
    pairs: Vec<String>,
    /// Check the change without making it.
    #[arg(long)]
    validate_only: bool,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    connect: BootstrapArgs,
    #[command(flatten)]
    resource: ResourceArgs,
    /// Keys to remove.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
}

pub async fn run(command: ConfigCommand) -> Result<ExitCode> {
    match command {
        ConfigCommand::Get(args) => get(args).await,
        ConfigCommand::Set(args) => {
            let changes = args
                .pairs
                .iter()
                .map(|p| {
                    let (k, v) = p
                        .split_once('=')
                        .ok_or_else(|| anyhow!("{p:?} is not KEY=VALUE"))?;
                    Ok((k.trim().to_owned(), OP_SET, Some(v.to_owned())))
                })
                .collect::<Result<Vec<_>>>()?;
            alter(&args.connect, &args.resource, changes, args.validate_only).await
        }
        ConfigCommand::Delete(args) => {
            let changes = args
                .keys
                .iter()
                .map(|k| (k.clone(), OP_DELETE, None))
                .collect();
            alter(&args.connect, &args.resource, changes, false).await
        }
    }
}

impl ResourceArgs {
    /// Kafka's resource type and name.
    fn resource(&self) -> (i8, String) {
        match (&self.topic, self.broker) {
            (Some(topic), _) => (RESOURCE_TOPIC, topic.clone()),
            (None, Some(id)) => (RESOURCE_BROKER, id.to_string()),
            (None, None) => (RESOURCE_BROKER, String::new()),
        }
    }

    fn describe(&self) -> String {
        match (&self.topic, self.broker) {
            (Some(topic), _) => format!("topic {topic}"),
            (None, Some(id)) => format!("broker {id}"),
            (None, None) => "the cluster-wide broker defaults".into(),
        }
    }
}

/// The connection a resource's requests go to: that broker for a broker
/// resource, the bootstrap broker otherwise.
async fn connection_for<'a>(
    cluster: &'a mut ClusterClient,
    resource: &ResourceArgs,
) -> Result<&'a mut Connection> {
    match resource.broker {
        Some(id) => cluster.broker(id).await,
        None => Ok(cluster.bootstrap()),
    }
}

fn source_name(source: i8) -> &'static str {
    match source {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        _ => "UNKNOWN",
    }
}

async fn get(args: GetArgs) -> Result<ExitCode> {
    let mut cluster = ClusterClient::connect(&args.connect.bootstrap_server).await?;
    let conn = connection_for(&mut cluster, &args.resource).await?;
    let (resource_type, name) = args.resource.resource();
    let request = DescribeConfigsRequest::default()
        .with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name))
            .with_configuration_keys((!args.keys.is_empty()).then(|| {
                args.keys
                    .iter()
                    .cloned()
                    .map(StrBytes::from_string)
                    .collect()
            }))])
        .with_include_synonyms(args.synonyms);
    let (response, _) = conn.send(&request, 4).await?;
    let result = response
        .results
        .first()
        .ok_or_else(|| anyhow!("DescribeConfigs answered without a result"))?;
    if result.error_code != 0 {
        bail!(
            "cannot describe {}: {}: {}",
            args.resource.describe(),
            error_name(result.error_code),
            result.error_message.as_deref().unwrap_or("")
        );
    }
    let value = |v: &Option<StrBytes>| v.as_deref().unwrap_or("null").to_owned();
    let mut rows = Vec::new();
    for c in &result.configs {
        rows.push(vec![
            c.name.to_string(),
            value(&c.value),
            source_name(c.config_source).to_owned(),
            if c.read_only { "read-only" } else { "dynamic" }.to_owned(),
        ]);
        if args.synonyms {
            for s in &c.synonyms {
                rows.push(vec![
                    format!("  synonym {}", s.name.as_str()),
                    value(&s.value),
                    source_name(s.source).to_owned(),
                    String::new(),
                ]);
            }
        }
    }
    print_table(&["NAME", "VALUE", "SOURCE", "UPDATE"], &rows);
    Ok(ExitCode::SUCCESS)
}

async fn alter(
    connect: &BootstrapArgs,
    resource: &ResourceArgs,
    changes: Vec<(String, i8, Option<String>)>,
    validate_only: bool,
) -> Result<ExitCode> {
    let mut cluster = ClusterClient::connect(&connect.bootstrap_server).await?;
    let conn = connection_for(&mut cluster, resource).await?;
    let (resource_type, name) = resource.resource();
    let request = IncrementalAlterConfigsRequest::default()
        .with_validate_only(validate_only)
        .with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name))
            .with_configs(
                changes
                    .iter()
                    .map(|(k, op, v)| {
                        AlterableConfig::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_config_operation(*op)
                            .with_value(v.clone().map(StrBytes::from_string))
                    })
                    .collect(),
            )]);
    let (response, _) = conn
        .send(&request, 1)
        .await
        .context("IncrementalAlterConfigs")?;
    let result = response
        .responses
        .first()
        .ok_or_else(|| anyhow!("IncrementalAlterConfigs answered without a result"))?;
    if result.error_code != 0 {
        bail!(
            "{} refused: {}: {}",
            resource.describe(),
            error_name(result.error_code),
            result.error_message.as_deref().unwrap_or("")
        );
    }
    let what = changes
        .iter()
        .map(|(k, _, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("{k} removed"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    if validate_only {
        println!("valid for {}: {what}", resource.describe());
    } else {
        println!("changed {}: {what}", resource.describe());
    }
    Ok(ExitCode::SUCCESS)
}
