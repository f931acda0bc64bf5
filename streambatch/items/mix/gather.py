"""A mixture's batches: rows of several sources gathered in one pass, each row tagged with its source.

`MixGather` copies the rows of a batch whose rows come from several stores (or
corpora) straight into the final ``(w, T)`` arrays.  When every store's tokens
share one dtype, one read-only record view spans them all (as
`streambatch.items.windows.gather.ShardedGather` does for one corpus) and a batch
is one gather per buffer, whatever the mix; otherwise each store's rows are
copied into their rows of the final arrays, widened to the common dtype.

A mixture's batch is a `streambatch.MiniBatch` whose rows carry ``sources`` (one
source id per row); its provenance is resolved per source.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.minibatch import MiniBatch, SourceArray, present
from ...batch.reduce import TokenSums
from ...errors import AccumulationError, DataError
from ...model.flat import Flat
from ..windows.gather import RowMasks, StoreGather, mask_counter, spanning_records
from ..windows.windows import WindowSpace


class MixGather:
    """Gathers rows ``(source, position)`` of several sources into one ``(w, T)`` pair of arrays.

    Every store of every source is a *shard*; a row's global position is its
    position plus its source's offset, and its shard comes from one
    ``searchsorted``.  A row outside its shard (a damaged plan file) is a `DataError`.
    """

    __slots__ = ("_bases", "_direct", "_dtype", "_ends", "_gathers", "_last", "_length", "_limit", "_offsets", "_span", "_tokens")

    def __init__(self, spaces: Sequence[WindowSpace]) -> None:
        length = spaces[0].config.context_length
        self._length = length
        flats: list[Flat] = [space.store.flat() for space in spaces]
        shards: list[npt.NDArray[Any]] = []  # every shard's tokens, source after source
        bases: list[int] = []
        offsets: list[int] = []
        total = 0
        for flat in flats:
            offsets.append(total)
            shards.extend(flat.tokens)
            bases.extend(total + int(start) for start in flat.bases[:-1].tolist())
            total += flat.size
        sizes = np.array([tokens.size for tokens in shards], dtype=np.int64)
        self._offsets = np.array(offsets, dtype=np.int64)
        self._bases = np.array(bases, dtype=np.int64)
        self._ends = self._bases[1:]  # shard k holds global positions in [bases[k], bases[k + 1])
        self._last = self._bases + sizes - (length + 1)  # the last start where T + 1 tokens fit
        self._dtype = np.result_type(*(tokens.dtype for tokens in shards))
        self._tokens = tuple(shards)  # kept alive with the views below
        self._gathers = [StoreGather(tokens, length) for tokens in shards]
        self._span = spanning_records(self._tokens, self._bases, length)
        self._limit = [flat.size - (length + 1) for flat in flats]  # the last start in each source
        single = all(flat.single for flat in flats)  # one shard per source
        self._direct = None if self._span is None or not single else self._span[2] + self._offsets  # shard s is source s

    def check_bound(self, source: int, positions: npt.NDArray[Any]) -> None:
        """Refuse (`DataError`) first-token *positions* of *source* beyond its last window start (a damaged plan)."""
        if positions.size and int(positions.max()) > self._limit[source]:
            raise DataError(
                f"position {int(positions.max())} of source {source} is not a window start of that source; "
                "the plan does not belong to it (remove the plan files and plan again)"
            )

    def __call__(self, sources: SourceArray, positions: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` of rows starting at *positions* of *sources* (one source id per row)."""
        return self.take(self.where(sources, positions))

    def where(self, sources: SourceArray, positions: npt.NDArray[Any]) -> tuple[npt.NDArray[np.int64], ...]:
        """Where the rows are read, checked once (for many batches at a time): give slices of it to `take`.

        Sources of one store each, whose positions `check_bound` passed: one add per row.
        """
        if self._direct is not None:
            return (positions + self._direct[sources],)
        where = positions.astype(np.int64) + self._offsets[sources]
        shards = np.searchsorted(self._ends, where, side="right")
        outside = (where < self._bases[shards]) | (where > self._last[shards])
        if outside.any():
            row = int(np.argmax(outside))
            raise DataError(
                f"row {row}: position {int(positions[row])} of source {int(sources[row])} is not a window start of that "
                "source; the plan does not belong to it (remove the plan files and plan again)"
            )
        if self._span is not None:  # the span's record numbers
            return (where + self._span[2][shards],)
        return shards, where - self._bases[shards]

    def take(self, rows: tuple[npt.NDArray[np.int64], ...]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` of rows found by `rows` (or a slice of each of its arrays)."""
        width = rows[0].size
        shape, dtype = (width, self._length), self._dtype
        if width == 0:
            return np.zeros(shape, dtype), np.zeros(shape, dtype)
        if self._span is not None:  # one gather per buffer
            records, shifted, _ = self._span
            return np.ndarray(shape, dtype, records[rows[0]]), np.ndarray(shape, dtype, shifted[rows[0]])
        shards, local = rows
        inputs, targets = np.empty(shape, dtype), np.empty(shape, dtype)
        for shard in present(shards):
            picked = np.flatnonzero(shards == shard)
            inputs[picked], targets[picked] = self._gathers[shard](local[picked].astype(np.intp))
        return inputs, targets


def mixture_mask(
    spaces: Sequence[WindowSpace], sources: SourceArray, positions: npt.NDArray[Any], length: int
) -> npt.NDArray[np.bool_] | None:
    """The ``(w, T)`` loss mask of a mixture's window rows, each read from its own source; None when no source has one."""
    flats = [s.store.flat() for s in spaces]
    if not any(flat.has_loss_mask for flat in flats):
        return None
    out = np.ones((sources.size, length), dtype=np.bool_)
    for s in present(sources):
        rows = sources == s
        found = flats[s].target_mask(positions[rows], length)
        if found is not None:
            out[rows] = found
    return out


def mixture_counter(spaces: Sequence[WindowSpace]) -> Any:
    """What counts the trained targets of a mixture's window rows ``(sources, positions) -> int`` in the bits, each
    row by its own source (`streambatch.items.windows.gather.mask_counter`; a source without a mask counts ``T``
    a row), or None when no source has a mask or one's mask is made with the batch (a corpus, no C kernel)."""
    masked = [s.store.has_loss_mask for s in spaces]
    if not any(masked):
        return None
    counters: list[Any] = [mask_counter(s) if m else False for s, m in zip(spaces, masked, strict=True)]
    if any(c is None for c in counters):
        return None
    length = spaces[0].config.context_length

    def count(sources: SourceArray, positions: npt.NDArray[Any]) -> int:
        total = 0
        for s in present(sources):
            rows = positions[sources == s]
            counter = counters[s]
            total += counter(np.ascontiguousarray(rows, dtype=np.int64)) if counter else rows.size * length
        return total

    return count


def mixture_columns(batch: MiniBatch) -> dict[str, Any]:
    """A masked mixture window batch's ``loss_mask``, made on its first use (`mixture_mask`)."""
    assert batch.sources is not None
    return {"loss_mask": mixture_mask(batch.spaces, batch.sources, batch.positions, batch.context_length)}


def mixture_masks(spaces: Sequence[WindowSpace]) -> RowMasks | None:
    """The mixture's `RowMasks`: each row's mask read from its own source (`mixture_mask`), counted in the bits
    where every masked source can (`mixture_counter`); None when no source has a mask."""
    if not any(s.store.has_loss_mask for s in spaces):
        return None
    length = spaces[0].config.context_length
    return RowMasks(
        lambda sources, positions: mixture_mask(spaces, sources, positions, length), mixture_counter(spaces), mixture_columns
    )


def source_sums(batch: MiniBatch, row_loss_sums: npt.ArrayLike, gradient_sum: Any = None) -> TokenSums:
    """A batch's raw `TokenSums` with per-source sums: *row_loss_sums* holds each row's summed token loss.

    *gradient_sum* (default: one zero) is the batch's gradient sums; per-source sums carry losses and counts only.

    Every row of windows holds ``T`` target tokens; a packed row (a mixture of packed
    rows) holds its real targets
    only (``loss_mask``: padding never counts, and its row loss sum must leave the
    padding out).  Rows of one source add (``math.fsum``, exact up to one rounding)
    into that source's `TokenSums`.  A batch without ``sources`` (one store) gives
    sums without ``sources``.  `streambatch.token_mean` adds these
    per source across micro-batches, workers and ranks, and reports each source's mean.

    >>> import streambatch as sb
    >>> from streambatch.items.mix.mixture import mix
    >>> a = sb.windows([sb.Document("a", "train", range(6))], context_length=2)
    >>> b = sb.windows([sb.Document("b", "train", range(6))], context_length=2)
    >>> batch = sb.materialize(sb.chunk(mix([a, b], [1, 1], seed=3), 4))[0]
    >>> mean = sb.token_mean([source_sums(batch, [1.0, 2.0, 3.0, 4.0])])
    >>> batch.sources.tolist(), mean.mean_loss, {s: m.mean_loss for s, m in mean.sources.items()}
    ([0, 1, 0, 1], 1.25, {0: 1.0, 1: 1.5})
    """
    losses = np.asarray(row_loss_sums, dtype=np.float64).reshape(-1)
    if losses.size != batch.width:
        raise AccumulationError(f"row_loss_sums has {losses.size} values for a batch of {batch.width} rows; pass one per row")
    T = batch.context_length
    zero = np.zeros(1)
    total = TokenSums(math.fsum(losses.tolist()), batch.token_count, zero if gradient_sum is None else gradient_sum)
    sources = batch.sources  # a mixture's batch, of windows or packed rows
    if sources is None:
        return total
    mask = batch.loss_mask  # packed rows: real targets only
    targets = np.full(sources.size, T, dtype=np.int64) if mask is None else np.count_nonzero(mask, axis=1)
    per = {
        s: TokenSums(math.fsum(losses[sources == s].tolist()), int(targets[sources == s].sum()), zero) for s in present(sources)
    }
    return replace(total, sources=per)
