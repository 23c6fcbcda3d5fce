"""kcat (librdkafka's CLI, from Debian) against samsa: metadata, produce, consume."""

import json
import shutil
import subprocess

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


def kcat(*args, input=None, timeout=60):
    # tests/run-all.sh installs kcat: its absence is a broken set-up, not a
    # reason to pass without testing anything.
    assert KCAT is not None, "kcat is not installed (tests/run-all.sh installs it from Debian)"
    r = subprocess.run([KCAT, *args], input=input, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"kcat {args} failed ({r.returncode}): {r.stderr.decode(errors='replace')}"
    return r.stdout


def test_kcat_produce_consume_metadata(samsa_factory, topic_name):
    node = samsa_factory(["num_partitions=2"])
    b = ["-b", node.bootstrap, "-X", "broker.address.family=v4"]
    # Auto-created on first produce metadata request.
    lines = "".join(f"line-{i}\n" for i in range(100)).encode()
    kcat(*b, "-P", "-t", topic_name, "-p", "0", "-X", "enable.idempotence=true", input=lines)
    md = json.loads(kcat(*b, "-L", "-J", "-t", topic_name))
    t = [t for t in md["topics"] if t["topic"] == topic_name]
    assert t and len(t[0]["partitions"]) == 2, md
    out = kcat(*b, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e", "-f", "%o %s\\n")
    got = out.decode().splitlines()
    assert got == [f"{i} line-{i}" for i in range(100)], got[:5]
