"""Consumers caught up on many partitions, with and without fetch sessions
(tests/bench/run.sh fetch-sessions): what a broker pays for a consumer's
fetch round when nothing new arrives, and what crosses the wire.

For each size in --partitions, a fresh broker gets one topic of that many
partitions and one record in each. --consumers fetchers (Fetch v12, the
version kafka-python sends, max_wait_ms --max-wait-ms, min_bytes 1), each
on its own connection and thread, stand at the log end of every partition
and fetch in a loop, in alternating windows of --seconds on the same
broker:

- full: every request names every partition (session_epoch -1, as
  librdkafka and clients without sessions send);
- session: a full fetch opens a session (epoch 0), then every request is
  incremental and names nothing (KIP-227), as kafka-python sends once its
  positions stop moving.

Reported per size and mode: broker CPU (% of a core and ms per fetch
round), rounds per second, bytes sent and received per round. Asserts that
every answer carries no error and, in session mode, no partition (nothing
new arrived), and that the session's answers keep its id.
"""

import argparse
import pathlib
import socket
import sys
import threading
import time

from kafka.protocol.consumer import FetchRequest
from kafka.protocol.parser import KafkaProtocol
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka import Producer
from procs import (broker_arguments, cpu_seconds, free_port, fresh_dir, print_table,  # noqa: E402
                   run_sizes, start_broker, stop_broker)

TOPIC = "fetch-sessions-bench"
VERSION = 12
_FetchTopic = FetchRequest.FetchTopic
_FetchPartition = _FetchTopic.FetchPartition


def fetch(partitions, session_id, epoch, max_wait_ms):
    named = [_FetchPartition(partition=p, current_leader_epoch=-1, fetch_offset=1,
                             last_fetched_epoch=-1, log_start_offset=-1,
                             partition_max_bytes=1 << 20)
             for p in range(partitions)]
    topics = [_FetchTopic(topic=TOPIC, partitions=named)] if named else []
    return FetchRequest[VERSION](replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
                                 max_bytes=50 << 20, isolation_level=0, session_id=session_id,
                                 session_epoch=epoch, topics=topics, forgotten_topics_data=[],
                                 rack_id="")


class Fetcher:
    """One connection fetching in a loop; counts rounds and bytes."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.settimeout(60)
        self.proto = KafkaProtocol(client_id="samsa-bench")
        self.rounds = self.sent = self.received = 0

    def call(self, request):
        self.proto.send_request(request)
        data = self.proto.send_bytes()
        self.sock.sendall(data)
        self.sent += len(data)
        while True:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.received += len(chunk)
            answers = self.proto.receive_bytes(chunk)
            if answers:
                self.rounds += 1
                return answers[0][1]

    def loop(self, mode, partitions, max_wait_ms, stop, errors):
        try:
            if mode == "full":
                request = fetch(partitions, 0, -1, max_wait_ms)
                while not stop.is_set():
                    answer = self.call(request)
                    bad = [(t.topic, p.partition_index, p.error_code) for t in answer.responses
                           for p in t.partitions if p.error_code]
                    if answer.error_code or bad:
                        raise RuntimeError(f"full fetch: {answer.error_code} {bad[:5]}")
                return
            opened = self.call(fetch(partitions, 0, 0, max_wait_ms))
            if opened.error_code or opened.session_id == 0:
                raise RuntimeError(f"no session: error {opened.error_code}")
            session, epoch = opened.session_id, 1
            while not stop.is_set():
                answer = self.call(fetch(0, session, epoch, max_wait_ms))
                named = sum(len(t.partitions) for t in answer.responses)
                if answer.error_code or answer.session_id != session or named:
                    raise RuntimeError(f"incremental fetch: error {answer.error_code}, "
                                       f"session {answer.session_id}, {named} partitions")
                epoch += 1
            # Close the session, as a consumer leaving does.
            self.call(fetch(0, session, -1, max_wait_ms))
        except Exception as e:  # reported by the main thread
            errors.append(f"{mode}: {e}")


def window(args, port, pid, partitions, mode):
    fetchers = [Fetcher(port) for _ in range(args.consumers)]
    stop, errors = threading.Event(), []
    threads = [threading.Thread(target=f.loop, args=(mode, partitions, args.max_wait_ms, stop, errors))
               for f in fetchers]
    for t in threads:
        t.start()
    # The first round of each (the full fetch, or the session's opening)
    # is not what this measures: count from when each has done one.
    while any(f.rounds == 0 for f in fetchers) and not errors:
        time.sleep(0.01)  # waiting for other threads' first answers
    base = [(f.rounds, f.sent, f.received) for f in fetchers]
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(args.seconds)  # the measured window
    cpu, elapsed = cpu_seconds(pid) - cpu0, time.monotonic() - t0
    after = [(f.rounds, f.sent, f.received) for f in fetchers]
    stop.set()
    for t in threads:
        t.join()
    for f in fetchers:
        f.sock.close()
    if errors:
        raise RuntimeError("; ".join(errors))
    rounds = sum(a[0] - b[0] for a, b in zip(after, base))
    sent = sum(a[1] - b[1] for a, b in zip(after, base))
    received = sum(a[2] - b[2] for a, b in zip(after, base))
    return {"cpu_pct": cpu / elapsed * 100, "rounds_s": rounds / elapsed,
            "cpu_ms_round": cpu * 1000 / max(rounds, 1),
            "sent_round": sent / max(rounds, 1), "received_round": received / max(rounds, 1)}


def run(args, partitions):
    data = fresh_dir(pathlib.Path(args.dir) / f"p{partitions}")
    port = free_port()
    log = open(data.parent / f"p{partitions}.log", "wb")
    proc = start_broker(args.samsa, data / "data", port, log, args.set)
    try:
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, partitions, 1)], request_timeout=300)[TOPIC].result()
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "linger.ms": 20})
        for p in range(partitions):
            producer.produce(TOPIC, b"x", partition=p)
            producer.poll(0)
        if producer.flush(120) != 0:
            raise RuntimeError("records not acknowledged")
        row = {"partitions": partitions, "windows": []}
        for i in range(args.windows):
            modes = args.modes.split(",")
            for mode in (modes if i % 2 == 0 else modes[::-1]):
                row["windows"].append((mode, window(args, port, proc.pid, partitions, mode)))
        return row
    except Exception as e:  # one size failing still prints the others
        return {"partitions": partitions, "error": str(e)}
    finally:
        stop_broker(proc, "clean")
        log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    broker_arguments(parser)
    parser.add_argument("--partitions", default="1000,10000")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--windows", type=int, default=2,
                        help="windows per mode, alternating which goes first")
    parser.add_argument("--max-wait-ms", type=int, default=500)
    parser.add_argument("--modes", default="full,session",
                        help="which of full and session to measure")
    args = parser.parse_args()
    sizes = run_sizes(args.partitions, lambda n: run(args, n))
    rows = []
    for size in sizes:
        if "error" in size:
            rows.append(size)
            continue
        for mode, w in size["windows"]:
            rows.append({"partitions": size["partitions"], "mode": mode, **w})
    failed = print_table(
        ["partitions", "mode", "broker CPU", "ms CPU / round", "rounds/s",
         "bytes sent / round", "bytes received / round"],
        rows, lambda r: f"{r['partitions']:,}",
        lambda r: [r["mode"], f"{r['cpu_pct']:.1f}%", f"{r['cpu_ms_round']:.2f}",
                   f"{r['rounds_s']:.1f}", f"{r['sent_round']:,.0f}",
                   f"{r['received_round']:,.0f}"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
