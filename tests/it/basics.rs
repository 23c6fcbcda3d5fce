//! ApiVersions and Metadata basics: what every client does first.

use std::time::Duration;

use kafka_protocol::messages::ApiKey;
use samsa_tests::{unique_topic, SamsaNode};

/// Every API the broker is expected to serve today, each advertised with a
/// range the `kafka-protocol` codec (Kafka 4.1 schemas) knows.
#[test]
fn api_versions_advertises_the_served_apis() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let resp = c.api_versions().unwrap();
    assert_eq!(resp.error_code, 0);
    let expected = [
        ApiKey::Produce,
        ApiKey::Fetch,
        ApiKey::ListOffsets,
        ApiKey::Metadata,
        ApiKey::ApiVersions,
        ApiKey::CreateTopics,
        ApiKey::DeleteTopics,
        ApiKey::InitProducerId,
        ApiKey::DescribeConfigs,
        ApiKey::CreatePartitions,
        ApiKey::DescribeCluster,
        ApiKey::DescribeLogDirs,
        ApiKey::DescribeQuorum,
        ApiKey::DescribeTopicPartitions,
    ];
    for key in expected {
        let (min, max) = *c
            .broker_versions()
            .get(&(key as i16))
            .unwrap_or_else(|| panic!("{key:?} is not advertised"));
        let known = key.valid_versions();
        assert!(min <= max, "{key:?}: min {min} > max {max}");
        assert!(
            min >= known.min && max <= known.max,
            "{key:?} advertised {min}..{max}, outside the known schema range {known}"
        );
    }
    for k in &resp.api_keys {
        assert!(
            ApiKey::try_from(k.api_key).is_ok(),
            "unknown api key {} advertised",
            k.api_key
        );
    }
    // ApiVersions v0..=3 must all be served (clients start at different versions).
    let (min, max) = c.broker_versions()[&(ApiKey::ApiVersions as i16)];
    assert_eq!(min, 0, "ApiVersions must be served from v0");
    assert!(max >= 3, "ApiVersions max {max} < 3");
}

/// KIP-584 features: `transaction.version` is finalized at 2 (what makes
/// Kafka 4 clients use transaction version 2), supported 0..=2; a v3
/// answer leaves the supported range out because it starts at 0
/// (KAFKA-17492); v0–2 have no feature fields at all.
#[test]
fn api_versions_finalizes_transaction_version_2() {
    use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
    let node = SamsaNode::start();
    let mut c = node.client();
    let (code, v4) = c
        .api_versions_at(&ApiVersionsRequest::default(), 4)
        .unwrap();
    assert_eq!(code, 0);
    let supported: Vec<_> = v4
        .supported_features
        .iter()
        .map(|f| (f.name.to_string(), f.min_version, f.max_version))
        .collect();
    assert_eq!(supported, vec![("transaction.version".to_string(), 0, 2)]);
    let finalized: Vec<_> = v4
        .finalized_features
        .iter()
        .map(|f| (f.name.to_string(), f.min_version_level, f.max_version_level))
        .collect();
    assert_eq!(finalized, vec![("transaction.version".to_string(), 2, 2)]);
    assert!(v4.finalized_features_epoch >= 0, "{v4:?}");

    let (code, v3) = c
        .api_versions_at(&ApiVersionsRequest::default(), 3)
        .unwrap();
    assert_eq!(code, 0);
    assert!(v3.supported_features.is_empty(), "{v3:?}");
    assert_eq!(v3.finalized_features.len(), 1, "{v3:?}");

    // v2 has no tagged fields: the decoder would find trailing bytes if
    // the broker wrote any.
    let (code, v2) = c
        .api_versions_at(&ApiVersionsRequest::default(), 2)
        .unwrap();
    assert_eq!(code, 0);
    assert!(v2.finalized_features.is_empty());
}

#[test]
fn metadata_describes_this_broker_and_created_topics() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let topic = unique_topic("md");
    c.create_topic(&topic, 3).unwrap();
    let md = c.metadata(None).unwrap();
    assert_eq!(md.brokers.len(), 1, "{md:?}");
    let b = &md.brokers[0];
    assert_eq!(b.node_id.0, node.node_id());
    assert_eq!(b.host.as_str(), "127.0.0.1");
    assert_eq!(b.port, i32::from(node.port()));
    assert_eq!(md.controller_id.0, node.node_id(), "controller id");
    let t = md
        .topics
        .iter()
        .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .unwrap_or_else(|| panic!("{topic} missing from {md:?}"));
    assert_eq!(t.error_code, 0);
    let mut parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    parts.sort();
    assert_eq!(parts, vec![0, 1, 2]);
    for p in &t.partitions {
        assert_eq!(p.error_code, 0);
        assert_eq!(p.leader_id.0, node.node_id());
        assert_eq!(
            p.replica_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![node.node_id()]
        );
        assert_eq!(
            p.isr_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
            vec![node.node_id()]
        );
    }
    // Creating it again is TOPIC_ALREADY_EXISTS.
    let again = c.create_topic_result(&topic, 3).unwrap();
    assert_eq!(again.error_code, samsa_tests::codes::TOPIC_ALREADY_EXISTS);
    // Deleting makes it disappear.
    assert_eq!(c.delete_topic(&topic).unwrap(), 0);
    // (Kafka lets metadata catch up asynchronously: poll with a deadline.)
    samsa_tests::wait_until(
        "deleted topic to leave metadata",
        Duration::from_secs(10),
        || c.partition_count(&topic).unwrap().is_none().then_some(()),
    );
}
