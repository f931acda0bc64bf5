"""Tests for `streambatch.chunk`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streambatch import ConfigError, batch_count, batch_widths, chunked


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
