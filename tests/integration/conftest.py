"""Fixtures for the integration tests: the real tigon-server binary on a free loopback port, driven
through the `tigon` Python client.

The binary: $TIGON_SERVER_BIN, else $TIGON_BUILD_DIR/server/tigon-server, else the first of
build/, build-s/ under the repository that has one.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import tigon  # noqa: E402

# A tiny random Llama: fast on the CPU in fp32, and bit-reproducible for a given seed.
TINY_LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)


def server_binary():
    candidates = []
    if os.environ.get("TIGON_SERVER_BIN"):
        candidates.append(os.environ["TIGON_SERVER_BIN"])
    if os.environ.get("TIGON_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["TIGON_BUILD_DIR"], "server", "tigon-server"))
    candidates += [os.path.join(ROOT, d, "server", "tigon-server") for d in ("build", "build-s")]
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    pytest.fail("tigon-server not found; build it or set TIGON_SERVER_BIN (looked at: "
                + ", ".join(candidates) + ")")


class ServerProcess:
    """tigon-server started with --listen=127.0.0.1:0; the bound ports are read from its stdout."""

    def __init__(self, tmp_path, *flags, name="server", preexec_fn=None):
        self.log_path = os.path.join(tmp_path, f"{name}.log")
        self.flags = ["--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--log-level=debug", *flags]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([server_binary(), *self.flags], stdout=subprocess.PIPE,
                                     stderr=self._log, text=True, preexec_fn=preexec_fn)
        self.address = None
        self.metrics_url = None
        lines = []
        deadline = time.time() + 120
        while time.time() < deadline and self.address is None:
            line = self.proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.match(r"tigon-server listening on (\S+)", line)
            if m:
                self.address = m.group(1)
        if self.address is None:
            self.proc.kill()
            raise RuntimeError(f"tigon-server did not start: {lines} {self.log()}")
        line = self.proc.stdout.readline()
        m = re.match(r"tigon-server metrics on (\S+)", line)
        if m:
            self.metrics_url = m.group(1)
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def client(self, token=None, **kwargs):
        return tigon.connect(self.address, token=token, **kwargs)

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def signal(self, signum):
        self.proc.send_signal(signum)

    def wait(self, timeout=60):
        return self.proc.wait(timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture
def start_server(tmp_path):
    """start_server(*flags) -> ServerProcess; every server is stopped at the end of the test."""
    servers = []

    def start(*flags, name=None, preexec_fn=None):
        server = ServerProcess(str(tmp_path), *flags, name=name or f"server{len(servers)}", preexec_fn=preexec_fn)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One server for the tests that need no special flags: small limits so that they can be hit."""
    tmp = tmp_path_factory.mktemp("shared")
    server = ServerProcess(str(tmp), f"--checkpoint-root={tmp / 'checkpoints'}",
                           f"--model-root={os.path.join(ROOT, 'tests', 'fixtures')}", "--max-batch-tokens=2048",
                           "--max-message-bytes=8192", "--max-sessions=8")
    server.checkpoint_root = str(tmp / "checkpoints")
    yield server
    server.stop()


def process_memory_bytes(pid, field="VmRSS"):
    """A memory figure of /proc/PID/status in bytes: VmRSS (resident now) or VmHWM (the peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def byte_batches(text, batch, seq_len, count, seed=0):
    """`count` [batch, seq_len] windows of the UTF-8 bytes of `text` at seeded random offsets."""
    import random
    data = text.encode()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        rows = []
        for _ in range(batch):
            start = rng.randrange(0, len(data) - seq_len)
            rows.append(list(data[start:start + seq_len]))
        out.append(rows)
    return out


CORPUS = ("the quick brown fox jumps over the lazy dog. " * 20 +
          "pack my box with five dozen liquor jugs. " * 20)

