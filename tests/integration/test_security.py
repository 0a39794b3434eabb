"""Hostile and careless clients: malformed input on every RPC, absurd model configs, missing or wrong
tokens, sessions of other clients, TLS and mutual TLS. Each test names the practice it follows."""
import json
import math
import time
import os
import subprocess

import grpc
import numpy as np
import pytest

import tigon
from tigon.v1 import trainer_pb2 as pb
from tigon.v1 import trainer_pb2_grpc as pb_grpc
from conftest import TINY_LLAMA

PROBE = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 30, 40, 50, 60, 70, 80, 90]]
C = grpc.StatusCode


def raw_stub(address):
    """The generated stub, without the client's own checks, so that malformed requests reach the server."""
    return pb_grpc.TrainerStub(grpc.insecure_channel(address))


def call(rpc, request):
    """The status code of a raw call."""
    try:
        rpc(request, timeout=60)
        return C.OK
    except grpc.RpcError as error:
        return error.code()


def batch(rows=1, seq_len=4, ids=None, labels=None, weights=None):
    b = pb.Batch(batch=rows, seq_len=seq_len)
    b.input_ids.extend(ids if ids is not None else [(7 * i + 1) % 256 for i in range(rows * seq_len)])
    if labels is not None:
        b.labels.extend(labels)
    if weights is not None:
        b.loss_weights.extend(weights)
    return b


def snapshot(session):
    """Everything a failed call must leave alone: step, pending gradients and the weights (through
    the log-probabilities of a fixed batch, bit-exact in fp32 on the CPU)."""
    info = session.info()
    return info.step, info.accumulated_batches, session.forward(PROBE, return_logprobs=True).logprobs


