"""Tests for `streambatch.cli.epoch`: epochs and start batches, saved state, resume after a kill."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb
import streambatch.cli.epoch as cli_epoch
from streambatch.cli import main
from streambatch.read.jsonl import read_jsonl


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def _corpus(path: Path, count: int = 30, seed: int = 3) -> list[sb.Document]:
    rng = np.random.default_rng(seed)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, 1000, rng.integers(2, 20))) for i in range(count)]
    path.write_text("".join(json.dumps({"id": d.id, "partition": "train", "tokens": d.tokens.tolist()}) + "\n" for d in docs))
    return docs


ARGS = ["-T", "3", "-B", "4", "--seed", "11"]


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[sb.Document]]:
    path = tmp_path / "docs.jsonl"
    return path, _corpus(path)


def test_epoch_and_start_batch(corpus: tuple[Path, list[sb.Document]]) -> None:
    """--epoch E --start-batch K writes epoch E of the run from batch K, each record naming its epoch."""
    path, docs = corpus
    status, text = run(["epoch", str(path), *ARGS, "--epoch", "2", "--start-batch", "3"])
    assert 0 == status
    records = [json.loads(line) for line in text.splitlines()]
    expected = sb.Run(docs, context_length=3, batch_size=4, seed=11).epoch(2)
    assert [(2, i) for i in range(3, len(expected))] == [(r["epoch"], r["index"]) for r in records]
    assert [b.inputs.tolist() for b in expected][3:] == [r["inputs"] for r in records]


def _reference(path: Path, tmp_path: Path) -> str:
    reference = tmp_path / "reference.jsonl"
    assert (0, "") == run(["epoch", str(path), *ARGS, "--epoch", "1", "-o", str(reference)])
    return reference.read_text()


def test_save_state_records_the_output_position(corpus: tuple[Path, list[sb.Document]], tmp_path: Path) -> None:
    """The state after the run: the run's position (the next epoch's start) and the output's length and batches."""
    path, _ = corpus
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert (0, "") == run(["epoch", str(path), *ARGS, "--epoch", "1", "-o", str(out), "--save-state", str(state)])
    assert _reference(path, tmp_path) == out.read_text()
    saved = json.loads(state.read_text())
    assert ("streambatch.state", 2, "epoch-command", 1) == (saved["format"], saved["version"], saved["kind"], saved["epoch"])
    assert (2, 0, 11) == (saved["run"]["epoch"], saved["run"]["batch"], saved["run"]["seed"])
    lines = out.read_text().count("\n")
    digest = hashlib.blake2b(out.read_bytes(), digest_size=32).hexdigest()
    expected = {"path": "out.jsonl", "bytes": out.stat().st_size, "batches": lines, "first": 0, "digest": digest}
    assert expected == saved["output"]
    assert (0, "") == run(["epoch", str(path), *ARGS, "-o", str(out), "--resume", str(state)])  # finished: nothing more
    assert _reference(path, tmp_path) == out.read_text()


