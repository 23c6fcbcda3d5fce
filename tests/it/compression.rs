//! A topic's `compression.type` other than `producer`: the leader stores
//! every batch in the topic's codec whatever the producer used, consumers
//! read the records unchanged, and idempotence and transactions work as on
//! any topic. Producers and consumers are librdkafka; the stored codec is
//! read from raw Fetch answers and from `samsa dump-log` of the segment.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{CreateTopicsRequest, DescribeConfigsRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use samsa_tests::batch::{batch_codecs, layout};
use samsa_tests::client::{topic_name, KafkaClient};
use samsa_tests::cluster::run_to_exit;
use samsa_tests::codes::{CORRUPT_MESSAGE, INVALID_CONFIG, NONE, OUT_OF_ORDER_SEQUENCE_NUMBER};
use samsa_tests::group::MemberRef;
use samsa_tests::node::samsa_bin;
use samsa_tests::rdk::assign_consumer_config;
use samsa_tests::txn::{
    read_values, retry_coordinator, transactional_producer_config, Isolation, TxnProducer, VISIBLE,
};
use samsa_tests::wait::try_wait_until;
use samsa_tests::{unique_topic, BatchBuilder, SamsaNode};

const ACKS_ALL: i16 = -1;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

/// The codec bits of a `compression.type` value.
fn codec_id(name: &str) -> u8 {
    match name {
        "uncompressed" | "none" => 0,
        "gzip" => 1,
        "snappy" => 2,
        "lz4" => 3,
        "zstd" => 4,
        other => panic!("no codec {other}"),
    }
}

/// CreateTopics of one single-partition topic with these configs.
fn create_topic_with(
    c: &mut KafkaClient,
    name: &str,
    configs: &[(&str, &str)],
) -> CreatableTopicResult {
    let configs = configs
        .iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k.to_string()))
                .with_value(Some(StrBytes::from_string(v.to_string())))
        })
        .collect();
    let topic = CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(configs);
    let req = CreateTopicsRequest::default()
        .with_topics(vec![topic])
        .with_timeout_ms(30_000);
    let resp = c.call(&req).unwrap();
    resp.topics.into_iter().next().unwrap()
}

/// `(value, config source)` of one config key of a resource (2 topic, 4 broker).
fn describe(c: &mut KafkaClient, resource_type: i8, name: &str, key: &str) -> (String, i8) {
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(Some(vec![StrBytes::from_string(key.to_string())]))]);
    let resp = c.call(&req).unwrap();
    let result = &resp.results[0];
    assert_eq!(result.error_code, NONE, "{result:?}");
    let entry = result
        .configs
        .iter()
        .find(|e| e.name.as_str() == key)
        .unwrap_or_else(|| panic!("{name} has no {key}: {result:?}"));
    (
        entry.value.as_ref().unwrap().as_str().to_string(),
        entry.config_source,
    )
}

/// `(base offset, codec, control)` of every stored batch, from raw Fetches
/// up to the high watermark.
fn stored_batches(c: &mut KafkaClient, topic: &str) -> Vec<(i64, u8, bool)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let p = c.fetch(topic, 0, offset, 0, 1).unwrap();
        assert_eq!(p.error_code, NONE, "fetch {topic} at {offset}");
        let data = p.records.clone().unwrap_or_default();
        let mut rest = &data[..];
        let before = offset;
        for (base, codec) in batch_codecs(&data) {
            let len = i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
            let attributes = rest[layout::ATTRIBUTES + 1];
            let last_delta =
                i32::from_be_bytes(rest[layout::LAST_OFFSET_DELTA..][..4].try_into().unwrap());
            out.push((base, codec, attributes & 0x20 != 0));
            offset = base + i64::from(last_delta) + 1;
            rest = &rest[len + layout::LOG_OVERHEAD..];
        }
        if offset >= p.high_watermark {
            return out;
        }
        assert!(
            offset > before,
            "fetch of {topic} made no progress at {offset}"
        );
    }
}

