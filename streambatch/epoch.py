"""The façade: `Epoch` pipes the public stages, windows -> shuffle -> chunk -> share -> materialize.

It adds no rule of its own: every batch it yields is the batch a user gets by
chaining the same stages by hand, and every check it makes is a stage's.
Iteration is lazy and repeatable; the shuffle plan is computed once, on first
use.
"""

from __future__ import annotations

import enum
import os
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ._checks import check_non_negative, check_positive, check_seed
from .batch.minibatch import MiniBatch
from .config import EpochConfig, items_of
from .errors import ConfigError
from .io.keyed_file import check_plan_dir
from .items.pack.pack import check_emittable
from .items.protocol import EpochItems, orders_by_plan
from .items.windows.window_index import WindowConfig, WindowIndex
from .items.windows.windows import Windows
from .model.documents import Partition
from .model.source import TokenSource
from .order.plan import plan_file
from .order.shuffle import shuffle
from .order.splitmix import derive_seed
from .stages.chunk import BatchSize, Chunks, batch_count, batch_widths, bind_batch_size, check_batch_size, chunk, largest_batch
from .stages.materialize import Batches, materialize
from .stages.schedule import BatchSchedule, BatchSizeArg
from .stages.share import share
from .state import check_index

__all__ = ["Epoch", "derive_seed"]


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET  # seed= not passed: document order with a DeprecationWarning (0.3); seed will be required
NO_SEED = (
    "Epoch(...) without seed= reads the windows in document order, unshuffled: pass seed=N for a shuffled epoch "
    "(the CLI's --seed N) or seed=None for document order (--sequential); a later release will require seed="
)


