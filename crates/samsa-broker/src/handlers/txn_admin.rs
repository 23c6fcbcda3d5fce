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
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::{now_ms, Broker};
use kafka_protocol::error::ResponseError;

/// DESCRIBE on each transactional id, else
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED for it.
pub fn describe_transactions(
    broker: &Broker,
    access: &Access,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let (ids, denied): (Vec<String>, Vec<String>) = request
        .transactional_ids
        .iter()
        .map(|t| t.0.as_str().to_string())
        .partition(|id| access.allows_transactional_id(AclOperation::Describe, id));
    let described = broker.txn.serving().describe_transactions(&ids);
    let refused = denied.into_iter().map(|id| {
        TransactionState::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_transactional_id(TransactionalId(str_bytes(id)))
            .with_transaction_state(str_bytes(""))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    });
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
        .chain(refused)
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// Lists only the transactional ids the caller may DESCRIBE.
pub fn list_transactions(
    broker: &Broker,
    access: &Access,
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
                .filter(|t| {
                    access.allows_transactional_id(AclOperation::Describe, &t.transactional_id)
                })
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
/// READ on the topic, else TOPIC_AUTHORIZATION_FAILED.
pub fn describe_producers(
    broker: &Broker,
    access: &Access,
    request: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = request
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.as_str().to_string();
            let denied = !access.allows_topic(AclOperation::Read, &name);
            let partitions = t
                .partition_indexes
                .iter()
                .map(|&index| {
                    let response = PartitionResponse::default().with_partition_index(index);
                    if denied {
                        return response
                            .with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    }
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
