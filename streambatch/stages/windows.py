"""Stage 2, windows: every complete causal window of a store, as integers.

A window of context length ``T`` is ``T + 1`` consecutive tokens of one document
starting at ``0, s, 2s, ...``.  Windows are numbered globally in document order;
`WindowIndex` maps window numbers to (document index, start) and token positions
with one ``searchsorted`` per call, never a Python object per window.
`windows` gives them to the next stage as `Windows`: a random-access, sliceable
sequence of window numbers backed by no per-window array at all (sequential
order) or by one uint32 per window (a shuffled plan).
"""

from __future__ import annotations

import mmap
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt

from .._checks import is_integer
from ..errors import DataError, OutOfRangeError
from ..model.documents import Partition
from ..model.source import TokenSource, as_source, partition_documents
from .window_index import IntArray, WindowConfig, WindowIndex, in_blocks


class ShuffleOrder(NamedTuple):
    """A seeded order: the seed and the SplitMix64 state after its Fisher–Yates shuffle."""

    seed: int
    state_after: int


_ITER_BLOCK = 1 << 16  # window numbers made at once when iterating a view
POSITION_LIMIT = 1 << 32  # plans hold uint32 first-token positions while every position fits


class WindowSpace:
    """What every view of one window enumeration shares: the source, its index, the partition.

    The source is a `DocumentStore` or a `streambatch.Corpus` (its positions are
    global in the corpus's virtual token space).  ``cache`` holds per-space helpers
    of later stages (the gather's row views); it is rebuilt after pickling, never
    pickled (it views the tokens).
    """

    __slots__ = ("cache", "config", "index", "partition", "plan_holds_positions", "store")

    def __init__(
        self, store: TokenSource, config: WindowConfig, partition: Partition, include: npt.NDArray[np.bool_] | None = None
    ) -> None:
        self.store = store
        self.config = config
        self.partition = partition
        self.index = WindowIndex(store.lengths, config, store.starts, include)
        self.plan_holds_positions = store.flat_size < POSITION_LIMIT
        self.cache: dict[str, Any] = {}

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.store, self.config, self.partition, self.index, self.plan_holds_positions)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.store, self.config, self.partition, self.index, self.plan_holds_positions = state
        self.cache = {}

    def plan_dtype(self, count: int) -> Any:
        """dtype of a plan of *count* windows: uint32 positions, else uint32/int64 window numbers."""
        if self.plan_holds_positions or count < (1 << 32):
            return np.uint32
        return np.int64


