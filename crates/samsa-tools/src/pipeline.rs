//! `samsa pipeline …`: an exactly-once consume-transform-produce worker
//! (`stage`), and the drivers that run a pipeline of such workers from the
//! outside (`samsa demo pipeline`, `samsa pipeline bench`, see [`driver`]).
//!
//! A stage process is one member of a consumer group reading its input
//! topic with `isolation.level=read_committed` and writing each record,
//! key unchanged and the value tagged with the stage that saw it, to its
//! output topic through a transactional producer. Every transaction carries
//! the consumer positions of the records it wrote
//! (`send_offsets_to_transaction` with the consumer's group metadata, so the
//! group coordinator can fence a member of an old generation, KIP-447), so
//! the output and the input offsets become visible together or not at all.
//!
//! Invariants the stage keeps:
//! - a transaction is open only while the records it holds have been read
//!   past the committed offsets; it is committed every `--txn-interval-ms`
//!   together with the positions of every assigned partition;
//! - after an abort the consumer is rewound to the committed offsets
//!   before anything else is read, so aborted output is written again, once;
//! - on a revoke the open transaction is committed (or, if the partitions
//!   were lost, aborted) before the partitions go to another member;
//! - an assigned partition starts at the group's committed offset as this
//!   stage fetched it, asked again until no open transaction holds it
//!   ([`start_offsets`]), never at librdkafka's own fetch;
//! - a fatal producer error (fenced by a newer process of the same slot,
//!   whose `transactional.id` is `<prefix>-<slot>`) or a failure to recover
//!   ends the process with a non-zero status: a supervisor restarts the
//!   slot, which fences the old producer and starts from committed offsets.
//!
//! `--plain` runs the same loop without transactions (idempotent producer,
//! auto-committed offsets): at-least-once, the baseline of the benchmark.
//!
//! librdkafka's transactional calls block; the whole stage runs on tokio's
//! blocking pool.

pub mod driver;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{self, forward_error, forward_log, ConnectArgs};
use crate::signals;

#[derive(Debug, Subcommand)]
pub enum PipelineCommand {
    /// Run one consume-transform-produce stage process (a consumer group
    /// member with a transactional producer).
    Stage(StageArgs),
    /// Measure end-to-end throughput of a transactional pipeline stage
    /// against the plain (non-transactional, auto-commit) one.
    Bench(driver::BenchArgs),
}

#[derive(Debug, Clone, Args)]
pub struct StageArgs {
    /// Topic to consume.
    #[arg(long)]
    pub input: String,
    /// Topic to produce the transformed records to.
    #[arg(long)]
    pub output: String,
    /// Consumer group of the stage (every process of the stage uses the same).
    #[arg(long)]
    pub group: String,
    /// Name written into each output record to say which stage saw it
    /// (default: the group).
    #[arg(long)]
    pub stage: Option<String>,
    /// Process slot within the stage: a restarted slot reuses its
    /// transactional.id and so fences its predecessor.
    #[arg(long, default_value_t = 0)]
    pub slot: u32,
    /// transactional.id prefix; the id is `<prefix>-<slot>` (default: the group).
    #[arg(long)]
    pub transactional_id_prefix: Option<String>,
    /// How often the open transaction is committed.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub txn_interval_ms: u64,
    /// Consumer group session timeout (how soon a dead member's partitions move).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub session_timeout_ms: u64,
    /// No transactions: idempotent producer and auto-committed offsets
    /// (at-least-once; the benchmark's baseline).
    #[arg(long)]
    pub plain: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

impl StageArgs {
    fn stage_name(&self) -> &str {
        self.stage.as_deref().unwrap_or(&self.group)
    }

    fn transactional_id(&self) -> String {
        let prefix = self
            .transactional_id_prefix
            .as_deref()
            .unwrap_or(&self.group);
        format!("{prefix}-{}", self.slot)
    }

    /// What the stage appends to each value: `|<stage>/<slot>`.
    fn tag(&self) -> Vec<u8> {
        format!("|{}/{}", self.stage_name(), self.slot).into_bytes()
    }
}

pub async fn run(command: PipelineCommand) -> Result<ExitCode> {
    match command {
        PipelineCommand::Stage(args) => run_stage(args).await,
        PipelineCommand::Bench(args) => driver::bench(args).await,
    }
}

async fn run_stage(args: StageArgs) -> Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    let shutdown = signals::shutdown_signal()?;
    let mut task = tokio::task::spawn_blocking({
        let stop = Arc::clone(&stop);
        move || {
            if args.plain {
                plain_stage(&args, &stop)
            } else {
                transactional_stage(&args, &stop)
            }
        }
    });
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = shutdown => {
            stop.store(true, Ordering::Relaxed);
            task.await
        }
    };
    joined.context("stage task failed")?
}

