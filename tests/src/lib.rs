//! Test harness for samsa: starts real `samsa` processes, talks to them with a
//! raw Kafka protocol client, builds record batches by hand, and checks
//! exactly-once properties of what clients wrote and read.
//!
//! Everything here is test code, so `unwrap`/`expect` are fine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod batch;
pub mod checker;
pub mod client;
pub mod cluster;
pub mod compat;
pub mod compose;
pub mod group;
pub mod http;
pub mod keep;
pub mod load;
pub mod nemesis;
pub mod node;
pub mod otlp;
pub mod pipeline;
pub mod pki;
pub mod rdk;
pub mod small_fs;
pub mod txn;
pub mod verify_run;
pub mod wait;

pub use batch::{BatchBuilder, FetchedRecord};
pub use checker::{EosChecker, EosReport, KeyChecker, KeyReport};
pub use client::{is_connection_closed, KafkaClient};
pub use node::SamsaNode;
pub use wait::wait_until;

/// Kafka error codes the tests assert on (names as in the Kafka protocol guide).
pub mod codes {
    pub const NONE: i16 = 0;
    pub const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub const CORRUPT_MESSAGE: i16 = 2;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub const UNSUPPORTED_VERSION: i16 = 35;
    pub const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub const INVALID_CONFIG: i16 = 40;
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const LEADER_NOT_AVAILABLE: i16 = 5;
    pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    pub const NOT_CONTROLLER: i16 = 41;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
    pub const PRODUCER_FENCED: i16 = 90;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const TRANSACTION_ABORTABLE: i16 = 120;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
    pub const GROUP_ID_NOT_FOUND: i16 = 69;

    /// Whether a client retries a Produce answered `code` while partition
    /// leadership moves (a new leader not serving yet, an ISR that still
    /// holds a dead replica): the codes Kafka's producer retries there.
    pub fn produce_retriable_during_failover(code: i16) -> bool {
        matches!(
            code,
            LEADER_NOT_AVAILABLE
                | NOT_LEADER_OR_FOLLOWER
                | REQUEST_TIMED_OUT
                | NOT_ENOUGH_REPLICAS
                | NOT_ENOUGH_REPLICAS_AFTER_APPEND
        )
    }
}

/// A topic name unique within this process (tests in one binary may share a
/// node in the future; keep names distinct anyway).
pub fn unique_topic(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
