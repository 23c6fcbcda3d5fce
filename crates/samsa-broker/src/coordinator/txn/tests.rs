//! Unit tests of the coordinator's handlers: no sockets, no clock, no disk.
//! The harness plays the runtime: it "persists" writes into an in-memory log
//! per `__transaction_state` partition, and can rebuild a coordinator from
//! that log as a new leader would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;

use super::records::txn_record;
use super::state::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID};
use super::*;
use crate::coordinator::placement::{coordinator_partition, LedByImage};
use crate::coordinator::{Coordinator, ProducerIdSource, StateRecord, TakesEffect, Write};
use crate::topic_partition::TopicPartition;

const TV1_ADD: i16 = 3;
const TV2_ADD: i16 = 5;
const TV1_END: i16 = 4;
const TV2_END: i16 = 5;
const INIT_V: i16 = 5;
const TIMEOUT: i32 = 60_000;

use ResponseError as E;

/// Hands out producer ids from 1000 up, or fails when told to.
struct Pids {
    next: i64,
    fail: Option<ResponseError>,
    handed_out: usize,
}

impl ProducerIdSource for Pids {
    fn next_producer_id(&mut self) -> Result<i64, ResponseError> {
        if let Some(e) = self.fail {
            return Err(e);
        }
        self.handed_out += 1;
        self.next += 1;
        Ok(self.next - 1)
    }
}

struct H {
    c: TxnCoordinator,
    pids: Pids,
    /// Durable records of each `__transaction_state` partition, in order.
    log: BTreeMap<i32, Vec<StateRecord>>,
    epochs: BTreeMap<i32, i32>,
    now: i64,
}

fn tp(topic: &str, partition: i32) -> TopicPartition {
    TopicPartition::new(topic, partition)
}

fn pe(producer_id: i64, epoch: i16) -> ProducerIdAndEpoch {
    ProducerIdAndEpoch::new(producer_id, epoch)
}

fn markers_of(effects: &[Effect]) -> Vec<WriteMarkers> {
    effects
        .iter()
        .map(|e| match e {
            Effect::WriteMarkers(m) => m.clone(),
        })
        .collect()
}

impl H {
    /// A coordinator leading every partition at epoch 0, with an empty log.
    fn new() -> Self {
        Self::with_config(TxnConfig::default())
    }

    fn with_config(config: TxnConfig) -> Self {
        let n = config.transaction_state_partitions;
        let mut h = H {
            c: TxnCoordinator::new(config),
            pids: Pids {
                next: 1000,
                fail: None,
                handed_out: 0,
            },
            log: BTreeMap::new(),
            epochs: BTreeMap::new(),
            now: 1_000_000,
        };
        for p in 0..n {
            h.load(p, 0);
        }
        h
    }

    /// Loads partition `p` at `epoch` from the log, as a new leader would,
    /// and returns what the load asks for.
    fn load(&mut self, p: i32, epoch: i32) -> TxnStep {
        assert!(self.c.begin_loading(p, epoch).is_some());
        self.epochs.insert(p, epoch);
        let records = self.log.get(&p).cloned().unwrap_or_default();
        let state =
            CoordinatorState::replay(records.iter().map(|r| (&r.key, r.value.as_ref()))).unwrap();
        self.c
            .finish_loading(p, epoch, state, self.now, &mut self.pids)
            .unwrap()
    }

    /// Reloads the partition of `id` at the next epoch.
    fn reload(&mut self, id: &str) -> TxnStep {
        let p = self.c.partition_for(id);
        let epoch = self.epochs[&p] + 1;
        self.load(p, epoch)
    }

    /// Puts `m` into the log as the latest record of `id` and reloads.
    fn seed(&mut self, id: &str, m: TransactionMetadata) -> TxnStep {
        let p = self.c.partition_for(id);
        self.log
            .entry(p)
            .or_default()
            .push(txn_record(id, Some(&m)));
        self.reload(id)
    }

    /// The runtime's append succeeding: records become durable, then the
    /// coordinator is told.
    fn persist_write(&mut self, w: Write) -> TxnStep {
        assert_eq!(w.coordinator_epoch, self.epochs[&w.partition]);
        assert_eq!(w.partition, self.c.partition_for(&w.owner));
        self.log
            .entry(w.partition)
            .or_default()
            .extend(w.records.iter().cloned());
        let done = self.c.complete_write(w.id, Ok(0), 0);
        assert_eq!(done.error, None);
        done
    }

    /// Runs an outcome to its end: persists its write if any; the response
    /// the client gets, and the effects released.
    fn finish<R: CoordinatorResponse>(&mut self, out: Outcome<R>) -> (R, Vec<Effect>) {
        match out.write {
            None => (out.response, Vec::new()),
            Some(w) => {
                // The client is answered after this write: it must be
                // durable by then (see `takes_effect`).
                assert_eq!(w.takes_effect, TakesEffect::OnceDurable, "{w:?}");
                let done = self.persist_write(w);
                (done.response(out.response), done.effects)
            }
        }
    }

    fn init_req(id: &str, current: Option<ProducerIdAndEpoch>) -> InitProducerIdRequest {
        InitProducerIdRequest {
            transactional_id: id.to_string(),
            transaction_timeout_ms: TIMEOUT,
            current,
            version: INIT_V,
        }
    }

    fn init(&mut self, id: &str) -> InitProducerIdResponse {
        self.init_with(id, None).0
    }

    fn init_with(
        &mut self,
        id: &str,
        current: Option<ProducerIdAndEpoch>,
    ) -> (InitProducerIdResponse, Vec<Effect>) {
        let out = self
            .c
            .init_producer_id(&Self::init_req(id, current), self.now, &mut self.pids);
        self.finish(out)
    }

    /// Initialises `id` and returns its producer id and epoch.
    fn ready(&mut self, id: &str) -> ProducerIdAndEpoch {
        let r = self.init(id);
        assert_eq!(r.error, None);
        pe(r.producer_id, r.producer_epoch)
    }

    fn add_req(
        id: &str,
        p: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        version: i16,
    ) -> AddPartitionsRequest {
        AddPartitionsRequest {
            transactional_id: id.to_string(),
            producer_id: p.producer_id,
            producer_epoch: p.epoch,
            partitions: partitions.to_vec(),
            verify_only: false,
            version,
        }
    }

    fn add(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        version: i16,
    ) -> AddPartitionsResponse {
        let out = self
            .c
            .add_partitions_to_txn(&Self::add_req(id, p, partitions, version), self.now);
        self.finish(out).0
    }

    fn add_ok(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        version: i16,
    ) {
        let r = self.add(id, p, partitions, version);
        assert_eq!(r.error(), None, "{r:?}");
    }

    fn verify(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
    ) -> Vec<Option<ResponseError>> {
        let mut req = Self::add_req(id, p, partitions, TV2_ADD);
        req.verify_only = true;
        let out = self.c.add_partitions_to_txn(&req, self.now);
        assert!(out.write.is_none(), "verification never writes");
        out.response.results.into_iter().map(|(_, e)| e).collect()
    }

    fn end_req(id: &str, p: ProducerIdAndEpoch, result: TxnResult, version: i16) -> EndTxnRequest {
        EndTxnRequest {
            transactional_id: id.to_string(),
            producer_id: p.producer_id,
            producer_epoch: p.epoch,
            result,
            version,
        }
    }

