//! The pipeline workload: consume-transform-produce, exactly once.
//!
//! An idempotent producer fills the input topic. [`WORKERS`] workers form
//! one consumer group (read_committed, no auto commit); each has its own
//! transactional producer, turns every input value `v` into `v@<worker>#<txn>`
//! (the input it came from, and which transaction wrote it), writes it to
//! the output topic's partition of the same number, and every
//! [`COMMIT_EVERY`] commits the transaction together with the consumer's
//! positions (`send_offsets_to_transaction` with the group metadata).
//! On an abortable error it aborts and rewinds to the committed offsets;
//! on a fatal one it starts over with a new producer (same
//! `transactional.id`, which fences the old one) and a new consumer.
//! Partitions are revoked only after the open transaction is aborted, and
//! assigned at offsets fetched until stable
//! (`samsa_tools::pipeline::start_offsets`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::TopicPartitionList;
use samsa_tools::client::{forward_error, forward_log};

use super::{
    group_consumer_settings, offsets_list, partitions_of, positions, produce_round_robin,
    recording_producer, send, transactional_settings, txn_id, Env, Pending, RecordingProducer,
    MAX_POLL, TXN_CALL_TIMEOUT,
};
use crate::history::{EventKind, Workload};

pub const WORKERS: usize = 2;
/// How long a transaction stays open before it is committed.
const COMMIT_EVERY: Duration = Duration::from_millis(200);
const RETRIES: u32 = 3;

const W: Workload = Workload::Pipeline;

/// Fills the input topic until producing stops.
pub fn run_input_producer(env: &Env, topic: &str) -> Result<()> {
    produce_round_robin(env, W, "pipeline-in", topic, env.rate)
}

/// Where a worker reads and writes.
#[derive(Clone)]
pub struct Topics {
    pub input: String,
    pub output: String,
    pub group: String,
    pub transactional_id_prefix: String,
}

/// How a step failed.
enum StepError {
    /// Abort, rewind, go on.
    Abortable(KafkaError),
    /// Start over with a new producer and consumer.
    Fatal(anyhow::Error),
}

fn classify(what: &str, err: KafkaError) -> StepError {
    match &err {
        KafkaError::Transaction(e) if e.txn_requires_abort() && !e.is_fatal() => {
            StepError::Abortable(err)
        }
        _ => StepError::Fatal(anyhow!("{what}: {err}")),
    }
}

#[derive(Default)]
struct TxnState {
    open: Option<(String, Instant)>,
    n: u64,
    fatal: Option<String>,
}

/// A worker's producer and its open transaction, shared by the poll loop
/// and the rebalance callback (same thread).
struct Worker {
    env: Env,
    name: String,
    label: String,
    topics: Topics,
    producer: RecordingProducer,
    state: Mutex<TxnState>,
}

type WorkerConsumer = BaseConsumer<WorkerContext>;

