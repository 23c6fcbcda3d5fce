//! Group membership APIs: the wire side of the group coordinator's
//! membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) and its group
//! admin (DescribeGroups, ListGroups, DeleteGroups); offsets are
//! [`super::offsets`].
//!
//! Each handler converts the `kafka-protocol` message to the coordinator's
//! [`crate::coordinator::group::api`] structs, runs the coordinator through
//! [`crate::coordinator::group::GroupRuntime`] (waiting for the reply
//! delivered to the request's token where the coordinator parks it), and
//! converts back with only the fields the request's version has, as Kafka
//! fills them. Every call runs in a span carrying the group id.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::{
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, SyncGroupRequest,
    SyncGroupResponse,
};
use tracing::{info_span, Instrument};

use super::str_bytes;
use crate::coordinator::group::{self, ClientInfo, Reply};
use crate::error::wire_code;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
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
        let request = join_request(&request, version, client);
        let reply = broker
            .groups
            .call(|c, token, now| c.join_group(token, &request, now))
            .await;
        let response = match reply {
            Some(Reply::Join(r)) => r,
            _ => group::JoinGroupResponse::error(LOST, &request.member_id),
        };
        join_response(response, version)
    }
    .instrument(span)
    .await
}

fn join_request(
    request: &JoinGroupRequest,
    version: i16,
    client: ClientInfo,
) -> group::JoinGroupRequest {
    group::JoinGroupRequest {
        group_id: request.group_id.to_string(),
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
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
        version,
    }
}

/// The JoinGroup answer with the fields of `version`: a member's group
/// instance id from v5, the protocol type from v7, and Kafka's rule for the
/// protocol name — nullable from v7, where an empty name (an error,
/// MEMBER_ID_REQUIRED) goes out as null; before v7 a null one goes out as "".
fn join_response(r: group::JoinGroupResponse, version: i16) -> JoinGroupResponse {
    let protocol_name = if version >= 7 {
        r.protocol_name.filter(|n| !n.is_empty())
    } else {
        Some(r.protocol_name.unwrap_or_default())
    };
    let members = r
        .members
        .into_iter()
        .map(|m| {
            let member = JoinGroupResponseMember::default()
                .with_member_id(str_bytes(m.member_id))
                .with_metadata(m.metadata);
            if version >= 5 {
                member.with_group_instance_id(m.group_instance_id.map(str_bytes))
            } else {
                member
            }
        })
        .collect();
    let response = JoinGroupResponse::default()
        .with_error_code(wire_code(r.error))
        .with_generation_id(r.generation_id)
        .with_protocol_name(protocol_name.map(str_bytes))
        .with_leader(str_bytes(r.leader))
        .with_skip_assignment(r.skip_assignment)
        .with_member_id(str_bytes(r.member_id))
        .with_members(members);
    if version >= 7 {
        response.with_protocol_type(r.protocol_type.map(str_bytes))
    } else {
        response
    }
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
        let request = sync_request(&request);
        let reply = broker
            .groups
            .call(|c, token, now| c.sync_group(token, &request, now))
            .await;
        let response = match reply {
            Some(Reply::Sync(r)) => r,
            _ => group::SyncGroupResponse::error(LOST),
        };
        sync_response(response, version)
    }
    .instrument(span)
    .await
}

/// A SyncGroup's protocol type and name are on the wire from v5 (`None`
/// before).
fn sync_request(request: &SyncGroupRequest) -> group::SyncGroupRequest {
    group::SyncGroupRequest {
        group_id: request.group_id.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        protocol_type: request.protocol_type.as_ref().map(|s| s.to_string()),
        protocol_name: request.protocol_name.as_ref().map(|s| s.to_string()),
        assignments: request
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.clone()))
            .collect(),
    }
}

/// The SyncGroup answer; the protocol type and name only from v5.
fn sync_response(r: group::SyncGroupResponse, version: i16) -> SyncGroupResponse {
    let response = SyncGroupResponse::default()
        .with_error_code(wire_code(r.error))
        .with_assignment(r.assignment);
    if version >= 5 {
        response
            .with_protocol_type(r.protocol_type.map(str_bytes))
            .with_protocol_name(r.protocol_name.map(str_bytes))
    } else {
        response
    }
}

