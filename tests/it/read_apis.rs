//! The read-only APIs admin clients and UIs call first, over the raw
//! protocol: DescribeTopicPartitions (paging with a cursor, unknown and
//! invalid topics, bad cursors), DescribeLogDirs (sizes that follow the
//! segment files, topic filters, v1–v4, a vanished log directory) and
//! DescribeQuorum (a single node as its own quorum; on three nodes every
//! broker answers with the Raft leader's view, which agrees with `samsa
//! cluster status` and follows a controller failover).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use kafka_protocol::messages::describe_quorum_response::DescribeQuorumResponse;
use kafka_protocol::messages::describe_topic_partitions_response::DescribeTopicPartitionsResponse;
use samsa_tests::batch::now_ms;
use samsa_tests::cluster::{run_to_exit, SamsaCluster, FAST_SETTINGS};
use samsa_tests::codes::{
    INVALID_TOPIC_EXCEPTION, NONE, REQUEST_TIMED_OUT, UNKNOWN_TOPIC_OR_PARTITION,
};
use samsa_tests::node::samsa_bin;
use samsa_tests::{unique_topic, wait_until, BatchBuilder, KafkaClient, SamsaNode};

use crate::replication::{create_replicated_topic, ACKS_ALL};

const INVALID_REQUEST: i16 = 42;
const KAFKA_STORAGE_ERROR: i16 = 56;
/// Every topic operation (READ … ALTER_CONFIGS), what Kafka reports
/// without an authorizer.
const ALL_TOPIC_OPERATIONS: i32 = 3576;

/// `(topic, [partition indexes])` of an answer, in answer order.
fn pages(resp: &DescribeTopicPartitionsResponse) -> Vec<(String, i16, Vec<i32>)> {
    resp.topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(),
                t.error_code,
                t.partitions.iter().map(|p| p.partition_index).collect(),
            )
        })
        .collect()
}

fn cursor(resp: &DescribeTopicPartitionsResponse) -> Option<(String, i32)> {
    resp.next_cursor
        .as_ref()
        .map(|c| (c.topic_name.0.to_string(), c.partition_index))
}

