"""Stage 4, chunk: items (windows, packed rows, a mixture's items) into batches of *batch_size*, the last one smaller.

The final batch is never padded and never dropped.  `chunk` gives `Chunks`, a
lazy sequence of views (nothing is copied), each tagged with its batch index;
`streambatch.stages.share` takes a worker's or a rank's share of them.  Any
`streambatch.items.protocol.Items` can be chunked.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar, overload

import numpy as np
import numpy.typing as npt
from more_itertools import sliced

from .._checks import check_non_negative, check_positive, is_integer
from ..errors import ConfigError, OutOfRangeError
from ..items.protocol import Items, counted_targets
from .schedule import BatchSchedule

BatchSize = int | BatchSchedule  # a fixed size, or a schedule bound to its items' T (`streambatch.stages.schedule`)

ItemsT = TypeVar("ItemsT", bound=Items)


def batch_count(window_count: int, batch_size: BatchSize) -> int:
    """Number of batches: ``ceil(window_count / batch_size)``; 0 for an empty epoch (a schedule: its own count).

    >>> batch_count(5, 3), batch_count(0, 3)
    (2, 0)
    """
    check_non_negative(window_count, "window_count", "the number of windows in the epoch")
    if isinstance(batch_size, BatchSchedule):
        return batch_size.count(window_count)
    check_positive(batch_size, "batch_size", "the number of windows per batch")
    return -(-window_count // batch_size)


def batch_widths(window_count: int, batch_size: BatchSize) -> list[int]:
    """Widths ``[B] * k + [r]``: full batches, then the smaller final one (if any); a schedule's follow it.

    >>> batch_widths(5, 1), batch_widths(5, 3), batch_widths(5, 5), batch_widths(0, 3)
    ([1, 1, 1, 1, 1], [3, 2], [5], [])
    """
    if isinstance(batch_size, BatchSchedule):
        return batch_size.widths(check_non_negative(window_count, "window_count", "the number of items in the epoch"))
    full, rest = divmod(window_count, batch_size) if batch_count(window_count, batch_size) else (0, 0)
    return [batch_size] * full + ([rest] if rest else [])


def chunked(order: npt.NDArray[np.integer], batch_size: int) -> Iterator[npt.NDArray[np.integer]]:
    """Yield *batch_size* entries of an array at a time; the last chunk may be short.

    Chunks are views of *order*: no copy and no object per window.

    >>> [c.tolist() for c in chunked(np.arange(5), batch_size=2)]
    [[0, 1], [2, 3], [4]]
    """
    check_positive(batch_size, "batch_size", "the number of windows per batch")
    return sliced(order, batch_size)


class Chunks(Sequence[ItemsT], Generic[ItemsT]):
    """Batches of an `Items` sequence (usually `Windows`), lazily: chunk *j* is a view of batch ``batches[j]``.

    Sized and indexable, so resuming, sharding and splitting are slicing; each
    chunk knows its global batch index (``.batch_index``).  Made by `chunk`;
    `streambatch.share` takes shares of it.
    """

    __slots__ = ("batch_size", "batches", "items", "part", "parts", "rank", "world_size")

    def __init__(
        self,
        items: ItemsT,
        batch_size: BatchSize,
        batches: range,
        rank: int = 0,
        world_size: int = 1,
        part: int = 0,
        parts: int = 1,
    ) -> None:
        self.items = items
        self.batch_size = batch_size
        self.batches = batches
        self.rank = rank
        self.world_size = world_size
        self.part = part  # micro-batch *part* of *parts* of the rank's rows (gradient accumulation)
        self.parts = parts

    @property
    def split(self) -> bool:
        """True when each chunk is a share of its batch's rows (a rank's, or a micro-batch of one)."""
        return self.world_size > 1 or self.parts > 1

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def windows(self) -> ItemsT:
        """The chunked sequence (`Windows` in window mode): the same as `items`."""
        return self.items

    @overload
    def __getitem__(self, item: int) -> ItemsT: ...
    @overload
    def __getitem__(self, item: slice) -> Chunks[ItemsT]: ...
    def __getitem__(self, item: int | slice) -> ItemsT | Chunks[ItemsT]:
        if isinstance(item, slice):
            try:
                return Chunks(self.items, self.batch_size, self.batches[item], self.rank, self.world_size, self.part, self.parts)
            except (TypeError, ValueError) as err:
                raise OutOfRangeError(f"slice {item!r} is not a slice of ints with a non-zero step ({err})") from None
        if not is_integer(item):
            raise OutOfRangeError(f"batch index={item!r} is not an int; pass 0 <= index < batch_count")
        if not -len(self) <= int(item) < len(self):
            raise OutOfRangeError(f"batch index={item!r} is out of range for {len(self)} batches; use 0 <= index < batch_count")
        return self._chunk(self.batches[int(item)])

    @property
    def uniform(self) -> bool:
        """True when every batch but the last holds ``batch_size`` items (no schedule)."""
        return type(self.batch_size) is int

    def span(self, batch: int) -> tuple[int, int]:
        """``(first, stop)``: the items of batch *batch* (a global batch index)."""
        size = self.batch_size
        if type(size) is int:
            first = batch * size
            return first, min(first + size, len(self.items))
        return size.span(batch, len(self.items))  # type: ignore[union-attr]

    def _chunk(self, batch: int) -> ItemsT:
        first, last = self.span(batch)
        if self.split:
            whole = self.items.view(first, last)
            return rank_view(whole, self.rank, self.world_size, batch, self.part, self.parts)
        return self.items.view(first, last, batch_index=batch)

    def __iter__(self) -> Iterator[ItemsT]:
        return map(self._chunk, self.batches)

    @property
    def widths(self) -> list[int]:
        """Rows of every chunk, without building them."""
        whole = [hi - lo for lo, hi in map(self.span, self.batches)]
        if not self.split:
            return whole
        return [hi - lo for lo, hi in (part_share(w, self.rank, self.world_size, self.part, self.parts) for w in whole)]

    def __repr__(self) -> str:
        share = f", rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        share += f", part={self.part}/{self.parts}" if self.parts > 1 else ""
        return f"Chunks({len(self)} of batch_size={self.batch_size}, batches={self.batches}{share})"


def chunk(windows: ItemsT, batch_size: int | str | BatchSchedule | Sequence[tuple[int, int]]) -> Chunks[ItemsT]:
    """Batches of *batch_size* windows, the last one smaller: a lazy sequence of views.

    *batch_size* may be a schedule (`streambatch.stages.schedule`): the widths follow it, bound to the items' ``T``.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", range(7))], context_length=1)
    >>> [list(c) for c in sb.chunk(w, batch_size=4)]
    [[0, 1, 2, 3], [4, 5]]
    >>> [len(c) for c in sb.chunk(w, batch_size="0:1 2:3")]
    [1, 1, 3, 1]
    """
    size = check_batch_size(batch_size)
    if not isinstance(windows, Items) or isinstance(windows, str | bytes):
        raise ConfigError(f"windows={windows!r} is not a streambatch.Windows; build one with sb.windows(store, ...)")
    size = bind_batch_size(size, windows)
    return Chunks(windows, size, range(batch_count(len(windows), size)))


def check_batch_size(batch_size: object) -> BatchSize:
    """*batch_size* as a positive int (the fixed path, unchanged), or a `BatchSchedule` (a string, pairs)."""
    if is_integer(batch_size):
        return check_positive(batch_size, "batch_size", "the number of windows per batch")
    return BatchSchedule.parse(batch_size)


def bind_batch_size(batch_size: BatchSize, items: Items) -> BatchSize:
    """*batch_size* over *items*: an int as it is, a schedule bound to the items' ``T`` (an item is T tokens)."""
    if isinstance(batch_size, BatchSchedule):
        return batch_size.bound(items.context_length)  # type: ignore[attr-defined]
    return batch_size


