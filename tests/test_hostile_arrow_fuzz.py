"""Seeded byte-flip fuzzing of Arrow IPC files and saved ``datasets`` folders: no crash, no traceback, ever.

Each run is a child process (`tests/fuzz_formats.py`), so a segfault fails the
test instead of killing pytest; every damaged copy must read, or be refused
with a `StreamBatchError` naming it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .hostile import ENV, REPO

pytest.importorskip("pyarrow")

SCRIPT = REPO / "tests" / "fuzz_formats.py"


def _fuzz(tmp_path: Path, kind: str, seed: int, count: int) -> tuple[int, int]:
    if kind == "dataset":
        pytest.importorskip("datasets")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), kind, str(seed), str(count), str(tmp_path)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    last = [line for line in done.stdout.splitlines() if line.startswith("FILE ")][-1:]
    assert done.returncode == 0, (
        f"{kind} seed {seed}: exit {done.returncode} at {last}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr
    found = re.search(r"DONE read=(\d+) refused=(\d+)", done.stdout)
    assert found is not None, done.stdout[-2000:]
    read, refused = int(found[1]), int(found[2])
    assert read + refused == count
    return read, refused


@pytest.mark.parametrize("kind", ["arrow", "arrow-stream", "dataset"])
def test_byte_flips_never_crash(tmp_path: Path, kind: str) -> None:
    """70 damaged copies of each kind (210 in all), always run: each reads or is a DataError naming the copy."""
    read, refused = _fuzz(tmp_path, kind, 1, 70)
    assert refused > 0  # the damage is seen, not just survived
    assert read > 0  # and a flip in a value that does not matter still reads


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arrow", "arrow-stream", "dataset"])
def test_byte_flips_never_crash_many(tmp_path: Path, kind: str) -> None:
    """300 damaged copies of each kind (900 in all; before the fix, some segfaulted or gave SystemError and
    UnicodeDecodeError tracebacks)."""
    read, refused = _fuzz(tmp_path, kind, 18, 300)
    assert refused > 50
    assert read > 0


def test_an_invalid_record_batch_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A string column whose offsets point past its data (what crashed `prepare`) is a DataError naming the file."""
    import pyarrow as pa

    from streambatch.errors import DataError
    from streambatch.read.columns.arrow import iter_arrow

    path = tmp_path / "bad.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("text", pa.string())])) as writer:
        writer.write_batch(pa.record_batch([pa.array(["ab", "cd"])], names=["text"]))
    data = path.read_bytes()
    offsets = b"".join(n.to_bytes(4, "little") for n in (0, 2, 4))
    assert data.count(offsets) == 1
    path.write_bytes(data.replace(offsets, offsets[:8] + (1 << 30).to_bytes(4, "little")))  # far past the 4 bytes
    with pytest.raises(DataError, match=r"bad\.arrow: cannot read as Arrow IPC \(ArrowInvalid"):
        list(iter_arrow(path))
    done = subprocess.run(
        [sys.executable, "-m", "streambatch", "prepare", str(path), "-o", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "bad.arrow: cannot read as Arrow IPC" in done.stderr
    assert not (tmp_path / "s").exists()