# Practice: Triton's L0 input-validation suites (every malformed tensor and shape refused with a precise
# status, the server unharmed) plus Tinker's contract that a failed call changes no training state.
def test_malformed_input_on_every_rpc_gets_the_right_status_and_changes_nothing(shared_server):
    client = shared_server.client()
    stub = raw_stub(shared_server.address)
    with client.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=1e-2)) as session:
        session.train_step([[1, 2, 3, 4, 5, 6]])
        session.forward_backward([[9, 8, 7, 6, 5]])  # pending gradients: a failed call must keep them too
        before = snapshot(session)
        assert before[:2] == (1, 1)
        sid = session.id
        nan, inf = float("nan"), float("inf")
        bad_batches = {
            "ragged (7 ids for 2 x 4)": (batch(2, 4, ids=list(range(1, 8))), C.INVALID_ARGUMENT),
            "empty (0 x 0)": (batch(0, 0, ids=[]), C.INVALID_ARGUMENT),
            "empty ids for 1 x 4": (batch(1, 4, ids=[]), C.INVALID_ARGUMENT),
            "negative shape": (batch(-1, -4, ids=[]), C.INVALID_ARGUMENT),
            "labels of another shape": (batch(1, 4, labels=[1, 2, 3]), C.INVALID_ARGUMENT),
            "loss weights of another shape": (batch(1, 4, weights=[1.0] * 5), C.INVALID_ARGUMENT),
            "id = vocab size": (batch(1, 4, ids=[1, 256, 2, 3]), C.INVALID_ARGUMENT),
            "negative id": (batch(1, 4, ids=[1, -1, 2, 3]), C.INVALID_ARGUMENT),
            "id = 2^31 - 1": (batch(1, 4, ids=[1, 2**31 - 1, 2, 3]), C.INVALID_ARGUMENT),
            "label outside the vocabulary": (batch(1, 4, labels=[1, 2, 256, -100]), C.INVALID_ARGUMENT),
            "negative label other than -100": (batch(1, 4, labels=[1, 2, -5, -100]), C.INVALID_ARGUMENT),
            "NaN loss weight": (batch(1, 4, weights=[1, nan, 1, 1]), C.INVALID_ARGUMENT),
            "inf loss weight": (batch(1, 4, weights=[1, inf, 1, 1]), C.INVALID_ARGUMENT),
            "-inf loss weight": (batch(1, 4, weights=[1, -inf, 1, 1]), C.INVALID_ARGUMENT),
            "negative loss weight": (batch(1, 4, weights=[1, -0.5, 1, 1]), C.INVALID_ARGUMENT),
            "all loss weights zero": (batch(1, 4, weights=[0, 0, 0, 0]), C.INVALID_ARGUMENT),
            "every label ignored": (batch(1, 4, labels=[-100] * 4), C.INVALID_ARGUMENT),
            "seq_len 1 with default labels": (batch(1, 1), C.INVALID_ARGUMENT),
            "seq_len over max_position_embeddings": (batch(1, 129), C.INVALID_ARGUMENT),
            "tokens over --max-batch-tokens": (batch(1, 3000, ids=[3] * 3000), C.RESOURCE_EXHAUSTED),
            "batch * seq_len overflowing int64": (batch(2**40, 2**40, ids=[1]), C.RESOURCE_EXHAUSTED),
            "message over --max-message-bytes": (batch(1, 2000, ids=[200] * 2000, weights=[1.0] * 2000),
                                                 C.RESOURCE_EXHAUSTED),
        }
        cases = []
        for name, (b, code) in bad_batches.items():
            cases.append((f"TrainStep: {name}", stub.TrainStep, pb.TrainStepRequest(session_id=sid, batch=b), code))
            cases.append((f"ForwardBackward: {name}", stub.ForwardBackward,
                          pb.ForwardBackwardRequest(session_id=sid, batch=b), code))
            if name not in ("every label ignored", "seq_len 1 with default labels", "all loss weights zero"):
                cases.append((f"Forward: {name}", stub.Forward, pb.ForwardRequest(session_id=sid, batch=b), code))
        cases += [
            ("TrainStep without a batch", stub.TrainStep, pb.TrainStepRequest(session_id=sid), C.INVALID_ARGUMENT),
            ("ForwardBackward without a batch", stub.ForwardBackward, pb.ForwardBackwardRequest(session_id=sid),
             C.INVALID_ARGUMENT),
            ("Forward without a batch", stub.Forward, pb.ForwardRequest(session_id=sid), C.INVALID_ARGUMENT),
        ]
        bad_optimizers = [dict(lr=-1e-3), dict(lr=nan), dict(lr=inf), dict(beta1=1.0), dict(beta1=-0.1),
                          dict(beta2=1.0), dict(beta2=1.5), dict(eps=0.0), dict(eps=-1e-8), dict(eps=nan),
                          dict(weight_decay=-0.1), dict(max_grad_norm=-1.0), dict(max_grad_norm=inf)]
        for settings in bad_optimizers:
            o = pb.OptimizerSettings(**settings)
            cases.append((f"OptimStep {settings}", stub.OptimStep, pb.OptimStepRequest(session_id=sid, optimizer=o),
                          C.INVALID_ARGUMENT))
            cases.append((f"TrainStep {settings}", stub.TrainStep,
                          pb.TrainStepRequest(session_id=sid, batch=batch(), optimizer=o), C.INVALID_ARGUMENT))
        for name, path, code in [("empty", "", C.INVALID_ARGUMENT), ("NUL byte", "a\0b", C.INVALID_ARGUMENT),
                                 ("escape", "../../etc", C.PERMISSION_DENIED),
                                 ("absolute", "/etc/passwd", C.PERMISSION_DENIED),
                                 ("temporary name", "run/x.tmp-1-0", C.INVALID_ARGUMENT)]:
            cases.append((f"SaveCheckpoint {name}", stub.SaveCheckpoint,
                          pb.SaveCheckpointRequest(session_id=sid, path=path), code))
            cases.append((f"LoadCheckpoint {name}", stub.LoadCheckpoint,
                          pb.LoadCheckpointRequest(session_id=sid, path=path), code))
        cases += [
            ("LoadCheckpoint never saved", stub.LoadCheckpoint, pb.LoadCheckpointRequest(session_id=sid, path="nope"),
             C.NOT_FOUND),
            ("SaveCheckpoint with pending gradients", stub.SaveCheckpoint,
             pb.SaveCheckpointRequest(session_id=sid, path="pending"), C.FAILED_PRECONDITION),
            ("MeasureSavings 0 x 16", stub.MeasureSavings, pb.MeasureSavingsRequest(session_id=sid, batch=0, seq_len=16),
             C.INVALID_ARGUMENT),
            ("MeasureSavings past max_position_embeddings", stub.MeasureSavings,
             pb.MeasureSavingsRequest(session_id=sid, batch=1, seq_len=129), C.INVALID_ARGUMENT),
        ]
        # Unknown and empty session ids on every session RPC.
        for bad_id, code in (("s-doesnotexist", C.NOT_FOUND), ("", C.INVALID_ARGUMENT)):
            cases += [
                (f"GetSession {bad_id!r}", stub.GetSession, pb.GetSessionRequest(session_id=bad_id), code),
                (f"CloseSession {bad_id!r}", stub.CloseSession, pb.CloseSessionRequest(session_id=bad_id), code),
                (f"TrainStep {bad_id!r}", stub.TrainStep, pb.TrainStepRequest(session_id=bad_id, batch=batch()), code),
                (f"ForwardBackward {bad_id!r}", stub.ForwardBackward,
                 pb.ForwardBackwardRequest(session_id=bad_id, batch=batch()), code),
                (f"OptimStep {bad_id!r}", stub.OptimStep, pb.OptimStepRequest(session_id=bad_id), code),
                (f"Forward {bad_id!r}", stub.Forward, pb.ForwardRequest(session_id=bad_id, batch=batch()), code),
                (f"SaveCheckpoint {bad_id!r}", stub.SaveCheckpoint,
                 pb.SaveCheckpointRequest(session_id=bad_id, path="x"), code),
                (f"MeasureSavings {bad_id!r}", stub.MeasureSavings,
                 pb.MeasureSavingsRequest(session_id=bad_id, batch=1, seq_len=8), code),
            ]
        failures = []
        for name, rpc, request, code in cases:
            got = call(rpc, request)
            if got != code:
                failures.append(f"{name}: {got} (expected {code})")
            after = snapshot(session)
            if after[:2] != before[:2] or not np.array_equal(after[2], before[2]):
                failures.append(f"{name}: changed the session: step/pending {before[:2]} -> {after[:2]}")
        assert not failures, "\n".join(failures)
        print(f"\n{len(cases)} malformed requests refused, the session unchanged after each")
        # The session still works, with its pending gradients intact.
        assert session.optim_step().step == 2


