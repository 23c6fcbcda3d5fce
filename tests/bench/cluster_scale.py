"""Three nodes with many partitions (tests/bench/run.sh cluster-scale).

Three `samsa server` processes, each a voter and a broker. For each size of
--partitions (RF 3, in topics of --per-topic partitions):

1. CreateTopics through node 1, one request per topic, --inflight at once.
   Reported: until every answer came, and until every node's own Metadata
   lists every partition with a leader (the metadata image applied and the
   broker's view derived on all three nodes).
2. Idle: after --settle-seconds, the CPU of the three processes together
   over --idle-seconds, in % of one core, --idle-windows times one after
   the other (followers fetch from their leaders all the while, through
   their fetch sessions). --idle-only stops here.
3. At the end of the run: the quorum store, the controller's Raft log and
   snapshots (sled) on disk (the largest of the three), and the size of the
   last metadata snapshot built (the image as JSON; one is built every
   `metadata_snapshot_interval_entries` Raft entries, 5,000 by default).
4. SIGKILL of a broker that leads about a third of the partitions and is
   not the controller leader. Reported: how many it led, and until the two
   others' Metadata name no partition led by it (the controller fences it
   after the broker session timeout, then elects other leaders).
5. Its restart: until its Metadata lists every partition with a leader,
   and until it is back in every ISR (its partitions opened and caught up).
6. A preferred leader election (ElectLeaders) gives it its leaderships
   back; then SIGTERM of the same broker (a controlled shutdown moves its
   leaderships before it stops). Reported: until the others name no
   partition led by it, and until it exited (its logs flushed and closed).

Prints a Markdown table; asserts nothing but that each step ended.
"""

import argparse
import pathlib
import re
import time

from confluent_kafka import ElectionType
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest
from procs import (ClusterNode, Connection, cpu_seconds, free_port, fresh_dir,  # noqa: E402
                   print_table, rss_mib, run_sizes, wait_for)

PREFIX = "cluster-scale"


def metadata(node):
    """{(topic, partition): (leader, isr)} of the benchmark's topics, as the
    node itself answers Metadata; None while it does not answer."""
    try:
        conn = Connection(node.kafka, 1)
    except OSError:
        return None
    try:
        conn.sock.settimeout(30)
        (answer,) = conn.pipeline([MetadataRequest[1](topics=None)])
    except OSError:
        return None
    finally:
        conn.close()
    return {(t.name, p.partition_index): (p.leader_id, tuple(p.isr_nodes))
            for t in answer.topics if t.name.startswith(PREFIX)
            for p in t.partitions}


def all_led(node, partitions):
    view = metadata(node)
    return view is not None and len(view) == partitions and all(
        leader >= 0 for leader, _ in view.values())


def led_by(node, broker):
    """How many partitions `node` names `broker` the leader of, or None."""
    view = metadata(node)
    return None if view is None else sum(1 for leader, _ in view.values() if leader == broker)


def in_every_isr(node, broker):
    """Whether `node` names `broker` in the ISR of every partition."""
    view = metadata(node)
    return view is not None and all(broker in isr for _, isr in view.values())


def store_mib(node):
    """Space on disk of the node's quorum store (the directory sled keeps
    its `conf` and `db` in)."""
    total = 0
    for conf in node.data.rglob("conf"):
        if (conf.parent / "db").exists():
            total += sum(f.stat().st_blocks * 512 for f in conf.parent.rglob("*") if f.is_file())
    return total / (1 << 20)


def snapshot_mib(node):
    """Size of the last metadata snapshot the node built (its log says), or
    None if it built none (`metadata_snapshot_interval_entries`)."""
    size = None
    with open(node.log.name, errors="replace") as log:
        for line in log:
            if "built metadata snapshot" in line:
                size = int(re.search(r"bytes=(\d+)", line).group(1)) / (1 << 20)
    return size


