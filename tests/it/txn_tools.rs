//! `samsa txn` (the kafka-transactions.sh equivalents) and the broker's
//! HTTP endpoint, run as real processes: the CLI binary against a real
//! broker, its tables parsed from stdout, `/metrics` scraped over HTTP.
//!
//! A hanging transaction is made the way Kafka makes one: a transactional
//! write the coordinator does not know about. KIP-890 verification refuses
//! such a write, so the broker runs with
//! `transaction_partition_verification_enable=false`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use samsa_tests::batch::now_ms;
use samsa_tests::cluster::{run_cli, SamsaCluster};
use samsa_tests::codes::NONE;
use samsa_tests::http::{http_get, metric};
use samsa_tests::node::samsa_bin;
use samsa_tests::txn::{
    create_topic_default_rf, init_transactional_id, partition_leaders, transaction_state_leader,
    TxnProducer,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, wait_until, BatchBuilder, SamsaNode};

const CLI_TIMEOUT: Duration = Duration::from_secs(60);
const SETTLE: Duration = Duration::from_secs(30);
/// The broker's `transaction_max_timeout_ms` in the hanging test: short,
/// so the transaction counts as hanging after seconds.
const MAX_TIMEOUT_MS: i64 = 1_500;

/// One table `samsa txn …` printed: a row per line, as header → value.
type Table = Vec<BTreeMap<String, String>>;

