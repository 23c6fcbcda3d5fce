//! OpenTelemetry traces (`otlp_endpoint`), received by a real OTLP/gRPC
//! receiver (`samsa_tests::otlp`): one committed transaction on a
//! three-node cluster is one trace from the coordinator's EndTxn request
//! through the markers on the other partition leaders — their appends,
//! fsyncs and replication waits — across at least two nodes; a bad
//! endpoint stops the broker with a clear error; a node without an
//! endpoint exports nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use samsa_tests::cluster::{run_cli, SamsaCluster};
use samsa_tests::node::samsa_bin;
use samsa_tests::otlp::{OtlpReceiver, ReceivedSpan, SPAN_KIND_CLIENT, SPAN_KIND_SERVER};
use samsa_tests::txn::TxnProducer;
use samsa_tests::unique_topic;
use samsa_tests::wait::{try_wait_until, wait_until};

use crate::replication::{create_replicated_topic, leader_and_isr};

/// A trace's spans by span id.
struct Trace<'a> {
    spans: BTreeMap<&'a str, &'a ReceivedSpan>,
}

impl<'a> Trace<'a> {
    fn of(all: &'a [ReceivedSpan], trace_id: &str) -> Trace<'a> {
        Trace {
            spans: all
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .map(|s| (s.span_id.as_str(), s))
                .collect(),
        }
    }

    fn named(&self, name: &str) -> Vec<&'a ReceivedSpan> {
        self.spans
            .values()
            .filter(|s| s.name == name)
            .copied()
            .collect()
    }

    fn parent(&self, span: &ReceivedSpan) -> Option<&'a ReceivedSpan> {
        self.spans.get(span.parent_span_id.as_str()).copied()
    }

    /// Whether `ancestor` is above `span` (every span between them received).
    fn descends_from(&self, span: &ReceivedSpan, ancestor: &ReceivedSpan) -> bool {
        let mut at = self.parent(span);
        while let Some(p) = at {
            if p.span_id == ancestor.span_id {
                return true;
            }
            at = self.parent(p);
        }
        false
    }

    fn nodes(&self) -> BTreeSet<i64> {
        self.spans.values().filter_map(|s| s.node_id).collect()
    }

    /// Names and nodes, for failure messages.
    fn describe(&self) -> String {
        let mut lines: Vec<String> = self
            .spans
            .values()
            .map(|s| {
                format!(
                    "{} on node {:?} (span {}, parent {})",
                    s.name, s.node_id, s.span_id, s.parent_span_id
                )
            })
            .collect();
        lines.sort();
        lines.join("\n")
    }
}