/// Timeout of each blocking transactional call (init, send offsets,
/// commit, abort) and of the offset lookups of a rewind.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a call that failed with a retriable error is tried again.
const TXN_CALL_RETRIES: u32 = 4;
/// A transactional call that has not returned this long after its own
/// timeout is taken as hung: the process exits for the supervisor.
const HUNG_CALL: Duration = Duration::from_secs(15);
/// A transactional call slower than this is logged, and poked (see
/// [`watchdog`]).
const SLOW_CALL: Duration = Duration::from_secs(5);
/// How often a slow transactional call is poked. Longer than the idle
/// time after which the producer closes a connection
/// ([`PRODUCER_IDLE_CLOSE`]), so the connections a poke opened have closed
/// before the next poke opens them again: both are changes the waiting
/// request looks again on, while connections kept up by pokes would
/// change nothing.
const POKE_EVERY: Duration = Duration::from_secs(6);
/// How long a poke waits for the brokers' answers.
const POKE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the stage logs its counters.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Longest single consumer poll: bounds how late a stop or a commit can be.
const MAX_POLL: Duration = Duration::from_millis(100);

/// Counters of one stage process.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    records_in: AtomicU64,
    committed_txns: AtomicU64,
    committed_records: AtomicU64,
    aborted_txns: AtomicU64,
    delivery_failures: AtomicU64,
}

impl Counters {
    fn log(&self, label: &str) {
        tracing::info!(
            stage = label,
            records_in = self.records_in.load(Ordering::Relaxed),
            committed_transactions = self.committed_txns.load(Ordering::Relaxed),
            committed_records = self.committed_records.load(Ordering::Relaxed),
            aborted_transactions = self.aborted_txns.load(Ordering::Relaxed),
            delivery_failures = self.delivery_failures.load(Ordering::Relaxed),
            "progress"
        );
    }
}

/// Producer context: librdkafka logs into `tracing`, delivery failures
/// counted (in a transaction they also make the commit fail, which aborts).
pub(crate) struct StageProducerContext {
    counters: Arc<Counters>,
}

impl StageProducerContext {
    fn new(counters: &Arc<Counters>) -> Self {
        StageProducerContext {
            counters: Arc::clone(counters),
        }
    }

    /// Records whose delivery failed so far.
    pub(crate) fn delivery_failures(&self) -> u64 {
        self.counters.delivery_failures.load(Ordering::Relaxed)
    }

    pub(crate) fn standalone() -> Self {
        Self::new(&Arc::new(Counters::default()))
    }
}

impl ClientContext for StageProducerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ProducerContext for StageProducerContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((err, _)) = result {
            let failed = self
                .counters
                .delivery_failures
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            // A broker failover fails whole batches at once: log the 1st,
            // 2nd, 4th, … failure, the progress line has the count.
            if failed.is_power_of_two() {
                tracing::warn!("delivery failed ({failed} so far): {err}");
            }
        }
    }
}

pub(crate) type StageProducer = ThreadedProducer<StageProducerContext>;

/// How a transactional step failed.
#[derive(Debug)]
enum TxnError {
    /// The transaction must be aborted (and the input rewound); the
    /// producer stays usable.
    Abortable(KafkaError),
    /// The producer (or the stage) cannot go on: exit, let the supervisor
    /// restart the slot.
    Fatal(anyhow::Error),
}

fn classify(what: &str, err: KafkaError) -> TxnError {
    match &err {
        KafkaError::Transaction(e) if e.is_fatal() => {
            TxnError::Fatal(anyhow!("{what}: fatal transactional error: {err}"))
        }
        KafkaError::Transaction(e) if e.txn_requires_abort() => TxnError::Abortable(err),
        _ => TxnError::Fatal(anyhow!("{what}: {err}")),
    }
}

