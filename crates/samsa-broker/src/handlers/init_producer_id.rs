//! InitProducerId. Idempotent producers (no transactional id): every call
//! gets a fresh producer id at epoch 0, as Kafka does for non-transactional
//! producers (including KIP-360 re-initialisation after a fatal sequence
//! error). With a transactional id the transaction coordinator answers
//! (`handlers::txn::init_producer_id`).
//!
//! Authorization as Kafka's: WRITE on the transactional id
//! (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), or for an idempotent producer
//! IDEMPOTENT_WRITE on the cluster or WRITE on some topic
//! (CLUSTER_AUTHORIZATION_FAILED).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
use tracing::{info, warn};

use crate::producer_ids::ProducerIdError;
use crate::security::access::Access;
use crate::security::acl::{AclOperation, ResourceType};
use crate::Broker;

pub async fn handle(
    broker: &Broker,
    access: &Access,
    request: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
            .with_error_code(error.code())
    };
    if let Some(transactional_id) = request.transactional_id.as_ref() {
        if !access.allows_transactional_id(AclOperation::Write, transactional_id.0.as_str()) {
            return refused(ResponseError::TransactionalIdAuthorizationFailed);
        }
        return super::txn::init_producer_id(
            broker,
            &request,
            transactional_id.0.as_str(),
            version,
        )
        .await;
    }
    if !access.allows_cluster(AclOperation::IdempotentWrite)
        && !access.allows_any(AclOperation::Write, ResourceType::Topic)
    {
        return refused(ResponseError::ClusterAuthorizationFailed);
    }
    let response = InitProducerIdResponse::default()
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    match broker.producer_ids.next_producer_id().await {
        Ok(id) => {
            info!(producer_id = id, "producer id assigned");
            response
                .with_producer_id(ProducerId(id))
                .with_producer_epoch(0)
        }
        // As Kafka does while its controller cannot hand out a block:
        // a retriable error the client backs off on.
        Err(e @ ProducerIdError::Unavailable(_)) => {
            warn!(error = %e, "cannot allocate a producer id yet");
            response.with_error_code(ResponseError::CoordinatorLoadInProgress.code())
        }
        Err(e) => {
            warn!(error = %e, "cannot allocate a producer id");
            response.with_error_code(ResponseError::UnknownServerError.code())
        }
    }
}