/// The `compresscodec` of every batch `samsa dump-log` prints for the
/// topic's first segment.
fn dumped_codecs(node: &SamsaNode, topic: &str) -> Vec<String> {
    let segment = node
        .data_dir()
        .join(format!("{topic}-0"))
        .join(format!("{:020}.log", 0));
    let args = vec!["dump-log".to_string(), segment.display().to_string()];
    let (status, text) = run_to_exit(&samsa_bin(), &args, Duration::from_secs(30));
    assert!(status.success(), "dump-log failed: {status}\n{text}");
    text.lines()
        .filter(|l| l.starts_with("baseOffset:"))
        .map(|l| {
            l.split("compresscodec: ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("no codec in {l:?}"))
                .to_string()
        })
        .collect()
}

/// One record as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    timestamp: i64,
}

/// Records with and without keys, values and headers; every value long
/// and repetitive enough that each codec really compresses.
fn sample(tag: &str, count: usize) -> Vec<Rec> {
    let t0 = 1_760_000_000_000;
    (0..count)
        .map(|i| Rec {
            key: (i % 4 != 3).then(|| format!("{tag}-key-{i}").into_bytes()),
            value: (i % 7 != 6).then(|| format!("{tag} value {i};").repeat(20).into_bytes()),
            headers: if i % 3 == 0 {
                Vec::new()
            } else {
                vec![
                    (format!("h-{i}"), Some(format!("{tag}-{i}").into_bytes())),
                    ("null".to_string(), None),
                ]
            },
            timestamp: t0 + (i as i64 * 17) % 40,
        })
        .collect()
}

