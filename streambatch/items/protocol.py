"""The one seam between the ordering stages and the rest: a sequence of training items.

`chunk`, `share`, `split_rows` and `materialize` take any `Items`: the windows of
`sb.windows` (the chapter's mode), packed rows, or a mixture's items.  An
`Items` is sized and sliceable, and its `view` is what a chunk is: a contiguous
run of items tagged with its global batch index.  Gathering is the item kind's
own: ``gather(index)`` makes one view's `streambatch.MiniBatch`, and
``gather_batches(batch_size, batches)`` the batches of consecutive (or strided)
chunks of the whole sequence, as fast as the kind can (`Windows`: a block of
positions at a time).  No stage asks which kind it holds.

`PlannedItems` is what `Windows` and packed `Rows` share: the view, its order,
its plan (in memory or mapped from a plan file) and the sequence protocol.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol, TypeGuard, TypeVar, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from .._checks import is_integer
from ..batch.minibatch import MiniBatch
from ..errors import ConfigError, OutOfRangeError
from ..model.documents import Partition
from ..model.source import TokenSource
from ..order.protocol import ItemWords, Orderable, ShuffleOrder
from .windows.window_index import WindowConfig, WindowIndex

_Self = TypeVar("_Self")
Span = tuple[TokenSource, npt.NDArray[np.int64], npt.NDArray[np.int64]]  # (store, flat starts, token counts)


@runtime_checkable
class Items(Protocol):
    """What the chunk, share and materialize stages need of a sequence of items (every kind has each member).

    ``isinstance(x, Items)`` holds for windows, packed rows and mixtures; it asks
    no property that reads a store (so it stays cheap where Python evaluates them).
    """

    @property
    def words(self) -> ItemWords:
        """What messages call the items (`streambatch.order.protocol.ItemWords`)."""
        ...

    @property
    def packed(self) -> bool:
        """True for packed rows (alone or mixed): their batches carry the packed columns."""
        ...

    def __len__(self) -> int: ...

    def __getitem__(self, item: Any) -> Any: ...

    @property
    def batch_index(self) -> int | None:
        """The global batch this view is (None for a whole sequence)."""
        ...

    @property
    def global_count(self) -> int | None:
        """A rank's share of a batch: the counted targets of the whole batch over every rank (None: a whole batch)."""
        ...

    def view(self: _Self, lo: int, hi: int, *, batch_index: int | None = None, global_count: int | None = None) -> _Self:
        """Items ``[lo, hi)`` as one chunk, tagged with *batch_index* (and, a rank's share, *global_count*)."""
        ...

    def counted_targets(self) -> int:
        """The targets of this view that count in a token mean, from the plan alone (no token is read)."""
        ...

    def token_spans(self) -> list[Span]:
        """``[(store, starts, lengths)]``: the flat token spans this view reads (what a remote reader fetches)."""
        ...

    def gather(self, index: int) -> MiniBatch:
        """This view's items as one batch numbered *index*."""
        ...

    def gather_batches(self, batch_size: int, batches: range) -> Iterator[MiniBatch]:
        """Batches *batches* (a range of batch numbers) of this sequence chunked by *batch_size*."""
        ...


class EpochItems(Items, Protocol):
    """What `streambatch.Epoch`, `streambatch.Run` and the command line read of the items of an epoch, besides
    what the stages need: every member each kind (`Windows`, packed `Rows`, `Mixture`) has, typed, so the
    façades reach none through ``Any`` or ``getattr``.  A member a kind has no answer for refuses by name
    (a mixture's ``store``, packed rows' ``window_index``)."""

    @property
    def partition(self) -> Partition:
        """The partition whose items these are."""
        ...

    @property
    def config(self) -> WindowConfig:
        """Context length and stride (packed rows: stride ``T``)."""
        ...

    @property
    def context_length(self) -> int:
        """``T``."""
        ...

    @property
    def order(self) -> object:
        """The seeded order the items are in (windows and rows: a `ShuffleOrder`; a mixture: its own), or None."""
        ...

    @property
    def seed(self) -> int | None:
        """The seed of that order (None: the natural order)."""
        ...

    @property
    def shuffle_state_after(self) -> int | None:
        """The SplitMix64 state after the shuffle (None: natural order, or a mixture)."""
        ...

    @property
    def plan_nbytes(self) -> int:
        """Bytes of the plan behind the items (0 in the natural order)."""
        ...

    @property
    def untrained(self) -> object:
        """What ``skip_untrained`` dropped (`streambatch.items.untrained.UntrainedReport`; a mixture: one per
        source), or None: every item kept."""
        ...

    @property
    def fingerprint(self) -> str:
        """What the items' order depends on besides the seed (the stores' fingerprints)."""
        ...

    @property
    def stores(self) -> tuple[TokenSource, ...]:
        """Every store the items read (a mixture: one per source)."""
        ...

    @property
    def store(self) -> TokenSource:
        """The one store the items read (refused for a mixture: `stores`)."""
        ...

    @property
    def window_index(self) -> WindowIndex:
        """The source's window numbering (refused for packed rows and mixtures)."""
        ...

    @property
    def space(self) -> Any:
        """What every view of the sequence shares (source, index or packing, partition; a mixture's plan)."""
        ...

    def numbers(self) -> npt.NDArray[np.int64]:
        """Each item's number (its place in the natural order)."""
        ...

    def unordered(self: _Self) -> _Self:
        """Every (kept) item in the natural order (a mixture: itself)."""
        ...

    def reseed(self: _Self, seed: int | None) -> tuple[_Self, int | None]:
        """What an epoch of *seed* is made of: items (unordered) and the seed to order them with."""
        ...


