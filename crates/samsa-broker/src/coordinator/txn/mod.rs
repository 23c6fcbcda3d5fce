//! The transaction coordinator, as a sans-IO state machine.
//!
//! A transactional id `T` is coordinated by the leader of partition
//! [`coordinator_partition`](crate::coordinator::placement::coordinator_partition)`(T, 50)` of `__transaction_state`
//! ([`placement`](crate::coordinator::placement)). That partition's records hold the state of every id it
//! owns ([`records`]); the coordinator keeps the latest value of each in
//! memory and decides every transition ([`TxnState`] has the table).
//!
//! Nothing here does I/O, reads a clock or spawns a task. The runtime
//! ([`crate::coordinator::runtime`]) feeds requests, time and producer ids in, and carries writes and
//! effects out:
//!
//! ```text
//!   request ─▶ handler(&mut coordinator, request, now_ms, ids) ─▶ Outcome { write, response }
//!                                                                    │
//!         write == None: send `response` now                         │
//!         write == Some(w): append w.records to __transaction_state-w.partition (acks=all)
//!                              │
//!                              ▼
//!         complete_write(w.id, Ok(base) | Err(produce error), now) ─▶ TxnStep { error, effects, writes }
//!                              │
//!         send completion.response(response)   (the handler's response, or the append's error)
//!         run completion.effects:  WriteMarkers ─▶ WriteTxnMarkers to partition leaders
//!                                        │ all partitions done
//!                                        ▼
//!                              markers_written(&markers, now_ms) ─▶ Write (Complete*) ─▶ as above
//! ```
//!
//! # Pending writes: state changes only once durable
//!
//! A handler never changes the state it answers from. When a transition
//! needs a record, the handler registers a *pending write* for the id (its
//! target value, and the effects it unlocks) and returns the write. Only
//! [`complete_write`](crate::coordinator::Coordinator::complete_write) with `Ok` applies the target and
//! releases the effects (the markers of a `Prepare*`, for instance); with
//! an error it drops them and answers with the coordinator's error for it
//! (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, …), the state untouched. At
//! most one write per id is in flight: meanwhile every request that would
//! change the id answers CONCURRENT_TRANSACTIONS, as Kafka's "pending
//! state" does; read-only calls (verify-only `AddPartitionsToTxn`,
//! `DescribeTransactions`, `ListTransactions`) see the committed state.
//!
//! Records are whole values, not deltas, so a write whose outcome is
//! ambiguous (it timed out, yet became durable later) cannot corrupt the
//! replayed state: the next record of that id replaces it, and nothing it
//! would have unlocked (markers) was ever started.
//!
//! # The runtime's side of the contract
//!
//! 1. **One at a time.** Calls into a [`TxnCoordinator`] are serialized (a
//!    mutex around it; every call is short). Writes may be in flight
//!    concurrently — for different ids.
//! 2. **Writes.** Append [`Write::records`](crate::coordinator::Write) to `__transaction_state`
//!    partition `partition` as its leader *at leader epoch*
//!    `coordinator_epoch` (fail with NOT_LEADER_OR_FOLLOWER if
//!    the epoch moved), with acks=all, then report the result with
//!    [`complete_write`](crate::coordinator::Coordinator::complete_write). The topic is created with
//!    `transaction.state.log.num.partitions` partitions, replication
//!    min(3, brokers), `min.insync.replicas` 2 where possible, unclean
//!    leader election off, and no time or size retention: its records are
//!    the state (a later compaction may keep the newest record per key).
//! 3. **Markers.** For [`Effect::WriteMarkers`], send `WriteTxnMarkers`
//!    (producer id, epoch, commit flag, `coordinator_epoch`, partitions) to
//!    the leaders of the partitions, retrying a partition on retriable
//!    errors (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS*, REQUEST_TIMED_OUT,
//!    …) after refreshing its leader; a partition whose topic was deleted is
//!    done. INVALID_PRODUCER_EPOCH or TRANSACTION_COORDINATOR_FENCED means a
//!    newer epoch or coordinator took over: drop the whole effect. When all
//!    partitions are done call [`TxnCoordinator::markers_written`] and
//!    handle its write like any other (if that write fails with a retriable
//!    error, call `markers_written` again later).
//! 4. **Timers.** At `next_deadline`, `tick` (the [`Coordinator`](crate::coordinator::Coordinator)
//!    contract): every `abort_check_interval_ms` (Kafka: 10 s)
//!    [`TxnCoordinator::abort_expired_transactions`], and every
//!    `id_expiry_check_interval_ms` (Kafka: hourly)
//!    [`TxnCoordinator::expire_transactional_ids`]; both return writes.
//! 5. **Leadership.** On becoming leader of `__transaction_state`-`p` at
//!    leader epoch `e`: [`begin_loading`](crate::coordinator::Coordinator::begin_loading)`(p, e)`, read the
//!    partition from its start to its end, rebuild with
//!    [`CoordinatorState::replay`], then
//!    [`finish_loading`](crate::coordinator::Coordinator::finish_loading) — which returns the markers to
//!    (re)send for `Prepare*` transactions and the writes that finish
//!    half-fenced ones. On losing it: [`unload`](crate::coordinator::Coordinator::unload) and drop
//!    the partition's marker sends. Requests for ids of partitions not held
//!    answer NOT_COORDINATOR, of partitions loading
//!    COORDINATOR_LOAD_IN_PROGRESS.
//! 6. **Producer ids** come from a [`ProducerIdSource`](crate::coordinator::ProducerIdSource): answer from a block
//!    already held; with none ready, return COORDINATOR_LOAD_IN_PROGRESS
//!    (the client retries) and fetch one.
//! 7. **Wire.** Convert `kafka-protocol` messages to the [`api`] structs
//!    and back (one call per transaction of a v4+ `AddPartitionsToTxn`).
//!    Before calling, answer unknown topics as Kafka does
//!    (UNKNOWN_TOPIC_OR_PARTITION for them, OPERATION_NOT_ATTEMPTED for the
//!    request's other partitions); `InitProducerId` without a transactional
//!    id never reaches the coordinator. A partition leader verifying for a
//!    produce maps TRANSACTION_ABORTABLE to INVALID_TXN_STATE and
//!    PRODUCER_FENCED to INVALID_PRODUCER_EPOCH for producers that predate
//!    them. `FindCoordinator(TRANSACTION, T)` names the leader of
//!    [`partition_for`](crate::coordinator::Coordinator::partition_for)`(T)`.
//!
//! # Exactly-once invariants kept here
//!
//! - A transition takes effect only once its record is durable, except the
//!   `Complete*` written once every marker is: no client is answered after
//!   it, so it takes effect once appended (a lost one leaves `Prepare*`,
//!   which the next coordinator finishes again; every later record of the
//!   partition is acknowledged only with it). Markers are written only for
//!   a durable `Prepare*`, and `Complete*` only after every marker.
//! - Fencing bumps the epoch, and the abort markers carry the bumped epoch,
//!   so every partition of the transaction refuses the old producer.
//! - A request from an older transaction never moves a newer one: TV1 needs
//!   the exact current epoch, and a TV2 `EndTxn` is a retry only if it names
//!   exactly the id and epoch of the transaction that just ended — so a
//!   delayed `EndTxn` cannot end the next transaction (KAFKA-17754).
//! - No client ever holds epoch `i16::MAX`, so a fence can always bump;
//!   an epoch that would reach it moves the client to a new producer id.
//!
//! # Where samsa deliberately differs from Kafka 4
//!
//! - A fence caused by a new instance's `InitProducerId` leaves nothing the
//!   fenced instance could pass off as a retry: its TV2 `EndTxn(abort)` is
//!   PRODUCER_FENCED (Kafka accepts any epoch-minus-one abort as a retry,
//!   which gives the zombie the new epoch until the new instance retries).
//!   A fence caused by the *timeout* of a TV2 transaction keeps that
//!   retry, so the producer can abort and carry on as KIP-890 intends.
//! - TV2 `EndTxn` at the new epoch while the previous transaction is still
//!   in `Prepare*` answers CONCURRENT_TRANSACTIONS (retriable) rather than
//!   PRODUCER_FENCED.
//! - `PrepareEpochFence` is never written: the fence and its abort are one
//!   `PrepareAbort` record. A TV2 abort of a transaction that added nothing
//!   writes `CompleteAbort` directly.
//! - `AddPartitionsToTxn` with no partitions changes nothing.
//! - The `Complete*` after the markers takes effect once appended, not once
//!   replicated, so the id's next transaction does not wait for it.
//! - Not implemented: `ListTransactions` v2's transactional-id pattern and
//!   `InitProducerId`'s `keep_prepared_txn` (KIP-939); advertise
//!   `ListTransactions` v0–v1 and `InitProducerId` up to v5.

pub mod api;
mod coordinator;
pub mod grpc;
pub mod markers;
pub mod records;
pub mod service;
pub mod state;
pub mod verify;

#[cfg(test)]
mod tests;

pub use api::*;
pub use coordinator::{Effect, Outcome, TxnConfig, TxnCoordinator, TxnStep, WriteMarkers};
pub use records::{CoordinatorState, ReplayError, Unfinished};
pub use service::TxnRuntime;
pub use state::{ProducerIdAndEpoch, TransactionMetadata, TransactionVersion, TxnResult, TxnState};
