//! Three-node clusters of real `samsa server` processes, each node both a
//! controller and a broker: Kafka clients through any node, controller
//! failover under SIGKILL, producer-id uniqueness across failovers, broker
//! fencing, quorum loss, bad configuration, and `samsa dev --nodes 3` with
//! `samsa cluster status`.
//!
//! Each test starts its own cluster (free ports, temporary directories) and
//! kills every process when it ends, also on failure. Waits are polls with
//! deadlines. The settings shorten the broker session to 3 s (the issue's
//! 9 s default is not what is under test) to keep the suite fast.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    DescribeClusterRequest, InitProducerIdRequest, MetadataResponse, ProducerId,
};
use rdkafka::producer::Producer;
use samsa_tests::client::{fetch_request, produce_request};
use samsa_tests::cluster::{median_and_max, run_to_exit, SamsaCluster};
use samsa_tests::codes::{
    COORDINATOR_LOAD_IN_PROGRESS, LEADER_NOT_AVAILABLE, NONE, NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, TOPIC_ALREADY_EXISTS,
};
use samsa_tests::http::http_get;
use samsa_tests::node::samsa_bin;
use samsa_tests::rdk::{
    acked_count, checking_producer, consume_to_end, idempotent_producer_config, send_checked,
};
use samsa_tests::{unique_topic, wait_until, BatchBuilder, EosChecker, KafkaClient};

const ACKS_ALL: i16 = -1;

/// One CreateTopics attempt at `name` (one partition) through `client`,
/// retried until it is created, as an admin client retries it: `Ok(true)`
/// created, `Ok(false)` try again (NOT_CONTROLLER, REQUEST_TIMED_OUT, a
/// transport error), `Err` any other answer.
///
/// TOPIC_ALREADY_EXISTS counts as created when an earlier attempt at the
/// name may have created it (`maybe_created`: it timed out or its answer
/// was lost). It can also answer a name's first attempt: the broker
/// forwards CreateTopics to the active controller and sends it again when
/// that controller dies mid-call, as Kafka's broker does, and a first send
/// that had committed makes the second find the topic. So a first attempt
/// answered TOPIC_ALREADY_EXISTS counts as created only if the topic is
/// there as asked (the names are unique to the test: nobody else creates
/// them), and `resent` counts those; a topic that is not there is a wrong
/// answer.
fn create_attempt(
    client: &mut KafkaClient,
    name: &str,
    maybe_created: &mut bool,
    resent: &mut u32,
) -> Result<bool, String> {
    match client.create_topic_result(name, 1) {
        Ok(r) if r.error_code == NONE => Ok(true),
        Ok(r) if r.error_code == TOPIC_ALREADY_EXISTS && *maybe_created => Ok(true),
        Ok(r) if r.error_code == TOPIC_ALREADY_EXISTS => match leaders(client, name) {
            Some(partitions) if partitions.len() == 1 => {
                *resent += 1;
                Ok(true)
            }
            other => Err(format!(
                "CreateTopics answered TOPIC_ALREADY_EXISTS ({:?}) for a name never asked for \
                 before, and the topic is not there as asked: {other:?}",
                r.error_message
            )),
        },
        Ok(r) if r.error_code == REQUEST_TIMED_OUT => {
            *maybe_created = true;
            Ok(false)
        }
        Ok(r) if r.error_code == NOT_CONTROLLER => Ok(false),
        Ok(r) => Err(format!(
            "CreateTopics answered error code {} ({:?})",
            r.error_code, r.error_message
        )),
        Err(_) => {
            *maybe_created = true;
            Ok(false)
        }
    }
}

/// `(leader, leader_epoch, error_code)` per partition of `topic`, as node
/// `client` reports it; `None` if the topic is unknown there.
fn leaders(client: &mut KafkaClient, topic: &str) -> Option<Vec<(i32, i32, i16)>> {
    let t = client.topic_metadata(topic)?;
    let mut parts: Vec<_> = t
        .partitions
        .iter()
        .map(|p| {
            (
                p.partition_index,
                (p.leader_id.0, p.leader_epoch, p.error_code),
            )
        })
        .collect();
    parts.sort_by_key(|(i, _)| *i);
    Some(parts.into_iter().map(|(_, v)| v).collect())
}

fn broker_ids(md: &MetadataResponse) -> BTreeSet<i32> {
    md.brokers.iter().map(|b| b.node_id.0).collect()
}

/// Asks node `id` for Metadata; `None` if it cannot be reached.
fn metadata_of(cluster: &SamsaCluster, id: i32) -> Option<MetadataResponse> {
    KafkaClient::connect(cluster.node(id).addr())
        .ok()?
        .metadata(None)
        .ok()
}

fn one_record(value: &str) -> bytes::Bytes {
    BatchBuilder::new().values([value]).build()
}