class Windows(Sequence[int]):
    """A random-access, sliceable sequence of windows (global window numbers) of one store.

    No tokens and no object per window: a sequential `Windows` is a range of
    window numbers; a shuffled one views a *plan* of one uint32 per window (each
    window's first-token position, or its number in stores of 2**32+ tokens), in
    memory or memory-mapped from a plan file (`streambatch.plan_file`).
    Slicing returns a view; ``positions()`` and ``locate()`` map a view to token
    positions and (document index, start) for the next stage.

    >>> import streambatch as sb
    >>> w = sb.windows(sb.DocumentStore.from_arrays([0, 10, 11, 12, 1, 0, 20, 21, 1], [0, 5, 9]), context_length=2)
    >>> len(w), list(w), w[1:3].positions().tolist()
    (5, [0, 1, 2, 3, 4], [1, 2])
    """

    __slots__ = ("_batch_index", "_hi", "_lo", "_order", "_plan", "_space")

    def __init__(
        self,
        space: WindowSpace,
        plan: npt.NDArray[Any] | None = None,
        lo: int = 0,
        hi: int | None = None,
        *,
        order: ShuffleOrder | None = None,
        batch_index: int | None = None,
    ) -> None:
        self._space = space
        self._plan = plan
        self._lo = lo
        self._hi = (space.index.window_count if plan is None else plan.size) if hi is None else hi
        self._order = order
        self._batch_index = batch_index

    # -- what this view is: set at construction, never changed -----------------------
    @property
    def order(self) -> ShuffleOrder | None:
        """The seeded order these windows are in (seed and SplitMix64 state after the shuffle); None: document order."""
        return self._order

    @property
    def seed(self) -> int | None:
        """The shuffle seed of this order, or None for document order."""
        return None if self._order is None else self._order.seed

    @property
    def shuffle_state_after(self) -> int | None:
        """The SplitMix64 state after the shuffle that made this order; None for document order."""
        return None if self._order is None else self._order.state_after

    @property
    def batch_index(self) -> int | None:
        """The batch index of a chunk made by `streambatch.chunk`, else None."""
        return self._batch_index

    @property
    def batch(self) -> int | None:
        """Deprecated spelling of `batch_index` (kept for one release)."""
        warnings.warn("Windows.batch is deprecated; use Windows.batch_index", DeprecationWarning, stacklevel=2)
        return self._batch_index

    @property
    def state_after(self) -> int | None:
        """Deprecated spelling of `shuffle_state_after` (kept for one release)."""
        warnings.warn("Windows.state_after is deprecated; use Windows.shuffle_state_after", DeprecationWarning, stacklevel=2)
        return self.shuffle_state_after

    def view(self, lo: int, hi: int, *, batch_index: int | None = None) -> Windows:
        """Windows ``lo:hi`` of this view (``0 <= lo <= hi <= len``), in the same order, tagged with *batch_index*."""
        return Windows(self._space, self._plan, self._lo + lo, self._lo + hi, order=self._order, batch_index=batch_index)

    # -- what the next stages need -------------------------------------------------
    @property
    def space(self) -> WindowSpace:
        """The shared store, index and partition."""
        return self._space

    @property
    def store(self) -> TokenSource:
        """The store (or corpus) the windows read."""
        return self._space.store

    @property
    def window_index(self) -> WindowIndex:
        """The store's `WindowIndex` (window numbers <-> documents and positions)."""
        return self._space.index

    @property
    def config(self) -> WindowConfig:
        """Context length and stride."""
        return self._space.config

    @property
    def context_length(self) -> int:
        """``T``."""
        return self._space.config.context_length

    @property
    def partition(self) -> Partition:
        """The partition whose windows these are."""
        return self._space.partition

    @property
    def is_sequential(self) -> bool:
        """True when no plan backs this view (document order, no per-window array)."""
        return self._plan is None

    @property
    def plan(self) -> npt.NDArray[Any] | None:
        """The whole plan this view looks into (None in sequential order)."""
        return self._plan

    @property
    def plan_nbytes(self) -> int:
        """Bytes of the plan behind this view (0 in sequential order; file pages for a plan file)."""
        return 0 if self._plan is None else int(self._plan.nbytes)

    @property
    def plan_path(self) -> str | None:
        """The file the plan is memory-mapped from (see `streambatch.plan_file`), else None."""
        mapped = _mapped_file(self._plan)
        return None if mapped is None else mapped.filename

    def __reduce__(self) -> tuple[Any, ...]:
        # a memory-mapped plan travels as its file name (spawned workers map the same
        # file), never as a copy of its bytes; the space pickles without its caches
        plan: Any = _mapped_file(self._plan) or self._plan
        return (_rebuild_windows, (self._space, plan, self._lo, self._hi, self._order, self._batch_index))

    def plan_values(self) -> npt.NDArray[Any]:
        """This view's plan entries: first-token positions (or window numbers in 2**32+ token stores).

        A view of the plan when there is one; a fresh array for sequential order.
        """
        space = self._space
        if self._plan is not None:
            return self._plan[self._lo : self._hi]
        dtype = space.plan_dtype(len(self))
        if space.plan_holds_positions:  # built in bounded blocks: no per-window temporary beyond the result
            return space.index.range_positions(self._lo, self._hi, dtype)
        return np.arange(self._lo, self._hi, dtype=dtype)

    def with_plan(self, plan: npt.NDArray[Any], order: ShuffleOrder | None) -> Windows:
        """The same windows in the order of *plan* (entries as `plan_values` gives them)."""
        if plan.size != len(self):
            raise OutOfRangeError(f"plan has {plan.size} entries for {len(self)} windows; pass one entry per window")
        if isinstance(plan, np.memmap):  # a plain view: batches never see the memmap subclass
            plan = plan.view(np.ndarray)
        return Windows(self._space, plan, 0, plan.size, order=order)

    def _entries(self) -> npt.NDArray[Any]:
        """This view's plan entries; read from a file, each is checked where it is used (a window here, else `DataError`).

        Plans computed in this process (`shuffle`) are not checked: they cannot be damaged, and the check costs
        about as much as gathering a short row.
        """
        assert self._plan is not None
        values = self._plan[self._lo : self._hi]
        bad = self._space.index.first_invalid(values, self._space.plan_holds_positions) if _from_file(self._plan) else -1
        if bad >= 0:
            where = self.plan_path or "the plan"
            raise DataError(
                f"{where}: entry {self._lo + bad} ({int(values[bad])}) is not a window of partition "
                f"{self.partition.value!r} at T={self.context_length}, stride {self.config.stride} of this source; "
                "the plan is damaged or foreign: remove it and plan again"
            )
        return values

    def positions(self) -> npt.NDArray[np.intp]:
        """First-token position of each window in the store's flat tokens (intp: numpy's fast index)."""
        space = self._space
        if self._plan is None:
            return space.index.range_positions(self._lo, self._hi, np.intp)
        values = self._entries()
        if space.plan_holds_positions:
            return values.astype(np.intp)
        return space.index.positions(values).astype(np.intp, copy=False)

    def numbers(self) -> IntArray:
        """Global window number of each window (document order numbering)."""
        if self._plan is None:
            return np.arange(self._lo, self._hi, dtype=np.int64)
        values = self._entries()
        if self._space.plan_holds_positions:
            return in_blocks(self._space.index.windows_at, values)[0]
        return values.astype(np.int64)

    def locate(self) -> tuple[IntArray, IntArray]:
        """``(document index, start)`` of each window (built in bounded blocks: the result is all that grows)."""
        index = self._space.index
        if self._plan is not None and self._space.plan_holds_positions:
            documents, starts = in_blocks(index.locate_positions, self._entries(), 2)
        else:
            documents, starts = in_blocks(index.locate, self.numbers(), 2)
        return documents, starts

    # -- the sequence protocol -----------------------------------------------------
    def __len__(self) -> int:
        return self._hi - self._lo

    @overload
    def __getitem__(self, item: int) -> int: ...
    @overload
    def __getitem__(self, item: slice) -> Windows: ...
    def __getitem__(self, item: int | slice) -> int | Windows:
        size = len(self)
        if isinstance(item, slice):
            try:
                start, stop, step = item.indices(size)
            except (TypeError, ValueError) as err:
                raise OutOfRangeError(f"slice {item!r} is not a slice of ints with a non-zero step ({err})") from None
            if step == 1:
                return self.view(start, max(start, stop))
            picked = self.plan_values()[start:stop:step] if self._plan is not None else None
            if picked is None:
                numbers = np.arange(self._lo + start, self._lo + stop, step, dtype=np.int64)
                space = self._space
                picked = space.index.positions(numbers) if space.plan_holds_positions else numbers
                picked = picked.astype(space.plan_dtype(numbers.size))
            return Windows(self._space, picked, 0, picked.size, order=self._order)
        if not is_integer(item):
            raise OutOfRangeError(f"index={item!r} is not an int or a slice; index windows by position")
        at = int(item) + size if int(item) < 0 else int(item)
        if not 0 <= at < size:
            raise OutOfRangeError(f"index={item!r} is out of range for {size} windows; use -len <= index < len")
        return int(self[at : at + 1].numbers()[0])

    def __iter__(self) -> Iterator[int]:
        for lo in range(0, len(self), _ITER_BLOCK):  # bounded: one block of numbers at a time
            yield from self.view(lo, min(lo + _ITER_BLOCK, len(self))).numbers().tolist()

    def __repr__(self) -> str:
        order = "sequential" if self._plan is None else f"seed={self.seed}"
        return (
            f"Windows({len(self)} windows, context_length={self.context_length}, stride={self.config.stride}, "
            f"{order}, partition={self.partition.value!r})"
        )