/// Span counts by trace, name and node, for failure messages.
fn summary(spans: &[ReceivedSpan]) -> String {
    let mut counts: BTreeMap<(String, String, Option<i64>), usize> = BTreeMap::new();
    for s in spans {
        *counts
            .entry((s.trace_id.clone(), s.name.clone(), s.node_id))
            .or_default() += 1;
    }
    counts
        .into_iter()
        .map(|((trace, name, node), n)| format!("trace {trace}: {n} × {name} on node {node:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_committed_transaction_is_one_trace_across_the_coordinator_and_the_partition_leaders() {
    let receiver = OtlpReceiver::start().unwrap();
    let endpoint = format!("otlp_endpoint={}", receiver.endpoint());
    let cluster = SamsaCluster::start(3, &[&endpoint]);
    let topic = unique_topic("traced");
    create_replicated_topic(&mut cluster.client(1), &topic, 3, 3);
    let leaders: BTreeSet<i32> =
        wait_until("three partition leaders", Duration::from_secs(30), || {
            let parts = leader_and_isr(&mut cluster.client(1), &topic)?;
            let leaders: BTreeSet<i32> = parts.iter().map(|(leader, _)| *leader).collect();
            (parts
                .iter()
                .all(|(leader, isr)| *leader > 0 && isr.len() == 3)
                && leaders.len() == 3)
                .then_some(leaders)
        });
    assert_eq!(leaders.len(), 3);

    let transactional_id = unique_topic("traced-txn");
    let producer = TxnProducer::transactional(&cluster.bootstrap(), &transactional_id);
    producer.begin().unwrap();
    for partition in 0..3 {
        producer.send_ok(&topic, Some(partition), "traced");
    }
    producer.commit().unwrap();

    // Spans leave each node in batches, a second apart: the trace is
    // checked whole until it holds (or the wait ends with its last failure).
    let mut last = String::from("no span received");
    let verified = try_wait_until(Duration::from_secs(30), || {
        match check_transaction_trace(&receiver.spans(), &transactional_id, &topic, &leaders) {
            Ok(()) => Some(()),
            Err(failure) => {
                last = failure;
                None
            }
        }
    });
    assert!(
        verified.is_some(),
        "the committed transaction's trace is not as expected after 30 s: {last}\nreceived:\n{}",
        summary(&receiver.spans())
    );
}

/// Ok when `spans` hold the trace of the transaction's EndTxn as the test
/// above describes it; otherwise what is missing or wrong.
fn check_transaction_trace(
    spans: &[ReceivedSpan],
    transactional_id: &str,
    topic: &str,
    leaders: &BTreeSet<i32>,
) -> Result<(), String> {
    macro_rules! ensure {
        ($cond:expr, $($why:tt)*) => {
            if !$cond {
                return Err(format!($($why)*));
            }
        };
    }
    let end_txn = spans
        .iter()
        .find(|s| s.name == "EndTxn" && s.attribute("transactional_id") == Some(transactional_id))
        .ok_or("no EndTxn span with the transactional id")?;
    let trace = Trace::of(spans, &end_txn.trace_id);
    let context = trace.describe();
    let coordinator = end_txn.node_id.ok_or("spans name no node")?;

    // The request span: a server span, the root, with the transaction's fields.
    ensure!(
        end_txn.kind == SPAN_KIND_SERVER,
        "EndTxn is not a server span:\n{context}"
    );
    ensure!(
        end_txn.parent_span_id.is_empty(),
        "EndTxn is not the root:\n{context}"
    );
    ensure!(
        end_txn.attribute("producer_id").is_some(),
        "no producer id: {end_txn:?}"
    );
    ensure!(
        end_txn.attribute("api") == Some("EndTxn"),
        "no api: {end_txn:?}"
    );

    // The coordinator's own durable write (PrepareCommit) under the request.
    ensure!(
        trace
            .named("coordinator_write")
            .iter()
            .any(|w| w.node_id == Some(coordinator) && trace.descends_from(w, end_txn)),
        "no coordinator_write under EndTxn:\n{context}"
    );

    // Markers: a marker_write to every leader, made on the coordinator
    // under the request; the remote ones are client spans whose children
    // are the leaders' server spans (a retried round adds spans, not leaders).
    let marker_writes = trace.named("marker_write");
    let written_to: BTreeSet<String> = marker_writes
        .iter()
        .filter_map(|w| w.attribute("leader").map(str::to_string))
        .collect();
    let all_leaders: BTreeSet<String> = leaders.iter().map(|l| l.to_string()).collect();
    ensure!(
        written_to == all_leaders,
        "marker_write to {written_to:?}, leaders {all_leaders:?}:\n{context}"
    );
    for write in &marker_writes {
        ensure!(
            write.node_id == Some(coordinator) && trace.descends_from(write, end_txn),
            "a marker_write not under EndTxn on the coordinator:\n{context}"
        );
    }
    let remote: BTreeSet<i64> = leaders
        .iter()
        .map(|&l| i64::from(l))
        .filter(|&l| l != coordinator)
        .collect();
    let served = trace.named("write_txn_markers");
    let served_on: BTreeSet<i64> = served.iter().filter_map(|s| s.node_id).collect();
    ensure!(
        served_on == remote,
        "write_txn_markers on {served_on:?}, remote leaders {remote:?}:\n{context}"
    );
    for server in &served {
        let leader = server.node_id.ok_or("spans name no node")?;
        ensure!(
            server.kind == SPAN_KIND_SERVER,
            "not a server span: {server:?}"
        );
        let caller = trace
            .parent(server)
            .ok_or_else(|| format!("write_txn_markers on {leader} has no parent:\n{context}"))?;
        ensure!(
            caller.name == "marker_write"
                && caller.kind == SPAN_KIND_CLIENT
                && caller.node_id == Some(coordinator)
                && caller.attribute("leader") == Some(leader.to_string().as_str()),
            "the parent of write_txn_markers on {leader} is {caller:?}:\n{context}"
        );
        // The leader's append of the marker and its wait for the ISR.
        for child in ["append", "replication_wait"] {
            ensure!(
                trace
                    .named(child)
                    .iter()
                    .any(|s| s.node_id == Some(leader) && trace.descends_from(s, server)),
                "no {child} under write_txn_markers on node {leader}:\n{context}"
            );
        }
    }
    // Every partition's marker append is in the trace, the coordinator's
    // own partition included.
    let appended: BTreeSet<String> = trace
        .named("append")
        .iter()
        .filter(|s| s.attribute("topic") == Some(topic))
        .filter_map(|s| s.attribute("partition").map(str::to_string))
        .collect();
    ensure!(
        appended.len() == 3,
        "marker appends of partitions {appended:?}:\n{context}"
    );
    ensure!(trace.nodes().len() >= 2, "one node only:\n{context}");

    // The produce requests are traces of their own, with the producer's fields.
    let produce = spans
        .iter()
        .find(|s| s.name == "Produce" && s.attribute("transactional_id") == Some(transactional_id))
        .ok_or("no Produce span with the transactional id")?;
    ensure!(
        produce.parent_span_id.is_empty() && produce.trace_id != end_txn.trace_id,
        "the Produce span is not a root of its own trace: {produce:?}"
    );
    Ok(())
}

/// `samsa server` with `settings`, which must stop it at start: its stderr.
fn refused_start(settings: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec![
        "server".into(),
        "--data-dir".into(),
        dir.path().display().to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
    ];
    for setting in settings {
        args.extend(["--set".to_string(), setting.to_string()]);
    }
    let output = run_cli(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(!output.status.success(), "{settings:?} started: {output:?}");
    output.stderr
}

#[test]
fn an_otlp_endpoint_that_is_not_http_stops_the_broker_with_a_clear_error() {
    let stderr = refused_start(&["otlp_endpoint=grpc://collector:4317"]);
    assert!(
        stderr.contains("otlp_endpoint") && stderr.contains("http://"),
        "{stderr}"
    );
    let stderr = refused_start(&[
        "otlp_endpoint=http://127.0.0.1:4317",
        "trace_sample_ratio=1.5",
    ]);
    assert!(stderr.contains("trace_sample_ratio"), "{stderr}");
}

/// Sampling (decided before a trace's first span is made): with a ratio of 0 no
/// request starts a trace (nor do the appends and fsyncs below it), and
/// with 1 every request does. A stopping node exports what it queued, so
/// the receiver has everything once the node has exited.
#[test]
fn a_sample_ratio_of_0_keeps_no_trace_and_1_keeps_every_one() {
    use samsa_tests::SamsaNode;

    let run = |ratio: &str| {
        let receiver = OtlpReceiver::start().unwrap();
        let endpoint = format!("otlp_endpoint={}", receiver.endpoint());
        let ratio = format!("trace_sample_ratio={ratio}");
        let mut node = SamsaNode::start_with(&[&endpoint, &ratio]);
        let topic = unique_topic("sampled");
        let mut client = node.client();
        client.create_topic(&topic, 1).unwrap();
        for i in 0..20 {
            let batch = samsa_tests::BatchBuilder::new()
                .record_kv(format!("k{i}"), "v")
                .build();
            let answer = client.produce(&topic, 0, batch, -1).unwrap();
            assert_eq!(answer.error_code, 0, "{answer:?}");
        }
        assert!(node.sigterm_and_wait().success());
        receiver.spans()
    };
    let none = run("0");
    assert!(none.is_empty(), "ratio 0 exported:\n{}", summary(&none));
    // Half the requests: whatever is kept is whole, no span without its
    // parent (an unsampled request's appends and fsyncs are not made).
    let half = run("0.5");
    let ids: BTreeSet<&str> = half.iter().map(|s| s.span_id.as_str()).collect();
    for span in &half {
        assert!(
            // A request's span, the root, names its API.
            span.parent_span_id.is_empty() && span.attribute("api").is_some()
                || ids.contains(span.parent_span_id.as_str()),
            "{span:?} has no parent among the spans received:\n{}",
            summary(&half)
        );
    }
    assert!(half.iter().filter(|s| s.name == "Produce").count() <= 20);
    let all = run("1");
    let produces = all.iter().filter(|s| s.name == "Produce").count();
    let appends = all.iter().filter(|s| s.name == "append").count();
    assert_eq!(produces, 20, "{}", summary(&all));
    assert!(appends >= 20, "{}", summary(&all));
}
