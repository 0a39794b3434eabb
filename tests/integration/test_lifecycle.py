"""The server process: flags, SIGTERM while training, resume after kill -9, health, reflection, metrics,
and the generated Python code being current."""
import filecmp
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request


import tigon
from conftest import CORPUS, ROOT, TINY_LLAMA, byte_batches, server_binary


def test_help_lists_every_flag():
    out = subprocess.run([server_binary(), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for flag in ("--listen", "--auth-token-file", "--checkpoint-root", "--max-sessions", "--max-batch-tokens",
                 "--max-message-bytes", "--log-level", "--exit-timeout", "--metrics-listen", "--help"):
        assert flag in out.stdout, flag
    bad = subprocess.run([server_binary(), "--max-sessions=0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--max-sessions" in bad.stderr


def test_sigterm_during_training_finishes_the_step_and_exits_0(start_server):
    server = start_server("--exit-timeout=60")
    client = server.client()
    session = client.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=1e-2))
    batches = byte_batches(CORPUS, 4, 32, 1000)
    completed, failures = [], []
    started = threading.Event()

    def train():
        for b in batches:
            try:
                completed.append(session.train_step(b).step)
                started.set()
            except tigon.TigonError as e:
                failures.append(e)
                return

    thread = threading.Thread(target=train)
    thread.start()
    assert started.wait(60)
    time.sleep(0.2)
    server.signal(signal.SIGTERM)
    assert server.wait(60) == 0
    thread.join(60)
    assert completed == list(range(1, len(completed) + 1)), "no step lost or applied twice"
    assert len(completed) < len(batches)
    assert failures and isinstance(failures[0], (tigon.Unavailable, tigon.Cancelled)), failures
    log = server.log()
    assert "SIGTERM: not serving any more" in log and "tigon-server stopped" in log


def test_save_kill_restart_load_continues_with_the_same_losses(start_server, tmp_path):
    root = tmp_path / "ckpt"
    batches = byte_batches(CORPUS, 4, 32, 8, seed=11)
    options = dict(precision="fp32", optimizer=dict(lr=1e-2, weight_decay=0.01), seed=3)

    first = start_server(f"--checkpoint-root={root}", name="first")
    session = first.client().create_session(TINY_LLAMA, **options)
    for b in batches[:4]:
        session.train_step(b)
    saved = session.save("run/step-4")
    assert saved.path == "run/step-4" and saved.step == 4
    uninterrupted = [session.train_step(b).loss for b in batches[4:]]
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL

    second = start_server(f"--checkpoint-root={root}", name="second")
    resumed = second.client().create_session(TINY_LLAMA, **options)
    loaded = resumed.load("run/step-4")
    assert loaded.step == 4 and resumed.info().step == 4
    continued = [resumed.train_step(b) for b in batches[4:]]
    assert [r.step for r in continued] == [5, 6, 7, 8]
    assert [r.loss for r in continued] == uninterrupted, "CPU fp32 runs are bit-reproducible"


def test_reflection_lists_the_services(shared_server):
    import grpc
    channel = grpc.insecure_channel(shared_server.address)
    # ServerReflectionRequest{list_services: ""} is field 7; the response's list_services_response is
    # field 6, holding repeated ServiceResponse{name = 1}. Decoded by hand: no reflection package needed.
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
    response = next(iter(call(iter([b"\x3a\x00"]), timeout=10)))

    def fields(data):
        i = 0
        while i < len(data):
            key, i = _varint(data, i)
            if key & 7 == 2:
                n, i = _varint(data, i)
                yield key >> 3, data[i:i + n]
                i += n
            elif key & 7 == 0:
                _, i = _varint(data, i)
            else:
                raise AssertionError("unexpected wire type")

    names = set()
    for number, value in fields(response):
        if number == 6:
            for inner, service in fields(value):
                names |= {v.decode() for n, v in fields(service) if n == 1}
    assert {"tigon.v1.Trainer", "grpc.health.v1.Health"} <= names, names


def _varint(data, i):
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def test_metrics_endpoint_exports_training_metrics(shared_server):
    client = shared_server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        session.train_step(byte_batches(CORPUS, 2, 16, 1)[0])
        with urllib.request.urlopen(shared_server.metrics_url, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        assert f'tigon_session_loss{{model_family="llama",session="{session.id}"}}' in text
        assert re.search(r'tigon_rpcs_total\{code="OK",method="TrainStep"\} [1-9]', text)
        assert 'tigon_step_duration_seconds_bucket{method="TrainStep",model_family="llama",le="+Inf"}' in text
        assert re.search(r"tigon_active_sessions [1-9]", text)
        for line in text.splitlines():
            if line and not line.startswith("#"):
                assert re.match(r'^[a-z_]+(\{[^}]*\})? \S+$', line), line


def test_generated_python_code_is_current(tmp_path):
    script = os.path.join(ROOT, "client", "python", "generate_proto.sh")
    subprocess.run(["bash", script, str(tmp_path)], check=True, timeout=120)
    committed = os.path.join(ROOT, "client", "python", "tigon", "v1")
    for name in ("trainer_pb2.py", "trainer_pb2_grpc.py"):
        assert filecmp.cmp(tmp_path / "tigon" / "v1" / name, os.path.join(committed, name), shallow=False), \
            f"{name} is stale: run client/python/generate_proto.sh"


def test_a_port_in_use_is_refused_at_start(shared_server):
    port = shared_server.address.rsplit(":", 1)[1]
    out = subprocess.run([server_binary(), f"--listen=127.0.0.1:{port}", "--metrics-listen=off"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot listen" in out.stderr
    metrics_port = shared_server.metrics_url.split(":")[-1].split("/")[0]
    out = subprocess.run([server_binary(), "--listen=127.0.0.1:0", f"--metrics-listen=127.0.0.1:{metrics_port}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot listen for metrics" in out.stderr


def test_a_taken_default_metrics_port_does_not_stop_the_server(tmp_path):
    import socket
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("127.0.0.1", 9464))
        holder.listen()
    except OSError:
        pass  # something else already holds the default port: the same situation
    try:
        log = open(tmp_path / "server.log", "wb")
        proc = subprocess.Popen([server_binary(), "--listen=127.0.0.1:0"], stdout=subprocess.PIPE, stderr=log,
                                text=True)
        line = proc.stdout.readline()
        assert line.startswith("tigon-server listening on "), line
        address = line.split()[-1]
        assert tigon.connect(address).server_info().version
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        log.close()
        assert "running without metrics" in (tmp_path / "server.log").read_text()
    finally:
        holder.close()


def test_version_a_taken_port_and_the_start_line_speak_plainly(start_server):
    out = subprocess.run([server_binary(), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and re.fullmatch(r"tigon-server \d+\.\d+\.\d+ \(engine \S+\)\n", out.stdout), out
    first = start_server()
    taken = subprocess.run([server_binary(), f"--listen={first.address}", "--metrics-listen=off"],
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 2
    assert f"cannot listen on {first.address}: Address already in use" in taken.stderr, taken.stderr
    assert "another process" in taken.stderr and "--listen" in taken.stderr
    log = first.log()
    devices = len(first.client().server_info().devices)
    if devices == 0:
        assert "no CUDA devices (sessions run on the CPU)" in log and "devices: 0" not in log
    assert re.search(r"CPU tensor memory cap (\d+\.\d GiB|off)", log), log
