"""Window starts enumerated in bounded blocks (issue 18, item 4): equal to the unblocked result, in bounded memory."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch.items.windows import window_index
from streambatch.items.windows.window_index import WindowConfig, WindowIndex, window_starts
from streambatch.order.shuffle import permute


def _naive(lengths: list[int], config: WindowConfig, include: list[bool] | None = None) -> list[int]:
    """Every window's first-token position, one Python loop per document (the reference)."""
    positions, start = [], 0
    for k, length in enumerate(lengths):
        if include is None or include[k]:
            positions += (start + window_starts(length, config.context_length, config.stride)).tolist()
        start += length
    return positions


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    context_length=st.integers(1, 6),
    stride=st.sampled_from([1, 2, 3, 5, 7]),
    block=st.integers(1, 9),
    data=st.data(),
)
def test_blocks_equal_the_unblocked_enumeration(
    lengths: list[int], context_length: int, stride: int, block: int, data: st.DataObject
) -> None:
    """Any range, any block size (inside documents too), any stride, documents left out: the naive positions."""
    config = WindowConfig(context_length, stride)
    include = data.draw(st.lists(st.booleans(), min_size=len(lengths), max_size=len(lengths)))
    index = WindowIndex(lengths, config, include=np.array(include))
    expected = _naive(lengths, config, include)
    assert index.window_count == len(expected)
    lo = data.draw(st.integers(0, len(expected)))
    hi = data.draw(st.integers(lo, len(expected)))
    for dtype in (np.int64, np.uint32, np.intp):
        got = index.range_positions(lo, hi, dtype, block=block)
        assert got.dtype == dtype
        assert got.tolist() == expected[lo:hi]
    assert index.all_positions(np.uint32, block=block).tolist() == expected
    assert index.positions(np.arange(lo, hi)).tolist() == expected[lo:hi]  # the per-window lookup agrees


@pytest.mark.parametrize("stride", [1, 3, 7])
def test_block_boundaries_inside_and_between_documents(stride: int) -> None:
    """Ranges starting and ending one before, at and one after every block boundary; a document ending at one."""
    config = WindowConfig(2, stride)
    block = 5
    first = 3 + (10 - 1) * stride  # 10 windows: the second block boundary is the document boundary
    lengths = [first, 3 + (23 - 1) * stride, 2, 3 + (4 - 1) * stride]  # 10, 23, 0 and 4 windows
    index = WindowIndex(lengths, config)
    expected = _naive(lengths, config)
    assert index.window_count == 37
    edges = sorted({max(0, min(37, b + d)) for b in range(0, 40, block) for d in (-1, 0, 1)})
    for lo in edges:
        for hi in edges:
            if lo <= hi:
                assert index.range_positions(lo, hi, np.int64, block=block).tolist() == expected[lo:hi], (lo, hi)
    out = np.full(37, 99, dtype=np.uint32)
    assert index.all_positions(np.uint32, block=block, out=out) is out
    assert out.tolist() == expected


def test_windows_views_use_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """positions(), plan_values(), iteration and shuffle of sequential views: the unblocked results, tiny blocks."""
    monkeypatch.setattr(window_index, "BLOCK", 4)
    lengths = [40, 1, 17, 9]
    tokens = np.arange(sum(lengths), dtype=np.uint16)
    store = sb.DocumentStore.from_arrays(tokens, np.concatenate([[0], np.cumsum(lengths)]))
    w = sb.windows(store, context_length=3, stride=3)
    expected = _naive(lengths, WindowConfig(3, 3))
    assert w.positions().tolist() == expected == w.plan_values().tolist()
    assert w[5:14].positions().tolist() == expected[5:14] == w[5:14].plan_values().tolist()
    assert w[5:14].positions().dtype == np.intp
    assert list(w) == list(range(len(expected)))
    reference = np.array(expected, dtype=np.uint32)
    state = permute(reference, 11)
    shuffled = sb.shuffle(w, 11)
    assert shuffled.plan is not None
    assert shuffled.plan.tolist() == reference.tolist()
    assert shuffled.shuffle_state_after == state


