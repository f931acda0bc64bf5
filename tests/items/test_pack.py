"""Tests for the packing core, `streambatch.items.pack.pack`: pieces, best-fit decreasing rows, the gather."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streambatch import _kernels
from streambatch.errors import ConfigError, DataError, OutOfRangeError
from streambatch.items.pack._pack_gather import id_dtype
from streambatch.items.pack.pack import PackedArrays, PieceIndex, best_fit_decreasing, gather_segments, pack_lengths
from streambatch.items.windows.window_index import WindowConfig, WindowIndex

needs_c = pytest.mark.skipif(not _kernels.available()["best_fit"], reason="streambatch._best_fit is not built")
BACKENDS = ["python", pytest.param("c", marks=needs_c)]


def brute_best_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """The rule read literally: scan every open bin for the least room that fits, lowest number on ties."""
    order = sorted((i for i, s in enumerate(sizes) if s), key=lambda i: (-sizes[i], i))
    rooms: list[int] = []
    bins: list[list[int]] = []
    for item in order:
        size, best = sizes[item], -1
        for b, room in enumerate(rooms):
            if size <= room and (best < 0 or room < rooms[best]):
                best = b
        if best < 0:
            rooms.append(capacity - size)
            bins.append([item])
        else:
            rooms[best] -= size
            bins[best].append(item)
    return bins


def as_bins(offsets: np.ndarray, items: np.ndarray) -> list[list[int]]:
    return [items[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def brute_pieces(length: int, T: int) -> list[tuple[int, int]]:
    """(start, m) of each piece of one document, from the definition."""
    if length == 1:
        return [(0, 1)]
    return [(s, min(T + 1, length - s)) for s in range(0, max(length - 1, 0), T)]


# ----------------------------------------------------------------------------- pieces
@pytest.mark.parametrize(
    ("length", "T", "pieces"),
    [
        (0, 4, []),  # no piece
        (1, 4, [(0, 1)]),  # one token: a piece without target (skipped)
        (2, 4, [(0, 2)]),
        (5, 4, [(0, 5)]),  # exactly T + 1: one full piece
        (6, 4, [(0, 5), (4, 2)]),
        (8, 4, [(0, 5), (4, 4)]),  # 2T: a full piece and a tail of T - 1 targets
        (9, 4, [(0, 5), (4, 5)]),  # 2T + 1: two full pieces, no one-token remainder
        (13, 4, [(0, 5), (4, 5), (8, 5)]),
        (3, 1, [(0, 2), (1, 2)]),  # T = 1: every piece is full
    ],
)
def test_pieces_table(length: int, T: int, pieces: list[tuple[int, int]]) -> None:
    assert pieces == brute_pieces(length, T)
    index = PieceIndex([length], T)
    docs, starts, sizes = index.locate(np.arange(index.piece_count))
    assert pieces == list(zip(starts.tolist(), sizes.tolist(), strict=True))
    assert set(docs.tolist()) <= {0}
    assert index.full_count == sum(m == T + 1 for _, m in pieces)
    assert index.target_count == max(length - 1, 0) == sum(m - 1 for _, m in pieces)


@given(st.lists(st.integers(0, 60), max_size=12), st.integers(1, 9))
def test_piece_index_matches_enumeration(lengths: list[int], T: int) -> None:
    """Global piece n is the n-th (document, start, m) in document order; number() inverts locate()."""
    expected = [(d, s, m) for d, L in enumerate(lengths) for s, m in brute_pieces(L, T)]
    index = PieceIndex(lengths, T)
    assert index.piece_count == len(expected)
    located = index.locate(np.arange(index.piece_count))
    assert expected == list(zip(*(a.tolist() for a in located), strict=True))
    assert index.number(located[0], located[1]).tolist() == list(range(len(expected)))
    full = [(d, s) for d, s, m in expected if m == T + 1]
    assert full == list(zip(*(a.tolist() for a in index.locate_full(np.arange(index.full_count))), strict=True))
    assert index.skipped_pieces == lengths.count(1)


def test_partition_mask_drops_documents() -> None:
    index = PieceIndex([5, 5, 1], 2, include=[True, False, True])
    assert (index.piece_count, index.full_count, index.skipped_pieces, index.target_count) == (3, 2, 1, 4)


# ----------------------------------------------------------------------------- best-fit decreasing
def test_best_fit_worked_example() -> None:
    """Sizes 5 4 3 3 2 2 1 into bins of 6: 5|1 first (5 opens bin 0, 1 fills it last), ties go to bin 1."""
    offsets, items = best_fit_decreasing([3, 5, 2, 4, 3, 2, 1], 6, backend="python")
    # 5 -> new bin 0 (room 1); 4 -> new bin 1 (room 2); 3 -> new 2 (room 3); 3 -> bin 2 (room 0);
    # 2 -> bin 1 (room 0, best fit); 2 -> new bin 3 (room 4); 1 -> bin 0 (room 1 < 4)
    assert [[1, 6], [3, 2], [0, 4], [5]] == as_bins(offsets, items)


@pytest.mark.parametrize("backend", BACKENDS)
@given(data=st.data())
def test_best_fit_matches_the_literal_rule(backend: Any, data: st.DataObject) -> None:
    capacity = data.draw(st.integers(1, 30))
    sizes = data.draw(st.lists(st.integers(0, capacity), max_size=60))
    offsets, items = best_fit_decreasing(np.array(sizes, dtype=np.int64), capacity, backend=backend)
    assert brute_best_fit(sizes, capacity) == as_bins(offsets, items)
    assert offsets.dtype == np.int64
    assert items.dtype == np.uint32


@needs_c
@pytest.mark.parametrize("capacity", [1, 2, 63, 64, 65, 1000, 4096, 5000])
def test_c_and_python_agree_at_scale(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    for sizes in (rng.integers(0, capacity + 1, 20_000), rng.integers(0, max(2, capacity // 8), 20_000)):
        c = best_fit_decreasing(sizes, capacity, backend="c")
        py = best_fit_decreasing(sizes, capacity, backend="python")
        assert np.array_equal(c[0], py[0])
        assert np.array_equal(c[1], py[1])


def test_best_fit_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        best_fit_decreasing([1, 7], 6)
    with pytest.raises(ConfigError, match="1-D"):
        best_fit_decreasing([[1]], 6)
    with pytest.raises(ConfigError):
        best_fit_decreasing([1], 0)
    with pytest.raises(ConfigError, match="backend"):
        best_fit_decreasing([1], 3, backend="fortran")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- rows and the gather
def corpus(lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random uint16 tokens for documents of *lengths*, and each document's first token position."""
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    tokens = np.random.default_rng(seed).integers(0, 60_000, sum(lengths), dtype=np.uint16)
    return tokens, starts