/// Runs a blocking transactional call, again while librdkafka says the
/// error is retriable (e.g. a timeout while the coordinator moves).
fn with_retries(what: &str, mut call: impl FnMut() -> KafkaResult<()>) -> Result<(), TxnError> {
    let mut attempt = 0;
    loop {
        let started = Instant::now();
        let result = watchdog::watch(&mut call);
        // A call that blocks this long stalls the whole stage (no polls,
        // no rejoin in a rebalance): say so, it is where time goes.
        if started.elapsed() >= SLOW_CALL {
            tracing::warn!(
                "{what} took {} ms ({})",
                started.elapsed().as_millis(),
                if result.is_ok() { "ok" } else { "failed" }
            );
        }
        match result {
            Ok(()) => return Ok(()),
            Err(KafkaError::Transaction(e)) if e.is_retriable() && attempt < TXN_CALL_RETRIES => {
                attempt += 1;
                tracing::warn!("{what}: retriable error, trying again ({attempt}): {e}");
            }
            Err(err) => return Err(classify(what, err)),
        }
    }
}

/// Watches the stage's blocking librdkafka calls: gets a slow one to look
/// for its coordinator again, and exits the process when one outlives its
/// own timeout by far.
///
/// librdkafka 2.12 does not enforce the timeout of a transactional call
/// while its request waits for a coordinator (librdkafka issues 5511 and
/// 5456). Such a request looks the coordinator up again only when one of
/// the client's broker connections goes up or down, and at most once a
/// second (`rd_kafka_coord_req_fsm`, run from
/// `rd_kafka_coord_rkb_monitor_cb`). After a SIGKILL of the coordinator
/// the last look can come before the cluster names a new one (the killed
/// broker is fenced only after its session timeout). Once the producer's
/// idle connections have closed but one, that one keeps closing when idle
/// and being reopened at once by the request's own look, so every
/// reopening falls within a second of the look and changes nothing: the
/// request waits on the dead broker until it returns.
/// That is the likely cause of the stalls seen three times in the
/// pipeline chaos test, each time while CI ran other suites beside it
/// (`docs/RELIABILITY.md`). So a call slower than [`SLOW_CALL`] is *poked*
/// every [`POKE_EVERY`]: the stage's producer lists the groups of every
/// broker, which opens a connection to each broker that has none, and the
/// waiting request looks again.
///
/// A stage stuck in a call anyway holds its partitions and stalls its
/// group's rebalance forever, while a restarted slot fences it and resumes
/// from committed offsets; a test that sees the exit has found a hang.
mod watchdog {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    static EPOCH: OnceLock<Instant> = OnceLock::new();
    /// Milliseconds since [`EPOCH`] when the running call started, plus
    /// one (0: no call running).
    static RUNNING_SINCE: AtomicU64 = AtomicU64::new(0);

