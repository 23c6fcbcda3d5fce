//! Per-transactional-id state: [`TxnState`] (with its transition table) and
//! [`TransactionMetadata`].

use crate::topic_partition::TopicPartition;
use std::collections::BTreeSet;
use std::fmt;

/// "No producer id" on the wire and in Kafka's logs.
pub const NO_PRODUCER_ID: i64 = -1;
/// "No producer epoch" on the wire and in Kafka's logs.
pub const NO_PRODUCER_EPOCH: i16 = -1;

/// An epoch at or above this value is exhausted: the coordinator never hands
/// it to a client to transact with, so that it can always fence a producer
/// by bumping once more (to `i16::MAX`) without overflowing.
pub const EXHAUSTED_EPOCH: i16 = i16::MAX - 1;

/// Whether `epoch` is too high to be bumped for a client (see [`EXHAUSTED_EPOCH`]).
pub fn is_epoch_exhausted(epoch: i16) -> bool {
    epoch >= EXHAUSTED_EPOCH
}

/// State of one transactional id at its coordinator.
///
/// Every transition is written to `__transaction_state` before it takes
/// effect (see the [module docs](super) for how the runtime confirms that).
///
/// | from | event | to |
/// |---|---|---|
/// | (no state) | `InitProducerId` | `Empty` (new producer id, epoch 0) |
/// | `Empty`, `CompleteCommit`, `CompleteAbort` | `InitProducerId` | `Empty` (epoch + 1, or a new producer id at epoch 0 once the epoch is exhausted) |
/// | `Empty`, `CompleteCommit`, `CompleteAbort`, `Ongoing` | `AddPartitionsToTxn`, `AddOffsetsToTxn` | `Ongoing` (partitions added; the start time is set when the transaction begins) |
/// | `Ongoing` | `EndTxn(commit)` | `PrepareCommit` (TV2: epoch + 1) |
/// | `Ongoing` | `EndTxn(abort)` | `PrepareAbort` (TV2: epoch + 1) |
/// | `Ongoing` | `InitProducerId`, or the transaction timed out | `PrepareEpochFence`, immediately `PrepareAbort` with epoch + 1 (one write) |
/// | `PrepareCommit` | markers written to every partition | `CompleteCommit` |
/// | `PrepareAbort` | markers written to every partition | `CompleteAbort` |
/// | `Empty`, `CompleteCommit`, `CompleteAbort` | `EndTxn(abort)` at the current epoch (TV2, nothing was added) | `CompleteAbort` (epoch + 1, no markers needed) |
/// | `Empty`, `CompleteCommit`, `CompleteAbort` | `transactional.id.expiration.ms` passed | `Dead` (a tombstone; the id is forgotten) |
///
/// `PrepareEpochFence` and `Dead` are never stored as a state samsa acts on:
/// the first only labels the pending write of a fencing abort, the second
/// the pending write of a tombstone. (If a record ever holds
/// `PrepareEpochFence`, replay treats the transaction as one to fence and
/// abort; a record holding `Dead` is replayed like a tombstone.)
///
/// `CompleteCommit` and `CompleteAbort` behave like `Empty` for the next
/// transaction; they are kept so that a retried `EndTxn` can be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    PrepareEpochFence,
    Dead,
}

impl TxnState {
    pub const ALL: [TxnState; 8] = [
        TxnState::Empty,
        TxnState::Ongoing,
        TxnState::PrepareCommit,
        TxnState::PrepareAbort,
        TxnState::CompleteCommit,
        TxnState::CompleteAbort,
        TxnState::PrepareEpochFence,
        TxnState::Dead,
    ];

    /// The name Kafka uses in DescribeTransactions / ListTransactions.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
            TxnState::Dead => "Dead",
        }
    }

    /// The state with Kafka name `name` (case-sensitive, as Kafka matches).
    pub fn from_name(name: &str) -> Option<TxnState> {
        TxnState::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether the table above allows `self → next`.
    pub fn can_transition_to(self, next: TxnState) -> bool {
        use TxnState::*;
        match next {
            Empty => matches!(self, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(self, Empty | Ongoing | CompleteCommit | CompleteAbort),
            PrepareCommit => self == Ongoing,
            PrepareAbort => matches!(self, Ongoing | PrepareEpochFence),
            CompleteCommit => self == PrepareCommit,
            CompleteAbort => matches!(self, PrepareAbort | Empty | CompleteCommit | CompleteAbort),
            PrepareEpochFence => self == Ongoing,
            Dead => matches!(self, Empty | CompleteCommit | CompleteAbort),
        }
    }

    /// A transaction is open: partitions may hold its uncommitted records.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            TxnState::Ongoing | TxnState::PrepareCommit | TxnState::PrepareAbort
        )
    }

    /// No transaction is open: a new one may begin, or the producer be re-initialised.
    pub fn is_idle(self) -> bool {
        matches!(
            self,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        )
    }
}

