"""The metrics endpoint against the real Prometheus tools (Debian's `prometheus` package): promtool accepts
the exposition, and a Prometheus server scraping a running tigon-server answers a query for a training
metric through its HTTP API. Also MeasureSavings, whose results are exported as metrics."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import CORPUS, ROOT, TINY_LLAMA, byte_batches
from test_dashboard import dashboard_queries


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(server):
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        return response.read().decode()


def test_promtool_accepts_the_exposition_and_the_scrape_config(shared_server):
    assert shutil.which("promtool"), "promtool comes with Debian's prometheus package (scripts/setup.sh)"
    client = shared_server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        for batch in byte_batches(CORPUS, 2, 16, 3):
            session.train_step(batch)
        session.measure_savings(2, 16)
        text = scrape(shared_server)
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert 'le="0.0025"' in text, "bucket bounds are written in their shortest form"
    config = subprocess.run(["promtool", "check", "config",
                             os.path.join(ROOT, "deploy", "prometheus", "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_measure_savings_reports_both_kernel_choices(shared_server):
    client = shared_server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        result = session.measure_savings(2, 16)
        assert result.fused.kernels == "fused" and result.reference.kernels == "reference"
        assert result.fused.step_seconds > 0 and result.reference.step_seconds > 0
        assert result.speedup == result.reference.step_seconds / result.fused.step_seconds
        assert result.saved_bytes == result.reference.peak_memory_bytes - result.fused.peak_memory_bytes
        assert session.info().step == 0, "the session itself is not trained"
        text = scrape(shared_server)
        assert f'tigon_savings_step_seconds{{kernels="fused",model_family="llama",session="{session.id}"}}' in text


def test_a_real_prometheus_scrapes_a_training_server(shared_server, tmp_path):
    assert shutil.which("prometheus"), "Debian's prometheus package (scripts/setup.sh)"
    target = shared_server.metrics_url.split("//", 1)[1].split("/", 1)[0]
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: tigon\n"
                      f"    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    prometheus = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    client = shared_server.client()
    try:
        with client.create_session(TINY_LLAMA, precision="fp32") as session:
            query = urllib.parse.urlencode({"query": f'tigon_session_loss{{session="{session.id}"}}'})
            url = f"http://127.0.0.1:{port}/api/v1/query?{query}"
            batches = byte_batches(CORPUS, 2, 16, 200)
            deadline = time.time() + 60
            answer = []
            while time.time() < deadline and not answer:
                session.train_step(batches[int(time.time()) % len(batches)])
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        body = json.load(response)
                    answer = body["data"]["result"]
                except OSError:
                    pass  # Prometheus is still starting
                time.sleep(0.5)
            assert answer, "Prometheus never returned the session's loss"
            sample = answer[0]
            assert sample["metric"]["job"] == "tigon" and sample["metric"]["model_family"] == "llama"
            assert 0 < float(sample["value"][1]) < 10
            # Every query of the Grafana dashboard is valid PromQL that this Prometheus evaluates.
            for batch in batches[:3]:  # steps between scrapes, so that the rates are not empty
                session.train_step(batch)
                time.sleep(0.5)
            session.measure_savings(2, 16)
            time.sleep(2.5)
            empty = []
            for expr in dashboard_queries():
                expr = expr.replace("$session", ".*")
                if expr.startswith("label_values("):
                    continue  # a Grafana templating function, not PromQL
                q = urllib.parse.urlencode({"query": expr})
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/query?{q}", timeout=10) as response:
                    body = json.load(response)
                assert body["status"] == "success", (expr, body)
                if not body["data"]["result"]:
                    empty.append(expr)
            # Device memory is empty on a CPU server, out-of-memory events have not happened; the rest
            # has data after training and one MeasureSavings.
            assert all("device_memory" in e or "out_of_memory" in e or 'code!="OK"' in e for e in empty), empty
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        log.close()


def test_counters_and_process_metrics_are_exported_from_the_start(start_server):
    server = start_server()
    text = scrape(server)
    for family in ("llama", "gemma", "mistral", "qwen2", "phi3"):
        assert f'tigon_out_of_memory_total{{model_family="{family}"}} 0' in text, text
        assert f'tigon_tokens_processed_total{{model_family="{family}"}} 0' in text
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["process_resident_memory_bytes"] > 1 << 20
    assert values["process_cpu_seconds_total"] > 0
    assert values["process_open_fds"] > 0
    assert abs(values["process_start_time_seconds"] - time.time()) < 600


def test_half_open_connections_do_not_stall_a_scrape(start_server):
    server = start_server()
    host, port = server.metrics_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    stalled = []
    try:
        for i in range(64):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a request that never ends
            stalled.append(s)
        time.sleep(0.2)
        # With the connections still open, a scrape is answered at once (3 s: a bound, not a measurement).
        with urllib.request.urlopen(server.metrics_url, timeout=3) as response:
            assert "tigon_active_sessions 0" in response.read().decode()
    finally:
        for s in stalled:
            s.close()


def prometheus_up(tmp_path, jobs):
    """Starts a real Prometheus scraping each job {name: extra scrape config}; returns {job: up} once
    every job has been scraped."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n" + "".join(
        f"  - job_name: {name}\n{extra}    static_configs:\n      - targets: ['{target}']\n"
        for name, (target, extra) in jobs.items()))
    log = open(tmp_path / "prometheus.log", "wb")
    prometheus = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "up"})
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    result = json.load(response)["data"]["result"]
                up = {r["metric"]["job"]: r["value"][1] for r in result}
                if set(up) == set(jobs):
                    return up
            except OSError:
                pass  # Prometheus is still starting
            time.sleep(0.5)
        raise AssertionError("Prometheus never scraped every job: " + (tmp_path / "prometheus.log").read_text())
    finally:
        prometheus.terminate()
        prometheus.wait(30)
        log.close()


