//! Consumer groups from the outside: the classic group protocol and
//! (transactional) offset commits spoken by hand with [`KafkaClient`], where
//! a group's coordinator lives, librdkafka group consumers, and the
//! `samsa demo eos-attempt` process the SIGKILL / zombie tests drive.
//!
//! The raw requests exist to see exactly what the coordinator answers a
//! member that is stale (old generation, unknown member id, fenced static
//! instance); real clients are exercised through librdkafka and Python.
//! Everything here is blocking.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::consumer_protocol_assignment::{
    ConsumerProtocolAssignment, TopicPartition as AssignedPartitions,
};
use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment};
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequest, TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{ApiKey, GroupId, ProducerId, TransactionalId};
use kafka_protocol::protocol::{Encodable, StrBytes};
use rdkafka::config::ClientConfig;

use crate::client::{topic_name, KafkaClient};
use crate::codes::*;
use crate::node::{has_setpriv, samsa_bin};
use crate::txn::{java_string_hash, kafka_abs, retry_coordinator};

/// The internal topic that holds group metadata and committed offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Its partition count unless a test changes `offsets.topic.num.partitions`.
pub const OFFSETS_PARTITIONS: i32 = 50;
/// FindCoordinator key type of a consumer group.
pub const KEY_TYPE_GROUP: i8 = 0;
/// The smallest `session.timeout.ms` Kafka accepts by default
/// (`group.min.session.timeout.ms`).
pub const MIN_SESSION_TIMEOUT_MS: i32 = 6000;

/// The `__consumer_offsets` partition that coordinates `group`:
/// `Utils.abs(group.hashCode()) % partitions`, as Kafka places it.
pub fn offsets_partition(group: &str, partitions: i32) -> i32 {
    kafka_abs(java_string_hash(group)) % partitions
}

/// A `ConsumerProtocolSubscription` v0 for `topics`, with its version
/// prefix: the member metadata a Java or librdkafka consumer sends in
/// JoinGroup for protocol type "consumer".
pub fn consumer_subscription(topics: &[&str]) -> Bytes {
    let s = ConsumerProtocolSubscription::default().with_topics(
        topics
            .iter()
            .map(|t| StrBytes::from_string(t.to_string()))
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    s.encode(&mut buf, 0).expect("encode subscription");
    buf.freeze()
}

/// A `ConsumerProtocolAssignment` v0 of `partitions` of `topic`, with its
/// version prefix (what a group leader hands out in SyncGroup).
pub fn consumer_assignment(topic: &str, partitions: &[i32]) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        AssignedPartitions::default()
            .with_topic(topic_name(topic))
            .with_partitions(partitions.to_vec()),
    ]);
    let mut buf = BytesMut::new();
    buf.put_i16(0);
    a.encode(&mut buf, 0).expect("encode assignment");
    buf.freeze()
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

fn opt_str(s: Option<&str>) -> Option<StrBytes> {
    s.map(|s| StrBytes::from_string(s.to_string()))
}

/// One partition of an OffsetFetch answer: (partition, committed offset
/// or -1, error code).
pub type FetchedOffset = (i32, i64, i16);

/// Who sends a group request: member id, generation and static instance id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRef {
    pub member_id: String,
    pub generation: i32,
    pub instance_id: Option<String>,
}

impl MemberRef {
    /// The member `resp` made of a JoinGroup that succeeded.
    pub fn joined(resp: &JoinGroupResponse, instance_id: Option<&str>) -> MemberRef {
        MemberRef {
            member_id: resp.member_id.to_string(),
            generation: resp.generation_id,
            instance_id: instance_id.map(str::to_string),
        }
    }

    /// The same member at another generation.
    pub fn at_generation(&self, generation: i32) -> MemberRef {
        MemberRef {
            generation,
            ..self.clone()
        }
    }

    /// Another member id at the same generation (instance id kept).
    pub fn with_member_id(&self, member_id: &str) -> MemberRef {
        MemberRef {
            member_id: member_id.to_string(),
            ..self.clone()
        }
    }
}

