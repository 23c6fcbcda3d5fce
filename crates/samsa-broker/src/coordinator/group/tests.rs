//! Unit tests of the group coordinator: no sockets, no clock, no disk. The
//! harness plays the runtime: it hands out tokens, keeps the replies delivered
//! to them, "persists" writes into an in-memory log per `__consumer_offsets`
//! partition, and can rebuild a coordinator from that log as a new leader
//! would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;

use super::records::{
    decode_group_record, group_metadata_record, offset_record, replay, OffsetAndMetadata,
    StoredGroup, StoredMember,
};
use crate::coordinator::{Coordinator, LogEntry, StateRecord, TransactionalWrite, Write};

/// The group coordinator never asks for producer ids.
fn no_ids() -> impl FnMut() -> Result<i64, ResponseError> {
    || Err(ResponseError::UnknownServerError)
}
use super::*;
use crate::coordinator::placement::LedByImage;

use ResponseError as E;

const GROUP: &str = "g";
const SESSION: i32 = 10_000;
const REBALANCE: i32 = 30_000;

struct Harness {
    c: GroupCoordinator,
    next_token: u64,
    replies: BTreeMap<Token, Reply>,
    /// Writes not yet completed.
    writes: Vec<Write>,
    /// Durable log per partition.
    log: BTreeMap<i32, Vec<LogEntry>>,
    now: i64,
}

impl Harness {
    fn new(delay_ms: i32) -> Self {
        Self::with(GroupConfig {
            initial_rebalance_delay_ms: delay_ms,
            ..GroupConfig::default()
        })
    }

    fn with(config: GroupConfig) -> Self {
        let mut c = GroupCoordinator::new(config, 7);
        let p = c.partition_for(GROUP);
        c.begin_loading(p, 1).unwrap();
        c.finish_loading(p, 1, BTreeMap::new(), 0, &mut no_ids())
            .unwrap();
        Harness {
            c,
            next_token: 0,
            replies: BTreeMap::new(),
            writes: Vec::new(),
            log: BTreeMap::new(),
            now: 1_000,
        }
    }

    fn token(&mut self) -> Token {
        self.next_token += 1;
        Token(self.next_token)
    }

    fn apply(&mut self, step: GroupStep) {
        for (t, r) in step.deliveries {
            assert!(self.replies.insert(t, r).is_none(), "two replies to {t:?}");
        }
        self.writes.extend(step.writes);
    }

    /// Completes every write in flight as durable (or with `error`).
    fn flush(&mut self, error: Option<ResponseError>) {
        while !self.writes.is_empty() {
            let writes = std::mem::take(&mut self.writes);
            for w in writes {
                let log = self.log.entry(w.partition).or_default();
                let base_offset = log.len() as i64;
                if error.is_none() {
                    for r in &w.records {
                        log.push(LogEntry::Record {
                            offset: log.len() as i64,
                            producer_id: w.transactional.as_ref().map(|t| t.producer_id),
                            key: r.key.clone(),
                            value: r.value.clone(),
                        });
                    }
                }
                let step =
                    self.c
                        .complete_write(w.id, error.map_or(Ok(base_offset), Err), self.now);
                self.apply(step);
            }
        }
    }

    fn take(&mut self, t: Token) -> Option<Reply> {
        self.replies.remove(&t)
    }

    /// A JoinGroup of a consumer (version: see [`Self::join_with`]).
    fn join_request(
        member: &str,
        instance: Option<&str>,
        protocols: &[(&str, &[u8])],
    ) -> JoinGroupRequest {
        JoinGroupRequest {
            group_id: GROUP.into(),
            member_id: member.into(),
            group_instance_id: instance.map(Into::into),
            protocol_type: "consumer".into(),
            protocols: protocols
                .iter()
                .map(|(n, m)| (n.to_string(), Bytes::copy_from_slice(m)))
                .collect(),
            session_timeout_ms: SESSION,
            rebalance_timeout_ms: REBALANCE,
            client: ClientInfo {
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
            },
            version: 9,
        }
    }

    /// Sends a JoinGroup; its token (the reply may come later).
    fn join(&mut self, member: &str, instance: Option<&str>) -> Token {
        self.join_with(Self::join_request(member, instance, &[("range", b"m")]), 9)
    }

    /// Sends `request` as a JoinGroup of `version`.
    fn join_with(&mut self, request: JoinGroupRequest, version: i16) -> Token {
        let t = self.token();
        let request = JoinGroupRequest { version, ..request };
        let step = self.c.join_group(t, &request, self.now);
        self.apply(step);
        t
    }

    fn join_reply(&mut self, t: Token) -> JoinGroupResponse {
        match self.take(t) {
            Some(Reply::Join(r)) => r,
            other => panic!("no JoinGroup reply for {t:?}: {other:?}"),
        }
    }

    /// A new dynamic member: MEMBER_ID_REQUIRED, then the join with that id.
    fn new_member(&mut self) -> (String, Token) {
        let t = self.join("", None);
        let r = self.join_reply(t);
        assert_eq!(r.error, Some(E::MemberIdRequired));
        let id = r.member_id;
        (id.clone(), self.join(&id, None))
    }

    fn sync(&mut self, member: &str, generation: i32, assignments: &[(&str, &[u8])]) -> Token {
        let t = self.token();
        let request = SyncGroupRequest {
            group_id: GROUP.into(),
            generation_id: generation,
            member_id: member.into(),
            group_instance_id: None,
            protocol_type: None,
            protocol_name: None,
            assignments: assignments
                .iter()
                .map(|(m, a)| (m.to_string(), Bytes::copy_from_slice(a)))
                .collect(),
        };
        let step = self.c.sync_group(t, &request, self.now);
        self.apply(step);
        t
    }

