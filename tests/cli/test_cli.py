"""Tests for `streambatch.cli`: the demo, the epoch command and one-line errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streambatch.cli import main


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out), out.getvalue()


def test_demo_and_trace(golden: Path) -> None:
    """`streambatch demo` and `demo --trace` print the golden files."""
    assert (0, (golden / "expected-report.txt").read_text()) == run(["demo"])
    assert (0, (golden / "expected-trace.txt").read_text()) == run(["demo", "--trace"])


@pytest.mark.slow
def test_python_dash_m_runs_the_cli(golden: Path) -> None:
    """`python -m streambatch demo` is the same command."""
    done = subprocess.run([sys.executable, "-m", "streambatch", "demo"], capture_output=True, text=True, check=True)
    assert (golden / "expected-report.txt").read_text() == done.stdout


@pytest.fixture
def fixture_file(tmp_path: Path) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text(
        '{"id": "train-a", "partition": "train", "tokens": [0, 10, 11, 12, 1]}\n'
        '{"id": "train-b", "partition": "train", "tokens": [0, 20, 21, 1]}\n'
    )
    return path


def test_epoch_writes_one_object_per_batch(fixture_file: Path) -> None:
    """Seed 7 on the fixture: two batches, provenance and ids as in the chapter."""
    status, text = run(["epoch", str(fixture_file), "--context-length", "2", "--batch-size", "3", "--seed", "7"])
    assert status == 0
    batches = [json.loads(line) for line in text.splitlines()]
    assert [b["index"] for b in batches] == [0, 1]
    assert [b["shape"] for b in batches] == [[3, 2], [2, 2]]
    assert [b["token_count"] for b in batches] == [6, 4]
    assert batches[0]["rows"][0] == {"document": "train-b", "document_index": 1, "start": 1, "partition": "train"}
    assert batches[0]["inputs"] == [[20, 21], [10, 11], [0, 20]]
    assert batches[1]["targets"] == [[10, 11], [12, 1]]


def test_epoch_sequential_with_stride_to_file(fixture_file: Path, tmp_path: Path) -> None:
    """--sequential keeps document order; --output writes the file atomically."""
    out = tmp_path / "batches.jsonl"
    status, text = run(["epoch", str(fixture_file), "-T", "2", "-B", "8", "--stride", "2", "--sequential", "-o", str(out)])
    assert (status, text) == (0, "")
    rows = json.loads(out.read_text())["rows"]
    assert [(r["document"], r["start"]) for r in rows] == [("train-a", 0), ("train-a", 2), ("train-b", 0)]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["epoch", "{file}", "-T", "0", "-B", "3", "--seed", "7"], "context_length=0 must be a positive int"),
        (["epoch", "{file}", "-T", "2", "-B", "0", "--seed", "7"], "batch_size=0 must be a positive int"),
        (["epoch", "{file}", "-T", "2", "-B", "3", "--seed", "-1"], r"seed=-1 must be an int in \[0, 2\*\*64\)"),
        (["epoch", "{file}", "-T", "2", "-B", "3"], "one of the arguments --seed --sequential is required"),
        (["epoch", "{missing}", "-T", "2", "-B", "3", "--seed", "1"], "cannot open"),
        (["epoch", "{bad}", "-T", "2", "-B", "3", "--seed", "1"], r"bad.jsonl:2 \(document id='x'\): token\[0\]=1.5"),
        (
            ["epoch", "{file}", "-T", "2", "-B", "3", "--seed", "1", "--partition", "test"],
            "no document is in the epoch's partition 'test'",
        ),
        (["nope"], "invalid choice"),
    ],
    ids=["T", "B", "seed", "no-order", "missing", "bad-token", "partition", "command"],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, fixture_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: exit 2, one line on stderr naming the problem, nothing on stdout, no output file."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "y", "partition": "train", "tokens": [1]}\n{"id": "x", "partition": "train", "tokens": [1.5]}\n')
    names = {"file": str(fixture_file), "missing": str(tmp_path / "missing.jsonl"), "bad": str(bad)}
    out = tmp_path / "out.jsonl"
    status, text = run([a.format(**names) for a in argv] + (["-o", str(out)] if argv[0] == "epoch" else []))
    err = capsys.readouterr().err
    assert status == 2
    assert text == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("streambatch: error: ")
    assert message in err or __import__("re").search(message, err)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".streambatch-")] == []


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["plan", "{file}", "-T", "2", "-B", "2", "--seed", "1", "-o", "s3://b/plans"], "--output"),
        (["epoch", "{file}", "-T", "2", "-B", "2", "--seed", "1", "--plan-dir", "s3://b/plans"], "--plan-dir"),
        (["epoch", "{file}", "-T", "2", "-B", "2", "--seed", "1", "--save-state", "gs://b/state", "-o", "{out}"], "--save-state"),
        (["epoch", "{file}", "-T", "2", "-B", "2", "--seed", "1", "-o", "s3://b/out.jsonl"], "--output"),
        (["audit", "{file}", "-T", "2", "-B", "2", "--seed", "1", "--plan-dir", "s3://b/plans"], "--plan-dir"),
        (["trace", "{file}", "-T", "2", "-B", "2", "--seed", "7", "--svg", "s3://b/figure.svg"], "--svg"),
    ],
)
def test_an_address_where_only_a_path_works_is_refused(
    argv: list[str], option: str, fixture_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """An object-storage address for an option that needs a local path: one line naming the option, exit 2, and
    no local folder named ``s3:`` or ``gs:`` (nor any file) created."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out.jsonl"
    status, _ = run([a.format(file=fixture_file, out=out) for a in argv])
    err = capsys.readouterr().err
    assert status == 2
    assert len(err.splitlines()) == 1
    assert f" {option} " in err
    assert "object-storage address is not accepted" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p != fixture_file) == []