    fn end(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        result: TxnResult,
        version: i16,
    ) -> (EndTxnResponse, Vec<Effect>) {
        let out = self.c.end_txn(
            &Self::end_req(id, p, result, version),
            self.now,
            &mut self.pids,
        );
        self.finish(out)
    }

    /// `end` that must not write, returning its error.
    fn end_error(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        result: TxnResult,
        version: i16,
    ) -> Option<ResponseError> {
        let out = self.c.end_txn(
            &Self::end_req(id, p, result, version),
            self.now,
            &mut self.pids,
        );
        assert!(out.write.is_none(), "{out:?}");
        out.response.error
    }

    /// Writes every marker of `effects` and persists the `Complete*` writes.
    fn complete_markers(&mut self, effects: Vec<Effect>) {
        for m in markers_of(&effects) {
            let w = self.c.markers_written(&m, self.now).unwrap();
            let done = self.persist_write(w);
            assert!(done.effects.is_empty());
        }
    }

    /// A whole transaction: add, end, markers.
    fn transaction(
        &mut self,
        id: &str,
        p: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        result: TxnResult,
        tv2: bool,
    ) -> EndTxnResponse {
        self.add_ok(id, p, partitions, if tv2 { TV2_ADD } else { TV1_ADD });
        let (r, effects) = self.end(id, p, result, if tv2 { TV2_END } else { TV1_END });
        assert_eq!(r.error, None);
        self.complete_markers(effects);
        r
    }

    fn meta(&self, id: &str) -> TransactionMetadata {
        self.c.transaction(id).cloned().unwrap()
    }

    fn state(&self, id: &str) -> TxnState {
        self.meta(id).state
    }

    /// A coordinator rebuilt from the durable log alone.
    fn rebuilt(&self) -> TxnCoordinator {
        let mut c = TxnCoordinator::new(self.c.config().clone());
        let mut pids = Pids {
            next: 1_000_000,
            fail: None,
            handed_out: 0,
        };
        for (&p, &epoch) in &self.epochs {
            let records = self.log.get(&p).cloned().unwrap_or_default();
            let state =
                CoordinatorState::replay(records.iter().map(|r| (&r.key, r.value.as_ref())))
                    .unwrap();
            assert!(c.begin_loading(p, epoch + 1).is_some());
            c.finish_loading(p, epoch + 1, state, self.now, &mut pids)
                .unwrap();
        }
        c
    }
}

fn metadata(producer_id: i64, epoch: i16, state: TxnState) -> TransactionMetadata {
    TransactionMetadata {
        producer_id,
        producer_epoch: epoch,
        last_producer_id: NO_PRODUCER_ID,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        next_producer_id: NO_PRODUCER_ID,
        timeout_ms: TIMEOUT,
        state,
        partitions: Default::default(),
        txn_start_timestamp: -1,
        txn_last_update_timestamp: 0,
        transaction_version: TransactionVersion::V1,
    }
}

// ---------------------------------------------------------------------------
// InitProducerId
// ---------------------------------------------------------------------------

#[test]
fn new_id_gets_a_producer_id_at_epoch_zero_once_durable() {
    let mut h = H::new();
    let out =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    assert_eq!(out.response, InitProducerIdResponse::ok(pe(1000, 0)));
    let w = out.write.clone().unwrap();
    assert_eq!(w.partition, coordinator_partition("t", 50));
    assert_eq!(w.records.len(), 1);

    // Nothing is visible until the write is durable.
    assert!(h.c.transaction("t").is_none());
    assert_eq!(
        h.c.describe_transactions(&["t".into()])[0].error,
        Some(E::TransactionalIdNotFound)
    );
    // A concurrent InitProducerId waits.
    let again =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    assert_eq!(again.response.error, Some(E::ConcurrentTransactions));
    assert!(again.write.is_none());

    let (r, effects) = h.finish(out);
    assert_eq!(r, InitProducerIdResponse::ok(pe(1000, 0)));
    assert!(effects.is_empty());
    let m = h.meta("t");
    assert_eq!(
        (m.producer_id, m.producer_epoch, m.state),
        (1000, 0, TxnState::Empty)
    );
    assert_eq!(m.timeout_ms, TIMEOUT);
    assert_eq!(m.txn_start_timestamp, -1);
    assert_eq!(m.last(), None);
}

#[test]
fn a_failed_write_changes_nothing_and_answers_the_coordinator_error() {
    let mut h = H::new();
    for (append_error, answer) in [
        (E::NotEnoughReplicas, E::CoordinatorNotAvailable),
        (E::NotEnoughReplicasAfterAppend, E::CoordinatorNotAvailable),
        (E::RequestTimedOut, E::CoordinatorNotAvailable),
        (E::UnknownTopicOrPartition, E::CoordinatorNotAvailable),
        (E::NotLeaderOrFollower, E::NotCoordinator),
        (E::KafkaStorageError, E::NotCoordinator),
        (E::MessageTooLarge, E::UnknownServerError),
        (E::RecordListTooLarge, E::UnknownServerError),
        (E::CorruptMessage, E::CorruptMessage),
    ] {
        let out =
            h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
        let w = out.write.unwrap();
        let done = h.c.complete_write(w.id, Err(append_error), 0);
        assert_eq!(done.error, Some(answer));
        assert!(done.effects.is_empty());
        assert_eq!(
            done.response(out.response),
            InitProducerIdResponse::error(answer)
        );
        assert!(h.c.transaction("t").is_none());
        // The id is free again, and reporting twice is harmless.
        assert_eq!(
            h.c.complete_write(w.id, Ok(0), 0).error,
            Some(E::NotCoordinator)
        );
    }
    let r = h.init("t");
    assert_eq!(r.error, None);
    assert_eq!(r.producer_epoch, 0);
}

#[test]
fn init_bumps_the_epoch_and_takes_the_new_timeout() {
    let mut h = H::new();
    let p = h.ready("t");
    assert_eq!(p, pe(1000, 0));
    let mut req = H::init_req("t", None);
    req.transaction_timeout_ms = 5_000;
    let out = h.c.init_producer_id(&req, h.now, &mut h.pids);
    let (r, _) = h.finish(out);
    assert_eq!(r, InitProducerIdResponse::ok(pe(1000, 1)));
    assert_eq!(h.meta("t").timeout_ms, 5_000);
    assert_eq!(h.ready("t"), pe(1000, 2));
    assert_eq!(h.pids.handed_out, 1);
}

#[test]
fn init_validates_the_request() {
    let mut h = H::new();
    for timeout in [0, -1, 900_001, i32::MAX] {
        let mut req = H::init_req("t", None);
        req.transaction_timeout_ms = timeout;
        let out = h.c.init_producer_id(&req, h.now, &mut h.pids);
        assert_eq!(
            out.response,
            InitProducerIdResponse::error(E::InvalidTransactionTimeout)
        );
        assert!(out.write.is_none());
    }
    let mut req = H::init_req("t", None);
    req.transaction_timeout_ms = 900_000;
    assert_eq!(
        h.c.init_producer_id(&req, h.now, &mut h.pids)
            .response
            .error,
        None
    );

    let out =
        h.c.init_producer_id(&H::init_req("", None), h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::InvalidRequest));

    let mut h = H::with_config(TxnConfig {
        max_timeout_ms: 10_000,
        ..TxnConfig::default()
    });
    let out =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::InvalidTransactionTimeout));
}