#[test]
fn describe_topic_partitions_pages_with_a_cursor() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let base = unique_topic("dtp");
    let (a, b, cc, missing) = (
        format!("{base}-a"),
        format!("{base}-b"),
        format!("{base}-c"),
        format!("{base}-d-missing"),
    );
    c.create_topic(&a, 3).unwrap();
    c.create_topic(&b, 2).unwrap();
    c.create_topic(&cc, 1).unwrap();
    let md = c.metadata(Some(&[&a])).unwrap();
    let a_id = md.topics[0].topic_id;

    // Named topics, out of order and one twice; 2 partitions per page.
    let named = [
        b.as_str(),
        missing.as_str(),
        a.as_str(),
        cc.as_str(),
        b.as_str(),
    ];
    let p1 = c.describe_topic_partitions(&named, 2, None).unwrap();
    assert_eq!(pages(&p1), vec![(a.clone(), NONE, vec![0, 1])]);
    assert_eq!(cursor(&p1), Some((a.clone(), 2)));
    let t = &p1.topics[0];
    assert_eq!(t.topic_id, a_id);
    assert!(!t.is_internal);
    assert_eq!(t.topic_authorized_operations, ALL_TOPIC_OPERATIONS);
    for p in &t.partitions {
        assert_eq!(p.error_code, NONE);
        assert_eq!((p.leader_id.0, p.leader_epoch), (node.node_id(), 0));
        assert_eq!(p.replica_nodes.iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
        assert_eq!(p.isr_nodes.iter().map(|r| r.0).collect::<Vec<_>>(), [1]);
        assert_eq!(p.eligible_leader_replicas, Some(vec![]));
        assert_eq!(p.last_known_elr, Some(vec![]));
        assert!(p.offline_replicas.is_empty());
    }

    let p2 = c
        .describe_topic_partitions(&named, 2, Some((&a, 2)))
        .unwrap();
    assert_eq!(
        pages(&p2),
        vec![(a.clone(), NONE, vec![2]), (b.clone(), NONE, vec![0])]
    );
    assert_eq!(cursor(&p2), Some((b.clone(), 1)));
    // The page is full right after the last partition of `cc`: the cursor
    // names the next topic, which does not exist.
    let p3 = c
        .describe_topic_partitions(&named, 2, Some((&b, 1)))
        .unwrap();
    assert_eq!(
        pages(&p3),
        vec![(b.clone(), NONE, vec![1]), (cc.clone(), NONE, vec![0])]
    );
    assert_eq!(cursor(&p3), Some((missing.clone(), 0)));
    let p4 = c
        .describe_topic_partitions(&named, 2, Some((&missing, 0)))
        .unwrap();
    assert_eq!(
        pages(&p4),
        vec![(missing.clone(), UNKNOWN_TOPIC_OR_PARTITION, vec![])]
    );
    assert!(p4.topics[0].topic_id.is_nil());
    assert_eq!(cursor(&p4), None);
    // Unknown topics are never auto-created.
    let md = c.metadata(Some(&[&missing])).unwrap();
    assert_eq!(md.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);

    // Every topic, no limit to speak of: all partitions, no cursor; a limit
    // of 0 counts as 1.
    let all = c.describe_topic_partitions(&[], 10_000, None).unwrap();
    assert_eq!(
        pages(&all),
        vec![
            (a.clone(), NONE, vec![0, 1, 2]),
            (b.clone(), NONE, vec![0, 1]),
            (cc.clone(), NONE, vec![0]),
        ]
    );
    assert_eq!(cursor(&all), None);
    let one = c.describe_topic_partitions(&[], 0, Some((&b, 1))).unwrap();
    assert_eq!(pages(&one), vec![(b.clone(), NONE, vec![1])]);
    assert_eq!(cursor(&one), Some((cc.clone(), 0)));

    // A cursor on a topic that is not named, or with a negative partition,
    // refuses the request; an invalid name is INVALID_TOPIC_EXCEPTION.
    let bad = c
        .describe_topic_partitions(&[&a, &b], 10, Some((&cc, 0)))
        .unwrap();
    assert_eq!(
        pages(&bad),
        vec![
            (a.clone(), INVALID_REQUEST, vec![]),
            (b.clone(), INVALID_REQUEST, vec![])
        ]
    );
    let bad = c
        .describe_topic_partitions(&[&a], 10, Some((&a, -1)))
        .unwrap();
    assert_eq!(pages(&bad), vec![(a.clone(), INVALID_REQUEST, vec![])]);
    let invalid = c
        .describe_topic_partitions(&["bad/name"], 10, None)
        .unwrap();
    assert_eq!(
        pages(&invalid),
        vec![("bad/name".to_string(), INVALID_TOPIC_EXCEPTION, vec![])]
    );
    // The connection is still good.
    c.metadata(Some(&[])).unwrap();
}

/// Bytes of the segment files (`*.log`) of one partition directory.
fn segment_bytes(dir: &Path) -> i64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| i64::try_from(e.metadata().unwrap().len()).unwrap())
        .sum()
}

/// `(topic, partition) → (size, offset lag)` of a log-dir result.
fn sizes(
    result: &kafka_protocol::messages::describe_log_dirs_response::DescribeLogDirsResult,
) -> Vec<(String, i32, i64, i64)> {
    result
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                assert!(!p.is_future_key);
                (
                    t.name.0.to_string(),
                    p.partition_index,
                    p.partition_size,
                    p.offset_lag,
                )
            })
        })
        .collect()
}