    fn sync_reply(&mut self, t: Token) -> SyncGroupResponse {
        match self.take(t) {
            Some(Reply::Sync(r)) => r,
            other => panic!("no SyncGroup reply for {t:?}: {other:?}"),
        }
    }

    fn heartbeat(
        &mut self,
        member: &str,
        instance: Option<&str>,
        generation: i32,
    ) -> Option<ResponseError> {
        let request = HeartbeatRequest {
            group_id: GROUP.into(),
            generation_id: generation,
            member_id: member.into(),
            group_instance_id: instance.map(Into::into),
        };
        self.c.heartbeat(&request, self.now).error
    }

    /// A LeaveGroup of `version` for `members` (member id, instance id);
    /// its answer.
    fn leave(&mut self, members: &[(&str, Option<&str>)], version: i16) -> LeaveGroupResponse {
        let request = LeaveGroupRequest {
            group_id: GROUP.into(),
            members: members
                .iter()
                .map(|(id, instance)| LeavingMember {
                    member_id: (*id).into(),
                    group_instance_id: instance.map(Into::into),
                })
                .collect(),
            version,
        };
        let (response, step) = self.c.leave_group(&request, self.now);
        self.apply(step);
        response
    }

    fn tick_at(&mut self, now: i64) {
        self.now = now;
        let step = self.c.tick(now, &mut no_ids());
        self.apply(step);
    }

    fn commit(&mut self, generation: i32, member: &str, offset: i64) -> Token {
        self.commit_at(generation, member, offset, 9)
    }

    fn commit_at(&mut self, generation: i32, member: &str, offset: i64, version: i16) -> Token {
        let t = self.token();
        let request = commit_request(generation, member, None, offset);
        let step = self.c.offset_commit(t, &request, version, self.now);
        self.apply(step);
        t
    }

    fn commit_error(&mut self, t: Token) -> Option<ResponseError> {
        match self.take(t) {
            Some(Reply::Commit(r)) => r[0].error,
            other => panic!("no commit reply for {t:?}: {other:?}"),
        }
    }

    fn committed(&self, require_stable: bool) -> Result<Option<i64>, ResponseError> {
        let topics = vec![("t".to_string(), vec![0])];
        let r = self.c.offset_fetch(GROUP, Some(&topics), require_stable)?;
        match r[0].error {
            Some(e) => Err(e),
            None => Ok(r[0].offset.as_ref().map(|o| o.offset)),
        }
    }

    fn state(&self) -> GroupState {
        self.c.describe_group(GROUP).unwrap().state
    }

    /// One static member (`instance`) joined, synced (assignment "x") and
    /// Stable at generation 1; its member id.
    fn stable_static(&mut self, instance: &str) -> String {
        let t = self.join("", Some(instance));
        let id = self.join_reply(t).member_id;
        let ts = self.sync(&id, 1, &[(&id, b"x")]);
        self.flush(None);
        assert_eq!(self.sync_reply(ts).assignment.as_ref(), b"x");
        id
    }

    /// One member whose consumer-protocol subscription is `topic`, joined,
    /// synced and Stable at generation 1; its member id.
    fn stable_subscriber(&mut self, topic: &str) -> String {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::Encodable;
        let mut subscription = Vec::new();
        subscription.extend_from_slice(&1i16.to_be_bytes());
        ConsumerProtocolSubscription::default()
            .with_topics(vec![kafka_protocol::protocol::StrBytes::from_string(
                topic.to_string(),
            )])
            .encode(&mut subscription, 1)
            .unwrap();
        let t = self.join_with(
            Harness::join_request("", None, &[("range", &subscription)]),
            3,
        );
        let id = self.join_reply(t).member_id;
        let ts = self.sync(&id, 1, &[(&id, b"")]);
        self.flush(None);
        self.sync_reply(ts);
        id
    }

    /// One member joined, synced and Stable at generation 1.
    fn stable_one(&mut self) -> String {
        let (a, ja) = self.new_member();
        let r = self.join_reply(ja);
        assert_eq!((r.error, r.generation_id), (None, 1));
        assert_eq!(r.leader, a);
        assert_eq!(r.members.len(), 1);
        let t = self.sync(&a, 1, &[(&a, b"all")]);
        assert!(
            self.take(t).is_none(),
            "the leader's SyncGroup waits for the write"
        );
        self.flush(None);
        let r = self.sync_reply(t);
        assert_eq!((r.error, r.assignment.as_ref()), (None, &b"all"[..]));
        assert_eq!(self.state(), GroupState::Stable);
        a
    }
}

#[test]
fn state_table_allows_only_its_transitions() {
    use GroupState::*;
    assert!(Empty.can_transition_to(PreparingRebalance));
    assert!(PreparingRebalance.can_transition_to(CompletingRebalance));
    assert!(CompletingRebalance.can_transition_to(Stable));
    assert!(Stable.can_transition_to(PreparingRebalance));
    assert!(!Empty.can_transition_to(Stable));
    assert!(!Stable.can_transition_to(CompletingRebalance));
    assert!(!Dead.can_transition_to(Empty));
}

#[test]
fn first_member_needs_a_member_id_then_leads_generation_one() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    assert!(
        a.starts_with("c-"),
        "member ids start with the client id: {a}"
    );
    assert_eq!(h.heartbeat(&a, None, 1), None);
}

#[test]
fn join_below_v4_gets_a_member_id_at_once() {
    let mut h = Harness::new(0);
    let t = h.join_with(Harness::join_request("", None, &[("range", b"m")]), 3);
    let r = h.join_reply(t);
    assert_eq!((r.error, r.generation_id), (None, 1));
    assert!(!r.member_id.is_empty());
}

