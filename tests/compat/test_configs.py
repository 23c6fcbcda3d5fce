"""Dynamic configuration with real admin clients: confluent-kafka's
incremental_alter_configs and describe_configs, kafka-python's alter_configs
(incremental and the legacy AlterConfigs, which replaces a resource's whole
set), and `samsa config`. Changes take effect without a restart (a lowered
max.message.bytes refuses the next record, a shorter retention.ms deletes
old segments), sources and synonyms are Kafka's, bad values are refused with
Kafka's error codes and change nothing, and the values survive a SIGKILL.
The same across a three-node cluster: tests/it/dynamic_configs.rs.
"""

import subprocess
import time

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource as KpResource
from kafka.admin import ConfigResourceType as KpType

DEADLINE = 60.0


def admin(node):
    return AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})


def create(node, name, config=None):
    a = admin(node)  # kept alive until the future resolves
    futures = a.create_topics([NewTopic(name, num_partitions=1, replication_factor=1, config=config or {})])
    futures[name].result(30)


def incremental(node, restype, name, *entries):
    """incremental_alter_configs of one resource; entries are (key, op, value)."""
    resource = ConfigResource(restype, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, op, v in entries
    ])
    a = admin(node)
    futures = a.incremental_alter_configs([resource], request_timeout=30)
    return futures[resource].result(30)


def describe(node, restype, name):
    resource = ConfigResource(restype, name)
    a = admin(node)
    return a.describe_configs([resource], request_timeout=30)[resource].result(30)


def refusal(node, restype, name, *entries):
    with pytest.raises(KafkaException) as e:
        incremental(node, restype, name, *entries)
    return e.value.args[0]


def produce_one(node, topic, size):
    """Produces one record of `size` bytes; returns the delivery error (None: acknowledged)."""
    p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4",
                  "message.timeout.ms": 20000, "retries": 0})
    errors = []
    p.produce(topic, value=b"x" * size, partition=0, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    return errors[0]


def test_confluent_incremental_alter_and_describe_topic_configs(samsa, topic_name):
    create(samsa, topic_name)
    SET, DELETE, APPEND = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND
    incremental(samsa, ResourceType.TOPIC, topic_name,
                ("retention.ms", SET, "3600000"), ("cleanup.policy", APPEND, "compact"))
    configs = describe(samsa, ResourceType.TOPIC, topic_name)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # APPEND adds to the value in force (delete, the default).
    assert configs["cleanup.policy"].value == "delete,compact", configs["cleanup.policy"]
    assert not configs["retention.ms"].is_read_only

    # DELETE: back to the broker's value, with its source.
    incremental(samsa, ResourceType.TOPIC, topic_name, ("retention.ms", DELETE, None))
    configs = describe(samsa, ResourceType.TOPIC, topic_name)
    assert configs["retention.ms"].value == "604800000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    # Refusals: Kafka's codes, nothing changed.
    err = refusal(samsa, ResourceType.TOPIC, topic_name, ("retention.ms", SET, "soon"))
    assert err.code() == KafkaError.INVALID_CONFIG and "retention.ms" in err.str(), err
    err = refusal(samsa, ResourceType.TOPIC, topic_name, ("no.such.config", SET, "1"))
    assert err.code() == KafkaError.INVALID_CONFIG and "no.such.config" in err.str(), err
    err = refusal(samsa, ResourceType.TOPIC, topic_name, ("retention.ms", APPEND, "1"))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    err = refusal(samsa, ResourceType.TOPIC, topic_name,
                  ("min.compaction.lag.ms", SET, "10"), ("max.compaction.lag.ms", SET, "5"))
    assert err.code() == KafkaError.INVALID_CONFIG, err
    err = refusal(samsa, ResourceType.TOPIC, "no-such-topic", ("retention.ms", SET, "1000"))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, err
    configs = describe(samsa, ResourceType.TOPIC, topic_name)
    assert configs["retention.ms"].value == "604800000"
    assert configs["min.compaction.lag.ms"].value == "0"

    # validate_only checks and changes nothing.
    resource = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=SET)])
    a = admin(samsa)
    a.incremental_alter_configs([resource], validate_only=True)[resource].result(30)
    assert describe(samsa, ResourceType.TOPIC, topic_name)["retention.ms"].value == "604800000"


