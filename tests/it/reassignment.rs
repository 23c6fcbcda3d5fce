//! Moving partitions on clusters of real `samsa server` processes
//! (KIP-455 reassignment, ElectLeaders, the rebalance and decommission
//! tools), with clients writing through every move:
//!
//! - a three-node cluster grows to five when two broker-only nodes (not
//!   voters) join it (`samsa cluster rebalance`) and shrinks back to three
//!   (`samsa cluster decommission 4,5`, then the emptied nodes are killed)
//!   while `samsa verify` runs its idempotent, transactional,
//!   consume-transform-produce and queue workloads: zero anomalies,
//!   replicas and leaders spread evenly at five, the emptied nodes' copies
//!   deleted, their registrations removed (`samsa cluster unregister`);
//! - a broker-only node whose disk is replaced (same id, empty data
//!   directory) copies its replicas back from the leaders;
//! - a reassignment to a node that is down stays in progress (listed with
//!   its adding and removing replicas) until cancelled; Kafka's errors for
//!   bad targets; a replica removed while its node was down is deleted
//!   when that node comes back;
//! - a throttled move survives SIGKILLs of the controller leader and of the
//!   partition's leader while an idempotent producer writes, and ends with
//!   the new replica holding the whole log;
//! - ElectLeaders PREFERRED (from kafka-python's admin client) restores the
//!   preferred leaders after a failover; OffsetForLeaderEpoch answers as
//!   Kafka's.
//!
//! Waits are polls with deadlines; every process is killed when its
//! cluster is dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use kafka_protocol::messages::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    DescribeClusterRequest, IncrementalAlterConfigsRequest, ListPartitionReassignmentsRequest,
    OffsetForLeaderEpochRequest,
};
use kafka_protocol::protocol::StrBytes;
use samsa_tests::client::topic_name;
use samsa_tests::cluster::{run_cli, SamsaCluster};
use samsa_tests::compat::{compat_script, PyScript};
use samsa_tests::load::IdempotentLoad;
use samsa_tests::node::samsa_bin;
use samsa_tests::verify_run::VerifyRun;
use samsa_tests::{unique_topic, wait_until, BatchBuilder, KafkaClient};
use samsa_verify::history::EventKind;

use crate::replication::create_assigned_topic;

const ACKS_ALL: i16 = -1;
const MOVE_TIMEOUT: Duration = Duration::from_secs(120);
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const INVALID_REPLICATION_FACTOR: i16 = 38;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const FENCED_LEADER_EPOCH: i16 = 74;
const UNKNOWN_LEADER_EPOCH: i16 = 75;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
/// 100 kB records written before the throttled move.
const BULK_RECORDS: usize = 200;

/// Small coordinator topics: they move with everything else.
const SETTINGS: &[&str] = &[
    "offsets_topic_num_partitions=6",
    "transaction_state_log_num_partitions=6",
];

/// Replicas (preferred leader first) and leader of every partition of
/// every topic, as node `id` reports them.
fn placement(c: &SamsaCluster, id: i32) -> BTreeMap<(String, i32), (Vec<i32>, i32)> {
    let md = c.client(id).metadata(None).expect("Metadata");
    let mut out = BTreeMap::new();
    for t in md.topics {
        let name = t.name.map(|n| n.0.to_string()).unwrap_or_default();
        for p in t.partitions {
            let replicas = p.replica_nodes.iter().map(|b| b.0).collect();
            out.insert((name.clone(), p.partition_index), (replicas, p.leader_id.0));
        }
    }
    out
}

fn cli(args: &[&str]) -> samsa_tests::cluster::CliOutput {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run_cli(&samsa_bin(), &args, Duration::from_secs(300))
}

fn assert_cli_ok(out: &samsa_tests::cluster::CliOutput, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        out.stdout,
        out.stderr
    );
}

/// The partition directories (`<topic>-<n>`) of `topics` in `data_dir`.
fn partition_dirs(data_dir: &Path, topics: &BTreeSet<String>) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.rsplit_once('-')
                .is_some_and(|(topic, n)| topics.contains(topic) && n.parse::<i32>().is_ok())
        })
        .collect()
}

