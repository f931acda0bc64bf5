"""Tests for `streambatch.chunk`."""

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


@given(st.integers(0, 60), st.integers(1, 9), st.integers(1, 5))
def test_shards_partition_the_batches(count: int, batch_size: int, workers: int) -> None:
    """share: worker k takes batches k, k + W, ...; together the workers take each batch once."""
    chunks = sb.chunk(_windows(count), batch_size)
    shares = [[c.batch_index for c in sb.share(chunks, worker=k, workers=workers)] for k in range(workers)]
    assert sorted(b for share in shares for b in share) == list(range(len(chunks)))
    assert all(share == list(range(k, len(chunks), workers)) for k, share in enumerate(shares))
    assert [c.batch_index for c in sb.share(iter(chunks), worker=1 % workers, workers=workers)] == shares[1 % workers]


@given(st.integers(0, 60), st.integers(1, 9), st.integers(1, 5))
def test_split_rows_are_contiguous_balanced_shares(count: int, batch_size: int, world: int) -> None:
    """split_rows: every rank sees every batch; its rows are a contiguous share, sizes differ by <= 1."""
    chunks = sb.chunk(_windows(count), batch_size)
    ranks = [list(sb.split_rows(chunks, r, world)) for r in range(world)]
    for j, whole in enumerate(chunks):
        parts = [ranks[r][j] for r in range(world)]
        assert [w for p in parts for w in p] == list(whole)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert {p.batch_index for p in parts} == {whole.batch_index}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: sb.share(c, worker=2, workers=2), r"worker=2 must be an int in \[0, workers=2\)"),
        (lambda c: sb.share(c, workers=0), "workers=0 must be a positive int"),
        (lambda c: sb.split_rows(c, -1, 2), r"rank=-1 must be an int in \[0, world_size=2\)"),
        (lambda c: sb.split_rows(sb.split_rows(c, 0, 2), 0, 2), "already split"),
        (lambda c: sb.chunk(list(range(3)), 2), "is not a streambatch.Windows"),
    ],
)
def test_share_arguments_are_checked(call: object, message: str) -> None:
    """Bad shares fail at the call, with the rule and the fix."""
    with pytest.raises(ConfigError, match=message):
        call(sb.chunk(_windows(5), 2))  # type: ignore[operator]


def test_chunk_index_out_of_range() -> None:
    """Indexing past the last batch is an OutOfRangeError (also an IndexError)."""
    with pytest.raises(IndexError, match="batch index=2 is out of range for 2 batches"):
        sb.chunk(_windows(3), 2)[2]
