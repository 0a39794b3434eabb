"""Training through the service: the loss falls, results are typed, batches may be lists or numpy
arrays, retried request ids are not applied twice, two clients train two sessions at once."""
import math
import os
import threading

import numpy as np
import pytest

import tigon
from conftest import CORPUS, ROOT, TINY_LLAMA, byte_batches


def test_a_session_trains_and_its_loss_falls(shared_server):
    client = shared_server.client()
    batches = byte_batches(CORPUS, batch=4, seq_len=32, count=40)
    with client.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=1e-2), seed=0) as session:
        assert session.info_at_creation.vocab_size == 256
        assert session.info_at_creation.parameter_count > 0
        assert set(session.info_at_creation.fused_ops) <= set(session.info_at_creation.ops)
        results = [session.train_step(b) for b in batches]
    losses = [r.loss for r in results]
    assert all(math.isfinite(x) for x in losses)
    assert results[0].loss > 4.0, "a random byte model starts near ln(256) = 5.5"
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3]), losses
    last = results[-1]
    assert last.step == 40
    assert last.tokens == 4 * 31  # default labels: inputs shifted by one, last position ignored
    assert last.grad_norm > 0 and math.isfinite(last.grad_norm)
    assert last.lr == pytest.approx(1e-2)
    assert last.tokens_per_second > 0 and last.wall_seconds > 0
    assert last.peak_memory_bytes >= 0 and not last.replayed


def test_forward_backward_then_optim_step_and_forward_logprobs(shared_server):
    client = shared_server.client()
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 256, size=(2, 16), dtype=np.int64)
    labels = np.roll(ids, -1, axis=1)
    labels[:, -1] = -100
    with client.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=1e-3)) as session:
        fb = session.forward_backward(ids.tolist(), labels=labels)  # a list and a numpy array
        assert fb.accumulated_batches == 1 and fb.step == 0
        fb2 = session.forward_backward(ids, labels=labels.tolist(), loss_weights=np.ones((2, 16)))
        assert fb2.accumulated_batches == 2
        step = session.optim_step(lr=5e-4, max_grad_norm=1.0)
        assert step.step == 1 and step.lr == pytest.approx(5e-4)
        assert session.info().accumulated_batches == 0

        out = session.forward(ids, labels=labels, return_logprobs=True)
        assert out.logprobs.shape == (2, 16)
        assert np.all(out.logprobs[:, -1] == 0.0), "ignored positions report 0"
        assert np.all(out.logprobs[:, :-1] < 0)
        # The loss is the mean negative log-probability of the target tokens.
        assert out.loss == pytest.approx(-out.logprobs[:, :-1].mean(), rel=1e-4)
        assert out.tokens == 30
        assert session.forward(ids).logprobs is None


def test_async_variants_return_futures(shared_server):
    client = shared_server.client()
    batches = byte_batches(CORPUS, batch=2, seq_len=16, count=4, seed=3)
    session = client.create_session_async(TINY_LLAMA, precision="fp32").result(timeout=60)
    try:
        futures = [session.train_step_async(b) for b in batches]
        steps = sorted(f.result(timeout=60).step for f in futures)
        assert steps == [1, 2, 3, 4], "steps on one session are serialised, each applied once"
        done = threading.Event()
        future = session.forward_async(batches[0])
        future.add_done_callback(lambda f: done.set())
        assert math.isfinite(future.result(timeout=60).loss)
        assert done.wait(10)
        bad = session.train_step_async([[999] * 16])
        assert isinstance(bad.exception(timeout=60), tigon.InvalidArgument)
        with pytest.raises(tigon.InvalidArgument):
            bad.result()
    finally:
        session.close_async().result(timeout=60)
    assert session.id not in [s.session_id for s in client.list_sessions()]


def test_a_retried_request_id_is_not_applied_twice(shared_server):
    client = shared_server.client()
    batch = byte_batches(CORPUS, batch=2, seq_len=16, count=1)[0]
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        first = session.train_step(batch, request_id="retry-me")
        again = session.train_step(batch, request_id="retry-me")
        assert again.replayed and not first.replayed
        assert again.step == first.step == 1 and again.loss == first.loss
        assert session.info().step == 1
        assert session.train_step(batch).step == 2