def test_a_scrape_needs_the_token_when_the_flag_is_set(start_server, tmp_path):
    token_file = tmp_path / "scrape-token"
    token_file.write_text("b1c8f0e7d2a94c33\n")
    server = start_server(f"--metrics-token-file={token_file}")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic YjFjOGYwZTdkMmE5NGMzMw=="}):
        request = urllib.request.Request(server.metrics_url, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 401, headers
        assert "tigon_" not in refused.value.read().decode()
    request = urllib.request.Request(server.metrics_url, headers={"Authorization": "Bearer b1c8f0e7d2a94c33"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert "tigon_active_sessions 0" in response.read().decode()
    # A real Prometheus scrapes it with `authorization: {credentials_file: ...}`, and not without.
    target = server.metrics_url.split("//", 1)[1].split("/", 1)[0]
    up = prometheus_up(tmp_path, {
        "with-token": (target, f"    authorization:\n      credentials_file: {token_file}\n"),
        "without-token": (target, ""),
    })
    assert up == {"with-token": "1", "without-token": "0"}


def http_get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode().strip()


def test_healthz_and_readyz_follow_the_service_and_need_no_token(start_server, tmp_path):
    """Kubernetes' HTTP probes on the metrics port: /healthz while the process serves, /readyz while the
    gRPC service takes calls (503 once SIGTERM starts the drain, while a step still finishes)."""
    import signal
    import threading
    import numpy as np
    token_file = tmp_path / "scrape-token"
    token_file.write_text("b1c8f0e7d2a94c33\n")
    server = start_server(f"--metrics-token-file={token_file}", "--exit-timeout=300")
    base = server.metrics_url.rsplit("/", 1)[0]
    assert http_get(base + "/healthz") == (200, "ok")
    assert http_get(base + "/readyz") == (200, "ready")
    assert http_get(server.metrics_url)[0] == 401, "/metrics still needs its token"
    # A step long enough to watch the drain: several seconds on two CPU cores.
    wide = dict(TINY_LLAMA, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=8, max_position_embeddings=1024)
    session = server.client().create_session(wide, precision="fp32")
    batch = np.random.default_rng(0).integers(0, 256, size=(4, 512), dtype=np.int32)
    outcome = {}
    step = threading.Thread(target=lambda: outcome.setdefault("step", session.train_step(batch).step))
    step.start()
    time.sleep(2.0)  # the step is inside the engine by then
    server.signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while http_get(base + "/readyz")[0] != 503 and time.monotonic() < deadline:
        time.sleep(0.02)
    readiness = http_get(base + "/readyz")
    liveness = http_get(base + "/healthz")
    step.join(300)
    assert readiness[0] == 503 and "draining" in readiness[1], readiness
    assert liveness == (200, "ok"), "alive while it drains"
    assert outcome.get("step") == 1, "the step in flight finished"
    assert server.wait(60) == 0
