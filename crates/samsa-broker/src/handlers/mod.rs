//! Kafka API handlers: each takes the decoded request and returns the response
//! struct; encoding and error-to-code mapping live at the edges
//! (`dispatch`, `error`).

pub mod acls;
pub mod admin;
pub mod alter_configs;
pub mod api_versions;
pub mod configs;
pub mod delete_records;
pub mod describe_log_dirs;
pub mod describe_quorum;
pub mod describe_topic_partitions;
pub mod fetch;
pub mod find_coordinator;
pub mod group;
pub mod init_producer_id;
pub mod list_offsets;
pub mod metadata;
pub mod offset_for_leader_epoch;
pub mod offsets;
pub mod produce;
pub mod replica_placement;
pub mod txn;
pub mod txn_admin;
pub mod user_scram;

use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;

pub(crate) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

pub(crate) fn topic_name(s: impl Into<String>) -> TopicName {
    TopicName(str_bytes(s))
}

/// The name of each topic of a request that names topics by id (`by_id`,
/// KIP-516: Fetch v13+, Produce v13+) or by name; `None`: an id this broker
/// does not know.
pub(crate) fn topic_names<'a>(
    broker: &crate::Broker,
    by_id: bool,
    topics: impl Iterator<Item = (&'a TopicName, &'a uuid::Uuid)>,
) -> Vec<Option<String>> {
    let image = broker.metadata.image();
    topics
        .map(|(name, id)| {
            if by_id {
                image.topic_by_id(id).map(|m| m.name.clone())
            } else {
                Some(name.0.to_string())
            }
        })
        .collect()
}

/// KIP-951: where a client should go for a partition this broker does not
/// lead (any more): the leader and leader epoch the metadata names (-1, -1
/// when it names none), and that leader's endpoint on the client's
/// listener while it is live.
pub(crate) struct LeaderHint {
    pub leader_id: i32,
    pub leader_epoch: i32,
    pub endpoint: Option<LeaderEndpoint>,
}

/// Where the leader of a [`LeaderHint`] is, for a client of one listener.
pub(crate) struct LeaderEndpoint {
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

pub(crate) fn leader_hint(
    broker: &crate::Broker,
    topic: &str,
    partition: i32,
    listener: &str,
) -> LeaderHint {
    let image = broker.metadata.image();
    let (mut leader_id, leader_epoch) = image
        .partition(topic, partition)
        .map_or((-1, -1), |p| (p.leader, p.leader_epoch));
    // Never point a client back at this broker when it refused as leader.
    if leader_id == broker.config.node_id && !broker.leads_usably(topic, partition) {
        leader_id = -1;
    }
    LeaderHint {
        leader_id,
        leader_epoch,
        endpoint: image.broker(leader_id).filter(|b| !b.fenced).and_then(|b| {
            b.endpoint(listener).map(|e| LeaderEndpoint {
                host: e.host.clone(),
                port: e.port,
                rack: b.rack.clone(),
            })
        }),
    }
}
