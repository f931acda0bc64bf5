"""Stage 5, share: the batches one DataLoader worker reads, the rows one data-parallel rank holds.

`share` is the one place a share is taken: a worker ``k`` of ``W`` reads
batches ``k, k + W, ...`` (a strided slice, so the DataLoader reads them back in
order), a rank ``r`` of ``R`` holds a contiguous, balanced share of every
batch's rows (`row_share`: sizes differ by at most one, so a batch narrower than
the world leaves some ranks empty, and they still take part).  Every rank's
share carries ``global_count``: the counted targets of the whole batch over all
ranks, from the plan alone, so a materialized share knows the token mean's
global denominator (``batch.global_token_count``) with no collective.  `split_rows` is
the rank half alone; ``shard`` is the deprecated name of the worker half.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable
from typing import Any, overload

from .._checks import is_integer
from ..errors import ConfigError
from .chunk import Chunks, ItemsT, rank_view


def _check_share(index: Any, count: Any, names: tuple[str, str]) -> tuple[int, int]:
    if not is_integer(count) or int(count) <= 0:
        raise ConfigError(f"{names[1]}={count!r} must be a positive int; pass the number of {names[1].replace('_', ' ')}")
    total = int(count)
    if not is_integer(index) or not 0 <= int(index) < total:
        raise ConfigError(f"{names[0]}={index!r} must be an int in [0, {names[1]}={total}); pass this process's {names[0]}")
    return int(index), total


@overload
def share(chunks: Chunks[ItemsT], *, worker: int = 0, workers: int = 1, rank: int = 0,
          world_size: int = 1, part: int = 0, parts: int = 1) -> Chunks[ItemsT]: ...  # fmt: skip
@overload
def share(chunks: range, *, worker: int = 0, workers: int = 1, rank: int = 0,
          world_size: int = 1, part: int = 0, parts: int = 1) -> range: ...  # fmt: skip
@overload
def share(chunks: Iterable[ItemsT], *, worker: int = 0, workers: int = 1, rank: int = 0,
          world_size: int = 1, part: int = 0, parts: int = 1) -> Iterable[ItemsT]: ...  # fmt: skip
def share(chunks: Iterable[ItemsT] | range, *, worker: int = 0, workers: int = 1, rank: int = 0,
          world_size: int = 1, part: int = 0, parts: int = 1) -> range | Iterable[ItemsT]:  # fmt: skip
    """Worker *worker* of *workers*' batches, and rank *rank* of *world_size*'s rows of each (micro-batch *part*
    of *parts* of those rows: gradient accumulation, `streambatch.stages.chunk.part_share`).

    On `Chunks` the share is lazy slicing (batches in between are never built);
    on a ``range`` of a run's global step numbers it is the range's slice (every
    rank takes every step); on any other iterable of items the worker share is
    ``itertools.islice`` and the rank share slices each chunk.  Every rank sees
    every batch, with the same ``batch_index``.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", range(8))], context_length=2)
    >>> [c.batch_index for c in sb.share(sb.chunk(w, 2), worker=1, workers=2)]
    [1]
    >>> [[len(c) for c in sb.share(sb.chunk(w, 4), rank=r, world_size=3)] for r in range(3)]
    [[2, 1], [1, 1], [1, 0]]
    """
    start, step = _check_share(worker, workers, ("worker", "workers"))
    at, world = _check_share(rank, world_size, ("rank", "world_size"))
    piece, pieces = _check_share(part, parts, ("part", "parts"))
    if isinstance(chunks, Chunks):
        if (world > 1 or pieces > 1) and chunks.split:
            raise ConfigError("these chunks are already split over ranks or micro-batches; take a rank share once")
        split = (
            Chunks(chunks.items, chunks.batch_size, chunks.batches, at, world, piece, pieces)
            if world > 1 or pieces > 1
            else chunks
        )
        return split[start::step] if step > 1 else split
    if isinstance(chunks, range):  # a run's global step numbers: every rank takes every step, so the worker's share
        return chunks[start::step]
    if not isinstance(chunks, Iterable):
        raise ConfigError(f"chunks={chunks!r} is not an iterable of chunks; pass sb.chunk(windows, batch_size)")
    picked = itertools.islice(chunks, start, None, step) if step > 1 else iter(chunks)
    return (_rows(c, at, world, piece, pieces) for c in picked) if world > 1 or pieces > 1 else picked


def _rows(chunk: ItemsT, rank: int, world: int, part: int, parts: int) -> ItemsT:
    return rank_view(chunk, rank, world, chunk.batch_index, part, parts)


@overload
def split_rows(chunks: Chunks[ItemsT], rank: int, world_size: int) -> Chunks[ItemsT]: ...
@overload
def split_rows(chunks: Iterable[ItemsT], rank: int, world_size: int) -> Iterable[ItemsT]: ...
def split_rows(chunks: Iterable[ItemsT], rank: int, world_size: int) -> Iterable[ItemsT]:
    """Each batch's contiguous, balanced share of rows for data-parallel *rank* of *world_size*: `share` of ranks.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", range(8))], context_length=2)
    >>> [[len(c) for c in sb.split_rows(sb.chunk(w, 4), r, 3)] for r in range(3)]
    [[2, 1], [1, 1], [1, 0]]
    """
    return share(chunks, rank=rank, world_size=world_size)


def shard(chunks: Iterable[ItemsT] | range, index: int, count: int) -> range | Iterable[ItemsT]:
    """Deprecated name of ``share(chunks, worker=index, workers=count)`` (a "shard" is a store of a corpus)."""
    warnings.warn("streambatch.shard is deprecated; use streambatch.share(chunks, worker=, workers=)", DeprecationWarning, 2)
    return share(chunks, worker=index, workers=count)
