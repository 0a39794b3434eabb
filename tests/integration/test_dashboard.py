"""deploy/grafana/tigon.json only queries metrics that tigon-server exports."""
import json
import os
import re
import urllib.request

from conftest import ROOT

DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "tigon.json")


def dashboard_queries():
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v.get("definition")]
    return queries


def exported_families(text):
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_every_dashboard_metric_is_exported(shared_server):
    with urllib.request.urlopen(shared_server.metrics_url, timeout=10) as response:
        families = exported_families(response.read().decode())
    queries = dashboard_queries()
    assert len(queries) >= 15
    used = set()
    for query in queries:
        used |= set(re.findall(r"\btigon_[a-z_]+", query))
    assert used, "the dashboard queries no tigon metric"
    for name in sorted(used):
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name.endswith(("_bucket", "_sum", "_count")) else name
        assert family in families, f"{name} (in the dashboard) is not exported; exported: {sorted(families)}"
    # The panels the issue asks for are there.
    titles = " | ".join(p["title"] for p in json.load(open(DASHBOARD))["panels"]).lower()
    for want in ("tokens per second", "p50 / p95", "loss", "fused vs reference", "memory saved", "device memory",
                 "out-of-memory", "failed calls"):
        assert want in titles, want
