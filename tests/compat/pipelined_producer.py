"""A pipelining producer workload: kafka-python producers with up to five
produce requests in flight per connection and several batches of one
partition in flight at once (librdkafka keeps one batch per partition in
flight; see docs/COMPATIBILITY.md, "Pipelining").

Not a pytest module: tests/it/pipelined_clients.rs runs it with the compat
venv's python against samsa processes it starts (and SIGKILLs), then reads
the topic back and feeds the history to the exactly-once checker. By hand,
against any broker:

    python tests/compat/pipelined_producer.py --bootstrap 127.0.0.1:9092 \
        --topic t --partitions 10 --create-topic --history /tmp/h.jsonl

Modes:
- ``transactional``: PRODUCERS producers, each with its own transactional
  id, write TRANSACTIONS transactions of RECORDS records spread round-robin
  over every partition (so each produce request carries batches for many
  partitions). A first attempt is aborted on purpose with probability
  ABORT_RATIO; an attempt that hits an abortable error is aborted and
  retried with new values, as an application would. A transaction counts
  as committed once commit_transaction returned and every record of it was
  acknowledged.
- ``idempotent``: PRODUCERS idempotent producers send TRANSACTIONS *
  RECORDS records each, then flush.
- ``plain``: the same without idempotence (acks=all). kafka-python
  pipelines plain batches as released; nothing is changed in it.

Released kafka-python keeps one batch per partition in flight when
idempotence is on; for the first two modes ``pipeline_partitions`` restores
Java's behaviour (see there). ``--mute-partitions`` keeps kafka-python's.

History (``--history``, JSON lines, one object per event, appended as they
happen; every value is unique in the run):

    {"ev":"send","producer":P,"txn":T|null,"value":V,"partition":N}
    {"ev":"ack","value":V,"partition":N,"offset":O}
    {"ev":"fail","value":V,"error":"ClassName: message"}
    {"ev":"commit","producer":P,"txn":T,"values":[V,...]}
    {"ev":"abort","producer":P,"txn":T,"reason":"random"|"error: ...","values":[V,...]}
    {"ev":"fatal","producer":P,"error":"..."}
    {"ev":"ooos_retried","producer":P,"partition":N,"sequence":S}
    {"ev":"inflight","producer":P,"requests":R,"pipelined_batches":B,
     "max_batches_per_partition":K,"max_requests_per_connection":M}
    {"ev":"end","ok":true|false,"ooos":N,...}

(Every event also has ``t``, the wall-clock time in seconds. ``ooos_retried``:
an OUT_OF_ORDER_SEQUENCE_NUMBER retried because an earlier batch of the
partition was unresolved, see ``pipeline_partitions``; ``inflight``: R
produce requests built; B batches sent while an earlier
batch of the same partition was still unanswered; K the most batches of one
partition in flight at once, M the most requests of one connection.)

Exit status: 0 when every producer finished without a fatal error and no
send failed with OUT_OF_ORDER_SEQUENCE_NUMBER; 3 otherwise (the history is
complete either way). An OUT_OF_ORDER_SEQUENCE_NUMBER is never worked
around: kafka-python recovers from it by bumping the epoch (KIP-360), which
would hide a broker that reorders a connection's batches, so here it ends
the producer like a fatal error.
"""

import argparse
import json
import logging
import random
import sys
import threading
import time

from kafka import KafkaAdminClient, KafkaProducer
from kafka import errors as Errors
from kafka.admin import NewTopic


class History:
    """The JSON-lines history, written from producer and sender threads."""

    def __init__(self, path):
        self._f = open(path, "w", buffering=1 << 20) if path else None
        self._lock = threading.Lock()
        self.ooos = 0
        self.fails = 0
        self.acks = 0

    def write(self, **event):
        if event["ev"] == "fail":
            self.fails += 1
            if "OutOfOrderSequenceNumber" in event["error"]:
                self.ooos += 1
        elif event["ev"] == "ack":
            self.acks += 1
        if self._f is None:
            return
        event["t"] = round(time.time(), 3)
        line = json.dumps(event, separators=(",", ":"))
        with self._lock:
            self._f.write(line + "\n")

    def close(self):
        if self._f is not None:
            with self._lock:
                self._f.close()


def describe(exc):
    return f"{type(exc).__name__}: {exc}"


