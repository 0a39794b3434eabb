"""DPO on a tiny random model, on the CPU: synthetic preference pairs where the chosen answer repeats the
prompt's first letter and the rejected one does not. A reference session (the same initial model) on the
same server gives the reference log-probabilities. The reward margin and accuracy rise as it trains.

  build/server/tigon-server --listen 127.0.0.1:50051 &
  PYTHONPATH=client/python /usr/bin/python3 client/python/examples/dpo_tiny.py [--address 127.0.0.1:50051]
"""
import argparse
import random

import tigon

CONFIG = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
PROMPT, ANSWER = 12, 8


def pair(rng):
    """(chosen, rejected) rows of prompt + answer bytes, and their labels: the loss covers the answer only."""
    prompt = [rng.randrange(97, 123) for _ in range(PROMPT)]
    chosen = [prompt[0]] * ANSWER
    rejected = [rng.randrange(97, 123) for _ in range(ANSWER)]
    rows, labels = [], []
    for answer in (chosen, rejected):
        ids = prompt + answer
        rows.append(ids)
        labels.append([-100] * (PROMPT - 1) + answer + [-100])
    return rows, labels


def batch(rng, pairs=4):
    rows, labels = [], []
    for _ in range(pairs):
        r, l = pair(rng)
        rows += r
        labels += l
    return rows, labels


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--address", default="127.0.0.1:50051")
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    rng = random.Random(0)
    client = tigon.connect(args.address)
    with client.create_session(CONFIG, precision="fp32", optimizer=dict(lr=2e-3), seed=1) as policy, \
            client.create_session(CONFIG, precision="fp32", seed=1) as reference:
        for step in range(1, args.steps + 1):
            ids, labels = batch(rng)
            r = policy.train_step(ids, labels=labels, loss_fn="dpo", loss_config={"beta": 0.1},
                                  reference_session=reference)
            if step % 10 == 0 or step == 1:
                m = r.metrics
                print(f"step {step:3d}  loss {r.loss:.4f}  reward margin {m['reward_margin']:+.3f}  "
                      f"accuracy {m['reward_accuracy']:.2f}", flush=True)


if __name__ == "__main__":
    main()