/// Topics, clients through any node, NOT_LEADER_OR_FOLLOWER, librdkafka
/// producing through one node and consuming through another.
#[test]
fn librdkafka_works_through_any_node() {
    let cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("any-node");
    cluster.client(2).create_topic(&topic, 3).unwrap();

    // Every node reports all three brokers and the same leaders, spread over them.
    let mut seen = Vec::new();
    for id in cluster.ids() {
        let mut c = cluster.client(id);
        let found = wait_until(
            &format!("node {id} to see {topic} with leaders"),
            Duration::from_secs(10),
            || {
                leaders(&mut c, &topic)
                    .filter(|l| l.iter().all(|(leader, _, e)| *leader > 0 && *e == 0))
            },
        );
        let md = c.metadata(Some(&[])).unwrap();
        assert_eq!(
            broker_ids(&md),
            BTreeSet::from([1, 2, 3]),
            "brokers seen by node {id}"
        );
        assert!(md.controller_id.0 > 0, "controller id from node {id}");
        seen.push(found);
    }
    assert!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "nodes disagree: {seen:?}"
    );
    let leader_of: Vec<i32> = seen[0].iter().map(|(l, _, _)| *l).collect();
    let topic_ids: std::collections::HashMap<String, _> = cluster
        .client(1)
        .metadata(Some(&[topic.as_str()]))
        .unwrap()
        .topics
        .into_iter()
        .map(|t| (t.name.unwrap().0.to_string(), t.topic_id))
        .collect();
    assert_eq!(
        leader_of.iter().collect::<BTreeSet<_>>().len(),
        3,
        "3 partitions over 3 brokers should have 3 different leaders: {leader_of:?}"
    );

    // A broker that does not lead a partition refuses it with Kafka's code.
    for (partition, leader) in leader_of.iter().enumerate() {
        let partition = i32::try_from(partition).unwrap();
        let other = cluster.ids().into_iter().find(|id| id != leader).unwrap();
        let mut c = cluster.client(other);
        let r = c
            .produce(&topic, partition, one_record("x"), ACKS_ALL)
            .unwrap();
        assert_eq!(
            r.error_code, NOT_LEADER_OR_FOLLOWER,
            "produce to {partition} on node {other}"
        );
        // Produce v10+ (KIP-951) names the leader, its epoch and its
        // endpoint; v13 addresses the topic by id.
        for version in [9, 10, 12, 13] {
            let mut req = produce_request(&topic, partition, one_record("x"), ACKS_ALL);
            if version >= 13 {
                req.topic_data[0].name = Default::default();
                req.topic_data[0].topic_id = topic_ids[&topic];
            }
            let resp = c.send(&req, version).unwrap();
            let p = &resp.responses[0].partition_responses[0];
            assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER, "Produce v{version}");
            let hint = (p.current_leader.leader_id.0, p.current_leader.leader_epoch);
            let endpoints: Vec<(i32, i32)> = resp
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.port))
                .collect();
            if version >= 10 {
                let port = i32::from(cluster.node(*leader).addr().port());
                assert_eq!(
                    hint,
                    (*leader, 0),
                    "Produce v{version} to {partition} on node {other}"
                );
                assert_eq!(endpoints, [(*leader, port)], "Produce v{version}");
            } else {
                assert_eq!(hint, (-1, -1), "Produce v{version}");
                assert!(endpoints.is_empty(), "Produce v{version}");
            }
        }
        let f = c.fetch(&topic, partition, 0, 0, 1).unwrap();
        assert_eq!(
            f.error_code, NOT_LEADER_OR_FOLLOWER,
            "fetch {partition} on node {other}"
        );
        // Fetch v16+ (KIP-951) names the leader, its epoch and its endpoint.
        let mut req = fetch_request(&topic, partition, 0, 0, 1);
        req.topics[0].topic = Default::default();
        req.topics[0].topic_id = topic_ids[&topic];
        for version in [15, 16, 18] {
            let resp = c.send(&req, version).unwrap();
            let p = &resp.responses[0].partitions[0];
            assert_eq!(p.error_code, NOT_LEADER_OR_FOLLOWER, "v{version}");
            let hint = (p.current_leader.leader_id.0, p.current_leader.leader_epoch);
            let endpoints: Vec<(i32, i32)> = resp
                .node_endpoints
                .iter()
                .map(|e| (e.node_id.0, e.port))
                .collect();
            if version >= 16 {
                assert_eq!(
                    hint,
                    (*leader, 0),
                    "v{version} fetch {partition} on node {other}"
                );
                let port = i32::from(cluster.node(*leader).addr().port());
                assert_eq!(endpoints, [(*leader, port)], "v{version}");
            } else {
                assert_eq!(hint, (-1, -1), "v{version}");
                assert!(endpoints.is_empty(), "v{version}");
            }
        }
        let l = c.list_offsets(&topic, partition, -1).unwrap();
        assert_eq!(
            l.error_code, NOT_LEADER_OR_FOLLOWER,
            "list offsets {partition} on node {other}"
        );
        let mut lc = cluster.client(*leader);
        let r = lc
            .produce(&topic, partition, one_record("y"), ACKS_ALL)
            .unwrap();
        assert_eq!(
            r.error_code, 0,
            "produce to {partition} on its leader {leader}"
        );
    }

    // librdkafka: produce bootstrapped at node 2 only, consume at node 3 only.
    let checker = EosChecker::shared();
    let producer = checking_producer(
        &idempotent_producer_config(&cluster.node(2).bootstrap()),
        checker.clone(),
    );
    const RECORDS: u64 = 3_000;
    for i in 0..RECORDS {
        send_checked(&producer, "p", &topic, None, format!("r{i:05}").as_bytes()).unwrap();
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    let producer = Arc::new(producer);
    assert_eq!(acked_count(&producer), RECORDS);
    let mut values = BTreeSet::new();
    consume_to_end(
        &cluster.node(3).bootstrap(),
        &topic,
        3,
        Duration::from_secs(60),
        |_, _, v| {
            values.insert(String::from_utf8_lossy(v).into_owned());
        },
    )
    .unwrap();
    let produced: BTreeSet<String> = (0..RECORDS).map(|i| format!("r{i:05}")).collect();
    assert!(
        produced.is_subset(&values),
        "consumed {} of {RECORDS} records",
        produced.intersection(&values).count()
    );

    // Partitions added and a topic deleted through different nodes.
    {
        use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
        use kafka_protocol::messages::CreatePartitionsRequest;
        let req = CreatePartitionsRequest::default()
            .with_topics(vec![CreatePartitionsTopic::default()
                .with_name(samsa_tests::client::topic_name(&topic))
                .with_count(4)])
            .with_timeout_ms(30_000);
        let resp = cluster.client(1).call(&req).unwrap();
        assert_eq!(
            resp.results[0].error_code, 0,
            "{:?}",
            resp.results[0].error_message
        );
        let mut c2 = cluster.client(2);
        wait_until(
            "node 2 to see 4 partitions with leaders",
            Duration::from_secs(10),
            || {
                leaders(&mut c2, &topic)
                    .filter(|l| l.len() == 4 && l.iter().all(|(l, _, _)| *l > 0))
            },
        );
    }
    let mut c3 = cluster.client(3);
    assert_eq!(c3.delete_topic(&topic).unwrap(), 0);
    for id in cluster.ids() {
        let mut c = cluster.client(id);
        wait_until(
            &format!("node {id} to forget {topic}"),
            Duration::from_secs(10),
            || {
                c.partition_count(&topic)
                    .ok()
                    .flatten()
                    .is_none()
                    .then_some(())
            },
        );
        // Logs are removed when the broker applies the image that dropped the
        // topic, which may trail the Metadata answer by a moment.
        let data_dir = cluster.node(id).data_dir();
        wait_until(
            &format!("node {id} to remove the directories of {topic}"),
            Duration::from_secs(10),
            || {
                let leftover: Vec<_> = std::fs::read_dir(&data_dir)
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&topic))
                    .map(|e| e.file_name())
                    .collect();
                leftover.is_empty().then_some(())
            },
        );
    }
}

