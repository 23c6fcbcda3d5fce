"""Consumer groups with Python clients: confluent-kafka (librdkafka) and
kafka-python (its own group client) subscribe() consumers split a topic's
partitions between two members, commit, and a new member of the group
resumes from the committed offsets; kafka-python's transactional
consume-transform-produce commits the input offsets with
send_offsets_to_transaction, and an aborted round leaves them where they
were.

Records are produced only once both members hold their partition, so what
each member reads shows which partitions it was given. Every wait polls a
condition with a deadline.
"""

import itertools
import os
import threading
import time

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata

from test_transactions import ck_read, kp_read, send_sync, txn_producer, wait_settled

DEADLINE = 60.0
# Kafka's smallest session timeout: a member that leaves without saying so
# is out of the group within six seconds.
SESSION_MS = 6000
_groups = itertools.count(os.getpid() * 1000 + 700)


def new_group(prefix):
    return f"{prefix}-{next(_groups)}"


def create_topic(node, name, partitions):
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        a.create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)],
                        timeout_ms=30000)
    finally:
        a.close()


def produce(node, topic, partitions, prefix, n):
    """n plain records per partition, values `{prefix}-p{partition}-{i}`."""
    p = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", linger_ms=5)
    try:
        for part in range(partitions):
            for i in range(n):
                p.send(topic, value=f"{prefix}-p{part}-{i}".encode(), partition=part).get(timeout=30)
    finally:
        p.close()


def wait_for(what, cond, step):
    """Calls `step()` then `cond()` until cond is true or the deadline passes."""
    deadline = time.monotonic() + DEADLINE
    while True:
        step()
        if cond():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


# --------------------------------------------------------------- confluent-kafka


def ck_member(node, group):
    return Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": group,
        "broker.address.family": "v4",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 500,
        "fetch.wait.max.ms": 100,
    })


def ck_poll(c, into):
    m = c.poll(0.1)
    if m is None:
        return
    if m.error():
        # End of a partition, or a dropped connection librdkafka re-opens
        # (reported as an error also against Kafka): not about the data.
        if m.error().code() in (KafkaError._PARTITION_EOF, KafkaError._TRANSPORT,
                                KafkaError._ALL_BROKERS_DOWN):
            return
        raise AssertionError(f"consumer error: {m.error()}")
    into.append((m.partition(), m.offset(), m.value().decode()))


def test_confluent_kafka_group_splits_partitions_commits_and_resumes(samsa, topic_name):
    create_topic(samsa, topic_name, 2)
    group = new_group("compat-ck-group")
    members = [ck_member(samsa, group), ck_member(samsa, group)]
    read = [[], []]
    for c in members:
        c.subscribe([topic_name])

    def assignments():
        return [sorted(tp.partition for tp in c.assignment()) for c in members]

    def step():
        for c, into in zip(members, read):
            ck_poll(c, into)

    wait_for("two members holding one partition each",
             lambda: sorted(assignments()) == [[0], [1]], step)
    owned = [a[0] for a in assignments()]
    produce(samsa, topic_name, 2, "first", 10)
    wait_for("each member reading its partition's 10 records",
             lambda: all(len(r) >= 10 for r in read), step)
    for c, into, part in zip(members, read, owned):
        assert [(p, o) for p, o, _ in into] == [(part, o) for o in range(10)], into
        c.commit(asynchronous=False)
        committed = c.committed([CkTopicPartition(topic_name, part)], timeout=30)
        assert [tp.offset for tp in committed] == [10]
    for c in members:
        c.close()

    produce(samsa, topic_name, 2, "second", 5)
    resumed = ck_member(samsa, group)
    resumed.subscribe([topic_name])
    got = []
    try:
        wait_for("the new member reading the 10 records after the committed offsets",
                 lambda: len(got) >= 10, lambda: ck_poll(resumed, got))
        assert sorted(got) == sorted((p, 10 + i, f"second-p{p}-{i}") for p in range(2) for i in range(5))
    finally:
        resumed.close()


# ------------------------------------------------------------------ kafka-python


def kp_member(node, group, **extra):
    return KafkaConsumer(
        bootstrap_servers=node.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=500,
        fetch_max_wait_ms=100,
        request_timeout_ms=30000,
        **extra,
    )


