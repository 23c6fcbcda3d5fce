//! Dynamic configuration on a three-node cluster: IncrementalAlterConfigs
//! through one node changes what every node reports (DescribeConfigs) and
//! what every partition leader enforces, without a restart; cluster-wide
//! defaults and a broker's own values take Kafka's precedence; the values
//! live in the controller's metadata log (they survive a SIGKILL of a node
//! and are replayed); broker resources go to their own broker.
//! Single-node behaviour with Kafka clients is `tests/compat/test_configs.py`.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::{
    CreateTopicsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use samsa_tests::cluster::SamsaCluster;
use samsa_tests::codes::{INVALID_CONFIG, NONE};
use samsa_tests::{unique_topic, wait_until, BatchBuilder, KafkaClient};

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SET: i8 = 0;
const DELETE: i8 = 1;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT: i8 = 3;
const INVALID_REQUEST: i16 = 42;
const MESSAGE_TOO_LARGE: i16 = 10;
const ACKS_ALL: i16 = -1;
const WAIT: Duration = Duration::from_secs(30);

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// IncrementalAlterConfigs of one resource; `(error code, message)`.
fn alter(
    c: &mut KafkaClient,
    resource_type: i8,
    name: &str,
    ops: &[(&str, i8, Option<&str>)],
) -> (i16, String) {
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(s(name))
            .with_configs(
                ops.iter()
                    .map(|(k, op, v)| {
                        AlterableConfig::default()
                            .with_name(s(k))
                            .with_config_operation(*op)
                            .with_value(v.map(s))
                    })
                    .collect(),
            ),
    ]);
    let resp = c.send(&req, 1).unwrap();
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

/// The configs of one resource as a node describes them, by name.
fn describe(
    c: &mut KafkaClient,
    resource_type: i8,
    name: &str,
) -> BTreeMap<String, DescribeConfigsResourceResult> {
    let req = DescribeConfigsRequest::default()
        .with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(s(name))
            .with_configuration_keys(None)])
        .with_include_synonyms(true);
    let resp = c.send(&req, 4).unwrap();
    let result = resp.results.into_iter().next().unwrap();
    assert_eq!(result.error_code, NONE, "{:?}", result.error_message);
    result
        .configs
        .into_iter()
        .map(|c| (c.name.to_string(), c))
        .collect()
}

/// `(value, source)` of `key` as described.
fn value_and_source(
    configs: &BTreeMap<String, DescribeConfigsResourceResult>,
    key: &str,
) -> (Option<String>, i8) {
    let c = &configs[key];
    (c.value.as_ref().map(|v| v.to_string()), c.config_source)
}

/// Waits until `node` describes `key` of the resource as `(value, source)`
/// (a change reaches a node when it applies the metadata log's entry).
fn wait_described(
    cluster: &SamsaCluster,
    node: i32,
    resource: (i8, &str),
    key: &str,
    expected: (&str, i8),
) {
    let mut c = cluster.client(node);
    let mut last = None;
    let shown = samsa_tests::wait::try_wait_until(WAIT, || {
        let now = value_and_source(&describe(&mut c, resource.0, resource.1), key);
        let ok = now.0.as_deref() == Some(expected.0) && now.1 == expected.1;
        last = Some(now);
        ok.then_some(())
    });
    assert!(
        shown.is_some(),
        "node {node} describes {key} of {resource:?} as {last:?}, not {expected:?}"
    );
}

/// The leader of each partition of `topic`, from node 1's metadata.
fn leaders(cluster: &SamsaCluster, topic: &str) -> Vec<(i32, i32)> {
    let mut c = cluster.client(1);
    wait_until("every partition to have a leader", WAIT, || {
        let md = c.metadata(Some(&[topic])).ok()?;
        let t = md.topics.first()?;
        let ls: Vec<(i32, i32)> = t
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.leader_id.0))
            .collect();
        (ls.len() == 3 && ls.iter().all(|(_, l)| *l > 0)).then_some(ls)
    })
}

/// Produces one batch with one `size`-byte record to each partition's
/// leader (acks=all) and returns the answers' error codes.
fn produce_everywhere(cluster: &SamsaCluster, topic: &str, size: usize) -> Vec<i16> {
    leaders(cluster, topic)
        .into_iter()
        .map(|(partition, leader)| {
            let batch = BatchBuilder::new().record(vec![b'x'; size]).build();
            let mut c = cluster.client(leader);
            wait_until(
                "a produce answer that is not a leadership move",
                WAIT,
                || {
                    let code = c
                        .produce(topic, partition, batch.clone(), ACKS_ALL)
                        .ok()?
                        .error_code;
                    (!samsa_tests::codes::produce_retriable_during_failover(code)).then_some(code)
                },
            )
        })
        .collect()
}

