"""Window arithmetic: `WindowConfig`, per-document window counts, and the global `WindowIndex`.

A window of context length ``T`` is ``T + 1`` consecutive tokens of one document
starting at ``0, s, 2s, ...``.  Windows are numbered globally in document order;
`WindowIndex` maps window numbers to (document index, start) and token positions
with one ``searchsorted`` per call, never a Python object per window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._checks import check_positive

IntArray = npt.NDArray[np.int64]
BLOCK = 1 << 20  # windows per block of position arithmetic: bounded temporaries (16 bytes per window of a block)


@dataclass(frozen=True)
class WindowConfig:
    """Context length ``T`` and stride ``s`` of causal windows; both positive ints.

    >>> WindowConfig(2).source_length
    3
    """

    context_length: int
    stride: int = 1

    def __post_init__(self) -> None:
        check_positive(self.context_length, "context_length", "the number of input tokens per window")
        check_positive(self.stride, "stride", "the distance between window starts")
        object.__setattr__(self, "context_length", int(self.context_length))
        object.__setattr__(self, "stride", int(self.stride))

    @property
    def source_length(self) -> int:
        """Tokens one window reads: ``T + 1`` (inputs are the first T, targets the last T)."""
        return self.context_length + 1


def window_counts(lengths: npt.ArrayLike, context_length: int, stride: int = 1) -> IntArray:
    """Count each document's windows in one numpy expression.

    >>> window_counts([5, 4, 2], context_length=2).tolist()
    [3, 2, 0]

    With stride 2 a 7-token document has windows at 0, 2 and 4:

    >>> window_counts([7], context_length=2, stride=2).tolist()
    [3]
    """
    config = WindowConfig(context_length, stride)
    sizes = np.asarray(lengths, dtype=np.int64)
    return np.maximum(0, (sizes - config.source_length) // config.stride + 1)


def window_tails(lengths: npt.ArrayLike, context_length: int, stride: int = 1) -> tuple[IntArray, IntArray]:
    """Return ``(tail_start, tail_length)`` per document: the tokens no window starts on.

    A document shorter than ``T + 1`` is all tail (start 0).  A tail of length 0
    means every token can begin or end a window: nothing is left unused.

    >>> [a.tolist() for a in window_tails([5, 8, 2], context_length=2, stride=2)]
    [[5, 7, 0], [0, 1, 2]]
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    counts = window_counts(sizes, context_length, stride)
    tail_start = np.where(counts > 0, (counts - 1) * stride + context_length + 1, 0)
    tail_start = np.minimum(tail_start, sizes)
    return tail_start, sizes - tail_start


def window_starts(length: int, context_length: int, stride: int = 1) -> IntArray:
    """Starts of one document's windows.

    >>> window_starts(7, context_length=2, stride=2).tolist()
    [0, 2, 4]
    """
    count = int(window_counts([length], context_length, stride)[0])
    return np.arange(count, dtype=np.int64) * stride


def in_blocks(function: Callable[[Any], Any], values: npt.NDArray[Any], outputs: int = 1) -> list[IntArray]:
    """*function* (one int64 array out, or a tuple of *outputs*) over blocks of `BLOCK` *values*, into fresh arrays.

    The temporaries *function* makes are bounded by a block; only the results grow with *values*.

    >>> in_blocks(lambda v: (v * 2, v + 1), np.arange(3), 2)[1].tolist()
    [1, 2, 3]
    """
    results = [np.empty(values.size, dtype=np.int64) for _ in range(outputs)]
    for lo in range(0, values.size, BLOCK):
        got = function(values[lo : lo + BLOCK])
        for result, part in zip(results, got if outputs > 1 else (got,), strict=True):
            result[lo : lo + part.size] = part
    return results