#[test]
fn describe_log_dirs_sizes_follow_the_segment_files() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let topic = unique_topic("dld");
    let other = unique_topic("dld-other");
    c.create_topic(&topic, 2).unwrap();
    c.create_topic(&other, 1).unwrap();
    let data_dir = std::path::absolute(node.data_dir()).unwrap();

    for version in 1..=4 {
        let resp = c.describe_log_dirs(None, version).unwrap();
        assert_eq!(resp.error_code, NONE);
        assert_eq!(resp.results.len(), 1, "one log dir: {resp:?}");
        let dir = &resp.results[0];
        assert_eq!(dir.error_code, NONE);
        assert_eq!(Path::new(dir.log_dir.as_str()), data_dir);
        let mut listed = sizes(dir);
        listed.sort();
        let mut expected = vec![
            (topic.clone(), 0, 0, 0),
            (topic.clone(), 1, 0, 0),
            (other.clone(), 0, 0, 0),
        ];
        expected.sort();
        assert_eq!(listed, expected, "v{version}");
        if version >= 4 {
            assert!(dir.total_bytes > 0 && dir.usable_bytes > 0, "{dir:?}");
            assert!(dir.usable_bytes <= dir.total_bytes, "{dir:?}");
        } else {
            // Not in the version: the decoder's default.
            assert_eq!((dir.total_bytes, dir.usable_bytes), (-1, -1));
        }
    }

    // Sizes grow with every produce and are the segment files' bytes.
    let mut last = 0;
    for round in 0..3 {
        let batch = BatchBuilder::new()
            .values((0..50).map(|i| format!("round {round} record {i} {}", "x".repeat(100))))
            .build();
        let r = c.produce(&topic, 0, batch, ACKS_ALL).unwrap();
        assert_eq!(r.error_code, NONE);
        let resp = c
            .describe_log_dirs(Some(&[(&topic, &[0, 1, 99]), ("no-such-topic", &[0])]), 4)
            .unwrap();
        let listed = sizes(&resp.results[0]);
        let on_disk = segment_bytes(&node.data_dir().join(format!("{topic}-0")));
        assert_eq!(
            listed,
            vec![(topic.clone(), 0, on_disk, 0), (topic.clone(), 1, 0, 0)],
            "round {round}: only the named partitions that exist"
        );
        assert!(on_disk > last, "round {round}: {on_disk} after {last}");
        last = on_disk;
    }
    // An empty filter asks for nothing.
    let resp = c.describe_log_dirs(Some(&[]), 4).unwrap();
    assert!(resp.results[0].topics.is_empty(), "{resp:?}");

    // The log directory goes away: KAFKA_STORAGE_ERROR for it, no panic,
    // and the broker still answers other requests.
    let moved = node.data_dir().with_extension("moved");
    std::fs::rename(node.data_dir(), &moved).unwrap();
    let resp = c.describe_log_dirs(None, 4).unwrap();
    std::fs::rename(&moved, node.data_dir()).unwrap();
    assert_eq!(resp.error_code, NONE);
    assert_eq!(resp.results.len(), 1);
    assert_eq!(resp.results[0].error_code, KAFKA_STORAGE_ERROR, "{resp:?}");
    assert!(resp.results[0].topics.is_empty());
    c.metadata(Some(&[])).unwrap();
    assert_eq!(
        c.describe_log_dirs(None, 4).unwrap().results[0].error_code,
        NONE
    );
}

/// `(leader, epoch, high watermark, [(voter, log end)])` of an answer.
fn quorum_state(resp: &DescribeQuorumResponse) -> (i32, i32, i64, Vec<(i32, i64)>) {
    assert_eq!(resp.error_code, NONE, "{resp:?}");
    assert_eq!(resp.topics.len(), 1, "{resp:?}");
    assert_eq!(resp.topics[0].topic_name.0.as_str(), "__cluster_metadata");
    let p = &resp.topics[0].partitions[0];
    assert_eq!((p.partition_index, p.error_code), (0, NONE), "{resp:?}");
    assert!(p.observers.is_empty(), "{resp:?}");
    let mut voters: Vec<(i32, i64)> = p
        .current_voters
        .iter()
        .map(|v| (v.replica_id.0, v.log_end_offset))
        .collect();
    voters.sort();
    (p.leader_id.0, p.leader_epoch, p.high_watermark, voters)
}

#[test]
fn describe_quorum_on_one_node_is_this_node() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let me = node.node_id();
    let first = quorum_state(&c.describe_quorum(0).unwrap());
    c.create_topic(&unique_topic("dq"), 1).unwrap();
    for version in 0..=2 {
        let before = now_ms();
        let resp = c.describe_quorum(version).unwrap();
        let (leader, epoch, hw, voters) = quorum_state(&resp);
        assert_eq!((leader, epoch), (me, 0));
        // One metadata change (the topic) since the first answer.
        assert_eq!(hw, first.2 + 1, "v{version}");
        assert_eq!(voters, vec![(me, hw)]);
        let v = &resp.topics[0].partitions[0].current_voters[0];
        if version >= 1 {
            // The leader's times are "now".
            assert!(v.last_fetch_timestamp >= before, "{v:?}");
            assert!(v.last_caught_up_timestamp >= before, "{v:?}");
        } else {
            assert_eq!(
                (v.last_fetch_timestamp, v.last_caught_up_timestamp),
                (-1, -1)
            );
        }
        assert!(v.replica_directory_id.is_nil());
        if version >= 2 {
            // No controller listener on a single node.
            assert_eq!(resp.nodes.len(), 1, "{resp:?}");
            assert_eq!(resp.nodes[0].node_id.0, me);
            assert!(resp.nodes[0].listeners.is_empty(), "{resp:?}");
            assert_eq!(resp.error_message.as_deref(), Some(""));
        }
    }
    // Only __cluster_metadata-0 is a quorum: every other partition asked
    // for is UNKNOWN_TOPIC_OR_PARTITION.
    for (topic, parts) in [("__cluster_metadata", &[0, 1][..]), ("other", &[0][..])] {
        let resp = c.describe_quorum_of(topic, parts, 2).unwrap();
        assert_eq!(resp.error_code, NONE);
        let got: Vec<(i32, i16)> = resp.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.error_code))
            .collect();
        let want: Vec<(i32, i16)> = parts
            .iter()
            .map(|p| (*p, UNKNOWN_TOPIC_OR_PARTITION))
            .collect();
        assert_eq!(got, want, "{topic} {parts:?}");
    }
}

