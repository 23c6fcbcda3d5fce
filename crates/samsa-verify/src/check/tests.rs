//! Synthetic histories: a clean one, and one per anomaly kind, each
//! detected with the right count.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::history::{
    Compaction, FinalPartition, GroupInfo, PartitionOffset, TopicInfo, TopicPartition,
};

const DATA: &str = "t-data";
const TXN: &str = "t-txn";
const QUEUE: &str = "t-queue";
const PIN: &str = "t-pin";
const POUT: &str = "t-pout";
const COMPACT: &str = "t-compact";
/// The compacted topic's settings in these histories.
const MAX_LAG: i64 = 5_000;
const DELETE_RETENTION: i64 = 5_000;
const GRACE: i64 = 2_000;

/// A history under construction; time advances by 1 ms per event.
struct H {
    events: Vec<Event>,
    now: i64,
    commit_id: u64,
}

impl H {
    fn new() -> H {
        let topic = |topic: &str, workload, role| TopicInfo {
            topic: topic.into(),
            workload,
            role,
            partitions: 2,
            compaction: None,
        };
        let mut h = H {
            events: Vec::new(),
            now: 1_000,
            commit_id: 0,
        };
        h.push(EventKind::RunStarted {
            seed: 1,
            bootstrap: "b".into(),
            workloads: Workload::ALL.to_vec(),
            topics: vec![
                topic(DATA, Workload::Idempotent, TopicRole::Data),
                topic(TXN, Workload::Txn, TopicRole::Data),
                topic(QUEUE, Workload::Queue, TopicRole::Data),
                topic(PIN, Workload::Pipeline, TopicRole::PipelineInput),
                topic(POUT, Workload::Pipeline, TopicRole::PipelineOutput),
                TopicInfo {
                    compaction: Some(Compaction {
                        max_lag_ms: Some(MAX_LAG),
                        delete_retention_ms: Some(DELETE_RETENTION),
                        grace_ms: GRACE,
                    }),
                    ..topic(COMPACT, Workload::Compact, TopicRole::Data)
                },
            ],
            groups: vec![
                GroupInfo {
                    group: "gq".into(),
                    workload: Workload::Queue,
                    input_topic: QUEUE.into(),
                },
                GroupInfo {
                    group: "gp".into(),
                    workload: Workload::Pipeline,
                    input_topic: PIN.into(),
                },
            ],
        });
        h
    }

    fn push(&mut self, kind: EventKind) -> &mut H {
        self.now += 1;
        self.events.push(Event {
            time_ms: self.now,
            kind,
        });
        self
    }

    fn send(&mut self, w: Workload, topic: &str, p: i32, value: &str, txn: Option<&str>) {
        self.push(EventKind::Send {
            workload: w,
            producer: "p".into(),
            value: value.into(),
            topic: topic.into(),
            partition: p,
            txn: txn.map(str::to_string),
            key: None,
            tombstone: false,
        });
    }

    /// A failed delivery of idempotent producer "p"'s `value`.
    fn failed(&mut self, topic: &str, p: i32, value: &str, error: &str) {
        self.push(EventKind::AckFailed {
            workload: Workload::Idempotent,
            producer: "p".into(),
            value: value.into(),
            topic: topic.into(),
            partition: p,
            txn: None,
            error: error.into(),
        });
    }

    fn ack(
        &mut self,
        w: Workload,
        topic: &str,
        p: i32,
        offset: i64,
        value: &str,
        txn: Option<&str>,
    ) {
        self.push(EventKind::Ack {
            workload: w,
            producer: "p".into(),
            value: value.into(),
            topic: topic.into(),
            partition: p,
            offset,
            txn: txn.map(str::to_string),
        });
    }

    /// An idempotent send acknowledged at `offset`.
    fn acked(&mut self, topic: &str, p: i32, offset: i64, value: &str) {
        self.send(Workload::Idempotent, topic, p, value, None);
        self.ack(Workload::Idempotent, topic, p, offset, value, None);
    }

    fn txn(&mut self, id: &str, records: &[(i32, &str)]) {
        self.push(EventKind::TxnBegin {
            workload: Workload::Txn,
            producer: "p".into(),
            txn: id.into(),
        });
        for (p, v) in records {
            self.send(Workload::Txn, TXN, *p, v, Some(id));
        }
    }

    fn commit_issued(&mut self, id: &str) {
        self.push(EventKind::TxnCommitIssued {
            workload: Workload::Txn,
            txn: id.into(),
        });
    }

    fn committed(&mut self, id: &str) {
        self.commit_issued(id);
        self.push(EventKind::TxnCommitted {
            workload: Workload::Txn,
            txn: id.into(),
        });
    }

    fn aborted(&mut self, id: &str, intentional: bool) {
        self.push(EventKind::TxnAborted {
            workload: Workload::Txn,
            txn: id.into(),
            intentional,
        });
    }

    fn poll(&mut self, w: Workload, consumer: &str, topic: &str, p: i32, offset: i64, value: &str) {
        self.push(EventKind::Poll {
            workload: w,
            consumer: consumer.into(),
            topic: topic.into(),
            partition: p,
            offset,
            value: value.into(),
        });
    }

