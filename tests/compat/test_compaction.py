"""Compacted topics with real clients: confluent-kafka (librdkafka) and
kafka-python create `cleanup.policy=compact` topics, produce keyed records
(idempotent and transactional), and read them back after the broker's log
cleaner ran: the latest value of every key at its original offset, nothing
superseded in the cleaned part, tombstones gone after delete.retention.ms,
aborted records never visible to read_committed, the same after a SIGKILL.

The cleaner runs on its own schedule, so each check waits, with a
deadline, for the state it expects to become visible (re-reading the
topic from the start).
"""

import itertools
import os
import time

import kafka.errors
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic as CkNewTopic
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

_group_ids = itertools.count(os.getpid() * 1000 + 700)
DEADLINE = 60.0
# The cleaner looks for dirty logs every 100 ms instead of 15 s.
SETTINGS = ["log_cleaner_backoff_ms=100"]
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "4096",
    "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "1000",
}


def create_compacted(node, name):
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})
    futures = admin.create_topics([CkNewTopic(name, num_partitions=1, replication_factor=1, config=COMPACTED)])
    futures[name].result(30)


def read_all(node, topic, isolation="read_uncommitted"):
    """Every (offset, key, value) a reader at `isolation` gets up to the partition's end."""
    c = Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": f"compat-compaction-{next(_group_ids)}",
        "broker.address.family": "v4",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "isolation.level": isolation,
    })
    try:
        c.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
        rows = []
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, f"{topic} never reached its end"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return rows
                raise AssertionError(f"consumer error: {m.error()}")
            value = None if m.value() is None else m.value().decode()
            rows.append((m.offset(), m.key().decode(), value))
    finally:
        c.close()


def latest_per_key(rows):
    return {key: (offset, value) for offset, key, value in rows}


def wait_for(node, topic, done, what, isolation="read_uncommitted"):
    """Re-reads the topic until `done(rows)` holds; returns those rows."""
    deadline = time.monotonic() + DEADLINE
    while True:
        rows = read_all(node, topic, isolation)
        if done(rows):
            return rows
        assert time.monotonic() < deadline, f"{what}: never happened; last read {len(rows)} rows"
        time.sleep(0.2)  # back-off between reads: the cleaner runs on its own schedule


def produce_keyed(p, topic, records):
    """Produces (key, value) pairs; returns {offset: (key, value)} from the delivery reports."""
    acked = {}
    errors = []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            value = None if msg.value() is None else msg.value().decode()
            acked[msg.offset()] = (msg.key().decode(), value)

    for key, value in records:
        p.produce(topic, key=key, value=value, partition=0, on_delivery=report)
        p.poll(0)
    assert p.flush(30) == 0
    assert not errors, errors
    return acked


def test_latest_value_per_key_survives_compaction_tombstones_go_and_a_restart(samsa_factory, topic_name):
    node = samsa_factory(SETTINGS)
    create_compacted(node, topic_name)
    p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4",
                  "enable.idempotence": True, "linger.ms": 5,
                  # Small batches: a segment rolls (and can be cleaned) only between batches.
                  "batch.num.messages": 10})
    acked = produce_keyed(p, topic_name, [(f"k{i % 20}", f"v{i}") for i in range(2000)])
    expected = latest_per_key([(o, k, v) for o, (k, v) in sorted(acked.items())])

    def compacted(rows):
        return len(rows) < 600 and latest_per_key(rows) == expected

    rows = wait_for(node, topic_name, compacted, "compaction")
    assert all(acked[o] == (k, v) for o, k, v in rows), "every row read was produced at that offset"

    # A keyless record is refused with INVALID_RECORD, and nothing else breaks.
    failures = []
    p.produce(topic_name, value=b"no key", partition=0, on_delivery=lambda err, msg: failures.append(err))
    p.flush(30)
    assert failures and failures[0] is not None and failures[0].code() == KafkaError.INVALID_RECORD, failures

    # A tombstone for k0 stays a while, then k0 is gone altogether; the
    # filler after it rolls the tombstone out of the active segment.
    acked.update(produce_keyed(p, topic_name, [("k0", None)] + [(f"k{1 + i % 19}", f"w{i}") for i in range(400)]))
    rows = wait_for(node, topic_name, lambda rows: all(k != "k0" for _, k, _ in rows), "tombstone removal")
    expected = latest_per_key([(o, k, v) for o, (k, v) in sorted(acked.items()) if k != "k0"])
    assert latest_per_key(rows) == expected

    # SIGKILL and restart: the cleaned log reads back the same.
    node.kill()
    node.start()
    assert read_all(node, topic_name) == rows


