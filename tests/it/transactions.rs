//! Transactions end to end, written against Kafka's behaviour: librdkafka
//! transactional producers, read_committed and read_uncommitted readers
//! (librdkafka's and a raw one that applies the broker's aborted-transaction
//! list itself), the on-disk log through `samsa dump-log`, coordinator
//! failover on a three-node cluster, and hand-driven protocol requests for
//! the stale-request anomalies (KAFKA-17754).
//!
//! The seed experiments are those of DESIGN.md ("Seed experiments samsa must
//! reproduce"). Tests whose name starts with `cluster_` run three nodes
//! (RF 3, min.insync.replicas 2) and belong to the `heavy` nextest group.
//!
//! After `commit_transaction` returns, the markers may still be on their way
//! (the coordinator answers once PrepareCommit is durable), so visibility
//! is always awaited with a deadline, and exact contents are asserted only
//! once every partition's LSO has caught up with its log end.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::error::RDKafkaErrorCode;
use samsa_tests::client::KafkaClient;
use samsa_tests::cluster::{run_to_exit, SamsaCluster};
use samsa_tests::codes::*;
use samsa_tests::node::samsa_bin;
use samsa_tests::txn::{
    create_topic_default_rf, end_txn_v5, error_code, init_transactional_id, is_fatal,
    partition_leaders, plain_producer_config, read_topic, read_values, requires_abort,
    resolve_commit, retry_coordinator, transaction_state_leader, transaction_state_partition,
    transactional_producer_config, wait_values, ClientView, Isolation, Seen, TxnProducer,
    TRANSACTION_STATE_PARTITIONS, TRANSACTION_STATE_TOPIC,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, wait_until, BatchBuilder, SamsaNode};

const ACKS_ALL: i16 = -1;
/// How long markers may take to become visible after an EndTxn.
const VISIBLE: Duration = Duration::from_secs(30);
/// How long a coordinator failover may take (session timeout 3 s, election,
/// replay of the state partition, marker retries; debug build on 2 cores).
const FAILOVER: Duration = Duration::from_secs(60);

use Isolation::{ReadCommitted, ReadUncommitted};

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Waits until partition `p` of `topic` on `client`'s broker has no open
/// transaction (LSO == log end offset); returns that offset.
fn wait_settled(client: &mut KafkaClient, topic: &str, p: i32) -> i64 {
    let mut last = None;
    try_wait_until(VISIBLE, || {
        let leo = client.log_end_offset(topic, p).ok()?;
        let lso = client.last_stable_offset(topic, p).ok()?;
        last = Some((lso, leo));
        (lso == leo).then_some(leo)
    })
    .unwrap_or_else(|| {
        panic!("{topic}/{p}: LSO never reached the log end; last (lso, leo) = {last:?}")
    })
}

