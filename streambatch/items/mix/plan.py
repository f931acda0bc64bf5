"""Stage: mix, the order of a blend of several sources, exact and randomly accessible.

A mixture interleaves the items of ``k`` sources at given weights.  Its order is
Tijdeman's chairman assignment (`tijdeman_order`): after every prefix of ``n``
items, source ``s`` holds within ``1 - 1/(2k-2)`` of ``w_s n`` items (``w`` the
normalised weights), computed in exact integer arithmetic.  A `MixPlan` stores
one uint8 source id per item and a checkpoint table of per-source counts every
``block`` items (at most half a byte per item), so `MixPlan.locate` maps any
position to (source, index within that source) without replaying the order.

Within a source the items come epoch after epoch, each source epoch in the
chapter's exact SplitMix64 order with its own seed (`source_epoch_seed`):
index ``j`` of source ``s`` (of ``N_s`` items) is position ``j mod N_s`` of its
source epoch ``j div N_s`` (`source_position`).  A source given more items than
it has repeats whole epochs (every item once before any twice); a smaller share
takes a prefix of its first epoch.

>>> plan = plan_mix([0.5, 0.25, 0.25], sizes=[4, 1, 1])
>>> len(plan), plan.sources.tolist(), plan.counts().tolist()
(8, [0, 1, 2, 0, 0, 1, 2, 0], [4, 2, 2])
>>> plan.locate([5, 6])
(array([1, 2], dtype=uint8), array([1, 1]))
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ..._checks import check_non_negative, check_positive, check_seed, is_integer, short_repr
from ..._kernels import legacy_switch
from ...errors import ConfigError, DataError, OutOfRangeError
from ...io.keyed_file import check_blocks
from ...order.shuffle import IndexArray, shuffled_order
from ...order.splitmix import splitmix64_draws
from .order import (
    KERNEL_LIMIT,
    MAX_SOURCES,
    CountArray,
    SourceArray,
    block_for,
    check_weights,
    integer_weights,
    tijdeman_order,
)

__all__ = [
    "KERNEL_LIMIT",
    "MAX_SOURCES",
    "MixPlan",
    "block_for",
    "check_weights",
    "default_length",
    "integer_weights",
    "normalised_weights",
    "plan_mix",
    "source_epoch_seed",
    "source_order",
    "tijdeman_order",
]

legacy_switch(__name__, "BACKEND", "mix_order", "python")  # the old switch ("c" or "python"), for one release

IntArray = npt.NDArray[np.int64]
_GATHER = 1 << 20  # bytes of block gathered per locate chunk: bounded scratch memory
_EPOCH_STRIDE = 256  # source epoch seeds: draw number 256 * epoch + source + 1


def normalised_weights(weights: Any) -> tuple[Fraction, ...]:
    """The exact normalised weights ``w`` (summing to 1) of *weights*.

    >>> normalised_weights([3, 1])
    (Fraction(3, 4), Fraction(1, 4))
    """
    ints = integer_weights(weights)
    total = sum(ints)
    return tuple(Fraction(value, total) for value in ints)


class MixPlan:
    """Tijdeman's order of a mixture: one uint8 source id per item, per-source counts every `block` items.

    ``checkpoints[r, s]`` counts source ``s`` among the first ``r * block`` items.
    Memory: ``len(plan) * (1 + 8k / block)`` bytes, at most 1.5 bytes per item.

    >>> plan = plan_mix([2, 1], length=6)
    >>> plan.sources.tolist(), plan.counts(4).tolist(), plan.locate(4)
    ([0, 1, 0, 0, 1, 0], [3, 1], (1, 1))
    """

    __slots__ = ("block", "checkpoints", "integer_weights", "origin", "sources")

    def __init__(
        self, sources: SourceArray, checkpoints: CountArray, weights: tuple[int, ...], block: int, origin: str | None = None
    ) -> None:
        self.sources = sources
        self.checkpoints = checkpoints
        self.integer_weights = weights
        self.block = block
        self.origin = origin  # the plan file it is mapped from (named by errors), else None

    @property
    def source_count(self) -> int:
        """``k``, the number of sources."""
        return len(self.integer_weights)

    @property
    def weights(self) -> tuple[Fraction, ...]:
        """The exact normalised weights."""
        total = sum(self.integer_weights)
        return tuple(Fraction(value, total) for value in self.integer_weights)

    @property
    def nbytes(self) -> int:
        """Bytes held: the source ids and the checkpoint table."""
        return int(self.sources.nbytes + self.checkpoints.nbytes)

    def __len__(self) -> int:
        return int(self.sources.size)

    def __repr__(self) -> str:
        return f"MixPlan(length={len(self)}, weights={[str(w) for w in self.weights]!r}, block={self.block})"

    def counts(self, n: int | None = None) -> CountArray:
        """How many of the first *n* items (default: all) each source holds.

        >>> plan_mix([1, 1, 2], length=9).counts(5).tolist()
        [1, 1, 3]
        """
        n = len(self) if n is None else check_non_negative(n, "n", "a prefix length")
        if n > len(self):
            raise OutOfRangeError(f"n={n} is beyond the mixture's {len(self)} items; pass a prefix length up to {len(self)}")
        row = n // self.block
        start = row * self.block
        extra = np.bincount(self.ids(start, n), minlength=self.source_count).astype(np.int64)
        check_blocks(self.checkpoints, row * self.source_count, (row + 1) * self.source_count)  # flat entries of a row
        result: CountArray = self.checkpoints[row] + extra
        return result

    def ids(self, lo: int, hi: int) -> SourceArray:
        """The source ids of items ``lo .. hi - 1`` (a view; from a plan file, its blocks checked on first read)."""
        check_blocks(self.sources, lo, hi)
        return self.sources[lo:hi]

    def span(self, lo: int, hi: int) -> tuple[SourceArray, list[int], list[int]]:
        """``(ids, counts before lo, counts before hi)`` of items ``lo .. hi - 1``, checked against each other.

        The ids' counts must be the difference of the two checkpoint counts: a plan file whose
        digests were forged over edited ids or counts is a `DataError` naming it, never a numpy error.

        >>> ids, before, after = plan_mix([2, 1], length=6).span(2, 5)
        >>> ids.tolist(), before, after
        ([0, 0, 1], [1, 1], [3, 2])
        """
        ids = self.ids(lo, hi)
        before, after = self.counts(lo), self.counts(hi)
        if not np.array_equal(np.bincount(ids, minlength=self.source_count), after - before):
            fix = "remove it and plan again" if self.origin else "build the mixture again"
            raise DataError(
                f"{self.origin or 'the mixture plan (in memory)'}: the source ids of items {lo}..{hi - 1} do not agree "
                f"with its checkpoint counts; the plan is damaged: {fix}"
            )
        return ids, before.tolist(), after.tolist()

    def truncated(self, length: int) -> MixPlan:
        """The first *length* items (a view): Tijdeman's order does not depend on the total length."""
        length = check_non_negative(length, "length", "the number of items to keep")
        if length > len(self):
            raise OutOfRangeError(f"length={length} is beyond the mixture's {len(self)} items")
        rows = self.checkpoints[: length // self.block + 1]
        return MixPlan(self.sources[:length], rows, self.integer_weights, self.block, self.origin)

    @overload
    def locate(self, positions: int) -> tuple[int, int]: ...
    @overload
    def locate(self, positions: npt.ArrayLike) -> tuple[SourceArray, IntArray]: ...
    def locate(self, positions: Any) -> Any:
        """``(source, index within that source)`` of each position, without replaying the order.

        The index is the checkpoint count of the position's block plus the count of
        its source in the block before it: at most `block` bytes read per position,
        vectorized over a batch.  An int gives a pair of ints.

        >>> plan = plan_mix([0.6, 0.3, 0.1], length=20)
        >>> plan.locate(19), plan.locate(np.array([0, 6, 16]))
        ((0, 11), (array([0, 2, 2], dtype=uint8), array([0, 0, 1])))
        """
        scalar = is_integer(positions)
        where = self._check_positions(positions)
        rows = where // self.block
        for row in np.unique(rows).tolist():  # a plan file's blocks behind each position: checked on first read
            self.ids(row * self.block, min((row + 1) * self.block, len(self)))
            check_blocks(self.checkpoints, row * self.source_count, (row + 1) * self.source_count)
        sources = self.sources[where]
        indices = self.checkpoints[rows, sources]
        full = len(self) // self.block
        blocks = self.sources[: full * self.block].reshape(full, self.block)
        tail = np.full(self.block, MAX_SOURCES, dtype=np.uint8)  # the short last block, padded with no source
        tail[: len(self) - full * self.block] = self.sources[full * self.block :]
        step = max(1, _GATHER // self.block)
        columns = np.arange(self.block, dtype=np.int64)
        for lo in range(0, where.size, step):
            hi = min(lo + step, where.size)
            row = rows[lo:hi]
            gathered = blocks[np.minimum(row, max(full - 1, 0))] if full else np.empty((hi - lo, self.block), np.uint8)
            gathered[row == full] = tail
            before = columns < (where[lo:hi] - row * self.block)[:, None]
            indices[lo:hi] += np.count_nonzero((gathered == sources[lo:hi, None]) & before, axis=1)
        if scalar:
            return int(sources[0]), int(indices[0])
        return sources.reshape(np.shape(positions)), indices.reshape(np.shape(positions))

    def _check_positions(self, positions: Any) -> IntArray:
        if is_integer(positions):
            where = np.array([int(positions)], dtype=np.int64)
        else:
            array = np.asarray(positions)
            if array.size and array.dtype.kind not in "iu":
                raise ConfigError(f"positions={short_repr(positions)} must be integers; pass item positions of the mixture")
            where = array.astype(np.int64).reshape(-1)
        if where.size and (int(where.min()) < 0 or int(where.max()) >= len(self)):
            bad = int(where[(where < 0) | (where >= len(self))][0])
            raise OutOfRangeError(f"position {bad} is out of range for a mixture of {len(self)} items; pass 0 to {len(self) - 1}")
        return where


def plan_mix(weights: Any, length: int | None = None, *, sizes: Sequence[int] | None = None, block: int | None = None) -> MixPlan:
    """Plan a mixture of *length* items at *weights*; with ``length=None``, the `default_length` for *sizes*.

    >>> plan_mix([0.6, 0.3, 0.1], length=10).sources.tolist()
    [0, 1, 0, 0, 1, 0, 2, 0, 1, 0]
    """
    ints = integer_weights(weights)
    if length is None:
        if sizes is None:
            raise ConfigError("length=None needs sizes=[items of each source] to pass the largest source once; pass either")
        return _plan_one_pass(ints, _check_sizes(sizes, len(ints)), block)
    length = check_non_negative(length, "length", "the number of items of the mixture")
    if sizes is not None:
        _check_sizes(sizes, len(ints))
    sources, checkpoints = tijdeman_order(ints, length, block)
    return MixPlan(sources, checkpoints, ints, block_for(len(ints)) if block is None else int(block))


def default_length(sizes: Sequence[int], weights: Any) -> int:
    """The length that passes the largest source exactly once at its weight.

    The largest source ``b`` (most items; among equals the smallest weight, then
    the lowest index) holds ``N_b`` items.  The default length is the smallest
    ``L`` whose prefix gives ``b`` exactly ``N_b`` items: the mixture ends on the
    last item of ``b``'s first epoch.  By Tijdeman's bound ``L`` lies within
    ``(1 - mu) / w_b`` of ``N_b / w_b``.  It is found by planning the order.

    >>> default_length([4, 1, 1], [0.5, 0.25, 0.25]), default_length([10, 3], [1, 1])
    (8, 19)
    """
    return len(plan_mix(weights, sizes=sizes))


def _check_sizes(sizes: Sequence[int], count: int) -> list[int]:
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence | np.ndarray) or len(sizes) != count:
        raise ConfigError(f"sizes={short_repr(sizes)} must hold one item count per source ({count}); pass len(part) of each")
    return [
        check_positive(size, f"sizes[{s}]", "the number of items of that source (a source needs one)")
        for s, size in enumerate(sizes)
    ]


def _plan_one_pass(ints: tuple[int, ...], sizes: list[int], block: int | None) -> MixPlan:
    """The plan of `default_length`: order up to a proven upper bound, then cut after the largest source's last item."""
    k = len(ints)
    big = min(range(k), key=lambda s: (-sizes[s], Fraction(ints[s]), s))
    items = sizes[big]
    if k == 1:
        bound = items
    else:  # c_b(L) >= w_b L - (1 - mu) >= N_b once L = floor((N_b + 1 - mu) / w_b)
        m, total = 2 * k - 2, sum(ints)
        bound = total * (m * (items + 1) - 1) // (m * ints[big])
    bound = check_non_negative(bound, "length", "a mixture length below 2**48 (the largest source has too small a weight)")
    sources, checkpoints = tijdeman_order(ints, bound, block)
    plan = MixPlan(sources, checkpoints, ints, block_for(k) if block is None else int(block))
    row = int(np.searchsorted(checkpoints[:, big], items, side="left")) - 1  # the block holding the N_b-th item
    start = row * plan.block
    found = np.flatnonzero(sources[start : start + plan.block] == big)
    return plan.truncated(start + int(found[items - int(checkpoints[row, big]) - 1]) + 1)


def source_epoch_seed(seed: int, source: int, epoch: int) -> int:
    """The shuffle seed of source epoch *epoch* of source *source* in a mixture seeded with *seed*.

    It is SplitMix64 draw number ``256 * epoch + source + 1`` from *seed* (that is,
    ``derive_seed(seed, 256 * epoch + source + 1)``).  SplitMix64's draws from one
    seed are pairwise distinct (its output function is a bijection of the state,
    and the state steps by an odd constant), so no two source epochs of one
    mixture share a seed; draw 0 (the plain seed) is never used.

    >>> source_epoch_seed(7, 0, 0) == int(splitmix64_draws(7, 1, 1)[0])
    True
    >>> len({source_epoch_seed(7, s, e) for s in range(3) for e in range(3)})
    9
    """
    seed = check_seed(seed)
    if not is_integer(source) or not 0 <= int(source) < MAX_SOURCES:
        raise ConfigError(f"source={short_repr(source)} must be an int in [0, {MAX_SOURCES}); pass the source's index")
    epoch = check_non_negative(epoch, "epoch", "the source epoch number (0 for the first)")
    return int(splitmix64_draws(seed, _EPOCH_STRIDE * epoch + int(source) + 1, 1)[0])


def source_order(size: int, seed: int, source: int, epoch: int) -> IndexArray:
    """The order of source epoch *epoch* of *source* (of *size* items): the chapter's shuffle at its seed.

    >>> source_order(5, seed=7, source=0, epoch=0).tolist() == shuffled_order(5, source_epoch_seed(7, 0, 0))[0].tolist()
    True
    """
    return shuffled_order(size, source_epoch_seed(seed, source, epoch))[0]