/// The transactional producer a TxnOffsetCommit speaks for.
#[derive(Debug, Clone)]
pub struct TxnRef {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// JoinGroup parameters of a "consumer" member subscribed to one topic.
#[derive(Debug, Clone)]
pub struct JoinSpec {
    pub group: String,
    pub topic: String,
    pub instance_id: Option<String>,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
}

impl JoinSpec {
    pub fn new(group: &str, topic: &str) -> JoinSpec {
        JoinSpec {
            group: group.to_string(),
            topic: topic.to_string(),
            instance_id: None,
            // Long enough that members of a hand-driven test need no
            // heartbeats between its steps.
            session_timeout_ms: 30_000,
            rebalance_timeout_ms: 30_000,
        }
    }

    pub fn static_member(mut self, instance_id: &str) -> JoinSpec {
        self.instance_id = Some(instance_id.to_string());
        self
    }

    fn request(&self, member_id: &str) -> JoinGroupRequest {
        JoinGroupRequest::default()
            .with_group_id(group_id(&self.group))
            .with_session_timeout_ms(self.session_timeout_ms)
            .with_rebalance_timeout_ms(self.rebalance_timeout_ms)
            .with_member_id(StrBytes::from_string(member_id.to_string()))
            .with_group_instance_id(opt_str(self.instance_id.as_deref()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(consumer_subscription(&[&self.topic]))])
    }
}

impl KafkaClient {
    /// Sends one JoinGroup as `member_id` without waiting for the answer
    /// (JoinGroup blocks until the rebalance completes); returns the
    /// correlation id and version for [`KafkaClient::recv_join_group`].
    pub fn send_join_group(&mut self, spec: &JoinSpec, member_id: &str) -> Result<(i32, i16)> {
        let version = self.version_for(ApiKey::JoinGroup)?;
        let corr = self.send_only(&spec.request(member_id), version)?;
        Ok((corr, version))
    }

    /// The answer to [`KafkaClient::send_join_group`].
    pub fn recv_join_group(&mut self, (corr, version): (i32, i16)) -> Result<JoinGroupResponse> {
        self.recv::<JoinGroupRequest>(corr, version)
    }

    /// One JoinGroup as `member_id`, answered whatever its error code.
    pub fn join_group_once(
        &mut self,
        spec: &JoinSpec,
        member_id: &str,
    ) -> Result<JoinGroupResponse> {
        let pending = self.send_join_group(spec, member_id)?;
        self.recv_join_group(pending)
    }

    /// Joins as a new member: an empty member id first, then (v4+, dynamic
    /// members) the id the coordinator hands out with MEMBER_ID_REQUIRED.
    /// Retries while the coordinator loads. Returns the final answer
    /// whatever its error code.
    pub fn join_group(&mut self, spec: &JoinSpec) -> Result<JoinGroupResponse> {
        let (code, first) = retry_coordinator("JoinGroup", Duration::from_secs(30), || {
            let r = self.join_group_once(spec, "")?;
            Ok((r.error_code, r))
        })?;
        if code != MEMBER_ID_REQUIRED {
            return Ok(first);
        }
        let member_id = first.member_id.to_string();
        self.join_group_once(spec, &member_id)
    }

    /// SyncGroup; `assignments` (member id, assignment bytes) is what a
    /// leader sends, empty for a follower.
    pub fn sync_group(
        &mut self,
        group: &str,
        member: &MemberRef,
        assignments: &[(String, Bytes)],
    ) -> Result<SyncGroupResponse> {
        let req = SyncGroupRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id(member.generation)
            .with_member_id(StrBytes::from_string(member.member_id.clone()))
            .with_group_instance_id(opt_str(member.instance_id.as_deref()))
            .with_protocol_type(Some(StrBytes::from_static_str("consumer")))
            .with_protocol_name(Some(StrBytes::from_static_str("range")))
            .with_assignments(
                assignments
                    .iter()
                    .map(|(m, a)| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(StrBytes::from_string(m.clone()))
                            .with_assignment(a.clone())
                    })
                    .collect(),
            );
        self.call(&req)
    }

    /// Heartbeat; returns its error code.
    pub fn heartbeat(&mut self, group: &str, member: &MemberRef) -> Result<i16> {
        let req = HeartbeatRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id(member.generation)
            .with_member_id(StrBytes::from_string(member.member_id.clone()))
            .with_group_instance_id(opt_str(member.instance_id.as_deref()));
        Ok(self.call(&req)?.error_code)
    }

