"""Issue 25, item 7: `prepare --workers` with a tokenizer that runs its own threads never runs slower than one worker.

An HF tokenizer encodes batches on every core already, so the CPUs are split
between processes and its threads (each process keeps at least 2); the summary
line says what was used.  A tokenizer without threads keeps one process per worker.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

import streambatch.read.workers as workers
from streambatch.cli import main
from streambatch.read.text.tokenizers import ByteTokenizer, HFTokenizer
from streambatch.read.workers import WorkerPlan, plan_workers
from tests.read.test_read_tokenizers import train_bpe


@pytest.mark.parametrize(
    ("cpus", "asked", "threaded", "expected"),
    [
        (2, 2, True, WorkerPlan(1, 2)),  # the trial's machine: one process, the tokenizer's 2 threads
        (2, 1, True, WorkerPlan(1, 2)),
        (16, 4, True, WorkerPlan(4, 4)),
        (16, 16, True, WorkerPlan(8, 2)),
        (2, 2, False, WorkerPlan(2, 1)),  # bytes: the pool is the parallelism
        (2, 5, False, WorkerPlan(2, 1)),
    ],
)
def test_the_cpus_are_split_between_processes_and_tokenizer_threads(
    monkeypatch: pytest.MonkeyPatch, cpus: int, asked: int, threaded: bool, expected: WorkerPlan
) -> None:
    monkeypatch.setattr(workers, "available_cpus", lambda: cpus)
    tokenizer = HFTokenizer.__new__(HFTokenizer) if threaded else ByteTokenizer()
    assert plan_workers(asked, tokenizer, quiet=True) == expected
    assert expected.processes * expected.threads <= max(cpus, asked if not threaded else cpus)


def test_the_summary_says_what_was_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tokenizers")
    monkeypatch.setattr(workers, "available_cpus", lambda: 2)
    tokenizer = train_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])
    (tmp_path / "a.txt").write_text("hello world " * 50)
    (tmp_path / "b.txt").write_text("goodbye moon " * 50)
    argv = ["prepare", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "-o", str(tmp_path / "store")]
    assert main([*argv, "--tokenizer", str(tokenizer), "--workers", "2"], io.StringIO()) == 0
    err = capsys.readouterr().err
    assert "workers=2 run as 1 process x 2 tokenizer threads on 2 CPUs" in err
    assert re.search(r"^prepare: 2 files, .*, 1 process x 2 tokenizer threads, ", err, re.M)
