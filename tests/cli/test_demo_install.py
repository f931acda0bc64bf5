"""scripts/demo.sh installs only when needed (issue 43: it reinstalled on every call, 8.5 s and a warning box)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines() if line.startswith("version ="))
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls.log"
"""
FAKE_COMMAND = """#!/usr/bin/env bash
if [ "${1:-}" = "--version" ]; then printf 'streambatch %s\nkernels: shuffle c\n' "$(cat "$(dirname "$0")/../reported")"
else echo "ran $*"; fi
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of what _venv.sh reads, with a .venv whose python logs its calls instead of installing."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts", ignore=shutil.ignore_patterns("*.py", "*.c"))
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "streambatch").mkdir()
    for source in [*ROOT.glob("streambatch/*.c"), *ROOT.glob("streambatch/*.h")]:
        shutil.copy(source, tmp_path / "streambatch" / source.name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("streambatch", FAKE_COMMAND)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / ".venv" / "reported").write_text(VERSION)
    return tmp_path


def _demo(tree: Path) -> tuple[str, list[str]]:
    done = subprocess.run(["bash", str(tree / "scripts" / "demo.sh"), "--x"], capture_output=True, text=True, check=True)
    log = tree / ".venv" / "calls.log"
    calls = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return done.stdout, calls


def test_demo_installs_once_then_runs_straight_away(tree: Path) -> None:
    out, calls = _demo(tree)
    assert out == "ran demo --x\n"
    assert any("pip install" in c and "-e" in c for c in calls)
    out, calls = _demo(tree)
    assert (out, calls) == ("ran demo --x\n", [])


def test_a_changed_build_file_or_version_installs_again(tree: Path) -> None:
    _demo(tree)
    with (tree / "setup.py").open("a") as handle:
        handle.write("\n# changed\n")
    assert any("pip install" in c for c in _demo(tree)[1])
    assert _demo(tree)[1] == []
    (tree / ".venv" / "reported").write_text("0.0.1")  # another version installed (e.g. by hand)
    assert any("pip install" in c for c in _demo(tree)[1])