    /// LeaveGroup of one member (v3+ batched form); returns the top-level
    /// error code, or the member's if the top level is NONE.
    pub fn leave_group(&mut self, group: &str, member: &MemberRef) -> Result<i16> {
        let version = self.version_for(ApiKey::LeaveGroup)?;
        let mut req = LeaveGroupRequest::default().with_group_id(group_id(group));
        if version >= 3 {
            req.members = vec![MemberIdentity::default()
                .with_member_id(StrBytes::from_string(member.member_id.clone()))
                .with_group_instance_id(opt_str(member.instance_id.as_deref()))];
        } else {
            req.member_id = StrBytes::from_string(member.member_id.clone());
        }
        let resp = self.send(&req, version)?;
        if resp.error_code != NONE {
            return Ok(resp.error_code);
        }
        Ok(resp.members.first().map(|m| m.error_code).unwrap_or(NONE))
    }

    /// OffsetCommit of `offsets` (partition, offset) of `topic` as `member`
    /// (generation -1 and an empty member id for a simple, group-less
    /// commit); returns each partition's error code.
    pub fn offset_commit(
        &mut self,
        group: &str,
        member: &MemberRef,
        topic: &str,
        offsets: &[(i32, i64)],
    ) -> Result<Vec<(i32, i16)>> {
        let version = self.version_for(ApiKey::OffsetCommit)?;
        self.offset_commit_at(group, member, topic, offsets, version)
    }