def pipeline_partitions(producer, on_retried_ooos):
    """Lets ``producer`` keep up to max_in_flight_requests_per_connection
    batches of one partition in flight, with the retry rules Java's producer
    has for that case.

    Released kafka-python cannot pipeline idempotent batches: 2.x refuses
    idempotence with more than one request in flight, and 3.0.0 onwards
    (commit a1582bc, "Enforce guaranteed message order when
    idempotence_enabled") mutes a partition while one of its batches is in
    flight, because its retry path was not made for several. Three private
    behaviours are changed here, each to what Java's producer does:

    - no muting (``guarantee_message_order``);
    - a retried batch goes back into its partition's queue in sequence
      order (Java's ``insertInSequenceOrder``; kafka-python puts each at the
      head, which reverses the batches of a connection that died);
    - OUT_OF_ORDER_SEQUENCE_NUMBER for a batch while a batch of the same
      partition with a lower sequence is unresolved (waiting to be retried
      after a retriable error such as NOT_ENOUGH_REPLICAS,
      NOT_LEADER_OR_FOLLOWER or a dead connection, or still in flight to the
      partition's previous leader) is retried, not fatal (Java's
      ``canRetry``): any broker must refuse the later batch until the
      earlier one is in. ``on_retried_ooos(batch)`` is told of each. An
      OUT_OF_ORDER_SEQUENCE_NUMBER while every earlier batch of the
      partition is acknowledged - a broker that appended a connection's
      batches out of order - goes to kafka-python as before (an epoch bump
      that fails the batch; this script then ends the run).

    Batching, sequence numbers, transactions, the wire protocol and every
    other retry decision are kafka-python's own."""
    sender, acc = producer._sender, producer._accumulator
    sender.config["guarantee_message_order"] = False

    def sequence(batch):
        seq = batch.records.base_sequence
        return None if seq is None or seq < 0 else seq

    def reenqueue_in_sequence_order(batch, now=None):
        batch.retry(now=now)
        seq = sequence(batch)
        with acc._tp_lock(batch.topic_partition):
            dq = acc._batches[batch.topic_partition]
            i = 0
            if seq is not None:
                while i < len(dq) and sequence(dq[i]) is not None and sequence(dq[i]) < seq:
                    i += 1
            dq.insert(i, batch)

    def earlier_batch_unresolved(batch):
        # An earlier batch of the partition waits to be retried, or is still
        # in flight - on another connection: the responses of one
        # connection come in order, so an earlier batch sent on this one has
        # been answered by now.
        seq = sequence(batch)
        if seq is None:
            return False
        tp = batch.topic_partition
        with acc._tp_lock(tp):
            queued = [b for b in acc._batches.get(tp, ()) if b.in_retry()]
        in_flight = [b for _, b in list(sender._in_flight_batches.get(tp, ())) if b is not batch]
        return any(sequence(b) is not None and sequence(b) < seq for b in queued + in_flight)

    complete_batch = sender._complete_batch
    ooos = Errors.OutOfOrderSequenceNumberError.errno

    def complete_batch_retrying_ooos(batch, partition_response):
        tm = sender._transaction_manager
        if (partition_response.error_code == ooos
                and earlier_batch_unresolved(batch)
                and not batch.has_reached_delivery_timeout(acc.delivery_timeout_ms)
                and tm is not None and tm.producer_id_and_epoch.match(batch)):
            on_retried_ooos(batch)
            acc.reenqueue(batch)
            sender._maybe_remove_from_inflight_batches(batch)
            return
        complete_batch(batch, partition_response)

    acc.reenqueue = reenqueue_in_sequence_order
    sender._complete_batch = complete_batch_retrying_ooos


class InflightCounter:
    """Counts, for every produce request the producer's sender builds, how
    many batches of each partition in it are then in flight (this one plus
    earlier ones not yet answered) and how many requests its connection
    then has outstanding. kafka-python keeps both in private state of its
    sender (``_in_flight_batches``: per partition, batches drained and not
    completed) and connections (``in_flight_requests``); this wraps the
    accumulator's ``drain``, which the sender calls right before it pushes
    the drained batches into that state and sends one request per node, so
    every request is counted exactly, from the sender thread, without
    sampling. Written against kafka-python 3.0.12 (pinned in
    requirements.txt)."""

    def __init__(self, producer):
        sender = producer._sender
        self.max_batches_per_partition = 0
        self.max_requests_per_connection = 0
        self.requests = 0
        self.pipelined_batches = 0
        in_flight = sender._in_flight_batches
        conns = getattr(sender._client, "_conns", None)
        if conns is None:
            conns = getattr(getattr(sender._client, "_manager", None), "_conns", {})
        drain = sender._accumulator.drain

        def counting_drain(*args, **kwargs):
            by_node = drain(*args, **kwargs)
            for node_id, batches in by_node.items():
                if not batches:
                    continue
                self.requests += 1
                for b in batches:
                    queue = in_flight.get(b.topic_partition)
                    earlier = len(queue) if queue else 0
                    if earlier:
                        self.pipelined_batches += 1
                    self.max_batches_per_partition = max(self.max_batches_per_partition, earlier + 1)
                conn = conns.get(node_id)
                if conn is not None:
                    self.max_requests_per_connection = max(
                        self.max_requests_per_connection, len(conn.in_flight_requests) + 1)
            return by_node

        sender._accumulator.drain = counting_drain


