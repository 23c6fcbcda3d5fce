//! The one declaration of every Kafka API samsa serves: its key, the
//! versions served, and how a request of it is ordered against the other
//! requests of its connection.
//!
//! Everything that needs the list reads it here: ApiVersions advertises
//! exactly [`SUPPORTED_APIS`] (`handlers::api_versions`), `dispatch` refuses
//! a request outside it and routes the rest, and the listener (`server`)
//! orders a connection's requests by [`ConnectionOrder`]. Adding an API is
//! one row here and one arm in `dispatch::handle`.

use kafka_protocol::messages::ApiKey;

/// How a request is ordered against the other requests of its connection.
/// Answers always leave in request order; this is about when a request
/// runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionOrder {
    /// Runs concurrently with the connection's other requests.
    Concurrent,
    /// Runs concurrently, but appends only after every earlier request of
    /// this order has appended (`produce_order`): Produce.
    AppendInOrder,
    /// Starts once every earlier request of the connection is answered,
    /// and later ones wait for it. Kafka handles a connection's requests one
    /// at a time and clients rely on it for the group coordinator's: an
    /// OffsetFetch sent right after an asynchronous OffsetCommit sees it.
    Barrier,
}

/// One API samsa serves.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    pub key: ApiKey,
    pub min_version: i16,
    pub max_version: i16,
    pub order: ConnectionOrder,
}

const fn api(key: ApiKey, min_version: i16, max_version: i16, order: ConnectionOrder) -> Api {
    Api {
        key,
        min_version,
        max_version,
        order,
    }
}

use ConnectionOrder::{AppendInOrder, Barrier, Concurrent};

/// Every API samsa implements, with the versions it serves.
pub const SUPPORTED_APIS: &[Api] = &[
    api(ApiKey::Produce, 3, 13, AppendInOrder),
    api(ApiKey::Fetch, 4, 18, Concurrent),
    api(ApiKey::ListOffsets, 1, 10, Concurrent),
    api(ApiKey::OffsetForLeaderEpoch, 2, 4, Concurrent),
    api(ApiKey::Metadata, 0, 13, Concurrent),
    api(ApiKey::ApiVersions, 0, 4, Concurrent),
    api(ApiKey::CreateTopics, 2, 7, Concurrent),
    api(ApiKey::DeleteTopics, 1, 6, Concurrent),
    api(ApiKey::DeleteRecords, 0, 2, Concurrent),
    api(ApiKey::InitProducerId, 0, 5, Concurrent),
    api(ApiKey::DescribeConfigs, 1, 4, Concurrent),
    api(ApiKey::AlterConfigs, 0, 2, Concurrent),
    api(ApiKey::IncrementalAlterConfigs, 0, 1, Concurrent),
    api(ApiKey::CreatePartitions, 0, 3, Concurrent),
    api(ApiKey::ElectLeaders, 0, 2, Concurrent),
    api(ApiKey::AlterPartitionReassignments, 0, 1, Concurrent),
    api(ApiKey::ListPartitionReassignments, 0, 0, Concurrent),
    api(ApiKey::DescribeCluster, 0, 2, Concurrent),
    api(ApiKey::UnregisterBroker, 0, 0, Concurrent),
    api(ApiKey::FindCoordinator, 0, 6, Concurrent),
    api(ApiKey::AddPartitionsToTxn, 0, 5, Concurrent),
    api(ApiKey::AddOffsetsToTxn, 0, 4, Concurrent),
    api(ApiKey::EndTxn, 0, 5, Concurrent),
    api(ApiKey::WriteTxnMarkers, 1, 1, Concurrent),
    api(ApiKey::DescribeProducers, 0, 0, Concurrent),
    api(ApiKey::DescribeTransactions, 0, 0, Concurrent),
    api(ApiKey::ListTransactions, 0, 1, Concurrent),
    api(ApiKey::JoinGroup, 0, 9, Barrier),
    api(ApiKey::SyncGroup, 0, 5, Barrier),
    api(ApiKey::Heartbeat, 0, 4, Barrier),
    api(ApiKey::LeaveGroup, 0, 5, Barrier),
    api(ApiKey::OffsetCommit, 2, 9, Barrier),
    api(ApiKey::OffsetFetch, 1, 9, Barrier),
    api(ApiKey::OffsetDelete, 0, 0, Barrier),
    api(ApiKey::DescribeGroups, 0, 6, Barrier),
    api(ApiKey::ListGroups, 0, 5, Barrier),
    api(ApiKey::DeleteGroups, 0, 2, Barrier),
    api(ApiKey::TxnOffsetCommit, 0, 5, Barrier),
    api(ApiKey::DescribeLogDirs, 1, 4, Concurrent),
    api(ApiKey::DescribeQuorum, 0, 2, Concurrent),
    api(ApiKey::DescribeTopicPartitions, 0, 0, Concurrent),
    api(ApiKey::DescribeUserScramCredentials, 0, 0, Concurrent),
    api(ApiKey::AlterUserScramCredentials, 0, 0, Concurrent),
    api(ApiKey::DescribeAcls, 1, 3, Concurrent),
    api(ApiKey::CreateAcls, 1, 3, Concurrent),
    api(ApiKey::DeleteAcls, 1, 3, Concurrent),
    // Barriers: a connection authenticates one step at a time.
    api(ApiKey::SaslHandshake, 1, 1, Barrier),
    api(ApiKey::SaslAuthenticate, 0, 2, Barrier),
];

