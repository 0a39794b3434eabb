"""Checkpoints between tenants, links swapped in during saves, a full disk, log injection and requests
that do not parse, all through the real server on loopback."""
import ctypes
import ctypes.util
import os
import re
import resource
import signal
import threading
import time

import grpc
import numpy as np
import pytest

import tigon
from tigon.v1 import trainer_pb2 as pb
from tigon.v1 import trainer_pb2_grpc as pb_grpc
from conftest import TINY_LLAMA

PROBE = [[5, 6, 7, 8, 9, 10, 11, 12]]


def tokens_file(path):
    path.write_text("alice-token user alice\nbob-token user bob\nops-token admin ops\n")
    return path


def tree(root):
    """Every path under `root` (links not followed), relative to it."""
    out = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(folder, name), root))
    return out


# Practice: a multi-tenant store gives each principal a prefix of its own (S3 bucket policies on
# ${aws:username}/, Hugging Face namespaces); the admin role reaches all of them.
def test_each_principal_has_its_own_checkpoint_namespace(start_server, tmp_path):
    root = tmp_path / "checkpoints"
    server = start_server(f"--auth-token-file={tokens_file(tmp_path / 'tokens')}", f"--checkpoint-root={root}")
    alice, bob, ops = (server.client(token=t) for t in ("alice-token", "bob-token", "ops-token"))
    a = alice.create_session(TINY_LLAMA, precision="fp32", seed=1, optimizer=dict(lr=1e-2))
    a.train_step([[1, 2, 3, 4, 5]])
    assert a.save("private").path == "private"
    assert (root / "alice" / "private" / "model.safetensors").is_file(), "under Alice's folder"
    alices_loss = a.forward(PROBE).loss

    b = bob.create_session(TINY_LLAMA, precision="fp32", seed=2)
    bobs_loss = b.forward(PROBE).loss
    assert bobs_loss != alices_loss
    # Bob reaches only his own folder: relative, "..", absolute and linked paths to Alice's are refused.
    with pytest.raises(tigon.NotFound):
        b.load("private")
    for path in ("../alice/private", str(root / "alice" / "private"), str(root) + "/bob/../alice/private"):
        with pytest.raises(tigon.PermissionDenied, match="another principal's namespace"):
            b.load(path)
        with pytest.raises(tigon.PermissionDenied):
            b.save(path)
    os.makedirs(root / "bob", exist_ok=True)
    os.symlink(root / "alice", root / "bob" / "alice-link")
    os.symlink("../alice/private", root / "bob" / "relative-link")
    for path in ("alice-link/private", "relative-link"):
        with pytest.raises(tigon.PermissionDenied, match="symbolic link"):
            b.load(path)
    with pytest.raises(tigon.PermissionDenied):
        b.save("alice-link/private")
    # As a model, another's checkpoint is not offered (the same NOT_FOUND as for any folder not offered).
    for path in (str(root / "alice" / "private"), str(root / "bob" / "relative-link"), "relative-link",
                 "../alice/private"):
        with pytest.raises(tigon.NotFound):
            bob.create_session(path, precision="fp32")
    assert b.forward(PROBE).loss == bobs_loss, "Bob's session still holds Bob's weights"
    # Alice's checkpoint is unchanged, and Bob's own save went to his folder.
    assert b.save("private").path == "private"
    assert (root / "bob" / "private" / "model.safetensors").is_file()
    a.load("private")
    assert a.forward(PROBE).loss == alices_loss
    # The same name in both namespaces: each loads its own.
    b.load("private")
    assert b.forward(PROBE).loss == bobs_loss
    # Alice may open her own checkpoint as a model; an admin reaches every namespace from the root.
    with alice.create_session(str(root / "alice" / "private"), precision="fp32") as again:
        assert again.forward(PROBE).loss == alices_loss
    admins_view = tigon.Session(ops, b.info_at_creation)
    admins_view.load("alice/private")
    assert b.forward(PROBE).loss == alices_loss
    with ops.create_session(str(root / "bob" / "private"), precision="fp32") as admins_own:
        assert admins_own.forward(PROBE).loss == bobs_loss
    a.close()
    b.close()


