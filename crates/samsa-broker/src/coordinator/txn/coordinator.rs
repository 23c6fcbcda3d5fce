//! [`TxnCoordinator`]: the handlers, the pending writes, and ownership of
//! `__transaction_state` partitions. See the [module docs](super) for the
//! contract with the runtime.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::error::ResponseError;
use tracing::{info, warn};

use super::api::*;
use super::records::{txn_record, CoordinatorState, Unfinished};
use super::state::{
    is_epoch_exhausted, ProducerIdAndEpoch, TransactionMetadata, TransactionVersion, TxnResult,
    TxnState, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
};
use crate::coordinator::placement::{
    coordinator_partition, LedByImage, CONSUMER_OFFSETS_TOPIC, DEFAULT_CONSUMER_OFFSETS_PARTITIONS,
    DEFAULT_TRANSACTION_STATE_PARTITIONS, TRANSACTION_STATE_TOPIC,
};
use crate::coordinator::{
    illegal_transition, AppendResult, Coordinator, LogEntry, ProducerIdSource, Step, TakesEffect,
    Write, WriteId, WriteIds,
};
use crate::error::{producer_fenced_for_version, txn_append_error_code};
use crate::topic_partition::TopicPartition;

/// Tunables, with Kafka's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnConfig {
    /// `transaction.state.log.num.partitions`.
    pub transaction_state_partitions: i32,
    /// `offsets.topic.num.partitions` (where `AddOffsetsToTxn` places a group).
    pub consumer_offsets_partitions: i32,
    /// `transaction.max.timeout.ms`: the largest timeout a producer may ask for.
    pub max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: an idle id unused this long is forgotten.
    pub transactional_id_expiration_ms: i64,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how
    /// often timed-out transactions are looked for.
    pub abort_check_interval_ms: i64,
    /// `transaction.remove.expired.transaction.cleanup.interval.ms`: how
    /// often idle ids are looked for.
    pub id_expiry_check_interval_ms: i64,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            transaction_state_partitions: DEFAULT_TRANSACTION_STATE_PARTITIONS,
            consumer_offsets_partitions: DEFAULT_CONSUMER_OFFSETS_PARTITIONS,
            max_timeout_ms: 900_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            abort_check_interval_ms: 10_000,
            id_expiry_check_interval_ms: 3_600_000,
        }
    }
}

/// What a handler returns: maybe a write, and the response to send — right
/// away if there is no write, otherwise once the write is durable (through
/// [`TxnStep::response`], which substitutes the error if it failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<R> {
    pub write: Option<Write>,
    pub response: R,
}

/// Write COMMIT/ABORT control records for one transaction.
///
/// Send `WriteTxnMarkers` to the leader of every partition (grouped by
/// broker), retrying each partition until it succeeds, then call
/// [`TxnCoordinator::markers_written`] with this value. An empty
/// `partitions` needs no request: report it written at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteMarkers {
    pub transactional_id: String,
    /// The `__transaction_state` partition whose coordinator sends them.
    pub partition: i32,
    pub coordinator_epoch: i32,
    pub producer_id: i64,
    /// The epoch of the markers: the transaction's for TV1, the bumped one
    /// for TV2 and for fencing aborts (which fences the old epoch on the
    /// partitions).
    pub producer_epoch: i16,
    pub result: TxnResult,
    pub partitions: Vec<TopicPartition>,
}

/// Something the runtime must do after a write became durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    WriteMarkers(WriteMarkers),
}

/// What a call asks of the runtime: writes to persist, markers to send,
/// and — for a completed write — the error its requester gets instead of
/// the planned response.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnStep {
    /// `None`: the write is durable and applied. Otherwise the error to
    /// answer with; the state is unchanged.
    pub error: Option<ResponseError>,
    /// To run now: markers of durable `Prepare*` transactions (after a
    /// write), or of those found unfinished at load.
    pub effects: Vec<Effect>,
    /// Writes to persist (fencing aborts found half-done at load, timed-out
    /// transactions, expired ids).
    pub writes: Vec<Write>,
}

impl TxnStep {
    /// The response to send for a handler's [`Outcome`] whose write this
    /// step completed.
    pub fn response<R: CoordinatorResponse>(&self, response: R) -> R {
        match self.error {
            None => response,
            Some(e) => response.with_error(e),
        }
    }

    fn failed(error: ResponseError) -> Self {
        TxnStep {
            error: Some(error),
            ..TxnStep::default()
        }
    }
}

impl Step for TxnStep {
    fn take_writes(&mut self) -> Vec<Write> {
        std::mem::take(&mut self.writes)
    }

    fn is_empty(&self) -> bool {
        self.effects.is_empty()
    }
}

/// A write handed to the runtime and not yet reported.
#[derive(Debug)]
struct Pending {
    id: WriteId,
    /// The value once durable; `None` forgets the id (tombstone).
    target: Option<TransactionMetadata>,
    /// The state this write moves to (`PrepareEpochFence` for a fencing
    /// abort, `Dead` for a tombstone); blocks other transitions meanwhile.
    label: TxnState,
    effects: Vec<Effect>,
}

#[derive(Debug)]
enum Phase {
    Loading,
    Active {
        state: CoordinatorState,
        pending: BTreeMap<String, Pending>,
    },
}

#[derive(Debug)]
struct Slot {
    coordinator_epoch: i32,
    phase: Phase,
}

/// A decision of a handler before it is turned into an [`Outcome`].
enum Plan<R> {
    Reply(R),
    Write {
        partition: i32,
        transactional_id: String,
        target: Option<TransactionMetadata>,
        label: TxnState,
        effects: Vec<Effect>,
        response: R,
        takes_effect: TakesEffect,
    },
}

/// Why a transaction is fenced and aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FenceCause {
    /// A new instance called `InitProducerId`: the old one must never pass
    /// for a retry afterwards.
    NewInstance,
    /// The transaction outlived its timeout: a TV2 producer may still end
    /// it (its abort is answered as a retry) and carry on.
    Timeout,
}