class Fatal(Exception):
    pass


class Worker(threading.Thread):
    def __init__(self, args, index, history):
        super().__init__(name=f"producer-{index}", daemon=True)
        self.args = args
        self.name_ = f"{args.run_id}p{index}"
        self.history = history
        self.rng = random.Random(args.seed * 1000 + index)
        self.error = None
        self.committed = 0
        self.aborted = 0
        self.sent = 0
        self.counter = None
        # Padding only, to make batches bigger: values stay short so that
        # the history stays small.
        self.key = b"k" * args.key_size if args.key_size else None
        self.started = None
        self.finished = None

    def producer_config(self):
        a = self.args
        c = dict(
            bootstrap_servers=a.bootstrap,
            client_id=self.name_,
            acks="all",
            enable_idempotence=a.mode != "plain",
            max_in_flight_requests_per_connection=a.max_in_flight,
            linger_ms=a.linger_ms,
            batch_size=a.batch_size,
            request_timeout_ms=a.request_timeout_ms,
            delivery_timeout_ms=a.delivery_timeout_ms,
            max_block_ms=a.max_block_ms,
            retry_backoff_ms=100,
            reconnect_backoff_ms=20,
            reconnect_backoff_max_ms=500,
            metadata_max_age_ms=5000,
        )
        if a.mode == "transactional":
            c["transactional_id"] = self.name_
            c["transaction_timeout_ms"] = a.transaction_timeout_ms
        return c

    def run(self):
        try:
            self.producer = KafkaProducer(**self.producer_config())
            if self.args.mode != "plain" and not self.args.mute_partitions:
                pipeline_partitions(self.producer, self.retried_ooos)
            self.counter = InflightCounter(self.producer)
            if self.args.mode == "transactional":
                self.producer.init_transactions()
                self.run_transactional()
            else:
                self.run_idempotent()
            self.finished = time.monotonic()
        except Exception as e:  # noqa: BLE001 - every failure ends the run loudly
            self.error = describe(e)
            self.history.write(ev="fatal", producer=self.name_, error=self.error)
        finally:
            if self.counter is not None:
                c = self.counter
                self.history.write(
                    ev="inflight", producer=self.name_, requests=c.requests,
                    pipelined_batches=c.pipelined_batches,
                    max_batches_per_partition=c.max_batches_per_partition,
                    max_requests_per_connection=c.max_requests_per_connection)
            if getattr(self, "producer", None) is not None:
                try:
                    self.producer.close(timeout=10)
                except Exception as e:  # noqa: BLE001
                    print(f"{self.name_}: close: {describe(e)}", file=sys.stderr)

    def retried_ooos(self, batch):
        self.history.write(ev="ooos_retried", producer=self.name_,
                           partition=batch.topic_partition.partition,
                           sequence=batch.records.base_sequence)

    def send(self, txn, value, partition, acked):
        h = self.history
        h.write(ev="send", producer=self.name_, txn=txn, value=value, partition=partition)
        self.sent += 1

        def on_ack(md, value=value):
            acked.add(value)
            h.write(ev="ack", value=value, partition=md.partition, offset=md.offset)

        def on_fail(exc, value=value):
            h.write(ev="fail", value=value, error=describe(exc))

        if self.started is None:
            self.started = time.monotonic()
        payload = value.encode()
        if len(payload) < self.args.value_size:
            payload += b"." * (self.args.value_size - len(payload))
        fut = self.producer.send(self.args.topic, key=self.key, value=payload, partition=partition)
        fut.add_callback(on_ack)
        fut.add_errback(on_fail)

    def check_ooos(self):
        if self.history.ooos:
            raise Fatal(f"{self.history.ooos} send(s) of this run failed with OUT_OF_ORDER_SEQUENCE_NUMBER")

    def run_transactional(self):
        a = self.args
        tm = self.producer._transaction_manager
        for t in range(a.transactions):
            attempt = 0
            while True:
                attempt += 1
                if attempt > a.max_attempts:
                    raise Fatal(f"transaction {t} did not commit in {a.max_attempts} attempts")
                txn = f"{self.name_}t{t:03d}a{attempt}"
                values, acked = [], set()
                self.producer.begin_transaction()
                try:
                    for i in range(a.records):
                        v = f"{txn}-{i:06d}"
                        values.append(v)
                        self.send(txn, v, i % a.partitions, acked)
                    if attempt == 1 and self.rng.random() < a.abort_ratio:
                        self.producer.flush()
                        self.producer.abort_transaction()
                        self.history.write(ev="abort", producer=self.name_, txn=txn, reason="random", values=values)
                        self.aborted += 1
                        continue
                    self.producer.commit_transaction()
                except Errors.KafkaError as e:
                    self.check_ooos()
                    if tm.has_fatal_error():
                        raise
                    # An abortable error: abort, then retry with new values.
                    self.producer.abort_transaction()
                    self.history.write(ev="abort", producer=self.name_, txn=txn,
                                       reason=f"error: {describe(e)}", values=values)
                    self.aborted += 1
                    continue
                self.check_ooos()
                missing = [v for v in values if v not in acked]
                if missing:
                    raise Fatal(f"{txn} committed but {len(missing)} records have no acknowledgement, e.g. {missing[:3]}")
                self.history.write(ev="commit", producer=self.name_, txn=txn, values=values)
                self.committed += 1
                break

    def run_idempotent(self):
        a = self.args
        acked = set()
        for i in range(a.transactions * a.records):
            self.send(None, f"{self.name_}-{i:07d}", i % a.partitions, acked)
            if i % 1000 == 999:
                self.check_ooos()
        self.producer.flush()
        self.check_ooos()