    fn assigned(&mut self, w: Workload, consumer: &str, group: &str, topic: &str, ps: &[i32]) {
        self.push(EventKind::Assigned {
            workload: w,
            consumer: consumer.into(),
            group: group.into(),
            partitions: ps
                .iter()
                .map(|p| TopicPartition {
                    topic: topic.into(),
                    partition: *p,
                })
                .collect(),
        });
    }

    /// A queue offset commit, acknowledged.
    fn queue_commit(&mut self, consumer: &str, p: i32, offset: i64) {
        self.commit_id += 1;
        let commit = self.commit_id;
        self.push(EventKind::OffsetCommitIssued {
            workload: Workload::Queue,
            consumer: consumer.into(),
            group: "gq".into(),
            commit,
            offsets: vec![PartitionOffset {
                topic: QUEUE.into(),
                partition: p,
                offset,
            }],
        });
        self.push(EventKind::OffsetCommitted {
            workload: Workload::Queue,
            consumer: consumer.into(),
            group: "gq".into(),
            commit,
        });
    }

    fn final_read(&mut self, isolation: Isolation, topic: &str, records: &[(i32, i64, &str)]) {
        for (p, o, v) in records {
            self.push(EventKind::FinalRead {
                isolation,
                topic: topic.into(),
                partition: *p,
                offset: *o,
                value: (*v).into(),
                key: None,
                tombstone: false,
            });
        }
    }

    /// Both final reads of `topic` done; every partition complete.
    fn final_done(&mut self, topic: &str) {
        for isolation in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
            self.push(EventKind::FinalReadDone {
                isolation,
                topic: topic.into(),
                partitions: (0..2)
                    .map(|p| FinalPartition {
                        partition: p,
                        end_offset: 100,
                        complete: true,
                    })
                    .collect(),
                started_ms: Some(self.now),
            });
        }
    }

    fn check(&self) -> Findings {
        check(&self.events)
    }
}

/// A run of every workload with nothing wrong.
fn clean() -> H {
    let mut h = H::new();
    // Idempotent: two acked records, one failed delivery that never landed.
    h.acked(DATA, 0, 0, "i-1");
    h.acked(DATA, 1, 0, "i-2");
    h.send(Workload::Idempotent, DATA, 0, "i-3", None);
    h.failed(DATA, 0, "i-3", "timed out");
    // Txn: a committed one across two partitions, one aborted on purpose,
    // one with an unknown outcome that did commit.
    h.txn("x1", &[(0, "x1-a"), (1, "x1-b")]);
    h.ack(Workload::Txn, TXN, 0, 0, "x1-a", Some("x1"));
    h.ack(Workload::Txn, TXN, 1, 0, "x1-b", Some("x1"));
    h.committed("x1");
    h.txn("x2", &[(0, "x2-a"), (1, "x2-b")]);
    h.aborted("x2", true);
    h.txn("x3", &[(0, "x3-a"), (1, "x3-b")]);
    h.commit_issued("x3");
    h.push(EventKind::TxnCommitFailed {
        workload: Workload::Txn,
        txn: "x3".into(),
        error: "timed out".into(),
    });
    // Queue: two records polled, then committed.
    h.acked(QUEUE, 0, 0, "q-1");
    h.acked(QUEUE, 0, 1, "q-2");
    h.assigned(Workload::Queue, "c1", "gq", QUEUE, &[0, 1]);
    h.poll(Workload::Queue, "c1", QUEUE, 0, 0, "q-1");
    h.poll(Workload::Queue, "c1", QUEUE, 0, 1, "q-2");
    h.queue_commit("c1", 0, 2);
    // Pipeline: one input, processed in a committed transaction.
    h.acked(PIN, 0, 0, "pin-1");
    h.assigned(Workload::Pipeline, "w1", "gp", PIN, &[0, 1]);
    h.poll(Workload::Pipeline, "w1", PIN, 0, 0, "pin-1");
    h.push(EventKind::TxnBegin {
        workload: Workload::Pipeline,
        producer: "w1".into(),
        txn: "w1-t1".into(),
    });
    h.send(Workload::Pipeline, POUT, 0, "pin-1@w1#w1-t1", Some("w1-t1"));
    h.push(EventKind::TxnOffsets {
        workload: Workload::Pipeline,
        txn: "w1-t1".into(),
        group: "gp".into(),
        offsets: vec![PartitionOffset {
            topic: PIN.into(),
            partition: 0,
            offset: 1,
        }],
    });
    h.committed("w1-t1");
    h.push(EventKind::ProducingStopped {});
    h.push(EventKind::Drained {
        complete: true,
        detail: String::new(),
    });
    for isolation in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        h.final_read(isolation, DATA, &[(0, 0, "i-1"), (1, 0, "i-2")]);
        h.final_read(isolation, QUEUE, &[(0, 0, "q-1"), (0, 1, "q-2")]);
        h.final_read(isolation, PIN, &[(0, 0, "pin-1")]);
        h.final_read(isolation, POUT, &[(0, 0, "pin-1@w1#w1-t1")]);
    }
    // x3 (unknown) committed: all of it is there, as is x1.
    h.final_read(
        Isolation::ReadCommitted,
        TXN,
        &[
            (0, 0, "x1-a"),
            (1, 0, "x1-b"),
            (0, 3, "x3-a"),
            (1, 3, "x3-b"),
        ],
    );
    h.final_read(
        Isolation::ReadUncommitted,
        TXN,
        &[
            (0, 0, "x1-a"),
            (1, 0, "x1-b"),
            (0, 1, "x2-a"),
            (1, 1, "x2-b"),
            (0, 3, "x3-a"),
            (1, 3, "x3-b"),
        ],
    );
    for topic in [DATA, TXN, QUEUE, PIN, POUT] {
        h.final_done(topic);
    }
    h.push(EventKind::RunEnded {});
    h
}