/// The transaction coordinator of every `__transaction_state` partition
/// this broker leads. Sans-IO: see the [module docs](super).
#[derive(Debug)]
pub struct TxnCoordinator {
    config: TxnConfig,
    slots: BTreeMap<i32, Slot>,
    writes: BTreeMap<WriteId, (i32, String)>,
    write_ids: WriteIds,
    led_by_image: LedByImage,
    /// When [`Coordinator::tick`] next looks for timed-out transactions
    /// and for idle ids to expire (0: at the first tick).
    next_abort_check_ms: i64,
    next_id_expiry_ms: i64,
    /// Write-only meters (transactions ended, timed out); none in unit tests.
    meters: Option<samsa_metrics::coordinators::TxnMeters>,
}

/// A state write from `from` to `to` that is a transaction's last: its
/// markers are all written and it is complete.
fn record_end(
    meters: &samsa_metrics::coordinators::TxnMeters,
    from: &TransactionMetadata,
    to: &TransactionMetadata,
    now_ms: i64,
) {
    use samsa_metrics::coordinators::Outcome;
    let outcome = match (from.state, to.state) {
        (TxnState::PrepareCommit, TxnState::CompleteCommit) => Outcome::Commit,
        (TxnState::PrepareAbort, TxnState::CompleteAbort) => Outcome::Abort,
        _ => return,
    };
    // The Prepare write stamped when the end was decided.
    meters.ended(outcome, now_ms - from.txn_last_update_timestamp);
}

fn markers(
    transactional_id: &str,
    partition: i32,
    coordinator_epoch: i32,
    m: &TransactionMetadata,
    result: TxnResult,
) -> Effect {
    Effect::WriteMarkers(WriteMarkers {
        transactional_id: transactional_id.to_string(),
        partition,
        coordinator_epoch,
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        result,
        partitions: m.partitions.iter().cloned().collect(),
    })
}

/// The epoch after `epoch`, or an internal error at `i16::MAX` (which no
/// client ever holds: see [`super::state::EXHAUSTED_EPOCH`]).
fn bumped(epoch: i16) -> Result<i16, ResponseError> {
    epoch.checked_add(1).ok_or_else(|| {
        warn!(epoch, "producer epoch cannot be bumped any further");
        ResponseError::UnknownServerError
    })
}

impl TxnCoordinator {
    pub fn new(config: TxnConfig) -> Self {
        Self {
            config,
            slots: BTreeMap::new(),
            writes: BTreeMap::new(),
            write_ids: WriteIds::default(),
            led_by_image: LedByImage::default(),
            next_abort_check_ms: 0,
            next_id_expiry_ms: 0,
            meters: None,
        }
    }

    /// Records ended and timed-out transactions into `meters` from now on.
    pub fn with_meters(mut self, meters: samsa_metrics::coordinators::TxnMeters) -> Self {
        self.meters = Some(meters);
        self
    }

    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    // -----------------------------------------------------------------
    // Ownership of state partitions
    // -----------------------------------------------------------------

    fn drop_partition(&mut self, partition: i32) {
        self.slots.remove(&partition);
        self.writes.retain(|_, (p, _)| *p != partition);
    }

    /// Whether requests for `transactional_id` can be served here now:
    /// NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS otherwise.
    pub fn check_coordinator(&self, transactional_id: &str) -> Result<(), ResponseError> {
        self.active(transactional_id).map(|_| ())
    }

    /// The committed state of `transactional_id`, if it is served here.
    pub fn transaction(&self, transactional_id: &str) -> Option<&TransactionMetadata> {
        self.active(transactional_id)
            .ok()
            .and_then(|a| a.state.get(transactional_id))
    }

