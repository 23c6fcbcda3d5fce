"""Cleaner benchmark (tests/bench/run.sh cleaner): the log cleaner's rate on
a log whose keys fill a good part of its offset map, and what a cleaning
pass costs a producer of another topic while it runs, in one run.

One broker. Two topics of one partition are filled first with DIRTY_RECORDS
keyed 1 KiB records over KEYS distinct keys (`samsa bench produce --keys`),
while their policy is still `delete`, so nothing is cleaned yet. Then, for
each configuration:

1. baseline: `samsa bench produce` (PRODUCE_RECORDS × 1 KiB, acks=all,
   idempotent) to a third topic, with the cleaner idle;
2. the same, started right after one dirty topic is switched to
   `cleanup.policy=compact` at run time (`samsa config set`), so the
   cleaner compacts it while the producer runs; once unthrottled, once with
   `log.cleaner.io.max.bytes.per.second` set (dynamically) to THROTTLE.

The cleaner's passes come from the broker's own log line ("log cleaner
compacted partition": bytes read and written, keys, time). The produce run
is checked to have ended before the cleaning did (otherwise part of it ran
beside an idle cleaner, and the row says so). Prints a Markdown table;
asserts nothing except that every record was acknowledged.
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
from procs import free_port  # noqa: E402


class Broker:
    def __init__(self, binary, data, settings):
        self.binary, self.data, self.settings = binary, data, settings
        self.port = free_port()
        self.log = data.parent / "broker.log"
        args = [binary, "server", "--listen", self.bootstrap, "--data-dir", str(data),
                "--set", "http_listen=127.0.0.1:0"]
        for s in settings:
            args += ["--set", s]
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(args, stdout=out, stderr=out, env={**os.environ, "RUST_LOG": "info"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)  # the listener is not bound yet
        raise RuntimeError("broker did not start")

    @property
    def bootstrap(self):
        return f"127.0.0.1:{self.port}"

    def passes(self, topic):
        """(monotonic-ish order) every cleaner pass logged for topic-0: (bytes_read, bytes_written, keys, took_ms)."""
        pattern = re.compile(rf"log cleaner compacted partition partition={re.escape(topic)}-0 .*"
                             r"bytes_read=(\d+) bytes_written=(\d+) .*keys=(\d+) took_ms=(\d+)")
        lines = self.log.read_text(errors="replace").splitlines()
        return [tuple(map(int, m.groups())) for m in map(pattern.search, lines) if m]

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def samsa(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"samsa {' '.join(args)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


SUMMARY = re.compile(r"(\d+) records sent, (\d+) failed, ([\d.]+) records/sec \(([\d.]+) MB/sec\), .* "
                     r"([\d.]+) ms 50th, ([\d.]+) ms 99th")


def produce(binary, broker, topic, records, keys=None, acks="all"):
    args = ["bench", "produce", "-b", broker.bootstrap, "--topic", topic, "--records", str(records),
            "--record-size", "1024", "--acks", acks]
    if acks == "all":
        args.append("--idempotent")
    if keys:
        args += ["--keys", str(keys)]
    out = samsa(binary, *args)
    m = SUMMARY.search(out)
    if not m:
        raise RuntimeError(f"no summary in {out!r}")
    sent, failed, rate, mbs, p50, p99 = m.groups()
    assert int(failed) == 0 and int(sent) == records, out
    return float(mbs), float(p50), float(p99)


def clean_while_producing(binary, broker, dirty, plain, records):
    """Switches `dirty` to compact and produces to `plain` at once; waits
    for the cleaner to go idle. Returns the produce figures, the cleaner's
    passes and whether cleaning outlasted the producer."""
    before = len(broker.passes(dirty))
    samsa(binary, "config", "set", "-b", broker.bootstrap, "--topic", dirty,
          "cleanup.policy=compact", "min.cleanable.dirty.ratio=0.01")
    started = time.monotonic()
    figures = produce(binary, broker, plain, records)
    produced_for = time.monotonic() - started
    cleaning_ended_during_produce = len(broker.passes(dirty)) > before
    deadline = time.monotonic() + 1800
    first_pass_by = time.monotonic() + 120
    seen = -1
    while time.monotonic() < deadline:
        passes = broker.passes(dirty)[before:]
        if passes and len(passes) == seen:
            break
        if not passes and time.monotonic() > first_pass_by:
            raise RuntimeError(f"no cleaner pass on {dirty} within 120 s (only the active segment is dirty?)")
        seen = len(passes)
        time.sleep(2.0)  # ten cleaner backoffs (200 ms): a further pass would have been logged
    passes = broker.passes(dirty)[before:]
    return figures, passes, produced_for, not cleaning_ended_during_produce


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    # Data kept under ~5 GB: this VM caps its page cache near 6 GB, and
    # writes beyond that pay for reclaim (measured: 270 MB/s idle produce
    # falls to 100-160 MB/s after 4 GB written).
    parser.add_argument("--dirty-records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--produce-records", type=int, default=200_000)
    parser.add_argument("--throttle", type=int, default=50 * 1024 * 1024)
    # Idle runs before the first cleaning (their spread is the noise).
    parser.add_argument("--idle-runs", type=int, default=3)
    # The active segment is never cleaned: a dirty topic needs several closed ones.
    parser.add_argument("--segment-bytes", type=int, default=256 * 1024 * 1024)
    args = parser.parse_args()
    work = pathlib.Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    data.mkdir(parents=True)
    broker = Broker(args.samsa, data, ["log_cleaner_backoff_ms=200"])
    try:
        for topic in ("dirty-a", "dirty-b"):
            samsa(args.samsa, "topic", "create", topic, "--partitions", "1", "-b", broker.bootstrap,
                  "--config", f"segment.bytes={args.segment_bytes}", "--config", "retention.ms=-1")
        samsa(args.samsa, "topic", "create", "plain", "--partitions", "1", "-b", broker.bootstrap)
        fill_started = time.monotonic()
        for topic in ("dirty-a", "dirty-b"):
            produce(args.samsa, broker, topic, args.dirty_records, keys=args.keys, acks="1")
        fill_secs = time.monotonic() - fill_started
        # The fill's writeback (and the broker's fsync of rolled segments)
        # would otherwise weigh on the first measurement.
        os.sync()

        rows = []

        def idle(label):
            mbs, p50, p99 = produce(args.samsa, broker, "plain", args.produce_records)
            rows.append((label, mbs, p50, p99, None, True))

        for _ in range(args.idle_runs):
            idle("cleaner idle")
        for label, dirty, throttle in (("cleaning, unthrottled", "dirty-a", None),
                                       (f"cleaning, throttled to {args.throttle / 1048576:.0f} MiB/s", "dirty-b",
                                        args.throttle)):
            if throttle:
                samsa(args.samsa, "config", "set", "-b", broker.bootstrap, "--broker-defaults",
                      f"log.cleaner.io.max.bytes.per.second={throttle}")
            (mbs, p50, p99), passes, _, covered = clean_while_producing(
                args.samsa, broker, dirty, "plain", args.produce_records)
            rows.append((label, mbs, p50, p99, passes, covered))
            os.sync()
            idle("cleaner idle again")
    finally:
        broker.kill()

    dirty_bytes = args.dirty_records * 1100
    print(f"## Log cleaner: {args.dirty_records:,} records over {args.keys:,} keys per dirty topic "
          f"(~{dirty_bytes / 1e9:.1f} GB), producer of {args.produce_records:,} × 1 KiB "
          f"({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())})")
    print()
    print(f"filling both dirty topics took {fill_secs:.1f} s")
    print()
    print("| while | produce MB/s | p50 ms | p99 ms | cleaner passes | read MB | written MB | keys | cleaner MB/s | cleaning outlasted the producer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, mbs, p50, p99, passes, covered in rows:
        if passes:
            read = sum(p[0] for p in passes)
            written = sum(p[1] for p in passes)
            keys = max(p[2] for p in passes)
            took = sum(p[3] for p in passes) / 1000
            rate = read / 1e6 / took if took else float("inf")
            print(f"| {label} | {mbs:.1f} | {p50:.1f} | {p99:.1f} | {len(passes)} | {read / 1e6:,.0f} | "
                  f"{written / 1e6:,.0f} | {keys:,} | {rate:.0f} | {'yes' if covered else 'no'} |")
        else:
            print(f"| {label} | {mbs:.1f} | {p50:.1f} | {p99:.1f} | – | – | – | – | – | – |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
