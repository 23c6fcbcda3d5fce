"""Topic compression.type other than producer, through confluent-kafka and
kafka-python: topics created with the config, described back with their
source, bad values refused, and records produced in another codec read back
unchanged (the broker rewrites them into the topic's codec)."""

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType
from kafka.admin import NewTopic as KpNewTopic
from kafka.errors import InvalidConfigurationError

CODECS = ["uncompressed", "gzip", "snappy", "lz4", "zstd"]


def confluent_admin(node):
    return AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})


def confluent_describe(a, topic):
    res = ConfigResource("topic", topic)
    (f,) = a.describe_configs([res], request_timeout=30).values()
    return f.result(timeout=30)


def records(tag, n):
    return [
        (f"{tag}-key-{i}".encode() if i % 4 != 3 else None,
         (f"{tag} value {i};" * 20).encode(),
         [("h", f"{tag}-{i}".encode())] if i % 3 else [],
         1_760_000_000_000 + i)
        for i in range(n)
    ]


def confluent_read(node, topic, n):
    c = Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": f"{topic}-reader",
        "enable.auto.commit": False,
        "broker.address.family": "v4",
    })
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    deadline = time.monotonic() + 60
    while len(out) < n:
        assert time.monotonic() < deadline, f"read {len(out)} of {n}"
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        out.append((m.key(), m.value(), m.headers() or [], m.timestamp()[1]))
    c.close()
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_creates_describes_and_reads_back(samsa, topic_name, codec):
    a = confluent_admin(samsa)
    fs = a.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1,
                                   config={"compression.type": codec})], operation_timeout=30)
    fs[topic_name].result(timeout=30)
    entry = confluent_describe(a, topic_name)["compression.type"]
    assert entry.value == codec
    assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not entry.is_read_only

    # The producer compresses with another codec than the topic's.
    sent_codec = "lz4" if codec != "lz4" else "zstd"
    p = Producer({"bootstrap.servers": samsa.bootstrap, "compression.type": sent_codec,
                  "linger.ms": 20, "broker.address.family": "v4"})
    sent = records(codec, 25)
    for key, value, headers, ts in sent:
        p.produce(topic_name, value=value, key=key, headers=headers, timestamp=ts, partition=0)
    assert p.flush(30) == 0
    assert confluent_read(samsa, topic_name, len(sent)) == sent


def test_confluent_kafka_invalid_value_and_default(samsa, topic_name):
    a = confluent_admin(samsa)
    fs = a.create_topics([NewTopic(topic_name + "-bad", num_partitions=1, replication_factor=1,
                                   config={"compression.type": "brotli"})], operation_timeout=30)
    with pytest.raises(KafkaException) as err:
        fs[topic_name + "-bad"].result(timeout=30)
    assert err.value.args[0].name() == "INVALID_CONFIG", err.value
    assert "must be one of" in err.value.args[0].str(), err.value

    fs = a.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                         operation_timeout=30)
    fs[topic_name].result(timeout=30)
    entry = confluent_describe(a, topic_name)["compression.type"]
    assert (entry.value, entry.source) == ("producer", ConfigSource.DEFAULT_CONFIG.value)


def kp_admin(node):
    return KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)


def test_kafka_python_creates_describes_and_reads_back(samsa, topic_name):
    # kafka-python decodes gzip without extra packages: the topic stores
    # gzip, the producer sends uncompressed, and the other way round.
    a = kp_admin(samsa)
    for name, topic_codec in [(topic_name + "-gz", "gzip"), (topic_name + "-plain", "uncompressed")]:
        a.create_topics([KpNewTopic(name=name, num_partitions=1, replication_factor=1,
                                    topic_configs={"compression.type": topic_codec})],
                        timeout_ms=30000, raise_errors=True)
        described = a.describe_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, name, configs={"compression.type": None})])
        entry = described["topic"][name]["compression.type"]
        assert (entry["value"], entry["config_source"]) == (topic_codec, "DYNAMIC_TOPIC_CONFIG"), entry

    with pytest.raises(InvalidConfigurationError):
        a.create_topics([KpNewTopic(name=topic_name + "-bad", num_partitions=1, replication_factor=1,
                                    topic_configs={"compression.type": "GZIP"})],
                        timeout_ms=30000, raise_errors=True)
    a.close()

    for name, producer_codec in [(topic_name + "-gz", None), (topic_name + "-plain", "gzip")]:
        p = KafkaProducer(bootstrap_servers=samsa.bootstrap, compression_type=producer_codec,
                          linger_ms=20, request_timeout_ms=30000)
        sent = records(name, 25)
        for key, value, headers, ts in sent:
            p.send(name, value=value, key=key, headers=headers, timestamp_ms=ts, partition=0)
        p.flush(timeout=60)
        p.close()

        c = KafkaConsumer(bootstrap_servers=samsa.bootstrap, group_id=None, enable_auto_commit=False,
                          auto_offset_reset="earliest", fetch_max_wait_ms=100,
                          request_timeout_ms=30000)
        tp = KpTopicPartition(name, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < len(sent):
            assert time.monotonic() < deadline, f"{name}: read {len(got)} of {len(sent)}"
            for msgs in c.poll(timeout_ms=500).values():
                got += [(m.key, m.value, list(m.headers), m.timestamp) for m in msgs]
        c.close()
        assert got == sent, name