#[test]
fn second_member_triggers_a_rebalance_the_first_learns_by_heartbeat() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let (b, jb) = h.new_member();
    assert!(h.take(jb).is_none(), "b waits for a to rejoin");
    assert_eq!(h.state(), GroupState::PreparingRebalance);
    assert_eq!(h.heartbeat(&a, None, 1), Some(E::RebalanceInProgress));
    let ja = h.join(&a, None);
    let (ra, rb) = (h.join_reply(ja), h.join_reply(jb));
    assert_eq!((ra.generation_id, rb.generation_id), (2, 2));
    assert_eq!(ra.leader, a, "the leader stays");
    assert_eq!((ra.members.len(), rb.members.len()), (2, 0));
    let tb = h.sync(&b, 2, &[]);
    let ta = h.sync(&a, 2, &[(&a, b"p0"), (&b, b"p1")]);
    h.flush(None);
    assert_eq!(h.sync_reply(ta).assignment.as_ref(), b"p0");
    assert_eq!(h.sync_reply(tb).assignment.as_ref(), b"p1");
    assert_eq!(h.heartbeat(&b, None, 1), Some(E::IllegalGeneration));
}

#[test]
fn a_member_that_does_not_rejoin_is_removed_at_the_rebalance_timeout() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let (_b, jb) = h.new_member();
    // a keeps heartbeating but never rejoins.
    let deadline = h.c.next_deadline().unwrap();
    h.tick_at(h.now + 5_000);
    assert_eq!(h.heartbeat(&a, None, 1), Some(E::RebalanceInProgress));
    h.tick_at(deadline.max(h.now + i64::from(REBALANCE)));
    let rb = h.join_reply(jb);
    assert_eq!((rb.error, rb.generation_id, rb.members.len()), (None, 2, 1));
    assert_eq!(h.heartbeat(&a, None, 2), Some(E::UnknownMemberId));
}

/// librdkafka drops a MEMBER_ID_REQUIRED answer that arrives after its
/// subscription changed (0113 u_multiple_subscription_changes) and joins
/// again without an id: the id handed out first is a pending member that
/// never joins. As in Kafka (`hasAllMembersJoined` needs no pending
/// members), the join phase waits for it until its session timeout, unless
/// it leaves.
#[test]
fn a_member_id_handed_out_but_never_used_holds_the_join_until_it_expires() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let abandoned = h.join("", None);
    assert_eq!(h.join_reply(abandoned).error, Some(E::MemberIdRequired));
    let handed_out_at = h.now;
    let (b, jb) = h.new_member();
    let ja = h.join(&a, None);
    assert!(h.take(ja).is_none() && h.take(jb).is_none());
    h.tick_at(handed_out_at + i64::from(SESSION) - 1);
    assert!(h.take(ja).is_none(), "the pending member still may join");
    h.tick_at(handed_out_at + i64::from(SESSION));
    let (ra, rb) = (h.join_reply(ja), h.join_reply(jb));
    assert_eq!((ra.generation_id, rb.generation_id), (2, 2));
    assert_eq!(ra.members.len(), 2, "{a} and {b}, not the abandoned id");
}

/// A pending member id that leaves (LeaveGroup) completes the join at once.
#[test]
fn a_pending_member_id_that_leaves_completes_the_join_at_once() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let abandoned = h.join("", None);
    let pending = h.join_reply(abandoned).member_id;
    let (_b, jb) = h.new_member();
    let ja = h.join(&a, None);
    assert!(h.take(ja).is_none());
    let response = h.leave(&[(&pending, None)], 3);
    assert_eq!(response.members[0].error, None);
    assert_eq!(h.join_reply(ja).generation_id, 2);
    assert_eq!(h.join_reply(jb).generation_id, 2);
}

#[test]
fn a_silent_member_expires_after_its_session_timeout() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    h.tick_at(h.now + i64::from(SESSION) - 1);
    assert_eq!(h.heartbeat(&a, None, 1), None);
    let last = h.now;
    h.tick_at(last + i64::from(SESSION));
    assert_eq!(h.heartbeat(&a, None, 1), Some(E::UnknownMemberId));
    assert_eq!(h.state(), GroupState::Empty);
    h.flush(None);
    // The empty generation was stored.
    let p = h.c.partition_for(GROUP);
    assert!(!h.log[&p].is_empty());
}

#[test]
fn timers_due_at_a_request_apply_before_it_even_if_the_timer_loop_is_late() {
    let mut h = Harness::new(0);
    let _a = h.stable_one();
    let deadline = h.now + i64::from(SESSION);
    // Before the deadline nothing is due.
    let step = h.c.timers_due(deadline - 1);
    assert!(step.deliveries.is_empty());
    assert_eq!(h.state(), GroupState::Stable);
    // A request arriving at the deadline finds the member gone, though no
    // timer tick ran.
    h.now = deadline;
    let step = h.c.timers_due(deadline);
    h.apply(step);
    assert_eq!(h.state(), GroupState::Empty);
}

#[test]
fn session_timeout_outside_the_broker_limits_is_refused() {
    let mut h = Harness::new(0);
    for timeout in [5_999, 1_800_001] {
        let request = JoinGroupRequest {
            session_timeout_ms: timeout,
            ..Harness::join_request("", None, &[("range", b"m")])
        };
        let t = h.join_with(request, 9);
        assert_eq!(h.join_reply(t).error, Some(E::InvalidSessionTimeout));
    }
}

#[test]
fn protocols_must_overlap_and_the_type_must_match() {
    let mut h = Harness::new(0);
    h.stable_one();
    let t = h.join_with(Harness::join_request("", None, &[("roundrobin", b"m")]), 3);
    assert_eq!(h.join_reply(t).error, Some(E::InconsistentGroupProtocol));
    let request = JoinGroupRequest {
        protocol_type: "connect".into(),
        ..Harness::join_request("", None, &[("range", b"m")])
    };
    let t = h.join_with(request, 3);
    assert_eq!(h.join_reply(t).error, Some(E::InconsistentGroupProtocol));
}