/// DescribeQuorum through node `id`'s Kafka port, if it answers in time.
fn quorum_via(cluster: &SamsaCluster, id: i32) -> Option<DescribeQuorumResponse> {
    let mut c = KafkaClient::connect(cluster.node(id).addr()).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    c.describe_quorum(2).ok()
}

/// The controller leader `samsa cluster status` prints.
fn status_leader(cluster: &SamsaCluster, running: &[i32]) -> (i32, u64) {
    let controllers: Vec<String> = running
        .iter()
        .map(|id| cluster.node(*id).controller_addr())
        .collect();
    let args: Vec<String> = ["cluster", "status", "--controller", &controllers.join(",")]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(status.success(), "cluster status failed:\n{text}");
    let field = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name:?} in\n{text}"))
            .trim()
            .to_string()
    };
    let leader = field("Controller leader:");
    let leader: i32 = leader.split_whitespace().next().unwrap().parse().unwrap();
    let offset: u64 = field("Metadata offset:").parse().unwrap();
    (leader, offset)
}

/// Three nodes: every broker answers DescribeQuorum with the Raft leader's
/// view (forwarded, as a Kafka broker does), the leader is the one `samsa
/// cluster status` shows, the followers' times are recent; log dirs and
/// partitions of an RF 3 topic are described on every broker; after the
/// leader's SIGKILL the survivors report the new leader at a higher epoch,
/// the dead voter unknown in the new term, and its replicas offline.
#[test]
fn cluster_describes_quorum_log_dirs_and_partitions_across_a_failover() {
    let mut cluster = SamsaCluster::start(3, FAST_SETTINGS);
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let topic = unique_topic("read-apis");
    let mut c = cluster.client(1);
    create_replicated_topic(&mut c, &topic, 2, 3);

    // The quorum, through each broker, agrees with `samsa cluster status`.
    let (status_says, status_offset) = status_leader(&cluster, &[1, 2, 3]);
    assert_eq!(status_says, leader);
    let started = now_ms();
    let mut epoch = 0;
    for id in [1, 2, 3] {
        let resp = wait_until(
            &format!("node {id} to describe the quorum with every voter caught up"),
            Duration::from_secs(20),
            || {
                let resp = quorum_via(&cluster, id)?;
                let p = &resp.topics.first()?.partitions.first()?;
                p.current_voters
                    .iter()
                    .all(|v| v.last_caught_up_timestamp > 0)
                    .then_some(resp)
            },
        );
        let (l, e, hw, voters) = quorum_state(&resp);
        assert_eq!(l, leader, "node {id}: {resp:?}");
        assert!(e >= 1, "{resp:?}");
        epoch = e;
        // Status read the leader's applied offset (a Raft index) before.
        assert!(
            hw > i64::try_from(status_offset).unwrap(),
            "{hw} {status_offset}"
        );
        assert_eq!(
            voters.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        let leader_end = voters.iter().find(|(v, _)| *v == leader).unwrap().1;
        assert!(hw <= leader_end, "{resp:?}");
        let p = &resp.topics[0].partitions[0];
        for v in &p.current_voters {
            assert!(v.log_end_offset > 0, "{v:?}");
            // Heartbeats every 150 ms: answered within the last seconds.
            assert!(v.last_fetch_timestamp >= started - 5_000, "{v:?}");
            assert!(
                v.last_caught_up_timestamp <= v.last_fetch_timestamp,
                "{v:?}"
            );
        }
        let mut nodes: Vec<(i32, String)> = resp
            .nodes
            .iter()
            .map(|n| {
                assert_eq!(n.listeners.len(), 1, "{n:?}");
                let l = &n.listeners[0];
                assert_eq!(l.name.as_str(), "CONTROLLER");
                (n.node_id.0, format!("{}:{}", l.host.as_str(), l.port))
            })
            .collect();
        nodes.sort();
        let expected: Vec<(i32, String)> = [1, 2, 3]
            .iter()
            .map(|n| (*n, cluster.node(*n).controller_addr()))
            .collect();
        assert_eq!(nodes, expected);
    }

    // Log dirs: every broker holds both partitions of the RF 3 topic; once
    // replicated, the sizes agree and no replica lags.
    let batch = BatchBuilder::new()
        .values((0..20).map(|i| format!("replicated {i}")))
        .build();
    let md = c.metadata(Some(&[&topic])).unwrap();
    let p0_leader = md.topics[0]
        .partitions
        .iter()
        .find(|p| p.partition_index == 0)
        .unwrap()
        .leader_id
        .0;
    let r = cluster
        .client(p0_leader)
        .produce(&topic, 0, batch, ACKS_ALL)
        .unwrap();
    assert_eq!(r.error_code, NONE);
    wait_until(
        "every broker to report the same non-empty size for partition 0",
        Duration::from_secs(20),
        || {
            let mut seen = BTreeSet::new();
            for id in [1, 2, 3] {
                let resp = cluster
                    .client(id)
                    .describe_log_dirs(Some(&[(&topic, &[0, 1])]), 4)
                    .ok()?;
                let listed = sizes(&resp.results[0]);
                if listed.len() != 2 || listed.iter().any(|(_, _, _, lag)| *lag != 0) {
                    return None;
                }
                seen.insert(listed[0].2);
            }
            (seen.len() == 1 && seen.first() > Some(&0)).then_some(())
        },
    );
    let all = cluster
        .client(2)
        .describe_topic_partitions(&[&topic], 100, None)
        .unwrap();
    for p in &all.topics[0].partitions {
        let mut replicas: Vec<i32> = p.replica_nodes.iter().map(|r| r.0).collect();
        replicas.sort();
        assert_eq!(replicas, [1, 2, 3], "{p:?}");
        assert!(p.offline_replicas.is_empty(), "{p:?}");
    }

    // Failover: the survivors name a new leader at a higher epoch; the dead
    // voter has not answered it, so it is unknown in the new term.
    cluster.sigkill(leader);
    let survivors: Vec<i32> = [1, 2, 3].into_iter().filter(|n| *n != leader).collect();
    for id in &survivors {
        let resp = wait_until(
            &format!("node {id} to report a new controller leader"),
            Duration::from_secs(30),
            || {
                let resp = quorum_via(&cluster, *id)?;
                if resp.error_code == REQUEST_TIMED_OUT {
                    return None; // no leader within the forwarding timeout
                }
                let (l, e, _, _) = quorum_state(&resp);
                (l != leader && e > epoch).then_some(resp)
            },
        );
        let (new_leader, _, _, _) = quorum_state(&resp);
        assert!(survivors.contains(&new_leader), "{resp:?}");
        let dead = resp.topics[0].partitions[0]
            .current_voters
            .iter()
            .find(|v| v.replica_id.0 == leader)
            .unwrap();
        assert_eq!(
            (
                dead.log_end_offset,
                dead.last_fetch_timestamp,
                dead.last_caught_up_timestamp
            ),
            (-1, -1, -1),
            "{resp:?}"
        );
    }
    let (status_says, _) = status_leader(&cluster, &survivors);
    let via_kafka = quorum_state(&quorum_via(&cluster, survivors[0]).unwrap()).0;
    assert_eq!(status_says, via_kafka);
    // Once the dead broker is fenced its replicas are offline.
    wait_until(
        "the dead broker's replicas to be offline",
        Duration::from_secs(20),
        || {
            let resp = cluster
                .client(survivors[0])
                .describe_topic_partitions(&[&topic], 100, None)
                .ok()?;
            resp.topics[0]
                .partitions
                .iter()
                .all(|p| p.offline_replicas.iter().map(|r| r.0).eq([leader]))
                .then_some(())
        },
    );

    // Without a majority no controller leads: the last node answers
    // REQUEST_TIMED_OUT once its forwarding gives up (5 s here).
    cluster.sigkill(via_kafka);
    let last = survivors.into_iter().find(|n| *n != via_kafka).unwrap();
    let resp = quorum_via(&cluster, last).unwrap();
    assert_eq!(resp.error_code, REQUEST_TIMED_OUT, "{resp:?}");
    assert!(
        resp.error_message.as_deref().is_some_and(|m| !m.is_empty()),
        "{resp:?}"
    );
    assert!(resp.topics.is_empty(), "{resp:?}");
}