#[test]
fn kip_360_fields_from_the_wire() {
    assert_eq!(InitProducerIdRequest::current_from_wire(-1, -1), Ok(None));
    assert_eq!(
        InitProducerIdRequest::current_from_wire(5, 2),
        Ok(Some(pe(5, 2)))
    );
    assert_eq!(
        InitProducerIdRequest::current_from_wire(5, -1),
        Err(E::InvalidRequest)
    );
    assert_eq!(
        InitProducerIdRequest::current_from_wire(-1, 0),
        Err(E::InvalidRequest)
    );
}

#[test]
fn producer_id_allocation_failure_is_answered() {
    let mut h = H::new();
    h.pids.fail = Some(E::CoordinatorLoadInProgress);
    let out =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::CoordinatorLoadInProgress));
    assert!(out.write.is_none());
    h.pids.fail = None;
    assert_eq!(h.ready("t"), pe(1000, 0));
}

#[test]
fn kip_360_recovery_checks_the_given_producer() {
    let mut h = H::new();
    let p = h.ready("t");
    // The client's own id and epoch: bump, remembering them.
    let (r, _) = h.init_with("t", Some(p));
    assert_eq!(r, InitProducerIdResponse::ok(pe(1000, 1)));
    assert_eq!(h.meta("t").last(), Some(p));
    // A retry of that call (the answer was lost): the same answer, no bump.
    let (r, _) = h.init_with("t", Some(p));
    assert_eq!(r, InitProducerIdResponse::ok(pe(1000, 1)));
    // Anything else is fenced.
    for bad in [pe(1000, 5), pe(1000, -1), pe(77, 1)] {
        let (r, _) = h.init_with("t", Some(bad));
        assert_eq!(r.error, Some(E::ProducerFenced), "{bad:?}");
    }
    // Before v4 clients get INVALID_PRODUCER_EPOCH instead.
    let mut req = H::init_req("t", Some(pe(1000, 5)));
    req.version = 3;
    let out = h.c.init_producer_id(&req, h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::InvalidProducerEpoch));

    // Another instance initialises: the old one can no longer recover.
    assert_eq!(h.ready("t"), pe(1000, 2));
    let (r, _) = h.init_with("t", Some(pe(1000, 1)));
    assert_eq!(r.error, Some(E::ProducerFenced));

    // An unknown id gets a fresh producer id whatever it claims.
    let (r, _) = h.init_with("u", Some(pe(5, 5)));
    assert_eq!(r, InitProducerIdResponse::ok(pe(1001, 0)));
}

#[test]
fn init_fences_an_ongoing_transaction_and_aborts_it_first() {
    let mut h = H::new();
    let p = h.ready("t");
    let parts = [tp("a", 0), tp("b", 1)];
    h.add_ok("t", p, &parts, TV1_ADD);

    let out =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    let w = out.write.clone().unwrap();
    // In flight: everything else waits, the committed state is still Ongoing.
    assert_eq!(h.state("t"), TxnState::Ongoing);
    let again =
        h.c.init_producer_id(&H::init_req("t", None), h.now, &mut h.pids);
    assert_eq!(again.response.error, Some(E::ConcurrentTransactions));
    assert!(h.c.expired_transactions(i64::MAX).is_empty());

    let done = h.persist_write(w);
    let r = done.response(out.response);
    assert_eq!(r.error, Some(E::ConcurrentTransactions));
    let m = h.meta("t");
    assert_eq!((m.state, m.producer_epoch), (TxnState::PrepareAbort, 1));
    assert_eq!(m.last(), None);
    let markers = markers_of(&done.effects);
    assert_eq!(
        markers,
        vec![WriteMarkers {
            transactional_id: "t".into(),
            partition: coordinator_partition("t", 50),
            coordinator_epoch: 0,
            producer_id: 1000,
            producer_epoch: 1,
            result: TxnResult::Abort,
            partitions: parts.to_vec(),
        }]
    );

    // The old instance is fenced everywhere.
    assert_eq!(
        h.add("t", p, &[tp("c", 0)], TV1_ADD).error(),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV2_END),
        Some(E::ProducerFenced)
    );
    // The new one retries while the abort completes.
    assert_eq!(h.init("t").error, Some(E::ConcurrentTransactions));

    h.complete_markers(done.effects);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
    assert!(h.meta("t").partitions.is_empty());
    assert_eq!(h.ready("t"), pe(1000, 2));
    // Even as a TV2 "retry" of an abort, the zombie is fenced.
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV2_END),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("t", pe(1000, 1), TxnResult::Abort, TV2_END),
        Some(E::ProducerFenced)
    );
}

#[test]
fn init_waits_while_a_transaction_completes() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    let (r, effects) = h.end("t", p, TxnResult::Commit, TV1_END);
    assert_eq!(r.error, None);
    assert_eq!(h.init("t").error, Some(E::ConcurrentTransactions));
    h.complete_markers(effects);
    assert_eq!(h.ready("t"), pe(1000, 1));
}

#[test]
fn an_exhausted_epoch_moves_to_a_new_producer_id() {
    let mut h = H::new();
    h.seed("t", metadata(7, i16::MAX - 2, TxnState::CompleteCommit));
    assert_eq!(h.ready("t"), pe(7, i16::MAX - 1));
    // 32766 is exhausted: a new id, nothing to retry with.
    assert_eq!(h.ready("t"), pe(1000, 0));
    assert_eq!(h.meta("t").last(), None);

    // KIP-360 at an exhausted epoch: new id, and the retry gets it too.
    h.seed("u", metadata(8, i16::MAX - 1, TxnState::Empty));
    let (r, _) = h.init_with("u", Some(pe(8, i16::MAX - 1)));
    assert_eq!(r, InitProducerIdResponse::ok(pe(1001, 0)));
    let handed_out = h.pids.handed_out;
    let (r, _) = h.init_with("u", Some(pe(8, i16::MAX - 1)));
    assert_eq!(r, InitProducerIdResponse::ok(pe(1001, 0)));
    assert_eq!(h.pids.handed_out, handed_out, "a retry allocates nothing");

    // Fencing at the last usable epoch uses i16::MAX for the markers; the
    // retry then moves to a new producer id.
    let mut m = metadata(9, i16::MAX - 1, TxnState::Ongoing);
    m.partitions.insert(tp("a", 0));
    m.txn_start_timestamp = 0;
    h.seed("v", m);
    let (r, effects) = h.init_with("v", None);
    assert_eq!(r.error, Some(E::ConcurrentTransactions));
    assert_eq!(markers_of(&effects)[0].producer_epoch, i16::MAX);
    h.complete_markers(effects);
    assert_eq!(h.meta("v").producer_epoch, i16::MAX);
    assert_eq!(h.ready("v"), pe(1002, 0));
}

// ---------------------------------------------------------------------------
// AddPartitionsToTxn / AddOffsetsToTxn
// ---------------------------------------------------------------------------

