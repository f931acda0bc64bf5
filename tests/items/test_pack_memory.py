"""Packing's memory follows the corpus, never ``T``: the kernel, `sb.pack`, batches that cannot be emitted, records."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.cli import batch_record, main, records
from streambatch.cli.records import record_pieces
from streambatch.errors import ConfigError
from streambatch.items.pack.pack import best_fit_decreasing
from tests.hostile import ENV, PEAK_RSS
from tests.pack_reference import old_best_fit

needs_c = pytest.mark.skipif(not _kernels.available()["best_fit"], reason="streambatch._best_fit is not built")
BACKENDS = ["python", pytest.param("c", marks=needs_c)]
SHORT = [sb.Document(f"d{i}", "train", np.arange(3 + i % 40) % 50) for i in range(100)]


def as_bins(offsets: np.ndarray, items: np.ndarray) -> list[list[int]]:
    return [items[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_packing_matches_the_old_kernel(backend: Any, data: st.DataObject) -> None:
    """Same bins, same order, same ties as the O(T) kernel, for dense and sparse sizes alike."""
    capacity = data.draw(st.integers(1, 200), label="capacity")
    palette = data.draw(st.lists(st.integers(0, capacity), min_size=1, max_size=6), label="palette")
    sizes = data.draw(st.lists(st.one_of(st.integers(0, capacity), st.sampled_from(palette)), max_size=80), label="sizes")
    offsets, items = best_fit_decreasing(np.array(sizes, dtype=np.int64), capacity, backend=backend)
    assert old_best_fit(sizes, capacity) == as_bins(offsets, items)


@needs_c
@pytest.mark.parametrize("capacity", [(1 << 16) + 3, (1 << 31) + 5, (1 << 32) - 1])
def test_large_capacities_agree_with_python(capacity: int) -> None:
    """Sizes above 2**16 take the second radix pass; both backends still agree, bin by bin."""
    rng = np.random.default_rng(capacity)
    for sizes in (rng.integers(0, capacity + 1, 5_000), rng.choice([capacity, capacity // 3, 7, 1 << 16], 5_000)):
        c = best_fit_decreasing(sizes, capacity, backend="c")
        py = best_fit_decreasing(sizes, capacity, backend="python")
        assert np.array_equal(c[0], py[0])
        assert np.array_equal(c[1], py[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernel_memory_does_not_grow_with_capacity(backend: Any) -> None:
    """A hundred sizes into bins of 2**31 - 1 positions: kilobytes (the old kernel took 8 bytes per position)."""
    sizes = np.arange(1, 101, dtype=np.uint32)
    tracemalloc.start()
    try:
        best_fit_decreasing(sizes, (1 << 31) - 1, backend=backend)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_sb_pack_at_huge_T_is_small() -> None:
    """`sb.pack` of 100 short documents at T = 2**27 holds a few integers per document (it took 1.1 GB)."""
    tracemalloc.start()
    try:
        rows = sb.pack(SHORT, context_length=1 << 27)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (len(rows), rows.report.targets) == (1, sum(len(d) - 1 for d in SHORT))
    assert peak < 2 << 20


@pytest.mark.parametrize(
    ("T", "batch_size", "match"),
    [
        (1 << 31, 1, r"1 row of T=2147483648 holds 2147483648 positions, 2\*\*31 or more .*pass T < 2\*\*31"),
        (1 << 40, 4, r"2\*\*31 or more"),
    ],
)
def test_unemittable_batches_are_refused_before_packing(T: int, batch_size: int, match: str) -> None:
    """width * T >= 2**31 cannot be emitted (int32 cu_seqlens): refused by `sb.pack`/`sb.Epoch` (so by `sb.mix` of
    packed parts), not at a batch."""
    with pytest.raises(ConfigError, match=match):
        sb.Epoch(SHORT, context_length=T, batch_size=batch_size, pack=True, seed=None)
    with pytest.raises(ConfigError, match=match):
        sb.pack(SHORT, context_length=T)


def test_cli_refuses_unemittable_T(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, out = tmp_path / "store", tmp_path / "out.jsonl"
    sb.write_store(store, SHORT)
    assert main(["epoch", str(store), "--pack", "-T", str(1 << 40), "-B", "1", "--sequential", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "2**31 or more" in err
    assert "Traceback" not in err
    assert not out.exists()


LIMITED = (
    PEAK_RSS
    + """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import numpy as np
import streambatch as sb
from streambatch.cli import main
docs = [sb.Document(f"d{i}", "train", np.arange(3 + i % 40) % 50) for i in range(100)]
rows = sb.pack(docs, context_length=1 << 30)  # the packing itself is small at any T
assert len(rows) == 1
try:
    sb.Epoch(docs, context_length=1 << 30, batch_size=1, pack=True, seed=None)
except sb.ConfigError as err:
    print("api:", err, file=sys.stderr)
sb.write_store(sys.argv[1], docs)
status = main(["epoch", sys.argv[1], "--pack", "-T", str(1 << 30), "-B", "1", "--sequential", "-o", sys.argv[2]])
print("peak", peak(), file=sys.stderr)
sys.exit(status)
"""
)


def test_epoch_pack_at_2_30_under_a_4_gib_address_limit(tmp_path: Path) -> None:
    """17 GiB of batch arrays under RLIMIT_AS = 4 GiB: one clear line, exit 2, no output; API and CLI alike."""
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, str(tmp_path / "store"), str(out)], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("api: a packed batch of 1 row of T=1073741824 needs")
    assert "address-space limit of 4294967296 bytes (4.0 GiB); pass a smaller T or batch_size" in lines[0]
    assert lines[1].startswith("streambatch: error: a packed batch of 1 row of T=1073741824 needs")
    assert "Traceback" not in done.stderr
    assert "MemoryError" not in done.stderr
    assert int(lines[2].split()[1]) < 1 << 30
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12), T=st.integers(1, 8), packed=st.booleans())
def test_record_pieces_join_to_the_record(lengths: list[int], T: int, packed: bool) -> None:
    """The record written a piece at a time is exactly the JSON of `batch_record`, windows and packed rows alike."""
    docs = [sb.Document(f"d{i}", "train", np.arange(L) % 13) for i, L in enumerate(lengths)]
    try:
        epoch = sb.Epoch(docs, context_length=T, batch_size=3, pack=packed, seed=None)
    except sb.StreamBatchError:
        return  # no document long enough for one window
    for batch in epoch:
        line = b"".join(record_pieces(batch))
        assert line.endswith(b"}\n")
        assert line.count(b"\n") == 1
        assert json.loads(line) == batch_record(batch)


def test_writing_a_long_record_holds_one_piece_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One packed row of T = 2**16 written 1,024 numbers at a time: the writer holds one piece (kilobytes), never
    the record's lists (megabytes; at T = 2**27 the whole record took 17 GB)."""
    (batch,) = sb.Epoch(SHORT, context_length=1 << 16, batch_size=1, pack=True, seed=None)
    monkeypatch.setattr(records, "_PIECE", 1024)
    assert batch.segment_ids is not None  # the columns built on first use are the batch's memory, not the writer's
    pieces = 0
    tracemalloc.start()
    try:
        for piece in record_pieces(batch):
            assert len(piece) < 1 << 14
            pieces += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pieces > 5 * 64
    assert peak < 256 << 10  # the record's lists would take about 5 * 2**16 * 36 bytes = 11 MiB
    monkeypatch.undo()
    assert json.loads(b"".join(record_pieces(batch))) == batch_record(batch)