class OrderableItems(EpochItems, Orderable, Protocol):
    """Epoch items a seeded plan orders (`streambatch.shuffle`, `streambatch.plan_file`): windows and packed rows."""


def orders_by_plan(items: EpochItems) -> TypeGuard[OrderableItems]:
    """Whether a seeded plan orders *items*: yes for windows and packed rows; a mixture's words say it orders itself."""
    return items.words.orders_itself is None


def check_agrees(
    items: EpochItems, *, context_length: int | None, stride: int | None, partition: Partition | str | None, pack: bool
) -> None:
    """The one rule for items passed to a façade: the window arguments may be left out; given, they must agree.

    >>> import streambatch as sb
    >>> w = sb.windows([sb.Document("a", "train", range(6))], context_length=2)
    >>> check_agrees(w, context_length=3, stride=None, partition=None, pack=False)
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: context_length=3 but the windows passed have context_length=2; leave it out or match it
    """
    what, has, are = items.words.passed
    if pack and not items.packed:
        raise ConfigError(f"pack=True but {items.words.not_packed}")
    have = {"context_length": items.context_length, "stride": items.config.stride}
    for key, value in {"context_length": context_length, "stride": stride}.items():
        if value is not None and value != have[key]:
            raise ConfigError(f"{key}={value!r} but {what} {has} {key}={have[key]}; leave it out or match it")
    if partition is not None and Partition.parse(partition, "epoch") != items.partition:
        raise ConfigError(f"partition={partition!r} but {what} {are} of {items.partition.value!r}")


def counted_targets(items: Any) -> int:
    """The counted targets of *items* (a view of any item kind), from its plan alone: no token is read.

    Each kind brings its own (windows: ``len * T``; packed rows: their real targets; a mixture: its sources'; with
    a loss mask, the mask bits at those targets): the one call the share stage makes for the whole batch's count.
    """
    count = getattr(items, "counted_targets", None)
    if count is None:
        raise ConfigError(
            f"items={type(items).__name__} has no counted_targets(); an item kind split over ranks says how many "
            "targets each view counts (see streambatch.items.protocol)"
        )
    return int(count())


ITER_BLOCK = 1 << 16  # item numbers made at once when iterating a view
_P = TypeVar("_P", bound="PlannedItems")