pub fn heartbeat(broker: &Broker, request: HeartbeatRequest) -> HeartbeatResponse {
    let request = group::HeartbeatRequest {
        group_id: request.group_id.to_string(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
    };
    let response = broker
        .groups
        .with(|c, now| (c.heartbeat(&request, now), Default::default()));
    HeartbeatResponse::default().with_error_code(wire_code(response.error))
}

pub fn leave_group(
    broker: &Broker,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let _span = info_span!("leave_group", group = request.group_id.as_str()).entered();
    let request = leave_request(&request, version);
    let response = broker.groups.with(|c, now| c.leave_group(&request, now));
    leave_response(response)
}

/// v3+ leaves a batch (member id and/or group instance id); before, the
/// request's one member id.
fn leave_request(request: &LeaveGroupRequest, version: i16) -> group::LeaveGroupRequest {
    let members = if version >= 3 {
        request
            .members
            .iter()
            .map(|m| group::LeavingMember {
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.as_ref().map(|s| s.to_string()),
            })
            .collect()
    } else {
        vec![group::LeavingMember {
            member_id: request.member_id.to_string(),
            group_instance_id: None,
        }]
    };
    group::LeaveGroupRequest {
        group_id: request.group_id.to_string(),
        members,
        version,
    }
}

/// The LeaveGroup answer; the coordinator lists members only for v3+.
fn leave_response(r: group::LeaveGroupResponse) -> LeaveGroupResponse {
    let members = r
        .members
        .into_iter()
        .map(|m| {
            MemberResponse::default()
                .with_member_id(str_bytes(m.member_id))
                .with_group_instance_id(m.group_instance_id.map(str_bytes))
                .with_error_code(wire_code(m.error))
        })
        .collect();
    LeaveGroupResponse::default()
        .with_error_code(wire_code(r.error))
        .with_members(members)
}

pub async fn delete_groups(
    broker: &Broker,
    access: &Access,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for group in &request.groups_names {
        let name = group.to_string();
        if !access.allows_group(AclOperation::Delete, &name) {
            results.push(
                DeletableGroupResult::default()
                    .with_group_id(group.clone())
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code()),
            );
            continue;
        }
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
    access: &Access,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let coordinator = broker.groups.serving();
    let groups = request
        .groups
        .iter()
        .map(|g: &GroupId| {
            let described = DescribedGroup::default().with_group_id(g.clone());
            if !access.allows_group(AclOperation::Describe, g.as_str()) {
                return described
                    .with_error_code(ResponseError::GroupAuthorizationFailed.code())
                    .with_group_state(str_bytes(""));
            }
            match coordinator.describe_group(g.as_str()) {
                Err(e) => described
                    .with_error_code(e.code())
                    .with_group_state(str_bytes("")),
                Ok(d) => {
                    let unknown = d.state == crate::coordinator::group::GroupState::Dead
                        && d.members.is_empty()
                        && d.protocol_type.is_empty();
                    let mut described = described;
                    if version >= 3 && request.include_authorized_operations {
                        described.authorized_operations = access.authorized_operations(
                            crate::security::access::GROUP_OPERATIONS,
                            crate::security::acl::ResourceType::Group,
                            g.as_str(),
                        );
                    }
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
    access: &Access,
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
    // Kafka: DESCRIBE on the cluster lists every group, otherwise only
    // the groups the caller may DESCRIBE.
    let all = access.allows_cluster(AclOperation::Describe);
    let groups = listed
        .into_iter()
        .filter(|g| all || access.allows_group(AclOperation::Describe, &g.group_id))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::protocol::{Decodable, Encodable};

    use super::*;

    /// Encodes `message` at `version` (which fails if it holds a field the
    /// version does not have) and decodes it again, as a client would.
    fn on_the_wire<M: Encodable + Decodable>(message: &M, version: i16) -> M {
        let mut buf = BytesMut::new();
        message
            .encode(&mut buf, version)
            .unwrap_or_else(|e| panic!("v{version} does not encode: {e}"));
        M::decode(&mut buf.freeze(), version).unwrap()
    }

    fn leader_answer(version: i16) -> group::JoinGroupResponse {
        group::JoinGroupResponse {
            error: None,
            generation_id: 3,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("range".into()),
            leader: "m1".into(),
            // The coordinator sets it only for v9+ (KIP-814).
            skip_assignment: version >= 9,
            member_id: "m1".into(),
            members: vec![group::JoinGroupMember {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                metadata: Bytes::from_static(b"meta"),
            }],
        }
    }

    #[test]
    fn join_answers_have_the_fields_of_their_version() {
        for version in 0..=9 {
            let r = on_the_wire(&join_response(leader_answer(version), version), version);
            assert_eq!((r.error_code, r.generation_id), (0, 3));
            assert_eq!(r.protocol_name.as_deref(), Some("range"));
            assert_eq!((r.leader.as_str(), r.member_id.as_str()), ("m1", "m1"));
            assert_eq!(r.skip_assignment, version >= 9);
            assert_eq!(
                r.protocol_type.as_deref(),
                (version >= 7).then_some("consumer"),
                "v{version}"
            );
            assert_eq!(r.members.len(), 1);
            assert_eq!(r.members[0].metadata.as_ref(), b"meta");
            assert_eq!(
                r.members[0].group_instance_id.as_deref(),
                (version >= 5).then_some("i1"),
                "v{version}"
            );

            let error = group::JoinGroupResponse::error(ResponseError::MemberIdRequired, "m2");
            let r = on_the_wire(&join_response(error, version), version);
            assert_eq!(r.error_code, ResponseError::MemberIdRequired.code());
            assert_eq!((r.generation_id, r.member_id.as_str()), (-1, "m2"));
            assert_eq!(r.leader.as_str(), "");
            // Nullable from v7, where an empty name goes out as null.
            assert_eq!(
                r.protocol_name.as_deref(),
                (version < 7).then_some(""),
                "v{version}"
            );
        }
    }

    #[test]
    fn join_requests_before_v1_rebalance_within_the_session_timeout() {
        let wire = JoinGroupRequest::default()
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(30_000);
        let client = ClientInfo::default();
        assert_eq!(
            join_request(&wire, 0, client.clone()).rebalance_timeout_ms,
            10_000
        );
        assert_eq!(join_request(&wire, 1, client).rebalance_timeout_ms, 30_000);
    }

    #[test]
    fn sync_answers_name_the_protocol_from_v5() {
        for version in 0..=5 {
            let ok = group::SyncGroupResponse::ok(
                Bytes::from_static(b"a"),
                Some("consumer"),
                Some("range"),
            );
            let r = on_the_wire(&sync_response(ok, version), version);
            assert_eq!((r.error_code, r.assignment.as_ref()), (0, &b"a"[..]));
            let expected = |name| (version >= 5).then_some(name);
            assert_eq!(r.protocol_type.as_deref(), expected("consumer"));
            assert_eq!(r.protocol_name.as_deref(), expected("range"));
        }
    }

    #[test]
    fn leave_group_is_one_member_before_v3_and_a_batch_after() {
        let wire = LeaveGroupRequest::default()
            .with_member_id(str_bytes("m1"))
            .with_members(vec![MemberIdentity::default()
                .with_member_id(str_bytes(""))
                .with_group_instance_id(Some(str_bytes("i1")))]);
        let old = leave_request(&wire, 2);
        assert_eq!(old.version, 2);
        assert_eq!(
            old.members,
            vec![group::LeavingMember {
                member_id: "m1".into(),
                group_instance_id: None,
            }]
        );
        let batch = leave_request(&wire, 3);
        assert_eq!(
            batch.members,
            vec![group::LeavingMember {
                member_id: String::new(),
                group_instance_id: Some("i1".into()),
            }]
        );

        for version in 0..=2 {
            let one = group::LeaveGroupResponse {
                error: Some(ResponseError::UnknownMemberId),
                members: Vec::new(),
            };
            let r = on_the_wire(&leave_response(one), version);
            assert_eq!(r.error_code, ResponseError::UnknownMemberId.code());
        }
        for version in 3..=5 {
            let each = group::LeaveGroupResponse {
                error: None,
                members: vec![group::LeftMember {
                    member_id: "m1".into(),
                    group_instance_id: Some("i1".into()),
                    error: Some(ResponseError::FencedInstanceId),
                }],
            };
            let r = on_the_wire(&leave_response(each), version);
            assert_eq!(r.error_code, 0);
            assert_eq!(r.members.len(), 1);
            assert_eq!(r.members[0].member_id.as_str(), "m1");
            assert_eq!(r.members[0].group_instance_id.as_deref(), Some("i1"));
            assert_eq!(
                r.members[0].error_code,
                ResponseError::FencedInstanceId.code()
            );
        }
    }
}
