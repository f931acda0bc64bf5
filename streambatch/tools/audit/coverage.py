"""What "every item once" means for the epoch's items, and the order of a pass over them.

Items are the one thing the audit counts per kind, because what makes an item
itself differs: a window is a place on the store's stride grid (windows of a
stride below ``T`` share targets, so targets cannot tell them apart), a packed
row a number of the packing whose segments must tile the partition's targets.

- `WindowCoverage`: every window of the partition, recomputed from the store
  (``[T + 1]`` tokens inside one document, on the stride grid), appears exactly
  once: a uint16 stamp per window finds a repeat, within a batch too, in O(1)
  per row.  The order of a pass: (batch index, document, start) per row.
- `TargetCoverage`: every row number of the packing once, and every target of
  every document of the partition in exactly one segment (segments sorted by
  their first target tile the targets: one running maximum).  The order of a
  pass: (batch index, row numbers) per batch.

Both read a batch as `streambatch.tools.audit.expected.Segments`, so a new item
kind is a new rule here only if its items are neither.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._progress import Bar
from ...batch.reduce import TokenMean
from ...items.windows.window_index import window_counts
from ..stand_in import span_units, sums_of_units, window_loss_units
from .expected import Expected, IntArray, Segments, segments

_STAMP_BLOCK = (1 << 16) - 1  # rows per stamp block: stamps 1..65535 fit uint16, 0 means "never seen"
_DIRECT_BLOCK = 1 << 22  # windows per step of the direct mean


class Order:
    """A running hash of each batch's index and its items' keys: two passes in the same order hash the same."""

    def __init__(self) -> None:
        self.digest = hashlib.blake2b(digest_size=16)
        self.rows = 0

    def add(self, index: int, keys: tuple[IntArray, ...]) -> None:
        self.digest.update(np.array([index, keys[0].size], dtype=np.int64).tobytes())
        for key in keys:
            self.digest.update(key.tobytes())
        self.rows += int(keys[0].size)


class WindowCoverage:
    """Windows: each window of the partition on the stride grid once (see the module docstring)."""

    NOUN = "windows"
    TARGET = "token"  # what the direct mean is over

    def __init__(self, expected: Expected) -> None:
        ex = self.expected = expected
        T = ex.context_length
        self.counts = np.where(ex.included, window_counts(ex.lengths, T, ex.stride), 0)
        self.cumulative = np.cumsum(self.counts)
        self.first = self.cumulative - self.counts
        self.window_count = int(self.cumulative[-1]) if self.cumulative.size else 0
        self.kept: npt.NDArray[np.bool_] | None = None  # skip_untrained: the windows with a counted target
        self.counted_targets = self.window_count * T
        if ex.masked or ex.untrained is not None:
            per = ex.window_targets()  # counted targets of each window, from the store's bits
            self.counted_targets = int(per.sum())
            if ex.untrained is not None:
                self.kept = per > 0
        self.stamps = np.zeros(self.window_count, dtype=np.uint16)
        self.valid_rows = self.covered = 0

    # -- the grid -----------------------------------------------------------------------------
    def numbers(self, lo: int, hi: int) -> IntArray:
        """Window numbers ``lo:hi`` of the epoch's items in document order (the kept ones under skip_untrained)."""
        if self.kept is None:
            return np.arange(lo, hi, dtype=np.int64)
        return np.flatnonzero(self.kept)[lo:hi].astype(np.int64)

    def locate(self, numbers: IntArray) -> tuple[IntArray, IntArray]:
        documents = np.searchsorted(self.cumulative, numbers, side="right")
        return documents, (numbers - self.first[documents]) * self.expected.stride

    def on_grid(
        self, documents: IntArray, starts: IntArray, valid: npt.NDArray[np.bool_]
    ) -> tuple[npt.NDArray[np.bool_], IntArray]:
        """Which of the *valid* rows are windows of the epoch (on the stride grid), and every row's window number."""
        safe = np.where(valid, documents, 0)
        numbers = self.first[safe] + starts // self.expected.stride  # meaningful where on the grid
        return valid & (starts % self.expected.stride == 0), numbers

    # -- one pass -------------------------------------------------------------------------------
    def key(self, piece: Any, seg: Segments | None = None) -> tuple[int, tuple[IntArray, ...]]:
        """A piece's batch index and the keys its order is hashed by: (document, start) per row."""
        found = segments(piece, self.expected.context_length) if seg is None else seg
        return found.batch, (found.documents, found.starts)

    def rows(self, tally: Any, seg: Segments, piece: Any) -> None:
        """Nothing to see before the rows are placed: a window is known by where it lies."""

    def primary(self, tally: Any, seg: Segments, where: Any) -> npt.NDArray[np.bool_]:
        """Stamp the valid rows that are windows (on the grid); a row of no document or off the grid is no window
        of the epoch (``coverage``).  Returns the rows that are windows."""
        stride = self.expected.stride
        window: npt.NDArray[np.bool_] = where.valid & (seg.starts % stride == 0)
        numbers = self.first[where.safe] + seg.starts // stride  # meaningful where on the grid
        why = f"no such window (no such document, or off the stride-{stride} grid)"
        tally.count_at("coverage", "foreign", seg, ~where.known | (where.valid & ~window), why)
        picked = np.flatnonzero(window)
        self.valid_rows += picked.size
        for lo in range(0, picked.size, _STAMP_BLOCK):
            block = picked[lo : lo + _STAMP_BLOCK]
            chosen = numbers[block]
            mine = np.arange(1, block.size + 1, dtype=np.uint16)
            earlier = self.stamps[chosen] != 0  # seen in an earlier block
            # two rows of one window: only one stamp survives, so the other row reads a stamp not its own
            # (written back to front so that, as numpy stores the last write, the first row keeps its stamp
            # and the message names the repeat; the count is exact either way)
            self.stamps[chosen[::-1]] = mine[::-1]
            again = earlier | (self.stamps[chosen] != mine)
            if again.any():
                at = int(block[np.argmax(again)])
                origin = self.expected.origin(int(seg.documents[at]), int(seg.starts[at]))
                tally.note("duplicates", f"batch {seg.batch} row {at}: window {origin} appears more than once")
        return window

    def membership(self) -> npt.NDArray[np.bool_]:
        return np.zeros(self.window_count, dtype=bool)

    def mark(self, seen: npt.NDArray[np.bool_], keys: tuple[IntArray, ...]) -> None:
        """Mark the windows among the rows of *keys* (documents, starts) as held by another pass."""
        documents, starts = keys
        ex = self.expected
        known = (documents >= 0) & (documents < ex.lengths.size)
        safe = np.where(known, documents, 0)
        inside = known & (starts >= 0) & (starts <= ex.lengths[safe] - 1 - ex.context_length)
        window, numbers = self.on_grid(documents, starts, inside & ex.included[safe])
        seen[numbers[window]] = True

    def same_items(self, seen: npt.NDArray[np.bool_], rows: int, primary_rows: int) -> bool:
        """The other pass held the windows the primary pass held, and as many rows."""
        return rows == primary_rows and bool(np.array_equal(seen, self.stamps != 0))

    def direct(self, bar: Bar) -> TokenMean | None:
        """The stand-in token mean over every window of the epoch in document order, in closed form per window."""
        units, count, T = 0, self.expected.item_count, self.expected.context_length
        for lo in range(0, count, _DIRECT_BLOCK):
            numbers = self.numbers(lo, min(lo + _DIRECT_BLOCK, count))
            documents, starts = self.locate(numbers)
            units += window_loss_units(documents, starts, T)
            bar.update(numbers.size)
        bar.close()
        return sums_of_units(units, count * T).mean() if count * T else None

    def finish(self, tally: Any) -> tuple[int, int]:
        """``(covered windows, repeated windows)``; notes the windows that never appeared (or should not have)."""
        if self.kept is not None:  # skip_untrained: a dropped window must never appear, and counts as not expected
            emitted = (self.stamps != 0) & ~self.kept
            if emitted.any():
                documents, starts = self.locate(np.flatnonzero(emitted)[:1].astype(np.int64))
                origin = self.expected.origin(int(documents[0]), int(starts[0]))
                tally.note("coverage", f"window {origin} has no counted target but appears (skip_untrained dropped it)")
            self.stamps[~self.kept] = 0
            tally.counts["foreign"] += int(np.count_nonzero(emitted))
        covered = int(np.count_nonzero(self.stamps))
        count = self.expected.item_count
        if covered < count:
            missing = np.flatnonzero((self.stamps == 0) if self.kept is None else (self.stamps == 0) & self.kept)
            documents, starts = self.locate(missing[:1].astype(np.int64))
            origin = self.expected.origin(int(documents[0]), int(starts[0]))
            tally.note("coverage", f"{missing.size} of {count} windows never appeared; the first is {origin}")
        return covered, self.valid_rows - covered