class WindowIndex:
    """Global window numbering over documents, mapped to tokens arithmetically.

    Holds a few int64 numbers per document, nothing per window.  Window ``n`` is
    the ``n``-th (document, start) pair in document order; its *position* is the
    index of its first token in the store's flat token array.

    >>> index = WindowIndex([5, 4], WindowConfig(2))
    >>> index.window_count, [a.tolist() for a in index.locate(np.array([4, 1]))]
    (5, [[1, 0], [1, 1]])
    >>> index.positions(np.array([4, 1])).tolist()
    [6, 1]
    """

    __slots__ = (
        "_doc_base",
        "_doc_ends",
        "_doc_starts",
        "_entry_last",
        "_entry_starts",
        "_window_docs",
        "config",
        "counts",
        "cumulative",
        "starts",
        "window_count",
    )

    def __init__(
        self,
        lengths: npt.ArrayLike,
        config: WindowConfig,
        starts: npt.ArrayLike | None = None,
        include: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        sizes = np.asarray(lengths, dtype=np.int64)
        self.config = config
        self.counts: IntArray = window_counts(sizes, config.context_length, config.stride)
        if include is not None:  # documents outside the partition contribute no windows
            self.counts = np.where(include, self.counts, 0)
        self.cumulative: IntArray = np.cumsum(self.counts)  # inclusive: windows in docs 0..i
        self.window_count = int(self.cumulative[-1]) if self.cumulative.size else 0
        if starts is None:
            self.starts: IntArray = np.zeros(sizes.size, dtype=np.int64)
            np.cumsum(sizes[:-1], out=self.starts[1:])
        else:
            self.starts = np.asarray(starts, dtype=np.int64)
        self._window_docs: IntArray = np.flatnonzero(self.counts)
        self._doc_starts: IntArray = self.starts[self._window_docs]  # increasing: documents never overlap
        self._doc_ends: IntArray = self.cumulative[self._window_docs]  # window numbers below each one's end
        # window n of document d (counted globally) starts at position _doc_base[d] + n * stride
        self._doc_base: IntArray = self._doc_starts - (self._doc_ends - self.counts[self._window_docs]) * config.stride
        # the plan-entry check: slot 0 is "before the first document", slot k + 1 is document _window_docs[k]
        least = np.iinfo(np.int64).min
        self._entry_starts: IntArray = np.r_[least, self._doc_starts]
        last = self._doc_starts + (self.counts[self._window_docs] - 1) * config.stride  # each one's last window start
        self._entry_last: IntArray = np.r_[least, last]

    def locate(self, windows: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """Map global window numbers to ``(document index, start)`` arrays."""
        numbers = np.asarray(windows, dtype=np.int64)
        documents = np.searchsorted(self.cumulative, numbers, side="right")
        first = self.cumulative[documents] - self.counts[documents]
        return documents, (numbers - first) * self.config.stride

    def positions(self, windows: npt.ArrayLike) -> IntArray:
        """Map global window numbers to token positions in the flat array."""
        documents, starts = self.locate(windows)
        return self.starts[documents] + starts

    def locate_positions(self, positions: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """Map token positions of windows back to ``(document index, start)``."""
        where = np.asarray(positions, dtype=np.int64)
        documents = self._window_docs[np.searchsorted(self._doc_starts, where, side="right") - 1]
        return documents, where - self.starts[documents]

    def _bad_entries(self, where: npt.NDArray[Any]) -> tuple[IntArray, npt.NDArray[np.bool_]]:
        """``(slot, bad)`` of positions: one ``searchsorted`` (as `locate_positions`) and a compare or two."""
        slot = np.searchsorted(self._entry_starts, where, side="right") - 1
        bad = where > self._entry_last[slot]
        if self.config.stride > 1:
            bad |= (where - self._entry_starts[slot]) % self.config.stride != 0
        return slot, bad

    def entry_windows(self, entries: npt.NDArray[Any], holds_positions: bool = True) -> IntArray:
        """The window number of each plan entry, -1 where it is no window here: the check of plan entries.

        Positions must be window starts (of a document with windows: the partition's),
        window numbers in ``[0, window_count)``.

        >>> WindowIndex([5, 4], WindowConfig(2)).entry_windows(np.array([0, 6, 3, 7, -1])).tolist()
        [0, 4, -1, -1, -1]
        """
        where = np.asarray(entries).astype(np.int64, copy=False)
        if not holds_positions:
            return np.where((where >= 0) & (where < self.window_count), where, -1)
        if not self._doc_starts.size:
            return np.full(where.size, -1, dtype=np.int64)
        slot, bad = self._bad_entries(where)
        numbers = (where - self._doc_base[slot - 1]) // self.config.stride
        numbers[bad] = -1
        return numbers

    def first_invalid(self, entries: npt.NDArray[Any], holds_positions: bool = True) -> int:
        """Index of the first of *entries* that is no window here (-1 when all are); in bounded blocks.

        What every batch of a plan file runs on its entries: a few numpy calls, whatever the batch size.

        >>> index = WindowIndex([5, 4], WindowConfig(2))
        >>> index.first_invalid(np.array([0, 6])), index.first_invalid(np.array([6, 3])), index.first_invalid(np.array([7]))
        (-1, 1, 0)
        """
        for lo in range(0, len(entries), 1 << 20):  # bounded temporaries, whatever the view's length
            block = entries[lo : lo + (1 << 20)]
            bad = self._bad_entries(block)[1] if holds_positions else (block < 0) | (block >= self.window_count)
            if bad.any():
                return lo + int(np.argmax(bad))
        return -1

    def windows_at(self, positions: npt.ArrayLike) -> IntArray:
        """Map token positions of windows back to global window numbers."""
        documents, starts = self.locate_positions(positions)
        return self.cumulative[documents] - self.counts[documents] + starts // self.config.stride

    def all_positions(
        self, dtype: npt.DTypeLike = np.int64, block: int | None = None, out: npt.NDArray[Any] | None = None
    ) -> npt.NDArray[np.integer]:
        """Token position of every window, in window order, built in bounded blocks (into *out* if given).

        >>> WindowIndex([5, 4], WindowConfig(2)).all_positions().tolist()
        [0, 1, 2, 5, 6]
        """
        return self.range_positions(0, self.window_count, dtype, block=block, out=out)

    def range_positions(
        self,
        lo: int,
        hi: int,
        dtype: npt.DTypeLike = np.int64,
        *,
        block: int | None = None,
        out: npt.NDArray[Any] | None = None,
    ) -> npt.NDArray[Any]:
        """Token positions of windows ``lo .. hi - 1`` (``0 <= lo <= hi <= window_count``), into *out* if given.

        Built in blocks of at most *block* windows (default `BLOCK`), inside a
        document too: the temporaries are 16 bytes per window of one block, never
        per window of the range, so one document of 10**9 windows costs only the output.

        >>> WindowIndex([5, 4], WindowConfig(2)).range_positions(1, 4).tolist()
        [1, 2, 5]
        """
        out = np.empty(hi - lo, dtype=dtype) if out is None else out
        stride, base, ends = self.config.stride, self._doc_base, self._doc_ends
        block = BLOCK if block is None else block
        ramp: IntArray | None = None
        for first in range(lo, hi, block):
            last = min(first + block, hi)
            d0 = int(np.searchsorted(ends, first, side="right"))
            d1 = int(np.searchsorted(ends, last - 1, side="right")) + 1
            if d1 - d0 == 1:  # inside one document: an arithmetic ramp, no per-window index array
                if ramp is None:
                    ramp = np.arange(min(block, hi - lo), dtype=np.int64)
                    ramp *= stride
                np.add(ramp[: last - first], int(base[d0]) + first * stride, out=out[first - lo : last - lo], casting="unsafe")
                continue
            taken = np.minimum(ends[d0:d1], last) - np.maximum(ends[d0:d1] - self.counts[self._window_docs[d0:d1]], first)
            chunk = np.repeat(base[d0:d1], taken)
            chunk += np.arange(first, last, dtype=np.int64) * stride
            out[first - lo : last - lo] = chunk
        return out
