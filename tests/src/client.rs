//! A small blocking Kafka protocol client on `kafka-protocol` 0.18: one TCP
//! connection, length-prefixed frames, one request in flight at a time.
//!
//! It exists to send exactly the bytes a test wants (including bad ones) and to
//! see exactly what the broker answers; real clients are tested separately.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic,
};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreateTopicsRequest};
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::describe_log_dirs_request::{
    DescribableLogDirTopic, DescribeLogDirsRequest,
};
use kafka_protocol::messages::describe_log_dirs_response::DescribeLogDirsResponse;
use kafka_protocol::messages::describe_quorum_request::{
    DescribeQuorumRequest, PartitionData as QuorumPartitionData, TopicData as QuorumTopicData,
};
use kafka_protocol::messages::describe_quorum_response::DescribeQuorumResponse;
use kafka_protocol::messages::describe_topic_partitions_request::{
    Cursor as DescribeTopicPartitionsCursor, DescribeTopicPartitionsRequest, TopicRequest,
};
use kafka_protocol::messages::describe_topic_partitions_response::DescribeTopicPartitionsResponse;
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::messages::list_offsets_response::ListOffsetsPartitionResponse;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::metadata_response::MetadataResponse;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    ApiKey, BrokerId, ProducerId, RequestHeader, ResponseHeader, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{
    encode_request_header_into_buffer, Decodable, Encodable, Request, StrBytes,
};

use crate::batch::{decode_records, FetchedRecord, CONTROL_ABORT};

/// Largest response frame the client accepts.
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;
/// Read/write timeout of a connection unless a test changes it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Highest versions this client uses even if the broker offers more: Produce
/// and Fetch from v13 on address topics by id, and the helpers use names.
fn client_cap(key: ApiKey) -> i16 {
    match key {
        ApiKey::Produce | ApiKey::Fetch => 12,
        _ => i16::MAX,
    }
}

/// True if `err` means the peer closed or reset the connection.
pub fn is_connection_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::UnexpectedEof
                    | ErrorKind::ConnectionReset
                    | ErrorKind::ConnectionAborted
                    | ErrorKind::BrokenPipe
            )
        })
    })
}

/// What happened when a test waited for the broker after sending something.
#[derive(Debug)]
pub enum ReadOutcome {
    /// The broker closed (or reset) the connection.
    Closed,
    /// The broker sent a frame (its body, without the length prefix).
    Frame(Bytes),
    /// Nothing arrived within the timeout and the connection is still open.
    Timeout,
}

/// A blocking Kafka protocol connection.
pub struct KafkaClient {
    stream: TcpStream,
    addr: SocketAddr,
    next_correlation: i32,
    /// api key -> (min, max) as advertised by the broker in ApiVersions.
    broker_versions: HashMap<i16, (i16, i16)>,
    client_id: String,
}

impl KafkaClient {
    /// Connects and performs ApiVersions, so that [`KafkaClient::version_for`]
    /// knows what the broker supports.
    pub fn connect(addr: SocketAddr) -> Result<KafkaClient> {
        let mut c = Self::connect_with_timeout(addr, Duration::from_secs(10))?;
        c.api_versions().context("ApiVersions handshake")?;
        Ok(c)
    }

