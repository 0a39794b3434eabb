"""Progress output written to a pipe or a log: plain lines without carriage returns, and every loss
labelled with what it is (the bar's smoothed or per-step loss, the summary's means over the last steps)."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, server_binary


def tigon_train_binary():
    build = os.environ.get("TIGON_BUILD_DIR") or os.path.join(ROOT, "build")
    path = os.path.join(build, "engine", "tigon-train")
    if not os.access(path, os.X_OK):
        pytest.fail(f"tigon-train not found at {path}; build it (ninja -C {build} tigon-train)")
    return path


def test_finetune_into_a_pipe_prints_labelled_plain_lines():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "client", "python"))
    steps = 20
    out = subprocess.run([sys.executable, "-m", "tigon.finetune", "--server-bin", server_binary(), "--kernels",
                          "fused", "--steps", str(steps), "--batch-size", "2", "--seq-len", "16", "--hidden", "32"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr and "\r" not in out.stdout
    progress = [line for line in out.stderr.splitlines() if re.search(r"step \d+/\d+", line)]
    assert 2 <= len(progress) <= 11, progress  # a line per tenth of the run, not one per step
    assert all("smoothed loss" in line for line in progress), progress
    assert progress[-1].split("step ", 1)[1].startswith(f"{steps}/{steps}")
    # The summary says what its losses are: means over a window of steps, which the bar's value is not.
    header = next(line for line in out.stdout.splitlines() if line.startswith("summary"))
    assert re.search(r"mean over the first and the last \d+ steps", header), header
    assert re.search(r"last \d+ mean", out.stdout)


def test_tigon_train_into_a_pipe_prints_plain_lines():
    steps = 20
    out = subprocess.run([tigon_train_binary(), "--cpu", "--steps", str(steps), "--batch", "2", "--seq", "16",
                          "--hidden", "32", "--layers", "1", "--precision", "fp32"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stderr and "\r" not in out.stdout
    progress = [line for line in out.stderr.splitlines() if re.match(r"step \d+/\d+", line)]
    assert 2 <= len(progress) <= 11, out.stderr
    assert all("step loss" in line and "tok/s" in line for line in progress), progress
    assert progress[-1].startswith(f"step {steps}/{steps}")
    assert re.search(r"mean of last \d+ steps", out.stdout), out.stdout
