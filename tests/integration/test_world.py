"""Sessions over several servers (CreateSessionRequest.world, tigon.WorldSession) on machines without a GPU:
the refusals a CPU-only server gives, and the client's row split. The training itself needs NCCL and a GPU
per server: tests/gpu/service/test_world_gpu.py."""
import time

import numpy as np
import pytest

import tigon
from conftest import TINY_LLAMA
from tigon.world import _as_rows, _row_shares


def test_new_communicator_id_without_nccl_is_failed_precondition(shared_server):
    client = shared_server.client()
    with pytest.raises(tigon.FailedPrecondition, match="NCCL"):
        client.new_communicator_id()
    assert client.server_info().version  # still serving


def test_a_world_rank_on_a_server_without_cuda_is_refused_and_nothing_is_created(shared_server):
    client = shared_server.client()
    before = len(client.list_sessions())
    with pytest.raises(tigon.FailedPrecondition, match="CUDA device"):
        client.create_session(TINY_LLAMA, precision="fp32", world=(2, 0, bytes(128)))
    with pytest.raises(tigon.InvalidArgument, match="communicator_id"):
        client.create_session(TINY_LLAMA, precision="fp32", world=(2, 0, b"short"))
    with pytest.raises(tigon.InvalidArgument, match="rank"):
        client.create_session(TINY_LLAMA, precision="fp32", world=(2, 5, bytes(128)))
    assert len(client.list_sessions()) == before


def test_world_session_create_reports_the_first_refusal(shared_server):
    clients = [shared_server.client(), shared_server.client()]
    with pytest.raises(tigon.FailedPrecondition, match="NCCL"):
        tigon.WorldSession.create(clients, TINY_LLAMA, precision="fp32")
    with pytest.raises(tigon.InvalidArgument, match="two clients"):
        tigon.WorldSession.create(clients[:1], TINY_LLAMA)
    with pytest.raises(tigon.InvalidArgument, match="devices"):
        tigon.WorldSession.create(clients, TINY_LLAMA, devices=[0])


@pytest.mark.parametrize("rows,ranks", [(2, 2), (7, 2), (5, 3), (16, 4), (3, 3)])
def test_rows_are_shared_in_order_as_evenly_as_possible(rows, ranks):
    shares = _row_shares(rows, ranks)
    assert len(shares) == ranks
    assert [count for _, count in shares] == sorted((count for _, count in shares), reverse=True)
    assert max(c for _, c in shares) - min(c for _, c in shares) <= 1
    assert min(c for _, c in shares) >= 1
    batch = np.arange(rows * 3).reshape(rows, 3)
    pieces = [_as_rows(batch, "input_ids")[first:first + count] for first, count in shares]
    np.testing.assert_array_equal(np.concatenate(pieces), batch)
    as_lists = [_as_rows(batch.tolist(), "input_ids")[first:first + count] for first, count in shares]
    assert sum(as_lists, []) == batch.tolist()


def test_a_batch_with_fewer_rows_than_ranks_is_refused_before_any_call():
    class Unreachable:
        def train_step_async(self, *args, **kwargs):
            raise AssertionError("no rank may be called")

    world = tigon.WorldSession([Unreachable(), Unreachable(), Unreachable()])
    with pytest.raises(tigon.InvalidArgument, match="3 ranks"):
        world.train_step(np.zeros((2, 8), dtype=np.int32))
    with pytest.raises(tigon.InvalidArgument, match="3 ranks"):
        world.train_step([1, 2, 3, 4])


class _Finished:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _RecordingRank:
    """Stands in for a rank's Session: records what each call received."""

    vocab_size = 1000

    def __init__(self, rank, calls):
        self.rank, self.calls = rank, calls

    def train_step_async(self, input_ids, labels, loss_weights, **settings):
        self.calls.append(("train_step", self.rank, np.asarray(input_ids).tolist(),
                           None if labels is None else np.asarray(labels).tolist(), settings))
        return _Finished(f"result of rank {self.rank}")

    def save_async(self, path, timeout=None):
        self.calls.append(("save", self.rank, path))
        return _Finished(self.rank)

    def load_async(self, path, timeout=None):
        self.calls.append(("load", self.rank, path))
        return _Finished(self.rank)

    def close_async(self, timeout=None):
        self.calls.append(("close", self.rank))
        return _Finished(None)


