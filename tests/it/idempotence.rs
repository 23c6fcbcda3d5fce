//! Idempotent produce at the protocol level: hand-built batches with chosen
//! producer id, epoch and sequence numbers.

use bytes::Bytes;
use samsa_tests::client::KafkaClient;
use samsa_tests::codes::{INVALID_PRODUCER_EPOCH, NONE, OUT_OF_ORDER_SEQUENCE_NUMBER};
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

const ACKS_ALL: i16 = -1;

fn values(c: &mut KafkaClient, topic: &str) -> Vec<(i64, String)> {
    c.fetch_all(topic, 0, 0)
        .unwrap()
        .into_iter()
        .map(|r| {
            let v = r.value.unwrap_or_default();
            (r.offset, String::from_utf8_lossy(&v).into_owned())
        })
        .collect()
}

fn expect(list: &[(i64, &str)]) -> Vec<(i64, String)> {
    list.iter().map(|(o, v)| (*o, v.to_string())).collect()
}

/// Produces and asserts error NONE and the given base offset.
fn produce_ok(c: &mut KafkaClient, topic: &str, batch: &Bytes, base: i64, what: &str) {
    let r = c.produce(topic, 0, batch.clone(), ACKS_ALL).unwrap();
    assert_eq!(
        (r.error_code, r.base_offset),
        (NONE, base),
        "{what}: expected error 0 at base offset {base}, got {r:?}"
    );
}

#[test]
fn duplicate_batch_is_stored_once_and_answered_with_first_offset() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("dup");
    c.create_topic(&t, 1).unwrap();

    // A plain batch first, so the idempotent one does not start at offset 0.
    let plain = BatchBuilder::new().values(["plain-0", "plain-1"]).build();
    produce_ok(&mut c, &t, &plain, 0, "plain batch");

    let pid = c.init_producer_id().unwrap();
    let (id, epoch) = (pid.producer_id.0, pid.producer_epoch);
    assert!(id >= 0, "producer id {id}");
    assert!(epoch >= 0, "producer epoch {epoch}");

    let b0 = BatchBuilder::idempotent(id, epoch, 0)
        .values(["a0", "a1", "a2"])
        .build();
    produce_ok(&mut c, &t, &b0, 2, "first send of b0");
    produce_ok(&mut c, &t, &b0, 2, "retry of b0 (must not append)");
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        5,
        "retry appended records"
    );

    let b1 = BatchBuilder::idempotent(id, epoch, 3)
        .values(["a3"])
        .build();
    produce_ok(&mut c, &t, &b1, 5, "b1 (next sequence)");
    // b0 is no longer the last batch but still among the last five.
    produce_ok(&mut c, &t, &b0, 2, "late retry of b0");
    produce_ok(&mut c, &t, &b1, 5, "retry of b1");

    // A second connection sees the same single copy.
    let mut c2 = node.client();
    assert_eq!(
        values(&mut c2, &t),
        expect(&[
            (0, "plain-0"),
            (1, "plain-1"),
            (2, "a0"),
            (3, "a1"),
            (4, "a2"),
            (5, "a3")
        ])
    );
}

#[test]
fn sequence_gap_is_out_of_order_sequence_number() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("gap");
    c.create_topic(&t, 1).unwrap();
    let pid = c.init_producer_id().unwrap();
    let (id, epoch) = (pid.producer_id.0, pid.producer_epoch);

    let b0 = BatchBuilder::idempotent(id, epoch, 0)
        .values(["g0", "g1", "g2"])
        .build();
    produce_ok(&mut c, &t, &b0, 0, "b0");

    // Next expected sequence is 3; 5 leaves a gap.
    let gap = BatchBuilder::idempotent(id, epoch, 5)
        .values(["gap"])
        .build();
    let r = c.produce(&t, 0, gap, ACKS_ALL).unwrap();
    assert_eq!(
        r.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER,
        "produce with sequence 5 after 0..=2: {r:?}"
    );
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        3,
        "rejected batch was appended"
    );

    // The producer can go on with the right sequence.
    let b1 = BatchBuilder::idempotent(id, epoch, 3)
        .values(["g3"])
        .build();
    produce_ok(&mut c, &t, &b1, 3, "b1 after the rejected gap");
    assert_eq!(
        values(&mut c, &t),
        expect(&[(0, "g0"), (1, "g1"), (2, "g2"), (3, "g3")])
    );
}