fn parse_table(stdout: &str) -> Table {
    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let headers: Vec<&str> = lines
        .next()
        .unwrap_or_else(|| panic!("no table header in {stdout:?}"))
        .split_whitespace()
        .collect();
    lines
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(
                cells.len(),
                headers.len(),
                "row {line:?} does not match the header {headers:?}"
            );
            headers
                .iter()
                .zip(cells)
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

/// Runs `samsa txn <args> -b <bootstrap>`: the parsed table on success,
/// the stderr text on failure.
fn txn_cli(bootstrap: &str, args: &[&str]) -> Result<Table, String> {
    let mut all: Vec<String> = vec!["txn".into()];
    all.extend(args.iter().map(|a| a.to_string()));
    all.extend(["-b".to_string(), bootstrap.to_string()]);
    let out = run_cli(&samsa_bin(), &all, CLI_TIMEOUT);
    if out.status.success() {
        Ok(parse_table(&out.stdout))
    } else {
        Err(format!(
            "`samsa {}` failed ({}): {}",
            all.join(" "),
            out.status,
            out.stderr
        ))
    }
}

fn txn_ok(bootstrap: &str, args: &[&str]) -> Table {
    txn_cli(bootstrap, args).unwrap_or_else(|e| panic!("{e}"))
}

fn metrics(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    body
}

fn wait_metric(addr: SocketAddr, name: &str, expected: i64) {
    let mut last = String::new();
    let seen = try_wait_until(SETTLE, || {
        last = metrics(addr);
        (metric(&last, name) == Some(expected)).then_some(())
    });
    assert!(
        seen.is_some(),
        "{name} never became {expected}; last scrape:\n{last}"
    );
}

/// A transactional write the coordinator never heard of (no
/// AddPartitionsToTxn, verification off) leaves a hanging transaction, here
/// on two partitions: `find-hanging` lists them once they are older than
/// the max timeout, the gauge counts them, `abort` ends them (by start
/// offset, and by producer id / epochs), read_committed readers move past
/// them, and then neither the tool nor the gauge sees anything.
#[test]
fn hanging_transaction_is_found_gauged_and_aborted() {
    let max_timeout = format!("transaction_max_timeout_ms={MAX_TIMEOUT_MS}");
    let node = SamsaNode::start_with(&[
        "transaction_partition_verification_enable=false",
        &max_timeout,
    ]);
    let bootstrap = node.bootstrap();
    let http = node.http_addr();
    let mut c = node.client();
    let topic = unique_topic("hanging");
    c.create_topic(&topic, 2).unwrap();

    let id = unique_topic("hanging-txn");
    let (pid, epoch) = init_transactional_id(&mut c, &id, 1_000);
    let written_at = Instant::now();
    for p in 0..2 {
        let before = BatchBuilder::new().record("before").build();
        assert_eq!(c.produce(&topic, p, before, -1).unwrap().error_code, NONE);
        let hanging = BatchBuilder::idempotent(pid, epoch, 0)
            .transactional(true)
            .record("hanging")
            .build();
        let produced = c.produce_txn_at(&id, &topic, p, hanging, -1, 11).unwrap();
        assert_eq!(
            (produced.error_code, produced.base_offset),
            (NONE, 1),
            "{produced:?}"
        );
        let after = BatchBuilder::new().record("after").build();
        assert_eq!(c.produce(&topic, p, after, -1).unwrap().base_offset, 2);
        assert_eq!(c.last_stable_offset(&topic, p).unwrap(), 1, "pinned LSO");
        assert_eq!(
            c.read_committed(&topic, p).unwrap().values(),
            vec![(0, "before".to_string())]
        );
    }

    // Younger than the max timeout: not hanging yet (the coordinator could
    // still be about to end it). Asked with a max timeout longer than the
    // transactions can be old by the time the tool looks (their age so far
    // plus the tool's whole run), so this holds on any machine.
    let young_ms = (written_at.elapsed() + CLI_TIMEOUT).as_millis().to_string();
    let early = txn_ok(
        &bootstrap,
        &[
            "find-hanging",
            "--topic",
            &topic,
            "--max-transaction-timeout-ms",
            &young_ms,
        ],
    );
    assert!(early.is_empty(), "reported before the timeout: {early:?}");
    let timeout_ms = MAX_TIMEOUT_MS.to_string();
    let find = [
        "find-hanging",
        "--topic",
        &topic,
        "--max-transaction-timeout-ms",
        &timeout_ms,
    ];
    let metrics_now = metrics(http);
    assert_eq!(metric(&metrics_now, "samsa_open_transactions"), Some(2));

    // Older than the max timeout, and the coordinator's transaction for the
    // id does not hold the partitions: hanging.
    let rows = wait_until("find-hanging to list the transactions", SETTLE, || {
        let rows = txn_ok(&bootstrap, &find);
        (rows.len() == 2).then_some(rows)
    });
    for (p, row) in rows.iter().enumerate() {
        assert_eq!(row["Topic"], topic);
        assert_eq!(row["Partition"], p.to_string());
        assert_eq!(row["ProducerId"], pid.to_string());
        assert_eq!(row["ProducerEpoch"], epoch.to_string());
        assert_eq!(row["CoordinatorEpoch"], "-1", "no marker was ever written");
        assert_eq!(row["StartOffset"], "1");
        let last_ts: i64 = row["LastTimestamp"].parse().unwrap();
        assert!(now_ms() - last_ts > MAX_TIMEOUT_MS, "{row:?}");
    }
    // One partition, and by broker: the same transactions.
    let one = txn_ok(
        &bootstrap,
        &[
            "find-hanging",
            "--topic",
            &topic,
            "--partition",
            "1",
            "--max-transaction-timeout-ms",
            &timeout_ms,
        ],
    );
    assert_eq!(one, rows[1..]);
    let by_broker = txn_ok(
        &bootstrap,
        &[
            "find-hanging",
            "--broker-id",
            "1",
            "--max-transaction-timeout-ms",
            &timeout_ms,
        ],
    );
    assert_eq!(by_broker, rows);
    // In minutes (Kafka's unit) the default of 15 is far off.
    assert!(txn_ok(&bootstrap, &["find-hanging", "--topic", &topic]).is_empty());
    wait_metric(http, "samsa_partitions_with_hanging_transactions", 2);

    // The coordinator knows the id, but not these partitions.
    let listed = txn_ok(&bootstrap, &["list", "--producer-id", &pid.to_string()]);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["TransactionalId"], id);
    assert_eq!(listed[0]["TransactionState"], "Empty");

    // An abort naming a start offset with no transaction is refused.
    let wrong = txn_cli(
        &bootstrap,
        &[
            "abort",
            "--topic",
            &topic,
            "--partition",
            "0",
            "--start-offset",
            "0",
        ],
    )
    .expect_err("abort at an offset no transaction starts at");
    assert!(
        wrong.contains("no open transaction starts at offset 0"),
        "{wrong}"
    );

    // Partition 0 by start offset; partition 1 by producer id and epochs as
    // find-hanging printed them (coordinator epoch -1 is sent as 0).
    let abort_by_offset = [
        "abort",
        "--topic",
        &topic,
        "--partition",
        "0",
        "--start-offset",
        "1",
    ];
    txn_ok(&bootstrap, &abort_by_offset);
    wait_metric(http, "samsa_partitions_with_hanging_transactions", 1);
    let pid_text = pid.to_string();
    let epoch_text = epoch.to_string();
    txn_ok(
        &bootstrap,
        &[
            "abort",
            "--topic",
            &topic,
            "--partition",
            "1",
            "--producer-id",
            &pid_text,
            "--producer-epoch",
            &epoch_text,
            "--coordinator-epoch",
            "-1",
        ],
    );

    // Readers move past them: each ABORT marker took offset 3.
    for p in 0..2 {
        assert_eq!(c.last_stable_offset(&topic, p).unwrap(), 4);
        let read = c.read_committed(&topic, p).unwrap();
        assert_eq!(
            read.values(),
            vec![(0, "before".to_string()), (2, "after".to_string())]
        );
        assert_eq!(read.aborted, vec![(pid, 1)]);
    }
    assert!(txn_ok(&bootstrap, &find).is_empty());
    wait_metric(http, "samsa_partitions_with_hanging_transactions", 0);
    assert_eq!(metric(&metrics(http), "samsa_open_transactions"), Some(0));
    // Nothing left to abort at that offset.
    assert!(txn_cli(&bootstrap, &abort_by_offset).is_err());

    // The leader checks an operator's coordinator epoch as a coordinator's:
    // after a marker at epoch 5, one at 3 is fenced; the tool, reading the
    // epoch from DescribeProducers, writes at 5.
    let mut reopen = |seq: i32, offset: i64| {
        let batch = BatchBuilder::idempotent(pid, epoch, seq)
            .transactional(true)
            .record("hanging-again")
            .build();
        let produced = c.produce_txn_at(&id, &topic, 1, batch, -1, 11).unwrap();
        assert_eq!(
            (produced.error_code, produced.base_offset),
            (NONE, offset),
            "{produced:?}"
        );
    };
    let abort_at = |coordinator_epoch: &str| {
        txn_cli(
            &bootstrap,
            &[
                "abort",
                "--topic",
                &topic,
                "--partition",
                "1",
                "--producer-id",
                &pid_text,
                "--producer-epoch",
                &epoch_text,
                "--coordinator-epoch",
                coordinator_epoch,
            ],
        )
    };
    reopen(1, 4);
    abort_at("5").unwrap();
    reopen(2, 6);
    let fenced = abort_at("3").expect_err("a marker below the partition's coordinator epoch");
    assert!(fenced.contains("TransactionCoordinatorFenced"), "{fenced}");
    let described = txn_ok(
        &bootstrap,
        &["describe-producers", "--topic", &topic, "--partition", "1"],
    );
    assert_eq!(described[0]["LatestCoordinatorEpoch"], "5", "{described:?}");
    assert_eq!(described[0]["CurrentTransactionStartOffset"], "6");
    txn_ok(
        &bootstrap,
        &[
            "abort",
            "--topic",
            &topic,
            "--partition",
            "1",
            "--start-offset",
            "6",
        ],
    );
    assert_eq!(c.last_stable_offset(&topic, 1).unwrap(), 8);
}

