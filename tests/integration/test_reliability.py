"""Faults a training service must survive without losing or corrupting state: kill -9 during a save,
kill and resume, deadlines that pass mid-step, messages at the size limit, SIGTERM with steps in
flight, retried and racing requests. Each test names the practice it follows."""
import os
import random
import re
import signal
import threading
import time

import numpy as np
import pytest

import tigon
from conftest import CORPUS, TINY_LLAMA, byte_batches

# Slow enough on the CPU that one step of a full batch takes well over a second.
WIDE_LLAMA = dict(TINY_LLAMA, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=8)
PROBE = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 30, 40, 50, 60, 70, 80, 90]]


def logprobs(session, batch=PROBE):
    """The session's weights, seen through a fixed batch (bit-exact on the CPU in fp32)."""
    return session.forward(batch, return_logprobs=True).logprobs


def slow_batch(session, min_forward_seconds=0.35):
    """A batch whose training step takes about a second or more on this machine, whatever its load: rows
    are doubled until a forward pass (about a third of a step) takes `min_forward_seconds`."""
    rng = np.random.default_rng(0)
    rows = 2
    while True:
        batch = rng.integers(0, 256, size=(rows, 64))
        start = time.perf_counter()
        session.forward(batch)
        if time.perf_counter() - start >= min_forward_seconds or rows >= 64:
            return batch
        rows *= 2


def checkpoint_entries(root):
    """Every name under the checkpoint root, relative to it."""
    out = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        out += [os.path.normpath(os.path.join(rel, n)) for n in dirs + files]
    return sorted(out)


# Practice: crash-consistency testing as done for databases and storage engines (and Triton's L0
# model-repository tests): kill -9 at random moments of a write, then check that the published name holds
# the old or the new version, complete, and that recovery removes the debris.
def test_kill_9_during_save_never_leaves_a_half_written_checkpoint(start_server, tmp_path):
    root = tmp_path / "ckpt"
    # ~4.2 M parameters: weights and AdamW state are ~50 MB, so a save takes tens of milliseconds.
    model = dict(WIDE_LLAMA, num_hidden_layers=4)
    options = dict(precision="fp32", optimizer=dict(lr=1e-3), seed=1)
    batch = byte_batches(CORPUS, 2, 16, 1, seed=5)[0]

    server = start_server(f"--checkpoint-root={root}", name="first")
    session = server.client().create_session(model, **options)
    session.train_step(batch)
    saved = session.save("run/latest")
    assert saved.step == 1
    # What each step's weights look like: the checkpoint under the final name must match one of them.
    expected = {1: logprobs(session)}
    files = sorted(os.listdir(root / "run" / "latest"))
    assert {"config.json", "model.safetensors", "optimizer.safetensors", "tigon_state.json"} <= set(files)
    save_seconds = saved.wall_seconds
    rng = random.Random(1234)
    outcomes = {"old": 0, "new": 0}
    killed_mid_save = 0
    for attempt in range(8):
        step = session.info().step
        session.train_step(batch)
        expected[step + 1] = logprobs(session)
        future = session.save_async("run/latest")
        # Random moments from just after the request is sent to a little past the measured save time.
        time.sleep(rng.uniform(0.0, 1.3 * save_seconds))
        finished = future.done()
        server.signal(signal.SIGKILL)
        assert server.wait(30) == -signal.SIGKILL
        killed_mid_save += not finished

        # Nothing but the final checkpoint and the engine's temporary names is visible.
        for name in checkpoint_entries(root):
            top = name.split(os.sep)[1] if name.startswith("run" + os.sep) else None
            assert name == "run" or top == "latest" or re.fullmatch(r"latest\.tmp-\d+-\d+", top or ""), name

        server = start_server(f"--checkpoint-root={root}", name=f"restart{attempt}")
        # The restarted server removed the debris of the killed one.
        assert not [n for n in checkpoint_entries(root) if ".tmp-" in n], checkpoint_entries(root)
        session = server.client().create_session(model, **options)
        loaded = session.load("run/latest")
        assert loaded.step in (step, step + 1), (loaded.step, step)
        outcomes["new" if loaded.step == step + 1 else "old"] += 1
        np.testing.assert_array_equal(logprobs(session), expected[loaded.step],
                                      err_msg="the checkpoint is exactly the state saved at its step")
        assert sorted(os.listdir(root / "run" / "latest")) == files, "a complete checkpoint"
        if loaded.step == step:  # resumed from the old checkpoint: redoing the lost step gives the same state
            session.train_step(batch)
            np.testing.assert_array_equal(logprobs(session), expected[step + 1])
            session.save("run/latest")  # the checkpoint on disk is again the session's state
    print(f"\nkill -9 during save: {outcomes}, {killed_mid_save} of 8 kills before the save answered; "
          f"a save took {save_seconds * 1000:.0f} ms")
    assert killed_mid_save >= 1, "no kill landed while a save was running"
    # Resume works: the final session keeps training from its checkpoint.
    result = session.train_step(batch)
    assert result.step == session.info().step and np.isfinite(result.loss)


