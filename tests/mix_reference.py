"""Reference code for tests/items/test_mix.py: a mixture's items computed the slow, obvious way (not used by the package).

`plan_items` maps plan positions to ``(source, item)`` through each source's epoch orders
(`seeded_orders`), as `streambatch.items.mix.space.MixSpace` does with plan files and blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from streambatch._checks import check_non_negative, check_positive, check_seed, is_integer, short_repr
from streambatch.errors import ConfigError
from streambatch.items.mix.plan import MixPlan, source_order
from streambatch.order.shuffle import IndexArray

__all__ = ["EpochOrder", "plan_items", "seeded_orders", "source_items", "source_position"]

IntArray = npt.NDArray[np.int64]
EpochOrder = Callable[[int], Any]
"""A source's order of one source epoch: ``order(epoch)[i]`` is the item at position ``i`` of that epoch."""


def seeded_orders(sizes: Sequence[int], seed: int, cache: int = 2) -> list[EpochOrder]:
    """One `EpochOrder` per source: `source_order` at *seed*, the last *cache* epochs of each kept.

    >>> orders = seeded_orders([5], seed=7)
    >>> orders[0](1).tolist() == source_order(5, 7, 0, 1).tolist()
    True
    """
    seed = check_seed(seed)

    def make(size: int, source: int) -> EpochOrder:
        @lru_cache(maxsize=cache)
        def order(epoch: int) -> IndexArray:
            return source_order(size, seed, source, epoch)

        return order

    return [make(check_positive(size, f"sizes[{s}]", "the number of items of that source"), s) for s, size in enumerate(sizes)]


@overload
def source_position(index: int, size: int) -> tuple[int, int]: ...
@overload
def source_position(index: npt.ArrayLike, size: int) -> tuple[IntArray, IntArray]: ...
def source_position(index: Any, size: int) -> Any:
    """``(source epoch, position within that epoch's order)`` of index *index* of a source of *size* items.

    >>> source_position(7, 3), source_position(np.array([0, 2, 3]), 3)
    ((2, 1), (array([0, 0, 1]), array([0, 2, 0])))
    """
    size = check_positive(size, "size", "the number of items of the source")
    if is_integer(index):
        epoch, position = divmod(check_non_negative(index, "index", "an index within the source"), size)
        return epoch, position
    indices = np.asarray(index, dtype=np.int64)
    if indices.size and int(indices.min()) < 0:
        raise ConfigError(f"index={short_repr(index)} must be non-negative; pass indices within the source")
    epochs, positions = np.divmod(indices, size)
    return epochs, positions


def source_items(indices: npt.ArrayLike, size: int, order: EpochOrder) -> IntArray:
    """Item numbers of a source at *indices* within its stream: ``order(epoch)[position]``.

    *order* maps a source epoch to anything indexable by position (a numpy array
    is indexed with one gather; any other sequence item by item), e.g. one of
    `seeded_orders`.  Each epoch's order is fetched once per call.

    >>> source_items([0, 1, 2, 3, 4], 2, lambda epoch: [1, 0] if epoch % 2 else [0, 1]).tolist()
    [0, 1, 1, 0, 0]
    """
    epochs, positions = source_position(np.asarray(indices, dtype=np.int64), size)
    items = np.empty(positions.shape, dtype=np.int64)
    for epoch in np.unique(epochs).tolist():
        chosen = epochs == epoch
        epoch_order = order(int(epoch))
        if isinstance(epoch_order, np.ndarray):
            items[chosen] = epoch_order[positions[chosen]]
        else:
            items[chosen] = [int(epoch_order[int(p)]) for p in positions[chosen].tolist()]
    return items


def plan_items(
    plan: MixPlan, positions: npt.ArrayLike, sizes: Sequence[int], orders: Sequence[EpochOrder]
) -> tuple[Any, IntArray]:
    """``(source, item number within its source)`` of each position; ``orders[s]`` as for `source_items`.

    >>> from streambatch.items.mix.plan import plan_mix
    >>> plan = plan_mix([1, 1], length=6)
    >>> sources, items = plan_items(plan, np.arange(6), [2, 3], seeded_orders([2, 3], seed=7))
    >>> sources.tolist(), items.tolist()
    ([0, 1, 0, 1, 0, 1], [0, 1, 1, 2, 0, 0])
    """
    sources, indices = plan.locate(np.asarray(positions))
    items = np.empty(indices.shape, dtype=np.int64)
    for s in np.unique(sources).tolist():
        chosen = sources == s
        items[chosen] = source_items(indices[chosen], sizes[s], orders[s])
    return sources, items