/// Waits until `verify` has recorded `n` more acknowledgements, so each
/// shape of the cluster carries load for a while.
fn more_acks(verify: &VerifyRun, n: usize) {
    let acks = || {
        verify
            .events()
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Ack { .. }))
            .count()
    };
    let target = acks() + n;
    wait_until("more acknowledgements", MOVE_TIMEOUT, || {
        (acks() >= target).then_some(())
    });
}

#[test]
fn a_cluster_grows_to_five_and_back_to_three_under_exactly_once_load() {
    let mut c = SamsaCluster::start(3, SETTINGS);
    let bootstrap = (1..=3)
        .map(|id| c.node(id).bootstrap())
        .collect::<Vec<_>>()
        .join(",");
    let verify = VerifyRun::start(
        &[
            "--bootstrap-server",
            &bootstrap,
            "--duration",
            "45s",
            "--rate",
            "200",
            "--seed",
            "19",
        ]
        .map(String::from),
    );
    verify.wait_producing(Duration::from_secs(120));

    // Grow: two brokers that are not voters join the running cluster,
    // then everything is spread over five.
    let joined = [c.add_broker_only(), c.add_broker_only()];
    assert_eq!(joined, [4, 5]);
    for id in joined {
        c.spawn(id);
    }
    for id in joined {
        c.wait_ready(id);
    }
    let out = cli(&["cluster", "rebalance", "-b", &bootstrap, "--timeout", "120"]);
    assert_cli_ok(&out, "samsa cluster rebalance");
    eprintln!("rebalance: {}", out.stdout.trim());
    // Every planned leader leads once node 1 has applied the elections.
    let spread = wait_until("the planned leaders to lead", MOVE_TIMEOUT, || {
        let spread = placement(&c, 1);
        spread
            .values()
            .all(|(list, leader)| list.first() == Some(leader))
            .then_some(spread)
    });
    let mut replicas: BTreeMap<i32, usize> = BTreeMap::new();
    let mut preferred: BTreeMap<i32, usize> = BTreeMap::new();
    for (list, _) in spread.values() {
        for b in list {
            *replicas.entry(*b).or_default() += 1;
        }
        *preferred.entry(list[0]).or_default() += 1;
    }
    eprintln!("at five nodes: replicas per broker {replicas:?}, leaders {preferred:?}");
    more_acks(&verify, 400);
    assert_eq!(
        replicas.len(),
        5,
        "every broker holds replicas: {replicas:?}"
    );
    let (min, max) = (
        replicas.values().min().copied().unwrap_or(0),
        replicas.values().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "replicas spread evenly: {replicas:?}");
    let (min, max) = (
        preferred.values().min().copied().unwrap_or(0),
        preferred.values().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "leaders spread evenly: {preferred:?}");

    // Shrink: empty nodes 4 and 5, then stop them.
    let out = cli(&[
        "cluster",
        "decommission",
        "4,5",
        "-b",
        &bootstrap,
        "--timeout",
        "120",
    ]);
    assert_cli_ok(&out, "samsa cluster decommission 4,5");
    eprintln!("decommission: {}", out.stdout.trim());
    more_acks(&verify, 400);
    let after = placement(&c, 1);
    let topics: BTreeSet<String> = after.keys().map(|(t, _)| t.clone()).collect();
    for ((topic, p), (list, _)) in &after {
        assert!(
            list.iter().all(|b| (1..=3).contains(b)),
            "{topic}-{p} still on {list:?}"
        );
    }
    for id in [4, 5] {
        let dir = c.node(id).data_dir();
        wait_until(
            &format!("node {id} to delete the copies moved away"),
            MOVE_TIMEOUT,
            || partition_dirs(&dir, &topics).is_empty().then_some(()),
        );
        c.sigkill(id);
    }
    // Taken away for good: their registrations go (UnregisterBroker), so
    // even DescribeCluster's fenced brokers no longer list them.
    let out = cli(&["cluster", "unregister", "4,5", "-b", &bootstrap]);
    assert_cli_ok(&out, "samsa cluster unregister 4,5");
    let again = cli(&["cluster", "unregister", "4", "-b", &bootstrap]);
    assert!(
        !again.status.success() && again.stderr.contains("BrokerIdNotRegistered (102)"),
        "a second unregister: {:?} {}",
        again.status,
        again.stderr
    );
    let described = wait_until(
        "brokers 4 and 5 unregistered on node 1",
        MOVE_TIMEOUT,
        || {
            let req = DescribeClusterRequest::default().with_include_fenced_brokers(true);
            let resp = c.client(1).send(&req, 2).ok()?;
            let ids: BTreeSet<i32> = resp.brokers.iter().map(|b| b.broker_id.0).collect();
            (ids == BTreeSet::from([1, 2, 3])).then_some(ids)
        },
    );
    eprintln!("brokers after unregister: {described:?}");
    // And the remaining brokers stop following them.
    wait_until(
        "node 1 to stop its fetchers of 4 and 5",
        MOVE_TIMEOUT,
        || {
            let log = c.log_tail(1, 5_000);
            [4, 5]
                .iter()
                .all(|id| {
                    log.lines().any(|l| {
                        l.contains("broker unregistered: no longer following it")
                            && l.contains(&format!("peer={id}"))
                    })
                })
                .then_some(())
        },
    );

    let done = verify.finish(Duration::from_secs(300));
    let report = &done.report;
    assert_eq!(
        done.status.code(),
        Some(0),
        "samsa verify failed:\n{report:#}\nstderr:\n{}",
        done.stderr_tail(60)
    );
    assert_eq!(report["anomaly_count"], 0, "{report:#}");
    for w in ["idempotent", "txn", "pipeline", "queue"] {
        let ops = report["workloads"][w]["ops"].as_u64().unwrap_or(0);
        assert!(ops > 0, "workload {w} did nothing: {report:#}");
    }
}