#[test]
fn the_protocol_all_members_prefer_is_selected() {
    let mut h = Harness::new(0);
    let ta = h.join_with(
        Harness::join_request("", None, &[("cooperative-sticky", b"a"), ("range", b"a")]),
        3,
    );
    let a = h.join_reply(ta);
    assert_eq!(a.protocol_name.as_deref(), Some("cooperative-sticky"));
    let a = a.member_id;
    let tb = h.join_with(Harness::join_request("", None, &[("range", b"b")]), 3);
    let ta = h.join_with(
        Harness::join_request(&a, None, &[("cooperative-sticky", b"a"), ("range", b"a")]),
        3,
    );
    let (ra, rb) = (h.join_reply(ta), h.join_reply(tb));
    assert_eq!(ra.protocol_name.as_deref(), Some("range"));
    assert_eq!(rb.protocol_name.as_deref(), Some("range"));
    // The leader sees every member's metadata for the chosen protocol.
    let metas: Vec<&[u8]> = ra.members.iter().map(|m| m.metadata.as_ref()).collect();
    assert_eq!(metas.len(), 2);
    assert!(metas.contains(&&b"a"[..]) && metas.contains(&&b"b"[..]));
}

#[test]
fn initial_rebalance_delay_holds_the_first_join() {
    let mut h = Harness::new(3_000);
    let (_a, ja) = h.new_member();
    assert!(h.take(ja).is_none());
    h.tick_at(h.now + 2_999);
    assert!(h.take(ja).is_none());
    let (_b, jb) = h.new_member();
    // b joined during the delay: it is extended once more.
    h.tick_at(h.now + 1);
    assert!(h.take(ja).is_none());
    h.tick_at(h.now + 3_000);
    let (ra, rb) = (h.join_reply(ja), h.join_reply(jb));
    assert_eq!((ra.generation_id, rb.generation_id), (1, 1));
}

#[test]
fn static_member_rejoining_in_a_stable_group_fences_the_old_id_without_a_rebalance() {
    let mut h = Harness::new(0);
    let t = h.join("", Some("i1"));
    let r = h.join_reply(t);
    assert_eq!(
        (r.error, r.generation_id),
        (None, 1),
        "static members need no KIP-394 round"
    );
    let old = r.member_id;
    let ts = h.sync(&old, 1, &[(&old, b"x")]);
    h.flush(None);
    assert_eq!(h.sync_reply(ts).assignment.as_ref(), b"x");

    let t = h.join("", Some("i1"));
    assert!(h.take(t).is_none(), "answered once the new id is durable");
    h.flush(None);
    let r = h.join_reply(t);
    let new = r.member_id.clone();
    assert_ne!(new, old);
    assert_eq!((r.error, r.generation_id), (None, 1));
    assert!(
        r.skip_assignment,
        "the returning leader keeps its assignment (v9)"
    );
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(h.heartbeat(&old, Some("i1"), 1), Some(E::FencedInstanceId));
    assert_eq!(h.heartbeat(&new, Some("i1"), 1), None);
    let ts = h.sync(&new, 1, &[]);
    assert_eq!(h.sync_reply(ts).assignment.as_ref(), b"x");
}

// Kafka's static-member replacement: if the metadata naming the new member
// id cannot be stored, the rejoin fails and the old member id is back, so
// the group in memory and the one in the log (which a new coordinator would
// load) agree.
#[test]
fn a_static_rejoin_whose_write_fails_restores_the_old_member_id() {
    let mut h = Harness::new(0);
    let old = h.stable_static("i1");
    let t = h.join("", Some("i1"));
    h.flush(Some(E::NotEnoughReplicas));
    let r = h.join_reply(t);
    assert_eq!(
        r.error,
        Some(E::CoordinatorNotAvailable),
        "the rejoin fails: {r:?}"
    );
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(h.heartbeat(&old, Some("i1"), 1), None, "old id restored");
    let ts = h.sync(&old, 1, &[]);
    assert_eq!(h.sync_reply(ts).assignment.as_ref(), b"x");
    let members = h.c.describe_group(GROUP).unwrap().members;
    assert_eq!(members.len(), 1);
}

#[test]
fn leave_group_v3_removes_a_batch_and_reports_each_member() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let r = h.leave(&[(&a, None), ("nobody", None), ("", Some("i9"))], 3);
    let errors: Vec<Option<ResponseError>> = r.members.iter().map(|m| m.error).collect();
    assert_eq!(
        errors,
        vec![None, Some(E::UnknownMemberId), Some(E::UnknownMemberId)]
    );
    assert_eq!(h.state(), GroupState::Empty);
}

#[test]
fn offset_commit_checks_generation_member_and_rebalance() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let t = h.commit(7, &a, 5);
    assert_eq!(h.commit_error(t), Some(E::IllegalGeneration));
    let t = h.commit(1, "nobody", 5);
    assert_eq!(h.commit_error(t), Some(E::UnknownMemberId));
    let t = h.commit(-1, "", 5);
    assert_eq!(
        h.commit_error(t),
        Some(E::UnknownMemberId),
        "no standalone commits to a live group"
    );

    let t = h.commit(1, &a, 5);
    assert!(h.take(t).is_none(), "answered once durable");
    assert_eq!(
        h.committed(false),
        Ok(None),
        "not visible before it is durable"
    );
    assert_eq!(h.committed(true), Err(E::UnstableOffsetCommit));
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    assert_eq!(h.committed(true), Ok(Some(5)));

    // During CompletingRebalance a commit must wait for the new generation.
    let (_b, _jb) = h.new_member();
    let _ja = h.join(&a, None);
    assert_eq!(h.state(), GroupState::CompletingRebalance);
    let t = h.commit(2, &a, 6);
    assert_eq!(h.commit_error(t), Some(E::RebalanceInProgress));
}

