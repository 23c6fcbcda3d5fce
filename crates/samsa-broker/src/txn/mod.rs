//! The transaction coordinator, as a sans-IO state machine (being built:
//! so far, where a transactional id is coordinated and what is known
//! about it).

pub mod placement;
pub mod state;

pub use placement::{coordinator_partition, TRANSACTION_STATE_TOPIC};
pub use state::{
    ProducerIdAndEpoch, TopicPartition, TransactionMetadata, TransactionVersion, TxnResult,
    TxnState,
};
