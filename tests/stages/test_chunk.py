"""Tests for `streambatch.stages.chunk`: batch widths, chunk views, random access."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import ConfigError
from streambatch.stages.chunk import batch_count, batch_widths, chunked


@pytest.mark.parametrize(
    ("windows", "batch_size", "widths"),
    [(5, 1, [1, 1, 1, 1, 1]), (5, 3, [3, 2]), (5, 5, [5]), (5, 8, [5]), (6, 3, [3, 3]), (0, 3, [])],
)
def test_widths_table(windows: int, batch_size: int, widths: list[int]) -> None:
    """Online, mini-batch and full-set widths; an empty epoch has no batches."""
    assert widths == batch_widths(windows, batch_size)
    assert len(widths) == batch_count(windows, batch_size)


@given(st.integers(0, 500), st.integers(1, 50))
def test_widths_are_full_then_one_smaller(windows: int, batch_size: int) -> None:
    """[B, ..., B, r] with 0 < r <= B, summing to the window count: never padded, never dropped."""
    widths = batch_widths(windows, batch_size)
    assert windows == sum(widths)
    assert all(w == batch_size for w in widths[:-1])
    if widths:
        assert 0 < widths[-1] <= batch_size


@given(st.integers(0, 200), st.integers(1, 30))
def test_chunks_rejoin_the_input(windows: int, batch_size: int) -> None:
    """Concatenated chunks are the input order, and chunks are views, not copies."""
    order = np.arange(windows)[::-1].copy()
    chunks = list(chunked(order, batch_size))
    assert order.tolist() == [x for c in chunks for x in c.tolist()]
    assert all(np.shares_memory(c, order) for c in chunks)


def test_zero_batch_size_raises_at_the_call() -> None:
    """B = 0 is an error raised by the call itself, before any iteration."""
    with pytest.raises(ConfigError, match=r"batch_size=0 must be a positive int; pass the number of windows"):
        chunked(np.arange(3), 0)


def _windows(count: int) -> sb.Windows:
    return sb.windows([sb.Document("a", "train", range(count + 1))], context_length=1)


@given(st.integers(0, 60), st.integers(1, 9))
def test_chunk_views_cover_the_windows_once(count: int, batch_size: int) -> None:
    """chunk: widths [B, ..., B, r], views in order, each knowing its batch index; random access agrees."""
    chunks = sb.chunk(_windows(count), batch_size)
    assert len(chunks) == batch_count(count, batch_size)
    assert [len(c) for c in chunks] == batch_widths(count, batch_size) == chunks.widths
    assert [w for c in chunks for w in c] == list(range(count))
    assert [c.batch_index for c in chunks] == list(range(len(chunks)))
    assert all(list(chunks[i]) == list(c) for i, c in enumerate(chunks))


def test_chunk_refuses_what_is_not_windows() -> None:
    """chunk takes the windows stage's output; a plain list fails at the call, with the rule and the fix."""
    with pytest.raises(ConfigError, match=r"is not a streambatch\.Windows"):
        sb.chunk(list(range(3)), 2)  # type: ignore[arg-type]


def test_chunk_index_out_of_range() -> None:
    """Indexing past the last batch is an OutOfRangeError (also an IndexError)."""
    with pytest.raises(IndexError, match="batch index=2 is out of range for 2 batches"):
        sb.chunk(_windows(3), 2)[2]