fn only(f: &Findings, kind: AnomalyKind, count: usize) {
    assert_eq!(f.count(kind), count, "{kind:?} in {f:#?}");
    let others: Vec<&Finding> = f.anomalies.iter().filter(|a| a.kind != kind).collect();
    assert!(others.is_empty(), "only {kind:?} expected: {others:#?}");
    let finding = f.anomalies.iter().find(|a| a.kind == kind);
    assert!(finding.is_some_and(|a| !a.examples.is_empty()));
}

/// `clean()` with the final read_committed entries of `values` removed.
fn without_committed_reads(mut h: H, values: &[&str]) -> H {
    h.events.retain(|e| {
        !matches!(&e.kind, EventKind::FinalRead { isolation: Isolation::ReadCommitted, value, .. }
            if values.contains(&value.as_str()))
    });
    h
}

#[test]
fn a_clean_history_has_no_anomalies() {
    let f = clean().check();
    assert!(f.anomalies.is_empty(), "{f:#?}");
    assert!(f.unchecked.is_empty());
    assert!(f.drained);
    assert_eq!(
        f.txns,
        TxnCounts {
            committed: 2,
            aborted: 1,
            unknown: 1,
            never_committed: 0
        }
    );
}

#[test]
fn an_unknown_outcome_may_also_be_all_absent() {
    let h = without_committed_reads(clean(), &["x3-a", "x3-b"]);
    assert!(h.check().anomalies.is_empty());
}

#[test]
fn lost_acknowledged_records() {
    let f = without_committed_reads(clean(), &["i-1", "q-2"]).check();
    only(&f, AnomalyKind::Lost, 2);
}

#[test]
fn lost_committed_transaction() {
    let f = without_committed_reads(clean(), &["x1-a", "x1-b"]).check();
    only(&f, AnomalyKind::Lost, 2);
}

#[test]
fn nothing_is_missing_from_an_incomplete_partition() {
    let mut h = without_committed_reads(clean(), &["i-1"]);
    for e in &mut h.events {
        if let EventKind::FinalReadDone {
            isolation: Isolation::ReadCommitted,
            topic,
            partitions,
            ..
        } = &mut e.kind
        {
            if topic == DATA {
                partitions[0].complete = false;
            }
        }
    }
    let f = h.check();
    assert!(f.anomalies.is_empty(), "{f:#?}");
    assert_eq!(f.unchecked.len(), 1);
}

#[test]
fn duplicates_in_the_final_read() {
    let mut h = clean();
    // i-2 written twice (a retry the idempotent producer should have caught),
    // the failed i-3 present twice too.
    h.final_read(
        Isolation::ReadCommitted,
        DATA,
        &[(1, 1, "i-2"), (0, 5, "i-3"), (0, 6, "i-3")],
    );
    let f = h.check();
    only(&f, AnomalyKind::Duplicate, 2);
}

#[test]
fn a_duplicate_of_a_producer_that_timed_out_records_names_the_epoch_bump() {
    let mut h = clean();
    h.final_read(Isolation::ReadCommitted, DATA, &[(1, 1, "i-2")]);
    let f = h.check();
    only(&f, AnomalyKind::Duplicate, 1);
    assert!(!f.anomalies[0].examples[0].contains("epoch"), "{f:#?}");
    // librdkafka's own wording for a record whose message timeout expired.
    h.send(Workload::Idempotent, DATA, 1, "i-9", None);
    h.failed(
        DATA,
        1,
        "i-9",
        "Message production error: MessageTimedOut (Local: Message timed out)",
    );
    let f = h.check();
    only(&f, AnomalyKind::Duplicate, 1);
    assert!(
        f.anomalies[0].examples[0].contains("1 message timeouts: librdkafka bumps the epoch"),
        "{f:#?}"
    );
}

#[test]
fn a_failed_delivery_may_be_present_once() {
    let mut h = clean();
    h.final_read(Isolation::ReadCommitted, DATA, &[(0, 5, "i-3")]);
    assert!(h.check().anomalies.is_empty());
}

#[test]
fn offset_conflicts_between_ack_poll_and_reads() {
    let mut h = clean();
    // Acknowledged at DATA[0]@0 as i-1; the uncommitted read says otherwise.
    h.send(Workload::Idempotent, DATA, 0, "other", None);
    h.send(Workload::Queue, QUEUE, 0, "q-x", None);
    h.final_read(Isolation::ReadUncommitted, DATA, &[(0, 0, "other")]);
    // A poll saw something else at QUEUE[0]@1 than the final read.
    h.poll(Workload::Queue, "c2", QUEUE, 0, 1, "q-x");
    let f = h.check();
    only(&f, AnomalyKind::OffsetConflict, 2);
}

