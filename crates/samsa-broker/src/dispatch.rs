//! Request decoding, version checks and routing to handlers.
//!
//! [`crate::apis::SUPPORTED_APIS`] is the single table of what samsa
//! implements: ApiVersions advertises exactly it, and a request outside it is
//! refused here.
//!
//! Kafka's rules kept here: the ApiVersions response always uses response
//! header v0, and an ApiVersions request at an unknown version is answered
//! with UNSUPPORTED_VERSION and the supported ranges encoded as v0. Every other
//! response uses `ApiKey::response_header_version`. An unknown API key, an
//! unsupported version of another API, or a body that does not decode closes
//! the connection.

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};
use tracing::{debug, Instrument};

use crate::handlers;
use crate::produce_order::AppendTurn;
use crate::Broker;

/// Where a request came from: the client's address (DescribeGroups shows
/// it as a member's host) and the listener its connection came in on (the
/// broker addresses a client is told are that listener's).
#[derive(Debug, Clone)]
pub struct ClientConnection {
    pub peer: std::net::SocketAddr,
    pub listener: std::sync::Arc<str>,
    /// Who the connection authenticated as (TLS client certificate, SASL);
    /// `User:ANONYMOUS` otherwise.
    pub principal: std::sync::Arc<crate::security::Principal>,
}

