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
    let mut pacer: Option<Pacer> = None;
    let mut generation = 0u64;
    let mut n = 0u64;
    'producers: while env.producing() {
        generation += 1;
        let producer = recording_producer(
            env,
            W,
            &name,
            &transactional_settings(&name, transactional_id),
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
                pacer.insert(Pacer::new(txns_per_sec))
            }
        };
        while pacer.wait(|| env.producing()) {
            n += 1;
            let id = txn_id(&label, n);
            match one_transaction(env, &producer, &name, topic, &id, &mut rng, abort_ratio) {
                Next::Continue => {}
                Next::Replace => continue 'producers,
            }
        }
        break;
    }
    Ok(())
}

fn one_transaction(
    env: &Env,
    producer: &RecordingProducer,
    name: &str,
    topic: &str,
    id: &str,
    rng: &mut StdRng,
    abort_ratio: f64,
) -> Next {
    if let Err(e) = producer.begin_transaction() {
        tracing::warn!(producer = %name, "begin_transaction: {e}");
        return Next::Replace;
    }
    env.recorder.record(EventKind::TxnBegin {
        workload: W,
        producer: name.to_string(),
        txn: id.to_string(),
    });
    let partitions = env.partitions.max(1);
    let first = rng.gen_range(0..partitions);
    let mut failed = false;
    for j in 0..RECORDS_PER_TXN {
        let offset = i32::try_from(j).unwrap_or(0);
        let pending = Pending {
            value: format!("{id}-r{j}"),
            topic: topic.to_string(),
            partition: (first + offset) % partitions,
            txn: Some(id.to_string()),
        };
        if let Err(e) = send(producer, W, name, pending) {
            tracing::warn!(producer = %name, "send in {id}: {e}");
            failed = true;
            break;
        }
    }
    if failed || rng.gen_bool(abort_ratio.clamp(0.0, 1.0)) {
        return abort(env, producer, name, id, !failed);
    }
    env.recorder.record(EventKind::TxnCommitIssued {
        workload: W,
        txn: id.to_string(),
    });
    let mut attempt = 0;
    loop {
        match producer.commit_transaction(TXN_CALL_TIMEOUT) {
            Ok(()) => {
                env.recorder.record(EventKind::TxnCommitted {
                    workload: W,
                    txn: id.to_string(),
                });
                return Next::Continue;
            }
            Err(e) => {
                env.recorder.record(EventKind::TxnCommitFailed {
                    workload: W,
                    txn: id.to_string(),
                    error: e.to_string(),
                });
                tracing::warn!(producer = %name, "commit of {id} failed: {e}");
                match &e {
                    KafkaError::Transaction(te) if te.is_retriable() && attempt < RETRIES => {
                        attempt += 1;
                    }
                    KafkaError::Transaction(te) if te.txn_requires_abort() => {
                        return abort(env, producer, name, id, false);
                    }
                    _ => return Next::Replace,
                }
            }
        }
    }
}

/// Aborts `id` (`intentional`: chosen, not forced by an error).
fn abort(env: &Env, producer: &RecordingProducer, name: &str, id: &str, intentional: bool) -> Next {
    let mut attempt = 0;
    loop {
        match producer.abort_transaction(TXN_CALL_TIMEOUT) {
            Ok(()) => {
                env.recorder.record(EventKind::TxnAborted {
                    workload: W,
                    txn: id.to_string(),
                    intentional,
                });
                return Next::Continue;
            }
            Err(e) => {
                env.recorder.record(EventKind::TxnAbortFailed {
                    workload: W,
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
