//! The coordinators of a broker: transactions ([`txn`], over
//! `__transaction_state`) and consumer groups ([`group`], over
//! `__consumer_offsets`), and the one runtime that drives both.
//!
//! Each coordinator is a sans-IO state machine — no I/O, no clock, no
//! task: requests, time and producer ids go in, records to write and
//! replies come out — that keeps the [`Coordinator`] contract below. The
//! [`runtime::Runtime`] is its IO side, the same for both: the state topic
//! created on first use ([`state_topic`]), leadership of its partitions
//! followed (load what this broker newly leads by replaying it, unload what
//! it no longer leads), durable appends (acks=all at the coordinator epoch)
//! reported back with [`Coordinator::complete_write`], and the timer
//! ([`Coordinator::next_deadline`] / [`Coordinator::tick`]). What only one
//! coordinator needs lives in its `service` module: markers and KIP-890
//! verification for transactions ([`txn::service`]), requests parked until
//! a rebalance or a write completes for groups ([`group::service`]). Both
//! take and answer plain structs ([`txn::api`], [`group::api`]; their
//! error type is `kafka-protocol`'s `ResponseError`): the wire —
//! `kafka-protocol` messages — is converted in `crate::handlers`.
//!
//! ```text
//!  handler ──▶ runtime.serving() ─▶ &mut C ─▶ C::Step { writes, replies / effects }
//!                                                │
//!    each write: append to <state topic>-partition as leader at coordinator_epoch,
//!                acks=all  ─▶  C::complete_write(id, Ok(base offset) | Err(code), now)
//!                                                │
//!    the rest of a step: Hosted::carry_out (deliver replies, send markers)
//!  leadership of a state partition: begin_loading ─▶ replay(log) ─▶ finish_loading | unload
//!  timer: next_deadline() ─▶ tick(now)
//! ```
//!
//! Invariants both coordinators keep, and the runtime relies on:
//! - **State changes only once durable.** A call that needs a record
//!   registers a pending write and returns it; the state it answers from
//!   moves only when [`Coordinator::complete_write`] reports `Ok`, which
//!   the runtime does once the record is durable, or for a write that
//!   [`TakesEffect::OnceAppended`] once it is in the leader's log (no
//!   client is answered after such a write). A failed write leaves the
//!   state as it was and answers the caller with the coordinator's error
//!   for it.
//! - **Coordinator epoch.** A write is appended only by the leader of its
//!   partition at the leader epoch the partition was loaded at; an unknown
//!   or stale [`WriteId`] (the partition was unloaded) is answered
//!   NOT_COORDINATOR and changes nothing.
//! - **Calls are serialized and short**: the runtime holds the state
//!   machine's mutex for one synchronous call, never across an await.
//! - **An illegal transition is refused**, never applied: it is a bug, not
//!   bad input, so it is logged at ERROR ([`illegal_transition`]) and the
//!   request that caused it, if any, is answered UNKNOWN_SERVER_ERROR
//!   (Kafka's `IllegalStateException`).
//!
//! # Two ways of answering, on purpose
//!
//! Both coordinators hand the runtime one kind of result, a [`Step`]
//! (writes, and what else to carry out), but they answer requests
//! differently, because their requests wait for different things:
//!
//! - **A transaction request waits at most for its own write.** Its answer
//!   is decided when it is handled; only whether its write becomes durable
//!   is open. So a handler returns the answer with the write
//!   ([`txn::Outcome`]), and the step that completes that write says
//!   whether to send it as is or with the append's error
//!   ([`txn::TxnStep::response`]). Nothing is parked, so nothing can be
//!   left unanswered when a partition is unloaded: the caller is awaiting
//!   its own write, which the unload fails.
//! - **A group request may wait for other requests and for time.** A
//!   JoinGroup is answered when the last member joins or the rebalance
//!   timer fires, a follower's SyncGroup when the leader's assignment is
//!   durable: the answer comes from a call made for someone else. So each
//!   request is parked under a [`group::Token`] and answered by whichever
//!   step delivers a reply to it ([`group::GroupStep::deliveries`]), and
//!   unloading a partition delivers NOT_COORDINATOR to everything parked.
//!
//! Giving transactions tokens would add parking (and a way to leak a
//! parked request) to a coordinator that never needs it; giving groups
//! outcomes cannot express an answer caused by another member.

