"""Stage 5, materialize: gather each chunk's rows straight into its final arrays.

The only place token buffers are created: one vectorized gather per buffer from
a read-only view of the flat tokens as overlapping ``T``-token records, giving
C-contiguous ``inputs[w, T]`` and ``targets[w, T]`` in the store's dtype.  No
per-window staging copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from .batch import MiniBatch
from .chunking import Chunks
from .documents import DocumentStore
from .errors import ConfigError
from .windowing import Windows, WindowSpace


class RowGather:
    """Gathers rows of one store for one context length into final ``(w, T)`` arrays.

    Each buffer is one vectorized copy: the flat tokens are viewed (read-only, no
    copy) as overlapping ``T``-token records, one per token position, and the
    rows' positions select whole records, so each row is a single block copy
    straight into the final C-contiguous array.

    >>> store = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5])
    >>> inputs, targets = RowGather(store, context_length=2)(np.array([2, 0]))
    >>> inputs.tolist(), targets.tolist()
    ([[11, 12], [0, 10]], [[12, 1], [10, 11]])
    """

    __slots__ = ("_dtype", "_empty", "_length", "_records", "_shifted")

    def __init__(self, store: DocumentStore, context_length: int) -> None:
        self._length = length = context_length
        tokens = store.tokens
        self._dtype = tokens.dtype
        self._empty = np.zeros((0, length), dtype=tokens.dtype)
        self._records: npt.NDArray[Any] | None = None
        self._shifted: npt.NDArray[Any] | None = None
        if tokens.size >= length + 1:
            itemsize = tokens.dtype.itemsize
            record = np.dtype((np.void, length * itemsize))
            count = tokens.size - length  # records that have a following record (targets)
            self._records = np.ndarray(shape=(count,), dtype=record, buffer=tokens, strides=(itemsize,))
            self._shifted = np.ndarray(shape=(count,), dtype=record, buffer=tokens, offset=itemsize, strides=(itemsize,))

    def __call__(self, positions: npt.NDArray[np.intp]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` for rows starting at *positions* (an intp array)."""
        records, width = self._records, positions.size
        if records is None or self._shifted is None or width == 0:  # a rank's empty share, or no windows
            return self._empty.copy(), self._empty.copy()
        shape, dtype = (width, self._length), self._dtype
        # wrap each gathered record buffer as (width, T) tokens: no copy, cheaper than view + reshape
        return np.ndarray(shape, dtype, records[positions]), np.ndarray(shape, dtype, self._shifted[positions])


def row_gather(space: WindowSpace) -> RowGather:
    """The space's `RowGather`, built once and cached on it."""
    gather: RowGather | None = space.cache.get("gather")
    if gather is None:
        gather = space.cache["gather"] = RowGather(space.store, space.config.context_length)
    return gather


def materialize_one(windows: Windows, index: int | None = None) -> MiniBatch:
    """Gather one chunk of windows into a `MiniBatch` (*index* defaults to the chunk's batch index).

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
    >>> materialize_one(w[1:3]).inputs.tolist()
    [[10, 11], [11, 12]]
    """
    if not isinstance(windows, Windows):
        raise ConfigError(f"chunk={windows!r} is not a streambatch.Windows; chunk windows with sb.chunk(windows, batch_size)")
    positions = windows.positions()
    inputs, targets = row_gather(windows.space)(positions)
    number = (windows.batch if windows.batch is not None else 0) if index is None else index
    return MiniBatch(number, inputs, targets, positions, windows.space)


class Batches(Sequence[MiniBatch]):
    """A lazy, sized, indexable sequence of batches: ``materialize`` over `Chunks`.

    Nothing is gathered until a batch is asked for; ``batches[i]`` gathers batch
    *i* alone, so DataLoader workers and resumed runs index straight into it.
    """

    __slots__ = ("chunks",)

    def __init__(self, chunks: Chunks) -> None:
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
        if self.chunks.world_size > 1:
            return map(materialize_one, self.chunks)
        return _iter_blocks(self.chunks)

    def __repr__(self) -> str:
        return f"Batches({self.chunks!r})"


_BLOCK_WINDOWS = 2048  # consecutive batches whose positions are computed (and cast to intp) at once


def _iter_blocks(chunks: Chunks) -> Iterator[MiniBatch]:
    """Iterate whole batches with the per-batch work cut to the gather itself.

    Positions of a block of consecutive batches come from one call (one cast to
    intp, one searchsorted in sequential order); a strided share (``step > 1``)
    takes one batch per block so the batches in between are never touched.
    """
    windows, size, batches = chunks.windows, chunks.batch_size, chunks.batches
    space, total = windows.space, len(windows)
    gather = row_gather(space)
    per = max(1, _BLOCK_WINDOWS // size) if batches.step == 1 else 1
    for head in range(0, len(batches), per):
        group = batches[head : head + per]
        base = group[0] * size
        positions = windows[base : min((group[-1] + 1) * size, total)].positions()
        for batch in group:
            rows = positions[(batch - group[0]) * size :][:size]
            inputs, targets = gather(rows)
            yield MiniBatch(batch, inputs, targets, rows, space)


@overload
def materialize(chunks: Chunks) -> Batches: ...  # type: ignore[overload-overlap]
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
    return map(materialize_one, chunks)
