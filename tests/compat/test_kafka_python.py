"""kafka-python (pure Python) against samsa: admin, idempotent produce,
assign()-based consume, offsets, metadata, the broker version it infers,
broker configs, fetch sessions. No consumer groups."""

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from eos import Checker

PARTITIONS = 3
N = 2000


def admin(node):
    return KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)


def create_topic(node, name, partitions=PARTITIONS):
    a = admin(node)
    try:
        a.create_topics([NewTopic(name=name, num_partitions=partitions, replication_factor=1)],
                        timeout_ms=30000)
    finally:
        a.close()


def consumer(node):
    return KafkaConsumer(
        bootstrap_servers=node.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        request_timeout_ms=30000,
    )


def test_admin_create_topic_and_metadata(samsa, topic_name):
    create_topic(samsa, topic_name)
    c = consumer(samsa)
    assert topic_name in c.topics()
    assert c.partitions_for_topic(topic_name) == set(range(PARTITIONS))
    c.close()

    a = admin(samsa)
    desc = a.describe_topics([topic_name])
    assert len(desc) == 1 and desc[0]["error_code"] == 0, desc
    parts = sorted(desc[0]["partitions"], key=lambda p: p["partition_index"])
    assert [p["partition_index"] for p in parts] == list(range(PARTITIONS))
    assert all(p["leader_id"] == 1 for p in parts), parts
    cluster = a.describe_cluster()
    assert [b["broker_id"] for b in cluster["brokers"]] == [1], cluster
    assert cluster["brokers"][0]["port"] == samsa.port
    assert cluster["controller_id"] == 1, cluster
    with pytest.raises(TopicAlreadyExistsError):
        a.create_topics([NewTopic(name=topic_name, num_partitions=1, replication_factor=1)],
                        timeout_ms=30000, raise_errors=True)
    a.close()


def test_idempotent_produce_and_assign_consume_exactly_once(samsa, topic_name):
    create_topic(samsa, topic_name)
    checker = Checker()
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, enable_idempotence=True, acks="all",
                      linger_ms=5, request_timeout_ms=30000)
    futures = []
    for i in range(N):
        v = f"kp-{i:06}".encode()
        checker.send(v)
        futures.append((v, p.send(topic_name, value=v, key=str(i % 13).encode())))
    p.flush(timeout=60)
    for v, f in futures:
        md = f.get(timeout=60)
        checker.ack(v, md.partition, md.offset)
    p.close()

    c = consumer(samsa)
    tps = [TopicPartition(topic_name, i) for i in range(PARTITIONS)]
    ends = c.end_offsets(tps)
    assert sum(ends.values()) == N, ends
    assert c.beginning_offsets(tps) == {tp: 0 for tp in tps}
    c.assign(tps)
    c.seek_to_beginning(*tps)
    pos = {tp: 0 for tp in tps}
    deadline = time.monotonic() + 120
    while any(pos[tp] < ends[tp] for tp in tps):
        assert time.monotonic() < deadline, f"consume timed out at {pos}, ends {ends}"
        for tp, msgs in c.poll(timeout_ms=500).items():
            for m in msgs:
                checker.read(m.partition, m.offset, m.value)
                pos[tp] = max(pos[tp], m.offset + 1)
    c.close()
    checker.assert_ok()