impl fmt::Display for TxnState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a transaction ends: the control record written to its partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxnResult {
    Commit,
    Abort,
}

impl TxnResult {
    /// `EndTxn`'s `committed` flag.
    pub fn from_committed(committed: bool) -> Self {
        if committed {
            TxnResult::Commit
        } else {
            TxnResult::Abort
        }
    }

    pub fn is_commit(self) -> bool {
        self == TxnResult::Commit
    }

    /// The `Prepare*` state of this outcome.
    pub fn prepare_state(self) -> TxnState {
        match self {
            TxnResult::Commit => TxnState::PrepareCommit,
            TxnResult::Abort => TxnState::PrepareAbort,
        }
    }

    /// The `Complete*` state of this outcome.
    pub fn complete_state(self) -> TxnState {
        match self {
            TxnResult::Commit => TxnState::CompleteCommit,
            TxnResult::Abort => TxnState::CompleteAbort,
        }
    }
}

/// The transaction protocol a client spoke for a transition.
///
/// - `V1`: the epoch stays the same from `InitProducerId` to the next
///   `InitProducerId` (Kafka's TV0/TV1: `EndTxn` < v5, client-side
///   `AddPartitionsToTxn` v0–v3);
/// - `V2` (KIP-890): the epoch is bumped by every `EndTxn` (v5+) and the
///   partitions are added by the partition leaders (`AddPartitionsToTxn` v4+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionVersion {
    V1,
    V2,
}

/// A producer id with one of its epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerIdAndEpoch {
    pub producer_id: i64,
    pub epoch: i16,
}

impl ProducerIdAndEpoch {
    pub const fn new(producer_id: i64, epoch: i16) -> Self {
        Self { producer_id, epoch }
    }
}

/// Everything the coordinator knows about one transactional id; each record
/// of `__transaction_state` holds one whole value of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionMetadata {
    /// The producer id the client uses now.
    pub producer_id: i64,
    /// The epoch the client uses now (the fencing epoch while a fenced
    /// transaction is being aborted).
    pub producer_epoch: i16,
    /// The id and epoch a client may still legitimately hold and retry with
    /// (`NO_PRODUCER_ID` / `NO_PRODUCER_EPOCH` when there is none):
    ///
    /// - after `InitProducerId` with the client's current id and epoch
    ///   (KIP-360): the ones it sent, so a retry of that call gets the same
    ///   answer instead of a second bump;
    /// - after a TV2 end (`EndTxn` v5+, or a timeout abort of a TV2
    ///   transaction): the ones the ended transaction ran with, so a retried
    ///   `EndTxn` is recognised — and nothing older is;
    /// - after a fresh `InitProducerId` or a fence by one: none, so the
    ///   fenced instance cannot pass for a retry.
    pub last_producer_id: i64,
    pub last_producer_epoch: i16,
    /// The producer id the client moves to when this TV2 transaction
    /// completes because its bumped epoch reached `i16::MAX` (set in
    /// `Prepare*`, consumed by `Complete*`; `NO_PRODUCER_ID` otherwise).
    pub next_producer_id: i64,
    /// `transaction.timeout.ms` the client asked for in `InitProducerId`.
    pub timeout_ms: i32,
    pub state: TxnState,
    /// Partitions (including `__consumer_offsets` ones) of the open transaction.
    pub partitions: BTreeSet<TopicPartition>,
    /// When the current (or last) transaction began; -1 before the first one
    /// after `InitProducerId`.
    pub txn_start_timestamp: i64,
    /// When this value was last changed.
    pub txn_last_update_timestamp: i64,
    /// The protocol of the last transition that depends on it (the adds of
    /// the transaction, then its end).
    pub transaction_version: TransactionVersion,
}

impl TransactionMetadata {
    /// The id and epoch the client holds now.
    pub fn current(&self) -> ProducerIdAndEpoch {
        ProducerIdAndEpoch::new(self.producer_id, self.producer_epoch)
    }

