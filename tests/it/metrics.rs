//! `/metrics` after a known workload on one node, over a real socket: the
//! request metrics count each request once with its time split and its
//! error codes by name, the topic traffic counts what was appended and
//! what consumers fetched, the connection gauges follow open connections
//! and the client software they named; the page is OpenMetrics (Content
//! type, `# EOF`).

use std::time::Duration;

use samsa_tests::batch::BatchBuilder;
use samsa_tests::http::{float_metric, http_get, metric};
use samsa_tests::wait::wait_until;
use samsa_tests::{unique_topic, SamsaNode};

const RECORDS: usize = 25;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

fn scrape(node: &SamsaNode) -> String {
    let (status, body) = http_get(node.http_addr(), "/metrics").expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("# EOF\n"), "not OpenMetrics: {body}");
    body
}

#[test]
fn request_topic_and_connection_metrics_follow_a_known_workload() {
    let node = SamsaNode::start();
    let topic = unique_topic("metrics");
    let mut client = node.client();
    client.create_topic(&topic, 1).unwrap();
    let batch = BatchBuilder::new()
        .values((0..RECORDS).map(|i| format!("record-{i}")))
        .build();
    let produced = client.produce(&topic, 0, batch.clone(), -1).unwrap();
    assert_eq!(produced.error_code, 0);
    let refused = client.produce(&topic, 7, batch.clone(), -1).unwrap();
    assert_eq!(refused.error_code, UNKNOWN_TOPIC_OR_PARTITION);
    let fetched = client.fetch(&topic, 0, 0, 0, 1).unwrap();
    assert_eq!(fetched.error_code, 0);

    // The answers above were written before the client read them; their
    // metrics were recorded right after: wait for the last to show.
    let ours = "samsa_kafka_client_connections{listener=\"PLAINTEXT\",client_software_name=\"samsa-tests\",client_software_version=\"0.1.0\"}";
    let page = wait_until(
        "the fetch in the request metrics",
        Duration::from_secs(10),
        || {
            let page = scrape(&node);
            // The start-up probe's connection named the same software: it is
            // closed by now, ours is open.
            (metric(&page, "samsa_kafka_requests_total{api=\"Fetch\"}") == Some(1)
                && metric(&page, ours) == Some(1))
            .then_some(page)
        },
    );
    let value = |key: &str| metric(&page, key).unwrap_or_else(|| panic!("{key} missing:\n{page}"));
    assert_eq!(value("samsa_kafka_requests_total{api=\"Produce\"}"), 2);
    assert_eq!(
        value("samsa_kafka_request_duration_seconds_count{api=\"Produce\"}"),
        2
    );
    assert_eq!(
        value("samsa_kafka_request_remote_seconds_count{api=\"Produce\"}"),
        2
    );
    assert_eq!(
        value("samsa_kafka_request_errors_total{api=\"Produce\",error=\"UNKNOWN_TOPIC_OR_PARTITION\"}"),
        1
    );
    assert_eq!(
        value(&format!(
            "samsa_topic_records_in_total{{topic=\"{topic}\"}}"
        )),
        RECORDS as i64
    );
    assert_eq!(
        value(&format!("samsa_topic_bytes_in_total{{topic=\"{topic}\"}}")),
        batch.len() as i64
    );
    assert_eq!(
        value(&format!(
            "samsa_topic_records_out_total{{topic=\"{topic}\"}}"
        )),
        RECORDS as i64
    );
    assert!(value("samsa_kafka_connections{listener=\"PLAINTEXT\"}") >= 1);
    assert!(page.contains("# TYPE samsa_kafka_request_duration_seconds histogram"));

    // A closed connection leaves the gauges; its client software with it.
    drop(client);
    wait_until(
        "the closed connection to leave the gauge",
        Duration::from_secs(10),
        || {
            let page = scrape(&node);
            (!page.contains("client_software_name=\"samsa-tests\"")).then_some(())
        },
    );
}

