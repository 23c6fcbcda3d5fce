"""confluent-kafka (librdkafka underneath) against samsa: admin, idempotent
produce, assign()-based consume, offsets, metadata. No consumer groups."""

import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

import itertools
import os

from eos import Checker

_group_ids = itertools.count(os.getpid() * 1000)

PARTITIONS = 3
N = 3000


def admin(node):
    return AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})


def create_topic(node, name, partitions=PARTITIONS):
    a = admin(node)  # keep the handle alive until the future resolves
    fs = a.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                         operation_timeout=30, request_timeout=30)
    fs[name].result(timeout=60)


def consumer(node):
    # assign() only, nothing committed; confluent-kafka insists on a group.id
    # anyway, so use a unique one that never joins.
    return Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": f"compat-assign-{next(_group_ids)}",
        "broker.address.family": "v4",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
    })


def read_all(node, topic, partitions, checker, timeout=120):
    c = consumer(node)
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    pos = {p: 0 for p in range(partitions)}
    deadline = time.monotonic() + timeout
    n = 0
    while any(pos[p] < ends[p] for p in pos):
        assert time.monotonic() < deadline, f"consume timed out: positions {pos}, ends {ends}"
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        checker.read(m.partition(), m.offset(), m.value())
        pos[m.partition()] = max(pos[m.partition()], m.offset() + 1)
        n += 1
    c.close()
    return ends, n


def test_admin_create_topic_and_metadata(samsa, topic_name):
    create_topic(samsa, topic_name)
    a = admin(samsa)
    md = a.list_topics(timeout=30)
    assert topic_name in md.topics, sorted(md.topics)
    t = md.topics[topic_name]
    assert t.error is None, t.error
    assert sorted(t.partitions) == list(range(PARTITIONS))
    for p in t.partitions.values():
        assert p.leader == 1
        assert list(p.replicas) == [1]
        assert list(p.isrs) == [1]
    assert list(md.brokers) == [1]
    b = md.brokers[1]
    assert (b.host, b.port) == ("127.0.0.1", samsa.port)
    assert md.controller_id == 1
    # Creating it again fails with TOPIC_ALREADY_EXISTS.
    fs = a.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)])
    try:
        fs[topic_name].result(timeout=30)
        raise AssertionError("second create succeeded")
    except Exception as e:  # KafkaException wrapping KafkaError
        err = e.args[0]
        assert err.code() == KafkaError.TOPIC_ALREADY_EXISTS, err


def test_idempotent_produce_and_assign_consume_exactly_once(samsa, topic_name):
    create_topic(samsa, topic_name)
    checker = Checker()
    errors = []

    def on_delivery(err, msg):
        if err is not None:
            checker.fail(msg.value(), err)
        else:
            checker.ack(msg.value(), msg.partition(), msg.offset())

    p = Producer({
        "bootstrap.servers": samsa.bootstrap,
        "broker.address.family": "v4",
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "error_cb": lambda e: errors.append(e),
    })
    for i in range(N):
        v = f"ck-{i:06}".encode()
        checker.send(v)
        p.produce(topic_name, value=v, key=str(i % 17).encode(), on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(60) == 0, "messages left in the producer queue"
    assert not checker.failed, list(checker.failed.items())[:5]
    assert len(checker.acks) == N
    assert not [e for e in errors if e.fatal()], errors

    ends, n = read_all(samsa, topic_name, PARTITIONS, checker)
    assert sum(ends.values()) == N, ends
    checker.assert_ok()
    # Same key, same partition.
    by_key = {}
    for v, (part, _) in checker.acks.items():
        by_key.setdefault(int(v[3:]) % 17, set()).add(part)
    assert all(len(parts) == 1 for parts in by_key.values()), by_key


def test_list_offsets_watermarks_and_times(samsa, topic_name):
    create_topic(samsa, topic_name, partitions=1)
    base = int(time.time() * 1000) - 3_600_000
    p = Producer({"bootstrap.servers": samsa.bootstrap, "broker.address.family": "v4",
                  "enable.idempotence": True, "acks": "all"})
    for i in range(10):
        p.produce(topic_name, partition=0, value=f"t{i}".encode(), timestamp=base + 100 * i)
    assert p.flush(30) == 0

    c = consumer(samsa)
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=30) == (0, 10)
    found = c.offsets_for_times([TopicPartition(topic_name, 0, base + 450)], timeout=30)
    assert found[0].error is None
    assert found[0].offset == 5
    found = c.offsets_for_times([TopicPartition(topic_name, 0, base)], timeout=30)
    assert found[0].offset == 0
    found = c.offsets_for_times([TopicPartition(topic_name, 0, base + 100_000)], timeout=30)
    assert found[0].offset == -1  # OFFSET_END: no such record
    # Consuming from a timestamp-derived offset yields that record.
    c.assign([TopicPartition(topic_name, 0, 5)])
    m = None
    deadline = time.monotonic() + 30
    while m is None and time.monotonic() < deadline:
        m = c.poll(0.5)
    assert m is not None and m.error() is None
    assert (m.offset(), m.value(), m.timestamp()[1]) == (5, b"t5", base + 500)
    c.close()


def test_describe_configs_broker_resource(samsa_factory):
    """AdminClient.describe_configs on the broker resource, as librdkafka
    reads it: Kafka's keys with their sources (STATIC_BROKER_CONFIG for what
    samsa was started with, DEFAULT_CONFIG otherwise), read-only unless
    Kafka can change the key at run time, and the synonyms librdkafka always
    asks for."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    node = samsa_factory(["log.retention_ms=3600000"])
    a = admin(node)
    resource = ConfigResource(ResourceType.BROKER, "1")
    fs = a.describe_configs([resource], request_timeout=30)
    configs = fs[resource].result(timeout=60)
    for name in ("log.retention.ms", "log.segment.bytes", "message.max.bytes", "log.cleanup.policy"):
        assert not configs[name].is_read_only, name
    for name in ("log.dirs", "num.partitions", "node.id", "log.retention.hours"):
        assert configs[name].is_read_only, name
    for name, entry in configs.items():
        assert not entry.is_sensitive, name
        assert entry.source in (ConfigSource.STATIC_BROKER_CONFIG.value,
                                ConfigSource.DEFAULT_CONFIG.value), (name, entry.source)
    adv = configs["advertised.listeners"]
    assert adv.value == f"PLAINTEXT://{node.bootstrap}", adv
    assert adv.source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert not adv.is_default
    partitions = configs["offsets.topic.num.partitions"]
    assert partitions.value == "50" and partitions.is_default, partitions
    assert partitions.source == ConfigSource.DEFAULT_CONFIG.value
    retention = configs["log.retention.ms"]
    assert retention.value == "3600000"
    assert retention.source == ConfigSource.STATIC_BROKER_CONFIG.value
    synonyms = [(s.name, s.value, s.source) for s in retention.synonyms.values()]
    assert synonyms == [
        ("log.retention.ms", "3600000", ConfigSource.STATIC_BROKER_CONFIG.value),
        ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG.value),
    ], synonyms
    assert configs["log.retention.hours"].value == "168"
    assert configs["log.dirs"].value == str(node.data_dir)
    assert configs["node.id"].value == "1" and configs["broker.id"].value == "1"
