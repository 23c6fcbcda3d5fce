"""Free loopback ports for the brokers the Python tests and benchmarks start.

Drawn below the kernel's ephemeral range (32768-60999), as the Rust harness
(tests/src/node.rs, free_port) and the deploy scripts (tests/deploy/ports.sh)
do. A port that `bind(0)` hands out is one the kernel also hands to the next
`bind(0)` and to the local side of outgoing connections: in CI the compat
suite's broker got a Kafka port that its own HTTP listener (`http_listen`
on port 0) had taken a moment before, and the broker exited with "Address
already in use". Below that range only listeners take ports, so a bind check
right before use holds unless two runs draw the same port at the same moment.

A port is handed out once per process: a cluster draws all its ports before
any node binds one, so the bind check alone can hand the same port twice.
"""

import random
import socket

_FIRST, _PAST_LAST = 20000, 32000
_handed_out = set()


def free_port() -> int:
    for _ in range(1000):
        port = random.randrange(_FIRST, _PAST_LAST)
        if port in _handed_out:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_FIRST}..{_PAST_LAST} on 127.0.0.1")


if __name__ == "__main__":
    # `python3 tests/ports.py N`: N distinct free ports on one line, for shell scripts.
    import sys

    print(" ".join(str(free_port()) for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1)))