#[test]
fn add_partitions_starts_and_extends_the_transaction() {
    let mut h = H::new();
    let p = h.ready("t");
    h.now = 5_000;
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    let m = h.meta("t");
    assert_eq!(m.state, TxnState::Ongoing);
    assert_eq!(m.txn_start_timestamp, 5_000);
    assert_eq!(m.transaction_version, TransactionVersion::V1);

    h.now = 6_000;
    h.add_ok("t", p, &[tp("a", 1), tp("b", 0)], TV1_ADD);
    let m = h.meta("t");
    assert_eq!(m.txn_start_timestamp, 5_000, "the start stays");
    assert_eq!(m.txn_last_update_timestamp, 6_000);
    assert_eq!(
        m.partitions.iter().cloned().collect::<Vec<_>>(),
        vec![tp("a", 0), tp("a", 1), tp("b", 0)]
    );

    // Already in the transaction: answered without a write.
    let out = h.c.add_partitions_to_txn(
        &H::add_req("t", p, &[tp("a", 1), tp("a", 0)], TV1_ADD),
        h.now,
    );
    assert!(out.write.is_none());
    assert_eq!(
        out.response.results,
        vec![(tp("a", 1), None), (tp("a", 0), None)]
    );
    // Nothing to add: nothing written either.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("u", p, &[], TV1_ADD), h.now);
    assert!(out.write.is_none());

    // Partition leaders (v4+) add for TV2 producers.
    let q = h.ready("u");
    h.add_ok("u", q, &[tp("a", 0)], TV2_ADD);
    assert_eq!(h.meta("u").transaction_version, TransactionVersion::V2);
}

#[test]
fn add_partitions_errors() {
    let mut h = H::new();
    let parts = [tp("a", 0), tp("b", 0)];
    let every = |r: AddPartitionsResponse| -> Option<ResponseError> {
        let first = r.results[0].1;
        assert!(r.results.iter().all(|(_, e)| *e == first), "{r:?}");
        assert_eq!(r.results.len(), 2);
        first
    };
    assert_eq!(
        every(h.add("t", pe(1000, 0), &parts, TV1_ADD)),
        Some(E::InvalidProducerIdMapping)
    );
    let p = h.ready("t");
    assert_eq!(
        every(h.add("t", pe(999, 0), &parts, TV1_ADD)),
        Some(E::InvalidProducerIdMapping)
    );
    h.ready("t"); // epoch 1: the caller's 0 is stale.
    assert_eq!(
        every(h.add("t", p, &parts, TV1_ADD)),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        every(h.add("t", pe(1000, 7), &parts, TV1_ADD)),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        every(h.add("t", p, &parts, 1)),
        Some(E::InvalidProducerEpoch)
    );
    assert_eq!(
        every(h.add("", p, &parts, TV1_ADD)),
        Some(E::InvalidRequest)
    );

    let p = pe(1000, 1);
    // A write in flight.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("t", p, &parts[..1], TV1_ADD), h.now);
    assert!(out.write.is_some());
    assert_eq!(
        every(h.add("t", p, &parts, TV1_ADD)),
        Some(E::ConcurrentTransactions)
    );
    h.finish(out);
    // Completing.
    let (_, effects) = h.end("t", p, TxnResult::Commit, TV1_END);
    assert_eq!(
        every(h.add("t", p, &parts, TV1_ADD)),
        Some(E::ConcurrentTransactions)
    );
    h.complete_markers(effects);
    assert_eq!(every(h.add("t", p, &parts, TV1_ADD)), None);
}

#[test]
fn verify_only_answers_from_the_committed_transaction() {
    let mut h = H::new();
    let (a, b) = ([tp("a", 0)], [tp("b", 0)]);
    assert_eq!(
        h.verify("t", pe(1000, 0), &a),
        vec![Some(E::InvalidProducerIdMapping)]
    );
    let p = h.ready("t");
    // No transaction yet.
    assert_eq!(h.verify("t", p, &a), vec![Some(E::TransactionAbortable)]);
    h.add_ok("t", p, &a, TV1_ADD);
    assert_eq!(
        h.verify("t", p, &[a[0].clone(), b[0].clone()]),
        vec![None, Some(E::TransactionAbortable)]
    );
    assert_eq!(
        h.verify("t", pe(1000, 3), &a),
        vec![Some(E::ProducerFenced)]
    );
    assert_eq!(
        h.verify("t", pe(4, 0), &a),
        vec![Some(E::InvalidProducerIdMapping)]
    );
    assert_eq!(h.verify("", p, &a), vec![Some(E::InvalidRequest)]);

    // b's add is in flight: not in the transaction yet.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("t", p, &b, TV1_ADD), h.now);
    assert_eq!(h.verify("t", p, &b), vec![Some(E::TransactionAbortable)]);
    h.finish(out);
    assert_eq!(h.verify("t", p, &b), vec![None]);

    let (_, effects) = h.end("t", p, TxnResult::Commit, TV1_END);
    assert_eq!(h.verify("t", p, &a), vec![Some(E::ConcurrentTransactions)]);
    h.complete_markers(effects);
    assert_eq!(h.verify("t", p, &a), vec![Some(E::TransactionAbortable)]);
    assert_eq!(
        h.state("t"),
        TxnState::CompleteCommit,
        "verification changes nothing"
    );
}

#[test]
fn add_offsets_adds_the_groups_offsets_partition() {
    let mut h = H::new();
    let p = h.ready("t");
    let req = AddOffsetsRequest {
        transactional_id: "t".into(),
        producer_id: p.producer_id,
        producer_epoch: p.epoch,
        group_id: "my-group".into(),
        version: 3,
    };
    let out = h.c.add_offsets_to_txn(&req, h.now);
    let (r, _) = h.finish(out);
    assert_eq!(r.error, None);
    let offsets = tp("__consumer_offsets", coordinator_partition("my-group", 50));
    assert_eq!(
        h.meta("t").partitions.iter().collect::<Vec<_>>(),
        vec![&offsets]
    );
    assert_eq!(h.state("t"), TxnState::Ongoing);

    let stale = AddOffsetsRequest {
        producer_epoch: 9,
        ..req.clone()
    };
    assert_eq!(
        h.c.add_offsets_to_txn(&stale, h.now).response.error,
        Some(E::ProducerFenced)
    );
    let old = AddOffsetsRequest {
        version: 1,
        ..stale
    };
    assert_eq!(
        h.c.add_offsets_to_txn(&old, h.now).response.error,
        Some(E::InvalidProducerEpoch)
    );
    let unknown = AddOffsetsRequest {
        transactional_id: "nobody".into(),
        ..req
    };
    assert_eq!(
        h.c.add_offsets_to_txn(&unknown, h.now).response.error,
        Some(E::InvalidProducerIdMapping)
    );
}

// ---------------------------------------------------------------------------
// EndTxn, transaction version 1
// ---------------------------------------------------------------------------

