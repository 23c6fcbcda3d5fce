//! The coordinators' state topics on a three-node cluster are compacted by
//! every replica, and a coordinator that loads a compacted log after its
//! predecessor was SIGKILLed has the state the killed one had: the group's
//! last committed offset, the transactional id's producer id and epoch.

use std::path::Path;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::rdk::partition_zero_at;
use samsa_tests::txn::{
    create_topic_default_rf, init_transactional_id, partition_leaders, TxnProducer,
};
use samsa_tests::{unique_topic, wait_until};

/// Segments of both state topics: the cleaner only takes closed segments.
const SEGMENT_BYTES: u64 = 16 * 1024;
const COMMITS: i64 = 1500;
const TRANSACTIONS: usize = 300;
const WAIT: Duration = Duration::from_secs(120);

/// Bytes of the segment files of `partition` in a node's data directory.
fn log_bytes(data_dir: &Path, partition: &str) -> u64 {
    std::fs::read_dir(data_dir.join(partition))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Waits until every node's replica of `partition` was compacted (its
/// cleaner logged a pass) and holds at most `bound` bytes.
fn wait_compacted_everywhere(cluster: &SamsaCluster, partition: &str, bound: u64) {
    for id in cluster.ids() {
        let node = cluster.node(id);
        let marker = format!("log cleaner compacted partition partition={partition} ");
        let mut last = 0;
        let done = samsa_tests::wait::try_wait_until(WAIT, || {
            last = log_bytes(&node.data_dir(), partition);
            let cleaned =
                std::fs::read_to_string(node.log_path()).is_ok_and(|log| log.contains(&marker));
            (cleaned && last <= bound).then_some(())
        });
        assert!(
            done.is_some(),
            "node {id}'s {partition} was not compacted to at most {bound} bytes (it holds {last})"
        );
    }
}

/// The leader of `topic`-0, which coordinates everything of these tests
/// (one partition per state topic); `not` excludes a killed node (asked of
/// another one, and not taken as the answer).
fn leader_of(cluster: &SamsaCluster, topic: &str, not: Option<i32>) -> i32 {
    let ask = cluster
        .ids()
        .into_iter()
        .find(|id| Some(*id) != not)
        .unwrap();
    wait_until(&format!("a live leader of {topic}-0"), WAIT, || {
        let leader = *partition_leaders(&mut cluster.client(ask), topic)?.get(&0)?;
        (leader > 0 && Some(leader) != not).then_some(leader)
    })
}

#[test]
fn cluster_compacted_state_topics_reload_after_their_leader_is_killed() {
    let segment = format!("{SEGMENT_BYTES}");
    let mut cluster = SamsaCluster::start(
        3,
        &[
            "offsets_topic_num_partitions=1",
            "transaction_state_log_num_partitions=1",
            &format!("offsets_topic_segment_bytes={segment}"),
            &format!("transaction_state_log_segment_bytes={segment}"),
            "log_cleaner_backoff_ms=100",
        ],
    );
    let bootstrap = cluster.bootstrap();
    let topic = unique_topic("state-compaction");
    create_topic_default_rf(&mut cluster.client(1), &topic, 1).unwrap();

    // Offsets: COMMITS standalone commits of one group (one key), each
    // record over 100 bytes with its batch: far more than the bound below.
    let group = unique_topic("state-compaction-group");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    for offset in 1..=COMMITS {
        consumer
            .commit(&partition_zero_at(&topic, offset), CommitMode::Sync)
            .unwrap_or_else(|e| panic!("commit of offset {offset}: {e}"));
    }
    drop(consumer);

    // Transactions: TRANSACTIONS committed ones of one transactional id
    // (three state records each), then a fresh InitProducerId that fences
    // the producer and bumps the epoch: the state to find again.
    let transactional_id = unique_topic("state-compaction-txn");
    let producer = TxnProducer::transactional(&bootstrap, &transactional_id);
    for i in 0..TRANSACTIONS {
        producer.begin().unwrap();
        producer.send_ok(&topic, Some(0), &format!("t{i}"));
        producer.commit().unwrap();
    }
    drop(producer);
    let txn_leader = leader_of(&cluster, "__transaction_state", None);
    let (producer_id, epoch) =
        init_transactional_id(&mut cluster.client(txn_leader), &transactional_id, 60_000);

    // Both logs compacted by every replica: what is left is the active
    // segment, a few cleaned ones and the last batch of each.
    let bound = 4 * SEGMENT_BYTES;
    wait_compacted_everywhere(&cluster, "__consumer_offsets-0", bound);
    wait_compacted_everywhere(&cluster, "__transaction_state-0", bound);

    // The group coordinator's broker killed: the next one loads the
    // compacted log and has the last commit.
    let offsets_leader = leader_of(&cluster, "__consumer_offsets", None);
    let txn_leader = leader_of(&cluster, "__transaction_state", None);
    cluster.sigkill(offsets_leader);
    let committed = wait_until("the new group coordinator's committed offset", WAIT, || {
        let coordinator = leader_of(&cluster, "__consumer_offsets", Some(offsets_leader));
        // Errors while it loads (COORDINATOR_LOAD_IN_PROGRESS): asked again.
        let offset = cluster
            .client(coordinator)
            .committed_offset(&group, &topic, 0)
            .ok()?;
        (offset >= 0).then_some(offset)
    });
    assert_eq!(committed, COMMITS, "the offset committed last, found again");
    if txn_leader != offsets_leader {
        cluster.restart(offsets_leader);
        cluster.sigkill(txn_leader);
    }

    // The transaction coordinator's broker killed: the next one knows the
    // id's producer id and epoch, so a new InitProducerId bumps that epoch
    // (a lost state would hand out another id, or epoch 0).
    let coordinator = leader_of(&cluster, "__transaction_state", Some(txn_leader));
    let (again_id, again_epoch) =
        init_transactional_id(&mut cluster.client(coordinator), &transactional_id, 60_000);
    assert_eq!(
        (again_id, again_epoch),
        (producer_id, epoch + 1),
        "the transactional id's state after its coordinator's broker was killed"
    );
}