/// Sends `records` to partition 0 with a librdkafka producer whose
/// `compression.type` is `codec` (batched: linger 50 ms), and waits for
/// every delivery.
fn produce_with(bootstrap: &str, topic: &str, codec: &str, records: &[Rec]) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("compression.type", codec)
        .set("linger.ms", "50")
        .set("acks", "all")
        .set("broker.address.family", "v4")
        .create()
        .unwrap();
    for r in records {
        let mut headers = OwnedHeaders::new();
        for (k, v) in &r.headers {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record = BaseRecord::<[u8], [u8]>::to(topic)
            .partition(0)
            .timestamp(r.timestamp)
            .headers(headers);
        if let Some(k) = &r.key {
            record = record.key(&k[..]);
        }
        if let Some(v) = &r.value {
            record = record.payload(&v[..]);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    assert_eq!(producer.in_flight_count(), 0);
}

/// Reads `count` records of partition 0 from the beginning with a
/// librdkafka consumer.
fn consume(bootstrap: &str, topic: &str, count: usize) -> Vec<Rec> {
    let consumer: BaseConsumer = assign_consumer_config(bootstrap).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let got = try_wait_until(Duration::from_secs(30), || {
        while let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            assert_eq!(m.offset(), out.len() as i64, "offsets in order");
            out.push(Rec {
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers: m
                    .headers()
                    .map(|hs| {
                        hs.iter()
                            .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                            .collect()
                    })
                    .unwrap_or_default(),
                timestamp: m.timestamp().to_millis().unwrap(),
            });
        }
        (out.len() >= count).then_some(())
    });
    assert!(got.is_some(), "read {} of {count} records", out.len());
    out
}

/// A topic with `compression.type=target`; records from a librdkafka
/// producer of each of `producer_codecs` read back unchanged, every stored
/// batch in the topic's codec.
fn topic_stores_its_codec(target: &str, producer_codecs: [&str; 2]) {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let t = unique_topic(&format!("codec-{target}"));
    let created = create_topic_with(&mut c, &t, &[("compression.type", target)]);
    assert_eq!(created.error_code, NONE, "{created:?}");
    assert_eq!(
        describe(&mut c, 2, &t, "compression.type"),
        (target.to_string(), SOURCE_TOPIC)
    );

    let mut sent = Vec::new();
    for codec in producer_codecs {
        let records = sample(codec, 30);
        produce_with(&bootstrap, &t, codec, &records);
        sent.extend(records);
    }
    assert_eq!(consume(&bootstrap, &t, sent.len()), sent);

    let batches = stored_batches(&mut c, &t);
    assert!(batches.len() >= 2, "{batches:?}");
    assert!(
        batches
            .iter()
            .all(|&(_, codec, _)| codec == codec_id(target)),
        "{target}: {batches:?}"
    );
    let want = if target == "uncompressed" {
        "none"
    } else {
        target
    };
    let dumped = dumped_codecs(&node, &t);
    assert_eq!(dumped.len(), batches.len());
    assert!(dumped.iter().all(|c| c == want), "{target}: {dumped:?}");
}

#[test]
fn topic_compression_gzip() {
    topic_stores_its_codec("gzip", ["zstd", "none"]);
}

#[test]
fn topic_compression_snappy() {
    topic_stores_its_codec("snappy", ["gzip", "none"]);
}

#[test]
fn topic_compression_lz4() {
    topic_stores_its_codec("lz4", ["snappy", "none"]);
}

#[test]
fn topic_compression_zstd() {
    topic_stores_its_codec("zstd", ["lz4", "none"]);
}

#[test]
fn topic_compression_uncompressed() {
    topic_stores_its_codec("uncompressed", ["zstd", "snappy"]);
}

/// Produces and asserts error NONE at the given base offset.
fn produce_ok(c: &mut KafkaClient, topic: &str, batch: &Bytes, base: i64, what: &str) {
    let r = c.produce(topic, 0, batch.clone(), ACKS_ALL).unwrap();
    assert_eq!((r.error_code, r.base_offset), (NONE, base), "{what}: {r:?}");
}

#[test]
fn idempotent_retry_of_a_recompressed_batch_writes_nothing() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("codec-dup");
    let created = create_topic_with(&mut c, &t, &[("compression.type", "zstd")]);
    assert_eq!(created.error_code, NONE, "{created:?}");
    let pid = c.init_producer_id().unwrap();
    let (id, epoch) = (pid.producer_id.0, pid.producer_epoch);

    let b0 = BatchBuilder::idempotent(id, epoch, 0)
        .values(["a0", "a1", "a2"])
        .compression(Compression::Lz4)
        .build();
    produce_ok(&mut c, &t, &b0, 0, "first send of b0");
    produce_ok(&mut c, &t, &b0, 0, "retry of b0");
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 3, "the retry was written");

    let b1 = BatchBuilder::idempotent(id, epoch, 3)
        .values(["a3", "a4"])
        .build();
    produce_ok(&mut c, &t, &b1, 3, "b1, uncompressed");
    produce_ok(&mut c, &t, &b0, 0, "late retry of b0");
    produce_ok(&mut c, &t, &b1, 3, "retry of b1");
    let gap = BatchBuilder::idempotent(id, epoch, 9)
        .values(["gap"])
        .compression(Compression::Snappy)
        .build();
    let r = c.produce(&t, 0, gap, ACKS_ALL).unwrap();
    assert_eq!(r.error_code, OUT_OF_ORDER_SEQUENCE_NUMBER, "{r:?}");
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 5);

    let values: Vec<_> = c
        .fetch_all(&t, 0, 0)
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!((r.producer_id, r.producer_epoch), (id, epoch));
            r.offset_value()
        })
        .collect();
    let want: Vec<_> = ["a0", "a1", "a2", "a3", "a4"]
        .iter()
        .enumerate()
        .map(|(i, v)| (i as i64, v.to_string()))
        .collect();
    assert_eq!(values, want);
    assert_eq!(
        stored_batches(&mut c, &t),
        vec![(0, 4, false), (3, 4, false)]
    );
}