def test_two_clients_train_two_sessions_at_once(shared_server):
    results, errors = {}, []

    def train(name, seed):
        try:
            client = shared_server.client()
            with client.create_session(TINY_LLAMA, precision="fp32", seed=seed,
                                       optimizer=dict(lr=1e-2)) as session:
                results[name] = [session.train_step(b).loss
                                 for b in byte_batches(CORPUS, 4, 32, 15, seed=seed)]
        except Exception as e:  # reported below with the thread's name
            errors.append((name, e))

    threads = [threading.Thread(target=train, args=(n, s)) for n, s in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    for name in ("a", "b"):
        assert len(results[name]) == 15 and all(math.isfinite(x) for x in results[name])
        assert results[name][-1] < results[name][0]


def test_server_info_health_and_session_listing(shared_server):
    client = shared_server.client()
    info = client.server_info()
    assert "llama" in info.model_families
    assert info.max_batch_tokens == 2048 and info.max_message_bytes == 8192
    assert info.checkpoints_enabled and not info.auth_required
    assert info.version and info.engine_version
    assert client.health() == "SERVING"
    with client.create_session(TINY_LLAMA, precision="fp32", kernels="reference", seed=5) as session:
        listed = {s.session_id: s for s in client.list_sessions()}
        assert session.id in listed
        assert listed[session.id].seed == 5
        assert listed[session.id].fused_ops == []
        assert set(listed[session.id].ops.values()) == {"reference"}
        other = client.session(session.id)
        assert other.id == session.id
    assert session.id not in [s.session_id for s in client.list_sessions()]


def test_sessions_from_hugging_face_folders_and_from_saved_checkpoints(shared_server):
    client = shared_server.client()
    fixture = os.path.join(ROOT, "tests", "fixtures", "llama")
    with client.create_session(fixture, precision="fp32", optimizer=dict(lr=1e-2)) as session:
        info = session.info_at_creation
        assert info.model_family == "llama" and info.max_position_embeddings == 64
        batch = [[t % info.vocab_size for t in range(i, i + 32)] for i in range(4)]
        before = session.forward(batch).loss
        for _ in range(5):
            session.train_step(batch)
        after = session.forward(batch).loss
        assert after < before
        session.save("from-fixture")
    # A saved checkpoint is a Hugging Face folder: it starts a new session with the trained weights.
    saved = os.path.join(shared_server.checkpoint_root, "from-fixture")
    with client.create_session(saved, precision="fp32") as reloaded:
        assert reloaded.forward(batch).loss == pytest.approx(after, rel=1e-6)


def test_loading_a_checkpoint_of_another_model_is_refused_without_harm(shared_server):
    client = shared_server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as small:
        small.train_step([[1, 2, 3, 4]])
        small.save("tiny-llama")
    wider = dict(TINY_LLAMA, hidden_size=64, intermediate_size=128)
    with client.create_session(wider, precision="fp32") as session:
        session.train_step([[1, 2, 3, 4]])
        before = session.forward([[5, 6, 7, 8]]).loss
        with pytest.raises((tigon.InvalidArgument, tigon.FailedPrecondition)) as err:
            session.load("tiny-llama")
        assert err.value.message
        assert session.info().step == 1
        assert session.forward([[5, 6, 7, 8]]).loss == before, "a refused load changes nothing"
        assert session.train_step([[1, 2, 3, 4]]).step == 2


def test_retries_ride_out_a_server_that_is_not_up_yet():
    import socket
    import subprocess
    import time
    from conftest import server_binary
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = []

    def start_late():
        time.sleep(0.5)
        started.append(subprocess.Popen([server_binary(), f"--listen=127.0.0.1:{port}", "--metrics-listen=off"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    thread = threading.Thread(target=start_late)
    thread.start()
    try:
        with pytest.raises(tigon.Unavailable):
            tigon.connect(f"127.0.0.1:{port}").server_info()  # no retries: fails at once
        start = time.time()
        # UNAVAILABLE, retried after waiting for the channel to connect (windows of 0.2 s doubling to 5 s:
        # about 20 s over 8 retries, room for a server that starts slowly on a loaded machine).
        info = tigon.connect(f"127.0.0.1:{port}", retries=8).server_info()
        assert info.version and time.time() - start < 30
    finally:
        thread.join()
        for proc in started:
            proc.terminate()
            proc.wait(30)
