"""What the Python benchmarks share: a free port, a broker started and
waited for, the arguments every single-node benchmark takes, a node of a
three-node cluster, a socket that pipelines Kafka requests, a process's CPU time, resident memory and open
descriptors from /proc, and the Markdown table they print."""

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from kafka.protocol.parser import KafkaProtocol

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from ports import free_port  # noqa: E402,F401 (the benchmarks import it from here)


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def idle_cpu_pct(pid, seconds):
    before = cpu_seconds(pid)
    time.sleep(seconds)  # measuring idle CPU: nothing to wait for
    return (cpu_seconds(pid) - before) / seconds * 100


def fresh_dir(path):
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def broker_arguments(parser):
    """--samsa, --dir, --idle-seconds and --set, which every single-node
    benchmark takes."""
    parser.add_argument("--samsa", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker setting for every start (samsa server --set)")


def start_broker(binary, data, port, log, settings=()):
    """`samsa server` on 127.0.0.1:port, returned once it accepts."""
    args = [binary, "server", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data),
            "--set", "http_listen=127.0.0.1:0"]
    for setting in settings:
        args += ["--set", setting]
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)  # the listener is not bound yet
    proc.kill()
    raise RuntimeError("broker did not start")


def print_table(columns, rows, first, cells):
    """A Markdown table of `rows`: `first` names the row (its first cell),
    `cells` gives the others; a row with an "error" prints it instead.
    Returns whether any row failed."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    failed = False
    for r in rows:
        if "error" in r:
            failed = True
            print(f"| {first(r)} | failed: {r['error']} |" + " |" * (len(columns) - 2))
        else:
            print("| " + " | ".join([first(r)] + cells(r)) + " |")
    return failed


def run_sizes(sizes, run):
    """run(n) for each n of the comma-separated `sizes`, each row also
    printed to stderr as it comes."""
    rows = []
    for n in (int(x) for x in sizes.split(",")):
        row = run(n)
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def stop_broker(proc, how):
    """Stops the broker: "clean" (SIGTERM) or "kill" (SIGKILL); returns how
    long it took to exit."""
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM if how == "clean" else signal.SIGKILL)
    proc.wait()
    return time.monotonic() - start


def wait_for(condition, seconds, what):
    """Polls `condition` until it holds; raises "`what` within `seconds` s"."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)  # polling a process's state: nothing to wait on
    raise RuntimeError(f"{what} within {seconds} s")


class ClusterNode:
    """One `samsa server` of a cluster whose voters are `voters`
    ("1@host:port,..."), each a voter and a broker, on free Kafka and HTTP
    ports, its data under base/node<id>, its output in base/node<id>.log."""

    def __init__(self, binary, base, node_id, voters, settings=()):
        self.node_id = node_id
        self.kafka, self.http = free_port(), free_port()
        self.data = base / f"node{node_id}"
        self.args = [binary, "server", "--node-id", str(node_id),
                     "--listen", f"127.0.0.1:{self.kafka}", "--data-dir", str(self.data),
                     "--set", f"http_listen=127.0.0.1:{self.http}",
                     "--set", f"controller_quorum_voters={voters}",
                     "--set", f"controller_listen={voters.split(',')[node_id - 1].split('@')[1]}"]
        for setting in settings:
            self.args += ["--set", setting]
        self.log = open(base / f"node{node_id}.log", "ab")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=self.log)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def metrics(self):
        """The /metrics page, or "" while the node does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=5) as r:
                return r.read().decode()
        except OSError:
            return ""

    def active_controller(self):
        return any(line.startswith("samsa_controller_active 1")
                   for line in self.metrics().splitlines())

    def ready(self):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False


class Connection:
    """One socket; requests pipelined up to `inflight`, answers in order."""

    def __init__(self, port, inflight):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.proto = KafkaProtocol(client_id="samsa-bench")
        self.inflight = inflight

    def pipeline(self, requests):
        answers, sent, pending = [], 0, 0
        while len(answers) < len(requests):
            while sent < len(requests) and pending < self.inflight:
                self.proto.send_request(requests[sent])
                sent += 1
                pending += 1
            data = self.proto.send_bytes()
            if data:
                self.sock.sendall(data)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            for _, answer in self.proto.receive_bytes(chunk):
                answers.append(answer)
                pending -= 1
        return answers

    def close(self):
        self.sock.close()