#[test]
fn an_ack_without_an_offset_counts_for_lost_and_duplicates_only() {
    // librdkafka acknowledges records implicitly, with offset -1001, when a
    // later batch's success shows they were written although their own
    // answer was lost. Two such records read once each: nothing wrong.
    let mut h = clean();
    h.acked(DATA, 1, -1001, "i-4");
    h.acked(DATA, 0, -1001, "i-5");
    for isolation in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        h.final_read(isolation, DATA, &[(1, 1, "i-4"), (0, 1, "i-5")]);
    }
    let f = h.check();
    assert!(f.anomalies.is_empty(), "{f:#?}");
    // One that is not there is still lost.
    h.acked(DATA, 1, -1001, "i-6");
    only(&h.check(), AnomalyKind::Lost, 1);
}

#[test]
fn aborted_reads_in_polls_and_the_final_read() {
    let mut h = clean();
    h.final_read(
        Isolation::ReadCommitted,
        TXN,
        &[(0, 1, "x2-a"), (1, 1, "x2-b")],
    );
    h.poll(Workload::Queue, "c1", TXN, 0, 1, "x2-a");
    let f = h.check();
    only(&f, AnomalyKind::AbortedRead, 3);
    assert!(f.anomalies[0].examples[0].contains("aborted on purpose"));
}

#[test]
fn reads_before_the_commit_was_issued() {
    let mut h = H::new();
    h.txn("x1", &[(0, "x1-a")]);
    h.poll(Workload::Txn, "c1", TXN, 0, 0, "x1-a");
    h.committed("x1");
    // A transaction that never issued a commit, seen in the final read.
    h.txn("x2", &[(1, "x2-a")]);
    h.final_read(
        Isolation::ReadCommitted,
        TXN,
        &[(0, 0, "x1-a"), (1, 0, "x2-a")],
    );
    h.final_done(TXN);
    let f = h.check();
    only(&f, AnomalyKind::ReadBeforeCommit, 2);
}

#[test]
fn torn_transactions_committed_or_unknown() {
    let f = without_committed_reads(clean(), &["x1-b", "x3-a"]).check();
    only(&f, AnomalyKind::TornTransaction, 2);
}

#[test]
fn polls_going_backwards_within_an_assignment() {
    let mut h = clean();
    // Repeats q-2's offset: backwards. After a re-assignment it is fine.
    h.poll(Workload::Queue, "c1", QUEUE, 0, 1, "q-2");
    h.assigned(Workload::Queue, "c1", "gq", QUEUE, &[0]);
    h.poll(Workload::Queue, "c1", QUEUE, 0, 0, "q-1");
    h.poll(Workload::Queue, "c1", QUEUE, 0, 1, "q-2");
    h.push(EventKind::Seek {
        workload: Workload::Queue,
        consumer: "c1".into(),
        topic: QUEUE.into(),
        partition: 0,
        offset: 0,
    });
    h.poll(Workload::Queue, "c1", QUEUE, 0, 0, "q-1");
    h.poll(Workload::Queue, "c1", QUEUE, 0, 0, "q-1");
    let f = h.check();
    only(&f, AnomalyKind::PollBackwards, 2);
}

#[test]
fn a_queue_commit_past_unpolled_input() {
    let mut h = clean();
    // The final read has q-3 at offset 2, never polled; c1 commits 3.
    h.send(Workload::Queue, QUEUE, 0, "q-3", None);
    h.final_read(Isolation::ReadCommitted, QUEUE, &[(0, 2, "q-3")]);
    h.queue_commit("c1", 0, 3);
    let f = h.check();
    only(&f, AnomalyKind::CommitSkipsInput, 1);
}

#[test]
fn a_queue_commit_before_the_poll_skips_it() {
    let mut h = clean();
    h.send(Workload::Queue, QUEUE, 0, "q-3", None);
    h.final_read(Isolation::ReadCommitted, QUEUE, &[(0, 2, "q-3")]);
    h.queue_commit("c1", 0, 3);
    h.poll(Workload::Queue, "c1", QUEUE, 0, 2, "q-3");
    let f = h.check();
    only(&f, AnomalyKind::CommitSkipsInput, 1);
}

#[test]
fn a_pipeline_commit_past_input_without_output() {
    let mut h = clean();
    // pin-2 at offset 1 is in the input, the committed offset 2 passes it,
    // and its output is nowhere.
    h.send(Workload::Pipeline, PIN, 0, "pin-2", None);
    h.final_read(Isolation::ReadCommitted, PIN, &[(0, 1, "pin-2")]);
    h.push(EventKind::TxnBegin {
        workload: Workload::Pipeline,
        producer: "w1".into(),
        txn: "w1-t2".into(),
    });
    h.push(EventKind::TxnOffsets {
        workload: Workload::Pipeline,
        txn: "w1-t2".into(),
        group: "gp".into(),
        offsets: vec![PartitionOffset {
            topic: PIN.into(),
            partition: 0,
            offset: 2,
        }],
    });
    h.committed("w1-t2");
    let f = h.check();
    assert_eq!(f.count(AnomalyKind::CommitSkipsInput), 1, "{f:#?}");
    assert_eq!(f.count(AnomalyKind::Lost), 1, "{f:#?}");
    assert_eq!(f.anomalies.len(), 2, "{f:#?}");
}

