"""Issue 18, item 6: paths in messages are shortened, through the one `short_path` helper.

Each refusal below names files under a folder whose absolute path is longer
than `LONG_PATH` (so shown whole it would be elided in the middle).  Run from
that folder, every message shows the short relative form and never the
absolute one: plan files, the epoch command's ``--resume``, mixture files.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

import streambatch as sb
import streambatch.io.files
from streambatch._paths import LONG_PATH, short_path
from streambatch.cli import main
from streambatch.errors import ConfigError, StoreError
from streambatch.io.mixture_file import open_mixture, read_mixture_file
from streambatch.order.plan import plan_file


@pytest.fixture
def deep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder whose absolute path is longer than LONG_PATH characters."""
    folder = tmp_path / ("a-rather-long-folder-name-" * 3) / ("and-another-one-" * 3)
    folder.mkdir(parents=True)
    assert len(str(folder / "x")) > LONG_PATH
    monkeypatch.chdir(folder)
    return folder


def _documents() -> list[sb.Document]:
    return [sb.Document(f"d{i}", "train", range(10 * i, 10 * i + 9)) for i in range(6)]


def _shows_relative(message: str, folder: Path, *relative: str) -> None:
    assert str(folder) not in message
    for name in relative:
        assert name in message


def test_the_helper_is_one_function() -> None:
    """io.files re-exports the one helper (no second implementation)."""
    assert streambatch.io.files.short_path is short_path


def test_a_damaged_plan_file_is_named_relative(deep: Path) -> None:
    """A truncated plan file: the StoreError names it relative to the working folder, in the message and its fix."""
    order = plan_file(sb.windows(_documents(), context_length=3), 7, deep / "plans")
    path = Path(order.plan_path)
    assert len(str(path)) > LONG_PATH
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 1)
    with pytest.raises(StoreError) as caught:
        plan_file(sb.windows(_documents(), context_length=3), 7, deep / "plans")
    shown = os.path.join("plans", path.name)
    assert str(caught.value).startswith(f"{shown}: ")
    assert f"remove {shown} and plan again" in str(caught.value)
    _shows_relative(str(caught.value), deep, shown)


def test_the_epoch_commands_resume_names_its_files_relative(deep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`epoch --resume` after the output was cut: exit 2, one line naming the state and output files relative."""
    sb.write_store(deep / "store", _documents())
    out, state = deep / "out.jsonl", deep / "state.json"
    argv = ["epoch", str(deep / "store"), "-T", "3", "-B", "2", "--seed", "3", "-o", str(out)]
    assert 0 == main([*argv, "--save-state", str(state)], io.StringIO())
    out.write_bytes(out.read_bytes()[:10])
    capsys.readouterr()
    assert 2 == main([*argv, "--resume", str(state)], io.StringIO())
    err = capsys.readouterr().err
    assert err.startswith("streambatch: error: state.json: output out.jsonl has 10 bytes"), err
    assert err.count("\n") == 1
    _shows_relative(err, deep, "state.json", "out.jsonl")


def test_a_resume_from_a_damaged_state_file_is_named_relative(deep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A state file that is not JSON: the refusal names it relative (the bounded reader gets the short form)."""
    sb.write_store(deep / "store", _documents())
    (deep / "state.json").write_text("{not json")
    argv = ["epoch", str(deep / "store"), "-T", "3", "-B", "2", "--seed", "3", "-o", str(deep / "out.jsonl")]
    assert 2 == main([*argv, "--resume", str(deep / "state.json")], io.StringIO())
    err = capsys.readouterr().err
    assert err.startswith("streambatch: error: state.json: "), err
    _shows_relative(err, deep, "state.json")


def test_a_mixture_file_names_itself_and_its_sources_relative(deep: Path) -> None:
    """A malformed mixture file, and one naming a missing source: both paths are shown relative."""
    mixture = deep / "mixture.json"
    mixture.write_text(json.dumps({"sources": []}))
    with pytest.raises(ConfigError) as caught:
        read_mixture_file(mixture)
    assert str(caught.value).startswith("mixture.json: 'sources' must be a list")
    _shows_relative(str(caught.value), deep, "mixture.json")
    mixture.write_text(json.dumps({"sources": [{"name": "web", "path": "web", "weight": 1}]}))
    with pytest.raises(ConfigError) as caught:
        open_mixture(mixture)
    assert str(caught.value) == "mixture.json: source 'web': web: no such store or corpus manifest"


def test_a_path_elsewhere_is_elided_in_the_middle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from a folder that is not above it, a long path keeps its ends and loses its middle."""
    folder = tmp_path / ("b" * 80) / ("c" * 80)
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere" / "deeper" / "still"
    elsewhere.mkdir(parents=True)
    monkeypatch.chdir(elsewhere)
    (folder / "mixture.json").write_text("[]")
    with pytest.raises(ConfigError) as caught:
        read_mixture_file(folder / "mixture.json")
    shown = short_path(folder / "mixture.json")
    assert len(shown) == LONG_PATH
    assert "..." in shown
    assert str(caught.value).startswith(f"{shown}: the top level must be an object")
