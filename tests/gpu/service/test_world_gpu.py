"""A session over two servers (tigon.WorldSession), one GPU each, against the same training on one server and
one GPU. Needs two CUDA devices (deploy/device/multi_gpu.sh runs it on nvidia-h200-x2):

    TIGON_SERVER_BIN=build-gpu/server/tigon-server python3 -m pytest -q tests/gpu/service/test_world_gpu.py
"""
import time

import numpy as np
import pytest

import tigon
from conftest import ServerProcess

MODEL = dict(model_type="llama", vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
             tie_word_embeddings=False)
OPTIMIZER = dict(lr=1e-3, weight_decay=0.01)


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("world")
    servers = [ServerProcess(str(tmp), f"--checkpoint-root={tmp / 'ckpt'}", name=f"server{r}") for r in range(2)]
    devices = servers[0].client().server_info().devices
    if len(devices) < 2:
        for server in servers:
            server.stop()
        pytest.fail(f"this test needs two CUDA devices; the server sees {len(devices)}")
    yield servers
    for server in servers:
        server.stop()


def batches(steps, rows, seq, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, MODEL["vocab_size"], size=(rows, seq), dtype=np.int32) for _ in range(steps)]


def test_two_servers_train_as_one_gpu_does(two_servers):
    clients = [server.client() for server in two_servers]
    data = batches(6, 5, 64)  # 5 rows: 3 on rank 0, 2 on rank 1
    probe = batches(1, 2, 64, seed=9)[0]
    with clients[0].create_session(MODEL, precision="fp32", optimizer=OPTIMIZER, seed=3, devices=[0]) as single:
        expected = [single.train_step(batch) for batch in data]
        expected_logprobs = np.array(single.forward(probe, return_logprobs=True).logprobs)
    with tigon.WorldSession.create(clients, MODEL, precision="fp32", optimizer=OPTIMIZER, seed=3,
                                   devices=[0, 1]) as world:
        infos = world.info()
        assert [(i.world_size, i.rank) for i in infos] == [(2, 0), (2, 1)]
        got = [world.train_step(batch) for batch in data]
        for e, g in zip(expected, got):
            assert g.step == e.step
            assert g.tokens == e.tokens  # the whole batch's, not rank 0's rows
            assert g.loss == pytest.approx(e.loss, rel=1e-5)
            assert g.grad_norm == pytest.approx(e.grad_norm, rel=1e-4)
        # Both ranks hold the same weights, bit for bit, and they are the single GPU's within fp32 rounding.
        ranks = [np.array(s.forward(probe, return_logprobs=True).logprobs) for s in world.sessions]
        np.testing.assert_array_equal(ranks[0], ranks[1])
        np.testing.assert_allclose(ranks[0], expected_logprobs, rtol=0, atol=1e-4)
        assert all(i.step == len(data) for i in world.info())
        # Gradient accumulation over the world: two forward_backward calls, then one optimizer step.
        world.forward_backward(data[0])
        world.forward_backward(data[1])
        result = world.optim_step()
        assert result.step == len(data) + 1
        assert [i.accumulated_batches for i in world.info()] == [0, 0]



def test_a_rank_that_never_joins_fails_creation_within_its_timeout(two_servers):
    """Rank 0 of a world of two whose rank 1 is never started: creating the session fails once the collective
    timeout has passed (the NCCL communicator is initialised without blocking, then aborted), with a status that
    says so, and the server goes on serving."""
    client = two_servers[0].client()
    communicator_id = client.new_communicator_id()
    start = time.monotonic()
    with pytest.raises((tigon.DeadlineExceeded, tigon.Unavailable)) as failure:
        client.create_session(MODEL, precision="fp32", optimizer=OPTIMIZER, seed=3, devices=[0],
                              world=(2, 0, communicator_id, 5.0), timeout=120)
    elapsed = time.monotonic() - start
    assert "NCCL" in str(failure.value) or "communicator" in str(failure.value), str(failure.value)
    assert 4.0 < elapsed < 60.0, f"creation failed after {elapsed:.1f} s with a 5 s collective timeout"
    with client.create_session(MODEL, precision="fp32", optimizer=OPTIMIZER, seed=3, devices=[0]) as session:
        assert np.isfinite(session.train_step(batches(1, 2, 32)[0]).loss)