#[test]
fn a_pipeline_input_with_two_outputs() {
    let mut h = clean();
    h.push(EventKind::TxnBegin {
        workload: Workload::Pipeline,
        producer: "w2".into(),
        txn: "w2-t1".into(),
    });
    h.send(Workload::Pipeline, POUT, 1, "pin-1@w2#w2-t1", Some("w2-t1"));
    h.committed("w2-t1");
    h.final_read(Isolation::ReadCommitted, POUT, &[(1, 0, "pin-1@w2#w2-t1")]);
    let f = h.check();
    only(&f, AnomalyKind::Duplicate, 1);
}

#[test]
fn committed_offsets_going_backwards() {
    let mut h = clean();
    // c1 committed 2 (acknowledged), then c2 commits 1.
    h.queue_commit("c2", 0, 1);
    let f = h.check();
    only(&f, AnomalyKind::CommitBackwards, 1);
}

#[test]
fn overlapping_commits_are_not_ordered() {
    let mut h = clean();
    // c2's commit of 1 was issued before c1's commit of 2 was acknowledged.
    h.commit_id += 1;
    let a = h.commit_id;
    h.commit_id += 1;
    let b = h.commit_id;
    let issue = |consumer: &str, commit, offset| EventKind::OffsetCommitIssued {
        workload: Workload::Queue,
        consumer: consumer.into(),
        group: "gq".into(),
        commit,
        offsets: vec![PartitionOffset {
            topic: QUEUE.into(),
            partition: 1,
            offset,
        }],
    };
    let done = |consumer: &str, commit| EventKind::OffsetCommitted {
        workload: Workload::Queue,
        consumer: consumer.into(),
        group: "gq".into(),
        commit,
    };
    h.push(issue("c1", a, 0));
    h.push(issue("c2", b, 0));
    h.push(done("c1", a));
    h.push(done("c2", b));
    assert!(h.check().anomalies.is_empty());
}

#[test]
fn pipeline_commits_going_backwards() {
    let mut h = clean();
    h.push(EventKind::TxnBegin {
        workload: Workload::Pipeline,
        producer: "w2".into(),
        txn: "w2-t1".into(),
    });
    h.push(EventKind::TxnOffsets {
        workload: Workload::Pipeline,
        txn: "w2-t1".into(),
        group: "gp".into(),
        offsets: vec![PartitionOffset {
            topic: PIN.into(),
            partition: 0,
            offset: 0,
        }],
    });
    h.committed("w2-t1");
    let f = h.check();
    only(&f, AnomalyKind::CommitBackwards, 1);
}

#[test]
fn records_of_one_producer_out_of_send_order() {
    let mut h = H::new();
    h.acked(DATA, 0, 1, "i-1");
    h.acked(DATA, 0, 0, "i-2");
    h.acked(DATA, 0, 2, "i-3");
    // Another partition's order is its own.
    h.acked(DATA, 1, 0, "i-4");
    h.final_read(
        Isolation::ReadCommitted,
        DATA,
        &[(0, 0, "i-2"), (0, 1, "i-1"), (0, 2, "i-3"), (1, 0, "i-4")],
    );
    h.final_done(DATA);
    let f = h.check();
    only(&f, AnomalyKind::Reordered, 1);
}

#[test]
fn values_nobody_sent() {
    let mut h = clean();
    h.final_read(Isolation::ReadUncommitted, DATA, &[(0, 9, "from-nowhere")]);
    h.poll(Workload::Queue, "c1", QUEUE, 1, 5, "from-nowhere-too");
    let f = h.check();
    only(&f, AnomalyKind::UnknownValue, 2);
}

#[test]
fn a_record_read_elsewhere_than_acknowledged() {
    let mut h = clean();
    // i-2 was acknowledged at DATA[1]@0; the reads have it at @4 instead.
    for e in &mut h.events {
        if let EventKind::FinalRead { value, offset, .. } = &mut e.kind {
            if value == "i-2" {
                *offset = 4;
            }
        }
    }
    let f = h.check();
    only(&f, AnomalyKind::OffsetConflict, 1);
}

// ---------------------------------------------------------------------
// Compacted topics.

/// How a transaction of the compact workload ended.
#[derive(Clone, Copy)]
enum End {
    Committed,
    Aborted,
    CommitFailed,
}

/// A step of the compact workload: at `t` ms, an idempotent write or a
/// transaction of keyed records (key, value, tombstone).
enum Op {
    W(i64, &'static str, &'static str, bool),
    Txn(
        i64,
        &'static str,
        Vec<(&'static str, &'static str, bool)>,
        End,
    ),
    /// A failed delivery (no acknowledgement).
    Failed(i64, &'static str, &'static str, bool),
}

impl Op {
    fn time(&self) -> i64 {
        match self {
            Op::W(t, ..) | Op::Txn(t, ..) | Op::Failed(t, ..) => *t,
        }
    }
}