/// AlterPartitionReassignments of partition 0 of `topic` (`None` cancels).
fn reassign(
    client: &mut KafkaClient,
    topic: &str,
    target: Option<&[i32]>,
    allow_rf_change: bool,
) -> AlterPartitionReassignmentsResponse {
    let req = AlterPartitionReassignmentsRequest::default()
        .with_timeout_ms(30_000)
        .with_allow_replication_factor_change(allow_rf_change)
        .with_topics(vec![ReassignableTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(vec![ReassignablePartition::default()
                .with_partition_index(0)
                .with_replicas(
                    target.map(|t| t.iter().copied().map(BrokerId).collect()),
                )])]);
    client.send(&req, 1).unwrap()
}

fn reassign_code(client: &mut KafkaClient, topic: &str, target: Option<&[i32]>) -> i16 {
    let resp = reassign(client, topic, target, true);
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    resp.responses[0].partitions[0].error_code
}

/// The reassignments in progress: (topic, partition) → (replicas, adding, removing).
type Moving = BTreeMap<(String, i32), (Vec<i32>, Vec<i32>, Vec<i32>)>;

fn in_progress(client: &mut KafkaClient) -> Moving {
    let resp = client
        .send(
            &ListPartitionReassignmentsRequest::default().with_topics(None),
            0,
        )
        .unwrap();
    assert_eq!(resp.error_code, 0);
    let ids = |l: &[BrokerId]| l.iter().map(|b| b.0).collect::<Vec<_>>();
    resp.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(move |p| {
                (
                    (t.name.0.to_string(), p.partition_index),
                    (
                        ids(&p.replicas),
                        ids(&p.adding_replicas),
                        ids(&p.removing_replicas),
                    ),
                )
            })
        })
        .collect()
}

/// Writes `n` records `tag-i` with acks=all through whoever leads.
fn produce_all(c: &SamsaCluster, ask: i32, topic: &str, tag: &str, n: usize) {
    for i in 0..n {
        let value = format!("{tag}-{i}");
        wait_until(&format!("{topic} to take {value}"), MOVE_TIMEOUT, || {
            let leader = placement(c, ask).get(&(topic.to_string(), 0))?.1;
            if leader < 0 {
                return None;
            }
            let mut client = KafkaClient::connect(c.node(leader).addr()).ok()?;
            let batch = BatchBuilder::new().values([value.as_str()]).build();
            let r = client.produce(topic, 0, batch, ACKS_ALL).ok()?;
            (r.error_code == 0).then_some(())
        });
    }
}

/// Every value of partition 0, read from its leader.
fn read_all(c: &SamsaCluster, ask: i32, topic: &str) -> Vec<String> {
    wait_until(&format!("{topic} to be read"), MOVE_TIMEOUT, || {
        let leader = placement(c, ask).get(&(topic.to_string(), 0))?.1;
        let mut client = KafkaClient::connect(c.node(leader).addr()).ok()?;
        let records = client.fetch_all(topic, 0, 0).ok()?;
        Some(
            records
                .into_iter()
                .map(|r| {
                    String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
                })
                .collect(),
        )
    })
}

