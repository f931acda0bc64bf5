"""Stage 5, materialize: gather each chunk's rows straight into its final arrays.

The only place token buffers are created: one vectorized gather per buffer from
a read-only view of the flat tokens as overlapping ``T``-token records, giving
C-contiguous ``inputs[w, T]`` and ``targets[w, T]`` in the store's dtype.  No
per-window staging copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

from ..errors import ConfigError
from ..items.pack.rows import Rows, iter_batches
from ..items.protocol import Items
from ..items.windows.gather import row_gather
from ..items.windows.windows import Windows
from .batch import MiniBatch
from .chunk import Chunks


def materialize_one(windows: Windows | Items, index: int | None = None) -> MiniBatch:
    """Gather one chunk of windows into a `MiniBatch` (*index* defaults to the chunk's batch index).

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
    >>> materialize_one(w[1:3]).inputs.tolist()
    [[10, 11], [11, 12]]
    """
    if not isinstance(windows, Windows):
        view = getattr(windows, "materialize_view", None)
        if view is None:
            raise ConfigError(f"chunk={windows!r} is not a streambatch.Windows; chunk windows with sb.chunk(windows, batch_size)")
        return view((windows.batch_index or 0) if index is None else index)  # type: ignore[no-any-return]
    positions = windows.positions()
    inputs, targets = row_gather(windows.space)(positions)
    number = (windows.batch_index or 0) if index is None else index
    return MiniBatch(number, inputs, targets, positions, windows.space)


class Batches(Sequence[MiniBatch]):
    """A lazy, sized, indexable sequence of batches: ``materialize`` over `Chunks`.

    Nothing is gathered until a batch is asked for; ``batches[i]`` gathers batch
    *i* alone, so DataLoader workers and resumed runs index straight into it.
    """

    __slots__ = ("chunks",)

    def __init__(self, chunks: Chunks[Any]) -> None:
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks)

    @overload
    def __getitem__(self, item: int) -> MiniBatch: ...
    @overload
    def __getitem__(self, item: slice) -> Batches: ...
    def __getitem__(self, item: int | slice) -> MiniBatch | Batches:
        if isinstance(item, slice):
            return Batches(self.chunks[item])
        return materialize_one(self.chunks[item])

    def __iter__(self) -> Iterator[MiniBatch]:
        chunks = self.chunks
        many = getattr(chunks.items, "materialize_chunks", None)  # an Items' own iteration (a mixture's)
        if many is not None:
            return many(chunks)  # type: ignore[no-any-return]
        if chunks.world_size == 1 and isinstance(chunks.items, Rows):
            return iter_batches(chunks.items, chunks.batch_size, chunks.batches)
        if chunks.world_size > 1 or not isinstance(chunks.items, Windows):
            return map(materialize_one, chunks)
        return _iter_blocks(chunks)

    def __repr__(self) -> str:
        return f"Batches({self.chunks!r})"


_BLOCK_WINDOWS = 2048  # consecutive batches whose positions are computed (and cast to intp) at once


def _iter_blocks(chunks: Chunks[Any]) -> Iterator[MiniBatch]:
    """Iterate whole batches with the per-batch work cut to the gather itself.

    Positions of a block of consecutive batches come from one call (one cast to
    intp, one searchsorted in sequential order) and are mapped to the gather's
    rows once (a corpus's shard lookup); a strided share (``step > 1``) takes one
    batch per block so the batches in between are never touched.
    """
    windows, size, batches = chunks.items, chunks.batch_size, chunks.batches
    space, total = windows.space, len(windows)
    gather = row_gather(space)
    take = gather.take
    per = max(1, _BLOCK_WINDOWS // size) if batches.step == 1 else 1
    for head in range(0, len(batches), per):
        group = batches[head : head + per]
        base = group[0] * size
        positions = windows[base : min((group[-1] + 1) * size, total)].positions()
        rows = gather.rows(positions)
        for batch in group:
            lo = (batch - group[0]) * size
            inputs, targets = take(rows[lo : lo + size])
            yield MiniBatch(batch, inputs, targets, positions[lo : lo + size], space)


@overload
def materialize(chunks: Chunks[Any]) -> Batches: ...
@overload
def materialize(chunks: Iterable[Windows]) -> Iterator[MiniBatch]: ...
def materialize(chunks: Iterable[Windows]) -> Batches | Iterator[MiniBatch]:
    """Gather each chunk into a `MiniBatch`, lazily: the only token copy of the pipeline.

    Over `Chunks` the result is a lazy `Batches` sequence (``len``, indexing);
    over any other iterable of `Windows` it is an iterator.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
    >>> [b.shape for b in sb.materialize(sb.chunk(w, 2))]
    [(2, 2), (1, 2)]
    """
    if isinstance(chunks, Chunks):
        return Batches(chunks)
    if not isinstance(chunks, Iterable):
        raise ConfigError(f"chunks={chunks!r} is not an iterable of Windows; pass sb.chunk(windows, batch_size)")
    return map(materialize_one, chunks)
