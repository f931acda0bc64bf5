"""``scripts/train_tiny_lm.py`` in both modes: it trains, and reports target tokens per step and the corpus share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_tiny_lm.py"


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--pack"], ["--sft", "--world-size", "2"]], ids=["windows", "pack", "sft-ddp"])
def test_train_tiny_lm_reports_tokens_per_step(mode: list[str]) -> None:
    argv = ["--epochs", "1", "--max-bytes", "12000", "--context-length", "128", "--batch-size", "8", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1])}  # this tree's streambatch
    done = subprocess.run([sys.executable, str(SCRIPT), *argv, *mode], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    share = re.search(r"an epoch trains on ([\d,]+) of ([\d,]+) targets", done.stdout)
    step = re.search(
        r"epoch 1: token-mean loss ([\d.]+) over ([\d,]+) target tokens, ([\d,.]+) target tokens per step", done.stdout
    )
    assert share, done.stdout
    assert step, done.stdout
    covered, targets = (int(share.group(i).replace(",", "")) for i in (1, 2))
    assert int(step.group(2).replace(",", "")) == covered  # an epoch's denominators add up to the targets it covers
    # packing covers every target; windows lose tails (and under --sft, completion targets in a lost tail)
    assert (covered == targets) if "--pack" in mode else (covered < targets)