impl Worker {
    fn state(&self) -> MutexGuard<'_, TxnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open_txn(&self) -> Option<String> {
        self.state().open.as_ref().map(|(id, _)| id.clone())
    }

    fn process(&self, msg: &BorrowedMessage<'_>) -> Result<(), StepError> {
        let input = String::from_utf8_lossy(msg.payload().unwrap_or_default()).into_owned();
        self.env.recorder.record(EventKind::Poll {
            workload: W,
            consumer: self.name.clone(),
            topic: msg.topic().to_string(),
            partition: msg.partition(),
            offset: msg.offset(),
            value: input.clone(),
        });
        let txn = match self.open_txn() {
            Some(id) => id,
            None => {
                self.producer
                    .begin_transaction()
                    .map_err(|e| classify("begin_transaction", e))?;
                let id = {
                    let mut s = self.state();
                    s.n += 1;
                    let id = txn_id(&self.label, s.n);
                    s.open = Some((id.clone(), Instant::now()));
                    id
                };
                self.env.recorder.record(EventKind::TxnBegin {
                    workload: W,
                    producer: self.name.clone(),
                    txn: id.clone(),
                });
                id
            }
        };
        let pending = Pending {
            value: format!("{input}@{}#{txn}", self.name),
            topic: self.topics.output.clone(),
            partition: msg.partition() % self.env.partitions.max(1),
            txn: Some(txn),
            ..Pending::default()
        };
        send(&self.producer, W, &self.name, pending).map_err(|e| classify("produce", e))
    }

    fn due(&self) -> bool {
        self.state()
            .open
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= COMMIT_EVERY)
    }

    /// Commits the open transaction with the consumer's positions; aborts
    /// and rewinds on an abortable error.
    fn commit(&self, consumer: &WorkerConsumer) -> Result<(), StepError> {
        let Some(id) = self.open_txn() else {
            return Ok(());
        };
        match self.try_commit(consumer, &id) {
            Ok(()) => {
                self.state().open = None;
                Ok(())
            }
            Err(StepError::Abortable(err)) => {
                tracing::warn!(worker = %self.name, "transaction {id} failed, aborting: {err}");
                self.abort(&id)?;
                self.rewind(consumer)
            }
            Err(fatal) => Err(fatal),
        }
    }

    fn try_commit(&self, consumer: &WorkerConsumer, id: &str) -> Result<(), StepError> {
        let offsets = positions(consumer).map_err(StepError::Fatal)?;
        if !offsets.is_empty() {
            let group = consumer
                .group_metadata()
                .ok_or_else(|| StepError::Fatal(anyhow!("the consumer has no group metadata")))?;
            let tpl = offsets_list(&offsets).map_err(StepError::Fatal)?;
            retrying("send_offsets_to_transaction", || {
                self.producer
                    .send_offsets_to_transaction(&tpl, &group, TXN_CALL_TIMEOUT)
            })?;
            self.env.recorder.record(EventKind::TxnOffsets {
                workload: W,
                txn: id.to_string(),
                group: self.topics.group.clone(),
                offsets,
            });
        }
        self.env.recorder.record(EventKind::TxnCommitIssued {
            workload: W,
            txn: id.to_string(),
        });
        let committed = retrying("commit_transaction", || {
            self.producer.commit_transaction(TXN_CALL_TIMEOUT)
        });
        match &committed {
            Ok(()) => self.env.recorder.record(EventKind::TxnCommitted {
                workload: W,
                txn: id.to_string(),
            }),
            Err(StepError::Abortable(e)) => self.env.recorder.record(EventKind::TxnCommitFailed {
                workload: W,
                txn: id.to_string(),
                error: e.to_string(),
            }),
            Err(StepError::Fatal(e)) => self.env.recorder.record(EventKind::TxnCommitFailed {
                workload: W,
                txn: id.to_string(),
                error: format!("{e:#}"),
            }),
        }
        committed
    }

    fn abort(&self, id: &str) -> Result<(), StepError> {
        let aborted = retrying("abort_transaction", || {
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        });
        match aborted {
            Ok(()) => {
                self.env.recorder.record(EventKind::TxnAborted {
                    workload: W,
                    txn: id.to_string(),
                    intentional: false,
                });
                self.state().open = None;
                Ok(())
            }
            Err(StepError::Abortable(e)) => {
                self.record_abort_failed(id, &e.to_string());
                Err(StepError::Fatal(anyhow!("abort_transaction: {e}")))
            }
            Err(StepError::Fatal(e)) => {
                self.record_abort_failed(id, &format!("{e:#}"));
                Err(StepError::Fatal(e))
            }
        }
    }

    fn record_abort_failed(&self, id: &str, error: &str) {
        self.env.recorder.record(EventKind::TxnAbortFailed {
            workload: W,
            txn: id.to_string(),
            error: error.to_string(),
        });
    }

    /// Moves every assigned partition back to its committed offset.
    fn rewind(&self, consumer: &WorkerConsumer) -> Result<(), StepError> {
        let assignment = consumer
            .assignment()
            .map_err(|e| StepError::Fatal(e.into()))?;
        let start = samsa_tools::pipeline::start_offsets(consumer, &assignment)
            .map_err(StepError::Fatal)?;
        if start.count() == 0 {
            return Ok(());
        }
        consumer
            .seek_partitions(start.clone(), TXN_CALL_TIMEOUT)
            .map_err(|e| StepError::Fatal(e.into()))?;
        for e in start.elements() {
            if let rdkafka::Offset::Offset(offset) = e.offset() {
                self.env.recorder.record(EventKind::Seek {
                    workload: W,
                    consumer: self.name.clone(),
                    topic: e.topic().to_string(),
                    partition: e.partition(),
                    offset,
                });
            } else {
                self.env.recorder.record(EventKind::Seek {
                    workload: W,
                    consumer: self.name.clone(),
                    topic: e.topic().to_string(),
                    partition: e.partition(),
                    offset: -2,
                });
            }
        }
        Ok(())
    }

    fn set_fatal(&self, why: String) {
        self.state().fatal = Some(why);
    }
}

/// Runs a transactional call, again while librdkafka says it is retriable.
fn retrying(what: &str, mut call: impl FnMut() -> KafkaResult<()>) -> Result<(), StepError> {
    let mut attempt = 0;
    loop {
        match call() {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && attempt < RETRIES => {
                attempt += 1;
                tracing::warn!("{what}: retriable error, trying again: {e}");
            }
            Err(e) => return Err(classify(what, e)),
        }
    }
}

