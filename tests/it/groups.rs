//! Consumer groups and offsets in transactions, written against Kafka's
//! behaviour: seed experiment 2 (a consume-transform-produce process
//! SIGKILLed between produce and commit, then retried), zombie members
//! fenced after a rebalance (by hand with the raw protocol, and with
//! librdkafka members that are SIGSTOPped), and the lag of a read_committed
//! group consumer at the end of a transactional topic.
//!
//! The consume-transform-produce processes are real: `samsa demo
//! eos-attempt` children (librdkafka consumer group with
//! enable.auto.commit=false and read_committed, a transactional producer,
//! synchronous sends, `send_offsets_to_transaction`). The tests wait for
//! their marker lines on stdout, never for time to pass. Tests whose name
//! starts with `cluster_` run three nodes (the `heavy` nextest group).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset};
use samsa_tests::client::KafkaClient;
use samsa_tests::cluster::{run_to_exit, SamsaCluster};
use samsa_tests::codes::*;
use samsa_tests::group::{
    consumer_assignment, group_consumer_config, offsets_partition, wait_committed_offset, Attempt,
    JoinSpec, MemberRef, TxnRef, KEY_TYPE_GROUP, OFFSETS_PARTITIONS, OFFSETS_TOPIC,
};
use samsa_tests::node::samsa_bin;
use samsa_tests::txn::{
    create_topic_default_rf, partition_leaders, plain_producer_config, read_values,
    retry_coordinator, wait_values, Isolation, TxnProducer, VISIBLE,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, SamsaNode};

use Isolation::{ReadCommitted, ReadUncommitted};

/// How long one attempt process may take: join the group (the initial
/// rebalance delay, a dead member's session timeout), read, write, commit.
const ATTEMPT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

/// Input, output, group and transactional id of one pipeline.
struct Pipeline {
    bootstrap: String,
    input: String,
    output: String,
    group: String,
    txn: String,
    partitions: i32,
}

impl Pipeline {
    /// Creates the input and output topics (`partitions` each, the broker's
    /// default replication) and writes `n` plain records `input-0..n` to
    /// the input, in equal consecutive runs per partition (so that reading
    /// in (partition, offset) order gives them in order).
    fn create(
        client: &mut KafkaClient,
        bootstrap: &str,
        name: &str,
        n: usize,
        partitions: i32,
    ) -> Pipeline {
        let p = Pipeline {
            bootstrap: bootstrap.to_string(),
            input: unique_topic(&format!("{name}-in")),
            output: unique_topic(&format!("{name}-out")),
            group: unique_topic(&format!("{name}-group")),
            txn: unique_topic(&format!("{name}-txn")),
            partitions,
        };
        create_topic_default_rf(client, &p.input, partitions).unwrap();
        create_topic_default_rf(client, &p.output, partitions).unwrap();
        let producer = TxnProducer::new(&plain_producer_config(bootstrap));
        let per_partition = n / partitions as usize;
        for i in 0..n {
            let partition = (i / per_partition) as i32;
            let (_, offset) = producer.send_ok(&p.input, Some(partition), &format!("input-{i}"));
            assert_eq!(
                offset,
                (i % per_partition) as i64,
                "plain input records take consecutive offsets"
            );
        }
        p
    }

    fn attempt(&self, name: &str, txn: &str, wait_at: Option<&'static str>) -> Attempt {
        Attempt {
            bootstrap: self.bootstrap.clone(),
            input: self.input.clone(),
            output: self.output.clone(),
            group: self.group.clone(),
            transactional_id: txn.to_string(),
            name: name.to_string(),
            records: 10,
            wait_at,
        }
    }

    fn output_values(&self, isolation: Isolation) -> Vec<String> {
        read_values(&self.bootstrap, &self.output, self.partitions, isolation).unwrap()
    }
}

/// What attempt `name` writes for `input-0..n`.
fn processed_by(name: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("input-{i} processed by {name}"))
        .collect()
}

