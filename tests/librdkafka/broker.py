#!/usr/bin/env python3
"""Helpers for run.sh: `broker.py free-ports N` prints N distinct free TCP
ports on 127.0.0.1; `broker.py wait PORT PID TIMEOUT [BROKERS]` polls until the broker
answers ApiVersions and, with BROKERS, its Metadata lists at least that many
brokers (exit 0), the process PID exits (exit 1) or TIMEOUT seconds pass
(exit 2)."""

import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            body = struct.pack(">hhih", 18, 0, 77, 3) + b"run"
            s.sendall(struct.pack(">i", len(body)) + body)
            n = struct.unpack(">i", recv(s, 4))[0]
            return struct.unpack(">i", recv(s, n)[:4])[0] == 77
    except (OSError, struct.error):
        return False


def broker_count(port: int) -> int:
    """Brokers in a Metadata v0 answer (-1 if the broker does not answer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            # Metadata v0 with an empty topic array: all topics, and the brokers.
            body = struct.pack(">hhih", 3, 0, 78, 3) + b"run" + struct.pack(">i", 0)
            s.sendall(struct.pack(">i", len(body)) + body)
            n = struct.unpack(">i", recv(s, 4))[0]
            corr, brokers = struct.unpack(">ii", recv(s, n)[:8])
            return brokers if corr == 78 else -1
    except (OSError, struct.error):
        return -1


def recv(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise ConnectionError("closed")
        b += c
    return b


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists"; check /proc state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def main():
    if sys.argv[1] == "free-ports":
        # All of a run's ports from one process, so none is handed out twice.
        print(" ".join(str(free_port()) for _ in range(int(sys.argv[2]))))
        return 0
    if sys.argv[1] == "wait":
        port, pid, timeout = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
        brokers = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        deadline = time.monotonic() + timeout
        pause = 0.005
        while time.monotonic() < deadline:
            if answers(port) and (brokers == 0 or broker_count(port) >= brokers):
                return 0
            if not alive(pid):
                return 1
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        return 2
    print(__doc__, file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