def test_a_topic_config_change_takes_effect_without_restart(samsa_factory, topic_name):
    node = samsa_factory(["retention_check_interval_ms=200"])
    create(node, topic_name, {"segment.bytes": "1024"})
    assert produce_one(node, topic_name, 4000) is None

    # max.message.bytes lowered: the next record is refused; raised: taken.
    incremental(node, ResourceType.TOPIC, topic_name, ("max.message.bytes", AlterConfigOpType.SET, "2000"))
    err = produce_one(node, topic_name, 4000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    incremental(node, ResourceType.TOPIC, topic_name, ("max.message.bytes", AlterConfigOpType.DELETE, None))
    assert produce_one(node, topic_name, 4000) is None

    # Records an hour old in closed segments: a retention.ms of a minute,
    # set at run time, deletes them (the log start moves past them).
    # Another topic: retention stops at the first recent segment.
    topic_name = f"{topic_name}-retention"
    create(node, topic_name, {"segment.bytes": "1024"})
    p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4", "linger.ms": 0})
    hour_ago = int(time.time() * 1000) - 3_600_000
    for i in range(20):
        p.produce(topic_name, value=b"y" * 600, partition=0, timestamp=hour_ago)
        p.flush(30)
    assert produce_one(node, topic_name, 10) is None  # a recent record in the active segment
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"{topic_name}-w", "broker.address.family": "v4"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=30)
        assert low == 0 and high == 21, (low, high)
        incremental(node, ResourceType.TOPIC, topic_name, ("retention.ms", AlterConfigOpType.SET, "60000"))
        deadline = time.monotonic() + DEADLINE
        while True:
            low, _ = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=30)
            if low >= 19:  # offset 19 shares its segment with the recent record
                break
            assert time.monotonic() < deadline, f"retention never deleted the old segments (log start {low})"
            time.sleep(0.2)  # retention runs on its own interval (200 ms here)
    finally:
        c.close()


def samsa_config(node, *args, ok=True):
    """Runs `samsa config ... -b node`; its output. Neither Python client
    sends the cluster-wide default resource (a broker resource with an
    empty name), which Kafka's own tool does: samsa's does too."""
    from conftest import samsa_bin

    r = subprocess.run([str(samsa_bin()), "config", *args, "-b", node.bootstrap],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode == 0) == ok, (args, r.returncode, r.stdout, r.stderr)
    return r.stdout + r.stderr


def rows_of(table):
    """`samsa config get` output as {name: [value, source, update]}."""
    return {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:] if line.strip()}