#[test]
fn transactions_on_a_recompressing_topic_read_committed_exactly() {
    let node = SamsaNode::start();
    let bootstrap = node.bootstrap();
    let mut c = node.client();
    let t = unique_topic("codec-txn");
    let created = create_topic_with(&mut c, &t, &[("compression.type", "gzip")]);
    assert_eq!(created.error_code, NONE, "{created:?}");

    let mut config = transactional_producer_config(&bootstrap, &unique_topic("codec-txn-id"));
    config.set("compression.type", "lz4");
    let p = TxnProducer::new(&config);
    p.init().unwrap();
    let mut committed = Vec::new();
    for (round, commit) in [(0, true), (1, false), (2, true)] {
        p.begin().unwrap();
        for i in 0..4 {
            let value = format!("txn-{round}-{i}");
            p.send_ok(&t, Some(0), &value);
            if commit {
                committed.push(value);
            }
        }
        if commit {
            p.commit().unwrap();
        } else {
            p.abort().unwrap();
        }
    }
    // Settled: no open transaction left, every marker written.
    let settled = try_wait_until(VISIBLE, || {
        let leo = c.log_end_offset(&t, 0).ok()?;
        (c.last_stable_offset(&t, 0).ok()? == leo).then_some(leo)
    });
    assert!(settled.is_some(), "the LSO never reached the log end");

    let read = c.read_committed(&t, 0).unwrap();
    let values: Vec<String> = read.values().into_iter().map(|(_, v)| v).collect();
    assert_eq!(values, committed);
    assert_eq!(read.aborted.len(), 1, "{:?}", read.aborted);
    assert_eq!(
        read_values(&bootstrap, &t, 1, Isolation::ReadCommitted).unwrap(),
        committed
    );

    let batches = stored_batches(&mut c, &t);
    let markers = batches.iter().filter(|b| b.2).count();
    assert_eq!(markers, 3, "{batches:?}");
    for &(base, codec, control) in &batches {
        let want = if control { 0 } else { 1 };
        assert_eq!(codec, want, "batch at {base}: {batches:?}");
    }
}

#[test]
fn bad_values_and_undecompressable_batches_are_refused() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let bad = create_topic_with(
        &mut c,
        &unique_topic("codec-bad"),
        &[("compression.type", "brotli")],
    );
    assert_eq!(bad.error_code, INVALID_CONFIG, "{bad:?}");
    let message = bad.error_message.unwrap();
    assert!(
        message
            .as_str()
            .contains("uncompressed, zstd, lz4, snappy, gzip, producer"),
        "{message:?}"
    );

    let t = unique_topic("codec-corrupt");
    let created = create_topic_with(&mut c, &t, &[("compression.type", "zstd")]);
    assert_eq!(created.error_code, NONE, "{created:?}");
    // Says lz4 (attribute bits 3), holds plain records, CRC valid.
    let mut batch = BatchBuilder::new().values(["x", "y"]).build().to_vec();
    batch[layout::ATTRIBUTES + 1] |= 3;
    let crc = crc32c::crc32c(&batch[layout::ATTRIBUTES..]);
    batch[layout::CRC..layout::CRC + 4].copy_from_slice(&crc.to_be_bytes());
    let r = c.produce(&t, 0, Bytes::from(batch), ACKS_ALL).unwrap();
    assert_eq!(r.error_code, CORRUPT_MESSAGE, "{r:?}");
    assert_eq!(c.log_end_offset(&t, 0).unwrap(), 0);
    // The partition goes on.
    let good = BatchBuilder::new().values(["z"]).build();
    produce_ok(&mut c, &t, &good, 0, "a good batch after the corrupt one");
}

