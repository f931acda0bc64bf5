"""What every view of one mixture shares (`MixSpace`): the parts, the plan, the seed, the source epochs' orders.

Source epoch ``e`` of source ``s`` is ``shuffle(parts[s], source_epoch_seed(seed, s, e))``
(with a plan folder: that shuffle's plan file); a position's window (a packed
mixture's: row) is found from its index within its source: ``divmod(index, N_s)``
gives the epoch and the place in it.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..._kernels import cache_key
from ...batch.minibatch import SourceArray, present
from ...order.plan import plan_file
from ...order.shuffle import shuffle
from ..pack.rows import Rows, row_targets
from ..windows.windows import Windows, window_targets
from .gather import MixGather
from .packed_gather import PackedMixGather
from .plan import MixPlan, source_epoch_seed

IntArray = npt.NDArray[np.int64]


class MixItem(NamedTuple):
    """One item of a mixture: its source and its window number (a packed mixture's: row number) within that source."""

    source: int
    window: int


class MixSpace:
    """What every view of one mixture shares: the parts, the plan, the seed and the source-epoch orders."""

    __slots__ = ("cache", "names", "parts", "plan", "plan_dir", "plan_path", "seed", "sizes")

    def __init__(
        self,
        parts: tuple[Windows | Rows, ...],
        names: tuple[str, ...],
        plan: MixPlan,
        seed: int,
        plan_dir: str | os.PathLike[str] | None,
        plan_path: str | None = None,
    ) -> None:
        self.parts = parts
        self.names = names
        self.plan = plan
        self.seed = seed
        self.plan_dir = plan_dir
        self.plan_path = plan_path
        self.sizes = np.array([len(p) for p in parts], dtype=np.int64)
        self.cache: dict[Any, Any] = {}

    @property
    def packed(self) -> bool:
        """True when the parts are packed `Rows` (every part is of one kind)."""
        return self.parts[0].packed

    @property
    def spaces(self) -> tuple[Any, ...]:
        """Each source's item space (window spaces, or packings: every part is of one kind)."""
        return tuple(p.space for p in self.parts)

    def __getstate__(self) -> tuple[Any, ...]:
        plan: Any = self.plan if self.plan_path is None else None  # a plan file is mapped again, never copied
        return (self.parts, self.names, plan, self.seed, self.plan_dir, self.plan_path)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        parts, names, plan, seed, plan_dir, plan_path = state
        if plan is None:
            from .plan_file import reopen_mix_plan

            plan = reopen_mix_plan(plan_path)
        self.__init__(parts, names, plan, seed, plan_dir, plan_path)  # type: ignore[misc]

    def reseeded(self, seed: int) -> MixSpace:
        """The same parts and plan (Tijdeman's order does not depend on the seed), source orders of *seed*."""
        return MixSpace(self.parts, self.names, self.plan, seed, self.plan_dir, self.plan_path)

    def order(self, source: int, epoch: int) -> Windows | Rows:
        """Source epoch *epoch* of *source*: ``shuffle(parts[source], source_epoch_seed(seed, source, epoch))``.

        With a plan folder it is that shuffle's plan file.  The last two epochs asked for of each source are kept.
        """
        key = (source, epoch)
        found: Windows | Rows | None = self.cache.get(key)
        if found is None:
            seed = source_epoch_seed(self.seed, source, epoch)
            part = self.parts[source]
            found = shuffle(part, seed) if self.plan_dir is None else plan_file(part, seed, self.plan_dir)
            # list(): one atomic copy of the keys, so RankLoader's gather threads may ask concurrently
            held = [k for k in list(self.cache) if isinstance(k, tuple) and k[0] == source]  # oldest first
            for old in held[:-1]:  # keep this epoch and the one asked for before it
                self.cache.pop(old, None)
            self.cache[key] = found
        return found

    def gather(self) -> MixGather:
        """The row gather over every source's stores (built once)."""
        key = cache_key("gather", "window_gather")
        gather: MixGather | None = self.cache.get(key)
        if gather is None:
            gather = self.cache[key] = MixGather(self.spaces)
        return gather

    def packed_gather(self) -> PackedMixGather:
        """The gather of a mixture of packed rows (built once)."""
        key = cache_key("packed gather", "packed_gather")
        gather: PackedMixGather | None = self.cache.get(key)
        if gather is None:
            gather = self.cache[key] = PackedMixGather(self.spaces, self.names)
        return gather

    def stream(self, source: int, first: int, stop: int) -> npt.NDArray[Any]:
        """First-token positions (packed: row numbers) of indices ``first .. stop - 1`` of *source*'s stream.

        Slices of its epochs' plans.
        """
        size = int(self.sizes[source])
        pieces = []
        for epoch in range(first // size, (stop - 1) // size + 1):
            ordered = self.order(source, epoch)
            values = ordered.view(max(first - epoch * size, 0), min(stop - epoch * size, size)).plan_values()
            pieces.append(ordered.space.plan_positions(values))  # window numbers: their starts
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def window_rows(self, lo: int, hi: int) -> tuple[SourceArray, npt.NDArray[np.intp], tuple[npt.NDArray[np.int64], ...]]:
        """Sources, first-token positions and the gather's checked rows of items ``lo .. hi - 1``.

        The items are contiguous, so each source's are a contiguous run of its stream:
        the counts before *lo*, then one slice of its epoch's plan per source (no search per item).
        """
        sources, before, after = self.plan.span(lo, hi)  # a checkpoint row and a block each
        positions = np.empty(hi - lo, dtype=np.intp)
        gather = self.gather()
        for s, (first, stop) in enumerate(zip(before, after, strict=True)):
            if stop > first:
                values = self.stream(s, first, stop)
                gather.check_bound(s, values)
                positions[sources == s] = values
        return sources, positions, gather.where(sources, positions)

    def numbers(self, lo: int, hi: int) -> tuple[SourceArray, IntArray]:
        """Sources and row numbers (each within its source's packing) of items ``lo .. hi - 1`` of a packed mixture."""
        sources, before, after = self.plan.span(lo, hi)
        numbers = np.empty(hi - lo, dtype=np.int64)
        for s, (first, stop) in enumerate(zip(before, after, strict=True)):
            if stop > first:
                numbers[sources == s] = self.stream(s, first, stop)
        return sources, numbers

    def windows(self, sources: SourceArray, indices: IntArray) -> IntArray:
        """Window number (in its source) of index *indices* of each row's source."""
        out = np.empty(indices.size, dtype=np.int64)
        for s in present(sources):
            rows = np.flatnonzero(sources == s)
            epochs, at = np.divmod(indices[rows], self.sizes[s])
            for e in present(epochs):
                chosen = epochs == e
                out[rows[chosen]] = self.order(s, e)[:].numbers()[at[chosen]]
        return out


def counted_targets(view: Any) -> int:
    """The counted targets of a view of a mixture: each source's items counted by that source's own rule.

    >>> import streambatch as sb
    >>> from streambatch.items.mix.mixture import mix
    >>> web = sb.windows([sb.Document("w", "train", range(12))], context_length=2)
    >>> code = sb.windows([sb.Document("c", "train", range(100, 105))], context_length=2)
    >>> counted_targets(mix([web, code], [0.75, 0.25], seed=7)[:5])
    10
    """
    return sum(source_targets(view))


def source_targets(view: Any) -> list[int]:
    """Each source's counted targets in a view of a mixture (`counted_targets` per source; no token is read).

    >>> import streambatch as sb
    >>> from streambatch.items.mix.mixture import mix
    >>> web = sb.windows([sb.Document("w", "train", range(12))], context_length=2)
    >>> code = sb.windows([sb.Document("c", "train", range(100, 105))], context_length=2)
    >>> source_targets(mix([web, code], [0.75, 0.25], seed=7)[:5])
    [8, 2]
    """
    space = view.space
    found = [0] * len(space.parts)
    if space.packed:
        sources, numbers = space.numbers(*view.bounds)
        for s in present(sources):
            found[s] = row_targets(space.spaces[s], numbers[sources == s])
        return found
    spaces = space.spaces
    if any(w.store.has_loss_mask for w in spaces):  # the mask bits at each window's targets
        sources, positions, _ = space.window_rows(*view.bounds)
        for s, n in _counts(sources):
            found[s] = window_targets(spaces[s], int(n), positions[sources == s]) if n else 0
        return found
    for s, n in _counts(view.sources()):
        found[s] = window_targets(spaces[s], n) if n else 0
    return found


def _counts(sources: SourceArray) -> list[tuple[int, int]]:
    return list(enumerate(np.bincount(sources).tolist()))