/// SIGKILLs the controller leader repeatedly while topics are being created.
#[test]
fn controller_leader_kills_lose_no_topic_and_killed_nodes_catch_up() {
    const KILLS: usize = 5;
    let mut cluster = SamsaCluster::start(3, &["metadata_snapshot_interval_entries=16"]);
    let addrs: BTreeMap<i32, std::net::SocketAddr> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, cluster.node(id).addr()))
        .collect();
    let created: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let creator = {
        let created = created.clone();
        let stop = stop.clone();
        let prefix = unique_topic("kill");
        std::thread::spawn(move || {
            let mut n = 0u32;
            let mut attempt = 0usize;
            let mut maybe_created = false;
            let mut resent = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("{prefix}-{n}");
                // Any live node: the one that answered last, else the next.
                let ids: Vec<i32> = addrs.keys().copied().collect();
                let id = ids[attempt % ids.len()];
                let Ok(mut c) = KafkaClient::connect(addrs[&id]) else {
                    // A killed node: nothing was asked.
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let done = create_attempt(&mut c, &name, &mut maybe_created, &mut resent)
                    .unwrap_or_else(|e| panic!("topic creator: {name} on node {id}: {e}"));
                if done {
                    created.lock().unwrap().push(name);
                    n += 1;
                    maybe_created = false;
                } else {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            resent
        })
    };
    // A creator that stopped on a wrong answer fails the test with it.
    let creator_failed = |creator: &std::thread::JoinHandle<u32>| {
        assert!(
            !creator.is_finished(),
            "the topic creator stopped on a wrong CreateTopics answer (its panic above)"
        );
    };

    let mut failovers = Vec::new();
    let mut first_create = Vec::new();
    for round in 1..=KILLS {
        let leader = cluster.wait_leader(Duration::from_secs(20));
        let before = created.lock().unwrap().len();
        wait_until("topics being created", Duration::from_secs(20), || {
            creator_failed(&creator);
            (created.lock().unwrap().len() >= before + 3).then_some(())
        });
        let count_at_kill = created.lock().unwrap().len();
        let killed_at = Instant::now();
        cluster.sigkill(leader);
        let new_leader = wait_until(
            &format!("a new controller leader after killing {leader}"),
            Duration::from_secs(15),
            || cluster.self_declared_leader().filter(|l| *l != leader),
        );
        let failover = killed_at.elapsed();
        wait_until(
            "a topic created after the kill",
            Duration::from_secs(20),
            || {
                creator_failed(&creator);
                (created.lock().unwrap().len() > count_at_kill).then_some(())
            },
        );
        let writes_back = killed_at.elapsed();
        println!(
            "round {round}: killed leader {leader}; node {new_leader} took over after {failover:?}; \
             topic creation worked again after {writes_back:?}"
        );
        failovers.push(failover);
        first_create.push(writes_back);

        // The killed node rejoins and catches up with the leader's log.
        cluster.restart(leader);
        wait_until(
            &format!("node {leader} to catch up with the metadata log"),
            Duration::from_secs(20),
            || {
                let offsets = cluster.metadata_offsets();
                let target = *offsets.values().max()?;
                (offsets.len() == 3 && offsets.get(&leader) == Some(&target)).then_some(())
            },
        );
    }
    stop.store(true, Ordering::Relaxed);
    let resent = creator
        .join()
        .expect("the topic creator stopped on a wrong CreateTopics answer");

    let created = created.lock().unwrap().clone();
    assert!(
        created.len() >= KILLS * 3,
        "only {} topics created",
        created.len()
    );
    // No created topic is lost, on any node (each node's image).
    for id in cluster.ids() {
        let names = wait_until(
            &format!("node {id} to list all topics"),
            Duration::from_secs(20),
            || {
                let md = metadata_of(&cluster, id)?;
                let names: HashSet<String> = md
                    .topics
                    .iter()
                    .filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_owned()))
                    .collect();
                created.iter().all(|t| names.contains(t)).then_some(names)
            },
        );
        assert!(created.iter().all(|t| names.contains(t)));
    }
    let (median, worst) = median_and_max(&failovers);
    let (median_w, worst_w) = median_and_max(&first_create);
    println!(
        "controller failover over {KILLS} SIGKILLs of the leader: median {median:?}, worst {worst:?} \
         (until a survivor declares itself leader); first successful CreateTopics after the kill: \
         median {median_w:?}, worst {worst_w:?}; {} topics created, none lost ({resent} of \
         them answered TOPIC_ALREADY_EXISTS on their first attempt: a send the broker resent \
         across the failover had committed)",
        created.len()
    );
    // How fast is measured above, for the record; the behaviour is that
    // each kill got a new leader and topic creation back (the waits).
}

