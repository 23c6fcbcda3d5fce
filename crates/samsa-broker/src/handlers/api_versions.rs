//! ApiVersions: advertises exactly [`crate::apis::SUPPORTED_APIS`], and
//! (v3+) the one KIP-584 feature samsa serves: `transaction.version`.
//!
//! Kafka 4 clients switch to transaction version 2 (Produce v12 adds the
//! partition, no AddPartitionsToTxn; EndTxn v5 bumps the epoch at every
//! end) only when the cluster's *finalized* `transaction.version` is 2, so
//! advertising the APIs alone leaves them on version 1. samsa serves both
//! versions side by side and has no `UpdateFeatures`: the level is fixed at
//! 2 on every node, as a fresh Kafka 4 cluster finalizes it. No other
//! feature is named: `group.version` 1 would promise KIP-848, which samsa
//! lacks, and `metadata.version` levels stand for Kafka releases.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::protocol::StrBytes;

use crate::apis::SUPPORTED_APIS;

fn supported_versions() -> Vec<ApiVersion> {
    SUPPORTED_APIS
        .iter()
        .map(|api| {
            ApiVersion::default()
                .with_api_key(api.key as i16)
                .with_min_version(api.min_version)
                .with_max_version(api.max_version)
        })
        .collect()
}

/// The `transaction.version` levels samsa implements (0 and 1 are the
/// same protocol to a broker: version 1 clients).
pub const TRANSACTION_VERSION_MIN: i16 = 0;
pub const TRANSACTION_VERSION_MAX: i16 = 2;
/// The finalized `transaction.version` of every samsa cluster.
pub const TRANSACTION_VERSION_FINALIZED: i16 = 2;
/// Epoch of the finalized features: they never change, so one value; any
/// epoch ≥ 0 tells a client the finalized list is valid (-1: none).
const FINALIZED_FEATURES_EPOCH: i64 = 1;

pub fn handle(version: i16) -> ApiVersionsResponse {
    let supported = SupportedFeatureKey::default()
        .with_name(StrBytes::from_static_str("transaction.version"))
        .with_min_version(TRANSACTION_VERSION_MIN)
        .with_max_version(TRANSACTION_VERSION_MAX);
    // KAFKA-17492: a v3 client cannot read a supported range starting at
    // 0 (TRANSACTION_VERSION_MIN), so below v4 it is left out, as Kafka does.
    let supported_features = if version >= 4 {
        vec![supported]
    } else {
        Vec::new()
    };
    let finalized = FinalizedFeatureKey::default()
        .with_name(StrBytes::from_static_str("transaction.version"))
        .with_min_version_level(TRANSACTION_VERSION_FINALIZED)
        .with_max_version_level(TRANSACTION_VERSION_FINALIZED);
    // The feature fields are tagged fields of v3+; older encoders skip them.
    ApiVersionsResponse::default()
        .with_error_code(0)
        .with_api_keys(supported_versions())
        .with_supported_features(supported_features)
        .with_finalized_features_epoch(FINALIZED_FEATURES_EPOCH)
        .with_finalized_features(vec![finalized])
}

/// The answer to an ApiVersions request at a version samsa lacks: error 35
/// with the supported ranges, encoded as v0 so any client can read it.
/// The answer to ApiVersions at a version samsa does not serve: encoded as
/// v0 by the caller, with every supported range.
pub fn unsupported_version() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(supported_versions())
}
