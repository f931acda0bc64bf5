"""The façade: `Epoch` pipes the public stages, windows -> shuffle -> chunk -> materialize.

It adds no stage logic of its own: every batch it yields is the batch a user
gets by chaining the same stages by hand.  Iteration is lazy and repeatable;
the shuffle plan is computed once, on first use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ._checks import check_non_negative, check_positive, check_seed, is_integer
from .errors import OutOfRangeError
from .model.documents import Partition, TokenSource, as_store
from .stages.batch import MiniBatch
from .stages.chunk import Chunks, batch_count, batch_widths, chunk, split_rows
from .stages.materialize import Batches, materialize, materialize_one
from .stages.plan import check_plan_dir, plan_file
from .stages.shuffle import shuffle, splitmix64_draws
from .stages.windows import WindowConfig, WindowIndex, Windows, windows


def derive_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of epoch *epoch* of a run seeded with *seed*; epoch 0 uses *seed* itself.

    Epoch ``e > 0`` takes SplitMix64 draw number ``e`` from *seed*, so every
    epoch's order follows from the run seed and the epoch number alone.

    >>> derive_seed(7, 0), derive_seed(7, 1) != derive_seed(7, 2)
    (7, True)
    >>> derive_seed(7, -1)
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: epoch=-1 must be a non-negative int; pass the epoch number (0 for the first)
    """
    checked = check_seed(seed)
    number = check_non_negative(epoch, "epoch", "the epoch number (0 for the first)")
    if number == 0:
        return checked
    return int(splitmix64_draws(checked, number, 1)[0])


class Epoch:
    """Every window of one partition exactly once, batched; the final batch is smaller.

    ``Epoch(docs, context_length=T, batch_size=B, stride=s, seed=k)`` is
    ``materialize(chunk(shuffle(windows(store, ...), k), B))``, with random access.
    *documents* may be a store, a `Corpus` of several, or documents.  With
    ``plan_dir=DIR`` the shuffle is ``plan_file(windows, k, DIR)``: the same order,
    computed once into a file that every rank and worker memory-maps.

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
        plan_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.batch_size = check_positive(batch_size, "batch_size", "the number of windows per batch")
        config = WindowConfig(context_length, stride)
        self.seed = None if seed is None else check_seed(seed)
        self.partition = Partition.parse(partition, "epoch")
        self.plan_dir = None if plan_dir is None else check_plan_dir(plan_dir)
        self.store: TokenSource = as_store(documents)
        self.store.check_partition(self.partition)
        self.windows: Windows = windows(
            self.store, context_length=config.context_length, stride=config.stride, partition=self.partition
        )
        self._order: Windows | None = None

    @classmethod
    def from_windows(cls, ordered: Windows, *, batch_size: int) -> Epoch:
        """The epoch of windows already in their order (e.g. ``sb.shuffle(sb.windows(...), seed)``)."""
        epoch = cls.__new__(cls)
        epoch.batch_size = check_positive(batch_size, "batch_size", "the number of windows per batch")
        epoch.seed = ordered.seed
        epoch.partition = ordered.partition
        epoch.store = ordered.store
        epoch.plan_dir = None
        epoch.windows = Windows(ordered.space)
        epoch._order = ordered
        return epoch

    def reseeded(self, seed: int | None) -> Epoch:
        """The same windows and batching over the same store, in the order of *seed*."""
        twin = Epoch.__new__(Epoch)
        twin.__dict__.update(self.__dict__)
        twin.seed = None if seed is None else check_seed(seed)
        twin._order = None
        return twin

    @property
    def config(self) -> WindowConfig:
        """Context length and stride."""
        return self.windows.config

    @property
    def index(self) -> WindowIndex:
        """The store's window numbering."""
        return self.windows.window_index

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
        return len(self.windows)

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

    @property
    def order(self) -> Windows:
        """The epoch's windows in order: ``shuffle(windows, seed)`` (computed once), or document order.

        With *plan_dir* the order is ``plan_file(windows, seed, plan_dir)``: the same
        order, memory-mapped from a plan file computed once for every process.
        """
        if self._order is None:
            if self.seed is None:
                self._order = self.windows
            elif self.plan_dir is not None:
                self._order = plan_file(self.windows, self.seed, self.plan_dir)
            else:
                self._order = shuffle(self.windows, self.seed)
        return self._order

    @property
    def shuffle_state_after(self) -> int | None:
        """SplitMix64 state after the shuffle; ``None`` for sequential order."""
        return self.order.state_after

    @property
    def plan_nbytes(self) -> int:
        """Bytes held for the epoch's order (0 for sequential order)."""
        return self.order.plan_nbytes

    def chunks(self) -> Chunks:
        """``chunk(order, batch_size)``: the epoch's batches as lazy window views."""
        return chunk(self.order, self.batch_size)

    def batches(self, *, rank: int = 0, world_size: int = 1) -> Batches:
        """``materialize(chunks)`` as a lazy sequence; with *world_size* > 1, this rank's rows of each."""
        chunks = self.chunks()
        return materialize(split_rows(chunks, rank, world_size) if world_size != 1 or rank != 0 else chunks)

    def window_order(self) -> npt.NDArray[np.integer[Any]]:
        """Global window numbers in epoch order (materialized on request only)."""
        return self.order.numbers()

    def batch_windows(self, index: int) -> npt.NDArray[np.integer[Any]]:
        """Window numbers of batch *index*."""
        return self.chunks()[self._batch_index(index)].numbers()

    def _batch_index(self, index: Any) -> int:
        if not is_integer(index):
            raise OutOfRangeError(f"batch index={index!r} is not an int; pass 0 <= index < batch_count={self.batch_count}")
        if not 0 <= int(index) < self.batch_count:
            raise OutOfRangeError(
                f"batch index={index} is out of range for {self.batch_count} batches; use 0 <= index < batch_count"
            )
        return int(index)

    def batch(self, index: int) -> MiniBatch:
        """Materialize batch *index* alone."""
        return materialize_one(self.chunks()[self._batch_index(index)])

    def __getitem__(self, index: int) -> MiniBatch:
        return self.batch(index)

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
        end = None if stop is None else check_non_negative(stop, "stop", "the batch index to stop before")
        stride = check_positive(step, "step", "the distance between yielded batches")
        batches = self.batches(rank=rank, world_size=world_size)
        return iter(batches[begin:end:stride])

    def __iter__(self) -> Iterator[MiniBatch]:
        return iter(self.batches())

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