def test_fetch_session_carries_a_consumer_through_waves_pauses_and_reassignment(
        samsa, topic_name, caplog):
    """kafka-python opens a KIP-227 fetch session and then sends incremental
    fetches naming only what changed; samsa answers only the partitions with
    news. Every record arrives once and in order through waves that touch a
    few partitions, a pause (the client forgets partitions from its session),
    a resume and a reassignment (it adds some), and the client never finds
    an answer it must reject."""
    caplog.set_level("INFO", logger="kafka.consumer.fetcher")
    partitions = 8
    create_topic(samsa, topic_name, partitions)
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, enable_idempotence=True, acks="all",
                      request_timeout_ms=30000)
    c = consumer(samsa)
    sent = {i: [] for i in range(partitions)}
    got = {i: [] for i in range(partitions)}

    def produce(wave, targets):
        for t in targets:
            for k in range(3):
                v = f"w{wave}-p{t}-{k}".encode()
                md = p.send(topic_name, value=v, partition=t).get(timeout=60)
                sent[t].append((md.offset, v))

    def drain(assigned):
        live = [tp for tp in assigned if tp not in c.paused()]
        deadline = time.monotonic() + 60
        while any(len(got[tp.partition]) < len(sent[tp.partition]) for tp in live):
            assert time.monotonic() < deadline, f"consume timed out: got {got}, sent {sent}"
            for tp, msgs in c.poll(timeout_ms=500).items():
                assert tp not in c.paused(), f"records of paused {tp}"
                got[tp.partition].extend((m.offset, m.value) for m in msgs)

    first = [TopicPartition(topic_name, i) for i in range(6)]
    c.assign(first)
    c.seek_to_beginning(*first)
    produce(1, [0, 1])
    drain(first)
    produce(2, [5])
    drain(first)
    paused = [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]
    c.pause(*paused)
    produce(3, [0, 2])
    drain(first)
    assert got[0] == sent[0][:3], "a paused partition delivered"
    c.resume(*paused)
    drain(first)
    everything = [TopicPartition(topic_name, i) for i in range(partitions)]
    c.assign(everything)
    c.seek_to_beginning(*everything[6:])
    produce(4, [6, 7, 3])
    drain(everything)
    for i in range(partitions):
        assert got[i] == sent[i], f"partition {i}: got {got[i]}, sent {sent[i]}"
    sessions = [(h.next_metadata.session_id, h.next_metadata.epoch)
                for h in c._fetcher._session_handlers.values()]
    c.close()
    p.close()

    # The consumer held a session the broker granted and moved its epoch on
    # (it would be 0 or the session id 0 had samsa refused or closed it).
    assert any(session_id != 0 and epoch > 1 for session_id, epoch in sessions), sessions
    refused = [r.getMessage() for r in caplog.records
               if "unable to process the fetch request" in r.getMessage()
               or "invalid full fetch response" in r.getMessage()
               or "invalid incremental fetch response" in r.getMessage()]
    assert refused == [], refused


def test_list_offsets_by_time(samsa, topic_name):
    create_topic(samsa, topic_name, partitions=1)
    base = int(time.time() * 1000) - 3_600_000
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, enable_idempotence=True, acks="all")
    for i in range(10):
        p.send(topic_name, value=f"t{i}".encode(), partition=0, timestamp_ms=base + 100 * i).get(timeout=30)
    p.close()
    c = consumer(samsa)
    tp = TopicPartition(topic_name, 0)
    assert c.beginning_offsets([tp]) == {tp: 0}
    assert c.end_offsets([tp]) == {tp: 10}
    r = c.offsets_for_times({tp: base + 450})
    assert r[tp].offset == 5 and r[tp].timestamp == base + 500, r
    r = c.offsets_for_times({tp: base + 100_000})
    assert r[tp] is None, r
    c.close()


def test_describe_features_finalizes_transaction_version_2(samsa):
    """KIP-584 features as kafka-python's admin reads them: samsa finalizes
    transaction.version 2, the level at which Kafka 4 clients use
    transaction version 2 (Produce v12, EndTxn v5)."""
    a = admin(samsa)
    try:
        features = a.describe_features()
    finally:
        a.close()
    tv = features.get("transaction.version")
    assert tv is not None, features
    assert tv["finalized"] == (2, 2), features
    assert tv["finalized_epoch"] is not None and tv["finalized_epoch"] >= 0, features
    # The supported range is only in ApiVersions v4+ answers (it starts at 0).
    assert tv.get("supported", (0, 2)) == (0, 2), features
    assert set(features) == {"transaction.version"}, features