def create_status(stub, config=None, raw_json=None, **fields):
    request = pb.CreateSessionRequest(**{"precision": "fp32", **fields})
    request.config_json = raw_json if raw_json is not None else json.dumps(config)
    try:
        stub.CreateSession(request, timeout=60)
        return C.OK, ""
    except grpc.RpcError as error:
        return error.code(), error.details()


# Practice: Triton's L0 model-configuration tests (bad configs refused at load with a precise error),
# and a memory bound checked before allocating, as serving systems do for model sizes.
def test_absurd_session_configs_are_refused_before_anything_is_allocated(shared_server):
    client = shared_server.client()
    stub = raw_stub(shared_server.address)
    with client.create_session(TINY_LLAMA, precision="fp32") as bystander:
        before = snapshot(bystander)
        sessions_before = client.server_info().active_sessions
        cases = [
            # Sizes past every released model are capped (models/config.cpp) ...
            ("huge hidden size", dict(TINY_LLAMA, hidden_size=2**40), {}, C.INVALID_ARGUMENT, "hidden_size"),
            ("huge vocabulary", dict(TINY_LLAMA, vocab_size=10**12), {}, C.INVALID_ARGUMENT, "vocab_size"),
            ("many layers", dict(TINY_LLAMA, num_hidden_layers=10**9), {}, C.INVALID_ARGUMENT, "num_hidden_layers"),
            ("int64 overflow", dict(TINY_LLAMA, hidden_size=2**62, intermediate_size=2**62), {},
             C.INVALID_ARGUMENT, "hidden_size"),
            # ... as the attack's huge head (19 GiB of RSS in a minute) and 65,536 thin layers (37 s a step) were.
            ("huge head_dim", dict(TINY_LLAMA, hidden_size=1, num_attention_heads=1, num_key_value_heads=1,
                                   head_dim=2**31 - 2), {}, C.INVALID_ARGUMENT, "head_dim"),
            ("65536 thin layers", dict(TINY_LLAMA, hidden_size=4, num_attention_heads=1, num_key_value_heads=1,
                                       intermediate_size=4, num_hidden_layers=65536), {},
             C.INVALID_ARGUMENT, "num_hidden_layers"),
            # ... and under the caps, a model over --max-parameters (default 1e11) or over the machine's memory
            # is refused from its config, before anything is allocated.
            ("over --max-parameters", dict(TINY_LLAMA, vocab_size=2**22, hidden_size=2**16, num_attention_heads=512,
                                           num_key_value_heads=512), {}, C.RESOURCE_EXHAUSTED, "--max-parameters"),
            ("over the machine's memory", dict(TINY_LLAMA, vocab_size=2**20, hidden_size=2**15,
                                               num_attention_heads=256, num_key_value_heads=256), {},
             C.RESOURCE_EXHAUSTED, "available"),
            ("max_position_embeddings 0", dict(TINY_LLAMA, max_position_embeddings=0), {}, C.INVALID_ARGUMENT,
             "max_position_embeddings"),
            ("max_position_embeddings -1", dict(TINY_LLAMA, max_position_embeddings=-1), {}, C.INVALID_ARGUMENT,
             "max_position_embeddings"),
            ("zero layers", dict(TINY_LLAMA, num_hidden_layers=0), {}, C.INVALID_ARGUMENT, "num_hidden_layers"),
            ("negative hidden size", dict(TINY_LLAMA, hidden_size=-32), {}, C.INVALID_ARGUMENT, "hidden_size"),
            ("fractional hidden size", dict(TINY_LLAMA, hidden_size=32.5), {}, C.INVALID_ARGUMENT, "hidden_size"),
            ("hidden size as text", dict(TINY_LLAMA, hidden_size="32"), {}, C.INVALID_ARGUMENT, "hidden_size"),
            ("zero vocabulary", dict(TINY_LLAMA, vocab_size=0), {}, C.INVALID_ARGUMENT, "vocab_size"),
            ("heads not dividing hidden", dict(TINY_LLAMA, num_attention_heads=5, num_key_value_heads=5), {},
             C.INVALID_ARGUMENT, "divisible"),
            ("kv heads not dividing heads", dict(TINY_LLAMA, num_key_value_heads=3), {}, C.INVALID_ARGUMENT,
             "num_key_value_heads"),
            ("unknown activation", dict(TINY_LLAMA, hidden_act="relu6"), {}, C.INVALID_ARGUMENT, "activation"),
            ("unknown model_type", dict(TINY_LLAMA, model_type="gpt2"), {}, C.INVALID_ARGUMENT, "not supported"),
            ("model_type missing", {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}, {},
             C.INVALID_ARGUMENT, "model_type"),
            ("bad precision", TINY_LLAMA, dict(precision="fp8"), C.INVALID_ARGUMENT, "precision"),
            ("bad kernels", TINY_LLAMA, dict(kernels="fastest"), C.INVALID_ARGUMENT, "kernels"),
            ("bad kernel override", TINY_LLAMA, dict(kernel_overrides={"rms_norm": "maybe"}), C.INVALID_ARGUMENT,
             "kernel_overrides"),
            ("negative lr", TINY_LLAMA, dict(optimizer=pb.OptimizerSettings(lr=-1.0)), C.INVALID_ARGUMENT, "lr"),
            ("beta1 = 1", TINY_LLAMA, dict(optimizer=pb.OptimizerSettings(beta1=1.0)), C.INVALID_ARGUMENT, "beta1"),
            ("beta2 > 1", TINY_LLAMA, dict(optimizer=pb.OptimizerSettings(beta2=1.01)), C.INVALID_ARGUMENT, "beta2"),
            ("eps = 0", TINY_LLAMA, dict(optimizer=pb.OptimizerSettings(eps=0.0)), C.INVALID_ARGUMENT, "eps"),
            ("NaN weight decay", TINY_LLAMA, dict(optimizer=pb.OptimizerSettings(weight_decay=math.nan)),
             C.INVALID_ARGUMENT, "weight_decay"),
            ("device -1", TINY_LLAMA, dict(devices=[-1]), C.INVALID_ARGUMENT, "device -1"),
        ]
        failures = []
        for name, config, fields, code, fragment in cases:
            started = time.monotonic()
            got, message = create_status(stub, config, **fields)
            seconds = time.monotonic() - started
            if got != code or fragment not in message:
                failures.append(f"{name}: {got} {message!r} (expected {code} mentioning {fragment!r})")
            elif seconds > 1.0:
                failures.append(f"{name}: refused after {seconds:.1f} s, not at once")
        for name, text in [("bad JSON", "{not json"), ("JSON array", "[1, 2]"), ("empty", ""),
                           ("truncated", json.dumps(TINY_LLAMA)[:-10])]:
            got, message = create_status(stub, raw_json=text)
            if got != C.INVALID_ARGUMENT:
                failures.append(f"{name}: {got} {message!r} (expected INVALID_ARGUMENT)")
        assert not failures, "\n".join(failures)
        assert client.server_info().active_sessions == sessions_before, "no session was created or leaked"
        after = snapshot(bystander)
        assert after[:2] == before[:2] and np.array_equal(after[2], before[2])