/// A compacted history: every record on partition 0, offsets in time
/// order. Two writes of `a` (one tombstone of `b` after a value), a
/// committed transaction writing `a` last and an aborted one after it,
/// `c` written every second from 4 s to 30 s (c-0 … c-26: the appends that
/// roll segments), a tombstone of `d` at 20.5 s, `e` written at 24 s and
/// deleted at 29 s. With a max lag of 5 s and a grace of 2 s, what was
/// superseded before about 23 s is due by 60 s; the tombstone of `b` too
/// (due by 22.5 s), not those of `d` and `e` (no append late enough).
fn compact_ops() -> Vec<Op> {
    let mut ops = vec![
        Op::W(1_000, "a", "a-1", false),
        Op::W(1_100, "b", "b-1", false),
        Op::W(2_000, "a", "a-2", false),
        Op::W(2_100, "b", "b-2", true),
        Op::Txn(3_000, "x1", vec![("a", "x1-a", false)], End::Committed),
        Op::Txn(3_100, "x2", vec![("a", "x2-a", false)], End::Aborted),
        Op::W(20_500, "d", "d-1", true),
        Op::W(24_000, "e", "e-1", false),
        Op::W(29_000, "e", "e-2", true),
    ];
    for (i, value) in C_VALUES.iter().enumerate() {
        ops.push(Op::W(4_000 + 1_000 * i as i64, "c", value, false));
    }
    ops
}

const C_VALUES: [&str; 27] = [
    "c-0", "c-1", "c-2", "c-3", "c-4", "c-5", "c-6", "c-7", "c-8", "c-9", "c-10", "c-11", "c-12",
    "c-13", "c-14", "c-15", "c-16", "c-17", "c-18", "c-19", "c-20", "c-21", "c-22", "c-23", "c-24",
    "c-25", "c-26",
];

/// What a legitimately compacted final read of [`compact_ops`] holds: the
/// latest of every key, c-25 (superseded, not yet due), the tombstone of
/// `d` (not yet due) and both records of `e` (not yet due).
const COMPACT_READ: [&str; 6] = ["x1-a", "c-25", "c-26", "d-1", "e-1", "e-2"];

/// (offset, key, tombstone) of every record written.
type Placed = HashMap<&'static str, (i64, &'static str, bool)>;

/// `ops` as a history, then both final reads of `read` beginning at 60 s.
fn compacted(mut ops: Vec<Op>, read: &[&str]) -> (H, Placed) {
    ops.sort_by_key(Op::time);
    let mut h = H::new();
    let mut placed = Placed::new();
    let mut offset = 0;
    let send = |h: &mut H, key: &str, value: &str, tombstone: bool, txn: Option<&str>| {
        h.push(EventKind::Send {
            workload: Workload::Compact,
            producer: if txn.is_some() { "ct" } else { "cp" }.into(),
            value: value.into(),
            topic: COMPACT.into(),
            partition: 0,
            txn: txn.map(str::to_string),
            key: Some(key.into()),
            tombstone,
        });
    };
    for op in &ops {
        h.now = op.time();
        match op {
            Op::W(_, key, value, tombstone) => {
                send(&mut h, key, value, *tombstone, None);
                h.ack(Workload::Compact, COMPACT, 0, offset, value, None);
                placed.insert(value, (offset, key, *tombstone));
                offset += 1;
            }
            Op::Failed(_, key, value, tombstone) => {
                send(&mut h, key, value, *tombstone, None);
                h.push(EventKind::AckFailed {
                    workload: Workload::Compact,
                    producer: "cp".into(),
                    value: value.to_string(),
                    topic: COMPACT.into(),
                    partition: 0,
                    txn: None,
                    error: "timed out".into(),
                });
            }
            Op::Txn(_, id, records, end) => {
                h.push(EventKind::TxnBegin {
                    workload: Workload::Compact,
                    producer: "ct".into(),
                    txn: id.to_string(),
                });
                for (key, value, tombstone) in records {
                    send(&mut h, key, value, *tombstone, Some(id));
                    h.ack(Workload::Compact, COMPACT, 0, offset, value, Some(id));
                    placed.insert(value, (offset, key, *tombstone));
                    offset += 1;
                }
                match end {
                    End::Committed => h.committed(id),
                    End::Aborted => h.aborted(id, true),
                    End::CommitFailed => {
                        h.commit_issued(id);
                        h.push(EventKind::TxnCommitFailed {
                            workload: Workload::Compact,
                            txn: id.to_string(),
                            error: "timed out".into(),
                        });
                    }
                }
                // The transaction's marker.
                offset += 1;
            }
        }
    }
    h.now = 59_000;
    h.push(EventKind::ProducingStopped {});
    h.push(EventKind::Drained {
        complete: true,
        detail: String::new(),
    });
    h.now = 60_000;
    for isolation in [Isolation::ReadCommitted, Isolation::ReadUncommitted] {
        for value in read {
            let (offset, key, tombstone) = placed[value];
            h.push(EventKind::FinalRead {
                isolation,
                topic: COMPACT.into(),
                partition: 0,
                offset,
                value: value.to_string(),
                key: Some(key.into()),
                tombstone,
            });
        }
    }
    h.now = 60_000;
    h.final_done(COMPACT);
    (h, placed)
}

