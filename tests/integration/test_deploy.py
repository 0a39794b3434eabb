"""The deployment files parse, and every tigon-server flag they pass is one the binary accepts."""
import json
import os
import re
import signal
import subprocess
import sys
import time

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


def deployment_container():
    docs = list(yaml.safe_load_all(read("deploy", "k8s", "tigon.yaml")))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PersistentVolumeClaim"} <= kinds
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


def test_kubernetes_manifests_parse_and_use_real_flags():
    pod, container = deployment_container()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    assert any(v.get("secret") for v in pod["spec"]["volumes"])
    used = {a.split("=", 1)[0] for a in container["args"]}
    assert used <= accepted_flags(), used - accepted_flags()
    # The address, auth and metrics go through the image's entrypoint (deploy/docker/entrypoint.sh).
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TIGON_AUTH_TOKEN_FILE"].startswith(next(m["mountPath"] for m in container["volumeMounts"]
                                                        if m["name"] == "token"))
    assert "TIGON_CHECKPOINT_ROOT" in env and "--listen" not in used and "--auth-token-file" not in used


def test_kubernetes_deployment_pins_its_image_tolerates_gpu_nodes_and_probes_the_grpc_port():
    pod, container = deployment_container()
    image = container["image"]
    last = image.split("@")[0].rpartition("/")[2]  # NAME[:TAG] after the registry, whose host may have a port
    tag = last.partition(":")[2]
    assert "@sha256:" in image or (tag and tag != "latest"), image
    assert any(t.get("key") == "nvidia.com/gpu" and t.get("operator") == "Exists"
               for t in pod["spec"].get("tolerations", [])), pod["spec"].get("tolerations")
    env = {e["name"]: e["value"] for e in container["env"]}
    grpc_port = int(env["TIGON_LISTEN"].rsplit(":", 1)[1])
    assert {"name": "grpc", "containerPort": grpc_port} in container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == grpc_port, probe
    # Metrics leave the pod only behind a scrape token.
    if not env["TIGON_METRICS_LISTEN"].startswith("127.0.0.1:"):
        assert env.get("TIGON_METRICS_TOKEN_FILE")


def test_dockerfile_and_slurm_script_use_real_flags():
    accepted = accepted_flags()
    dockerfile = read("Dockerfile")
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    assert {a.split("=", 1)[0] for a in cmd} <= accepted
    assert "HEALTHCHECK" in dockerfile and re.search(r"^USER (?!root)", dockerfile, re.M)
    entrypoint = read("deploy", "docker", "entrypoint.sh")
    assert set(re.findall(r'"(--[a-z][a-z-]*)=', entrypoint)) <= accepted
    slurm = read("deploy", "slurm", "tigon-server.sbatch")
    # The server's command line: from its binary ("$0" inside the srun script) to its output's redirection.
    command = re.search(r'"\$0"(.*?)> >\(', slurm, re.S).group(1)
    used = flags_in(command)
    assert "--listen" in used and used <= accepted, used - accepted
    check = subprocess.run(["bash", "-n", os.path.join(ROOT, "deploy", "slurm", "tigon-server.sbatch")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def dockerfile_env(dockerfile):
    """The ENV of the final stage, as a dict (KEY=VALUE pairs, continued lines joined)."""
    final = dockerfile.rsplit("\nFROM ", 1)[1].replace("\\\n", " ")
    env = {}
    for line in re.findall(r"^ENV (.*)$", final, re.M):
        env.update(dict(pair.split("=", 1) for pair in line.split()))
    return env


def test_dockerfile_defaults_are_secure_and_its_healthcheck_follows_the_configuration():
    dockerfile = read("Dockerfile")
    healthcheck = re.search(r"^HEALTHCHECK .*$", dockerfile, re.M).group(0)
    assert "50051" not in healthcheck and "127.0.0.1" not in healthcheck, healthcheck
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))
    assert not any(a.startswith(("--metrics-listen=0.0.0.0", "--listen")) for a in entrypoint + cmd)
    env = dockerfile_env(dockerfile)
    assert env["TIGON_METRICS_LISTEN"].startswith("127.0.0.1:")
    assert env["TIGON_AUTH_TOKEN_FILE"]
    # Only the gRPC port is published by default; the metrics port stays inside the container.
    assert re.findall(r"^EXPOSE (.*)$", dockerfile, re.M) == [env["TIGON_LISTEN"].rsplit(":", 1)[1]]