#[test]
fn a_move_to_a_stopped_node_waits_until_cancelled_and_a_replica_removed_while_down_is_deleted() {
    let mut c = SamsaCluster::start(4, SETTINGS);
    let topic = unique_topic("move");
    let mut client = c.client(2);
    create_assigned_topic(&mut client, &topic, &[1, 2, 3], None);
    produce_all(&c, 2, &topic, "before", 20);

    // Node 4 is down: it cannot catch up, so the move stays in progress.
    c.sigkill(4);
    assert_eq!(reassign_code(&mut client, &topic, Some(&[2, 3, 4])), 0);
    let moving = in_progress(&mut client);
    assert_eq!(
        moving.get(&(topic.clone(), 0)),
        Some(&(vec![2, 3, 4, 1], vec![4], vec![1])),
        "{moving:?}"
    );
    // Kafka's refusals.
    assert_eq!(
        reassign_code(&mut client, &topic, Some(&[2, 2, 3])),
        INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(
        reassign_code(&mut client, &topic, Some(&[2, 3, 9])),
        INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(
        reassign_code(&mut client, "no-such-topic", Some(&[1])),
        UNKNOWN_TOPIC_OR_PARTITION
    );
    let narrower = reassign(&mut client, &topic, Some(&[2, 3]), false);
    assert_eq!(
        narrower.responses[0].partitions[0].error_code,
        INVALID_REPLICATION_FACTOR
    );
    // Cancel: back to the original replicas.
    assert_eq!(reassign_code(&mut client, &topic, None), 0);
    assert!(in_progress(&mut client).is_empty());
    // Kafka's revert: the original replicas in the move's order.
    wait_until("the original replicas", MOVE_TIMEOUT, || {
        (placement(&c, 2).get(&(topic.clone(), 0))?.0 == vec![2, 3, 1]).then_some(())
    });
    assert_eq!(
        reassign_code(&mut client, &topic, None),
        NO_REASSIGNMENT_IN_PROGRESS
    );

    // Node 4 back, node 1 (the leader) down: the move completes without
    // node 1, which learns it was removed when it restarts.
    c.restart(4);
    c.sigkill(1);
    produce_all(&c, 2, &topic, "during", 20);
    assert_eq!(reassign_code(&mut client, &topic, Some(&[2, 3, 4])), 0);
    wait_until("the move to complete", MOVE_TIMEOUT, || {
        let done = in_progress(&mut client).is_empty()
            && placement(&c, 2).get(&(topic.clone(), 0))?.0 == vec![2, 3, 4];
        done.then_some(())
    });
    produce_all(&c, 2, &topic, "after", 20);
    let values = read_all(&c, 2, &topic);
    let expected: Vec<String> = ["before", "during", "after"]
        .iter()
        .flat_map(|tag| (0..20).map(move |i| format!("{tag}-{i}")))
        .collect();
    assert_eq!(values, expected, "every record once, in order");

    let dir = c.node(1).data_dir().join(format!("{topic}-0"));
    assert!(dir.exists(), "node 1 was down: its copy is still there");
    c.restart(1);
    wait_until("node 1 to delete the removed copy", MOVE_TIMEOUT, || {
        (!dir.exists()).then_some(())
    });
    assert!(c.node(4).data_dir().join(format!("{topic}-0")).exists());
}

fn set_cluster_configs(client: &mut KafkaClient, configs: &[(&str, Option<&str>)]) {
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_static_str(""))
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        AlterableConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_config_operation(if v.is_some() { 0 } else { 1 })
                            .with_value(v.map(|v| StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            ),
    ]);
    let resp = client.call(&req).unwrap();
    assert_eq!(
        resp.responses[0].error_code, 0,
        "{:?}",
        resp.responses[0].error_message
    );
}