def test_admin_read_apis_log_dirs_quorum_and_topic_partitions(samsa, topic_name):
    """The read-only admin calls of kafka-python 3.0: describe_log_dirs
    (DescribeLogDirs v4), describe_metadata_quorum (DescribeQuorum v2) and
    describe_topic_partitions (DescribeTopicPartitions, paged). kafka-python's
    describe_topics still uses Metadata, so it is covered above."""
    create_topic(samsa, topic_name)
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, acks="all", request_timeout_ms=30000)
    for i in range(200):
        p.send(topic_name, value=f"log-dir-{i:04}".encode() * 4, partition=0)
    p.flush(timeout=60)
    p.close()

    a = admin(samsa)
    try:
        dirs = a.describe_log_dirs()
        assert [d["broker"] for d in dirs] == [1], dirs
        (log_dir,) = dirs[0]["log_dirs"]
        assert log_dir["error_code"] == 0, log_dir
        assert log_dir["log_dir"] == str(samsa.data_dir.resolve()), log_dir
        assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"], log_dir
        (topic,) = [t for t in log_dir["topics"] if t["name"] == topic_name]
        sizes = {p["partition_index"]: p["partition_size"] for p in topic["partitions"]}
        assert sorted(sizes) == list(range(PARTITIONS)), topic
        on_disk = sum(f.stat().st_size for f in (samsa.data_dir / f"{topic_name}-0").glob("*.log"))
        assert sizes[0] == on_disk > 200 * 40, (sizes, on_disk)
        assert sizes[1] == sizes[2] == 0, sizes
        assert all(p["offset_lag"] == 0 and not p["is_future_key"] for p in topic["partitions"]), topic
        # Filtered to one partition.
        filtered = a.describe_log_dirs(topic_partitions={topic_name: [1]})
        (log_dir,) = filtered[0]["log_dirs"]
        assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in log_dir["topics"]] \
            == [(topic_name, [1])], filtered

        quorum = a.describe_metadata_quorum()
        (topic,) = quorum["topics"]
        assert topic["topic_name"] == "__cluster_metadata", quorum
        (part,) = topic["partitions"]
        assert part["error"] is None, quorum
        assert part["leader_id"] == 1 and part["leader_epoch"] == 0, quorum
        # One node: the metadata changes so far (the topic) are its log.
        assert part["high_watermark"] >= 1, quorum
        (voter,) = part["current_voters"]
        assert voter["replica_id"] == 1 and voter["log_end_offset"] == part["high_watermark"], quorum
        assert voter["last_fetch_timestamp"] > 0 and voter["last_caught_up_timestamp"] > 0, quorum
        assert part["observers"] == [], quorum
        assert [n["node_id"] for n in quorum["nodes"]] == [1], quorum

        first = a.describe_topic_partitions([topic_name], response_partition_limit=2)
        (t,) = first["topics"]
        assert t["error_code"] == 0 and t["name"] == topic_name, first
        assert [p["partition_index"] for p in t["partitions"]] == [0, 1], first
        assert all(p["leader_id"] == 1 and p["replica_nodes"] == [1] for p in t["partitions"]), first
        assert first["next_cursor"] == {"topic_name": topic_name, "partition_index": 2}, first
        rest = a.describe_topic_partitions([topic_name], response_partition_limit=2,
                                           cursor=first["next_cursor"])
        assert [p["partition_index"] for p in rest["topics"][0]["partitions"]] == [2], rest
        assert rest["next_cursor"] is None, rest
        unknown = a.describe_topic_partitions([topic_name + "-missing"])
        assert unknown["topics"][0]["error_code"] == 3, unknown
    finally:
        a.close()
