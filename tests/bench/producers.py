"""Scale benchmark, idempotent producers per broker (tests/bench/run.sh
producers): what a single node pays for the producer ids it keeps
idempotence state for, and how long that state takes to come back.

A fresh broker gets one topic of --partitions partitions. For each size in
--producers, that many producer ids are taken (InitProducerId, as an
idempotent producer starts) and each writes one batch of one 100-byte
record, sequence 0, acks=all, to partition id % partitions. The requests are
kafka-python's protocol messages (kafka.protocol: InitProducerId v4,
Produce v9, the v2 record batch builder) on one socket, --inflight
requests pipelined, one batch per partition per request: librdkafka and
kafka-python's producers take one producer id per client instance, and a
hundred thousand instances would measure the client. Reported per size:

- producer ids taken/s and first batches written/s;
- the broker's resident memory after writing; its CPU while idle for
  --idle-seconds;
- a clean stop (SIGTERM): how long it took and the bytes of producer
  snapshots it left; then a start, until every producer's batch, sent
  again, is answered as a duplicate with its first offset (the state was
  loaded, nothing was appended twice);
- a SIGKILL, and the same check after the next start (the state comes
  from the snapshots and the log written since).

With --transactional the ids are transactional ids instead: each takes
its producer id (InitProducerId to the transaction coordinator, which
writes it to `__transaction_state`), and after each restart takes it again
until every one has the same producer id at a newer epoch.

Prints a Markdown table; exits non-zero if a batch sent again was
appended instead of recognised.
"""

import argparse
import pathlib
import sys
import time

from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest
from kafka.record.default_records import DefaultRecordBatchBuilder
from procs import (Connection, broker_arguments, free_port, fresh_dir, idle_cpu_pct,  # noqa: E402
                   print_table, rss_mib, run_sizes, start_broker, stop_broker)

TOPIC = "producers-bench"
VALUE = b"x" * 100
Topic = ProduceRequest[9].TopicProduceData
Partition = Topic.PartitionProduceData


def batch(producer_id, epoch):
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=0, batch_size=1 << 16)
    builder.append(0, int(time.time() * 1000), None, VALUE, [])
    return bytes(builder.build())


def produce_requests(batches, partitions):
    """One request per `partitions` producers, each producer's batch to
    partition id % partitions (one batch per partition per request)."""
    requests, order = [], []
    for start in range(0, len(batches), partitions):
        chunk = batches[start:start + partitions]
        requests.append(ProduceRequest[9](
            transactional_id=None, acks=-1, timeout_ms=60000,
            topic_data=[Topic(name=TOPIC, partition_data=[
                Partition(index=i % partitions, records=records)
                for i, (_, records) in enumerate(chunk)])]))
        order.append([producer for producer, _ in chunk])
    return requests, order


def offsets_of(answers, order):
    """{producer: (error, base offset)} from produce answers."""
    result = {}
    for answer, producers in zip(answers, order):
        by_index = {p.index: p for p in answer.responses[0].partition_responses}
        for i, producer in enumerate(producers):
            p = by_index[i]
            result[producer] = (p.error_code, p.base_offset)
    return result


def wait_serving(port, deadline):
    while time.monotonic() < deadline:
        try:
            return Connection(port, 1)
        except OSError:
            time.sleep(0.05)  # the listener is not bound yet
    raise RuntimeError("broker did not listen again")


def resend_until_recognised(port, requests, order, first, deadline, inflight):
    """Sends every first batch again until each is answered as its
    duplicate; returns the producers whose batch was appended again."""
    while time.monotonic() < deadline:
        conn = wait_serving(port, deadline)
        conn.inflight = inflight
        try:
            again = offsets_of(conn.pipeline(requests), order)
        except (OSError, ConnectionError):
            continue  # the broker is still starting
        finally:
            conn.close()
        if any(error != 0 for error, _ in again.values()):
            time.sleep(0.05)  # partitions still opening (retriable errors)
            continue
        return [p for p, answer in again.items() if answer != first[p]]
    raise RuntimeError("producers' batches not answered within the deadline")