def run_entrypoint(tmp_path, **env):
    """deploy/docker/entrypoint.sh with a tigon-server that prints its arguments, one a line."""
    fake = tmp_path / "fake-server"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "TIGON_SERVER_BIN": str(fake), **env}
    out = subprocess.run(["bash", os.path.join(ROOT, "deploy", "docker", "entrypoint.sh"), "--max-sessions=4"],
                         env=env, capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout.splitlines(), out.stderr


def test_docker_entrypoint_requires_auth_and_keeps_metrics_private_unless_told(tmp_path):
    tokens = tmp_path / "tokens"
    code, _, err = run_entrypoint(tmp_path, TIGON_AUTH_TOKEN_FILE=str(tokens))
    assert code != 0 and "TIGON_ALLOW_NO_AUTH" in err  # no token file mounted: no unauthenticated server
    tokens.write_text("secret-token\n")
    code, flags, err = run_entrypoint(tmp_path, TIGON_AUTH_TOKEN_FILE=str(tokens))
    assert code == 0, err
    assert f"--auth-token-file={tokens}" in flags and "--max-sessions=4" in flags
    assert "--metrics-listen=127.0.0.1:9464" in flags and "--listen=0.0.0.0:50051" in flags
    code, _, err = run_entrypoint(tmp_path, TIGON_AUTH_TOKEN_FILE=str(tokens), TIGON_METRICS_LISTEN="0.0.0.0:9464")
    assert code != 0 and "TIGON_METRICS_TOKEN_FILE" in err
    code, flags, err = run_entrypoint(tmp_path, TIGON_AUTH_TOKEN_FILE=str(tokens), TIGON_METRICS_LISTEN="0.0.0.0:9464",
                                      TIGON_METRICS_TOKEN_FILE=str(tokens), TIGON_TLS_CERT="c.pem",
                                      TIGON_TLS_KEY="k.pem", TIGON_LISTEN="0.0.0.0:6000")
    assert code == 0, err
    assert {"--metrics-listen=0.0.0.0:9464", f"--metrics-token-file={tokens}", "--tls-cert=c.pem",
            "--tls-key=k.pem", "--listen=0.0.0.0:6000"} <= set(flags)
    code, flags, err = run_entrypoint(tmp_path, TIGON_AUTH_TOKEN_FILE=str(tokens / "missing"), TIGON_ALLOW_NO_AUTH="1")
    assert code == 0 and not any(f.startswith("--auth-token-file") for f in flags), err


def run_healthcheck(**env):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.path.join(ROOT, "client", "python"), **env}
    return subprocess.run([sys.executable, os.path.join(ROOT, "deploy", "docker", "healthcheck.py")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_docker_healthcheck_follows_the_listen_address_and_tls(start_server, tmp_path):
    from test_security import make_certificates
    certs = tmp_path / "certs"
    certs.mkdir()
    f = make_certificates(certs)
    server = start_server(f"--tls-cert={f['server.pem']}", f"--tls-key={f['server.key']}", name="tls")
    port = server.address.rsplit(":", 1)[1]  # not 50051: the probe must follow TIGON_LISTEN
    tls = dict(TIGON_TLS_CERT=f["server.pem"], TIGON_TLS_KEY=f["server.key"], TIGON_HEALTHCHECK_ROOT_CERT=f["ca.pem"])
    ok = run_healthcheck(TIGON_LISTEN=f"0.0.0.0:{port}", **tls)
    assert ok.returncode == 0, ok.stderr
    assert run_healthcheck(TIGON_LISTEN=f"0.0.0.0:{port}").returncode != 0  # plaintext to a TLS port
    plain = start_server(name="plain")
    assert run_healthcheck(TIGON_LISTEN=plain.address).returncode == 0
    server.signal(signal.SIGTERM)  # draining: NOT_SERVING
    deadline = time.time() + 30
    while time.time() < deadline and run_healthcheck(TIGON_LISTEN=f"127.0.0.1:{port}", **tls).returncode == 0:
        time.sleep(0.2)
    assert run_healthcheck(TIGON_LISTEN=f"127.0.0.1:{port}", **tls).returncode != 0


def test_prometheus_config_parses_and_targets_the_metrics_port():
    config = yaml.safe_load(read("deploy", "prometheus", "prometheus.yml"))
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:9464"]
