//! Background loads for fault tests, checked by the exactly-once checker at
//! the end: an idempotent librdkafka producer ([`IdempotentLoad`], acks=all,
//! round-robin over the partitions, every pause between acknowledgements of
//! a partition recorded) and a transactional one ([`TxnLoad`]: transactions
//! over every partition, every fourth aborted on purpose, a commit that
//! fails resolved as [`crate::txn::resolve_commit`] does).
//!
//! Blocking (librdkafka); the loads run on plain threads.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Result;
use rdkafka::producer::Producer;

use crate::checker::{EosChecker, EosReport, SharedChecker};
use crate::client::KafkaClient;
use crate::rdk::{self, AckGap, CheckingProducer};
use crate::txn::{read_topic, resolve_commit, ClientView, Isolation, TxnProducer};
use crate::wait::wait_until;

/// An idempotent producer writing round-robin to `partitions` partitions
/// of a topic until [`IdempotentLoad::finish`].
pub struct IdempotentLoad {
    pub topic: String,
    partitions: i32,
    pub checker: SharedChecker,
    pub producer: Arc<CheckingProducer>,
    stop: Arc<AtomicBool>,
    writer: Option<JoinHandle<Result<u64>>>,
}

impl IdempotentLoad {
    /// Starts writing (about 500 records/s) and waits for the first
    /// acknowledgements.
    pub fn start(bootstrap: &str, topic: &str, partitions: i32) -> IdempotentLoad {
        let checker = EosChecker::shared();
        let producer = Arc::new(rdk::checking_producer(
            &rdk::with_eos_debug(rdk::idempotent_producer_config(bootstrap)),
            Arc::clone(&checker),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (producer, stop, topic) =
                (Arc::clone(&producer), Arc::clone(&stop), topic.to_string());
            std::thread::spawn(move || -> Result<u64> {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let partition = i32::try_from(n % u64::try_from(partitions)?)?;
                    let value = format!("idem-{n:08}");
                    rdk::send_checked(
                        &producer,
                        "idem",
                        &topic,
                        Some(partition),
                        value.as_bytes(),
                    )?;
                    n += 1;
                    // Pacing (about 500 records/s), not synchronisation.
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(n)
            })
        };
        let load = IdempotentLoad {
            topic: topic.to_string(),
            partitions,
            checker,
            producer,
            stop,
            writer: Some(writer),
        };
        load.wait_progress(100, Duration::from_secs(60));
        load
    }

    pub fn acked(&self) -> u64 {
        rdk::acked_count(&self.producer)
    }

    /// Waits until `n` more records are acknowledged than now.
    pub fn wait_progress(&self, n: u64, timeout: Duration) {
        let target = self.acked() + n;
        wait_until(
            &format!("{n} more acknowledgements of the idempotent producer"),
            timeout,
            || (self.acked() >= target).then_some(()),
        );
    }

    /// The longest pause between acknowledgements of one partition that
    /// overlaps `[from, to]`.
    pub fn longest_gap(&self, from: Instant, to: Instant) -> Option<AckGap> {
        self.producer.context().longest_gap(from, to)
    }

    /// Stops writing, waits for every outstanding acknowledgement (none may
    /// fail), reads the topic back through `bootstrap` and returns the
    /// checker's report (the caller asserts on it).
    pub fn finish(mut self, bootstrap: &str) -> EosReport {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self
            .writer
            .take()
            .expect("writer")
            .join()
            .expect("the idempotent writer panicked")
            .expect("the idempotent writer failed");
        self.producer
            .flush(Duration::from_secs(120))
            .expect("flush the idempotent producer");
        let ctx = self.producer.context();
        let fatal = ctx.fatal.lock().unwrap().clone();
        assert!(
            fatal.is_none(),
            "idempotent producer: fatal error {fatal:?}"
        );
        {
            let c = self.checker.lock().unwrap();
            assert_eq!(c.sent() as u64, sent);
            assert_eq!(
                c.failed(),
                0,
                "{} deliveries failed although message.timeout.ms outlasts the faults; client \
                 errors: {:?}",
                c.failed(),
                ctx.errors.lock().unwrap()
            );
        }
        rdk::consume_to_end(
            bootstrap,
            &self.topic,
            self.partitions,
            Duration::from_secs(120),
            |p, o, v| self.checker.lock().unwrap().read(p, o, v),
        )
        .expect("read the idempotent topic back");
        let report = self.checker.lock().unwrap().check();
        report
    }
}

impl Drop for IdempotentLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One transaction of a [`TxnLoad`]: its values and how the client saw it end.
#[derive(Debug, Clone)]
pub struct TxnRecord {
    pub values: Vec<String>,
    pub view: ClientView,
}

/// What [`TxnLoad::finish`] found.
#[derive(Debug)]
pub struct TxnOutcome {
    pub report: EosReport,
    pub committed: usize,
    pub aborted: usize,
    /// Outcome unknown to the client (a new producer took over), resolved
    /// by reading: how many of those turned out committed.
    pub unknown: usize,
    pub unknown_committed: usize,
    /// Transactions read_committed showed partly: must be empty.
    pub torn: Vec<String>,
}

/// A transactional producer running transactions of two records per
/// partition over every partition of a topic until [`TxnLoad::finish`];
/// every fourth transaction is aborted on purpose.
pub struct TxnLoad {
    pub topic: String,
    partitions: i32,
    checker: SharedChecker,
    stop: Arc<AtomicBool>,
    pub finished: Arc<AtomicU64>,
    worker: Option<JoinHandle<Vec<TxnRecord>>>,
}

impl TxnLoad {
    /// Starts the producer (`transactional_id`) and waits for its first
    /// committed transactions.
    pub fn start(bootstrap: &str, topic: &str, partitions: i32, transactional_id: &str) -> TxnLoad {
        let checker = EosChecker::shared();
        let stop = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicU64::new(0));
        let worker = {
            let (checker, stop, finished) = (
                Arc::clone(&checker),
                Arc::clone(&stop),
                Arc::clone(&finished),
            );
            let (bootstrap, topic, id) = (
                bootstrap.to_string(),
                topic.to_string(),
                transactional_id.to_string(),
            );
            std::thread::spawn(move || {
                let mut p = TxnProducer::transactional(&bootstrap, &id);
                let mut txns = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    if let Err(e) = p.begin() {
                        eprintln!("txn load: begin_transaction failed: {e}; a new producer");
                        drop(p);
                        p = TxnProducer::transactional(&bootstrap, &id);
                        continue;
                    }
                    let mut values = Vec::new();
                    let mut send_failed = false;
                    'sends: for part in 0..partitions {
                        for k in 0..2 {
                            let v = format!("txn-{n:06}-{part}-{k}");
                            checker.lock().unwrap().send("txn", v.as_bytes());
                            let sent = p.send_sync(&topic, Some(part), &v);
                            match sent {
                                Ok((pp, off)) => checker.lock().unwrap().ack(v.as_bytes(), pp, off),
                                Err(e) => {
                                    eprintln!("txn load: send of {v} failed: {e}; aborting");
                                    checker.lock().unwrap().fail(v.as_bytes(), e.to_string());
                                    send_failed = true;
                                }
                            }
                            values.push(v);
                            if send_failed {
                                break 'sends;
                            }
                        }
                    }
                    // Without a commit request the transaction can only end
                    // aborted, also when the abort call fails and a new
                    // producer (fencing this one) takes over.
                    let view = if send_failed || n.is_multiple_of(4) {
                        if let Err(e) = p.abort() {
                            eprintln!("txn load: abort failed: {e}; a new producer");
                            drop(p);
                            p = TxnProducer::transactional(&bootstrap, &id);
                        }
                        ClientView::Aborted
                    } else {
                        let commit = p.commit();
                        let (next, view) = resolve_commit(p, commit, &bootstrap, &id);
                        p = next;
                        view
                    };
                    txns.push(TxnRecord { values, view });
                    finished.fetch_add(1, Ordering::Relaxed);
                }
                txns
            })
        };
        let load = TxnLoad {
            topic: topic.to_string(),
            partitions,
            checker,
            stop,
            finished,
            worker: Some(worker),
        };
        load.wait_progress(3, Duration::from_secs(90));
        load
    }

    /// Waits until `n` more transactions have ended than now.
    pub fn wait_progress(&self, n: u64, timeout: Duration) {
        let target = self.finished.load(Ordering::Relaxed) + n;
        wait_until(
            &format!("{n} more transactions of the transactional producer"),
            timeout,
            || (self.finished.load(Ordering::Relaxed) >= target).then_some(()),
        );
    }

    /// Stops after the current transaction, waits until every partition's
    /// last stable offset is its log end (`client_for` gives a client to a
    /// partition's leader), reads the topic read_committed through
    /// `bootstrap` and checks: no transaction partly visible, a committed
    /// one whole, an aborted one absent, nothing lost or duplicated.
    pub fn finish(
        mut self,
        bootstrap: &str,
        mut leader_client: impl FnMut(i32) -> Option<KafkaClient>,
    ) -> TxnOutcome {
        self.stop.store(true, Ordering::Relaxed);
        let txns = self
            .worker
            .take()
            .expect("worker")
            .join()
            .expect("the transactional load panicked");
        let topic = self.topic.clone();
        wait_until(
            "every partition's last stable offset at its log end",
            Duration::from_secs(60),
            || {
                for p in 0..self.partitions {
                    let mut c = leader_client(p)?;
                    let lso = c.last_stable_offset(&topic, p).ok()?;
                    let leo = c.log_end_offset(&topic, p).ok()?;
                    if lso != leo {
                        return None;
                    }
                }
                Some(())
            },
        );
        let seen = read_topic(bootstrap, &topic, self.partitions, Isolation::ReadCommitted)
            .expect("read the transactional topic read_committed");
        let visible: BTreeSet<&str> = seen.iter().map(|(_, _, v)| v.as_str()).collect();
        let mut out = TxnOutcome {
            report: EosReport::default(),
            committed: 0,
            aborted: 0,
            unknown: 0,
            unknown_committed: 0,
            torn: Vec::new(),
        };
        let mut checker = self.checker.lock().unwrap();
        for t in &txns {
            let shown = t
                .values
                .iter()
                .filter(|v| visible.contains(v.as_str()))
                .count();
            let all = shown == t.values.len();
            if shown > 0 && !all {
                out.torn.push(format!(
                    "{:?} transaction shows {shown} of {} records: {:?}",
                    t.view,
                    t.values.len(),
                    t.values
                ));
            }
            let committed = match t.view {
                ClientView::Committed => {
                    out.committed += 1;
                    true
                }
                ClientView::Aborted => {
                    out.aborted += 1;
                    false
                }
                ClientView::Unknown => {
                    out.unknown += 1;
                    if all {
                        out.unknown_committed += 1;
                    }
                    all
                }
            };
            if !committed {
                for v in &t.values {
                    checker.abort(v.as_bytes());
                }
            }
        }
        for (p, o, v) in &seen {
            checker.read(*p, *o, v.as_bytes());
        }
        out.report = checker.check();
        out
    }
}

impl Drop for TxnLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