#[test]
fn standalone_commit_with_generation_minus_one_creates_an_empty_group() {
    let mut h = Harness::new(0);
    let t = h.commit(-1, "", 42);
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    assert_eq!(h.committed(false), Ok(Some(42)));
    assert_eq!(h.state(), GroupState::Empty);
    let t = h.commit(3, "", 43);
    assert_eq!(
        h.commit_error(t),
        Some(E::UnknownMemberId),
        "a member-less commit with a generation names no member of the empty group"
    );
    let t = h.commit(3, "gone", 43);
    assert_eq!(h.commit_error(t), Some(E::UnknownMemberId));
}

#[test]
fn failed_commit_write_changes_nothing() {
    let mut h = Harness::new(0);
    let t = h.commit(-1, "", 42);
    h.flush(Some(E::NotEnoughReplicas));
    assert_eq!(h.commit_error(t), Some(E::CoordinatorNotAvailable));
    assert_eq!(h.committed(true), Ok(None));
}

#[test]
fn sync_waits_for_the_leader_and_a_failed_write_makes_members_rejoin() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let (b, jb) = h.new_member();
    let ja = h.join(&a, None);
    h.join_reply(ja);
    h.join_reply(jb);
    let tb = h.sync(&b, 2, &[]);
    assert!(h.take(tb).is_none(), "b waits for the leader");
    let ta = h.sync(&a, 2, &[(&a, b"1"), (&b, b"2")]);
    h.flush(Some(E::NotLeaderOrFollower));
    assert_eq!(h.sync_reply(ta).error, Some(E::NotCoordinator));
    assert_eq!(h.sync_reply(tb).error, Some(E::NotCoordinator));
    assert_eq!(h.state(), GroupState::PreparingRebalance);
}

#[test]
fn delete_groups_refuses_a_live_group_and_tombstones_an_empty_one() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let t = h.token();
    let step = h.c.delete_group(t, GROUP, h.now);
    h.apply(step);
    assert_eq!(h.take(t), Some(Reply::Deleted(Some(E::NonEmptyGroup))));
    let r = h.leave(&[(&a, None)], 1);
    assert_eq!(r.error, None);
    let c = h.commit(-1, "", 9);
    h.flush(None);
    h.commit_error(c);
    let t = h.token();
    let step = h.c.delete_group(t, GROUP, h.now);
    h.apply(step);
    h.flush(None);
    assert_eq!(h.take(t), Some(Reply::Deleted(None)));
    assert_eq!(h.committed(false), Ok(None));
    assert_eq!(h.c.describe_group(GROUP).unwrap().state, GroupState::Dead);
    let t = h.token();
    let step = h.c.delete_group(t, GROUP, h.now);
    h.apply(step);
    assert_eq!(h.take(t), Some(Reply::Deleted(Some(E::GroupIdNotFound))));
    // A new leader replaying the log finds nothing of the group.
    let p = h.c.partition_for(GROUP);
    assert!(replay(h.log[&p].clone()).unwrap().is_empty());
}

#[test]
fn offset_delete_refuses_subscribed_topics() {
    let mut h = Harness::new(0);
    let a = h.stable_subscriber("t");
    let c = h.commit(1, &a, 3);
    h.flush(None);
    h.commit_error(c);
    let t = h.token();
    let step =
        h.c.offset_delete(t, GROUP, &[("t".into(), 0), ("other".into(), 0)], h.now)
            .unwrap();
    h.apply(step);
    h.flush(None);
    match h.take(t) {
        Some(Reply::Commit(r)) => {
            assert_eq!(r[0].error, Some(E::GroupSubscribedToTopic));
            assert_eq!(r[1].error, None);
        }
        other => panic!("{other:?}"),
    }
    let mut fresh = Harness::new(0);
    assert_eq!(
        fresh
            .c
            .offset_delete(Token(999), GROUP, &[], 0)
            .unwrap_err(),
        E::GroupIdNotFound
    );
}

#[test]
fn partitions_not_held_or_loading_answer_coordinator_errors() {
    let mut c = GroupCoordinator::new(GroupConfig::default(), 1);
    assert_eq!(
        c.offset_fetch(GROUP, None, false).unwrap_err(),
        E::NotCoordinator
    );
    let p = c.partition_for(GROUP);
    c.begin_loading(p, 3).unwrap();
    assert_eq!(
        c.offset_fetch(GROUP, None, false).unwrap_err(),
        E::CoordinatorLoadInProgress
    );
    assert!(c.begin_loading(p, 3).is_none(), "same epoch: nothing to do");
    assert_eq!(
        c.finish_loading(p, 2, BTreeMap::new(), 0, &mut no_ids())
            .unwrap_err(),
        E::NotCoordinator,
        "stale load"
    );
    c.finish_loading(p, 3, BTreeMap::new(), 0, &mut no_ids())
        .unwrap();
    assert_eq!(c.offset_fetch(GROUP, None, false).unwrap(), vec![]);
    c.unload(p, Some(3));
    assert_eq!(
        c.offset_fetch(GROUP, None, false).unwrap_err(),
        E::NotCoordinator
    );
}

