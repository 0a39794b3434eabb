"""Fine-tune a model on a text file through a tigon-server, showing the loss fall.

    scripts/finetune.sh --server 127.0.0.1:50051 --text corpus.txt --steps 200
    scripts/finetune.sh --server-bin build/server/tigon-server --kernels fused,reference

scripts/finetune.sh runs this module with Debian's /usr/bin/python3 (where scripts/setup.sh installed
python3-grpcio and python3-protobuf) and the client on PYTHONPATH, whatever python3 comes first on PATH;
PYTHONPATH=client/python /usr/bin/python3 -m tigon.finetune is the same.

Text is tokenised as UTF-8 bytes (a vocabulary of 256, which the default model has); --ids reads
pre-tokenised ids instead (whitespace-separated integers, or a .npy array). Without either it trains on
generated sentences ("three plus four is seven."), so the demo needs no data. A --model with a vocabulary
of its own (a tokenizer file in its folder, or more than 384 ids) would learn noise from bytes: text is
refused for it unless --byte-tokens says bytes are meant; tokenise with the model's tokenizer and pass --ids. Batches are windows of
seq_len tokens at seeded random offsets; labels are the inputs shifted by one. With several --kernels
choices the same run (same seed, same batches) is repeated for each, and a comparison is printed.
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time

import tigon


def default_config(args):
    # Sizes only, head_dim explicit (some families default it to a constant, Gemma's 256); tied embeddings,
    # activation and the rest are the family's defaults.
    return dict(model_type=args.family, vocab_size=256, hidden_size=args.hidden,
                intermediate_size=args.intermediate or 2 * args.hidden, num_hidden_layers=args.layers,
                num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 2),
                head_dim=args.hidden // args.heads, max_position_embeddings=max(args.seq_len, 128),
                rms_norm_eps=1e-6)


def generated_text(min_bytes=200000, seed=1234):
    """Sentences with learnable structure: small additions written in words."""
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
             "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen"]
    rng = random.Random(seed)
    parts, size = [], 0
    while size < min_bytes:
        a, b = rng.randrange(10), rng.randrange(10)
        sentence = f"{words[a]} plus {words[b]} is {words[a + b]}. "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


def load_tokens(args):
    if not args.text and not args.ids:
        return list(generated_text().encode())
    if args.text:
        with open(args.text, "rb") as f:
            return list(f.read())
    if args.ids.endswith(".npy"):
        import numpy as np
        return [int(x) for x in np.load(args.ids).ravel()]
    with open(args.ids) as f:
        return [int(x) for x in f.read().split()]


# A byte-level vocabulary: the 256 byte values and at most 128 special or sentinel ids (ByT5 has 384).
BYTE_VOCABULARY_MAX = 256 + 128
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "spiece.model")
# --kernels: one run per choice the server takes, plus the CLI's own shorthands.
KERNEL_CHOICES = ("fused", "reference")
KERNEL_SHORTHANDS = {"both": KERNEL_CHOICES}


def kernel_runs(value, gpu_server):
    """The --kernels value as the list of runs: 'auto' (both on a GPU server, fused on a CPU one), 'both',
    or a comma-separated list of fused/reference."""
    if value == "auto":
        return list(KERNEL_CHOICES) if gpu_server else ["fused"]
    runs = []
    for part in (p.strip() for p in value.split(",") if p.strip()):
        runs.extend(KERNEL_SHORTHANDS.get(part, (part,)))
    unknown = [k for k in runs if k not in KERNEL_CHOICES]
    if unknown or not runs:
        raise SystemExit(f"finetune: --kernels {value!r}: expected auto, {', '.join(KERNEL_SHORTHANDS)} or a "
                         f"comma-separated list of {', '.join(KERNEL_CHOICES)}")
    return runs


def model_vocabulary(model):
    """(vocab_size or None, the tokenizer files found) of --model: a config dict or a local folder."""
    if isinstance(model, dict):
        return model.get("vocab_size"), []
    if not os.path.isdir(model):
        return None, []  # a folder on the server's machine: its vocabulary is known once the session exists
    tokenizers = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(model, f))]
    vocab = None
    config = os.path.join(model, "config.json")
    if os.path.isfile(config):
        with open(config) as f:
            vocab = json.load(f).get("vocab_size")
    return vocab, tokenizers


def check_byte_tokens(args, vocab, tokenizers):
    """Refuses to train a model that has its own vocabulary on UTF-8 bytes unless --byte-tokens asks for it."""
    if args.ids or args.byte_tokens:
        return
    reason = None
    if tokenizers:
        reason = f"its folder has a tokenizer ({', '.join(tokenizers)})"
    elif vocab is not None and vocab > BYTE_VOCABULARY_MAX:
        reason = f"its vocabulary has {vocab:,} ids, not bytes"
    if reason:
        what = f"--text {args.text}" if args.text else "the generated sentences"
        raise SystemExit(f"finetune: {what} would be fed to the model as UTF-8 bytes, but {reason}: tokenise the "
                         "text with the model's tokenizer and pass --ids, or pass --byte-tokens to train on bytes")


def make_batches(tokens, batch, seq_len, steps, seed):
    if len(tokens) <= seq_len:
        raise SystemExit(f"finetune: the data has {len(tokens)} tokens; seq_len {seq_len} needs more")
    rng = random.Random(seed)
    out = []
    for _ in range(steps):
        starts = [rng.randrange(0, len(tokens) - seq_len + 1) for _ in range(batch)]
        out.append([tokens[s:s + seq_len] for s in starts])
    return out


class Progress:
    """A one-line progress bar on a terminal; in a pipe or a log (no carriage returns), a line every 10%.
    It shows the loss smoothed over about ten steps (an exponential moving average), labelled so."""

    def __init__(self, total, label, stream=sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.tty = stream.isatty()
        self.next_report = 0

    def update(self, done, loss, tokens_per_second):
        text = f"smoothed loss {loss:7.4f}  {tokens_per_second:10,.0f} tokens/s"
        if self.tty:
            width = 30
            filled = int(width * done / self.total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                              f"{done}/{self.total}  {text}")
            if done == self.total:
                self.stream.write("\n")
            self.stream.flush()
        elif done >= self.next_report or done == self.total:
            self.stream.write(f"{self.label} step {done}/{self.total}  {text}\n")
            self.stream.flush()
            self.next_report = done + max(1, self.total // 10)


def train(client, model, kernels, batches, args, save_path=None):
    losses, client_seconds, tokens = [], 0.0, 0
    peak = 0
    progress = Progress(len(batches), f"{kernels:>9}")
    smoothed = None
    with client.create_session(model, precision=args.precision, kernels=kernels, seed=args.seed,
                               optimizer=dict(lr=args.lr, weight_decay=args.weight_decay,
                                              max_grad_norm=args.max_grad_norm)) as session:
        info = session.info_at_creation
        check_byte_tokens(args, info.vocab_size, [])  # a model folder on the server's machine is known only now
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            result = session.train_step(batch)
            elapsed = time.perf_counter() - start
            client_seconds += elapsed
            tokens += result.tokens
            peak = max(peak, result.peak_memory_bytes)
            losses.append(result.loss)
            smoothed = result.loss if smoothed is None else 0.9 * smoothed + 0.1 * result.loss
            progress.update(i + 1, smoothed, tokens / client_seconds)
        saved = session.save(save_path) if save_path else None
    k = max(1, min(10, len(losses) // 5))  # the summary's first and last loss are means over k steps
    return dict(kernels=kernels, model_family=info.model_family, parameters=info.parameter_count,
                fused_ops=info.fused_ops, steps=len(losses), loss_window=k, first_loss=sum(losses[:k]) / k,
                last_loss=sum(losses[-k:]) / k, tokens=tokens, seconds=client_seconds,
                tokens_per_second=tokens / client_seconds, peak_memory_bytes=peak,
                checkpoint=saved.path if saved else None, losses=losses)


def start_local_server(binary, log_path, checkpoint_root=None, model_folder=None):
    log = open(log_path, "ab")
    flags = ["--listen=127.0.0.1:0", "--metrics-listen=off"]
    if checkpoint_root:
        flags.append(f"--checkpoint-root={checkpoint_root}")
    if model_folder:
        # The server reads model folders only inside its model roots: offer the folder's parent.
        flags.append(f"--model-root={os.path.dirname(os.path.abspath(model_folder))}")
    proc = subprocess.Popen([binary, *flags],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    for line in proc.stdout:
        m = re.match(r"tigon-server listening on (\S+)", line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"finetune: {binary} did not start; see {log_path}")


def print_summary(runs, stream=sys.stdout):
    k = runs[0]["loss_window"]
    first, last = f"first {k} mean", f"last {k} mean"
    print(f"\nsummary (loss: mean over the first and the last {k} steps, unsmoothed)", file=stream)
    print(f"  {'kernels':<10} {'steps':>6} {first:>13} {last:>13} {'tokens/s':>12} "
          f"{'peak memory':>12}", file=stream)
    for r in runs:
        memory = f"{r['peak_memory_bytes'] / 2**20:,.1f} MiB" if r["peak_memory_bytes"] else "n/a (CPU)"
        print(f"  {r['kernels']:<10} {r['steps']:>6} {r['first_loss']:>13.4f} {r['last_loss']:>13.4f} "
              f"{r['tokens_per_second']:>12,.0f} {memory:>12}", file=stream)
    r = runs[0]
    print(f"  model {r['model_family']}, {r['parameters']:,} parameters; fused ops: "
          f"{', '.join(r['fused_ops']) or 'none'}", file=stream)
    if r["checkpoint"]:
        where = "" if os.path.isabs(r["checkpoint"]) else " under the server's checkpoint root"
        print(f"  checkpoint saved at '{r['checkpoint']}'{where}", file=stream)
    by = {x["kernels"]: x for x in runs}
    if "fused" in by and "reference" in by:
        f, ref = by["fused"], by["reference"]
        line = f"  fused vs reference: {f['tokens_per_second'] / ref['tokens_per_second']:.2f}x tokens/s"
        if f["peak_memory_bytes"] and ref["peak_memory_bytes"]:
            line += f", {100 * (1 - f['peak_memory_bytes'] / ref['peak_memory_bytes']):.0f}% less peak memory"
        print(line, file=stream)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/finetune.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--server", help="HOST:PORT of a running tigon-server")
    where.add_argument("--server-bin", help="start this tigon-server binary on a free loopback port for the run")
    ap.add_argument("--token-file", help="file with the bearer token")
    ap.add_argument("--tls", action="store_true", help="speak TLS to the server (implied by the --tls-* files)")
    ap.add_argument("--tls-root-cert", help="PEM file of the CA that signed the server's certificate")
    ap.add_argument("--tls-client-cert", help="PEM client certificate for a server with --tls-client-ca")
    ap.add_argument("--tls-client-key", help="PEM private key of --tls-client-cert")
    ap.add_argument("--tls-server-name", help="name to check the server's certificate against, if not HOST")
    data = ap.add_mutually_exclusive_group()
    data.add_argument("--text", help="a text file, tokenised as UTF-8 bytes (default: generated sentences)")
    data.add_argument("--ids", help="pre-tokenised ids: whitespace-separated integers or a .npy file")
    ap.add_argument("--byte-tokens", action="store_true",
                    help="train a --model that has its own vocabulary on UTF-8 bytes anyway (refused otherwise)")
    ap.add_argument("--model", help="a Hugging Face config.json or model folder (default: a small byte-level model)")
    ap.add_argument("--family", default="llama", help="model_type of the default model (default llama)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=0, help="default: 2 * hidden")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--precision", default="auto", help="fp32, bf16, bf16_mixed, or auto: bf16 on a GPU, fp32 on a CPU")
    ap.add_argument("--kernels", default="auto",
                    help=f"{', '.join(KERNEL_CHOICES)}, a comma-separated list of them, both "
                         f"({','.join(KERNEL_CHOICES)}), or auto: both on a GPU server, fused on a CPU one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", help="checkpoint written at the end: a path inside the server's --checkpoint-root; "
                                   "with --server-bin, a local folder")
    ap.add_argument("--checkpoint-root", help="with --server-bin: the started server's --checkpoint-root "
                                              "(default: the folder that holds --save)")
    ap.add_argument("--json", help="write the summary (with every step's loss) to this file")
    args = ap.parse_args(argv)

    token = None
    if args.token_file:
        # The first entry's token (a line may be 'TOKEN' or 'TOKEN ROLE NAME', as in the server's file).
        with open(args.token_file) as f:
            token = next((line.split()[0] for line in f if line.strip() and not line.strip().startswith("#")), None)
    if args.checkpoint_root and not args.server_bin:
        ap.error("--checkpoint-root is for the server that --server-bin starts")
    proc = None
    save_path = args.save
    if args.server_bin:
        checkpoint_root = None
        if args.save:
            save_path = os.path.abspath(args.save)
            checkpoint_root = os.path.abspath(args.checkpoint_root or os.path.dirname(save_path))
            if os.path.commonpath([checkpoint_root, save_path]) != checkpoint_root:
                ap.error(f"--save {args.save} is not inside --checkpoint-root {args.checkpoint_root}")
            os.makedirs(checkpoint_root, exist_ok=True)
        log_path = os.environ.get("TIGON_SERVER_LOG", os.path.join(tempfile.gettempdir(), "tigon-server.log"))
        model_folder = args.model if args.model and os.path.isdir(args.model) else None
        proc, address = start_local_server(args.server_bin, log_path, checkpoint_root, model_folder)
    else:
        address = args.server
    try:
        client = tigon.connect(address, token=token, tls=args.tls, root_cert=args.tls_root_cert,
                               client_cert=args.tls_client_cert, client_key=args.tls_client_key,
                               server_name=args.tls_server_name)
        server = client.server_info()
        if args.precision == "auto":
            args.precision = "bf16" if server.devices else "fp32"
        runs_kernels = kernel_runs(args.kernels, bool(server.devices))
        if args.save and not server.checkpoints_enabled:
            raise SystemExit(f"finetune: --save needs a server with --checkpoint-root; the one at {address} has "
                             "checkpoints disabled")
        if args.model:
            model = args.model
            if os.path.isfile(args.model):
                with open(args.model) as f:
                    model = json.load(f)
        else:
            model = default_config(args)
        vocab, tokenizers = model_vocabulary(model)
        check_byte_tokens(args, vocab, tokenizers)
        tokens = load_tokens(args)
        if vocab is not None and tokens and max(tokens) >= vocab:
            raise SystemExit(f"finetune: token id {max(tokens)} is outside the model's vocabulary of {vocab}")
        batches = make_batches(tokens, args.batch_size, args.seq_len, args.steps, args.seed)
        devices = ", ".join(f"{d.name} ({d.total_bytes / 2**30:.0f} GiB)" for d in server.devices) or "CPU"
        print(f"tigon-server {server.version} at {address} on {devices}; {len(tokens):,} tokens; "
              f"{args.steps} steps of {args.batch_size} x {args.seq_len}; precision {args.precision}",
              file=sys.stderr)
        runs = []
        for kernels in runs_kernels:
            runs.append(train(client, model, kernels, batches, args, save_path))
    except tigon.TigonError as e:
        raise SystemExit(f"finetune: {e}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    if args.server_bin and args.save:
        for r in runs:  # the started server is gone: name the checkpoint by its local folder
            r["checkpoint"] = os.path.join(checkpoint_root, r["checkpoint"])
    print_summary(runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    for r in runs:
        if not math.isfinite(r["last_loss"]):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