    fn now_ms() -> u64 {
        let epoch = EPOCH.get_or_init(Instant::now);
        u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Runs `call` under the watchdog.
    pub fn watch<T>(call: &mut impl FnMut() -> T) -> T {
        RUNNING_SINCE.store(now_ms() + 1, Ordering::Relaxed);
        let out = call();
        RUNNING_SINCE.store(0, Ordering::Relaxed);
        out
    }

    /// Starts the thread that calls `poke` while a call has been running
    /// longer than [`super::SLOW_CALL`], at most every [`super::POKE_EVERY`],
    /// and exits the process (status 3) once a call has been running
    /// longer than `limit`.
    pub fn start(limit: Duration, label: String, poke: impl Fn() + Send + 'static) {
        now_ms();
        let limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        let slow_ms = u64::try_from(super::SLOW_CALL.as_millis()).unwrap_or(u64::MAX);
        let poke_every_ms = u64::try_from(super::POKE_EVERY.as_millis()).unwrap_or(u64::MAX);
        let spawned = std::thread::Builder::new()
            .name("txn-watchdog".into())
            .spawn(move || {
                // (call start, last poke) of the call that was last poked.
                let mut poked: Option<(u64, u64)> = None;
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                    let since = RUNNING_SINCE.load(Ordering::Relaxed);
                    if since == 0 {
                        continue;
                    }
                    let now = now_ms();
                    let running_ms = now.saturating_sub(since - 1);
                    if running_ms > limit_ms {
                        tracing::error!(
                            stage = %label,
                            "a transactional call has not returned for {limit:?}: exiting for a restart"
                        );
                        std::process::exit(3);
                    }
                    let due = match poked {
                        Some((call, last)) if call == since => {
                            now.saturating_sub(last) >= poke_every_ms
                        }
                        _ => running_ms >= slow_ms,
                    };
                    if due {
                        tracing::info!(
                            stage = %label,
                            "a transactional call has been running {running_ms} ms: \
                             poking it so that it looks for its coordinator again"
                        );
                        poke();
                        poked = Some((since, now));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the transaction watchdog: {e}");
        }
    }
}

/// The open transaction and what was last committed.
#[derive(Debug, Default)]
struct TxnState {
    /// When the open transaction began (`None`: no transaction open).
    opened_at: Option<Instant>,
    /// Records produced in the open transaction.
    records: u64,
    /// Positions sent with the last committed transaction, so that an
    /// idle stage does not commit the same offsets again and again.
    committed: BTreeMap<(String, i32), i64>,
    /// When the last transaction ended (committed or aborted).
    ended_at: Option<Instant>,
    /// Set by the rebalance callback when recovery failed there; the main
    /// loop exits with it.
    fatal: Option<String>,
}

/// The transactional half of a stage: the producer and its transaction,
/// shared by the main loop and the consumer's rebalance callback (which
/// runs inside `poll`, on the same thread).
struct Transactor {
    producer: Arc<StageProducer>,
    output: String,
    tag: Vec<u8>,
    label: String,
    counters: Arc<Counters>,
    state: Mutex<TxnState>,
}

type StageConsumer = BaseConsumer<StageConsumerContext>;

impl Transactor {
    fn state(&self) -> MutexGuard<'_, TxnState> {
        // A panic while the lock was held ends the process anyway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_open(&self) -> bool {
        self.state().opened_at.is_some()
    }

    fn begin(&self) -> Result<(), TxnError> {
        self.producer
            .begin_transaction()
            .map_err(|e| classify("begin_transaction", e))?;
        let mut s = self.state();
        s.opened_at = Some(Instant::now());
        s.records = 0;
        Ok(())
    }

    /// Writes the transformed `msg` into the open transaction (opening one
    /// if none is).
    fn process(&self, msg: &BorrowedMessage<'_>) -> Result<(), TxnError> {
        if !self.is_open() {
            self.begin()?;
        }
        let mut value = msg.payload().unwrap_or_default().to_vec();
        value.extend_from_slice(&self.tag);
        send_blocking(&self.producer, &self.output, msg.key(), &value)
            .map_err(|e| classify("produce", e))?;
        self.state().records += 1;
        self.counters.records_in.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Commits the open transaction with the consumer's positions; with no
    /// transaction open, commits the positions alone if they moved (past
    /// control records, or after an abort). Aborts and rewinds on an
    /// abortable error.
    fn commit(&self, consumer: &StageConsumer) -> Result<(), TxnError> {
        let positions = positions(consumer).map_err(TxnError::Fatal)?;
        let open = self.is_open();
        if !open && (positions.is_empty() || positions == self.state().committed) {
            return Ok(());
        }
        match self.try_commit(consumer, &positions, open) {
            Ok(()) => {
                let mut s = self.state();
                self.counters.committed_txns.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .committed_records
                    .fetch_add(s.records, Ordering::Relaxed);
                s.opened_at = None;
                s.records = 0;
                s.committed = positions;
                s.ended_at = Some(Instant::now());
                Ok(())
            }
            Err(TxnError::Abortable(err)) => {
                tracing::warn!(stage = %self.label, "transaction failed, aborting: {err}");
                self.abort()?;
                rewind(consumer).map_err(TxnError::Fatal)
            }
            Err(fatal) => Err(fatal),
        }
    }

    fn try_commit(
        &self,
        consumer: &StageConsumer,
        positions: &BTreeMap<(String, i32), i64>,
        open: bool,
    ) -> Result<(), TxnError> {
        if !open {
            self.begin()?;
        }
        let group = consumer.group_metadata().ok_or_else(|| {
            TxnError::Fatal(anyhow!("the consumer has no group metadata to commit with"))
        })?;
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in positions {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))
                .map_err(|e| TxnError::Fatal(e.into()))?;
        }
        with_retries("send_offsets_to_transaction", || {
            self.producer
                .send_offsets_to_transaction(&tpl, &group, TXN_CALL_TIMEOUT)
        })?;
        with_retries("commit_transaction", || {
            self.producer.commit_transaction(TXN_CALL_TIMEOUT)
        })
    }

    /// Aborts the open transaction; the caller rewinds the input if it
    /// keeps its partitions.
    fn abort(&self) -> Result<(), TxnError> {
        with_retries("abort_transaction", || {
            self.producer.abort_transaction(TXN_CALL_TIMEOUT)
        })
        .map_err(|e| match e {
            // An abort that itself needs an abort cannot be recovered here.
            TxnError::Abortable(err) => TxnError::Fatal(anyhow!("abort_transaction: {err}")),
            fatal => fatal,
        })?;
        let mut s = self.state();
        s.opened_at = None;
        s.records = 0;
        s.ended_at = Some(Instant::now());
        self.counters.aborted_txns.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the open transaction (or, with none open, the last commit)
    /// is at least `interval` old.
    fn due(&self, interval: Duration) -> bool {
        let s = self.state();
        match (s.opened_at, s.ended_at) {
            (Some(t), _) | (None, Some(t)) => t.elapsed() >= interval,
            (None, None) => true,
        }
    }

    fn fatal(&self) -> Option<String> {
        self.state().fatal.clone()
    }

    fn set_fatal(&self, err: &anyhow::Error) {
        self.state().fatal = Some(format!("{err:#}"));
    }
}

/// The consumer's positions (next offset to read) of every assigned
/// partition that has one.
fn positions(consumer: &StageConsumer) -> Result<BTreeMap<(String, i32), i64>> {
    let tpl = consumer.position().context("consumer positions")?;
    Ok(tpl
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        })
        .collect())
}

