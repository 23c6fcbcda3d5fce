//! Committed offsets of a group: OffsetCommit, TxnOffsetCommit (offsets
//! pending until the producer's marker), OffsetFetch, OffsetDelete and
//! retention — the part of [`GroupCoordinator`] whose changes become
//! visible only once their records are durable.

use super::*;

impl GroupCoordinator {
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
    /// OffsetCommit at API `version`: checks generation and member, then
    /// writes the offsets; the reply is delivered once they are durable.
    pub fn offset_commit(
        &mut self,
        token: Token,
        request: &CommitRequest,
        version: i16,
        now_ms: i64,
    ) -> GroupStep {
        let if_unknown = if request.generation_id < 0 {
            UnknownGroup::Create
        } else if version >= 9 {
            // A group-managed commit for a group this coordinator does not
            // know: v9+ says so (meaningful to both group protocols); older
            // clients only understand ILLEGAL_GENERATION.
            UnknownGroup::Refuse(ResponseError::GroupIdNotFound)
        } else {
            UnknownGroup::Refuse(ResponseError::IllegalGeneration)
        };
        self.commit(token, request, if_unknown, None, now_ms, |group| {
            validate_commit(
                group,
                request.generation_id,
                &request.member_id,
                request.group_instance_id.as_deref(),
                now_ms,
            )
        })
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
        let if_unknown = if request.generation_id < 0 && request.member_id.is_empty() {
            UnknownGroup::Create
        } else {
            // Every TxnOffsetCommit version answers ILLEGAL_GENERATION there.
            UnknownGroup::Refuse(ResponseError::IllegalGeneration)
        };
        self.commit(
            token,
            request,
            if_unknown,
            Some(producer),
            now_ms,
            |group| validate_txn_commit(group, request),
        )
    }
    /// What both commits do: find the group (see [`UnknownGroup`]), check
    /// the committer with `validate`, then write the offsets (for
    /// `producer`: as its transactional batch). A refusal answers every
    /// partition with its error.
    fn commit(
        &mut self,
        token: Token,
        request: &CommitRequest,
        if_unknown: UnknownGroup,
        producer: Option<TransactionalWrite>,
        now_ms: i64,
        validate: impl FnOnce(&mut Group) -> Result<(), ResponseError>,
    ) -> GroupStep {
        let checked = self
            .commit_context(request, if_unknown, now_ms)
            .and_then(|(group, ctx)| {
                validate(&mut *group)?;
                Ok((group, ctx))
            });
        match checked {
            Err(e) => refuse_all(token, request, e),
            Ok((group, mut ctx)) => {
                write_commit(group, &mut ctx, token, request, producer);
                ctx.step
            }
        }
    }
    /// The group a commit goes to; an unknown one is created (Empty) or the
    /// commit refused, as `if_unknown` says.
    fn commit_context(
        &mut self,
        request: &CommitRequest,
        if_unknown: UnknownGroup,
        now_ms: i64,
    ) -> Result<(&mut Group, Ctx<'_>), ResponseError> {
        if request.group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        self.owner(&request.group_id)?;
        if !self.groups.contains_key(&request.group_id) {
            if let UnknownGroup::Refuse(e) = if_unknown {
                return Err(e);
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
    /// An offset commit's write is durable (`Ok(base offset)`) or failed:
    /// only now do its offsets become visible — or, in a transaction,
    /// pending until the producer's marker — and the request is answered.
    pub(super) fn commit_written(
        &mut self,
        group_id: &str,
        token: Token,
        offsets: CommitOffsets,
        refused: Vec<PartitionResult>,
        producer_id: Option<i64>,
        written: Result<i64, ResponseError>,
    ) -> GroupStep {
        if let Some(group) = self.groups.get_mut(group_id) {
            if producer_id.is_none() {
                for (tp, _) in &offsets {
                    if let Some(n) = group.pending_commits.get_mut(tp) {
                        *n -= 1;
                        if *n == 0 {
                            group.pending_commits.remove(tp);
                        }
                    }
                }
            }
            if let Ok(log_offset) = written {
                if let Some(meters) = &self.meters {
                    meters.offsets_committed(offsets.len());
                }
                let logged = offsets.iter().map(|(tp, o)| {
                    let logged = LoggedOffset {
                        value: o.clone(),
                        log_offset,
                    };
                    (tp.clone(), logged)
                });
                match producer_id {
                    // Writes can complete out of log order.
                    None => commit_offsets(&mut group.offsets, logged),
                    Some(pid) => group.pending_txn.entry(pid).or_default().extend(logged),
                }
            }
        }
        let error = match written {
            // Unloaded meanwhile: the next coordinator reads the record.
            Ok(_) if !self.groups.contains_key(group_id) => Some(ResponseError::NotCoordinator),
            Ok(_) => None,
            Err(e) => Some(e),
        };
        let partitions = offsets.into_iter().map(|(tp, _)| tp);
        answer(token, refused, partitions, error)
    }

    /// An OffsetDelete's tombstones are durable (or failed with `error`).
    pub(super) fn offsets_deleted(
        &mut self,
        group_id: &str,
        token: Token,
        partitions: Vec<(String, i32)>,
        refused: Vec<PartitionResult>,
        error: Option<ResponseError>,
    ) -> GroupStep {
        if let (Some(group), None) = (self.groups.get_mut(group_id), error) {
            for tp in &partitions {
                group.offsets.remove(tp);
            }
        }
        answer(token, refused, partitions, error)
    }
}

/// What a commit to a group this coordinator does not know gets.
enum UnknownGroup {
    /// A commit outside group membership (a standalone committer): the
    /// group is created, Empty.
    Create,
    Refuse(ResponseError),
}

/// The reply to a commit or an OffsetDelete: the partitions refused before
/// its write, then `partitions`, each with `error`.
fn answer(
    token: Token,
    mut refused: Vec<PartitionResult>,
    partitions: impl IntoIterator<Item = (String, i32)>,
    error: Option<ResponseError>,
) -> GroupStep {
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

/// OffsetCommit's generation and member checks, in Kafka's order: the
/// member before the generation, so a consumer that lost its membership
/// hears UNKNOWN_MEMBER_ID (and rejoins with a fresh id) also when the group
/// has meanwhile gone Empty. Generation -1 with no member on an empty group
/// is a simple (standalone) commit.
pub(super) fn validate_commit(
    group: &mut Group,
    generation: i32,
    member_id: &str,
    instance_id: Option<&str>,
    now_ms: i64,
) -> Result<(), ResponseError> {
    match group.state {
        GroupState::Dead => return Err(ResponseError::CoordinatorNotAvailable),
        GroupState::Empty if generation < 0 => return Ok(()),
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
pub(super) fn validate_txn_commit(
    group: &Group,
    request: &CommitRequest,
) -> Result<(), ResponseError> {
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
pub(super) fn offsets_to_write(
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

/// Every partition of a commit refused with `error`.
fn refuse_all(token: Token, request: &CommitRequest, error: ResponseError) -> GroupStep {
    let partitions = request
        .partitions
        .iter()
        .map(|p| (p.topic.clone(), p.partition));
    answer(token, Vec::new(), partitions, Some(error))
}

/// Writes a checked commit's offsets (for a transaction's producer: as its
/// transactional batch); answered at once if none is left to write.
pub(super) fn write_commit(
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
