"""ACLs with real clients, as Kafka's StandardAuthorizer judges them.

Each node runs with the authorizer on and two listeners: the harness's
plaintext one, whose connections are `User:ANONYMOUS` and a super user
here (the operator's admin listener: it creates users, topics and ACLs),
and a SASL_PLAINTEXT one where alice authenticates with SCRAM-SHA-512 and
gets only what the ACLs grant her. ACLs are managed through the Kafka
admin APIs of confluent-kafka and kafka-python, and with `samsa user` and
`samsa acl`.
"""

import itertools
import os
import subprocess

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from conftest import free_port, samsa_bin

PASSWORD = "alice-secret"
_ids = itertools.count(os.getpid() * 1000 + 700)


def acl_node(samsa_factory, authorizer=True):
    port = free_port()
    node = samsa_factory([
        f"listeners.sasl.listen=127.0.0.1:{port}",
        "listeners.sasl.security_protocol=SASL_PLAINTEXT",
        f"authorizer_enable={'true' if authorizer else 'false'}",
        'super_users=["User:ANONYMOUS", "User:admin"]',
    ])
    node.sasl = f"127.0.0.1:{port}"
    node.admin = AdminClient({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4"})
    upsertion = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), PASSWORD.encode())
    for f in node.admin.alter_user_scram_credentials([upsertion]).values():
        f.result(30)
    return node