/// Moves every assigned partition back to its committed offset (the log
/// start if the group never committed one), dropping what was prefetched.
fn rewind(consumer: &StageConsumer) -> Result<()> {
    let assignment = consumer.assignment().context("the consumer's assignment")?;
    let tpl = start_offsets(consumer, &assignment)
        .context("cannot fetch the committed offsets to rewind to")?;
    if tpl.count() == 0 {
        return Ok(());
    }
    let result = consumer
        .seek_partitions(tpl, TXN_CALL_TIMEOUT)
        .context("cannot rewind to the committed offsets")?;
    for e in result.elements() {
        if let Err(err) = e.error() {
            bail!(
                "cannot rewind {}[{}] to the committed offset: {err}",
                e.topic(),
                e.partition()
            );
        }
    }
    tracing::info!(
        "rewound {} partition(s) to the committed offsets",
        result.count()
    );
    Ok(())
}

/// Enqueues one record, waiting while librdkafka's local queue is full.
pub(crate) fn send_blocking(
    producer: &StageProducer,
    topic: &str,
    key: Option<&[u8]>,
    value: &[u8],
) -> KafkaResult<()> {
    loop {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).payload(value);
        if let Some(k) = key {
            record = record.key(k);
        }
        match producer.send(record) {
            Ok(()) => return Ok(()),
            // The producer's own thread is delivering; back off briefly.
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((err, _)) => return Err(err),
        }
    }
}

/// Consumer context of a transactional stage: commits or aborts the open
/// transaction before partitions are taken away.
struct StageConsumerContext {
    transactor: Arc<Transactor>,
}

impl ClientContext for StageConsumerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ConsumerContext for StageConsumerContext {
    /// Assigned partitions start at offsets this stage fetched itself (see
    /// [`start_offsets`]), never at librdkafka's own committed-offset fetch.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let t = &self.transactor;
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                tracing::info!(stage = %t.label, partitions = tpl.count(), "partitions assigned");
                // `tpl` is librdkafka's own list: assign a new one.
                let start = start_offsets(consumer, tpl).unwrap_or_else(|e| {
                    // The main loop ends the process before it commits anything.
                    t.set_fatal(&e.context("cannot fetch the committed offsets to start from"));
                    tpl.clone()
                });
                if cooperative {
                    consumer.incremental_assign(&start)
                } else {
                    consumer.assign(&start)
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.revoke(consumer, tpl);
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(stage = %t.label, "rebalance error: {}", RDKafkaErrorCode::from(other));
                consumer.unassign()
            }
        };
        if let Err(e) = result {
            t.set_fatal(&anyhow!("applying the rebalance: {e}"));
        }
    }
}

