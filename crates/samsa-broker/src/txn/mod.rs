//! The transaction coordinator, as a sans-IO state machine (being built:
//! so far, where a transactional id is coordinated, what is known about
//! it, and how that is stored in `__transaction_state`).

pub mod placement;
pub mod records;
pub mod state;

pub use placement::{coordinator_partition, TRANSACTION_STATE_TOPIC};
pub use records::{CoordinatorState, RecordError, ReplayError, TxnRecord, Unfinished};
pub use state::{
    ProducerIdAndEpoch, TopicPartition, TransactionMetadata, TransactionVersion, TxnResult,
    TxnState,
};
