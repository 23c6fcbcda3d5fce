"""TLS and SASL benchmark (tests/bench/run.sh security): produce and consume
throughput over PLAINTEXT, SSL and SASL_SSL (SCRAM-SHA-512) against one
broker in one run, the broker's CPU per MB on each, and the time to set up
a connection (TCP, TLS handshake, SCRAM exchange, first Metadata answer).

One broker with three listeners on one PKI (tests/compat/pki.py). Each
round, per protocol: a fresh confluent-kafka producer sends RECORDS records
of 1 KiB (acks=all, idempotent, linger 5 ms) to its own one-partition
topic, then a consumer reads them all back, then the topic is deleted;
rounds run the protocols in
alternating order (P S Q, Q S P, ...) so drift on a noisy machine falls on
all of them. Then CONNECTS connections per protocol, each timed from
creating the client to its first Metadata answer. Prints a Markdown table;
asserts nothing but that every record was acknowledged and read.
"""

import argparse
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "compat"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pki import make_pki, server_settings  # noqa: E402
from procs import cpu_seconds, free_port  # noqa: E402

PASSWORD = "bench-secret"


def start_broker(binary, directory, pki):
    ports = {"PLAINTEXT": free_port(), "SSL": free_port(), "SASL_SSL": free_port()}
    args = [binary, "server", "--listen", f"127.0.0.1:{ports['PLAINTEXT']}",
            "--data-dir", str(directory / "data"), "--set", "http_listen=127.0.0.1:0",
            "--set", f"listeners.tls.listen=127.0.0.1:{ports['SSL']}",
            "--set", "listeners.tls.security_protocol=SSL",
            "--set", f"listeners.sasl.listen=127.0.0.1:{ports['SASL_SSL']}",
            "--set", "listeners.sasl.security_protocol=SASL_SSL"]
    for s in server_settings(pki):
        args += ["--set", s]
    log = open(directory / "broker.log", "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", ports["SASL_SSL"]), timeout=1).close()
            return proc, ports
        except OSError:
            time.sleep(0.05)  # the listener is not bound yet
    proc.kill()
    raise RuntimeError("broker did not start")


def client_config(protocol, ports, pki):
    config = {"bootstrap.servers": f"127.0.0.1:{ports[protocol]}", "broker.address.family": "v4"}
    if protocol != "PLAINTEXT":
        config.update({"security.protocol": protocol, "ssl.ca.location": str(pki["ca"])})
    if protocol == "SASL_SSL":
        config.update({"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench",
                       "sasl.password": PASSWORD})
    return config


def produce(config, topic, records, value):
    p = Producer({**config, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "queue.buffering.max.messages": 500000})
    failed = []
    start = time.monotonic()
    for _ in range(records):
        while True:
            try:
                p.produce(topic, value, partition=0,
                          on_delivery=lambda e, m: failed.append(e) if e else None)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0 and not failed, failed[:3]
    return time.monotonic() - start


def consume(config, topic, records):
    c = Consumer({**config, "group.id": f"bench-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "fetch.max.bytes": 52428800})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.monotonic()
    while got < records:
        for m in c.consume(num_messages=10000, timeout=1.0):
            if m.error() is None:
                got += 1
    elapsed = time.monotonic() - start
    c.close()
    return elapsed


def connect_time(config):
    start = time.monotonic()
    a = AdminClient(config)
    a.list_topics(timeout=30)
    return time.monotonic() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--records", type=int, default=300000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connects", type=int, default=30)
    args = parser.parse_args()

    directory = pathlib.Path(args.dir)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    pki = make_pki(directory / "pki")
    proc, ports = start_broker(args.samsa, directory, pki)
    try:
        admin = AdminClient(client_config("PLAINTEXT", ports, pki))
        upsertion = UserScramCredentialUpsertion(
            "bench", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), PASSWORD.encode())
        for f in admin.alter_user_scram_credentials([upsertion]).values():
            f.result(30)
        protocols = ["PLAINTEXT", "SSL", "SASL_SSL"]
        value = os.urandom(1024)
        mb = args.records * len(value) / 1e6
        results = {p: {"produce": [], "consume": [], "cpu": []} for p in protocols}
        for round_no in range(args.rounds):
            order = protocols if round_no % 2 == 0 else list(reversed(protocols))
            for protocol in order:
                topic = f"bench-{protocol.lower()}-{round_no}"
                for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                    f.result(30)
                config = client_config(protocol, ports, pki)
                cpu_before = cpu_seconds(proc.pid)
                produced = produce(config, topic, args.records, value)
                consumed = consume(config, topic, args.records)
                results[protocol]["cpu"].append((cpu_seconds(proc.pid) - cpu_before) / (2 * mb))
                results[protocol]["produce"].append(mb / produced)
                results[protocol]["consume"].append(mb / consumed)
                # Later runs would otherwise write beside a growing log
                # (page-cache reclaim, writeback), whichever protocol they use.
                for f in admin.delete_topics([topic]).values():
                    f.result(30)
        connects = {p: [] for p in protocols}
        for _ in range(args.connects):
            for protocol in protocols:
                connects[protocol].append(connect_time(client_config(protocol, ports, pki)))

        print(f"{args.records} records of 1 KiB per run, {args.rounds} rounds; "
              f"connection setup: {args.connects} connections per protocol\n")
        print("| listener | produce MB/s (acks=all, idempotent) | consume MB/s | broker CPU ms per MB (produce + consume) | connection setup median / p90 ms |")
        print("|---|---|---|---|---|")
        for protocol in protocols:
            r = results[protocol]
            c = sorted(connects[protocol])
            p90 = c[min(len(c) - 1, int(len(c) * 0.9))]
            print(f"| {protocol} | {' / '.join(f'{x:.0f}' for x in r['produce'])} "
                  f"| {' / '.join(f'{x:.0f}' for x in r['consume'])} "
                  f"| {' / '.join(f'{x * 1000:.1f}' for x in r['cpu'])} "
                  f"| {statistics.median(c) * 1000:.1f} / {p90 * 1000:.1f} |")
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    main()
