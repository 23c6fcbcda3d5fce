"""TLS and SASL with real clients: confluent-kafka (librdkafka) and
kafka-python over SASL_SSL with SCRAM-SHA-512 (and SCRAM-SHA-256, PLAIN)
produce, consume, run transactions and groups; users are managed with the
Kafka admin APIs (AlterUserScramCredentials / DescribeUserScramCredentials);
a wrong password, an unknown user, an untrusted or expired client
certificate are refused while the broker keeps serving everyone else; a
short connections.max.reauth.ms makes clients re-authenticate on their
connections without losing anything.

Each node has its plaintext listener (the harness's, used to create
users, as an operator's admin listener would be) and the secured ones the
test adds on free ports.
"""

import itertools
import os
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from conftest import free_port
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from pki import make_pki, server_settings

PASSWORD = "alice-secret"
_groups = itertools.count(os.getpid() * 1000 + 900)


def secured_node(samsa_factory, tmp_path, protocol="SASL_SSL", client_auth="none", extra=()):
    paths = make_pki(tmp_path / "pki")
    port = free_port()
    node = samsa_factory([
        f"listeners.secure.listen=127.0.0.1:{port}",
        f"listeners.secure.security_protocol={protocol}",
        *server_settings(paths, client_auth),
        *extra,
    ])
    node.secure = f"127.0.0.1:{port}"
    node.pki = paths
    return node


def add_user(node, user, password=PASSWORD, mechanism=ScramMechanism.SCRAM_SHA_512, iterations=8192):
    a = AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})
    upsertion = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, iterations), password.encode())
    for f in a.alter_user_scram_credentials([upsertion]).values():
        f.result(30)


def sasl_config(node, user="alice", password=PASSWORD, mechanism="SCRAM-SHA-512"):
    return {"bootstrap.servers": node.secure, "broker.address.family": "v4",
            "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password,
            "ssl.ca.location": str(node.pki["ca"])}


def produce(config, topic, values, **extra):
    p = Producer({**config, **extra})
    failures = []
    for v in values:
        p.produce(topic, value=v.encode(), partition=0, on_delivery=lambda e, m: failures.append(e) if e else None)
    assert p.flush(60) == 0
    return failures