def final_batch(items: int, batch_size: BatchSize) -> tuple[int, int, int]:
    """``(full batches, final width, final capacity)`` of an epoch of *items*: the final batch and the size it
    would hold (a schedule: its phase's), without listing every width.

    >>> final_batch(5, 3), final_batch(6, 3), final_batch(0, 3)
    ((1, 2, 3), (2, 3, 3), (0, 0, 3))
    """
    count = batch_count(items, batch_size)
    if isinstance(batch_size, BatchSchedule):
        if not count:
            return 0, 0, batch_size.phases[0][1]
        first, stop = batch_size.span(count - 1, items)
        capacity = batch_size.size_of(count - 1, items)
        return count - (stop - first < capacity), stop - first, capacity
    return items // batch_size, items - (count - 1) * batch_size if count else 0, batch_size


def fixed_batch_size(batch_size: BatchSize, what: str) -> int:
    """*batch_size* where only a fixed size makes sense (*what* names who needs it); a schedule is a `ConfigError`."""
    if isinstance(batch_size, BatchSchedule):
        raise ConfigError(f"{what} needs a fixed batch_size, not the schedule {batch_size}; pass an int batch size")
    return batch_size


def largest_batch(batch_size: BatchSize) -> int:
    """The widest batch *batch_size* makes: itself, or a schedule's widest phase."""
    return batch_size.largest if isinstance(batch_size, BatchSchedule) else batch_size


def rank_view(whole: ItemsT, rank: int, world_size: int, batch_index: int | None, part: int = 0, parts: int = 1) -> ItemsT:
    """*rank*'s rows of the batch *whole* (`row_share`), or micro-batch *part* of *parts* of them (`part_share`),
    carrying the whole batch's counted targets.

    The count comes from the plan alone (`counted_targets`), the same on every
    rank and every micro-batch, so each knows the token mean's global
    denominator (the whole step's) with no collective; a share with no rows still gets it.
    """
    lo, hi = part_share(len(whole), rank, world_size, part, parts)
    return whole.view(lo, hi, batch_index=batch_index, global_count=counted_targets(whole))


def part_share(width: int, rank: int, world_size: int, part: int = 0, parts: int = 1) -> tuple[int, int]:
    """``(start, stop)`` of micro-batch *part* of *parts* of *rank*'s rows: `row_share` of the rank's `row_share`.

    The rank's rows are the same for any *parts* (gradient accumulation splits a
    rank's share, never the batch again).

    >>> part_share(7, 0, 2, 0, 2), part_share(7, 0, 2, 1, 2), part_share(7, 1, 2, 1, 2)
    ((0, 2), (2, 4), (6, 7))
    """
    lo, hi = row_share(width, rank, world_size)
    first, last = row_share(hi - lo, part, parts)
    return lo + first, lo + last


def row_share(width: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, stop)`` of *rank*'s contiguous, balanced share of *width* rows.

    Shares differ by at most one row; the first ``width % world_size`` ranks take
    one more, so a batch narrower than the world leaves some ranks empty.

    >>> [row_share(5, r, 3) for r in range(3)], row_share(1, 2, 3)
    ([(0, 2), (2, 4), (4, 5)], (1, 1))
    """
    base, extra = divmod(width, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)