fn compacted_read_with(extra: &[&'static str]) -> Vec<&'static str> {
    COMPACT_READ.iter().chain(extra).copied().collect()
}

fn compacted_read_without(gone: &[&str]) -> Vec<&'static str> {
    COMPACT_READ
        .iter()
        .filter(|v| !gone.contains(v))
        .copied()
        .collect()
}

/// The final read_committed read's record of `value` moved to `offset`.
fn read_at_offset(h: &mut H, value: &str, to: i64) {
    for e in &mut h.events {
        if let EventKind::FinalRead {
            value: v, offset, ..
        } = &mut e.kind
        {
            if v == value {
                *offset = to;
            }
        }
    }
}

#[test]
fn a_legitimately_compacted_topic_has_no_anomalies() {
    let (h, _) = compacted(compact_ops(), &COMPACT_READ);
    let f = h.check();
    assert!(f.anomalies.is_empty(), "{f:#?}");
    let stats = f.compacted.iter().find(|t| t.topic == COMPACT).unwrap();
    assert_eq!(
        *stats,
        CompactedTopic {
            topic: COMPACT.into(),
            keys: 5,
            // 35 writes in the log (x2-a was aborted).
            writes: 35,
            tombstones: 3,
            read: 6,
            tombstones_read: 2,
            superseded_read: 2,
            // a-1, a-2, b-1, b-2 and c-0 … c-19.
            due_for_removal: 24,
        }
    );
    // Superseded records not yet due may all still be there; tombstones
    // not yet due may go early, with what they delete.
    let mut all: Vec<&str> = vec!["x1-a", "d-1", "e-1", "e-2"];
    all.extend(&C_VALUES[20..]);
    let (h, _) = compacted(compact_ops(), &all);
    assert!(h.check().anomalies.is_empty());
    let (h, _) = compacted(
        compact_ops(),
        &compacted_read_without(&["d-1", "e-1", "e-2"]),
    );
    assert!(h.check().anomalies.is_empty());
}

#[test]
fn the_latest_write_of_a_key_must_stay() {
    // x1-a (committed) is the latest of `a`: the aborted x2-a after it
    // does not replace it.
    let (h, _) = compacted(compact_ops(), &compacted_read_without(&["x1-a"]));
    let f = h.check();
    only(&f, AnomalyKind::CompactedLatestMissing, 1);
    assert!(f.anomalies[0].examples[0].contains("x1-a"), "{f:#?}");
    // The latest idempotent write too.
    let (h, _) = compacted(compact_ops(), &compacted_read_without(&["c-26"]));
    only(&h.check(), AnomalyKind::CompactedLatestMissing, 1);
}

#[test]
fn a_later_tombstone_that_may_have_landed_excuses_the_latest() {
    // A tombstone of `a` whose delivery failed may be in the log after
    // x1-a, and gone since: x1-a may be gone.
    let mut ops = compact_ops();
    ops.push(Op::Failed(3_500, "a", "a-9", true));
    let (h, _) = compacted(ops, &compacted_read_without(&["x1-a"]));
    let f = h.check();
    assert!(f.anomalies.is_empty(), "{f:#?}");
}

#[test]
fn an_unknown_outcome_seen_in_part_counts_as_committed() {
    let mut ops = compact_ops();
    ops.push(Op::Txn(
        3_200,
        "x3",
        vec![("f", "x3-f", false), ("g", "x3-g", false)],
        End::CommitFailed,
    ));
    // None of it: fine (it may have been aborted).
    let (h, _) = compacted(ops, &COMPACT_READ);
    assert!(h.check().anomalies.is_empty());
    let mut ops = compact_ops();
    ops.push(Op::Txn(
        3_200,
        "x3",
        vec![("f", "x3-f", false), ("g", "x3-g", false)],
        End::CommitFailed,
    ));
    // x3-f seen: x3 committed, and x3-g, the latest of `g`, is missing
    // (a compacted topic's transaction is judged by key, not as torn).
    let (h, _) = compacted(ops, &compacted_read_with(&["x3-f"]));
    let f = h.check();
    only(&f, AnomalyKind::CompactedLatestMissing, 1);
    assert!(f.anomalies[0].examples[0].contains("x3-g"), "{f:#?}");
}

#[test]
fn a_superseded_record_past_the_max_lag_is_overdue() {
    // a-1 was superseded by a-2 (acknowledged at 2 s); c-20 by c-21 too
    // late for the appends after it to roll its segment: not judged.
    let (h, _) = compacted(compact_ops(), &compacted_read_with(&["a-1", "c-20"]));
    let f = h.check();
    only(&f, AnomalyKind::CompactionOverdue, 1);
    assert!(f.anomalies[0].examples[0].contains("a-1"), "{f:#?}");
}

#[test]
fn overdue_is_judged_against_when_the_read_began() {
    // a-2 acknowledged at 2002 ms (events are 1 ms apart); the first record
    // sent after 7002 ms (c-4, at 8001 ms) was acknowledged at 8002 ms;
    // + 2 s grace: 10002 ms.
    let read_from = |started: i64| {
        let (mut h, _) = compacted(compact_ops(), &compacted_read_with(&["a-1"]));
        for e in &mut h.events {
            if let EventKind::FinalReadDone {
                topic, started_ms, ..
            } = &mut e.kind
            {
                if topic == COMPACT {
                    *started_ms = Some(started);
                }
            }
        }
        h.check()
    };
    assert!(read_from(10_001).anomalies.is_empty());
    only(&read_from(10_002), AnomalyKind::CompactionOverdue, 1);
}

#[test]
fn a_tombstone_past_its_delete_retention_is_overdue() {
    // b-2 (acknowledged at 2102 ms): rolled and cleaned by 10002 ms,
    // horizon 15002 ms, the next pass due by the append after 20002 ms
    // (d-1, acknowledged at 20502 ms) + 2 s.
    let (h, _) = compacted(compact_ops(), &compacted_read_with(&["b-2"]));
    let f = h.check();
    only(&f, AnomalyKind::TombstoneOverdue, 1);
    assert!(f.anomalies[0].examples[0].contains("b-2"), "{f:#?}");
}

#[test]
fn a_tombstone_stays_for_its_delete_retention() {
    // z-1 deletes `z` 1.5 s before the read ends: delete.retention.ms is 5 s.
    let with_z = || {
        let mut ops = compact_ops();
        ops.push(Op::W(58_500, "z", "z-1", true));
        ops
    };
    let (h, _) = compacted(with_z(), &compacted_read_with(&["z-1"]));
    assert!(h.check().anomalies.is_empty());
    let (h, _) = compacted(with_z(), &COMPACT_READ);
    let f = h.check();
    only(&f, AnomalyKind::TombstoneEarly, 1);
    assert!(f.anomalies[0].examples[0].contains("z-1"), "{f:#?}");
    // Replaced by a later write of `z` (which may itself go, being a
    // tombstone whose delivery failed), it may go at once.
    let mut ops = with_z();
    ops.push(Op::Failed(58_700, "z", "z-2", true));
    let (h, _) = compacted(ops, &COMPACT_READ);
    assert!(h.check().anomalies.is_empty());
}

#[test]
fn a_deleted_key_must_not_come_back() {
    // e-2 deleted `e` (not due yet, so it may go), but e-1 is still there.
    let (h, _) = compacted(compact_ops(), &compacted_read_without(&["e-2"]));
    let f = h.check();
    only(&f, AnomalyKind::Resurrected, 1);
    assert!(f.anomalies[0].examples[0].contains("e-1"), "{f:#?}");
}

#[test]
fn value_checks_run_on_compacted_topics() {
    // The aborted x2-a in the read_committed read.
    let (mut h, placed) = compacted(compact_ops(), &COMPACT_READ);
    h.push(EventKind::FinalRead {
        isolation: Isolation::ReadCommitted,
        topic: COMPACT.into(),
        partition: 0,
        offset: placed["x2-a"].0,
        value: "x2-a".into(),
        key: Some("a".into()),
        tombstone: false,
    });
    only(&h.check(), AnomalyKind::AbortedRead, 1);
    // A record read at another offset than its acknowledgement's (where
    // its transaction's marker is).
    let (mut h, placed) = compacted(compact_ops(), &COMPACT_READ);
    read_at_offset(&mut h, "x1-a", placed["x1-a"].0 + 1);
    only(&h.check(), AnomalyKind::OffsetConflict, 1);
    // A value read as a tombstone it was not sent as.
    let (mut h, _) = compacted(compact_ops(), &COMPACT_READ);
    for e in &mut h.events {
        if let EventKind::FinalRead {
            isolation: Isolation::ReadCommitted,
            value,
            tombstone,
            ..
        } = &mut e.kind
        {
            if value == "c-26" {
                *tombstone = true;
            }
        }
    }
    only(&h.check(), AnomalyKind::UnknownValue, 1);
}

#[test]
fn a_write_acknowledged_without_an_offset_is_judged_by_its_key() {
    let without_offsets = |h: &mut H, values: &[&str]| {
        for e in &mut h.events {
            if let EventKind::Ack { value, offset, .. } = &mut e.kind {
                if values.contains(&value.as_str()) {
                    *offset = -1001;
                }
            }
        }
    };
    // c-26 is found where the read has it; h-1 (the only write of `h`)
    // is nowhere, and nothing of its key could have replaced it.
    let mut ops = compact_ops();
    ops.push(Op::W(3_300, "h", "h-1", false));
    let (mut h, _) = compacted(ops, &COMPACT_READ);
    without_offsets(&mut h, &["c-26", "h-1"]);
    let f = h.check();
    only(&f, AnomalyKind::CompactedLatestMissing, 1);
    assert!(f.anomalies[0].examples[0].contains("h-1"), "{f:#?}");
    // A later h-2 in the read may have replaced it.
    let mut ops = compact_ops();
    ops.push(Op::W(3_300, "h", "h-1", false));
    ops.push(Op::W(3_400, "h", "h-2", false));
    let (mut h, _) = compacted(ops, &compacted_read_with(&["h-2"]));
    without_offsets(&mut h, &["h-1"]);
    assert!(h.check().anomalies.is_empty());
}