# Practice: Tinker's save_state/load_state contract (weights and optimizer state), checked the way
# PyTorch's checkpoint tests do: the resumed run is bit-identical to the run that was never stopped.
def test_save_kill_restart_load_is_bit_identical_to_an_uninterrupted_run(start_server, tmp_path):
    root = tmp_path / "ckpt"
    batches = byte_batches(CORPUS, 4, 32, 10, seed=11)
    options = dict(precision="fp32", optimizer=dict(lr=1e-2, weight_decay=0.01, max_grad_norm=1.0))

    first = start_server(f"--checkpoint-root={root}", name="first")
    session = first.client().create_session(TINY_LLAMA, seed=3, **options)
    for b in batches[:4]:
        session.train_step(b)
    assert session.save("run/step-4").step == 4
    uninterrupted = [session.train_step(b) for b in batches[4:]]
    final_logprobs = logprobs(session)
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL

    second = start_server(f"--checkpoint-root={root}", name="second")
    # Another seed: every weight that matters must come from the checkpoint.
    resumed = second.client().create_session(TINY_LLAMA, seed=99, **options)
    assert resumed.load("run/step-4").step == 4
    continued = [resumed.train_step(b) for b in batches[4:]]
    assert [r.step for r in continued] == list(range(5, 11))
    assert [r.loss for r in continued] == [r.loss for r in uninterrupted], "fp32 on the CPU is bit-reproducible"
    assert [r.grad_norm for r in continued] == [r.grad_norm for r in uninterrupted]
    np.testing.assert_array_equal(logprobs(resumed), final_logprobs)

    # Control: the same weights without the AdamW moments and step diverge after the first step, so the
    # equality above depends on the optimizer state being restored.
    weights_only = root / "run" / "weights-only"
    os.makedirs(weights_only)
    for name in os.listdir(root / "run" / "step-4"):
        if name not in ("optimizer.safetensors", "tigon_state.json"):
            os.link(root / "run" / "step-4" / name, weights_only / name)
    control = second.client().create_session(TINY_LLAMA, seed=99, **options)
    assert control.load("run/weights-only").step == 0
    control_losses = [control.train_step(b).loss for b in batches[4:6]]
    assert control_losses[0] == uninterrupted[0].loss, "same weights: same first loss"
    assert control_losses[1] != uninterrupted[1].loss, "fresh AdamW moments: a different second step"


# Practice: gRPC's deadline guidance ("the server should check the deadline and stop work that no one
# waits for") with Tinker-style exactly-once steps: a step whose caller gave up is not applied.
def test_a_step_whose_deadline_passes_mid_step_is_not_applied(start_server):
    server = start_server()
    with server.client().create_session(WIDE_LLAMA, precision="fp32", optimizer=dict(lr=1e-2)) as session:
        big = slow_batch(session)
        before = logprobs(session)
        for attempt in range(2):
            start = time.monotonic()
            with pytest.raises(tigon.DeadlineExceeded):
                session.train_step(big, request_id="slow-step", timeout=0.2)
            assert time.monotonic() - start < 1.0, "the client gives up at its deadline"
            # Forward waits for the abandoned step to leave the session, then sees the same weights.
            np.testing.assert_array_equal(logprobs(session), before)
            info = session.info()
            assert info.step == 0 and info.accumulated_batches == 0
        # Under heavy load an attempt may even time out before its step starts (also not applied); at least
        # one must have been abandoned mid-step, after its backward pass.
        mid_step = server.log().count("its gradients were dropped, no update applied")
        before_start = server.log().count("the deadline passed before the step started")
        assert mid_step >= 1 and mid_step + before_start == 2, (mid_step, before_start)
        # The same request id was not remembered as done: without the deadline it is applied, once.
        result = session.train_step(big, request_id="slow-step")
        assert result.step == 1 and not result.replayed
        assert result.wall_seconds > 0.2, "the step cannot finish within the 0.2 s deadline"
        assert not np.array_equal(logprobs(session), before)
        assert session.train_step(big, request_id="slow-step").replayed


# Practice: gRPC's max-message-size semantics (grpc.max_receive_message_length applies to the
# serialized message; a message of exactly the limit is accepted) — the boundary test Triton's L0
# suites do for request sizes.
def with_order(request):
    """The request as the client sends it: numbered in its session handle's order (16-byte stream, a
    number below 128: one byte)."""
    request.order.stream, request.order.number = bytes(16), 1
    return request


