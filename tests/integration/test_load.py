"""Sustained concurrent load on one server: no errors, no lost or doubled steps, latency reported,
memory of the server process stable."""
import os
import threading
import time

import numpy as np

import tigon
from conftest import TINY_LLAMA, process_memory_bytes

CLIENTS = 32
SESSIONS = 8
DURATION_S = float(os.environ.get("TIGON_LOAD_SECONDS", "20"))
WARMUP_S = 5.0
# Allowed growth of the server's resident memory between the end of the warm-up and the end of the run:
# allocator arenas settle during the warm-up; a leak of even 1 KiB per call (~10,000 calls) would pass 10 MiB.
RSS_MARGIN_BYTES = 16 << 20




# Practice: Triton's L0 perf_analyzer/load suites (many concurrent clients, latency percentiles, zero
# errors) and Tinker's accounting of steps per run: every successful call is exactly one step.
def test_32_clients_on_8_sessions_lose_nothing_and_keep_memory_stable(start_server, capsys):
    server = start_server("--max-sessions=16", "--log-level=info")
    owner = server.client()
    sessions = [owner.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=1e-3), seed=i)
                for i in range(SESSIONS)]
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, size=(2, 16)) for _ in range(16)]
    steps_ok = [0] * SESSIONS
    latencies, errors = [], []
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + DURATION_S

    def run(worker):
        client = server.client()  # one channel per client, as separate processes would have
        index = worker % SESSIONS
        session = client.session(sessions[index].id)
        calls = 0
        while time.monotonic() < stop_at:
            batch = batches[(worker + calls) % len(batches)]
            t0 = time.perf_counter()
            try:
                if calls % 8 == 7:
                    session.forward(batch)  # a read among the steps
                    steps = 0
                else:
                    session.train_step(batch)
                    steps = 1
            except tigon.TigonError as e:
                with lock:
                    errors.append((worker, e))
                return
            elapsed = time.perf_counter() - t0
            with lock:
                latencies.append(elapsed)
                steps_ok[index] += steps
            calls += 1
        client.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(CLIENTS)]
    for t in threads:
        t.start()
    time.sleep(WARMUP_S)
    rss_warm = process_memory_bytes(server.proc.pid)
    calls_at_warm = len(latencies)
    peak = rss_warm
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        peak = max(peak, process_memory_bytes(server.proc.pid))
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    rss_end = process_memory_bytes(server.proc.pid)

    assert not errors, errors[:5]
    for index, session in enumerate(sessions):
        assert session.info().step == steps_ok[index], f"session {index}: steps lost or applied twice"
    ms = np.array(latencies) * 1000
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    with capsys.disabled():  # shown in CI's quiet runs too
        print(f"\nload: {CLIENTS} clients, {SESSIONS} sessions, {elapsed:.1f} s, {len(ms)} calls "
              f"({sum(steps_ok)} steps, {len(ms) / elapsed:.0f} calls/s); latency p50 {p50:.1f} ms, "
              f"p95 {p95:.1f} ms, p99 {p99:.1f} ms; server RSS {rss_warm / 2**20:.1f} MiB after warm-up "
              f"({calls_at_warm} calls), {rss_end / 2**20:.1f} MiB at the end, peak {peak / 2**20:.1f} MiB")
    assert min(steps_ok) > 0, "every session made progress"
    assert rss_end <= rss_warm + RSS_MARGIN_BYTES, \
        f"server RSS grew by {(rss_end - rss_warm) / 2**20:.1f} MiB under steady load"
    for session in sessions:
        session.close()
