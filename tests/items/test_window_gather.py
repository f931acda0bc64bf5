"""The window gather's C kernel (issue 22, item 7): `WindowGatherer` against the numpy record-view gather."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streambatch as sb
from streambatch import _kernels
from streambatch.items.windows.gather import ShardedGather, StoreGather

needs_c = pytest.mark.skipif(not _kernels.available()["window_gather"], reason="the C window gather is not built")
pytestmark = pytest.mark.kernels  # C against numpy: .ci/run runs these again with the CPU features off
WindowGatherer: Any = getattr(_kernels.built("window_gather"), "WindowGatherer", None)


def _tokens(size: int, dtype: Any, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, np.iinfo(dtype).max, size, dtype=np.int64, endpoint=True).astype(dtype)


def _numpy(gather: StoreGather | ShardedGather) -> StoreGather | ShardedGather:
    gather.kernel = None  # the numpy path alone
    return gather


def _outcome(gather: StoreGather | ShardedGather, rows: np.ndarray) -> object:
    try:
        inputs, targets = gather.take(rows)
    except sb.DataError as error:
        return str(error)
    assert inputs.flags.c_contiguous
    assert targets.flags.c_contiguous
    return inputs.dtype, inputs.shape, targets.shape, inputs.tolist(), targets.tolist()


@needs_c
@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from([np.uint16, np.uint32]),
    size=st.integers(1, 300),
    context_length=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_c_equals_numpy_on_random_positions(dtype: Any, size: int, context_length: int, seed: int, data: st.DataObject) -> None:
    """Random positions, in and out of range (past the end, at the last token): the same arrays or the same DataError."""
    store = sb.DocumentStore.from_arrays(_tokens(size, dtype, seed), [0, size])
    fast, slow = StoreGather(store.tokens, context_length), _numpy(StoreGather(store.tokens, context_length))
    assert (fast.kernel is not None) == (size >= context_length + 1)
    rows = np.array(data.draw(st.lists(st.integers(0, size + 2), max_size=70)), dtype=np.intp)
    assert _outcome(fast, rows) == _outcome(slow, rows)


@needs_c
def test_out_of_range_is_the_same_data_error() -> None:
    """A row past the last window start (a plan of another store) is the numpy path's DataError, nothing returned."""
    store = sb.DocumentStore.from_arrays(_tokens(20, np.uint32, 4), [0, 20])
    for gather in (StoreGather(store.tokens, 4), _numpy(StoreGather(store.tokens, 4))):
        with pytest.raises(sb.DataError, match="outside the store's 20 tokens; the plan does not belong"):
            gather.take(np.array([0, 16], dtype=np.intp))


@needs_c
@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_kernel_rows_and_refusals(dtype: Any) -> None:
    """Row i is tokens[p : p + T] and tokens[p + 1 : p + T + 1]; positions outside [0, len - T) raise IndexError."""
    tokens = _tokens(50, dtype, 1)
    kernel = WindowGatherer(tokens, 7)
    rows = np.array([0, 42, 3, 3, 20], dtype=np.int64)
    inputs, targets = kernel.gather(rows)
    assert inputs.dtype == targets.dtype == np.dtype(dtype)
    assert inputs.tolist() == [tokens[p : p + 7].tolist() for p in rows]
    assert targets.tolist() == [tokens[p + 1 : p + 8].tolist() for p in rows]
    assert kernel.gather(np.zeros(0, dtype=np.int64))[0].shape == (0, 7)
    for bad in (43, -1, 2**62):
        with pytest.raises(IndexError, match=f"row 1 of the batch starts at position {bad}"):
            kernel.gather(np.array([0, bad], dtype=np.int64))
    with pytest.raises(TypeError, match="rows must be int64"):
        kernel.gather(np.array([0], dtype=np.int32))
    with pytest.raises(TypeError, match="uint16 or uint32"):
        WindowGatherer(tokens.astype(np.float32), 7)
    with pytest.raises(ValueError, match="positive"):
        WindowGatherer(tokens, 0)


@needs_c
def test_large_batch_released_gil_path_and_epoch() -> None:
    """A batch of >= 65,536 positions (filled without the GIL) and a whole epoch: the same as numpy's."""
    size, T = 300_000, 512
    store = sb.DocumentStore.from_arrays(_tokens(size, np.uint16, 2), [0, size])
    rows = np.random.default_rng(3).integers(0, size - T, 200).astype(np.intp)
    assert _outcome(StoreGather(store.tokens, T), rows) == _outcome(_numpy(StoreGather(store.tokens, T)), rows)
    epoch = sb.Epoch(store, context_length=T, stride=97, batch_size=33, seed=5)
    for batch in epoch:
        starts = batch.positions
        assert batch.inputs.tolist() == [store.tokens[p : p + T].tolist() for p in starts.tolist()]
        assert np.array_equal(batch.inputs[:, 1:], batch.targets[:, :-1])


@needs_c
@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=4), context_length=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_corpus_span_gather_c_equals_numpy(sizes: list[int], context_length: int, seed: int) -> None:
    """A corpus's spanning gather in C reads the same records as numpy's, every window of every shard."""
    shards = [sb.DocumentStore.from_arrays(_tokens(n, np.uint16, seed + k), [0, n], ids=[f"s{k}"]) for k, n in enumerate(sizes)]
    corpus = sb.Corpus(shards)
    fast, slow = ShardedGather(corpus.flat(), context_length), _numpy(ShardedGather(corpus.flat(), context_length))
    starts = np.concatenate(
        [np.arange(int(b), int(b) + max(0, n - context_length), dtype=np.intp) for b, n in zip(corpus.bases, sizes, strict=False)]
    )
    if starts.size == 0:
        return
    assert _outcome(fast, fast.where(starts)) == _outcome(slow, slow.where(starts))


@needs_c
@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(9, 400),
    context_length=st.integers(1, 600),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_the_next_batch_hint_changes_nothing(size: int, context_length: int, seed: int, data: st.DataObject) -> None:
    """``gather(rows, next)`` asks for the next batch's rows as its copy ends: the arrays are ``gather(rows)``'s for
    any next (in range, out of range, negative, empty, None; rows long and short of the stream's 1 KB chunk)."""
    T = min(context_length, size - 1)
    tokens = _tokens(size, np.uint16, seed)
    kernel = WindowGatherer(tokens, T)
    rows = np.array(data.draw(st.lists(st.integers(0, size - T - 1), max_size=40)), dtype=np.int64)
    hint = data.draw(st.one_of(st.none(), st.lists(st.integers(-(2**62), 2**62), max_size=40)))
    next_rows = None if hint is None else np.array(hint, dtype=np.int64)
    plain, hinted = kernel.gather(rows), kernel.gather(rows, next_rows)
    assert [a.tolist() for a in plain] == [a.tolist() for a in hinted]
    with pytest.raises(TypeError, match="next must be int64"):
        kernel.gather(rows, np.zeros(2, dtype=np.int32))
    with pytest.raises(TypeError, match="takes 1 argument"):
        kernel.gather(rows, rows, rows)