class Epoch:
    """Every window of one partition exactly once, batched; the final batch is smaller.

    ``Epoch(source, context_length=T, batch_size=B, stride=s, seed=k)`` is
    ``materialize(chunk(shuffle(windows(source, ...), k), B))``, with random access.
    *source* is anything the stages read (a store, a `Corpus`, what
    `streambatch.open_source` returns, documents) or `Windows` the stages made
    (already shuffled, or to be shuffled with *seed*).  With ``plan_dir=DIR`` the
    shuffle is ``plan_file(windows, k, DIR)``: the same order, computed once into
    a file that every rank and worker memory-maps (``verify_plan=True`` reads it
    once when opened, checking its digest and that no window repeats).

    *seed* is required, as the CLI's ``--seed N | --sequential`` is: ``seed=None``
    means document order (windows passed already shuffled keep their order).
    Leaving it out still gives document order, with a `DeprecationWarning`.

    ``pack=True`` (or `Rows` from `sb.pack` as *source*) is the packed mode: the
    same pipe over ``sb.pack(source, context_length=T)`` (no stride), whose items
    are rows and whose batches are packed `MiniBatch` es; ``item_count`` counts
    rows.  Over a mixture (``sb.mix`` of ``sb.pack`` parts, or a mixture file with
    ``pack=True``) the batches are packed batches carrying ``sources``.

    ``skip_untrained=True`` drops the windows (packed: pieces, before packing) with
    no counted target under the source's loss mask (``epoch.items.untrained``
    counts them; a mixture filters each source before mixing); by default they
    are kept, so a masked epoch holds the unmasked epoch's items.

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
        source: object = None,
        *,
        context_length: int | None = None,
        batch_size: BatchSizeArg,
        stride: int | None = None,
        seed: int | _Unset | None = UNSET,
        partition: Partition | str | None = None,
        keep_partition: bool = False,
        plan_dir: str | os.PathLike[str] | None = None,
        verify_plan: bool = False,
        documents: Any = None,
        pack: bool = False,
        skip_untrained: bool = False,
    ) -> None:
        if documents is not None:
            if source is not None:
                raise ConfigError("pass the source once: source= (documents= is its deprecated name)")
            warnings.warn("Epoch(documents=...) is deprecated; pass the source first, or source=", DeprecationWarning, 2)
            source = documents
        config = EpochConfig(
            batch_size, seed, context_length, stride, partition, keep_partition, plan_dir, verify_plan, pack, skip_untrained
        )
        self._open(source, config, stacklevel=3)

    @classmethod
    def from_config(cls, source: object, config: EpochConfig) -> Epoch:
        """The epoch of *source* under *config* (what `streambatch.Run` builds each epoch with)."""
        epoch = cls.__new__(cls)
        epoch._open(source, config, stacklevel=4)
        return epoch

    def _open(self, source: object, config: EpochConfig, stacklevel: int) -> None:
        self._closed = False
        size = check_batch_size(config.batch_size)  # an int, or a schedule (bound to T below)
        seed = config.seed
        given = items_of(source, config, None if isinstance(seed, _Unset) else seed)
        if isinstance(seed, _Unset):
            if given.order is None:
                warnings.warn(NO_SEED, DeprecationWarning, stacklevel=stacklevel)
            seed = None
        if given.seed is not None and seed is not None and seed != given.seed:
            raise ConfigError(f"seed={seed!r} but {given.words.seed_taken.format(seed=given.seed)}")
        self.seed = given.seed if seed is None else check_seed(seed)
        self.plan_dir = None if config.plan_dir is None else check_plan_dir(config.plan_dir)
        self.verify_plan = bool(config.verify_plan)  # read the plan file once to check it (digest, entries, repeats)
        self.settings = replace(config, seed=self.seed, plan_dir=self.plan_dir, verify_plan=self.verify_plan)
        self._order: EpochItems | None = given if given.order is not None or self.seed is None else None
        self.items: EpochItems = given if given.order is None else given.unordered()  # a mixture is its own order
        self.batch_size: BatchSize = bind_batch_size(size, given)
        self.pack: bool = given.packed  # packed rows (sb.pack), alone or mixed
        self.partition: Partition = self.items.partition
        if self.pack:  # refuse a batch that cannot be emitted now, not at the first batch
            widest = max((s.dtype for s in given.stores), key=lambda d: np.dtype(d).itemsize)  # a mixture: its sources'
            largest = largest_batch(self.batch_size)
            check_emittable(min(largest, len(given)), self.context_length, widest, batch_size=largest)

    @property
    def windows(self) -> EpochItems:
        """Deprecated name of `items` (kept for one release): the epoch's items, windows or not."""
        warnings.warn("Epoch.windows is deprecated; use Epoch.items", DeprecationWarning, stacklevel=2)
        return self.items

    @property
    def store(self) -> TokenSource:
        """The store or corpus the items read (a mixture has one per source: ``items.parts[s].store``)."""
        return self.items.store

    @classmethod
    def from_windows(cls, ordered: Windows, *, batch_size: int) -> Epoch:
        """The epoch of windows already in their order (e.g. ``sb.shuffle(sb.windows(...), seed)``): ``Epoch(ordered, ...)``."""
        return cls(ordered, batch_size=batch_size, seed=None)

    def reseeded(self, seed: int | None, *, consumed: int | None = None) -> Epoch:
        """The same windows and batching over the same source, in the order of *seed*.

        *consumed*: the items a run consumed before this epoch (epoch ``e``: ``e * item_count``); a batch-size
        schedule goes on from there (`streambatch.stages.schedule.BatchSchedule.after`).  None keeps this epoch's.
        """
        items, seed = self.items.reseed(seed)  # a mixture's: the same plan, source orders of *seed*
        size = self.batch_size
        settings = replace(self.settings, seed=seed)
        if consumed is not None and isinstance(size, BatchSchedule):
            settings = replace(settings, batch_size=size.after(consumed))
        return Epoch.from_config(items, settings)

    @property
    def config(self) -> WindowConfig:
        """Context length and stride."""
        return self.items.config

    @property
    def index(self) -> WindowIndex:
        """The source's window numbering (window mode only; packed epochs have ``items.packing``)."""
        return self.items.window_index

    @property
    def context_length(self) -> int:
        """``T``."""
        return self.config.context_length

    @property
    def stride(self) -> int:
        """Distance between window starts within a document."""
        return self.config.stride

    @property
    def item_count(self) -> int:
        """Items in this epoch: windows, packed rows, or a mixture's items."""
        return len(self.items)

    @property
    def window_count(self) -> int:
        """Complete windows in this epoch (a packed epoch's items are rows: `item_count`)."""
        if self.pack:
            raise ConfigError("a packed epoch has rows, not windows; use epoch.item_count")
        return len(self.items)

    @property
    def batch_count(self) -> int:
        """Batches in this epoch: ``ceil(item_count / batch_size)``."""
        return batch_count(self.item_count, self.batch_size)

    @property
    def batch_widths(self) -> list[int]:
        """``[B, ..., B, r]``: the width of every batch."""
        return batch_widths(self.item_count, self.batch_size)

    def __len__(self) -> int:
        return self.batch_count

    @property
    def order(self) -> EpochItems:
        """The epoch's items in order: ``shuffle(items, seed)`` (computed once), or document order.

        With *plan_dir* the order is ``plan_file(windows, seed, plan_dir)``: the same
        order, memory-mapped from a plan file computed once for every process.
        """
        if self._order is None:
            assert self.seed is not None  # sequential epochs and mixtures hold their order from the start
            planned = self.items
            assert orders_by_plan(planned)  # so these are windows or rows, which a seeded plan orders
            if self.plan_dir is not None:
                self._order = plan_file(planned, self.seed, self.plan_dir, verify=self.verify_plan)
            else:
                self._order = shuffle(planned, self.seed)
        return self._order

    @property
    def shuffle_state_after(self) -> int | None:
        """SplitMix64 state after the shuffle; ``None`` for sequential order."""
        return self.order.shuffle_state_after

    @property
    def plan_nbytes(self) -> int:
        """Bytes held for the epoch's order (0 for sequential order)."""
        return self.order.plan_nbytes

    def chunks(self) -> Chunks[EpochItems]:
        """``chunk(order, batch_size)``: the epoch's batches as lazy window (or row) views."""
        return chunk(self.order, self.batch_size)

    def batches(self, *, worker: int = 0, workers: int = 1, rank: int = 0, world_size: int = 1) -> Batches:
        """``materialize(share(chunks, ...))``: a lazy sequence of this worker's batches, this rank's rows of each."""
        if self.closed:
            raise ConfigError("this epoch was closed (epoch.close()); build it again (sb.Epoch) to read its batches")
        return materialize(share(self.chunks(), worker=worker, workers=workers, rank=rank, world_size=world_size))

    def window_order(self) -> npt.NDArray[np.int64]:
        """Global window numbers in epoch order (materialized on request only)."""
        return self.order.numbers()

    def batch_windows(self, index: int) -> npt.NDArray[np.int64]:
        """Window numbers of batch *index*."""
        return self.chunks()[check_index(index, self.batch_count)].numbers()

    def batch(self, index: int) -> MiniBatch:
        """Materialize batch *index* alone."""
        return self.batches()[check_index(index, self.batch_count)]

    def __getitem__(self, index: int) -> MiniBatch:
        return self.batch(index)

    def iter_batches(
        self, start: int = 0, stop: int | None = None, step: int = 1, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[MiniBatch]:
        """Lazily yield batches ``start, start + step, ...`` below *stop*, this *rank*'s rows of each.

        With *world_size* > 1 each yielded batch holds only this *rank*'s rows of the
        global batch (`streambatch.share`); ``MiniBatch.index`` stays the global
        batch index.

        >>> import streambatch as sb
        >>> epoch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=4, seed=7)
        >>> [[b.width for b in epoch.iter_batches(rank=r, world_size=3)] for r in range(3)]
        [[2, 1], [1, 1], [1, 0]]
        """
        begin = check_non_negative(start, "start", "the first batch index")
        end = None if stop is None else check_non_negative(stop, "stop", "the batch index to stop before")
        stride = check_positive(step, "step", "the distance between yielded batches")
        return iter(self.batches(rank=rank, world_size=world_size)[begin:end:stride])

    def __iter__(self) -> Iterator[MiniBatch]:
        return iter(self.batches())

    # -- closing ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether `close` was called (or a store it reads was closed): its batches are then refused."""
        return self._closed or any(store.closed for store in self.items.stores)

    def close(self) -> None:
        """Close the stores the epoch reads (a store shared with another epoch is closed for it too): a remote
        store's requests in flight are waited for and its memory given back; the batches are refused from now on.

        >>> import streambatch as sb
        >>> with sb.Epoch([sb.Document("a", "train", range(6))], context_length=2, batch_size=2, seed=1) as epoch:
        ...     len(list(epoch))
        2
        >>> epoch.closed
        True
        """
        self._closed = True
        for store in self.items.stores:
            store.close()

    def __enter__(self) -> Epoch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Epoch):
            return NotImplemented
        return (
            self.partition == other.partition
            and self.config == other.config
            and self.batch_size == other.batch_size
            and self.item_count == other.item_count
            and self.shuffle_state_after == other.shuffle_state_after
            and all(a == b for a, b in zip(self, other, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        order = "sequential" if self.seed is None else f"seed={self.seed}"
        if self.pack:
            return (
                f"Epoch(pack=True, rows={self.item_count}, batches={self.batch_count}, context_length={self.context_length}, "
                f"batch_size={self.batch_size}, {order}, partition={self.partition.value!r})"
            )
        return (
            f"Epoch(windows={self.window_count}, batches={self.batch_count}, context_length={self.context_length}, "
            f"stride={self.stride}, batch_size={self.batch_size}, {order}, partition={self.partition.value!r})"
        )