def test_read_committed_sees_the_same_latest_values_after_compaction(samsa_factory, topic_name):
    node = samsa_factory(SETTINGS)
    create_compacted(node, topic_name)
    p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4",
                  "transactional.id": f"{topic_name}-txn", "linger.ms": 5})
    p.init_transactions(30)
    committed = {}
    for round_ in range(60):
        p.begin_transaction()
        aborting = round_ % 3 == 2
        records = [(f"k{j}", f"{'a' if aborting else 'c'}{round_}-{j}") for j in range(10)]
        if aborting:
            records.append(("ghost", f"aborted-{round_}"))
        for key, value in records:
            p.produce(topic_name, key=key, value=value, partition=0)
        if aborting:
            p.flush(30)  # the aborted records really reach the log
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            committed.update(dict(records))
    produced = 60 * 10 + 20

    def compacted(rows):
        return len(rows) < produced // 2 and {k: v for _, k, v in rows} == committed

    rows = wait_for(node, topic_name, compacted, "compaction under read_committed", "read_committed")
    assert all(not v.startswith("a") for _, _, v in rows), "no aborted value is ever read"
    assert all(k != "ghost" for _, k, _ in rows)
    # The uncommitted view lost aborted records too, not only superseded
    # ones: of the 20 aborted "ghost" records, only those still in the
    # active segment remain.
    after = read_all(node, topic_name, "read_uncommitted")
    assert sum(1 for _, k, _ in after if k == "ghost") < 20


def test_kafka_python_creates_describes_and_writes_a_compacted_topic(samsa, topic_name):
    admin = KafkaAdminClient(bootstrap_servers=samsa.bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(name=topic_name, num_partitions=1, replication_factor=1,
                                      topic_configs={"cleanup.policy": "compact,delete",
                                                     "min.compaction.lag.ms": "1000"})], timeout_ms=30000)
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic_name)],
                                           config_filter="all")
        entries = described["topic"][topic_name]
        assert entries["cleanup.policy"]["value"] == "compact,delete", entries["cleanup.policy"]
        assert entries["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert entries["min.compaction.lag.ms"]["value"] == "1000"
        assert entries["delete.retention.ms"]["value"] == "86400000"
        assert entries["delete.retention.ms"]["config_source"] == "DEFAULT_CONFIG"
        with pytest.raises(kafka.errors.InvalidConfigurationError):
            admin.create_topics([NewTopic(name=f"{topic_name}-bad", num_partitions=1, replication_factor=1,
                                          topic_configs={"cleanup.policy": "compacted"})], timeout_ms=30000)
        with pytest.raises(kafka.errors.InvalidConfigurationError):
            admin.create_topics([NewTopic(name=f"{topic_name}-lag", num_partitions=1, replication_factor=1,
                                          topic_configs={"min.compaction.lag.ms": "10",
                                                         "max.compaction.lag.ms": "5"})], timeout_ms=30000)
    finally:
        admin.close()
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, acks="all", request_timeout_ms=30000, retries=0)
    try:
        assert p.send(topic_name, key=b"k", value=b"v", partition=0).get(timeout=30).offset == 0
        with pytest.raises(kafka.errors.InvalidRecordError):
            p.send(topic_name, value=b"no key", partition=0).get(timeout=30)
    finally:
        p.close()


def count_records(node, topic, partition=0):
    """How many records a read_uncommitted reader gets from `topic`'s partition (keys not decoded)."""
    c = Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": f"compat-compaction-{next(_group_ids)}",
        "broker.address.family": "v4",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
    })
    try:
        c.assign([CkTopicPartition(topic, partition, OFFSET_BEGINNING)])
        count = 0
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, f"{topic} never reached its end"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return count
                raise AssertionError(f"consumer error: {m.error()}")
            count += 1
    finally:
        c.close()


def wait_until_fewer(node, topic, limit, what):
    deadline = time.monotonic() + DEADLINE
    while True:
        n = count_records(node, topic)
        if n < limit:
            return n
        assert time.monotonic() < deadline, f"{what}: {topic} still holds {n} records"
        time.sleep(0.2)  # back-off between reads: the cleaner runs on its own schedule