class KpPoller:
    """Polls a kafka-python consumer on its own thread (a member blocked in
    a rebalance must not keep the other member from rejoining); keeps what
    it read and its assignment."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.read = []
        self.assigned = []
        self.error = None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while not self.stop.is_set():
                batch = self.consumer.poll(timeout_ms=100)
                with self.lock:
                    self.assigned = sorted(tp.partition for tp in self.consumer.assignment())
                    for msgs in batch.values():
                        self.read.extend((m.partition, m.offset, m.value.decode()) for m in msgs)
        except Exception as e:  # surfaced by the test's assertions
            self.error = e

    def snapshot(self):
        assert self.error is None, f"consumer thread failed: {self.error!r}"
        with self.lock:
            return list(self.assigned), list(self.read)

    def halt(self):
        self.stop.set()
        self.thread.join(timeout=30)


def test_kafka_python_group_splits_partitions_commits_and_resumes(samsa, topic_name):
    create_topic(samsa, topic_name, 2)
    group = new_group("compat-kp-group")
    pollers = []
    for _ in range(2):
        c = kp_member(samsa, group)
        c.subscribe([topic_name])
        pollers.append(KpPoller(c))
    try:
        wait_for("two members holding one partition each",
                 lambda: sorted(p.snapshot()[0] for p in pollers) == [[0], [1]], lambda: time.sleep(0.05))
        produce(samsa, topic_name, 2, "first", 10)
        wait_for("each member reading its partition's 10 records",
                 lambda: all(len(p.snapshot()[1]) >= 10 for p in pollers), lambda: time.sleep(0.05))
        for p in pollers:
            p.halt()
        for p in pollers:
            (part,), read = p.snapshot()
            assert [(q, o) for q, o, _ in read] == [(part, o) for o in range(10)], read
            p.consumer.commit()
            assert p.consumer.committed(TopicPartition(topic_name, part)) == 10
    finally:
        for p in pollers:
            p.halt()
            p.consumer.close()

    produce(samsa, topic_name, 2, "second", 5)
    resumed = kp_member(samsa, group)
    resumed.subscribe([topic_name])
    got = []
    try:
        def step():
            for msgs in resumed.poll(timeout_ms=100).values():
                got.extend((m.partition, m.offset, m.value.decode()) for m in msgs)
        wait_for("the new member reading the 10 records after the committed offsets",
                 lambda: len(got) >= 10, step)
        assert sorted(got) == sorted((p, 10 + i, f"second-p{p}-{i}") for p in range(2) for i in range(5))
    finally:
        resumed.close()


def test_kafka_python_consume_transform_produce_with_offsets_in_the_transaction(samsa, topic_name):
    src, dst = f"{topic_name}-in", f"{topic_name}-out"
    create_topic(samsa, src, 1)
    create_topic(samsa, dst, 1)
    produce(samsa, src, 1, "in", 10)
    group = new_group("compat-kp-eos")
    tp = TopicPartition(src, 0)

    def one_round(txn_id, n, commit):
        """Consumes n records through the group, writes them transformed and
        sends the offsets in one transaction; commits or aborts."""
        consumer = kp_member(samsa, group, isolation_level="read_committed")
        consumer.subscribe([src])
        producer = txn_producer(samsa, txn_id)
        try:
            records = []

            def step():
                for msgs in consumer.poll(timeout_ms=100, max_records=n - len(records)).values():
                    records.extend(msgs)
            wait_for(f"{n} input records", lambda: len(records) >= n, step)
            producer.begin_transaction()
            send_sync(producer, dst, [f"{r.value.decode()} processed" for r in records])
            producer.send_offsets_to_transaction(
                {tp: OffsetAndMetadata(records[-1].offset + 1, "", -1)}, consumer.group_metadata())
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
            return [r.value.decode() for r in records]
        finally:
            producer.close()
            consumer.close()

    first = one_round(f"{topic_name}-txn", 10, commit=True)
    assert first == [f"in-p0-{i}" for i in range(10)]
    end = wait_settled(samsa, dst)
    assert end == 11, "10 records + COMMIT"
    want = [f"in-p0-{i} processed" for i in range(10)]
    assert [v for _, v in ck_read(samsa, dst, "read_committed")] == want
    assert [v for _, v in kp_read(samsa, dst, "read_committed", end)] == want
    check = kp_member(samsa, group)
    try:
        assert check.committed(tp) == 10
    finally:
        check.close()

    # An aborted round: its outputs are invisible and its offsets discarded.
    produce(samsa, src, 1, "more", 5)
    assert one_round(f"{topic_name}-txn", 5, commit=False) == [f"more-p0-{i}" for i in range(5)]
    end = wait_settled(samsa, dst)
    assert end == 17, "+ 5 records + ABORT"
    assert [v for _, v in ck_read(samsa, dst, "read_committed")] == want
    assert len(ck_read(samsa, dst, "read_uncommitted")) == 15
    check = kp_member(samsa, group)
    try:
        assert check.committed(tp) == 10, "the aborted round's offsets were discarded"
    finally:
        check.close()

    # The retry reads the same 5 again and commits them.
    assert one_round(f"{topic_name}-txn", 5, commit=True) == [f"more-p0-{i}" for i in range(5)]
    end = wait_settled(samsa, dst)
    want += [f"more-p0-{i} processed" for i in range(5)]
    assert [v for _, v in ck_read(samsa, dst, "read_committed")] == want
    assert [v for _, v in kp_read(samsa, dst, "read_committed", end)] == want