/// Producer ids handed out by all brokers while the controller leader is
/// killed: every id is unique, over at least 20 blocks.
#[test]
fn producer_ids_stay_unique_across_controller_failovers() {
    const BLOCK: i64 = 10;
    const MIN_BLOCKS: usize = 30;
    let mut cluster = SamsaCluster::start(3, &[&format!("producer_id_block_size={BLOCK}")]);
    let ids: Arc<Mutex<Vec<i64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = cluster
        .ids()
        .into_iter()
        .map(|id| {
            let addr = cluster.node(id).addr();
            let ids = ids.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut client: Option<KafkaClient> = None;
                while !stop.load(Ordering::Relaxed) {
                    let c = match client.as_mut() {
                        Some(c) => c,
                        None => match KafkaClient::connect(addr) {
                            Ok(c) => client.insert(c),
                            Err(_) => {
                                std::thread::sleep(Duration::from_millis(50));
                                continue;
                            }
                        },
                    };
                    let req = InitProducerIdRequest::default()
                        .with_transactional_id(None)
                        .with_transaction_timeout_ms(i32::MAX)
                        .with_producer_id(ProducerId(-1))
                        .with_producer_epoch(-1);
                    match c.call(&req) {
                        Ok(r) if r.error_code == NONE => ids.lock().unwrap().push(r.producer_id.0),
                        // No block right now (the controller is failing
                        // over): retry, as a producer does.
                        Ok(r) if r.error_code == COORDINATOR_LOAD_IN_PROGRESS => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Ok(r) => panic!(
                            "node {id}: InitProducerId answered error code {}, which no \
                             producer retries",
                            r.error_code
                        ),
                        // A killed node: reconnect.
                        Err(_) => client = None,
                    }
                }
            })
        })
        .collect();
    // A worker that stopped on a wrong answer fails the test with it.
    let check_workers = || {
        assert!(
            workers.iter().all(|w| !w.is_finished()),
            "an InitProducerId worker stopped on a wrong answer (its panic above)"
        );
    };
    let blocks = |ids: &[i64]| {
        ids.iter()
            .map(|id| id / BLOCK)
            .collect::<HashSet<_>>()
            .len()
    };
    let mut kills = 0;
    while kills < 3 || blocks(&ids.lock().unwrap()) < MIN_BLOCKS {
        assert!(kills < 10, "too few blocks after {kills} kills");
        let leader = cluster.wait_leader(Duration::from_secs(20));
        let before = ids.lock().unwrap().len();
        wait_until(
            "producer ids being handed out",
            Duration::from_secs(20),
            || {
                check_workers();
                (ids.lock().unwrap().len() > before + 2 * BLOCK as usize).then_some(())
            },
        );
        cluster.sigkill(leader);
        kills += 1;
        let after_kill = ids.lock().unwrap().len();
        wait_until(
            "producer ids after the kill",
            Duration::from_secs(30),
            || {
                check_workers();
                (ids.lock().unwrap().len() > after_kill + 2 * BLOCK as usize).then_some(())
            },
        );
        cluster.restart(leader);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join()
            .expect("an InitProducerId worker stopped on a wrong answer");
    }
    let ids = ids.lock().unwrap().clone();
    let unique: HashSet<i64> = ids.iter().copied().collect();
    println!(
        "{} producer ids from {} blocks over {kills} controller-leader kills, all unique: {}",
        ids.len(),
        blocks(&ids),
        unique.len() == ids.len()
    );
    assert!(blocks(&ids) >= 20, "only {} blocks", blocks(&ids));
    assert_eq!(
        unique.len(),
        ids.len(),
        "a producer id was handed out twice"
    );
}

