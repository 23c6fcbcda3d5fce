"""The client side of tests/it/secured_cluster.rs: confluent-kafka over
SASL_SSL (SCRAM-SHA-512) against a three-node cluster with ACLs (and of
tests/containers' SASL_SSL compose cluster).

With --admin-user, that user (a super user) first creates the topic with
three replicas.

As the user the ACLs allow: TRANSACTIONS transactions over every partition
of the topic (every other one aborted), then a read_committed group
consumer that must read exactly the committed records and commits its
offsets. As a user without ACLs: a produce refused with
TOPIC_AUTHORIZATION_FAILED. Prints one JSON line with what it saw; exits 1
on any difference.
"""

import argparse
import json
import sys
import time

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--user", required=True)
    p.add_argument("--password", required=True)
    p.add_argument("--stranger", required=True)
    p.add_argument("--stranger-password", required=True)
    p.add_argument("--transactions", type=int, default=10)
    p.add_argument("--admin-user")
    p.add_argument("--admin-password")
    a = p.parse_args()

    def config(user, password):
        return {"bootstrap.servers": a.bootstrap, "broker.address.family": "v4",
                "security.protocol": "SASL_SSL", "ssl.ca.location": a.ca,
                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password}

    if a.admin_user:
        admin = AdminClient(config(a.admin_user, a.admin_password))
        for f in admin.create_topics([NewTopic(a.topic, a.partitions, 3)]).values():
            f.result(60)

    producer = Producer({**config(a.user, a.password), "transactional.id": a.transactional_id})
    producer.init_transactions(60)
    committed = set()
    for t in range(a.transactions):
        producer.begin_transaction()
        values = [f"t{t}-p{p}" for p in range(a.partitions)]
        for part, value in enumerate(values):
            producer.produce(a.topic, value=value.encode(), partition=part)
        if t % 2 == 0:
            producer.commit_transaction(60)
            committed.update(values)
        else:
            producer.abort_transaction(60)

    consumer = Consumer({**config(a.user, a.password), "group.id": a.group,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    consumer.subscribe([a.topic])
    read = []
    deadline = time.monotonic() + 90
    while len(read) < len(committed) and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            read.append(m.value().decode())
    # A little longer: anything beyond the committed records is a failure.
    end = time.monotonic() + 2
    while time.monotonic() < end:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            read.append(m.value().decode())
    commit_error = None
    try:
        consumer.commit(asynchronous=False)
    except Exception as e:  # noqa: BLE001 - reported below
        commit_error = str(e)
    consumer.close()

    outcome = []
    stranger = Producer({**config(a.stranger, a.stranger_password), "message.timeout.ms": 15000})
    stranger.produce(a.topic, value=b"stranger", partition=0, on_delivery=lambda e, m: outcome.append(e))
    stranger.flush(30)
    stranger_error = outcome[0].code() if outcome and outcome[0] is not None else None

    report = {
        "committed": len(committed), "read": len(read), "distinct_read": len(set(read)),
        "unexpected": sorted(set(read) - committed)[:10], "missing": sorted(committed - set(read))[:10],
        "commit_error": commit_error,
        "stranger_error": KafkaError(stranger_error).name() if stranger_error is not None else None,
    }
    print(json.dumps(report))
    ok = (len(read) == len(committed) and set(read) == committed and commit_error is None
          and stranger_error == KafkaError.TOPIC_AUTHORIZATION_FAILED)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