def check_batch(batch: PackedArrays, tokens: np.ndarray, starts: np.ndarray, T: int) -> set[tuple[int, int]]:
    """Check one batch against the definition; return the (document, target position) pairs it covers."""
    w = batch.inputs.shape[0]
    expected_in = np.zeros((w, T), dtype=tokens.dtype)
    expected_out = np.zeros((w, T), dtype=tokens.dtype)
    expected_seg = np.full((w, T), -1, dtype=id_dtype(T))
    expected_pos = np.zeros((w, T), dtype=id_dtype(T))
    column = np.zeros(w, dtype=np.int64)
    sequences: list[tuple[int, bool]] = []
    covered: set[tuple[int, int]] = set()
    last_row, k = -1, 0
    for row, doc, start, length in zip(
        batch.segment_rows.tolist(),
        batch.segment_documents.tolist(),
        batch.segment_starts.tolist(),
        batch.segment_lengths.tolist(),
        strict=True,
    ):
        if row != last_row:  # close the previous row with its padding
            if last_row >= 0 and column[last_row] < T:
                sequences.append((T - int(column[last_row]), True))
            k = 0
            last_row = row
        c, at = int(column[row]), int(starts[doc]) + start
        expected_in[row, c : c + length] = tokens[at : at + length]
        expected_out[row, c : c + length] = tokens[at + 1 : at + length + 1]
        expected_seg[row, c : c + length] = k
        expected_pos[row, c : c + length] = np.arange(length)
        for t in range(start + 1, start + length + 1):
            assert (doc, t) not in covered
            covered.add((doc, t))
        sequences.append((length, False))
        column[row] += length
        k += 1
    if last_row >= 0 and column[last_row] < T:
        sequences.append((T - int(column[last_row]), True))
    assert (column <= T).all()
    for row in range(w):
        expected_pos[row, column[row] :] = np.arange(T - column[row])
    assert np.array_equal(expected_in, batch.inputs)
    assert np.array_equal(expected_out, batch.targets)
    assert np.array_equal(expected_seg, batch.segment_ids)
    assert np.array_equal(expected_pos, batch.position_ids)
    assert np.array_equal(batch.loss_mask, batch.segment_ids >= 0)
    assert batch.target_count == int(batch.loss_mask.sum()) == int(column.sum()) == len(covered)
    assert (batch.inputs[~batch.loss_mask] == 0).all()
    assert (batch.targets[~batch.loss_mask] == 0).all()
    assert np.diff(batch.cu_seqlens).tolist() == [n for n, _ in sequences]
    assert batch.sequence_is_pad.tolist() == [p for _, p in sequences]
    assert batch.cu_seqlens[-1] == w * T
    assert batch.max_seqlen == max((n for n, _ in sequences), default=0)
    assert batch.cu_seqlens.dtype == np.int32
    assert batch.segment_ids.dtype == batch.position_ids.dtype == id_dtype(T)
    flat_seg = batch.segment_ids.reshape(-1)
    for a, b in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist(), strict=True):
        assert (flat_seg[a:b] == flat_seg[a]).all()
        assert (a // T) == ((b - 1) // T)
    return covered


lengths_strategy = st.lists(
    st.one_of(st.integers(0, 3), st.integers(0, 40), st.sampled_from([1, 2, 9, 10, 11, 17, 18, 19, 28, 30])), max_size=14
)


@pytest.mark.parametrize("backend", BACKENDS)
@given(lengths=lengths_strategy, T=st.sampled_from([1, 2, 3, 5, 9, 10]), width=st.integers(1, 7), seed=st.integers(0, 2**32))
def test_every_target_exactly_once(backend: Any, lengths: list[int], T: int, width: int, seed: int) -> None:
    """All rows, in a shuffled order and cut into batches, cover each (document, target) exactly once."""
    rows = pack_lengths(lengths, T, backend=backend)
    tokens, starts = corpus(lengths, seed % 7)
    report = rows.report
    assert report.targets == sum(max(L - 1, 0) for L in lengths)
    assert report.skipped_pieces == lengths.count(1)
    assert report.rows == len(rows) >= report.lower_bound
    assert report.window_targets == int(WindowIndex(lengths, WindowConfig(T, T)).window_count) * T
    order = np.random.default_rng(seed).permutation(len(rows))
    covered: set[tuple[int, int]] = set()
    pad = 0
    for lo in range(0, len(rows), width):
        batch = rows.gather(tokens, starts, order[lo : lo + width])
        part = check_batch(batch, tokens, starts, T)
        assert not covered & part
        covered |= part
        pad += int((~batch.loss_mask).sum())
    assert covered == {(d, t) for d, L in enumerate(lengths) for t in range(1, L)}
    assert pad == report.pad_positions


@given(lengths=lengths_strategy, T=st.integers(1, 12))
def test_full_rows_are_the_stride_T_windows(lengths: list[int], T: int) -> None:
    """Rows 0 .. full_rows - 1 are the window mode's windows at stride T, in its order."""
    rows = pack_lengths(lengths, T)
    seg = rows.segments(np.arange(rows.full_rows))
    windows = WindowIndex(lengths, WindowConfig(T, T))
    docs, starts = windows.locate(np.arange(windows.window_count))
    assert seg.documents.tolist() == docs.tolist()
    assert seg.starts.tolist() == starts.tolist()
    assert set(seg.lengths.tolist()) <= {T}


@given(lengths=lengths_strategy, T=st.integers(2, 12))
def test_packed_rows_follow_best_fit(lengths: list[int], T: int) -> None:
    """Packed rows are the literal rule applied to the tails (targets (L - 1) % T, by document)."""
    rows = pack_lengths(lengths, T)
    tails = [(L - 1) % T if L >= 2 else 0 for L in lengths]
    assert brute_best_fit(tails, T) == as_bins(rows.offsets, rows.tails)
    packed = rows.segments(np.arange(rows.full_rows, len(rows)))
    assert (np.add.reduceat(packed.lengths, packed.offsets[:-1]) <= T).all() if packed.documents.size else True


@needs_c
def test_pack_c_and_python_agree() -> None:
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 5_000), 1, 20_000).astype(np.int64)
    include = rng.random(lengths.size) < 0.9
    for T in (64, 256, 1000):
        c = pack_lengths(lengths, T, include=include, backend="c")
        py = pack_lengths(lengths, T, include=include, backend="python")
        assert c.report == py.report
        assert np.array_equal(c.offsets, py.offsets)
        assert np.array_equal(c.tails, py.tails)