/// Produces one record acks=all through `c`, whose broker another broker's
/// Metadata named leader: it may not have applied that metadata yet and
/// answers NOT_LEADER_OR_FOLLOWER (appending nothing) until it has, which a
/// client retries. Any other answer is returned.
fn produce_once_leading(
    c: &mut KafkaClient,
    topic: &str,
    partition: i32,
    value: &str,
) -> PartitionProduceResponse {
    wait_until(
        &format!("{topic}-{partition}'s leader to take a write"),
        Duration::from_secs(10),
        || {
            let r = c
                .produce(topic, partition, one_record(value), ACKS_ALL)
                .unwrap();
            (r.error_code != NOT_LEADER_OR_FOLLOWER).then_some(r)
        },
    )
}

/// A SIGKILLed broker is fenced after the session timeout, its single-replica
/// partitions become unavailable, and it leads them again when it returns.
#[test]
fn killed_broker_is_fenced_and_unfenced_when_it_returns() {
    let session = Duration::from_millis(3_000);
    let heartbeat = Duration::from_millis(500);
    let mut cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("fence");
    cluster.client(1).create_topic(&topic, 6).unwrap();
    let mut observer_client = cluster.client(1);
    let initial = wait_until(
        "leaders of every partition",
        Duration::from_secs(10),
        || {
            leaders(&mut observer_client, &topic)
                .filter(|l| l.iter().all(|(leader, _, _)| *leader > 0))
        },
    );
    // One acknowledged record in every partition, through its leader.
    for (partition, (leader, _, _)) in initial.iter().enumerate() {
        let partition = i32::try_from(partition).unwrap();
        let r = produce_once_leading(&mut cluster.client(*leader), &topic, partition, "before");
        assert_eq!(r.error_code, 0);
    }
    // The victim: a broker that leads partitions but is not the controller
    // leader, so this test sees broker fencing, not controller failover.
    let controller = cluster.wait_leader(Duration::from_secs(20));
    let victim = initial
        .iter()
        .map(|(l, _, _)| *l)
        .find(|l| *l != controller)
        .expect("a partition led by a non-controller broker");
    let observer = cluster.ids().into_iter().find(|id| *id != victim).unwrap();
    let victims: Vec<usize> = initial
        .iter()
        .enumerate()
        .filter(|(_, (l, _, _))| *l == victim)
        .map(|(i, _)| i)
        .collect();

    let killed_at = Instant::now();
    cluster.sigkill(victim);
    let mut c = cluster.client(observer);
    let fenced = wait_until(
        &format!("broker {victim} to be fenced"),
        session + Duration::from_secs(15),
        || {
            let md = c.metadata(Some(&[])).ok()?;
            let gone = !broker_ids(&md).contains(&victim);
            let state = leaders(&mut c, &topic)?;
            let unavailable = victims
                .iter()
                .all(|p| state[*p].0 == -1 && state[*p].2 == LEADER_NOT_AVAILABLE);
            (gone && unavailable).then_some(killed_at.elapsed())
        },
    );
    println!("broker {victim} fenced {fenced:?} after SIGKILL (session timeout {session:?})");
    // DescribeCluster v2 lists it, flagged, when asked for fenced brokers;
    // without the flag (and before v2) it is left out like in Metadata.
    let described = |c: &mut KafkaClient, version: i16, include_fenced: bool| {
        let req = DescribeClusterRequest::default().with_include_fenced_brokers(include_fenced);
        let resp = c.send(&req, version).unwrap();
        assert_eq!(resp.error_code, 0);
        let mut brokers: Vec<(i32, bool)> = resp
            .brokers
            .iter()
            .map(|b| (b.broker_id.0, b.is_fenced))
            .collect();
        brokers.sort_unstable();
        brokers
    };
    let all: Vec<(i32, bool)> = cluster
        .ids()
        .into_iter()
        .map(|id| (id, id == victim))
        .collect();
    assert_eq!(described(&mut c, 2, true), all);
    let live: Vec<(i32, bool)> = all.iter().copied().filter(|(_, fenced)| !fenced).collect();
    assert_eq!(described(&mut c, 2, false), live);
    assert_eq!(described(&mut c, 1, false), live);
    assert!(
        fenced >= session.saturating_sub(heartbeat + Duration::from_millis(300)),
        "fenced after only {fenced:?}, before the session timeout"
    );
    // Other partitions keep their leaders; produce to the orphans is refused.
    let during = leaders(&mut c, &topic).unwrap();
    for (p, (leader, _, _)) in during.iter().enumerate() {
        if !victims.contains(&p) {
            assert_eq!(
                *leader, initial[p].0,
                "partition {p} moved although its leader lives"
            );
        }
    }
    let r = c
        .produce(
            &topic,
            i32::try_from(victims[0]).unwrap(),
            one_record("x"),
            ACKS_ALL,
        )
        .unwrap();
    assert_eq!(r.error_code, NOT_LEADER_OR_FOLLOWER);

    // Back: unfenced, leads its partitions again at a newer epoch, data intact.
    cluster.restart(victim);
    let back = wait_until(
        &format!("broker {victim} to lead again"),
        Duration::from_secs(20),
        || {
            let md = c.metadata(Some(&[])).ok()?;
            let state = leaders(&mut c, &topic)?;
            (broker_ids(&md).contains(&victim) && victims.iter().all(|p| state[*p].0 == victim))
                .then_some(state)
        },
    );
    let mut vc = cluster.client(victim);
    for p in &victims {
        assert!(
            back[*p].1 > initial[*p].1,
            "leader epoch of {p} did not grow: {:?}",
            back[*p]
        );
        let partition = i32::try_from(*p).unwrap();
        let r = produce_once_leading(&mut vc, &topic, partition, "after");
        assert_eq!(r.error_code, 0, "produce to {partition} after the return");
        assert_eq!(r.base_offset, 1, "the record from before the kill is kept");
        let values: Vec<String> = vc
            .fetch_all(&topic, partition, 0)
            .unwrap()
            .into_iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
            .collect();
        assert_eq!(values, ["before", "after"]);
    }
}