/// A client to `addr` that gives up quickly (a node may be dead).
fn quick_client(addr: std::net::SocketAddr) -> Option<KafkaClient> {
    let mut c = KafkaClient::connect_with_timeout(addr, Duration::from_secs(1)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.api_versions().ok()?;
    Some(c)
}

/// A client to the first running node that answers.
fn any_client(cluster: &mut SamsaCluster) -> Option<KafkaClient> {
    cluster
        .running()
        .into_iter()
        .find_map(|id| quick_client(cluster.node(id).addr()))
}

/// Waits until every partition of `topic` has a live leader whose LSO
/// equals its log end offset (no transaction open anywhere); returns the
/// log end offsets.
fn wait_cluster_settled(
    cluster: &mut SamsaCluster,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> BTreeMap<i32, i64> {
    let mut last = String::new();
    let r = try_wait_until(timeout, || {
        let running = cluster.running();
        let leaders = partition_leaders(&mut any_client(cluster)?, topic)?;
        let mut ends = BTreeMap::new();
        for p in 0..partitions {
            let leader = *leaders.get(&p)?;
            if !running.contains(&leader) {
                last = format!("partition {p}: leader {leader} is not running");
                return None;
            }
            let mut c = quick_client(cluster.node(leader).addr())?;
            let leo = c.log_end_offset(topic, p).ok()?;
            let lso = c.last_stable_offset(topic, p).ok()?;
            if lso != leo {
                last = format!("partition {p} on node {leader}: lso {lso} < leo {leo}");
                return None;
            }
            ends.insert(p, leo);
        }
        Some(ends)
    });
    r.unwrap_or_else(|| {
        panic!(
            "{topic}: not every partition settled within {timeout:?}: {last}\n{}",
            cluster.all_logs(40)
        )
    })
}

/// Produces a hand-built transactional batch with Produce v12 (transaction
/// version 2: the partition joins the transaction implicitly, after the
/// leader checked with the coordinator), retrying while the answer is
/// retriable (the previous transaction still completing, the coordinator
/// loading). Returns the final error code and base offset.
fn produce_txn(c: &mut KafkaClient, id: &str, topic: &str, batch: &Bytes) -> (i16, i64) {
    let (code, base) = retry_coordinator("Produce", VISIBLE, || {
        let r = c.produce_txn_at(id, topic, 0, batch.clone(), ACKS_ALL, 12)?;
        // Kafka answers old clients NOT_ENOUGH_REPLICAS for a transient
        // verification failure; treat it like CONCURRENT_TRANSACTIONS.
        let code = if r.error_code == NOT_ENOUGH_REPLICAS {
            CONCURRENT_TRANSACTIONS
        } else {
            r.error_code
        };
        Ok((code, r.base_offset))
    })
    .unwrap();
    (code, base)
}

fn txn_batch(pid: i64, epoch: i16, seq: i32, value: &str) -> Bytes {
    BatchBuilder::idempotent(pid, epoch, seq)
        .transactional(true)
        .record(value)
        .build()
}

/// Requires the broker to speak transaction version 2 (EndTxn v5, Produce v12).
fn require_tv2(c: &KafkaClient) {
    let v = c.broker_versions();
    let end = v
        .get(&(kafka_protocol::messages::ApiKey::EndTxn as i16))
        .copied();
    let produce = v
        .get(&(kafka_protocol::messages::ApiKey::Produce as i16))
        .copied();
    assert!(
        end.is_some_and(|(_, max)| max >= 5) && produce.is_some_and(|(_, max)| max >= 12),
        "transaction version 2 needs EndTxn v5 and Produce v12; the broker advertises EndTxn {end:?}, Produce {produce:?}"
    );
}

// ---------------------------------------------------------------------------
// seed experiments
// ---------------------------------------------------------------------------

/// Seed 1 (seed 000): three batches of 5 through one transactional producer
/// with synchronous sends: A commits; B fails after 3 sends and aborts; B is
/// resent and commits. The aborted records are in the log (13 physically)
/// but read_committed sees 10. Offsets are exact: each marker takes one.
#[test]
fn cluster_seed1_aborted_batch_is_in_the_log_but_not_read_committed() {
    let cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("seed1");
    create_topic_default_rf(&mut cluster.client(1), &topic, 1).unwrap();
    let bootstrap = cluster.bootstrap();
    let p = TxnProducer::transactional(&bootstrap, &unique_topic("seed1-txn"));

    let a: Vec<String> = (0..5).map(|i| format!("A-{i}")).collect();
    let b1: Vec<String> = (0..3).map(|i| format!("B-attempt1-{i}")).collect();
    let b2: Vec<String> = (0..5).map(|i| format!("B-attempt2-{i}")).collect();
    let mut offsets = Vec::new();

    p.begin().unwrap();
    for v in &a {
        offsets.push(p.send_ok(&topic, Some(0), v).1);
    }
    p.commit().unwrap();

    p.begin().unwrap();
    for v in &b1 {
        offsets.push(p.send_ok(&topic, Some(0), v).1);
    }
    // "Processing fails" on the third record: abort. The three sends were
    // acknowledged, so they are in the log and the abort cannot drop them.
    p.abort().unwrap();

    p.begin().unwrap();
    for v in &b2 {
        offsets.push(p.send_ok(&topic, Some(0), v).1);
    }
    p.commit().unwrap();

    // A at 0..=4, COMMIT at 5, B1 at 6..=8, ABORT at 9, B2 at 10..=14,
    // COMMIT at 15: a transaction's first record cannot be appended before
    // the previous transaction's marker (CONCURRENT_TRANSACTIONS until it
    // completes).
    let expected_offsets: Vec<i64> = (0..5).chain(6..9).chain(10..15).collect();
    assert_eq!(offsets, expected_offsets, "acknowledged offsets");

    let committed: Vec<String> = a.iter().chain(&b2).cloned().collect();
    let all: Vec<String> = a.iter().chain(&b1).chain(&b2).cloned().collect();
    wait_values(&bootstrap, &topic, 1, ReadCommitted, &committed);
    let uncommitted = read_values(&bootstrap, &topic, 1, ReadUncommitted).unwrap();
    assert_eq!(uncommitted, all);
    eprintln!(
        "read_committed={} read_uncommitted={}",
        committed.len(),
        uncommitted.len()
    );
    assert_eq!((committed.len(), uncommitted.len()), (10, 13));

    // The same through raw read_committed fetches from the leader.
    let leader = partition_leaders(&mut cluster.client(1), &topic).unwrap()[&0];
    let mut c = cluster.client(leader);
    assert_eq!(
        wait_settled(&mut c, &topic, 0),
        16,
        "13 records + 3 markers"
    );
    let read = c.read_committed(&topic, 0).unwrap();
    assert_eq!(read.last_stable_offset, 16);
    let got: Vec<(i64, String)> = read.values();
    let want: Vec<(i64, String)> = (0..5)
        .chain(10..15)
        .zip(committed.iter().cloned())
        .collect();
    assert_eq!(got, want);
    assert_eq!(
        read.aborted.len(),
        1,
        "one aborted transaction: {:?}",
        read.aborted
    );
    assert_eq!(
        read.aborted[0].1, 6,
        "the aborted transaction starts at B1's first record"
    );
    let raw = c.read_uncommitted_with_control(&topic, 0).unwrap();
    let markers: Vec<(i64, Option<i16>)> = raw
        .iter()
        .filter(|r| r.control)
        .map(|r| (r.offset, r.control_type()))
        .collect();
    assert_eq!(
        markers,
        vec![(5, Some(1)), (9, Some(0)), (15, Some(1))],
        "COMMIT, ABORT, COMMIT markers"
    );
}

/// Seed 3 (seed 002): one transaction writes to two topics. Before the
/// commit neither record is visible to read_committed; after it both are.
/// An aborted transaction over both topics is never visible, although its
/// records are in both logs; a later committed one is.
#[test]
fn seed3_two_topics_commit_together_and_abort_together() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let ta = unique_topic("seed3-a");
    let tb = unique_topic("seed3-b");
    c.create_topic(&ta, 1).unwrap();
    c.create_topic(&tb, 1).unwrap();

    let committer = TxnProducer::transactional(&bootstrap, &unique_topic("seed3-committer"));
    committer.begin().unwrap();
    assert_eq!(
        committer.send_ok(&ta, Some(0), "committed-msg-in-A"),
        (0, 0)
    );
    assert_eq!(
        committer.send_ok(&tb, Some(0), "committed-msg-in-B"),
        (0, 0)
    );
    // Open: both records are in the logs, neither is stable.
    for t in [&ta, &tb] {
        assert_eq!(c.log_end_offset(t, 0).unwrap(), 1, "{t}");
        assert_eq!(
            c.last_stable_offset(t, 0).unwrap(),
            0,
            "{t}: LSO while open"
        );
        assert_eq!(
            read_values(&bootstrap, t, 1, ReadCommitted).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(c.read_committed(t, 0).unwrap().records, vec![]);
    }
    committer.commit().unwrap();
    wait_values(
        &bootstrap,
        &ta,
        1,
        ReadCommitted,
        &strs(&["committed-msg-in-A"]),
    );
    wait_values(
        &bootstrap,
        &tb,
        1,
        ReadCommitted,
        &strs(&["committed-msg-in-B"]),
    );

    let aborter = TxnProducer::transactional(&bootstrap, &unique_topic("seed3-aborter"));
    aborter.begin().unwrap();
    // Synchronous sends: flushed to the broker before the abort (seed 002's
    // second run), so the records and the ABORT markers are in the logs.
    assert_eq!(aborter.send_ok(&ta, Some(0), "ABORTED-msg-in-A"), (0, 2));
    assert_eq!(aborter.send_ok(&tb, Some(0), "ABORTED-msg-in-B"), (0, 2));
    aborter.abort().unwrap();
    for t in [&ta, &tb] {
        assert_eq!(
            wait_settled(&mut c, t, 0),
            4,
            "{t}: data, COMMIT, data, ABORT"
        );
    }
    for (t, v) in [(&ta, "A"), (&tb, "B")] {
        let committed = format!("committed-msg-in-{v}");
        let aborted = format!("ABORTED-msg-in-{v}");
        assert_eq!(
            read_values(&bootstrap, t, 1, ReadCommitted).unwrap(),
            vec![committed.clone()],
            "{t}: read_committed after the abort"
        );
        assert_eq!(
            read_values(&bootstrap, t, 1, ReadUncommitted).unwrap(),
            vec![committed.clone(), aborted],
            "{t}: read_uncommitted shows the aborted record in log order"
        );
        let raw = c.read_committed(t, 0).unwrap();
        assert_eq!(
            raw.values(),
            vec![(0, committed)],
            "{t}: raw read_committed"
        );
        assert_eq!(raw.aborted.len(), 1, "{t}: {:?}", raw.aborted);
        assert_eq!(
            raw.aborted[0].1, 2,
            "{t}: aborted transaction's first offset"
        );
    }

    // A later committed transaction over both topics is read past the abort.
    committer.begin().unwrap();
    committer.send_ok(&ta, Some(0), "committed-msg-2-in-A");
    committer.send_ok(&tb, Some(0), "committed-msg-2-in-B");
    committer.commit().unwrap();
    wait_values(
        &bootstrap,
        &ta,
        1,
        ReadCommitted,
        &strs(&["committed-msg-in-A", "committed-msg-2-in-A"]),
    );
    wait_values(
        &bootstrap,
        &tb,
        1,
        ReadCommitted,
        &strs(&["committed-msg-in-B", "committed-msg-2-in-B"]),
    );
}

/// Seed 4 (seed 002): an open transaction pins the LSO at its first record,
/// so a read_committed reader does not get even a plain record another
/// producer wrote after it. ListOffsets read_committed answers the LSO. On
/// commit both records are released, in log order.
#[test]
fn seed4_open_transaction_holds_back_a_later_plain_record() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let t = unique_topic("seed4");
    c.create_topic(&t, 1).unwrap();

    let plain = TxnProducer::new(&plain_producer_config(&bootstrap));
    assert_eq!(plain.send_ok(&t, Some(0), "before"), (0, 0));

    let a = TxnProducer::transactional(&bootstrap, &unique_topic("seed4-a"));
    a.begin().unwrap();
    assert_eq!(a.send_ok(&t, Some(0), "from-A-still-open"), (0, 1));
    assert_eq!(plain.send_ok(&t, Some(0), "from-B-plain-after"), (0, 2));

    // The LSO is A's first offset; the high watermark is past B's record.
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 3);
    assert_eq!(
        c.last_stable_offset(&t, 0).unwrap(),
        1,
        "ListOffsets read_committed"
    );
    let f = c.fetch_isolated(&t, 0, 0, 1).unwrap();
    assert_eq!(f.error_code, NONE);
    assert_eq!((f.last_stable_offset, f.high_watermark), (1, 3));
    let raw = c.read_committed(&t, 0).unwrap();
    assert_eq!(raw.values(), vec![(0, "before".to_string())]);
    // librdkafka's read_committed consumer reaches its end at the LSO:
    // B's plain record is held back behind A's open transaction.
    assert_eq!(
        read_topic(&bootstrap, &t, 1, ReadCommitted).unwrap(),
        vec![(0, 0, "before".to_string())]
    );
    assert_eq!(
        read_topic(&bootstrap, &t, 1, ReadUncommitted).unwrap(),
        vec![
            (0, 0, "before".to_string()),
            (0, 1, "from-A-still-open".to_string()),
            (0, 2, "from-B-plain-after".to_string()),
        ]
    );
    // Still held back a moment later (nothing but the commit releases it).
    assert_eq!(c.last_stable_offset(&t, 0).unwrap(), 1);

    a.commit().unwrap();
    assert_eq!(
        wait_settled(&mut c, &t, 0),
        4,
        "the COMMIT marker at offset 3"
    );
    let expected: Vec<Seen> = vec![
        (0, 0, "before".to_string()),
        (0, 1, "from-A-still-open".to_string()),
        (0, 2, "from-B-plain-after".to_string()),
    ];
    assert_eq!(
        read_topic(&bootstrap, &t, 1, ReadCommitted).unwrap(),
        expected
    );
    assert_eq!(
        c.read_committed(&t, 0).unwrap().values(),
        vec![
            (0, "before".to_string()),
            (1, "from-A-still-open".to_string()),
            (2, "from-B-plain-after".to_string()),
        ]
    );
}