#[test]
fn a_throttled_move_survives_the_controller_and_the_leader_being_killed() {
    let mut c = SamsaCluster::start(4, SETTINGS);
    let bulk = unique_topic("throttled");
    let writes = unique_topic("writes");
    let mut client = c.client(2);
    create_assigned_topic(&mut client, &bulk, &[1, 2, 3], None);
    create_assigned_topic(&mut client, &writes, &[1, 2, 3], None);
    // About 20 MB to copy at 500 kB/s: the move takes about 40 s unless
    // the throttle is lifted, far longer than the kills below.
    let payload = "x".repeat(100 * 1024);
    for i in 0..BULK_RECORDS {
        produce_all(&c, 2, &bulk, &format!("bulk-{i}-{payload}"), 1);
    }
    set_cluster_configs(
        &mut client,
        &[
            ("leader.replication.throttled.rate", Some("500000")),
            ("follower.replication.throttled.rate", Some("500000")),
        ],
    );
    let load = IdempotentLoad::start(&c.bootstrap(), &writes, 1);
    load.wait_progress(20, MOVE_TIMEOUT);

    for topic in [&bulk, &writes] {
        assert_eq!(reassign_code(&mut client, topic, Some(&[4, 2, 3])), 0);
    }
    assert!(
        in_progress(&mut client).contains_key(&(bulk.clone(), 0)),
        "20 MB at 500 kB/s cannot have moved yet"
    );
    let controller = c.wait_leader(Duration::from_secs(30));
    c.sigkill(controller);
    c.restart(controller);
    if controller != 1 {
        c.sigkill(1);
        c.restart(1);
    }
    let ask = if controller == 2 { 3 } else { 2 };
    let mut client = c.client(ask);
    assert!(
        in_progress(&mut client).contains_key(&(bulk.clone(), 0)),
        "still throttled after the kills"
    );
    set_cluster_configs(
        &mut client,
        &[
            ("leader.replication.throttled.rate", None),
            ("follower.replication.throttled.rate", None),
        ],
    );
    wait_until("the moves to complete", MOVE_TIMEOUT, || {
        let now = placement(&c, ask);
        let done = in_progress(&mut client).is_empty()
            && [&bulk, &writes].iter().all(|t| {
                now.get(&((*t).clone(), 0))
                    .is_some_and(|(r, _)| r == &vec![4, 2, 3])
            });
        done.then_some(())
    });
    load.wait_progress(load.acked() + 20, MOVE_TIMEOUT);
    load.finish(&c.bootstrap()).assert_ok();
    let values = read_all(&c, ask, &bulk);
    assert_eq!(
        values.iter().filter(|v| v.starts_with("bulk-")).count(),
        BULK_RECORDS,
        "the new replicas hold the whole log"
    );
}

/// OffsetForLeaderEpoch of partition 0 of `topic` to node `node`.
fn end_of_epoch(
    c: &SamsaCluster,
    node: i32,
    topic: &str,
    replica_id: i32,
    current_leader_epoch: i32,
    epoch: i32,
) -> (i16, i32, i64) {
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(replica_id))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(current_leader_epoch)
                .with_leader_epoch(epoch)])]);
    let resp = c.client(node).send(&req, 4).unwrap();
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.leader_epoch, p.end_offset)
}

