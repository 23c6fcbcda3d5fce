"""Reassignment benchmark (tests/bench/run.sh reassign): how fast a
reassignment moves data, with and without the replication throttle, and
what a producer of another topic sees meanwhile, in one run.

`samsa dev --nodes 4`. Topic `bulk` (6 partitions, RF 3, on brokers 1-3)
is filled with BULK_MB (default 2000) of 1 KiB text records (`samsa bench produce`);
topic `live` (6 partitions, RF 3, on brokers 1-3) takes a steady
confluent-kafka producer (RATE records/s of 1 KiB, acks=all, idempotent)
whose delivery latencies are recorded. Then, in order:

1. idle: the live producer alone for IDLE_SECONDS;
2. unthrottled: `samsa cluster reassign` moves every `bulk` partition from
   {1,2,3} to {2,3,4} (each partition copied once, to broker 4) while the
   live producer runs; MB/s = one replica's bytes / the move's time;
3. the move back to {1,2,3} (not measured);
4. throttled: the same move with `--throttle THROTTLE` (bytes/s, leader
   and follower rates; default 50 MB/s).

The bytes on broker 4 after each move are printed beside it, so a move
that finished without copying would show.

Prints a Markdown table. Asserts nothing but that every live record was
acknowledged and every move finished.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

from confluent_kafka import Producer


def samsa(binary, *args, timeout=3600):
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"samsa {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def plan_file(path, topic, partitions, brokers):
    rotations = [brokers[i:] + brokers[:i] for i in range(len(brokers))]
    plan = {"version": 1, "partitions": [
        {"topic": topic, "partition": p, "replicas": rotations[p % len(rotations)]}
        for p in range(partitions)]}
    path.write_text(json.dumps(plan))
    return str(path)


class LiveProducer:
    """RATE records/s to `live`; delivery latency of each, in ms."""

    def __init__(self, bootstrap, rate):
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                  "enable.idempotence": True, "linger.ms": 5})
        self.rate, self.latencies, self.errors = rate, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.value = b"v" * 1024

    def run(self):
        sent, start = 0, time.monotonic()
        while not self.stop.is_set():
            due = start + sent / self.rate
            now = time.monotonic()
            if now < due:
                time.sleep(min(due - now, 0.01))
                continue
            t0 = time.monotonic()

            def done(err, _msg, t0=t0):
                if err is not None:
                    self.errors.append(str(err))
                else:
                    self.latencies.append((time.monotonic() - t0) * 1000)

            self.producer.produce("live", self.value, partition=sent % 6, on_delivery=done)
            self.producer.poll(0)
            sent += 1
        self.producer.flush(60)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def summary(self):
        lat = sorted(self.latencies)
        if not lat:
            return "-", "-", "-"
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
        return f"{pct(0.5):.1f}", f"{pct(0.99):.1f}", f"{lat[-1]:.1f}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--port", type=int, default=29092)
    parser.add_argument("--bulk-mb", type=int, default=int(os.environ.get("BULK_MB", "2000")))
    parser.add_argument("--throttle", type=int, default=int(os.environ.get("THROTTLE", "50000000")))
    parser.add_argument("--rate", type=int, default=int(os.environ.get("RATE", "2000")))
    parser.add_argument("--idle-seconds", type=int, default=15)
    args = parser.parse_args()
    base = pathlib.Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    p = args.port
    bootstrap = ",".join(f"127.0.0.1:{p + 100 * i}" for i in range(4))
    log = open(base / "cluster.log", "wb")
    dev = subprocess.Popen([args.samsa, "dev", "--nodes", "4", "--port", str(p),
                            "--controller-port", str(p + 1), "--http-port", str(p + 2),
                            "--data-dir", str(base / "data")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            r = subprocess.run([args.samsa, "topic", "create", "ready", "--partitions", "1",
                                "--replication-factor", "3", "-b", bootstrap],
                               capture_output=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not start")
            time.sleep(0.2)
        for topic in ["bulk", "live"]:
            samsa(args.samsa, "topic", "create", topic, "--partitions", "6",
                  "--replication-factor", "3", "-b", bootstrap)
            samsa(args.samsa, "cluster", "reassign", "-b", bootstrap, "--plan",
                  plan_file(base / f"{topic}-123.json", topic, 6, [1, 2, 3]))
        records = args.bulk_mb * 1024
        samsa(args.samsa, "bench", "produce", "-b", bootstrap, "--topic", "bulk",
              "--records", str(records), "--record-size", "1024", "--partitions", "6",
              "--acks", "all", "--payload", "text")
        def bulk_bytes_on(node):
            return sum(f.stat().st_size for f in (base / "data" / f"node-{node}").rglob("*.log")
                       if f.parent.name.startswith("bulk-"))
        bulk_bytes = bulk_bytes_on(1)
        # The fill's dirty pages are written back before anything is timed.
        os.sync()
        time.sleep(5)
        to_new = plan_file(base / "bulk-234.json", "bulk", 6, [2, 3, 4])
        back = plan_file(base / "bulk-123b.json", "bulk", 6, [1, 2, 3])
        print(f"## samsa reassignment benchmark {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
        print()
        print(f"`samsa dev --nodes 4`; `bulk`: 6 partitions, RF 3, {bulk_bytes / 1e6:.0f} MB per "
              f"replica; `live`: {args.rate} records/s of 1 KiB, acks=all, idempotent.")
        print()
        print(f"load before: {os.getloadavg()[0]:.2f}")
        print()
        print("| phase | moved MB | seconds | MB/s | on broker 4 after, MB | live p50 ms | live p99 ms | live max ms | live records |")
        print("|---|---|---|---|---|---|---|---|---|")
        with LiveProducer(bootstrap, args.rate) as live:
            time.sleep(args.idle_seconds)
        p50, p99, mx = live.summary()
        print(f"| idle (no move) | - | {args.idle_seconds} | - | - | {p50} | {p99} | {mx} | {len(live.latencies)} |")
        for name, extra in [("unthrottled", []), (f"throttled {args.throttle / 1e6:.0f} MB/s",
                                                   ["--throttle", str(args.throttle)])]:
            with LiveProducer(bootstrap, args.rate) as live:
                t0 = time.monotonic()
                samsa(args.samsa, "cluster", "reassign", "-b", bootstrap, "--plan", to_new,
                      "--timeout", "3600", *extra)
                took = time.monotonic() - t0
            p50, p99, mx = live.summary()
            if live.errors:
                raise RuntimeError(f"live producer errors: {live.errors[:5]}")
            print(f"| {name} | {bulk_bytes / 1e6:.0f} | {took:.1f} | {bulk_bytes / 1e6 / took:.1f} "
                  f"| {bulk_bytes_on(4) / 1e6:.0f} | {p50} | {p99} | {mx} | {len(live.latencies)} |")
            samsa(args.samsa, "cluster", "reassign", "-b", bootstrap, "--plan", back,
                  "--timeout", "3600")
            # Broker 4 deletes its copies when it applies the move back; the
            # next move must copy everything again, not find them there (a
            # broker that applies only the later image keeps its copy: the
            # follower protocol resumes it, which is right but not a copy).
            deadline = time.monotonic() + 120
            while any((base / "data" / "node-4").glob("bulk-*")):
                if time.monotonic() > deadline:
                    raise RuntimeError("broker 4 kept its copies of bulk")
                time.sleep(0.1)
        print()
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        dev.terminate()
        try:
            dev.wait(30)
        except subprocess.TimeoutExpired:
            dev.kill()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
