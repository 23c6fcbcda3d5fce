"""Compaction benchmark (tests/bench/run.sh compaction): how long the group
coordinator takes to load `__consumer_offsets` after COMMITS offset commits
to GROUPS groups, before and after the log cleaner compacted it, and the
cleaner's throughput on that log.

One broker (one `__consumer_offsets` partition with 16 MiB segments by default, so the
cleaner has closed segments to take), driven by confluent-kafka consumers
committing asynchronously. Each measurement SIGKILLs the broker and starts
it again; the load time is the broker's own log line ("coordinator state
partition loaded elapsed_ms=..."). Prints a Markdown table; asserts
nothing except that the committed offsets survive.
"""

import argparse
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from procs import free_port  # noqa: E402


class Broker:
    def __init__(self, binary, data, settings):
        self.binary, self.data, self.settings = binary, data, settings
        self.port = free_port()
        self.proc = None
        self.log = data.parent / "broker.log"

    def start(self, extra=()):
        self.log.write_text("")
        args = [self.binary, "server", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data),
                "--set", "http_listen=127.0.0.1:0"]
        for s in [*self.settings, *extra]:
            args += ["--set", s]
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(args, stdout=out, stderr=out, env={**os.environ, "RUST_LOG": "info"})
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("broker did not start")

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def log_lines(self):
        return self.log.read_text(errors="replace").splitlines()

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"


def offsets_dir_bytes(data):
    d = data / "__consumer_offsets-0"
    return sum(f.stat().st_size for f in d.iterdir() if f.name.endswith(".log"))


def wait_loaded(broker, timeout=600):
    """Forces the group coordinator to load (FindCoordinator + a committed()
    call), then reads the load time from the broker's log."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(r'coordinator_load\{kind="group" partition=0 .*coordinator state partition loaded elapsed_ms=(\d+)')
    while time.monotonic() < deadline:
        for line in broker.log_lines():
            m = pattern.search(line)
            if m:
                return int(m.group(1))
        time.sleep(0.1)
    raise RuntimeError("the group coordinator did not load")


def committed(broker, group, topic):
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=300)[0].offset
    finally:
        c.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=4)
    # About 127 bytes a commit: 16 MiB segments give the 1M commits 7
    # closed segments for the cleaner (the active one is never cleaned).
    parser.add_argument("--segment-bytes", type=int, default=16 * 1024 * 1024)
    args = parser.parse_args()
    work = pathlib.Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    data.mkdir(parents=True)
    broker = Broker(args.samsa, data, [
        "offsets_topic_num_partitions=1", f"offsets_topic_segment_bytes={args.segment_bytes}",
        "group_initial_rebalance_delay_ms=0", "log_cleaner_backoff_ms=200",
    ])
    broker.start(["log_cleaner_enable=false"])
    topic = "bench-compaction"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(60)

    per_group = args.commits // args.groups
    started = time.monotonic()
    done = [0] * args.groups
    failed = []

    def on_commit(g):
        def report(err, _partitions):
            if err is not None:
                failed.append(err)
            done[g] += 1
        return report

    consumers = [Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g{g}", "enable.auto.commit": False,
                           "on_commit": on_commit(g)})
                 for g in range(args.groups)]
    for offset in range(1, per_group + 1):
        for g, c in enumerate(consumers):
            c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=True)
            # At most 500 commits in flight per group: the coordinator answers
            # each once durable, and a flood would only time out in the client.
            while offset - done[g] > 500:
                c.poll(0.01)
    for g, c in enumerate(consumers):
        while done[g] < per_group:
            c.poll(0.01)
        c.close()
    assert not failed, failed[:5]
    commit_secs = time.monotonic() - started
    uncompacted_bytes = offsets_dir_bytes(data)

    rows = []
    broker.kill()
    broker.start(["log_cleaner_enable=false"])
    assert committed(broker, "g0", topic) == per_group
    rows.append(("before compaction", wait_loaded(broker), uncompacted_bytes))

    # The cleaner compacts every closed segment; the active one stays.
    broker.kill()
    broker.start()
    pattern = re.compile(r"log cleaner compacted partition partition=__consumer_offsets-0 .*bytes_read=(\d+) "
                         r"bytes_written=(\d+) .*took_ms=(\d+)")
    def cleaner_passes():
        return [tuple(map(int, m.groups())) for m in map(pattern.search, broker.log_lines()) if m]

    deadline = time.monotonic() + 600
    passes = []
    while time.monotonic() < deadline:
        seen = len(passes)
        time.sleep(1.0)  # five cleaner backoffs: a pass would have started
        passes = cleaner_passes()
        if passes and len(passes) == seen:
            break
    if not passes:
        raise RuntimeError("the cleaner never compacted __consumer_offsets")
    read = sum(p[0] for p in passes)
    took = sum(p[2] for p in passes) / 1000
    compacted_bytes = offsets_dir_bytes(data)

    broker.kill()
    broker.start(["log_cleaner_enable=false"])
    for g in range(args.groups):
        assert committed(broker, f"g{g}", topic) == per_group, g
    rows.append(("after compaction", wait_loaded(broker), compacted_bytes))
    broker.kill()

    print(f"## Coordinator load after {args.commits:,} offset commits to {args.groups} groups "
          f"({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())})")
    print()
    print(f"commits took {commit_secs:.1f} s ({args.commits / commit_secs:,.0f}/s); "
          f"cleaner: {len(passes)} passes read {read / 1e6:.1f} MB in {took:.2f} s "
          f"= {read / 1e6 / took if took else float('inf'):.1f} MB/s")
    print()
    print("| `__consumer_offsets-0` | load time (ms) | log bytes |")
    print("|---|---|---|")
    for name, ms, size in rows:
        print(f"| {name} | {ms} | {size:,} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