def test_deeply_nested_config_json_is_refused_and_no_tenant_loses_a_session(start_server):
    """A 200 KB config_json nested 100,000 deep killed the server with SIGSEGV (a recursive copy of the
    parsed value); the parse now bounds depth, for every user's sake."""
    server = start_server("--max-message-bytes=1048576")
    client = server.client()
    stub = raw_stub(server.address)
    deep = "[" * 100_000 + "]" * 100_000
    with client.create_session(TINY_LLAMA, precision="fp32") as bystander:
        before = snapshot(bystander)
        for text in ('{"model_type": "llama", "x": ' + deep + "}", deep, '{"a":' * 50_000 + "1" + "}" * 50_000):
            got, message = create_status(stub, raw_json=text)
            assert got == C.INVALID_ARGUMENT and "deeper than 64" in message, (got, message)
        after = snapshot(bystander)
        assert after[:2] == before[:2] and np.array_equal(after[2], before[2])
    assert server.proc.poll() is None


def write_tokens(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


# Practice: gRPC's authentication guide (per-call bearer credentials; UNAUTHENTICATED for who-are-you,
# PERMISSION_DENIED for may-you) and Tinker's model of a training run owned by the key that created it.
def test_tokens_and_session_ownership(start_server, tmp_path):
    tokens = write_tokens(tmp_path / "tokens", [
        "# TOKEN ROLE NAME; a bare token is the user 'default'",
        "alice-1 user alice", "alice-2 user alice", "bob-1 user bob", "root-1 admin ops", "legacy-token"])
    server = start_server(f"--auth-token-file={tokens}")
    for bad in (server.client(), server.client(token="wrong"), server.client(token="alice")):
        with pytest.raises(tigon.Unauthenticated):
            bad.server_info()
        with pytest.raises(tigon.Unauthenticated):
            bad.create_session(TINY_LLAMA, precision="fp32")
        assert bad.health() == "SERVING", "health stays open for probes"
    alice, alice_rotated, bob, admin = (server.client(token=t) for t in ("alice-1", "alice-2", "bob-1", "root-1"))
    legacy = server.client(token="legacy-token")
    session = alice.create_session(TINY_LLAMA, precision="fp32")
    session.train_step([[1, 2, 3, 4]])
    before = snapshot(session)
    # bob may not touch it, through any RPC; nor may the tokenless or a wrong token.
    bobs_view = tigon.Session(bob, session.info_at_creation)
    for name, attempt in [("info", lambda: bobs_view.info()), ("train_step", lambda: bobs_view.train_step([[1, 2]])),
                          ("forward", lambda: bobs_view.forward([[1, 2]])),
                          ("forward_backward", lambda: bobs_view.forward_backward([[1, 2]])),
                          ("optim_step", lambda: bobs_view.optim_step()),
                          ("save", lambda: bobs_view.save("bob")), ("load", lambda: bobs_view.load("bob")),
                          ("measure_savings", lambda: bobs_view.measure_savings(1, 8)),
                          ("close", lambda: bobs_view.close()), ("session", lambda: bob.session(session.id))]:
        with pytest.raises(tigon.PermissionDenied, match="belongs to another client"):
            attempt()
    assert session.id not in [s.session_id for s in bob.list_sessions()]
    assert session.id not in [s.session_id for s in legacy.list_sessions()]
    after = snapshot(session)
    assert after[:2] == before[:2] and np.array_equal(after[2], before[2]), "refused calls changed nothing"
    # The owner under either of its tokens (a rotation) and an admin may.
    assert alice_rotated.session(session.id).train_step([[1, 2, 3, 4]]).step == 2
    assert tigon.Session(admin, session.info_at_creation).train_step([[1, 2, 3, 4]]).step == 3
    assert session.id in [s.session_id for s in admin.list_sessions()]
    # Bare tokens are one user, as before roles existed.
    with legacy.create_session(TINY_LLAMA, precision="fp32") as own:
        assert own.train_step([[1, 2, 3, 4]]).step == 1
        with pytest.raises(tigon.PermissionDenied):
            tigon.Session(alice, own.info_at_creation).info()
    tigon.Session(admin, session.info_at_creation).close()
    log = server.log()
    assert "auth on (5 tokens, 1 admin)" in log
    for secret in ("alice-1", "alice-2", "bob-1", "root-1", "legacy-token"):
        assert secret not in log, "a token leaked into the log"


def make_certificates(folder):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by it, and a
    client certificate from another CA; EC P-256 keys, made with Debian's openssl."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "rogue-ca"):
        openssl("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2",
                "-subj", f"/CN=tigon test {ca}")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, ca, ext in (("server", "ca", "server.ext"), ("client", "ca", "client.ext"),
                          ("rogue-client", "rogue-ca", "client.ext")):
        openssl("req", "-new", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", ext)
    return {name: str(folder / name) for name in os.listdir(folder)}


# Practice: gRPC's TLS/mTLS authentication guide and Triton's L0_grpc SSL tests: a TLS port refuses
# plaintext, a client that does not trust the server's CA refuses it, and under mutual TLS a client
# without a certificate (or with one from another CA) fails the handshake.
def test_tls_and_mutual_tls_with_certificates_made_by_openssl(start_server, tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    f = make_certificates(certs)
    tls = start_server(f"--tls-cert={f['server.pem']}", f"--tls-key={f['server.key']}", name="tls")
    good = tls.client(root_cert=f["ca.pem"])
    with good.create_session(TINY_LLAMA, precision="fp32") as session:
        assert session.train_step([[1, 2, 3, 4]]).step == 1
    assert good.health() == "SERVING"
    assert tigon.connect(tls.address.replace("127.0.0.1", "localhost"), root_cert=open(f["ca.pem"], "rb").read()
                         ).server_info().version, "PEM bytes work too, and the DNS name"
    with pytest.raises(tigon.Unavailable):
        tls.client().server_info(timeout=10)  # plaintext to a TLS port
    with pytest.raises(tigon.Unavailable):
        tls.client(root_cert=f["rogue-ca.pem"]).server_info(timeout=10)  # a server it cannot verify

    mtls = start_server(f"--tls-cert={f['server.pem']}", f"--tls-key={f['server.key']}",
                        f"--tls-client-ca={f['ca.pem']}", name="mtls")
    member = mtls.client(root_cert=f["ca.pem"], client_cert=f["client.pem"], client_key=f["client.key"])
    with member.create_session(TINY_LLAMA, precision="fp32") as session:
        assert session.train_step([[1, 2, 3, 4]]).step == 1
    for refused in (mtls.client(root_cert=f["ca.pem"]),
                    mtls.client(root_cert=f["ca.pem"], client_cert=f["rogue-client.pem"],
                                client_key=f["rogue-client.key"]),
                    mtls.client()):
        with pytest.raises(tigon.Unavailable):
            refused.server_info(timeout=10)
        with pytest.raises(tigon.Unavailable):
            refused.health(timeout=10)
    assert "mutual TLS" in mtls.log() and "(TLS)" in tls.log()
    with pytest.raises(tigon.InvalidArgument, match="client_cert and client_key"):
        tigon.connect(mtls.address, client_cert=f["client.pem"])
    # A key that is not PEM stops the start with a message naming the flag.
    bad = subprocess.run([tls.proc.args[0], "--listen=127.0.0.1:0", "--metrics-listen=off",
                          f"--tls-cert={f['server.pem']}", f"--tls-key={f['server.csr']}"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--tls-key" in bad.stderr


def test_finetune_cli_speaks_mutual_tls(start_server, tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    f = make_certificates(certs)
    tokens = write_tokens(tmp_path / "tokens", ["cli-token user cli"])
    server = start_server(f"--tls-cert={f['server.pem']}", f"--tls-key={f['server.key']}",
                          f"--tls-client-ca={f['ca.pem']}", f"--auth-token-file={tokens}")
    from tigon import finetune
    args = ["--server", server.address, "--token-file", str(tokens), "--tls-root-cert", f["ca.pem"],
            "--tls-client-cert", f["client.pem"], "--tls-client-key", f["client.key"],
            "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--hidden", "32", "--precision", "fp32",
            "--kernels", "fused", "--json", str(tmp_path / "run.json")]
    assert finetune.main(args) == 0
    assert json.loads((tmp_path / "run.json").read_text())[0]["steps"] == 3
    with pytest.raises(SystemExit, match="UNAVAILABLE"):
        finetune.main(args[:6] + args[10:])  # without the client certificate and key