impl StageConsumerContext {
    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let t = &self.transactor;
        let lost = consumer.assignment_lost();
        tracing::info!(
            stage = %t.label,
            partitions = tpl.count(),
            lost,
            open = t.is_open(),
            "partitions revoked"
        );
        let outcome = if lost {
            // Another member may own them already: our offsets
            // would be fenced, so don't try.
            if t.is_open() {
                t.abort()
            } else {
                Ok(())
            }
        } else {
            t.commit(consumer)
        };
        match outcome {
            Ok(()) => {}
            Err(TxnError::Abortable(err)) => {
                if let Err(e) = t.abort() {
                    t.set_fatal(&anyhow!("abort on revoke after {err}: {e:?}"));
                }
            }
            Err(TxnError::Fatal(err)) => t.set_fatal(&err),
        }
        // The next assignment starts from committed offsets.
        t.state().committed.clear();
    }
}

/// How long an assignment waits for offsets held by open transactions.
const STABLE_OFFSETS_TIMEOUT: Duration = Duration::from_secs(60);

/// The offsets the partitions of `tpl` start at: the group's committed
/// offset, or the log start where the group never committed one.
///
/// librdkafka's own fetch at assignment time is not safe for a
/// read_committed consumer: the coordinator answers a partition whose
/// offset sits in an open transaction with UNSTABLE_OFFSET_COMMIT and
/// offset -1, and when a rebalance re-assigns that partition while such
/// an answer is on its way (a retry waits up to a second), librdkafka takes
/// the -1 as "no committed offset" and starts at `auto.offset.reset`, the
/// log start: everything already committed is read and written again. Here
/// an UNSTABLE_OFFSET_COMMIT (or any other per-partition error) is asked
/// again until the offset is stable, and only an answer without error and
/// without offset means the log start. (`samsa verify`'s pipeline workload
/// starts its partitions the same way.)
pub fn start_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    tpl: &TopicPartitionList,
) -> Result<TopicPartitionList> {
    let deadline = Instant::now() + STABLE_OFFSETS_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let committed =
            consumer.committed_offsets(tpl.clone(), left.max(Duration::from_millis(100)));
        let why = match committed {
            Ok(committed) => match committed.elements().iter().find_map(|e| {
                e.error()
                    .err()
                    .map(|err| format!("{}[{}]: {err}", e.topic(), e.partition()))
            }) {
                None => {
                    let mut start = TopicPartitionList::new();
                    for e in committed.elements() {
                        let offset = match e.offset() {
                            Offset::Offset(o) => Offset::Offset(o),
                            _ => Offset::Beginning,
                        };
                        start.add_partition_offset(e.topic(), e.partition(), offset)?;
                    }
                    return Ok(start);
                }
                Some(why) => why,
            },
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            bail!("{why}");
        }
        tracing::debug!("committed offsets not stable yet ({why}); asking again");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn consumer_settings(args: &StageArgs) -> Vec<(&'static str, String)> {
    let session = args.session_timeout_ms;
    vec![
        ("group.id", args.group.clone()),
        (
            "client.id",
            format!("samsa-stage-{}-{}", args.stage_name(), args.slot),
        ),
        ("auto.offset.reset", "earliest".to_string()),
        ("isolation.level", "read_committed".to_string()),
        ("session.timeout.ms", session.to_string()),
        ("heartbeat.interval.ms", (session / 3).max(100).to_string()),
        ("fetch.wait.max.ms", "100".to_string()),
        ("allow.auto.create.topics", "false".to_string()),
    ]
}

fn producer_settings(args: &StageArgs) -> Vec<(&'static str, String)> {
    vec![
        (
            "client.id",
            format!("samsa-stage-{}-{}", args.stage_name(), args.slot),
        ),
        ("acks", "all".to_string()),
        ("enable.idempotence", "true".to_string()),
        ("linger.ms", "5".to_string()),
    ]
}

/// How long a connection of a stage's transactional producer may stay
/// idle before librdkafka closes it (less up to 2 s of jitter per
/// connection): how often a `send_offsets_to_transaction` stalled on a
/// group coordinator that the client dropped gets librdkafka to look again
/// (see [`transactional_producer_settings`]).
pub const PRODUCER_IDLE_CLOSE: Duration = Duration::from_secs(5);

/// Longest pause between two connection attempts of a stage's producer
/// to one broker (librdkafka's default is 10 s; Kafka's Java client waits
/// at most 1 s).
///
/// After a failover a transactional call waits for the new transaction
/// coordinator to be looked up, which librdkafka does only when a retry
/// of its request fails again: with the default, an AddOffsetsToTxn that
/// failed while the killed broker was still named waited up to 10 s more,
/// half of the call's time, after the broker was fenced and a new
/// coordinator named.
pub const PRODUCER_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// librdkafka properties of a stage's transactional producer besides the
/// common ones: its `transactional.id`, idle connections closed after
/// [`PRODUCER_IDLE_CLOSE`], reconnects at most
/// [`PRODUCER_RECONNECT_BACKOFF_MAX`] apart.
///
/// Why close idle connections: librdkafka since 2.10 drops a broker that a
/// Metadata answer leaves out — as Kafka and samsa leave out a fenced
/// broker, which a killed one becomes after its session timeout — but keeps
/// it in its coordinator cache. A TxnOffsetCommit that then finds it there
/// as the group's coordinator waits for a broker connection of the client
/// to change state before it looks the coordinator up again, and
/// `send_offsets_to_transaction` does not enforce its own timeout
/// meanwhile (librdkafka issues 5511 and 5456, open in 2.12). It happens
/// when the killed broker coordinated both the stage's group and its
/// transactional id: AddOffsetsToTxn waits through the failover, the dead
/// broker is dropped meanwhile, and nothing evicts it from the cache first.
/// With every other connection steady the call waited until the watchdog
/// ended the process. A stalled call leaves every connection of the
/// producer idle, and each one closed is such a state change; the first
/// that comes while another connection is up, a second or more after
/// librdkafka's last look, makes it ask for the group's new coordinator
/// (the call then returned 5 to 15 s after it stalled,
/// `tests/it/coordinator_loss.rs`). When those looks still named the dead
/// broker, closing may not be enough: the stage also pokes a slow call
/// ([`watchdog`]).
pub fn transactional_producer_settings(transactional_id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("transactional.id", transactional_id.to_string()),
        (
            "connections.max.idle.ms",
            PRODUCER_IDLE_CLOSE.as_millis().to_string(),
        ),
        (
            "reconnect.backoff.max.ms",
            PRODUCER_RECONNECT_BACKOFF_MAX.as_millis().to_string(),
        ),
    ]
}