def test_the_batch_in_flight_is_cut_off_and_written_again(
    corpus: tuple[Path, list[sb.Document]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after writing batch 4 but before saving the state: the resume cuts that line and writes it once."""
    path, _ = corpus
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    real, calls = cli_epoch.atomic_text, []

    def interrupted(target: Any) -> Any:
        calls.append(target)
        if len(calls) == 6:  # state saves: the start, then after batches 0..3; the 6th would follow batch 4
            raise KeyboardInterrupt
        return real(target)

    monkeypatch.setattr(cli_epoch, "atomic_text", interrupted)
    assert (130, "") == run(["epoch", str(path), *ARGS, "--epoch", "1", "-o", str(out), "--save-state", str(state)])
    monkeypatch.setattr(cli_epoch, "atomic_text", real)
    assert 5 == out.read_text().count("\n")  # batch 4 reached the file ...
    assert 4 == json.loads(state.read_text())["output"]["batches"]  # ... but not the state
    assert (0, "") == run(["epoch", str(path), *ARGS, "-o", str(out), "--resume", str(state)])
    assert _reference(path, tmp_path) == out.read_text()


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_a_run_killed_at_a_random_moment_resumes_exactly(tmp_path: Path, seed: int) -> None:
    """SIGKILL at a random moment, resume with what was saved: the output holds every window exactly once, in order.

    The rule for the batch in flight: whatever the killed run wrote after its last saved state is cut off and
    written again, so the output file holds it exactly once.
    """
    path = tmp_path / "docs.jsonl"
    docs = _corpus(path, count=60, seed=seed)
    args = ["epoch", str(path), "-T", "3", "-B", "1", "--seed", "5"]
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    chooser = random.Random(seed)
    threshold = chooser.randint(1, 60)
    child = subprocess.Popen(
        [sys.executable, "-m", "streambatch", *args, "-o", str(out), "--save-state", str(state)], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        try:
            if json.loads(state.read_text())["output"]["batches"] >= threshold:
                break
        except (OSError, ValueError):  # not written yet
            pass
        time.sleep(0.001)
    time.sleep(chooser.uniform(0, 0.005))
    child.send_signal(signal.SIGKILL)
    assert -signal.SIGKILL == child.wait(), child.stderr.read() if child.stderr else ""
    assert (0, "") == run([*args, "-o", str(out), "--resume", str(state)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    expected = sb.Epoch(docs, context_length=3, batch_size=1, seed=5)
    assert list(range(len(expected))) == [r["index"] for r in records]
    origins = Counter((row["document_index"], row["start"]) for r in records for row in r["rows"])
    assert len(expected.window_order()) == len(origins)
    assert {1} == set(origins.values())
    assert [b.inputs.tolist() for b in expected] == [r["inputs"] for r in records]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--save-state", "{state}"], r"--save-state/--resume need --output FILE"),
        (["-o", "{out}", "--resume", "{state}", "--epoch", "1"], r"--resume continues where its state file says"),
        (["-o", "{out}", "--start-batch", "99"], r"start_batch=99 is out of range for an epoch of \d+ batches"),
        (["-o", "{out}", "--epoch", "-1"], r"epoch=-1 must be a non-negative int"),
        (["-o", "{out}", "--resume", "{missing}"], r"No such file or directory"),
        (["-o", "{out}", "--resume", "{garbage}"], r"invalid JSON"),
        (["-o", "{out}", "--resume", "{foreign}"], r"state seed=12 but this run has seed=11"),
        (["-o", "{other}", "--resume", "{state}"], r"the state belongs to output"),
        (["-o", "{out}", "--resume", "{short}"], r"output .* has \d+ bytes but the state recorded \d+"),
    ],
    ids=["no-output", "resume-and-epoch", "start-range", "epoch-negative", "missing", "garbage", "foreign", "other-out", "short"],
)
def test_refusals_are_one_line_and_touch_nothing(
    corpus: tuple[Path, list[sb.Document]], tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """Bad flags or a state of another run: exit 2, one line, the output and the state file unchanged."""
    path, _ = corpus
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert 0 == run(["epoch", str(path), *ARGS, "-o", str(out), "--save-state", str(state)])[0]
    saved = json.loads(state.read_text())
    names = {"out": out, "state": state, "missing": tmp_path / "missing.json", "other": tmp_path / "other.jsonl"}
    names["garbage"] = tmp_path / "garbage.json"
    names["garbage"].write_text("{not json")
    names["foreign"] = tmp_path / "foreign.json"
    names["foreign"].write_text(json.dumps({**saved, "run": {**saved["run"], "seed": 12}}))
    names["short"] = tmp_path / "short.json"
    names["short"].write_text(json.dumps({**saved, "output": {**saved["output"], "bytes": 10**9}}))
    before = (out.read_bytes(), state.read_bytes())
    capsys.readouterr()
    status, text = run(["epoch", str(path), *ARGS, *[a.format(**{k: str(v) for k, v in names.items()}) for a in extra]])
    err = capsys.readouterr().err
    assert (2, "") == (status, text)
    assert 1 == len(err.splitlines())
    assert re.search(message, err), err
    assert before == (out.read_bytes(), state.read_bytes())
    assert not names["other"].exists()


def test_state_files_are_written_atomically(corpus: tuple[Path, list[sb.Document]], tmp_path: Path) -> None:
    """No temporary file is left beside the state after a run."""
    path, _ = corpus
    out, state = tmp_path / "out.jsonl", tmp_path / "state.json"
    assert 0 == run(["epoch", str(path), *ARGS, "-o", str(out), "--save-state", str(state)])[0]
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith(".streambatch-")]
    assert os.path.getsize(state) < 2000


def test_an_empty_epoch_says_so_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """T longer than every document: exit 0, no batches, and a note on stderr (the API's window_count is 0)."""
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "tokens": [1, 2, 3]}\n')
    assert main(["epoch", str(path), "-T", "5", "-B", "2", "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "the epoch is empty" in captured.err
    assert "T + 1 = 6 tokens" in captured.err
    assert sb.Epoch(read_jsonl(path), context_length=5, batch_size=2, seed=None).window_count == 0


def test_a_hostile_state_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A state file nested 100,000 deep is a clean error (exit 2), not a RecursionError."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "tokens": [1, 2, 3, 4]}\n')
    state = tmp_path / "state.json"
    state.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["epoch", str(docs), "-T", "1", "-B", "2", "--seed", "1", "-o", str(tmp_path / "o"), "--resume", str(state)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streambatch: error:")
    assert len(err.splitlines()) == 1


def test_save_state_never_costs_the_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--save-state equal to --output is refused; an unwritable state path fails before the output is truncated."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "tokens": [1, 2, 3, 4, 5]}\n')
    out = tmp_path / "precious.jsonl"
    out.write_text("finished epoch\n")
    common = ["epoch", str(docs), "-T", "2", "-B", "2", "--seed", "1", "-o", str(out)]
    assert main([*common, "--save-state", str(out)]) == 2
    assert "keep the state in a file of its own" in capsys.readouterr().err
    assert main([*common, "--save-state", str(tmp_path / "missing" / "state.json")]) == 2
    capsys.readouterr()
    assert out.read_text() == "finished epoch\n"