/// The figures read at scrape time and those the coordinators record, after
/// a known workload: a transaction of `RECORDS` records commits, a group
/// commits offset 10 of its partition, and the page shows the log's
/// offsets, the committed transaction, the group's lag, the node as its
/// own active controller and the process.
#[test]
fn partition_coordinator_controller_and_process_figures_follow_a_known_workload() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use samsa_tests::rdk::{create_topic_admin, idempotent_producer_config, partition_zero_at};

    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let topic = unique_topic("figures");
    create_topic_admin(&bootstrap, &topic, 1).unwrap();
    // Once more: an admin API's per-topic error is counted too.
    let _ = create_topic_admin(&bootstrap, &topic, 1);
    let t = Duration::from_secs(30);
    let txn: BaseProducer = idempotent_producer_config(&bootstrap)
        .set("transactional.id", unique_topic("figures-txn"))
        .set("transaction.timeout.ms", "120000")
        .create()
        .unwrap();
    txn.init_transactions(t).unwrap();
    txn.begin_transaction().unwrap();
    for i in 0..RECORDS {
        let key = format!("k{i}");
        txn.send(BaseRecord::to(&topic).key(&key).payload(&key))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    txn.commit_transaction(t).unwrap();
    let group = unique_topic("figures-group");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", &group)
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    consumer
        .commit(&partition_zero_at(&topic, 10), CommitMode::Sync)
        .unwrap();

    // RECORDS records and the commit marker.
    let end = RECORDS as i64 + 1;
    let tp = format!("topic=\"{topic}\",partition=\"0\"");
    let lag_key = format!("samsa_consumer_group_lag{{group=\"{group}\",{tp}}}");
    let page = wait_until(
        "the commit's figures on /metrics",
        Duration::from_secs(30),
        || {
            let page = scrape(&node);
            (metric(&page, &lag_key) == Some(end - 10)).then_some(page)
        },
    );
    let value = |key: &str| metric(&page, key).unwrap_or_else(|| panic!("{key} missing:\n{page}"));
    assert_eq!(
        value(&format!("samsa_partition_log_end_offset{{{tp}}}")),
        end
    );
    assert_eq!(
        value(&format!("samsa_partition_high_watermark{{{tp}}}")),
        end
    );
    assert_eq!(value(&format!("samsa_partition_lso_lag{{{tp}}}")), 0);
    assert_eq!(
        value(&format!("samsa_partition_log_start_offset{{{tp}}}")),
        0
    );
    assert_eq!(value(&format!("samsa_partition_segments{{{tp}}}")), 1);
    assert!(value(&format!("samsa_partition_size_bytes{{{tp}}}")) > 0);
    assert_eq!(
        value(&format!("samsa_partition_in_sync_replicas{{{tp}}}")),
        1
    );
    assert_eq!(value(&format!("samsa_partition_producers{{{tp}}}")), 1);
    assert_eq!(
        value(&format!(
            "samsa_consumer_group_committed_offset{{group=\"{group}\",{tp}}}"
        )),
        10
    );
    assert_eq!(
        value("samsa_transactions_ended_total{outcome=\"commit\"}"),
        1
    );
    assert_eq!(
        value("samsa_coordinator_transactions{state=\"CompleteCommit\"}"),
        1
    );
    assert_eq!(value("samsa_under_replicated_partitions"), 0);
    assert_eq!(value("samsa_controller_active"), 1);
    assert_eq!(value("samsa_offline_partitions"), 0);
    assert_eq!(value("samsa_active_brokers"), 1);
    assert_eq!(value("samsa_consumer_group_offset_commits_total"), 1);
    assert_eq!(
        value(
            "samsa_kafka_request_errors_total{api=\"CreateTopics\",error=\"TOPIC_ALREADY_EXISTS\"}"
        ),
        1
    );
    // One partition, one marker; one transactional producer, one block.
    assert_eq!(value("samsa_transaction_markers_written_total"), 1);
    assert_eq!(value("samsa_transaction_markers_pending"), 0);
    assert_eq!(value("samsa_producer_ids_allocated_total"), 1);
    assert_eq!(value("samsa_producer_id_blocks_total"), 1);
    let total = value("samsa_log_dir_total_bytes");
    let usable = value("samsa_log_dir_usable_bytes");
    assert!(
        total > 0 && (0..=total).contains(&usable),
        "{total} {usable}"
    );
    // Traces are off: nothing exported, nothing lost.
    assert_eq!(value("samsa_trace_spans_exported_total"), 0);
    assert_eq!(value("samsa_trace_spans_lost_total"), 0);
    assert!(value("process_open_fds") > 10);
    assert!(value("process_resident_memory_bytes") > 1 << 20);
    assert!(value("samsa_tokio_workers") >= 1);
    assert!(
        page.contains("\nsamsa_log_flush_duration_seconds_count "),
        "{page}"
    );
    assert!(page.contains("\nprocess_cpu_seconds_total "), "{page}");
}