fn config(
    connect: &ConnectArgs,
    settings: &[(&'static str, String)],
) -> Result<rdkafka::ClientConfig> {
    let borrowed: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    connect.client_config(&borrowed)
}

fn transactional_stage(args: &StageArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let label = format!("{}/{}", args.stage_name(), args.slot);
    let transactional_id = args.transactional_id();
    let counters = Arc::new(Counters::default());

    let mut producer_settings = producer_settings(args);
    producer_settings.extend(transactional_producer_settings(&transactional_id));
    let producer: Arc<StageProducer> = Arc::new(
        config(&args.connect, &producer_settings)?
            .create_with_context(StageProducerContext::new(&counters))
            .context("cannot create the transactional producer")?,
    );
    let poked = Arc::clone(&producer);
    watchdog::start(TXN_CALL_TIMEOUT + HUNG_CALL, label.clone(), move || {
        // ListGroups goes to every broker the client knows, so each one
        // without a connection gets one: as many changes as brokers.
        if let Err(e) = poked.client().fetch_group_list(None, POKE_TIMEOUT) {
            tracing::info!("poking a slow transactional call: {e}");
        }
    });
    // Fences every earlier producer of this slot and aborts its open
    // transaction, so the committed offsets we start from are final.
    producer
        .init_transactions(TXN_CALL_TIMEOUT)
        .with_context(|| format!("init_transactions for transactional.id {transactional_id}"))?;
    tracing::info!(stage = %label, %transactional_id, "transactional producer ready");

    let transactor = Arc::new(Transactor {
        producer,
        output: args.output.clone(),
        tag: args.tag(),
        label: label.clone(),
        counters: Arc::clone(&counters),
        state: Mutex::new(TxnState::default()),
    });
    let mut consumer_settings = consumer_settings(args);
    consumer_settings.push(("enable.auto.commit", "false".to_string()));
    consumer_settings.push(("enable.auto.offset.store", "false".to_string()));
    let consumer: StageConsumer = config(&args.connect, &consumer_settings)?
        .create_with_context(StageConsumerContext {
            transactor: Arc::clone(&transactor),
        })
        .context("cannot create the consumer")?;
    consumer
        .subscribe(&[args.input.as_str()])
        .with_context(|| format!("cannot subscribe to {}", args.input))?;
    tracing::info!(stage = %label, input = %args.input, output = %args.output, group = %args.group, "stage started");

    let interval = Duration::from_millis(args.txn_interval_ms);
    let mut last_progress = Instant::now();
    let result = loop {
        if stop.load(Ordering::Relaxed) {
            break transactor.commit(&consumer);
        }
        let step = match consumer.poll(MAX_POLL.min(interval)) {
            Some(Ok(msg)) => transactor.process(&msg),
            Some(Err(err)) => {
                log_consumer_error(&label, &err);
                Ok(())
            }
            None => Ok(()),
        };
        if let Some(fatal) = transactor.fatal() {
            break Err(TxnError::Fatal(anyhow!(fatal)));
        }
        let step = match step {
            Err(TxnError::Abortable(err)) => {
                tracing::warn!(stage = %label, "produce failed, aborting: {err}");
                transactor
                    .abort()
                    .and_then(|()| rewind(&consumer).map_err(TxnError::Fatal))
            }
            other => other,
        };
        if let Err(err) = step {
            break Err(err);
        }
        if transactor.due(interval) {
            if let Err(err) = transactor.commit(&consumer) {
                break Err(err);
            }
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            counters.log(&label);
            last_progress = Instant::now();
        }
    };
    counters.log(&label);
    match result {
        Ok(()) => {
            // Leaving the group runs the revoke callback (nothing is open).
            consumer.unsubscribe();
            drop(consumer);
            tracing::info!(stage = %label, "stopped cleanly");
            Ok(ExitCode::SUCCESS)
        }
        Err(TxnError::Fatal(err)) => Err(err.context(format!("stage {label}"))),
        Err(TxnError::Abortable(err)) => Err(anyhow!("stage {label}: cannot recover from {err}")),
    }
}

/// Consumer errors are informational (librdkafka recovers by itself); a
/// lost broker connection, common while brokers restart, is not a warning.
fn log_consumer_error(label: &str, err: &KafkaError) {
    match err {
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
        ) => tracing::debug!(stage = label, "consumer: {err}"),
        _ => tracing::warn!(stage = label, "consumer error: {err}"),
    }
}

/// Consumer context of a plain stage: logs only.
struct PlainConsumerContext;

impl ClientContext for PlainConsumerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        forward_log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        forward_error(&error, reason);
    }
}