/// One entry of `samsa dump-log --print-data-log`: a record line with the
/// fields of its batch line.
#[derive(Debug, Clone)]
struct Dumped {
    batch: BTreeMap<String, String>,
    record: BTreeMap<String, String>,
}

impl Dumped {
    fn b(&self, k: &str) -> &str {
        self.batch.get(k).map_or("<missing>", String::as_str)
    }
    fn r(&self, k: &str) -> &str {
        self.record.get(k).map_or("<missing>", String::as_str)
    }
    fn offset(&self) -> i64 {
        self.r("offset").parse().expect("record offset")
    }
}

/// `key: value key: value …` → map (values are single tokens; payloads in
/// these tests have no spaces).
fn fields(line: &str) -> BTreeMap<String, String> {
    let toks: Vec<&str> = line.trim_start_matches('|').split_whitespace().collect();
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i + 1 < toks.len() {
        if let Some(k) = toks[i].strip_suffix(':') {
            out.insert(k.to_string(), toks[i + 1].to_string());
            i += 2;
        } else {
            i += 1;
        }
    }
    out
}

fn parse_dump(text: &str) -> Vec<Dumped> {
    let mut out = Vec::new();
    let mut batch = None;
    for line in text.lines() {
        if line.starts_with("baseOffset:") {
            batch = Some(fields(line));
        } else if line.starts_with("| offset:") {
            let batch = batch.clone().expect("record line before any batch line");
            out.push(Dumped {
                batch,
                record: fields(line),
            });
        }
    }
    out
}

