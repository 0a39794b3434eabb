"""Every status code the service promises, each produced by a request that deserves it; after each one
the server still serves and the session is unchanged."""
import os
import socket
import time

import numpy as np
import pytest

import tigon
from conftest import TINY_LLAMA


def assert_still_serving(client, session=None, step=None):
    assert client.server_info().version
    if session is not None:
        info = session.info()
        assert info.step == step, "a failed call must not change the session"
        assert info.accumulated_batches == 0


@pytest.fixture
def session(shared_server):
    client = shared_server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as s:
        yield client, s


def test_invalid_argument(session):
    client, s = session
    cases = [
        (lambda: s.train_step([[1, 2, 300, 4]]), "input_ids[0][2] = 300 is outside the vocabulary"),
        (lambda: s.train_step([[1, 2, 3, 4]], labels=[[1, 2, 3, 256]]), "labels[0][3] = 256"),
        (lambda: s.train_step([[1, 2, 3, 4]], loss_weights=[[1, -1, 1, 1]]), "loss_weights[0][1]"),
        (lambda: s.train_step([[1, 2, 3, 4]], loss_weights=[[1, float("nan"), 1, 1]]), "loss_weights[0][1]"),
        (lambda: s.train_step([[1, 2, 3, 4]], labels=[[-100] * 4]), "every label is -100"),
        (lambda: s.forward_backward([[1]]), "seq_len must be at least 2"),
        (lambda: s.train_step(np.zeros((1, 129), dtype=np.int32)), "max_position_embeddings 128"),
        (lambda: s.optim_step(lr=-1.0), "lr"),
        (lambda: client.create_session(dict(TINY_LLAMA, model_type="gpt2")), "not supported"),
        (lambda: client.create_session(TINY_LLAMA, precision="fp8"), "precision"),
        (lambda: client.create_session(dict(TINY_LLAMA, hidden_size=-4), precision="fp32"), "hidden_size"),
        (lambda: client.create_session(TINY_LLAMA, precision="fp32", devices=[7]), "device 7"),
    ]
    for call, fragment in cases:
        with pytest.raises(tigon.InvalidArgument) as err:
            call()
        assert fragment in err.value.message, (fragment, err.value.message)
        assert_still_serving(client, s, step=0)
    # Shape mistakes are caught by the client before anything is sent.
    with pytest.raises(tigon.InvalidArgument, match="ragged"):
        s.train_step([[1, 2, 3], [4, 5]])
    with pytest.raises(tigon.InvalidArgument, match="shape"):
        s.train_step([[1, 2, 3]], labels=[[1, 2]])


def test_not_found(session, shared_server):
    client, s = session
    with pytest.raises(tigon.NotFound, match="no session 's-0000'"):
        client.session("s-0000")
    with pytest.raises(tigon.NotFound, match="no checkpoint 'never-saved'"):
        s.load("never-saved")
    with pytest.raises(tigon.NotFound, match="names no model this server offers"):
        client.create_session("/nonexistent/model/folder")
    closed = client.create_session(TINY_LLAMA, precision="fp32")
    closed.close()
    with pytest.raises(tigon.NotFound):
        closed.train_step([[1, 2, 3]])
    assert_still_serving(client, s, step=0)


def test_resource_exhausted_says_which_limit(session, shared_server):
    client, s = session
    with pytest.raises(tigon.ResourceExhausted, match="--max-batch-tokens"):
        s.train_step(np.ones((1, 3000), dtype=np.int32))  # 3000 tokens > 2048, message < 8192 bytes
    with pytest.raises(tigon.ResourceExhausted, match="larger than max"):
        # 2000 tokens with weights and labels: over the 8192-byte message limit.
        s.train_step(np.full((1, 2000), 200), labels=np.full((1, 2000), 200),
                     loss_weights=np.ones((1, 2000)))
    assert_still_serving(client, s, step=0)


def test_session_limit_is_resource_exhausted(start_server):
    server = start_server("--max-sessions=1")
    client = server.client()
    first = client.create_session(TINY_LLAMA, precision="fp32")
    with pytest.raises(tigon.ResourceExhausted, match="--max-sessions=1"):
        client.create_session(TINY_LLAMA, precision="fp32")
    first.close()
    client.create_session(TINY_LLAMA, precision="fp32").close()


def test_failed_precondition(session, start_server):
    client, s = session
    with pytest.raises(tigon.FailedPrecondition, match="ForwardBackward"):
        s.optim_step()
    assert_still_serving(client, s, step=0)
    server = start_server()  # no --checkpoint-root
    with server.client().create_session(TINY_LLAMA, precision="fp32") as other:
        with pytest.raises(tigon.FailedPrecondition, match="--checkpoint-root"):
            other.save("x")


def test_permission_denied_outside_the_checkpoint_root(session, shared_server, tmp_path):
    client, s = session
    for path in ("../escape", "a/../../escape", str(tmp_path / "abs"), "/etc"):
        with pytest.raises(tigon.PermissionDenied, match="outside the server's checkpoint root"):
            s.save(path)
        with pytest.raises(tigon.PermissionDenied):
            s.load(path)
    os.symlink(tmp_path, os.path.join(shared_server.checkpoint_root, "link-out"))
    with pytest.raises(tigon.PermissionDenied):
        s.save("link-out/ckpt")
    assert not os.path.exists(tmp_path / "ckpt")
    assert not os.path.exists(tmp_path / "abs")
    assert_still_serving(client, s, step=0)


def test_deadline_passing_while_queued_applies_nothing(shared_server):
    client = shared_server.client()
    # A wider model and a full batch make one step slow enough to queue a second call behind it.
    wide = dict(TINY_LLAMA, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=8)
    with client.create_session(wide, precision="fp32") as s:
        slow_batch = np.random.default_rng(0).integers(0, 256, size=(8, 64))
        slow = s.train_step_async(slow_batch)
        time.sleep(0.5)  # the slow step is running and holds the session
        assert not slow.done(), "the slow step must outlast the queued call's deadline"
        with pytest.raises(tigon.DeadlineExceeded):
            s.train_step([[1, 2, 3, 4]], timeout=0.05)
        assert slow.result(timeout=300).step == 1
        assert s.info().step == 1, "the call whose deadline passed was not applied"
        assert s.train_step([[1, 2, 3, 4]]).step == 2
    assert_still_serving(client)


def test_unauthenticated_with_a_missing_or_wrong_token(start_server, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("# the accepted token\ncorrect-horse\n")
    server = start_server(f"--auth-token-file={token_file}")
    for client in (server.client(), server.client(token="wrong")):
        with pytest.raises(tigon.Unauthenticated):
            client.server_info()
        with pytest.raises(tigon.Unauthenticated):
            client.create_session(TINY_LLAMA, precision="fp32")
        assert client.health() == "SERVING", "health stays open for probes"
    good = server.client(token="correct-horse")
    assert good.server_info().auth_required
    with good.create_session(TINY_LLAMA, precision="fp32") as s:
        assert s.train_step([[1, 2, 3, 4]]).step == 1
        with pytest.raises(tigon.Unauthenticated):
            server.client(token="wrong").session(s.id)
    assert "not accepted" in server.log() and "correct-horse" not in server.log()


def test_unavailable_when_nothing_listens():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(tigon.Unavailable):
        tigon.connect(f"127.0.0.1:{port}").server_info(timeout=10)
