//! Transaction admin APIs (KIP-664): DescribeTransactions and
//! ListTransactions, answered by the transaction coordinator from its
//! committed state, and DescribeProducers, answered by a partition leader
//! from the partition's producer state.

use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::{
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
    DescribeTransactionsResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId,
    TransactionalId,
};

use super::{str_bytes, topic_name};
use crate::coordinator::txn::{self};
use crate::error::partition_error_code;
use crate::error::wire_code;
use crate::{now_ms, Broker};

pub fn describe_transactions(
    broker: &Broker,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let ids: Vec<String> = request
        .transactional_ids
        .iter()
        .map(|t| t.0.as_str().to_string())
        .collect();
    let described = broker.txn.serving().describe_transactions(&ids);
    let states = described
        .into_iter()
        .map(|d| {
            TransactionState::default()
                .with_error_code(wire_code(d.error))
                .with_transactional_id(TransactionalId(str_bytes(d.transactional_id)))
                .with_transaction_state(str_bytes(d.state))
                .with_transaction_timeout_ms(d.timeout_ms)
                .with_transaction_start_time_ms(d.start_time_ms)
                .with_producer_id(ProducerId(d.producer_id))
                .with_producer_epoch(d.producer_epoch)
                .with_topics(
                    d.topics
                        .into_iter()
                        .map(|(topic, partitions)| {
                            TopicData::default()
                                .with_topic(topic_name(topic))
                                .with_partitions(partitions)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

pub fn list_transactions(
    broker: &Broker,
    request: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let filter = txn::ListTransactionsFilter {
        states: request
            .state_filters
            .iter()
            .map(|s| s.as_str().to_string())
            .collect(),
        producer_ids: request.producer_id_filters.iter().map(|p| p.0).collect(),
        duration_filter_ms: if version >= 1 {
            request.duration_filter
        } else {
            -1
        },
    };
    let listed = broker.txn.serving().list_transactions(&filter, now_ms());
    ListTransactionsResponse::default()
        .with_error_code(wire_code(listed.error))
        .with_unknown_state_filters(
            listed
                .unknown_state_filters
                .into_iter()
                .map(str_bytes)
                .collect(),
        )
        .with_transaction_states(
            listed
                .transactions
                .into_iter()
                .map(|t| {
                    ListedState::default()
                        .with_transactional_id(TransactionalId(str_bytes(t.transactional_id)))
                        .with_producer_id(ProducerId(t.producer_id))
                        .with_transaction_state(str_bytes(t.state))
                })
                .collect(),
        )
}

/// `DescribeProducers`: the producer state of partitions this broker leads.
pub fn describe_producers(
    broker: &Broker,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&index| {
                    let response = PartitionResponse::default().with_partition_index(index);
                    let described = broker
                        .leader_partition(&name, index)
                        .and_then(|p| p.describe_producers().map_err(|e| partition_error_code(&e)));
                    match described {
                        Ok(producers) => response.with_active_producers(
                            producers
                                .into_iter()
                                .map(|d| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(d.producer_id))
                                        .with_producer_epoch(i32::from(d.producer_epoch))
                                        .with_last_sequence(d.last_sequence)
                                        .with_last_timestamp(d.last_timestamp)
                                        .with_coordinator_epoch(d.coordinator_epoch)
                                        .with_current_txn_start_offset(d.current_txn_start_offset)
                                })
                                .collect(),
                        ),
                        Err(e) => response.with_error_code(e.code()),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