class PlannedItems(Sequence[int]):
    """What `Windows` and packed `Rows` share: a view ``[lo, hi)`` of a whole sequence of numbered items.

    The items are integers (window or row numbers) over a shared *space*; in
    their natural order no per-item array backs them, in a seeded order one
    *plan* array does (in memory, or memory-mapped from a plan file: a pickled
    view travels as the file's name).  Set at construction, never changed: the
    order (`ShuffleOrder`) and the batch index of a chunk.  A subclass says what
    its plan entries are (`plan_values`, `numbers`, `_picked`) and how many items
    the whole space holds (`_whole`).
    """

    __slots__ = ("_batch_index", "_global_count", "_hi", "_lo", "_order", "_plan", "_space")
    words = ItemWords()  # what messages call these items (each kind has its own)
    packed = False  # True for packed rows: their batches carry the packed columns

    def __init__(
        self,
        space: Any,
        plan: npt.NDArray[Any] | None = None,
        lo: int = 0,
        hi: int | None = None,
        *,
        order: ShuffleOrder | None = None,
        batch_index: int | None = None,
        global_count: int | None = None,
    ) -> None:
        self._space = space
        self._plan = plan
        self._lo = lo
        self._hi = (self._whole(space) if plan is None else plan.size) if hi is None else hi
        self._order = order
        self._batch_index = batch_index
        self._global_count = global_count

    @staticmethod
    def _whole(space: Any) -> int:
        """Items of the whole *space*, in its natural order."""
        raise NotImplementedError

    def numbers(self) -> npt.NDArray[np.int64]:
        """Each item's number (its place in the natural order)."""
        raise NotImplementedError

    def _picked(self, start: int, stop: int, step: int) -> npt.NDArray[Any]:
        """Plan entries of ``self[start:stop:step]`` (a step other than 1)."""
        raise NotImplementedError

    def counted_targets(self) -> int:
        """The targets of this view that count in a token mean, from the plan alone (no token is read)."""
        raise NotImplementedError

    def target_counts(self) -> npt.NDArray[np.int64]:
        """Each item's counted targets (the same rule as `counted_targets`, item by item)."""
        raise NotImplementedError

    # -- what this view is: set at construction, never changed -----------------------
    @property
    def order(self) -> ShuffleOrder | None:
        """The seeded order these items are in (seed and SplitMix64 state after the shuffle); None: natural order."""
        return self._order

    @property
    def seed(self) -> int | None:
        """The shuffle seed of this order, or None for the natural (document, row) order."""
        return None if self._order is None else self._order.seed

    @property
    def shuffle_state_after(self) -> int | None:
        """The SplitMix64 state after the shuffle that made this order; None for the natural order."""
        return None if self._order is None else self._order.state_after

    @property
    def batch_index(self) -> int | None:
        """The batch index of a chunk made by `streambatch.chunk`, else None."""
        return self._batch_index

    @property
    def global_count(self) -> int | None:
        """A rank's share of a batch: the counted targets of the whole batch over every rank (None: a whole batch)."""
        return self._global_count

    def view(self: _P, lo: int, hi: int, *, batch_index: int | None = None, global_count: int | None = None) -> _P:
        """Items ``lo:hi`` of this view (``0 <= lo <= hi <= len``), in the same order, tagged with *batch_index*.

        *global_count* marks the view as a rank's share of a batch whose ranks count that many targets in all.
        """
        return type(self)(
            self._space, self._plan, self._lo + lo, self._lo + hi, order=self._order, batch_index=batch_index,
            global_count=global_count,
        )  # fmt: skip

    def with_plan(self: _P, plan: npt.NDArray[Any], order: ShuffleOrder | None) -> _P:
        """The same items in the order of *plan* (entries as `plan_values` gives them)."""
        if plan.size != len(self):
            raise OutOfRangeError(f"plan has {plan.size} entries for {len(self)} {self.words.items}; pass one entry per item")
        if isinstance(plan, np.memmap):  # a plain view: batches never see the memmap subclass
            plan = plan.view(np.ndarray)
        return type(self)(self._space, plan, 0, plan.size, order=order)

    def unordered(self: _P) -> _P:
        """Every item of the whole space, in the natural order (the kept ones of ``skip_untrained``)."""
        report = self.untrained  # an UntrainedReport: its kept entries are the natural order
        if report is None:
            return type(self)(self._space)
        return type(self)(self._space, report.entries, 0, report.kept)

    def plan_key_fields(self) -> dict[str, Any]:
        """What names a plan file of these items, besides the seed (`streambatch.order.plan.plan_key`)."""
        raise NotImplementedError

    def fill_plan(self, values: npt.NDArray[Any]) -> None:
        """Write every item's plan entry, in the natural order, into *values* (in bounded blocks): its number."""
        for lo in range(0, values.size, ITER_BLOCK):
            hi = min(lo + ITER_BLOCK, values.size)
            values[lo:hi] = np.arange(lo, hi, dtype=values.dtype)

    def plan_entries(self, block: npt.NDArray[np.integer], total: int) -> npt.NDArray[np.int64]:
        """Each plan entry's item number, -1 where the entry names no item of the *total* (a number past the last)."""
        numbers = block.astype(np.int64)
        numbers[(numbers < 0) | (numbers >= total)] = -1
        return numbers

    @property
    def whole_count(self) -> int:
        """Items of the whole space (every window, or every packed row), in any order."""
        return self._whole(self._space)

    @property
    def is_whole(self) -> bool:
        """True for every item of the space in the natural order (what a mixture part and a plan need); under
        ``skip_untrained``, every kept item in that order."""
        report = self.untrained
        if report is None:
            return self.is_sequential and len(self) == self.whole_count
        return self._order is None and self._plan is report.entries and len(self) == report.kept

    @property
    def space(self) -> Any:
        """What every view of this sequence shares (source, index or packing, partition)."""
        return self._space

    @property
    def untrained(self) -> Any:
        """The `streambatch.items.untrained.UntrainedReport` of ``skip_untrained`` (kept and dropped items), or None."""
        return getattr(self._space, "untrained", None)

    @property
    def store(self) -> TokenSource:
        """The store (or corpus) the items read."""
        return self._space.store  # type: ignore[no-any-return]

    @property
    def stores(self) -> tuple[TokenSource, ...]:
        """Every store the items read: this one (a mixture: one per source)."""
        return (self._space.store,)

    def reseed(self: _P, seed: int | None) -> tuple[_P, int | None]:
        """What an epoch of *seed* is made of: these items (unordered) and *seed* itself (a mixture: its own)."""
        return self, seed

    @property
    def fingerprint(self) -> str:
        """What the items' order depends on besides the seed: the store's fingerprint (else its content's)."""
        store = self.store
        return store.fingerprint or store.content_fingerprint()

    @property
    def partition(self) -> Partition:
        """The partition whose items these are."""
        return self._space.partition  # type: ignore[no-any-return]

    @property
    def is_sequential(self) -> bool:
        """True when no plan backs this view (natural order, no per-item array)."""
        return self._plan is None

    @property
    def plan(self) -> npt.NDArray[Any] | None:
        """The whole plan this view looks into (None in the natural order)."""
        return self._plan

    @property
    def plan_nbytes(self) -> int:
        """Bytes of the plan behind this view (0 in the natural order; file pages for a plan file)."""
        return 0 if self._plan is None else int(self._plan.nbytes)

    @property
    def plan_path(self) -> str | None:
        """The file the plan is memory-mapped from (see `streambatch.plan_file`), else None."""
        mapped = mapped_file(self._plan)
        return None if mapped is None else mapped.filename

    def __reduce__(self) -> tuple[Any, ...]:
        # a memory-mapped plan travels as its file name (spawned workers map the same
        # file), never as a copy of its bytes; the space pickles without its caches
        plan: Any = mapped_file(self._plan) or self._plan
        rest = (self._lo, self._hi, self._order, self._batch_index, self._global_count)
        return (_rebuild, (type(self), self._space, plan, *rest))

    # -- the sequence protocol -----------------------------------------------------
    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self: _P, item: int) -> int: ...
    @overload
    def __getitem__(self: _P, item: slice) -> _P: ...
    def __getitem__(self: _P, item: int | slice) -> int | _P:
        size = len(self)
        if isinstance(item, slice):
            try:
                start, stop, step = item.indices(size)
            except (TypeError, ValueError) as err:
                raise OutOfRangeError(f"slice {item!r} is not a slice of ints with a non-zero step ({err})") from None
            if step == 1:
                return self.view(start, max(start, stop))
            picked = self._picked(start, stop, step)
            return type(self)(self._space, picked, 0, picked.size, order=self._order)
        if not is_integer(item):
            raise OutOfRangeError(f"index={item!r} is not an int or a slice; index {self.words.items} by position")
        at = int(item) + size if int(item) < 0 else int(item)
        if not 0 <= at < size:
            raise OutOfRangeError(f"index={item!r} is out of range for {size} {self.words.items}; use -len <= index < len")
        return int(self.view(at, at + 1).numbers()[0])

    def __iter__(self) -> Iterator[int]:
        for lo in range(0, len(self), ITER_BLOCK):  # bounded: one block of numbers at a time
            yield from self.view(lo, min(lo + ITER_BLOCK, len(self))).numbers().tolist()