    /// Connects without sending anything.
    pub fn connect_with_timeout(addr: SocketAddr, timeout: Duration) -> Result<KafkaClient> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(KafkaClient {
            stream,
            addr,
            next_correlation: 1,
            broker_versions: HashMap::new(),
            client_id: "samsa-tests".to_string(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the read timeout of the socket (`None` blocks forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        self.stream.set_read_timeout(t)?;
        Ok(())
    }

    /// The versions the broker advertised, by API key.
    pub fn broker_versions(&self) -> &HashMap<i16, (i16, i16)> {
        &self.broker_versions
    }

    /// The highest version both this client (its codec and caps) and the
    /// broker support for `key`.
    pub fn version_for(&self, key: ApiKey) -> Result<i16> {
        let ours = key.valid_versions();
        let (bmin, bmax) = *self
            .broker_versions
            .get(&(key as i16))
            .ok_or_else(|| anyhow!("broker does not advertise {key:?}"))?;
        let max = ours.max.min(bmax).min(client_cap(key));
        let min = ours.min.max(bmin);
        if min > max {
            bail!(
                "no common version for {key:?}: client {}..{}, broker {bmin}..{bmax}",
                ours.min,
                ours.max
            );
        }
        Ok(max)
    }

    fn correlation(&mut self) -> i32 {
        let c = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        c
    }

    /// Encodes header + body of `req` at `version` into a length-prefixed frame.
    pub fn encode_frame<R: Request>(&mut self, req: &R, version: i16) -> Result<(i32, BytesMut)> {
        let correlation_id = self.correlation();
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        encode_request_header_into_buffer(&mut buf, &header)?;
        req.encode(&mut buf, version)?;
        let len = i32::try_from(buf.len() - 4)?;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        Ok((correlation_id, buf))
    }

    /// Sends `req` at `version` without waiting for an answer; returns the
    /// correlation id to pass to [`KafkaClient::recv`].
    pub fn send_only<R: Request>(&mut self, req: &R, version: i16) -> Result<i32> {
        let (corr, frame) = self.encode_frame(req, version)?;
        self.stream.write_all(&frame).context("write request")?;
        Ok(corr)
    }

    /// Reads the answer to a request sent with [`KafkaClient::send_only`].
    pub fn recv<R: Request>(&mut self, correlation_id: i32, version: i16) -> Result<R::Response> {
        let mut frame = self.read_frame()?;
        let api_key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown key {}", R::KEY))?;
        let header_version = if api_key == ApiKey::ApiVersions {
            0
        } else {
            api_key.response_header_version(version)
        };
        let header = ResponseHeader::decode(&mut frame, header_version)
            .with_context(|| format!("decode {api_key:?} v{version} response header"))?;
        if header.correlation_id != correlation_id {
            bail!(
                "{api_key:?} response has correlation id {}, expected {correlation_id}",
                header.correlation_id
            );
        }
        let resp = R::Response::decode(&mut frame, version)
            .with_context(|| format!("decode {api_key:?} v{version} response body"))?;
        if frame.has_remaining() {
            bail!(
                "{api_key:?} v{version} response has {} trailing bytes after the body",
                frame.remaining()
            );
        }
        Ok(resp)
    }

    /// Sends `req` at `version` and reads its response.
    pub fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response> {
        let corr = self.send_only(req, version)?;
        self.recv::<R>(corr, version)
    }

    /// Sends `req` at the highest common version.
    pub fn call<R: Request>(&mut self, req: &R) -> Result<R::Response> {
        let key = ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown key {}", R::KEY))?;
        let v = self.version_for(key)?;
        self.send(req, v)
    }

    /// Reads one length-prefixed frame (without the prefix).
    pub fn read_frame(&mut self) -> Result<Bytes> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .context("read response length")?;
        let len = i32::from_be_bytes(len);
        let len = usize::try_from(len).map_err(|_| anyhow!("negative frame length {len}"))?;
        if len > MAX_RESPONSE_BYTES {
            bail!("response frame of {len} bytes is larger than {MAX_RESPONSE_BYTES}");
        }
        let mut body = vec![0u8; len];
        self.stream
            .read_exact(&mut body)
            .context("read response body")?;
        Ok(Bytes::from(body))
    }

    /// Writes arbitrary bytes to the socket.
    pub fn send_raw_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).context("write raw bytes")?;
        self.stream.flush()?;
        Ok(())
    }

    /// Closes the write half (the broker sees EOF after what was sent).
    pub fn shutdown_write(&mut self) -> Result<()> {
        self.stream.shutdown(Shutdown::Write)?;
        Ok(())
    }

    /// Waits up to `timeout` for the broker to either send a frame or close
    /// the connection.
    pub fn wait_for_frame_or_close(&mut self, timeout: Duration) -> ReadOutcome {
        let _ = self.stream.set_read_timeout(Some(timeout));
        let mut len = [0u8; 4];
        let out = match self.stream.read(&mut len[..1]) {
            Ok(0) => ReadOutcome::Closed,
            Ok(_) => match self.stream.read_exact(&mut len[1..]) {
                Ok(()) => {
                    let n = i32::from_be_bytes(len);
                    let mut body = vec![0u8; usize::try_from(n).unwrap_or(0)];
                    match self.stream.read_exact(&mut body) {
                        Ok(()) => ReadOutcome::Frame(Bytes::from(body)),
                        Err(_) => ReadOutcome::Closed,
                    }
                }
                Err(_) => ReadOutcome::Closed,
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                ReadOutcome::Timeout
            }
            Err(_) => ReadOutcome::Closed,
        };
        let _ = self.stream.set_read_timeout(Some(IO_TIMEOUT));
        out
    }