# Practice: the openat2(2) RESOLVE_BENEATH discipline of container runtimes (runc's securejoin, CVE-2019-5736
# and CVE-2021-30465): resolve once, then work only through the descriptors held.
def test_links_swapped_in_during_saves_never_send_files_outside_the_root(start_server, tmp_path):
    root, outside = tmp_path / "checkpoints", tmp_path / "outside"
    os.makedirs(root / "run")
    os.makedirs(outside)
    server = start_server(f"--checkpoint-root={root}")
    session = server.client().create_session(TINY_LLAMA, precision="fp32")
    session.train_step([[1, 2, 3, 4]])
    stop = threading.Event()

    def swap(path, target):
        """Puts a link to `target` at `path` for a moment, then the folder back (renames are atomic)."""
        link, hidden = str(path) + ".link", str(path) + ".real"
        try:
            os.symlink(target, link)
            os.rename(str(path), hidden)
            os.rename(link, str(path))
            time.sleep(0.0005)
            os.rename(str(path), link)
            os.rename(hidden, str(path))
            os.unlink(link)
        except OSError:
            # The server moved a folder of its own in between (the attack raced a save that was
            # publishing): the attacker keeps going rather than end its thread.
            pass

    def attacker():
        pid = server.proc.pid
        while not stop.is_set():
            swap(root / "run", outside)  # the parent of every checkpoint
            # The temporary names a save uses next: "<name>.tmp-<pid>-<n>".
            for n in range(0, 400, 37):
                try:
                    os.symlink(outside, root / "run" / f"latest.tmp-{pid}-{n}")
                except OSError:
                    pass
            if (root / "run" / "latest").is_dir():
                swap(root / "run" / "latest", outside)

    thread = threading.Thread(target=attacker)
    thread.start()
    outcomes = {}
    try:
        for i in range(100):
            try:
                session.save("run/latest")
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except tigon.TigonError as error:
                outcomes[type(error).__name__] = outcomes.get(type(error).__name__, 0) + 1
    finally:
        stop.set()
        thread.join()
    assert os.listdir(outside) == [], f"files escaped the checkpoint root: {tree(outside)} ({outcomes})"
    assert outcomes.get("ok", 0) > 0, outcomes
    assert set(outcomes) <= {"ok", "PermissionDenied", "Aborted", "TigonError", "InvalidArgument", "NotFound", "Internal"}, \
        outcomes
    # The server is unharmed and saves normally once the links are gone.
    assert session.save("run/final").path == "run/final"
    assert (root / "run" / "final" / "optimizer.safetensors").is_file()


