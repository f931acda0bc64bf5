"""`epoch`, `audit` and `inspect` under a batch-size schedule whose thresholds count over the run: for epoch E each
shows what `sb.Run(...).epoch(E)` yields (the schedule going on after E epochs of items), and the state saved by
``epoch --save-state`` records the items consumed since the run's start."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.cli import main

SCHEDULE = "0:4 800:3 1500:5"  # T=3: batches of 4 until item 267, of 3 until item 500, then of 5


def _run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[sb.Document]]:
    rng = np.random.default_rng(3)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 1000, rng.integers(2, 20))) for i in range(30)]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": d.id, "partition": "train", "tokens": d.tokens.tolist()}) + "\n" for d in docs))
    return path, docs


def _reference(docs: list[sb.Document]) -> sb.Run:
    return sb.Run(docs, context_length=3, batch_size=SCHEDULE, seed=11, epochs=4)


def test_every_command_shows_the_runs_epoch(corpus: tuple[Path, list[sb.Document]], tmp_path: Path) -> None:
    path, docs = corpus
    run = _reference(docs)
    widths = [run.epoch(e).batch_widths for e in range(4)]
    assert len({tuple(w) for w in widths}) >= 3  # the epochs differ: thresholds fall in later epochs
    assert set(widths[1][:-1]) == {4, 3}  # epoch 1 changes 4 -> 3 inside it
    args = ["-T", "3", "-B", SCHEDULE, "--seed", "11"]
    for e in range(4):
        status, text = _run(["epoch", str(path), *args, "--epoch", str(e)])
        assert status == 0
        records = [json.loads(line) for line in text.splitlines()]
        assert [len(r["inputs"]) for r in records] == widths[e]
        assert [r["inputs"] for r in records] == [b.inputs.tolist() for b in run.epoch(e)]
        status, text = _run(["inspect", str(path), "-T", "3", "-B", SCHEDULE, "--epoch", str(e), "--json"])
        assert status == 0
        part = json.loads(text)["partitions"]["train"]
        assert part["batches"] == run.batches_in(e)
        assert [w for w, n in part["width_runs"] for _ in range(n)] == widths[e]
        status, text = _run(["audit", str(path), *args, "--epoch", str(e), "--quiet", "--json"])
        assert status == 0
        assert json.loads(text)["batches"] == run.batches_in(e)
    status, text = _run(["inspect", str(path), "-T", "3", "-B", SCHEDULE, "--epoch", "2"])
    assert f"B={SCHEDULE}, epoch 2" in text
    # the saved state of epoch 2, cut off mid-epoch: items counted since the run's start, and it resumes
    out, state = tmp_path / "e2.jsonl", tmp_path / "e2.state"
    status, _ = _run(["epoch", str(path), *args, "--epoch", "2", "-o", str(out), "--save-state", str(state)])
    assert status == 0
    saved = json.loads(state.read_text())
    assert saved["run"]["items"] == 3 * run.item_count  # epoch 2 written whole: (3, 0)
    assert saved["run"]["epoch"] == 3
