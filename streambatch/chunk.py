"""Stage 4, chunk: split an epoch's order into batches of *batch_size*; the last is smaller.

The final batch is never padded and never dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from ._checks import check_non_negative, check_positive
from .errors import OutOfRangeError


def batch_count(window_count: int, batch_size: int) -> int:
    """Number of batches: ``ceil(window_count / batch_size)``; 0 for an empty epoch.

    >>> batch_count(5, 3), batch_count(0, 3)
    (2, 0)
    """
    check_non_negative(window_count, "window_count", "the number of windows in the epoch")
    check_positive(batch_size, "batch_size", "the number of windows per batch")
    return -(-window_count // batch_size)


def batch_widths(window_count: int, batch_size: int) -> list[int]:
    """Widths ``[B] * k + [r]``: full batches, then the smaller final one (if any).

    >>> batch_widths(5, 1), batch_widths(5, 3), batch_widths(5, 5), batch_widths(0, 3)
    ([1, 1, 1, 1, 1], [3, 2], [5], [])
    """
    full, rest = divmod(window_count, batch_size) if batch_count(window_count, batch_size) else (0, 0)
    return [batch_size] * full + ([rest] if rest else [])


def batch_bounds(window_count: int, batch_size: int, index: int) -> tuple[int, int]:
    """``(start, stop)`` of batch *index* within the epoch's order.

    >>> batch_bounds(5, 3, 1)
    (3, 5)
    """
    count = batch_count(window_count, batch_size)
    if not 0 <= index < count:
        raise OutOfRangeError(f"batch index={index} is out of range for {count} batches; use 0 <= index < batch_count")
    start = index * batch_size
    return start, min(start + batch_size, window_count)


def chunked(order: npt.NDArray[np.integer], batch_size: int) -> Iterator[npt.NDArray[np.integer]]:
    """Yield *batch_size* window numbers at a time; the last chunk may be short.

    Chunks are views of *order*: no copy and no object per window.

    >>> [c.tolist() for c in chunked(np.arange(5), batch_size=2)]
    [[0, 1], [2, 3], [4]]
    """
    check_positive(batch_size, "batch_size", "the number of windows per batch")
    return _chunked(order, batch_size)


def _chunked(order: npt.NDArray[np.integer], batch_size: int) -> Iterator[npt.NDArray[np.integer]]:
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]
