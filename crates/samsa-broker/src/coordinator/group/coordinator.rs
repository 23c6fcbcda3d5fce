//! [`GroupCoordinator`]: the classic group protocol, committed offsets and
//! ownership of `__consumer_offsets` partitions. See the [module docs](super)
//! for the contract with the shell.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::{
    HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::StrBytes;
use tracing::{debug, info};

use super::records::{
    commit_offsets, group_metadata_record, offset_record, LoadedGroup, LoggedOffset,
    OffsetAndMetadata, StoredGroup, StoredMember,
};
use super::GroupState;
use crate::coordinator::placement::{coordinator_partition, LedByImage, CONSUMER_OFFSETS_TOPIC};
use crate::coordinator::{
    illegal_transition, AppendResult, Coordinator, LogEntry, ProducerIdSource, StateRecord, Step,
    TransactionalWrite, Write, WriteId, WriteIds,
};
use crate::error::txn_append_error_code;

/// Tunables, with Kafka's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `offsets.topic.num.partitions`: the `N` of group placement.
    pub offsets_partitions: i32,
    /// `group.initial.rebalance.delay.ms`.
    pub initial_rebalance_delay_ms: i32,
    /// `group.min.session.timeout.ms`.
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub max_session_timeout_ms: i32,
    /// `group.max.size`.
    pub max_size: usize,
    /// `offset.metadata.max.bytes`.
    pub offset_metadata_max_bytes: usize,
    /// `offsets.retention.minutes` in ms: how long the offsets of a group
    /// without members outlive it (see [`GroupCoordinator::tick`]).
    pub offsets_retention_ms: i64,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: i64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            offsets_partitions: 50,
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            max_size: i32::MAX as usize,
            offset_metadata_max_bytes: 4096,
            offsets_retention_ms: 7 * 24 * 3600 * 1000,
            offsets_retention_check_interval_ms: 600_000,
        }
    }
}

/// Identifies one waiting request: the shell picks a fresh token per
/// request and delivers to it the [`Reply`] a later [`GroupStep`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub u64);

/// The answer to a waiting request.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Join(JoinGroupResponse),
    Sync(SyncGroupResponse),
    /// Per partition: `None` committed, or the error.
    Commit(Vec<PartitionResult>),
    /// The outcome of deleting one group.
    Deleted(Option<ResponseError>),
}

/// A partition of an offset commit or delete and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub topic: String,
    pub partition: i32,
    pub error: Option<ResponseError>,
}

/// What a call asks of the shell: replies to deliver now, writes to persist.
#[derive(Debug, Default, PartialEq)]
pub struct GroupStep {
    pub deliveries: Vec<(Token, Reply)>,
    pub writes: Vec<Write>,
}

impl GroupStep {
    fn reply(token: Token, reply: Reply) -> Self {
        GroupStep {
            deliveries: vec![(token, reply)],
            writes: Vec::new(),
        }
    }

    fn merge(&mut self, other: GroupStep) {
        self.deliveries.extend(other.deliveries);
        self.writes.extend(other.writes);
    }
}

impl Step for GroupStep {
    fn take_writes(&mut self) -> Vec<Write> {
        std::mem::take(&mut self.writes)
    }

    fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }
}

/// Who sent a request, for the member list of DescribeGroups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub client_id: String,
    pub client_host: String,
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Vec<u8>,
    pub assignment: Vec<u8>,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

/// A group as ListGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: GroupState,
}

/// One partition of an OffsetFetch answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: i32,
    /// `None`: nothing committed.
    pub offset: Option<OffsetAndMetadata>,
    pub error: Option<ResponseError>,
}

/// An offset to commit, as the wire gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPartition {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// OffsetCommit, or TxnOffsetCommit without its producer fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub partitions: Vec<CommitPartition>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Parked {
    token: Token,
    version: i16,
}

#[derive(Debug, Clone)]
struct Member {
    id: String,
    instance_id: Option<String>,
    client: ClientInfo,
    rebalance_timeout_ms: i32,
    session_timeout_ms: i32,
    /// In the member's order of preference.
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    join: Option<Parked>,
    sync: Option<Parked>,
    session_deadline: i64,
    /// Order of joining, for picking a leader the way Kafka does (the
    /// first member to join).
    joined_seq: u64,
}

impl Member {
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    fn keeps_alive(&self) -> bool {
        self.join.is_some() || self.sync.is_some()
    }

    fn same_protocols(&self, protocols: &[(String, Bytes)]) -> bool {
        self.protocols == protocols
    }
}

#[derive(Debug)]
struct Group {
    id: String,
    partition: i32,
    state: GroupState,
    state_since: i64,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// group.instance.id → member id.
    static_members: BTreeMap<String, String>,
    /// KIP-394: member ids handed out with MEMBER_ID_REQUIRED, not yet
    /// joined, and until when they may come back.
    pending_members: BTreeMap<String, i64>,
    /// PreparingRebalance: when the join phase ends regardless;
    /// CompletingRebalance: when members without a SyncGroup are dropped.
    rebalance_deadline: i64,
    /// The initial delay of a group that was empty (Kafka's
    /// `InitialDelayedJoin`): time left to extend by, and whether a member
    /// joined since the last extension.
    initial_delay: Option<InitialDelay>,
    /// The write of the leader's assignment, while in flight.
    assignment_write: Option<WriteId>,
    offsets: BTreeMap<(String, i32), LoggedOffset>,
    /// Plain commits not yet durable (OffsetFetch `require_stable`).
    pending_commits: BTreeMap<(String, i32), u32>,
    /// Durable transactional offsets waiting for their producer's marker.
    pending_txn: BTreeMap<i64, BTreeMap<(String, i32), LoggedOffset>>,
    next_join_seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct InitialDelay {
    remaining_ms: i64,
    joined_since: bool,
}

impl Group {
    fn new(id: String, partition: i32, now_ms: i64) -> Self {
        Group {
            id,
            partition,
            state: GroupState::Empty,
            state_since: now_ms,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            pending_members: BTreeMap::new(),
            rebalance_deadline: 0,
            initial_delay: None,
            assignment_write: None,
            offsets: BTreeMap::new(),
            pending_commits: BTreeMap::new(),
            pending_txn: BTreeMap::new(),
            next_join_seq: 0,
        }
    }

    /// Moves to `to` if the table of [`GroupState`] allows it; otherwise
    /// refuses (the one policy, [`illegal_transition`]) and stays.
    fn transition(&mut self, to: GroupState, now_ms: i64) {
        if !self.state.can_transition_to(to) {
            let _ = illegal_transition(&self.id, &self.state, &to);
            return;
        }
        if self.state != to {
            debug!(group = %self.id, from = ?self.state, to = ?to, generation = self.generation, "group state");
        }
        self.state = to;
        self.state_since = now_ms;
    }

    /// Protocols every member supports, in the order of the first member's preference.
    fn candidate_protocols(&self) -> Vec<String> {
        let mut members = self.members.values();
        let Some(first) = members.next() else {
            return Vec::new();
        };
        let mut candidates: Vec<String> = first.protocols.iter().map(|(n, _)| n.clone()).collect();
        for m in members {
            candidates.retain(|c| m.protocols.iter().any(|(n, _)| n == c));
        }
        candidates
    }

    /// Whether a member with `protocols` could join: same protocol type
    /// and at least one protocol in common with every member.
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if self.members.is_empty() {
            return !protocol_type.is_empty() && !protocols.is_empty();
        }
        if self.protocol_type.as_deref() != Some(protocol_type) {
            return false;
        }
        let candidates = self.candidate_protocols();
        protocols.iter().any(|(n, _)| candidates.contains(n))
    }

    /// Kafka's vote: each member picks its most preferred candidate, the
    /// most picked wins (ties to the first member's preference).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidate_protocols();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some((name, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(n)) {
                *votes.entry(name.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max()?;
        candidates
            .into_iter()
            .find(|c| votes.get(c.as_str()) == Some(&best))
    }

    fn all_joined(&self) -> bool {
        self.pending_members.is_empty() && self.members.values().all(|m| m.join.is_some())
    }

