"""Packed rows as items: `pack` gives `Rows`, which the ordering stages take as they take `Windows`.

`pack(source, context_length=T)` cuts every document of one partition into
pieces and packs them into rows of ``T`` positions (`streambatch.items.pack.pack`:
full pieces one per row, the rest best-fit decreasing, never split).  `Rows` is
the item sequence of that packing: sized, sliceable, integers only (row
numbers), backed by no per-row array in row order, or by one uint32 per row
in a shuffled order (``sb.shuffle(rows, seed)``: the chapter's SplitMix64
Fisher–Yates over row numbers, the same stage and code as for windows).
`sb.chunk`, `sb.share`, `sb.split_rows` and `sb.materialize` take it unchanged;
a chunk of rows materializes into a packed `streambatch.MiniBatch`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._checks import check_positive, is_integer
from ..._kernels import built, extension, legacy_switch
from ...batch.minibatch import MiniBatch, row_batch
from ...batch.span import spanning_tokens
from ...errors import ConfigError, DataError, OutOfRangeError
from ...io.keyed_file import check_blocks
from ...model.documents import Partition
from ...model.flat import Flat
from ...model.source import TokenSource, as_source, partition_documents
from ...order.protocol import ItemWords
from ..protocol import ITER_BLOCK, PlannedItems
from ..road import BatchReader, fetched, gather_one
from ..untrained import drop_untrained
from ..windows.window_index import IntArray, WindowConfig
from ._pack_gather import PackedArrays, batch_bytes, check_emittable, gather_segments
from .pack import PackedRows, PackReport, PieceIndex, pack_lengths
from .pack_file import ALGORITHM, packing_file
from .packed_batch import from_arrays, from_kernel, mask_pieces

legacy_switch(__name__, "GATHER_BACKEND", "packed_gather", "numpy")  # the old switch ("c" or "numpy"), one release


class RowSpace:
    """What every view of one packing shares: the source, the packed rows, the partition (and caches, never pickled)."""

    __slots__ = ("cache", "packing", "pad_id", "partition", "store", "untrained")

    def __init__(self, store: TokenSource, packing: PackedRows, partition: Partition, pad_id: int = 0) -> None:
        self.store = store
        self.packing = packing
        self.partition = partition
        self.pad_id = pad_id
        self.cache: dict[str, Any] = {}
        self.untrained: Any = None  # an UntrainedReport when skip_untrained dropped rows (streambatch.items.untrained)

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.store, self.packing, self.partition, self.pad_id, self.untrained)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.store, self.packing, self.partition, self.pad_id = state[:4]
        self.untrained = state[4] if len(state) > 4 else None
        self.cache = {}

    def item_numbers(self, positions: npt.NDArray[Any]) -> IntArray:
        """The row numbers of a batch's rows (its ``positions`` are row numbers)."""
        return positions.astype(np.int64, copy=False)

    def plan_positions(self, values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """What a gather reads for plan entries *values*: the row numbers themselves."""
        return values

    def plan_dtype(self, count: int) -> Any:
        """dtype of a plan of *count* rows: uint32 row numbers below 2**32 rows, else int64."""
        return np.uint32 if count < (1 << 32) else np.int64


class Rows(PlannedItems):
    """A random-access, sliceable sequence of packed rows (row numbers) of one source; see the module docstring.

    >>> import streambatch as sb
    >>> rows = sb.pack([sb.Document("a", "train", [0, 10, 11, 12, 1]), sb.Document("b", "train", [0, 20, 1])],
    ...                context_length=3)
    >>> len(rows), list(rows), rows.report.pad_positions
    (2, [0, 1], 0)
    """

    __slots__ = ()
    words = ItemWords(item="packed row", items="rows", kind="packed rows (sb.pack)",
                      call="sb.pack(source, context_length=T)", empty="rows (its partition has no target)")  # fmt: skip
    packed = True
    _space: RowSpace

    @staticmethod
    def _whole(space: RowSpace) -> int:
        return len(space.packing)

    @property
    def space(self) -> RowSpace:
        """The shared source, packing and partition."""
        return self._space

    @property
    def packing(self) -> PackedRows:
        """The packing: row numbers <-> segments (document, start, targets)."""
        return self._space.packing

    @property
    def window_index(self) -> Any:
        """Refused: packed rows are numbered by their packing, not by windows."""
        raise ConfigError("a packed epoch has no window index; use epoch.items.packing (the packing) instead")

    @property
    def report(self) -> PackReport:
        """What packing did: targets, rows, pad share, the window mode's coverage at stride ``T`` (under
        ``skip_untrained``: of the kept rows, with the dropped pieces counted)."""
        kept = self.untrained
        found: PackReport = self._space.packing.report if kept is None else kept.packing
        return found

    @property
    def context_length(self) -> int:
        """``T``: positions per row."""
        return self._space.packing.context_length

    @property
    def config(self) -> WindowConfig:
        """``T`` and the pieces' stride, ``T`` (consecutive pieces of a document share one token)."""
        T = self.context_length
        return WindowConfig(T, T)

    def plan_values(self) -> npt.NDArray[Any]:
        """This view's row numbers as plan entries (uint32, int64 beyond 2**32 rows): a view of the plan, or fresh."""
        if self._plan is not None:
            check_blocks(self._plan, self._lo, self._hi)  # a plan file's blocks: checked on first read
            return self._plan[self._lo : self._hi]
        return np.arange(self._lo, self._hi, dtype=self._space.plan_dtype(len(self._space.packing)))

    def numbers(self) -> IntArray:
        """Row number of each item of this view."""
        if self._plan is None:
            return np.arange(self._lo, self._hi, dtype=np.int64)
        check_blocks(self._plan, self._lo, self._hi)  # a plan file's blocks: checked on first read
        return self._plan[self._lo : self._hi].astype(np.int64)

    def token_spans(self) -> list[tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """``[(store, starts, lengths)]``: the flat token spans this view's pieces read (targets + 1 tokens each)."""
        return row_spans(self._space, self.numbers())

    def counted_targets(self) -> int:
        """The real targets of these rows (`counted_targets`): from the packing alone, no token is read."""
        return counted_targets(self)

    def target_counts(self) -> IntArray:
        """Each row's counted targets (`row_item_targets`): what ``skip_untrained`` filters on."""
        return row_item_targets(self._space, self.numbers())

    def gather(self, index: int) -> MiniBatch:
        """Gather this view into a packed `MiniBatch` numbered *index*: the one-batch case of `gather_batches`."""
        return gather_one(self, index)

    def gather_batches(self, batch_size: int, batches: range, *, reader: BatchReader | None = None) -> Iterator[MiniBatch]:
        """Batches *batches* of these rows chunked by *batch_size*, a block of row numbers at a time, each fetched
        first from a remote store (`streambatch.items.road.fetched`; *reader*: a `streambatch.Batches`' own)."""
        return fetched(self, batch_size, batches, lambda todo: iter_batches(self, batch_size, todo), reader)

    def _picked(self, start: int, stop: int, step: int) -> npt.NDArray[Any]:
        return self.numbers()[start:stop:step].astype(self._space.plan_dtype(len(self._space.packing)))

    def plan_key_fields(self) -> dict[str, Any]:
        """A plan file's key: the corpus, the mode and packing algorithm, T, partition, the rows and their entries."""
        count = len(self)
        return {
            "corpus": self.store.content_fingerprint(),
            "mode": "pack",
            "algorithm": ALGORITHM,
            "context_length": self.context_length,
            "partition": self.partition.value,
            "rows": count,
            "holds": "rows",
            "dtype": np.dtype(self._space.plan_dtype(count)).newbyteorder("<").str,
        }

    def __repr__(self) -> str:
        order = "row order" if self._plan is None else f"seed={self.seed}"
        return (
            f"Rows({len(self)} rows, context_length={self.context_length}, pad_share={self.report.pad_share:.4%}, "
            f"{order}, partition={self.partition.value!r})"
        )


def row_spans(space: RowSpace, numbers: IntArray) -> list[tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """The flat token spans of rows *numbers* of *space*: each piece's first token and ``targets + 1`` tokens."""
    seg = space.packing.segments(numbers)
    store: Any = space.store
    return [(store, store.starts[seg.documents] + seg.starts, seg.lengths + 1)]


def counted_targets(view: Rows) -> int:
    """The counted targets of a view of packed rows: their real targets (padding never counts).

    >>> import streambatch as sb
    >>> rows = sb.pack([sb.Document("a", "train", range(5)), sb.Document("b", "train", range(3))], context_length=3)
    >>> counted_targets(rows), counted_targets(rows[1:])
    (6, 3)
    """
    return row_targets(view.space, view.numbers())


def row_targets(space: RowSpace, numbers: npt.ArrayLike) -> int:
    """Counted targets of rows *numbers* of *space*: their pieces' targets (from the packing's lengths), or,
    with a loss mask, the set mask bits of those targets (the mask bits alone: no token is read)."""
    if not space.store.has_loss_mask:
        return int(space.packing.segments(numbers).lengths.sum())
    return int(row_item_targets(space, numbers).sum())


def row_item_targets(space: RowSpace, numbers: npt.ArrayLike) -> IntArray:
    """The one counting rule of packed rows: the counted targets of each of rows *numbers* of *space*, its pieces'
    targets, or under a loss mask the set mask bits of those targets (no token is read; padding never counts)."""
    seg = space.packing.segments(numbers)
    flat = space.store.flat()
    first = flat.starts[seg.documents] + seg.starts + 1  # each piece's first target, in the flat token space
    counted = np.concatenate([[0], np.cumsum(flat.counted_between(first, first + seg.lengths))])
    found: IntArray = counted[seg.offsets[1:]] - counted[seg.offsets[:-1]]
    return found


def emit(space: RowSpace, numbers: IntArray, index: int) -> MiniBatch:
    """Batch *index* of rows *numbers* (int64): the C gather when built and the source is one store, else numpy.

    The one rule of how a packed batch is made (`Rows.gather`, a packed mixture's source blocks;
    `iter_batches` takes its C path inline, with the same batch): rows that do not belong to the
    packing are a `DataError` on both backends.
    """
    gatherer = packed_gatherer(space)
    try:
        if gatherer is False:
            try:
                arrays = gather_rows(space, numbers)
            except OutOfRangeError as err:  # the same refusal as the C gather's
                raise _refused(err) from None
            return mask_pieces(from_arrays(index, arrays, numbers, space), (space.store,))
        if masked_after(space):  # a mask the kernel does not read: every column now, then the mask ANDed in
            try:
                outputs = gatherer.gather(numbers)
            except ValueError as err:
                raise _refused(err) from None
            return mask_pieces(from_kernel(index, outputs, numbers, space), (space.store,))
        try:
            outputs = gatherer.gather_tokens(numbers)
        except ValueError as err:
            raise _refused(err) from None
        return from_kernel(index, outputs, numbers, space, build=packed_columns)
    except MemoryError:
        T, dtype = space.packing.context_length, space.store.dtype
        need = batch_bytes(numbers.size, T, dtype)
        raise ConfigError(
            f"out of memory gathering a packed batch of {numbers.size} rows of T={T} (its arrays alone take "
            f"{need} bytes, {need / 2**30:.1f} GiB); pass a smaller T or batch_size"
        ) from None


def packed_gatherer(space: RowSpace, *, made: bool = False) -> Any:
    """The C gatherer of *space*, built once and cached on it; False where numpy gathers (the ``packed_gather``
    kernel switched to ``"python"``, or a source the kernel does not read).  *made*: for a batch the C gatherer
    made (its columns on demand), whatever the switch says now."""
    kernel = built("packed_gather") if made else extension("packed_gather")
    if kernel is None:
        return False
    gatherer = space.cache.get("gather")
    if gatherer is None:
        gatherer = space.cache["gather"] = _gatherer(space, kernel)
    return gatherer


def packed_columns(batch: MiniBatch) -> dict[str, Any]:
    """The segment and position ids and the loss mask of a packed *batch* gathered by ``gather_tokens``: the same
    kernel's pass 5 over the batch's rows (no token read), for one source or a mixture's (``batch.sources``)."""
    gatherers = tuple(packed_gatherer(space, made=True) for space in batch.spaces)
    numbers = np.ascontiguousarray(batch.positions, dtype=np.int64)
    if batch.sources is None:
        outputs = gatherers[0].columns(numbers)
    else:
        outputs = gatherers[0].columns(numbers, np.ascontiguousarray(batch.sources, dtype=np.uint8), gatherers)
    return {"segment_ids": outputs[2], "position_ids": outputs[3], "loss_mask": outputs[4]}


def _refused(err: Exception) -> DataError:
    return DataError(f"{err}; the rows do not belong to this packing (remove the plan file and plan again)")


_BLOCK_ROWS = 2048  # consecutive batches whose row numbers are read (and cast to int64) at once


def iter_batches(rows: Rows, batch_size: int, batches: range) -> Iterator[MiniBatch]:
    """Emit batches *batches* of *rows* chunked by *batch_size*: row numbers read a block of batches at a time.

    The per-batch work is the gather and the batch object: one call of the C gather's token pass and
    `row_batch` where `emit` would take that path (the same batch), else `emit`; a refused or too large batch
    goes through `emit`, which names the error.
    """
    space, total = rows.space, len(rows)
    check_emittable(min(batch_size, total), space.packing.context_length, space.store.dtype, batch_size=batch_size)
    per = max(1, _BLOCK_ROWS // batch_size) if batches.step == 1 else 1
    gatherer, spaces = packed_gatherer(space), (space,)
    # emit's C path with its decisions made once: the kernel's token pass, the batch made by row_batch
    tokens = None if gatherer is False or masked_after(space) else gatherer.gather_tokens
    for head in range(0, len(batches), per):
        group = batches[head : head + per]
        base = group[0] * batch_size
        numbers = rows[base : min((group[-1] + 1) * batch_size, total)].numbers()
        for at, batch in zip(range(0, len(group) * batch_size, batch_size), group, strict=True):
            here = numbers[at : at + batch_size]
            if tokens is None:
                yield emit(space, here, batch)
                continue
            try:  # the next batch's rows ride along: the kernel asks for their look-ups as this copy goes
                made = tokens(here, numbers[at + batch_size : at + 2 * batch_size])
                inputs, targets, _, _, _, cu_seqlens, segments, count, longest = made
            except (ValueError, MemoryError):  # refused, or too large: emit words the error
                yield emit(space, here, batch)
                continue
            yield row_batch(batch, inputs, targets, here, spaces, count, packed_columns, (cu_seqlens, longest, segments))


def _gatherer(space: RowSpace, kernel: Any) -> Any:
    """The C gatherer of *space* (views of its tokens and packing; *kernel*: the extension), or False where numpy
    gathers.

    A `Corpus` is read through one view spanning its shards (`streambatch.batch.span`), with each
    document's start moved into it; shards of mixed dtypes are gathered by numpy.
    """
    flat, rows = space.store.flat(), space.packing
    if rows.context_length >= 1 << 31:
        return False
    tokens, starts = flat.tokens[0], flat.starts
    if not flat.single:
        found = spanning_tokens(flat.tokens, flat.bases)
        if found is None:
            return False
        tokens, shift = found
        starts = flat.starts + shift[flat.shard_of(np.arange(flat.starts.size))]
    full_docs, full_ends = rows.index.full_pieces()
    args = (tokens, starts, rows.index.lengths, full_docs, full_ends, rows.offsets, rows.tails)  # the partition's lengths
    bits = kernel_bits(flat)
    gatherer = kernel.Gatherer(*(np.ascontiguousarray(a) for a in args), rows.context_length, rows.full_rows, space.pad_id, bits)
    if bits is not None:  # a masked store: every row's count once, in row order; a batch's count is then a sum
        gatherer.use_row_counts(row_counts(gatherer, len(rows)))
    return gatherer


def row_counts(gatherer: Any, rows: int) -> npt.NDArray[np.uint32]:
    """Every row's counted targets, in row order (uint32): the C *gatherer*'s passes 0-2 and each segment's set
    mask bits, over *rows* rows, a block of row numbers at a time.  Made once per packing: the bits are then read
    in order, one pass, where each batch would read a few lines of them from a random place per segment (masked
    emission 0.90-0.92x the unmasked one that way, 0.99x with the table: scripts/bench_mask.py)."""
    table = np.empty(rows, dtype=np.uint32)
    for lo in range(0, rows, ITER_BLOCK):
        hi = min(rows, lo + ITER_BLOCK)
        table[lo:hi] = gatherer.row_counts(np.arange(lo, hi, dtype=np.int64))
    return table


def kernel_bits(flat: Flat) -> Any:
    """The loss-mask bits the C gatherer reads for a source's *flat* space (one shard's), or None: no mask, or
    several shards (their bits are ANDed in afterwards by `mask_pieces`)."""
    bits = flat.bits[0] if flat.single else None
    return None if bits is None else np.ascontiguousarray(bits, dtype=np.uint8)


def masked_after(space: RowSpace) -> bool:
    """Whether *space*'s batches need `mask_pieces` after the gather: a mask the C gatherer did not read."""
    flat = space.store.flat()
    if not flat.has_loss_mask:
        return False
    return packed_gatherer(space) is False or kernel_bits(flat) is None


def gather_rows(space: RowSpace, numbers: IntArray) -> PackedArrays:
    """Tokens, ids, masks and provenance of rows *numbers* of *space* (any order, repeats allowed)."""
    seg = space.packing.segments(numbers)
    flat = space.store.flat()
    return gather_segments(
        flat,
        flat.starts,
        seg.offsets,
        seg.documents,
        seg.starts,
        seg.lengths,
        space.packing.context_length,
        pad_id=space.pad_id,
    )


def pack(
    source: Any,
    *,
    context_length: int,
    partition: Partition | str = Partition.TRAIN,
    keep_partition: bool = False,
    pad_id: int = 0,
    plan_dir: str | os.PathLike[str] | None = None,
    skip_untrained: bool = False,
) -> Rows:
    """Every target of *partition* in *source*, in pieces packed into rows of ``T`` positions, in row order.

    *source* is what `sb.windows` takes; a document of another partition is
    refused unless *keep_partition* skips it (the one partition rule).  Full
    pieces (``T + 1`` tokens) fill a row each, in document order; the other
    pieces follow, packed best-fit decreasing; one-token documents are counted
    in ``rows.report.skipped_pieces`` and skipped.  Padding positions of a
    materialized batch hold *pad_id* (inputs and targets) with ``loss_mask``
    False.  Holds a few integers per document and per packed row, nothing per
    token; deterministic for a given corpus and ``T``.  With *plan_dir* the
    packing is computed once into a packing file there and memory-mapped by
    every later call, in any process (`streambatch.items.pack.pack_file`).
    With *skip_untrained* the pieces with no counted target under the source's
    loss mask are dropped before packing (``rows.untrained`` counts them, and
    ``rows.report`` is the kept rows'): `streambatch.items.untrained`.

    >>> import streambatch as sb
    >>> rows = sb.pack([sb.Document("a", "train", [0, 10, 11, 12, 1]), sb.Document("b", "train", [0, 20, 1])],
    ...                context_length=3)
    >>> batch = next(iter(sb.materialize(sb.chunk(rows, 2))))
    >>> batch.inputs.tolist(), batch.segment_ids.tolist(), batch.target_count
    ([[0, 10, 11], [0, 20, 12]], [[0, 0, 0], [0, 0, 1]], 6)
    """
    store = as_source(source)
    chosen = Partition.parse(partition, "pack")
    include = partition_documents(store, chosen, keep_partition=keep_partition)
    top = int(np.iinfo(store.dtype).max)
    if not is_integer(pad_id) or not 0 <= int(pad_id) <= top:
        raise ConfigError(f"pad_id={pad_id!r} does not fit the source's {store.dtype}; pass a token id in [0, {top}]")
    T = check_positive(context_length, "context_length", "the positions of one row (T)")
    check_emittable(1, T, store.dtype, memory=False)  # a row of 2**31 positions can never be emitted
    drop = untrained_tails(store, PieceIndex(store.lengths, T, include)) if skip_untrained else None
    if plan_dir is None:
        packed = pack_lengths(store.lengths, context_length, include=include, drop_tails=drop)
    else:
        packed = packing_file(store, context_length, chosen.value, include, plan_dir, drop)
    rows = Rows(RowSpace(store, packed, chosen, int(pad_id)))
    if drop is None:
        return rows
    return drop_untrained(rows, tails=drop, packing=lambda kept: kept_report(packed, kept))


def untrained_tails(store: TokenSource, index: PieceIndex) -> IntArray:
    """The documents (of *index*) whose tail piece has no counted target under *store*'s loss mask (none without one).

    >>> import streambatch as sb
    >>> store = sb.DocumentStore.from_arrays(range(10), [0, 4, 10], loss_mask=[0, 0, 1, 0, 0, 0, 0, 0, 0, 1])
    >>> untrained_tails(store, PieceIndex(store.lengths, 2)).tolist()
    [0]
    """
    sizes = index.tail_sizes()
    documents = np.flatnonzero(sizes)
    flat = store.flat()
    if not flat.has_loss_mask or not documents.size:
        return np.zeros(0, dtype=np.int64)
    last = flat.starts[documents].astype(np.int64) + index.lengths[documents]  # each tail ends its document
    dropped: IntArray = documents[flat.counted_between(last - sizes[documents], last) == 0].astype(np.int64)
    return dropped


def kept_report(packing: PackedRows, kept: npt.NDArray[Any]) -> PackReport:
    """The `PackReport` of the rows *kept* (row numbers) of *packing*: its full rows not kept are dropped pieces."""
    report, T = packing.report, packing.context_length
    full = int(np.count_nonzero(np.asarray(kept) < report.full_rows))
    gone = report.full_rows - full
    return replace(
        report, full_rows=full, targets=report.targets - gone * T, pieces=report.pieces - gone, window_targets=full * T,
        dropped_pieces=report.dropped_pieces + gone,
    )  # fmt: skip