class _MappedFile(NamedTuple):
    """Where a read-only memory-mapped plan lives: enough to map it again in another process."""

    filename: str
    dtype: str
    offset: int
    size: int


def _from_file(plan: npt.NDArray[Any]) -> bool:
    """Whether *plan* views a memory-mapped file (a plan file: its entries are checked where used)."""
    base: Any = plan
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return isinstance(base, mmap.mmap)


def _mapped_file(plan: npt.NDArray[Any] | None) -> _MappedFile | None:
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
        return _MappedFile(str(mapped.filename), mapped.dtype.str, int(mapped.offset), int(mapped.size))
    return None


def _rebuild_windows(space: WindowSpace, plan: Any, *rest: Any) -> Windows:
    if isinstance(plan, _MappedFile):
        mapped = np.memmap(plan.filename, dtype=np.dtype(plan.dtype), mode="r", offset=plan.offset, shape=(plan.size,))
        plan = mapped.view(np.ndarray)
    lo, hi, order, batch_index = rest
    return Windows(space, plan, lo, hi, order=order, batch_index=batch_index)


def windows(
    source: Any,
    *,
    context_length: int,
    stride: int = 1,
    partition: Partition | str = Partition.TRAIN,
    keep_partition: bool = False,
) -> Windows:
    """Every complete window of *partition* in *source*, in document order.

    *source* is a `DocumentStore` (in memory or opened with `open_store`), a
    `Corpus` of several stores, what `open_source` returns, or an iterable of
    `Document`.  A document of another partition is refused (`PartitionError`)
    unless *keep_partition* skips it: `streambatch.model.source.partition_documents`.
    Holds a few integers per document and nothing per window.

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> w = sb.windows(docs, context_length=2)
    >>> len(w), [(int(d), int(s)) for d, s in zip(*w.locate())]
    (5, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)])
    """
    config = WindowConfig(context_length, stride)
    store = as_source(source)
    chosen = Partition.parse(partition, "windows")
    space = WindowSpace(store, config, chosen, partition_documents(store, chosen, keep_partition=keep_partition))
    return Windows(space)