#[test]
fn a_partition_led_by_the_image_but_not_loading_yet_answers_load_in_progress() {
    let mut c = GroupCoordinator::new(GroupConfig::default(), 7);
    let p = c.partition_for(GROUP);
    let led = LedByImage::new([p].into());
    assert!(c.set_led_by_image(led.clone()), "its load should begin");
    assert_eq!(
        c.offset_fetch(GROUP, None, false).unwrap_err(),
        E::CoordinatorLoadInProgress
    );
    let step = c.offset_commit(Token(1), &commit_request(-1, "", None, 5), 9, 0);
    assert!(matches!(
        &step.deliveries[..],
        [(Token(1), Reply::Commit(r))] if r[0].error == Some(E::CoordinatorLoadInProgress)
    ));
    assert_eq!(c.list_groups().unwrap_err(), E::CoordinatorLoadInProgress);
    c.begin_loading(p, 1).unwrap();
    assert!(!c.set_led_by_image(led), "loading");
    c.finish_loading(p, 1, BTreeMap::new(), 0, &mut no_ids())
        .unwrap();
    assert_eq!(c.offset_fetch(GROUP, None, false).unwrap(), vec![]);
    assert!(!c.set_led_by_image(LedByImage::default()));
    c.unload(p, Some(1));
    assert_eq!(
        c.offset_fetch(GROUP, None, false).unwrap_err(),
        E::NotCoordinator,
        "neither held nor led"
    );
}

#[test]
fn unload_answers_waiting_joins_not_coordinator() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let (_b, jb) = h.new_member();
    let p = h.c.partition_for(GROUP);
    let step = h.c.unload(p, None);
    h.apply(step);
    assert_eq!(h.join_reply(jb).error, Some(E::NotCoordinator));
    assert_eq!(h.heartbeat(&a, None, 1), Some(E::NotCoordinator));
}

#[test]
fn a_new_leader_rebuilds_offsets_and_members_from_the_log() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let t = h.commit(1, &a, 11);
    h.flush(None);
    h.commit_error(t);
    let p = h.c.partition_for(GROUP);
    let mut c = GroupCoordinator::new(GroupConfig::default(), 2);
    c.begin_loading(p, 2).unwrap();
    c.finish_loading(
        p,
        2,
        replay(h.log[&p].clone()).unwrap(),
        h.now,
        &mut no_ids(),
    )
    .unwrap();
    let d = c.describe_group(GROUP).unwrap();
    assert_eq!(d.state, GroupState::Stable);
    assert_eq!(d.members.len(), 1);
    assert_eq!(d.members[0].assignment, b"all");
    let topics = vec![("t".to_string(), vec![0])];
    assert_eq!(
        c.offset_fetch(GROUP, Some(&topics), true).unwrap()[0]
            .offset
            .as_ref()
            .unwrap()
            .offset,
        11
    );
}

/// A commit of `offset` for partition t-0 of the group.
fn commit_request(
    generation_id: i32,
    member_id: impl Into<String>,
    group_instance_id: Option<String>,
    offset: i64,
) -> CommitRequest {
    CommitRequest {
        group_id: GROUP.into(),
        generation_id,
        member_id: member_id.into(),
        group_instance_id,
        partitions: vec![CommitPartition {
            topic: "t".into(),
            partition: 0,
            offset,
            leader_epoch: -1,
            metadata: None,
        }],
    }
}

fn txn_commit(
    h: &mut Harness,
    producer_id: i64,
    offset: i64,
    generation: i32,
    member: &str,
) -> Token {
    let t = h.token();
    let request = commit_request(generation, member, None, offset);
    let producer = TransactionalWrite {
        transactional_id: "tx".into(),
        producer_id,
        producer_epoch: 0,
        add_partition: false,
    };
    let step = h.c.txn_offset_commit(t, &request, producer, h.now);
    h.apply(step);
    t
}

#[test]
fn transactional_offsets_wait_for_the_commit_marker_and_vanish_on_abort() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let p = h.c.partition_for(GROUP);
    let t = txn_commit(&mut h, 77, 20, 1, &a);
    assert!(
        h.writes[0].transactional.is_some(),
        "written as the producer's transactional batch"
    );
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    assert_eq!(h.committed(false), Ok(None), "pending until the marker");
    assert_eq!(h.committed(true), Err(E::UnstableOffsetCommit));
    h.c.complete_transaction(p, 77, true);
    assert_eq!(h.committed(true), Ok(Some(20)));

    let t = txn_commit(&mut h, 77, 30, 1, &a);
    h.flush(None);
    h.commit_error(t);
    h.c.complete_transaction(p, 77, false);
    assert_eq!(
        h.committed(true),
        Ok(Some(20)),
        "aborted offsets are dropped"
    );
}

// A COMMIT marker replaces a committed offset by the producer's pending one
// only if the pending offset's record is later in the log: a transaction
// that commits late (its coordinator failed over, say) must not send the
// group's offset back to before a newer commit, or the consumer reads its
// input again. Live and on replay alike.
#[test]
fn a_late_commit_marker_does_not_replace_a_newer_committed_offset() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let p = h.c.partition_for(GROUP);
    let t = txn_commit(&mut h, 77, 20, 1, &a);
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    // Written after the transactional offset: later in the log.
    let t = h.commit(1, &a, 50);
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    h.c.complete_transaction(p, 77, true);
    assert_eq!(h.committed(false), Ok(Some(50)));

    // The same log replayed by the next leader, the marker after both.
    let mut log = h.log[&p].clone();
    log.push(LogEntry::Marker {
        producer_id: 77,
        commit: true,
    });
    let groups = replay(log).unwrap();
    assert_eq!(
        groups[GROUP].offsets[&("t".to_string(), 0)].value.offset,
        50
    );

    // A transactional offset written after the plain commit does win.
    let t = txn_commit(&mut h, 78, 60, 1, &a);
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    h.c.complete_transaction(p, 78, true);
    assert_eq!(h.committed(false), Ok(Some(60)));
}