/// `list`, `describe` and `describe-producers` show a librdkafka
/// transaction while it is open and after it commits; `/metrics`,
/// `/healthz` and `/readyz` answer.
#[test]
fn list_and_describe_show_a_live_librdkafka_transaction() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let http = node.http_addr();
    assert_eq!(http_get(http, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(http, "/readyz").unwrap().0, 200);
    assert_eq!(http_get(http, "/nothing").unwrap().0, 404);
    let mut c = node.client();
    let topic = unique_topic("live-txn");
    c.create_topic(&topic, 2).unwrap();
    let id = unique_topic("live-txn-id");
    let producer = TxnProducer::transactional(&bootstrap, &id);
    producer.begin().unwrap();
    producer.send_ok(&topic, Some(1), "one");

    let listed = txn_ok(&bootstrap, &["list"]);
    let mine: Vec<_> = listed
        .iter()
        .filter(|r| r["TransactionalId"] == id)
        .collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert_eq!(mine[0]["Coordinator"], "1");
    assert_eq!(mine[0]["TransactionState"], "Ongoing");
    let pid = mine[0]["ProducerId"].clone();

    // Filters.
    let only = |args: &[&str]| -> usize {
        let mut all = vec!["list"];
        all.extend_from_slice(args);
        txn_ok(&bootstrap, &all)
            .iter()
            .filter(|r| r["TransactionalId"] == id)
            .count()
    };
    assert_eq!(only(&["--state", "Ongoing"]), 1);
    assert_eq!(only(&["--state", "CompleteCommit"]), 0);
    assert_eq!(only(&["--producer-id", &pid]), 1);
    assert_eq!(only(&["--producer-id", "999999999"]), 0);
    assert_eq!(only(&["--duration-filter", "3600000"]), 0);
    assert_eq!(only(&["--duration-filter", "0"]), 1);

    let described = txn_ok(&bootstrap, &["describe", "--transactional-id", &id]);
    assert_eq!(described.len(), 1, "{described:?}");
    let d = &described[0];
    assert_eq!(d["CoordinatorId"], "1");
    assert_eq!(d["ProducerId"], pid);
    assert_eq!(d["TransactionState"], "Ongoing");
    assert_eq!(d["TopicPartitions"], format!("{topic}-1"));
    assert_ne!(d["CurrentTransactionStartTimeMs"], "None");

    let producers = txn_ok(
        &bootstrap,
        &["describe-producers", "--topic", &topic, "--partition", "1"],
    );
    assert_eq!(producers.len(), 1, "{producers:?}");
    assert_eq!(producers[0]["ProducerId"], pid);
    assert_eq!(producers[0]["CurrentTransactionStartOffset"], "0");
    let scrape = metrics(http);
    assert_eq!(
        metric(&scrape, "samsa_open_transactions"),
        Some(1),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "samsa_coordinator_ongoing_transactions"),
        Some(1),
        "{scrape}"
    );
    assert_eq!(
        metric(&scrape, "samsa_partitions_with_hanging_transactions"),
        Some(0)
    );
    assert!(
        scrape.contains(&format!(
            "samsa_partition_lso_lag{{topic=\"{topic}\",partition=\"1\"}} 1"
        )),
        "{scrape}"
    );
    // A live transaction is not hanging, however short the timeout asked.
    let hanging = txn_ok(
        &bootstrap,
        &[
            "find-hanging",
            "--topic",
            &topic,
            "--max-transaction-timeout-ms",
            "0",
        ],
    );
    assert!(hanging.is_empty(), "{hanging:?}");

    producer.commit().unwrap();
    wait_until("the commit to complete", SETTLE, || {
        let d = txn_ok(&bootstrap, &["describe", "--transactional-id", &id]);
        (d[0]["TransactionState"] == "CompleteCommit").then_some(())
    });
    let producers = txn_ok(
        &bootstrap,
        &["describe-producers", "--topic", &topic, "--partition", "1"],
    );
    assert_eq!(producers[0]["CurrentTransactionStartOffset"], "None");
    wait_metric(http, "samsa_open_transactions", 0);
    let missing = txn_cli(
        &bootstrap,
        &["describe", "--transactional-id", "no-such-id"],
    )
    .expect_err("describe of an unknown id");
    assert!(missing.contains("TransactionalIdNotFound"), "{missing}");
}