RETRIABLE_COORDINATOR_ERRORS = (14, 15, 16)  # load in progress, not available, not coordinator


def init_producer_ids(port, names, inflight, deadline):
    """InitProducerId for every name (None: idempotent), again for those
    answered with a retriable coordinator error, until all succeed."""
    answers = [None] * len(names)
    todo = list(range(len(names)))
    while todo:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(todo)} InitProducerId not answered within the deadline")
        try:
            conn = wait_serving(port, deadline)
            conn.inflight = inflight
            got = conn.pipeline([
                InitProducerIdRequest[4](transactional_id=names[i], transaction_timeout_ms=60000,
                                         producer_id=-1, producer_epoch=-1)
                for i in todo])
            conn.close()
        except (OSError, ConnectionError):
            continue  # the broker is still starting
        for i, answer in zip(todo, got):
            if answer.error_code not in RETRIABLE_COORDINATOR_ERRORS:
                answers[i] = answer
        todo = [i for i in todo if answers[i] is None]
        if todo:
            time.sleep(0.05)  # the coordinator is loading its state
    failed = [a for a in answers if a.error_code]
    if failed:
        raise RuntimeError(f"InitProducerId failed: {failed[0]}")
    return answers


def run_transactional(args, count):
    """Transactional ids: each takes its producer id once; after a clean
    stop and after a SIGKILL, taking it again must give the same producer
    id at the next epoch (the coordinator loaded its state)."""
    directory = fresh_dir(pathlib.Path(args.dir) / f"t{count}")
    data = directory / "data"
    port = free_port()
    names = [f"bench-txn-{i}" for i in range(count)]
    row = {"producers": count}
    with open(directory / "broker.log", "ab") as log:
        proc = start_broker(args.samsa, data, port, log, args.set)
        try:
            init_producer_ids(port, names[:1], 1, time.monotonic() + 120)  # state topic created
            start = time.monotonic()
            first = init_producer_ids(port, names[1:], args.inflight, start + 600)
            row["inits_per_s"] = (count - 1) / (time.monotonic() - start)
            row["rss_mib"] = rss_mib(proc.pid)
            row["idle_cpu_pct"] = idle_cpu_pct(proc.pid, args.idle_seconds)
            row["state_mib"] = sum(f.stat().st_size for d in data.glob("__transaction_state-*")
                                   for f in d.rglob("*") if f.is_file()) / 2**20
            for how in ("clean", "kill"):
                stopped = stop_broker(proc, how)
                row.setdefault("stop_s", stopped)  # the clean stop's (first)
                start = time.monotonic()
                proc = start_broker(args.samsa, data, port, log, args.set)
                again = init_producer_ids(port, names[1:], args.inflight, start + 600)
                row[f"{how}_restart_s"] = time.monotonic() - start
                row[f"{how}_rss_mib"] = rss_mib(proc.pid)
                lost = [name for name, a, b in zip(names[1:], first, again)
                        if b.producer_id != a.producer_id or b.producer_epoch <= a.producer_epoch]
                if lost:
                    row["error"] = (f"after the {how} restart {len(lost)} transactional ids "
                                    f"got a new producer id or no newer epoch (e.g. {lost[0]})")
                    return row
                first = again
        finally:
            proc.kill()
            proc.wait()
    return row


def snapshot_bytes(data):
    return sum(f.stat().st_size for f in data.rglob("*.snapshot"))


