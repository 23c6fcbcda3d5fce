//! Pipelined produce through the raw protocol: several Produce requests of
//! one connection in flight at once, each with batches for many partitions
//! in an order of its own, as the Java client and franz-go send them with
//! `max.in.flight.requests.per.connection=5`. Kafka applies a connection's
//! requests in arrival order, and an idempotent or transactional producer
//! relies on it: a batch that lands before an earlier one of the same
//! partition is OUT_OF_ORDER_SEQUENCE_NUMBER (fatal for a transactional
//! producer). librdkafka keeps one request in flight per partition, so these
//! tests are what exercises the path.
//!
//! Every case: a producer (idempotent, transactional with transaction
//! version 1 — AddPartitionsToTxn first, Produce v11 — or version 2 —
//! Produce v12 adds the partition) writes a few transactions (or rounds),
//! each as `requests` Produce requests sent back to back on one connection
//! per partition leader before any answer is read; every batch must be
//! accepted, and the exactly-once checker then finds every record once, at
//! its acknowledged offset, in sequence order. `SAMSA_TEST_SEED` replays the
//! orders of a run.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use samsa_tests::checker::EosChecker;
use samsa_tests::client::{topic_name, KafkaClient};
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes::*;
use samsa_tests::http::{http_get, metric};
use samsa_tests::txn::{
    create_topic_default_rf, end_txn_v5, init_transactional_id, retry_coordinator, serving_leader,
};
use samsa_tests::{unique_topic, wait_until, BatchBuilder, SamsaNode};

/// Transactions (or, for the idempotent producer, rounds) per case.
const TRANSACTIONS: usize = 3;
/// Produce requests in flight per connection: the Java client's default.
const IN_FLIGHT: usize = 5;
/// Partitions per leader, so every request carries batches for 8.
const PARTITIONS_PER_LEADER: i32 = 8;
const SETTLE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum ProducerKind {
    /// No producer id: the order of appends is the only order there is.
    Plain,
    Idempotent,
    /// Transaction version 1: AddPartitionsToTxn, Produce v11, EndTxn v4.
    TransactionalV1,
    /// Transaction version 2: Produce v12 adds the partition, EndTxn v5.
    TransactionalV2,
}

impl ProducerKind {
    const ALL: [ProducerKind; 4] = [
        ProducerKind::Plain,
        ProducerKind::Idempotent,
        ProducerKind::TransactionalV1,
        ProducerKind::TransactionalV2,
    ];

    fn produce_version(self) -> i16 {
        match self {
            ProducerKind::Plain | ProducerKind::Idempotent | ProducerKind::TransactionalV2 => 12,
            ProducerKind::TransactionalV1 => 11,
        }
    }
}

/// One pipelined request: the partitions it writes, in its order, and how
/// many records each batch holds.
type RequestPlan = Vec<(i32, usize)>;

/// A producer writing pipelined requests, with what it sent and was
/// acknowledged recorded in the exactly-once checker.
struct Pipeliner {
    kind: ProducerKind,
    name: String,
    transactional_id: Option<String>,
    producer: (i64, i16),
    next_sequence: HashMap<i32, i32>,
    checker: EosChecker,
    acks: i16,
}

/// The broker coordinating transactional id `id` (FindCoordinator, which
/// also creates `__transaction_state` on first use).
fn coordinator_of(client: &mut KafkaClient, id: &str) -> i32 {
    wait_until("a transaction coordinator", SETTLE, || {
        let (code, node) = client.find_coordinator(1, id).ok()?;
        (code == NONE).then_some(node)
    })
}

impl Pipeliner {
    /// A new producer; `coordinator` must be the coordinator of `name`
    /// when `kind` is transactional.
    fn new(
        kind: ProducerKind,
        acks: i16,
        name: String,
        coordinator: &mut KafkaClient,
    ) -> Pipeliner {
        let (transactional_id, producer) = match kind {
            ProducerKind::Plain => (None, (-1, -1)),
            ProducerKind::Idempotent => {
                let r = coordinator.init_producer_id().expect("InitProducerId");
                assert_eq!(r.error_code, NONE, "InitProducerId: {r:?}");
                (None, (r.producer_id.0, r.producer_epoch))
            }
            ProducerKind::TransactionalV1 | ProducerKind::TransactionalV2 => {
                let producer = init_transactional_id(coordinator, &name, 60_000);
                (Some(name.clone()), producer)
            }
        };
        Pipeliner {
            kind,
            name,
            transactional_id,
            producer,
            next_sequence: HashMap::new(),
            checker: EosChecker::new(),
            acks,
        }
    }