#[test]
fn tv1_commit_runs_prepare_markers_complete() {
    let mut h = H::new();
    let p = h.ready("t");
    let parts = [tp("a", 0), tp("__consumer_offsets", 3)];
    h.add_ok("t", p, &parts, TV1_ADD);

    let out = h.c.end_txn(
        &H::end_req("t", p, TxnResult::Commit, TV1_END),
        h.now,
        &mut h.pids,
    );
    assert_eq!(h.state("t"), TxnState::Ongoing, "not before it is durable");
    let (r, effects) = h.finish(out);
    assert_eq!(r, EndTxnResponse::ok(None));
    let m = h.meta("t");
    assert_eq!((m.state, m.producer_epoch), (TxnState::PrepareCommit, 0));
    let markers = markers_of(&effects);
    assert_eq!(markers.len(), 1);
    assert_eq!(markers[0].result, TxnResult::Commit);
    assert_eq!(
        (markers[0].producer_id, markers[0].producer_epoch),
        (1000, 0)
    );
    let mut sorted = parts.to_vec();
    sorted.sort();
    assert_eq!(markers[0].partitions, sorted);

    // While completing.
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::ConcurrentTransactions)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV1_END),
        Some(E::InvalidTxnState)
    );

    h.complete_markers(effects);
    let m = h.meta("t");
    assert_eq!(m.state, TxnState::CompleteCommit);
    assert!(m.partitions.is_empty());

    // Retries after completion.
    assert_eq!(h.end_error("t", p, TxnResult::Commit, TV1_END), None);
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV1_END),
        Some(E::InvalidTxnState)
    );

    // The next transaction starts from CompleteCommit as from Empty.
    h.now += 10;
    h.add_ok("t", p, &[tp("b", 0)], TV1_ADD);
    assert_eq!(h.meta("t").txn_start_timestamp, h.now);
}

#[test]
fn tv1_abort_and_its_retries() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    let (r, effects) = h.end("t", p, TxnResult::Abort, TV1_END);
    assert_eq!(r.error, None);
    assert_eq!(h.state("t"), TxnState::PrepareAbort);
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV1_END),
        Some(E::ConcurrentTransactions)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::InvalidTxnState)
    );
    h.complete_markers(effects);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);
    assert_eq!(h.end_error("t", p, TxnResult::Abort, TV1_END), None);
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::InvalidTxnState)
    );
}

#[test]
fn tv1_end_errors() {
    let mut h = H::new();
    assert_eq!(
        h.end_error("t", pe(1000, 0), TxnResult::Commit, TV1_END),
        Some(E::InvalidProducerIdMapping)
    );
    let p = h.ready("t");
    // Nothing to end.
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::InvalidTxnState)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV1_END),
        Some(E::InvalidTxnState)
    );
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    assert_eq!(
        h.end_error("t", pe(5, 0), TxnResult::Commit, TV1_END),
        Some(E::InvalidProducerIdMapping)
    );
    assert_eq!(
        h.end_error("t", pe(1000, 1), TxnResult::Commit, TV1_END),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("t", pe(1000, 1), TxnResult::Commit, 1),
        Some(E::InvalidProducerEpoch)
    );
    assert_eq!(
        h.end_error("", p, TxnResult::Commit, TV1_END),
        Some(E::InvalidRequest)
    );
    // A write in flight.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("t", p, &[tp("b", 0)], TV1_ADD), h.now);
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV1_END),
        Some(E::ConcurrentTransactions)
    );
    h.finish(out);
    assert_eq!(h.state("t"), TxnState::Ongoing);
}

// ---------------------------------------------------------------------------
// EndTxn, transaction version 2
// ---------------------------------------------------------------------------

#[test]
fn tv2_end_bumps_the_epoch_and_answers_it() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV2_ADD);
    let (r, effects) = h.end("t", p, TxnResult::Commit, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 1))));
    let m = h.meta("t");
    assert_eq!(
        (m.state, m.producer_epoch, m.last()),
        (TxnState::PrepareCommit, 1, Some(p))
    );
    // Markers carry the new epoch, which fences the old one on the partitions.
    let markers = markers_of(&effects);
    assert_eq!(
        (markers[0].producer_id, markers[0].producer_epoch),
        (1000, 1)
    );

    // Retries while completing; the next epoch too early.
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV2_END),
        Some(E::ConcurrentTransactions)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV2_END),
        Some(E::InvalidTxnState)
    );
    assert_eq!(
        h.end_error("t", pe(1000, 1), TxnResult::Abort, TV2_END),
        Some(E::ConcurrentTransactions)
    );
    assert_eq!(
        h.add("t", pe(1000, 1), &[tp("a", 0)], TV2_ADD).error(),
        Some(E::ConcurrentTransactions)
    );

    h.complete_markers(effects);
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    // A retry after completion: success with the same next id and epoch.
    let (r, fx) = h.end("t", p, TxnResult::Commit, TV2_END);
    assert_eq!((r, fx), (EndTxnResponse::ok(Some(pe(1000, 1))), Vec::new()));
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV2_END),
        Some(E::InvalidTxnState)
    );
    // At the new epoch: nothing to commit; an abort of nothing bumps again.
    assert_eq!(
        h.end_error("t", pe(1000, 1), TxnResult::Commit, TV2_END),
        Some(E::InvalidTxnState)
    );
    let (r, fx) = h.end("t", pe(1000, 1), TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 2))));
    assert!(fx.is_empty(), "nothing was added, no markers");
    let m = h.meta("t");
    assert_eq!(
        (m.state, m.producer_epoch, m.last()),
        (TxnState::CompleteAbort, 2, Some(pe(1000, 1)))
    );
    let (r, _) = h.end("t", pe(1000, 1), TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 2))));

    // From Empty: abort of nothing bumps, commit is refused, older epochs fenced.
    let q = h.ready("u");
    assert_eq!(
        h.end_error("u", q, TxnResult::Commit, TV2_END),
        Some(E::InvalidTxnState)
    );
    let (r, _) = h.end("u", q, TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(q.producer_id, 1))));
    assert_eq!(
        h.end_error("u", pe(q.producer_id, 5), TxnResult::Abort, TV2_END),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("u", pe(1, 1), TxnResult::Abort, TV2_END),
        Some(E::InvalidProducerIdMapping)
    );
}

#[test]
fn tv2_stale_end_txn_does_not_end_the_next_transaction() {
    // KAFKA-17754: the first EndTxn(abort) of transaction 1 is delayed in
    // the network; its retry aborts transaction 1; transaction 2 begins at
    // the bumped epoch; then the delayed request arrives.
    let mut h = H::new();
    let p0 = h.ready("t");
    h.add_ok("t", p0, &[tp("a", 0)], TV2_ADD);
    let delayed = H::end_req("t", p0, TxnResult::Abort, TV2_END);
    let (r, effects) = h.end("t", p0, TxnResult::Abort, TV2_END);
    let p1 = pe(r.producer_id, r.producer_epoch);
    assert_eq!(p1, pe(1000, 1));
    h.complete_markers(effects);

    h.add_ok("t", p1, &[tp("b", 0)], TV2_ADD);
    let before = h.meta("t");
    for result in [TxnResult::Abort, TxnResult::Commit] {
        let req = EndTxnRequest {
            result,
            ..delayed.clone()
        };
        let out = h.c.end_txn(&req, h.now, &mut h.pids);
        assert_eq!(out.response.error, Some(E::ProducerFenced));
        assert!(out.write.is_none());
    }
    assert_eq!(h.meta("t"), before, "transaction 2 is untouched");

    // Transaction 2 commits normally, and the stale request stays fenced in
    // every state transaction 2 passes through.
    let (r, effects) = h.end("t", p1, TxnResult::Commit, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 2))));
    assert_eq!(markers_of(&effects)[0].partitions, vec![tp("b", 0)]);
    assert_eq!(markers_of(&effects)[0].result, TxnResult::Commit);
    let out = h.c.end_txn(&delayed, h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::ProducerFenced));
    h.complete_markers(effects);
    let out = h.c.end_txn(&delayed, h.now, &mut h.pids);
    assert_eq!(out.response.error, Some(E::ProducerFenced));
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    // Only transaction 2's own retry is recognised.
    assert_eq!(h.end_error("t", p1, TxnResult::Commit, TV2_END), None);
}