/// A SaslHandshake or SaslAuthenticate frame of a SASL listener's
/// connection, answered by its session (`security::sasl`): the encoded
/// answer, and whether the connection goes on.
pub(crate) fn sasl_step(
    frame: &Bytes,
    session: &mut crate::security::sasl::SaslSession,
    now_ms: i64,
) -> Result<(BytesMut, crate::security::sasl::Outcome), DispatchError> {
    let mut frame = frame.clone();
    if frame.len() < 8 {
        return Err(DispatchError::Close(
            "frame too short for a request header".into(),
        ));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let v = i16::from_be_bytes([frame[2], frame[3]]);
    let cid = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api_key = ApiKey::try_from(raw_key)
        .map_err(|_| DispatchError::Close(format!("unknown api key {raw_key}")))?;
    let supported = crate::apis::find(api_key)
        .is_some_and(|api| (api.min_version..=api.max_version).contains(&v));
    if !supported {
        return Err(DispatchError::Close(format!(
            "unsupported version {v} of {api_key:?}"
        )));
    }
    let header = RequestHeader::decode(&mut frame, api_key.request_header_version(v))
        .map_err(|e| DispatchError::Close(format!("malformed {api_key:?} header: {e}")))?;
    match api_key {
        ApiKey::SaslHandshake => {
            let request = decode(api_key, &mut frame, v)?;
            let (response, outcome) = session.handshake(&request);
            Ok((
                encode_response(api_key, v, header.correlation_id, &response)?,
                outcome,
            ))
        }
        ApiKey::SaslAuthenticate => {
            let request = decode(api_key, &mut frame, v)?;
            let (response, outcome) = session.authenticate(&request, v, now_ms);
            Ok((encode_response(api_key, v, cid, &response)?, outcome))
        }
        other => Err(DispatchError::Close(format!(
            "{other:?} is not a SASL request"
        ))),
    }
}

#[derive(Debug)]
pub enum DispatchError {
    /// The connection must be closed; the reason is logged.
    Close(String),
}

/// Decodes one request frame, runs its handler, and returns the encoded
/// response (header + body, without the length prefix), or `None` when the
/// protocol says not to answer (acks=0 produce). `turn` is a
/// Produce request's place in its connection's append order
/// ([`crate::produce_order`]; none: it appends whenever it runs).
pub async fn dispatch(
    broker: &Broker,
    mut frame: Bytes,
    client: &ClientConnection,
    turn: Option<AppendTurn>,
) -> Result<Option<BytesMut>, DispatchError> {
    if frame.len() < 8 {
        return Err(DispatchError::Close(format!(
            "frame of {} bytes is too short for a request header",
            frame.len()
        )));
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api_key = ApiKey::try_from(raw_key)
        .map_err(|_| DispatchError::Close(format!("unknown api key {raw_key}")))?;

    let Some(&crate::apis::Api {
        min_version: min,
        max_version: max,
        ..
    }) = crate::apis::find(api_key)
    else {
        return Err(DispatchError::Close(format!(
            "unsupported api {api_key:?} (key {raw_key}) v{version}"
        )));
    };
    if version < min || version > max {
        if api_key == ApiKey::ApiVersions {
            let response = handlers::api_versions::unsupported_version();
            return encode_response(ApiKey::ApiVersions, 0, correlation_id, &response).map(Some);
        }
        return Err(DispatchError::Close(format!(
            "unsupported version {version} of {api_key:?} (supported {min}..={max})"
        )));
    }

    let header_version = api_key.request_header_version(version);
    let header = RequestHeader::decode(&mut frame, header_version).map_err(|e| {
        DispatchError::Close(format!(
            "malformed {api_key:?} v{version} request header: {e}"
        ))
    })?;
    let client_id = header
        .client_id
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default();
    // The root of the request's trace (`crate::trace`); its transaction
    // fields are filled in once the body is decoded.
    let span = tracing::debug_span!(
        target: crate::trace::TARGET,
        "request",
        otel.name = api_key_name(api_key),
        otel.kind = "server",
        api = ?api_key,
        version,
        correlation_id,
        client_id = client_id.as_str(),
        principal = %client.principal,
        listener = &*client.listener,
        transactional_id = tracing::field::Empty,
        producer_id = tracing::field::Empty,
        producer_epoch = tracing::field::Empty,
        partitions = tracing::field::Empty,
    );
    handle(broker, api_key, header, frame, client, turn, &span)
        .instrument(span.clone())
        .await
        .map_err(|DispatchError::Close(reason)| {
            DispatchError::Close(format!(
                "{reason} (client id {client_id:?}, correlation id {correlation_id})"
            ))
        })
}

/// The API's name as Kafka spells it (`Produce`, `EndTxn`): a trace's
/// span name.
fn api_key_name(api_key: ApiKey) -> String {
    format!("{api_key:?}")
}

/// The client software an ApiVersions request (v3+, KIP-511) names, if it
/// decodes (the request itself is decoded again by its handler).
pub fn client_software(frame: &Bytes) -> Option<(String, String)> {
    let mut frame = frame.clone();
    let version = i16::from_be_bytes([*frame.get(2)?, *frame.get(3)?]);
    if version < 3 {
        return None;
    }
    RequestHeader::decode(
        &mut frame,
        ApiKey::ApiVersions.request_header_version(version),
    )
    .ok()?;
    let request = kafka_protocol::messages::ApiVersionsRequest::decode(&mut frame, version).ok()?;
    Some((
        request.client_software_name.to_string(),
        request.client_software_version.to_string(),
    ))
}

fn decode<T: Decodable>(
    api_key: ApiKey,
    body: &mut Bytes,
    version: i16,
) -> Result<T, DispatchError> {
    // Kept for the log line: which bytes did not decode is what tells a
    // client's bug from a decoder's.
    let whole = body.clone();
    let request = T::decode(body, version).map_err(|e| {
        DispatchError::Close(format!(
            "malformed {api_key:?} v{version} request: {e}; body of {} bytes, {} undecoded, starting {}",
            whole.len(),
            body.remaining(),
            hex_prefix(&whole, MALFORMED_PREFIX_BYTES)
        ))
    })?;
    if body.has_remaining() {
        debug!(api = ?api_key, trailing = body.remaining(), "request has trailing bytes");
    }
    Ok(request)
}

/// How much of an undecodable request body the log line shows.
const MALFORMED_PREFIX_BYTES: usize = 64;

/// The first `limit` bytes of `bytes` in hex (`…` when there are more).
fn hex_prefix(bytes: &[u8], limit: usize) -> String {
    let mut out: String = bytes
        .iter()
        .take(limit)
        .map(|b| format!("{b:02x}"))
        .collect();
    if bytes.len() > limit {
        out.push('…');
    }
    out
}

/// Encodes `response` with the header version the API and version call for.
pub fn encode_response<T: Encodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &T,
) -> Result<BytesMut, DispatchError> {
    let mut buf = BytesMut::new();
    let header_version = if api_key == ApiKey::ApiVersions {
        0
    } else {
        api_key.response_header_version(version)
    };
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, header_version)
        .and_then(|_| response.encode(&mut buf, version))
        .map_err(|e| {
            // An encoding failure is a samsa bug (a field set that the version
            // lacks); closing is what the client can best recover from.
            tracing::error!(api = ?api_key, version, error = %e, "cannot encode response");
            DispatchError::Close(format!(
                "cannot encode {api_key:?} v{version} response: {e}"
            ))
        })?;
    Ok(buf)
}

