"""Columns built on demand: packed rows and masked windows count their targets at emission and build
``loss_mask``, ``segment_ids`` and ``position_ids`` on first use, equal to the eager gather's."""

from __future__ import annotations

import ctypes
import mmap
import pickle
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.items.pack.rows import packed_gatherer
from streambatch.model.mask import count_reader, pack_mask, target_mask_numpy

needs_kernel = pytest.mark.skipif(not _kernels.available()["packed_gather"], reason="the C gather is not built")
LAZY = ("_loss_mask", "_segment_ids", "_position_ids")


def _documents(lengths: list[int], seed: int, masked: bool) -> list[sb.Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for i, n in enumerate(lengths):
        mask = rng.random(n) < 0.6 if masked else None
        if mask is not None:
            mask[-1] = True  # every document trains something
        docs.append(sb.Document(f"d{i}", "train", rng.integers(0, 500, n), loss_mask=mask))
    return docs


@pytest.mark.kernels
@needs_kernel
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 40), min_size=1, max_size=12),
    T=st.integers(1, 9),
    B=st.integers(1, 5),
    seed=st.integers(0, 3),
    masked=st.booleans(),
)
def test_packed_columns_on_demand_equal_the_eager_gather(lengths: list[int], T: int, B: int, seed: int, masked: bool) -> None:
    store = sb.DocumentStore.from_documents(_documents(lengths, seed, masked))
    rows = sb.shuffle(sb.pack(store, context_length=T), seed)
    for batch in sb.materialize(sb.chunk(rows, B)):
        assert not any(key in batch.__dict__ for key in LAZY), "emission wrote a column"
        gatherer = packed_gatherer(batch.space)
        eager = gatherer.gather(np.ascontiguousarray(batch.positions, dtype=np.int64))
        assert batch.target_count == eager[7]
        assert np.array_equal(batch.inputs, eager[0])
        assert np.array_equal(batch.targets, eager[1])
        shipped = pickle.loads(pickle.dumps(batch))  # not built yet: built where it is used
        for one in (batch, shipped):
            assert np.array_equal(one.segment_ids, eager[2])
            assert np.array_equal(one.position_ids, eager[3])
            assert np.array_equal(one.loss_mask, eager[4])
            assert one.target_count == int(one.loss_mask.sum())  # type: ignore[union-attr]


@pytest.mark.kernels
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 60), min_size=1, max_size=10),
    T=st.integers(1, 12),
    B=st.integers(1, 6),
    seed=st.integers(0, 3),
)
def test_masked_windows_count_in_the_bits_and_make_the_mask_on_use(lengths: list[int], T: int, B: int, seed: int) -> None:
    store = sb.DocumentStore.from_documents(_documents(lengths, seed, True))
    try:
        windows = sb.windows(store, context_length=T)
    except sb.StreamBatchError:
        return  # no document holds a window
    for batch in sb.materialize(sb.chunk(sb.shuffle(windows, seed), B)):
        expected = target_mask_numpy(store.loss_bits, batch.positions, T)
        twin = batch.in_epoch(3)  # shares the pending build, made on its own
        assert batch.target_count == int(expected.sum())
        assert np.array_equal(batch.loss_mask, expected)
        assert np.array_equal(twin.loss_mask, expected)
        assert twin.epoch == 3


@pytest.mark.kernels
def test_count_reader_counts_every_ragged_range() -> None:
    rng = np.random.default_rng(5)
    flat = rng.random(3000) < 0.5
    bits = pack_mask(flat)
    positions = rng.integers(0, 3000 - 300, 200).astype(np.int64)
    for T in (1, 7, 8, 63, 64, 65, 129, 299):
        count = count_reader(bits, T)
        if count is None:
            pytest.skip("the C kernel is not built")
        assert count(positions) == sum(int(flat[p + 1 : p + T + 1].sum()) for p in positions.tolist())


