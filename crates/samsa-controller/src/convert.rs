//! Conversions between the generated protobuf messages
//! (`samsa_proto::controller`) and the controller's domain types in
//! [`crate::logic`]. The server (`service.rs`) decodes with the `*_from_pb`
//! functions, the client (`client.rs`) encodes with the `*_to_pb` ones, so the
//! two sides cannot drift apart.
//!
//! Wire conventions: UUIDs are hyphenated strings; `-1` in counts means
//! "cluster default"; an absent `ControllerError` (or code 0) means success.

use std::collections::BTreeMap;

use samsa_proto::controller as pb;
use uuid::Uuid;

use crate::error::{ControllerError, LeaderHint};
use crate::image::PartitionState;
use crate::logic::{
    AlterPartition, CreatePartitions, CreateTopic, ElectionType, Heartbeat, RegisterBroker,
};
use crate::records::{BrokerEndpoint, BrokerId};

pub fn error_to_pb(e: &ControllerError) -> pb::ControllerError {
    let leader = match e {
        ControllerError::NotController { leader } => leader.clone(),
        _ => None,
    };
    pb::ControllerError {
        code: i32::from(e.code()),
        message: e.to_string(),
        leader_id: leader.as_ref().map(|l| l.node_id),
        leader_address: leader.map(|l| l.address).unwrap_or_default(),
    }
}

/// `Ok` when `e` is absent or carries code 0.
pub fn error_from_pb(e: Option<pb::ControllerError>) -> Result<(), ControllerError> {
    match e {
        None => Ok(()),
        Some(e) if e.code == 0 => Ok(()),
        Some(e) => {
            let leader = e.leader_id.map(|node_id| LeaderHint {
                node_id,
                address: e.leader_address.clone(),
            });
            let code = i16::try_from(e.code)
                .unwrap_or(crate::error::ResponseError::UnknownServerError.code());
            Err(ControllerError::from_code(code, e.message, leader))
        }
    }
}

pub fn parse_uuid(s: &str, what: &str) -> Result<Uuid, ControllerError> {
    Uuid::parse_str(s)
        .map_err(|_| ControllerError::InvalidRequest(format!("{what} {s:?} is not a UUID")))
}

pub fn endpoint_to_pb(e: &BrokerEndpoint) -> pb::Endpoint {
    pb::Endpoint {
        name: e.name.clone(),
        host: e.host.clone(),
        port: u32::from(e.port),
        security_protocol: e.security_protocol.clone(),
    }
}

pub fn endpoint_from_pb(e: pb::Endpoint) -> Result<BrokerEndpoint, ControllerError> {
    Ok(BrokerEndpoint {
        port: u16::try_from(e.port).map_err(|_| {
            ControllerError::InvalidRequest(format!("port {} out of range", e.port))
        })?,
        name: e.name,
        host: e.host,
        security_protocol: e.security_protocol,
    })
}

pub fn register_to_pb(r: &RegisterBroker) -> pb::RegisterBrokerRequest {
    pb::RegisterBrokerRequest {
        broker_id: r.broker_id,
        incarnation_id: r.incarnation_id.to_string(),
        cluster_id: r.cluster_id.clone().unwrap_or_default(),
        endpoints: r.endpoints.iter().map(endpoint_to_pb).collect(),
        rack: r.rack.clone(),
    }
}

pub fn register_from_pb(r: pb::RegisterBrokerRequest) -> Result<RegisterBroker, ControllerError> {
    Ok(RegisterBroker {
        broker_id: r.broker_id,
        incarnation_id: parse_uuid(&r.incarnation_id, "incarnation id")?,
        cluster_id: Some(r.cluster_id).filter(|c| !c.is_empty()),
        endpoints: r
            .endpoints
            .into_iter()
            .map(endpoint_from_pb)
            .collect::<Result<_, _>>()?,
        rack: r.rack,
    })
}

pub fn heartbeat_to_pb(h: &Heartbeat) -> pb::BrokerHeartbeatRequest {
    pb::BrokerHeartbeatRequest {
        broker_id: h.broker_id,
        broker_epoch: h.broker_epoch,
        metadata_offset: h.metadata_offset,
        want_fence: h.want_fence,
    }
}

pub fn heartbeat_from_pb(h: pb::BrokerHeartbeatRequest) -> Heartbeat {
    Heartbeat {
        broker_id: h.broker_id,
        broker_epoch: h.broker_epoch,
        metadata_offset: h.metadata_offset,
        want_fence: h.want_fence,
    }
}

