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

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.minibatch import MiniBatch
from ...errors import ConfigError, DataError
from ...io.files import short_path
from ...io.keyed_file import check_blocks
from ...model.documents import Partition
from ...model.source import TokenSource, as_source, partition_documents
from ...order.protocol import ItemWords, ShuffleOrder
from ..protocol import PlannedItems, from_file
from ..road import BatchReader, fetched, gather_one
from ..untrained import drop_untrained
from .gather import iter_window_batches
from .window_index import IntArray, WindowConfig, WindowIndex, in_blocks

__all__ = ["POSITION_LIMIT", "ShuffleOrder", "WindowSpace", "Windows", "windows"]

POSITION_LIMIT = 1 << 32  # plans hold uint32 first-token positions while every position fits


class WindowSpace:
    """What every view of one window enumeration shares: the source, its index, the partition.

    The source is a `DocumentStore` or a `streambatch.Corpus` (its positions are
    global in the corpus's virtual token space).  ``cache`` holds per-space helpers
    of later stages (the gather's row views); it is rebuilt after pickling, never
    pickled (it views the tokens).
    """

    __slots__ = ("cache", "config", "index", "partition", "plan_holds_positions", "store", "untrained")

    def __init__(
        self, store: TokenSource, config: WindowConfig, partition: Partition, include: npt.NDArray[np.bool_] | None = None
    ) -> None:
        self.store = store
        self.config = config
        self.partition = partition
        self.index = WindowIndex(store.lengths, config, store.starts, include)
        self.plan_holds_positions = store.flat_size < POSITION_LIMIT
        self.cache: dict[str, Any] = {}
        self.untrained: Any = None  # an UntrainedReport when skip_untrained dropped windows (streambatch.items.untrained)

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.store, self.config, self.partition, self.index, self.plan_holds_positions, self.untrained)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.store, self.config, self.partition, self.index, self.plan_holds_positions = state[:5]
        self.untrained = state[5] if len(state) > 5 else None
        self.cache = {}

    def locate_positions(self, positions: npt.NDArray[Any]) -> tuple[IntArray, IntArray]:
        """``(document index, start)`` of windows starting at first-token *positions*."""
        return self.index.locate_positions(positions)

    def item_numbers(self, positions: npt.NDArray[Any]) -> IntArray:
        """The window numbers of windows starting at first-token *positions*."""
        return self.index.windows_at(positions)

    def plan_positions(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """What a gather reads for plan entries *values*: first-token positions (the entries, or their windows')."""
        return values if self.plan_holds_positions else self.index.positions(values)

    def plan_dtype(self, count: int) -> Any:
        """dtype of a plan of *count* windows: uint32 positions, else uint32/int64 window numbers."""
        if self.plan_holds_positions or count < (1 << 32):
            return np.uint32
        return np.int64


class Windows(PlannedItems):
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

    __slots__ = ()
    words = ItemWords(item="window", items="windows", kind="windows (sb.windows)", call="sb.windows(source, ...)",
                      empty="windows")  # fmt: skip
    _space: WindowSpace

    @staticmethod
    def _whole(space: WindowSpace) -> int:
        return space.index.window_count

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

    # -- what the next stages need -------------------------------------------------
    @property
    def space(self) -> WindowSpace:
        """The shared store, index and partition."""
        return self._space

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

    def plan_values(self) -> npt.NDArray[Any]:
        """This view's plan entries: first-token positions (or window numbers in 2**32+ token stores).

        A view of the plan when there is one; a fresh array for sequential order.
        """
        space = self._space
        if self._plan is not None:
            check_blocks(self._plan, self._lo, self._hi)  # a plan file's blocks: checked on first read
            return self._plan[self._lo : self._hi]
        dtype = space.plan_dtype(len(self))
        if space.plan_holds_positions:  # built in bounded blocks: no per-window temporary beyond the result
            return space.index.range_positions(self._lo, self._hi, dtype)
        return np.arange(self._lo, self._hi, dtype=dtype)

    def _entries(self) -> npt.NDArray[Any]:
        """This view's plan entries; read from a file, each is checked where it is used (a window here, else `DataError`).

        Plans computed in this process (`shuffle`) are not checked: they cannot be damaged, and the check costs
        about as much as gathering a short row.
        """
        assert self._plan is not None
        check_blocks(self._plan, self._lo, self._hi)  # a plan file's blocks: checked on first read
        values = self._plan[self._lo : self._hi]
        bad = self._space.index.first_invalid(values, self._space.plan_holds_positions) if from_file(self._plan) else -1
        if bad >= 0:
            where = short_path(self.plan_path) if self.plan_path else "the plan"
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

    def token_spans(self) -> list[tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """``[(store, starts, lengths)]``: the flat token spans this view reads (``T + 1`` tokens a window).

        What a remote store fetches before the view is gathered (`streambatch.io.remote.prefetch`).
        """
        starts = self.positions().astype(np.int64)
        return [(self.store, starts, np.full(starts.size, self.context_length + 1, dtype=np.int64))]

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

    def counted_targets(self) -> int:
        """The targets of these windows that count in a token mean (`counted_targets`): no token is read."""
        return counted_targets(self)

    def target_counts(self) -> IntArray:
        """Each window's counted targets (``T``, or its set mask bits): what ``skip_untrained`` filters on."""
        return window_item_targets(self._space, self.positions())

    def gather(self, index: int) -> MiniBatch:
        """Gather this view into a `MiniBatch` numbered *index*: the one-batch case of `gather_batches`."""
        return gather_one(self, index)

    def gather_batches(self, batch_size: int, batches: range, *, reader: BatchReader | None = None) -> Iterator[MiniBatch]:
        """Batches *batches* of these windows chunked by *batch_size*, a block of positions at a time, each fetched
        first from a remote store (`streambatch.items.road.fetched`; *reader*: a `streambatch.Batches`' own)."""
        return fetched(self, batch_size, batches, lambda todo: iter_window_batches(self, batch_size, todo), reader)

    def _picked(self, start: int, stop: int, step: int) -> npt.NDArray[Any]:
        if self._plan is not None:
            return self.plan_values()[start:stop:step]
        numbers = np.arange(self._lo + start, self._lo + stop, step, dtype=np.int64)
        space = self._space
        picked = space.index.positions(numbers) if space.plan_holds_positions else numbers
        return picked.astype(space.plan_dtype(numbers.size))

    def plan_key_fields(self) -> dict[str, Any]:
        """A plan file's key: the corpus, T, stride, partition, the windows and what its entries hold."""
        space, count = self._space, len(self)
        return {
            "corpus": space.store.content_fingerprint(),
            "context_length": space.config.context_length,
            "stride": space.config.stride,
            "partition": space.partition.value,
            "windows": count,
            "holds": "positions" if space.plan_holds_positions else "window_numbers",
            "dtype": np.dtype(space.plan_dtype(count)).newbyteorder("<").str,
        }

    def fill_plan(self, values: npt.NDArray[Any]) -> None:
        """Every window's plan entry in document order: its first token's position (or its number)."""
        if self._space.plan_holds_positions:
            self._space.index.all_positions(values.dtype, out=values)
        else:
            super().fill_plan(values)

    def plan_entries(self, block: npt.NDArray[np.integer], total: int) -> npt.NDArray[np.int64]:
        """Each entry's window number, -1 where it is no window start of this source and partition."""
        return self._space.index.entry_windows(block, self._space.plan_holds_positions)

    def __repr__(self) -> str:
        order = "sequential" if self._plan is None else f"seed={self.seed}"
        return (
            f"Windows({len(self)} windows, context_length={self.context_length}, stride={self.config.stride}, "
            f"{order}, partition={self.partition.value!r})"
        )


def counted_targets(view: Windows) -> int:
    """The counted targets of a view of windows: ``len * T``, or the set mask bits of their targets.

    >>> import streambatch as sb
    >>> counted_targets(sb.windows([sb.Document("a", "train", range(8))], context_length=3)[1:4])
    9
    """
    masked = view.store.has_loss_mask
    return window_targets(view.space, len(view), view.positions() if masked else None)


def window_targets(space: WindowSpace, count: int, positions: npt.NDArray[Any] | None = None) -> int:
    """Counted targets of *count* windows of *space*: ``count * T`` without a loss mask; with one, the set
    bits of the targets of the windows starting at *positions* (the mask bits alone: no token is read)."""
    if not space.store.has_loss_mask:
        return count * space.config.context_length
    if positions is None:
        raise ConfigError("the store has a loss mask: pass the windows' positions to count their trained targets")
    return int(window_item_targets(space, positions).sum())


def window_item_targets(space: WindowSpace, positions: npt.NDArray[Any]) -> IntArray:
    """The one counting rule of windows: the counted targets of each window of *space* starting at first-token
    *positions*, ``T`` each without a loss mask, else the set mask bits of its ``T`` targets (no token is read)."""
    first = positions.astype(np.int64) + 1  # a window's targets are the T tokens after its first
    return space.store.flat().counted_between(first, first + space.config.context_length)


def windows(
    source: Any,
    *,
    context_length: int,
    stride: int = 1,
    partition: Partition | str = Partition.TRAIN,
    keep_partition: bool = False,
    skip_untrained: bool = False,
) -> Windows:
    """Every complete window of *partition* in *source*, in document order.

    *source* is a `DocumentStore` (in memory or opened with `open_store`), a
    `Corpus` of several stores, what `open_source` returns, or an iterable of
    `Document`.  A document of another partition is refused (`PartitionError`)
    unless *keep_partition* skips it: `streambatch.model.source.partition_documents`.
    Holds a few integers per document and nothing per window.  With
    *skip_untrained* the windows with no counted target under the source's loss
    mask are dropped (a plan of the kept ones; ``windows.untrained`` counts
    them): `streambatch.items.untrained`.

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
    return drop_untrained(Windows(space)) if skip_untrained else Windows(space)
