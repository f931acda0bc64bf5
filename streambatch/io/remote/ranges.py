"""Byte and position ranges of a remote token file: whole blocks, GET parts, coalescing, index positions.

Pure numpy helpers of `streambatch.io.remote.tokens` (the file, its holds and GETs) and
`streambatch.io.remote.mapping` (the array over it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .blocks import BLOCK


def whole_blocks(
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    nbytes: int,
    present: npt.NDArray[np.bool_] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Byte ranges widened to whole blocks, sorted, cut where they overlap (each block in exactly one range; the
    caller's split into parallel GETs is kept), and without the blocks *present* says are here already.

    >>> [a.tolist() for a in whole_blocks(np.array([70000, 0]), np.array([140000, 70000]), 1 << 20)]
    [[0, 131072], [131072, 196608]]
    >>> [a.tolist() for a in whole_blocks(np.array([0]), np.array([200000]), 1 << 20, np.array([False, True, False, False]))]
    [[0, 131072], [65536, 262144]]
    """
    keep = ends > starts
    order = np.argsort(starts[keep], kind="stable")
    lo = (starts[keep] // BLOCK * BLOCK)[order]
    hi = np.minimum(-(-ends[keep] // BLOCK) * BLOCK, nbytes)[order]
    if lo.size:
        covered = np.maximum.accumulate(hi)
        lo[1:] = np.maximum(lo[1:], covered[:-1])  # what an earlier range already takes
        hi = np.maximum(hi, lo)
    nonempty = hi > lo
    lo, hi = lo[nonempty], hi[nonempty]
    if present is None or not lo.size or not present.any():
        return lo, hi
    counts = (hi - lo + BLOCK - 1) // BLOCK
    first = np.repeat(lo // BLOCK, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
    cut = np.repeat(np.arange(lo.size), counts)  # which range each block came from: runs never join two ranges
    wanted = ~present[first]
    first, cut = first[wanted], cut[wanted]
    if not first.size:
        return first, first
    breaks = np.flatnonzero((np.diff(first) != 1) | (np.diff(cut) != 0)) + 1
    heads = np.concatenate([[0], breaks])
    tails = np.concatenate([breaks - 1, [first.size - 1]])
    return first[heads] * BLOCK, np.minimum((first[tails] + 1) * BLOCK, nbytes)


def positions_of(key: Any, size: int) -> npt.NDArray[np.int64]:
    """The positions an index array or a mask *key* reads of an array of *size* items (checked: numpy would
    read the ones in range before refusing the others)."""
    found = np.asarray(key)
    if found.dtype == np.bool_:
        if found.shape != (size,):
            raise IndexError(f"boolean index of shape {found.shape} does not match {size} tokens")
        return np.flatnonzero(found).astype(np.int64)
    if found.dtype.kind not in "iu":
        other: npt.NDArray[np.int64] = np.arange(size)[key].astype(np.int64)  # anything else numpy accepts
        return other
    picked = found.astype(np.int64)
    picked = np.where(picked < 0, picked + size, picked)
    if picked.size and (int(picked.min()) < 0 or int(picked.max()) >= size):
        raise IndexError(f"index out of bounds for {size} tokens")
    return picked


def distinct(slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sorted distinct *slots* (np.unique's first call imports numpy.ma: 40 ms in the middle of an epoch)."""
    ordered = np.sort(slots)
    found: npt.NDArray[np.int64] = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered
    return found


def parts(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], size: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Byte ranges ``[starts, ends)`` cut into pieces of at most *size* bytes (in order; empty ranges dropped).

    >>> [a.tolist() for a in parts(np.array([0, 10]), np.array([5, 30]), 8)]
    [[0, 10, 18, 26], [5, 18, 26, 30]]
    """
    counts = np.maximum(-(-(ends - starts) // size), 0)
    total = int(counts.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    lo = np.repeat(starts, counts) + offsets * size
    return lo, np.minimum(lo + size, np.repeat(ends, counts))


def coalesce(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], gap: int, spare: float = 0.04
) -> tuple[list[int], list[int]]:
    """Sorted, merged byte ranges: overlapping ranges become one, and so do ranges at most *gap* bytes apart,
    smallest gaps first, while the gap bytes fetched stay within *spare* of the bytes needed.

    >>> coalesce(np.array([0, 10, 100]), np.array([5, 20, 110]), gap=8, spare=1.0)
    ([0, 100], [20, 110])
    >>> coalesce(np.array([0, 10, 100]), np.array([5, 20, 110]), gap=8, spare=0.0)
    ([0, 10, 100], [5, 20, 110])
    """
    if not starts.size:
        return [], []
    order = np.argsort(starts, kind="stable")
    lo, hi = starts[order], np.maximum.accumulate(ends[order])
    touching = np.flatnonzero(lo[1:] > hi[:-1]) + 1  # breaks between ranges that do not overlap or touch
    firsts = np.concatenate([[0], touching])
    lasts = np.concatenate([touching - 1, [lo.size - 1]])
    lo, hi = lo[firsts], hi[lasts]
    gaps = lo[1:] - hi[:-1]
    budget = spare * float((hi - lo).sum())
    by_size = np.argsort(gaps, kind="stable")
    taken = by_size[(np.cumsum(gaps[by_size]) <= budget) & (gaps[by_size] <= gap)]
    keep = np.ones(gaps.size, dtype=bool)
    keep[taken] = False  # merged: no break there
    breaks = np.flatnonzero(keep) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks - 1, [lo.size - 1]])
    return lo[firsts].tolist(), hi[lasts].tolist()
