"""Calls on one session run in the order they were sent, `*_async` ones included (CallOrder in
trainer.proto, server/session_sequence.*), and every call has an `*_async` variant (tigon/_calls.py)."""
import inspect
import time

import numpy as np
import pytest

import tigon
from conftest import TINY_LLAMA

PROBE = [[5, 6, 7, 8, 9, 10, 11, 12], [20, 30, 40, 50, 60, 70, 80, 90]]


def batches(seed):
    """A big batch (16 x 64: 1,008 target tokens) and a small one (1 x 4): the small one's call reaches the
    server, and would be ready to run, long before the big one's."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(16, 64)), rng.integers(0, 256, size=(1, 4))


def test_async_calls_of_very_different_sizes_run_in_the_order_they_were_sent(start_server):
    server = start_server()
    client = server.client()
    options = dict(precision="fp32", optimizer=dict(lr=1e-2), seed=3)
    with client.create_session(TINY_LLAMA, **options) as ordered, client.create_session(TINY_LLAMA, **options) as sequential:
        rounds = [batches(seed) for seed in range(4)]
        # Sent without waiting: big forward_backward, small forward_backward, optim_step, and a forward
        # that must see the updated weights; then the same calls one at a time on a twin session.
        futures = []
        for big, small in rounds:
            futures.append((ordered.forward_backward_async(big), ordered.forward_backward_async(small),
                            ordered.optim_step_async(), ordered.forward_async(small)))
        for i, (big, small) in enumerate(rounds):
            fb_big, fb_small, optim, forward = (f.result(timeout=120) for f in futures[i])
            assert (fb_big.accumulated_batches, fb_small.accumulated_batches) == (1, 2)
            assert fb_big.tokens == big.shape[0] * (big.shape[1] - 1)
            assert optim.step == i + 1 and optim.accumulated_batches == 0
            sequential.forward_backward(big)
            sequential.forward_backward(small)
            assert sequential.optim_step().grad_norm == optim.grad_norm
            assert sequential.forward(small).loss == forward.loss
        np.testing.assert_array_equal(ordered.forward(PROBE, return_logprobs=True).logprobs,
                                      sequential.forward(PROBE, return_logprobs=True).logprobs)
        # Checkpoints and close keep their place too.
        big, small = rounds[0]
        pending = ordered.train_step_async(big)
        closed = ordered.close_async()
        assert pending.result(timeout=120).step == len(rounds) + 1
        closed.result(timeout=60)
        with pytest.raises(tigon.NotFound):
            ordered.info()


def test_an_optim_step_sent_right_after_a_big_forward_backward_steps_on_its_gradients(start_server):
    # Each pair starts on an idle session, so both calls race for it: without the order, the small
    # OptimStep often got there first (FailedPrecondition: no accumulated gradients).
    server = start_server()
    client = server.client()
    rng = np.random.default_rng(1)
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        for i in range(40):
            big = rng.integers(0, 256, size=(8 << (i % 3), 128))  # 1,024 to 4,096 tokens
            backward, optim = session.forward_backward_async(big), session.optim_step_async()
            assert backward.result(timeout=120).accumulated_batches == 1
            assert optim.result(timeout=120).step == i + 1


def test_a_call_that_never_reached_the_server_stops_the_calls_after_it(start_server):
    server = start_server("--max-message-bytes=4096", "--call-order-timeout=1")
    client = server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        oversized = np.random.default_rng(0).integers(0, 256, size=(32, 128))  # refused before any handler
        small = [[1, 2, 3, 4, 5]]
        lost = session.forward_backward_async(oversized)
        after = [session.forward_backward_async(small), session.optim_step_async()]
        with pytest.raises(tigon.ResourceExhausted, match="larger than max"):
            lost.result(timeout=60)
        start = time.monotonic()
        for future in after:
            with pytest.raises(tigon.Aborted, match="never reached the server"):
                future.result(timeout=60)
        assert time.monotonic() - start < 30
        info = session.info()
        assert (info.step, info.accumulated_batches) == (0, 0), "nothing after the lost call ran"
        # The next calls start a new order and run.
        assert session.forward_backward(small).accumulated_batches == 1
        assert session.optim_step().step == 1


def test_leaving_the_with_block_closes_the_session_behind_a_call_that_never_arrived(start_server):
    server = start_server("--max-message-bytes=4096", "--call-order-timeout=1")
    client = server.client()
    with client.create_session(TINY_LLAMA, precision="fp32") as session:
        lost = session.forward_backward_async(np.random.default_rng(0).integers(0, 256, size=(32, 128)))
    assert session.id not in {s.session_id for s in client.list_sessions()}
    with pytest.raises(tigon.ResourceExhausted):
        lost.result(timeout=60)


def _calls(cls):
    """The public methods of cls that make a call (not properties, not the Client's local close)."""
    return {name for name, member in vars(cls).items()
            if not name.startswith("_") and not name.endswith("_async")
            and (inspect.isfunction(member) or isinstance(member, classmethod))}


@pytest.mark.parametrize("cls", [tigon.Client, tigon.Session, tigon.WorldSession])
def test_every_call_has_an_async_variant(cls):
    names = _calls(cls) - ({"close"} if cls is tigon.Client else set())
    assert names, cls
    missing = {name for name in names if not hasattr(cls, name + "_async")}
    assert not missing, f"{cls.__name__} has no *_async for {sorted(missing)}"


def test_the_async_variants_return_futures_of_the_same_results(shared_server):
    client = shared_server.client()
    assert client.server_info_async().result(timeout=30).version == client.server_info().version
    assert client.health_async().result(timeout=30) == "SERVING"
    with pytest.raises(tigon.FailedPrecondition, match="NCCL"):
        client.new_communicator_id_async().result(timeout=30)
    with client.create_session_async(TINY_LLAMA, precision="fp32").result(timeout=60) as session:
        assert session.id in {s.session_id for s in client.list_sessions_async().result(timeout=30)}
        handle = client.session_async(session.id).result(timeout=30)
        assert isinstance(handle, tigon.Session) and handle.id == session.id
        assert handle.train_step_async(PROBE).result(timeout=60).step == 1
    with pytest.raises(tigon.FailedPrecondition, match="NCCL"):
        tigon.WorldSession.create_async([client, shared_server.client()], TINY_LLAMA,
                                        precision="fp32").result(timeout=60)


class _Rank:
    """Stands in for a rank's Session (its *_async calls answer at once)."""

    vocab_size = 256

    def __init__(self, rank, calls):
        self.rank, self.calls = rank, calls

    def _answer(self, value):
        return tigon.Future(_Done(value))

    def train_step_async(self, input_ids, labels, loss_weights, **settings):
        self.calls.append(("train_step", self.rank))
        return self._answer(f"step on rank {self.rank}")

    def info_async(self, timeout=None):
        self.calls.append(("info", self.rank))
        return self._answer(f"info of rank {self.rank}")


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value


def test_world_session_async_calls_go_to_every_rank_when_made():
    calls = []
    world = tigon.WorldSession([_Rank(r, calls) for r in range(2)])
    step = world.train_step_async([[1, 2, 3], [4, 5, 6]])
    info = world.info_async()
    assert calls == [("train_step", 0), ("train_step", 1), ("info", 0), ("info", 1)]  # sent in order, at once
    assert step.result(timeout=10) == "step on rank 0"
    assert info.result(timeout=10) == ["info of rank 0", "info of rank 1"]
