"""Compose the stages into one epoch: documents -> windows -> order -> chunks -> batches.

`Epoch` validates at the call and adds no stage logic of its own; iteration is
lazy and repeatable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ._checks import check_non_negative, check_positive, check_seed, is_integer
from .chunk import batch_bounds, batch_count, batch_widths
from .documents import DocumentStore, Partition, as_store
from .errors import ConfigError
from .materialize import Materializer, MiniBatch
from .shuffle import shuffled_order, splitmix64_draws
from .windows import WindowConfig, WindowIndex

_U32 = 1 << 32
_CAST_BLOCK = 4096  # windows whose positions are cast to intp at once


def _gather_positions(index: WindowIndex, order: npt.NDArray[Any], block: int = 1 << 22) -> npt.NDArray[np.uint32]:
    """Replace window numbers by their first-token positions, in place when dtypes allow."""
    positions = index.all_positions(np.uint32)
    out = order if order.dtype == np.uint32 else np.empty(order.size, dtype=np.uint32)
    for lo in range(0, order.size, block):
        out[lo : lo + block] = positions[order[lo : lo + block]]
    return out


def _share(first: int, last: int, rank: int, world: int) -> tuple[int, int]:
    """This rank's contiguous, balanced share of slots ``first..last``."""
    base, extra = divmod(last - first, world)
    lo = first + rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def derive_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch *epoch* of a run seeded with *seed*; epoch 0 uses *seed* itself.

    >>> derive_seed(7, 0), derive_seed(7, 1) != derive_seed(7, 2)
    (7, True)
    """
    if epoch == 0:
        return seed
    return int(splitmix64_draws(seed, epoch, 1)[0])


class Epoch:
    """Every window of one partition exactly once, batched; the final batch is smaller.

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]),
    ...         sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> epoch = sb.Epoch(docs, context_length=2, batch_size=3, seed=7)
    >>> epoch.window_count, epoch.batch_count, [b.shape for b in epoch]
    (5, 2, [(3, 2), (2, 2)])
    >>> [str(p) for b in epoch for p in b.provenance]
    ['train-b@1', 'train-a@1', 'train-b@0', 'train-a@0', 'train-a@2']
    """

    def __init__(
        self,
        documents: Any,
        *,
        context_length: int,
        batch_size: int,
        stride: int = 1,
        seed: int | None = None,
        partition: Partition | str = Partition.TRAIN,
    ) -> None:
        self.batch_size = check_positive(batch_size, "batch_size", "the number of windows per batch")
        self.config = WindowConfig(context_length, stride)
        self.seed = None if seed is None else check_seed(seed)
        self.partition = Partition.parse(partition, "epoch")
        self.store: DocumentStore = as_store(documents)
        self.store.check_partition(self.partition)
        self.index = WindowIndex(self.store.lengths, self.config, self.store.starts)
        self._materialize = Materializer(self.store, self.index)
        self._plan: tuple[npt.NDArray[Any] | None, int | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_materialize"]  # views over the tokens: rebuilt, never pickled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._materialize = Materializer(self.store, self.index)

    def reseeded(self, seed: int | None) -> Epoch:
        """The same windows and batching over the same store, in the order of *seed*."""
        return Epoch(
            self.store,
            context_length=self.context_length,
            batch_size=self.batch_size,
            stride=self.stride,
            seed=seed,
            partition=self.partition,
        )

    @property
    def context_length(self) -> int:
        """``T``."""
        return self.config.context_length

    @property
    def stride(self) -> int:
        """Distance between window starts within a document."""
        return self.config.stride

    @property
    def window_count(self) -> int:
        """Complete windows in this epoch."""
        return self.index.window_count

    @property
    def batch_count(self) -> int:
        """Batches in this epoch: ``ceil(window_count / batch_size)``."""
        return batch_count(self.window_count, self.batch_size)

    @property
    def batch_widths(self) -> list[int]:
        """``[B, ..., B, r]``: the width of every batch."""
        return batch_widths(self.window_count, self.batch_size)

    def __len__(self) -> int:
        return self.batch_count

    def _order(self) -> tuple[npt.NDArray[Any] | None, int | None]:
        """``(plan, state_after)``: the plan holds each slot's first-token position.

        Computed on first use, then reused by every pass.  Positions take 4 bytes
        per window while the store has fewer than 2**32 tokens; beyond that the plan
        keeps window numbers (4 bytes while they fit) and maps them per batch.
        """
        if self._plan is None:
            if self.seed is None:
                self._plan = (None, None)
            else:
                order, state = shuffled_order(self.window_count, self.seed)
                if self._plan_holds_positions:
                    order = _gather_positions(self.index, order)
                self._plan = (order, state)
        return self._plan

    @property
    def _plan_holds_positions(self) -> bool:
        return self.store.tokens.size < _U32

    @property
    def shuffle_state_after(self) -> int | None:
        """SplitMix64 state after the shuffle; ``None`` for sequential order."""
        return self._order()[1]

    @property
    def plan_nbytes(self) -> int:
        """Bytes held per epoch for its order (0 for sequential order)."""
        plan = self._order()[0]
        return 0 if plan is None else int(plan.nbytes)

    def _positions(self, start: int, stop: int) -> npt.NDArray[Any]:
        plan = self._order()[0]
        if plan is None:
            return self.index.positions(np.arange(start, stop, dtype=np.int64))
        if self._plan_holds_positions:
            return plan[start:stop]
        return self.index.positions(plan[start:stop])

    def window_order(self) -> npt.NDArray[np.integer[Any]]:
        """Global window numbers in epoch order (materialized on request only)."""
        plan = self._order()[0]
        if plan is None:
            return np.arange(self.window_count, dtype=np.int64)
        return self.index.windows_at(plan) if self._plan_holds_positions else plan

    def batch_windows(self, index: int) -> npt.NDArray[np.integer[Any]]:
        """Window numbers of batch *index*."""
        start, stop = batch_bounds(self.window_count, self.batch_size, index)
        return self.index.windows_at(self._positions(start, stop))

    def batch(self, index: int) -> MiniBatch:
        """Materialize batch *index* alone."""
        start, stop = batch_bounds(self.window_count, self.batch_size, index)
        return self._materialize(self._positions(start, stop), index)

    def iter_batches(
        self, start: int = 0, stop: int | None = None, step: int = 1, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[MiniBatch]:
        """Lazily yield batches ``start, start + step, ...`` below *stop* (a strided share).

        With *world_size* > 1 each yielded batch holds only this *rank*'s rows of the
        global batch: contiguous, balanced shares (sizes differ by at most one, the
        first ``width % world_size`` ranks take one more), so a final batch narrower
        than the world leaves some ranks with zero rows.  ``MiniBatch.index`` stays
        the global batch index.

        >>> import streambatch as sb
        >>> epoch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=4)
        >>> [[b.width for b in epoch.iter_batches(rank=r, world_size=3)] for r in range(3)]
        [[2, 1], [1, 1], [1, 0]]
        """
        begin = check_non_negative(start, "start", "the first batch index")
        count = self.batch_count
        end = count if stop is None else min(check_non_negative(stop, "stop", "the batch index to stop before"), count)
        stride = check_positive(step, "step", "the distance between yielded batches")
        world = check_positive(world_size, "world_size", "the number of data-parallel ranks")
        if not is_integer(rank) or not 0 <= int(rank) < world:
            raise ConfigError(f"rank={rank!r} must be an int in [0, world_size={world}); pass this process's rank")
        return self._iter(begin, end, stride, int(rank), world)

    def _iter(self, begin: int, end: int, stride: int, rank: int = 0, world: int = 1) -> Iterator[MiniBatch]:
        size, total, make = self.batch_size, self.window_count, self._materialize
        plan = self._order()[0]
        if plan is None or not self._plan_holds_positions or world > 1:
            for index in range(begin, end, stride):
                first = index * size
                last = min(first + size, total)
                if world > 1:
                    first, last = _share(first, last, rank, world)
                yield make(self._positions(first, last), index)
            return
        # the hot loop: two gathers per batch; positions are cast to intp (numpy's
        # fast indexing path) a block of batches at a time
        gather, store, windex = make.gather, self.store, self.index
        # with stride > 1 (a DataLoader worker's share) the batches in between belong to
        # other workers: cast one batch at a time rather than theirs too
        block = max(1, _CAST_BLOCK // size) if stride == 1 else stride
        for head in range(begin, end, block):
            indices = range(head, min(head + block, end), stride)
            cast = plan[head * size : min((indices[-1] + 1) * size, total)].astype(np.intp)
            for index in indices:
                first = (index - head) * size
                positions = cast[first : first + size]
                inputs, targets = gather(positions)
                yield MiniBatch(index, inputs, targets, positions, store, windex)

    def __iter__(self) -> Iterator[MiniBatch]:
        return self.iter_batches()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Epoch):
            return NotImplemented
        return (
            self.partition == other.partition
            and self.config == other.config
            and self.batch_size == other.batch_size
            and self.window_count == other.window_count
            and self.shuffle_state_after == other.shuffle_state_after
            and all(a == b for a, b in zip(self, other, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        order = "sequential" if self.seed is None else f"seed={self.seed}"
        return (
            f"Epoch(windows={self.window_count}, batches={self.batch_count}, context_length={self.context_length}, "
            f"stride={self.stride}, batch_size={self.batch_size}, {order}, partition={self.partition.value!r})"
        )