def test_a_request_exactly_at_max_message_bytes_succeeds_one_byte_over_is_resource_exhausted(shared_server):
    limit = shared_server.client().server_info().max_message_bytes
    assert limit == 8192
    with shared_server.client().create_session(TINY_LLAMA, precision="fp32") as session:
        rng = np.random.default_rng(3)
        # The request id is a string field: 2 + len(id) bytes while len(id) < 128, so it sets the size to
        # the byte. The batch (ids 128..255: 2-byte varints; labels; float weights) fills the rest.
        for seq_len in range(128, 1, -1):
            ids = rng.integers(128, 256, size=(8, seq_len))
            labels = np.roll(ids, -1, axis=1)
            weights = np.ones(ids.shape)
            build = lambda request_id: with_order(session._train_request(ids, labels, weights, request_id, {}))  # noqa: E731
            base = build("x").ByteSize() - 3
            pad = limit - base - 2
            if 1 <= pad < 127:
                break
        assert 1 <= pad < 127 and ids.size <= 2048
        at_limit, over_limit = "a" * pad, "b" * (pad + 1)
        assert build(at_limit).ByteSize() == limit
        assert build(over_limit).ByteSize() == limit + 1
        with pytest.raises(tigon.ResourceExhausted, match="larger than max"):
            session.train_step(ids, labels=labels, loss_weights=weights, request_id=over_limit)
        assert session.info().step == 0
        result = session.train_step(ids, labels=labels, loss_weights=weights, request_id=at_limit)
        assert result.step == 1 and result.tokens == ids.size


# Practice: Kubernetes' graceful termination and Triton's L0_lifecycle: on SIGTERM readiness turns
# NOT_SERVING first, new work is refused (UNAVAILABLE), work in flight completes, the exit is clean.
def test_sigterm_with_steps_in_flight_drains_and_exits_0(start_server):
    exit_timeout = 60
    server = start_server(f"--exit-timeout={exit_timeout}")
    client = server.client()
    session = client.create_session(WIDE_LLAMA, precision="fp32")
    big = slow_batch(session)
    in_flight = [session.train_step_async(big), session.train_step_async(big)]  # one runs, one waits
    time.sleep(0.3)
    assert not any(f.done() for f in in_flight), "the steps must still be running at SIGTERM"
    prober = server.client()  # a fresh connection, like a load balancer's health check
    assert prober.health() == "SERVING"
    sigterm_at = time.monotonic()
    server.signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while prober.health() != "NOT_SERVING":
        assert time.monotonic() < deadline, "health did not turn NOT_SERVING"
        time.sleep(0.02)
    with pytest.raises(tigon.Unavailable, match="shutting down"):
        prober.server_info()
    with pytest.raises(tigon.Unavailable):
        session.train_step([[1, 2, 3, 4]])
    assert not all(f.done() for f in in_flight), "the checks above ran while a step was in flight"
    steps = sorted(f.result(timeout=exit_timeout).step for f in in_flight)
    assert steps == [1, 2], "both in-flight steps finished and were applied once"
    assert server.wait(exit_timeout) == 0
    assert time.monotonic() - sigterm_at < exit_timeout
    log = server.log()
    assert "SIGTERM: not serving any more" in log and "tigon-server stopped" in log
    assert "still running; cancelling" not in log


# Practice: idempotency keys as in Tinker's and Stripe's APIs — a retried or duplicated request with
# the same id is applied exactly once, even when the copies race each other.
def test_a_train_step_retried_or_raced_with_the_same_request_id_is_applied_once(shared_server):
    batch = byte_batches(CORPUS, 4, 32, 1, seed=8)[0]
    options = dict(precision="fp32", optimizer=dict(lr=1e-2), seed=4)
    with shared_server.client().create_session(TINY_LLAMA, **options) as reference:
        once = reference.train_step(batch)
        applied_once = logprobs(reference)
    clients = [shared_server.client() for _ in range(2)]
    with clients[0].create_session(TINY_LLAMA, **options) as session:
        twin = clients[1].session(session.id)
        for round_ in range(3):  # a few races: the interleavings differ from run to run
            barrier = threading.Barrier(2)
            results = [None, None]

            def send(i, handle):
                barrier.wait()
                results[i] = handle.train_step(batch, request_id=f"race-{round_}")

            threads = [threading.Thread(target=send, args=(i, h)) for i, h in enumerate((session, twin))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert sorted(r.replayed for r in results) == [False, True]
            assert results[0].step == results[1].step == round_ + 1
            assert results[0].loss == results[1].loss
            if round_ == 0:
                assert results[0].loss == once.loss
                np.testing.assert_array_equal(logprobs(session), applied_once)
            # A plain retry later is answered from the first result too.
            retry = session.train_step(batch, request_id=f"race-{round_}")
            assert retry.replayed and retry.step == round_ + 1
        assert session.info().step == 3