def mount_tmpfs(path, size):
    """Mounts a tmpfs of `size` at `path` (needs root or CAP_SYS_ADMIN); False when that is not allowed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    os.makedirs(path, exist_ok=True)
    return libc.mount(b"tmpfs", str(path).encode(), b"tmpfs", 0, f"size={size}".encode()) == 0


def unmount(path):
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.umount2(str(path).encode(), 2)  # MNT_DETACH


def limit_file_size(limit):
    """For preexec_fn: files the server writes may grow to `limit` bytes (SIGXFSZ ignored, so writes
    past it fail with EFBIG instead of killing the process)."""
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


# Practice: gRPC's status-code guide: RESOURCE_EXHAUSTED for "the entire file system is out of space".
def test_a_full_disk_during_a_save_is_resource_exhausted(start_server, tmp_path):
    root = tmp_path / "small"
    # A 256 KiB tmpfs holds the folders and the weights but not the optimizer state (the tiny model's
    # files are about 420 KB). Where mounting is not allowed (no root or CAP_SYS_ADMIN), the server's files
    # are capped at 256 KiB with RLIMIT_FSIZE instead: EFBIG, which maps to the same status.
    mounted = mount_tmpfs(root, "256k")
    try:
        server = start_server(f"--checkpoint-root={root}",
                              preexec_fn=None if mounted else limit_file_size(256 << 10))
        session = server.client().create_session(TINY_LLAMA, precision="fp32")
        session.train_step([[1, 2, 3, 4]])
        with pytest.raises(tigon.ResourceExhausted, match="saving checkpoint 'full' failed") as error:
            session.save("full")
        assert ("No space left" if mounted else "too large") in str(error.value), str(error.value)
        assert not [n for n in tree(root) if ".tmp-" in n], "the temporary folder is removed"
        assert not os.path.exists(root / "full")
        assert session.train_step([[1, 2, 3, 4]]).step == 2, "the session is unharmed"
        server.stop()
    finally:
        if mounted:
            unmount(root)


# Practice: OWASP's logging cheat sheet (encode CR/LF and other control characters of user input) and
# CWE-117; bounded log lines as in Envoy's access-log truncation.
def test_client_strings_cannot_forge_log_lines_or_flood_the_log(start_server, tmp_path):
    server = start_server(f"--checkpoint-root={tmp_path / 'checkpoints'}")
    stub = pb_grpc.TrainerStub(grpc.insecure_channel(server.address))
    forged = "s-1\n[2026-01-01 00:00:00.000] [info] session s-2 closed"
    for session_id in (forged, "x" * (1 << 20)):
        with pytest.raises(grpc.RpcError) as error:
            stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
        assert len(error.value.details()) < 1024, "the id is not echoed whole"
        assert "\n" not in error.value.details()
    session = server.client().create_session(TINY_LLAMA, precision="fp32")
    with pytest.raises(grpc.RpcError) as error:
        stub.TrainStep(pb.TrainStepRequest(session_id=session.id, request_id="r" * 4096,
                                           batch=pb.Batch(batch=1, seq_len=4, input_ids=[1, 2, 3, 4])), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in error.value.details()
    for path in ("../a\n[2026-01-01 00:00:00.000] [critical] forged", "p" * (1 << 20), "q\r\x1b[2J" * 100):
        with pytest.raises(tigon.TigonError) as error:
            session.save(path)
        assert len(str(error.value)) < 1024 and "\n" not in str(error.value)
    for model_path in ("/no/such\nfolder", "/no/such\nfolder" + "z" * (1 << 16)):
        with pytest.raises(tigon.TigonError) as error:
            server.client().create_session(model_path, precision="fp32")
        assert "\n" not in str(error.value) and len(str(error.value)) < 1024
    session.close()
    log = server.log()
    assert "s-1\\n[2026" in log, "the id appears escaped"
    assert len(log) < 200_000, f"the log grew by {len(log)} bytes"
    for line in log.splitlines():  # every line is one the server wrote: none starts with forged text
        assert len(line) < 5000, line[:200]
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+ [TDIWEC] ", line), line[:200]


# Practice: gRPC's status-code guide: a request the server cannot decode is INVALID_ARGUMENT, and
# the message says so (by default gRPC C++ answers INTERNAL with no message at all).
def test_a_request_that_does_not_parse_is_invalid_argument_with_a_message(start_server):
    server = start_server()
    channel = grpc.insecure_channel(server.address)
    for method in ("TrainStep", "CreateSession", "SaveCheckpoint"):
        raw = channel.unary_unary(f"/tigon.v1.Trainer/{method}", request_serializer=None,
                                  response_deserializer=None)
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\x80", b"\x08"):
            with pytest.raises(grpc.RpcError) as error:
                raw(garbage, timeout=60)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, garbage, error.value)
            assert f"tigon.v1.{method}Request" in error.value.details()
            assert "do not parse" in error.value.details()
    assert server.client().server_info().version, "the server still serves"