def test_worked_example_rows() -> None:
    """Documents of 7, 3, 2, 1 tokens at T = 4: one full row, tails 2 (doc 0), 2 (doc 1), 1 (doc 2)."""
    lengths = [7, 3, 2, 1]
    tokens, starts = corpus(lengths)
    rows = pack_lengths(lengths, 4)
    assert (len(rows), rows.full_rows, rows.report.skipped_pieces) == (3, 1, 1)
    assert as_bins(rows.offsets, rows.tails) == [[0, 1], [2]]  # 2 + 2 fill a row; 1 opens another
    batch = rows.gather(tokens, starts, [0, 1, 2])
    assert batch.segment_documents.tolist() == [0, 0, 1, 2]
    assert batch.segment_starts.tolist() == [0, 4, 0, 0]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0], [0, 0, 1, 1], [0, -1, -1, -1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 0, 1], [0, 0, 1, 2]]
    assert batch.cu_seqlens.tolist() == [0, 4, 6, 8, 9, 12]
    assert batch.max_seqlen == 4
    assert batch.target_count == 9 == rows.report.targets
    assert batch.inputs[1].tolist() == [*tokens[4:6].tolist(), *tokens[7:9].tolist()]
    assert batch.targets[2].tolist() == [int(tokens[11]), 0, 0, 0]


