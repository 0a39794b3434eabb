"""python3 -m tigon.finetune against a running server: the loss falls and a summary is printed."""
import json
import os
import subprocess
import sys

from conftest import CORPUS, ROOT


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
