"""Transactions with Python clients: kafka-python's transactional producer
commits and aborts; read_committed consumers of both confluent-kafka
(librdkafka) and kafka-python (its own fetcher and aborted-transaction
filtering) see exactly the committed records, read_uncommitted ones see
everything in log order.

Sends are synchronous (`.get()`), so the aborted records really are in the
log (an abort drops records still buffered in the client). Visibility after
a commit is awaited with a deadline: the coordinator answers EndTxn before
every marker is written.
"""

import itertools
import os
import time

import kafka.errors
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

_group_ids = itertools.count(os.getpid() * 1000 + 500)
DEADLINE = 30.0


def create_topic(node, name):
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        a.create_topics([NewTopic(name=name, num_partitions=1, replication_factor=1)], timeout_ms=30000)
    finally:
        a.close()


def txn_producer(node, txn_id):
    p = KafkaProducer(
        bootstrap_servers=node.bootstrap,
        transactional_id=txn_id,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        request_timeout_ms=30000,
    )
    p.init_transactions()
    return p


def ck_consumer(node, isolation):
    return Consumer({
        "bootstrap.servers": node.bootstrap,
        "group.id": f"compat-txn-{next(_group_ids)}",
        "broker.address.family": "v4",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 100,
        "isolation.level": isolation,
    })


def ck_read(node, topic, isolation):
    """Values a confluent-kafka reader gets until the partition's end (the
    LSO for read_committed, the high watermark otherwise)."""
    c = ck_consumer(node, isolation)
    try:
        c.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
        out = []
        deadline = time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < deadline, f"{topic} ({isolation}) never reached its end: {out}"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"consumer error: {m.error()}")
            out.append((m.offset(), m.value().decode()))
    finally:
        c.close()


def ck_high(node, topic, isolation):
    """The high watermark as a reader at `isolation` sees it (ListOffsets
    with that isolation level: the LSO for read_committed)."""
    c = ck_consumer(node, isolation)
    try:
        return c.get_watermark_offsets(CkTopicPartition(topic, 0), timeout=30, cached=False)[1]
    finally:
        c.close()


def wait_settled(node, topic):
    """Waits until no transaction is open on the partition; returns its end."""
    deadline = time.monotonic() + DEADLINE
    while True:
        lso, hw = ck_high(node, topic, "read_committed"), ck_high(node, topic, "read_uncommitted")
        if lso == hw:
            return hw
        assert time.monotonic() < deadline, f"LSO {lso} never reached the high watermark {hw}"
        time.sleep(0.1)  # back-off between checks


def kp_read(node, topic, isolation, end):
    """Values kafka-python's consumer gets at `isolation` up to offset `end`
    (its position moves past control records and aborted batches)."""
    c = KafkaConsumer(
        bootstrap_servers=node.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation,
        fetch_max_wait_ms=100,
        request_timeout_ms=30000,
    )
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        out = []
        deadline = time.monotonic() + DEADLINE
        while c.position(tp) < end:
            assert time.monotonic() < deadline, f"kafka-python {isolation} stuck at {c.position(tp)} < {end}: {out}"
            for _, msgs in c.poll(timeout_ms=200).items():
                out.extend((m.offset, m.value.decode()) for m in msgs)
        return out
    finally:
        c.close()


def send_sync(p, topic, values):
    return [p.send(topic, value=v.encode(), partition=0).get(timeout=30).offset for v in values]


def test_kafka_python_transactions_commit_and_abort(samsa, topic_name):
    create_topic(samsa, topic_name)
    p = txn_producer(samsa, f"{topic_name}-txn")
    committed_1 = [f"c-{i}" for i in range(5)]
    aborted = [f"a-{i}" for i in range(3)]
    committed_2 = [f"c-{i}" for i in range(5, 7)]

    p.begin_transaction()
    assert send_sync(p, topic_name, committed_1) == [0, 1, 2, 3, 4]
    p.commit_transaction()

    p.begin_transaction()
    assert send_sync(p, topic_name, aborted) == [6, 7, 8]  # after the COMMIT marker at 5
    p.abort_transaction()

    p.begin_transaction()
    assert send_sync(p, topic_name, committed_2) == [10, 11]  # after the ABORT marker at 9
    p.commit_transaction()
    p.close()

    # 10 records + 3 markers.
    assert wait_settled(samsa, topic_name) == 13
    want_committed = list(zip([0, 1, 2, 3, 4, 10, 11], committed_1 + committed_2))
    want_all = list(zip([0, 1, 2, 3, 4, 6, 7, 8, 10, 11], committed_1 + aborted + committed_2))
    assert ck_read(samsa, topic_name, "read_committed") == want_committed
    assert ck_read(samsa, topic_name, "read_uncommitted") == want_all
    assert kp_read(samsa, topic_name, "read_committed", 13) == want_committed
    assert kp_read(samsa, topic_name, "read_uncommitted", 13) == want_all


def test_open_transaction_is_invisible_until_commit(samsa, topic_name):
    create_topic(samsa, topic_name)
    p = txn_producer(samsa, f"{topic_name}-txn")
    p.begin_transaction()
    assert send_sync(p, topic_name, ["open-0", "open-1"]) == [0, 1]

    # Open: the LSO is the transaction's first offset, readers stop there.
    assert ck_high(samsa, topic_name, "read_uncommitted") == 2
    assert ck_high(samsa, topic_name, "read_committed") == 0
    assert ck_read(samsa, topic_name, "read_committed") == []
    assert ck_read(samsa, topic_name, "read_uncommitted") == [(0, "open-0"), (1, "open-1")]

    p.commit_transaction()
    p.close()
    assert wait_settled(samsa, topic_name) == 3
    assert ck_read(samsa, topic_name, "read_committed") == [(0, "open-0"), (1, "open-1")]
    assert kp_read(samsa, topic_name, "read_committed", 3) == [(0, "open-0"), (1, "open-1")]


def test_fenced_kafka_python_producer_writes_nothing_visible(samsa, topic_name):
    create_topic(samsa, topic_name)
    txn_id = f"{topic_name}-txn"
    p1 = txn_producer(samsa, txn_id)
    p1.begin_transaction()
    assert send_sync(p1, topic_name, ["p1-0"]) == [0]

    p2 = txn_producer(samsa, txn_id)  # fences p1 and aborts its transaction
    # The fenced producer's write is refused with INVALID_PRODUCER_EPOCH
    # (kafka-python's InvalidProducerEpochError), or its commit with
    # PRODUCER_FENCED; any other failure is not fencing.
    with pytest.raises((kafka.errors.InvalidProducerEpochError, kafka.errors.ProducerFencedError)) as fenced:
        p1.send(topic_name, value=b"p1-after-fence", partition=0).get(timeout=30)
        p1.commit_transaction()
    print(f"fenced producer failed as expected: {fenced.value!r}")
    p1.close(timeout=5)

    p2.begin_transaction()
    send_sync(p2, topic_name, ["p2-0"])
    p2.commit_transaction()
    p2.close()
    end = wait_settled(samsa, topic_name)
    assert [v for _, v in ck_read(samsa, topic_name, "read_committed")] == ["p2-0"]
    assert [v for _, v in kp_read(samsa, topic_name, "read_committed", end)] == ["p2-0"]
    assert [v for _, v in ck_read(samsa, topic_name, "read_uncommitted")] == ["p1-0", "p2-0"]
