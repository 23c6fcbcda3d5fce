//! A small Kafka protocol client for the CLI tools that need APIs
//! librdkafka does not expose (DescribeProducers, DescribeTransactions,
//! ListTransactions, WriteTxnMarkers, IncrementalAlterConfigs): one connection per broker, one
//! request in flight, versions negotiated with ApiVersions, and a cluster
//! view (brokers, partition leaders) from Metadata.
//!
//! Only what the broker answers is trusted: every response is decoded with
//! the version it was asked at, and a malformed answer is an error, never a
//! panic.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{encode_request_header_into_buffer, Decodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest answer the CLI accepts (a Metadata answer of a big cluster fits).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `ERROR_NAME (code)` of a Kafka error code, for messages.
pub fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error {code}"),
    }
}

/// One connection to one broker.
pub struct Connection {
    stream: TcpStream,
    addr: String,
    next_correlation: i32,
    /// api key -> highest version the broker advertises.
    broker_max: HashMap<i16, (i16, i16)>,
}

impl Connection {
    /// Connects to `addr` (`host:port`) and asks ApiVersions.
    pub async fn connect(addr: &str) -> Result<Connection> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connect to {addr}: timed out after {CONNECT_TIMEOUT:?}"))?
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream,
            addr: addr.to_string(),
            next_correlation: 1,
            broker_max: HashMap::new(),
        };
        // v0 is understood by every broker; its answer lists the rest.
        let versions: ApiVersionsResponse = conn
            .send_at(&ApiVersionsRequest::default(), 0)
            .await
            .with_context(|| format!("ApiVersions to {addr}"))?;
        if versions.error_code != 0 {
            bail!("ApiVersions to {addr}: {}", error_name(versions.error_code));
        }
        conn.broker_max = versions
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(conn)
    }

    /// The highest version of `R` both the codec and the broker support,
    /// capped at `cap` (a version whose fields this tool does not fill).
    pub fn version<R: Request>(&self, cap: i16) -> Result<i16> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown api key {}", R::KEY))?;
        let ours = key.valid_versions();
        let Some(&(min, max)) = self.broker_max.get(&R::KEY) else {
            bail!("the broker at {} does not support {key:?}", self.addr);
        };
        let version = ours.max.min(max).min(cap);
        if version < ours.min.max(min) {
            bail!(
                "no common version of {key:?} with the broker at {} (it offers {min}..{max})",
                self.addr
            );
        }
        Ok(version)
    }

    /// Sends `request` at the highest common version up to `cap`.
    pub async fn send<R: Request>(&mut self, request: &R, cap: i16) -> Result<(R::Response, i16)> {
        let version = self.version::<R>(cap)?;
        Ok((self.send_at(request, version).await?, version))
    }

    /// Sends `request` at `version` and reads its answer.
    pub async fn send_at<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown api key {}", R::KEY))?;
        let correlation_id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("samsa-cli")));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        encode_request_header_into_buffer(&mut frame, &header)?;
        request.encode(&mut frame, version)?;
        let len = i32::try_from(frame.len() - 4)?;
        frame[0..4].copy_from_slice(&len.to_be_bytes());
        let exchange = async {
            self.stream.write_all(&frame).await?;
            let len = self.stream.read_i32().await?;
            let len = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_RESPONSE_BYTES)
                .ok_or_else(|| anyhow!("answer of {len} bytes is out of range"))?;
            let mut body = vec![0u8; len];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, anyhow::Error>(body)
        };
        let body = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                anyhow!(
                    "{key:?} to {}: no answer within {REQUEST_TIMEOUT:?}",
                    self.addr
                )
            })?
            .with_context(|| format!("{key:?} to {}", self.addr))?;
        let mut body = bytes::Bytes::from(body);
        // ApiVersions answers always use response header v0.
        let header_version = if key == ApiKey::ApiVersions {
            0
        } else {
            key.response_header_version(version)
        };
        let header = ResponseHeader::decode(&mut body, header_version)
            .with_context(|| format!("decode the {key:?} v{version} answer header"))?;
        if header.correlation_id != correlation_id {
            bail!(
                "{key:?} to {}: answer for request {} while waiting for {correlation_id}",
                self.addr,
                header.correlation_id
            );
        }
        let response = R::Response::decode(&mut body, version)
            .with_context(|| format!("decode the {key:?} v{version} answer"))?;
        if body.has_remaining() {
            tracing::debug!(key = ?key, left = body.remaining(), "answer has trailing bytes");
        }
        Ok(response)
    }
}

/// A broker as Metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub node_id: i32,
    pub addr: String,
    /// `broker.rack`, when the broker declares one.
    pub rack: Option<String>,
}

/// One partition of the Metadata answer.
#[derive(Debug, Clone)]
pub struct PartitionInfo {
    pub topic: String,
    pub partition: i32,
    /// -1 when the partition has no leader.
    pub leader: i32,
    pub replicas: Vec<i32>,
}

/// The cluster as the bootstrap broker sees it, with a connection per
/// broker opened on demand.
pub struct ClusterClient {
    pub brokers: BTreeMap<i32, BrokerAddr>,
    pub partitions: Vec<PartitionInfo>,
    connections: HashMap<i32, Connection>,
    bootstrap: Connection,
}