def run_size(args, producers):
    directory = fresh_dir(pathlib.Path(args.dir) / f"p{producers}")
    data = directory / "data"
    port = free_port()
    row = {"producers": producers}
    with open(directory / "broker.log", "ab") as log:
        proc = start_broker(args.samsa, data, port, log, args.set)
        try:
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}",
                                 "broker.address.family": "v4"})
            for f in admin.create_topics([NewTopic(TOPIC, args.partitions, 1)]).values():
                f.result(timeout=60)
            conn = Connection(port, args.inflight)
            start = time.monotonic()
            ids = conn.pipeline([
                InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000,
                                         producer_id=-1, producer_epoch=-1)
                for _ in range(producers)])
            row["inits_per_s"] = producers / (time.monotonic() - start)
            if any(a.error_code for a in ids):
                row["error"] = f"InitProducerId failed: {ids[0]}"
                return row
            batches = [(a.producer_id, batch(a.producer_id, a.producer_epoch)) for a in ids]
            requests, order = produce_requests(batches, args.partitions)
            start = time.monotonic()
            first = offsets_of(conn.pipeline(requests), order)
            row["writes_per_s"] = producers / (time.monotonic() - start)
            conn.close()
            if any(error for error, _ in first.values()):
                row["error"] = "a first batch failed"
                return row
            row["rss_mib"] = rss_mib(proc.pid)
            row["idle_cpu_pct"] = idle_cpu_pct(proc.pid, args.idle_seconds)
            for how in ("clean", "kill"):
                stopped = stop_broker(proc, how)
                # The clean stop (first) is the one whose time and snapshots count.
                row.setdefault("stop_s", stopped)
                row.setdefault("snapshot_mib", snapshot_bytes(data) / 2**20)
                start = time.monotonic()
                proc = start_broker(args.samsa, data, port, log, args.set)
                appended = resend_until_recognised(port, requests, order, first, start + 600,
                                                   args.inflight)
                row[f"{how}_restart_s"] = time.monotonic() - start
                row[f"{how}_rss_mib"] = rss_mib(proc.pid)
                if appended:
                    row["error"] = (f"after the {how} restart {len(appended)} batches sent again "
                                    f"were appended, not recognised (e.g. producer {appended[0]})")
                    return row
        finally:
            proc.kill()
            proc.wait()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    broker_arguments(parser)
    parser.add_argument("--producers", default="1000,10000,100000")
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--transactional", action="store_true",
                        help="transactional ids instead: InitProducerId only, and after each "
                        "restart the same producer id at a newer epoch")
    args = parser.parse_args()
    rows = run_sizes(args.producers, lambda n: run_transactional(args, n) if args.transactional
                     else run_size(args, n))
    if args.transactional:
        failed = print_table(
            ["transactional ids", "taken/s", "RSS MiB", "idle CPU", "`__transaction_state` MiB",
             "clean stop", "restart after a clean stop", "restart after SIGKILL",
             "RSS after restart"],
            rows, lambda r: f"{r['producers']:,}",
            lambda r: [f"{r['inits_per_s']:,.0f}", f"{r['rss_mib']:.0f}",
                       f"{r['idle_cpu_pct']:.1f}%", f"{r['state_mib']:.1f}", f"{r['stop_s']:.1f} s",
                       f"{r['clean_restart_s']:.1f} s", f"{r['kill_restart_s']:.1f} s",
                       f"{r['kill_rss_mib']:.0f}"])
    else:
        failed = print_table(
            ["producer ids", "taken/s", "first batches/s", "RSS MiB", "idle CPU", "clean stop",
             "snapshots MiB", "restart after a clean stop", "restart after SIGKILL",
             "RSS after restart"],
            rows, lambda r: f"{r['producers']:,}",
            lambda r: [f"{r['inits_per_s']:,.0f}", f"{r['writes_per_s']:,.0f}",
                       f"{r['rss_mib']:.0f}", f"{r['idle_cpu_pct']:.1f}%", f"{r['stop_s']:.1f} s",
                       f"{r['snapshot_mib']:.1f}", f"{r['clean_restart_s']:.1f} s",
                       f"{r['kill_restart_s']:.1f} s", f"{r['kill_rss_mib']:.0f}"])
    sys.exit(1 if failed else 0)

if __name__ == "__main__":
    main()