// Writes of one group can be reported durable out of log order (each waits
// for acks=all on its own); the later record is the committed offset.
#[test]
fn plain_commits_completing_out_of_log_order_keep_the_later_record() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let first = h.commit(1, &a, 10);
    let second = h.commit(1, &a, 11);
    assert_eq!(h.writes.len(), 2);
    let later = h.writes.pop().unwrap();
    let earlier = h.writes.pop().unwrap();
    let step = h.c.complete_write(later.id, Ok(5), h.now);
    h.apply(step);
    let step = h.c.complete_write(earlier.id, Ok(4), h.now);
    h.apply(step);
    assert_eq!(h.commit_error(first), None);
    assert_eq!(h.commit_error(second), None);
    assert_eq!(h.committed(false), Ok(Some(11)));
}

#[test]
fn member_commits_to_an_unknown_group_are_refused_by_version() {
    let mut h = Harness::new(0);
    let t = h.commit_at(3, "gone", 5, 9);
    assert_eq!(h.commit_error(t), Some(E::GroupIdNotFound));
    let t = h.commit_at(3, "gone", 5, 8);
    assert_eq!(h.commit_error(t), Some(E::IllegalGeneration));
    let t = txn_commit(&mut h, 1, 5, 3, "gone");
    assert_eq!(h.commit_error(t), Some(E::IllegalGeneration));
    assert_eq!(h.committed(false), Ok(None), "nothing was written");
}

#[test]
fn txn_offset_commit_fences_zombie_members_kip_447() {
    let mut h = Harness::new(0);
    let a = h.stable_one();
    let t = txn_commit(&mut h, 1, 5, 0, &a);
    assert_eq!(h.commit_error(t), Some(E::IllegalGeneration));
    let t = txn_commit(&mut h, 1, 5, 1, "zombie");
    assert_eq!(h.commit_error(t), Some(E::UnknownMemberId));
}

#[test]
fn txn_offset_commit_fences_a_replaced_static_member() {
    let mut h = Harness::new(0);
    let old = h.stable_static("i1");
    let ts = h.join("", Some("i1"));
    h.flush(None);
    assert_eq!(h.join_reply(ts).error, None);
    let t = h.token();
    let request = commit_request(1, old, Some("i1".into()), 1);
    let producer = TransactionalWrite {
        transactional_id: "tx".into(),
        producer_id: 1,
        producer_epoch: 0,
        add_partition: false,
    };
    let step = h.c.txn_offset_commit(t, &request, producer, h.now);
    h.apply(step);
    assert_eq!(h.commit_error(t), Some(E::FencedInstanceId));
}

#[test]
fn replay_resolves_transactional_offsets_by_the_markers_in_the_log() {
    let o = |offset| OffsetAndMetadata {
        offset,
        leader_epoch: -1,
        metadata: Some("m".into()),
        commit_timestamp: 5,
    };
    let rec = |offset: i64, pid: Option<i64>, r: StateRecord| LogEntry::Record {
        offset,
        producer_id: pid,
        key: r.key,
        value: r.value,
    };
    let entries = vec![
        rec(0, None, offset_record(GROUP, "t", 0, Some(&o(1)))),
        rec(1, Some(9), offset_record(GROUP, "t", 0, Some(&o(2)))),
        rec(2, Some(8), offset_record(GROUP, "t", 1, Some(&o(3)))),
        LogEntry::Marker {
            producer_id: 9,
            commit: true,
        },
        rec(4, Some(9), offset_record(GROUP, "t", 0, Some(&o(4)))),
        LogEntry::Marker {
            producer_id: 9,
            commit: false,
        },
        rec(6, Some(7), offset_record(GROUP, "t", 2, Some(&o(5)))),
    ];
    let groups = replay(entries).unwrap();
    let g = &groups[GROUP];
    assert_eq!(g.offsets[&("t".to_string(), 0)].value.offset, 2);
    assert!(!g.offsets.contains_key(&("t".to_string(), 1)));
    assert_eq!(
        g.pending_txn.keys().copied().collect::<Vec<_>>(),
        vec![7, 8],
        "still open"
    );
}

#[test]
fn records_round_trip_and_garbage_is_an_error() {
    let group = StoredGroup {
        protocol_type: Some("consumer".into()),
        generation: 4,
        protocol: Some("range".into()),
        leader: Some("m1".into()),
        state_timestamp: 9,
        members: vec![StoredMember {
            member_id: "m1".into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/h".into(),
            rebalance_timeout_ms: 1,
            session_timeout_ms: 2,
            subscription: vec![1, 2],
            assignment: vec![3],
        }],
    };
    let r = group_metadata_record(GROUP, Some(&group));
    let (key, value) = decode_group_record(&r.key, r.value.as_deref()).unwrap();
    assert_eq!(key, records::RecordKey::Group(GROUP.into()));
    assert_eq!(value, records::GroupRecordValue::Group(Some(group)));
    let o = OffsetAndMetadata {
        offset: 1,
        leader_epoch: 2,
        metadata: None,
        commit_timestamp: 3,
    };
    let r = offset_record(GROUP, "t", 5, Some(&o));
    assert_eq!(
        decode_group_record(&r.key, r.value.as_deref()).unwrap().1,
        records::GroupRecordValue::Offset(Some(o))
    );
    // Every prefix and a pseudo-random byte soup decode to an error, never a panic.
    for len in 0..r.key.len() {
        assert!(matches!(
            decode_group_record(&r.key[..len], None),
            Err(crate::coordinator::RecordError::Truncated(_))
        ));
    }
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..2_000 {
        let bytes: Vec<u8> = (0..(x % 64) as usize)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = decode_group_record(&bytes, Some(&bytes));
        x = x.wrapping_add(1);
    }
    assert!(matches!(
        replay(vec![LogEntry::Record {
            offset: 0,
            producer_id: None,
            key: vec![0, 9],
            value: None
        }]),
        Err(records::ReplayError {
            index: 0,
            error: crate::coordinator::RecordError::UnknownKeyVersion(9)
        })
    ));
}