    /// [`KafkaClient::offset_commit`] at an explicit version.
    pub fn offset_commit_at(
        &mut self,
        group: &str,
        member: &MemberRef,
        topic: &str,
        offsets: &[(i32, i64)],
        version: i16,
    ) -> Result<Vec<(i32, i16)>> {
        let req = OffsetCommitRequest::default()
            .with_group_id(group_id(group))
            .with_generation_id_or_member_epoch(member.generation)
            .with_member_id(StrBytes::from_string(member.member_id.clone()))
            .with_group_instance_id(opt_str(member.instance_id.as_deref()))
            .with_retention_time_ms(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|&(p, o)| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(o)
                                .with_committed_leader_epoch(-1)
                        })
                        .collect(),
                )]);
        let resp = self.send(&req, version)?;
        Ok(resp
            .topics
            .into_iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions)
            .map(|p| (p.partition_index, p.error_code))
            .collect())
    }

    /// OffsetFetch of `partitions` of `topic` (the single-group form below
    /// v8, the batched one from v8 on). Returns the group-level error code
    /// and (partition, committed offset, error code) per partition; offset
    /// -1 means nothing committed. `require_stable` asks the coordinator to
    /// answer UNSTABLE_OFFSET_COMMIT while a transactional commit is pending.
    pub fn offset_fetch(
        &mut self,
        group: &str,
        topic: &str,
        partitions: &[i32],
        require_stable: bool,
    ) -> Result<(i16, Vec<FetchedOffset>)> {
        let version = self.version_for(ApiKey::OffsetFetch)?;
        if require_stable && version < 7 {
            bail!("OffsetFetch v{version} has no require_stable");
        }
        let mut req = OffsetFetchRequest::default();
        if version >= 7 {
            req.require_stable = require_stable;
        }
        if version >= 8 {
            req.groups = vec![OffsetFetchRequestGroup::default()
                .with_group_id(group_id(group))
                .with_topics(Some(vec![OffsetFetchRequestTopics::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(partitions.to_vec())]))];
        } else {
            req.group_id = group_id(group);
            req.topics = Some(vec![OffsetFetchRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(partitions.to_vec())]);
        }
        let resp = self.send(&req, version)?;
        if version >= 8 {
            let g = resp
                .groups
                .into_iter()
                .find(|g| g.group_id.0.as_str() == group)
                .ok_or_else(|| anyhow!("OffsetFetch response lacks group {group}"))?;
            let parts = g
                .topics
                .into_iter()
                .filter(|t| t.name.0.as_str() == topic)
                .flat_map(|t| t.partitions)
                .map(|p| (p.partition_index, p.committed_offset, p.error_code))
                .collect();
            Ok((g.error_code, parts))
        } else {
            let parts = resp
                .topics
                .into_iter()
                .filter(|t| t.name.0.as_str() == topic)
                .flat_map(|t| t.partitions)
                .map(|p| (p.partition_index, p.committed_offset, p.error_code))
                .collect();
            Ok((resp.error_code, parts))
        }
    }

    /// The committed offset of one partition (-1 if none), failing on any
    /// error code (require_stable off: a pending transactional commit is
    /// not visible and does not block).
    pub fn committed_offset(&mut self, group: &str, topic: &str, partition: i32) -> Result<i64> {
        let (code, parts) = self.offset_fetch(group, topic, &[partition], false)?;
        if code != NONE {
            bail!("OffsetFetch {group}: group error {code}");
        }
        match parts.as_slice() {
            [(p, offset, NONE)] if *p == partition => Ok(*offset),
            other => bail!("OffsetFetch {group} {topic}/{partition}: {other:?}"),
        }
    }

    /// AddOffsetsToTxn (transaction version 1: the producer adds the group's
    /// offsets partition before TxnOffsetCommit); returns its error code.
    pub fn add_offsets_to_txn(&mut self, txn: &TxnRef, group: &str) -> Result<i16> {
        let req = AddOffsetsToTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                txn.transactional_id.clone(),
            )))
            .with_producer_id(ProducerId(txn.producer_id))
            .with_producer_epoch(txn.producer_epoch)
            .with_group_id(group_id(group));
        Ok(self.call(&req)?.error_code)
    }

    /// TxnOffsetCommit of `offsets` of `topic` for `txn` as `member`, at
    /// `version` (3 or 4 carry the member fields and need AddOffsetsToTxn
    /// first; 5 adds the group implicitly). Returns each partition's code.
    pub fn txn_offset_commit(
        &mut self,
        txn: &TxnRef,
        group: &str,
        member: &MemberRef,
        topic: &str,
        offsets: &[(i32, i64)],
        version: i16,
    ) -> Result<Vec<(i32, i16)>> {
        let req = TxnOffsetCommitRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(
                txn.transactional_id.clone(),
            )))
            .with_group_id(group_id(group))
            .with_producer_id(ProducerId(txn.producer_id))
            .with_producer_epoch(txn.producer_epoch)
            .with_generation_id(member.generation)
            .with_member_id(StrBytes::from_string(member.member_id.clone()))
            .with_group_instance_id(opt_str(member.instance_id.as_deref()))
            .with_topics(vec![TxnOffsetCommitRequestTopic::default()
                .with_name(topic_name(topic))
                .with_partitions(
                    offsets
                        .iter()
                        .map(|&(p, o)| {
                            TxnOffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(o)
                                .with_committed_leader_epoch(-1)
                        })
                        .collect(),
                )]);
        let resp = self.send(&req, version)?;
        Ok(resp
            .topics
            .into_iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions)
            .map(|p| (p.partition_index, p.error_code))
            .collect())
    }

    /// A connection to the coordinator of `group`: FindCoordinator (retried
    /// while the coordinator is not available yet), then the broker's
    /// address from Metadata.
    pub fn group_coordinator(&mut self, group: &str) -> Result<KafkaClient> {
        let (code, node) = retry_coordinator("FindCoordinator", Duration::from_secs(60), || {
            self.find_coordinator(KEY_TYPE_GROUP, group)
        })?;
        if code != NONE {
            bail!("FindCoordinator(group {group}): error {code}");
        }
        let md = self.metadata(Some(&[]))?;
        let b = md
            .brokers
            .iter()
            .find(|b| b.node_id.0 == node)
            .ok_or_else(|| anyhow!("coordinator {node} of {group} is not in Metadata"))?;
        let addr: std::net::SocketAddr = format!("{}:{}", b.host, b.port)
            .parse()
            .with_context(|| format!("address of broker {node}"))?;
        KafkaClient::connect(addr)
    }
}

