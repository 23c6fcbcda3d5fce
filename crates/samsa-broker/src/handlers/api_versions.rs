//! ApiVersions: advertises exactly [`crate::dispatch::SUPPORTED_APIS`].

use bytes::BytesMut;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};

use crate::dispatch::{encode_response, DispatchError, SUPPORTED_APIS};

fn supported_versions() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|(key, min, max)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect()
}

pub fn handle() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(supported_versions())
}

/// The answer to an ApiVersions request at a version samsa lacks: error 35
/// with the supported ranges, encoded as v0 so any client can read it.
pub fn unsupported_version_response(correlation_id: i32) -> Result<BytesMut, DispatchError> {
    let response = ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(supported_versions());
    encode_response(ApiKey::ApiVersions, 0, correlation_id, &response)
}