#[test]
fn tv2_end_at_the_last_epoch_moves_to_a_new_producer_id() {
    let mut h = H::new();
    let old = pe(7, i16::MAX - 1);
    let mut m = metadata(old.producer_id, old.epoch, TxnState::Ongoing);
    m.partitions.insert(tp("a", 0));
    m.txn_start_timestamp = 0;
    m.transaction_version = TransactionVersion::V2;
    h.seed("t", m);

    let (r, effects) = h.end("t", old, TxnResult::Commit, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 0))));
    let markers = markers_of(&effects);
    assert_eq!(
        (markers[0].producer_id, markers[0].producer_epoch),
        (7, i16::MAX)
    );
    let m = h.meta("t");
    assert_eq!(
        (m.producer_id, m.producer_epoch, m.next_producer_id),
        (7, i16::MAX, 1000)
    );
    assert_eq!(
        h.end_error("t", old, TxnResult::Commit, TV2_END),
        Some(E::ConcurrentTransactions)
    );

    h.complete_markers(effects);
    let m = h.meta("t");
    assert_eq!(
        (m.state, m.producer_id, m.producer_epoch),
        (TxnState::CompleteCommit, 1000, 0)
    );
    assert_eq!(m.next_producer_id, NO_PRODUCER_ID);
    assert_eq!(m.last(), Some(old));
    // The retry with the old id is still recognised, and answers the new one.
    let (r, _) = h.end("t", old, TxnResult::Commit, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 0))));
    assert_eq!(
        h.end_error("t", old, TxnResult::Abort, TV2_END),
        Some(E::InvalidTxnState)
    );
    // The new id works.
    h.add_ok("t", pe(1000, 0), &[tp("a", 0)], TV2_ADD);

    // An empty abort reaching the last epoch moves at once.
    h.seed("u", metadata(8, i16::MAX - 1, TxnState::Empty));
    let (r, fx) = h.end("u", pe(8, i16::MAX - 1), TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1001, 0))));
    assert!(fx.is_empty());
    assert_eq!(h.meta("u").current(), pe(1001, 0));

    // Allocation failure: answered, nothing changes.
    let mut m = metadata(9, i16::MAX - 1, TxnState::Ongoing);
    m.partitions.insert(tp("a", 0));
    m.txn_start_timestamp = 0;
    h.seed("v", m.clone());
    h.pids.fail = Some(E::CoordinatorLoadInProgress);
    assert_eq!(
        h.end_error("v", pe(9, i16::MAX - 1), TxnResult::Commit, TV2_END),
        Some(E::CoordinatorLoadInProgress)
    );
    assert_eq!(h.meta("v"), m);
}

// ---------------------------------------------------------------------------
// Markers
// ---------------------------------------------------------------------------

#[test]
fn markers_written_must_match_the_transaction() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    let (_, effects) = h.end("t", p, TxnResult::Commit, TV1_END);
    let good = markers_of(&effects).remove(0);

    let wrong_result = WriteMarkers {
        result: TxnResult::Abort,
        ..good.clone()
    };
    assert_eq!(
        h.c.markers_written(&wrong_result, h.now),
        Err(E::InvalidTxnState)
    );
    let wrong_epoch = WriteMarkers {
        producer_epoch: 3,
        ..good.clone()
    };
    assert_eq!(
        h.c.markers_written(&wrong_epoch, h.now),
        Err(E::InvalidTxnState)
    );
    let old_coordinator = WriteMarkers {
        coordinator_epoch: good.coordinator_epoch - 1,
        ..good.clone()
    };
    assert_eq!(
        h.c.markers_written(&old_coordinator, h.now),
        Err(E::NotCoordinator)
    );

    let w = h.c.markers_written(&good, h.now).unwrap();
    assert_eq!(w.takes_effect, TakesEffect::OnceAppended);
    // In flight: a duplicate report waits.
    assert_eq!(
        h.c.markers_written(&good, h.now),
        Err(E::ConcurrentTransactions)
    );
    // The Complete write fails: still PrepareCommit, report again later.
    let done = h.c.complete_write(w.id, Err(E::RequestTimedOut), 0);
    assert_eq!(done.error, Some(E::CoordinatorNotAvailable));
    assert_eq!(h.state("t"), TxnState::PrepareCommit);
    let w = h.c.markers_written(&good, h.now).unwrap();
    h.persist_write(w);
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    assert_eq!(h.c.markers_written(&good, h.now), Err(E::InvalidTxnState));
}

// ---------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------

#[test]
fn tv1_timeout_aborts_and_fences_the_producer() {
    let mut h = H::new();
    let mut req = H::init_req("t", None);
    req.transaction_timeout_ms = 1_000;
    let out = h.c.init_producer_id(&req, h.now, &mut h.pids);
    h.finish(out);
    let p = pe(1000, 0);
    h.ready("idle"); // never expires: no transaction.
    let start = h.now;
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);

    assert!(h.c.expired_transactions(start + 1_000).is_empty());
    let expired = h.c.expired_transactions(start + 1_001);
    assert_eq!(
        expired,
        vec![ExpiredTransaction {
            transactional_id: "t".into(),
            producer_id: 1000,
            producer_epoch: 0,
            start_time_ms: start,
            timeout_ms: 1_000,
        }]
    );
    h.now = start + 1_001;
    let writes = h.c.abort_expired_transactions(h.now, &mut h.pids);
    assert_eq!(writes.len(), 1);
    // In flight: not listed again, not aborted twice.
    assert!(h.c.expired_transactions(h.now).is_empty());
    assert_eq!(
        h.c.abort_expired(&expired[0], h.now, &mut h.pids),
        Err(E::ConcurrentTransactions)
    );
    let done = h.persist_write(writes.into_iter().next().unwrap());
    let markers = markers_of(&done.effects);
    assert_eq!(
        (markers[0].producer_epoch, markers[0].result),
        (1, TxnResult::Abort)
    );
    assert_eq!(h.state("t"), TxnState::PrepareAbort);
    // The same listing again is stale now.
    assert_eq!(
        h.c.abort_expired(&expired[0], h.now, &mut h.pids),
        Err(E::ProducerFenced)
    );

    h.complete_markers(done.effects);
    // A TV1 producer is fenced: its epoch is gone.
    assert_eq!(
        h.add("t", p, &[tp("a", 0)], TV1_ADD).error(),
        Some(E::ProducerFenced)
    );
    assert_eq!(
        h.end_error("t", p, TxnResult::Abort, TV1_END),
        Some(E::ProducerFenced)
    );
    let (r, _) = h.init_with("t", Some(p));
    assert_eq!(r.error, Some(E::ProducerFenced));
}

