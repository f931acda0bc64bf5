"""Tests for ``global_token_count``: every rank's share of a batch carries the whole batch's counted targets."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import streambatch as sb
from streambatch import ConfigError
from streambatch.items.protocol import counted_targets
from tests.strategies import documents


def _items(kind: str, docs: list[sb.Document], T: int, stride: int, seed: int) -> Any:
    half = len(docs) // 2
    if kind == "windows":
        return sb.shuffle(sb.windows(docs, context_length=T, stride=stride), seed=seed)
    if kind == "packed":
        return sb.shuffle(sb.pack(docs, context_length=T), seed=seed)
    if kind == "mixture":
        parts = [
            sb.windows(docs[:half], context_length=T, stride=stride),
            sb.windows(docs[half:], context_length=T, stride=stride),
        ]
    else:
        parts = [sb.pack(docs[:half], context_length=T), sb.pack(docs[half:], context_length=T)]
    return sb.mix(parts, [1, 2], seed=seed)


def _kinds(docs: list[sb.Document], T: int, stride: int, seed: int) -> list[tuple[str, Any]]:
    """Every item kind this corpus allows (a mixture needs windows in both halves)."""
    found = [(kind, _items(kind, docs, T, stride, seed)) for kind in ("windows", "packed")]
    for kind in ("mixture", "packed mixture"):
        with contextlib.suppress(ConfigError):  # a half without a single window or row
            found.append((kind, _items(kind, docs, T, stride, seed)))
    return found


@given(
    documents(max_docs=10),
    st.integers(1, 6),
    st.integers(1, 4),
    st.integers(1, 7),
    st.integers(1, 5),
    st.integers(1, 3),
    st.integers(0, 2**32),
)
def test_every_share_carries_the_whole_batch_count(
    docs: list[sb.Document], T: int, stride: int, batch_size: int, world: int, workers: int, seed: int
) -> None:
    """Over windows, packed rows and mixtures: each rank's global_token_count is the whole batch's token_count,
    the shares' token counts add up to it, and it equals `counted_targets` of the whole chunk (the plan alone)."""
    if not docs:
        return
    for kind, items in _kinds(docs, T, stride, seed):
        chunks = sb.chunk(items, batch_size)
        whole = list(sb.materialize(chunks))
        assert [b.global_token_count for b in whole] == [b.token_count for b in whole] == [counted_targets(c) for c in chunks]
        for worker in range(workers):
            by_rank = [list(sb.materialize(sb.share(chunks, worker=worker, workers=workers, rank=r, world_size=world)))
                       for r in range(world)]  # fmt: skip
            by_iter = [list(sb.materialize(sb.split_rows(iter(chunks[worker::workers]), r, world))) for r in range(world)]
            for j, batch in enumerate(whole[worker::workers]):
                for ranks in (by_rank, by_iter):
                    shares = [ranks[r][j] for r in range(world)]
                    assert [s.global_token_count for s in shares] == [batch.token_count] * world, kind
                    assert sum(s.token_count for s in shares) == batch.token_count, kind
                    assert shares[-1].in_epoch(3).global_token_count == batch.token_count


def test_a_rank_with_no_rows_still_gets_the_count() -> None:
    """A final batch narrower than the world: ranks without rows carry the whole batch's count (width x T)."""
    epoch = sb.Epoch([sb.Document("a", "train", range(9))], context_length=3, batch_size=4, seed=1)
    last = [epoch.batches(rank=r, world_size=4)[-1] for r in range(4)]
    assert [b.width for b in last] == [1, 1, 0, 0]
    assert [b.global_token_count for b in last] == [6] * 4
    run = sb.Run([sb.Document("a", "train", range(9))], context_length=3, batch_size=4, seed=1, epochs=2)
    assert run.batch(1, 1, rank=3, world_size=4).global_token_count == 6


def test_an_item_kind_without_a_count_is_refused_when_split() -> None:
    """Splitting rows needs the kind's counted_targets; one without it gets a ConfigError naming the seam."""
    with pytest.raises(ConfigError, match="counted_targets"):
        counted_targets(object())
