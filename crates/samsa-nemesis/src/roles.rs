//! Finding the node that holds a role when a fault aimed at the role
//! starts: the leader of a topic partition (Metadata), the active controller
//! (DescribeQuorum), a transaction coordinator (FindCoordinator).
//!
//! [`Roles`] is what the runner asks; [`KafkaRoles`] answers through the
//! Kafka port of whichever node answers (the CLI's small protocol client).

use kafka_protocol::messages::describe_quorum_request::{
    DescribeQuorumRequest, PartitionData, TopicData,
};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::StrBytes;
use samsa_tools::wire::{ClusterClient, Connection};

/// Who holds a role now; `None` when no node knows (e.g. an election runs).
pub trait Roles {
    fn partition_leader(&mut self) -> Option<u32>;
    fn controller(&mut self) -> Option<u32>;
}

/// [`Roles`] over the Kafka protocol; blocking (call it from a thread that
/// may block on `handle`).
pub struct KafkaRoles {
    /// `host:port` of every node's Kafka listener.
    pub bootstrap: Vec<String>,
    pub topic: String,
    pub partition: i32,
    pub handle: tokio::runtime::Handle,
}

impl Roles for KafkaRoles {
    fn partition_leader(&mut self) -> Option<u32> {
        let topic = self.topic.clone();
        let partition = self.partition;
        self.handle.block_on(async {
            for addr in &self.bootstrap {
                let Ok(c) = ClusterClient::connect(addr).await else {
                    continue;
                };
                if let Ok(p) = c.partition(&topic, partition) {
                    if p.leader > 0 {
                        return u32::try_from(p.leader).ok();
                    }
                }
            }
            None
        })
    }

    fn controller(&mut self) -> Option<u32> {
        self.handle.block_on(async {
            for addr in &self.bootstrap {
                let Ok(mut c) = Connection::connect(addr).await else {
                    continue;
                };
                let req = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
                    .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                    .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
                let Ok((resp, _)) = c.send(&req, 1).await else {
                    continue;
                };
                let leader = resp
                    .topics
                    .first()
                    .and_then(|t| t.partitions.first())
                    .map(|p| p.leader_id.0);
                if let Some(l) = leader.filter(|l| *l > 0) {
                    return u32::try_from(l).ok();
                }
            }
            None
        })
    }
}