/// Two of three controllers down: the survivor keeps serving what it leads,
/// metadata changes fail with a retriable error, and all recovers.
#[test]
fn quorum_loss_keeps_leaderships_and_fails_metadata_changes_retriably() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("quorum");
    cluster.client(1).create_topic(&topic, 3).unwrap();
    let mut c = cluster.client(1);
    let state = wait_until("leaders", Duration::from_secs(10), || {
        leaders(&mut c, &topic).filter(|l| l.iter().all(|(leader, _, _)| *leader > 0))
    });
    let survivor = 1;
    let own = i32::try_from(state.iter().position(|(l, _, _)| *l == survivor).unwrap()).unwrap();
    cluster.sigkill(2);
    cluster.sigkill(3);

    // The survivor keeps its leadership.
    let mut s = cluster.client(survivor);
    let r = s
        .produce(&topic, own, one_record("during"), ACKS_ALL)
        .unwrap();
    assert_eq!(
        r.error_code, 0,
        "produce on the survivor during quorum loss"
    );
    assert_eq!(s.fetch_all(&topic, own, 0).unwrap().len(), 1);

    // A metadata change fails within the request timeout, retriably.
    let started = Instant::now();
    let r = s
        .create_topic_result(&unique_topic("no-quorum"), 1)
        .unwrap();
    let took = started.elapsed();
    let message = r
        .error_message
        .as_ref()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_default();
    println!(
        "CreateTopics without quorum: error {} after {took:?}: {message}",
        r.error_code
    );
    // Within the request's timeout: the answer came before the client's
    // read timeout (as long as the request's 30 s) gave up on it.
    assert_eq!(r.error_code, REQUEST_TIMED_OUT, "{message}");
    assert!(message.contains("controller"), "unclear message: {message}");

    // One controller back: quorum again, changes work, the dead node is fenced.
    cluster.restart(2);
    let name = unique_topic("quorum-back");
    let mut maybe_created = false;
    wait_until(
        "CreateTopics to work again",
        Duration::from_secs(30),
        || {
            let mut c = KafkaClient::connect(cluster.node(survivor).addr()).ok()?;
            create_attempt(&mut c, &name, &mut maybe_created, &mut 0)
                .unwrap_or_else(|e| panic!("CreateTopics {name}: {e}"))
                .then_some(())
        },
    );
    wait_until("node 3 to be fenced", Duration::from_secs(20), || {
        let md = metadata_of(&cluster, survivor)?;
        (!broker_ids(&md).contains(&3)).then_some(())
    });
    cluster.restart(3);
    let md = metadata_of(&cluster, 3).unwrap();
    assert_eq!(broker_ids(&md), BTreeSet::from([1, 2, 3]));
    assert!(md
        .topics
        .iter()
        .any(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name)));
}

fn assert_fails_with(output: &(std::process::ExitStatus, String), needle: &str) {
    let (status, text) = output;
    assert!(
        !status.success(),
        "expected a failure, got success:\n{text}"
    );
    assert!(
        text.contains(needle),
        "expected the error to mention {needle:?}:\n{text}"
    );
    assert!(
        !text.contains("panicked"),
        "a panic instead of an error:\n{text}"
    );
}