#[test]
fn cluster_configs_change_through_any_node_and_take_effect_on_every_node() {
    let mut cluster = SamsaCluster::start(3, &[]);
    let topic = unique_topic("dyn-cfg");
    let mut c1 = cluster.client(1);
    let created = c1
        .call(
            &CreateTopicsRequest::default()
                .with_topics(vec![CreatableTopic::default()
                    .with_name(TopicName(s(&topic)))
                    .with_num_partitions(3)
                    .with_replication_factor(3)])
                .with_timeout_ms(30_000),
        )
        .unwrap();
    assert_eq!(created.topics[0].error_code, NONE);
    assert_eq!(produce_everywhere(&cluster, &topic, 4000), vec![NONE; 3]);

    // A topic config set through node 2: every node reports it, and every
    // leader refuses what it no longer allows.
    let mut c2 = cluster.client(2);
    assert_eq!(
        alter(
            &mut c2,
            RESOURCE_TOPIC,
            &topic,
            &[("max.message.bytes", SET, Some("2000"))]
        ),
        (NONE, String::new())
    );
    for node in [1, 2, 3] {
        wait_described(
            &cluster,
            node,
            (RESOURCE_TOPIC, &topic),
            "max.message.bytes",
            ("2000", SOURCE_TOPIC),
        );
    }
    assert_eq!(
        produce_everywhere(&cluster, &topic, 4000),
        vec![MESSAGE_TOO_LARGE; 3]
    );
    // A bad value is refused and changes nothing.
    let (code, message) = alter(
        &mut c2,
        RESOURCE_TOPIC,
        &topic,
        &[("max.message.bytes", SET, Some("big"))],
    );
    assert_eq!(code, INVALID_CONFIG, "{message}");
    assert!(message.contains("max.message.bytes"), "{message}");

    // Cluster-wide default through node 3, then node 1's own value.
    let mut c3 = cluster.client(3);
    assert_eq!(
        alter(
            &mut c3,
            RESOURCE_BROKER,
            "",
            &[("log.retention.ms", SET, Some("7200000"))]
        )
        .0,
        NONE
    );
    for node in [1, 2, 3] {
        wait_described(
            &cluster,
            node,
            (RESOURCE_BROKER, &node.to_string()),
            "log.retention.ms",
            ("7200000", SOURCE_DYNAMIC_DEFAULT),
        );
        wait_described(
            &cluster,
            node,
            (RESOURCE_TOPIC, &topic),
            "retention.ms",
            ("7200000", SOURCE_DYNAMIC_DEFAULT),
        );
    }
    assert_eq!(
        alter(
            &mut c1,
            RESOURCE_BROKER,
            "1",
            &[("log.retention.ms", SET, Some("3600000"))]
        )
        .0,
        NONE
    );
    wait_described(
        &cluster,
        1,
        (RESOURCE_TOPIC, &topic),
        "retention.ms",
        ("3600000", SOURCE_DYNAMIC_BROKER),
    );
    wait_described(
        &cluster,
        2,
        (RESOURCE_TOPIC, &topic),
        "retention.ms",
        ("7200000", SOURCE_DYNAMIC_DEFAULT),
    );
    // Broker 1's resource sent to broker 2, and a static key: refused.
    let (code, message) = alter(
        &mut c2,
        RESOURCE_BROKER,
        "1",
        &[("log.retention.ms", SET, Some("1"))],
    );
    assert_eq!(code, INVALID_REQUEST, "{message}");
    let (code, message) = alter(
        &mut c2,
        RESOURCE_BROKER,
        "2",
        &[("num.partitions", SET, Some("5"))],
    );
    assert_eq!(code, INVALID_REQUEST, "{message}");
    assert!(message.contains("num.partitions"), "{message}");

    // The values are in the metadata log: a node SIGKILLed and started
    // again has them, and so does the partition it leads.
    cluster.sigkill(3);
    cluster.restart(3);
    wait_described(
        &cluster,
        3,
        (RESOURCE_TOPIC, &topic),
        "max.message.bytes",
        ("2000", SOURCE_TOPIC),
    );
    wait_described(
        &cluster,
        3,
        (RESOURCE_BROKER, "3"),
        "log.retention.ms",
        ("7200000", SOURCE_DYNAMIC_DEFAULT),
    );
    assert_eq!(
        produce_everywhere(&cluster, &topic, 4000),
        vec![MESSAGE_TOO_LARGE; 3]
    );

    // Removed, the topic takes the broker default again everywhere.
    assert_eq!(
        alter(
            &mut c1,
            RESOURCE_TOPIC,
            &topic,
            &[("max.message.bytes", DELETE, None)]
        )
        .0,
        NONE
    );
    for node in [1, 2, 3] {
        wait_described(
            &cluster,
            node,
            (RESOURCE_TOPIC, &topic),
            "max.message.bytes",
            ("1048588", 5),
        );
    }
    assert_eq!(produce_everywhere(&cluster, &topic, 4000), vec![NONE; 3]);
}