class MappedFile(NamedTuple):
    """Where a read-only memory-mapped plan lives: enough to map it again in another process."""

    filename: str
    dtype: str
    offset: int
    size: int


def from_file(plan: npt.NDArray[Any]) -> bool:
    """Whether *plan* views a memory-mapped file (a plan file: its entries are checked where used)."""
    base: Any = plan
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return isinstance(base, mmap.mmap)


def mapped_file(plan: npt.NDArray[Any] | None) -> MappedFile | None:
    """The file behind *plan* when it views a whole np.memmap (not a slice of one), else None."""
    if plan is None:
        return None
    mapped: Any = plan if isinstance(plan, np.memmap) else plan.base
    buffer: Any = getattr(mapped, "base", None)
    if (
        isinstance(mapped, np.memmap)
        and isinstance(buffer, mmap.mmap)  # the memmap itself, not a slice of one
        and mapped.filename is not None
        and plan.size == mapped.size
        and plan.dtype == mapped.dtype
        and plan.__array_interface__["data"][0] == mapped.__array_interface__["data"][0]
    ):
        return MappedFile(str(mapped.filename), mapped.dtype.str, int(mapped.offset), int(mapped.size))
    return None


def _rebuild(cls: type[PlannedItems], space: Any, plan: Any, *rest: Any) -> PlannedItems:
    if isinstance(plan, MappedFile):
        mapped = np.memmap(plan.filename, dtype=np.dtype(plan.dtype), mode="r", offset=plan.offset, shape=(plan.size,))
        plan = mapped.view(np.ndarray)
    lo, hi, order, batch_index, global_count = rest
    return cls(space, plan, lo, hi, order=order, batch_index=batch_index, global_count=global_count)