    fn active(&self, transactional_id: &str) -> Result<ActiveRef<'_>, ResponseError> {
        let partition = self.partition_for(transactional_id);
        match self.slots.get(&partition) {
            None => Err(self.led_by_image.unheld_error(partition)),
            Some(Slot {
                phase: Phase::Loading,
                ..
            }) => Err(ResponseError::CoordinatorLoadInProgress),
            Some(Slot {
                coordinator_epoch,
                phase: Phase::Active { state, pending },
            }) => Ok(ActiveRef {
                partition,
                coordinator_epoch: *coordinator_epoch,
                state,
                pending,
            }),
        }
    }

    // -----------------------------------------------------------------
    // Writes
    // -----------------------------------------------------------------

    /// A request handler's last step: runs its plan (a refusal answered as
    /// `refused` builds it), with PRODUCER_FENCED answered as
    /// INVALID_PRODUCER_EPOCH to versions before `fenced_since`, which do
    /// not know it.
    fn answer<R: CoordinatorResponse>(
        &mut self,
        plan: Result<Plan<R>, ResponseError>,
        refused: impl FnOnce(ResponseError) -> R,
        version: i16,
        fenced_since: i16,
    ) -> Outcome<R> {
        let plan = plan.unwrap_or_else(|e| Plan::Reply(refused(e)));
        let outcome = self.run(plan);
        Outcome {
            write: outcome.write,
            response: outcome
                .response
                .map_errors(|e| producer_fenced_for_version(e, version, fenced_since)),
        }
    }

    fn run<R: CoordinatorResponse>(&mut self, step: Plan<R>) -> Outcome<R> {
        match step {
            Plan::Reply(response) => Outcome {
                write: None,
                response,
            },
            Plan::Write {
                partition,
                transactional_id,
                target,
                label,
                effects,
                response,
                takes_effect,
            } => {
                let Some(Slot {
                    coordinator_epoch,
                    phase: Phase::Active { pending, .. },
                }) = self.slots.get_mut(&partition)
                else {
                    // Handlers only plan writes for active partitions; never
                    // answer success for a write that was not made.
                    return Outcome {
                        write: None,
                        response: response.with_error(ResponseError::NotCoordinator),
                    };
                };
                let id = self.write_ids.next_id();
                let record = txn_record(&transactional_id, target.as_ref());
                pending.insert(
                    transactional_id.clone(),
                    Pending {
                        id,
                        target,
                        label,
                        effects,
                    },
                );
                self.writes
                    .insert(id, (partition, transactional_id.clone()));
                Outcome {
                    write: Some(Write {
                        id,
                        owner: transactional_id,
                        partition,
                        coordinator_epoch: *coordinator_epoch,
                        records: vec![record],
                        transactional: None,
                        takes_effect,
                    }),
                    response,
                }
            }
        }
    }

    // -----------------------------------------------------------------
    // InitProducerId
    // -----------------------------------------------------------------

    /// `InitProducerId` for a transactional id.
    ///
    /// - new id: a new producer id at epoch 0;
    /// - no open transaction: epoch + 1 (a new producer id at epoch 0 once
    ///   the epoch is exhausted); a KIP-360 call must name the current id
    ///   and epoch (or repeat the previous call's) else PRODUCER_FENCED;
    /// - `Ongoing`: fence — the transaction is aborted with epoch + 1 and
    ///   the answer (after that write) is CONCURRENT_TRANSACTIONS, so the
    ///   client retries once the abort completes and gets another bump;
    /// - `Prepare*` or a write in flight: CONCURRENT_TRANSACTIONS.
    pub fn init_producer_id(
        &mut self,
        request: &InitProducerIdRequest,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Outcome<InitProducerIdResponse> {
        let plan = self.plan_init_producer_id(request, now_ms, ids);
        self.answer(plan, InitProducerIdResponse::error, request.version, 4)
    }

    /// Long on purpose: one match over the id's state is the decision table
    /// of `InitProducerId` (new id, idle, open, preparing, fenced, KIP-360
    /// retries), read top to bottom as the doc of [`Self::init_producer_id`] lists it.
    fn plan_init_producer_id(
        &self,
        request: &InitProducerIdRequest,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<Plan<InitProducerIdResponse>, ResponseError> {
        let id = request.transactional_id.as_str();
        if id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let timeout_ms = request.transaction_timeout_ms;
        if timeout_ms <= 0 || timeout_ms > self.config.max_timeout_ms {
            return Err(ResponseError::InvalidTransactionTimeout);
        }
        let active = self.active(id)?;
        if active.pending.contains_key(id) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let Some(m) = active.state.get(id) else {
            let producer_id = ids.next_producer_id()?;
            let target = TransactionMetadata {
                producer_id,
                producer_epoch: 0,
                last_producer_id: NO_PRODUCER_ID,
                last_producer_epoch: NO_PRODUCER_EPOCH,
                next_producer_id: NO_PRODUCER_ID,
                timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                txn_start_timestamp: -1,
                txn_last_update_timestamp: now_ms,
                transaction_version: TransactionVersion::V1,
            };
            info!(transactional_id = id, producer_id, "new transactional id");
            let response = InitProducerIdResponse::ok(ProducerIdAndEpoch::new(producer_id, 0));
            return active.write(id, None, target, TxnState::Empty, Vec::new(), response);
        };
        if let Some(given) = request.current {
            if given.producer_id != m.producer_id && m.last() != Some(given) {
                return Err(ResponseError::ProducerFenced);
            }
        }
        match m.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                Err(ResponseError::ConcurrentTransactions)
            }
            TxnState::Ongoing | TxnState::PrepareEpochFence => {
                info!(
                    transactional_id = id,
                    producer_id = m.producer_id,
                    epoch = m.producer_epoch,
                    "fencing the previous producer and aborting its transaction"
                );
                // The answer, once the abort is durable, sends the client
                // back to retry: by then the abort has completed (or is
                // completing) and the retry bumps the epoch again.
                let response = InitProducerIdResponse::error(ResponseError::ConcurrentTransactions);
                self.fence(
                    active.partition,
                    id,
                    m,
                    FenceCause::NewInstance,
                    now_ms,
                    ids,
                    response,
                )
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let mut t = m.clone();
                t.state = TxnState::Empty;
                t.timeout_ms = timeout_ms;
                t.partitions.clear();
                t.txn_start_timestamp = -1;
                t.txn_last_update_timestamp = now_ms;
                t.next_producer_id = NO_PRODUCER_ID;
                match request.current {
                    // A retry of a call that already bumped: same answer.
                    Some(given) if m.last() == Some(given) => {}
                    Some(given) if given != m.current() => {
                        return Err(ResponseError::ProducerFenced);
                    }
                    _ => {
                        if is_epoch_exhausted(m.producer_epoch) {
                            t.producer_id = ids.next_producer_id()?;
                            t.producer_epoch = 0;
                            info!(
                                transactional_id = id,
                                old = m.producer_id,
                                new = t.producer_id,
                                "producer epoch exhausted, new producer id"
                            );
                        } else {
                            t.producer_epoch = bumped(m.producer_epoch)?;
                        }
                        t.set_last(request.current.map(|_| m.current()));
                    }
                }
                let response = InitProducerIdResponse::ok(t.current());
                active.write(id, Some(m), t, TxnState::Empty, Vec::new(), response)
            }
            TxnState::Dead => Err(ResponseError::ConcurrentTransactions),
        }
    }

    /// Plans the fencing abort of `m`'s open transaction: `PrepareAbort`
    /// with the epoch bumped, markers at that epoch once durable.
    #[allow(clippy::too_many_arguments)]
    fn fence<R>(
        &self,
        partition: i32,
        id: &str,
        m: &TransactionMetadata,
        cause: FenceCause,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
        response: R,
    ) -> Result<Plan<R>, ResponseError> {
        let coordinator_epoch = self.coordinator_epoch(partition).unwrap_or(-1);
        let mut t = m.clone();
        t.state = TxnState::PrepareAbort;
        t.producer_epoch = bumped(m.producer_epoch)?;
        t.txn_last_update_timestamp = now_ms;
        t.next_producer_id = NO_PRODUCER_ID;
        if cause == FenceCause::Timeout && m.transaction_version == TransactionVersion::V2 {
            // The producer may end this transaction itself (answered as a
            // retry) and go on with the bumped epoch — or with a new id if
            // that epoch can go no further.
            t.set_last(Some(m.current()));
            if t.producer_epoch == i16::MAX {
                t.next_producer_id = ids.next_producer_id()?;
            }
        } else {
            t.set_last(None);
        }
        if m.state != TxnState::PrepareEpochFence {
            check_transition(id, Some(m.state), TxnState::PrepareEpochFence)?;
        }
        check_transition(
            id,
            Some(TxnState::PrepareEpochFence),
            TxnState::PrepareAbort,
        )?;
        let effect = markers(id, partition, coordinator_epoch, &t, TxnResult::Abort);
        Ok(Plan::Write {
            partition,
            transactional_id: id.to_string(),
            target: Some(t),
            label: TxnState::PrepareEpochFence,
            effects: vec![effect],
            response,
            takes_effect: TakesEffect::OnceDurable,
        })
    }

    // -----------------------------------------------------------------
    // AddPartitionsToTxn / AddOffsetsToTxn
    // -----------------------------------------------------------------

    /// `AddPartitionsToTxn` for one transaction.
    ///
    /// Adding (v0–v3 from TV1 clients; v4+ without `verify_only` from
    /// partition leaders for TV2 producers) starts the transaction if none is
    /// open, or extends the open one. Partitions already in the ongoing
    /// transaction are answered at once, without a write.
    ///
    /// `verify_only` (v4+) changes nothing and answers per partition: none
    /// if it is in the ongoing transaction, TRANSACTION_ABORTABLE if not.
    ///
    /// Errors (for every partition): INVALID_PRODUCER_ID_MAPPING (unknown id
    /// or another producer id), PRODUCER_FENCED (another epoch;
    /// INVALID_PRODUCER_EPOCH before v2), CONCURRENT_TRANSACTIONS (a
    /// transaction is completing, or a write is in flight), NOT_COORDINATOR,
    /// COORDINATOR_LOAD_IN_PROGRESS, INVALID_REQUEST (empty id).
    pub fn add_partitions_to_txn(
        &mut self,
        request: &AddPartitionsRequest,
        now_ms: i64,
    ) -> Outcome<AddPartitionsResponse> {
        let plan = if request.verify_only {
            Ok(Plan::Reply(self.verify_partitions(request)))
        } else {
            let version = if request.version >= 4 {
                TransactionVersion::V2
            } else {
                TransactionVersion::V1
            };
            self.plan_add_partitions(
                &request.transactional_id,
                ProducerIdAndEpoch::new(request.producer_id, request.producer_epoch),
                &request.partitions,
                version,
                now_ms,
            )
        };
        let refused =
            |e| AddPartitionsResponse::all(&request.transactional_id, &request.partitions, Some(e));
        self.answer(plan, refused, request.version, 2)
    }

    /// `AddOffsetsToTxn`: adds partition `coordinator_partition(group)` of
    /// `__consumer_offsets`, with the errors of `AddPartitionsToTxn`.
    pub fn add_offsets_to_txn(
        &mut self,
        request: &AddOffsetsRequest,
        now_ms: i64,
    ) -> Outcome<AddOffsetsResponse> {
        let partition = TopicPartition::new(
            CONSUMER_OFFSETS_TOPIC,
            coordinator_partition(&request.group_id, self.config.consumer_offsets_partitions),
        );
        let partitions = [partition];
        let plan = self.plan_add_partitions(
            &request.transactional_id,
            ProducerIdAndEpoch::new(request.producer_id, request.producer_epoch),
            &partitions,
            TransactionVersion::V1,
            now_ms,
        );
        let refused =
            |e| AddPartitionsResponse::all(&request.transactional_id, &partitions, Some(e));
        let outcome = self.answer(plan, refused, request.version, 2);
        Outcome {
            write: outcome.write,
            response: AddOffsetsResponse {
                error: outcome.response.error(),
            },
        }
    }

    fn plan_add_partitions(
        &self,
        id: &str,
        producer: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        version: TransactionVersion,
        now_ms: i64,
    ) -> Result<Plan<AddPartitionsResponse>, ResponseError> {
        if id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let active = self.active(id)?;
        let m = active
            .state
            .get(id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if m.producer_id != producer.producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if m.producer_epoch != producer.epoch {
            return Err(ResponseError::ProducerFenced);
        }
        if active.pending.contains_key(id) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let ok = AddPartitionsResponse::all(id, partitions, None);
        match m.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                Err(ResponseError::ConcurrentTransactions)
            }
            TxnState::Dead => Err(ResponseError::InvalidProducerIdMapping),
            TxnState::Ongoing if partitions.iter().all(|tp| m.partitions.contains(tp)) => {
                Ok(Plan::Reply(ok))
            }
            // Nothing to add and no transaction to extend: nothing to record.
            _ if partitions.is_empty() => Ok(Plan::Reply(ok)),
            TxnState::Ongoing
            | TxnState::Empty
            | TxnState::CompleteCommit
            | TxnState::CompleteAbort => {
                let mut t = m.clone();
                if m.state != TxnState::Ongoing {
                    t.txn_start_timestamp = now_ms;
                }
                t.state = TxnState::Ongoing;
                t.partitions.extend(partitions.iter().cloned());
                t.txn_last_update_timestamp = now_ms;
                t.transaction_version = version;
                active.write(id, Some(m), t, TxnState::Ongoing, Vec::new(), ok)
            }
        }
    }

    fn verify_partitions(&self, request: &AddPartitionsRequest) -> AddPartitionsResponse {
        let id = request.transactional_id.as_str();
        let all = |e| AddPartitionsResponse::all(id, &request.partitions, Some(e));
        if id.is_empty() {
            return all(ResponseError::InvalidRequest);
        }
        let active = match self.active(id) {
            Ok(a) => a,
            Err(e) => return all(e),
        };
        // Committed state only: a write in flight will be checked again
        // when it completes, and partitions enter the set only then.
        let Some(m) = active.state.get(id) else {
            return all(ResponseError::InvalidProducerIdMapping);
        };
        if m.producer_id != request.producer_id {
            return all(ResponseError::InvalidProducerIdMapping);
        }
        if m.producer_epoch != request.producer_epoch {
            return all(ResponseError::ProducerFenced);
        }
        if matches!(
            m.state,
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence
        ) {
            return all(ResponseError::ConcurrentTransactions);
        }
        let ongoing = m.state == TxnState::Ongoing;
        AddPartitionsResponse {
            transactional_id: id.to_string(),
            results: request
                .partitions
                .iter()
                .map(|tp| {
                    let error = (!(ongoing && m.partitions.contains(tp)))
                        .then_some(ResponseError::TransactionAbortable);
                    (tp.clone(), error)
                })
                .collect(),
        }
    }

    // -----------------------------------------------------------------
    // EndTxn and markers
    // -----------------------------------------------------------------

    /// `EndTxn`: ends the ongoing transaction with `Prepare*` (answered once
    /// durable; the markers follow as an effect). v5+ (TV2) bumps the epoch
    /// and answers the id and epoch for the next transaction.
    ///
    /// Retries: TV1 compares the epoch exactly, and a completed transaction
    /// answers success for the same outcome, INVALID_TXN_STATE for the
    /// other, CONCURRENT_TRANSACTIONS while it completes. TV2 recognises a
    /// retry only by the exact id and epoch the just-ended transaction ran
    /// with, and only while that transaction is the last one — once the
    /// next transaction has begun, a stale `EndTxn` is PRODUCER_FENCED
    /// instead of ending it (the KAFKA-17754 anomaly). (TV1 cannot tell a
    /// delayed `EndTxn` from a new one at the same epoch; preventing that
    /// is what TV2's bump at every end is for.)
    pub fn end_txn(
        &mut self,
        request: &EndTxnRequest,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Outcome<EndTxnResponse> {
        let plan = self.plan_end_txn(request, now_ms, ids);
        self.answer(plan, EndTxnResponse::error, request.version, 2)
    }

    /// Long on purpose: one match over the transaction's state and the
    /// request's (TV1/TV2, retry, stale epoch, fence) is the decision table
    /// of `EndTxn`, kept whole so every case is seen beside the others.
    fn plan_end_txn(
        &self,
        request: &EndTxnRequest,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<Plan<EndTxnResponse>, ResponseError> {
        let id = request.transactional_id.as_str();
        if id.is_empty() {
            return Err(ResponseError::InvalidRequest);
        }
        let active = self.active(id)?;
        let m = active
            .state
            .get(id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        let given = ProducerIdAndEpoch::new(request.producer_id, request.producer_epoch);
        let result = request.result;
        let pending = active.pending.contains_key(id);
        let invalid_state = || {
            info!(transactional_id = id, state = %m.state, ?result, "EndTxn in a state that cannot take it");
            Err(ResponseError::InvalidTxnState)
        };

        if request.version < 5 {
            if m.producer_id != given.producer_id {
                return Err(ResponseError::InvalidProducerIdMapping);
            }
            if m.producer_epoch != given.epoch {
                return Err(ResponseError::ProducerFenced);
            }
            if pending {
                return Err(ResponseError::ConcurrentTransactions);
            }
            return match m.state {
                TxnState::Ongoing => {
                    let mut t = m.clone();
                    t.state = result.prepare_state();
                    t.txn_last_update_timestamp = now_ms;
                    t.transaction_version = TransactionVersion::V1;
                    t.next_producer_id = NO_PRODUCER_ID;
                    let effect =
                        markers(id, active.partition, active.coordinator_epoch, &t, result);
                    let label = t.state;
                    active.write(
                        id,
                        Some(m),
                        t,
                        label,
                        vec![effect],
                        EndTxnResponse::ok(None),
                    )
                }
                s if s == result.complete_state() => Ok(Plan::Reply(EndTxnResponse::ok(None))),
                s if s == result.prepare_state() => Err(ResponseError::ConcurrentTransactions),
                TxnState::PrepareEpochFence => Err(ResponseError::ConcurrentTransactions),
                _ => invalid_state(),
            };
        }

        // Transaction version 2.
        let ended = matches!(
            m.state,
            TxnState::PrepareCommit
                | TxnState::PrepareAbort
                | TxnState::CompleteCommit
                | TxnState::CompleteAbort
        );
        let retry =
            ended && m.transaction_version == TransactionVersion::V2 && m.last() == Some(given);
        let current = m.current() == given;
        if m.producer_id != given.producer_id && !retry {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if pending {
            return Err(ResponseError::ConcurrentTransactions);
        }
        if !current && !retry {
            return Err(ResponseError::ProducerFenced);
        }
        match m.state {
            TxnState::Ongoing => {
                let mut t = m.clone();
                t.state = result.prepare_state();
                t.producer_epoch = bumped(m.producer_epoch)?;
                t.set_last(Some(m.current()));
                t.txn_last_update_timestamp = now_ms;
                t.transaction_version = TransactionVersion::V2;
                t.next_producer_id = NO_PRODUCER_ID;
                if t.producer_epoch == i16::MAX {
                    t.next_producer_id = ids.next_producer_id()?;
                }
                let effect = markers(id, active.partition, active.coordinator_epoch, &t, result);
                let response = EndTxnResponse::ok(Some(t.after_completion()));
                let label = t.state;
                active.write(id, Some(m), t, label, vec![effect], response)
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                if current {
                    // The client already holds the epoch of its next
                    // transaction: let it retry once this one is complete.
                    Err(ResponseError::ConcurrentTransactions)
                } else if m.state == result.prepare_state() {
                    Err(ResponseError::ConcurrentTransactions)
                } else {
                    invalid_state()
                }
            }
            TxnState::CompleteCommit | TxnState::CompleteAbort if retry => {
                if m.state == result.complete_state() {
                    Ok(Plan::Reply(EndTxnResponse::ok(Some(m.current()))))
                } else {
                    invalid_state()
                }
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                if result.is_commit() {
                    return invalid_state();
                }
                // Aborting a transaction that added nothing: no markers,
                // straight to CompleteAbort with the epoch bumped.
                let mut t = m.clone();
                t.state = TxnState::CompleteAbort;
                t.partitions.clear();
                t.set_last(Some(m.current()));
                t.txn_last_update_timestamp = now_ms;
                if t.txn_start_timestamp < 0 {
                    t.txn_start_timestamp = now_ms;
                }
                t.transaction_version = TransactionVersion::V2;
                t.next_producer_id = NO_PRODUCER_ID;
                t.producer_epoch = bumped(m.producer_epoch)?;
                if t.producer_epoch == i16::MAX {
                    t.producer_id = ids.next_producer_id()?;
                    t.producer_epoch = 0;
                }
                let response = EndTxnResponse::ok(Some(t.current()));
                active.write(
                    id,
                    Some(m),
                    t,
                    TxnState::CompleteAbort,
                    Vec::new(),
                    response,
                )
            }
            TxnState::PrepareEpochFence => Err(ResponseError::ConcurrentTransactions),
            TxnState::Dead => invalid_state(),
        }
    }

    /// Every marker of `markers` is written: plans the `Complete*` write.
    ///
    /// Errors mean "drop it": NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS
    /// (the partition moved or is being reloaded; a load re-issues the
    /// markers it finds pending), INVALID_TXN_STATE (the transaction is no longer
    /// the one these markers end), CONCURRENT_TRANSACTIONS (a write is in
    /// flight; cannot happen while `Prepare*` is the state). If the
    /// returned write fails with anything but NOT_COORDINATOR, call this
    /// again after a backoff.
    pub fn markers_written(
        &mut self,
        markers: &WriteMarkers,
        now_ms: i64,
    ) -> Result<Write, ResponseError> {
        let step = self.plan_markers_written(markers, now_ms)?;
        self.run(step).write.ok_or(ResponseError::NotCoordinator)
    }

    fn plan_markers_written(
        &self,
        markers: &WriteMarkers,
        now_ms: i64,
    ) -> Result<Plan<()>, ResponseError> {
        let id = markers.transactional_id.as_str();
        let active = self.active(id)?;
        if active.partition != markers.partition
            || active.coordinator_epoch != markers.coordinator_epoch
        {
            return Err(ResponseError::NotCoordinator);
        }
        if active.pending.contains_key(id) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let m = active.state.get(id).ok_or(ResponseError::InvalidTxnState)?;
        if m.state != markers.result.prepare_state()
            || m.producer_id != markers.producer_id
            || m.producer_epoch != markers.producer_epoch
        {
            return Err(ResponseError::InvalidTxnState);
        }
        let mut t = m.clone();
        t.state = markers.result.complete_state();
        t.partitions.clear();
        t.txn_last_update_timestamp = now_ms;
        if t.next_producer_id != NO_PRODUCER_ID {
            t.producer_id = t.next_producer_id;
            t.producer_epoch = 0;
            t.next_producer_id = NO_PRODUCER_ID;
        }
        let label = t.state;
        // Takes effect once appended: the markers are written and the
        // client was answered at `Prepare*`, so nobody is told of this
        // record, and if it is lost with this leader the next coordinator
        // replays `Prepare*`, sends the markers again (they are idempotent)
        // and writes it again. Waiting for it to be durable would hold the
        // id's next `AddPartitionsToTxn` behind one more fsync and
        // replication round; that request's own `Ongoing` record follows
        // it in the same log, so its acks=all covers this one.
        let mut plan = active.write(id, Some(m), t, label, Vec::new(), ())?;
        if let Plan::Write { takes_effect, .. } = &mut plan {
            *takes_effect = TakesEffect::OnceAppended;
        }
        Ok(plan)
    }

    // -----------------------------------------------------------------
    // Timers
    // -----------------------------------------------------------------

    /// Transactions `Ongoing` for longer than their timeout (started before
    /// `now_ms - timeout`), without a write in flight.
    pub fn expired_transactions(&self, now_ms: i64) -> Vec<ExpiredTransaction> {
        let mut out = Vec::new();
        for slot in self.slots.values() {
            let Phase::Active { state, pending } = &slot.phase else {
                continue;
            };
            for (id, m) in state.iter() {
                let open = matches!(m.state, TxnState::Ongoing | TxnState::PrepareEpochFence);
                if open
                    && !pending.contains_key(id)
                    && m.txn_start_timestamp
                        .saturating_add(i64::from(m.timeout_ms))
                        < now_ms
                {
                    out.push(ExpiredTransaction {
                        transactional_id: id.clone(),
                        producer_id: m.producer_id,
                        producer_epoch: m.producer_epoch,
                        start_time_ms: m.txn_start_timestamp,
                        timeout_ms: m.timeout_ms,
                    });
                }
            }
        }
        out
    }

    /// Aborts one transaction listed by [`Self::expired_transactions`], if
    /// it is still that transaction (same producer id and epoch, still open,
    /// nothing in flight): the epoch is bumped, which fences the producer's
    /// further writes, and markers follow the write as an effect. A TV2
    /// producer may then end the transaction itself (answered as a retry of
    /// an abort) and carry on with the bumped epoch; a TV1 producer is fenced.
    pub fn abort_expired(
        &mut self,
        expired: &ExpiredTransaction,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<Write, ResponseError> {
        let step = self.plan_abort_expired(expired, now_ms, ids)?;
        self.run(step).write.ok_or(ResponseError::NotCoordinator)
    }

    fn plan_abort_expired(
        &self,
        expired: &ExpiredTransaction,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<Plan<()>, ResponseError> {
        let id = expired.transactional_id.as_str();
        let active = self.active(id)?;
        if active.pending.contains_key(id) {
            return Err(ResponseError::ConcurrentTransactions);
        }
        let m = active
            .state
            .get(id)
            .ok_or(ResponseError::InvalidProducerIdMapping)?;
        if m.producer_id != expired.producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if m.producer_epoch != expired.producer_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        if !matches!(m.state, TxnState::Ongoing | TxnState::PrepareEpochFence) {
            return Err(ResponseError::InvalidTxnState);
        }
        info!(
            transactional_id = id,
            producer_id = m.producer_id,
            epoch = m.producer_epoch,
            timeout_ms = m.timeout_ms,
            "aborting a transaction that timed out"
        );
        if let Some(meters) = &self.meters {
            meters.timed_out();
        }
        self.fence(
            active.partition,
            id,
            m,
            FenceCause::Timeout,
            now_ms,
            ids,
            (),
        )
    }

    /// [`Self::expired_transactions`] then [`Self::abort_expired`] for each:
    /// the writes to hand to the runtime.
    pub fn abort_expired_transactions(
        &mut self,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Vec<Write> {
        let mut writes = Vec::new();
        for expired in self.expired_transactions(now_ms) {
            match self.abort_expired(&expired, now_ms, ids) {
                Ok(w) => writes.push(w),
                Err(e) => {
                    warn!(transactional_id = expired.transactional_id, error = %e, "cannot abort a timed-out transaction now")
                }
            }
        }
        writes
    }

    /// Tombstones for ids with no open transaction and unchanged for
    /// `transactional_id_expiration_ms` (`Dead` while the write is in
    /// flight; forgotten once it is durable).
    pub fn expire_transactional_ids(&mut self, now_ms: i64) -> Vec<Write> {
        let expiration = self.config.transactional_id_expiration_ms;
        let mut steps = Vec::new();
        for (partition, slot) in &self.slots {
            let Phase::Active { state, pending } = &slot.phase else {
                continue;
            };
            for (id, m) in state.iter() {
                if m.state.is_idle()
                    && !pending.contains_key(id)
                    && m.txn_last_update_timestamp.saturating_add(expiration) <= now_ms
                    && check_transition(id, Some(m.state), TxnState::Dead).is_ok()
                {
                    steps.push(Plan::Write {
                        partition: *partition,
                        transactional_id: id.clone(),
                        target: None,
                        label: TxnState::Dead,
                        effects: Vec::new(),
                        response: (),
                        takes_effect: TakesEffect::OnceDurable,
                    });
                }
            }
        }
        steps
            .into_iter()
            .filter_map(|step| self.run(step).write)
            .collect()
    }

    // -----------------------------------------------------------------
    // Read-only views
    // -----------------------------------------------------------------

    /// `DescribeTransactions`: the committed state of each id (a write in
    /// flight is not shown), or its error: INVALID_REQUEST (empty id),
    /// NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, TRANSACTIONAL_ID_NOT_FOUND.
    pub fn describe_transactions(&self, transactional_ids: &[String]) -> Vec<DescribedTransaction> {
        transactional_ids
            .iter()
            .map(|id| {
                if id.is_empty() {
                    return DescribedTransaction::error(id, ResponseError::InvalidRequest);
                }
                let active = match self.active(id) {
                    Ok(a) => a,
                    Err(e) => return DescribedTransaction::error(id, e),
                };
                let Some(m) = active.state.get(id) else {
                    return DescribedTransaction::error(id, ResponseError::TransactionalIdNotFound);
                };
                let mut topics: Vec<(String, Vec<i32>)> = Vec::new();
                for tp in &m.partitions {
                    match topics.last_mut() {
                        Some((topic, parts)) if *topic == tp.topic => parts.push(tp.partition),
                        _ => topics.push((tp.topic.clone(), vec![tp.partition])),
                    }
                }
                DescribedTransaction {
                    transactional_id: id.clone(),
                    error: None,
                    state: m.state.name(),
                    producer_id: m.producer_id,
                    producer_epoch: m.producer_epoch,
                    timeout_ms: m.timeout_ms,
                    start_time_ms: m.txn_start_timestamp,
                    topics,
                }
            })
            .collect()
    }

    /// `ListTransactions` over every loaded partition; COORDINATOR_LOAD_IN_PROGRESS
    /// (and nothing listed) while any partition is loading. The duration
    /// filter keeps transactions whose start is more than that many ms
    /// before `now_ms`, as Kafka compares it.
    pub fn list_transactions(
        &self,
        filter: &ListTransactionsFilter,
        now_ms: i64,
    ) -> ListTransactionsResponse {
        let mut response = ListTransactionsResponse::default();
        if self
            .slots
            .values()
            .any(|s| matches!(s.phase, Phase::Loading))
        {
            response.error = Some(ResponseError::CoordinatorLoadInProgress);
            return response;
        }
        let mut states = BTreeSet::new();
        for name in &filter.states {
            match TxnState::from_name(name) {
                Some(s) => {
                    states.insert(s);
                }
                None => response.unknown_state_filters.push(name.clone()),
            }
        }
        for slot in self.slots.values() {
            let Phase::Active { state, .. } = &slot.phase else {
                continue;
            };
            for (id, m) in state.iter() {
                let include = m.state != TxnState::Dead
                    && (filter.producer_ids.is_empty()
                        || filter.producer_ids.contains(&m.producer_id))
                    && (filter.states.is_empty() || states.contains(&m.state))
                    && (filter.duration_filter_ms < 0
                        || now_ms.saturating_sub(m.txn_start_timestamp)
                            > filter.duration_filter_ms);
                if include {
                    response.transactions.push(ListedTransaction {
                        transactional_id: id.clone(),
                        producer_id: m.producer_id,
                        state: m.state.name(),
                    });
                }
            }
        }
        response
            .transactions
            .sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        response
    }
}

impl Coordinator for TxnCoordinator {
    type Step = TxnStep;
    type Replayed = CoordinatorState;
    const STATE_TOPIC: &'static str = TRANSACTION_STATE_TOPIC;
    const USES_PRODUCER_IDS: bool = true;
    const DEADLINES_FOLLOW_CALLS: bool = false;

    /// The `__transaction_state` partition of `transactional_id`.
    fn partition_for(&self, transactional_id: &str) -> i32 {
        coordinator_partition(transactional_id, self.config.transaction_state_partitions)
    }

    /// The state partitions the current metadata image says this broker
    /// leads; true if one of them is not loading or loaded yet.
    fn set_led_by_image(&mut self, led: LedByImage) -> bool {
        self.led_by_image = led;
        self.led_by_image
            .awaits_load(|p| self.slots.contains_key(&p))
    }

    /// The leader epoch at which `partition` is held (loading or loaded).
    fn coordinator_epoch(&self, partition: i32) -> Option<i32> {
        self.slots.get(&partition).map(|s| s.coordinator_epoch)
    }

    /// This broker became leader of `partition` at `coordinator_epoch`
    /// (its leader epoch): requests for its ids answer
    /// COORDINATOR_LOAD_IN_PROGRESS until [`finish_loading`](crate::coordinator::Coordinator::finish_loading). Whatever
    /// was held for the partition before is dropped, with its pending writes.
    /// Returns false (and changes nothing) for an epoch older than the one
    /// held.
    fn begin_loading(&mut self, partition: i32, coordinator_epoch: i32) -> Option<TxnStep> {
        if let Some(slot) = self.slots.get(&partition) {
            if slot.coordinator_epoch > coordinator_epoch {
                return None;
            }
        }
        self.drop_partition(partition);
        self.slots.insert(
            partition,
            Slot {
                coordinator_epoch,
                phase: Phase::Loading,
            },
        );
        Some(TxnStep::default())
    }

    fn replay(entries: Vec<LogEntry>) -> Result<CoordinatorState, String> {
        // Markers are not transaction state.
        let records = entries.into_iter().filter_map(|entry| match entry {
            LogEntry::Record { key, value, .. } => Some((key, value)),
            LogEntry::Marker { .. } => None,
        });
        CoordinatorState::replay(records).map_err(|e| e.to_string())
    }

    /// The partition's records are replayed into `state`: serve its ids.
    ///
    /// Returns the markers to (re)send for `Prepare*` transactions and the
    /// writes that finish half-fenced ones, or NOT_COORDINATOR if the
    /// partition is no longer loading at this epoch (the load is stale).
    fn finish_loading(
        &mut self,
        partition: i32,
        coordinator_epoch: i32,
        state: CoordinatorState,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Result<TxnStep, ResponseError> {
        match self.slots.get(&partition) {
            Some(Slot {
                coordinator_epoch: e,
                phase: Phase::Loading,
            }) if *e == coordinator_epoch => {}
            _ => return Err(ResponseError::NotCoordinator),
        }
        let unfinished = state.unfinished();
        let mut loaded = TxnStep::default();
        let mut steps = Vec::new();
        for (id, action) in unfinished {
            let Some(m) = state.get(&id) else { continue };
            match action {
                Unfinished::SendMarkers(result) => {
                    loaded
                        .effects
                        .push(markers(&id, partition, coordinator_epoch, m, result))
                }
                Unfinished::FenceAndAbort => {
                    match self.fence(partition, &id, m, FenceCause::NewInstance, now_ms, ids, ()) {
                        Ok(step) => steps.push(step),
                        Err(e) => {
                            warn!(transactional_id = id, error = %e, "cannot abort a fenced transaction found at load")
                        }
                    }
                }
            }
        }
        info!(
            partition,
            coordinator_epoch,
            transactional_ids = state.len(),
            to_complete = loaded.effects.len() + steps.len(),
            "transaction state loaded"
        );
        self.slots.insert(
            partition,
            Slot {
                coordinator_epoch,
                phase: Phase::Active {
                    state,
                    pending: BTreeMap::new(),
                },
            },
        );
        for step in steps {
            if let Some(w) = self.run(step).write {
                loaded.writes.push(w);
            }
        }
        Ok(loaded)
    }

    /// This broker no longer leads `partition` (at `coordinator_epoch`, if
    /// known; a newer epoch held is kept). Its ids answer NOT_COORDINATOR
    /// and its pending writes complete with NOT_COORDINATOR; the runtime drops
    /// the partition's marker sends.
    fn unload(&mut self, partition: i32, coordinator_epoch: Option<i32>) -> TxnStep {
        let stale = match (self.slots.get(&partition), coordinator_epoch) {
            (None, _) => return TxnStep::default(),
            (Some(slot), Some(e)) => slot.coordinator_epoch > e,
            (Some(_), None) => false,
        };
        if !stale {
            self.drop_partition(partition);
        }
        TxnStep::default()
    }

    /// The runtime reports the fate of write `id`: `Ok` once it is durable
    /// (acks=all), or the produce path's error. Only now does the state
    /// change (on success); the effects it unlocks are returned.
    ///
    /// An unknown id — the partition was unloaded meanwhile — answers
    /// NOT_COORDINATOR, even if the append succeeded: a new coordinator
    /// will find the record when it loads.
    fn complete_write(&mut self, id: WriteId, result: AppendResult, now_ms: i64) -> TxnStep {
        let not_coordinator = TxnStep::failed(ResponseError::NotCoordinator);
        let Some((partition, transactional_id)) = self.writes.remove(&id) else {
            return not_coordinator;
        };
        let Some(Slot {
            phase: Phase::Active { state, pending },
            ..
        }) = self.slots.get_mut(&partition)
        else {
            return not_coordinator;
        };
        match pending.get(&transactional_id) {
            Some(p) if p.id == id => {}
            _ => return not_coordinator,
        }
        let Some(p) = pending.remove(&transactional_id) else {
            return not_coordinator;
        };
        match result {
            Ok(_) => {
                if let (Some(meters), Some(to), Some(from)) =
                    (&self.meters, &p.target, state.get(&transactional_id))
                {
                    record_end(meters, from, to, now_ms);
                }
                match p.target {
                    Some(m) => state.insert(transactional_id, m),
                    None => state.remove(&transactional_id),
                }
                TxnStep {
                    effects: p.effects,
                    ..TxnStep::default()
                }
            }
            Err(e) => {
                let error = txn_append_error_code(e);
                warn!(transactional_id, to = %p.label, append_error = %e, answer = %error, "transaction state write failed");
                TxnStep::failed(error)
            }
        }
    }

    /// The earlier of the next look for timed-out transactions and the
    /// next expiry of idle transactional ids.
    fn next_deadline(&self) -> Option<i64> {
        Some(self.next_abort_check_ms.min(self.next_id_expiry_ms))
    }

    /// Every `abort_check_interval_ms`, aborts timed-out transactions
    /// ([`Self::abort_expired_transactions`]); every
    /// `id_expiry_check_interval_ms`, expires idle transactional ids
    /// ([`Self::expire_transactional_ids`]).
    fn tick(&mut self, now_ms: i64, ids: &mut dyn ProducerIdSource) -> TxnStep {
        let mut step = TxnStep::default();
        if self.next_abort_check_ms <= now_ms {
            step.writes
                .extend(self.abort_expired_transactions(now_ms, ids));
            self.next_abort_check_ms = now_ms + self.config.abort_check_interval_ms.max(1);
        }
        if self.next_id_expiry_ms <= now_ms {
            step.writes.extend(self.expire_transactional_ids(now_ms));
            self.next_id_expiry_ms = now_ms + self.config.id_expiry_check_interval_ms.max(1);
        }
        step
    }
}

/// An active partition, borrowed for planning.
struct ActiveRef<'a> {
    partition: i32,
    coordinator_epoch: i32,
    state: &'a CoordinatorState,
    pending: &'a BTreeMap<String, Pending>,
}

impl ActiveRef<'_> {
    /// A write moving `id` from `from` (`None`: not known yet) to `target`,
    /// checked against [`TxnState`]'s table.
    fn write<R>(
        &self,
        id: &str,
        from: Option<&TransactionMetadata>,
        target: TransactionMetadata,
        label: TxnState,
        effects: Vec<Effect>,
        response: R,
    ) -> Result<Plan<R>, ResponseError> {
        check_transition(id, from.map(|m| m.state), label)?;
        Ok(Plan::Write {
            partition: self.partition,
            transactional_id: id.to_string(),
            target: Some(target),
            label,
            effects,
            response,
            takes_effect: TakesEffect::OnceDurable,
        })
    }
}

/// Refuses (as UNKNOWN_SERVER_ERROR, logged) a transition the table of
/// [`TxnState`] does not allow; a new id may only become `Empty`.
fn check_transition(id: &str, from: Option<TxnState>, to: TxnState) -> Result<(), ResponseError> {
    let allowed = match from {
        None => to == TxnState::Empty,
        Some(from) => from.can_transition_to(to),
    };
    if allowed {
        Ok(())
    } else {
        Err(illegal_transition(id, &from, &to))
    }
}