// ---- offset retention ----------------------------------------------------

const RETENTION: i64 = 60_000;
const CHECK_EVERY: i64 = 1_000;

fn retention_harness() -> Harness {
    let mut h = Harness::with(GroupConfig {
        initial_rebalance_delay_ms: 0,
        offsets_retention_ms: RETENTION,
        offsets_retention_check_interval_ms: CHECK_EVERY,
        ..GroupConfig::default()
    });
    // The first tick schedules the first check an interval later.
    h.tick_at(h.now);
    h
}

/// A commit of `offset` to each of `partitions` (topic, partition).
fn commit_partitions(
    h: &mut Harness,
    generation: i32,
    member: &str,
    partitions: &[(&str, i32)],
    offset: i64,
) -> Token {
    let mut request = commit_request(generation, member, None, offset);
    request.partitions = partitions
        .iter()
        .map(|(topic, partition)| CommitPartition {
            topic: (*topic).into(),
            partition: *partition,
            offset,
            leader_epoch: -1,
            metadata: None,
        })
        .collect();
    let t = h.token();
    let step = h.c.offset_commit(t, &request, 9, h.now);
    h.apply(step);
    t
}

fn fetched(h: &Harness, topic: &str) -> Option<i64> {
    let wanted = [(topic.to_string(), vec![0])];
    let r = h.c.offset_fetch(GROUP, Some(&wanted), false).unwrap();
    r[0].offset.as_ref().map(|o| o.offset)
}

#[test]
fn offsets_of_a_group_without_members_expire_after_retention_and_the_group_goes() {
    let mut h = retention_harness();
    let a = h.stable_one();
    let t = h.commit(1, &a, 5);
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    // The member stays for twice the retention: retention counts from the
    // moment the group became Empty, not from the commit.
    for beat in 0..(2 * RETENTION / 5_000) {
        h.tick_at(h.now + 5_000);
        assert_eq!(h.heartbeat(&a, None, 1), None, "heartbeat {beat}");
    }
    h.flush(None);
    assert_eq!(
        h.committed(false),
        Ok(Some(5)),
        "kept while the group had members"
    );
    h.leave(&[(&a, None)], 3);
    h.flush(None);
    assert_eq!(h.state(), GroupState::Empty);
    let empty_since = h.now;

    h.tick_at(empty_since + RETENTION - CHECK_EVERY);
    assert_eq!(h.committed(false), Ok(Some(5)), "not yet");
    h.tick_at(empty_since + RETENTION + CHECK_EVERY);
    assert!(!h.writes.is_empty(), "tombstones written");
    h.flush(None);
    assert_eq!(h.state(), GroupState::Dead, "deleted");
    assert_eq!(h.committed(false), Ok(None));
    let p = h.c.partition_for(GROUP);
    assert!(
        replay(h.log[&p].clone()).unwrap().is_empty(),
        "a new leader finds neither offsets nor group"
    );
}

#[test]
fn offsets_of_a_standalone_committer_expire_by_commit_time() {
    let mut h = retention_harness();
    let first = commit_partitions(&mut h, -1, "", &[("early", 0)], 1);
    h.flush(None);
    assert_eq!(h.commit_error(first), None);
    let early_at = h.now;
    h.tick_at(early_at + RETENTION / 2);
    let later = commit_partitions(&mut h, -1, "", &[("late", 0)], 2);
    h.flush(None);
    assert_eq!(h.commit_error(later), None);

    h.tick_at(early_at + RETENTION + CHECK_EVERY);
    h.flush(None);
    assert_eq!(fetched(&h, "early"), None, "past retention");
    assert_eq!(fetched(&h, "late"), Some(2), "committed later: kept");
    h.tick_at(early_at + RETENTION / 2 + RETENTION + CHECK_EVERY);
    h.flush(None);
    assert_eq!(fetched(&h, "late"), None);
}

#[test]
fn a_stable_consumer_group_loses_only_offsets_of_topics_it_does_not_subscribe_to() {
    let mut h = retention_harness();
    let a = h.stable_subscriber("t");
    let c = commit_partitions(&mut h, 1, &a, &[("t", 0), ("old", 0)], 7);
    h.flush(None);
    assert_eq!(h.commit_error(c), None);
    for step in 1..=(RETENTION / 5_000 + 1) {
        h.tick_at(h.now + 5_000);
        assert_eq!(h.heartbeat(&a, None, 1), None, "heartbeat {step}");
    }
    h.flush(None);
    assert_eq!(h.state(), GroupState::Stable);
    assert_eq!(fetched(&h, "t"), Some(7), "subscribed: kept");
    assert_eq!(fetched(&h, "old"), None, "not subscribed: expired");
}

#[test]
fn offsets_pending_in_a_transaction_do_not_expire() {
    let mut h = retention_harness();
    let c = h.commit_at(-1, "", 3, 9);
    h.flush(None);
    assert_eq!(h.commit_error(c), None);
    let t = txn_commit(&mut h, 5, 4, -1, "");
    h.flush(None);
    assert_eq!(h.commit_error(t), None);
    h.tick_at(h.now + RETENTION + CHECK_EVERY);
    h.flush(None);
    assert_eq!(
        h.committed(false),
        Ok(Some(3)),
        "pending in a transaction: kept"
    );
    let p = h.c.partition_for(GROUP);
    h.c.complete_transaction(p, 5, true);
    assert_eq!(h.committed(false), Ok(Some(4)));
}