pub mod group;
pub mod placement;
pub mod runtime;
pub mod state_topic;
pub mod txn;

use kafka_protocol::error::ResponseError;

use placement::LedByImage;

/// Identifies one write handed to the runtime, unique per coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(u64);

/// Hands out fresh [`WriteId`]s.
#[derive(Debug, Default)]
pub struct WriteIds {
    next: u64,
}

impl WriteIds {
    pub fn next_id(&mut self) -> WriteId {
        self.next += 1;
        WriteId(self.next)
    }
}

/// One record of a coordinator's state topic (key, and value or tombstone),
/// encoded by the coordinator's record module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRecord {
    pub key: Vec<u8>,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
}

/// Records to append to partition `partition` of a coordinator's state
/// topic, as its leader at leader epoch `coordinator_epoch`, with acks=all;
/// then report the result with [`Coordinator::complete_write`] (when:
/// [`TakesEffect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub id: WriteId,
    /// The transactional id or group the records belong to (for logs).
    pub owner: String,
    pub partition: i32,
    pub coordinator_epoch: i32,
    pub records: Vec<StateRecord>,
    /// Offsets in a transaction: append as a transactional batch of this
    /// producer, after verifying the partition with its transaction.
    pub transactional: Option<TransactionalWrite>,
    pub takes_effect: TakesEffect,
}

/// When the runtime reports a [`Write`] to its coordinator, which is when
/// the transition it carries takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakesEffect {
    /// Once the record is durable: acks=all, covered by the state
    /// partition's HW in the coordinator epoch. Whatever a client is told
    /// after the transition must survive the loss of this leader.
    OnceDurable,
    /// Once the record is appended, as leader at the coordinator epoch;
    /// acks=all is awaited after the report, in the background. For a
    /// transition no client is told of and that a new coordinator repeats
    /// from the previous durable record (the transaction coordinator's
    /// `Complete*` once the markers are written, `markers_written` in
    /// `txn/coordinator.rs`). It is durable before
    /// anything that depends on it: every later write to the partition
    /// lands after it in the same log, and acks=all covers a log's prefix.
    OnceAppended,
}

/// The producer a transactional state write belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionalWrite {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// TxnOffsetCommit v5+ (transaction version 2): the leader adds the
    /// offsets partition to the transaction instead of only verifying it.
    pub add_partition: bool,
}

/// What the runtime reports for a write: `Ok(base offset of its batch)`
/// once it takes effect ([`TakesEffect`]), or the append's error code.
pub type AppendResult = Result<i64, ResponseError>;

/// What one call into a coordinator hands its runtime: writes to make
/// durable, and whatever else only that coordinator's service carries out
/// (replies for parked requests, markers to send).
pub trait Step: Default + Send + 'static {
    /// Takes the writes out; the runtime persists each and reports it.
    fn take_writes(&mut self) -> Vec<Write>;
    /// Whether anything besides writes is left to carry out.
    fn is_empty(&self) -> bool;
}

