"""Scale benchmark, consumer groups per broker (tests/bench/run.sh groups):
what a single node pays for groups with committed offsets, and how long
their offsets take to load after a SIGKILL.

A fresh broker gets one topic of --partitions partitions. For each size in
--groups, that many groups commit an offset for every partition, through
confluent-kafka's AdminClient (AlterConsumerGroupOffsets: an OffsetCommit
without membership, as a stopped Kafka Streams or Connect application's
groups hold offsets and no members), --inflight groups at a time; every
group then commits a second round (so `__consumer_offsets` holds two
records per group and partition, and the loaded state is the second).
Reported per size:

- commits/s: group-partition offsets committed per second, both rounds;
- `__consumer_offsets` bytes on disk, and the broker's resident memory and
  open descriptors after committing; its CPU while idle for
  --idle-seconds (per-group timers show up here);
- restart: the broker is SIGKILLed and started again; the time until
  every group's offsets are read back (ListConsumerGroupOffsets) equal to
  the second round's, and memory then.

Prints a Markdown table. Asserts that every committed offset is read back
after the restart.
"""

import argparse
import concurrent.futures
import pathlib
import sys
import time

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from procs import (broker_arguments, free_port, fresh_dir, idle_cpu_pct, open_fds,  # noqa: E402
                   print_table, rss_mib, run_sizes, start_broker, stop_broker)

TOPIC = "groups-bench"


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})


def group_name(i):
    return f"bench-group-{i}"


def offsets_of(partitions, round_):
    return [TopicPartition(TOPIC, p, round_ * 1000 + p) for p in range(partitions)]


def commit_all(a, groups, partitions, round_, inflight):
    """Commits round_'s offsets for every group, `inflight` groups at a time."""
    pending = []
    for i in range(groups):
        request = ConsumerGroupTopicPartitions(group_name(i), offsets_of(partitions, round_))
        pending.extend(a.alter_consumer_group_offsets([request], request_timeout=60).values())
        if len(pending) >= inflight:
            concurrent.futures.wait(pending)
            for f in pending:
                f.result()
            pending = []
    for f in pending:
        f.result()


def read_back(a, groups, partitions, deadline):
    """Reads every group's offsets until all equal round 2's or `deadline`;
    returns how many groups were still missing."""
    missing = set(range(groups))
    expected = {(tp.partition, tp.offset) for tp in offsets_of(partitions, 2)}
    while missing and time.monotonic() < deadline:
        for i in sorted(missing):
            request = ConsumerGroupTopicPartitions(group_name(i))
            try:
                (future,) = a.list_consumer_group_offsets([request], request_timeout=10).values()
                got = {(tp.partition, tp.offset) for tp in future.result().topic_partitions}
            except Exception:  # noqa: BLE001 - still loading (COORDINATOR_LOAD_IN_PROGRESS), retried
                continue
            if got == expected:
                missing.discard(i)
        if missing:
            time.sleep(0.05)  # polling the coordinator's load: nothing to wait on
    return len(missing)


def offsets_topic_bytes(data):
    return sum(f.stat().st_size for d in data.glob("__consumer_offsets-*")
               for f in d.rglob("*") if f.is_file())


def run_size(args, groups):
    directory = fresh_dir(pathlib.Path(args.dir) / f"g{groups}")
    data = directory / "data"
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    row = {"groups": groups}
    with open(directory / "broker.log", "ab") as log:
        proc = start_broker(args.samsa, data, port, log, args.set)
        try:
            a = admin(bootstrap)
            for f in a.create_topics([NewTopic(TOPIC, args.partitions, 1)]).values():
                f.result(timeout=60)
            start = time.monotonic()
            commit_all(a, groups, args.partitions, 1, args.inflight)
            commit_all(a, groups, args.partitions, 2, args.inflight)
            row["commits_per_s"] = 2 * groups * args.partitions / (time.monotonic() - start)
            row["offsets_mib"] = offsets_topic_bytes(data) / 2**20
            row["rss_mib"], row["fds"] = rss_mib(proc.pid), open_fds(proc.pid)
            row["idle_cpu_pct"] = idle_cpu_pct(proc.pid, args.idle_seconds)
            stop_broker(proc, "kill")
            start = time.monotonic()
            proc = start_broker(args.samsa, data, port, log, args.set)
            missing = read_back(admin(bootstrap), groups, args.partitions, start + 600)
            if missing:
                row["error"] = f"{missing} groups' offsets not read back within 600 s"
                return row
            row["restart_s"] = time.monotonic() - start
            row["rss_after_restart_mib"] = rss_mib(proc.pid)
        finally:
            proc.kill()
            proc.wait()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    broker_arguments(parser)
    parser.add_argument("--groups", default="10,1000")
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--inflight", type=int, default=50)
    args = parser.parse_args()
    rows = run_sizes(args.groups, lambda n: run_size(args, n))
    failed = print_table(
        ["groups", "offsets committed/s", "`__consumer_offsets` MiB", "RSS MiB", "fds", "idle CPU",
         "restart until every offset is read back", "RSS after restart"],
        rows, lambda r: f"{r['groups']:,}",
        lambda r: [f"{r['commits_per_s']:,.0f}", f"{r['offsets_mib']:.1f}", f"{r['rss_mib']:.0f}",
                   f"{r['fds']:,}", f"{r['idle_cpu_pct']:.1f}%", f"{r['restart_s']:.1f} s",
                   f"{r['rss_after_restart_mib']:.0f}"])
    sys.exit(1 if failed else 0)

if __name__ == "__main__":
    main()
