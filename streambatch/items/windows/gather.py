"""The window row gathers: copy whole ``T``-token records of one store (`StoreGather`) or of a corpus's shards (`ShardedGather`).

One vectorized gather per buffer from a read-only view of the flat tokens as
overlapping ``T``-token records, giving C-contiguous ``inputs[w, T]`` and
``targets[w, T]`` in the store's dtype.  `window_gather` caches the space's gather.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..._kernels import cache_key, extension, legacy_switch
from ...batch.minibatch import MiniBatch, row_batch
from ...batch.span import spanning_tokens
from ...errors import DataError
from ...model.flat import Flat
from ...model.mask import BitArray, count_reader, target_mask, target_reader

legacy_switch(__name__, "WINDOW_BACKEND", "window_gather", "numpy")  # the old switch ("c" or "numpy"), one release

_OUTSIDE = (
    "a row starts at a position outside the store's {size} tokens; "
    "the plan does not belong to this store (remove the plan file and plan again)"
)


def c_window_gather(tokens: npt.NDArray[Any], length: int, bits: npt.NDArray[np.uint8] | None = None) -> Any:
    """The C window gatherer of *tokens* for context length *length*, or None (not built or switched off: the
    ``window_gather`` kernel; another dtype; no window); with *bits* (the store's loss mask) its ``gather_counted``
    also counts the rows' trained targets."""
    kernel = extension("window_gather")
    if kernel is None or tokens.dtype not in (np.uint16, np.uint32) or tokens.size < length + 1:
        return None
    if not tokens.flags.c_contiguous:
        return None
    if bits is not None and (bits.dtype != np.uint8 or not bits.flags.c_contiguous or bits.size * 8 < tokens.size):
        bits = None
    return kernel.WindowGatherer(tokens, length) if bits is None else kernel.WindowGatherer(tokens, length, bits)


class StoreGather:
    """Gathers rows of one store for one context length into final ``(w, T)`` arrays.

    Each buffer is one vectorized copy: the flat tokens are viewed (read-only, no
    copy) as overlapping ``T``-token records, one per token position, and the
    rows' positions select whole records, so each row is a single block copy
    straight into the final C-contiguous array.  ``kernel`` is the C
    `WindowGatherer` doing that copy (None where numpy does it).

    >>> inputs, targets = StoreGather(np.array([0, 10, 11, 12, 1], np.uint16), context_length=2)(np.array([2, 0]))
    >>> inputs.tolist(), targets.tolist()
    ([[11, 12], [0, 10]], [[12, 1], [10, 11]])
    """

    __slots__ = ("_bits", "_dtype", "_empty", "_length", "_records", "_shifted", "counted", "kernel")

    def __init__(self, tokens: npt.NDArray[Any], context_length: int, bits: BitArray | None = None) -> None:
        self._length = length = context_length
        self._dtype = tokens.dtype
        self._empty = np.zeros((0, length), dtype=tokens.dtype)
        self._records: npt.NDArray[Any] | None = None
        self._shifted: npt.NDArray[Any] | None = None
        if tokens.size >= length + 1:
            itemsize = tokens.dtype.itemsize
            record = np.dtype((np.void, length * itemsize))
            count = tokens.size - length  # records that have a following record (targets)
            self._records = np.ndarray(shape=(count,), dtype=record, buffer=tokens, strides=(itemsize,))
            self._shifted = np.ndarray(shape=(count,), dtype=record, buffer=tokens, offset=itemsize, strides=(itemsize,))
        self._bits = bits  # the store's loss-mask bits: take_counted counts the rows' trained targets in them
        self.kernel = c_window_gather(tokens, length, None if bits is None else np.asarray(bits))  # C, or None
        self.counted = self.kernel is not None and bits is not None  # take_counted counts in the copy's loop

    @property
    def records(self) -> npt.NDArray[Any]:
        """The read-only record view: record ``p`` is the ``T`` tokens from position ``p`` (one void item)."""
        assert self._records is not None, "no records: the store is shorter than one window"
        return self._records

    @property
    def shifted(self) -> npt.NDArray[Any]:
        """`records` shifted by one token: the targets of a row starting at ``p``."""
        assert self._shifted is not None, "no records: the store is shorter than one window"
        return self._shifted

    def __call__(self, positions: npt.NDArray[np.intp]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` for rows starting at *positions* (an intp array): ``take(rows(positions))``."""
        return self.take(positions)

    def where(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.intp]:
        """Where `take` reads the rows starting at *positions*: in one store, the positions themselves."""
        return positions

    def take(self, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` for *rows* (a slice of what `rows` returned), one gather per buffer."""
        if self.kernel is not None:
            try:
                return self.kernel.gather(rows)  # type: ignore[no-any-return]
            except (IndexError, TypeError):  # a position beyond the tokens, or rows not int64: numpy decides
                pass
        records, width, positions = self._records, rows.size, rows
        if records is None or self._shifted is None or width == 0:  # a rank's empty share, or no windows
            return self._empty.copy(), self._empty.copy()
        shape, dtype = (width, self._length), self._dtype
        try:  # wrap each gathered record buffer as (width, T) tokens: no copy, cheaper than view + reshape
            return np.ndarray(shape, dtype, records[positions]), np.ndarray(shape, dtype, self._shifted[positions])
        except IndexError:  # e.g. a damaged plan file: positions beyond the tokens
            raise DataError(_OUTSIDE.format(size=records.size + self._length)) from None

    def take_counted(self, rows: npt.NDArray[np.intp]) -> tuple[npt.NDArray[Any], npt.NDArray[Any], int]:
        """`take`'s arrays and the rows' trained targets, counted by the C gather in its copy loop (``counted``)."""
        try:
            found: tuple[npt.NDArray[Any], npt.NDArray[Any], int] = self.kernel.gather_counted(rows)
            return found
        except (IndexError, TypeError):  # a position beyond the tokens, or rows not int64: numpy decides
            inputs, targets = self.take(rows)
            assert self._bits is not None, "counted without bits"
            return inputs, targets, int(np.count_nonzero(target_mask(self._bits, rows, self._length)))


class ShardedGather:
    """Gathers rows of a `Corpus` (global positions) straight into final ``(w, T)`` arrays.

    `rows` maps a whole block of batches to where they are read, once (`take`
    then only copies).  When the shards' token arrays share one dtype (the usual
    case), one read-only record view spans the address range holding all of them,
    and a row is read at ``position + shift[shard]``, the shift found by one
    lookup in a table of position buckets (an exact ``searchsorted`` on the
    shards' bases only for rows near a shard's end): the batch is then one
    gather per buffer, as for a single store.  That view is only ever read at rows inside a shard (window
    positions never point elsewhere); it is private to the gather and never
    exposed (``kernel``: the C `WindowGatherer` over it, or None).  Otherwise (mixed dtypes) each shard's rows are
    copied from that shard's record view straight into their rows of the final arrays.

    >>> from streambatch.model.store import DocumentStore
    >>> from streambatch.model.corpus import Corpus
    >>> a = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"])
    >>> b = DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
    >>> inputs, targets = ShardedGather(Corpus([a, b]).flat(), context_length=2)(np.array([6, 1, 5]))
    >>> inputs.tolist(), targets.tolist()
    ([[20, 21], [10, 11], [0, 20]], [[21, 1], [11, 12], [20, 21]])
    """

    __slots__ = (
        "_bases",
        "_dtype",
        "_ends",
        "_gathers",
        "_last",
        "_length",
        "_record",
        "_records",
        "_shifted",
        "_span",
        "_table",
        "_tokens",
        "kernel",
    )

    def __init__(self, flat: Flat, context_length: int) -> None:
        self._length = context_length
        self._dtype = flat.dtype
        self._tokens = flat.tokens  # kept alive with the views below
        self._gathers = [StoreGather(tokens, context_length) for tokens in flat.tokens]
        self._bases = flat.bases[:-1]
        # the last position of each shard where T + 1 tokens still fit: the spanning view is read nowhere else
        self._last = flat.bases[1:] - (context_length + 1)
        self._ends = flat.bases[1:-1]  # shard k holds the positions below ends[k] (and at or above ends[k - 1])
        self._record = np.dtype((np.void, context_length * flat.dtype.itemsize))
        self._span = spanning_records(self._tokens, flat.bases, context_length)
        self._table = None if self._span is None else _ShiftTable(flat.bases, self._last, self._span[2])
        self._records: npt.NDArray[Any] | None = None if self._span is None else self._span[0]
        self._shifted: Any = None if self._span is None else self._span[1]
        found = None if self._span is None else spanning_tokens(self._tokens, flat.bases)
        self.kernel = None if found is None else c_window_gather(found[0], context_length)  # reads the same records

    def __call__(self, positions: npt.NDArray[np.intp]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` for rows starting at global *positions* (an intp array): ``take(rows(positions))``."""
        return self.take(self.where(positions))

    def where(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[Any]:
        """Where `take` reads the rows starting at global *positions*; checks each lies inside a shard.

        With the spanning view: each row's record number in it (intp).  Otherwise:
        each row's shard and position within it (a structured array).  Slices of
        the result are what `take` accepts.
        """
        if self._table is not None:  # a table lookup per row; the exact check only near shard ends
            at, odd = self._table.records(positions)
            if odd is not None:
                at[odd] = self._checked(positions[odd], odd)
            return at
        return self._checked(positions)

    def _checked(self, positions: npt.NDArray[np.intp], rows: npt.NDArray[np.intp] | None = None) -> npt.NDArray[Any]:
        """`rows` by one ``searchsorted``, each position checked (*rows*: their row numbers, for the message)."""
        shards = np.searchsorted(self._ends, positions, side="right")
        outside = (positions < self._bases[shards]) | (positions > self._last[shards])
        if outside.any():  # e.g. a tampered plan file: never read the span between shards
            bad = int(np.argmax(outside))
            row = bad if rows is None else int(rows[bad])
            raise DataError(
                f"row {row}: position {int(positions[bad])} is not a window start inside a shard of this corpus; "
                "the plan does not belong to it (remove the plan file and plan again)"
            )
        if self._span is not None:
            at: npt.NDArray[np.intp] = positions + self._span[2][shards]
            return at
        where = np.empty(positions.size, dtype=_SHARD_ROWS)
        where["shard"], where["local"] = shards, positions - self._bases[shards]
        return where

    def take(self, rows: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)`` for *rows* (a slice of what `rows` returned)."""
        records, width = self._records, rows.size
        if self.kernel is not None:  # the spanning view's records, in C
            try:
                return self.kernel.gather(rows)  # type: ignore[no-any-return]
            except (IndexError, TypeError):  # rows not the span's record numbers (int64): numpy decides
                pass
        if records is not None and width:  # one gather per buffer, as in StoreGather
            shape = (width, self._length)
            return np.ndarray(shape, self._dtype, records[rows]), np.ndarray(shape, self._dtype, self._shifted[rows])
        shape, dtype = (width, self._length), self._dtype
        if width == 0:
            return np.zeros(shape, dtype), np.zeros(shape, dtype)
        inputs, targets = np.empty(shape, dtype), np.empty(shape, dtype)
        rows_in, rows_out = inputs.view(self._record).reshape(width), targets.view(self._record).reshape(width)
        order = np.argsort(rows["shard"], kind="stable")  # rows grouped by shard, in row order within each
        shards, local = rows["shard"][order], rows["local"][order]
        cuts = np.flatnonzero(shards[1:] != shards[:-1]) + 1  # only the shards present: O(width), never O(shards)
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), width], strict=True):
            shard = int(shards[lo])
            picked, gather = order[lo:hi], self._gathers[shard]
            if self._tokens[shard].dtype == dtype:  # whole records straight into this shard's rows
                rows_in[picked], rows_out[picked] = gather.records[local[lo:hi]], gather.shifted[local[lo:hi]]
            else:  # a uint16 shard of a uint32 corpus: widened on the way
                inputs[picked], targets[picked] = gather(local[lo:hi])
        return inputs, targets


_SHARD_ROWS = np.dtype([("shard", np.intp), ("local", np.intp)])  # rows of the per-shard path
_NOT_INSIDE = np.iinfo(np.intp).min  # no shift: a bucket not wholly inside one shard's window starts


class _ShiftTable:
    """The spanning view's shift by buckets of ``2**bits`` global positions: one lookup per row, no binary search.

    A bucket wholly inside one shard's window-start range holds that shard's shift;
    every other bucket (a shard's last T tokens, a boundary) holds ``_NOT_INSIDE``,
    and its rows (and any row outside the table) take the exact ``searchsorted`` path.
    """

    __slots__ = ("_bits", "_shift")

    def __init__(self, bases: npt.NDArray[np.int64], last: npt.NDArray[np.int64], shift: npt.NDArray[np.int64]) -> None:
        flat = int(bases[-1])
        wanted = min(1 << 20, max(1 << 12, 64 * shift.size))  # buckets: L2-sized for a few shards
        self._bits = max(1, flat.bit_length() - wanted.bit_length() + 1)  # >= 1: a negative position is past the end
        self._shift = np.full((flat >> self._bits) + 1, _NOT_INSIDE, dtype=np.intp)
        for first, final, by in zip(bases[:-1].tolist(), last.tolist(), shift.tolist(), strict=True):
            lo, hi = -(-first >> self._bits), (final + 1) >> self._bits  # the buckets wholly inside [first, final]
            if lo < hi:  # a shard without windows has none (and final + 1 may be negative)
                self._shift[lo:hi] = by

    def records(self, positions: npt.NDArray[Any]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp] | None]:
        """Each row's record number in the spanning view, and the rows (if any) left to the exact path."""
        where = np.ascontiguousarray(positions, dtype=np.intp)
        buckets = (where.view(np.uint64) >> np.uint64(self._bits)).view(np.intp)  # negative: huge, past the table
        try:
            shift = self._shift[buckets]
        except IndexError:  # a row past the table: every row takes the exact path
            return np.empty(where.size, dtype=np.intp), np.arange(where.size, dtype=np.intp)
        at: npt.NDArray[np.intp] = where + shift
        if where.size and shift.min() == _NOT_INSIDE:
            return at, np.flatnonzero(shift == _NOT_INSIDE)
        return at, None


def spanning_records(
    tokens: tuple[npt.NDArray[Any], ...], bases: npt.NDArray[np.int64], length: int
) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[np.int64]] | None:
    """Record views (inputs, targets) over `spanning_tokens` of the shards, and each shard's shift.

    Global position ``p`` of shard ``k`` is record ``p + shift[k]``; None where no span exists.
    """
    found = spanning_tokens(tokens, bases)
    if found is None or found[0].size < length + 1:
        return None
    span, shift = found
    size = span.dtype.itemsize
    record = np.dtype((np.void, length * size))
    records = np.ndarray(shape=(span.size - length,), dtype=record, buffer=span, strides=(size,))
    shifted = np.ndarray(shape=(span.size - length,), dtype=record, buffer=span, offset=size, strides=(size,))
    return records, shifted, shift


Gather = StoreGather | ShardedGather


def window_gather(space: Any) -> Gather:
    """The space's gather, built once (per switch of the ``window_gather`` kernel) and cached on it: `StoreGather`
    for one shard, `ShardedGather` for several."""
    key = cache_key("gather", "window_gather")
    gather: Gather | None = space.cache.get(key)
    if gather is None:
        flat: Flat = space.store.flat()
        length = space.config.context_length
        gather = StoreGather(flat.tokens[0], length, flat.bits[0]) if flat.single else ShardedGather(flat, length)
        space.cache[key] = gather
    return gather


MaskReader = Callable[[npt.NDArray[np.intp]], npt.NDArray[np.bool_]]


def mask_reader(space: Any) -> MaskReader | None:
    """What makes the ``(w, T)`` loss mask of window rows at positions of *space*'s store, cached on the space:
    one shard's bits bound to the C kernel (`streambatch.model.mask.target_reader`), a corpus's per-shard read
    (`streambatch.model.flat.Flat.target_mask`), or None without a mask (the batch then stores no ``loss_mask``:
    every target counts)."""
    key = cache_key("mask", "mask_bits")
    if key in space.cache:
        found: MaskReader | None = space.cache[key]
        return found
    flat: Flat = space.store.flat()
    length = space.config.context_length
    reader: MaskReader | None = None
    if flat.single and flat.bits[0] is not None:
        reader = target_reader(flat.bits[0], length)
    elif flat.has_loss_mask:
        reader = partial(_shard_masks, flat, length)
    space.cache[key] = reader
    return reader


def _shard_masks(flat: Flat, length: int, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    found = flat.target_mask(positions, length)
    assert found is not None, "a mask reader of a source without a mask"
    return found


def mask_counter(space: Any) -> Callable[[npt.NDArray[Any]], int] | None:
    """What counts the trained targets of window rows at positions of *space*'s store without making their mask
    (`streambatch.model.mask.count_reader`), cached on the space; None without a mask, or where the mask is made
    with the batch (a corpus's shards, no C kernel).  A store's own batches count in the gather's copy loop
    (`StoreGather.take_counted`); a mixture's count here."""
    key = cache_key("count", "mask_bits")
    if key in space.cache:
        found: Callable[[npt.NDArray[Any]], int] | None = space.cache[key]
        return found
    flat: Flat = space.store.flat()
    bits = flat.bits[0] if flat.single else None
    counter = None if bits is None else count_reader(bits, space.config.context_length)
    space.cache[key] = counter
    return counter


def window_columns(batch: MiniBatch) -> dict[str, Any]:
    """A masked window batch's ``loss_mask``, made on its first use (the batch counted its targets in the bits)."""
    unpack = mask_reader(batch.space)
    return {"loss_mask": None if unpack is None else unpack(batch.positions)}


class RowMasks(NamedTuple):
    """How batches of window rows get their loss mask, decided once per loop: the one window mask rule, for one
    store (`store_masks`) and a mixture (`streambatch.items.mix.gather.mixture_masks`) alike.

    ``mask(sources, positions)`` makes the ``(w, T)`` mask now; where the bits count in place, ``counter`` counts
    the trained targets now instead and ``build`` makes the mask on first use (None: no such counter).
    """

    mask: Callable[[Any, Any], Any]
    counter: Callable[[Any, Any], int] | None
    build: Callable[[MiniBatch], dict[str, Any]]


def store_masks(space: Any) -> RowMasks | None:
    """*space*'s `RowMasks` (`mask_reader`, `mask_counter`); None when its store has no mask."""
    unpack = mask_reader(space)
    if unpack is None:
        return None
    counter = mask_counter(space)
    count = None if counter is None else (lambda _sources, positions: counter(positions))
    return RowMasks(lambda _sources, positions: unpack(positions), count, window_columns)


def window_batch(
    index: int, inputs: Any, targets: Any, positions: Any, spaces: Any, masks: RowMasks | None, sources: Any = None,
    names: tuple[str, ...] | None = None,
) -> MiniBatch:  # fmt: skip
    """The `MiniBatch` of gathered window rows (a mixture's: with *sources* and *names*) under *masks*: no mask,
    a mask made now, or the targets counted now and the mask made on first use."""
    if masks is None:
        return MiniBatch(index, inputs, targets, positions, spaces, sources=sources, names=names)
    if masks.counter is None:
        mask = masks.mask(sources, positions)
        return MiniBatch(index, inputs, targets, positions, spaces, sources=sources, names=names, loss_mask=mask)
    count = masks.counter(sources, positions)
    return MiniBatch(
        index, inputs, targets, positions, spaces, sources=sources, names=names, target_count=count, build=masks.build
    )


def _counted(gather: Gather, unpack: MaskReader | None) -> bool:
    """Whether batches of *gather* count their trained targets in the copy (a masked store's C gather)."""
    return unpack is not None and isinstance(gather, StoreGather) and gather.counted


_BLOCK_WINDOWS = 2048  # consecutive batches whose positions are computed (and cast to intp) at once


def _blocks(windows: Any, size: int, batches: range, gather: Gather) -> Iterator[tuple[range, Any, Any]]:
    """``(group, positions, rows)`` per block of consecutive batches of *batches*: the positions of the block's
    windows from one call (one cast to intp, one searchsorted in sequential order), mapped to the gather's rows
    once (a corpus's shard lookup; one store reads the positions themselves: *rows* is *positions*); a strided
    share (``step > 1``) takes one batch per block, so the batches between are never touched."""
    total = len(windows)
    per = max(1, _BLOCK_WINDOWS // size) if batches.step == 1 else 1
    for head in range(0, len(batches), per):
        group = batches[head : head + per]
        positions = windows[group[0] * size : min((group[-1] + 1) * size, total)].positions()
        yield group, positions, gather.where(positions)


def _numpy_take(take: Callable[[Any], tuple[Any, Any]]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """*take* in the C gather's call shape ``(rows, next)``: numpy asks for nothing ahead."""
    return lambda rows, _next: take(rows)


def iter_window_batches(windows: Any, size: int, batches: range) -> Iterator[MiniBatch]:
    """Batches *batches* of *windows* chunked by *size*, with the per-batch work cut to the gather itself.

    The rows come a block of batches at a time (`_blocks`); what stays per batch is a slice of the block's
    positions, one call of the C gather (a masked store's counts its trained targets in the same call: the mask
    is made on first use) and the batch object (`row_batch`, no keyword handling).  A position the C gather
    refuses (a damaged plan) goes through `take`, whose numpy path names the error.
    """
    space = windows.space
    spaces = (space,)
    gather = window_gather(space)
    unpack = mask_reader(space)  # decided once: None makes nothing more
    counted = _counted(gather, unpack)
    kernel = gather.kernel  # a store's or a corpus's spanning C gather (None: numpy)
    if counted:  # a store's C gather with its mask bits
        take_counted = gather.take_counted  # type: ignore[union-attr]
        c_counted = kernel.gather_counted  # type: ignore[union-attr]
        for group, positions, _ in _blocks(windows, size, batches, gather):
            lo = 0
            for batch in group:
                here = positions[lo : lo + size]
                try:  # the next batch's rows ride along: the kernel asks for them as this copy ends
                    inputs, targets, count = c_counted(here, positions[lo + size : lo + 2 * size])
                except (IndexError, TypeError):  # refused by the C gather: the numpy path decides (DataError)
                    inputs, targets, count = take_counted(here)
                yield row_batch(batch, inputs, targets, here, spaces, count, window_columns)
                lo += size
        return
    take = gather.take
    c_take = _numpy_take(take) if kernel is None else kernel.gather
    masks = store_masks(space)
    for group, positions, rows in _blocks(windows, size, batches, gather):
        same, lo = rows is positions, 0
        for batch in group:
            here = positions[lo : lo + size]
            at = here if same else rows[lo : lo + size]
            try:  # the next batch's rows ride along: the kernel asks for them as this copy ends
                inputs, targets = c_take(at, rows[lo + size : lo + 2 * size])
            except (IndexError, TypeError):  # refused by the C gather: the numpy path decides (DataError)
                inputs, targets = take(at)
            if masks is None:
                yield row_batch(batch, inputs, targets, here, spaces, targets.size)
            else:
                yield window_batch(batch, inputs, targets, here, spaces, masks)
            lo += size