/// Why bytes are not a valid record of a coordinator's state topic (the
/// record formats of `txn/records.rs` and `group/records.rs`; decoding is
/// total: every malformed input is one of these, never a panic).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("record truncated while reading {0}")]
    Truncated(&'static str),
    #[error("unknown key version {0}")]
    UnknownKeyVersion(u16),
    #[error("unknown value version {0}")]
    UnknownValueVersion(u16),
    #[error("{0} is not valid UTF-8")]
    InvalidUtf8(&'static str),
    #[error("{0} trailing bytes after the value")]
    TrailingBytes(usize),
    #[error("record without a key")]
    NoKey,
    #[error("unknown transaction state id {0}")]
    UnknownState(u8),
    #[error("unknown transaction version {0}")]
    UnknownTransactionVersion(u8),
    #[error("invalid {field} {value}")]
    Invalid { field: &'static str, value: i64 },
}

impl From<crate::codec::Truncated> for RecordError {
    fn from(crate::codec::Truncated(what): crate::codec::Truncated) -> Self {
        RecordError::Truncated(what)
    }
}

/// A log entry of a state partition as the runtime replays it, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEntry {
    /// A data record at `offset`; `producer_id` is set for records of a
    /// transactional batch.
    Record {
        offset: i64,
        producer_id: Option<i64>,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    /// A COMMIT or ABORT marker of a producer.
    Marker { producer_id: i64, commit: bool },
}

/// Where a coordinator gets a new producer id when it needs one (a new
/// transactional id, an exhausted epoch). The runtime answers from a block
/// it already holds; with none ready it returns the error to answer with
/// (Kafka answers COORDINATOR_LOAD_IN_PROGRESS, and the client retries).
pub trait ProducerIdSource {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError>;
}

impl<F: FnMut() -> Result<i64, ResponseError>> ProducerIdSource for F {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError> {
        self()
    }
}

/// The sans-IO contract between a coordinator's state machine and the
/// [`runtime::Runtime`] that drives it (see the module docs).
pub trait Coordinator: Send + 'static {
    type Step: Step;
    /// A state partition's contents rebuilt from its log.
    type Replayed: Send + 'static;
    /// The state topic: `__transaction_state` or `__consumer_offsets`.
    const STATE_TOPIC: &'static str;
    /// Whether [`Self::tick`] and [`Self::finish_loading`] may need producer
    /// ids (the runtime then makes sure a block is held before calling).
    const USES_PRODUCER_IDS: bool;
    /// Whether a call may move [`Self::next_deadline`] (a join phase, a
    /// session), so the runtime's timer must look again after each one;
    /// false when only `tick` moves it (fixed-interval checks).
    const DEADLINES_FOLLOW_CALLS: bool;

    /// The partition of the state topic that owns `key` (a transactional
    /// id or a group id).
    fn partition_for(&self, key: &str) -> i32;
    /// Which state partitions the metadata image says this broker leads
    /// (see [`LedByImage`]); true if one of them is not held yet.
    fn set_led_by_image(&mut self, led: LedByImage) -> bool;
    /// The leader epoch `partition` is held at (loading or loaded).
    fn coordinator_epoch(&self, partition: i32) -> Option<i32>;
    /// This broker became leader of `partition` at `epoch`: its keys answer
    /// COORDINATOR_LOAD_IN_PROGRESS until [`Self::finish_loading`], and what
    /// was held before is dropped (its waiting requests answered). `None`
    /// (nothing changed) when the partition is held at a newer epoch.
    fn begin_loading(&mut self, partition: i32, epoch: i32) -> Option<Self::Step>;
    /// Rebuilds a partition's contents from its entries in log order.
    fn replay(entries: Vec<LogEntry>) -> Result<Self::Replayed, String>;
    /// Serves `partition` from what replay found; the step holds what
    /// loading found unfinished. NOT_COORDINATOR if it is no longer loading
    /// at `epoch` (the load is stale).
    fn finish_loading(
        &mut self,
        partition: i32,
        epoch: i32,
        replayed: Self::Replayed,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<Self::Step, ResponseError>;
    /// This broker no longer leads `partition` (at `epoch`, if known; a
    /// newer epoch held is kept): its keys answer NOT_COORDINATOR and its
    /// pending writes and waiting requests are answered so.
    fn unload(&mut self, partition: i32, epoch: Option<i32>) -> Self::Step;
    /// The fate of write `id`; only now does its state change (on `Ok`).
    fn complete_write(&mut self, id: WriteId, result: AppendResult, now_ms: i64) -> Self::Step;
    /// The earliest time [`Self::tick`] has something to do.
    fn next_deadline(&self) -> Option<i64>;
    /// Runs what is due by `now_ms` (expired sessions, timed-out
    /// transactions, retention).
    fn tick(&mut self, now_ms: i64, ids: &mut dyn ProducerIdSource) -> Self::Step;
}

/// The one policy for a transition a state table does not allow: refuse
/// it, log it at ERROR (a bug, not bad input), and answer the request that
/// caused it, if any, UNKNOWN_SERVER_ERROR.
pub fn illegal_transition(
    owner: &str,
    from: &dyn std::fmt::Debug,
    to: &dyn std::fmt::Debug,
) -> ResponseError {
    tracing::error!(
        owner,
        ?from,
        ?to,
        "refusing a state change outside the transition table"
    );
    ResponseError::UnknownServerError
}
