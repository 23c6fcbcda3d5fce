//! An idempotent librdkafka producer keeps sending while the broker is
//! SIGKILLed and restarted twice; afterwards every acknowledged record is
//! present exactly once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::Producer;
use samsa_tests::rdk::{
    acked_count, checking_producer, consume_to_end, idempotent_producer_config, send_checked,
};
use samsa_tests::{unique_topic, wait_until, EosChecker, SamsaNode};

const PARTITIONS: i32 = 2;
/// Acknowledgements to wait for between crashes.
const PROGRESS: u64 = 20_000;
/// Upper bound on sends, so the test stops by itself.
const MAX_SENDS: u64 = 2_000_000;

#[test]
fn idempotent_producer_across_two_sigkills_loses_and_duplicates_nothing() {
    let mut node = SamsaNode::start();
    let topic = unique_topic("chaos");
    node.client().create_topic(&topic, PARTITIONS).unwrap();

    let checker = EosChecker::shared();
    let producer = Arc::new(checking_producer(
        &idempotent_producer_config(&node.bootstrap()),
        checker.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let producer = producer.clone();
        let stop = stop.clone();
        let topic = topic.clone();
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && i < MAX_SENDS {
                send_checked(&producer, "p0", &topic, None, format!("c{i:08}").as_bytes())?;
                i += 1;
            }
            Ok(i)
        })
    };

    for round in 1..=2 {
        let target = acked_count(&producer) + PROGRESS;
        wait_until(
            &format!("{PROGRESS} more acks before crash {round}"),
            Duration::from_secs(120),
            || (acked_count(&producer) >= target).then_some(()),
        );
        node.sigkill();
        node.restart();
    }
    let target = acked_count(&producer) + PROGRESS;
    wait_until(
        "acks after the second restart",
        Duration::from_secs(120),
        || (acked_count(&producer) >= target).then_some(()),
    );
    stop.store(true, Ordering::Relaxed);
    let sent = sender.join().expect("sender thread panicked").unwrap();
    producer.flush(Duration::from_secs(180)).unwrap();

    let ctx = producer.context();
    let fatal = ctx.fatal.lock().unwrap().clone();
    assert!(fatal.is_none(), "fatal producer error: {fatal:?}");
    {
        let c = checker.lock().unwrap();
        assert_eq!(c.sent() as u64, sent);
        assert_eq!(
            c.failed(),
            0,
            "{} of {sent} deliveries failed although message.timeout.ms outlasts the restarts; \
             client errors: {:?}",
            c.failed(),
            ctx.errors.lock().unwrap()
        );
    }

    consume_to_end(
        &node.bootstrap(),
        &topic,
        PARTITIONS,
        Duration::from_secs(180),
        |p, o, v| checker.lock().unwrap().read(p, o, v),
    )
    .unwrap();
    let report = checker.lock().unwrap().check();
    let errors = ctx.errors.lock().unwrap();
    eprintln!(
        "{report}client errors seen during the crashes: {} (first: {:?})",
        errors.len(),
        errors.first()
    );
    assert!(
        !errors.is_empty(),
        "the producer never noticed the broker dying: the crashes were not exercised"
    );
    drop(errors);
    report.assert_ok();
    assert!(report.acked as u64 >= 3 * PROGRESS, "{report}");
}