def alice(node, **extra):
    return {"bootstrap.servers": node.sasl, "broker.address.family": "v4",
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice", "sasl.password": PASSWORD, **extra}


def create_topics(node, *names):
    for f in node.admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(30)


def allow(node, resource_type, name, operation, pattern=ResourcePatternType.LITERAL,
          permission=AclPermissionType.ALLOW, principal="User:alice"):
    binding = AclBinding(resource_type, name, pattern, principal, "*", operation, permission)
    for f in node.admin.create_acls([binding]).values():
        f.result(30)


def produce_one(config, topic):
    """The delivery error of one record (None: delivered)."""
    outcome = []
    p = Producer({**config, "message.timeout.ms": 10000})
    p.produce(topic, value=b"v", partition=0, on_delivery=lambda e, m: outcome.append(e))
    p.flush(20)
    assert len(outcome) == 1, outcome
    return outcome[0]


def test_transactional_id_and_topic_write_are_both_needed(samsa_factory, topic_name):
    node = acl_node(samsa_factory)
    allowed, other = f"{topic_name}-ok", f"{topic_name}-other"
    create_topics(node, allowed, other)
    txn_id = f"{topic_name}-txn"
    allow(node, ResourceType.TOPIC, allowed, AclOperation.WRITE)

    # No ACL on the transactional id: InitProducerId is refused.
    p = Producer(alice(node, **{"transactional.id": txn_id}))
    with pytest.raises(KafkaException) as e:
        p.init_transactions(20)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value

    # WRITE on the id (by prefix): the producer starts; the topic without
    # WRITE is refused when it joins the transaction.
    allow(node, ResourceType.TRANSACTIONAL_ID, topic_name, AclOperation.WRITE,
          pattern=ResourcePatternType.PREFIXED)
    p = Producer(alice(node, **{"transactional.id": txn_id}))
    p.init_transactions(20)
    p.begin_transaction()
    p.produce(allowed, value=b"committed", partition=0)
    p.commit_transaction(20)
    p.begin_transaction()
    delivery = []
    p.produce(other, value=b"refused", partition=0, on_delivery=lambda e, m: delivery.append(e))
    with pytest.raises(KafkaException):
        p.commit_transaction(20)
    p.poll(0)
    assert [e.code() for e in delivery] == [KafkaError.TOPIC_AUTHORIZATION_FAILED], delivery
    p.abort_transaction(20)

    # What alice committed is there; nothing reached the other topic.
    c = Consumer({"bootstrap.servers": node.bootstrap, "broker.address.family": "v4",
                  "group.id": f"acl-{next(_ids)}", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    for topic, expected in ((allowed, 1), (other, 0)):
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
        assert high - low == (expected + 1 if expected else 0), (topic, low, high)
    c.close()


def test_idempotent_producer_needs_write_on_some_topic_or_idempotent_write(samsa_factory, topic_name):
    node = acl_node(samsa_factory)
    create_topics(node, topic_name)
    error = produce_one(alice(node, **{"enable.idempotence": True}), topic_name)
    assert error is not None and error.code() in (
        KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED), error
    allow(node, ResourceType.TOPIC, topic_name, AclOperation.WRITE)
    assert produce_one(alice(node, **{"enable.idempotence": True}), topic_name) is None


def test_consumer_without_read_on_its_group_cannot_commit(samsa_factory, topic_name):
    node = acl_node(samsa_factory)
    create_topics(node, topic_name)
    allow(node, ResourceType.TOPIC, topic_name, AclOperation.READ)
    group = f"acl-group-{next(_ids)}"
    # DESCRIBE lets the client find the group's coordinator; committing
    # needs READ.
    allow(node, ResourceType.GROUP, group, AclOperation.DESCRIBE)
    c = Consumer(alice(node, **{"group.id": group, "enable.auto.commit": False}))
    with pytest.raises(KafkaException) as e:
        c.commit(offsets=[TopicPartition(topic_name, 0, 0)], asynchronous=False)
    assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, e.value
    c.close()

    allow(node, ResourceType.GROUP, group, AclOperation.READ)
    c = Consumer(alice(node, **{"group.id": group, "enable.auto.commit": False}))
    committed = c.commit(offsets=[TopicPartition(topic_name, 0, 0)], asynchronous=False)
    assert committed[0].error is None, committed
    c.close()


def test_prefixed_allow_and_literal_deny_and_hidden_topics(samsa_factory, topic_name):
    node = acl_node(samsa_factory)
    prefix = f"{topic_name}-orders-"
    open_topic, secret, unrelated = f"{prefix}a", f"{prefix}secret", f"{topic_name}-payroll"
    create_topics(node, open_topic, secret, unrelated)
    allow(node, ResourceType.TOPIC, prefix, AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED)
    allow(node, ResourceType.TOPIC, secret, AclOperation.ALL, permission=AclPermissionType.DENY)

    assert produce_one(alice(node), open_topic) is None
    error = produce_one(alice(node), secret)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

    # Metadata shows alice only what she may DESCRIBE (implied by WRITE),
    # and DENY ALL hides the secret topic too.
    visible = set(AdminClient(alice(node)).list_topics(timeout=20).topics)
    assert open_topic in visible and secret not in visible and unrelated not in visible, visible

    # What she may do on it, as Metadata's authorized-operations bits tell
    # it (DESCRIBE implied by WRITE); the admin listener's super user may
    # do everything on the cluster.
    as_alice = AdminClient(alice(node))
    described = as_alice.describe_topics(
        TopicCollection([open_topic]), include_authorized_operations=True)[open_topic].result(30)
    assert set(described.authorized_operations) == {AclOperation.WRITE, AclOperation.DESCRIBE}, described
    cluster = node.admin.describe_cluster(include_authorized_operations=True).result(30)
    assert len(cluster.authorized_operations) == 7, cluster.authorized_operations


def test_acl_admin_apis_answer_as_kafka(samsa_factory, topic_name):
    from kafka import KafkaAdminClient
    from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ResourcePattern
    from kafka.admin import ACLResourcePatternType, ResourcePatternFilter
    from kafka.admin import ResourceType as KpResourceType

    node = acl_node(samsa_factory)
    allow(node, ResourceType.TOPIC, topic_name, AclOperation.READ)
    allow(node, ResourceType.GROUP, "g", AclOperation.READ, pattern=ResourcePatternType.PREFIXED)

    described = node.admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None,
        AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert sorted((b.restype, b.name, b.resource_pattern_type) for b in described) == sorted([
        (ResourceType.TOPIC, topic_name, ResourcePatternType.LITERAL),
        (ResourceType.GROUP, "g", ResourcePatternType.PREFIXED)]), described

    # kafka-python: create, describe with a MATCH filter, delete.
    kp = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=30000)
    try:
        acl = ACL(principal="User:bob", host="*", operation=ACLOperation.WRITE,
                  permission_type=ACLPermissionType.ALLOW,
                  resource_pattern=ResourcePattern(KpResourceType.TOPIC, topic_name))
        result = kp.create_acls([acl])
        assert result["failed"] == [], result
        matched, error = kp.describe_acls(ACLFilter(
            principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KpResourceType.TOPIC, topic_name,
                                                   ACLResourcePatternType.MATCH)))
        assert {a.principal for a in matched} == {"User:alice", "User:bob"}, (matched, error)
        deleted = kp.delete_acls([ACLFilter(
            principal="User:bob", host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY))])
        assert len(deleted) == 1 and len(deleted[0][1]) == 1, deleted
    finally:
        kp.close()

    # An invalid binding (the cluster resource, code 4, which librdkafka
    # calls BROKER, under another name) is refused with a reason; alice may
    # not manage ACLs.
    bad = AclBinding(ResourceType.BROKER, "not-the-cluster", ResourcePatternType.LITERAL,
                     "User:alice", "*", AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        for f in node.admin.create_acls([bad]).values():
            f.result(30)
    assert e.value.args[0].code() == KafkaError.INVALID_REQUEST, e.value
    as_alice = AdminClient(alice(node))
    mine = AclBinding(ResourceType.TOPIC, "anything", ResourcePatternType.LITERAL,
                      "User:alice", "*", AclOperation.ALL, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        for f in as_alice.create_acls([mine]).values():
            f.result(30)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, e.value


def test_acl_apis_without_an_authorizer_answer_security_disabled(samsa_factory):
    node = acl_node(samsa_factory, authorizer=False)
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL,
                         "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        for f in node.admin.create_acls([binding]).values():
            f.result(30)
    assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED, e.value


def test_samsa_user_and_acl_commands_manage_what_clients_may_do(samsa_factory, topic_name):
    node = acl_node(samsa_factory)
    create_topics(node, topic_name)

    def samsa(*args):
        done = subprocess.run([str(samsa_bin()), *args, "-b", node.bootstrap], capture_output=True,
                              text=True, timeout=60, env={**os.environ, "SAMSA_USER_PASSWORD": "carol-secret"})
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    samsa("user", "add", "carol")
    assert "carol  SCRAM-SHA-512  8192" in samsa("user", "list", "carol")
    carol = {**alice(node), "sasl.username": "carol", "sasl.password": "carol-secret"}
    samsa("acl", "add", "--topic", topic_name, "--principal", "User:carol", "--operation", "WRITE")
    assert "User:carol" in samsa("acl", "list", "--topic", topic_name)
    assert produce_one(carol, topic_name) is None

    assert "removed 1 ACL(s)" in samsa("acl", "remove", "--principal", "User:carol")
    error = produce_one(carol, topic_name)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

    samsa("user", "delete", "carol")
    assert "carol" not in samsa("user", "list")
