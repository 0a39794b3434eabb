"""The deployment files parse, and every tigon-server flag they pass is one the binary accepts."""
import json
import os
import re
import subprocess

import yaml

from conftest import ROOT, server_binary


def accepted_flags():
    out = subprocess.run([server_binary(), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    return set(re.findall(r"^\s+(--[a-z-]+)", out.stdout, re.M))


def flags_in(command):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command))


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_kubernetes_manifests_parse_and_use_real_flags():
    docs = list(yaml.safe_load_all(read("deploy", "k8s", "tigon.yaml")))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PersistentVolumeClaim"} <= kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["grpc"]["port"] == 50051
    assert container["livenessProbe"]["grpc"]["port"] == 50051
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    assert any(v.get("secret") for v in pod["spec"]["volumes"])
    used = {a.split("=", 1)[0] for a in container["args"]}
    assert used <= accepted_flags(), used - accepted_flags()
    assert "--auth-token-file" in used and "--checkpoint-root" in used


def test_dockerfile_and_slurm_script_use_real_flags():
    accepted = accepted_flags()
    dockerfile = read("Dockerfile")
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    assert {a.split("=", 1)[0] for a in cmd} <= accepted
    assert "HEALTHCHECK" in dockerfile and re.search(r"^USER (?!root)", dockerfile, re.M)
    slurm = read("deploy", "slurm", "tigon-server.sbatch")
    # The server's command line: from its binary ("$0" inside the srun script) to its output's redirection.
    command = re.search(r'"\$0"(.*?)> >\(', slurm, re.S).group(1)
    used = flags_in(command)
    assert "--listen" in used and used <= accepted, used - accepted
    check = subprocess.run(["bash", "-n", os.path.join(ROOT, "deploy", "slurm", "tigon-server.sbatch")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_prometheus_config_parses_and_targets_the_metrics_port():
    config = yaml.safe_load(read("deploy", "prometheus", "prometheus.yml"))
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:9464"]