def consume(config, topic, count, isolation="read_committed"):
    c = Consumer({**config, "group.id": f"security-{next(_groups)}", "auto.offset.reset": "earliest",
                  "isolation.level": isolation, "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value().decode())
        c.commit(asynchronous=False)
        return got
    finally:
        c.close()


def test_sasl_ssl_scram_sha_512_idempotent_transactional_and_groups(samsa_factory, tmp_path, topic_name):
    node = secured_node(samsa_factory, tmp_path)
    add_user(node, "alice")
    config = sasl_config(node)
    assert produce(config, topic_name, [f"i{i}" for i in range(50)], **{"enable.idempotence": True}) == []

    txn = Producer({**config, "transactional.id": f"{topic_name}-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(20):
        txn.produce(topic_name, value=f"t{i}".encode(), partition=0)
    txn.commit_transaction(30)
    txn.begin_transaction()
    txn.produce(topic_name, value=b"aborted", partition=0)
    txn.abort_transaction(30)

    got = consume(config, topic_name, 70)
    assert sorted(got) == sorted([f"i{i}" for i in range(50)] + [f"t{i}" for i in range(20)]), got


def test_kafka_python_over_sasl_ssl_with_sha_256_and_plain(samsa_factory, tmp_path, topic_name):
    node = secured_node(samsa_factory, tmp_path)
    add_user(node, "bob", password="bob-secret", mechanism=ScramMechanism.SCRAM_SHA_256, iterations=4096)
    for mechanism in ("SCRAM-SHA-256", "PLAIN"):
        common = dict(bootstrap_servers=node.secure, security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                      sasl_plain_username="bob", sasl_plain_password="bob-secret",
                      ssl_cafile=str(node.pki["ca"]), request_timeout_ms=30000)
        p = KafkaProducer(acks="all", **common)
        for i in range(10):
            p.send(topic_name, f"{mechanism}-{i}".encode(), partition=0).get(timeout=30)
        p.close()
    c = KafkaConsumer(topic_name, group_id=f"kp-{next(_groups)}", auto_offset_reset="earliest",
                      consumer_timeout_ms=15000, bootstrap_servers=node.secure, security_protocol="SASL_SSL",
                      sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob",
                      sasl_plain_password="bob-secret", ssl_cafile=str(node.pki["ca"]))
    values = [m.value.decode() for m in c]
    c.close()
    assert len(values) == 20, values


def test_wrong_passwords_and_unknown_users_are_refused_and_others_keep_working(samsa_factory, tmp_path, topic_name):
    node = secured_node(samsa_factory, tmp_path)
    add_user(node, "alice")
    good = Producer({**sasl_config(node), "enable.idempotence": True})
    for user, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        errors = []
        bad = Producer({**sasl_config(node, user=user, password=password), "message.timeout.ms": 5000,
                        "error_cb": lambda e: errors.append(e)})
        bad.produce(topic_name, value=b"x", partition=0)
        good.produce(topic_name, value=f"during-{user}".encode(), partition=0)
        bad.flush(10)
        assert good.flush(30) == 0
        assert any(e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str() for e in errors), errors
        assert all(PASSWORD not in e.str() and "wrong" not in e.str() for e in errors)
    assert sorted(consume(sasl_config(node), topic_name, 2)) == ["during-alice", "during-mallory"]


def test_scram_credential_admin_apis_answer_as_kafka(samsa_factory, tmp_path):
    node = secured_node(samsa_factory, tmp_path)
    add_user(node, "alice")
    a = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        described = a.describe_user_scram_credentials(["alice"])
        assert "alice" in str(described) and "8192" in str(described), described
    finally:
        a.close()
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})
    few = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")
    with pytest.raises(KafkaException) as e:
        for f in admin.alter_user_scram_credentials([few]).values():
            f.result(30)
    assert e.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL, e.value
    missing = UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512)
    with pytest.raises(KafkaException) as e:
        for f in admin.alter_user_scram_credentials([missing]).values():
            f.result(30)
    assert e.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND, e.value
    # Deleting alice's credential: she can no longer authenticate.
    for f in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_512)]).values():
        f.result(30)
    errors = []
    p = Producer({**sasl_config(node), "message.timeout.ms": 5000, "error_cb": lambda err: errors.append(err)})
    p.produce("after-delete", value=b"x")
    p.flush(10)
    assert any(err.code() == KafkaError._AUTHENTICATION for err in errors), errors


def test_reauthentication_keeps_a_producer_going(samsa_factory, tmp_path, topic_name):
    """connections.max.reauth.ms of 1.5 s: librdkafka re-authenticates on its
    connections (KIP-368) and nothing it sends over 6 s is lost."""
    node = secured_node(samsa_factory, tmp_path, extra=["connections_max_reauth_ms=1500"])
    add_user(node, "alice")
    p = Producer({**sasl_config(node), "enable.idempotence": True})
    failures = []
    sent = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        p.produce(topic_name, value=f"r{sent}".encode(), partition=0,
                  on_delivery=lambda e, m: failures.append(e) if e else None)
        sent += 1
        p.poll(0.05)
    assert p.flush(30) == 0
    assert failures == []
    assert len(consume(sasl_config(node), topic_name, sent)) == sent


@pytest.mark.parametrize("client_auth", ["required", "requested"])
def test_tls_client_certificates(samsa_factory, tmp_path, topic_name, client_auth):
    node = secured_node(samsa_factory, tmp_path, protocol="SSL", client_auth=client_auth)
    base = {"bootstrap.servers": node.secure, "broker.address.family": "v4", "security.protocol": "SSL",
            "ssl.ca.location": str(node.pki["ca"]), "message.timeout.ms": 8000}

    def with_cert(stem):
        cert, key = node.pki[stem]
        return {**base, "ssl.certificate.location": str(cert), "ssl.key.location": str(key)}

    assert produce(with_cert("alice"), topic_name, ["by-alice"]) == []
    if client_auth == "required":
        # With `requested`, whether a client shows a certificate its server
        # does not trust (and is refused) or connects without one (and is
        # let in as ANONYMOUS) is the client's choice.
        for stem in ("expired", "stranger"):
            failures = produce(with_cert(stem), topic_name, [f"by-{stem}"])
            assert len(failures) == 1, (stem, failures)
    without = produce(base, topic_name, ["anonymous"])
    assert (without == []) == (client_auth == "requested"), without
    expected = ["by-alice"] + (["anonymous"] if client_auth == "requested" else [])
    assert sorted(consume(with_cert("alice"), topic_name, len(expected))) == sorted(expected)
