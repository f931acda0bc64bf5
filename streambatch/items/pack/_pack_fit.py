"""Best-fit decreasing over integer sizes: the C kernel ``streambatch._best_fit`` or its Python fallback.

Both give identical bins (``tests/items/test_pack.py`` checks them against each other
and against the rule read literally).
"""

from __future__ import annotations

import bisect
import heapq
from typing import Literal

import numpy as np
import numpy.typing as npt

from ..._checks import check_positive
from ..._kernels import backend as kernel_backend
from ..._kernels import built, legacy_switch
from ...errors import ConfigError

IntArray = npt.NDArray[np.int64]
Backend = Literal["c", "python"]

legacy_switch(__name__, "BACKEND", "best_fit", "python")  # the old switch ("c" or "python"), for one release

_U32 = 1 << 32


def best_fit_decreasing(
    sizes: npt.ArrayLike, capacity: int, *, backend: Backend | None = None
) -> tuple[IntArray, npt.NDArray[np.uint32]]:
    """Pack the non-zero *sizes* into bins of *capacity* by best-fit decreasing.

    Items are taken largest first (ties by index); each goes into the open bin
    with the least room that still holds it (ties to the lowest bin number),
    else into a new bin.  Returns ``(offsets, items)``: bin ``b`` holds the item
    indices ``items[offsets[b]:offsets[b + 1]]`` in placement order.  Items of
    size 0 are left out.

    >>> offsets, items = best_fit_decreasing([3, 5, 2, 4, 0, 1], capacity=6)
    >>> [items[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    [[1, 5], [3, 2], [0]]
    """
    cap = check_positive(capacity, "capacity", "the positions of one bin (T)")
    values = np.asarray(sizes)
    if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
        raise ConfigError(f"sizes has shape {values.shape} and dtype {values.dtype}; pass a 1-D array of integers")
    if values.size and (int(values.min()) < 0 or int(values.max()) > cap):
        raise ConfigError(f"sizes must lie in [0, capacity={cap}]; got [{int(values.min())}, {int(values.max())}]")
    if values.size >= _U32 or cap >= _U32:
        raise ConfigError(f"best_fit_decreasing packs fewer than 2**32 sizes of capacity below 2**32; got {values.size}, {cap}")
    chosen = kernel_backend("best_fit") if backend is None else backend
    if chosen == "c":
        kernel = built("best_fit")
        if kernel is None:
            raise ConfigError("backend='c' needs the compiled extension streambatch._best_fit; build it or pass backend='python'")
        offset_bytes, item_bytes = kernel.best_fit_decreasing(np.ascontiguousarray(values, dtype=np.uint32), cap)
        return np.frombuffer(offset_bytes, dtype=np.int64), np.frombuffer(item_bytes, dtype=np.uint32)
    if chosen != "python":
        raise ConfigError(f"backend={backend!r} is not 'c' or 'python'")
    return _best_fit_python(values.astype(np.int64), cap)


def _best_fit_python(sizes: IntArray, capacity: int) -> tuple[IntArray, npt.NDArray[np.uint32]]:
    """The same rule as the C kernel, one Python step per item: a heap of bin numbers per free room."""
    order = np.argsort(-sizes, kind="stable")
    order = order[sizes[order] > 0]
    heaps: dict[int, list[int]] = {}
    rooms: list[int] = []  # free rooms that have an open bin, increasing
    bin_of = np.empty(order.size, dtype=np.int64)
    bins = 0
    for step, size in enumerate(sizes[order].tolist()):
        at = bisect.bisect_left(rooms, size)
        if at == len(rooms):
            chosen, left = bins, capacity - size
            bins += 1
        else:
            room = rooms[at]
            chosen, left = heapq.heappop(heaps[room]), room - size
            if not heaps[room]:
                del heaps[room], rooms[at]
        bin_of[step] = chosen
        if left:
            if left in heaps:
                heapq.heappush(heaps[left], chosen)
            else:
                heaps[left] = [chosen]
                bisect.insort(rooms, left)
    offsets = np.zeros(bins + 1, dtype=np.int64)
    np.cumsum(np.bincount(bin_of, minlength=bins), out=offsets[1:])
    return offsets, order[np.argsort(bin_of, kind="stable")].astype(np.uint32)