fn dedup_across_restart(kill: bool) {
    let mut node = SamsaNode::start();
    let t = unique_topic(if kill { "dupkill" } else { "dupterm" });
    let (id, epoch, b0, b1) = {
        let mut c = node.client();
        c.create_topic(&t, 1).unwrap();
        let pid = c.init_producer_id().unwrap();
        let (id, epoch) = (pid.producer_id.0, pid.producer_epoch);
        let b0 = BatchBuilder::idempotent(id, epoch, 0)
            .values(["x0", "x1"])
            .build();
        let b1 = BatchBuilder::idempotent(id, epoch, 2)
            .values(["x2"])
            .build();
        produce_ok(&mut c, &t, &b0, 0, "b0");
        produce_ok(&mut c, &t, &b1, 2, "b1");
        (id, epoch, b0, b1)
    };
    if kill {
        node.sigkill();
    } else {
        let status = node.sigterm_and_wait();
        assert!(status.success(), "clean shutdown exited with {status}");
    }
    node.restart();

    let mut c = node.client();
    produce_ok(&mut c, &t, &b1, 2, "retry of b1 after restart");
    produce_ok(&mut c, &t, &b0, 0, "retry of b0 after restart");
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        3,
        "a retry after restart appended"
    );
    let b2 = BatchBuilder::idempotent(id, epoch, 3)
        .values(["x3"])
        .build();
    produce_ok(&mut c, &t, &b2, 3, "b2 after restart");
    let gap = BatchBuilder::idempotent(id, epoch, 9)
        .values(["gap"])
        .build();
    let r = c.produce(&t, 0, gap, ACKS_ALL).unwrap();
    assert_eq!(
        r.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER,
        "gap after restart: {r:?}"
    );
    assert_eq!(
        values(&mut c, &t),
        expect(&[(0, "x0"), (1, "x1"), (2, "x2"), (3, "x3")])
    );
}

#[test]
fn dedup_survives_sigkill_restart() {
    dedup_across_restart(true);
}

#[test]
fn dedup_survives_sigterm_restart() {
    dedup_across_restart(false);
}

#[test]
fn stale_epoch_is_invalid_producer_epoch() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("epoch");
    c.create_topic(&t, 1).unwrap();
    let pid = c.init_producer_id().unwrap();
    let (id, epoch) = (pid.producer_id.0, pid.producer_epoch);

    // A second InitProducerId hands out a different id.
    let other = c.init_producer_id().unwrap();
    assert_ne!(other.producer_id.0, id, "producer ids must not be reused");

    // The producer bumps its epoch (as after KIP-360) and starts at sequence 0.
    let bumped = BatchBuilder::idempotent(id, epoch + 1, 0)
        .values(["new-0", "new-1"])
        .build();
    produce_ok(&mut c, &t, &bumped, 0, "batch at epoch+1");

    // The old epoch is fenced, whatever its sequence.
    for seq in [0, 2] {
        let stale = BatchBuilder::idempotent(id, epoch, seq)
            .values(["stale"])
            .build();
        let r = c.produce(&t, 0, stale, ACKS_ALL).unwrap();
        assert_eq!(
            r.error_code,
            INVALID_PRODUCER_EPOCH,
            "produce at old epoch {epoch} seq {seq} after epoch {}: {r:?}",
            epoch + 1
        );
    }
    assert_eq!(
        c.log_end_offset(&t, 0).unwrap(),
        2,
        "a fenced batch was appended"
    );

    // The current epoch goes on.
    let next = BatchBuilder::idempotent(id, epoch + 1, 2)
        .values(["new-2"])
        .build();
    produce_ok(&mut c, &t, &next, 2, "next batch at epoch+1");
    assert_eq!(
        values(&mut c, &t),
        expect(&[(0, "new-0"), (1, "new-1"), (2, "new-2")])
    );
}