    /// [`Self::last_producer_id`] and [`Self::last_producer_epoch`], if set.
    pub fn last(&self) -> Option<ProducerIdAndEpoch> {
        (self.last_producer_epoch != NO_PRODUCER_EPOCH && self.last_producer_id != NO_PRODUCER_ID)
            .then(|| ProducerIdAndEpoch::new(self.last_producer_id, self.last_producer_epoch))
    }

    pub(crate) fn set_last(&mut self, last: Option<ProducerIdAndEpoch>) {
        match last {
            Some(p) => {
                self.last_producer_id = p.producer_id;
                self.last_producer_epoch = p.epoch;
            }
            None => {
                self.last_producer_id = NO_PRODUCER_ID;
                self.last_producer_epoch = NO_PRODUCER_EPOCH;
            }
        }
    }

    /// The id and epoch the client holds once the open transaction is
    /// complete: the current ones, or `(next_producer_id, 0)` if it rotates.
    pub fn after_completion(&self) -> ProducerIdAndEpoch {
        if self.next_producer_id != NO_PRODUCER_ID {
            ProducerIdAndEpoch::new(self.next_producer_id, 0)
        } else {
            self.current()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TxnState::*;

    #[test]
    fn transition_table() {
        let allowed: &[(TxnState, TxnState)] = &[
            (Empty, Empty),
            (CompleteCommit, Empty),
            (CompleteAbort, Empty),
            (Empty, Ongoing),
            (Ongoing, Ongoing),
            (CompleteCommit, Ongoing),
            (CompleteAbort, Ongoing),
            (Ongoing, PrepareCommit),
            (Ongoing, PrepareAbort),
            (PrepareEpochFence, PrepareAbort),
            (PrepareCommit, CompleteCommit),
            (PrepareAbort, CompleteAbort),
            (Empty, CompleteAbort),
            (CompleteCommit, CompleteAbort),
            (CompleteAbort, CompleteAbort),
            (Ongoing, PrepareEpochFence),
            (Empty, Dead),
            (CompleteCommit, Dead),
            (CompleteAbort, Dead),
        ];
        for from in TxnState::ALL {
            for to in TxnState::ALL {
                assert_eq!(
                    from.can_transition_to(to),
                    allowed.contains(&(from, to)),
                    "{from} -> {to}"
                );
            }
        }
        // Nothing leaves Dead; nothing but a fence abort leaves PrepareEpochFence.
        assert!(TxnState::ALL.iter().all(|s| !Dead.can_transition_to(*s)));
    }

    #[test]
    fn names_round_trip() {
        for s in TxnState::ALL {
            assert_eq!(TxnState::from_name(s.name()), Some(s));
        }
        assert_eq!(TxnState::from_name("ongoing"), None);
        assert_eq!(TxnState::from_name("Bogus"), None);
    }

    #[test]
    fn last_and_next_producer() {
        let mut m = TransactionMetadata {
            producer_id: 5,
            producer_epoch: 3,
            last_producer_id: NO_PRODUCER_ID,
            last_producer_epoch: NO_PRODUCER_EPOCH,
            next_producer_id: NO_PRODUCER_ID,
            timeout_ms: 1,
            state: Ongoing,
            partitions: BTreeSet::new(),
            txn_start_timestamp: -1,
            txn_last_update_timestamp: 0,
            transaction_version: TransactionVersion::V2,
        };
        assert_eq!(m.last(), None);
        m.set_last(Some(ProducerIdAndEpoch::new(5, 2)));
        assert_eq!((m.last_producer_id, m.last_producer_epoch), (5, 2));
        assert_eq!(m.last(), Some(ProducerIdAndEpoch::new(5, 2)));
        m.set_last(None);
        assert_eq!((m.last_producer_id, m.last_producer_epoch), (-1, -1));
        assert_eq!(m.after_completion(), ProducerIdAndEpoch::new(5, 3));
        m.next_producer_id = 9;
        assert_eq!(m.after_completion(), ProducerIdAndEpoch::new(9, 0));
    }

    #[test]
    fn exhaustion() {
        assert!(!is_epoch_exhausted(0));
        assert!(!is_epoch_exhausted(i16::MAX - 2));
        assert!(is_epoch_exhausted(i16::MAX - 1));
        assert!(is_epoch_exhausted(i16::MAX));
    }
}
