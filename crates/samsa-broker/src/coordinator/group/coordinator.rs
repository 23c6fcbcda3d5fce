//! [`GroupCoordinator`]: the classic group protocol, committed offsets and
//! ownership of `__consumer_offsets` partitions. See the [module docs](super)
//! for the contract with the runtime.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use tracing::{debug, info};

use super::api::{
    ClientInfo, CommitRequest, FetchedOffset, GroupDescription, GroupFigures, GroupListing,
    HeartbeatRequest, HeartbeatResponse, JoinGroupMember, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, LeavingMember, LeftMember, MemberDescription,
    PartitionResult, SyncGroupRequest, SyncGroupResponse,
};
use super::records::{
    commit_offsets, group_metadata_record, offset_record, LoadedGroup, LoggedOffset,
    OffsetAndMetadata, StoredGroup, StoredMember,
};
use super::GroupState;

mod membership;
mod offsets;

use crate::coordinator::placement::{coordinator_partition, LedByImage, CONSUMER_OFFSETS_TOPIC};
use crate::coordinator::{
    illegal_transition, AppendResult, Coordinator, LogEntry, ProducerIdSource, StateRecord, Step,
    TakesEffect, TransactionalWrite, Write, WriteId, WriteIds,
};
use crate::error::commit_append_error;
use membership::*;

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
    /// without members outlive it (see [`tick`](crate::coordinator::Coordinator::tick)).
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

/// Identifies one waiting request: the runtime picks a fresh token per
/// request and delivers to it the [`Reply`] a later [`GroupStep`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub u64);

/// The answer to a waiting request (the handler that waits for it
/// converts it for the wire).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Join(JoinGroupResponse),
    Sync(SyncGroupResponse),
    /// Per partition: `None` committed, or the error.
    Commit(Vec<PartitionResult>),
    /// The outcome of deleting one group.
    Deleted(Option<ResponseError>),
}