/// Seed 5 (seed 002): the log dump shows data batches and the COMMIT and
/// ABORT control records at their offsets, with the producer id and epoch
/// of the transaction and the coordinator epoch; the transaction index
/// dump lists the aborted transaction.
#[test]
fn seed5_dump_log_shows_batches_and_markers() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let t = unique_topic("seed5");
    c.create_topic(&t, 1).unwrap();

    let plain = TxnProducer::new(&plain_producer_config(&bootstrap));
    assert_eq!(plain.send_ok(&t, Some(0), "plain-0"), (0, 0));
    let p = TxnProducer::transactional(&bootstrap, &unique_topic("seed5-txn"));
    p.begin().unwrap();
    assert_eq!(p.send_ok(&t, Some(0), "committed-0"), (0, 1));
    assert_eq!(p.send_ok(&t, Some(0), "committed-1"), (0, 2));
    p.commit().unwrap();
    p.begin().unwrap();
    assert_eq!(p.send_ok(&t, Some(0), "aborted-0"), (0, 4));
    p.abort().unwrap();
    assert_eq!(wait_settled(&mut c, &t, 0), 6);

    let dir = node.data_dir().join(format!("{t}-0"));
    let segment = dir.join(format!("{:020}.log", 0));
    let txnindex = dir.join(format!("{:020}.txnindex", 0));
    let args = vec![
        "dump-log".to_string(),
        "--print-data-log".to_string(),
        segment.display().to_string(),
    ];
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(status.success(), "dump-log failed: {status}\n{text}");
    eprintln!("{text}");
    let recs = parse_dump(&text);
    let offsets: Vec<i64> = recs.iter().map(Dumped::offset).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3, 4, 5], "{text}");

    // 0: the plain record.
    assert_eq!(recs[0].b("isTransactional"), "false");
    assert_eq!(recs[0].b("isControl"), "false");
    assert_eq!(recs[0].b("producerId"), "-1");
    assert_eq!(recs[0].r("payload"), "plain-0");
    // 1, 2, 4: transactional data of one producer id.
    let pid = recs[1].b("producerId").to_string();
    assert!(pid.parse::<i64>().unwrap() >= 0, "{pid}");
    let data_epoch: i16 = recs[1].b("producerEpoch").parse().unwrap();
    for (i, payload) in [(1, "committed-0"), (2, "committed-1"), (4, "aborted-0")] {
        let r = &recs[i];
        assert_eq!(r.b("isTransactional"), "true", "offset {i}");
        assert_eq!(r.b("isControl"), "false", "offset {i}");
        assert_eq!(r.b("producerId"), pid, "offset {i}");
        assert_eq!(r.r("payload"), payload, "offset {i}");
        assert!(!r.record.contains_key("endTxnMarker"), "offset {i}");
    }
    // 3: COMMIT, 5: ABORT — control batches of the same producer id, at
    // an epoch no lower than its data's (transaction version 2 bumps it at
    // every end), carrying the coordinator epoch.
    let mut coordinator_epochs = BTreeSet::new();
    for (i, marker) in [(3, "COMMIT"), (5, "ABORT")] {
        let r = &recs[i];
        assert_eq!(r.b("isTransactional"), "true", "offset {i}");
        assert_eq!(r.b("isControl"), "true", "offset {i}");
        assert_eq!(
            r.b("count"),
            "1",
            "offset {i}: a marker batch holds one record"
        );
        assert_eq!(r.b("producerId"), pid, "offset {i}");
        let epoch: i16 = r.b("producerEpoch").parse().unwrap();
        assert!(
            epoch >= data_epoch,
            "offset {i}: marker epoch {epoch} < data epoch {data_epoch}"
        );
        assert_eq!(r.r("endTxnMarker"), marker, "offset {i}");
        let ce: i32 = r.r("coordinatorEpoch").parse().unwrap();
        assert!(ce >= 0, "offset {i}: coordinator epoch {ce}");
        coordinator_epochs.insert(ce);
    }
    assert_eq!(
        coordinator_epochs.len(),
        1,
        "one coordinator wrote both markers"
    );

    // The transaction index of the segment: the aborted transaction, from
    // its first record (4) to its ABORT marker (5); nothing was open after
    // it, so its last stable offset is 6.
    let args = vec!["dump-log".to_string(), txnindex.display().to_string()];
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(
        status.success(),
        "dump-log of the txnindex failed: {status}\n{text}"
    );
    let entries: Vec<&str> = text.lines().filter(|l| l.starts_with("version:")).collect();
    assert_eq!(
        entries,
        vec![format!(
            "version: 0 producerId: {pid} firstOffset: 4 lastOffset: 5 lastStableOffset: 6"
        )
        .as_str()],
        "{text}"
    );
}

/// Seed 6 (seeds 001, 004): a second producer with the same
/// transactional.id fences the first. The first's later send fails, its
/// commit fails with a fatal fencing error, and nothing of its transaction
/// becomes visible — what it wrote before the fence is aborted by the
/// second's InitProducerId, what it tried after is not in the log at all.
#[test]
fn seed6_second_producer_fences_the_first() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let t = unique_topic("seed6");
    c.create_topic(&t, 1).unwrap();
    let id = unique_topic("seed6-txn");

    let p1 = TxnProducer::transactional(&bootstrap, &id);
    p1.begin().unwrap();
    assert_eq!(p1.send_ok(&t, Some(0), "p1-before-fence"), (0, 0));

    let p2 = TxnProducer::transactional(&bootstrap, &id);
    // p2's InitProducerId aborted p1's open transaction.
    assert_eq!(
        wait_settled(&mut c, &t, 0),
        2,
        "p1's record and the ABORT marker"
    );

    let late = p1.send_sync(&t, Some(0), "p1-after-fence");
    // The produce carries the fenced epoch: INVALID_PRODUCER_EPOCH, as
    // Kafka answers a produce (KIP-588), not PRODUCER_FENCED.
    assert_eq!(
        late.as_ref().err().and_then(error_code),
        Some(RDKafkaErrorCode::InvalidProducerEpoch),
        "a send of the fenced producer: {late:?}"
    );
    let err = p1
        .commit()
        .expect_err("the fenced producer's commit succeeded");
    assert!(is_fatal(&err), "commit error is not fatal: {err}");
    assert!(
        !requires_abort(&err),
        "commit error asks for an abort: {err}"
    );
    assert_eq!(error_code(&err), Some(RDKafkaErrorCode::Fenced), "{err}");
    assert!(p1.fatal_error().is_some(), "no fatal error raised on p1");

    p2.begin().unwrap();
    p2.send_ok(&t, Some(0), "p2-0");
    p2.commit().unwrap();
    wait_values(&bootstrap, &t, 1, ReadCommitted, &strs(&["p2-0"]));
    assert_eq!(
        read_values(&bootstrap, &t, 1, ReadUncommitted).unwrap(),
        strs(&["p1-before-fence", "p2-0"]),
        "the send after the fence must not be in the log"
    );

    // Same producer id, higher epoch; the ABORT marker of p1's transaction
    // carries an epoch above p1's.
    let raw = c.read_uncommitted_with_control(&t, 0).unwrap();
    let find = |v: &str| {
        raw.iter()
            .find(|r| r.value.as_deref() == Some(v.as_bytes()))
            .unwrap_or_else(|| panic!("{v} not in {raw:?}"))
            .clone()
    };
    let r1 = find("p1-before-fence");
    let r2 = find("p2-0");
    assert_eq!(
        r1.producer_id, r2.producer_id,
        "the id keeps its producer id"
    );
    assert!(r2.producer_epoch > r1.producer_epoch, "{r1:?} {r2:?}");
    let abort = raw.iter().find(|r| r.offset == 1).unwrap();
    assert_eq!(
        abort.control_type(),
        Some(samsa_tests::batch::CONTROL_ABORT)
    );
    assert_eq!(abort.producer_id, r1.producer_id);
    assert!(abort.producer_epoch > r1.producer_epoch, "{abort:?}");
    let committed = c.read_committed(&t, 0).unwrap();
    assert_eq!(committed.values(), vec![(2, "p2-0".to_string())]);
}