def create_topic(args):
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap, request_timeout_ms=30000)
    try:
        admin.create_topics([NewTopic(name=args.topic, num_partitions=args.partitions,
                                      replication_factor=args.replication_factor)], timeout_ms=30000)
    finally:
        admin.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, default=10)
    p.add_argument("--create-topic", action="store_true")
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--mode", choices=["transactional", "idempotent", "plain"], default="transactional")
    p.add_argument("--producers", type=int, default=1)
    p.add_argument("--transactions", type=int, default=5)
    p.add_argument("--records", type=int, default=10000, help="records per transaction")
    p.add_argument("--abort-ratio", type=float, default=0.2)
    p.add_argument("--max-attempts", type=int, default=20)
    p.add_argument("--max-in-flight", type=int, default=5)
    p.add_argument("--linger-ms", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--request-timeout-ms", type=int, default=30000)
    p.add_argument("--delivery-timeout-ms", type=int, default=120000)
    p.add_argument("--max-block-ms", type=int, default=60000)
    p.add_argument("--transaction-timeout-ms", type=int, default=60000)
    p.add_argument("--mute-partitions", action="store_true",
                   help="kafka-python as released: one batch per partition in flight (see pipeline_partitions)")
    p.add_argument("--key-size", type=int, default=0, help="bytes of key padding per record")
    p.add_argument("--value-size", type=int, default=0,
                   help="pad every value to this many bytes (the history keeps the unpadded ids, so such a run "
                        "cannot be checked: for benchmarks)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-id", default="", help="prefix of producer names and values")
    p.add_argument("--history", help="JSON-lines history file")
    args = p.parse_args()
    # kafka-python's warnings (retries, coordinator moves, epoch bumps) to
    # stderr, which the tests keep with the history of a failed run.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")

    if args.create_topic:
        create_topic(args)
    history = History(args.history)
    started = time.monotonic()
    workers = [Worker(args, i, history) for i in range(args.producers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    took = time.monotonic() - started
    errors = {w.name_: w.error for w in workers if w.error}
    # Throughput: acknowledged records over the time from the first send to
    # the last producer's end (its last commit or flush), not counting
    # start-up (connections, metadata, init_transactions).
    starts = [w.started for w in workers if w.started is not None]
    ends = [w.finished for w in workers if w.finished is not None]
    produce_s = (max(ends) - min(starts)) if starts and ends and not errors else None
    rate = round(history.acks / produce_s) if produce_s else None
    ok = not errors and history.ooos == 0
    inflight = {w.name_: (w.counter.max_batches_per_partition, w.counter.max_requests_per_connection)
                for w in workers if w.counter}
    history.write(ev="end", ok=ok, ooos=history.ooos, fails=history.fails, acks=history.acks,
                  sent=sum(w.sent for w in workers), committed=sum(w.committed for w in workers),
                  aborted=sum(w.aborted for w in workers), seconds=round(took, 3),
                  records_per_second=rate, errors=errors)
    history.close()
    print(f"pipelined_producer: mode {args.mode}, {len(workers)} producers, "
          f"sent {sum(w.sent for w in workers)}, acked {history.acks}, failed {history.fails} "
          f"(OUT_OF_ORDER_SEQUENCE_NUMBER {history.ooos}), committed {sum(w.committed for w in workers)}, "
          f"aborted {sum(w.aborted for w in workers)}, {took:.1f} s, "
          f"{rate if rate is not None else '-'} records/s; "
          f"in flight max (batches of one partition, requests of one connection): {inflight}")
    for name, e in errors.items():
        print(f"pipelined_producer: {name} FAILED: {e}", file=sys.stderr)
    if history.ooos:
        print(f"pipelined_producer: FAILED: {history.ooos} OUT_OF_ORDER_SEQUENCE_NUMBER errors", file=sys.stderr)
    sys.exit(0 if ok else 3)


if __name__ == "__main__":
    main()
