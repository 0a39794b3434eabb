"""The metrics endpoint against the real Prometheus tools (Debian's `prometheus` package): promtool accepts
the exposition, and a Prometheus server scraping a running tigon-server answers a query for a training
metric through its HTTP API. Also MeasureSavings, whose results are exported as metrics."""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

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
        assert f'tigon_savings_step_seconds{{session="{session.id}",model_family="llama",kernels="fused"}}' in text


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