// ---------------------------------------------------------------------------
// timeout
// ---------------------------------------------------------------------------

/// A producer that begins a transaction and stalls is aborted by the
/// coordinator after its `transaction.timeout.ms`: until then the open
/// transaction pins the LSO, then the LSO moves on and a read_committed
/// reader gets the records written after the stalled one. The stalled
/// producer cannot commit afterwards; a new producer with the same id works.
#[test]
fn stalled_transaction_is_aborted_after_its_timeout() {
    let node =
        SamsaNode::start_with(&["transaction_abort_timed_out_transaction_cleanup_interval_ms=500"]);
    let bootstrap = node.bootstrap();
    let mut c = node.client();

    // The pinned LSO is checked while the transaction is provably open: the
    // abort writes its marker at offset 2, so a log still ending at 2 after
    // the LSO was read means no abort had happened when it was read. A
    // machine so slow that the abort came first gets a fresh topic and id
    // with a longer timeout, so the check always runs.
    let mut timeout_ms = 2_000u64;
    let (t, id, stalled, began) = loop {
        let t = unique_topic("timeout");
        c.create_topic(&t, 1).unwrap();
        let id = unique_topic("timeout-txn");
        let mut config = transactional_producer_config(&bootstrap, &id);
        config.set("transaction.timeout.ms", timeout_ms.to_string());
        let stalled = TxnProducer::new(&config);
        stalled.init().unwrap();
        stalled.begin().unwrap();
        let began = Instant::now();
        assert_eq!(stalled.send_ok(&t, Some(0), "stalled"), (0, 0));
        let plain = TxnProducer::new(&plain_producer_config(&bootstrap));
        assert_eq!(plain.send_ok(&t, Some(0), "later"), (0, 1));
        let lso = c.last_stable_offset(&t, 0).unwrap();
        if c.log_end_offset(&t, 0).unwrap() == 2 {
            assert_eq!(lso, 0, "the open transaction pins the LSO");
            break (t, id, stalled, began);
        }
        assert!(
            timeout_ms < 20_000,
            "the coordinator aborted every stalled transaction (timeouts up to {timeout_ms} ms) \
             before its LSO could be read"
        );
        eprintln!("aborted before the LSO was read with a {timeout_ms} ms timeout; again, longer");
        timeout_ms *= 4;
    };

    // The producer does nothing more. The coordinator aborts it.
    let settled = wait_settled(&mut c, &t, 0);
    let aborted_after = began.elapsed();
    assert_eq!(settled, 3, "stalled, later, ABORT marker");
    assert!(
        aborted_after >= Duration::from_millis(timeout_ms),
        "aborted after {aborted_after:?}, before the {timeout_ms} ms timeout"
    );
    assert_eq!(
        read_values(&bootstrap, &t, 1, ReadCommitted).unwrap(),
        strs(&["later"])
    );
    assert_eq!(
        read_values(&bootstrap, &t, 1, ReadUncommitted).unwrap(),
        strs(&["stalled", "later"])
    );
    let raw = c.read_uncommitted_with_control(&t, 0).unwrap();
    assert_eq!(
        raw[2].control_type(),
        Some(samsa_tests::batch::CONTROL_ABORT)
    );

    let late = stalled.commit();
    // The timeout abort bumped the producer's epoch: its EndTxn is
    // PRODUCER_FENCED, which librdkafka raises as a fatal _FENCED.
    let err = late.expect_err("commit of a timed-out transaction succeeded");
    assert_eq!(error_code(&err), Some(RDKafkaErrorCode::Fenced), "{err}");
    assert!(
        is_fatal(&err),
        "the late commit's error is not fatal: {err}"
    );
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        3,
        "the late commit wrote something"
    );

    let next = TxnProducer::transactional(&bootstrap, &id);
    next.begin().unwrap();
    assert_eq!(next.send_ok(&t, Some(0), "next"), (0, 3));
    next.commit().unwrap();
    wait_values(&bootstrap, &t, 1, ReadCommitted, &strs(&["later", "next"]));
}

// ---------------------------------------------------------------------------
// coordinator placement and failover
// ---------------------------------------------------------------------------

/// The coordinator of a transactional id is the leader of
/// `__transaction_state` partition `Utils.abs(hashCode(id)) % 50` — Kafka's
/// `Utils.abs` is `Math.abs` (with MIN_VALUE → 0), so for an id with a
/// negative hash the state is written to that partition, not to the one
/// sign-bit clearing would give.
/// On a fresh node, where FindCoordinator creates `__transaction_state`:
/// once it names this broker, InitProducerId is answered or told
/// COORDINATOR_LOAD_IN_PROGRESS (retry here), never NOT_COORDINATOR (look
/// the coordinator up again), while the state partition's load has not
/// begun.
#[test]
fn the_broker_find_coordinator_names_serves_the_transactional_id_at_once() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let id = unique_topic("coordinator-ready-txn");
    let (code, coordinator) = retry_coordinator("FindCoordinator(transaction)", VISIBLE, || {
        c.find_coordinator(1, &id)
    })
    .unwrap();
    assert_eq!((code, coordinator), (NONE, node.node_id()));
    let mut answers = Vec::new();
    let done = try_wait_until(VISIBLE, || {
        let code = c
            .init_producer_id_txn(&id, 60_000, (-1, -1))
            .unwrap()
            .error_code;
        answers.push(code);
        (code != COORDINATOR_LOAD_IN_PROGRESS).then_some(code)
    });
    assert_eq!(
        done,
        Some(NONE),
        "InitProducerId answers, in order, after FindCoordinator named this broker: {answers:?}"
    );
}