/// Long on purpose: one arm per API, each only decoding and calling its
/// handler (the APIs themselves are declared in [`crate::apis`]).
async fn handle(
    broker: &Broker,
    api_key: ApiKey,
    header: RequestHeader,
    mut body: Bytes,
    client: &ClientConnection,
    turn: Option<AppendTurn>,
    span: &tracing::Span,
) -> Result<Option<BytesMut>, DispatchError> {
    use crate::trace::{note_partitions, note_transaction};
    let listener = &*client.listener;
    let access = &broker.access(client);
    let v = header.request_api_version;
    let cid = header.correlation_id;
    use crate::security::acl::AclOperation::{Alter, Describe, Read};
    use kafka_protocol::error::ResponseError;
    const GROUP_DENIED: i16 = ResponseError::GroupAuthorizationFailed.code();
    const CLUSTER_DENIED: i16 = ResponseError::ClusterAuthorizationFailed.code();
    let meter = broker.request_meters.get(api_key);
    macro_rules! respond {
        ($resp:expr) => {{
            let answer = $resp;
            if let Some(meter) = meter {
                crate::request_metrics::count_errors(&broker.metrics.requests, meter, &answer);
            }
            encode_response(api_key, v, cid, &answer).map(Some)
        }};
    }
    match api_key {
        ApiKey::ApiVersions => {
            let _request: kafka_protocol::messages::ApiVersionsRequest =
                decode(api_key, &mut body, v)?;
            respond!(handlers::api_versions::handle(v))
        }
        ApiKey::Metadata => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::metadata::handle(broker, access, request, v, listener).await)
        }
        ApiKey::Produce => {
            let request: kafka_protocol::messages::ProduceRequest = decode(api_key, &mut body, v)?;
            note_transaction(
                span,
                request.transactional_id.as_ref().map(|t| t.0.as_str()),
                None,
            );
            note_partitions(
                span,
                request.topic_data.iter().map(|t| t.partition_data.len()),
            );
            let acks = request.acks;
            let response = handlers::produce::handle(
                broker,
                access,
                request,
                v,
                turn.unwrap_or_default(),
                listener,
            )
            .await;
            if acks == 0 {
                Ok(None)
            } else {
                respond!(response)
            }
        }
        ApiKey::Fetch => {
            let request: kafka_protocol::messages::FetchRequest = decode(api_key, &mut body, v)?;
            note_partitions(span, request.topics.iter().map(|t| t.partitions.len()));
            respond!(handlers::fetch::handle(broker, access, request, v, listener).await)
        }
        ApiKey::ListOffsets => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::list_offsets::handle(broker, access, request, v))
        }
        ApiKey::OffsetForLeaderEpoch => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::offset_for_leader_epoch::handle(
                broker, access, request
            ))
        }
        ApiKey::ElectLeaders => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::replica_placement::elect_leaders(broker, access, request, v).await)
        }
        ApiKey::AlterPartitionReassignments => {
            let request = decode(api_key, &mut body, v)?;
            respond!(
                handlers::replica_placement::alter_partition_reassignments(
                    broker, access, request, v
                )
                .await
            )
        }
        ApiKey::ListPartitionReassignments => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::replica_placement::list_partition_reassignments(
                broker, access, request
            ))
        }
        ApiKey::CreateTopics => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::admin::create_topics(broker, access, request, v).await)
        }
        ApiKey::DeleteTopics => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::admin::delete_topics(broker, access, request, v).await)
        }
        ApiKey::DeleteRecords => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::delete_records::handle(broker, access, request))
        }
        ApiKey::CreatePartitions => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::admin::create_partitions(broker, access, request).await)
        }
        ApiKey::DescribeConfigs => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::configs::describe_configs(
                broker, access, request, v
            ))
        }
        ApiKey::AlterConfigs => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::alter_configs::alter_configs(broker, access, request).await)
        }
        ApiKey::IncrementalAlterConfigs => {
            let request = decode(api_key, &mut body, v)?;
            respond!(
                handlers::alter_configs::incremental_alter_configs(broker, access, request).await
            )
        }
        ApiKey::UnregisterBroker => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::admin::unregister_broker(broker, access, request).await)
        }
        ApiKey::DescribeCluster => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::admin::describe_cluster(
                broker, access, request, v, listener
            ))
        }
        ApiKey::InitProducerId => {
            let request: kafka_protocol::messages::InitProducerIdRequest =
                decode(api_key, &mut body, v)?;
            note_transaction(
                span,
                request.transactional_id.as_ref().map(|t| t.0.as_str()),
                Some((request.producer_id.0, request.producer_epoch)),
            );
            respond!(handlers::init_producer_id::handle(broker, access, request, v).await)
        }
        ApiKey::FindCoordinator => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::find_coordinator::handle(broker, access, request, v, listener).await)
        }
        ApiKey::AddPartitionsToTxn => {
            let request: kafka_protocol::messages::AddPartitionsToTxnRequest =
                decode(api_key, &mut body, v)?;
            // v4+ batches transactions of many producers (from brokers).
            if v <= 3 {
                note_transaction(
                    span,
                    Some(request.v3_and_below_transactional_id.0.as_str()),
                    Some((
                        request.v3_and_below_producer_id.0,
                        request.v3_and_below_producer_epoch,
                    )),
                );
            }
            respond!(handlers::txn::add_partitions_to_txn(broker, access, request, v).await)
        }
        ApiKey::AddOffsetsToTxn => {
            let request: kafka_protocol::messages::AddOffsetsToTxnRequest =
                decode(api_key, &mut body, v)?;
            note_transaction(
                span,
                Some(request.transactional_id.0.as_str()),
                Some((request.producer_id.0, request.producer_epoch)),
            );
            respond!(handlers::txn::add_offsets_to_txn(broker, access, request, v).await)
        }
        ApiKey::EndTxn => {
            let request: kafka_protocol::messages::EndTxnRequest = decode(api_key, &mut body, v)?;
            note_transaction(
                span,
                Some(request.transactional_id.0.as_str()),
                Some((request.producer_id.0, request.producer_epoch)),
            );
            respond!(handlers::txn::end_txn(broker, access, request, v).await)
        }
        ApiKey::WriteTxnMarkers => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::txn::write_txn_markers(broker, access, request).await)
        }
        ApiKey::DescribeProducers => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::txn_admin::describe_producers(
                broker, access, request
            ))
        }
        ApiKey::DescribeTransactions => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::txn_admin::describe_transactions(
                broker, access, request
            ))
        }
        ApiKey::ListTransactions => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::txn_admin::list_transactions(
                broker, access, request, v
            ))
        }
        ApiKey::JoinGroup => {
            let request: kafka_protocol::messages::JoinGroupRequest =
                decode(api_key, &mut body, v)?;
            if !access.allows_group(Read, request.group_id.as_str()) {
                return respond!(kafka_protocol::messages::JoinGroupResponse::default()
                    .with_error_code(GROUP_DENIED)
                    .with_generation_id(-1)
                    .with_member_id(request.member_id));
            }
            let member = crate::coordinator::group::ClientInfo {
                client_id: header
                    .client_id
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_default(),
                // Kafka's form: "/" and the address.
                client_host: format!("/{}", client.peer.ip()),
            };
            respond!(handlers::group::join_group(broker, request, v, member).await)
        }
        ApiKey::SyncGroup => {
            let request: kafka_protocol::messages::SyncGroupRequest =
                decode(api_key, &mut body, v)?;
            if !access.allows_group(Read, request.group_id.as_str()) {
                return respond!(kafka_protocol::messages::SyncGroupResponse::default()
                    .with_error_code(GROUP_DENIED));
            }
            respond!(handlers::group::sync_group(broker, request, v).await)
        }
        ApiKey::Heartbeat => {
            let request: kafka_protocol::messages::HeartbeatRequest =
                decode(api_key, &mut body, v)?;
            if !access.allows_group(Read, request.group_id.as_str()) {
                return respond!(kafka_protocol::messages::HeartbeatResponse::default()
                    .with_error_code(GROUP_DENIED));
            }
            respond!(handlers::group::heartbeat(broker, request))
        }
        ApiKey::LeaveGroup => {
            let request: kafka_protocol::messages::LeaveGroupRequest =
                decode(api_key, &mut body, v)?;
            if !access.allows_group(Read, request.group_id.as_str()) {
                return respond!(kafka_protocol::messages::LeaveGroupResponse::default()
                    .with_error_code(GROUP_DENIED));
            }
            respond!(handlers::group::leave_group(broker, request, v))
        }
        ApiKey::OffsetCommit => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::offsets::offset_commit(broker, access, request, v).await)
        }
        ApiKey::OffsetFetch => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::offsets::offset_fetch(broker, access, request, v))
        }
        ApiKey::OffsetDelete => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::offsets::offset_delete(broker, access, request).await)
        }
        ApiKey::DescribeGroups => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::group::describe_groups(broker, access, request, v))
        }
        ApiKey::ListGroups => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::group::list_groups(broker, access, request, v))
        }
        ApiKey::DeleteGroups => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::group::delete_groups(broker, access, request).await)
        }
        ApiKey::TxnOffsetCommit => {
            let request: kafka_protocol::messages::TxnOffsetCommitRequest =
                decode(api_key, &mut body, v)?;
            note_transaction(
                span,
                Some(request.transactional_id.0.as_str()),
                Some((request.producer_id.0, request.producer_epoch)),
            );
            respond!(handlers::offsets::txn_offset_commit(broker, access, request, v).await)
        }
        ApiKey::DescribeLogDirs => {
            let request = decode(api_key, &mut body, v)?;
            if !access.allows_cluster(Describe) {
                return respond!(kafka_protocol::messages::DescribeLogDirsResponse::default()
                    .with_error_code(CLUSTER_DENIED));
            }
            respond!(handlers::describe_log_dirs::handle(broker, request))
        }
        ApiKey::DescribeQuorum => {
            let request = decode(api_key, &mut body, v)?;
            if !access.allows_cluster(Describe) {
                return respond!(kafka_protocol::messages::DescribeQuorumResponse::default()
                    .with_error_code(CLUSTER_DENIED));
            }
            respond!(handlers::describe_quorum::handle(broker, request, v).await)
        }
        ApiKey::DescribeUserScramCredentials => {
            let request = decode(api_key, &mut body, v)?;
            if !access.allows_cluster(Describe) {
                return respond!(
                    kafka_protocol::messages::DescribeUserScramCredentialsResponse::default()
                        .with_error_code(CLUSTER_DENIED)
                );
            }
            respond!(handlers::user_scram::describe(broker, request))
        }
        ApiKey::AlterUserScramCredentials => {
            let request: kafka_protocol::messages::AlterUserScramCredentialsRequest =
                decode(api_key, &mut body, v)?;
            if !access.allows_cluster(Alter) {
                return respond!(handlers::user_scram::refuse_all(
                    &request,
                    ResponseError::ClusterAuthorizationFailed
                ));
            }
            respond!(handlers::user_scram::alter(broker, request).await)
        }
        ApiKey::CreateAcls => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::acls::create_acls(broker, access, request).await)
        }
        ApiKey::DescribeAcls => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::acls::describe_acls(access, request))
        }
        ApiKey::DeleteAcls => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::acls::delete_acls(broker, access, request).await)
        }
        // Only a SASL listener's connection authenticates (`sasl_step`, before
        // dispatch); elsewhere Kafka answers ILLEGAL_SASL_STATE.
        ApiKey::SaslHandshake => {
            let _request: kafka_protocol::messages::SaslHandshakeRequest =
                decode(api_key, &mut body, v)?;
            respond!(kafka_protocol::messages::SaslHandshakeResponse::default()
                .with_error_code(kafka_protocol::error::ResponseError::IllegalSaslState.code()))
        }
        ApiKey::SaslAuthenticate => {
            let _request: kafka_protocol::messages::SaslAuthenticateRequest =
                decode(api_key, &mut body, v)?;
            respond!(
                kafka_protocol::messages::SaslAuthenticateResponse::default()
                    .with_error_code(kafka_protocol::error::ResponseError::IllegalSaslState.code())
                    .with_error_message(Some(handlers::str_bytes(
                        "SASL authentication is not enabled on this listener"
                    )))
            )
        }
        ApiKey::DescribeTopicPartitions => {
            let request = decode(api_key, &mut body, v)?;
            respond!(handlers::describe_topic_partitions::handle(
                broker, access, request, listener
            ))
        }
        other => Err(DispatchError::Close(format!("no handler for {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::hex_prefix;

    #[test]
    fn hex_prefix_is_bounded() {
        assert_eq!(hex_prefix(&[0x00, 0xab, 0x10], 8), "00ab10");
        assert_eq!(hex_prefix(&[1, 2, 3, 4], 2), "0102…");
        assert_eq!(hex_prefix(&[], 2), "");
    }
}
