//! The transaction coordinator, as a sans-IO state machine (being built:
//! so far, where a transactional id is coordinated).

pub mod placement;

pub use placement::{coordinator_partition, TRANSACTION_STATE_TOPIC};