/// Bad configurations end the process with a clear error, never a panic or
/// a silent hang.
#[test]
fn bad_cluster_configuration_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = || samsa_tests::node::free_port();
    let (p1, p2, p3) = (port(), port(), port());
    let voters = format!("1@127.0.0.1:{p1},2@127.0.0.1:{p2},3@127.0.0.1:{p3}");
    let server = |node: i32, controller: u16, voters: &str, extra: &[&str]| -> Vec<String> {
        let data = dir.path().join(format!("n{node}-{controller}"));
        let mut args: Vec<String> = vec![
            "server".into(),
            "--node-id".into(),
            node.to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", port()),
            "--data-dir".into(),
            data.display().to_string(),
            "--set".into(),
            format!("controller_quorum_voters={voters}"),
            "--set".into(),
            format!("controller_listen=127.0.0.1:{controller}"),
            "--set".into(),
            "http_listen=127.0.0.1:0".into(),
        ];
        for e in extra {
            args.push("--set".into());
            args.push((*e).into());
        }
        args
    };
    let bin = samsa_bin();
    let quick = Duration::from_secs(20);

    // The node is not in the voter list.
    let out = run_to_exit(&bin, &server(4, p1, &voters, &[]), quick);
    assert_fails_with(&out, "not in controller_quorum_voters");
    // A node id twice in the voter list.
    let dup = format!("1@127.0.0.1:{p1},1@127.0.0.1:{p2}");
    let out = run_to_exit(&bin, &server(1, p1, &dup, &[]), quick);
    assert_fails_with(&out, "appears twice");
    // The quorum cannot form (the other voters never start): a bounded wait.
    let started = Instant::now();
    let out = run_to_exit(
        &bin,
        &server(1, p1, &voters, &["controller_startup_timeout_ms=3000"]),
        Duration::from_secs(30),
    );
    assert_fails_with(&out, "could not register with the controller quorum");
    assert_fails_with(&out, "at least 2 of the 3 voters");
    println!("unreachable quorum reported after {:?}", started.elapsed());

    // A running cluster, then a second process with node id 2.
    let mut cluster = SamsaCluster::start(3, &[]);
    let node2 = cluster.node(2).controller_port;
    let out = run_to_exit(&bin, &server(2, node2, cluster.voters(), &[]), quick);
    assert_fails_with(&out, "configured twice");
    // The cluster is unharmed.
    cluster.wait_leader(Duration::from_secs(10));
    cluster
        .client(1)
        .create_topic(&unique_topic("still-fine"), 1)
        .unwrap();

    // Another cluster's data: a configured cluster id that is not this data's.
    cluster.sigkill(3);
    let mut args = cluster.server_args(3);
    args.extend(["--set".into(), "cluster_id=some-other-cluster".into()]);
    let out = run_to_exit(&bin, &args, quick);
    assert_fails_with(&out, "another cluster");
    // Cluster data started as a single node, and single-node data in a cluster.
    let single = vec![
        "server".to_string(),
        "--listen".into(),
        format!("127.0.0.1:{}", port()),
        "--data-dir".into(),
        cluster.node(3).data_dir().display().to_string(),
        "--set".into(),
        "http_listen=127.0.0.1:0".into(),
    ];
    let out = run_to_exit(&bin, &single, quick);
    assert_fails_with(&out, "belongs to a cluster node");
    let mut single_node = samsa_tests::SamsaNode::start();
    let single_data = single_node.data_dir();
    single_node.sigterm_and_wait();
    let mut args = server(1, p1, &voters, &[]);
    let at = args.iter().position(|a| a == "--data-dir").unwrap();
    args[at + 1] = single_data.display().to_string();
    let out = run_to_exit(&bin, &args, quick);
    assert_fails_with(&out, "single-node data");
    cluster.restart(3);
}

/// Nine free ports: base, base+100, base+200 for Kafka, controllers and HTTP.
fn dev_ports() -> (u16, u16) {
    for _ in 0..200 {
        let kafka = rand::random::<u16>() % 20_000 + 20_000;
        let controller = kafka + 1;
        let http = kafka + 2;
        let all = [
            kafka,
            kafka + 100,
            kafka + 200,
            controller,
            controller + 100,
            controller + 200,
            http,
            http + 100,
            http + 200,
        ];
        if all
            .iter()
            .all(|p| TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return (kafka, controller);
        }
    }
    panic!("no free port range for samsa dev");
}