def test_inferred_broker_version_is_kafka_4(samsa, topic_name):
    """kafka-python infers the broker's release from the ApiVersions maxima
    (kafka/protocol/broker_version_data.py): Produce v13 means 4.1, and
    that is what samsa's table reaches (4.2 would take ListOffsets v11, 4.3
    DescribeLogDirs v5). The clients then talk to samsa
    at those versions: a round trip with offset lookups still works."""
    create_topic(samsa, topic_name, partitions=1)
    c = consumer(samsa)
    try:
        assert c.config["api_version"] == (4, 1), c.config["api_version"]
    finally:
        c.close()
    p = KafkaProducer(bootstrap_servers=samsa.bootstrap, request_timeout_ms=30000)
    try:
        assert p.config["api_version"] == (4, 1), p.config["api_version"]
        for i in range(3):
            p.send(topic_name, value=b"v%d" % i, partition=0).get(timeout=30)
    finally:
        p.close()
    c = consumer(samsa)
    try:
        tp = TopicPartition(topic_name, 0)
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 3}
        c.assign([tp])
        c.seek_to_beginning(tp)
        values = []
        deadline = time.monotonic() + 60
        while len(values) < 3 and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
        assert values == [b"v0", b"v1", b"v2"], values
    finally:
        c.close()


def test_describe_configs_broker_resource(samsa_factory):
    """KafkaAdminClient.describe_configs on the broker resource: Kafka's keys
    (advertised.listeners, listeners, log.dirs, ...), STATIC_BROKER_CONFIG for
    what samsa was started with, DEFAULT_CONFIG otherwise, Kafka's synonyms,
    read-only unless Kafka can change the key at run time, no documentation
    unless asked for."""
    from kafka.admin import ConfigResource, ConfigResourceType

    node = samsa_factory(["num_partitions=3", "log.retention_ms=3600000"])
    a = admin(node)
    try:
        resource = ConfigResource(ConfigResourceType.BROKER, "1")
        every = a.describe_configs([resource], include_synonyms=True, config_filter="all")
        static = a.describe_configs([resource], config_filter="static")
    finally:
        a.close()
    configs = every["broker"]["1"]
    for name in ("log.retention.ms", "log.segment.bytes", "message.max.bytes", "log.cleanup.policy"):
        assert configs[name]["read_only"] is False, name
    for name in ("log.dirs", "num.partitions", "node.id", "log.retention.hours"):
        assert configs[name]["read_only"] is True, name
    for name, c in configs.items():
        assert c["is_sensitive"] is False, (name, c)
        assert c["documentation"] is None, (name, c)
        assert c["config_source"] in ("STATIC_BROKER_CONFIG", "DEFAULT_CONFIG"), (name, c)
    advertised = f"PLAINTEXT://{node.bootstrap}"
    assert configs["advertised.listeners"]["value"] == advertised, configs["advertised.listeners"]
    assert configs["advertised.listeners"]["config_source"] == "STATIC_BROKER_CONFIG"
    assert configs["listeners"]["value"] == advertised
    assert configs["log.dirs"]["value"] == str(node.data_dir)
    assert configs["num.partitions"]["value"] == "3"
    assert configs["num.partitions"]["synonyms"] == [
        {"name": "num.partitions", "value": "3", "source": "STATIC_BROKER_CONFIG"},
        {"name": "num.partitions", "value": "1", "source": "DEFAULT_CONFIG"},
    ]
    assert configs["log.retention.ms"]["value"] == "3600000"
    assert configs["log.retention.ms"]["synonyms"] == [
        {"name": "log.retention.ms", "value": "3600000", "source": "STATIC_BROKER_CONFIG"},
        {"name": "log.retention.hours", "value": "168", "source": "DEFAULT_CONFIG"},
    ]
    assert configs["log.retention.hours"]["value"] == "168"
    assert configs["log.retention.hours"]["config_source"] == "DEFAULT_CONFIG"
    assert configs["offsets.topic.num.partitions"]["value"] == "50"
    assert configs["offsets.topic.num.partitions"]["config_source"] == "DEFAULT_CONFIG"
    assert configs["group.initial.rebalance.delay.ms"]["value"] == "3000"
    assert configs["message.max.bytes"]["config_type"] == "INT"
    # What the harness and the test put on the command line, and only that.
    assert set(static["broker"]["1"]) == {
        "node.id", "broker.id", "listeners", "advertised.listeners", "log.dirs",
        "num.partitions", "log.retention.ms",
    }, sorted(static["broker"]["1"])