#[test]
fn the_broker_default_applies_to_topics_without_their_own() {
    let mut node = SamsaNode::start_with(&["log.compression_type=lz4"]);
    let mut c = node.client();
    let broker = node.node_id().to_string();
    assert_eq!(
        describe(&mut c, 4, &broker, "compression.type"),
        ("lz4".to_string(), SOURCE_STATIC_BROKER)
    );
    let t = unique_topic("codec-default");
    c.create_topic(&t, 1).unwrap();
    assert_eq!(
        describe(&mut c, 2, &t, "compression.type"),
        ("lz4".to_string(), SOURCE_STATIC_BROKER)
    );
    let own = unique_topic("codec-own");
    assert_eq!(
        create_topic_with(&mut c, &own, &[("compression.type", "producer")]).error_code,
        NONE
    );
    assert_eq!(
        describe(&mut c, 2, &own, "compression.type"),
        ("producer".to_string(), SOURCE_TOPIC)
    );
    let batch = BatchBuilder::new()
        .values(["d0", "d1"])
        .compression(Compression::Gzip)
        .build();
    produce_ok(&mut c, &t, &batch, 0, "to the default topic");
    produce_ok(&mut c, &own, &batch, 0, "to the producer topic");
    assert_eq!(stored_batches(&mut c, &t), vec![(0, 3, false)]);
    assert_eq!(stored_batches(&mut c, &own), vec![(0, 1, false)]);

    // The coordinators' topics are not compressed by the broker default:
    // committed offsets load back after a restart.
    let group = unique_topic("codec-group");
    let mut coordinator = c.group_coordinator(&group).unwrap();
    let standalone = MemberRef {
        member_id: String::new(),
        generation: -1,
        instance_id: None,
    };
    let (code, ()) = retry_coordinator("OffsetCommit", VISIBLE, || {
        let r = coordinator.offset_commit(&group, &standalone, &t, &[(0, 2)])?;
        Ok((r[0].1, ()))
    })
    .unwrap();
    assert_eq!(code, NONE);
    assert_eq!(
        describe(&mut c, 2, "__consumer_offsets", "compression.type"),
        ("producer".to_string(), SOURCE_TOPIC)
    );
    drop((c, coordinator));
    node.sigterm_and_wait();
    node.restart();
    let mut c = node.client();
    let (code, offset) = retry_coordinator("OffsetFetch", VISIBLE, || {
        let (code, parts) = c.offset_fetch(&group, &t, &[0], false)?;
        Ok((code, parts))
    })
    .unwrap();
    assert_eq!((code, offset), (NONE, vec![(0, 2, NONE)]));
}

#[test]
fn the_default_is_producer_as_in_kafka() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("codec-kafka-default");
    c.create_topic(&t, 1).unwrap();
    assert_eq!(
        describe(&mut c, 2, &t, "compression.type"),
        ("producer".to_string(), SOURCE_DEFAULT)
    );
    let batch = BatchBuilder::new()
        .values(["p0"])
        .compression(Compression::Snappy)
        .build();
    produce_ok(&mut c, &t, &batch, 0, "snappy to a producer topic");
    assert_eq!(stored_batches(&mut c, &t), vec![(0, 2, false)]);

    // librdkafka really sends each codec the tests above produce with
    // (so what they read back was rewritten by the broker).
    let bootstrap = node.bootstrap();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let t = unique_topic(&format!("codec-producer-{codec}"));
        c.create_topic(&t, 1).unwrap();
        let records = sample(codec, 10);
        produce_with(&bootstrap, &t, codec, &records);
        assert_eq!(consume(&bootstrap, &t, records.len()), records);
        let batches = stored_batches(&mut c, &t);
        assert!(
            !batches.is_empty() && batches.iter().all(|b| b.1 == codec_id(codec)),
            "{codec}: {batches:?}"
        );
    }
}

#[test]
fn list_offsets_by_timestamp_finds_records_inside_recompressed_batches() {
    let node = SamsaNode::start();
    let mut c = node.client();
    let t = unique_topic("codec-times");
    let created = create_topic_with(&mut c, &t, &[("compression.type", "zstd")]);
    assert_eq!(created.error_code, NONE, "{created:?}");
    let t0 = 1_760_000_000_000;
    let mut batch = BatchBuilder::new();
    for (i, delta) in [0, 10, 20, 30, 50, 40].into_iter().enumerate() {
        batch = batch.record_at(format!("r{i}"), t0 + delta);
    }
    produce_ok(&mut c, &t, &batch.build(), 0, "six records");
    assert_eq!(stored_batches(&mut c, &t), vec![(0, 4, false)]);
    let at = |c: &mut KafkaClient, ts: i64| {
        let r = c.list_offsets(&t, 0, ts).unwrap();
        assert_eq!(r.error_code, NONE, "{r:?}");
        (r.offset, r.timestamp)
    };
    // As Kafka answers: the record, not the batch.
    assert_eq!(at(&mut c, t0 + 25), (3, t0 + 30));
    assert_eq!(at(&mut c, t0 + 45), (4, t0 + 50));
    // MAX_TIMESTAMP (-3).
    assert_eq!(at(&mut c, -3), (4, t0 + 50));
}
