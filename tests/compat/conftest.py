"""pytest fixtures: a real samsa broker per test (free port, temp data dir).

The binary is $SAMSA_BIN, else <CARGO_TARGET_DIR or repo/target>/debug/samsa
(build it with `cargo build -p samsa`). The process is SIGKILLed at the end of
the test, also when the test fails; its log is printed when a test fails.
"""

import os
import pathlib
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from ports import free_port  # noqa: E402,F401 (the tests import it from here)


def samsa_bin() -> pathlib.Path:
    if os.environ.get("SAMSA_BIN"):
        return pathlib.Path(os.environ["SAMSA_BIN"])
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "samsa"


def api_versions_ok(port: int) -> bool:
    """Sends ApiVersions v0 and checks that an answer with our correlation id arrives."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            client_id = b"pytest"
            body = struct.pack(">hhih", 18, 0, 4242, len(client_id)) + client_id
            s.sendall(struct.pack(">i", len(body)) + body)
            hdr = _recv_exact(s, 4)
            (n,) = struct.unpack(">i", hdr)
            resp = _recv_exact(s, n)
            (corr,) = struct.unpack(">i", resp[:4])
            return corr == 4242
    except OSError:
        return False


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _die_with_parent():
    """PR_SET_PDEATHSIG(SIGKILL): the broker dies if pytest dies abruptly."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


class SamsaNode:
    def __init__(self, settings=()):
        self.bin = samsa_bin()
        if not self.bin.is_file():
            raise RuntimeError(
                f"samsa binary not found at {self.bin}: run `cargo build -p samsa` "
                "or set SAMSA_BIN"
            )
        self.tmp = tempfile.TemporaryDirectory(prefix="samsa-compat-")
        self.dir = pathlib.Path(self.tmp.name)
        self.data_dir = self.dir / "data"
        self.data_dir.mkdir()
        self.log_path = self.dir / "samsa.log"
        self.port = free_port()
        self.settings = list(settings)
        self.proc = None
        self.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0):
        listen = self.bootstrap
        args = [
            str(self.bin), "server",
            "--node-id", "1",
            "--listen", listen,
            "--advertised-listener", listen,
            "--data-dir", str(self.data_dir),
            # Any free port: these tests do not scrape /metrics.
            "--set", "http_listen=127.0.0.1:0",
        ]
        for s in self.settings:
            args += ["--set", s]
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                     preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"samsa exited with {self.proc.returncode} during startup\n{self.log_tail()}")
            if api_versions_ok(self.port):
                return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"samsa did not answer within {timeout}s\n{self.log_tail()}")
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, lines: int = 200) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(["----- samsa log -----", *text[-lines:], "----- end of samsa log -----"])

    def close(self):
        self.kill()
        self.tmp.cleanup()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _start(request, settings=()):
    node = SamsaNode(settings)

    def fin():
        failed = any(getattr(request.node, "rep_" + w, None) is not None and getattr(request.node, "rep_" + w).failed
                     for w in ("setup", "call"))
        if failed:
            print(node.log_tail(300))
        node.close()

    request.addfinalizer(fin)
    return node


@pytest.fixture
def samsa(request):
    """A fresh samsa node (default settings)."""
    return _start(request)


@pytest.fixture
def samsa_factory(request):
    """Starts a node with extra `key=value` settings: samsa_factory(["num_partitions=3"])."""
    return lambda settings=(): _start(request, settings)


@pytest.fixture
def topic_name(request):
    safe = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    return f"compat-{safe}-{os.getpid()}"