impl ConsumerContext for PlainConsumerContext {}

fn plain_stage(args: &StageArgs, stop: &AtomicBool) -> Result<ExitCode> {
    let label = format!("{}/{} (plain)", args.stage_name(), args.slot);
    let counters = Arc::new(Counters::default());
    let producer: StageProducer = config(&args.connect, &producer_settings(args))?
        .create_with_context(StageProducerContext::new(&counters))
        .context("cannot create the producer")?;
    let mut consumer_settings = consumer_settings(args);
    consumer_settings.push(("enable.auto.commit", "true".to_string()));
    let consumer: BaseConsumer<PlainConsumerContext> = config(&args.connect, &consumer_settings)?
        .create_with_context(PlainConsumerContext)
        .context("cannot create the consumer")?;
    consumer
        .subscribe(&[args.input.as_str()])
        .with_context(|| format!("cannot subscribe to {}", args.input))?;
    tracing::info!(stage = %label, input = %args.input, output = %args.output, group = %args.group, "stage started");
    let tag = args.tag();
    let mut last_progress = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(MAX_POLL) {
            Some(Ok(msg)) => {
                let mut value = msg.payload().unwrap_or_default().to_vec();
                value.extend_from_slice(&tag);
                send_blocking(&producer, &args.output, msg.key(), &value)
                    .with_context(|| format!("produce to {}", args.output))?;
                counters.records_in.fetch_add(1, Ordering::Relaxed);
            }
            Some(Err(err)) => log_consumer_error(&label, &err),
            None => {}
        }
        if let Some((code, reason)) = producer.client().fatal_error() {
            bail!("stage {label}: fatal producer error {code:?}: {reason}");
        }
        if last_progress.elapsed() >= PROGRESS_EVERY {
            counters.log(&label);
            last_progress = Instant::now();
        }
    }
    producer
        .flush(client::REQUEST_TIMEOUT)
        .context("flush on stop")?;
    counters.log(&label);
    Ok(ExitCode::SUCCESS)
}