    fn max_rebalance_timeout(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    /// The partitions whose offsets are past retention at `now` (see
    /// [`GroupCoordinator::expire_offsets`]).
    fn expired_offsets(&self, now: i64, retention_ms: i64) -> Vec<(String, i32)> {
        enum Since {
            BecameEmpty(i64),
            Commit,
        }
        let (since, subscribed) = match (&self.protocol_type, self.state) {
            (Some(_), GroupState::Empty) => (Since::BecameEmpty(self.state_since), None),
            (Some(t), GroupState::Stable) if t == "consumer" => match self.subscribed_topics() {
                Some(topics) => (Since::Commit, Some(topics)),
                None => return Vec::new(),
            },
            (None, _) => (Since::Commit, None),
            _ => return Vec::new(),
        };
        self.offsets
            .iter()
            .filter(|(tp, o)| {
                let base = match since {
                    Since::BecameEmpty(t) => t,
                    Since::Commit => o.value.commit_timestamp,
                };
                now.saturating_sub(base) >= retention_ms
                    && subscribed.as_ref().is_none_or(|s| !s.contains(&tp.0))
                    && !self.pending_commits.contains_key(*tp)
                    && !self.pending_txn.values().any(|p| p.contains_key(*tp))
            })
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    fn stored(&self) -> StoredGroup {
        let protocol = self.protocol.clone().unwrap_or_default();
        StoredGroup {
            protocol_type: self.protocol_type.clone(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_timestamp: self.state_since,
            members: self
                .members
                .values()
                .map(|m| StoredMember {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client.client_id.clone(),
                    client_host: m.client.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata_for(&protocol).to_vec(),
                    assignment: m.assignment.to_vec(),
                })
                .collect(),
        }
    }

    /// Topics the members subscribe to, if the group uses the consumer
    /// protocol and every subscription parses; `None`: unknown (treat every
    /// topic as subscribed).
    fn subscribed_topics(&self) -> Option<BTreeSet<String>> {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::Decodable;
        if self.protocol_type.as_deref() != Some("consumer") {
            return Some(BTreeSet::new());
        }
        let protocol = self.protocol.as_deref()?;
        let mut topics = BTreeSet::new();
        for m in self.members.values() {
            let mut metadata = m.metadata_for(protocol);
            if metadata.len() < 2 {
                return None;
            }
            let version = i16::from_be_bytes([metadata[0], metadata[1]]);
            let _ = bytes::Buf::get_i16(&mut metadata);
            let version = version.clamp(0, 3);
            let subscription = ConsumerProtocolSubscription::decode(&mut metadata, version).ok()?;
            topics.extend(subscription.topics.iter().map(|t| t.to_string()));
        }
        Some(topics)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionStatus {
    Loading { epoch: i32 },
    Loaded { epoch: i32 },
}

impl PartitionStatus {
    fn epoch(self) -> i32 {
        match self {
            PartitionStatus::Loading { epoch } | PartitionStatus::Loaded { epoch } => epoch,
        }
    }
}

/// Offsets to write, by (topic, partition).
type CommitOffsets = Vec<((String, i32), OffsetAndMetadata)>;

#[derive(Debug)]
enum WriteKind {
    /// A leader's assignment for `generation`.
    Assignment {
        generation: i32,
    },
    /// Group metadata nobody waits for.
    Metadata,
    Commit {
        token: Token,
        offsets: CommitOffsets,
        /// Partitions refused before the write, answered with the rest.
        refused: Vec<PartitionResult>,
        /// `Some(producer id)` for offsets in a transaction.
        producer_id: Option<i64>,
    },
    DeleteGroup {
        token: Token,
    },
    /// The metadata naming a static member's new member id (Stable group,
    /// no rebalance); the JoinGroup answer waits for it.
    StaticRejoin {
        token: Token,
        version: i16,
        response: Box<JoinGroupResponse>,
        /// The member as it was under its old id.
        previous: Box<Member>,
        new_id: String,
        was_leader: bool,
    },
    DeleteOffsets {
        token: Token,
        partitions: Vec<(String, i32)>,
        refused: Vec<PartitionResult>,
    },
}

#[derive(Debug)]
struct PendingWrite {
    group: String,
    kind: WriteKind,
}

/// Writes handed to the shell and not yet reported back.
#[derive(Debug, Default)]
struct Writes {
    ids: WriteIds,
    pending: BTreeMap<WriteId, PendingWrite>,
}

impl Writes {
    fn add(
        &mut self,
        group: &Group,
        epoch: i32,
        records: Vec<StateRecord>,
        kind: WriteKind,
    ) -> Write {
        let id = self.ids.next_id();
        self.pending.insert(
            id,
            PendingWrite {
                group: group.id.clone(),
                kind,
            },
        );
        Write {
            id,
            owner: group.id.clone(),
            partition: group.partition,
            coordinator_epoch: epoch,
            records,
            transactional: None,
        }
    }
}

/// What group-level steps need besides the group.
struct Ctx<'a> {
    config: &'a GroupConfig,
    writes: &'a mut Writes,
    epoch: i32,
    now_ms: i64,
    step: GroupStep,
}

/// The group coordinator of one broker: every group of the
/// `__consumer_offsets` partitions it leads.
#[derive(Debug)]
pub struct GroupCoordinator {
    config: GroupConfig,
    partitions: BTreeMap<i32, PartitionStatus>,
    groups: BTreeMap<String, Group>,
    writes: Writes,
    /// Makes member ids unique across coordinators and restarts (the shell
    /// picks it at random; Kafka uses a random UUID per member).
    member_id_seed: u64,
    next_member: u64,
    /// Markers that reached a partition while it was loading.
    markers_while_loading: BTreeMap<i32, Vec<(i64, bool)>>,
    led_by_image: LedByImage,
    /// When [`Self::tick`] next expires offsets (0: at the first tick,
    /// which only schedules the first check an interval later).
    retention_check_at: i64,
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

fn join_error(version: i16, error: ResponseError, member_id: &str) -> JoinGroupResponse {
    JoinGroupResponse::default()
        .with_error_code(error.code())
        .with_generation_id(-1)
        .with_protocol_name(if version >= 7 {
            None
        } else {
            Some(str_bytes(""))
        })
        .with_leader(str_bytes(""))
        .with_member_id(str_bytes(member_id))
}

fn sync_error(error: ResponseError) -> SyncGroupResponse {
    SyncGroupResponse::default().with_error_code(error.code())
}

/// A failed append, as the group APIs answer it.
fn commit_append_error(error: ResponseError) -> ResponseError {
    match error {
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => {
            ResponseError::InvalidCommitOffsetSize
        }
        other => txn_append_error_code(other),
    }
}

struct JoinArgs {
    token: Token,
    version: i16,
    member_id: String,
    instance_id: Option<String>,
    client: ClientInfo,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
}

impl GroupCoordinator {
    pub fn new(config: GroupConfig, member_id_seed: u64) -> Self {
        GroupCoordinator {
            config,
            partitions: BTreeMap::new(),
            groups: BTreeMap::new(),
            writes: Writes::default(),
            member_id_seed,
            next_member: 0,
            markers_while_loading: BTreeMap::new(),
            led_by_image: LedByImage::default(),
            retention_check_at: 0,
        }
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// Whether the group's partition is loaded here: NOT_COORDINATOR if
    /// not held, COORDINATOR_LOAD_IN_PROGRESS while loading or while the
    /// metadata image says it is led here but its load has not begun.
    fn owner(&self, group_id: &str) -> Result<i32, ResponseError> {
        let p = self.partition_for(group_id);
        match self.partitions.get(&p) {
            None => Err(self.led_by_image.unheld_error(p)),
            Some(PartitionStatus::Loading { .. }) => Err(ResponseError::CoordinatorLoadInProgress),
            Some(PartitionStatus::Loaded { epoch }) => Ok(*epoch),
        }
    }

    /// The loaded group and the context to change it in.
    fn group_ctx(
        &mut self,
        group_id: &str,
        now_ms: i64,
    ) -> Result<(&mut Group, Ctx<'_>), ResponseError> {
        let epoch = self.owner(group_id)?;
        let group = self
            .groups
            .get_mut(group_id)
            .ok_or(ResponseError::UnknownMemberId)?;
        Ok((
            group,
            Ctx {
                config: &self.config,
                writes: &mut self.writes,
                epoch,
                now_ms,
                step: GroupStep::default(),
            },
        ))
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        format!(
            "{client_id}-{:016x}-{:x}",
            self.member_id_seed, self.next_member
        )
    }

    // ---- ownership -------------------------------------------------------

    fn drop_partition(&mut self, p: i32) -> GroupStep {
        let mut step = GroupStep::default();
        let names: Vec<String> = self
            .groups
            .values()
            .filter(|g| g.partition == p)
            .map(|g| g.id.clone())
            .collect();
        for name in names {
            if let Some(group) = self.groups.remove(&name) {
                for m in group.members.values() {
                    fail_parked(&mut step, m, ResponseError::NotCoordinator);
                }
            }
        }
        step
    }

    // ---- JoinGroup -------------------------------------------------------

    pub fn join_group(
        &mut self,
        token: Token,
        request: &JoinGroupRequest,
        version: i16,
        client: ClientInfo,
        now_ms: i64,
    ) -> GroupStep {
        let member_id = request.member_id.to_string();
        let fail = |e: ResponseError| {
            GroupStep::reply(token, Reply::Join(join_error(version, e, &member_id)))
        };
        let group_id = request.group_id.to_string();
        if group_id.is_empty() {
            return fail(ResponseError::InvalidGroupId);
        }
        if let Err(e) = self.owner(&group_id) {
            return fail(e);
        }
        if request.session_timeout_ms < self.config.min_session_timeout_ms
            || request.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return fail(ResponseError::InvalidSessionTimeout);
        }
        let args = JoinArgs {
            token,
            version,
            member_id: member_id.clone(),
            instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
            protocol_type: request.protocol_type.to_string(),
            protocols: request
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect(),
            session_timeout_ms: request.session_timeout_ms,
            // v0 has no rebalance timeout: it is the session timeout.
            rebalance_timeout_ms: if version >= 1 {
                request.rebalance_timeout_ms
            } else {
                request.session_timeout_ms
            },
            client,
        };
        if !self.groups.contains_key(&group_id) {
            if !args.member_id.is_empty() {
                return fail(ResponseError::UnknownMemberId);
            }
            let p = self.partition_for(&group_id);
            self.groups
                .insert(group_id.clone(), Group::new(group_id.clone(), p, now_ms));
        }
        let fresh_id = args
            .member_id
            .is_empty()
            .then(|| self.new_member_id(&args.client.client_id));
        let (group, mut ctx) = match self.group_ctx(&group_id, now_ms) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        join(group, &mut ctx, args, fresh_id);
        ctx.step
    }

    // ---- SyncGroup -------------------------------------------------------

    pub fn sync_group(
        &mut self,
        token: Token,
        request: &SyncGroupRequest,
        version: i16,
        now_ms: i64,
    ) -> GroupStep {
        let fail = |e: ResponseError| GroupStep::reply(token, Reply::Sync(sync_error(e)));
        let group_id = request.group_id.to_string();
        let (group, mut ctx) = match self.group_ctx(&group_id, now_ms) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let member_id = request.member_id.to_string();
        let instance_id = request.group_instance_id.as_ref().map(|s| s.to_string());
        if let Err(e) = validate_member(group, &member_id, instance_id.as_deref()) {
            return fail(e);
        }
        if request.generation_id != group.generation {
            return fail(ResponseError::IllegalGeneration);
        }
        if request
            .protocol_type
            .as_ref()
            .is_some_and(|pt| group.protocol_type.as_deref() != Some(pt.as_str()))
            || request
                .protocol_name
                .as_ref()
                .is_some_and(|pn| group.protocol.as_deref() != Some(pn.as_str()))
        {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        match group.state {
            GroupState::Empty | GroupState::Dead => fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let Some(m) = group.members.get_mut(&member_id) else {
                    return fail(ResponseError::UnknownMemberId);
                };
                m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
                let assignment = m.assignment.clone();
                GroupStep::reply(token, Reply::Sync(sync_ok(group, version, assignment)))
            }
            GroupState::CompletingRebalance => {
                let is_leader = group.leader.as_deref() == Some(member_id.as_str());
                let Some(m) = group.members.get_mut(&member_id) else {
                    return fail(ResponseError::UnknownMemberId);
                };
                if let Some(old) = m.sync.replace(Parked { token, version }) {
                    ctx.step.deliveries.push((
                        old.token,
                        Reply::Sync(sync_error(ResponseError::RebalanceInProgress)),
                    ));
                }
                m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
                if is_leader && group.assignment_write.is_none() {
                    let mut assignments: BTreeMap<String, Bytes> = request
                        .assignments
                        .iter()
                        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                        .collect();
                    for m in group.members.values_mut() {
                        m.assignment = assignments.remove(&m.id).unwrap_or_default();
                    }
                    let record = group_metadata_record(&group.id, Some(&group.stored()));
                    let generation = group.generation;
                    let write = ctx.writes.add(
                        group,
                        ctx.epoch,
                        vec![record],
                        WriteKind::Assignment { generation },
                    );
                    group.assignment_write = Some(write.id);
                    ctx.step.writes.push(write);
                }
                ctx.step
            }
        }
    }

    // ---- Heartbeat -------------------------------------------------------

    pub fn heartbeat(&mut self, request: &HeartbeatRequest, now_ms: i64) -> Option<ResponseError> {
        let group_id = request.group_id.to_string();
        let (group, _) = match self.group_ctx(&group_id, now_ms) {
            Ok(x) => x,
            Err(e) => return Some(e),
        };
        let member_id = request.member_id.to_string();
        let instance_id = request.group_instance_id.as_ref().map(|s| s.to_string());
        if let Err(e) = validate_member(group, &member_id, instance_id.as_deref()) {
            return Some(e);
        }
        if matches!(group.state, GroupState::Empty | GroupState::Dead) {
            return Some(ResponseError::UnknownMemberId);
        }
        if request.generation_id != group.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        if let Some(m) = group.members.get_mut(&member_id) {
            m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
        }
        (group.state == GroupState::PreparingRebalance)
            .then_some(ResponseError::RebalanceInProgress)
    }

    // ---- LeaveGroup ------------------------------------------------------

    /// LeaveGroup; v3+ leaves a batch of members (by member id and/or
    /// group instance id), older versions one member id.
    pub fn leave_group(
        &mut self,
        request: &LeaveGroupRequest,
        version: i16,
        now_ms: i64,
    ) -> (LeaveGroupResponse, GroupStep) {
        let group_id = request.group_id.to_string();
        let leaving: Vec<(String, Option<String>)> = if version >= 3 {
            request
                .members
                .iter()
                .map(|m| {
                    (
                        m.member_id.to_string(),
                        m.group_instance_id.as_ref().map(|s| s.to_string()),
                    )
                })
                .collect()
        } else {
            vec![(request.member_id.to_string(), None)]
        };
        let top = |e: ResponseError| {
            (
                LeaveGroupResponse::default().with_error_code(e.code()),
                GroupStep::default(),
            )
        };
        let (group, mut ctx) = match self.group_ctx(&group_id, now_ms) {
            Ok(x) => x,
            Err(ResponseError::UnknownMemberId) if version >= 3 => {
                let members = leaving
                    .iter()
                    .map(|(id, instance)| {
                        member_response(
                            id,
                            instance.as_deref(),
                            Some(ResponseError::UnknownMemberId),
                        )
                    })
                    .collect();
                return (
                    LeaveGroupResponse::default().with_members(members),
                    GroupStep::default(),
                );
            }
            Err(e) => return top(e),
        };
        let mut results = Vec::new();
        let mut removed_any = false;
        for (member_id, instance_id) in &leaving {
            let error = leave_one(group, member_id, instance_id.as_deref(), &mut ctx.step);
            removed_any |= error.is_none();
            results.push(member_response(member_id, instance_id.as_deref(), error));
        }
        if removed_any {
            info!(group = %group_id, members = leaving.len(), "members left the group");
            members_changed(group, &mut ctx);
        }
        if version < 3 {
            let code = results.first().map_or(0, |r| r.error_code);
            return (
                LeaveGroupResponse::default().with_error_code(code),
                ctx.step,
            );
        }
        (
            LeaveGroupResponse::default().with_members(results),
            ctx.step,
        )
    }

    // ---- timers ----------------------------------------------------------

    /// Offset retention as Kafka keeps it (KIP-211): the offsets of a group
    /// with no members expire `offsets_retention_ms` after it became Empty
    /// (after their commit, for a group that only stores offsets); a Stable
    /// consumer group loses only the offsets of topics none of its members
    /// subscribes to, `offsets_retention_ms` after their commit. Offsets
    /// with a commit in flight or pending in a transaction stay. An Empty
    /// group left without offsets is deleted. The tombstones are written
    /// like any group write; memory forgets at once (a failed write leaves
    /// the offsets to the next check after a reload).
    pub fn expire_offsets(&mut self, now_ms: i64) -> GroupStep {
        let retention = self.config.offsets_retention_ms;
        let mut step = GroupStep::default();
        let mut deleted = Vec::new();
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        for group_id in ids {
            let Ok((group, mut ctx)) = self.group_ctx(&group_id, now_ms) else {
                continue;
            };
            let expired = group.expired_offsets(now_ms, retention);
            let mut records: Vec<StateRecord> = expired
                .iter()
                .map(|(t, p)| offset_record(&group.id, t, *p, None))
                .collect();
            for tp in &expired {
                group.offsets.remove(tp);
            }
            let empty = group.state == GroupState::Empty
                && group.offsets.is_empty()
                && group.pending_commits.is_empty()
                && group.pending_txn.is_empty()
                && group.assignment_write.is_none();
            if empty {
                records.push(group_metadata_record(&group.id, None));
                deleted.push(group_id.clone());
            }
            if records.is_empty() {
                continue;
            }
            info!(group = %group.id, offsets = expired.len(), deleted = empty, "offsets expired");
            let write = ctx
                .writes
                .add(group, ctx.epoch, records, WriteKind::Metadata);
            ctx.step.writes.push(write);
            step.merge(ctx.step);
        }
        for group_id in deleted {
            self.groups.remove(&group_id);
        }
        step
    }

    // ---- OffsetCommit ----------------------------------------------------

    /// OffsetCommit at API `version`: checks generation and member, then
    /// writes the offsets; the reply is delivered once they are durable.
    pub fn offset_commit(
        &mut self,
        token: Token,
        request: &CommitRequest,
        version: i16,
        now_ms: i64,
    ) -> GroupStep {
        // A group-managed commit for a group this coordinator does not
        // know: v9+ says so (GROUP_ID_NOT_FOUND, meaningful to both group
        // protocols); older clients only understand ILLEGAL_GENERATION.
        let standalone = request.generation_id < 0;
        let unknown_group = if version >= 9 {
            ResponseError::GroupIdNotFound
        } else {
            ResponseError::IllegalGeneration
        };
        match self.commit_context(request, standalone, unknown_group, now_ms) {
            Err(e) => refuse_all(token, request, e),
            Ok((group, mut ctx)) => match validate_commit(
                group,
                request.generation_id,
                &request.member_id,
                request.group_instance_id.as_deref(),
                now_ms,
            ) {
                Err(e) => refuse_all(token, request, e),
                Ok(()) => {
                    write_commit(group, &mut ctx, token, request, None);
                    ctx.step
                }
            },
        }
    }

    /// TxnOffsetCommit: the KIP-447 member checks, then the offsets are
    /// written as a transactional batch of the producer; once durable they
    /// are pending for that producer until its marker reaches the partition
    /// ([`Self::complete_transaction`]).
    pub fn txn_offset_commit(
        &mut self,
        token: Token,
        request: &CommitRequest,
        producer: TransactionalWrite,
        now_ms: i64,
    ) -> GroupStep {
        let standalone = request.generation_id < 0 && request.member_id.is_empty();
        // Every TxnOffsetCommit version answers ILLEGAL_GENERATION there.
        match self.commit_context(
            request,
            standalone,
            ResponseError::IllegalGeneration,
            now_ms,
        ) {
            Err(e) => refuse_all(token, request, e),
            Ok((group, mut ctx)) => match validate_txn_commit(group, request) {
                Err(e) => refuse_all(token, request, e),
                Ok(()) => {
                    write_commit(group, &mut ctx, token, request, Some(producer));
                    ctx.step
                }
            },
        }
    }

    /// The group a commit goes to, created (Empty) for a `standalone`
    /// commit if unknown; `unknown_group` for any other commit to an
    /// unknown group.
    fn commit_context(
        &mut self,
        request: &CommitRequest,
        standalone: bool,
        unknown_group: ResponseError,
        now_ms: i64,
    ) -> Result<(&mut Group, Ctx<'_>), ResponseError> {
        if request.group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        self.owner(&request.group_id)?;
        if !self.groups.contains_key(&request.group_id) {
            if !standalone {
                return Err(unknown_group);
            }
            let p = self.partition_for(&request.group_id);
            self.groups.insert(
                request.group_id.clone(),
                Group::new(request.group_id.clone(), p, now_ms),
            );
        }
        self.group_ctx(&request.group_id, now_ms)
    }

    /// A COMMIT or ABORT marker of `producer_id` reached offsets partition
    /// `p`: its pending offsets there become committed, or are dropped.
    pub fn complete_transaction(&mut self, p: i32, producer_id: i64, commit: bool) {
        if let Some(PartitionStatus::Loading { .. }) = self.partitions.get(&p) {
            // The load may have read the log before this marker: resolve
            // once its groups are installed.
            self.markers_while_loading
                .entry(p)
                .or_default()
                .push((producer_id, commit));
            return;
        }
        for group in self.groups.values_mut().filter(|g| g.partition == p) {
            if let Some(pending) = group.pending_txn.remove(&producer_id) {
                debug!(group = %group.id, producer_id, commit, partitions = pending.len(), "transactional offsets resolved");
                if commit {
                    commit_offsets(&mut group.offsets, pending);
                }
            }
        }
    }

    // ---- OffsetFetch -----------------------------------------------------

    /// The committed offsets of `group_id`: of the given partitions, or of
    /// every partition with an offset when `topics` is `None`. With
    /// `require_stable`, a partition with a commit not yet durable or
    /// transactional offsets awaiting their marker answers
    /// UNSTABLE_OFFSET_COMMIT.
    pub fn offset_fetch(
        &self,
        group_id: &str,
        topics: Option<&[(String, Vec<i32>)]>,
        require_stable: bool,
    ) -> Result<Vec<FetchedOffset>, ResponseError> {
        self.owner(group_id)?;
        let group = self.groups.get(group_id);
        let wanted: Vec<(String, i32)> = match topics {
            Some(topics) => topics
                .iter()
                .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
                .collect(),
            None => group
                .map(|g| g.offsets.keys().cloned().collect())
                .unwrap_or_default(),
        };
        Ok(wanted
            .into_iter()
            .map(|(topic, partition)| {
                let key = (topic, partition);
                let unstable = require_stable
                    && group.is_some_and(|g| {
                        g.pending_commits.contains_key(&key)
                            || g.pending_txn.values().any(|o| o.contains_key(&key))
                    });
                let (topic, partition) = key.clone();
                if unstable {
                    return FetchedOffset {
                        topic,
                        partition,
                        offset: None,
                        error: Some(ResponseError::UnstableOffsetCommit),
                    };
                }
                FetchedOffset {
                    topic,
                    partition,
                    offset: group.and_then(|g| g.offsets.get(&key).map(|o| o.value.clone())),
                    error: None,
                }
            })
            .collect())
    }

    // ---- OffsetDelete ----------------------------------------------------

    /// OffsetDelete: GROUP_ID_NOT_FOUND for an unknown group,
    /// GROUP_SUBSCRIBED_TO_TOPIC for partitions of topics the group's
    /// members subscribe to; the others are tombstoned and the reply comes
    /// once durable.
    pub fn offset_delete(
        &mut self,
        token: Token,
        group_id: &str,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<GroupStep, ResponseError> {
        let (group, mut ctx) = match self.group_ctx(group_id, now_ms) {
            Ok(x) => x,
            Err(ResponseError::UnknownMemberId) => return Err(ResponseError::GroupIdNotFound),
            Err(e) => return Err(e),
        };
        if group.state == GroupState::Dead {
            return Err(ResponseError::GroupIdNotFound);
        }
        let subscribed = if group.state == GroupState::Empty {
            Some(BTreeSet::new())
        } else {
            group.subscribed_topics()
        };
        let mut refused = Vec::new();
        let mut deleting = Vec::new();
        for (topic, partition) in partitions {
            let is_subscribed = subscribed.as_ref().is_none_or(|s| s.contains(topic));
            if is_subscribed {
                refused.push(PartitionResult {
                    topic: topic.clone(),
                    partition: *partition,
                    error: Some(ResponseError::GroupSubscribedToTopic),
                });
            } else if group.offsets.contains_key(&(topic.clone(), *partition)) {
                deleting.push((topic.clone(), *partition));
            } else {
                refused.push(PartitionResult {
                    topic: topic.clone(),
                    partition: *partition,
                    error: None,
                });
            }
        }
        if deleting.is_empty() {
            return Ok(GroupStep::reply(token, Reply::Commit(refused)));
        }
        let records = deleting
            .iter()
            .map(|(t, p)| offset_record(group_id, t, *p, None))
            .collect();
        let write = ctx.writes.add(
            group,
            ctx.epoch,
            records,
            WriteKind::DeleteOffsets {
                token,
                partitions: deleting,
                refused,
            },
        );
        ctx.step.writes.push(write);
        Ok(ctx.step)
    }

    // ---- DeleteGroups ----------------------------------------------------

    /// Deletes one group of a DeleteGroups request: GROUP_ID_NOT_FOUND if
    /// unknown, NON_EMPTY_GROUP while it has members; otherwise its offsets
    /// and metadata are tombstoned and the reply comes once durable.
    pub fn delete_group(&mut self, token: Token, group_id: &str, now_ms: i64) -> GroupStep {
        let fail = |e: ResponseError| GroupStep::reply(token, Reply::Deleted(Some(e)));
        let (group, mut ctx) = match self.group_ctx(group_id, now_ms) {
            Ok(x) => x,
            Err(ResponseError::UnknownMemberId) => return fail(ResponseError::GroupIdNotFound),
            Err(e) => return fail(e),
        };
        match group.state {
            GroupState::Dead => return fail(ResponseError::GroupIdNotFound),
            GroupState::Empty => {}
            _ => return fail(ResponseError::NonEmptyGroup),
        }
        let mut records: Vec<StateRecord> = group
            .offsets
            .keys()
            .map(|(t, p)| offset_record(group_id, t, *p, None))
            .collect();
        records.push(group_metadata_record(group_id, None));
        let write = ctx
            .writes
            .add(group, ctx.epoch, records, WriteKind::DeleteGroup { token });
        ctx.step.writes.push(write);
        ctx.step
    }

    // ---- DescribeGroups / ListGroups -------------------------------------

    /// DescribeGroups for one group: an unknown group is described as Dead.
    pub fn describe_group(&self, group_id: &str) -> Result<GroupDescription, ResponseError> {
        self.owner(group_id)?;
        let Some(group) = self.groups.get(group_id) else {
            return Ok(GroupDescription {
                state: GroupState::Dead,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            });
        };
        let stable = group.state == GroupState::Stable;
        let protocol = group.protocol.clone().unwrap_or_default();
        Ok(GroupDescription {
            state: group.state,
            protocol_type: group.protocol_type.clone().unwrap_or_default(),
            protocol: if stable {
                protocol.clone()
            } else {
                String::new()
            },
            members: group
                .members
                .values()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client.client_id.clone(),
                    client_host: m.client.client_host.clone(),
                    metadata: if stable {
                        m.metadata_for(&protocol).to_vec()
                    } else {
                        Vec::new()
                    },
                    assignment: if stable {
                        m.assignment.to_vec()
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
        })
    }

    /// Every group of the loaded partitions; `Err` with
    /// COORDINATOR_LOAD_IN_PROGRESS while one is still loading.
    pub fn list_groups(&self) -> Result<Vec<GroupListing>, ResponseError> {
        if self
            .partitions
            .values()
            .any(|s| matches!(s, PartitionStatus::Loading { .. }))
            || self
                .led_by_image
                .awaits_load(|p| self.partitions.contains_key(&p))
        {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(self
            .groups
            .values()
            .filter(|g| g.state != GroupState::Dead)
            .map(|g| GroupListing {
                group_id: g.id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
                state: g.state,
            })
            .collect())
    }

    // ---- write completion ------------------------------------------------
}

impl Coordinator for GroupCoordinator {
    type Step = GroupStep;
    type Replayed = BTreeMap<String, LoadedGroup>;
    const STATE_TOPIC: &'static str = CONSUMER_OFFSETS_TOPIC;
    const USES_PRODUCER_IDS: bool = false;

    /// The `__consumer_offsets` partition of `group_id`.
    fn partition_for(&self, group_id: &str) -> i32 {
        coordinator_partition(group_id, self.config.offsets_partitions)
    }

    /// The offsets partitions the current metadata image says this broker
    /// leads; true if one of them is not loading or loaded yet.
    fn set_led_by_image(&mut self, led: LedByImage) -> bool {
        self.led_by_image = led;
        self.led_by_image
            .awaits_load(|p| self.partitions.contains_key(&p))
    }

    /// The leader epoch this coordinator holds partition `p` at (loading or loaded).
    fn coordinator_epoch(&self, p: i32) -> Option<i32> {
        self.partitions.get(&p).map(|s| s.epoch())
    }

    /// Starts loading partition `p` led at `epoch`. `None` if it is already
    /// held at that or a newer epoch; otherwise what was held before is
    /// dropped (its waiting requests get NOT_COORDINATOR).
    fn begin_loading(&mut self, p: i32, epoch: i32) -> Option<GroupStep> {
        if let Some(held) = self.partitions.get(&p) {
            if held.epoch() >= epoch {
                return None;
            }
        }
        let step = self.drop_partition(p);
        self.markers_while_loading.remove(&p);
        self.partitions
            .insert(p, PartitionStatus::Loading { epoch });
        Some(step)
    }

    fn replay(entries: Vec<LogEntry>) -> Result<Self::Replayed, String> {
        super::records::replay(entries).map_err(|e| e.to_string())
    }

    /// Installs what replaying partition `p` found. Fails with
    /// NOT_COORDINATOR if the partition moved on meanwhile.
    fn finish_loading(
        &mut self,
        p: i32,
        epoch: i32,
        loaded: BTreeMap<String, LoadedGroup>,
        now_ms: i64,
        _ids: &mut dyn ProducerIdSource,
    ) -> Result<GroupStep, ResponseError> {
        if self.partitions.get(&p) != Some(&PartitionStatus::Loading { epoch }) {
            return Err(ResponseError::NotCoordinator);
        }
        let groups = loaded.len();
        for (name, l) in loaded {
            if self.partition_for(&name) != p {
                // Written under another partition count; not ours to serve.
                continue;
            }
            let group = restore_group(name.clone(), p, l, now_ms);
            self.groups.insert(name, group);
        }
        self.partitions.insert(p, PartitionStatus::Loaded { epoch });
        for (producer_id, commit) in self.markers_while_loading.remove(&p).unwrap_or_default() {
            self.complete_transaction(p, producer_id, commit);
        }
        info!(
            partition = p,
            coordinator_epoch = epoch,
            groups,
            "offsets partition loaded"
        );
        Ok(GroupStep::default())
    }

    /// Stops serving partition `p` (if held at `epoch`, or at any epoch when
    /// `None`); waiting requests of its groups get NOT_COORDINATOR.
    fn unload(&mut self, p: i32, epoch: Option<i32>) -> GroupStep {
        match self.partitions.get(&p) {
            Some(s) if epoch.is_none_or(|e| e == s.epoch()) => {}
            _ => return GroupStep::default(),
        }
        self.partitions.remove(&p);
        self.drop_partition(p)
    }

    /// The shell reports a write: `Ok(base offset of its batch)` once
    /// durable (acks=all), or the append's error. Only now do committed
    /// offsets become visible, and members get the leader's assignment.
    fn complete_write(&mut self, id: WriteId, result: AppendResult, now_ms: i64) -> GroupStep {
        let Some(pending) = self.writes.pending.remove(&id) else {
            return GroupStep::default();
        };
        let (log_offset, error) = match result {
            Ok(base_offset) => (base_offset, None),
            Err(e) => (-1, Some(commit_append_error(e))),
        };
        let group = self.groups.get_mut(&pending.group);
        match pending.kind {
            WriteKind::Metadata => GroupStep::default(),
            WriteKind::Assignment { generation } => {
                let Some(group) = group else {
                    return GroupStep::default();
                };
                if group.assignment_write == Some(id) {
                    group.assignment_write = None;
                }
                if group.generation != generation || group.state != GroupState::CompletingRebalance
                {
                    return GroupStep::default();
                }
                let mut step = GroupStep::default();
                match error {
                    None => {
                        group.transition(GroupState::Stable, now_ms);
                        for m in group.members.values_mut() {
                            if let Some(p) = m.sync.take() {
                                let r = SyncGroupResponse::default()
                                    .with_assignment(m.assignment.clone());
                                step.deliveries.push((p.token, Reply::Sync(r)));
                            }
                            m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
                        }
                        let (protocol_type, protocol) =
                            (group.protocol_type.clone(), group.protocol.clone());
                        for (_, reply) in &mut step.deliveries {
                            if let Reply::Sync(r) = reply {
                                r.protocol_type = protocol_type.as_deref().map(str_bytes);
                                r.protocol_name = protocol.as_deref().map(str_bytes);
                            }
                        }
                        info!(group = %group.id, generation, members = group.members.len(), "group stable");
                    }
                    Some(e) => {
                        // Kafka: the members get the error and rejoin.
                        for m in group.members.values_mut() {
                            m.assignment = Bytes::new();
                            if let Some(p) = m.sync.take() {
                                step.deliveries.push((p.token, Reply::Sync(sync_error(e))));
                            }
                        }
                        let Ok(epoch) = self.owner(&pending.group) else {
                            return step;
                        };
                        let Some(group) = self.groups.get_mut(&pending.group) else {
                            return step;
                        };
                        let mut ctx = Ctx {
                            config: &self.config,
                            writes: &mut self.writes,
                            epoch,
                            now_ms,
                            step,
                        };
                        prepare_rebalance(group, &mut ctx, "storing the assignment failed");
                        return ctx.step;
                    }
                }
                step
            }
            WriteKind::Commit {
                token,
                offsets,
                mut refused,
                producer_id,
            } => {
                if let Some(group) = group {
                    for (tp, o) in &offsets {
                        if producer_id.is_none() {
                            if let Some(n) = group.pending_commits.get_mut(tp) {
                                *n -= 1;
                                if *n == 0 {
                                    group.pending_commits.remove(tp);
                                }
                            }
                        }
                        if error.is_none() {
                            let logged = LoggedOffset {
                                value: o.clone(),
                                log_offset,
                            };
                            match producer_id {
                                // Writes can complete out of log order.
                                None => commit_offsets(&mut group.offsets, [(tp.clone(), logged)]),
                                Some(pid) => {
                                    group
                                        .pending_txn
                                        .entry(pid)
                                        .or_default()
                                        .insert(tp.clone(), logged);
                                }
                            }
                        }
                    }
                }
                let error = if error.is_none() && !self.groups.contains_key(&pending.group) {
                    // Unloaded meanwhile: the next coordinator reads the record.
                    Some(ResponseError::NotCoordinator)
                } else {
                    error
                };
                refused.extend(offsets.into_iter().map(|((topic, partition), _)| {
                    PartitionResult {
                        topic,
                        partition,
                        error,
                    }
                }));
                GroupStep::reply(token, Reply::Commit(refused))
            }
            WriteKind::DeleteOffsets {
                token,
                partitions,
                mut refused,
            } => {
                if let (Some(group), None) = (group, error) {
                    for tp in &partitions {
                        group.offsets.remove(tp);
                    }
                }
                refused.extend(
                    partitions
                        .into_iter()
                        .map(|(topic, partition)| PartitionResult {
                            topic,
                            partition,
                            error,
                        }),
                );
                GroupStep::reply(token, Reply::Commit(refused))
            }
            WriteKind::StaticRejoin {
                token,
                version,
                response,
                previous,
                new_id,
                was_leader,
            } => {
                let Some(e) = error else {
                    return GroupStep::reply(token, Reply::Join(*response));
                };
                if let Some(group) = group {
                    revert_static_rejoin(group, *previous, &new_id, was_leader);
                }
                GroupStep::reply(token, Reply::Join(join_error(version, e, &new_id)))
            }
            WriteKind::DeleteGroup { token } => {
                if error.is_none() {
                    if let Some(g) = group {
                        if g.members.is_empty() {
                            let pending_txn = std::mem::take(&mut g.pending_txn);
                            if pending_txn.is_empty() {
                                self.groups.remove(&pending.group);
                            } else {
                                // Offsets of open transactions still await their marker.
                                g.offsets.clear();
                                g.pending_txn = pending_txn;
                            }
                        }
                    }
                }
                GroupStep::reply(token, Reply::Deleted(error))
            }
        }
    }

    /// The earliest time [`Self::tick`] has something to do.
    fn next_deadline(&self) -> Option<i64> {
        let mut next: Option<i64> = None;
        let mut consider = |t: i64| next = Some(next.map_or(t, |n| n.min(t)));
        for g in self.groups.values() {
            if matches!(
                g.state,
                GroupState::PreparingRebalance | GroupState::CompletingRebalance
            ) {
                consider(g.rebalance_deadline);
            }
            for &deadline in g.pending_members.values() {
                consider(deadline);
            }
            for m in g.members.values().filter(|m| !m.keeps_alive()) {
                consider(m.session_deadline);
            }
        }
        consider(self.retention_check_at);
        next
    }

    /// Expires sessions, pending members and rebalance phases due by
    /// `now_ms`, and every `offsets_retention_check_interval_ms` the
    /// offsets past their retention ([`Self::expire_offsets`]).
    fn tick(&mut self, now_ms: i64, _ids: &mut dyn ProducerIdSource) -> GroupStep {
        let mut step = GroupStep::default();
        if self.retention_check_at <= now_ms {
            if self.retention_check_at > 0 {
                step.merge(self.expire_offsets(now_ms));
            }
            self.retention_check_at = now_ms + self.config.offsets_retention_check_interval_ms;
        }
        let due: Vec<String> = self
            .groups
            .values()
            .filter(|g| {
                let rebalance_due = matches!(
                    g.state,
                    GroupState::PreparingRebalance | GroupState::CompletingRebalance
                ) && g.rebalance_deadline <= now_ms;
                rebalance_due
                    || g.pending_members.values().any(|&d| d <= now_ms)
                    || g.members
                        .values()
                        .any(|m| !m.keeps_alive() && m.session_deadline <= now_ms)
            })
            .map(|g| g.id.clone())
            .collect();
        for group_id in due {
            let Ok((group, mut ctx)) = self.group_ctx(&group_id, now_ms) else {
                continue;
            };
            expire(group, &mut ctx);
            step.merge(ctx.step);
        }
        step
    }
}

/// Rebuilds a group from what replay found; a group with members resumes
/// Stable, their sessions starting now.
fn restore_group(name: String, p: i32, l: LoadedGroup, now_ms: i64) -> Group {
    let mut group = Group::new(name, p, now_ms);
    group.offsets = l.offsets;
    group.pending_txn = l.pending_txn;
    let Some(meta) = l.metadata else {
        return group;
    };
    group.generation = meta.generation;
    group.protocol_type = meta.protocol_type;
    group.protocol = meta.protocol.clone();
    group.leader = meta.leader;
    let protocol = meta.protocol.unwrap_or_default();
    for m in meta.members {
        let member = Member {
            id: m.member_id.clone(),
            instance_id: m.instance_id.clone(),
            client: ClientInfo {
                client_id: m.client_id,
                client_host: m.client_host,
            },
            rebalance_timeout_ms: m.rebalance_timeout_ms,
            session_timeout_ms: m.session_timeout_ms,
            protocols: vec![(protocol.clone(), Bytes::from(m.subscription))],
            assignment: Bytes::from(m.assignment),
            join: None,
            sync: None,
            session_deadline: now_ms + i64::from(m.session_timeout_ms),
            joined_seq: group.next_join_seq,
        };
        group.next_join_seq += 1;
        if let Some(instance) = &m.instance_id {
            group
                .static_members
                .insert(instance.clone(), m.member_id.clone());
        }
        group.members.insert(m.member_id, member);
    }
    if group.members.is_empty() {
        // Empty since the record was written: offset retention counts from then.
        group.state_since = meta.state_timestamp;
    } else {
        group.state = GroupState::Stable;
    }
    group
}

fn member_response(
    member_id: &str,
    instance_id: Option<&str>,
    error: Option<ResponseError>,
) -> MemberResponse {
    MemberResponse::default()
        .with_member_id(str_bytes(member_id))
        .with_group_instance_id(instance_id.map(str_bytes))
        .with_error_code(error.map_or(0, |e| e.code()))
}

fn sync_ok(group: &Group, version: i16, assignment: Bytes) -> SyncGroupResponse {
    let mut r = SyncGroupResponse::default().with_assignment(assignment);
    if version >= 5 {
        r = r
            .with_protocol_type(group.protocol_type.as_deref().map(str_bytes))
            .with_protocol_name(group.protocol.as_deref().map(str_bytes));
    }
    r
}

fn fail_parked(step: &mut GroupStep, m: &Member, error: ResponseError) {
    if let Some(p) = m.join {
        step.deliveries
            .push((p.token, Reply::Join(join_error(p.version, error, &m.id))));
    }
    if let Some(p) = m.sync {
        step.deliveries
            .push((p.token, Reply::Sync(sync_error(error))));
    }
}

/// The member named by a SyncGroup / Heartbeat / OffsetCommit exists, and a
/// static member's instance id still maps to it.
fn validate_member(
    group: &Group,
    member_id: &str,
    instance_id: Option<&str>,
) -> Result<(), ResponseError> {
    if let Some(instance) = instance_id {
        match group.static_members.get(instance) {
            Some(current) if current != member_id => return Err(ResponseError::FencedInstanceId),
            Some(_) => {}
            None => return Err(ResponseError::UnknownMemberId),
        }
    }
    if !group.members.contains_key(member_id) {
        return Err(ResponseError::UnknownMemberId);
    }
    Ok(())
}

/// OffsetCommit's generation and member checks. Generation -1 with no
/// member on an empty group is a simple (standalone) commit.
fn validate_commit(
    group: &mut Group,
    generation: i32,
    member_id: &str,
    instance_id: Option<&str>,
    now_ms: i64,
) -> Result<(), ResponseError> {
    match group.state {
        GroupState::Dead => return Err(ResponseError::CoordinatorNotAvailable),
        GroupState::Empty if generation < 0 => return Ok(()),
        GroupState::Empty => {
            return Err(if member_id.is_empty() {
                ResponseError::IllegalGeneration
            } else {
                ResponseError::UnknownMemberId
            })
        }
        _ => {}
    }
    validate_member(group, member_id, instance_id)?;
    if generation != group.generation {
        return Err(ResponseError::IllegalGeneration);
    }
    if group.state == GroupState::CompletingRebalance {
        return Err(ResponseError::RebalanceInProgress);
    }
    if let Some(m) = group.members.get_mut(member_id) {
        m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
    }
    Ok(())
}

/// KIP-447: a TxnOffsetCommit naming a member (generation ≥ 0 or a member
/// id) must match the group's current member and generation, so a zombie
/// that lost its partitions in a rebalance cannot commit for them.
fn validate_txn_commit(group: &Group, request: &CommitRequest) -> Result<(), ResponseError> {
    if group.state == GroupState::Dead {
        return Err(ResponseError::CoordinatorNotAvailable);
    }
    if let Some(instance) = request.group_instance_id.as_deref() {
        if group
            .static_members
            .get(instance)
            .is_some_and(|current| *current != request.member_id)
        {
            return Err(ResponseError::FencedInstanceId);
        }
    }
    if request.generation_id < 0 && request.member_id.is_empty() {
        // Offsets committed without group membership (older clients).
        return Ok(());
    }
    if !group.members.contains_key(&request.member_id) {
        return Err(ResponseError::UnknownMemberId);
    }
    if request.generation_id != group.generation {
        return Err(ResponseError::IllegalGeneration);
    }
    Ok(())
}

/// Splits a commit into the offsets to write and the partitions refused
/// (metadata over `offset.metadata.max.bytes`).
fn offsets_to_write(
    config: &GroupConfig,
    request: &CommitRequest,
    now_ms: i64,
) -> (CommitOffsets, Vec<PartitionResult>) {
    let mut offsets = Vec::new();
    let mut refused = Vec::new();
    for p in &request.partitions {
        if p.metadata
            .as_ref()
            .is_some_and(|m| m.len() > config.offset_metadata_max_bytes)
        {
            refused.push(PartitionResult {
                topic: p.topic.clone(),
                partition: p.partition,
                error: Some(ResponseError::OffsetMetadataTooLarge),
            });
            continue;
        }
        offsets.push((
            (p.topic.clone(), p.partition),
            OffsetAndMetadata {
                offset: p.offset,
                leader_epoch: p.leader_epoch,
                metadata: p.metadata.clone(),
                commit_timestamp: now_ms,
            },
        ));
    }
    (offsets, refused)
}

/// One member of a LeaveGroup: removed (`None`) or the error.
fn leave_one(
    group: &mut Group,
    member_id: &str,
    instance_id: Option<&str>,
    step: &mut GroupStep,
) -> Option<ResponseError> {
    let target = match instance_id {
        Some(instance) => match group.static_members.get(instance) {
            None => return Some(ResponseError::UnknownMemberId),
            Some(current) if !member_id.is_empty() && current != member_id => {
                return Some(ResponseError::FencedInstanceId)
            }
            Some(current) => current.clone(),
        },
        None => {
            if group.pending_members.remove(member_id).is_some() {
                return None;
            }
            member_id.to_string()
        }
    };
    let Some(member) = group.members.remove(&target) else {
        return Some(ResponseError::UnknownMemberId);
    };
    remove_member_bookkeeping(group, &member, step, ResponseError::UnknownMemberId);
    None
}

fn remove_member_bookkeeping(
    group: &mut Group,
    member: &Member,
    step: &mut GroupStep,
    error: ResponseError,
) {
    fail_parked(step, member, error);
    if let Some(instance) = &member.instance_id {
        if group.static_members.get(instance) == Some(&member.id) {
            group.static_members.remove(instance);
        }
    }
    if group.leader.as_deref() == Some(member.id.as_str()) {
        group.leader = None;
    }
}

/// After members left or expired: a settled group rebalances, a joining
/// group may now be complete.
fn members_changed(group: &mut Group, ctx: &mut Ctx<'_>) {
    match group.state {
        GroupState::Stable | GroupState::CompletingRebalance => {
            prepare_rebalance(group, ctx, "a member left")
        }
        GroupState::PreparingRebalance => try_complete_join(group, ctx),
        GroupState::Empty | GroupState::Dead => {}
    }
}

/// JoinGroup on a loaded group (see the module docs for the cases).
fn join(group: &mut Group, ctx: &mut Ctx<'_>, args: JoinArgs, fresh_id: Option<String>) {
    let fail = |ctx: &mut Ctx<'_>, e: ResponseError, member_id: &str| {
        ctx.step.deliveries.push((
            args.token,
            Reply::Join(join_error(args.version, e, member_id)),
        ));
    };
    if group.state == GroupState::Dead {
        return fail(ctx, ResponseError::CoordinatorNotAvailable, &args.member_id);
    }
    if !group.supports(&args.protocol_type, &args.protocols) {
        return fail(
            ctx,
            ResponseError::InconsistentGroupProtocol,
            &args.member_id,
        );
    }
    let now = ctx.now_ms;
    // A new member (no member id yet).
    if let Some(new_id) = fresh_id {
        if let Some(instance) = args.instance_id.clone() {
            if let Some(old_id) = group.static_members.get(&instance).cloned() {
                return replace_static_member(group, ctx, args, old_id, new_id);
            }
            if group.members.len() >= ctx.config.max_size {
                return fail(ctx, ResponseError::GroupMaxSizeReached, "");
            }
            return add_member_and_rebalance(group, ctx, args, new_id);
        }
        if args.version >= 4 {
            // KIP-394: hand out the id; the member joins with it.
            group
                .pending_members
                .insert(new_id.clone(), now + i64::from(args.session_timeout_ms));
            return fail(ctx, ResponseError::MemberIdRequired, &new_id);
        }
        if group.members.len() >= ctx.config.max_size {
            return fail(ctx, ResponseError::GroupMaxSizeReached, "");
        }
        return add_member_and_rebalance(group, ctx, args, new_id);
    }
    // A member with an id.
    let member_id = args.member_id.clone();
    if group.pending_members.remove(&member_id).is_some() {
        if group.members.len() >= ctx.config.max_size {
            return fail(ctx, ResponseError::GroupMaxSizeReached, &member_id);
        }
        return add_member_and_rebalance(group, ctx, args, member_id);
    }
    if let Err(e) = validate_member(group, &member_id, args.instance_id.as_deref()) {
        return fail(ctx, e, &member_id);
    }
    match group.state {
        GroupState::Empty | GroupState::Dead => {
            fail(ctx, ResponseError::UnknownMemberId, &member_id)
        }
        GroupState::PreparingRebalance => {
            update_member(group, ctx, &args);
            try_complete_join(group, ctx);
        }
        GroupState::CompletingRebalance | GroupState::Stable => {
            let is_leader = group.leader.as_deref() == Some(member_id.as_str());
            let unchanged = group
                .members
                .get(&member_id)
                .is_some_and(|m| m.same_protocols(&args.protocols));
            if unchanged && (group.state == GroupState::CompletingRebalance || !is_leader) {
                // Nothing changed: the member gets the current generation again.
                if let Some(m) = group.members.get_mut(&member_id) {
                    m.session_deadline = now + i64::from(m.session_timeout_ms);
                }
                let response = join_response(group, &member_id, args.version, is_leader);
                ctx.step
                    .deliveries
                    .push((args.token, Reply::Join(response)));
            } else {
                update_member(group, ctx, &args);
                prepare_rebalance(
                    group,
                    ctx,
                    "a member changed its protocols or the leader rejoined",
                );
            }
        }
    }
}

fn new_member(group: &mut Group, args: &JoinArgs, id: String, now_ms: i64) -> Member {
    group.next_join_seq += 1;
    Member {
        id,
        instance_id: args.instance_id.clone(),
        client: args.client.clone(),
        rebalance_timeout_ms: args.rebalance_timeout_ms,
        session_timeout_ms: args.session_timeout_ms,
        protocols: args.protocols.clone(),
        assignment: Bytes::new(),
        join: Some(Parked {
            token: args.token,
            version: args.version,
        }),
        sync: None,
        session_deadline: now_ms + i64::from(args.session_timeout_ms),
        joined_seq: group.next_join_seq,
    }
}

fn add_member_and_rebalance(group: &mut Group, ctx: &mut Ctx<'_>, args: JoinArgs, id: String) {
    let member = new_member(group, &args, id.clone(), ctx.now_ms);
    if let Some(instance) = &args.instance_id {
        group.static_members.insert(instance.clone(), id.clone());
    }
    if group.members.is_empty() {
        group.protocol_type = Some(args.protocol_type.clone());
    }
    group.members.insert(id, member);
    if let Some(delay) = &mut group.initial_delay {
        delay.joined_since = true;
    }
    match group.state {
        GroupState::PreparingRebalance => try_complete_join(group, ctx),
        _ => prepare_rebalance(group, ctx, "a member joined"),
    }
}

/// A failed write of a static member's new id: the member gets its old id
/// back (unless the group moved on meanwhile), so that the group and its
/// log agree on who is in it.
fn revert_static_rejoin(group: &mut Group, previous: Member, new_id: &str, was_leader: bool) {
    let Some(current) = group.members.get(new_id) else {
        return;
    };
    if current.join.is_some() || current.sync.is_some() {
        // The member has already sent a further request under the new id.
        return;
    }
    info!(group = %group.id, old = %previous.id, new = %new_id, "static member rejoin not stored; old member id restored");
    group.members.remove(new_id);
    if let Some(instance) = &previous.instance_id {
        group
            .static_members
            .insert(instance.clone(), previous.id.clone());
    }
    if was_leader {
        group.leader = Some(previous.id.clone());
    }
    group.members.insert(previous.id.clone(), previous);
}

/// A static member rejoins under a new member id: the old id is fenced.
/// In a Stable group whose member keeps its protocols this needs no
/// rebalance (the member gets the current generation and its assignment
/// through SyncGroup); otherwise the group rebalances.
fn replace_static_member(
    group: &mut Group,
    ctx: &mut Ctx<'_>,
    args: JoinArgs,
    old_id: String,
    new_id: String,
) {
    let Some(mut member) = group.members.remove(&old_id) else {
        group
            .static_members
            .remove(args.instance_id.as_deref().unwrap_or_default());
        return add_member_and_rebalance(group, ctx, args, new_id);
    };
    fail_parked(&mut ctx.step, &member, ResponseError::FencedInstanceId);
    info!(group = %group.id, old = %old_id, new = %new_id, "static member rejoined; old member id fenced");
    let unchanged = member.same_protocols(&args.protocols);
    let previous = Member {
        join: None,
        sync: None,
        ..member.clone()
    };
    let was_leader = group.leader.as_deref() == Some(old_id.as_str());
    member.id = new_id.clone();
    member.client = args.client.clone();
    member.session_timeout_ms = args.session_timeout_ms;
    member.rebalance_timeout_ms = args.rebalance_timeout_ms;
    member.protocols = args.protocols.clone();
    member.sync = None;
    member.join = None;
    member.session_deadline = ctx.now_ms + i64::from(args.session_timeout_ms);
    if let Some(instance) = &args.instance_id {
        group
            .static_members
            .insert(instance.clone(), new_id.clone());
    }
    if group.leader.as_deref() == Some(old_id.as_str()) {
        group.leader = Some(new_id.clone());
    }
    group.members.insert(new_id.clone(), member);
    match group.state {
        GroupState::Stable if unchanged => {
            let is_leader = group.leader.as_deref() == Some(new_id.as_str());
            let mut response = join_response(group, &new_id, args.version, false);
            if is_leader && args.version >= 9 {
                // KIP-814: the leader may skip the assignment it already made.
                response =
                    join_response(group, &new_id, args.version, true).with_skip_assignment(true);
            }
            // Answered once the new member id is durable; a failed write
            // puts the old member back (Kafka's static-member replacement).
            let record = group_metadata_record(&group.id, Some(&group.stored()));
            let kind = WriteKind::StaticRejoin {
                token: args.token,
                version: args.version,
                response: Box::new(response),
                previous: Box::new(previous),
                new_id,
                was_leader,
            };
            let write = ctx.writes.add(group, ctx.epoch, vec![record], kind);
            ctx.step.writes.push(write);
        }
        GroupState::PreparingRebalance => {
            if let Some(m) = group.members.get_mut(&new_id) {
                m.join = Some(Parked {
                    token: args.token,
                    version: args.version,
                });
            }
            try_complete_join(group, ctx);
        }
        _ => {
            if let Some(m) = group.members.get_mut(&new_id) {
                m.join = Some(Parked {
                    token: args.token,
                    version: args.version,
                });
            }
            prepare_rebalance(group, ctx, "a static member rejoined with other protocols");
        }
    }
}

fn update_member(group: &mut Group, ctx: &mut Ctx<'_>, args: &JoinArgs) {
    let Some(m) = group.members.get_mut(&args.member_id) else {
        return;
    };
    if let Some(old) = m.join.replace(Parked {
        token: args.token,
        version: args.version,
    }) {
        // A repeated JoinGroup replaces the one waiting.
        ctx.step.deliveries.push((
            old.token,
            Reply::Join(join_error(
                old.version,
                ResponseError::RebalanceInProgress,
                &m.id,
            )),
        ));
    }
    m.protocols = args.protocols.clone();
    m.session_timeout_ms = args.session_timeout_ms;
    m.rebalance_timeout_ms = args.rebalance_timeout_ms;
    m.client = args.client.clone();
    m.session_deadline = ctx.now_ms + i64::from(args.session_timeout_ms);
}

/// Stable / CompletingRebalance / Empty → PreparingRebalance.
fn prepare_rebalance(group: &mut Group, ctx: &mut Ctx<'_>, reason: &str) {
    if group.state == GroupState::CompletingRebalance {
        // Members waiting for an assignment must rejoin.
        group.assignment_write = None;
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
            if let Some(p) = m.sync.take() {
                ctx.step.deliveries.push((
                    p.token,
                    Reply::Sync(sync_error(ResponseError::RebalanceInProgress)),
                ));
            }
        }
    }
    let was_empty = group.state == GroupState::Empty;
    group.transition(GroupState::PreparingRebalance, ctx.now_ms);
    info!(group = %group.id, generation = group.generation, reason, "preparing to rebalance");
    let rebalance_timeout = group.max_rebalance_timeout();
    let delay = i64::from(ctx.config.initial_rebalance_delay_ms);
    if was_empty && delay > 0 {
        let first = delay.min(rebalance_timeout);
        group.initial_delay = Some(InitialDelay {
            remaining_ms: (rebalance_timeout - first).max(0),
            joined_since: false,
        });
        group.rebalance_deadline = ctx.now_ms + first;
    } else {
        group.initial_delay = None;
        group.rebalance_deadline = ctx.now_ms + rebalance_timeout;
        try_complete_join(group, ctx);
    }
}

/// Completes the join phase once every member has rejoined (never during
/// the initial delay).
fn try_complete_join(group: &mut Group, ctx: &mut Ctx<'_>) {
    if group.state == GroupState::PreparingRebalance
        && group.initial_delay.is_none()
        && group.all_joined()
    {
        complete_join(group, ctx);
    }
}

/// Ends the join phase: members that did not rejoin are removed; then the
/// next generation starts (CompletingRebalance, or Empty without members)
/// and every member gets its JoinGroup answer, the leader with the members.
fn complete_join(group: &mut Group, ctx: &mut Ctx<'_>) {
    let gone: Vec<String> = group
        .members
        .values()
        .filter(|m| m.join.is_none())
        .map(|m| m.id.clone())
        .collect();
    for id in gone {
        if let Some(m) = group.members.remove(&id) {
            info!(group = %group.id, member = %id, "member did not rejoin in time; removed");
            remove_member_bookkeeping(group, &m, &mut ctx.step, ResponseError::UnknownMemberId);
        }
    }
    group.pending_members.clear();
    group.initial_delay = None;
    group.generation += 1;
    if group.members.is_empty() {
        // The protocol type stays: DescribeGroups shows an emptied
        // consumer group as one.
        group.protocol = None;
        group.leader = None;
        group.transition(GroupState::Empty, ctx.now_ms);
        info!(group = %group.id, generation = group.generation, "group is empty");
        let record = group_metadata_record(&group.id, Some(&group.stored()));
        let write = ctx
            .writes
            .add(group, ctx.epoch, vec![record], WriteKind::Metadata);
        ctx.step.writes.push(write);
        return;
    }
    group.protocol = group.select_protocol();
    if group
        .leader
        .as_ref()
        .is_none_or(|l| !group.members.contains_key(l))
    {
        group.leader = group
            .members
            .values()
            .min_by_key(|m| m.joined_seq)
            .map(|m| m.id.clone());
    }
    group.transition(GroupState::CompletingRebalance, ctx.now_ms);
    group.rebalance_deadline = ctx.now_ms + group.max_rebalance_timeout();
    info!(group = %group.id, generation = group.generation, protocol = ?group.protocol, members = group.members.len(), "join phase complete");
    let ids: Vec<String> = group.members.keys().cloned().collect();
    for id in ids {
        let is_leader = group.leader.as_deref() == Some(id.as_str());
        let Some(parked) = group.members.get(&id).and_then(|m| m.join) else {
            continue;
        };
        let response = join_response(group, &id, parked.version, is_leader);
        ctx.step
            .deliveries
            .push((parked.token, Reply::Join(response)));
        if let Some(m) = group.members.get_mut(&id) {
            m.join = None;
            m.session_deadline = ctx.now_ms + i64::from(m.session_timeout_ms);
        }
    }
}

/// The JoinGroup answer for `member_id` at the current generation; the
/// leader (`with_members`) gets every member's metadata.
fn join_response(
    group: &Group,
    member_id: &str,
    version: i16,
    with_members: bool,
) -> JoinGroupResponse {
    let protocol = group.protocol.clone().unwrap_or_default();
    let members = if with_members {
        group
            .members
            .values()
            .map(|m| {
                let mut r = JoinGroupResponseMember::default()
                    .with_member_id(str_bytes(&m.id))
                    .with_metadata(m.metadata_for(&protocol));
                if version >= 5 {
                    r = r.with_group_instance_id(m.instance_id.as_deref().map(str_bytes));
                }
                r
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut r = JoinGroupResponse::default()
        .with_generation_id(group.generation)
        .with_protocol_name(Some(str_bytes(&protocol)))
        .with_leader(str_bytes(group.leader.as_deref().unwrap_or_default()))
        .with_member_id(str_bytes(member_id))
        .with_members(members);
    if version >= 7 {
        r = r.with_protocol_type(group.protocol_type.as_deref().map(str_bytes));
    }
    r
}

/// Timer work on one group (see [`GroupCoordinator::tick`]).
fn expire(group: &mut Group, ctx: &mut Ctx<'_>) {
    let now = ctx.now_ms;
    let before = group.pending_members.len();
    group.pending_members.retain(|_, deadline| *deadline > now);
    let mut changed = group.pending_members.len() != before;
    let expired: Vec<String> = group
        .members
        .values()
        .filter(|m| !m.keeps_alive() && m.session_deadline <= now)
        .map(|m| m.id.clone())
        .collect();
    for id in expired {
        if let Some(m) = group.members.remove(&id) {
            info!(group = %group.id, member = %id, "member session expired");
            remove_member_bookkeeping(group, &m, &mut ctx.step, ResponseError::UnknownMemberId);
            changed = true;
        }
    }
    if changed {
        members_changed(group, ctx);
    }
    if group.rebalance_deadline > now {
        return;
    }
    match group.state {
        GroupState::PreparingRebalance => {
            if let Some(delay) = group.initial_delay {
                if delay.joined_since && delay.remaining_ms > 0 {
                    let step =
                        i64::from(ctx.config.initial_rebalance_delay_ms).min(delay.remaining_ms);
                    group.initial_delay = Some(InitialDelay {
                        remaining_ms: delay.remaining_ms - step,
                        joined_since: false,
                    });
                    group.rebalance_deadline = now + step;
                    return;
                }
            }
            complete_join(group, ctx);
        }
        GroupState::CompletingRebalance => {
            let lagging: Vec<String> = group
                .members
                .values()
                .filter(|m| m.sync.is_none())
                .map(|m| m.id.clone())
                .collect();
            for id in lagging {
                if let Some(m) = group.members.remove(&id) {
                    info!(group = %group.id, member = %id, "member sent no SyncGroup in time; removed");
                    remove_member_bookkeeping(
                        group,
                        &m,
                        &mut ctx.step,
                        ResponseError::UnknownMemberId,
                    );
                }
            }
            prepare_rebalance(group, ctx, "members did not sync in time");
        }
        _ => {}
    }
}

/// Every partition of a commit refused with `error`.
fn refuse_all(token: Token, request: &CommitRequest, error: ResponseError) -> GroupStep {
    let results = request
        .partitions
        .iter()
        .map(|p| PartitionResult {
            topic: p.topic.clone(),
            partition: p.partition,
            error: Some(error),
        })
        .collect();
    GroupStep::reply(token, Reply::Commit(results))
}

/// Writes a checked commit's offsets (for a transaction's producer: as its
/// transactional batch); answered at once if none is left to write.
fn write_commit(
    group: &mut Group,
    ctx: &mut Ctx<'_>,
    token: Token,
    request: &CommitRequest,
    producer: Option<TransactionalWrite>,
) {
    let (offsets, refused) = offsets_to_write(ctx.config, request, ctx.now_ms);
    if offsets.is_empty() {
        ctx.step.deliveries.push((token, Reply::Commit(refused)));
        return;
    }
    if producer.is_none() {
        for (tp, _) in &offsets {
            *group.pending_commits.entry(tp.clone()).or_default() += 1;
        }
    }
    let records = offsets
        .iter()
        .map(|((t, p), o)| offset_record(&group.id, t, *p, Some(o)))
        .collect();
    let kind = WriteKind::Commit {
        token,
        offsets,
        refused,
        producer_id: producer.as_ref().map(|p| p.producer_id),
    };
    let mut write = ctx.writes.add(group, ctx.epoch, records, kind);
    write.transactional = producer;
    ctx.step.writes.push(write);
}
