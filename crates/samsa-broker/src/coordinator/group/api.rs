//! Requests and responses of the group coordinator, as plain structs.
//!
//! They carry what [`GroupCoordinator`](super::GroupCoordinator) needs from
//! the Kafka messages of the same names, and what its answers hold. A
//! request's API version rides along only where it changes what the
//! coordinator does: JoinGroup (KIP-394 member ids from v4, KIP-814
//! `skip_assignment` from v9) and LeaveGroup (a batch of members from v3).
//! Which fields a version has on the wire, and how Kafka fills them, is the
//! handlers' business: converting from and to the `kafka-protocol` types
//! happens in `crate::handlers::group` (membership, group admin) and
//! `crate::handlers::offsets` (offsets).

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::records::OffsetAndMetadata;
use super::GroupState;

/// Who sent a request, for the member list of DescribeGroups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientInfo {
    pub client_id: String,
    pub client_host: String,
}

// ---- membership ----------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupRequest {
    pub group_id: String,
    /// Empty for a member that has no id yet.
    pub member_id: String,
    /// Static membership (KIP-345, v5+).
    pub group_instance_id: Option<String>,
    pub protocol_type: String,
    /// `(name, metadata)`, in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    pub session_timeout_ms: i32,
    /// How long the join phase waits for this member (v0 has none on the
    /// wire: there it is the session timeout).
    pub rebalance_timeout_ms: i32,
    pub client: ClientInfo,
    /// v4+: a member without an id gets one with MEMBER_ID_REQUIRED and
    /// joins again with it (KIP-394); v9+: a returning static leader may
    /// skip the assignment (KIP-814).
    pub version: i16,
}

/// One member as the leader's JoinGroup answer lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// Its metadata for the selected protocol.
    pub metadata: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupResponse {
    pub error: Option<ResponseError>,
    /// -1 with an error.
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    /// The selected protocol; `None` or empty when there is none.
    pub protocol_name: Option<String>,
    /// Empty when there is none.
    pub leader: String,
    /// KIP-814: the leader keeps the assignment it made (v9+ only).
    pub skip_assignment: bool,
    /// The member's id (the one handed out, for MEMBER_ID_REQUIRED).
    pub member_id: String,
    /// Every member, for the leader; empty for the others.
    pub members: Vec<JoinGroupMember>,
}

impl JoinGroupResponse {
    pub fn error(error: ResponseError, member_id: &str) -> Self {
        Self {
            error: Some(error),
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            skip_assignment: false,
            member_id: member_id.to_string(),
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// v5+: checked against the group's when given (INCONSISTENT_GROUP_PROTOCOL).
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's `(member id, assignment)`; empty from the others.
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupResponse {
    pub error: Option<ResponseError>,
    /// The group's, with an assignment (the wire has them from v5).
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncGroupResponse {
    pub fn ok(assignment: Bytes, protocol_type: Option<&str>, protocol_name: Option<&str>) -> Self {
        Self {
            error: None,
            protocol_type: protocol_type.map(str::to_string),
            protocol_name: protocol_name.map(str::to_string),
            assignment,
        }
    }

    pub fn error(error: ResponseError) -> Self {
        Self {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub error: Option<ResponseError>,
}

/// A member leaving, by member id and/or (v3+) group instance id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeavingMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupRequest {
    pub group_id: String,
    /// v3+: the batch; before v3 the one member id, without instance id.
    pub members: Vec<LeavingMember>,
    /// v3+ answers per member (an unknown group: UNKNOWN_MEMBER_ID for
    /// each); older versions with one error.
    pub version: i16,
}

/// One member's outcome of a LeaveGroup (v3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub error: Option<ResponseError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaveGroupResponse {
    /// The whole request's error; before v3 also the one member's.
    pub error: Option<ResponseError>,
    /// v3+: per member, in request order.
    pub members: Vec<LeftMember>,
}

// ---- offsets -------------------------------------------------------------

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

/// A partition of an offset commit or delete and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionResult {
    pub topic: String,
    pub partition: i32,
    pub error: Option<ResponseError>,
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

// ---- group admin ---------------------------------------------------------

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

/// A group as `/metrics` shows it: its state, members and committed
/// offsets (topic, partition, offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupFigures {
    pub group_id: String,
    pub state: GroupState,
    pub members: usize,
    pub offsets: Vec<(String, i32, i64)>,
}

/// A group as ListGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: GroupState,
}