def test_iteration_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Iterating a view yields its window numbers block by block, sequential and shuffled alike."""

    from streambatch.items import protocol as items

    monkeypatch.setattr(items, "ITER_BLOCK", 3)
    w = sb.windows(sb.DocumentStore.from_arrays(np.zeros(30, dtype=np.uint16), [0, 12, 30]), context_length=2)
    order = sb.shuffle(w, 5)
    assert list(w) == w.numbers().tolist()
    assert len(list(w)) == 26
    assert list(order) == order.numbers().tolist()
    assert list(order[4:11]) == order.numbers().tolist()[4:11]


def test_one_long_document_plans_in_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """windows -> shuffle over one document of 4*10**6 windows: the 4-byte plan plus one block of scratch.

    The unblocked enumeration made 16 bytes of temporaries per window (64 MB here).
    """
    monkeypatch.setattr(window_index, "BLOCK", 1 << 16)
    count = 4_000_000
    store = sb.DocumentStore.from_arrays(np.zeros(count + 8, dtype=np.uint16), [0, count + 8])
    tracemalloc.start()
    try:
        order = sb.shuffle(sb.windows(store, context_length=8), 3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(order) == count
    assert order.plan is not None
    assert order.plan.dtype == np.uint32
    assert peak <= 4 * count + (2 << 20), f"peak {peak / 2**20:.1f} MiB for {count} windows"
    assert int(order.plan.min()) == 0
    assert int(order.plan.max()) == count - 1
    assert int(order.plan.sum(dtype=np.int64)) == count * (count - 1) // 2


@pytest.mark.slow
def test_cli_plan_of_one_long_document_in_bounded_memory(tmp_path: Path) -> None:
    """`streambatch plan` over one document of 2*10**7 windows: peak RSS within the plan + 160 MiB (was 16 B/window more)."""
    count = 20_000_000
    store = tmp_path / "store"
    sb.write_store(store, sb.DocumentStore.from_arrays(np.zeros(count + 8, dtype=np.uint16), [0, count + 8]))
    plans = tmp_path / "plans"
    command = [sys.executable, "-m", "streambatch", "plan", str(store), "-T", "8", "-B", "64", "--seed", "7"]
    command += ["--no-verify", "-o", str(plans)]
    probe = (
        "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    result = subprocess.run([sys.executable, "-c", probe, *command], capture_output=True, text=True, timeout=120)
    code, peak_kib = (int(x) for x in result.stdout.split()[-2:])
    assert code == 0, result.stderr
    planned = list(plans.glob("*.plan"))
    assert len(planned) == 1
    assert planned[0].stat().st_size >= 4 * count
    assert peak_kib * 1024 <= 4 * count + (160 << 20), f"peak RSS {peak_kib / 1024:.0f} MiB for {count} windows"


def test_numbers_and_locate_are_built_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """numbers() and locate() of shuffled and sequential views: the unblocked lookups, with blocks of 3 windows."""
    lengths = [11, 2, 30, 7]
    store = sb.DocumentStore.from_arrays(np.zeros(sum(lengths), dtype=np.uint16), np.concatenate([[0], np.cumsum(lengths)]))
    order = sb.shuffle(sb.windows(store, context_length=2, stride=2), 9)
    sequential = sb.windows(store, context_length=2, stride=2)
    index = order.window_index
    assert order.plan is not None
    expected_numbers = index.windows_at(order.plan).tolist()
    expected_located = [a.tolist() for a in index.locate_positions(order.plan)]
    monkeypatch.setattr(window_index, "BLOCK", 3)
    assert order.numbers().tolist() == expected_numbers
    assert [a.tolist() for a in order.locate()] == expected_located
    assert [a.tolist() for a in order[2:9].locate()] == [a[2:9] for a in expected_located]
    assert [a.tolist() for a in sequential.locate()] == [a.tolist() for a in index.locate(np.arange(len(sequential)))]
    assert window_index.in_blocks(lambda v: v * 2, np.arange(7))[0].tolist() == [0, 2, 4, 6, 8, 10, 12]