#[test]
fn transaction_state_placement_matches_kafka() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let id = "my-txn"; // hashCode -1061187895: Math.abs → 45, & 0x7fffffff → 3
    assert_eq!(
        transaction_state_partition(id, TRANSACTION_STATE_PARTITIONS),
        45
    );
    init_transactional_id(&mut c, id, 60_000);
    let (code, coordinator) = c.find_coordinator(1, id).unwrap();
    assert_eq!((code, coordinator), (NONE, node.node_id()));
    let leaders = wait_until("__transaction_state in Metadata", VISIBLE, || {
        partition_leaders(&mut c, TRANSACTION_STATE_TOPIC)
    });
    assert_eq!(leaders.len(), TRANSACTION_STATE_PARTITIONS as usize);
    let written: Vec<i32> = (0..TRANSACTION_STATE_PARTITIONS)
        .filter(|p| c.log_end_offset(TRANSACTION_STATE_TOPIC, *p).unwrap() > 0)
        .collect();
    assert_eq!(
        written,
        vec![45],
        "partitions of __transaction_state with records"
    );
}

/// Checks the end state of a transaction whose records are `values`: every
/// one of them is in the log (they were acknowledged with acks=all), and
/// read_committed sees all of them or none, as `view` allows. Returns
/// whether it committed.
fn check_all_or_nothing(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    values: &BTreeSet<String>,
    view: &ClientView,
) -> bool {
    let uncommitted: BTreeSet<String> = read_values(bootstrap, topic, partitions, ReadUncommitted)
        .unwrap()
        .into_iter()
        .collect();
    assert!(
        values.is_subset(&uncommitted),
        "acknowledged records missing from the log: {:?}",
        values.difference(&uncommitted).collect::<Vec<_>>()
    );
    let committed: BTreeSet<String> = read_values(bootstrap, topic, partitions, ReadCommitted)
        .unwrap()
        .into_iter()
        .filter(|v| values.contains(v))
        .collect();
    let outcome = if committed == *values {
        true
    } else if committed.is_empty() {
        false
    } else {
        panic!(
            "half-visible transaction: read_committed sees {} of {} records: {committed:?}",
            committed.len(),
            values.len()
        );
    };
    match view {
        ClientView::Committed => assert!(outcome, "commit returned Ok but nothing is visible"),
        ClientView::Aborted => assert!(!outcome, "abort returned Ok but the records are visible"),
        ClientView::Unknown => {}
    }
    outcome
}

/// Starts a cluster, a 3-partition RF 3 topic and an initialized producer;
/// returns them with the id of the node leading the transaction's state
/// partition (checked against FindCoordinator).
fn failover_setup(name: &str, partitions: i32) -> (SamsaCluster, String, String, TxnProducer, i32) {
    let mut cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic(name);
    create_topic_default_rf(&mut cluster.client(1), &topic, partitions).unwrap();
    let id = unique_topic(&format!("{name}-txn"));
    let p = TxnProducer::transactional(&cluster.bootstrap(), &id);
    let coordinator = wait_until("the transaction state partition's leader", VISIBLE, || {
        transaction_state_leader(&mut any_client(&mut cluster)?, &id)
    });
    let (code, found) = retry_coordinator("FindCoordinator", VISIBLE, || {
        cluster.client(1).find_coordinator(1, &id)
    })
    .unwrap();
    assert_eq!(
        (code, found),
        (NONE, coordinator),
        "FindCoordinator disagrees with the leader of __transaction_state partition {}",
        transaction_state_partition(&id, TRANSACTION_STATE_PARTITIONS)
    );
    (cluster, topic, id, p, coordinator)
}

/// The coordinator is SIGKILLed after the transaction's records are
/// acknowledged and before the commit. The transaction ends fully
/// committed or fully aborted, never half-visible; the producer (or a new
/// one with the same id) runs the next transaction; the killed node
/// rejoins and nothing changes.
#[test]
fn cluster_coordinator_killed_between_produce_and_commit() {
    const PARTITIONS: i32 = 3;
    let (mut cluster, topic, id, p, coordinator) = failover_setup("failover1", PARTITIONS);
    let bootstrap = cluster.bootstrap();

    p.begin().unwrap();
    let mut values = BTreeSet::new();
    for part in 0..PARTITIONS {
        for i in 0..3 {
            let v = format!("f1-{part}-{i}");
            p.send_ok(&topic, Some(part), &v);
            values.insert(v);
        }
    }
    eprintln!("SIGKILL node {coordinator}, the transaction's coordinator");
    cluster.sigkill(coordinator);
    let commit = p.commit();
    eprintln!("commit after the kill: {commit:?}");
    let (p, view) = resolve_commit(p, commit, &bootstrap, &id);

    wait_cluster_settled(&mut cluster, &topic, PARTITIONS, FAILOVER);
    let committed = check_all_or_nothing(&bootstrap, &topic, PARTITIONS, &values, &view);
    eprintln!(
        "client view {view:?}; the transaction {}",
        if committed { "committed" } else { "aborted" }
    );

    // The next transaction works.
    p.begin().unwrap();
    let mut next = BTreeSet::new();
    for part in 0..PARTITIONS {
        let v = format!("f1-next-{part}");
        p.send_ok(&topic, Some(part), &v);
        next.insert(v);
    }
    p.commit().unwrap();
    wait_cluster_settled(&mut cluster, &topic, PARTITIONS, FAILOVER);
    assert!(check_all_or_nothing(
        &bootstrap,
        &topic,
        PARTITIONS,
        &next,
        &ClientView::Committed
    ));

    cluster.restart(coordinator);
    wait_cluster_settled(&mut cluster, &topic, PARTITIONS, FAILOVER);
    assert_eq!(
        check_all_or_nothing(&bootstrap, &topic, PARTITIONS, &values, &view),
        committed,
        "the outcome changed when the old coordinator came back"
    );
    assert!(check_all_or_nothing(
        &bootstrap,
        &topic,
        PARTITIONS,
        &next,
        &ClientView::Committed
    ));
}

