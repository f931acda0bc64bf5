"""The batch: one ``[width, T]`` stack of rows, the one class every item kind gathers into.

`streambatch.materialize` makes them; the trainer and the reducer consume them.  A window is a one-segment row with
no padding, so windows, packed rows, mixtures and packed mixtures all give a `MiniBatch`:

- ``inputs`` and ``targets``: C-contiguous ``(w, T)`` arrays in the store's token dtype.
- optional columns, None where they do not apply (a window batch allocates none of the packed ones): ``loss_mask``
  (True at the targets that train: packed rows always, a window batch when its store has a loss mask), and for
  packed rows (`streambatch.items.pack.gather`) ``segment_ids``, ``position_ids``, ``cu_seqlens`` (+ ``max_seqlen``);
  ``sources`` (one source id per row) for a mixture.
- provenance: one columnar table per *segment* (`Segments`: row, source, document, start, length); a window's row
  is one segment of ``T`` targets.  A batch of windows resolves it from ``positions`` on first use.
- ``token_count``: the targets that count (``width * T`` for windows of an unmasked store, else ``loss_mask.sum()``).

``positions[r]`` is row *r*'s item locator within its source: a window's first-token position, a packed row's row
number.  ``spaces[s]`` is source *s*'s item space (``space`` is source 0's).  ``(epoch, index)`` is the batch's
place in a run (`streambatch.Run`); a batch of a lone `Epoch` has ``epoch`` 0.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import AccumulationError, ConfigError, RowIndexError
from ..model.documents import PARTITIONS, Partition
from .reduce import TokenContribution, TokenMean, token_mean

IntArray = npt.NDArray[np.int64]
SourceArray = npt.NDArray[np.uint8]

__all__ = ["MiniBatch", "SegmentProvenance", "Segments", "WindowProvenance", "present", "row_batch"]


def present(values: npt.NDArray[Any]) -> list[int]:
    """The distinct values of small non-negative ints (source ids, epochs, shards), sorted: one bincount, no sort.

    >>> present(np.array([3, 1, 3], dtype=np.uint8))
    [1, 3]
    """
    if not values.size:
        return []
    low = int(values.min())
    found: list[int] = (np.flatnonzero(np.bincount(values - low if low else values)) + low).tolist()
    return found


@dataclass(frozen=True)
class WindowProvenance:
    """Where one window row came from (*shard*: the store of a `streambatch.Corpus`; 0 for a store)."""

    document_id: str
    document_index: int
    start: int
    partition: Partition
    shard: int = 0

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}"


@dataclass(frozen=True)
class SegmentProvenance(WindowProvenance):
    """Where one segment of a packed batch came from: a piece of *length* targets from *start*, in batch *row*."""

    length: int = 0
    row: int = 0

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}+{self.length}"


class Segments(NamedTuple):
    """The provenance table, one entry per segment (int64 columns; row by row, a row's segments in order)."""

    row: IntArray
    source: IntArray
    document: IntArray
    start: IntArray
    length: IntArray


class MiniBatch:
    """One row-major ``[width, T]`` stack of rows (see the module docstring).

    One constructor for every item kind: the window gather passes the five
    positional arguments, packed rows add their columns and their provenance
    (``segments``: int64 ``(4, n)`` rows of row, document, start, targets), a
    mixture adds ``sources`` and ``names``.
    """

    __slots__ = ("__dict__", "_segments", "epoch", "index", "inputs", "positions", "spaces", "target_count", "targets")

    # the optional columns: None unless given (a batch of windows sets none of them, so its hot path stores none);
    # loss_mask, segment_ids and position_ids may instead be built on first use (see `_column`)
    sources: SourceArray | None = None  # a mixture's: each row's source
    names: tuple[str, ...] | None = None  # a mixture's: the sources' names
    cu_seqlens: npt.NDArray[np.int32] | None = None  # packed: int32 varlen boundaries over the flattened w * T positions
    max_seqlen: int | None = None  # packed: the longest sequence of cu_seqlens
    _global_count: int | None = None  # a rank's share: the whole batch's counted targets (see global_token_count)

    def __init__(
        self,
        index: int,
        inputs: npt.NDArray[Any],
        targets: npt.NDArray[Any],
        positions: npt.NDArray[Any],
        space: Any,
        epoch: int = 0,
        *,
        sources: SourceArray | None = None,
        names: tuple[str, ...] | None = None,
        loss_mask: npt.NDArray[np.bool_] | None = None,
        segment_ids: npt.NDArray[Any] | None = None,
        position_ids: npt.NDArray[Any] | None = None,
        cu_seqlens: npt.NDArray[np.int32] | None = None,
        max_seqlen: int | None = None,
        segments: npt.NDArray[np.int64] | None = None,
        target_count: int | None = None,
        build: Callable[[MiniBatch], dict[str, Any]] | None = None,
    ) -> None:
        self.epoch, self.index = epoch, index
        self.inputs, self.targets, self.positions = inputs, targets, positions
        self.spaces: tuple[Any, ...] = space if type(space) is tuple else (space,)  # one item space per source
        self._segments = segments  # int64 (4, n): row, document, start, length; None: one window per row, resolved on use
        if target_count is None:  # the gathers pass it; else every target, or the mask's
            target_count = targets.size if loss_mask is None else int(np.count_nonzero(loss_mask))
        self.target_count = target_count
        if sources is None and loss_mask is None and segment_ids is None and cu_seqlens is None and build is None:
            return  # a batch of windows: no instance dict is made
        columns = self.__dict__
        if sources is not None:
            self.sources, self.names = sources, names
        if loss_mask is not None:
            columns["_loss_mask"] = loss_mask
        if segment_ids is not None:
            columns["_segment_ids"], columns["_position_ids"] = segment_ids, position_ids
        if cu_seqlens is not None:
            self.cu_seqlens, self.max_seqlen = cu_seqlens, max_seqlen
        if build is not None:
            columns["_build"] = build

    def in_epoch(self, epoch: int) -> MiniBatch:
        """This batch placed in epoch *epoch* of a run: a new `MiniBatch` sharing the same arrays (and columns)."""
        twin = copy.copy(self)
        twin.epoch = epoch
        return twin

    # -- the columns built on demand ---------------------------------------------------
    def _column(self, name: str) -> Any:
        """Column *name* (``_loss_mask``, ``_segment_ids``, ``_position_ids``): given, built now, or None.

        The gathers that count the targets in place (packed rows; windows of a
        store with a loss mask) leave these columns to a *build* function (a
        module-level function, so the batch pickles) of the batch, run once on
        the first use of any of them: emission writes only the tokens.
        """
        columns = self.__dict__
        if name in columns:
            return columns[name]
        build = columns.pop("_build", None)
        if build is None:
            return None
        for key, value in build(self).items():
            columns.setdefault("_" + key, value)
        return columns.get(name)

    @property
    def loss_mask(self) -> npt.NDArray[np.bool_] | None:
        """``(w, T)`` bool: True at counted targets (packed: False at padding); None when every target counts."""
        found: npt.NDArray[np.bool_] | None = self._column("_loss_mask")
        return found

    @loss_mask.setter
    def loss_mask(self, mask: npt.NDArray[np.bool_] | None) -> None:  # and target_count recounted: never apart
        found = None if mask is None else np.asarray(mask, dtype=np.bool_)
        if found is not None and found.shape != self.targets.shape:
            raise ConfigError(f"loss_mask of shape {found.shape} for targets of {self.targets.shape}; pass one per target")
        self._column("_loss_mask")  # any pending build runs first: its columns belong together
        self.__dict__["_loss_mask"] = found
        self.target_count = int(self.targets.size if found is None else np.count_nonzero(found))

    @property
    def segment_ids(self) -> npt.NDArray[Any] | None:
        """Packed rows' ``(w, T)`` ids: 0, 1, ... by segment within each row; -1 at padding (None for windows)."""
        found: npt.NDArray[Any] | None = self._column("_segment_ids")
        return found

    @property
    def position_ids(self) -> npt.NDArray[Any] | None:
        """Packed rows' ``(w, T)`` positions: 0 at each segment's (and the padding's) first position, +1 along."""
        found: npt.NDArray[Any] | None = self._column("_position_ids")
        return found

    # -- what the batch is -------------------------------------------------------------
    @property
    def space(self) -> Any:
        """Source 0's item space (the only one unless the batch is a mixture's)."""
        return self.spaces[0]

    @property
    def plain(self) -> bool:
        """True for a batch of windows and nothing more: no mask, sources, packed columns or rank share (nothing
        beyond the five arrays and the counts: the wrappers' fast path)."""
        return not self.__dict__

    @property
    def packed(self) -> bool:
        """True for packed rows (the batch carries ``cu_seqlens``, the segment columns and ``loss_mask``)."""
        return self.cu_seqlens is not None

    @property
    def width(self) -> int:
        """Rows actually present (never the requested capacity)."""
        return int(self.inputs.shape[0])

    @property
    def context_length(self) -> int:
        """``T``: input and target length of every row."""
        return int(self.inputs.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        """``(width, T)``."""
        return (self.width, self.context_length)

    @property
    def token_count(self) -> int:
        """The targets that count, the token-mean denominator: ``width * T``, or ``loss_mask.sum()``."""
        return self.target_count

    @property
    def global_token_count(self) -> int:
        """Counted targets of the whole batch over every data-parallel rank: the token mean's global denominator.

        On a rank's share (``sb.split_rows``, ``rank=``/``world_size=``) it comes
        from the plan, the same on every rank, a rank with no rows included; on a
        whole batch it is `token_count`.
        """
        return self.target_count if self._global_count is None else self._global_count

    @global_token_count.setter
    def global_token_count(self, count: int) -> None:
        self._global_count = int(count)

    @property
    def pad_count(self) -> int:
        """Positions that do not count: ``width * T - token_count`` (padding and masked targets; 0 for plain windows)."""
        return int(self.targets.size) - self.target_count

    @property
    def sequence_is_pad(self) -> npt.NDArray[np.bool_] | None:
        """Per sequence of `cu_seqlens`: True for a row's padding (None without ``cu_seqlens``)."""
        if self.segment_ids is None or self.cu_seqlens is None:
            return None
        pad: npt.NDArray[np.bool_] = self.segment_ids.reshape(-1)[self.cu_seqlens[:-1]] < 0  # masked targets are not pad
        return pad

    # -- provenance: one table per segment ---------------------------------------------
    def _table(self) -> npt.NDArray[np.int64]:
        """The int64 ``(4, n)`` rows of row, document, start, length; a batch of windows resolves it once."""
        if self._segments is None:
            documents = np.zeros(self.width, dtype=np.int64)
            starts = np.zeros(self.width, dtype=np.int64)
            for s, chosen in self._by_source(self.sources):
                documents[chosen], starts[chosen] = self.spaces[s].locate_positions(self.positions[chosen])
            rows = np.arange(self.width, dtype=np.int64)
            self._segments = np.stack([rows, documents, starts, np.full(self.width, self.context_length, np.int64)])
        return self._segments

    def _by_source(self, sources: npt.NDArray[Any] | None) -> list[tuple[int, Any]]:
        """``(source, selection)`` pairs: every entry at once without sources, else each source's entries."""
        if sources is None:
            return [(0, slice(None))]
        return [(s, sources == s) for s in present(sources)]

    def _per_source(self, value: Callable[[Any, IntArray], Any], dtype: Any) -> npt.NDArray[Any]:
        """*value*(source's store, documents) of each segment, computed per source: the one "per source" rule."""
        documents = self.document_indices
        out = np.zeros(documents.size, dtype=dtype)
        sources = None if self.sources is None else self.segment_sources
        for s, chosen in self._by_source(sources):
            out[chosen] = value(self.spaces[s].store, documents[chosen])
        return out

    @property
    def segments(self) -> Segments:
        """The provenance table: per segment its row, source, document, start and length (targets)."""
        table = self._table()
        return Segments(table[0], self.segment_sources.astype(np.int64), table[1], table[2], table[3])

    @property
    def segment_rows(self) -> IntArray:
        """Per segment: its row in this batch."""
        found: IntArray = self._table()[0]
        return found

    @property
    def segment_lengths(self) -> IntArray:
        """Per segment: its targets (positions occupied; ``T`` for a window)."""
        found: IntArray = self._table()[3]
        return found

    @property
    def segment_sources(self) -> SourceArray:
        """Per segment: its row's source (all 0 outside a mixture)."""
        if self.sources is None:
            return np.zeros(self._table().shape[1], dtype=np.uint8)
        found: SourceArray = self.sources[self.segment_rows]
        return found

    @property
    def document_indices(self) -> IntArray:
        """Per segment: its document's index within its source (windows: per row)."""
        found: IntArray = self._table()[1]
        return found

    @property
    def starts(self) -> IntArray:
        """Per segment: where it starts in its document."""
        found: IntArray = self._table()[2]
        return found

    @property
    def shards(self) -> IntArray:
        """Per segment: the store of its source's `streambatch.Corpus` it came from (0 for one store)."""
        found: IntArray = self._per_source(lambda store, docs: store.shard_of(docs), np.int64)
        return found

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Partition of each segment."""
        codes = self._per_source(lambda store, docs: store.partition_codes[docs], np.uint8)
        return tuple(PARTITIONS[c] for c in codes.tolist())

    @property
    def partition(self) -> Partition | None:
        """The partition of every row (None for an empty batch)."""
        parts = set(self.partitions)
        return parts.pop() if len(parts) == 1 else None

    @property
    def document_ids(self) -> list[str]:
        """Document id of each segment (within its source)."""
        spaces = self.spaces
        pairs = zip(self.segment_sources.tolist(), self.document_indices.tolist(), strict=True)
        return [spaces[s].store.ids[d] for s, d in pairs]

    @property
    def source_names(self) -> list[str] | None:
        """The name of each row's source (None outside a mixture)."""
        if self.sources is None or self.names is None:
            return None
        return [self.names[s] for s in self.sources.tolist()]

    @property
    def item_numbers(self) -> IntArray:
        """Each row's item number within its source: a window number, or a packed row number."""
        out = np.zeros(self.width, dtype=np.int64)
        for s, chosen in self._by_source(self.sources):
            out[chosen] = self.spaces[s].item_numbers(self.positions[chosen])
        return out

    @property
    def window_numbers(self) -> IntArray:
        """Global window number of each row, within its source (a packed batch's items are rows: `row_numbers`)."""
        if self.packed:
            raise ConfigError("a packed batch's rows are packed rows, not windows; use batch.row_numbers (or item_numbers)")
        return self.item_numbers

    @property
    def row_numbers(self) -> IntArray:
        """A packed batch's rows: each row's number in its source's packing (a batch of windows: `window_numbers`)."""
        if not self.packed:
            raise ConfigError("a batch of windows has window numbers, not packed rows; use batch.window_numbers")
        return self.item_numbers

    @property
    def provenance(self) -> tuple[WindowProvenance, ...]:
        """Per segment, row by row: document id, index, start, partition, shard (packed: and length, row)."""
        columns = (self.document_ids, self.document_indices.tolist(), self.starts.tolist(), self.partitions)
        shards = self.shards.tolist()
        if not self.packed:
            rows = zip(*columns, shards, strict=True)
            return tuple(WindowProvenance(i, d, s, p, k) for i, d, s, p, k in rows)
        rest = (shards, self.segment_lengths.tolist(), self.segment_rows.tolist())
        return tuple(SegmentProvenance(*fields) for fields in zip(*columns, *rest, strict=True))

    # -- rows and the token mean --------------------------------------------------------
    def _row(self, buffer: npt.NDArray[Any], row: int) -> npt.NDArray[Any]:
        if not isinstance(row, (int, np.integer)) or not 0 <= row < self.width:
            raise RowIndexError(f"row={row!r} is out of range for a batch of width {self.width}; use 0 <= row < width")
        row_view: npt.NDArray[Any] = buffer[row]
        return row_view

    def input_row(self, row: int) -> npt.NDArray[Any]:
        """Input ids of *row*; raises `RowIndexError` (an IndexError) when out of range."""
        return self._row(self.inputs, row)

    def target_row(self, row: int) -> npt.NDArray[Any]:
        """Target ids of *row*; raises `RowIndexError` (an IndexError) when out of range."""
        return self._row(self.targets, row)

    def average_token_contributions(self, contributions: Sequence[TokenContribution]) -> TokenMean:
        """Token mean of exactly one contribution per counted target, row-major (over ``loss_mask`` when there is one)."""
        items = list(contributions)
        if len(items) != self.token_count:
            what = (
                f"a packed batch of {self.token_count} real targets (shape {list(self.shape)}, {self.pad_count} padding); "
                "pass exactly one per real target"
                if self.packed
                else f"a batch of {self.token_count} target tokens (shape {list(self.shape)}); pass exactly one per target token"
            )
            raise AccumulationError(f"got {len(items)} contributions for {what}")
        return token_mean(items)

    def _columns(self) -> tuple[Any, ...]:
        optional = (self.loss_mask, self.segment_ids, self.position_ids, self.cu_seqlens, self.sources)
        return (self.inputs, self.targets, *optional, self.max_seqlen, self.target_count)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MiniBatch):
            return NotImplemented
        return (
            self.epoch == other.epoch
            and self.index == other.index
            and all(_same(a, b) for a, b in zip(self._columns(), other._columns(), strict=True))
            and np.array_equal(self._table(), other._table())
            and (not self.packed or np.array_equal(self.positions, other.positions))
            and self.partitions == other.partitions
            and self.document_ids == other.document_ids
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        epoch = f"epoch={self.epoch}, " if self.epoch else ""
        packed = f", target_count={self.target_count}" if self.packed else ""
        per = None if self.sources is None else np.bincount(self.sources, minlength=len(self.spaces)).tolist()
        mixed = "" if per is None else f", rows per source={per}"
        return f"MiniBatch({epoch}index={self.index}, shape={self.shape}{packed}{mixed})"


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


_ALIASES = ("MixtureBatch", "PackedBatch", "PackedMixtureBatch")  # the 0.3 batch classes: one class since 0.4


def __getattr__(name: str) -> Any:
    if name in _ALIASES:
        warnings.warn(f"{name} is deprecated: every batch is a streambatch.MiniBatch", DeprecationWarning, stacklevel=2)
        return MiniBatch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_new = object.__new__


def row_batch(
    index: int,
    inputs: npt.NDArray[Any],
    targets: npt.NDArray[Any],
    positions: npt.NDArray[Any],
    spaces: tuple[Any, ...],
    count: int,
    build: Callable[[MiniBatch], dict[str, Any]] | None = None,
    packed: tuple[npt.NDArray[np.int32], int, npt.NDArray[np.int64]] | None = None,
) -> MiniBatch:
    """``MiniBatch(index, inputs, targets, positions, spaces[0], target_count=count, build=build)`` (and with
    *packed*, ``(cu_seqlens, max_seqlen, segments)``, those three keywords too), made without the keyword handling
    of `MiniBatch.__init__` (0.4-1 us of the 1-2 us a batch object costs): the gathers' hot path, one batch per
    ~20 us of copying.  *spaces* is the one-source tuple, made once per iteration; the result is the batch the
    constructor makes (tests/read/test_columns_on_demand.py)."""
    batch: MiniBatch = _new(MiniBatch)
    batch.epoch = 0
    batch.index = index
    batch.inputs = inputs
    batch.targets = targets
    batch.positions = positions
    batch.spaces = spaces
    batch._segments = None
    batch.target_count = count
    if build is not None:
        batch.__dict__["_build"] = build
    if packed is not None:
        batch.cu_seqlens, batch.max_seqlen, batch._segments = packed
    return batch
