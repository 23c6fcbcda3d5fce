//! FindCoordinator (v0–v6; v4+ batches `coordinator_keys`).
//!
//! Key type TRANSACTION (1): the live leader of `__transaction_state`
//! partition `coordinator_partition(T, N)` — the same placement every
//! other path uses ([`crate::coordinator::runtime::Runtime::coordinator_node`]).
//! The first request creates the topic; until it exists and has a leader
//! the answer is COORDINATOR_NOT_AVAILABLE, which clients retry.
//!
//! Key type GROUP (0): the live leader of `__consumer_offsets` partition
//! `coordinator_partition(G, N)` ([`crate::coordinator::runtime::Runtime::coordinator_node`]),
//! created on first use the same way. Any other key type is INVALID_REQUEST.
//!
//! Messages as Kafka sends them: v4+ leaves each coordinator's
//! `error_message` empty, success or not; v1–v3 name the outcome.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use tracing::debug;

use super::str_bytes;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;

/// `(node id, host, port)` on the client's listener, or the error for one
/// key. A coordinator without that listener is one the client cannot
/// reach: COORDINATOR_NOT_AVAILABLE, as Kafka answers.
fn find(
    broker: &Broker,
    access: &Access,
    key_type: i8,
    key: &str,
    listener: &str,
) -> Result<(i32, String, i32), ResponseError> {
    if key.is_empty() {
        return Err(ResponseError::InvalidRequest);
    }
    let node = match key_type {
        KEY_TYPE_TRANSACTION => {
            if !access.allows_transactional_id(AclOperation::Describe, key) {
                return Err(ResponseError::TransactionalIdAuthorizationFailed);
            }
            broker.txn.coordinator_node(broker, key)?
        }
        KEY_TYPE_GROUP => {
            if !access.allows_group(AclOperation::Describe, key) {
                return Err(ResponseError::GroupAuthorizationFailed);
            }
            broker.groups.coordinator_node(broker, key)?
        }
        _ => return Err(ResponseError::InvalidRequest),
    };
    let endpoint = node
        .endpoint(listener)
        .ok_or(ResponseError::CoordinatorNotAvailable)?;
    Ok((node.node_id, endpoint.host.clone(), endpoint.port))
}

pub fn handle(
    broker: &Broker,
    access: &Access,
    request: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    let key_type = if version >= 1 {
        request.key_type
    } else {
        KEY_TYPE_GROUP
    };
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .iter()
            .map(|key| {
                let c = Coordinator::default().with_key(key.clone());
                match find(broker, access, key_type, key.as_str(), listener) {
                    Ok((node, host, port)) => c
                        .with_node_id(BrokerId(node))
                        .with_host(str_bytes(host))
                        .with_port(port),
                    Err(e) => {
                        debug!(key = key.as_str(), key_type, error = ?e, "no coordinator");
                        c.with_node_id(BrokerId(-1))
                            .with_host(str_bytes(""))
                            .with_port(-1)
                            .with_error_code(e.code())
                    }
                }
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    // v1–v3 carry a top-level message, which Kafka fills with the error's
    // name on success ("NONE") and its description on failure; v0 has none.
    let message = |text: String| (version >= 1).then(|| str_bytes(text));
    match find(broker, access, key_type, request.key.as_str(), listener) {
        Ok((node, host, port)) => FindCoordinatorResponse::default()
            .with_error_message(message("NONE".into()))
            .with_node_id(BrokerId(node))
            .with_host(str_bytes(host))
            .with_port(port),
        Err(e) => {
            debug!(key = request.key.as_str(), key_type, error = ?e, "no coordinator");
            FindCoordinatorResponse::default()
                .with_error_code(e.code())
                .with_error_message(message(e.to_string()))
                .with_node_id(BrokerId(-1))
                .with_host(str_bytes(""))
                .with_port(-1)
        }
    }
}