/// The coordinator is SIGKILLed while it writes the COMMIT markers: as
/// soon as the first marker is seen on any partition. A visible COMMIT
/// marker means PrepareCommit was durable, so the only correct end is
/// fully committed — the new coordinator finishes the markers.
#[test]
fn cluster_coordinator_killed_while_writing_markers() {
    const PARTITIONS: i32 = 6;
    let (mut cluster, topic, id, p, coordinator) = failover_setup("failover2", PARTITIONS);
    let bootstrap = cluster.bootstrap();
    let leaders = partition_leaders(&mut cluster.client(1), &topic).unwrap();

    p.begin().unwrap();
    let mut values = BTreeSet::new();
    let mut data_end: BTreeMap<i32, i64> = BTreeMap::new();
    for part in 0..PARTITIONS {
        for i in 0..2 {
            let v = format!("f2-{part}-{i}");
            let (_, off) = p.send_ok(&topic, Some(part), &v);
            data_end.insert(part, off + 1);
            values.insert(v);
        }
    }
    let mut clients: BTreeMap<i32, KafkaClient> = leaders
        .values()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|&n| (n, cluster.client(n)))
        .collect();

    let committer = std::thread::spawn(move || {
        let r = p.commit();
        (p, r)
    });
    // Poll every partition's log end until a marker shows up, then kill.
    let marked = wait_until("the first COMMIT marker", VISIBLE, || {
        let marked: Vec<i32> = (0..PARTITIONS)
            .filter(|part| {
                let c = clients.get_mut(&leaders[part]).expect("leader client");
                c.log_end_offset(&topic, *part)
                    .is_ok_and(|leo| leo > data_end[part])
            })
            .collect();
        (!marked.is_empty()).then_some(marked)
    });
    cluster.sigkill(coordinator);
    eprintln!(
        "SIGKILLed coordinator {coordinator} with markers on partitions {marked:?} of {PARTITIONS}"
    );
    drop(clients);

    let (p, commit) = committer.join().unwrap();
    eprintln!("commit: {commit:?}");
    let (p, view) = resolve_commit(p, commit, &bootstrap, &id);
    assert_ne!(
        view,
        ClientView::Aborted,
        "a transaction with a COMMIT marker was aborted"
    );

    wait_cluster_settled(&mut cluster, &topic, PARTITIONS, FAILOVER);
    assert!(
        check_all_or_nothing(&bootstrap, &topic, PARTITIONS, &values, &view),
        "a COMMIT marker was visible before the kill, yet the transaction did not commit"
    );

    p.begin().unwrap();
    let mut next = BTreeSet::new();
    for part in 0..PARTITIONS {
        let v = format!("f2-next-{part}");
        p.send_ok(&topic, Some(part), &v);
        next.insert(v);
    }
    p.commit().unwrap();

    cluster.restart(coordinator);
    let ends = wait_cluster_settled(&mut cluster, &topic, PARTITIONS, FAILOVER);
    assert!(check_all_or_nothing(
        &bootstrap, &topic, PARTITIONS, &values, &view
    ));
    assert!(check_all_or_nothing(
        &bootstrap,
        &topic,
        PARTITIONS,
        &next,
        &ClientView::Committed
    ));
    // Per partition: 2 records, a COMMIT, 1 record, a COMMIT — markers
    // rewritten by the new coordinator are idempotent, so a partition may
    // hold the first COMMIT twice but never an ABORT.
    let leaders = partition_leaders(&mut any_client(&mut cluster).unwrap(), &topic).unwrap();
    for part in 0..PARTITIONS {
        let mut c = cluster.client(leaders[&part]);
        let raw = c.read_uncommitted_with_control(&topic, part).unwrap();
        let kinds: Vec<Option<i16>> = raw
            .iter()
            .filter(|r| r.control)
            .map(|r| r.control_type())
            .collect();
        assert!(
            kinds
                .iter()
                .all(|k| *k == Some(samsa_tests::batch::CONTROL_COMMIT)),
            "partition {part}: markers {kinds:?}"
        );
        assert!(
            ends[&part] >= 5,
            "partition {part}: log end {}",
            ends[&part]
        );
    }
}

// ---------------------------------------------------------------------------
// stale requests of a previous transaction (KAFKA-17754)
// ---------------------------------------------------------------------------

/// Two transactions of one producer driven by hand with transaction
/// version 2 (Produce v12, EndTxn v5: the epoch is bumped at every end).
/// A duplicate of the first transaction's EndTxn arriving during the second
/// is PRODUCER_FENCED and ends nothing: the second transaction's outcome is
/// what its own EndTxn says (abort), although the stale request said commit.
#[test]
fn stale_end_txn_cannot_end_the_next_transaction() {
    let node = SamsaNode::start();
    let mut c = node.client();
    require_tv2(&c);
    let t = unique_topic("stale-endtxn");
    c.create_topic(&t, 1).unwrap();
    let id = unique_topic("stale-endtxn-txn");
    let (pid, e0) = init_transactional_id(&mut c, &id, 60_000);

    // Transaction 1: one record, committed.
    assert_eq!(
        produce_txn(&mut c, &id, &t, &txn_batch(pid, e0, 0, "t1-a")),
        (NONE, 0)
    );
    let (code, next) = end_txn_v5(&mut c, &id, (pid, e0), true);
    assert_eq!(code, NONE);
    assert_eq!(next, (pid, e0 + 1), "EndTxn v5 bumps the epoch");
    let e1 = e0 + 1;
    assert_eq!(wait_settled(&mut c, &t, 0), 2);

    // A retry of transaction 1's EndTxn right after it is a retry: success,
    // answering the epoch for the next transaction. The opposite outcome is
    // INVALID_TXN_STATE.
    assert_eq!(end_txn_v5(&mut c, &id, (pid, e0), true), (NONE, (pid, e1)));
    let (code, _) = end_txn_v5(&mut c, &id, (pid, e0), false);
    assert_eq!(
        code, INVALID_TXN_STATE,
        "abort-retry of a committed transaction"
    );

    // Transaction 2: one record, still open.
    assert_eq!(
        produce_txn(&mut c, &id, &t, &txn_batch(pid, e1, 0, "t2-a")),
        (NONE, 2)
    );
    assert_eq!(
        c.last_stable_offset(&t, 0).unwrap(),
        2,
        "transaction 2 is open"
    );

    // The delayed duplicate of transaction 1's EndTxn(commit) arrives now.
    let (code, _) = end_txn_v5(&mut c, &id, (pid, e0), true);
    assert_eq!(
        code, PRODUCER_FENCED,
        "stale EndTxn(commit) during the next transaction"
    );
    let (code, _) = end_txn_v5(&mut c, &id, (pid, e0), false);
    assert_eq!(
        code, PRODUCER_FENCED,
        "stale EndTxn(abort) during the next transaction"
    );
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        3,
        "a stale EndTxn wrote a marker"
    );
    assert_eq!(
        c.last_stable_offset(&t, 0).unwrap(),
        2,
        "a stale EndTxn ended transaction 2"
    );

    // Transaction 2's own EndTxn: abort.
    let (code, next) = end_txn_v5(&mut c, &id, (pid, e1), false);
    assert_eq!((code, next), (NONE, (pid, e1 + 1)));
    assert_eq!(wait_settled(&mut c, &t, 0), 4);
    let read = c.read_committed(&t, 0).unwrap();
    assert_eq!(read.values(), vec![(0, "t1-a".to_string())]);
    assert_eq!(read.aborted, vec![(pid, 2)]);
    let raw = c.read_uncommitted_with_control(&t, 0).unwrap();
    let shape: Vec<(i64, bool, Option<i16>, i16)> = raw
        .iter()
        .map(|r| (r.offset, r.control, r.control_type(), r.producer_epoch))
        .collect();
    // TV2 markers carry the bumped epoch.
    assert_eq!(
        shape,
        vec![
            (0, false, None, e0),
            (1, true, Some(1), e1),
            (2, false, None, e1),
            (3, true, Some(0), e1 + 1),
        ]
    );

    // And once transaction 2 is over, the stale request still ends nothing.
    let (code, _) = end_txn_v5(&mut c, &id, (pid, e0), true);
    assert_eq!(code, PRODUCER_FENCED);
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 4);
}

