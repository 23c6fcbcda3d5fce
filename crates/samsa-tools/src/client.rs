//! What every Kafka client tool shares: the connection flags, the librdkafka
//! client configuration built from them, a client context that routes
//! librdkafka's log lines into `tracing`, and metadata helpers.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How long admin requests and transaction calls may take before a tool gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a metadata lookup may take: it is the first thing every tool
/// does, so an unreachable broker is reported after this long.
pub const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a tool finds the cluster (shared by the librdkafka tools and
/// `samsa txn`).
#[derive(Debug, Clone, Args)]
pub struct BootstrapArgs {
    /// Kafka bootstrap server(s), comma-separated.
    #[arg(
        long,
        short = 'b',
        alias = "bootstrap",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:9092",
        env = "SAMSA_BOOTSTRAP_SERVER"
    )]
    pub bootstrap_server: String,
}

#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub bootstrap: BootstrapArgs,
    /// Extra librdkafka property, applied last (repeatable), e.g. -X compression.type=lz4.
    #[arg(short = 'X', long = "property", value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
}

impl ConnectArgs {
    /// A librdkafka configuration: bootstrap servers, then the tool's own
    /// `settings`, then the user's `-X` properties (so the user has the last word).
    pub fn client_config(&self, settings: &[(&str, &str)]) -> Result<ClientConfig> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap.bootstrap_server)
            .set("client.id", "samsa-cli")
            // The CLI must not create topics as a side effect of looking them up.
            .set("allow.auto.create.topics", "false");
        for (key, value) in settings {
            config.set(*key, *value);
        }
        for property in &self.properties {
            let (key, value) = property
                .split_once('=')
                .ok_or_else(|| anyhow!("-X {property}: expected KEY=VALUE"))?;
            config.set(key.trim(), value);
        }
        Ok(config)
    }
}

/// Client context of the CLI tools: librdkafka logs become `tracing` events
/// under the `librdkafka` target (so `RUST_LOG=librdkafka=debug` works) and
/// client-level errors (broker down, ...) are warnings, not fatal.
#[derive(Debug, Clone, Copy, Default)]
pub struct CliContext;

impl ClientContext for CliContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ConsumerContext for CliContext {}

pub fn forward_log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", "{fac}: {message}"),
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", "{fac}: {message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", "{fac}: {message}");
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", "{fac}: {message}"),
    }
}

pub fn forward_error(error: &KafkaError, reason: &str) {
    match error {
        // With enable.partition.eof, reaching the end of a partition also
        // arrives here; it is progress, not a problem.
        KafkaError::PartitionEOF(_) | KafkaError::Global(RDKafkaErrorCode::PartitionEOF) => {
            tracing::debug!(target: "librdkafka", "{error}: {reason}");
        }
        _ => tracing::warn!(target: "librdkafka", "{error}: {reason}"),
    }
}

/// Splits `KEY=VALUE` (for `--config` style flags).
pub fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s}")),
    }
}

/// Partition ids of `topic`, sorted; an error if the topic does not exist.
/// Blocking (a metadata round trip): call from `spawn_blocking`.
pub fn topic_partitions<C: ClientContext>(client: &Client<C>, topic: &str) -> Result<Vec<i32>> {
    match lookup_topic_partitions(client, topic)? {
        Some(partitions) => Ok(partitions),
        None => bail!("topic {topic} does not exist"),
    }
}

/// Like [`topic_partitions`] but `None` when the topic does not exist.
pub fn lookup_topic_partitions<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
) -> Result<Option<Vec<i32>>> {
    let metadata = client
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .with_context(|| {
            format!("cannot fetch metadata of topic {topic} (is the broker reachable?)")
        })?;
    let Some(entry) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if let Some(err) = entry.error() {
        let code = RDKafkaErrorCode::from(err);
        if code == RDKafkaErrorCode::UnknownTopicOrPartition {
            return Ok(None);
        }
        bail!("topic {topic}: {code}");
    }
    let mut partitions: Vec<i32> = entry.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    Ok(Some(partitions))
}

/// Runs a blocking client job on tokio's blocking pool (librdkafka calls block)
/// and surfaces a panic in it as an error rather than aborting the runtime.
pub async fn blocking<T, F>(job: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|err| anyhow!("client task failed: {err}"))?
}