/// OffsetFetch with require_stable of partition 0: (error code, offset).
fn stable_offset(client: &mut KafkaClient, group: &str, topic: &str) -> (i16, i64) {
    let mut coordinator = client.group_coordinator(group).unwrap();
    let (code, parts) = coordinator.offset_fetch(group, topic, &[0], true).unwrap();
    assert_eq!(code, NONE, "OffsetFetch(require_stable) group-level error");
    match parts.as_slice() {
        [(0, offset, code)] => (*code, *offset),
        other => panic!("OffsetFetch {group} {topic}/0: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// seed experiment 2
// ---------------------------------------------------------------------------

/// Seed experiment 2 (seed 000), exactly: 10 input records; attempt A, a
/// separate process, consumes them through the group, writes 10 outputs
/// synchronously in a transaction, adds the input offsets to it, prints
/// READY-TO-COMMIT and is SIGKILLed. Before the retry the output shows
/// read_committed 0 / read_uncommitted 10 and the group has no committed
/// offset (the pending transactional one is invisible; require_stable
/// answers UNSTABLE_OFFSET_COMMIT). Attempt B with the same transactional.id
/// and group fences A's transaction, re-reads the same 10 and commits:
/// read_committed exactly B's 10, read_uncommitted 20, group offset 10.
fn seed2(client: &mut KafkaClient, bootstrap: &str) {
    let p = Pipeline::create(client, bootstrap, "seed2", 10, 1);

    let mut a = p.attempt("A", &p.txn, Some("ready-to-commit")).spawn();
    a.wait_for_line("READY-TO-COMMIT", ATTEMPT).unwrap();
    let status = a.sigkill();
    assert_eq!(
        status.signal(),
        Some(9),
        "attempt A must die of SIGKILL: {status}"
    );

    // Before the retry: no partial state.
    assert_eq!(
        p.output_values(ReadUncommitted),
        processed_by("A", 10),
        "A's 10 outputs are in the log"
    );
    assert_eq!(
        p.output_values(ReadCommitted),
        Vec::<String>::new(),
        "A's outputs are invisible to read_committed"
    );
    let mut coordinator = client.group_coordinator(&p.group).unwrap();
    assert_eq!(
        coordinator.committed_offset(&p.group, &p.input, 0).unwrap(),
        -1,
        "the group has no committed offset while A's transaction is open"
    );
    assert_eq!(
        stable_offset(client, &p.group, &p.input).0,
        UNSTABLE_OFFSET_COMMIT,
        "require_stable must report A's pending transactional offset commit"
    );

    let mut b = p.attempt("B", &p.txn, None).spawn();
    let status = b.wait_exit(ATTEMPT).unwrap();
    assert!(
        status.success(),
        "attempt B failed: {status}: {:?}",
        b.output
    );
    assert!(
        b.output.iter().any(|l| l.starts_with("COMMITTED n=10")),
        "{:?}",
        b.output
    );

    // After the retry: exactly once.
    wait_values(
        bootstrap,
        &p.output,
        1,
        ReadCommitted,
        &processed_by("B", 10),
    );
    let all: Vec<String> = processed_by("A", 10)
        .into_iter()
        .chain(processed_by("B", 10))
        .collect();
    assert_eq!(p.output_values(ReadUncommitted), all, "20 physically");
    wait_committed_offset(client, &p.group, &p.input, 0, 10, VISIBLE)
        .unwrap_or_else(|last| panic!("group offset never became 10: {last}"));
    assert_eq!(
        stable_offset(client, &p.group, &p.input),
        (NONE, 10),
        "require_stable once nothing is pending"
    );
}

#[test]
fn seed2_sigkill_between_produce_and_commit() {
    let node = SamsaNode::start();
    seed2(&mut node.client(), &node.bootstrap());
}

/// On three nodes (RF 3). First, placement: the coordinator FindCoordinator
/// names for a group is the leader of its `__consumer_offsets` partition,
/// `abs(hashCode(group)) % 50`.
#[test]
fn cluster_seed2_sigkill_between_produce_and_commit() {
    let cluster = SamsaCluster::start(3, &[]);
    let mut client = cluster.client(1);
    for group in ["hello", "my-txn", &unique_topic("placement")] {
        let (code, coordinator) = retry_coordinator("FindCoordinator(group)", VISIBLE, || {
            client.find_coordinator(KEY_TYPE_GROUP, group)
        })
        .unwrap();
        assert_eq!(code, NONE, "FindCoordinator({group})");
        let partition = offsets_partition(group, OFFSETS_PARTITIONS);
        let leaders = try_wait_until(VISIBLE, || {
            partition_leaders(&mut client, OFFSETS_TOPIC)
                .filter(|l| l.len() == OFFSETS_PARTITIONS as usize)
        })
        .unwrap_or_else(|| panic!("{OFFSETS_TOPIC} never had {OFFSETS_PARTITIONS} led partitions"));
        assert_eq!(
            Some(&coordinator),
            leaders.get(&partition),
            "the coordinator of {group} leads partition {partition} of {OFFSETS_TOPIC}"
        );
    }
    seed2(&mut client, &cluster.bootstrap());
}

// ---------------------------------------------------------------------------
// zombie members
// ---------------------------------------------------------------------------

/// Joins `spec` as a new member on `c` and, as the only member (so the
/// leader), syncs an assignment of every partition in `partitions`.
fn join_alone(c: &mut KafkaClient, spec: &JoinSpec, partitions: &[i32]) -> MemberRef {
    let j = c.join_group(spec).unwrap();
    assert_eq!(j.error_code, NONE, "JoinGroup: {j:?}");
    assert_eq!(j.leader, j.member_id, "the only member leads");
    let me = MemberRef::joined(&j, spec.instance_id.as_deref());
    let s = c
        .sync_group(
            &spec.group,
            &me,
            &[(
                me.member_id.clone(),
                consumer_assignment(&spec.topic, partitions),
            )],
        )
        .unwrap();
    assert_eq!(s.error_code, NONE, "SyncGroup: {s:?}");
    me
}

/// InitProducerId for a fresh transactional id on `c`'s broker (one node:
/// the coordinator of everything).
fn init_raw_txn(c: &mut KafkaClient) -> TxnRef {
    init_raw_txn_id(c, &unique_topic("raw-txn"))
}

/// InitProducerId for `id` as a starting process sends it (no current
/// producer id): a known id gets its epoch bumped.
fn init_raw_txn_id(c: &mut KafkaClient, id: &str) -> TxnRef {
    let id = id.to_string();
    let (code, r) = retry_coordinator("InitProducerId", VISIBLE, || {
        let r = c.init_producer_id_txn(&id, 60_000, (-1, -1))?;
        Ok((r.error_code, r))
    })
    .unwrap();
    assert_eq!(code, NONE, "InitProducerId: {r:?}");
    TxnRef {
        transactional_id: id,
        producer_id: r.producer_id.0,
        producer_epoch: r.producer_epoch,
    }
}

/// Transactional offset commits of the same members through both
/// transaction versions the broker offers: TxnOffsetCommit v3/v4 after an
/// explicit AddOffsetsToTxn (version 1), and v5, which adds the group to
/// the transaction implicitly (version 2), each in its own transaction.
struct TxnCommitters {
    client: KafkaClient,
    /// (TxnOffsetCommit version, producer).
    txns: Vec<(i16, TxnRef)>,
}

impl TxnCommitters {
    fn new(node: &SamsaNode) -> TxnCommitters {
        let mut client = node.client();
        let max = client
            .version_for(kafka_protocol::messages::ApiKey::TxnOffsetCommit)
            .unwrap();
        assert!(
            max >= 3,
            "TxnOffsetCommit v3+ carries the member fields (KIP-447); the broker offers v{max} at most"
        );
        let mut txns = vec![(max.min(4), init_raw_txn(&mut client))];
        if max >= 5 {
            txns.push((5, init_raw_txn(&mut client)));
        }
        TxnCommitters { client, txns }
    }

    /// Adds `group` to the version-1 transaction (version 2 needs nothing).
    fn add_group(&mut self, group: &str) {
        let (version, txn) = &self.txns[0];
        assert!(*version < 5);
        let (code, ()) = retry_coordinator("AddOffsetsToTxn", VISIBLE, || {
            Ok((self.client.add_offsets_to_txn(txn, group)?, ()))
        })
        .unwrap();
        assert_eq!(code, NONE, "AddOffsetsToTxn({group})");
    }

    /// TxnOffsetCommit through every transaction; asserts each answer is
    /// `expected` per partition. The version-2 transaction commits
    /// `offset + 100`, so that its (aborted) offsets are recognisable.
    fn commit(
        &mut self,
        group: &str,
        member: &MemberRef,
        topic: &str,
        offsets: &[(i32, i64)],
        expected: i16,
        what: &str,
    ) {
        for (version, txn) in &self.txns {
            let sent: Vec<(i32, i64)> = offsets
                .iter()
                .map(|&(p, o)| (p, if *version >= 5 { o + 100 } else { o }))
                .collect();
            let got = self
                .client
                .txn_offset_commit(txn, group, member, topic, &sent, *version)
                .unwrap();
            let want: Vec<(i32, i16)> = offsets.iter().map(|&(p, _)| (p, expected)).collect();
            assert_eq!(got, want, "TxnOffsetCommit v{version}: {what} ({member:?})");
        }
    }

    /// Commits the version-1 transaction and aborts the version-2 one.
    fn finish(&mut self) {
        for (i, (version, txn)) in self.txns.iter().enumerate() {
            let commit = i == 0;
            let end_version = if *version >= 5 { 5 } else { 4 };
            let (code, ()) = retry_coordinator("EndTxn", VISIBLE, || {
                let r = self.client.end_txn_at(
                    &txn.transactional_id,
                    (txn.producer_id, txn.producer_epoch),
                    commit,
                    end_version,
                )?;
                Ok((r.error_code, ()))
            })
            .unwrap();
            assert_eq!(code, NONE, "EndTxn v{end_version} (commit: {commit})");
        }
    }
}

/// Zombie fencing by hand (KIP-447), the answers Kafka's coordinator gives:
/// member A of generation N keeps its member id but the group moves to
/// generation N+1 when B joins; A's TxnOffsetCommit / OffsetCommit /
/// Heartbeat with generation N get ILLEGAL_GENERATION. A member id the
/// group does not know gets UNKNOWN_MEMBER_ID. A static member replaced by
/// a new instance with the same group.instance.id gets FENCED_INSTANCE_ID.
/// TxnOffsetCommit is checked at v3/v4 (after AddOffsetsToTxn) and at v5
/// (group added implicitly). The current members' commits succeed (the
/// control that the checks are not refusing everything), and after the
/// end only the committed transaction's offsets are visible.
#[test]
fn stale_members_are_fenced_from_offset_commits() {
    let node = SamsaNode::start();
    let topic = unique_topic("zombie-raw");
    let group = unique_topic("zombie-raw-group");
    node.client().create_topic(&topic, 2).unwrap();
    let mut bootstrap = node.client();
    let mut txns = TxnCommitters::new(&node);
    txns.add_group(&group);

    let spec = JoinSpec::new(&group, &topic);
    let mut ca = bootstrap.group_coordinator(&group).unwrap();
    let mut cb = bootstrap.group_coordinator(&group).unwrap();
    let a1 = join_alone(&mut ca, &spec, &[0, 1]);

    // The generation-N member may commit, transactionally or not.
    txns.commit(&group, &a1, &topic, &[(0, 1)], NONE, "the only member");
    assert_eq!(
        ca.offset_commit(&group, &a1, &topic, &[(1, 1)]).unwrap(),
        vec![(1, NONE)]
    );

    // B joins: the group rebalances to generation N+1, A rejoins with its id.
    let (code, first) = retry_coordinator("JoinGroup B", VISIBLE, || {
        let r = cb.join_group_once(&spec, "")?;
        Ok((r.error_code, r))
    })
    .unwrap();
    let b_id = match code {
        MEMBER_ID_REQUIRED => first.member_id.to_string(),
        other => panic!("a new dynamic member's first JoinGroup (v4+) gets MEMBER_ID_REQUIRED, got {other}: {first:?}"),
    };
    let pending_b = cb.send_join_group(&spec, &b_id).unwrap();
    let hb = try_wait_until(VISIBLE, || {
        let code = ca.heartbeat(&group, &a1).unwrap();
        (code != NONE).then_some(code)
    });
    assert_eq!(
        hb,
        Some(REBALANCE_IN_PROGRESS),
        "A's heartbeat must tell it to rejoin"
    );
    let ja = ca.join_group_once(&spec, &a1.member_id).unwrap();
    let jb = cb.recv_join_group(pending_b).unwrap();
    assert_eq!(
        (ja.error_code, jb.error_code),
        (NONE, NONE),
        "{ja:?} {jb:?}"
    );
    assert_eq!(ja.generation_id, jb.generation_id);
    assert!(
        ja.generation_id > a1.generation,
        "generation {} after {}",
        ja.generation_id,
        a1.generation
    );
    let (a2, b2) = (MemberRef::joined(&ja, None), MemberRef::joined(&jb, None));
    assert_eq!(a2.member_id, a1.member_id, "A kept its member id");
    let (leader, follower, leader_conn, follower_conn) = if ja.leader == ja.member_id {
        (&a2, &b2, &mut ca, &mut cb)
    } else {
        (&b2, &a2, &mut cb, &mut ca)
    };
    let assignments = [
        (a2.member_id.clone(), consumer_assignment(&topic, &[0])),
        (b2.member_id.clone(), consumer_assignment(&topic, &[1])),
    ];
    let s = leader_conn
        .sync_group(&group, leader, &assignments)
        .unwrap();
    assert_eq!(s.error_code, NONE, "leader SyncGroup {s:?}");
    let s = follower_conn.sync_group(&group, follower, &[]).unwrap();
    assert_eq!(s.error_code, NONE, "follower SyncGroup {s:?}");

    // A's old generation is refused everywhere.
    txns.commit(
        &group,
        &a1,
        &topic,
        &[(0, 5)],
        ILLEGAL_GENERATION,
        &format!(
            "generation {} while the group is at {}",
            a1.generation, a2.generation
        ),
    );
    assert_eq!(
        ca.offset_commit(&group, &a1, &topic, &[(0, 5)]).unwrap(),
        vec![(0, ILLEGAL_GENERATION)],
        "OffsetCommit with the old generation"
    );
    assert_eq!(
        ca.heartbeat(&group, &a1).unwrap(),
        ILLEGAL_GENERATION,
        "Heartbeat with the old generation"
    );

    // A member id the group does not know.
    let ghost = a2.with_member_id("consumer-ghost-0000");
    txns.commit(
        &group,
        &ghost,
        &topic,
        &[(1, 5)],
        UNKNOWN_MEMBER_ID,
        "an unknown member",
    );
    assert_eq!(
        cb.offset_commit(&group, &ghost, &topic, &[(1, 5)]).unwrap(),
        vec![(1, UNKNOWN_MEMBER_ID)],
        "OffsetCommit of an unknown member"
    );

    // The current members still commit.
    txns.commit(&group, &a2, &topic, &[(0, 2)], NONE, "the current member");
    assert_eq!(
        cb.offset_commit(&group, &b2, &topic, &[(1, 2)]).unwrap(),
        vec![(1, NONE)]
    );

    // Static membership: a second instance with the same group.instance.id
    // replaces the first one's member id; the first one is fenced.
    let static_group = unique_topic("zombie-raw-static");
    let static_spec = JoinSpec::new(&static_group, &topic).static_member("instance-1");
    let mut cs = bootstrap.group_coordinator(&static_group).unwrap();
    let s1 = join_alone(&mut cs, &static_spec, &[0, 1]);
    let j = cs.join_group(&static_spec).unwrap();
    assert_eq!(j.error_code, NONE, "the replacing instance joins: {j:?}");
    let s2 = MemberRef::joined(&j, Some("instance-1"));
    assert_ne!(
        s2.member_id, s1.member_id,
        "the new instance gets a new member id"
    );
    txns.add_group(&static_group);
    let stale = s1.at_generation(s2.generation);
    txns.commit(
        &static_group,
        &stale,
        &topic,
        &[(0, 7)],
        FENCED_INSTANCE_ID,
        "the replaced instance",
    );
    assert_eq!(
        cs.offset_commit(&static_group, &stale, &topic, &[(0, 7)])
            .unwrap(),
        vec![(0, FENCED_INSTANCE_ID)],
        "OffsetCommit of the replaced instance"
    );
    assert_eq!(
        cs.heartbeat(&static_group, &stale).unwrap(),
        FENCED_INSTANCE_ID,
        "Heartbeat of the replaced instance"
    );
    txns.commit(
        &static_group,
        &s2,
        &topic,
        &[(0, 3)],
        NONE,
        "the current instance",
    );

    // Every member leaves: the group is empty, its members' ids are gone.
    for (conn, member) in [(&mut ca, &a2), (&mut cb, &b2)] {
        assert_eq!(conn.leave_group(&group, member).unwrap(), NONE);
    }
    txns.commit(
        &group,
        &a2,
        &topic,
        &[(0, 6)],
        UNKNOWN_MEMBER_ID,
        "a member of an emptied group",
    );
    assert_eq!(
        ca.offset_commit(&group, &a2, &topic, &[(0, 6)]).unwrap(),
        vec![(0, UNKNOWN_MEMBER_ID)],
        "OffsetCommit of a member of an emptied group"
    );

    // Only what the current members sent in the committed transaction
    // becomes visible (the aborted one's +100 offsets never do).
    txns.finish();
    for (g, partition, expected) in [(&group, 0, 2), (&group, 1, 2), (&static_group, 0, 3)] {
        wait_committed_offset(&mut bootstrap, g, &topic, partition, expected, VISIBLE)
            .unwrap_or_else(|last| panic!("{g} {topic}/{partition}: expected {expected}, {last}"));
    }
}

/// One transactional producer commits offsets of a standalone group
/// (generation -1, no member) in three consecutive transactions, the third
/// after a restart (a fresh InitProducerId bumps its epoch, as attempt B's
/// does in seed experiment 2). Every TxnOffsetCommit is accepted and each
/// transaction's offset becomes the committed one. Once through transaction
/// version 1 (AddOffsetsToTxn, TxnOffsetCommit v3/v4, EndTxn v4) and once
/// through version 2 (TxnOffsetCommit v5, EndTxn v5, which bumps the epoch
/// at every end).
#[test]
fn consecutive_transactions_of_one_producer_commit_offsets_tv1() {
    consecutive_txn_offset_commits(false);
}

#[test]
fn consecutive_transactions_of_one_producer_commit_offsets_tv2() {
    consecutive_txn_offset_commits(true);
}

fn consecutive_txn_offset_commits(transaction_version_2: bool) {
    let node = SamsaNode::start();
    let topic = unique_topic("txn-offsets");
    node.client().create_topic(&topic, 1).unwrap();
    let mut bootstrap = node.client();
    let mut c = node.client();
    let max = c
        .version_for(kafka_protocol::messages::ApiKey::TxnOffsetCommit)
        .unwrap();
    let version = if transaction_version_2 {
        assert!(
            max >= 5,
            "transaction version 2 needs TxnOffsetCommit v5; the broker offers v{max}"
        );
        5
    } else {
        max.min(4)
    };
    let standalone = MemberRef {
        member_id: String::new(),
        generation: -1,
        instance_id: None,
    };
    let group = unique_topic("txn-offsets-group");
    // As a client does: find the group's coordinator first (which
    // creates the offsets topic); on one node it is this broker.
    drop(bootstrap.group_coordinator(&group).unwrap());
    let mut txn = init_raw_txn(&mut c);
    for round in 1..=3i64 {
        if round == 3 {
            let restarted = init_raw_txn_id(&mut c, &txn.transactional_id);
            assert_eq!(restarted.producer_id, txn.producer_id);
            assert!(restarted.producer_epoch > txn.producer_epoch);
            txn = restarted;
        }
        if version < 5 {
            let (code, ()) = retry_coordinator("AddOffsetsToTxn", VISIBLE, || {
                Ok((c.add_offsets_to_txn(&txn, &group)?, ()))
            })
            .unwrap();
            assert_eq!(code, NONE, "AddOffsetsToTxn, round {round}");
        }
        let (code, ()) = retry_coordinator("TxnOffsetCommit", VISIBLE, || {
            let r = c.txn_offset_commit(
                &txn,
                &group,
                &standalone,
                &topic,
                &[(0, round * 10)],
                version,
            )?;
            assert_eq!(r.len(), 1, "{r:?}");
            Ok((r[0].1, ()))
        })
        .unwrap();
        assert_eq!(
            code, NONE,
            "TxnOffsetCommit v{version}, round {round} (producer {} epoch {})",
            txn.producer_id, txn.producer_epoch
        );
        let end_version = if version >= 5 { 5 } else { 4 };
        let (code, next) = retry_coordinator("EndTxn", VISIBLE, || {
            let r = c.end_txn_at(
                &txn.transactional_id,
                (txn.producer_id, txn.producer_epoch),
                true,
                end_version,
            )?;
            Ok((r.error_code, (r.producer_id.0, r.producer_epoch)))
        })
        .unwrap();
        assert_eq!(code, NONE, "EndTxn v{end_version}, round {round}");
        if end_version >= 5 {
            txn.producer_id = next.0;
            txn.producer_epoch = next.1;
        }
        wait_committed_offset(&mut bootstrap, &group, &topic, 0, round * 10, VISIBLE)
            .unwrap_or_else(|last| {
                panic!(
                    "v{version} round {round}: committed offset never {}: {last}",
                    round * 10
                )
            });
    }
}

/// Once FindCoordinator(GROUP) has named a broker, that broker serves the
/// group: a commit sent to it right away is accepted, or answered
/// COORDINATOR_LOAD_IN_PROGRESS while it still loads the offsets partition
/// (retriable; Kafka's answer), never NOT_COORDINATOR (which sends a client
/// back to FindCoordinator, and makes librdkafka fail a synchronous commit).
/// On a fresh node, where FindCoordinator creates `__consumer_offsets`.
/// (Kafka registers a partition for loading in the same metadata update
/// that makes the broker its leader, so the window in which it would name
/// itself and still answer NOT_COORDINATOR is a thread switch wide.)
#[test]
fn the_broker_find_coordinator_names_serves_the_group_at_once() {
    let node = SamsaNode::start();
    let topic = unique_topic("coordinator-ready");
    node.client().create_topic(&topic, 1).unwrap();
    let group = unique_topic("coordinator-ready-group");
    let mut coordinator = node.client().group_coordinator(&group).unwrap();
    let standalone = MemberRef {
        member_id: String::new(),
        generation: -1,
        instance_id: None,
    };
    let mut answers = Vec::new();
    let done = try_wait_until(VISIBLE, || {
        let r = coordinator
            .offset_commit(&group, &standalone, &topic, &[(0, 4)])
            .unwrap();
        let code = r.first().map(|p| p.1);
        answers.push(code);
        (code != Some(COORDINATOR_LOAD_IN_PROGRESS)).then_some(code)
    });
    assert_eq!(
        done,
        Some(Some(NONE)),
        "OffsetCommit answers, in order, after FindCoordinator named this broker: {answers:?}"
    );
    assert_eq!(coordinator.committed_offset(&group, &topic, 0).unwrap(), 4);
}

/// A member's commit to a group the coordinator does not know (it expired
/// or was deleted): its generation cannot be valid there. OffsetCommit v9+
/// answers GROUP_ID_NOT_FOUND, older versions and TxnOffsetCommit
/// ILLEGAL_GENERATION (Kafka's codes).
#[test]
fn commits_of_a_member_to_an_unknown_group_are_refused() {
    let node = SamsaNode::start();
    let topic = unique_topic("unknown-group");
    node.client().create_topic(&topic, 1).unwrap();
    let mut bootstrap = node.client();
    let mut txns = TxnCommitters::new(&node);
    let unknown = unique_topic("unknown-group-group");
    let member = MemberRef {
        member_id: "consumer-gone-0000".to_string(),
        generation: 3,
        instance_id: None,
    };
    let mut cu = bootstrap.group_coordinator(&unknown).unwrap();
    let v = cu
        .version_for(kafka_protocol::messages::ApiKey::OffsetCommit)
        .unwrap();
    let newest = if v >= 9 {
        GROUP_ID_NOT_FOUND
    } else {
        ILLEGAL_GENERATION
    };
    for (version, expected) in [(v, newest), (8, ILLEGAL_GENERATION)] {
        // The coordinator may still be loading the offsets partition of a
        // fresh node: retriable answers are retried, as a client does.
        let (code, ()) = retry_coordinator("OffsetCommit", VISIBLE, || {
            let r = cu.offset_commit_at(&unknown, &member, &topic, &[(0, 6)], version)?;
            assert_eq!(r.len(), 1, "{r:?}");
            Ok((r[0].1, ()))
        })
        .unwrap();
        assert_eq!(
            code, expected,
            "OffsetCommit v{version} of a member to an unknown group"
        );
    }
    txns.add_group(&unknown);
    txns.commit(
        &unknown,
        &member,
        &topic,
        &[(0, 6)],
        ILLEGAL_GENERATION,
        "a member of an unknown group",
    );
}

/// Zombie fencing with librdkafka members: member Z consumes both input
/// partitions through the group and writes its 10 outputs in a
/// transaction, then is SIGSTOPped before sending its offsets, past its 6 s
/// session timeout. Member H (another transactional.id, same group) gets
/// the partitions,
/// redoes the work and commits. When Z continues, its offsets are refused
/// with a group fencing error (its member and generation are gone), it
/// aborts, and nothing it wrote becomes visible to read_committed.
#[test]
fn zombie_member_cannot_commit_after_losing_its_partitions() {
    let node = SamsaNode::start();
    let mut client = node.client();
    let p = Pipeline::create(&mut client, &node.bootstrap(), "zombie", 10, 2);
    let z_txn = format!("{}-z", p.txn);
    let h_txn = format!("{}-h", p.txn);

    let mut z = p.attempt("Z", &z_txn, Some("produced")).spawn();
    z.wait_for_line("PRODUCED", ATTEMPT).unwrap();
    kill(z.pid(), Signal::SIGSTOP).unwrap();

    let mut h = p.attempt("H", &h_txn, None).spawn();
    let status = h.wait_exit(ATTEMPT).unwrap();
    assert!(
        status.success(),
        "member H failed: {status}: {:?}",
        h.output
    );
    for partition in 0..2 {
        wait_committed_offset(&mut client, &p.group, &p.input, partition, 5, VISIBLE)
            .unwrap_or_else(|last| {
                panic!("H's offset 5 of {partition} never became visible: {last}")
            });
    }

    kill(z.pid(), Signal::SIGCONT).unwrap();
    z.go_on().unwrap();
    let status = z.wait_exit(ATTEMPT).unwrap();
    let refused = z
        .output
        .iter()
        .find(|l| l.starts_with("SEND-OFFSETS-FAILED") || l.starts_with("COMMIT-FAILED"))
        .cloned();
    assert!(
        !status.success() && refused.is_some(),
        "the zombie's transaction must be refused; it ended with {status}: {:?}",
        z.output
    );
    let refused = refused.unwrap();
    assert!(
        ["UnknownMemberId", "IllegalGeneration", "FencedInstanceId"]
            .iter()
            .any(|c| refused.contains(c)),
        "the refusal must be a group fencing error: {refused}"
    );
    assert!(
        z.output.iter().any(|l| l == "ABORTED"),
        "the zombie aborts: {:?}",
        z.output
    );

    wait_values(
        &p.bootstrap,
        &p.output,
        2,
        ReadCommitted,
        &processed_by("H", 10),
    );
    // In (partition, offset) order: each output partition holds Z's five
    // (aborted) and then H's five.
    let (z_all, h_all) = (processed_by("Z", 10), processed_by("H", 10));
    let all: Vec<String> = [&z_all[..5], &h_all[..5], &z_all[5..], &h_all[5..]].concat();
    assert_eq!(p.output_values(ReadUncommitted), all);
    let mut coordinator = client.group_coordinator(&p.group).unwrap();
    for partition in 0..2 {
        assert_eq!(
            coordinator
                .committed_offset(&p.group, &p.input, partition)
                .unwrap(),
            5,
            "the group offset of partition {partition} is H's"
        );
    }
}

// ---------------------------------------------------------------------------
// consumer lag
// ---------------------------------------------------------------------------

/// Keeps librdkafka's latest statistics.
#[derive(Default)]
struct StatsContext {
    latest: Mutex<Option<Statistics>>,
}

impl ClientContext for StatsContext {
    fn stats(&self, statistics: Statistics) {
        *self.latest.lock().unwrap() = Some(statistics);
    }
}

impl ConsumerContext for StatsContext {}

/// A read_committed group consumer that read a transactional topic to its
/// end (committed and aborted transactions; partition 0 ends with a
/// COMMIT marker, partition 1 with an ABORT marker) and committed its
/// position has lag 0: its position and committed offset equal the high
/// watermark (the marker's offset + 1, not the last record's + 1), and
/// librdkafka's own statistics say consumer_lag 0.
#[test]
fn read_committed_consumer_at_the_end_has_no_lag() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut client = node.client();
    let topic = unique_topic("lag");
    let group = unique_topic("lag-group");
    client.create_topic(&topic, 2).unwrap();
    let p = TxnProducer::transactional(&bootstrap, &unique_topic("lag-txn"));
    // (records on partition 0, records on partition 1, commit?)
    for (n0, n1, commit) in [(3, 2, true), (2, 1, false), (2, 0, true)] {
        p.begin().unwrap();
        for i in 0..n0 {
            p.send_ok(&topic, Some(0), &format!("p0-{commit}-{i}"));
        }
        for i in 0..n1 {
            p.send_ok(&topic, Some(1), &format!("p1-{commit}-{i}"));
        }
        if commit {
            p.commit().unwrap();
        } else {
            p.abort().unwrap();
        }
    }
    // p0: 3 + C + 2 + A + 2 + C = 10; p1: 2 + C + 1 + A = 5.
    let ends: BTreeMap<i32, i64> = [(0, 10), (1, 5)].into();
    for (&partition, &end) in &ends {
        let settled = try_wait_until(VISIBLE, || {
            let leo = client.log_end_offset(&topic, partition).ok()?;
            let lso = client.last_stable_offset(&topic, partition).ok()?;
            (leo == end && lso == end).then_some(())
        });
        assert!(
            settled.is_some(),
            "partition {partition} never settled at {end}"
        );
    }

    let mut config = group_consumer_config(&bootstrap, &group);
    config
        .set("enable.partition.eof", "true")
        .set("statistics.interval.ms", "100");
    let consumer: BaseConsumer<StatsContext> =
        config.create_with_context(StatsContext::default()).unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut at_end: BTreeMap<i32, bool> = BTreeMap::new();
    let mut read = 0;
    let done = try_wait_until(Duration::from_secs(60), || {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Ok(_)) => read += 1,
            // A dropped connection is reported as a consumer error (also
            // against Kafka) and librdkafka reconnects; not an answer
            // about the data, and the deadline still applies.
            Some(Err(KafkaError::MessageConsumption(
                code
                @ (RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown),
            ))) => eprintln!("transient client error {code:?}"),
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {}
        }
        (at_end.len() == 2).then_some(())
    });
    assert!(
        done.is_some(),
        "the consumer never reached both ends: {at_end:?}"
    );
    assert_eq!(read, 7, "3 + 2 committed records on p0, 2 on p1");
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();

    let position = consumer.position().unwrap();
    let committed = consumer.committed(Duration::from_secs(30)).unwrap();
    let mut coordinator = client.group_coordinator(&group).unwrap();
    for (&partition, &end) in &ends {
        let (_, high) = consumer
            .fetch_watermarks(&topic, partition, Duration::from_secs(30))
            .unwrap();
        assert_eq!(high, end, "high watermark of partition {partition}");
        let at = |tpl: &rdkafka::TopicPartitionList| {
            tpl.find_partition(&topic, partition).map(|e| e.offset())
        };
        assert_eq!(
            at(&position),
            Some(Offset::Offset(end)),
            "position of partition {partition}: past its last marker"
        );
        assert_eq!(
            at(&committed),
            Some(Offset::Offset(end)),
            "committed offset of partition {partition} (librdkafka)"
        );
        assert_eq!(
            coordinator
                .committed_offset(&group, &topic, partition)
                .unwrap(),
            end,
            "committed offset of partition {partition} (OffsetFetch)"
        );
    }

    // librdkafka's consumer_lag: the LSO minus the committed offset.
    let mut last = None;
    let lag_zero = try_wait_until(VISIBLE, || {
        let _ = consumer.poll(Duration::from_millis(50));
        let stats = consumer.context().latest.lock().unwrap();
        let t = stats.as_ref()?.topics.get(&topic)?;
        let lags: Vec<(i32, i64, i64, i64)> = ends
            .keys()
            .filter_map(|p| t.partitions.get(p))
            .map(|s| (s.partition, s.consumer_lag, s.committed_offset, s.ls_offset))
            .collect();
        last = Some(lags.clone());
        (lags.len() == 2 && lags.iter().all(|l| l.1 == 0)).then_some(())
    });
    assert!(
        lag_zero.is_some(),
        "librdkafka's consumer_lag never became 0 on both partitions; last (partition, lag, committed, lso) = {last:?}"
    );
}

