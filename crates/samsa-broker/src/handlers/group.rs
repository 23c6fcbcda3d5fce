//! Group membership APIs: the wire side of the group coordinator's
//! membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and its group
//! admin (DescribeGroups, ListGroups, DeleteGroups); offsets are
//! [`super::offsets`].
//!
//! Each handler converts the `kafka-protocol` message, runs the coordinator
//! through [`crate::coordinator::group::GroupRuntime`] (waiting for the reply delivered to
//! the request's token where the coordinator parks it), and converts back
//! with only the fields the request's version has. Every call runs in a span
//! carrying the group id.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use tracing::{info_span, Instrument};

use super::str_bytes;
use crate::coordinator::group::{ClientInfo, Reply};
use crate::error::wire_code;
use crate::Broker;

/// The reply a dropped waiter gets (the runtime shut down under it).
pub(super) const LOST: ResponseError = ResponseError::CoordinatorNotAvailable;

pub async fn join_group(
    broker: &Broker,
    request: JoinGroupRequest,
    version: i16,
    client: ClientInfo,
) -> JoinGroupResponse {
    let span = info_span!(
        "join_group",
        group = request.group_id.as_str(),
        member = request.member_id.as_str()
    );
    async {
        let reply = broker
            .groups
            .call(|c, token, now| c.join_group(token, &request, version, client, now))
            .await;
        match reply {
            Some(Reply::Join(r)) => protocol_name_as_kafka_sends_it(r, version),
            _ => JoinGroupResponse::default()
                .with_error_code(LOST.code())
                .with_generation_id(-1)
                .with_protocol_name((version < 7).then(|| str_bytes("")))
                .with_member_id(request.member_id.clone()),
        }
    }
    .instrument(span)
    .await
}

/// Kafka's rule for JoinGroup's protocol name: nullable from v7, where an
/// empty name (an error, MEMBER_ID_REQUIRED) goes out as null; before v7 a
/// null one goes out as "".
fn protocol_name_as_kafka_sends_it(mut r: JoinGroupResponse, version: i16) -> JoinGroupResponse {
    if version >= 7 {
        if r.protocol_name.as_ref().is_some_and(|n| n.is_empty()) {
            r.protocol_name = None;
        }
    } else if r.protocol_name.is_none() {
        r.protocol_name = Some(str_bytes(""));
    }
    r
}

pub async fn sync_group(
    broker: &Broker,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let span = info_span!(
        "sync_group",
        group = request.group_id.as_str(),
        member = request.member_id.as_str()
    );
    async {
        let reply = broker
            .groups
            .call(|c, token, now| c.sync_group(token, &request, version, now))
            .await;
        match reply {
            Some(Reply::Sync(mut r)) => {
                if version < 5 {
                    r.protocol_type = None;
                    r.protocol_name = None;
                }
                r
            }
            _ => SyncGroupResponse::default().with_error_code(LOST.code()),
        }
    }
    .instrument(span)
    .await
}

pub fn heartbeat(broker: &Broker, request: HeartbeatRequest) -> HeartbeatResponse {
    let error = broker
        .groups
        .with(|c, now| (c.heartbeat(&request, now), Default::default()));
    HeartbeatResponse::default().with_error_code(wire_code(error))
}

pub fn leave_group(
    broker: &Broker,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let _span = info_span!("leave_group", group = request.group_id.as_str()).entered();
    broker
        .groups
        .with(|c, now| c.leave_group(&request, version, now))
}

pub async fn delete_groups(broker: &Broker, request: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for group in &request.groups_names {
        let name = group.to_string();
        let error = match broker
            .groups
            .call(|c, token, now| c.delete_group(token, &name, now))
            .await
        {
            Some(Reply::Deleted(e)) => e,
            _ => Some(LOST),
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(group.clone())
                .with_error_code(wire_code(error)),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

pub fn describe_groups(
    broker: &Broker,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let coordinator = broker.groups.serving();
    let groups = request
        .groups
        .iter()
        .map(|g: &GroupId| {
            let described = DescribedGroup::default().with_group_id(g.clone());
            match coordinator.describe_group(g.as_str()) {
                Err(e) => described
                    .with_error_code(e.code())
                    .with_group_state(str_bytes("")),
                Ok(d) => {
                    let unknown = d.state == crate::coordinator::group::GroupState::Dead
                        && d.members.is_empty()
                        && d.protocol_type.is_empty();
                    let described = described
                        .with_group_state(str_bytes(d.state.name()))
                        .with_protocol_type(str_bytes(d.protocol_type))
                        .with_protocol_data(str_bytes(d.protocol))
                        .with_members(
                            d.members
                                .into_iter()
                                .map(|m| {
                                    let mut r = DescribedGroupMember::default()
                                        .with_member_id(str_bytes(m.member_id))
                                        .with_client_id(str_bytes(m.client_id))
                                        .with_client_host(str_bytes(m.client_host))
                                        .with_member_metadata(m.metadata.into())
                                        .with_member_assignment(m.assignment.into());
                                    if version >= 4 {
                                        r = r.with_group_instance_id(m.instance_id.map(str_bytes));
                                    }
                                    r
                                })
                                .collect(),
                        );
                    // v6 (KIP-1043) reports an unknown group as not found.
                    if unknown && version >= 6 {
                        described
                            .with_error_code(ResponseError::GroupIdNotFound.code())
                            .with_error_message(Some(str_bytes(format!(
                                "Group {} not found.",
                                g.as_str()
                            ))))
                    } else {
                        described
                    }
                }
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub fn list_groups(
    broker: &Broker,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let listed = match broker.groups.serving().list_groups() {
        Ok(l) => l,
        Err(e) => return ListGroupsResponse::default().with_error_code(e.code()),
    };
    let states: Vec<String> = if version >= 4 {
        request
            .states_filter
            .iter()
            .map(|s| s.to_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let types: Vec<String> = if version >= 5 {
        request
            .types_filter
            .iter()
            .map(|s| s.to_lowercase())
            .collect()
    } else {
        Vec::new()
    };
    let groups = listed
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state.name().to_lowercase()))
        // Every group samsa has is a classic group.
        .filter(|_| types.is_empty() || types.iter().any(|t| t == "classic"))
        .map(|g| {
            let mut r = ListedGroup::default()
                .with_group_id(GroupId(str_bytes(g.group_id)))
                .with_protocol_type(str_bytes(g.protocol_type));
            if version >= 4 {
                r = r.with_group_state(str_bytes(g.state.name()));
            }
            if version >= 5 {
                r = r.with_group_type(str_bytes("classic"));
            }
            r
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}