class TargetCoverage:
    """Packed rows: each row of the packing once, every target of the partition in one segment (module docstring)."""

    NOUN = "rows"
    TARGET = "target"

    def __init__(self, expected: Expected) -> None:
        ex = self.expected = expected
        targets = np.where(ex.included, np.maximum(ex.lengths - 1, 0), 0)
        self.target_first: IntArray = np.cumsum(targets) - targets  # global number of each document's first target
        self.target_count = int(targets.sum())
        items: Any = ex.epoch.items  # packed Rows
        self.row_total = len(items.packing)  # every row of the packing
        self.row_seen = np.zeros(self.row_total, dtype=bool)
        self.tiles: list[tuple[IntArray, IntArray]] = []  # (first global target, length) of each valid segment
        self.dropped = np.zeros(self.row_total, dtype=bool)  # rows skip_untrained dropped: seen, their targets tiled
        self._drop(items)
        self.counted_targets = self.target_count
        self.counted_units = 0  # stand-in units over every counted target (a masked store)
        if ex.masked:
            from .masks import counted_units

            docs = np.flatnonzero(ex.included & (ex.lengths >= 2)).astype(np.int64)
            self.counted_units, self.counted_targets = counted_units(ex.store, docs)

    def _drop(self, rows: Any) -> None:
        """Under skip_untrained: the dropped rows count as seen (one emitted is a duplicate), and their segments
        and the tails left out of packing as tiled (the tiling then proves emitted and dropped pieces hold every
        target once; the counted total, that no dropped piece held a counted target)."""
        report = rows.untrained
        if report is None:
            return
        self.dropped[:] = True
        self.dropped[np.asarray(report.entries, dtype=np.int64)] = False
        numbers = np.flatnonzero(self.dropped)
        self.row_seen[numbers] = True
        seg = rows.space.packing.segments(numbers)
        self.tiles.append((self.target_first[seg.documents] + seg.starts, seg.lengths.astype(np.int64)))
        if report.tails is not None and report.tails.size:  # tails left out of packing: tiled, in no row
            docs = np.asarray(report.tails, dtype=np.int64)
            lengths = self.expected.lengths
            sizes = (lengths[docs] - 1) % self.expected.context_length
            self.tiles.append((self.target_first[docs] + lengths[docs] - 1 - sizes, sizes))

    @staticmethod
    def _numbers(piece: Any) -> IntArray:
        found = piece.row_numbers if hasattr(piece, "row_numbers") else piece.numbers()  # a batch, or a chunk
        return np.asarray(found, dtype=np.int64).reshape(-1)

    def key(self, piece: Any, seg: Segments | None = None) -> tuple[int, tuple[IntArray, ...]]:
        """A piece's batch index and the keys its order is hashed by: its row numbers."""
        index = piece.index if hasattr(piece, "row_numbers") else piece.batch_index
        return int(index or 0), (self._numbers(piece),)

    def rows(self, tally: Any, seg: Segments, piece: Any) -> None:
        """Each row number of the packing seen once (before the batch's layout is checked)."""
        numbers = self._numbers(piece)
        known = (numbers >= 0) & (numbers < self.row_total)
        ok = numbers[known]
        repeats = int(np.count_nonzero(self.row_seen[ok])) + ok.size - int(np.unique(ok).size)
        if repeats or not known.all():
            tally.counts["duplicates"] += repeats + int(np.count_nonzero(~known))
            tally.note("duplicates", f"batch {seg.batch}: a row number appears twice or is not a row of the packing")
        self.row_seen[ok] = True

    def primary(self, tally: Any, seg: Segments, where: Any) -> npt.NDArray[np.bool_]:
        """The valid segments' targets, kept for the tiling."""
        valid: npt.NDArray[np.bool_] = where.valid
        self.tiles.append((self.target_first[seg.documents[valid]] + seg.starts[valid], seg.lengths[valid]))
        return valid

    def membership(self) -> npt.NDArray[np.bool_]:
        return np.zeros(self.row_total, dtype=bool)

    def mark(self, seen: npt.NDArray[np.bool_], keys: tuple[IntArray, ...]) -> None:
        """Mark the rows of *keys* (their row numbers) as held by another pass."""
        seen[keys[0]] = True

    def same_items(self, seen: npt.NDArray[np.bool_], rows: int, primary_rows: int) -> bool:
        """The other pass held the rows the primary pass saw (the dropped ones count as seen)."""
        return bool(np.array_equal(seen | self.dropped, self.row_seen))

    def direct(self, bar: Bar) -> TokenMean | None:
        """The stand-in mean over every (counted) target of the partition, in closed form per document."""
        bar.close()
        ex = self.expected
        if ex.masked:  # over the counted targets only
            return sums_of_units(self.counted_units, self.counted_targets).mean() if self.counted_targets else None
        docs = np.flatnonzero(ex.included & (ex.lengths >= 2))
        units = int(span_units(8 * (docs % 8) + 1, ex.lengths[docs] - 1).sum())
        return sums_of_units(units, self.target_count).mean() if self.target_count else None

    def finish(self, tally: Any) -> tuple[int, int]:
        """``(covered targets, targets seen more than once)`` from the tiling; notes coverage failures."""
        firsts = np.concatenate([k[0] for k in self.tiles]) if self.tiles else np.zeros(0, dtype=np.int64)
        sizes = np.concatenate([k[1] for k in self.tiles]) if self.tiles else np.zeros(0, dtype=np.int64)
        order = np.argsort(firsts, kind="stable")
        firsts, ends = firsts[order], firsts[order] + sizes[order]
        reach = np.maximum.accumulate(ends) if ends.size else ends  # furthest target covered so far
        floor = np.concatenate([[0], reach[:-1]]) if ends.size else ends
        covered = int(np.maximum(ends - np.maximum(firsts, floor), 0).sum())
        repeated = int(sizes.sum()) - covered
        if repeated:
            at = int(np.argmax(firsts < floor))
            tally.note(
                "duplicates", f"{repeated} targets appear more than once; the first repeat is in {self._target(int(firsts[at]))}"
            )
        if covered < self.target_count:
            gaps = np.flatnonzero(firsts > floor)
            missing = 0 if not firsts.size or firsts[0] > 0 else int(floor[gaps[0]]) if gaps.size else int(reach[-1])
            tally.note(
                "coverage",
                f"{self.target_count - covered} of {self.target_count} targets never appeared; "
                f"the first is {self._target(missing)}",
            )
        return covered, repeated

    def _target(self, number: int) -> str:
        document = int(np.searchsorted(self.target_first, number, side="right")) - 1  # the last one starting at or before
        ids = self.expected.store.ids
        return f"target {number - int(self.target_first[document])} of {ids[document]} (document index {document})"


def order_pass(coverage: Any, pieces: Iterable[Any], bar: Bar, *, membership: bool) -> tuple[Order, Any]:
    """The order of another pass (a replay, or another seed's), and with *membership* the items it held."""
    order, seen = Order(), coverage.membership() if membership else None
    for piece in pieces:
        index, keys = coverage.key(piece)
        order.add(index, keys)
        if seen is not None:
            coverage.mark(seen, keys)
        bar.update(keys[0].size)
    bar.close()
    return order, seen


Coverage = WindowCoverage | TargetCoverage


def coverage_of(expected: Expected) -> Coverage:
    """What "every item once" means for the epoch's items: packed rows tile the targets, windows sit on the grid."""
    return TargetCoverage(expected) if expected.packed else WindowCoverage(expected)