/// Polls the coordinator of `group` until the committed offset of
/// `topic`/`partition` is `expected` (-1: none); returns the last answer
/// otherwise. Committed transactional offsets become visible when the
/// COMMIT marker reaches the offsets partition, a moment after EndTxn.
pub fn wait_committed_offset(
    bootstrap: &mut KafkaClient,
    group: &str,
    topic: &str,
    partition: i32,
    expected: i64,
    timeout: Duration,
) -> std::result::Result<i64, String> {
    let mut last = String::new();
    crate::wait::try_wait_until(timeout, || {
        match bootstrap
            .group_coordinator(group)
            .and_then(|mut c| c.committed_offset(group, topic, partition))
        {
            Ok(o) if o == expected => return Some(o),
            Ok(o) => last = format!("committed offset {o}"),
            Err(e) => last = format!("{e:#}"),
        }
        None
    })
    .ok_or(last)
}

/// A librdkafka consumer-group member as the seed's consume-transform-
/// produce loop configures it: no auto-commit (offsets go through the
/// transaction), read_committed, from the earliest offset when the group
/// has none, and the shortest session Kafka allows so that a dead member
/// is noticed in seconds.
pub fn group_consumer_config(bootstrap: &str, group: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", MIN_SESSION_TIMEOUT_MS.to_string())
        .set("heartbeat.interval.ms", "500")
        .set("fetch.wait.max.ms", "100")
        .set("broker.address.family", "v4");
    c
}

/// A `samsa demo eos-attempt` child process (one consume-transform-produce
/// transaction in its own process), with its stdout read line by line on
/// a thread so that the test can wait for a marker line.
pub struct AttemptProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Every stdout line seen so far.
    pub output: Vec<String>,
}

/// Arguments of one `samsa demo eos-attempt`.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub bootstrap: String,
    pub input: String,
    pub output: String,
    pub group: String,
    pub transactional_id: String,
    /// Label written into each output value ("A", "B", …).
    pub name: String,
    pub records: usize,
    /// `ready-to-commit` or `produced`: print the marker and wait for a
    /// line on stdin before going on.
    pub wait_at: Option<&'static str>,
}

impl Attempt {
    pub fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = [
            "demo",
            "eos-attempt",
            "--bootstrap-server",
            &self.bootstrap,
            "--input",
            &self.input,
            "--output",
            &self.output,
            "--group",
            &self.group,
            "--transactional-id",
            &self.transactional_id,
            "--name",
            &self.name,
            "--records",
            &self.records.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(w) = self.wait_at {
            a.push("--wait-at".into());
            a.push(w.into());
        }
        a
    }

    /// Spawns the attempt (killed with the test: `PR_SET_PDEATHSIG` via
    /// setpriv when available, and on drop).
    pub fn spawn(&self) -> AttemptProcess {
        let bin = samsa_bin();
        let mut cmd = if has_setpriv() {
            let mut c = Command::new("setpriv");
            c.arg("--pdeathsig").arg("KILL").arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd
            .args(self.args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        let name = self.name.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                eprintln!("[attempt {name}] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        AttemptProcess {
            child,
            stdin,
            lines: rx,
            output: Vec::new(),
        }
    }
}

impl AttemptProcess {
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"))
    }

    /// Reads stdout until a line starts with `marker`; returns it. Fails if
    /// the process exits (its stdout closes) first or `timeout` passes.
    pub fn wait_for_line(&mut self, marker: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.output.push(line.clone());
                    if line.starts_with(marker) {
                        return Ok(line);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!(
                        "no line starting with {marker} within {timeout:?}; output so far: {:?}",
                        self.output
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!(
                        "the attempt exited before printing {marker}; output: {:?}",
                        self.output
                    )
                }
            }
        }
    }

    /// Lets a process waiting at its `--wait-at` marker go on.
    pub fn go_on(&mut self) -> Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| anyhow!("stdin closed"))?;
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
        Ok(())
    }

    /// SIGKILL, then reap: the exit status (signal 9).
    pub fn sigkill(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait for the attempt")
    }

    /// Waits for the process to exit; collects the rest of its stdout.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                // The pipe closes at exit; drain what is left.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.output.push(line);
                }
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                bail!(
                    "the attempt did not exit within {timeout:?}; output: {:?}",
                    self.output
                );
            }
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(50)) {
                self.output.push(line);
            }
        }
    }
}

impl Drop for AttemptProcess {
    fn drop(&mut self) {
        // A SIGSTOPped process must be continued to die of SIGKILL promptly.
        let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