struct WorkerContext {
    worker: Arc<Worker>,
}

impl ClientContext for WorkerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ConsumerContext for WorkerContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let w = &self.worker;
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let start =
                    samsa_tools::pipeline::start_offsets(consumer, tpl).unwrap_or_else(|e| {
                        w.set_fatal(format!(
                            "cannot fetch the committed offsets to start from: {e:#}"
                        ));
                        tpl.clone()
                    });
                w.env.recorder.record(EventKind::Assigned {
                    workload: W,
                    consumer: w.name.clone(),
                    group: w.topics.group.clone(),
                    partitions: partitions_of(tpl),
                });
                if cooperative {
                    consumer.incremental_assign(&start)
                } else {
                    consumer.assign(&start)
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // What the open transaction holds goes back to the group
                // uncommitted: its next owner processes it again.
                if let Some(id) = w.open_txn() {
                    if let Err(e) = w.abort(&id) {
                        let why = match e {
                            StepError::Fatal(e) => format!("{e:#}"),
                            StepError::Abortable(e) => e.to_string(),
                        };
                        w.set_fatal(format!("abort on revoke: {why}"));
                    }
                }
                w.env.recorder.record(EventKind::Revoked {
                    workload: W,
                    consumer: w.name.clone(),
                    group: w.topics.group.clone(),
                    partitions: partitions_of(tpl),
                    lost: consumer.assignment_lost(),
                });
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(worker = %w.name, "rebalance error: {}", RDKafkaErrorCode::from(other));
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            w.set_fatal(format!("applying the rebalance: {e}"));
        }
    }
}

/// Runs one worker until the run stops, starting over after fatal errors.
pub fn run_worker(env: &Env, topics: &Topics, index: usize) -> Result<()> {
    let name = format!("pipeline-w{index}");
    let transactional_id = format!("{}-{index}", topics.transactional_id_prefix);
    let mut generation = 0u64;
    let mut arrived = false;
    while env.running() {
        generation += 1;
        match worker_generation(
            env,
            topics,
            &name,
            &transactional_id,
            generation,
            &mut arrived,
        ) {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(worker = %name, "starting over after: {e:#}");
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    Ok(())
}

fn worker_generation(
    env: &Env,
    topics: &Topics,
    name: &str,
    transactional_id: &str,
    generation: u64,
    arrived: &mut bool,
) -> Result<()> {
    let producer = recording_producer(
        env,
        W,
        name,
        &transactional_settings(name, transactional_id),
    )
    .context("cannot create a pipeline producer")?;
    producer
        .init_transactions(TXN_CALL_TIMEOUT)
        .with_context(|| format!("init_transactions of {transactional_id}"))?;
    if !*arrived {
        *arrived = true;
        if !env.gate.arrive_and_wait() {
            return Ok(());
        }
    }
    let worker = Arc::new(Worker {
        env: env.clone(),
        name: name.to_string(),
        label: format!("{name}-g{generation}"),
        topics: topics.clone(),
        producer,
        state: Mutex::new(TxnState::default()),
    });
    let consumer: WorkerConsumer = env
        .config(&group_consumer_settings(name, &topics.group))?
        .create_with_context(WorkerContext {
            worker: Arc::clone(&worker),
        })
        .context("cannot create a pipeline consumer")?;
    consumer
        .subscribe(&[topics.input.as_str()])
        .with_context(|| format!("cannot subscribe to {}", topics.input))?;
    let outcome = loop {
        if !env.running() {
            break worker.commit(&consumer);
        }
        let step = match consumer.poll(MAX_POLL) {
            Some(Ok(msg)) => worker.process(&msg),
            Some(Err(e)) => {
                tracing::debug!(worker = %name, "consumer: {e}");
                Ok(())
            }
            None => Ok(()),
        };
        if let Some(fatal) = worker.state().fatal.take() {
            break Err(StepError::Fatal(anyhow!(fatal)));
        }
        let step = match step {
            Err(StepError::Abortable(e)) => {
                tracing::warn!(worker = %name, "produce failed, aborting: {e}");
                match worker.open_txn() {
                    Some(id) => worker.abort(&id).and_then(|()| worker.rewind(&consumer)),
                    None => Ok(()),
                }
            }
            other => other,
        };
        if let Err(e) = step {
            break Err(e);
        }
        if worker.due() {
            if let Err(e) = worker.commit(&consumer) {
                break Err(e);
            }
        }
    };
    match outcome {
        Ok(()) => {
            consumer.unsubscribe();
            drop(consumer);
            Ok(())
        }
        Err(StepError::Fatal(e)) => Err(e),
        Err(StepError::Abortable(e)) => Err(anyhow!("cannot recover from {e}")),
    }
}
