"""Issue 25, item 7: `prepare` of a source tree skips ``__pycache__`` and binary files found in folders, and says so.

A binary file named directly is still refused (exit 2, one line, no store written).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import streambatch as sb
from streambatch.cli import main
from streambatch.read.select import select_inputs


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (src / "README.md").write_text("# hello\n")
    (src / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\xa7\r\r\n\0\0\0\0" + bytes(range(256)))
    (src / "pkg" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + b"\0" * 64)
    return src


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    out = io.StringIO()
    status = main(argv, out)
    return status, out.getvalue(), capsys.readouterr().err


def test_a_folder_walk_leaves_out_caches_and_binary_files(tree: Path) -> None:
    selected = select_inputs([tree])
    assert [f.relative for f in selected] == ["README.md", "pkg/mod.py"]
    assert selected.left_out == (str(tree / "pkg" / "logo.png"),)  # __pycache__ is never entered


def test_prepare_of_a_source_tree_counts_what_it_left_out(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "store"
    status, _, err = _run(["prepare", str(tree), "-o", str(out)], capsys)
    assert status == 0, err
    store = sb.open_store(out)
    assert list(store.ids) == ["README.md", "pkg/mod.py"]
    summary = [line for line in err.splitlines() if line.startswith("prepare: 2 files")]
    assert len(summary) == 1
    assert "1 binary file in folders left out (e.g. " in summary[0]
    assert "logo.png" in summary[0]


def test_a_binary_file_named_directly_is_still_refused(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "store"
    status, text, err = _run(["prepare", str(tree / "pkg" / "logo.png"), "-o", str(out)], capsys)
    assert (status, text) == (2, "")
    assert len(err.strip().splitlines()) == 1
    assert "binary data, not text" in err
    assert not out.exists()
