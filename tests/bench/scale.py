"""Scale benchmark, partitions per broker (tests/bench/run.sh scale): how a
single node's cost grows with the partitions it hosts.

For each size in --partitions, a fresh broker gets that many partitions
(topics of at most 2,500 partitions; Kafka's guidance is a few thousand per
broker) and a confluent-kafka producer (acks=all, idempotent, linger 5 ms)
sends --records records of 1 KiB spread evenly over them, round robin (at
least one per partition). Reported per size:

- create: how long CreateTopics took, and whether every topic was created;
- produce: records/s of that flood; then p50/p99 of the time from
  produce() to the delivery report (librdkafka's own per-message
  latency) of a paced producer (--rate records/s for --latency-seconds,
  round robin over every partition), so the figure is not the flood's
  queue; and the CPU of the broker (per record) and of this client
  process (librdkafka's threads included) over that paced phase, since
  both share the machine's cores and either can be what the latency
  waits for;
- the bytes of its data directory, and the broker's resident memory and
  open file descriptors after producing,
  and its CPU while idle for --idle-seconds, --settle-seconds after the
  last write (per-partition timers and tasks show up here);
- restart: the broker is SIGKILLed and started again; the time until an
  idempotent producer has a record acknowledged by the last partition of
  every topic (every partition is recovered before the broker serves), and
  memory and descriptors then.

Prints a Markdown table. Asserts nothing but that every record was
acknowledged; a size that cannot be served is reported with its error.
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from procs import (broker_arguments, cpu_seconds, free_port, fresh_dir, idle_cpu_pct, open_fds,  # noqa: E402
                   print_table, rss_mib, run_sizes, start_broker, stop_broker)

TOPIC_PARTITIONS_MAX = 2500
VALUE = b"x" * 1024


def topic_sizes(partitions):
    sizes = []
    while partitions > 0:
        sizes.append(min(partitions, TOPIC_PARTITIONS_MAX))
        partitions -= sizes[-1]
    return sizes


def create_topics(bootstrap, sizes):
    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    topics = [NewTopic(f"scale-{i}", n, 1) for i, n in enumerate(sizes)]
    start = time.monotonic()
    errors = []
    for name, future in admin.create_topics(topics, request_timeout=600,
                                            operation_timeout=600).items():
        try:
            future.result(timeout=600)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            errors.append(f"{name}: {e}")
    return time.monotonic() - start, errors


def producer(bootstrap):
    return Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                     "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                     "queue.buffering.max.messages": 1000000,
                     "message.timeout.ms": 120000})


def every_partition(sizes):
    while True:
        for t, n in enumerate(sizes):
            for partition in range(n):
                yield f"scale-{t}", partition


def own_cpu_seconds():
    t = os.times()
    return t.user + t.system


def produce(bootstrap, sizes, per_partition, rate, latency_seconds, broker_pid):
    p = producer(bootstrap)
    latencies, failed = [], []

    def delivered(err, msg):
        if err is not None:
            failed.append(err)
        else:
            latencies.append(msg.latency())

    targets = every_partition(sizes)
    total = per_partition * sum(sizes)
    start = time.monotonic()
    for _ in range(total):
        topic, partition = next(targets)
        while True:
            try:
                p.produce(topic, VALUE, partition=partition, on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.01)
    left = p.flush(300)
    elapsed = time.monotonic() - start
    if left or failed:
        return None, f"{left} unacknowledged, {len(failed)} failed: {failed[:3]}"
    flood = len(latencies) / elapsed
    latencies.clear()
    broker_cpu, client_cpu = cpu_seconds(broker_pid), own_cpu_seconds()
    start = time.monotonic()
    for sent in range(int(rate * latency_seconds)):
        due = start + sent / rate
        while (now := time.monotonic()) < due:
            p.poll(min(due - now, 0.01))  # pacing: the next record is due then
        topic, partition = next(targets)
        p.produce(topic, VALUE, partition=partition, on_delivery=delivered)
    left = p.flush(300)
    paced_s = time.monotonic() - start
    broker_cpu, client_cpu = cpu_seconds(broker_pid) - broker_cpu, own_cpu_seconds() - client_cpu
    if left or failed:
        return None, f"paced: {left} unacknowledged, {len(failed)} failed: {failed[:3]}"
    latencies.sort()
    return {
        "paced_broker_us": broker_cpu / len(latencies) * 1e6,
        "paced_client_pct": client_cpu / paced_s * 100,
        "records_per_s": flood,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }, None


def first_acks(bootstrap, sizes, deadline):
    """Waits until the last partition of every topic acknowledges a record."""
    p = producer(bootstrap)
    pending = {f"scale-{t}": n - 1 for t, n in enumerate(sizes)}
    while pending and time.monotonic() < deadline:
        acked = []
        for topic, partition in pending.items():
            p.produce(topic, VALUE, partition=partition,
                      on_delivery=lambda e, m: acked.append(m.topic()) if e is None else None)
        p.flush(max(1.0, deadline - time.monotonic()))
        for topic in acked:
            pending.pop(topic, None)
    return not pending


def run_size(binary, directory, partitions, per_partition, args):
    data = fresh_dir(directory) / "data"
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    row = {"partitions": partitions}
    with open(directory / "broker.log", "ab") as log:
        proc = start_broker(binary, data, port, log, args.set)
        try:
            sizes = topic_sizes(partitions)
            row["create_s"], errors = create_topics(bootstrap, sizes)
            if errors:
                row["error"] = "; ".join(errors)[:300]
                return row
            produced, error = produce(bootstrap, sizes, per_partition, args.rate,
                                      args.latency_seconds, proc.pid)
            if error:
                row["error"] = error
                return row
            row.update(produced)
            row["rss_mib"], row["fds"] = rss_mib(proc.pid), open_fds(proc.pid)
            row["data_gib"] = sum(f.stat().st_size for f in data.rglob("*") if f.is_file()) / 2**30
            # The first high-watermark checkpoints (every 5 s) and flushes
            # of rolled segments follow the writes: idle means after them.
            time.sleep(args.settle_seconds)
            row["idle_cpu_pct"] = idle_cpu_pct(proc.pid, args.idle_seconds)
            stop_broker(proc, "kill")
            start = time.monotonic()
            proc = start_broker(binary, data, port, log, args.set)
            if not first_acks(bootstrap, sizes, start + 600):
                row["error"] = "no acknowledgement from every topic within 600 s after restart"
                return row
            row["restart_s"] = time.monotonic() - start
            row["rss_after_restart_mib"] = rss_mib(proc.pid)
            row["fds_after_restart"] = open_fds(proc.pid)
        finally:
            proc.kill()
            proc.wait()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    broker_arguments(parser)
    parser.add_argument("--partitions", default="10,1000,10000")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--settle-seconds", type=float, default=12.0)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    args = parser.parse_args()
    rows = run_sizes(args.partitions, lambda n: run_size(
        args.samsa, pathlib.Path(args.dir) / f"p{n}", n, max(1, args.records // n), args))
    failed = print_table(
        ["partitions", "create", "records/s", "paced p50 / p99 ms",
         "paced: broker CPU µs/record, client CPU", "data GiB", "RSS MiB", "fds",
         "idle CPU", "restart", "RSS / fds after restart"],
        rows, lambda r: f"{r['partitions']:,}",
        lambda r: [f"{r['create_s']:.1f} s", f"{r['records_per_s']:,.0f}",
                   f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f}",
                   f"{r['paced_broker_us']:.0f} µs, {r['paced_client_pct']:.0f}%", f"{r['data_gib']:.2f}",
                   f"{r['rss_mib']:.0f}", f"{r['fds']:,}", f"{r['idle_cpu_pct']:.1f}%",
                   f"{r['restart_s']:.1f} s",
                   f"{r['rss_after_restart_mib']:.0f} / {r['fds_after_restart']:,}"])
    sys.exit(1 if failed else 0)

if __name__ == "__main__":
    main()