fn default_if_negative(n: i32) -> Option<i32> {
    (n >= 0).then_some(n)
}

/// `topic_id`: see `CreatableTopic.topic_id`; `None` leaves the choice to the
/// controller.
pub fn create_topic_to_pb(t: &CreateTopic, topic_id: Option<Uuid>) -> pb::CreatableTopic {
    pb::CreatableTopic {
        topic_id: topic_id.map(|id| id.to_string()).unwrap_or_default(),
        name: t.name.clone(),
        num_partitions: t.num_partitions.unwrap_or(-1),
        replication_factor: t.replication_factor.unwrap_or(-1),
        assignments: t
            .assignments
            .iter()
            .flatten()
            .map(|r| pb::ReplicaList {
                broker_ids: r.clone(),
            })
            .collect(),
        configs: t
            .configs
            .iter()
            .map(|(k, v)| pb::ConfigEntry {
                name: k.clone(),
                value: Some(v.clone()),
            })
            .collect(),
    }
}

fn assignments_from_pb(lists: Vec<pb::ReplicaList>) -> Option<Vec<Vec<BrokerId>>> {
    (!lists.is_empty()).then(|| lists.into_iter().map(|l| l.broker_ids).collect())
}

pub fn create_topic_from_pb(t: pb::CreatableTopic) -> Result<CreateTopic, ControllerError> {
    let mut configs = BTreeMap::new();
    for entry in t.configs {
        let value = entry.value.ok_or_else(|| {
            ControllerError::InvalidConfig(format!("config {} has no value", entry.name))
        })?;
        configs.insert(entry.name, value);
    }
    Ok(CreateTopic {
        name: t.name,
        num_partitions: default_if_negative(t.num_partitions),
        replication_factor: default_if_negative(t.replication_factor),
        assignments: assignments_from_pb(t.assignments),
        configs,
    })
}

pub fn create_partitions_to_pb(c: &CreatePartitions) -> pb::CreatePartitionsTopic {
    pb::CreatePartitionsTopic {
        name: c.topic.clone(),
        new_total_count: c.new_total_count,
        assignments: c
            .assignments
            .iter()
            .flatten()
            .map(|r| pb::ReplicaList {
                broker_ids: r.clone(),
            })
            .collect(),
    }
}

pub fn create_partitions_from_pb(c: pb::CreatePartitionsTopic) -> CreatePartitions {
    CreatePartitions {
        topic: c.name,
        new_total_count: c.new_total_count,
        assignments: assignments_from_pb(c.assignments),
    }
}

pub fn alter_partition_from_pb(
    a: pb::AlterPartitionRequest,
) -> Result<AlterPartition, ControllerError> {
    Ok(AlterPartition {
        broker_id: a.broker_id,
        broker_epoch: a.broker_epoch,
        topic_id: parse_uuid(&a.topic_id, "topic id")?,
        partition: a.partition,
        leader_epoch: a.leader_epoch,
        partition_epoch: a.partition_epoch,
        new_isr: a.new_isr,
    })
}

/// The ISR changes of one broker as one `AlterPartitionsRequest`; the
/// broker's id and epoch are the first change's (a broker sends its own).
pub fn alter_partitions_to_pb(changes: &[AlterPartition]) -> pb::AlterPartitionsRequest {
    let (broker_id, broker_epoch) = changes
        .first()
        .map_or((-1, -1), |c| (c.broker_id, c.broker_epoch));
    pb::AlterPartitionsRequest {
        broker_id,
        broker_epoch,
        changes: changes
            .iter()
            .map(|c| pb::IsrChange {
                topic_id: c.topic_id.to_string(),
                partition: c.partition,
                leader_epoch: c.leader_epoch,
                partition_epoch: c.partition_epoch,
                new_isr: c.new_isr.clone(),
            })
            .collect(),
    }
}

pub fn alter_partitions_from_pb(
    r: pb::AlterPartitionsRequest,
) -> Result<Vec<AlterPartition>, ControllerError> {
    r.changes
        .into_iter()
        .map(|c| {
            Ok(AlterPartition {
                broker_id: r.broker_id,
                broker_epoch: r.broker_epoch,
                topic_id: parse_uuid(&c.topic_id, "topic id")?,
                partition: c.partition,
                leader_epoch: c.leader_epoch,
                partition_epoch: c.partition_epoch,
                new_isr: c.new_isr,
            })
        })
        .collect()
}

