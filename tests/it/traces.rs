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

    // The EndTxn request's trace, once every leader's marker spans are in.
    let found = try_wait_until(Duration::from_secs(30), || {
        let spans = receiver.spans();
        let end_txn = spans
            .iter()
            .find(|s| {
                s.name == "EndTxn" && s.attribute("transactional_id") == Some(&transactional_id)
            })?
            .clone();
        let trace = Trace::of(&spans, &end_txn.trace_id);
        let remote_leaders: BTreeSet<i64> = trace
            .named("write_txn_markers")
            .iter()
            .filter_map(|s| s.node_id)
            .collect();
        let coordinator = end_txn.node_id?;
        let expected: BTreeSet<i64> = leaders
            .iter()
            .map(|&l| i64::from(l))
            .filter(|&l| l != coordinator)
            .collect();
        let appends_on_remote = trace
            .named("replication_wait")
            .iter()
            .filter_map(|s| s.node_id)
            .filter(|n| expected.contains(n))
            .count();
        (remote_leaders == expected && appends_on_remote >= expected.len())
            .then_some((spans, end_txn))
    });
    let Some((spans, end_txn)) = found else {
        panic!(
            "no EndTxn trace with the markers of every partition leader (leaders {leaders:?}) \
             within 30 s; received:\n{}",
            summary(&receiver.spans())
        );
    };
    let trace = Trace::of(&spans, &end_txn.trace_id);
    let coordinator = end_txn.node_id.expect("spans name their node");
    let context = trace.describe();

    // The request span: a server span, the root, with the transaction's fields.
    assert_eq!(end_txn.kind, SPAN_KIND_SERVER, "{context}");
    assert!(
        end_txn.parent_span_id.is_empty(),
        "EndTxn is the root:\n{context}"
    );
    assert!(end_txn.attribute("producer_id").is_some(), "{end_txn:?}");
    assert_eq!(end_txn.attribute("api"), Some("EndTxn"), "{end_txn:?}");

    // The coordinator's own durable write (PrepareCommit) under the request.
    let coordinator_writes = trace.named("coordinator_write");
    assert!(
        coordinator_writes
            .iter()
            .any(|w| w.node_id == Some(coordinator) && trace.descends_from(w, &end_txn)),
        "no coordinator_write under EndTxn:\n{context}"
    );

    // Markers: one marker_write per leader under the request; the remote
    // ones are client spans whose child is the leader's server span.
    let marker_writes = trace.named("marker_write");
    assert_eq!(
        marker_writes.len(),
        3,
        "one marker_write per leader:\n{context}"
    );
    for write in &marker_writes {
        assert_eq!(write.node_id, Some(coordinator), "{context}");
        assert!(trace.descends_from(write, &end_txn), "{context}");
    }
    let served = trace.named("write_txn_markers");
    assert_eq!(served.len(), 2, "two remote leaders:\n{context}");
    for server in &served {
        let leader = server.node_id.expect("spans name their node");
        assert_ne!(leader, coordinator, "{context}");
        assert_eq!(server.kind, SPAN_KIND_SERVER, "{context}");
        let caller = trace
            .parent(server)
            .unwrap_or_else(|| panic!("write_txn_markers on {leader} has no parent:\n{context}"));
        assert_eq!(caller.name, "marker_write", "{context}");
        assert_eq!(caller.kind, SPAN_KIND_CLIENT, "{context}");
        assert_eq!(caller.node_id, Some(coordinator), "{context}");
        assert_eq!(
            caller.attribute("leader"),
            Some(leader.to_string().as_str())
        );
        // The leader's append of the marker and its wait for the ISR.
        for child in ["append", "replication_wait"] {
            assert!(
                trace
                    .named(child)
                    .iter()
                    .any(|s| s.node_id == Some(leader) && trace.descends_from(s, server)),
                "no {child} under write_txn_markers on node {leader}:\n{context}"
            );
        }
    }
    // Every leader's marker append is in the trace: the coordinator's own
    // partition too, if it leads one.
    let appended: BTreeSet<String> = trace
        .named("append")
        .iter()
        .filter(|s| s.attribute("topic") == Some(topic.as_str()))
        .filter_map(|s| s.attribute("partition").map(str::to_string))
        .collect();
    assert_eq!(
        appended.len(),
        3,
        "a marker append per partition:\n{context}"
    );
    assert!(trace.nodes().len() >= 2, "{context}");
    assert!(trace.nodes().contains(&coordinator));

    // The produce requests are traces of their own, with the producer's fields.
    let produce = spans
        .iter()
        .find(|s| s.name == "Produce" && s.attribute("transactional_id") == Some(&transactional_id))
        .expect("a Produce span with the transactional id");
    assert!(produce.parent_span_id.is_empty());
    assert_ne!(produce.trace_id, end_txn.trace_id);
}

#[test]
fn an_otlp_endpoint_that_is_not_http_stops_the_broker_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = run_cli(
        &samsa_bin(),
        &[
            "server".into(),
            "--data-dir".into(),
            dir.path().display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--set".into(),
            "otlp_endpoint=grpc://collector:4317".into(),
        ],
        Duration::from_secs(30),
    );
    assert!(!output.status.success(), "{output:?}");
    assert!(
        output.stderr.contains("otlp_endpoint") && output.stderr.contains("http://"),
        "{output:?}"
    );

    let output = run_cli(
        &samsa_bin(),
        &[
            "server".into(),
            "--data-dir".into(),
            dir.path().display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--set".into(),
            "otlp_endpoint=http://127.0.0.1:4317".into(),
            "--set".into(),
            "trace_sample_ratio=1.5".into(),
        ],
        Duration::from_secs(30),
    );
    assert!(!output.status.success(), "{output:?}");
    assert!(output.stderr.contains("trace_sample_ratio"), "{output:?}");
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