def test_each_rank_gets_its_rows_and_the_settings_and_rank_0s_result_is_returned():
    calls = []
    world = tigon.WorldSession([_RecordingRank(r, calls) for r in range(2)])
    batch = np.arange(15).reshape(5, 3)
    labels = batch + 100
    assert world.train_step(batch, labels, lr=0.5) == "result of rank 0"
    assert calls == [("train_step", 0, batch[:3].tolist(), labels[:3].tolist(), {"lr": 0.5}),
                     ("train_step", 1, batch[3:].tolist(), labels[3:].tolist(), {"lr": 0.5})]


def test_save_load_and_close_act_on_every_rank():
    calls = []
    with tigon.WorldSession([_RecordingRank(r, calls) for r in range(3)]) as world:
        world.save("run/step-1")
        world.load("run/step-1")
    assert calls == ([("save", r, "run/step-1") for r in range(3)] + [("load", r, "run/step-1") for r in range(3)] +
                     [("close", r) for r in range(3)])


def test_the_world_and_its_timeout_reach_the_request(shared_server):
    client = shared_server.client()
    request = client._create_request(TINY_LLAMA, "fp32", "fused", None, 0, None, False, (3, 2, bytes(128), 12.5))
    assert (request.world.world_size, request.world.rank) == (3, 2)
    assert request.world.communicator_id == bytes(128)
    assert request.world.collective_timeout_seconds == 12.5
    request = client._create_request(TINY_LLAMA, "fp32", "fused", None, 0, None, False, (2, 0, bytes(128), None))
    assert request.world.collective_timeout_seconds == 0  # the server's default
    assert not client._create_request(TINY_LLAMA, "fp32", "fused", None, 0, None).HasField("world")


def test_ids_outside_the_vocabulary_are_refused_before_any_rank_is_called():
    calls = []
    world = tigon.WorldSession([_RecordingRank(r, calls) for r in range(2)])
    batch = np.arange(8).reshape(4, 2)
    bad = batch.copy()
    bad[3, 1] = 1000  # only rank 1's rows: its server alone would refuse them
    with pytest.raises(tigon.InvalidArgument, match="input_ids holds 1000"):
        world.train_step(bad)
    with pytest.raises(tigon.InvalidArgument, match="labels holds -1"):
        world.train_step(batch, labels=[[0, 1], [2, 3], [4, 5], [6, -1]])
    with pytest.raises(tigon.InvalidArgument, match="labels has 1 rows, input_ids 4"):
        world.train_step(batch, labels=[0, 1])  # a server given rows 2-3 and no labels would refuse alone
    assert calls == []
    world.train_step(batch.tolist(), labels=[[0, 1], [2, 3], [4, 5], [6, -100]])  # -100: ignored
    assert len(calls) == 2


class _Call:
    """A call that finishes when told to (or fails at once), as a client Future behaves."""

    def __init__(self, error=None, value=None):
        self.error, self.value, self.was_cancelled = error, value, False
        self.finished = error is not None or value is not None
        self.callbacks = []

    def add_done_callback(self, fn):
        self.callbacks.append(fn)
        if self.finished:
            fn(self)

    def done(self):
        return self.finished

    def cancel(self):
        self.was_cancelled = self.finished = True
        self.error = tigon.TigonError("the call was cancelled")
        for fn in self.callbacks:
            fn(self)
        return True

    def exception(self, timeout=None):
        return self.error

    def result(self, timeout=None):
        if self.error is not None:
            raise self.error
        return self.value


def test_a_rank_that_fails_to_be_created_cancels_the_ones_still_joining():
    """Rank 1 is refused at once; rank 0 would wait for it until the collective timeout. create must raise
    rank 1's error without waiting, cancel rank 0's call, and close the ranks that were created."""
    closed = []

    class Created:
        def close(self, timeout=None):
            closed.append(self)

    joining, refused, created = _Call(), _Call(error=tigon.InvalidArgument("device 7 does not exist")), \
        _Call(value=Created())

    class FakeClient:
        def __init__(self, call):
            self.call = call

        def new_communicator_id(self, timeout=None):
            return bytes(128)

        def create_session_async(self, model, **kwargs):
            return self.call

    start = time.monotonic()
    with pytest.raises(tigon.InvalidArgument, match="device 7"):
        tigon.WorldSession.create([FakeClient(joining), FakeClient(refused), FakeClient(created)], TINY_LLAMA)
    assert time.monotonic() - start < 5
    assert joining.was_cancelled and not created.was_cancelled
    assert closed == [created.value]