    /// Starts a transaction over `partitions` (transaction version 1 adds
    /// them first, as its clients do).
    fn begin(&mut self, coordinator: &mut KafkaClient, topic: &str, partitions: &[i32]) {
        if let (ProducerKind::TransactionalV1, Some(id)) = (self.kind, &self.transactional_id) {
            let (code, results) = retry_coordinator("AddPartitionsToTxn", SETTLE, || {
                let results =
                    coordinator.add_partitions_to_txn(id, self.producer, topic, partitions)?;
                let code = results
                    .iter()
                    .map(|&(_, code)| code)
                    .find(|&code| code != NONE)
                    .unwrap_or(NONE);
                Ok((code, results))
            })
            .expect("AddPartitionsToTxn");
            assert_eq!(code, NONE, "AddPartitionsToTxn: {results:?}");
        }
    }

    fn commit(&mut self, coordinator: &mut KafkaClient) {
        let Some(id) = self.transactional_id.clone() else {
            return;
        };
        match self.kind {
            ProducerKind::TransactionalV1 => {
                let (code, r) = retry_coordinator("EndTxn", SETTLE, || {
                    let r = coordinator.end_txn_at(&id, self.producer, true, 4)?;
                    Ok((r.error_code, r))
                })
                .expect("EndTxn");
                assert_eq!(code, NONE, "EndTxn v4 commit: {r:?}");
            }
            ProducerKind::TransactionalV2 => {
                let (code, next) = end_txn_v5(coordinator, &id, self.producer, true);
                assert_eq!(code, NONE, "EndTxn v5 commit");
                // Transaction version 2 bumps the epoch at every end, and
                // sequences start again at 0 with it.
                if next != self.producer {
                    self.producer = next;
                    self.next_sequence.clear();
                }
            }
            ProducerKind::Plain | ProducerKind::Idempotent => return,
        }
        // Until its markers are written the transaction is still ending,
        // and a write of the next one would be refused as retriable
        // (CONCURRENT_TRANSACTIONS from the coordinator); a client retries
        // it, which a pipelined test that requires every batch to be
        // accepted cannot. So the next transaction starts once this one is
        // complete.
        wait_until("the transaction complete", SETTLE, || {
            let (code, state) = coordinator.transaction_state(&id).ok()?;
            (code == NONE && state == "CompleteCommit").then_some(())
        });
    }

    /// Builds one request of `plan`, recording its records as sent; returns
    /// it with the values of each batch in request order.
    fn request(
        &mut self,
        topic: &str,
        tag: &str,
        plan: &RequestPlan,
    ) -> (ProduceRequest, Vec<(i32, Vec<String>)>) {
        let mut partitions = Vec::new();
        let mut sent = Vec::new();
        for &(partition, records) in plan {
            let sequence = self.next_sequence.entry(partition).or_insert(0);
            let values: Vec<String> = (0..records)
                .map(|i| format!("{tag}-p{partition}-s{}", *sequence + i as i32))
                .collect();
            let (pid, epoch) = self.producer;
            let batch = match self.kind {
                ProducerKind::Plain => BatchBuilder::new(),
                _ => BatchBuilder::idempotent(pid, epoch, *sequence),
            }
            .transactional(self.transactional_id.is_some())
            .values(values.iter())
            .build();
            *sequence += records as i32;
            for value in &values {
                self.checker.send(&self.name, value.as_bytes());
            }
            partitions.push(
                PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch)),
            );
            sent.push((partition, values));
        }
        let request = ProduceRequest::default()
            .with_acks(self.acks)
            .with_timeout_ms(30_000)
            .with_transactional_id(
                self.transactional_id
                    .as_ref()
                    .map(|id| TransactionalId(StrBytes::from_string(id.clone()))),
            )
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(partitions)]);
        (request, sent)
    }

    /// Sends every request of `plans` on `client` before reading any answer,
    /// then requires every batch to be accepted and records its offsets.
    fn pipeline(
        &mut self,
        client: &mut KafkaClient,
        topic: &str,
        tag: &str,
        plans: &[RequestPlan],
    ) {
        let version = self.kind.produce_version();
        let mut in_flight = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let (request, sent) = self.request(topic, &format!("{tag}-r{i}"), plan);
            let correlation_id = client
                .send_only(&request, version)
                .expect("send a pipelined Produce");
            in_flight.push((correlation_id, sent));
        }
        if self.acks == 0 {
            return; // no answers by protocol
        }
        for (i, (correlation_id, sent)) in in_flight.into_iter().enumerate() {
            let response = client
                .recv::<ProduceRequest>(correlation_id, version)
                .expect("the answer to a pipelined Produce");
            let answers: BTreeMap<i32, (i16, i64, Option<String>)> = response
                .responses
                .iter()
                .flat_map(|t| &t.partition_responses)
                .map(|p| {
                    (
                        p.index,
                        (
                            p.error_code,
                            p.base_offset,
                            p.error_message.as_ref().map(|m| m.to_string()),
                        ),
                    )
                })
                .collect();
            for (partition, values) in sent {
                let Some(&(code, base_offset, ref message)) = answers.get(&partition) else {
                    panic!(
                        "request {i} of {tag}: no answer for partition {partition}: {response:?}"
                    );
                };
                assert_eq!(
                    code, NONE,
                    "{:?} acks={} request {i} of {tag}, partition {partition}: error {code} ({message:?}); \
                     the connection's requests were {plans:?}",
                    self.kind, self.acks
                );
                for (n, value) in values.iter().enumerate() {
                    self.checker
                        .ack(value.as_bytes(), partition, base_offset + n as i64);
                }
            }
        }
    }
}