def describe_txn(node, txn_id):
    import subprocess

    out = subprocess.run([str(node.bin), "txn", "describe", "-b", node.bootstrap, "--transactional-id", txn_id],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    header, row = (line.split() for line in out.stdout.strip().splitlines())
    fields = dict(zip(header, row))
    fields.pop("TransactionDurationMs")  # grows with the clock
    return fields


def test_coordinator_state_topics_are_compacted_and_reload_after_a_sigkill(samsa_factory, topic_name):
    node = samsa_factory(SETTINGS + [
        "offsets_topic_num_partitions=1", "transaction_state_log_num_partitions=1",
        "offsets_topic_segment_bytes=4096", "transaction_state_log_segment_bytes=4096",
        "group_initial_rebalance_delay_ms=0",
    ])
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})
    admin.create_topics([CkNewTopic(topic_name, num_partitions=1, replication_factor=1)])[topic_name].result(30)

    # 1,000 offset commits of one group, 150 transactions of one id.
    group = f"{topic_name}-group"
    c = Consumer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4", "group.id": group,
                  "enable.auto.commit": False})
    for offset in range(1, 1001):
        c.commit(offsets=[CkTopicPartition(topic_name, 0, offset)], asynchronous=False)
    c.close()
    txn_id = f"{topic_name}-txn"
    p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4", "transactional.id": txn_id})
    p.init_transactions(30)
    for i in range(150):
        p.begin_transaction()
        p.produce(topic_name, key=b"k", value=f"t{i}".encode(), partition=0)
        p.commit_transaction(30)

    # The cleaner brings both state topics down to about a record per key
    # (plus what the active segment still holds).
    wait_until_fewer(node, "__consumer_offsets", 200, "offsets compaction")
    wait_until_fewer(node, "__transaction_state", 200, "transaction state compaction")
    txn_before = describe_txn(node, txn_id)

    # SIGKILL, restart: both coordinators load the compacted logs.
    node.kill()
    node.start()
    c = Consumer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4", "group.id": group,
                  "enable.auto.commit": False})
    try:
        [committed] = c.committed([CkTopicPartition(topic_name, 0)], timeout=30)
        assert committed.offset == 1000, committed
    finally:
        c.close()
    assert describe_txn(node, txn_id) == txn_before
    # The id's epoch survived: a new instance fences the old one.
    fresh = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4", "transactional.id": txn_id})
    fresh.init_transactions(30)
    fresh.begin_transaction()
    fresh.produce(topic_name, key=b"k", value=b"after", partition=0)
    fresh.commit_transaction(30)
    with pytest.raises(KafkaException):
        p.begin_transaction()
        p.produce(topic_name, key=b"k", value=b"fenced", partition=0)
        p.commit_transaction(30)
    values = [v for _, _, v in read_all(node, topic_name, "read_committed")]
    assert values == [f"t{i}" for i in range(150)] + ["after"]


def test_sigkill_at_random_points_of_cleaning_loses_nothing(samsa_factory, topic_name):
    """The cleaner is throttled so a pass takes seconds; each round writes
    new values, waits until a pass is writing (its `cleaning/` directory
    exists), SIGKILLs the broker at a random point after that, and checks
    the restarted log: the latest value of every key at its offset, every
    row one that was produced there, no half-swapped files."""
    import random

    seed = int(os.environ.get("SAMSA_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    node = samsa_factory(SETTINGS + ["log_cleaner_io_max_bytes_per_second=150000"])
    create_compacted(node, topic_name)
    partition_dir = node.data_dir / f"{topic_name}-0"
    acked = {}
    kills_mid_pass = 0
    for round_ in range(4):
        p = Producer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4",
                      "enable.idempotence": True, "linger.ms": 5, "batch.num.messages": 10})
        acked.update(produce_keyed(p, topic_name, [(f"k{i % 100}", f"r{round_}-{i}-" + "x" * 80) for i in range(1500)]))
        del p
        deadline = time.monotonic() + DEADLINE
        while not (partition_dir / "cleaning").exists():
            assert time.monotonic() < deadline, f"seed {seed}: no cleaning pass started in round {round_}"
            time.sleep(0.01)  # polls the directory for the pass to begin
        time.sleep(rng.uniform(0, 1.0))  # the random point of the pass to kill at
        kills_mid_pass += (partition_dir / "cleaning").exists()
        node.kill()
        node.start()
        assert not (partition_dir / "cleaning").exists(), f"seed {seed}: an unfinished pass survived the restart"
        assert not list(partition_dir.glob("*.swap")), f"seed {seed}: a swap was left unfinished"
        rows = read_all(node, topic_name)
        expected = latest_per_key([(o, k, v) for o, (k, v) in sorted(acked.items())])
        assert latest_per_key(rows) == expected, f"seed {seed}, round {round_}"
        assert all(acked[o] == (k, v) for o, k, v in rows), f"seed {seed}, round {round_}: a row not produced there"
    print(f"seed {seed}: {kills_mid_pass} of 4 SIGKILLs inside a pass")
    assert kills_mid_pass > 0, f"seed {seed}: no SIGKILL landed inside a pass"
    # Left alone, the cleaner finishes: one row per key plus the active segment.
    wait_for(node, topic_name, lambda rows: len(rows) < 300 and latest_per_key(rows) == expected,
             f"seed {seed}: final compaction")