/// On a cluster: a follower counts its fetches from the leader and the
/// bytes they brought; the metadata snapshot's age is on every node once
/// snapshots are written (built by each controller), and still known after
/// a SIGKILL and restart (the time is stored with the snapshot).
#[test]
fn replica_fetches_and_the_raft_snapshot_age_on_a_cluster() {
    use samsa_tests::cluster::SamsaCluster;

    const AGE: &str = "samsa_raft_snapshot_age_seconds";
    let mut cluster = SamsaCluster::start(3, &["metadata_snapshot_interval_entries=5"]);
    let page_of = |cluster: &SamsaCluster, id: i32| {
        let (status, body) =
            http_get(cluster.node(id).http_addr(), "/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        body
    };
    // Every topic created is a metadata record: enough for a snapshot.
    let mut client = cluster.client(1);
    for i in 0..8 {
        client
            .create_topic(&unique_topic(&format!("snapshot-{i}")), 1)
            .unwrap();
    }
    let ages: Vec<f64> = (1..=3)
        .map(|id| {
            wait_until(
                "a metadata snapshot on every node",
                Duration::from_secs(60),
                || float_metric(&page_of(&cluster, id), AGE),
            )
        })
        .collect();
    for age in &ages {
        assert!((0.0..60.0).contains(age), "{ages:?}");
    }
    // Followers fetch from the leader of a replicated partition.
    let replicated = unique_topic("fetched");
    crate::replication::create_replicated_topic(&mut client, &replicated, 1, 3);
    let leader = wait_until("a leader", Duration::from_secs(30), || {
        let parts = crate::replication::leader_and_isr(&mut client, &replicated)?;
        parts.first().map(|(leader, _)| *leader).filter(|l| *l > 0)
    });
    let batch = samsa_tests::BatchBuilder::new()
        .record_kv("k", "fetched by the followers")
        .build();
    let mut leader_client = cluster.client(leader);
    // The leader may not have taken its leadership from the metadata yet
    // (NOT_LEADER_OR_FOLLOWER), or not even the topic, when another node's
    // Metadata named it first (UNKNOWN_TOPIC_OR_PARTITION): both are
    // retried, as clients do (nothing was appended).
    wait_until(
        "an acks=all write on the leader",
        Duration::from_secs(30),
        || {
            let answer = leader_client
                .produce(&replicated, 0, batch.clone(), -1)
                .unwrap();
            match answer.error_code {
                0 => Some(()),
                samsa_tests::codes::NOT_LEADER_OR_FOLLOWER
                | samsa_tests::codes::UNKNOWN_TOPIC_OR_PARTITION => None,
                code => panic!("produce answered {code}: {answer:?}"),
            }
        },
    );
    // Every follower has fetched the record (acks=all waited for the ISR;
    // polled in case one fell out of it on a loaded machine).
    let fetch_key = |name: &str| format!("{name}{{leader=\"{leader}\"}}");
    for follower in (1..=3).filter(|id| *id != leader) {
        wait_until(
            "a follower's fetch counts from the leader",
            Duration::from_secs(30),
            || {
                let page = page_of(&cluster, follower);
                let fetched = |name: &str| metric(&page, &fetch_key(name)).unwrap_or(0) > 0;
                (fetched("samsa_replica_fetch_requests_total")
                    && fetched("samsa_replica_fetch_bytes_total"))
                .then_some(())
            },
        );
    }

    let index_before = metric(&page_of(&cluster, 3), "samsa_raft_snapshot_index").unwrap();
    cluster.sigkill(3);
    cluster.restart(3);
    let page = page_of(&cluster, 3);
    let age =
        float_metric(&page, AGE).unwrap_or_else(|| panic!("{AGE} gone after a restart:\n{page}"));
    assert!((0.0..120.0).contains(&age), "{age}");
    assert!(metric(&page, "samsa_raft_snapshot_index").unwrap() >= index_before);
}