#[test]
fn tv2_timeout_lets_the_producer_abort_and_carry_on() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV2_ADD);
    h.now += i64::from(TIMEOUT) + 1;
    let writes = h.c.abort_expired_transactions(h.now, &mut h.pids);
    let done = h.persist_write(writes.into_iter().next().unwrap());
    h.complete_markers(done.effects);
    let m = h.meta("t");
    assert_eq!(
        (m.state, m.producer_epoch, m.last()),
        (TxnState::CompleteAbort, 1, Some(p))
    );

    // Its produce was refused with the old epoch; it aborts (a retry) and goes on.
    assert_eq!(
        h.end_error("t", p, TxnResult::Commit, TV2_END),
        Some(E::InvalidTxnState)
    );
    let (r, _) = h.end("t", p, TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1000, 1))));
    h.add_ok("t", pe(1000, 1), &[tp("a", 0)], TV2_ADD);

    // At the last usable epoch the timeout moves it to a new producer id.
    let mut m = metadata(9, i16::MAX - 1, TxnState::Ongoing);
    m.partitions.insert(tp("a", 0));
    m.txn_start_timestamp = 0;
    m.transaction_version = TransactionVersion::V2;
    h.seed("u", m);
    let expired: Vec<_> =
        h.c.expired_transactions(h.now)
            .into_iter()
            .filter(|e| e.transactional_id == "u")
            .collect();
    let w = h.c.abort_expired(&expired[0], h.now, &mut h.pids).unwrap();
    let done = h.persist_write(w);
    assert_eq!(markers_of(&done.effects)[0].producer_epoch, i16::MAX);
    h.complete_markers(done.effects);
    let (r, _) = h.end("u", pe(9, i16::MAX - 1), TxnResult::Abort, TV2_END);
    assert_eq!(r, EndTxnResponse::ok(Some(pe(1001, 0))));
}

// ---------------------------------------------------------------------------
// Transactional id expiration
// ---------------------------------------------------------------------------

#[test]
fn idle_transactional_ids_expire_with_a_tombstone() {
    let mut h = H::new();
    let week = TxnConfig::default().transactional_id_expiration_ms;
    let start = h.now;
    h.ready("idle");
    let p = h.ready("busy");
    h.add_ok("busy", p, &[tp("a", 0)], TV1_ADD);

    assert!(h.c.expire_transactional_ids(start + week - 1).is_empty());
    h.now = start + week;
    let writes = h.c.expire_transactional_ids(h.now);
    assert_eq!(writes.len(), 1, "an open transaction never expires");
    let w = writes.into_iter().next().unwrap();
    assert_eq!(w.owner, "idle");
    assert_eq!(w.records[0].value, None);
    // In flight: the id is busy.
    assert_eq!(h.init("idle").error, Some(E::ConcurrentTransactions));
    h.persist_write(w);
    assert!(h.c.transaction("idle").is_none());
    // Forgotten, also after a reload; a new InitProducerId starts afresh.
    h.reload("idle");
    assert!(h.c.transaction("idle").is_none());
    assert_eq!(h.ready("idle").epoch, 0);
}

// ---------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------

#[test]
fn describe_and_list() {
    let mut h = H::new();
    h.now = 10_000;
    let a = h.ready("a");
    h.add_ok("a", a, &[tp("y", 1), tp("x", 2), tp("x", 0)], TV1_ADD);
    let b = h.ready("b");
    h.now = 20_000;
    h.transaction("b", b, &[tp("x", 0)], TxnResult::Commit, false);
    h.ready("c");

    let d =
        h.c.describe_transactions(&["a".into(), "b".into(), "zzz".into(), "".into()]);
    assert_eq!(
        d[0],
        DescribedTransaction {
            transactional_id: "a".into(),
            error: None,
            state: "Ongoing",
            producer_id: a.producer_id,
            producer_epoch: 0,
            timeout_ms: TIMEOUT,
            start_time_ms: 10_000,
            topics: vec![("x".into(), vec![0, 2]), ("y".into(), vec![1])],
        }
    );
    assert_eq!((d[1].state, d[1].topics.len()), ("CompleteCommit", 0));
    assert_eq!(d[2].error, Some(E::TransactionalIdNotFound));
    assert_eq!(d[3].error, Some(E::InvalidRequest));

    let all =
        h.c.list_transactions(&ListTransactionsFilter::default(), h.now);
    assert_eq!(all.error, None);
    fn names(r: &ListTransactionsResponse) -> Vec<(&str, &'static str)> {
        r.transactions
            .iter()
            .map(|t| (t.transactional_id.as_str(), t.state))
            .collect()
    }
    assert_eq!(
        names(&all),
        vec![("a", "Ongoing"), ("b", "CompleteCommit"), ("c", "Empty")]
    );

    let r = h.c.list_transactions(
        &ListTransactionsFilter {
            states: vec!["Ongoing".into(), "Bogus".into()],
            ..Default::default()
        },
        h.now,
    );
    assert_eq!(names(&r), vec![("a", "Ongoing")]);
    assert_eq!(r.unknown_state_filters, vec!["Bogus".to_string()]);

    let r = h.c.list_transactions(
        &ListTransactionsFilter {
            producer_ids: vec![b.producer_id],
            ..Default::default()
        },
        h.now,
    );
    assert_eq!(names(&r), vec![("b", "CompleteCommit")]);

    // Started more than 15 s ago (as Kafka compares, Empty's -1 start counts as long ago).
    let r = h.c.list_transactions(
        &ListTransactionsFilter {
            duration_filter_ms: 15_000,
            ..Default::default()
        },
        h.now + 10_000,
    );
    assert_eq!(names(&r), vec![("a", "Ongoing"), ("c", "Empty")]);
}

// ---------------------------------------------------------------------------
// Ownership, loading, replay
// ---------------------------------------------------------------------------

#[test]
fn requests_for_partitions_not_held_are_refused() {
    let mut c = TxnCoordinator::new(TxnConfig::default());
    let mut pids = || Ok::<i64, ResponseError>(1);
    let p = c.partition_for("t");
    let check = |c: &mut TxnCoordinator,
                 pids: &mut dyn ProducerIdSource,
                 expected: ResponseError| {
        let init = c.init_producer_id(&H::init_req("t", None), 0, pids);
        assert_eq!(init.response.error, Some(expected));
        let add = c.add_partitions_to_txn(&H::add_req("t", pe(1, 0), &[tp("a", 0)], TV1_ADD), 0);
        assert_eq!(add.response.error(), Some(expected));
        let mut verify = H::add_req("t", pe(1, 0), &[tp("a", 0)], TV2_ADD);
        verify.verify_only = true;
        assert_eq!(
            c.add_partitions_to_txn(&verify, 0).response.error(),
            Some(expected)
        );
        let end = c.end_txn(
            &H::end_req("t", pe(1, 0), TxnResult::Commit, TV2_END),
            0,
            pids,
        );
        assert_eq!(end.response.error, Some(expected));
        assert_eq!(
            c.describe_transactions(&["t".into()])[0].error,
            Some(expected)
        );
        assert_eq!(c.check_coordinator("t"), Err(expected));
    };
    check(&mut c, &mut pids, E::NotCoordinator);
    // Led by the metadata image, but its load has not begun.
    assert!(c.set_led_by_image(LedByImage::new([p].into())));
    check(&mut c, &mut pids, E::CoordinatorLoadInProgress);
    assert!(!c.set_led_by_image(LedByImage::default()));
    check(&mut c, &mut pids, E::NotCoordinator);
    assert!(c.begin_loading(p, 3).is_some());
    check(&mut c, &mut pids, E::CoordinatorLoadInProgress);
    assert_eq!(
        c.list_transactions(&ListTransactionsFilter::default(), 0)
            .error,
        Some(E::CoordinatorLoadInProgress)
    );
    // A load for another epoch is stale.
    assert_eq!(
        c.finish_loading(p, 2, CoordinatorState::new(), 0, &mut pids),
        Err(E::NotCoordinator)
    );
    assert!(c.begin_loading(p, 2).is_none());
    c.finish_loading(p, 3, CoordinatorState::new(), 0, &mut pids)
        .unwrap();
    assert_eq!(c.check_coordinator("t"), Ok(()));
    assert_eq!(
        c.list_transactions(&ListTransactionsFilter::default(), 0)
            .error,
        None
    );
    // Unloading an older epoch keeps the newer one.
    c.unload(p, Some(2));
    assert_eq!(c.check_coordinator("t"), Ok(()));
    c.unload(p, Some(3));
    check(&mut c, &mut pids, E::NotCoordinator);
}