/// A random plan: `requests` requests, each over a random non-empty subset
/// of `partitions` (all of them with probability 1/2) in a random order,
/// 1–4 records per batch.
fn random_plans(rng: &mut StdRng, partitions: &[i32], requests: usize) -> Vec<RequestPlan> {
    (0..requests)
        .map(|_| {
            let mut chosen: Vec<i32> = partitions.to_vec();
            chosen.shuffle(rng);
            if rng.gen_bool(0.5) {
                chosen.truncate(rng.gen_range(1..=partitions.len()));
            }
            chosen
                .into_iter()
                .map(|p| (p, rng.gen_range(1..=4)))
                .collect()
        })
        .collect()
}

fn seeded_rng(test: &str) -> StdRng {
    let seed = std::env::var("SAMSA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: SAMSA_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Reads every partition of `topic` read_committed from its leader until
/// every record sent is visible (each batch was accepted, or sent with
/// acks=0 to a healthy broker), feeds the reads to the checker and requires
/// it to find nothing wrong.
fn read_back_and_check(
    pipeliner: &mut Pipeliner,
    topic: &str,
    leaders: &BTreeMap<i32, i32>,
    mut client_for: impl FnMut(i32) -> KafkaClient,
) {
    let sent = pipeliner.checker.sent();
    let reads = wait_until("every record sent readable", SETTLE, || {
        let mut reads = Vec::new();
        for (&partition, &leader) in leaders {
            let read = client_for(leader).read_committed(topic, partition).ok()?;
            reads.extend(
                read.values()
                    .into_iter()
                    .map(|(offset, value)| (partition, offset, value)),
            );
        }
        (reads.len() >= sent).then_some(reads)
    });
    assert_eq!(reads.len(), sent, "records read vs sent");
    for (partition, offset, value) in &reads {
        pipeliner
            .checker
            .read(*partition, *offset, value.as_bytes());
    }
    pipeliner.checker.check().assert_ok();
}

/// One case: `TRANSACTIONS` transactions of `IN_FLIGHT` pipelined requests
/// per leader connection, over a fresh topic of `PARTITIONS_PER_LEADER` ×
/// leaders partitions.
fn pipelined_case(
    kind: ProducerKind,
    acks: i16,
    rng: &mut StdRng,
    brokers: usize,
    mut client_for: impl FnMut(i32) -> KafkaClient,
    mut leader_of: impl FnMut(&str, i32) -> i32,
) {
    let topic = unique_topic("pipelined");
    let partitions = PARTITIONS_PER_LEADER * brokers as i32;
    create_topic_default_rf(&mut client_for(1), &topic, partitions).expect("create topic");
    let leaders: BTreeMap<i32, i32> = (0..partitions).map(|p| (p, leader_of(&topic, p))).collect();
    let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (&p, &leader) in &leaders {
        by_leader.entry(leader).or_default().push(p);
    }
    let name = unique_topic("pipeliner");
    let coordinator_node = coordinator_of(&mut client_for(1), &name);
    let mut coordinator = client_for(coordinator_node);
    let mut pipeliner = Pipeliner::new(kind, acks, name, &mut coordinator);
    let all: Vec<i32> = leaders.keys().copied().collect();
    // One connection per leader for the whole case, as a producer keeps:
    // order is a promise per connection.
    let mut connections: BTreeMap<i32, KafkaClient> =
        by_leader.keys().map(|&id| (id, client_for(id))).collect();
    for txn in 0..TRANSACTIONS {
        pipeliner.begin(&mut coordinator, &topic, &all);
        for (leader, partitions) in &by_leader {
            let plans = random_plans(rng, partitions, IN_FLIGHT);
            let connection = connections
                .get_mut(leader)
                .expect("a connection per leader");
            pipeliner.pipeline(connection, &topic, &format!("t{txn}-b{leader}"), &plans);
        }
        pipeliner.commit(&mut coordinator);
    }
    read_back_and_check(&mut pipeliner, &topic, &leaders, client_for);
    eprintln!(
        "{kind:?} acks={acks} on {brokers} broker(s): {} records over {partitions} partitions, all accepted and read once in order",
        pipeliner.checker.acked()
    );
}

/// The broker's pipelining counters: (batches that arrived behind an
/// unanswered request of their connection for the same partition, the most
/// requests of one connection in flight for one partition).
fn pipelining_seen(http: std::net::SocketAddr) -> (i64, i64) {
    let (status, body) = http_get(http, "/metrics").expect("scrape /metrics");
    assert_eq!(status, 200, "/metrics: {body}");
    (
        metric(&body, "samsa_produce_pipelined_batches_total").unwrap_or(0),
        metric(&body, "samsa_produce_partition_in_flight_max").unwrap_or(0),
    )
}

/// Every producer with acks=1 and all; plain and idempotent ones with
/// acks=0 too (transactional clients never use it).
fn matrix() -> Vec<(ProducerKind, i16)> {
    ProducerKind::ALL
        .into_iter()
        .flat_map(|kind| {
            let acks: &[i16] = match kind {
                ProducerKind::Plain | ProducerKind::Idempotent => &[0, 1, -1],
                _ => &[1, -1],
            };
            acks.iter().map(move |&acks| (kind, acks))
        })
        .collect()
}

/// Requires the broker's pipelining counters to show that requests
/// overlapped per partition.
fn assert_pipelining_seen(http: std::net::SocketAddr) {
    let (pipelined, in_flight_max) = pipelining_seen(http);
    assert!(
        pipelined > 0 && in_flight_max >= 2,
        "the broker saw no pipelined produce batches (pipelined {pipelined}, max in flight per partition {in_flight_max})"
    );
    eprintln!("broker: {pipelined} pipelined batches, up to {in_flight_max} requests in flight per partition");
}

#[test]
fn pipelined_produce_keeps_arrival_order_on_one_node() {
    let node = SamsaNode::start();
    let mut rng = seeded_rng("one node");
    for (kind, acks) in matrix() {
        {
            pipelined_case(kind, acks, &mut rng, 1, |_| node.client(), |_, _| 1);
        }
    }
    assert_pipelining_seen(node.http_addr());
}

#[test]
fn pipelined_produce_keeps_arrival_order_on_three_nodes() {
    let cluster = SamsaCluster::start(3, &[]);
    let mut rng = seeded_rng("three nodes");
    for (kind, acks) in matrix() {
        {
            pipelined_case(
                kind,
                acks,
                &mut rng,
                3,
                |id| cluster.client(id),
                |topic, partition| serving_leader(&cluster, 1, topic, partition, SETTLE),
            );
        }
    }
    // Every broker leads some of each topic's partitions and got pipelined
    // requests for them.
    for id in cluster.ids() {
        assert_pipelining_seen(cluster.node(id).http_addr());
    }
}

/// The property: whatever the number of pipelined requests and the order of
/// partitions inside each, every batch is accepted and lands in sequence
/// order. proptest picks the cases (one node, each case on a fresh topic).
#[test]
fn pipelined_produce_order_property() {
    let node = SamsaNode::start();
    let plan = (
        0usize..ProducerKind::ALL.len(),
        any::<bool>(),
        1usize..=8,
        any::<u64>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&plan, |(kind, acks_all, requests, seed)| {
            let kind = ProducerKind::ALL[kind];
            let acks = if acks_all { -1 } else { 1 };
            let mut rng = StdRng::seed_from_u64(seed);
            let topic = unique_topic("pipelined-prop");
            let mut client = node.client();
            create_topic_default_rf(&mut client, &topic, PARTITIONS_PER_LEADER)
                .expect("create topic");
            let partitions: Vec<i32> = (0..PARTITIONS_PER_LEADER).collect();
            let mut pipeliner = Pipeliner::new(kind, acks, unique_topic("pipeliner"), &mut client);
            pipeliner.begin(&mut client, &topic, &partitions);
            let plans = random_plans(&mut rng, &partitions, requests);
            pipeliner.pipeline(&mut node.client(), &topic, "prop", &plans);
            pipeliner.commit(&mut client);
            let leaders = partitions.iter().map(|&p| (p, 1)).collect();
            read_back_and_check(&mut pipeliner, &topic, &leaders, |_| node.client());
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
