"""--resume-sessions: after a server restart (a crash or a planned one), the sessions that saved a
checkpoint come back under their ids and owners at that checkpoint, and the client's retries find them.
What is lost is said in server/README.md: the steps after the checkpoint, pending gradients, remembered
request ids; a session that never saved does not come back, nor one its client closed."""
import signal
import socket

import numpy as np
import pytest

import tigon
from conftest import CORPUS, TINY_LLAMA, byte_batches


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tokens(path):
    path.write_text("alice-token user alice\nbob-token user bob\nroot-token admin ops\n")
    return path


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
def test_saved_sessions_come_back_after_a_restart_at_their_checkpoint(start_server, tmp_path, stop):
    root, port = tmp_path / "ckpt", free_port()
    flags = (f"--listen=127.0.0.1:{port}", f"--checkpoint-root={root}", "--resume-sessions",
             f"--auth-token-file={write_tokens(tmp_path / 'tokens')}")
    batches = byte_batches(CORPUS, 4, 32, 6, seed=5)
    probe = batches[0]
    first = start_server(*flags, name="first")
    alice = tigon.connect(first.address, token="alice-token", retries=8)
    saved = alice.create_session(TINY_LLAMA, precision="fp32", seed=3, optimizer=dict(lr=1e-2))
    for b in batches[:3]:
        saved.train_step(b)
    assert saved.save("run/step-3").step == 3
    at_checkpoint = saved.forward(probe, return_logprobs=True).logprobs
    saved.train_step(batches[3])  # lost: after the checkpoint
    never_saved = alice.create_session(TINY_LLAMA, precision="fp32", seed=4)
    closed = alice.create_session(TINY_LLAMA, precision="fp32", seed=5)
    closed.save("closed/step-0")
    closed.close()
    first.signal(stop)
    first.wait(60)

    second = start_server(*flags, name="second")
    assert second.address == first.address
    log = second.log()
    assert f"session {saved.id} resumed at step 3" in log, log
    assert f"session {never_saved.id} is not resumed: it never saved" in log
    assert "1 session(s) resumed" in log
    # The same Session handle, through the same client: its next calls find the session.
    info = saved.info()
    assert info.step == 3 and info.accumulated_batches == 0
    np.testing.assert_array_equal(saved.forward(probe, return_logprobs=True).logprobs, at_checkpoint)
    # Training goes on from the checkpoint exactly as it did before the restart.
    assert saved.train_step(batches[3]).step == 4
    with pytest.raises(tigon.NotFound):
        never_saved.info()
    with pytest.raises(tigon.NotFound):
        closed.info()
    # The owner is kept: another user may not use it.
    bob = tigon.connect(second.address, token="bob-token")
    with pytest.raises(tigon.PermissionDenied):
        bob.session(saved.id)
    # The records live in a folder of the root that only the server reads, which no checkpoint path
    # enters, an admin's included.
    assert (root / "+sessions").stat().st_mode & 0o777 == 0o700
    admin = tigon.connect(second.address, token="root-token")
    with pytest.raises(tigon.PermissionDenied, match="session records"):
        admin.session(saved.id).save("+sessions/x")
    saved.close()
    second.signal(signal.SIGTERM)
    second.wait(60)
    third = start_server(*flags, name="third")
    assert "0 session(s) resumed" in third.log(), "a session closed by its client stays closed"


def test_without_the_flag_no_session_comes_back_and_the_flag_needs_a_checkpoint_root(start_server, tmp_path):
    from conftest import server_binary
    import subprocess
    out = subprocess.run([server_binary(), "--resume-sessions"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--resume-sessions needs --checkpoint-root" in out.stderr
    root, port = tmp_path / "ckpt", free_port()
    first = start_server(f"--listen=127.0.0.1:{port}", f"--checkpoint-root={root}", name="first")
    session = first.client().create_session(TINY_LLAMA, precision="fp32")
    session.train_step(byte_batches(CORPUS, 2, 16, 1)[0])
    session.save("run")
    first.signal(signal.SIGKILL)
    first.wait(60)
    second = start_server(f"--listen=127.0.0.1:{port}", f"--checkpoint-root={root}", name="second")
    with pytest.raises(tigon.NotFound):
        tigon.connect(second.address, retries=3).session(session.id)