/// On three nodes: hanging transactions on partitions led by different
/// brokers are found next to a live librdkafka transaction on the same
/// partitions (which the cross-check with its coordinator excludes), each
/// is aborted through its own leader, and the live one still commits.
#[test]
fn cluster_find_hanging_crosschecks_coordinators_and_aborts_on_each_leader() {
    let cluster = SamsaCluster::start(3, &["transaction_partition_verification_enable=false"]);
    let bootstrap = cluster.bootstrap();
    let mut c = cluster.client(1);
    let topic = unique_topic("cluster-hanging");
    create_topic_default_rf(&mut c, &topic, 3).unwrap();
    let leaders = wait_until("leaders of every partition", SETTLE, || {
        partition_leaders(&mut c, &topic).filter(|l| l.len() == 3)
    });

    // The hanging producer: InitProducerId on its coordinator, then one
    // unverified transactional write to every partition, at its leader.
    let id = unique_topic("cluster-hanging-txn");
    let coordinator = wait_until("the hanging id's coordinator", SETTLE, || {
        match c.find_coordinator(1, &id).ok()? {
            (NONE, node) => Some(node),
            _ => None,
        }
    });
    let (pid, epoch) = init_transactional_id(&mut cluster.client(coordinator), &id, 60_000);
    for (&p, &leader) in &leaders {
        let batch = BatchBuilder::idempotent(pid, epoch, 0)
            .transactional(true)
            .record(format!("hanging-{p}"))
            .build();
        let produced = cluster
            .client(leader)
            .produce_txn_at(&id, &topic, p, batch, -1, 11)
            .unwrap();
        assert_eq!(
            (produced.error_code, produced.base_offset),
            (NONE, 0),
            "{produced:?}"
        );
    }

    // A live transaction on the same partitions, coordinated wherever its id lands.
    let live_id = unique_topic("cluster-live-txn");
    let live = TxnProducer::transactional(&bootstrap, &live_id);
    live.begin().unwrap();
    for p in 0..3 {
        assert_eq!(live.send_ok(&topic, Some(p), &format!("live-{p}")).1, 1);
    }

    // Every open transaction is a candidate at timeout 0; only the hanging
    // ones survive the cross-check.
    let find = [
        "find-hanging",
        "--topic",
        &topic,
        "--max-transaction-timeout-ms",
        "0",
    ];
    let rows = txn_ok(&bootstrap, &find);
    let found: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["Partition"].clone(),
                r["ProducerId"].clone(),
                r["StartOffset"].clone(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String)> = (0..3)
        .map(|p| (p.to_string(), pid.to_string(), "0".to_string()))
        .collect();
    assert_eq!(found, expected, "{rows:?}");
    // Every broker holds a replica of every partition (RF 3).
    assert_eq!(
        txn_ok(
            &bootstrap,
            &[
                "find-hanging",
                "--broker-id",
                "3",
                "--max-transaction-timeout-ms",
                "0"
            ]
        )
        .iter()
        .filter(|r| r["Topic"] == topic)
        .count(),
        3
    );

    // list names each id's coordinator.
    let listed = txn_ok(&bootstrap, &["list"]);
    let coordinator_of = |tid: &str| -> String {
        listed
            .iter()
            .find(|r| r["TransactionalId"] == tid)
            .unwrap_or_else(|| panic!("{tid} not listed: {listed:?}"))["Coordinator"]
            .clone()
    };
    assert_eq!(coordinator_of(&id), coordinator.to_string());
    let live_coordinator = transaction_state_leader(&mut c, &live_id).unwrap();
    assert_eq!(coordinator_of(&live_id), live_coordinator.to_string());

    for p in 0..3 {
        let partition = p.to_string();
        txn_ok(
            &bootstrap,
            &[
                "abort",
                "--topic",
                &topic,
                "--partition",
                &partition,
                "--start-offset",
                "0",
            ],
        );
    }
    live.commit().unwrap();
    assert!(txn_ok(&bootstrap, &find).is_empty());
    for (&p, &leader) in &leaders {
        let read = cluster.client(leader).read_committed(&topic, p).unwrap();
        assert_eq!(read.values(), vec![(1, format!("live-{p}"))]);
        assert_eq!(read.aborted, vec![(pid, 0)]);
    }
}
