//! The transactional workload: a few transactional producers, each
//! transaction writing [`RECORDS_PER_TXN`] records to as many partitions
//! of one topic, a random share of them (`--abort-ratio`) aborted on
//! purpose. Every step is recorded: begin, each send and its
//! acknowledgement, commit issued, committed or failed (an unknown outcome
//! unless an abort follows), aborted.
//!
//! A producer that hits a fatal error (or cannot abort) is replaced by a
//! new one with the same `transactional.id`, whose `init_transactions`
//! fences the old one and finishes its transaction on the broker.

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;

use super::{
    recording_producer, send, transactional_settings, txn_id, Env, Pacer, Pending,
    RecordingProducer, TXN_CALL_TIMEOUT,
};
use crate::history::{EventKind, Workload};

pub const PRODUCERS: usize = 2;
pub const RECORDS_PER_TXN: usize = 3;
/// How often a retriable commit or abort error is tried again.
const RETRIES: u32 = 3;

const W: Workload = Workload::Txn;

/// What to do after a transaction.
enum Next {
    Continue,
    /// The producer is unusable: replace it.
    Replace,
}

pub fn run_producer(
    env: &Env,
    topic: &str,
    transactional_id: &str,
    index: usize,
    abort_ratio: f64,
) -> Result<()> {
    let name = format!("txn-p{index}");
    let mut rng = StdRng::seed_from_u64(env.seed ^ (0x7478_6e00 + index as u64));
    let txns_per_sec = env.rate / (PRODUCERS * RECORDS_PER_TXN) as f64;
    let partitions = env.partitions.max(1);
    let producer = Transactional {
        workload: W,
        name: &name,
        transactional_id,
        txns_per_sec,
        abort_ratio,
        land_aborted: false,
    };
    producer.run(env, &mut rng, |id, rng| {
        let first = rng.gen_range(0..partitions);
        (0..RECORDS_PER_TXN)
            .map(|j| Pending {
                value: format!("{id}-r{j}"),
                topic: topic.to_string(),
                partition: (first + i32::try_from(j).unwrap_or(0)) % partitions,
                txn: Some(id.to_string()),
                ..Pending::default()
            })
            .collect()
    })
}

/// A transactional producer thread of a workload: transactions at
/// `txns_per_sec` until producing stops, `abort_ratio` of them aborted on
/// purpose, every step recorded; the txn and compact workloads' producer.
pub struct Transactional<'a> {
    pub workload: Workload,
    pub name: &'a str,
    pub transactional_id: &'a str,
    pub txns_per_sec: f64,
    pub abort_ratio: f64,
    /// Wait for a transaction's records to be acknowledged before aborting
    /// it on purpose, so they are in the log (else librdkafka mostly purges
    /// them unsent, and the abort only tests the client).
    pub land_aborted: bool,
}

impl Transactional<'_> {
    /// Runs transactions until producing stops; `records` makes the
    /// records of the transaction it is given the id of.
    pub fn run(
        &self,
        env: &Env,
        rng: &mut StdRng,
        mut records: impl FnMut(&str, &mut StdRng) -> Vec<Pending>,
    ) -> Result<()> {
        let name = self.name;
        let mut pacer: Option<Pacer> = None;
        let mut generation = 0u64;
        let mut n = 0u64;
        'producers: while env.producing() {
            generation += 1;
            let producer = recording_producer(
                env,
                self.workload,
                name,
                &transactional_settings(name, self.transactional_id),
            )
            .context("cannot create a transactional producer")?;
            loop {
                match producer.init_transactions(TXN_CALL_TIMEOUT) {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(producer = %name, "init_transactions: {e}");
                        if !env.producing() {
                            break 'producers;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(500));
                    }
                }
            }
            let label = format!("{name}-g{generation}");
            let pacer = match &mut pacer {
                Some(p) => p,
                None => {
                    if !env.gate.arrive_and_wait() {
                        return Ok(());
                    }
                    pacer.insert(Pacer::new(self.txns_per_sec))
                }
            };
            while pacer.wait(|| env.producing()) {
                n += 1;
                let id = txn_id(&label, n);
                match self.one_transaction(env, &producer, &id, rng, &mut records) {
                    Next::Continue => {}
                    Next::Replace => continue 'producers,
                }
            }
            break;
        }
        Ok(())
    }

    fn one_transaction(
        &self,
        env: &Env,
        producer: &RecordingProducer,
        id: &str,
        rng: &mut StdRng,
        records: &mut impl FnMut(&str, &mut StdRng) -> Vec<Pending>,
    ) -> Next {
        let (w, name) = (self.workload, self.name);
        if let Err(e) = producer.begin_transaction() {
            tracing::warn!(producer = %name, "begin_transaction: {e}");
            return Next::Replace;
        }
        env.recorder.record(EventKind::TxnBegin {
            workload: w,
            producer: name.to_string(),
            txn: id.to_string(),
        });
        let mut failed = false;
        for pending in records(id, rng) {
            if let Err(e) = send(producer, w, name, pending) {
                tracing::warn!(producer = %name, "send in {id}: {e}");
                failed = true;
                break;
            }
        }
        if failed || rng.gen_bool(self.abort_ratio.clamp(0.0, 1.0)) {
            if !failed && self.land_aborted {
                if let Err(e) = producer.flush(TXN_CALL_TIMEOUT) {
                    tracing::warn!(producer = %name, "flush before aborting {id}: {e}");
                }
            }
            return abort(env, producer, w, name, id, !failed);
        }
        env.recorder.record(EventKind::TxnCommitIssued {
            workload: w,
            txn: id.to_string(),
        });
        let mut attempt = 0;
        loop {
            match producer.commit_transaction(TXN_CALL_TIMEOUT) {
                Ok(()) => {
                    env.recorder.record(EventKind::TxnCommitted {
                        workload: w,
                        txn: id.to_string(),
                    });
                    return Next::Continue;
                }
                Err(e) => {
                    env.recorder.record(EventKind::TxnCommitFailed {
                        workload: w,
                        txn: id.to_string(),
                        error: e.to_string(),
                    });
                    tracing::warn!(producer = %name, "commit of {id} failed: {e}");
                    match &e {
                        KafkaError::Transaction(te) if te.is_retriable() && attempt < RETRIES => {
                            attempt += 1;
                        }
                        KafkaError::Transaction(te) if te.txn_requires_abort() => {
                            return abort(env, producer, w, name, id, false);
                        }
                        _ => return Next::Replace,
                    }
                }
            }
        }
    }
}

/// Aborts `id` (`intentional`: chosen, not forced by an error).
fn abort(
    env: &Env,
    producer: &RecordingProducer,
    w: Workload,
    name: &str,
    id: &str,
    intentional: bool,
) -> Next {
    let mut attempt = 0;
    loop {
        match producer.abort_transaction(TXN_CALL_TIMEOUT) {
            Ok(()) => {
                env.recorder.record(EventKind::TxnAborted {
                    workload: w,
                    txn: id.to_string(),
                    intentional,
                });
                return Next::Continue;
            }
            Err(e) => {
                env.recorder.record(EventKind::TxnAbortFailed {
                    workload: w,
                    txn: id.to_string(),
                    error: e.to_string(),
                });
                tracing::warn!(producer = %name, "abort of {id} failed: {e}");
                match &e {
                    KafkaError::Transaction(te) if te.is_retriable() && attempt < RETRIES => {
                        attempt += 1;
                    }
                    _ => return Next::Replace,
                }
            }
        }
    }
}
