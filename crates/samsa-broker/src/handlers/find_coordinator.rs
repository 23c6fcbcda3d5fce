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
//! Where Kafka answers COORDINATOR_NOT_AVAILABLE at once while it creates
//! the state topic, samsa first waits for that creation (up to
//! [`CREATION_WAIT`]) and looks again: librdkafka retries a
//! FindCoordinator that its transactional `send_offsets_to_transaction`
//! sends only a couple of times, 100 ms apart, then waits for a broker
//! state change that a steady cluster never makes, so a first
//! transactional offset commit on a fresh cluster whose `__consumer_offsets`
//! took longer to create hung past its own timeout.
//!
//! Messages as Kafka sends them: v4+ leaves each coordinator's
//! `error_message` empty, success or not; v1–v3 name the outcome.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use tracing::debug;

use super::str_bytes;
use crate::security::access::Access;
use crate::security::acl::AclOperation;
use crate::Broker;

/// How long a FindCoordinator waits for the state topic its key needs to
/// be created (well under clients' request timeouts, 30 s and more).
pub const CREATION_WAIT: Duration = Duration::from_secs(10);

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

/// [`find`], and once more if the state topic was being created and its
/// creation ended within [`CREATION_WAIT`].
async fn find_after_creation(
    broker: &Broker,
    access: &Access,
    key_type: i8,
    key: &str,
    listener: &str,
) -> Result<(i32, String, i32), ResponseError> {
    let found = find(broker, access, key_type, key, listener);
    if found != Err(ResponseError::CoordinatorNotAvailable) {
        return found;
    }
    let ended = match key_type {
        KEY_TYPE_TRANSACTION => broker.txn.state_topic_creation_ended(CREATION_WAIT).await,
        KEY_TYPE_GROUP => {
            broker
                .groups
                .state_topic_creation_ended(CREATION_WAIT)
                .await
        }
        _ => false,
    };
    if ended {
        find(broker, access, key_type, key, listener)
    } else {
        found
    }
}

pub async fn handle(
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
        let mut coordinators = Vec::with_capacity(request.coordinator_keys.len());
        for key in &request.coordinator_keys {
            let c = Coordinator::default().with_key(key.clone());
            coordinators.push(
                match find_after_creation(broker, access, key_type, key.as_str(), listener).await {
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
                },
            );
        }
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    // v1–v3 carry a top-level message, which Kafka fills with the error's
    // name on success ("NONE") and its description on failure; v0 has none.
    let message = |text: String| (version >= 1).then(|| str_bytes(text));
    match find_after_creation(broker, access, key_type, request.key.as_str(), listener).await {
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
