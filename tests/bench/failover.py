"""Controller failover as a client sees it (tests/bench/run.sh failover).

Three `samsa server` processes, each a voter and a broker. Each round: the
node leading the controller quorum (`samsa_controller_active` on
/metrics) is SIGKILLed, and at once an admin client (--client: kafka-python, or
confluent-kafka for librdkafka's), bootstrapped on the two other nodes
only, sends CreateTopics for a new topic and retries (as an application
would) until it succeeds. Reported
per round: when the new controller leader was elected (first node whose
/metrics says active), when the first CreateTopics succeeded, and how
many attempts failed or timed out (request timeout --timeout). Then the
killed node is restarted and waited for before the next round.

Prints a Markdown table; asserts nothing but that every round ended with
a created topic.
"""

import argparse
import pathlib
import shutil
import threading
import time

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka.admin import KafkaAdminClient, NewTopic
from procs import ClusterNode, free_port, wait_for  # noqa: E402


def create_topic(client, bootstrap, topic, timeout):
    if client == "confluent-kafka":
        admin = AdminClient({"bootstrap.servers": ",".join(bootstrap)})
        futures = admin.create_topics([ConfluentNewTopic(topic, 1, 3)],
                                      request_timeout=timeout, operation_timeout=timeout)
        futures[topic].result(timeout=timeout + 5)
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap,
                             request_timeout_ms=int(timeout * 1000))
    try:
        admin.create_topics([NewTopic(topic, 1, 3)], timeout_ms=int(timeout * 1000))
    finally:
        admin.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--client", choices=["kafka-python", "confluent-kafka"],
                        default="kafka-python")
    args = parser.parse_args()
    base = pathlib.Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    voters = ",".join(f"{i}@127.0.0.1:{free_port()}" for i in (1, 2, 3))
    nodes = [ClusterNode(args.samsa, base, i, voters) for i in (1, 2, 3)]
    rows = []
    try:
        for n in nodes:
            n.start()
        wait_for(lambda: all(n.ready() for n in nodes), 120, "the cluster did not start")
        for round_ in range(1, args.rounds + 1):
            leader = next(n for n in nodes if n.active_controller())
            others = [n for n in nodes if n is not leader]
            bootstrap = [f"127.0.0.1:{n.kafka}" for n in others]
            elected = {}

            def watch_election():
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and "at" not in elected:
                    if any(n.active_controller() for n in others):
                        elected["at"] = time.monotonic()
                    time.sleep(0.02)  # polling /metrics

            leader.kill()
            killed_at = time.monotonic()
            watcher = threading.Thread(target=watch_election)
            watcher.start()
            failures, created_at = [], None
            topic = f"failover-{round_}"
            while created_at is None and time.monotonic() - killed_at < 120:
                try:
                    create_topic(args.client, bootstrap, topic, args.timeout)
                    created_at = time.monotonic()
                except Exception as e:  # noqa: BLE001 - counted, then retried
                    if "TopicAlreadyExists" in type(e).__name__ + str(e):
                        created_at = time.monotonic()
                    else:
                        failures.append(f"{time.monotonic() - killed_at:.1f}s {type(e).__name__}")
            watcher.join()
            rows.append((round_, leader.node_id, elected.get("at", float("nan")) - killed_at,
                         (created_at or float("nan")) - killed_at, failures))
            print(rows[-1][:4], len(rows[-1][4]), rows[-1][4][:5], flush=True)
            leader.start()
            wait_for(lambda: all(n.ready() for n in nodes), 120, "the killed node did not rejoin")
    finally:
        for n in nodes:
            if n.proc and n.proc.poll() is None:
                n.kill()
    print(f"client: {args.client}")
    print("| round | killed | new controller elected after | first CreateTopics succeeded after | failed attempts |")
    print("|---|---|---|---|---|")
    for round_, killed, elected, created, failures in rows:
        print(f"| {round_} | node {killed} | {elected:.1f} s | {created:.1f} s | "
              f"{len(failures)} {'; '.join(failures[:3])} |")


if __name__ == "__main__":
    main()
