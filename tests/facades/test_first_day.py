"""A newcomer's traps (issue 25, item 7): the messages and outputs a first day runs into.

A validation-only source says which ``--partition`` to pass, a missing SOURCE says
what was looked for, ``demo --html FILE`` reports what it wrote as ``trace`` does, and
``inspect --pack`` shows the packed table first.  Each is checked through the command
line: the exit status, the one-line message, and that no output is written.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.errors import PartitionError, StoreError

VALIDATION = '{"id": "v", "partition": "validation", "tokens": [0, 30, 31, 32, 1]}\n'


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- a source without a document of the epoch's partition ---------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["epoch", "SRC", "-T", "2", "-B", "2", "--seed", "1", "-o", "out.jsonl"],
        ["epoch", "SRC", "-T", "2", "-B", "2", "--sequential", "--pack", "-o", "out.jsonl"],
        ["audit", "SRC", "-T", "2", "-B", "2", "--seed", "1"],
        ["plan", "SRC", "-T", "2", "-B", "2", "--seed", "1", "-o", "plans"],
        ["trace", "SRC", "-T", "2", "-B", "2", "--seed", "1", "--svg", "out.svg"],
    ],
)
@pytest.mark.parametrize("kind", ["jsonl", "store"])
def test_a_validation_only_source_names_its_partition(
    here: Path, kind: str, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--keep-partition would give an empty epoch (exit 0): the message suggests --partition validation instead."""
    Path("val.jsonl").write_text(VALIDATION)
    source = "val.jsonl"
    if kind == "store":
        sb.write_store("store", sb.iter_jsonl("val.jsonl"))
        source = "store"
    before = sorted(p.name for p in here.iterdir())
    status, out, err = run([source if word == "SRC" else word for word in command], capsys)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert "no document is in the epoch's partition 'train'" in err
    assert "--partition validation" in err
    assert "--keep-partition" not in err
    assert sorted(p.name for p in here.iterdir()) == before  # nothing written
    status, _, err = run([source if word == "SRC" else word for word in command] + ["--partition", "validation"], capsys)
    assert (status, err.startswith("streambatch: error")) == (0, False)  # the suggestion works


def test_a_validation_only_source_in_python() -> None:
    """The API raises the same PartitionError; a source of two other partitions lists both."""
    docs = [sb.Document("v", "validation", [0, 1, 2]), sb.Document("t", "test", [0, 1, 2])]
    with pytest.raises(PartitionError, match=r"holds 'validation', 'test'\); read them with --partition validation"):
        sb.Epoch(docs, context_length=2, batch_size=2, seed=1)
    with pytest.raises(PartitionError, match="partition='validation' in Python"):
        sb.pack(docs[:1], context_length=2)
    assert 1 == len(sb.Epoch(docs[:1], context_length=2, batch_size=2, seed=1, partition="validation"))


def test_a_mixed_source_still_suggests_keep_partition(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where the epoch's partition is there, the other documents are skipped with --keep-partition, as before."""
    Path("mixed.jsonl").write_text('{"id": "a", "tokens": [0, 1, 2]}\n' + VALIDATION)
    status, out, err = run(["epoch", "mixed.jsonl", "-T", "2", "-B", "2", "--seed", "1"], capsys)
    assert (status, out) == (2, "")
    assert "--keep-partition" in err


# --- a SOURCE that is not there -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["epoch", "data/store", "-T", "2", "-B", "2", "--seed", "1", "-o", "out.jsonl"],
        ["inspect", "data/store"],
        ["audit", "data/store", "-T", "2", "-B", "2", "--seed", "1"],
        ["plan", "data/store", "-T", "2", "-B", "2", "--seed", "1", "-o", "plans"],
    ],
)
def test_a_missing_store_folder_says_what_was_looked_for(
    here: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A name without a suffix is a store folder that is not there, not "a readable JSONL file"."""
    status, out, err = run(command, capsys)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "data/store: no such store folder" in err
    assert "corpus manifest" in err
    assert "streambatch prepare INPUT -o data/store" in err
    assert "JSONL file)" in err
    assert "pass a readable JSONL file" not in err
    assert [] == list(here.iterdir())  # nothing written


def test_a_missing_jsonl_file_is_still_named_as_one(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["epoch", "docs.jsonl", "-T", "2", "-B", "2", "--seed", "1"], capsys)
    assert (status, out) == (2, "")
    assert "cannot open 'docs.jsonl'" in err
    assert "JSONL file" in err
    with pytest.raises(StoreError, match="no such store folder"):
        sb.open_source("data/store")


# --- demo --html FILE ---------------------------------------------------------------------------------------


def test_demo_html_says_what_it_wrote_like_trace(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One `wrote FILE` line on stdout, not the report; trace --html prints the same kind of line."""
    status, out, err = run(["demo", "--html", "chapter.html"], capsys)
    assert (status, err) == (0, "")
    assert out == "wrote chapter.html: the chapter's epoch, 5 windows, 2 batches\n"
    assert Path("chapter.html").read_text().startswith("<!DOCTYPE html>")
    Path("docs.jsonl").write_text('{"id": "a", "tokens": [0, 10, 11, 12, 1]}\n{"id": "b", "tokens": [0, 20, 21, 1]}\n')
    status, traced, _ = run(["trace", "docs.jsonl", "-T", "2", "-B", "3", "--seed", "7", "--html", "t.html"], capsys)
    assert status == 0
    assert traced.startswith("wrote t.html: 5 windows, 2 batches")


def test_demo_html_to_stdout_reports_on_stderr(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["demo", "--html", "-", "--svg", "chapter.svg"], capsys)
    assert status == 0
    assert out.startswith("<!DOCTYPE html>")
    assert err.splitlines() == [
        "wrote chapter.svg: the chapter's epoch, 5 windows, 2 batches",
        "wrote standard output: the chapter's epoch, 5 windows, 2 batches",
    ]


def test_demo_html_into_a_missing_folder_writes_nothing(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(["demo", "--html", "gone/chapter.html"], capsys)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "gone" in err
    assert [] == list(here.iterdir())


def test_demo_trace_with_a_figure_prints_the_trace(here: Path, capsys: pytest.CaptureFixture[str], golden: Path) -> None:
    """--trace asks for the trace explicitly: it is printed, then the wrote line."""
    status, out, _ = run(["demo", "--trace", "--svg", "c.svg"], capsys)
    assert status == 0
    assert out == (golden / "expected-trace.txt").read_text() + "wrote c.svg: the chapter's epoch, 5 windows, 2 batches\n"


# --- inspect --pack -----------------------------------------------------------------------------------------


def test_inspect_pack_shows_the_packed_table_first(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("docs.jsonl").write_text('{"id": "a", "tokens": [0, 10, 11, 12, 13, 14, 15, 16, 1]}\n{"id": "b", "tokens": [0, 1]}\n')
    status, out, err = run(["inspect", "docs.jsonl", "-T", "4", "-B", "2", "--pack"], capsys)
    assert (status, err) == (0, "")
    tables = out.split("\n\n")
    assert tables[1].startswith("T=4: packed vs windows at stride 4  train: packed  train: windows")
    assert tables[2].startswith("windows: T=4, stride=4, B=2")
    status, out, _ = run(["inspect", "docs.jsonl", "-T", "4", "-B", "2"], capsys)
    assert status == 0
    assert "packed" not in out
    assert out.split("\n\n")[1].startswith("T=4, stride=1, B=2")