/// The declaration of `key`, if samsa serves it.
pub fn find(key: ApiKey) -> Option<&'static Api> {
    SUPPORTED_APIS.iter().find(|api| api.key == key)
}

/// The declaration of the API a request frame names (its first two bytes),
/// if samsa serves it.
pub fn of_frame(frame: &[u8]) -> Option<&'static Api> {
    let key = frame.get(..2).map(|k| i16::from_be_bytes([k[0], k[1]]))?;
    find(ApiKey::try_from(key).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn each_api_is_declared_once_within_the_protocol_schema() {
        let mut keys = BTreeSet::new();
        for api in SUPPORTED_APIS {
            assert!(keys.insert(api.key as i16), "{:?} declared twice", api.key);
            let known = api.key.valid_versions();
            assert!(
                known.min <= api.min_version
                    && api.min_version <= api.max_version
                    && api.max_version <= known.max,
                "{:?} serves {}..={}, outside the schema's {known}",
                api.key,
                api.min_version,
                api.max_version
            );
        }
    }

    #[test]
    fn the_group_coordinators_and_sasls_apis_are_the_barriers() {
        let barriers: BTreeSet<i16> = SUPPORTED_APIS
            .iter()
            .filter(|api| api.order == Barrier)
            .map(|api| api.key as i16)
            .collect();
        let group_apis: BTreeSet<i16> = [
            ApiKey::JoinGroup,
            ApiKey::SyncGroup,
            ApiKey::Heartbeat,
            ApiKey::LeaveGroup,
            ApiKey::OffsetCommit,
            ApiKey::OffsetFetch,
            ApiKey::TxnOffsetCommit,
            ApiKey::OffsetDelete,
            ApiKey::DeleteGroups,
            ApiKey::DescribeGroups,
            ApiKey::ListGroups,
            ApiKey::SaslHandshake,
            ApiKey::SaslAuthenticate,
        ]
        .into_iter()
        .map(|key| key as i16)
        .collect();
        assert_eq!(barriers, group_apis);
        let in_order: Vec<ApiKey> = SUPPORTED_APIS
            .iter()
            .filter(|api| api.order == AppendInOrder)
            .map(|api| api.key)
            .collect();
        assert_eq!(in_order, [ApiKey::Produce]);
    }

    #[test]
    fn a_frame_names_its_api_by_its_first_two_bytes() {
        assert_eq!(
            of_frame(&[0, 0, 0, 9]).map(|a| a.key),
            Some(ApiKey::Produce)
        );
        assert_eq!(of_frame(&[0, 11]).map(|a| a.order), Some(Barrier));
        assert!(of_frame(&[0]).is_none());
        assert!(of_frame(&[0x7f, 0x7f]).is_none(), "unknown key");
        // Known to the protocol, not served by samsa.
        assert!(of_frame(&(ApiKey::CreateDelegationToken as i16).to_be_bytes()).is_none());
    }
}
