//! The broker's view of the cluster, built from the controller's image
//! ([`metadata_view`]): what Kafka clients are told (live brokers with their
//! Kafka endpoints, the "controller", topics with leaders and ISRs) and what
//! the applier makes the hosted partitions match.
//!
//! Invariants: the conversion is pure (same image and Raft leader, same
//! view); the view carries the image's metadata offset, so a newer view
//! never has a smaller one; the reported controller is always a live broker
//! when there is one.

use samsa_controller::{MetadataImage, NodeId};

use crate::metadata::{BrokerInfo, KafkaEndpoint, MetadataView, TopicMetadata};

/// The broker's view of a controller image. The Kafka "controller" a
/// client is told is this broker itself while it is live, as a KRaft
/// broker names one of the brokers (KIP-590): clients send admin requests
/// there and it forwards them to the quorum, retrying while a new
/// controller leader is elected. Naming the Raft leader instead sent
/// clients, after a SIGKILL of that node, to a dead broker until its
/// session expired (~10 s). A fenced `me` (starting up) names the Raft
/// leader if it is a live broker, else the lowest live broker.
pub fn metadata_view(image: &MetadataImage, raft_leader: Option<NodeId>, me: i32) -> MetadataView {
    let brokers: Vec<BrokerInfo> = image
        .brokers()
        .map(|b| BrokerInfo {
            node_id: b.broker_id,
            endpoints: b
                .endpoints
                .iter()
                .map(|e| KafkaEndpoint {
                    listener: e.name.clone(),
                    host: e.host.clone(),
                    port: i32::from(e.port),
                })
                .collect(),
            rack: b.rack.clone(),
            fenced: !b.is_active(),
        })
        .collect();
    let live = |id: i32| brokers.iter().any(|b| b.node_id == id && !b.fenced);
    let controller_id = Some(me)
        .filter(|me| live(*me))
        .or_else(|| raft_leader.and_then(|l| i32::try_from(l).ok()))
        .filter(|l| live(*l))
        .or_else(|| brokers.iter().find(|b| !b.fenced).map(|b| b.node_id))
        .unwrap_or(me);
    let topics = image.topics().map(|t| TopicMetadata {
        name: t.name.clone(),
        topic_id: t.topic_id,
        partitions: i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
        replication_factor: i16::try_from(t.replication_factor()).unwrap_or(i16::MAX),
        configs: t.configs.clone(),
        partition_states: t.partitions.clone(),
    });
    MetadataView::from_parts(
        image.offset(),
        image.cluster_id().unwrap_or_default().to_owned(),
        controller_id,
        brokers,
        topics,
    )
    .with_dynamic_configs(
        image.cluster_configs().clone(),
        image.broker_configs().clone(),
    )
    .with_security(image.scram_credentials().clone(), image.acls().clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::config::MAIN_LISTENER as LISTENER;
    use samsa_controller::records::{BrokerEndpoint, MetadataRecord};
    use uuid::Uuid;

    #[test]
    fn metadata_view_reports_leaders_live_brokers_and_controller() {
        let mut image = MetadataImage::new();
        let endpoint = |port| BrokerEndpoint {
            name: LISTENER.into(),
            host: "127.0.0.1".into(),
            port,
            security_protocol: LISTENER.into(),
        };
        let topic_id = Uuid::from_u128(5);
        image
            .apply_batch(
                1,
                &[
                    MetadataRecord::ClusterIdAssigned {
                        cluster_id: "c".into(),
                    },
                    MetadataRecord::BrokerRegistered {
                        broker_id: 1,
                        incarnation_id: Uuid::from_u128(1),
                        broker_epoch: 0,
                        endpoints: vec![endpoint(9092)],
                        rack: None,
                    },
                    MetadataRecord::BrokerRegistered {
                        broker_id: 2,
                        incarnation_id: Uuid::from_u128(2),
                        broker_epoch: 1,
                        endpoints: vec![endpoint(9192)],
                        rack: None,
                    },
                    MetadataRecord::BrokerUnfenced {
                        broker_id: 2,
                        broker_epoch: 1,
                    },
                    MetadataRecord::TopicCreated {
                        name: "t".into(),
                        topic_id,
                        configs: Default::default(),
                    },
                    MetadataRecord::PartitionCreated {
                        topic_id,
                        partition: 0,
                        replicas: vec![2],
                        isr: vec![2],
                        leader: 2,
                        leader_epoch: 3,
                        partition_epoch: 0,
                    },
                ],
            )
            .unwrap();
        // Raft leader 1 is fenced: the live broker 2 is reported instead.
        let converted = metadata_view(&image, Some(1), 1);
        assert_eq!(converted.cluster_id, "c");
        assert_eq!(converted.controller_id, 2);
        assert_eq!(
            converted
                .live_brokers()
                .map(|b| b.node_id)
                .collect::<Vec<_>>(),
            vec![2]
        );
        let p = converted.partition("t", 0).unwrap();
        assert_eq!((p.leader, p.leader_epoch), (2, 3));
        assert_eq!(converted.topic("t").unwrap().replication_factor, 1);
        assert_eq!(metadata_view(&image, Some(2), 1).controller_id, 2);
        // A live broker names itself, whoever leads the quorum.
        assert_eq!(metadata_view(&image, Some(1), 2).controller_id, 2);
        assert_eq!(metadata_view(&image, None, 2).controller_id, 2);
    }
}