#[test]
fn preferred_leaders_come_back_by_election_and_offset_for_leader_epoch_answers_as_kafka() {
    let mut c = SamsaCluster::start(3, SETTINGS);
    let topic = unique_topic("elect");
    let mut client = c.client(2);
    create_assigned_topic(&mut client, &topic, &[1, 2, 3], None);
    produce_all(&c, 2, &topic, "epoch0", 10);

    c.sigkill(1);
    wait_until("a new leader", MOVE_TIMEOUT, || {
        let leader = placement(&c, 2).get(&(topic.clone(), 0))?.1;
        (leader > 1).then_some(())
    });
    produce_all(&c, 2, &topic, "epoch1", 10);
    c.restart(1);
    wait_until("node 1 back in the ISR", MOVE_TIMEOUT, || {
        let t = c.client(2).topic_metadata(&topic)?;
        t.partitions[0]
            .isr_nodes
            .iter()
            .any(|b| b.0 == 1)
            .then_some(())
    });
    let (_, leader) = placement(&c, 2)[&(topic.clone(), 0)].clone();
    assert_ne!(leader, 1);

    // OffsetForLeaderEpoch, before the election: epoch 0 ended at 10.
    let md = c.client(leader).topic_metadata(&topic).unwrap();
    let epoch = md.partitions[0].leader_epoch;
    assert!(epoch >= 1);
    assert_eq!(end_of_epoch(&c, leader, &topic, -1, epoch, 0), (0, 0, 10));
    assert_eq!(
        end_of_epoch(&c, leader, &topic, -1, -1, epoch),
        (0, epoch, 20)
    );
    assert_eq!(
        end_of_epoch(&c, leader, &topic, -1, -1, epoch + 5),
        (0, -1, -1)
    );
    assert_eq!(
        end_of_epoch(&c, leader, &topic, -1, epoch - 1, 0).0,
        FENCED_LEADER_EPOCH
    );
    assert_eq!(
        end_of_epoch(&c, leader, &topic, -1, epoch + 1, 0).0,
        UNKNOWN_LEADER_EPOCH
    );
    let follower = (1..=3).find(|b| *b != leader).unwrap();
    assert_eq!(
        end_of_epoch(&c, follower, &topic, -1, -1, 0).0,
        NOT_LEADER_OR_FOLLOWER
    );
    // The debugging id may ask any replica.
    let from_follower = wait_until("the follower to catch up", MOVE_TIMEOUT, || {
        let answer = end_of_epoch(&c, follower, &topic, -2, -1, 0);
        (answer == (0, 0, 10)).then_some(answer)
    });
    assert_eq!(from_follower, (0, 0, 10));

    // kafka-python's admin client: ElectLeaders PREFERRED, the
    // reassignment listing and a reassignment that only reorders.
    let dir = tempfile::tempdir().unwrap();
    let args = vec![
        "--bootstrap".to_string(),
        c.bootstrap(),
        "--topic".to_string(),
        topic.clone(),
    ];
    let mut script = PyScript::spawn(&compat_script("replica_admin.py"), &args, dir.path());
    let status = script.wait(Duration::from_secs(120));
    assert!(status.success(), "{}", script.output(60));
    wait_until("node 1 to lead again", MOVE_TIMEOUT, || {
        (placement(&c, 2).get(&(topic.clone(), 0))?.1 == 1).then_some(())
    });
    let values = read_all(&c, 2, &topic);
    assert_eq!(values.len(), 20, "{values:?}");
}

#[test]
fn a_broker_only_node_with_a_replaced_disk_copies_its_replicas_back() {
    let mut c = SamsaCluster::start(3, SETTINGS);
    let joined = c.add_broker_only();
    c.restart(joined);
    let topic = unique_topic("replaced");
    create_assigned_topic(&mut c.client(1), &topic, &[joined, 1, 2], None);
    produce_all(&c, 1, &topic, "before", 50);

    // The machine dies; its replacement has the same id and an empty disk.
    c.sigkill(joined);
    wait_until("a leader other than the lost node", MOVE_TIMEOUT, || {
        let leader = placement(&c, 1).get(&(topic.clone(), 0))?.1;
        (leader > 0 && leader != joined).then_some(())
    });
    produce_all(&c, 1, &topic, "while-down", 20);
    let data = c.node(joined).data_dir();
    std::fs::remove_dir_all(&data).expect("remove the lost node's data");
    std::fs::create_dir_all(&data).expect("create an empty data directory");
    c.restart(joined);
    wait_until("the replaced node back in the ISR", MOVE_TIMEOUT, || {
        let t = c.client(1).topic_metadata(&topic)?;
        t.partitions[0]
            .isr_nodes
            .iter()
            .any(|b| b.0 == joined)
            .then_some(())
    });

    // It leads again (preferred election) and serves the whole log.
    let out = cli(&["cluster", "elect-leaders", "-b", &c.node(1).bootstrap()]);
    assert_cli_ok(&out, "samsa cluster elect-leaders");
    wait_until("the replaced node to lead", MOVE_TIMEOUT, || {
        (placement(&c, 1).get(&(topic.clone(), 0))?.1 == joined).then_some(())
    });
    let expected: Vec<String> = (0..50)
        .map(|i| format!("before-{i}"))
        .chain((0..20).map(|i| format!("while-down-{i}")))
        .collect();
    assert_eq!(read_all(&c, joined, &topic), expected);
    assert_eq!(
        partition_dirs(&data, &BTreeSet::from([topic.clone()])),
        [format!("{topic}-0")]
    );
}
