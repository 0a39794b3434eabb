"""python3 -m tigon.finetune against a running server: the loss falls and a summary is printed."""
import json
import os
import subprocess
import sys

from conftest import CORPUS, ROOT, TINY_LLAMA, server_binary


def test_finetune_on_a_text_file(shared_server, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text(CORPUS)
    summary = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    out = subprocess.run([sys.executable, "-m", "tigon.finetune", "--server", shared_server.address,
                          "--text", str(text), "--steps", "40", "--batch-size", "4", "--seq-len", "32",
                          "--hidden", "32", "--lr", "1e-2", "--kernels", "fused,reference",
                          "--save", "finetune/final", "--json", str(summary)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout and "fused vs reference" in out.stdout
    assert "loss" in out.stderr and "tokens/s" in out.stderr
    runs = json.loads(summary.read_text())
    assert [r["kernels"] for r in runs] == ["fused", "reference"]
    for r in runs:
        assert r["last_loss"] < 0.7 * r["first_loss"], r
    # The same seed and batches: the fused and reference kernels train to nearly the same losses.
    assert abs(runs[0]["last_loss"] - runs[1]["last_loss"]) < 0.05 * runs[1]["last_loss"]
    assert os.path.isdir(os.path.join(shared_server.checkpoint_root, "finetune", "final"))


def run_finetune(*flags, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    return subprocess.run([sys.executable, "-m", "tigon.finetune", *flags], capture_output=True, text=True,
                          timeout=timeout, env=env)


SMALL_RUN = ("--steps", "3", "--batch-size", "2", "--seq-len", "16", "--hidden", "32")


def test_text_is_refused_for_a_model_with_its_own_vocabulary(shared_server, tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text(CORPUS)
    # A model folder with a tokenizer: bytes are not its token ids, even with a vocabulary of 256.
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(TINY_LLAMA)))
    (folder / "tokenizer.json").write_text("{}")
    out = run_finetune("--server", shared_server.address, "--text", str(text), "--model", str(folder), *SMALL_RUN)
    assert out.returncode != 0
    assert "tokenizer.json" in out.stderr and "--byte-tokens" in out.stderr and "--ids" in out.stderr
    assert "summary" not in out.stdout
    # A config with a real vocabulary, and the generated sentences (also text) for it.
    config = tmp_path / "config.json"
    config.write_text(json.dumps(dict(TINY_LLAMA, vocab_size=32000)))
    for data in (("--text", str(text)), ()):
        out = run_finetune("--server", shared_server.address, *data, "--model", str(config), *SMALL_RUN)
        assert out.returncode != 0 and "32,000 ids" in out.stderr, out.stderr
    # Asked for explicitly, bytes are allowed.
    out = run_finetune("--server", shared_server.address, "--text", str(text), "--model", str(config),
                       "--byte-tokens", "--kernels", "fused", *SMALL_RUN)
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout


def test_save_with_a_started_server_writes_the_checkpoint(tmp_path):
    save = tmp_path / "runs" / "final"
    out = run_finetune("--server-bin", server_binary(), "--save", str(save), "--kernels", "fused", *SMALL_RUN)
    assert out.returncode == 0, out.stderr
    assert os.path.isfile(save / "config.json") and os.path.isfile(save / "model.safetensors")
    assert str(save) in out.stdout


def test_save_is_refused_before_training_by_a_server_without_checkpoints(start_server):
    server = start_server()  # no --checkpoint-root
    out = run_finetune("--server", server.address, "--save", "final", "--steps", "200", "--batch-size", "2",
                       "--seq-len", "16", "--hidden", "32")
    assert out.returncode != 0
    assert "--checkpoint-root" in out.stderr
    assert "step" not in out.stderr.split("finetune:")[0]  # no training before the refusal
    assert "TrainStep" not in server.log()


def test_every_kernels_choice_in_the_help_is_accepted(shared_server):
    help_text = run_finetune("--help").stdout
    assert "both" in help_text and "auto" in help_text
    out = run_finetune("--server", shared_server.address, "--kernels", "both", *SMALL_RUN)
    assert out.returncode == 0, out.stderr
    assert "fused vs reference" in out.stdout
    out = run_finetune("--server", shared_server.address, "--kernels", "fast", *SMALL_RUN)
    assert out.returncode != 0 and "--kernels 'fast'" in out.stderr