    // ----- typed helpers -------------------------------------------------

    /// ApiVersions v3 (falls back to v0 if the broker answers
    /// UNSUPPORTED_VERSION); remembers the broker's ranges.
    pub fn api_versions(&mut self) -> Result<ApiVersionsResponse> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("samsa-tests"))
            .with_client_software_version(StrBytes::from_static_str("0.1.0"));
        let (error_code, resp) = self.api_versions_at(&req, 3)?;
        let resp = if error_code == crate::codes::UNSUPPORTED_VERSION {
            self.api_versions_at(&ApiVersionsRequest::default(), 0)?.1
        } else {
            resp
        };
        if resp.error_code != 0 {
            bail!("ApiVersions failed with error {}", resp.error_code);
        }
        self.broker_versions = resp
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(resp)
    }

    /// Sends ApiVersions at `version` (any i16, also unsupported ones, whose
    /// body is then encoded as v3) and decodes the answer: at `version` if
    /// its error code is 0, as v0 (what Kafka does for UNSUPPORTED_VERSION)
    /// otherwise. Returns the error code and the decoded response.
    pub fn api_versions_at(
        &mut self,
        req: &ApiVersionsRequest,
        version: i16,
    ) -> Result<(i16, ApiVersionsResponse)> {
        let corr = self.correlation();
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        // Request header v2 for ApiVersions v3+, v1 below (written by hand so
        // that versions the codec does not know can be sent too).
        buf.put_i16(ApiKey::ApiVersions as i16);
        buf.put_i16(version);
        buf.put_i32(corr);
        buf.put_i16(i16::try_from(self.client_id.len())?);
        buf.put_slice(self.client_id.as_bytes());
        let body_version = version.clamp(0, 3);
        if version >= 3 {
            buf.put_u8(0); // header tagged fields
        }
        req.encode(&mut buf, body_version)?;
        let len = i32::try_from(buf.len() - 4)?;
        buf[0..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).context("write ApiVersions")?;

        let mut frame = self.read_frame()?;
        let header = ResponseHeader::decode(&mut frame, 0)?;
        if header.correlation_id != corr {
            bail!(
                "ApiVersions response correlation id {} != {corr}",
                header.correlation_id
            );
        }
        if frame.len() < 2 {
            bail!("ApiVersions response too short");
        }
        let error_code = i16::from_be_bytes([frame[0], frame[1]]);
        let decode_version = if error_code == 0 {
            version.clamp(0, 4)
        } else {
            0
        };
        let resp = ApiVersionsResponse::decode(&mut frame, decode_version)
            .with_context(|| format!("decode ApiVersions response as v{decode_version}"))?;
        if frame.has_remaining() {
            bail!(
                "ApiVersions response (decoded as v{decode_version}) has {} trailing bytes",
                frame.remaining()
            );
        }
        Ok((error_code, resp))
    }

    /// Metadata for `topics` (`None` = all topics), without auto-creation.
    pub fn metadata(&mut self, topics: Option<&[&str]>) -> Result<MetadataResponse> {
        self.metadata_with(topics, false)
    }

    /// The Metadata answer for one known topic; `None` when the request
    /// fails or the topic is missing or answered with an error.
    pub fn topic_metadata(
        &mut self,
        topic: &str,
    ) -> Option<kafka_protocol::messages::metadata_response::MetadataResponseTopic> {
        self.metadata(Some(&[topic]))
            .ok()?
            .topics
            .into_iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .filter(|t| t.error_code == 0)
    }

    /// Metadata with an explicit `allow_auto_topic_creation`.
    pub fn metadata_with(
        &mut self,
        topics: Option<&[&str]>,
        allow_auto_topic_creation: bool,
    ) -> Result<MetadataResponse> {
        let mut req = MetadataRequest::default();
        req.topics = topics.map(|ts| {
            ts.iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                .collect()
        });
        req.allow_auto_topic_creation = allow_auto_topic_creation;
        self.call(&req)
    }

    /// DescribeTopicPartitions for `topics` (empty: every topic) at most
    /// `limit` partitions, from `cursor` (topic, partition).
    pub fn describe_topic_partitions(
        &mut self,
        topics: &[&str],
        limit: i32,
        cursor: Option<(&str, i32)>,
    ) -> Result<DescribeTopicPartitionsResponse> {
        let req = DescribeTopicPartitionsRequest::default()
            .with_topics(
                topics
                    .iter()
                    .map(|t| TopicRequest::default().with_name(topic_name(t)))
                    .collect(),
            )
            .with_response_partition_limit(limit)
            .with_cursor(cursor.map(|(t, p)| {
                DescribeTopicPartitionsCursor::default()
                    .with_topic_name(topic_name(t))
                    .with_partition_index(p)
            }));
        self.call(&req)
    }

    /// DescribeLogDirs at `version` for `topics` (`None`: every partition).
    pub fn describe_log_dirs(
        &mut self,
        topics: Option<&[(&str, &[i32])]>,
        version: i16,
    ) -> Result<DescribeLogDirsResponse> {
        let req = DescribeLogDirsRequest::default().with_topics(topics.map(|ts| {
            ts.iter()
                .map(|(t, ps)| {
                    DescribableLogDirTopic::default()
                        .with_topic(topic_name(t))
                        .with_partitions(ps.to_vec())
                })
                .collect()
        }));
        self.send(&req, version)
    }

    /// DescribeQuorum at `version` for `topic`'s `partitions` (Kafka's
    /// clients ask for `__cluster_metadata` partition 0).
    pub fn describe_quorum_of(
        &mut self,
        topic: &str,
        partitions: &[i32],
        version: i16,
    ) -> Result<DescribeQuorumResponse> {
        let req = DescribeQuorumRequest::default().with_topics(vec![QuorumTopicData::default()
            .with_topic_name(topic_name(topic))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| QuorumPartitionData::default().with_partition_index(*p))
                    .collect(),
            )]);
        self.send(&req, version)
    }

    /// DescribeQuorum at `version`, as `kafka-metadata-quorum` sends it.
    pub fn describe_quorum(&mut self, version: i16) -> Result<DescribeQuorumResponse> {
        self.describe_quorum_of("__cluster_metadata", &[0], version)
    }

    /// CreateTopics for one topic with replication factor 1; returns the
    /// per-topic result (check its `error_code`).
    pub fn create_topic_result(
        &mut self,
        name: &str,
        partitions: i32,
    ) -> Result<CreatableTopicResult> {
        let topic = CreatableTopic::default()
            .with_name(topic_name(name))
            .with_num_partitions(partitions)
            .with_replication_factor(1);
        let req = CreateTopicsRequest::default()
            .with_topics(vec![topic])
            .with_timeout_ms(30_000);
        let resp = self.call(&req)?;
        resp.topics
            .into_iter()
            .find(|t| t.name.0.as_str() == name)
            .ok_or_else(|| anyhow!("CreateTopics response lacks topic {name}"))
    }

    /// Creates a topic and fails unless the broker answers NONE.
    pub fn create_topic(&mut self, name: &str, partitions: i32) -> Result<()> {
        let r = self.create_topic_result(name, partitions)?;
        if r.error_code != 0 {
            bail!(
                "CreateTopics {name}: error {} ({:?})",
                r.error_code,
                r.error_message
            );
        }
        Ok(())
    }

    /// Produce one record set to one partition. With `acks == 0` Kafka sends
    /// no response, so a default response (error 0, offset -1) is returned.
    pub fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: Bytes,
        acks: i16,
    ) -> Result<PartitionProduceResponse> {
        let version = self.version_for(ApiKey::Produce)?;
        self.produce_at(topic, partition, records, acks, version)
    }

    /// [`KafkaClient::produce`] at an explicit version.
    pub fn produce_at(
        &mut self,
        topic: &str,
        partition: i32,
        records: Bytes,
        acks: i16,
        version: i16,
    ) -> Result<PartitionProduceResponse> {
        let req = produce_request(topic, partition, records, acks);
        if acks == 0 {
            self.send_only(&req, version)?;
            return Ok(PartitionProduceResponse::default()
                .with_index(partition)
                .with_base_offset(-1));
        }
        let resp = self.send(&req, version)?;
        resp.responses
            .into_iter()
            .find(|t| t.name.0.as_str() == topic)
            .and_then(|t| {
                t.partition_responses
                    .into_iter()
                    .find(|p| p.index == partition)
            })
            .ok_or_else(|| anyhow!("Produce response lacks {topic}/{partition}"))
    }

    /// [`KafkaClient::produce_at`] of transactional records: the request
    /// carries the producer's transactional id, as every client sends it
    /// (a broker needs it to verify the write with the coordinator).
    pub fn produce_txn_at(
        &mut self,
        transactional_id: &str,
        topic: &str,
        partition: i32,
        records: Bytes,
        acks: i16,
        version: i16,
    ) -> Result<PartitionProduceResponse> {
        let req = produce_request(topic, partition, records, acks).with_transactional_id(Some(
            TransactionalId(StrBytes::from_string(transactional_id.to_string())),
        ));
        let resp = self.send(&req, version)?;
        resp.responses
            .into_iter()
            .find(|t| t.name.0.as_str() == topic)
            .and_then(|t| {
                t.partition_responses
                    .into_iter()
                    .find(|p| p.index == partition)
            })
            .ok_or_else(|| anyhow!("Produce response lacks {topic}/{partition}"))
    }

    /// One Fetch of one partition from `offset`.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait_ms: i32,
        min_bytes: i32,
    ) -> Result<PartitionData> {
        let version = self.version_for(ApiKey::Fetch)?;
        let req = fetch_request(topic, partition, offset, max_wait_ms, min_bytes);
        let resp = self.send(&req, version)?;
        if resp.error_code != 0 {
            bail!("Fetch failed with top-level error {}", resp.error_code);
        }
        resp.responses
            .into_iter()
            .find(|t| t.topic.0.as_str() == topic)
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
            .ok_or_else(|| anyhow!("Fetch response lacks {topic}/{partition}"))
    }

    /// Reads every record of a partition from `from` up to its high watermark
    /// (control records are skipped). Fails on any partition error.
    pub fn fetch_all(
        &mut self,
        topic: &str,
        partition: i32,
        from: i64,
    ) -> Result<Vec<FetchedRecord>> {
        Ok(self
            .read_to_high_watermark(topic, partition, from)?
            .into_iter()
            .filter(|r| !r.control)
            .collect())
    }

    /// ListOffsets for one partition at `timestamp` (-1 latest, -2 earliest,
    /// -3 max timestamp, or a timestamp in ms).
    pub fn list_offsets(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<ListOffsetsPartitionResponse> {
        let version = self.version_for(ApiKey::ListOffsets)?;
        self.list_offsets_at(topic, partition, timestamp, version)
    }

    /// [`KafkaClient::list_offsets`] at an explicit version.
    pub fn list_offsets_at(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        version: i16,
    ) -> Result<ListOffsetsPartitionResponse> {
        self.list_offsets_with(topic, partition, timestamp, 0, version)
    }

    /// Log end offset (ListOffsets latest); fails on a partition error.
    pub fn log_end_offset(&mut self, topic: &str, partition: i32) -> Result<i64> {
        let r = self.list_offsets(topic, partition, -1)?;
        if r.error_code != 0 {
            bail!(
                "ListOffsets latest {topic}/{partition}: error {}",
                r.error_code
            );
        }
        Ok(r.offset)
    }

    /// DeleteTopics for one topic by name; returns its error code.
    /// DeleteRecords of one partition below `offset` (-1: the high
    /// watermark); returns (error code, low watermark).
    pub fn delete_records(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<(i16, i64)> {
        use kafka_protocol::messages::delete_records_request::{
            DeleteRecordsPartition, DeleteRecordsTopic,
        };
        let req = kafka_protocol::messages::DeleteRecordsRequest::default()
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(partition)
                    .with_offset(offset)])])
            .with_timeout_ms(30_000);
        let resp = self.call(&req)?;
        resp.topics
            .into_iter()
            .find(|t| t.name.0.as_str() == topic)
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
            .map(|p| (p.error_code, p.low_watermark))
            .ok_or_else(|| anyhow!("DeleteRecords response lacks {topic}/{partition}"))
    }

    pub fn delete_topic(&mut self, name: &str) -> Result<i16> {
        use kafka_protocol::messages::delete_topics_request::{
            DeleteTopicState, DeleteTopicsRequest,
        };
        let version = self.version_for(ApiKey::DeleteTopics)?;
        let mut req = DeleteTopicsRequest::default().with_timeout_ms(30_000);
        if version >= 6 {
            req.topics = vec![DeleteTopicState::default().with_name(Some(topic_name(name)))];
        } else {
            req.topic_names = vec![topic_name(name)];
        }
        let resp = self.send(&req, version)?;
        resp.responses
            .into_iter()
            .find(|r| r.name.as_ref().is_some_and(|n| n.0.as_str() == name))
            .map(|r| r.error_code)
            .ok_or_else(|| anyhow!("DeleteTopics response lacks {name}"))
    }

    /// Partition count of `topic` per Metadata, or `None` if the broker says
    /// the topic does not exist (UNKNOWN_TOPIC_OR_PARTITION).
    pub fn partition_count(&mut self, topic: &str) -> Result<Option<usize>> {
        let md = self.metadata(Some(&[topic]))?;
        let t = md
            .topics
            .into_iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
            .ok_or_else(|| anyhow!("Metadata response lacks {topic}"))?;
        match t.error_code {
            0 => Ok(Some(t.partitions.len())),
            3 => Ok(None),
            e => bail!("Metadata for {topic}: error {e}"),
        }
    }

    /// InitProducerId for an idempotent (non-transactional) producer.
    pub fn init_producer_id(&mut self) -> Result<InitProducerIdResponse> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(i32::MAX)
            .with_producer_id(kafka_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1);
        let resp = self.call(&req)?;
        if resp.error_code != 0 {
            bail!("InitProducerId failed with error {}", resp.error_code);
        }
        Ok(resp)
    }

    // ----- transactions --------------------------------------------------

    /// FindCoordinator for one key (`key_type` 0 = group, 1 = transaction):
    /// `(error_code, node_id)`. Uses the batched form (`coordinator_keys`)
    /// from v4 on, the single-key form below.
    pub fn find_coordinator(&mut self, key_type: i8, key: &str) -> Result<(i16, i32)> {
        let version = self.version_for(ApiKey::FindCoordinator)?;
        let mut req = FindCoordinatorRequest::default().with_key_type(key_type);
        if version >= 4 {
            req.coordinator_keys = vec![StrBytes::from_string(key.to_string())];
        } else {
            req.key = StrBytes::from_string(key.to_string());
        }
        let resp = self.send(&req, version)?;
        if version >= 4 {
            let c = resp
                .coordinators
                .into_iter()
                .find(|c| c.key.as_str() == key)
                .ok_or_else(|| anyhow!("FindCoordinator response lacks key {key}"))?;
            Ok((c.error_code, c.node_id.0))
        } else {
            Ok((resp.error_code, resp.node_id.0))
        }
    }

    /// DescribeTransactions of one id at its coordinator: the state name
    /// as Kafka spells it (`Ongoing`, `PrepareCommit`, `CompleteCommit`, …)
    /// and the error code.
    pub fn transaction_state(&mut self, transactional_id: &str) -> Result<(i16, String)> {
        let req = kafka_protocol::messages::DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            ))]);
        let resp = self.call(&req)?;
        let state = resp
            .transaction_states
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("DescribeTransactions answered no transaction"))?;
        Ok((state.error_code, state.transaction_state.to_string()))
    }

    /// InitProducerId with a transactional id at the highest common
    /// version; the answer is returned whatever its error code. `current`
    /// is the (producer id, epoch) a KIP-360 client sends to keep its id,
    /// `(-1, -1)` for a fresh start.
    pub fn init_producer_id_txn(
        &mut self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
        current: (i64, i16),
    ) -> Result<InitProducerIdResponse> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            ))))
            .with_transaction_timeout_ms(transaction_timeout_ms)
            .with_producer_id(ProducerId(current.0))
            .with_producer_epoch(current.1);
        self.call(&req)
    }

    /// AddPartitionsToTxn as a client sends it (v3 at most: v4+ are the
    /// broker-to-coordinator versions). Returns each partition's error code.
    pub fn add_partitions_to_txn(
        &mut self,
        transactional_id: &str,
        producer: (i64, i16),
        topic: &str,
        partitions: &[i32],
    ) -> Result<Vec<(i32, i16)>> {
        let version = self.version_for(ApiKey::AddPartitionsToTxn)?.min(3);
        let req = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            )))
            .with_v3_and_below_producer_id(ProducerId(producer.0))
            .with_v3_and_below_producer_epoch(producer.1)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(partitions.to_vec())]);
        let resp = self.send(&req, version)?;
        Ok(resp
            .results_by_topic_v3_and_below
            .into_iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.results_by_partition)
            .map(|p| (p.partition_index, p.partition_error_code))
            .collect())
    }

    /// EndTxn at an explicit `version` (v5+ is transaction version 2: the
    /// coordinator bumps the epoch and answers the producer id and epoch to
    /// use next). The answer is returned whatever its error code.
    pub fn end_txn_at(
        &mut self,
        transactional_id: &str,
        producer: (i64, i16),
        commit: bool,
        version: i16,
    ) -> Result<EndTxnResponse> {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                transactional_id.to_string(),
            )))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_committed(commit);
        self.send(&req, version)
    }

    /// ListOffsets for one partition with an isolation level (0 =
    /// read_uncommitted, 1 = read_committed: "latest" is then the LSO).
    pub fn list_offsets_isolated(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation_level: i8,
    ) -> Result<ListOffsetsPartitionResponse> {
        let version = self.version_for(ApiKey::ListOffsets)?;
        if isolation_level != 0 && version < 2 {
            bail!("ListOffsets v{version} has no isolation level");
        }
        self.list_offsets_with(topic, partition, timestamp, isolation_level, version)
    }

    /// One partition's ListOffsets answer at `version` and `isolation_level`.
    fn list_offsets_with(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
        isolation_level: i8,
        version: i16,
    ) -> Result<ListOffsetsPartitionResponse> {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation_level)
            .with_timeout_ms(30_000)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let resp = self.send(&req, version)?;
        resp.topics
            .into_iter()
            .find(|t| t.name.0.as_str() == topic)
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
            .ok_or_else(|| anyhow!("ListOffsets response lacks {topic}/{partition}"))
    }

    /// The last stable offset (ListOffsets latest, read_committed).
    pub fn last_stable_offset(&mut self, topic: &str, partition: i32) -> Result<i64> {
        let r = self.list_offsets_isolated(topic, partition, -1, 1)?;
        if r.error_code != 0 {
            bail!(
                "ListOffsets latest read_committed {topic}/{partition}: error {}",
                r.error_code
            );
        }
        Ok(r.offset)
    }

    /// One Fetch of one partition with an isolation level (1 = read_committed).
    pub fn fetch_isolated(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        isolation_level: i8,
    ) -> Result<PartitionData> {
        let version = self.version_for(ApiKey::Fetch)?;
        let req =
            fetch_request(topic, partition, offset, 0, 1).with_isolation_level(isolation_level);
        let resp = self.send(&req, version)?;
        if resp.error_code != 0 {
            bail!("Fetch failed with top-level error {}", resp.error_code);
        }
        resp.responses
            .into_iter()
            .find(|t| t.topic.0.as_str() == topic)
            .and_then(|t| {
                t.partitions
                    .into_iter()
                    .find(|p| p.partition_index == partition)
            })
            .ok_or_else(|| anyhow!("Fetch response lacks {topic}/{partition}"))
    }

    /// What a `read_committed` consumer of one partition sees, computed
    /// here from raw read_committed Fetch answers (not by a client library):
    /// every record below the LSO, minus control records and minus the
    /// records of the aborted transactions the broker lists (a producer's
    /// records are dropped from an aborted transaction's first offset up to
    /// its ABORT marker). Returns the records, the LSO the last answer
    /// reported, and every aborted transaction listed `(producer id, first
    /// offset)`.
    pub fn read_committed(&mut self, topic: &str, partition: i32) -> Result<CommittedRead> {
        let mut batches: Vec<FetchedRecord> = Vec::new();
        let mut aborted: Vec<(i64, i64)> = Vec::new();
        let mut offset = 0i64;
        let lso = loop {
            let p = self.fetch_isolated(topic, partition, offset, 1)?;
            if p.error_code != 0 {
                bail!(
                    "Fetch read_committed {topic}/{partition} at {offset}: error {}",
                    p.error_code
                );
            }
            let lso = p.last_stable_offset;
            if lso < 0 {
                bail!("Fetch read_committed {topic}/{partition}: no last stable offset ({lso})");
            }
            if lso > p.high_watermark {
                bail!(
                    "Fetch {topic}/{partition}: last stable offset {lso} above high watermark {}",
                    p.high_watermark
                );
            }
            for a in p.aborted_transactions.unwrap_or_default() {
                let a = (a.producer_id.0, a.first_offset);
                if !aborted.contains(&a) {
                    aborted.push(a);
                }
            }
            let (recs, next) = decode_records(
                partition,
                p.records.as_ref().map(|b| b.as_ref()).unwrap_or(&[]),
            )?;
            let before = offset;
            for r in recs {
                if r.offset >= offset {
                    if r.offset >= lso {
                        bail!(
                            "read_committed Fetch of {topic}/{partition} returned offset {} at or above the LSO {lso}",
                            r.offset
                        );
                    }
                    batches.push(r);
                }
            }
            if let Some(n) = next {
                offset = offset.max(n);
            }
            if offset >= lso {
                break lso;
            }
            if offset == before {
                bail!("Fetch {topic}/{partition} at {offset} made no progress (lso {lso})");
            }
        };
        aborted.sort_by_key(|a| a.1);
        // Replay the log in order: an aborted transaction starts at its first
        // offset and ends at its producer's ABORT marker.
        let mut open_aborted: std::collections::HashSet<i64> = Default::default();
        let mut next_aborted = 0;
        let mut records = Vec::new();
        for r in batches {
            while next_aborted < aborted.len() && aborted[next_aborted].1 <= r.offset {
                open_aborted.insert(aborted[next_aborted].0);
                next_aborted += 1;
            }
            if r.control {
                if r.control_type() == Some(CONTROL_ABORT) {
                    open_aborted.remove(&r.producer_id);
                }
                continue;
            }
            if r.transactional && open_aborted.contains(&r.producer_id) {
                continue;
            }
            records.push(r);
        }
        Ok(CommittedRead {
            records,
            last_stable_offset: lso,
            aborted,
        })
    }

    /// Every record and control record of a partition up to its high
    /// watermark, as a read_uncommitted Fetch returns them.
    pub fn read_uncommitted_with_control(
        &mut self,
        topic: &str,
        partition: i32,
    ) -> Result<Vec<FetchedRecord>> {
        self.read_to_high_watermark(topic, partition, 0)
    }

    /// Every record and control record from `from` up to the high watermark
    /// (read_uncommitted Fetches); fails on a partition error or no progress.
    fn read_to_high_watermark(
        &mut self,
        topic: &str,
        partition: i32,
        from: i64,
    ) -> Result<Vec<FetchedRecord>> {
        let mut out: Vec<FetchedRecord> = Vec::new();
        let mut offset = from;
        loop {
            let p = self.fetch(topic, partition, offset, 0, 1)?;
            if p.error_code != 0 {
                bail!(
                    "Fetch {topic}/{partition} at {offset}: error {}",
                    p.error_code
                );
            }
            let hw = p.high_watermark;
            let (recs, next) = decode_records(
                partition,
                p.records.as_ref().map(|b| b.as_ref()).unwrap_or(&[]),
            )?;
            let before = offset;
            out.extend(recs.into_iter().filter(|r| r.offset >= offset));
            if let Some(n) = next {
                offset = offset.max(n);
            }
            if offset >= hw {
                return Ok(out);
            }
            if offset == before {
                bail!("Fetch {topic}/{partition} at {offset} made no progress (hw {hw})");
            }
        }
    }
}

/// What [`KafkaClient::read_committed`] read.
#[derive(Debug, Clone)]
pub struct CommittedRead {
    /// The records a read_committed consumer gets, in log order.
    pub records: Vec<FetchedRecord>,
    pub last_stable_offset: i64,
    /// Aborted transactions the broker listed: (producer id, first offset).
    pub aborted: Vec<(i64, i64)>,
}

impl CommittedRead {
    /// `(offset, value)` of every record, values as UTF-8 (lossy).
    pub fn values(&self) -> Vec<(i64, String)> {
        self.records
            .iter()
            .map(FetchedRecord::offset_value)
            .collect()
    }
}

/// `TopicName` from a `&str`.
pub fn topic_name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

/// A Produce request for one partition (timeout 30 s).
pub fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

/// A full (sessionless) Fetch request for one partition.
pub fn fetch_request(
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
    min_bytes: i32,
) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(min_bytes)
        .with_max_bytes(16 * 1024 * 1024)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(4 * 1024 * 1024)])])
}
