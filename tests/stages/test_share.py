"""Tests for `streambatch.stages.share`: a worker's share of the batches, a rank's share of each batch's rows."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import ConfigError


def _windows(count: int) -> sb.Windows:
    return sb.windows([sb.Document("a", "train", range(count + 1))], context_length=1)


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
    ],
)
def test_share_arguments_are_checked(call: object, message: str) -> None:
    """Bad shares fail at the call, with the rule and the fix."""
    with pytest.raises(ConfigError, match=message):
        call(sb.chunk(_windows(5), 2))  # type: ignore[operator]


@given(st.integers(0, 40), st.integers(1, 5), st.integers(1, 4), st.integers(1, 3))
def test_a_range_of_steps_is_the_worker_share_on_every_rank(steps: int, workers: int, world: int, parts: int) -> None:
    """A run's global step numbers: every rank (and micro-batch) takes every step, so a range's share is its slice,
    a range again, whatever the ranks (it was a generator of int 'chunks' that failed when read)."""
    for k in range(workers):
        for rank in range(world):
            got = sb.share(range(steps), worker=k, workers=workers, rank=rank, world_size=world, part=parts - 1, parts=parts)
            assert got == range(k, steps, workers)
    with pytest.raises(ConfigError, match=r"rank=2 must be an int in \[0, world_size=2\)"):
        sb.share(range(steps), rank=2, world_size=2)