def test_lower_bound_is_met_on_a_long_corpus() -> None:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(1500), 1.0, 3_000), 1, 50_000).astype(np.int64)
    report = pack_lengths(lengths, 1024).report
    assert report.rows >= report.lower_bound
    assert report.pad_share < 0.005  # best-fit decreasing leaves almost nothing empty


def test_pack_is_deterministic() -> None:
    lengths = np.random.default_rng(5).integers(0, 500, 2_000)
    a, b = pack_lengths(lengths, 64), pack_lengths(lengths.copy(), 64)
    assert a.report == b.report
    assert np.array_equal(a.tails, b.tails)
    assert np.array_equal(a.offsets, b.offsets)


def test_rejections() -> None:
    with pytest.raises(DataError, match="length"):
        pack_lengths([3, -1], 2)
    with pytest.raises(ConfigError, match="context_length"):
        pack_lengths([3], 0)
    rows = pack_lengths([3, 4], 2)
    with pytest.raises(OutOfRangeError):
        rows.segments([len(rows)])
    tokens, starts = corpus([3, 4])
    with pytest.raises(DataError, match="at most T"):
        gather_segments(tokens, starts, [0, 2], [0, 1], [0, 0], [2, 1], 2)
    with pytest.raises(DataError, match="outside"):
        gather_segments(tokens, starts, [0, 1], [1], [0], [7], 8)
    with pytest.raises(DataError, match="every row"):
        gather_segments(tokens, starts, [0, 0, 1], [0], [0], [1], 2)
    with pytest.raises(ConfigError, match="pad_id"):
        gather_segments(tokens, starts, [0, 1], [0], [0], [1], 2, pad_id=-1)


def test_empty_selection() -> None:
    rows = pack_lengths([0, 1], 4)
    assert len(rows) == 0
    assert rows.report.pad_share == 0.0
    tokens, starts = corpus([0, 1])
    batch = rows.gather(tokens, starts, np.zeros(0, dtype=np.int64))
    assert batch.inputs.shape == (0, 4)
    assert batch.target_count == 0
    assert batch.cu_seqlens.tolist() == [0]


def test_uint32_tokens_and_pad_id() -> None:
    tokens = np.array([5, 6, 7, 8, 9], dtype=np.uint32) + 70_000
    rows = pack_lengths([3, 2], 4)
    batch = rows.gather(tokens, [0, 3], np.arange(len(rows)), pad_id=99)
    assert batch.inputs.dtype == np.uint32
    assert batch.inputs.tolist() == [[70_005, 70_006, 70_008, 99]]
    assert batch.targets.tolist() == [[70_006, 70_007, 70_009, 99]]