impl ClusterClient {
    /// Connects to the first reachable of the comma-separated `bootstrap`
    /// servers and reads Metadata of every topic.
    pub async fn connect(bootstrap: &str) -> Result<ClusterClient> {
        let mut last_error = None;
        for addr in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            match Connection::connect(addr).await {
                Ok(conn) => {
                    let mut cluster = ClusterClient {
                        brokers: BTreeMap::new(),
                        partitions: Vec::new(),
                        connections: HashMap::new(),
                        bootstrap: conn,
                    };
                    cluster.refresh().await?;
                    return Ok(cluster);
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error
            .unwrap_or_else(|| anyhow!("no bootstrap server given"))
            .context("cannot reach any bootstrap server (is the broker running?)"))
    }

    /// Reads Metadata (brokers and every topic's partitions) again.
    pub async fn refresh(&mut self) -> Result<()> {
        // topics: None asks for every topic (v1+).
        let request = MetadataRequest::default()
            .with_topics(None)
            .with_allow_auto_topic_creation(false);
        let (metadata, _) = self.bootstrap.send(&request, 12).await?;
        self.brokers = metadata
            .brokers
            .iter()
            .map(|b| {
                let node_id = b.node_id.0;
                let addr = format!("{}:{}", b.host.as_str(), b.port);
                let rack = b.rack.as_ref().map(|r| r.to_string());
                (
                    node_id,
                    BrokerAddr {
                        node_id,
                        addr,
                        rack,
                    },
                )
            })
            .collect();
        self.partitions = metadata
            .topics
            .iter()
            .filter(|t| t.error_code == 0)
            .flat_map(|t| {
                let topic = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                t.partitions.iter().map(move |p| PartitionInfo {
                    topic: topic.clone(),
                    partition: p.partition_index,
                    leader: p.leader_id.0,
                    replicas: p.replica_nodes.iter().map(|r| r.0).collect(),
                })
            })
            .collect();
        self.partitions
            .sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        // Connections to brokers that moved are reopened on next use.
        self.connections.clear();
        Ok(())
    }

    /// The partition's metadata, or an error naming what is missing.
    pub fn partition(&self, topic: &str, partition: i32) -> Result<&PartitionInfo> {
        if !self.partitions.iter().any(|p| p.topic == topic) {
            bail!("topic {topic} does not exist");
        }
        self.partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
            .ok_or_else(|| anyhow!("topic {topic} has no partition {partition}"))
    }

    /// The connection to the bootstrap broker.
    pub fn bootstrap(&mut self) -> &mut Connection {
        &mut self.bootstrap
    }

    /// The connection to broker `node_id`, opened if needed.
    pub async fn broker(&mut self, node_id: i32) -> Result<&mut Connection> {
        if !self.connections.contains_key(&node_id) {
            let addr = self
                .brokers
                .get(&node_id)
                .ok_or_else(|| anyhow!("broker {node_id} is not in the cluster metadata"))?
                .addr
                .clone();
            let conn = Connection::connect(&addr)
                .await
                .with_context(|| format!("broker {node_id}"))?;
            self.connections.insert(node_id, conn);
        }
        self.connections
            .get_mut(&node_id)
            .ok_or_else(|| anyhow!("broker {node_id}: connection lost"))
    }

    /// FindCoordinator(TRANSACTION, `transactional_id`): the coordinator's
    /// node id, or the error code the broker answered.
    pub async fn transaction_coordinator(
        &mut self,
        transactional_id: &str,
    ) -> Result<Result<i32, i16>> {
        const TRANSACTION: i8 = 1;
        let version = self.bootstrap.version::<FindCoordinatorRequest>(i16::MAX)?;
        let mut request = FindCoordinatorRequest::default().with_key_type(TRANSACTION);
        let key = StrBytes::from_string(transactional_id.to_string());
        if version >= 4 {
            request.coordinator_keys = vec![key];
        } else {
            request.key = key;
        }
        let response = self.bootstrap.send_at(&request, version).await?;
        let (code, node) = if version >= 4 {
            let c = response
                .coordinators
                .iter()
                .find(|c| c.key.as_str() == transactional_id)
                .ok_or_else(|| anyhow!("FindCoordinator answered without {transactional_id}"))?;
            (c.error_code, c.node_id.0)
        } else {
            (response.error_code, response.node_id.0)
        };
        Ok(if code == 0 { Ok(node) } else { Err(code) })
    }
}

/// Prints `rows` under `headers` in aligned columns (two spaces apart),
/// like Kafka's tools print their tables. An empty cell prints as `-` so
/// that every row splits into as many fields as there are headers.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", format_table(headers, rows));
}

pub fn format_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, value) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell(value).len());
            }
        }
    }
    let line = |values: Vec<String>| {
        let mut out = String::new();
        for (i, value) in values.iter().enumerate() {
            if i + 1 == values.len() {
                out.push_str(value);
            } else {
                out.push_str(&format!("{value:<width$}  ", width = widths[i]));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.iter().map(|v| cell(v)).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_fill_empty_cells() {
        let text = format_table(
            &["A", "Long"],
            &[vec!["x".into(), "".into()], vec!["yyyy".into(), "z".into()]],
        );
        assert_eq!(text, "A     Long\nx     -\nyyyy  z\n");
    }

    #[test]
    fn error_names() {
        assert_eq!(error_name(0), "error 0");
        assert_eq!(error_name(6), "NotLeaderOrFollower (6)");
    }
}