def create(node, partitions, per_topic, inflight):
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{node.kafka}"})
    names = [f"{PREFIX}-{i}" for i in range(partitions // per_topic)]
    for start in range(0, len(names), inflight):
        futures = admin.create_topics(
            [NewTopic(n, per_topic, 3) for n in names[start:start + inflight]],
            request_timeout=300, operation_timeout=300)
        for f in futures.values():
            f.result(timeout=330)


def run_size(args, partitions):
    base = fresh_dir(pathlib.Path(args.dir) / f"p{partitions}")
    voters = ",".join(f"{i}@127.0.0.1:{free_port()}" for i in (1, 2, 3))
    nodes = [ClusterNode(args.samsa, base, i, voters, args.set) for i in (1, 2, 3)]
    row = {"partitions": partitions}
    try:
        for n in nodes:
            n.start()
        wait_for(lambda: all(n.ready() for n in nodes), 120, "the cluster did not start")

        began = time.monotonic()
        create(nodes[0], partitions, args.per_topic, args.inflight)
        row["created_s"] = time.monotonic() - began
        wait_for(lambda: all(all_led(n, partitions) for n in nodes), 600,
                 "not every node listed every partition with a leader")
        row["applied_s"] = time.monotonic() - began
        row["rss_mib"] = max(rss_mib(n.proc.pid) for n in nodes)
        # The partitions' first checkpoints follow their creation: idle
        # means after them.
        time.sleep(args.settle_seconds)
        windows = []
        for _ in range(args.idle_windows):
            before = sum(cpu_seconds(n.proc.pid) for n in nodes)
            time.sleep(args.idle_seconds)  # measuring idle CPU: nothing to wait for
            windows.append((sum(cpu_seconds(n.proc.pid) for n in nodes) - before)
                           / args.idle_seconds * 100)
        row["idle_cpu"] = ", ".join(f"{w:.1f}%" for w in windows)
        if args.idle_only:
            return row

        victim = next(n for n in nodes[1:] if not n.active_controller())
        others = [n for n in nodes if n is not victim]
        row["led"] = led_by(others[0], victim.node_id)
        victim.kill()
        killed = time.monotonic()
        wait_for(lambda: all(led_by(n, victim.node_id) == 0 for n in others), 600,
                 "the killed broker's partitions did not move")
        row["kill_moved_s"] = time.monotonic() - killed

        victim.start()
        started = time.monotonic()
        wait_for(lambda: all_led(victim, partitions), 600,
                 "the restarted broker did not list every partition")
        row["restart_listed_s"] = time.monotonic() - started
        wait_for(lambda: in_every_isr(others[0], victim.node_id), 600,
                 "the restarted broker did not rejoin every ISR")
        row["restart_isr_s"] = time.monotonic() - started

        # Its preferred leaderships back (the imbalance check would take up
        # to 300 s), so that the controlled shutdown has some to move.
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{others[0].kafka}"})
        # (confluent-kafka 2.16's binding refuses the timeout arguments.)
        admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=330)
        wait_for(lambda: (led_by(others[0], victim.node_id) or 0) > 0, 600,
                 "the restarted broker did not lead again")
        row["led_again"] = led_by(others[0], victim.node_id)
        stopping = time.monotonic()
        victim.proc.terminate()
        wait_for(lambda: all(led_by(n, victim.node_id) == 0 for n in others), 600,
                 "the stopped broker's partitions did not move")
        row["term_moved_s"] = time.monotonic() - stopping
        victim.proc.wait(timeout=600)
        row["term_exit_s"] = time.monotonic() - stopping
        row["store_mib"] = max(store_mib(n) for n in nodes)
        sizes = [m for m in (snapshot_mib(n) for n in nodes) if m is not None]
        row["snapshot"] = f"{max(sizes):.1f} MiB" if sizes else "none built"
    except Exception as e:  # noqa: BLE001 - reported in the table
        row["error"] = f"{type(e).__name__}: {e}"
    finally:
        for n in nodes:
            if n.proc and n.proc.poll() is None:
                n.kill()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--partitions", default="300,3000,9000",
                        help="comma-separated totals, each a multiple of --per-topic")
    parser.add_argument("--per-topic", type=int, default=100)
    parser.add_argument("--inflight", type=int, default=10,
                        help="CreateTopics requests sent at once")
    parser.add_argument("--settle-seconds", type=float, default=10)
    parser.add_argument("--idle-seconds", type=float, default=10)
    parser.add_argument("--idle-windows", type=int, default=1)
    parser.add_argument("--idle-only", action="store_true",
                        help="stop after measuring the idle cluster")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of every node (samsa server --set)")
    args = parser.parse_args()
    rows = run_sizes(args.partitions, lambda n: run_size(args, n))
    if args.idle_only:
        failed = print_table(
            ["partitions (RF 3)", "CreateTopics", "every node lists all", "RSS (max)",
             "idle CPU (3 nodes)"],
            rows, lambda r: f"{r['partitions']:,}",
            lambda r: [f"{r['created_s']:.1f} s", f"{r['applied_s']:.1f} s",
                       f"{r['rss_mib']:.0f} MiB", r["idle_cpu"]])
        raise SystemExit(1 if failed else 0)
    failed = print_table(
        ["partitions (RF 3)", "CreateTopics", "every node lists all", "RSS (max)",
         "idle CPU (3 nodes)",
         "quorum store (max)", "last snapshot", "SIGKILL: led", "moved after",
         "restart: lists all", "in every ISR", "SIGTERM: led", "moved after", "exited after"],
        rows, lambda r: f"{r['partitions']:,}",
        lambda r: [f"{r['created_s']:.1f} s", f"{r['applied_s']:.1f} s",
                   f"{r['rss_mib']:.0f} MiB", r["idle_cpu"],
                   f"{r['store_mib']:.1f} MiB",
                   r["snapshot"], f"{r['led']:,}", f"{r['kill_moved_s']:.1f} s",
                   f"{r['restart_listed_s']:.1f} s", f"{r['restart_isr_s']:.1f} s",
                   f"{r['led_again']:,}", f"{r['term_moved_s']:.1f} s",
                   f"{r['term_exit_s']:.1f} s"])
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