/// What a call asks of the runtime: replies to deliver now, writes to persist.
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

    pub(crate) fn merge(&mut self, other: GroupStep) {
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
    /// The JoinGroup and the SyncGroup waiting for the group, if any.
    join: Option<Token>,
    sync: Option<Token>,
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
    /// When the rebalance under way (or the last one) began: its first
    /// move to PreparingRebalance from Empty or Stable.
    rebalance_started: i64,
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
            rebalance_started: now_ms,
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
        let rebalancing = |s| {
            matches!(
                s,
                GroupState::PreparingRebalance | GroupState::CompletingRebalance
            )
        };
        if rebalancing(to) && !rebalancing(self.state) {
            self.rebalance_started = now_ms;
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
    ///
    /// The one use of `kafka-protocol` in the coordinator besides its error
    /// codes: a member's metadata is opaque to the group protocol, but
    /// offset retention and OffsetDelete must know which topics a consumer
    /// group reads, and only the consumer protocol's subscription (the
    /// bytes the clients put there) says so.
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

/// Writes handed to the runtime and not yet reported back.
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
            takes_effect: TakesEffect::OnceDurable,
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
    /// Makes member ids unique across coordinators and restarts (the runtime
    /// picks it at random; Kafka uses a random UUID per member).
    member_id_seed: u64,
    next_member: u64,
    /// Markers that reached a partition while it was loading.
    markers_while_loading: BTreeMap<i32, Vec<(i64, bool)>>,
    led_by_image: LedByImage,
    /// When [`tick`](crate::coordinator::Coordinator::tick) next expires offsets (0: at the first tick,
    /// which only schedules the first check an interval later).
    retention_check_at: i64,
    /// Write-only meters (rebalances, offset commits); none in unit tests.
    meters: Option<samsa_metrics::coordinators::GroupMeters>,
}

impl GroupCoordinator {
    /// Records rebalances and offset commits into `meters` from now on.
    pub fn with_meters(mut self, meters: samsa_metrics::coordinators::GroupMeters) -> Self {
        self.meters = Some(meters);
        self
    }

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
            meters: None,
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

    // ---- SyncGroup -------------------------------------------------------

    // ---- Heartbeat -------------------------------------------------------

    // ---- LeaveGroup ------------------------------------------------------

    // ---- timers ----------------------------------------------------------

    // ---- OffsetCommit ----------------------------------------------------

    // ---- OffsetFetch -----------------------------------------------------

    // ---- OffsetDelete ----------------------------------------------------

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

    /// Every loaded group's state, members and committed offsets, for
    /// `/metrics` (groups of partitions still loading are not there yet).
    pub fn figures(&self) -> Vec<GroupFigures> {
        self.groups
            .values()
            .filter(|g| g.state != GroupState::Dead)
            .map(|g| GroupFigures {
                group_id: g.id.clone(),
                state: g.state,
                members: g.members.len(),
                offsets: g
                    .offsets
                    .iter()
                    .map(|((topic, partition), o)| (topic.clone(), *partition, o.value.offset))
                    .collect(),
            })
            .collect()
    }

    // ---- write completion ------------------------------------------------

    /// A DeleteGroups tombstone is durable: forget the group if it is still
    /// empty (keeping offsets of open transactions, which await their marker).
    fn group_deleted(&mut self, group_id: &str) {
        let Some(g) = self.groups.get_mut(group_id) else {
            return;
        };
        if !g.members.is_empty() {
            return;
        }
        let pending_txn = std::mem::take(&mut g.pending_txn);
        if pending_txn.is_empty() {
            self.groups.remove(group_id);
        } else {
            g.offsets.clear();
            g.pending_txn = pending_txn;
        }
    }
}

impl Coordinator for GroupCoordinator {
    type Step = GroupStep;
    type Replayed = BTreeMap<String, LoadedGroup>;
    const STATE_TOPIC: &'static str = CONSUMER_OFFSETS_TOPIC;
    const USES_PRODUCER_IDS: bool = false;
    const DEADLINES_FOLLOW_CALLS: bool = true;

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

    /// The runtime reports a write: `Ok(base offset of its batch)` once
    /// durable (acks=all), or the append's error. Only now do committed
    /// offsets become visible, and members get the leader's assignment.
    fn complete_write(&mut self, id: WriteId, result: AppendResult, now_ms: i64) -> GroupStep {
        let Some(pending) = self.writes.pending.remove(&id) else {
            return GroupStep::default();
        };
        let written = match result {
            Ok(base_offset) => Ok(base_offset),
            Err(e) => Err(commit_append_error(e)),
        };
        let group = pending.group;
        match pending.kind {
            WriteKind::Metadata => GroupStep::default(),
            WriteKind::Assignment { generation } => {
                self.assignment_written(id, &group, generation, written.err(), now_ms)
            }
            WriteKind::StaticRejoin {
                token,
                response,
                previous,
                new_id,
                was_leader,
            } => {
                let Err(e) = written else {
                    return GroupStep::reply(token, Reply::Join(*response));
                };
                if let Some(group) = self.groups.get_mut(&group) {
                    revert_static_rejoin(group, *previous, &new_id, was_leader);
                }
                GroupStep::reply(token, Reply::Join(JoinGroupResponse::error(e, &new_id)))
            }
            WriteKind::Commit {
                token,
                offsets,
                refused,
                producer_id,
            } => self.commit_written(&group, token, offsets, refused, producer_id, written),
            WriteKind::DeleteOffsets {
                token,
                partitions,
                refused,
            } => self.offsets_deleted(&group, token, partitions, refused, written.err()),
            WriteKind::DeleteGroup { token } => {
                let error = written.err();
                if error.is_none() {
                    self.group_deleted(&group);
                }
                GroupStep::reply(token, Reply::Deleted(error))
            }
        }
    }

    /// The earliest time [`tick`](crate::coordinator::Coordinator::tick) has something to do.
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
        self.expire_due(now_ms)
    }
}

impl GroupCoordinator {
    /// What the timers due by `now_ms` do, if any is due: applied before
    /// every request as well as by the timer loop, so that an answer never
    /// shows a member whose session ended before the request arrived (the
    /// timer loop may wake a millisecond or two after a deadline; a client
    /// that waits out a session timeout and then deletes the group must find
    /// it empty, as librdkafka's 0081 DescribeConsumerGroups does).
    pub(crate) fn timers_due(&mut self, now_ms: i64) -> GroupStep {
        use crate::coordinator::Coordinator as _;
        match self.next_deadline() {
            Some(deadline) if deadline <= now_ms => self.expire_due(now_ms),
            _ => GroupStep::default(),
        }
    }

    fn expire_due(&mut self, now_ms: i64) -> GroupStep {
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
