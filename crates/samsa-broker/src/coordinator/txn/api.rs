//! Requests and responses of the coordinator's handlers, as plain structs.
//!
//! They carry what the handlers need from the Kafka messages of the same
//! names (plus the request's API version, which decides the transaction
//! protocol and some error codes); converting from and to the wire types of
//! `kafka-protocol` is the handlers' job (`crate::handlers::txn`).

use kafka_protocol::error::ResponseError;

use super::state::{ProducerIdAndEpoch, TxnResult, NO_PRODUCER_EPOCH, NO_PRODUCER_ID};
use crate::topic_partition::TopicPartition;

/// A response whose error can be replaced, for when the write it waited for
/// failed (see [`super::TxnStep::response`]), or translated for the
/// request's version.
pub trait CoordinatorResponse {
    fn with_error(self, error: ResponseError) -> Self;
    /// Every error of the response passed through `f` (`None` is success).
    fn map_errors(self, f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self;
}

/// Internal writes (markers done, timeouts, expiration, loading) answer no one.
impl CoordinatorResponse for () {
    fn with_error(self, _error: ResponseError) -> Self {}
    fn map_errors(self, _f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self {}
}

/// `InitProducerId` with a transactional id (without one the broker hands out
/// a fresh id itself, no coordinator involved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdRequest {
    pub transactional_id: String,
    pub transaction_timeout_ms: i32,
    /// KIP-360 (v3+): the id and epoch the client has, if it sent them
    /// (`None` when it sent -1/-1).
    pub current: Option<ProducerIdAndEpoch>,
    pub version: i16,
}

impl InitProducerIdRequest {
    /// The KIP-360 fields as sent: both -1 is "none", both set is the
    /// client's producer, one without the other is INVALID_REQUEST (as
    /// Kafka answers it).
    pub fn current_from_wire(
        producer_id: i64,
        producer_epoch: i16,
    ) -> Result<Option<ProducerIdAndEpoch>, ResponseError> {
        match (producer_id, producer_epoch) {
            (NO_PRODUCER_ID, NO_PRODUCER_EPOCH) => Ok(None),
            (NO_PRODUCER_ID, _) | (_, NO_PRODUCER_EPOCH) => Err(ResponseError::InvalidRequest),
            (id, epoch) => Ok(Some(ProducerIdAndEpoch::new(id, epoch))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerIdResponse {
    pub error: Option<ResponseError>,
    pub producer_id: i64,
    pub producer_epoch: i16,
}

impl InitProducerIdResponse {
    pub fn ok(id: ProducerIdAndEpoch) -> Self {
        Self {
            error: None,
            producer_id: id.producer_id,
            producer_epoch: id.epoch,
        }
    }

    pub fn error(error: ResponseError) -> Self {
        Self {
            error: Some(error),
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
        }
    }
}

impl CoordinatorResponse for InitProducerIdResponse {
    fn with_error(self, error: ResponseError) -> Self {
        Self::error(error)
    }
    fn map_errors(mut self, f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self {
        self.error = f(self.error);
        self
    }
}

/// One transaction of `AddPartitionsToTxn`: the whole request for v0–v3
/// (sent by TV1 clients), one entry of `transactions` for v4+ (sent by
/// partition leaders: `verify_only` for KIP-890 part 1 verification, adding
/// for TV2 producers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partitions: Vec<TopicPartition>,
    /// v4+: answer whether the partitions are in the ongoing transaction,
    /// change nothing.
    pub verify_only: bool,
    pub version: i16,
}

/// The per-partition answer for one transaction (v0–v3: the whole response;
/// v4+: one entry of `results_by_transaction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddPartitionsResponse {
    pub transactional_id: String,
    pub results: Vec<(TopicPartition, Option<ResponseError>)>,
}

impl AddPartitionsResponse {
    /// The same answer for every partition.
    pub fn all(
        transactional_id: &str,
        partitions: &[TopicPartition],
        error: Option<ResponseError>,
    ) -> Self {
        Self {
            transactional_id: transactional_id.to_string(),
            results: partitions.iter().map(|tp| (tp.clone(), error)).collect(),
        }
    }

    /// The first error, if any partition has one.
    pub fn error(&self) -> Option<ResponseError> {
        self.results.iter().find_map(|(_, e)| *e)
    }
}

impl CoordinatorResponse for AddPartitionsResponse {
    fn with_error(mut self, error: ResponseError) -> Self {
        for (_, e) in &mut self.results {
            *e = Some(error);
        }
        self
    }
    fn map_errors(mut self, f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self {
        for (_, e) in &mut self.results {
            *e = f(*e);
        }
        self
    }
}

/// `AddOffsetsToTxn`: adds the group's `__consumer_offsets` partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOffsetsRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub group_id: String,
    pub version: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddOffsetsResponse {
    pub error: Option<ResponseError>,
}

impl CoordinatorResponse for AddOffsetsResponse {
    fn with_error(self, error: ResponseError) -> Self {
        Self { error: Some(error) }
    }
    fn map_errors(self, f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self {
        Self {
            error: f(self.error),
        }
    }
}

/// `EndTxn`; v5+ is transaction version 2 (the epoch is bumped by every end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndTxnRequest {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub result: TxnResult,
    pub version: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndTxnResponse {
    pub error: Option<ResponseError>,
    /// v5+: the id and epoch for the client's next transaction (-1 otherwise).
    pub producer_id: i64,
    pub producer_epoch: i16,
}

impl EndTxnResponse {
    pub fn ok(next: Option<ProducerIdAndEpoch>) -> Self {
        Self {
            error: None,
            producer_id: next.map_or(NO_PRODUCER_ID, |p| p.producer_id),
            producer_epoch: next.map_or(NO_PRODUCER_EPOCH, |p| p.epoch),
        }
    }

    pub fn error(error: ResponseError) -> Self {
        Self {
            error: Some(error),
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
        }
    }
}

impl CoordinatorResponse for EndTxnResponse {
    fn with_error(self, error: ResponseError) -> Self {
        Self::error(error)
    }
    fn map_errors(mut self, f: impl Fn(Option<ResponseError>) -> Option<ResponseError>) -> Self {
        self.error = f(self.error);
        self
    }
}

/// One entry of a `DescribeTransactions` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedTransaction {
    pub transactional_id: String,
    pub error: Option<ResponseError>,
    /// Kafka's state name (`""` with an error).
    pub state: &'static str,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub timeout_ms: i32,
    pub start_time_ms: i64,
    /// The partitions of the open transaction, by topic (topics and
    /// partitions in ascending order).
    pub topics: Vec<(String, Vec<i32>)>,
}

impl DescribedTransaction {
    pub fn error(transactional_id: &str, error: ResponseError) -> Self {
        Self {
            transactional_id: transactional_id.to_string(),
            error: Some(error),
            state: "",
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timeout_ms: 0,
            start_time_ms: -1,
            topics: Vec::new(),
        }
    }
}

/// `ListTransactions` filters (v0: states and producer ids; v1: duration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListTransactionsFilter {
    /// Kafka state names; empty means every state.
    pub states: Vec<String>,
    /// Empty means every producer id.
    pub producer_ids: Vec<i64>,
    /// Only transactions started more than this many ms ago; -1 for all.
    pub duration_filter_ms: i64,
}

impl Default for ListTransactionsFilter {
    fn default() -> Self {
        Self {
            states: Vec::new(),
            producer_ids: Vec::new(),
            duration_filter_ms: -1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTransaction {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListTransactionsResponse {
    pub error: Option<ResponseError>,
    /// Requested state names that are not states.
    pub unknown_state_filters: Vec<String>,
    /// Sorted by transactional id.
    pub transactions: Vec<ListedTransaction>,
}

/// A transaction open for longer than its timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredTransaction {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub start_time_ms: i64,
    pub timeout_ms: i32,
}
