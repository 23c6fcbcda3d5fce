//! Membership of a classic group: JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, static members, the rebalance phases and session expiry —
//! the part of [`GroupCoordinator`] that is soft state (changed in memory
//! at once, written as group metadata when a generation completes).

use super::*;

impl GroupCoordinator {
    pub(super) fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        format!(
            "{client_id}-{:016x}-{:x}",
            self.member_id_seed, self.next_member
        )
    }
    pub fn join_group(
        &mut self,
        token: Token,
        request: &JoinGroupRequest,
        now_ms: i64,
    ) -> GroupStep {
        let member_id = request.member_id.clone();
        let fail = |e: ResponseError| {
            GroupStep::reply(token, Reply::Join(JoinGroupResponse::error(e, &member_id)))
        };
        let group_id = request.group_id.clone();
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
            version: request.version,
            member_id: member_id.clone(),
            instance_id: request.group_instance_id.clone(),
            protocol_type: request.protocol_type.clone(),
            protocols: request.protocols.clone(),
            session_timeout_ms: request.session_timeout_ms,
            rebalance_timeout_ms: request.rebalance_timeout_ms,
            client: request.client.clone(),
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
    pub fn sync_group(
        &mut self,
        token: Token,
        request: &SyncGroupRequest,
        now_ms: i64,
    ) -> GroupStep {
        let fail =
            |e: ResponseError| GroupStep::reply(token, Reply::Sync(SyncGroupResponse::error(e)));
        let (group, mut ctx) = match self.group_ctx(&request.group_id, now_ms) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let member_id = request.member_id.as_str();
        if let Err(e) = validate_member(group, member_id, request.group_instance_id.as_deref()) {
            return fail(e);
        }
        if request.generation_id != group.generation {
            return fail(ResponseError::IllegalGeneration);
        }
        if request
            .protocol_type
            .as_ref()
            .is_some_and(|pt| group.protocol_type.as_ref() != Some(pt))
            || request
                .protocol_name
                .as_ref()
                .is_some_and(|pn| group.protocol.as_ref() != Some(pn))
        {
            return fail(ResponseError::InconsistentGroupProtocol);
        }
        match group.state {
            GroupState::Empty | GroupState::Dead => fail(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => fail(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                let Some(m) = group.members.get_mut(member_id) else {
                    return fail(ResponseError::UnknownMemberId);
                };
                m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
                let assignment = m.assignment.clone();
                GroupStep::reply(token, Reply::Sync(sync_ok(group, assignment)))
            }
            GroupState::CompletingRebalance => {
                let is_leader = group.leader.as_deref() == Some(member_id);
                let Some(m) = group.members.get_mut(member_id) else {
                    return fail(ResponseError::UnknownMemberId);
                };
                if let Some(old) = m.sync.replace(token) {
                    ctx.step.deliveries.push((
                        old,
                        Reply::Sync(SyncGroupResponse::error(ResponseError::RebalanceInProgress)),
                    ));
                }
                m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
                if is_leader && group.assignment_write.is_none() {
                    let mut assignments: BTreeMap<String, Bytes> =
                        request.assignments.iter().cloned().collect();
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
    pub fn heartbeat(&mut self, request: &HeartbeatRequest, now_ms: i64) -> HeartbeatResponse {
        HeartbeatResponse {
            error: self.heartbeat_error(request, now_ms),
        }
    }

    fn heartbeat_error(
        &mut self,
        request: &HeartbeatRequest,
        now_ms: i64,
    ) -> Option<ResponseError> {
        let (group, _) = match self.group_ctx(&request.group_id, now_ms) {
            Ok(x) => x,
            Err(e) => return Some(e),
        };
        let member_id = request.member_id.as_str();
        if let Err(e) = validate_member(group, member_id, request.group_instance_id.as_deref()) {
            return Some(e);
        }
        if matches!(group.state, GroupState::Empty | GroupState::Dead) {
            return Some(ResponseError::UnknownMemberId);
        }
        if request.generation_id != group.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        if let Some(m) = group.members.get_mut(member_id) {
            m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
        }
        (group.state == GroupState::PreparingRebalance)
            .then_some(ResponseError::RebalanceInProgress)
    }
    /// LeaveGroup; v3+ leaves a batch of members (by member id and/or
    /// group instance id) and answers for each, older versions one member
    /// id with one error.
    pub fn leave_group(
        &mut self,
        request: &LeaveGroupRequest,
        now_ms: i64,
    ) -> (LeaveGroupResponse, GroupStep) {
        let batch = request.version >= 3;
        let left = |m: &LeavingMember, error| LeftMember {
            member_id: m.member_id.clone(),
            group_instance_id: m.group_instance_id.clone(),
            error,
        };
        let (group, mut ctx) = match self.group_ctx(&request.group_id, now_ms) {
            Ok(x) => x,
            Err(ResponseError::UnknownMemberId) if batch => {
                let members = request
                    .members
                    .iter()
                    .map(|m| left(m, Some(ResponseError::UnknownMemberId)))
                    .collect();
                let response = LeaveGroupResponse {
                    error: None,
                    members,
                };
                return (response, GroupStep::default());
            }
            Err(e) => {
                let response = LeaveGroupResponse {
                    error: Some(e),
                    members: Vec::new(),
                };
                return (response, GroupStep::default());
            }
        };
        let mut results = Vec::new();
        let mut removed_any = false;
        for m in &request.members {
            let error = leave_one(
                group,
                &m.member_id,
                m.group_instance_id.as_deref(),
                &mut ctx.step,
            );
            removed_any |= error.is_none();
            results.push(left(m, error));
        }
        if removed_any {
            info!(group = %request.group_id, members = request.members.len(), "members left the group");
            members_changed(group, &mut ctx);
        }
        let response = if batch {
            LeaveGroupResponse {
                error: None,
                members: results,
            }
        } else {
            LeaveGroupResponse {
                error: results.first().and_then(|r| r.error),
                members: Vec::new(),
            }
        };
        (response, ctx.step)
    }
    /// The leader's assignment for `generation` is durable (or failed with
    /// `error`): the group becomes Stable and every waiting SyncGroup gets
    /// its member's assignment; on failure the members get the error and
    /// the group rebalances (Kafka's behaviour).
    pub(super) fn assignment_written(
        &mut self,
        id: WriteId,
        group_id: &str,
        generation: i32,
        error: Option<ResponseError>,
        now_ms: i64,
    ) -> GroupStep {
        let Some(group) = self.groups.get_mut(group_id) else {
            return GroupStep::default();
        };
        if group.assignment_write == Some(id) {
            group.assignment_write = None;
        }
        if group.generation != generation || group.state != GroupState::CompletingRebalance {
            return GroupStep::default();
        }
        let mut step = GroupStep::default();
        let Some(e) = error else {
            group.transition(GroupState::Stable, now_ms);
            if let Some(meters) = &self.meters {
                meters.rebalanced(now_ms - group.rebalance_started);
            }
            for m in group.members.values_mut() {
                if let Some(t) = m.sync.take() {
                    let r = SyncGroupResponse::ok(
                        m.assignment.clone(),
                        group.protocol_type.as_deref(),
                        group.protocol.as_deref(),
                    );
                    step.deliveries.push((t, Reply::Sync(r)));
                }
                m.session_deadline = now_ms + i64::from(m.session_timeout_ms);
            }
            info!(group = %group.id, generation, members = group.members.len(), "group stable");
            return step;
        };
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
            if let Some(t) = m.sync.take() {
                step.deliveries
                    .push((t, Reply::Sync(SyncGroupResponse::error(e))));
            }
        }
        let Ok(epoch) = self.owner(group_id) else {
            return step;
        };
        let Some(group) = self.groups.get_mut(group_id) else {
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
        ctx.step
    }
}

pub(super) struct JoinArgs {
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

/// The answer to a SyncGroup with the member's `assignment`.
pub(super) fn sync_ok(group: &Group, assignment: Bytes) -> SyncGroupResponse {
    SyncGroupResponse::ok(
        assignment,
        group.protocol_type.as_deref(),
        group.protocol.as_deref(),
    )
}

pub(super) fn fail_parked(step: &mut GroupStep, m: &Member, error: ResponseError) {
    if let Some(t) = m.join {
        step.deliveries
            .push((t, Reply::Join(JoinGroupResponse::error(error, &m.id))));
    }
    if let Some(t) = m.sync {
        step.deliveries
            .push((t, Reply::Sync(SyncGroupResponse::error(error))));
    }
}

/// The member named by a SyncGroup / Heartbeat / OffsetCommit exists, and a
/// static member's instance id still maps to it.
pub(super) fn validate_member(
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

/// One member of a LeaveGroup: removed (`None`) or the error.
pub(super) fn leave_one(
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

pub(super) fn remove_member_bookkeeping(
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
pub(super) fn members_changed(group: &mut Group, ctx: &mut Ctx<'_>) {
    match group.state {
        GroupState::Stable | GroupState::CompletingRebalance => {
            prepare_rebalance(group, ctx, "a member left")
        }
        GroupState::PreparingRebalance => try_complete_join(group, ctx),
        GroupState::Empty | GroupState::Dead => {}
    }
}

/// JoinGroup on a loaded group (see the module docs for the cases).
pub(super) fn join(group: &mut Group, ctx: &mut Ctx<'_>, args: JoinArgs, fresh_id: Option<String>) {
    let fail = |ctx: &mut Ctx<'_>, e: ResponseError, member_id: &str| {
        ctx.step.deliveries.push((
            args.token,
            Reply::Join(JoinGroupResponse::error(e, member_id)),
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
                let response = join_response(group, &member_id, is_leader);
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

pub(super) fn new_member(group: &mut Group, args: &JoinArgs, id: String, now_ms: i64) -> Member {
    group.next_join_seq += 1;
    Member {
        id,
        instance_id: args.instance_id.clone(),
        client: args.client.clone(),
        rebalance_timeout_ms: args.rebalance_timeout_ms,
        session_timeout_ms: args.session_timeout_ms,
        protocols: args.protocols.clone(),
        assignment: Bytes::new(),
        join: Some(args.token),
        sync: None,
        session_deadline: now_ms + i64::from(args.session_timeout_ms),
        joined_seq: group.next_join_seq,
    }
}

pub(super) fn add_member_and_rebalance(
    group: &mut Group,
    ctx: &mut Ctx<'_>,
    args: JoinArgs,
    id: String,
) {
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
pub(super) fn revert_static_rejoin(
    group: &mut Group,
    previous: Member,
    new_id: &str,
    was_leader: bool,
) {
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
pub(super) fn replace_static_member(
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
            let mut response = join_response(group, &new_id, false);
            if is_leader && args.version >= 9 {
                // KIP-814: the leader may skip the assignment it already made.
                response = join_response(group, &new_id, true);
                response.skip_assignment = true;
            }
            // Answered once the new member id is durable; a failed write
            // puts the old member back (Kafka's static-member replacement).
            let record = group_metadata_record(&group.id, Some(&group.stored()));
            let kind = WriteKind::StaticRejoin {
                token: args.token,
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
                m.join = Some(args.token);
            }
            try_complete_join(group, ctx);
        }
        _ => {
            if let Some(m) = group.members.get_mut(&new_id) {
                m.join = Some(args.token);
            }
            prepare_rebalance(group, ctx, "a static member rejoined with other protocols");
        }
    }
}

pub(super) fn update_member(group: &mut Group, ctx: &mut Ctx<'_>, args: &JoinArgs) {
    let Some(m) = group.members.get_mut(&args.member_id) else {
        return;
    };
    if let Some(old) = m.join.replace(args.token) {
        // A repeated JoinGroup replaces the one waiting.
        ctx.step.deliveries.push((
            old,
            Reply::Join(JoinGroupResponse::error(
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
pub(super) fn prepare_rebalance(group: &mut Group, ctx: &mut Ctx<'_>, reason: &str) {
    if group.state == GroupState::CompletingRebalance {
        // Members waiting for an assignment must rejoin.
        group.assignment_write = None;
        for m in group.members.values_mut() {
            m.assignment = Bytes::new();
            if let Some(t) = m.sync.take() {
                ctx.step.deliveries.push((
                    t,
                    Reply::Sync(SyncGroupResponse::error(ResponseError::RebalanceInProgress)),
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
pub(super) fn try_complete_join(group: &mut Group, ctx: &mut Ctx<'_>) {
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
pub(super) fn complete_join(group: &mut Group, ctx: &mut Ctx<'_>) {
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
        let response = join_response(group, &id, is_leader);
        ctx.step.deliveries.push((parked, Reply::Join(response)));
        if let Some(m) = group.members.get_mut(&id) {
            m.join = None;
            m.session_deadline = ctx.now_ms + i64::from(m.session_timeout_ms);
        }
    }
}

/// The JoinGroup answer for `member_id` at the current generation; the
/// leader (`with_members`) gets every member's metadata.
pub(super) fn join_response(
    group: &Group,
    member_id: &str,
    with_members: bool,
) -> JoinGroupResponse {
    let protocol = group.protocol.clone().unwrap_or_default();
    let members = if with_members {
        group
            .members
            .values()
            .map(|m| JoinGroupMember {
                member_id: m.id.clone(),
                group_instance_id: m.instance_id.clone(),
                metadata: m.metadata_for(&protocol),
            })
            .collect()
    } else {
        Vec::new()
    };
    JoinGroupResponse {
        error: None,
        generation_id: group.generation,
        protocol_type: group.protocol_type.clone(),
        protocol_name: Some(protocol),
        leader: group.leader.clone().unwrap_or_default(),
        skip_assignment: false,
        member_id: member_id.to_string(),
        members,
    }
}

/// Timer work on one group (see [`GroupCoordinator::tick`]).
pub(super) fn expire(group: &mut Group, ctx: &mut Ctx<'_>) {
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