def _guarded(raw: bytes) -> tuple[np.ndarray, object]:
    """*raw* as a uint8 array ending on the last byte before a page the process may not read (Linux): a count that
    read one byte past the bits would crash, not miscount.  Returns the array and the mapping holding it."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page)
    anchor = ctypes.c_char.from_buffer(region)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.mprotect(ctypes.c_void_p(ctypes.addressof(anchor) + page), page, 0) != 0:  # 0: PROT_NONE
        pytest.skip("mprotect is not available")
    array = np.frombuffer(region, dtype=np.uint8, count=len(raw), offset=page - len(raw))
    array[:] = np.frombuffer(raw, dtype=np.uint8)
    return array, (region, anchor)


@pytest.mark.kernels
@pytest.mark.skipif(sys.platform != "linux", reason="the guard page uses Linux's mprotect")
@settings(max_examples=300, deadline=None)
@given(data=st.data(), size=st.integers(2, 700))
def test_bit_counts_at_any_offset_read_only_the_bytes_of_the_bits(data: st.DataObject, size: int) -> None:
    """The C count takes 8 bytes at a time from any bit offset; it must count exactly and never read past the
    last byte holding a counted bit (the windows ending on a store's last token included)."""
    density = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    flat = np.random.default_rng(size).random(size) < density
    raw = pack_mask(flat).tobytes()
    bits, _keep = _guarded(raw)
    T = data.draw(st.integers(1, size - 1))
    last = size - T - 1  # the window whose last target is the last bit
    positions = np.array([last, *data.draw(st.lists(st.integers(0, last), max_size=6))], dtype=np.int64)
    count = count_reader(bits, T)
    if count is None:
        pytest.skip("the C kernel is not built")
    assert count(positions) == sum(int(flat[p + 1 : p + T + 1].sum()) for p in positions.tolist())


def test_a_pending_build_runs_before_a_column_is_replaced() -> None:
    """Setting ``loss_mask`` on a batch whose columns are pending keeps the other columns of the same build."""
    store = sb.DocumentStore.from_documents(_documents([30, 17, 9], 1, True))
    (batch,) = sb.materialize(sb.chunk(sb.pack(store, context_length=8), 16))
    mask = np.zeros(batch.shape, dtype=np.bool_)
    batch.loss_mask = mask
    assert batch.loss_mask is mask
    assert batch.segment_ids is not None
    assert batch.position_ids is not None


def _state(batch: sb.MiniBatch) -> dict[str, object]:
    """Every slot and instance attribute of *batch* (what pickling and copying carry)."""
    slots = {name: getattr(batch, name) for name in type(batch).__slots__ if name != "__dict__"}
    return {**slots, **vars(batch)}


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b or a == b


@pytest.mark.parametrize("masked", [False, True])
def test_the_hot_paths_make_the_constructors_batch(masked: bool) -> None:
    """`row_batch` (the window and packed emission loops) makes the batch `MiniBatch(...)` makes, attribute by
    attribute, and it pickles, copies and builds its columns alike."""
    store = sb.DocumentStore.from_documents(_documents([30, 17, 45, 9, 60], 2, masked))
    for items in (sb.windows(store, context_length=6), sb.pack(store, context_length=6)):
        chunks = sb.chunk(sb.shuffle(items, 5), 4)
        hot = list(sb.materialize(chunks))  # the emission loop: row_batch
        for index, batch in enumerate(hot):
            single = sb.materialize(chunks)[index]  # one batch alone: the constructor
            assert _state(batch).keys() == _state(single).keys()
            assert all(_same(_state(batch)[k], _state(single)[k]) for k in _state(batch)), index
            for column in ("loss_mask", "segment_ids", "position_ids", "cu_seqlens"):
                assert _same(getattr(batch, column), getattr(single, column)), column
            again = pickle.loads(pickle.dumps(hot[index]))
            assert _same(again.loss_mask, single.loss_mask)
            assert again.token_count == single.token_count