/// The answer to one ISR change: the partition's state after it, or why
/// it was refused.
pub fn alter_partition_response(
    result: &Result<PartitionState, ControllerError>,
) -> pb::AlterPartitionResponse {
    match result {
        Ok(state) => pb::AlterPartitionResponse {
            error: None,
            leader: state.leader,
            leader_epoch: state.leader_epoch,
            isr: state.isr.clone(),
            partition_epoch: state.partition_epoch,
        },
        Err(e) => pb::AlterPartitionResponse {
            error: Some(error_to_pb(e)),
            ..Default::default()
        },
    }
}

/// The partition state an `AlterPartitionResponse` carries (replicas are not
/// part of the response and come back empty).
pub fn partition_from_alter_response(r: &pb::AlterPartitionResponse) -> PartitionState {
    PartitionState::new(
        Vec::new(),
        r.isr.clone(),
        r.leader,
        r.leader_epoch,
        r.partition_epoch,
    )
}

pub fn election_type_to_pb(t: ElectionType) -> pb::ElectionType {
    match t {
        ElectionType::Preferred => pb::ElectionType::Preferred,
        ElectionType::Unclean => pb::ElectionType::Unclean,
    }
}

pub fn election_type_from_pb(t: i32) -> ElectionType {
    match pb::ElectionType::try_from(t) {
        Ok(pb::ElectionType::Unclean) => ElectionType::Unclean,
        _ => ElectionType::Preferred,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_roundtrip() {
        let reg = RegisterBroker {
            broker_id: 3,
            incarnation_id: Uuid::new_v4(),
            cluster_id: Some("c".into()),
            endpoints: vec![BrokerEndpoint {
                name: "PLAINTEXT".into(),
                host: "127.0.0.1".into(),
                port: 9092,
                security_protocol: "PLAINTEXT".into(),
            }],
            rack: Some("r1".into()),
        };
        assert_eq!(register_from_pb(register_to_pb(&reg)).unwrap(), reg);

        let topic = CreateTopic {
            name: "t".into(),
            num_partitions: None,
            replication_factor: Some(2),
            assignments: None,
            configs: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
        };
        assert_eq!(
            create_topic_from_pb(create_topic_to_pb(&topic, None)).unwrap(),
            topic
        );

        let alter = AlterPartition {
            broker_id: 1,
            broker_epoch: 4,
            topic_id: Uuid::new_v4(),
            partition: 2,
            leader_epoch: 3,
            partition_epoch: 9,
            new_isr: vec![1, 2],
        };
        // The one-partition request only arrives from brokers of earlier
        // versions: read, never sent.
        let request = pb::AlterPartitionRequest {
            broker_id: 1,
            broker_epoch: 4,
            topic_id: alter.topic_id.to_string(),
            partition: 2,
            leader_epoch: 3,
            partition_epoch: 9,
            new_isr: vec![1, 2],
        };
        assert_eq!(alter_partition_from_pb(request).unwrap(), alter);
    }

    #[test]
    fn isr_changes_roundtrip_as_one_request() {
        let change = |partition, new_isr: Vec<i32>| AlterPartition {
            broker_id: 2,
            broker_epoch: 7,
            topic_id: Uuid::new_v4(),
            partition,
            leader_epoch: 3,
            partition_epoch: 4,
            new_isr,
        };
        let changes = vec![change(0, vec![2]), change(5, vec![2, 1, 3])];
        assert_eq!(
            alter_partitions_from_pb(alter_partitions_to_pb(&changes)).unwrap(),
            changes
        );
        let refused = ControllerError::InvalidUpdateVersion { got: 1, current: 2 };
        let answer = alter_partition_response(&Err(refused.clone()));
        assert_eq!(
            error_from_pb(answer.error).unwrap_err().code(),
            refused.code()
        );
    }

    #[test]
    fn errors_roundtrip_with_codes_and_leader_hint() {
        let e = ControllerError::NotController {
            leader: Some(LeaderHint {
                node_id: 2,
                address: "127.0.0.1:1".into(),
            }),
        };
        assert_eq!(error_from_pb(Some(error_to_pb(&e))), Err(e));
        let stale = ControllerError::InvalidUpdateVersion { got: 1, current: 2 };
        let back = error_from_pb(Some(error_to_pb(&stale))).unwrap_err();
        assert_eq!(back.code(), stale.code());
        assert_eq!(error_from_pb(None), Ok(()));
    }
}
