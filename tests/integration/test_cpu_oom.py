"""CPU out of memory through the server (issue 8, item 3, CPU half), forced with the engine's CPU memory
limit (TIGON_CPU_MEMORY_LIMIT_BYTES): a batch too big for it gets RESOURCE_EXHAUSTED naming CPU memory,
is not applied, the session keeps training, and 200 such failures do not grow the server's memory.
The practice: Triton's L0 memory-growth tests (repeat a failing request, compare the process's
resident memory after a warm-up with the end) and the CUDA caching allocator's contract that an
out-of-memory error leaves the process usable.
"""
import numpy as np
import pytest

import tigon
from conftest import TINY_LLAMA, process_memory_bytes

LIMIT_BYTES = 8 << 20  # the tiny model and a normal step need well under 1 MiB of CPU tensors
NORMAL = np.arange(2 * 16, dtype=np.int32).reshape(2, 16) % 256
# Attention scores alone are 64 x 4 heads x 128 x 128 floats = 16 MiB, twice the limit.
BIG = (np.arange(64 * 128, dtype=np.int32).reshape(64, 128) * 7) % 256




@pytest.fixture
def limited_server(start_server, monkeypatch):
    monkeypatch.setenv("TIGON_CPU_MEMORY_LIMIT_BYTES", str(LIMIT_BYTES))
    server = start_server("--max-batch-tokens=65536")
    assert "CPU tensor memory limited to 8388608 bytes" in server.log()
    return server


def test_too_big_batch_is_resource_exhausted_and_the_session_keeps_training(limited_server):
    with limited_server.client().create_session(TINY_LLAMA, precision="fp32", seed=3) as s:
        assert s.train_step(NORMAL).step == 1
        loss_before = s.forward(NORMAL).loss
        with pytest.raises(tigon.ResourceExhausted, match="CPU memory exhausted") as failure:
            s.train_step(BIG)
        assert "CPU memory limit is 8388608 bytes" in str(failure.value)
        info = s.info()
        assert info.step == 1 and info.accumulated_batches == 0
        assert s.forward(NORMAL).loss == loss_before  # nothing was applied
        assert s.train_step(NORMAL).step == 2
        assert s.forward(NORMAL).loss != loss_before


def test_repeated_out_of_memory_does_not_grow_server_memory(limited_server):
    repeats, warmup = 200, 50  # warm-up past allocator caches (and ASan's 256 MB quarantine)
    with limited_server.client().create_session(TINY_LLAMA, precision="fp32", seed=4) as s:
        steps = 0
        resident_after_warmup = None
        for i in range(repeats):
            with pytest.raises(tigon.ResourceExhausted, match="CPU memory"):
                s.train_step(BIG)
            if i % 20 == 19:
                steps += 1
                assert s.train_step(NORMAL).step == steps
            if i == warmup - 1:
                resident_after_warmup = process_memory_bytes(limited_server.proc.pid)
        assert s.info().step == steps
        growth = process_memory_bytes(limited_server.proc.pid) - resident_after_warmup
        print(f"server resident memory growth over {repeats - warmup} failed steps: {growth} bytes")
        assert growth < 32 << 20, f"the server grew by {growth} bytes"