def test_broker_dynamic_configs_defaults_and_precedence(samsa, topic_name):
    create(samsa, topic_name)
    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    # The cluster-wide default applies to the broker and to topics without their own.
    samsa_config(samsa, "set", "--broker-defaults", "log.retention.ms=7200000", "message.max.bytes=3000")
    assert rows_of(samsa_config(samsa, "get", "--broker-defaults")) == {
        "log.retention.ms": ["7200000", "DYNAMIC_DEFAULT_BROKER_CONFIG", "dynamic"],
        "message.max.bytes": ["3000", "DYNAMIC_DEFAULT_BROKER_CONFIG", "dynamic"],
    }
    topic = describe(samsa, ResourceType.TOPIC, topic_name)
    assert (topic["retention.ms"].value, topic["retention.ms"].source) == (
        "7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert describe(samsa, ResourceType.BROKER, "1")["message.max.bytes"].source == \
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    err = produce_one(samsa, topic_name, 4000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    # This broker's own value beats the default; synonyms list both.
    incremental(samsa, ResourceType.BROKER, "1", ("log.retention.ms", SET, "3600000"))
    broker = describe(samsa, ResourceType.BROKER, "1")
    retention = broker["log.retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    # confluent-kafka keys synonyms by name (one per name); kafka-python lists them all.
    a = KafkaAdminClient(bootstrap_servers=samsa.bootstrap, request_timeout_ms=30000)
    try:
        listed = a.describe_configs([KpResource(KpType.BROKER, "1")], include_synonyms=True,
                                    config_filter="all")["broker"]["1"]["log.retention.ms"]["synonyms"]
    finally:
        a.close()
    assert listed == [
        {"name": "log.retention.ms", "value": "3600000", "source": "DYNAMIC_BROKER_CONFIG"},
        {"name": "log.retention.ms", "value": "7200000", "source": "DYNAMIC_DEFAULT_BROKER_CONFIG"},
        {"name": "log.retention.hours", "value": "168", "source": "DEFAULT_CONFIG"},
    ], listed
    assert describe(samsa, ResourceType.TOPIC, topic_name)["retention.ms"].value == "3600000"

    # Kafka's refusals for broker resources: INVALID_REQUEST.
    err = refusal(samsa, ResourceType.BROKER, "1", ("log.dirs", SET, "/tmp/elsewhere"))
    assert err.code() == KafkaError.INVALID_REQUEST and "log.dirs" in err.str(), err
    err = refusal(samsa, ResourceType.BROKER, "1", ("log.retention.ms", SET, "later"))
    assert err.code() == KafkaError.INVALID_REQUEST and "log.retention.ms" in err.str(), err
    out = samsa_config(samsa, "set", "--broker-defaults", "log.cleanup.policy=shred", ok=False)
    assert "InvalidRequest" in out and "log.cleanup.policy" in out, out

    # The values survive a SIGKILL.
    samsa.kill()
    samsa.start()
    broker = describe(samsa, ResourceType.BROKER, "1")
    assert broker["log.retention.ms"].value == "3600000"
    assert broker["message.max.bytes"].value == "3000"
    err = produce_one(samsa, topic_name, 4000)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err

    samsa_config(samsa, "delete", "--broker-defaults", "message.max.bytes")
    assert produce_one(samsa, topic_name, 4000) is None
    assert set(rows_of(samsa_config(samsa, "get", "--broker-defaults"))) == {"log.retention.ms"}
    incremental(samsa, ResourceType.BROKER, "1", ("log.retention.ms", DELETE, None))
    assert describe(samsa, ResourceType.BROKER, "1")["log.retention.ms"].value == "7200000"


def test_kafka_python_alter_configs_incremental_and_legacy(samsa, topic_name):
    create(samsa, topic_name, {"segment.ms": "3600000"})
    a = KafkaAdminClient(bootstrap_servers=samsa.bootstrap, request_timeout_ms=30000)
    try:
        # Incremental (the default against a broker that offers it).
        result = a.alter_configs([KpResource(KpType.TOPIC, topic_name, configs={"retention.ms": "120000"})])
        assert result["topic"][topic_name] == "OK", result
        configs = a.describe_configs([KpResource(KpType.TOPIC, topic_name)])["topic"][topic_name]
        assert configs["retention.ms"]["value"] == "120000"
        assert configs["segment.ms"]["value"] == "3600000", "an incremental change leaves other keys"

        # The legacy AlterConfigs: kafka-python re-sends the keys it does
        # not change (it knows the request replaces the whole set).
        result = a.alter_configs([KpResource(KpType.TOPIC, topic_name, configs={"retention.ms": "240000"})],
                                 incremental=False)
        assert result["topic"][topic_name] == "OK", result
        configs = a.describe_configs([KpResource(KpType.TOPIC, topic_name)])["topic"][topic_name]
        assert configs["retention.ms"]["value"] == "240000"
        assert configs["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert configs["segment.ms"]["value"] == "3600000"

        # A bad value: InvalidConfigurationError, nothing changed.
        result = a.alter_configs([KpResource(KpType.TOPIC, topic_name, configs={"retention.ms": "x"})],
                                 incremental=False)
        assert "InvalidConfigurationError" in result["topic"][topic_name], result
        configs = a.describe_configs([KpResource(KpType.TOPIC, topic_name)])["topic"][topic_name]
        assert configs["retention.ms"]["value"] == "240000"
    finally:
        a.close()


def test_legacy_alter_configs_replaces_the_whole_set(samsa, topic_name):
    """confluent-kafka's alter_configs sends AlterConfigs as given: every
    key of the topic it does not name is removed, as in Kafka."""
    create(samsa, topic_name, {"segment.ms": "3600000", "retention.ms": "120000"})
    resource = ConfigResource(ResourceType.TOPIC, topic_name, set_config={"retention.ms": "240000"})
    a = admin(samsa)
    a.alter_configs([resource])[resource].result(30)
    configs = describe(samsa, ResourceType.TOPIC, topic_name)
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
        "240000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (configs["segment.ms"].value, configs["segment.ms"].source) == (
        "604800000", ConfigSource.DEFAULT_CONFIG.value)


def test_samsa_config_cli(samsa, topic_name):
    create(samsa, topic_name)
    samsa_config(samsa, "set", "--topic", topic_name, "retention.ms=90000", "cleanup.policy=compact,delete")
    out = samsa_config(samsa, "get", "--topic", topic_name, "--key", "retention.ms", "--key", "cleanup.policy")
    assert rows_of(out) == {
        "retention.ms": ["90000", "DYNAMIC_TOPIC_CONFIG", "dynamic"],
        "cleanup.policy": ["compact,delete", "DYNAMIC_TOPIC_CONFIG", "dynamic"],
    }, out
    assert describe(samsa, ResourceType.TOPIC, topic_name)["retention.ms"].value == "90000"
    samsa_config(samsa, "delete", "--topic", topic_name, "retention.ms")
    assert describe(samsa, ResourceType.TOPIC, topic_name)["retention.ms"].value == "604800000"
    samsa_config(samsa, "set", "--broker-defaults", "log.segment.bytes=50000000")
    samsa_config(samsa, "set", "--broker", "1", "log.cleaner.backoff.ms=2000")
    rows = rows_of(samsa_config(samsa, "get", "--broker", "1", "--key", "log.segment.bytes",
                                "--key", "log.cleaner.backoff.ms"))
    assert rows == {
        "log.segment.bytes": ["50000000", "DYNAMIC_DEFAULT_BROKER_CONFIG", "dynamic"],
        "log.cleaner.backoff.ms": ["2000", "DYNAMIC_BROKER_CONFIG", "dynamic"],
    }, rows
    out = samsa_config(samsa, "set", "--topic", topic_name, "retention.ms=never", ok=False)
    assert "InvalidConfig" in out and "retention.ms" in out, out
    out = samsa_config(samsa, "set", "--broker", "1", "num.partitions=4", ok=False)
    assert "InvalidRequest" in out and "num.partitions" in out, out
    samsa_config(samsa, "set", "--topic", topic_name, "retention.ms=1000", "--validate-only")
    assert describe(samsa, ResourceType.TOPIC, topic_name)["retention.ms"].value == "604800000"