/// A delayed duplicate of a produce of a finished transaction (old epoch)
/// is refused with INVALID_PRODUCER_EPOCH, before and during the next
/// transaction: it neither lands in the log nor opens a hanging
/// transaction that would pin the LSO.
#[test]
fn stale_produce_of_a_finished_transaction_is_refused() {
    let node = SamsaNode::start();
    let mut c = node.client();
    require_tv2(&c);
    let t = unique_topic("stale-produce");
    c.create_topic(&t, 1).unwrap();
    let id = unique_topic("stale-produce-txn");
    let (pid, e0) = init_transactional_id(&mut c, &id, 60_000);

    let t1 = txn_batch(pid, e0, 0, "t1-a");
    assert_eq!(produce_txn(&mut c, &id, &t, &t1), (NONE, 0));
    let (code, next) = end_txn_v5(&mut c, &id, (pid, e0), true);
    assert_eq!((code, next), (NONE, (pid, e0 + 1)));
    let e1 = e0 + 1;
    assert_eq!(wait_settled(&mut c, &t, 0), 2);

    // Between transactions: a duplicate of transaction 1's produce.
    let (code, _) = produce_txn(&mut c, &id, &t, &t1);
    assert_eq!(
        code, INVALID_PRODUCER_EPOCH,
        "stale produce between transactions"
    );
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        2,
        "the stale produce was appended"
    );
    assert_eq!(
        c.last_stable_offset(&t, 0).unwrap(),
        2,
        "the stale produce opened a transaction"
    );

    // During transaction 2.
    assert_eq!(
        produce_txn(&mut c, &id, &t, &txn_batch(pid, e1, 0, "t2-a")),
        (NONE, 2)
    );
    let (code, _) = produce_txn(&mut c, &id, &t, &t1);
    assert_eq!(
        code, INVALID_PRODUCER_EPOCH,
        "stale produce during the next transaction"
    );
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 3);
    let (code, next) = end_txn_v5(&mut c, &id, (pid, e1), true);
    assert_eq!((code, next), (NONE, (pid, e1 + 1)));
    assert_eq!(wait_settled(&mut c, &t, 0), 4);
    let read = c.read_committed(&t, 0).unwrap();
    assert_eq!(
        read.values(),
        vec![(0, "t1-a".to_string()), (2, "t2-a".to_string())]
    );
    assert!(read.aborted.is_empty(), "{:?}", read.aborted);
}

/// A transactional producer pipelines its first writes to a partition
/// (librdkafka sends up to five Produce requests at once on a connection,
/// each batch with the next sequence). The first write of a transaction
/// waits for the leader's KIP-890 check with the coordinator, so the
/// writes after it must wait their turn: appended in request order, every
/// one is accepted at consecutive offsets. Out of order, a later sequence
/// lands first and the earlier ones fail with OUT_OF_ORDER_SEQUENCE_NUMBER
/// (found by librdkafka's 0103 `fatal_idempo` subtest on three nodes).
/// The coordinator is on another node than the partition leader, so the
/// check is a real round trip.
#[test]
fn cluster_pipelined_first_writes_of_a_transaction_keep_their_order() {
    use kafka_protocol::messages::{ApiKey, ProduceRequest, TransactionalId};
    use kafka_protocol::protocol::StrBytes;
    const WRITES: i32 = 20;

    let cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("pipelined-txn");
    create_topic_default_rf(&mut cluster.client(1), &topic, 1).unwrap();
    let leader = samsa_tests::txn::serving_leader(&cluster, 1, &topic, 0, VISIBLE);
    // A transactional id coordinated by another node than the leader.
    let mut c1 = cluster.client(1);
    let (id, coordinator) = (0..)
        .map(|i| format!("{topic}-txn-{i}"))
        .find_map(|id| {
            let (code, node) =
                retry_coordinator("FindCoordinator", VISIBLE, || c1.find_coordinator(1, &id))
                    .unwrap();
            assert_eq!(code, NONE, "FindCoordinator({id})");
            (node != leader).then_some((id, node))
        })
        .unwrap();
    let mut coord = cluster.client(coordinator);
    let producer = init_transactional_id(&mut coord, &id, 60_000);
    let (code, added) = retry_coordinator("AddPartitionsToTxn", VISIBLE, || {
        let r = coord.add_partitions_to_txn(&id, producer, &topic, &[0])?;
        Ok((r.first().map_or(-1, |p| p.1), r))
    })
    .unwrap();
    assert_eq!(code, NONE, "AddPartitionsToTxn: {added:?}");

    let mut c = cluster.client(leader);
    // Transaction version 1 (explicit AddPartitionsToTxn), as librdkafka.
    let version = c.version_for(ApiKey::Produce).unwrap().min(11);
    let sent: Vec<i32> = (0..WRITES)
        .map(|seq| {
            let batch = txn_batch(producer.0, producer.1, seq, &format!("v{seq}"));
            let req: ProduceRequest =
                samsa_tests::client::produce_request(&topic, 0, batch, ACKS_ALL)
                    .with_transactional_id(Some(TransactionalId(StrBytes::from_string(
                        id.clone(),
                    ))));
            c.send_only(&req, version).unwrap()
        })
        .collect();
    let answers: Vec<(i32, i16, i64)> = sent
        .into_iter()
        .enumerate()
        .map(|(seq, corr)| {
            let resp = c.recv::<ProduceRequest>(corr, version).unwrap();
            let p = &resp.responses[0].partition_responses[0];
            (seq as i32, p.error_code, p.base_offset)
        })
        .collect();
    let expected: Vec<(i32, i16, i64)> = (0..WRITES).map(|s| (s, NONE, i64::from(s))).collect();
    assert_eq!(
        answers, expected,
        "(sequence, error, base offset) of pipelined first writes"
    );
}