// ---------------------------------------------------------------------------
// demos
// ---------------------------------------------------------------------------

/// `samsa demo sigkill`, `zombie` and `consumer-lag` run against one node
/// and report that the broker behaved as Kafka does.
#[test]
fn group_demos_run_against_one_node() {
    let node = SamsaNode::start();
    let mut failed = Vec::new();
    for demo in ["sigkill", "zombie", "consumer-lag"] {
        let args: Vec<String> = ["demo", demo, "--bootstrap-server", &node.bootstrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (status, out) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(240));
        eprintln!("----- samsa demo {demo}: {status} -----\n{out}");
        if !(status.success() && out.contains("OK: the broker behaved as Kafka does.")) {
            failed.push(demo);
        }
    }
    assert!(
        failed.is_empty(),
        "these demos failed (output above): {failed:?}"
    );
}

/// DescribeGroups as Kafka answers it: a Stable group with its member, and
/// a group nobody knows — state Dead up to v5, GROUP_ID_NOT_FOUND with a
/// message from v6 on (KIP-1043).
#[test]
fn describe_groups_reports_members_and_unknown_groups_by_version() {
    use kafka_protocol::messages::{DescribeGroupsRequest, GroupId};
    use kafka_protocol::protocol::StrBytes;

    let node = SamsaNode::start();
    let topic = unique_topic("describe");
    let group = unique_topic("describe-group");
    let unknown = unique_topic("describe-nobody");
    node.client().create_topic(&topic, 1).unwrap();
    let mut c = node.client().group_coordinator(&group).unwrap();
    let me = join_alone(&mut c, &JoinSpec::new(&group, &topic), &[0]);
    for version in [5, 6] {
        let request = DescribeGroupsRequest::default().with_groups(vec![
            GroupId(StrBytes::from_string(group.clone())),
            GroupId(StrBytes::from_string(unknown.clone())),
        ]);
        // The unknown group's offsets partition may still be loading on a
        // fresh broker (COORDINATOR_LOAD_IN_PROGRESS, which clients retry).
        let r = samsa_tests::wait_until("groups described", Duration::from_secs(30), || {
            let r = c.send(&request, version).unwrap();
            (!r.groups
                .iter()
                .any(|g| g.error_code == COORDINATOR_LOAD_IN_PROGRESS))
            .then_some(r)
        });
        let (known, nobody) = (&r.groups[0], &r.groups[1]);
        assert_eq!(
            (known.error_code, known.group_state.as_str()),
            (NONE, "Stable"),
            "v{version}"
        );
        assert_eq!(known.protocol_type.as_str(), "consumer");
        assert_eq!(
            known
                .members
                .iter()
                .map(|m| m.member_id.to_string())
                .collect::<Vec<_>>(),
            vec![me.member_id.clone()]
        );
        if version >= 6 {
            assert_eq!(nobody.error_code, GROUP_ID_NOT_FOUND, "v6: {nobody:?}");
            assert!(
                nobody
                    .error_message
                    .as_ref()
                    .is_some_and(|m| m.contains(unknown.as_str())),
                "{nobody:?}"
            );
        } else {
            assert_eq!(
                (nobody.error_code, nobody.group_state.as_str()),
                (NONE, "Dead"),
                "v5: {nobody:?}"
            );
        }
    }
}
