#!/usr/bin/env python3
"""End-to-end training throughput through the service, measured at the Python client.

Starts `tigon-server` on a free loopback port, creates a session with a Llama config (random
initialisation, bf16, AdamW), and times `train_step` calls with random tokens. tokens/s is measured at
the client (median over steps after warm-up); peak device memory is what the server reports for the step.
The share of step time outside the engine (gRPC, copies, Python) = 1 - engine wall time / client time.

    python3 bench/e2e_bench.py --server-bin build-gpu/server/tigon-server --model llama3.2-1b \
        --batch 8 --seq 2048 --kernels fused reference [--out results.json]
    python3 bench/e2e_bench.py ... --model llama3-8b --batch 1 --max-seq
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client", "python"))
import tigon  # noqa: E402

from model_configs import MODELS  # noqa: E402  (the same configs as the Hugging Face baseline)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, extra=()):
        self.port = free_port()
        self.proc = subprocess.Popen([binary, f"--listen=127.0.0.1:{self.port}", "--max-message-bytes=268435456",
                                      "--max-batch-tokens=1048576", *extra],
                                     stdout=subprocess.DEVNULL, stderr=open("server.log", "ab"))
        self.address = f"127.0.0.1:{self.port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("tigon-server exited during start-up; see server.log")
                time.sleep(0.2)
        raise RuntimeError("tigon-server did not start listening")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def config_for(name):
    return dict(MODELS[name], model_type="llama")


def new_session(client, name, kernels, optimizer_in_backward):
    return client.create_session(config_for(name), precision="bf16", kernels=kernels,
                                 optimizer=dict(lr=1e-5, weight_decay=0.0),
                                 optimizer_in_backward=optimizer_in_backward)


def objective_inputs(loss_fn, batch, seq, rng):
    """train_step's objective keywords for `loss_fn` on random [batch, seq] rows (RL: the sampler's
    log-probabilities and advantages; cross_entropy: none)."""
    if loss_fn == "cross_entropy":
        return {}
    return dict(loss_fn=loss_fn, loss_fn_inputs={
        "logprobs": -rng.random((batch, seq), dtype=np.float32) * 10,
        "advantages": rng.standard_normal((batch, seq), dtype=np.float32)})


def run(client, name, batch, seq, kernels, steps, optimizer_in_backward=False, warmup=2, loss_fn="cross_entropy"):
    config = config_for(name)
    rng = np.random.default_rng(0)
    with new_session(client, name, kernels, optimizer_in_backward) as session:
        batches = [rng.integers(0, config["vocab_size"], size=(batch, seq), dtype=np.int32)
                   for _ in range(4)]
        objectives = [objective_inputs(loss_fn, batch, seq, rng) for _ in range(4)]
        for i in range(warmup):
            session.train_step(batches[i % 4], **objectives[i % 4])
        client_times, engine_times, peaks, reserved, losses = [], [], [], [], []
        for i in range(steps):
            t0 = time.perf_counter()
            result = session.train_step(batches[i % 4], **objectives[i % 4])
            client_times.append(time.perf_counter() - t0)
            engine_times.append(result.wall_seconds)
            peaks.append(result.peak_memory_bytes)
            reserved.append(getattr(result, "peak_reserved_bytes", 0))
            losses.append(result.loss)
        median = statistics.median(client_times)
        return dict(model=name, batch=batch, seq=seq, kernels=kernels, optimizer_in_backward=optimizer_in_backward,
                    loss_fn=loss_fn,
                    tokens_per_second=batch * seq / median, step_seconds=median,
                    engine_step_seconds=statistics.median(engine_times),
                    outside_engine_share=1.0 - sum(engine_times) / sum(client_times),
                    peak_allocated_gib=max(peaks) / 2**30, peak_reserved_gib=max(reserved) / 2**30,
                    last_loss=losses[-1])


def longest_sequence(client, name, seqs, kernels, optimizer_in_backward):
    """One training step at batch 1 for each length in turn, on one session, until one runs out of memory
    (the session survives a failed step). Returns [(seq, peak GiB or None)]."""
    config = config_for(name)
    rng = np.random.default_rng(0)
    tried = []
    with new_session(client, name, kernels, optimizer_in_backward) as session:
        for seq in seqs:
            try:
                r = session.train_step(rng.integers(0, config["vocab_size"], size=(1, seq), dtype=np.int32))
                tried.append((seq, r.peak_memory_bytes / 2**30))
            except tigon.ResourceExhausted:
                tried.append((seq, None))
                break
    return tried


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server-bin", required=True)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2,
                    help="untimed steps first; about 25 s of steps brings a power-capped GPU to its steady clocks")
    ap.add_argument("--kernels", nargs="+", default=["fused", "reference"])
    ap.add_argument("--max-seq", action="store_true", help="find the longest sequence at batch 1")
    ap.add_argument("--seqs", type=int, nargs="+", default=[16384, 20480, 24576, 32768, 40960, 49152, 65536],
                    help="sequence lengths tried in order by --max-seq")
    ap.add_argument("--optimizer-in-backward", action="store_true",
                    help="sessions apply AdamW during backward (no whole gradient buffer)")
    ap.add_argument("--loss-fn", nargs="+", default=["cross_entropy"],
                    help="objectives to time, each on a fresh session (importance_sampling and ppo get random "
                         "sampler log-probabilities and advantages)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.warmup < 0 or args.steps < 1:
        ap.error("--warmup must be >= 0 and --steps >= 1")
    server = Server(args.server_bin)
    results = []
    try:
        client = tigon.connect(server.address)
        for kernels in args.kernels:
            if args.max_seq:
                best = 0
                for seq, peak in longest_sequence(client, args.model, args.seqs, kernels, args.optimizer_in_backward):
                    print(f"{args.model} {kernels} batch 1 seq {seq}: "
                          f"{'out of memory' if peak is None else f'fits, peak {peak:.1f} GiB'}", flush=True)
                    if peak is not None:
                        best = seq
                results.append(dict(model=args.model, kernels=kernels, longest_seq=best,
                                    optimizer_in_backward=args.optimizer_in_backward))
            else:
                for loss_fn in args.loss_fn:
                    r = run(client, args.model, args.batch, args.seq, kernels, args.steps, args.optimizer_in_backward,
                            args.warmup, loss_fn)
                    print(json.dumps(r), flush=True)
                    results.append(r)
    finally:
        server.stop()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