#[test]
fn losing_leadership_drops_writes_in_flight() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0)], TV1_ADD);
    let out = h.c.end_txn(
        &H::end_req("t", p, TxnResult::Commit, TV1_END),
        h.now,
        &mut h.pids,
    );
    let w = out.write.unwrap();
    h.c.unload(w.partition, None);
    // The append may even have succeeded: this broker answers NOT_COORDINATOR
    // and starts no markers; the next leader finds the record and finishes.
    h.log
        .entry(w.partition)
        .or_default()
        .extend(w.records.clone());
    let done = h.c.complete_write(w.id, Ok(0), 0);
    assert_eq!(done.error, Some(E::NotCoordinator));
    assert!(done.effects.is_empty());
    assert_eq!(done.response(out.response).error, Some(E::NotCoordinator));
    assert_eq!(h.c.check_coordinator("t"), Err(E::NotCoordinator));

    let loaded = h.load(w.partition, 1);
    let markers = markers_of(&loaded.effects);
    assert_eq!(markers.len(), 1);
    assert_eq!(
        (
            markers[0].coordinator_epoch,
            markers[0].result,
            markers[0].partitions.clone()
        ),
        (1, TxnResult::Commit, vec![tp("a", 0)])
    );
    h.complete_markers(loaded.effects);
    assert_eq!(h.state("t"), TxnState::CompleteCommit);
    // A retry from the client reaches the new coordinator.
    assert_eq!(h.end_error("t", p, TxnResult::Commit, TV1_END), None);
}

#[test]
fn a_reload_finishes_prepared_and_half_fenced_transactions() {
    let mut h = H::new();
    let p = h.ready("t");
    h.add_ok("t", p, &[tp("a", 0), tp("b", 0)], TV2_ADD);
    let (_, effects) = h.end("t", p, TxnResult::Abort, TV2_END);
    let before = markers_of(&effects).remove(0);
    // The coordinator dies before the markers are done.
    let loaded = h.reload("t");
    assert!(loaded.writes.is_empty());
    let after = markers_of(&loaded.effects).remove(0);
    assert_eq!(
        after,
        WriteMarkers {
            coordinator_epoch: before.coordinator_epoch + 1,
            ..before.clone()
        }
    );
    // Markers of the old coordinator are not accepted any more.
    assert_eq!(h.c.markers_written(&before, h.now), Err(E::NotCoordinator));
    h.complete_markers(loaded.effects);
    assert_eq!(h.state("t"), TxnState::CompleteAbort);

    // A record holding PrepareEpochFence (never written by samsa, but
    // representable) is fenced and aborted at load.
    let mut m = metadata(50, 4, TxnState::PrepareEpochFence);
    m.partitions.insert(tp("c", 0));
    m.txn_start_timestamp = 0;
    let loaded = h.seed("u", m);
    assert!(loaded.effects.is_empty());
    assert_eq!(loaded.writes.len(), 1);
    assert_eq!(h.state("u"), TxnState::PrepareEpochFence);
    assert_eq!(h.init("u").error, Some(E::ConcurrentTransactions));
    let done = h.persist_write(loaded.writes.into_iter().next().unwrap());
    let markers = markers_of(&done.effects);
    assert_eq!(
        (markers[0].producer_epoch, markers[0].result),
        (5, TxnResult::Abort)
    );
    h.complete_markers(done.effects);
    assert_eq!(h.state("u"), TxnState::CompleteAbort);
    assert_eq!(h.ready("u"), pe(50, 6));
}

#[test]
fn replaying_the_log_rebuilds_every_transaction() {
    let mut h = H::new();
    // A mix of histories across partitions.
    let a = h.ready("a");
    h.transaction("a", a, &[tp("x", 0)], TxnResult::Commit, false);
    h.add_ok("a", a, &[tp("x", 1)], TV1_ADD);
    let b = h.ready("b");
    let r = h.transaction("b", b, &[tp("x", 0)], TxnResult::Abort, true);
    h.transaction(
        "b",
        pe(r.producer_id, r.producer_epoch),
        &[tp("y", 0)],
        TxnResult::Commit,
        true,
    );
    let c = h.ready("c");
    h.add_ok("c", c, &[tp("z", 3)], TV2_ADD);
    let (_, pending_markers) = h.end("c", c, TxnResult::Commit, TV2_END);
    let d = h.ready("d");
    h.add_ok("d", d, &[tp("z", 0)], TV1_ADD);
    h.init("d"); // fenced: PrepareAbort
    h.ready("e");
    h.ready("e");
    // A write that failed leaves no trace.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("e", pe(1004, 1), &[tp("q", 0)], TV1_ADD), h.now);
    h.c.complete_write(out.write.unwrap().id, Err(E::NotEnoughReplicas), 0);
    // A write still in flight is not in the log, nor in the committed state.
    let out =
        h.c.add_partitions_to_txn(&H::add_req("e", pe(1004, 1), &[tp("q", 1)], TV1_ADD), h.now);
    assert!(out.write.is_some());

    let rebuilt = h.rebuilt();
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(rebuilt.transaction(id), h.c.transaction(id), "{id}");
    }
    assert_eq!(h.state("c"), TxnState::PrepareCommit);
    assert_eq!(h.state("d"), TxnState::PrepareAbort);
    assert_eq!(h.meta("e").partitions.len(), 0);
    assert_eq!(
        rebuilt.list_transactions(&ListTransactionsFilter::default(), h.now),
        h.c.list_transactions(&ListTransactionsFilter::default(), h.now)
    );
    drop(pending_markers);
}

#[test]
fn a_corrupt_log_fails_the_load_without_panicking() {
    let records = [
        txn_record("a", Some(&metadata(1, 0, TxnState::Empty))),
        StateRecord {
            key: encode_key_for_test("b"),
            value: Some(vec![0, 0, 1]),
        },
    ];
    let err =
        CoordinatorState::replay(records.iter().map(|r| (&r.key, r.value.as_ref()))).unwrap_err();
    assert_eq!(err.index, 1);
}

fn encode_key_for_test(id: &str) -> Vec<u8> {
    records::encode_key(id)
}