/// `samsa dev --nodes 3` brings up a working cluster; `samsa cluster status`
/// describes it; SIGTERM stops all three nodes cleanly.
#[test]
fn dev_three_nodes_and_cluster_status() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let (kafka, controller) = dev_ports();
    let log = std::fs::File::create(dir.path().join("dev.log")).unwrap();
    let dev = Command::new(samsa_bin())
        .args(["dev", "--nodes", "3", "--port", &kafka.to_string()])
        .args(["--controller-port", &controller.to_string()])
        .args(["--http-port", &(kafka + 2).to_string(), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--set", "broker_session_timeout_ms=3000"])
        .env("RUST_LOG", "info,openraft=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    struct Kill(std::process::Child, std::path::PathBuf);
    impl Drop for Kill {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("{}", std::fs::read_to_string(&self.1).unwrap_or_default());
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let log_path = dir.path().join("dev.log");
    let mut guard = Kill(dev, log_path.clone());
    let addr = |n: u16| std::net::SocketAddr::from(([127, 0, 0, 1], kafka + 100 * n));
    for n in 0..3 {
        wait_until(
            &format!("dev node {} to list 3 brokers", n + 1),
            Duration::from_secs(60),
            || {
                let mut c =
                    KafkaClient::connect_with_timeout(addr(n), Duration::from_secs(1)).ok()?;
                c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                c.api_versions().ok()?;
                let md = c.metadata(Some(&[])).ok()?;
                (broker_ids(&md) == BTreeSet::from([1, 2, 3])).then_some(())
            },
        );
    }
    let topic = unique_topic("dev");
    KafkaClient::connect(addr(2))
        .unwrap()
        .create_topic(&topic, 3)
        .unwrap();
    let mut c1 = KafkaClient::connect(addr(0)).unwrap();
    wait_until("node 1 to see the topic", Duration::from_secs(10), || {
        leaders(&mut c1, &topic).filter(|l| l.len() == 3)
    });

    let controllers = format!(
        "127.0.0.1:{controller},127.0.0.1:{},127.0.0.1:{}",
        controller + 100,
        controller + 200
    );
    let args: Vec<String> = ["cluster", "status", "--controller", &controllers]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    println!("{text}");
    assert!(status.success(), "cluster status failed:\n{text}");
    assert!(text.contains("Controller leader:  "), "{text}");
    assert!(!text.contains("Controller leader:  none"), "{text}");
    assert_eq!(text.matches(" active").count(), 3, "{text}");
    assert_eq!(
        text.lines().filter(|l| l.contains(&topic)).count(),
        3,
        "{text}"
    );
    assert_eq!(text.matches("follower").count(), 2, "{text}");

    // Each node's HTTP endpoint: ready, and together they lead the topic's
    // three partitions.
    let mut led = 0;
    for n in 0..3u16 {
        let http = std::net::SocketAddr::from(([127, 0, 0, 1], kafka + 2 + 100 * n));
        wait_until(
            &format!("dev node {} to be ready", n + 1),
            Duration::from_secs(30),
            || (http_get(http, "/readyz").ok()?.0 == 200).then_some(()),
        );
        let (_, body) = http_get(http, "/metrics").unwrap();
        led += body
            .lines()
            .filter(|l| l.starts_with("samsa_partition_high_watermark{") && l.contains(&topic))
            .count();
    }
    assert_eq!(led, 3, "each partition is led by exactly one node");

    // SIGTERM: all nodes stop cleanly.
    nix_sigterm(guard.0.id());
    let status = samsa_tests::wait::try_wait_until(Duration::from_secs(30), || {
        guard.0.try_wait().ok().flatten()
    })
    .expect("samsa dev did not stop within 30 s of SIGTERM");
    assert!(status.success(), "samsa dev exited with {status}");
    let text = std::fs::read_to_string(&log_path).unwrap();
    assert!(text.contains("samsa dev cluster stopped cleanly"), "{text}");
}

/// A connection to the inter-node gRPC port whose peer never sends the
/// HTTP/2 preface (a client that gave up on it, its FIN lost in a partition)
/// does not keep a stopping node alive: the node exits on SIGTERM, and
/// cleanly, while the connection is still open.
#[test]
fn a_peer_connection_that_never_finished_its_handshake_does_not_hold_a_stopping_node() {
    let mut cluster = SamsaCluster::start(1, &[]);
    let mut silent = std::net::TcpStream::connect(cluster.node(1).controller_addr())
        .expect("connect to the gRPC port");
    // The server's HTTP/2 SETTINGS: the connection is accepted and served,
    // not still in the listen backlog when the stop comes.
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a read timeout");
    let mut settings = [0u8; 9];
    std::io::Read::read_exact(&mut silent, &mut settings).expect("the server's first HTTP/2 frame");
    assert_eq!(settings[3], 0x4, "an HTTP/2 SETTINGS frame: {settings:?}");
    let status = cluster.sigterm(1, Duration::from_secs(30));
    let log = cluster.log_tail(1, 40);
    let status = status.unwrap_or_else(|| panic!("node 1 did not exit within 30 s:\n{log}"));
    assert!(status.success(), "node 1 exited with {status}:\n{log}");
    assert!(
        log.contains("gRPC requests still in flight after the grace period"),
        "the stop waited for the silent connection, then dropped it:\n{log}"
    );
    drop(silent);
}

fn nix_sigterm(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    kill(Pid::from_raw(i32::try_from(pid).unwrap()), Signal::SIGTERM).expect("kill(SIGTERM)");
}

/// A voter whose data directory was wiped must not take part in the quorum
/// again (it could make it forget committed metadata): started on an empty
/// store that the other voters know, it exits with an error that says what
/// happened, and the cluster goes on without it.
#[test]
fn cluster_node_with_a_wiped_data_dir_refuses_to_start() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let mut client = cluster.client(2);
    let topic = unique_topic("wiped");
    wait_until("a topic created", Duration::from_secs(30), || {
        created(client.create_topic_result(&topic, 1))
    });
    cluster.sigkill(1);
    let data = cluster.node(1).data_dir();
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    cluster.spawn(1);
    let exited = samsa_tests::wait::try_wait_until(Duration::from_secs(60), || {
        (!cluster.running().contains(&1)).then_some(())
    });
    let log = cluster.log_tail(1, 60);
    assert!(exited.is_some(), "the wiped node kept running:\n{log}");
    assert!(
        log.contains("started on an empty controller store, but the quorum knows this node"),
        "{log}"
    );
    // Nodes 2 and 3 are a majority: metadata changes still commit.
    let second = unique_topic("wiped-after");
    wait_until(
        "a topic created without node 1",
        Duration::from_secs(30),
        || created(client.create_topic_result(&second, 1)),
    );
}

/// `Some` once CreateTopics says the topic is there: created, or (a
/// retry after a failover resent the first attempt) already existing.
fn created(
    result: anyhow::Result<kafka_protocol::messages::create_topics_response::CreatableTopicResult>,
) -> Option<()> {
    let code = result.ok()?.error_code;
    (code == 0 || code == TOPIC_ALREADY_EXISTS).then_some(())
}

/// The other side of the wiped-store check: a node that never took part
/// (its first start, after the others formed the quorum without it) joins.
#[test]
fn cluster_node_started_after_the_quorum_formed_joins_it() {
    let mut cluster = SamsaCluster::new(3, &[]);
    cluster.spawn(1);
    cluster.spawn(2);
    cluster.wait_ready(1);
    cluster.wait_ready(2);
    let mut client = cluster.client(1);
    wait_until(
        "brokers 1 and 2 registered",
        Duration::from_secs(30),
        || (client.metadata(Some(&[])).ok()?.brokers.len() == 2).then_some(()),
    );
    cluster.spawn(3);
    cluster.wait_ready(3);
    wait_until("broker 3 registered", Duration::from_secs(30), || {
        (client.metadata(Some(&[])).ok()?.brokers.len() == 3).then_some(())
    });
}
