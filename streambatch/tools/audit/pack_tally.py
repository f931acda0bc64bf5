"""The packed audit's primary pass: every check on each packed batch, vectorized, and the tiling of every document.

Each batch is checked from what it says about itself (per-segment provenance:
document, start, length, row) against the store alone: the segment and
position ids it should have are rebuilt from the provenance and compared
whole-array, its ids are compared with the document's tokens read from the
store, padding must be unmasked-free and outside its ``token_count``.  Segments
are kept as three integers each; at the end they are sorted by their first
target in a global numbering of every target of the partition, and tiling is
checked with one running maximum: every target lies in exactly one segment.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.reduce import TokenSums
from ...epoch import Epoch
from ...stages.chunk import batch_widths
from ..stand_in import sums_of_units, target_units
from .masks import MaskTally, counted_units

IntArray = npt.NDArray[np.int64]


class PackTally:
    """Every check of the packed audit's primary pass; ``first`` holds the first offending place of each failed check."""

    def __init__(self, epoch: Epoch) -> None:
        store = epoch.store
        self.store, self.T, self.batch_size = store, epoch.context_length, epoch.batch_size
        self.code = epoch.partition.code
        self.pad_id = int(epoch.windows.space.pad_id)  # one packing's (epoch.store refuses a mixture)
        included = store.partition_codes == self.code
        self.lengths: IntArray = store.lengths.astype(np.int64)
        targets = np.where(included, np.maximum(self.lengths - 1, 0), 0)
        self.target_first: IntArray = np.cumsum(targets) - targets  # global number of each document's first target
        self.target_count = int(targets.sum())
        self.row_count = len(epoch.windows)  # the epoch's rows (the kept ones under skip_untrained)
        rows: Any = epoch.windows  # packed Rows
        self.row_total = len(rows.packing)  # every row of the packing
        self.widths = np.asarray(batch_widths(self.row_count, self.batch_size), dtype=np.int64)
        self.rows_per_batch = np.zeros(self.widths.size, dtype=np.int64)
        self.row_seen = np.zeros(self.row_total, dtype=bool)
        self.digest = hashlib.blake2b(digest_size=16)  # (batch index, rows, row numbers) of each batch, in order
        self.kept: list[tuple[IntArray, IntArray]] = []  # (first global target, length) of each valid segment
        self.masked = bool(getattr(store, "has_loss_mask", False))
        self.counted_units = 0  # stand-in units over every counted target (a masked store)
        self.dropped = np.zeros(self.row_total, dtype=bool)  # rows skip_untrained dropped: seen, their targets tiled
        self._drop(epoch.windows)
        self.masks = MaskTally(store, self.T, self._counted(included))
        self.first: dict[str, str] = {}
        self.counts = dict.fromkeys(
            ("content", "segments", "positions", "padding", "cross_document", "cross_partition", "duplicate_rows"), 0
        )
        self.batches = self.rows = self.real_positions = self.denominator = 0

    def note(self, check: str, message: str) -> None:
        self.first.setdefault(check, message)

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
        self.kept.append((self.target_first[seg.documents] + seg.starts, seg.lengths.astype(np.int64)))
        if report.tails is not None and report.tails.size:  # tails left out of packing: tiled, in no row
            docs = np.asarray(report.tails, dtype=np.int64)
            sizes = (self.lengths[docs] - 1) % self.T
            self.kept.append((self.target_first[docs] + self.lengths[docs] - 1 - sizes, sizes))

    def _counted(self, included: npt.NDArray[np.bool_]) -> int:
        """Counted targets of the partition (every target without a mask): what the batches must count in all."""
        if not self.masked:
            return self.target_count
        docs = np.flatnonzero(included & (self.lengths >= 2)).astype(np.int64)
        self.counted_units, counted = counted_units(self.store, docs)
        return counted

    def _count(self, check: str, key: str, bad: npt.NDArray[np.bool_], message: str) -> None:
        count = int(np.count_nonzero(bad))
        if count:
            self.counts[key] += count
            self.note(check, message.format(at=int(np.argmax(bad.reshape(-1)))))

    def origin(self, document: int, start: int) -> str:
        name = self.store.ids[document] if 0 <= document < len(self.store) else f"<no document {document}>"
        return f"{name}@{start} (document index {document})"

    def piece(self, batch: Any) -> TokenSums:
        """Check one packed batch; return its stand-in raw sums over its claimed denominator."""
        index, T = int(batch.index), self.T
        numbers = np.asarray(batch.row_numbers, dtype=np.int64).reshape(-1)
        width = numbers.size
        self.batches += 1
        self.rows += width
        docs = np.asarray(batch.document_indices, dtype=np.int64).reshape(-1)
        starts = np.asarray(batch.starts, dtype=np.int64).reshape(-1)
        lengths = np.asarray(batch.segment_lengths, dtype=np.int64).reshape(-1)
        seg_rows = np.asarray(batch.segment_rows, dtype=np.int64).reshape(-1)
        self.digest.update(np.array([index, width], dtype=np.int64).tobytes())  # the order: as `packed._order` hashes it
        self.digest.update(numbers.tobytes())
        self._rows(index, numbers, width)

        arrays = [np.asarray(a) for a in (batch.inputs, batch.targets, batch.segment_ids, batch.position_ids, batch.loss_mask)]
        if width == 0 and docs.size == 0 and all(a.shape == (0, T) for a in arrays):  # a rank's empty share
            if int(batch.token_count):
                self.counts["padding"] += 1
                self.note("padding", f"batch {index}: an empty share claims {int(batch.token_count)} targets")
            return sums_of_units(0, int(batch.token_count))
        fill = np.bincount(seg_rows, weights=lengths, minlength=width) if docs.size else np.zeros(width)
        if (
            any(a.shape != (width, T) for a in arrays)
            or docs.size == 0
            or np.any(np.diff(seg_rows) < 0)
            or int(seg_rows.min()) < 0
            or int(seg_rows.max()) >= width
            or int(lengths.min()) < 1
            or np.any(fill > T)
            or np.any(np.bincount(seg_rows, minlength=width) == 0)
        ):
            self.counts["segments"] += 1
            shapes = [list(a.shape) for a in arrays]
            self.note("segments", f"batch {index}: arrays {shapes} and segment provenance do not form {width} rows of T={T}")
            return sums_of_units(0, int(batch.token_count))
        inputs, targets, segment_ids, position_ids, loss_mask = arrays

        # where each segment lies: its row's segments laid left to right from column 0
        ends = np.cumsum(lengths)
        row_first = np.searchsorted(seg_rows, np.arange(width))  # first segment of each row
        before = ends - lengths
        column = before - before[row_first][seg_rows]
        within = np.arange(docs.size) - row_first[seg_rows]  # expected segment id
        owner = np.repeat(np.arange(docs.size), lengths)  # segment of each real position
        offset = np.arange(owner.size) - before[owner]
        flat = seg_rows[owner] * T + column[owner] + offset

        expected_ids = np.full(width * T, -1, dtype=np.int64)
        expected_ids[flat] = within[owner]
        real = expected_ids >= 0
        self._count(
            "segments",
            "segments",
            segment_ids.reshape(-1) != expected_ids,
            f"batch {index} position {{at}}: segment id is not the expected one",
        )
        self._count(
            "positions",
            "positions",
            position_ids.reshape(-1)[flat] != offset,
            f"batch {index} real position {{at}}: position id does not restart at 0 at its segment and count up by 1",
        )
        pad_wrong = (~real & loss_mask.reshape(-1)) | (
            ~real & ((inputs.reshape(-1) != self.pad_id) | (targets.reshape(-1) != self.pad_id))
        )
        if not self.masked:  # no mask: every real target counts (a masked store's are the mask checks')
            pad_wrong |= real & ~loss_mask.reshape(-1)
        self._count(
            "padding",
            "padding",
            pad_wrong,
            f"batch {index} position {{at}}: loss_mask or pad id wrong (padding is pad_id, masked)",
        )
        claimed = int(batch.token_count)
        self._where(index, docs, starts, lengths)
        inside = self._inside(docs, starts, lengths)
        ok_pos = inside[owner]
        trained = real.copy()  # the store's bit at each real target (recomputed from the provenance)
        if self.masked and ok_pos.any():
            at = self.store.starts[docs[owner[ok_pos]]] + starts[owner[ok_pos]] + offset[ok_pos] + 1
            source: Any = self.store  # a store or a corpus
            trained[flat[ok_pos]] = source.mask_at(at)
        counted = int(np.count_nonzero(trained))
        if not self.masked and (claimed != counted or int(getattr(batch, "target_count", claimed)) != counted):
            self.counts["padding"] += 1
            self.note("padding", f"batch {index}: denominator {claimed} but {counted} counted targets; padding never counts")
        self.masks.packed(index, batch, loss_mask.astype(np.bool_), trained.reshape(width, T))
        if ok_pos.any():
            src = self.store.starts[docs[owner[ok_pos]]] + starts[owner[ok_pos]] + offset[ok_pos]
            pair = self.store.window_tokens(src, 2)  # input and target token, read from the store independently
            wrong = (inputs.reshape(-1)[flat[ok_pos]] != pair[:, 0]) | (targets.reshape(-1)[flat[ok_pos]] != pair[:, 1])
            where = np.flatnonzero(ok_pos)
            if wrong.any():
                self.counts["content"] += int(np.count_nonzero(wrong))
                s = int(owner[where[int(np.argmax(wrong))]])
                self.note(
                    "content",
                    f"batch {index}: segment {self.origin(int(docs[s]), int(starts[s]))}: ids differ from the document's tokens",
                )
        self.kept.append((self.target_first[docs[inside]] + starts[inside], lengths[inside]))

        # stand-in loss at every position, masked by the batch's own loss_mask: a pad counted would change the sum
        units = np.full(width * T, 1, dtype=np.int64)
        units[flat] = target_units(docs[owner], starts[owner] + offset)
        self.real_positions += owner.size
        self.denominator += claimed
        return sums_of_units(int(units[loss_mask.reshape(-1)].sum()), claimed)

    def _rows(self, index: int, numbers: IntArray, width: int) -> None:
        if 0 <= index < self.rows_per_batch.size:
            self.rows_per_batch[index] += width
        else:
            self.note("widths", f"batch index {index} is outside the epoch's {self.rows_per_batch.size} batches")
        known = (numbers >= 0) & (numbers < self.row_total)
        ok = numbers[known]
        repeats = int(np.count_nonzero(self.row_seen[ok])) + ok.size - int(np.unique(ok).size)
        if repeats or not known.all():
            self.counts["duplicate_rows"] += repeats + int(np.count_nonzero(~known))
            self.note("duplicates", f"batch {index}: a row number appears twice or is not a row of the packing")
        self.row_seen[ok] = True

    def _inside(self, docs: IntArray, starts: IntArray, lengths: IntArray) -> npt.NDArray[np.bool_]:
        known = (docs >= 0) & (docs < self.lengths.size)
        safe = np.where(known, docs, 0)
        same_part = known & (self.store.partition_codes[safe] == self.code)
        # every target of the segment inside its document: start >= 0 and start + length <= L - 1 (compare, never add)
        inside: npt.NDArray[np.bool_] = same_part & (starts >= 0) & (starts <= self.lengths[safe] - 1 - lengths)
        return inside

    def _where(self, index: int, docs: IntArray, starts: IntArray, lengths: IntArray) -> None:
        known = (docs >= 0) & (docs < self.lengths.size)
        safe = np.where(known, docs, 0)
        other = known & (self.store.partition_codes[safe] != self.code)
        crossing = ~known | ((starts < 0) | (starts > self.lengths[safe] - 1 - lengths))
        for check, bad, why in (
            ("cross_partition", other, "the document is in another partition"),
            ("cross_document", crossing, "its targets leave the document"),
        ):
            if bad.any():
                at = int(np.argmax(bad))
                self.counts[check] += int(np.count_nonzero(bad))
                self.note(check, f"batch {index} segment {at}: {self.origin(int(docs[at]), int(starts[at]))}: {why}")

    def finish(self) -> tuple[int, int]:
        """``(covered targets, targets seen more than once)`` from the tiling; notes coverage and widths failures."""
        self.masks.finish()
        firsts = np.concatenate([k[0] for k in self.kept]) if self.kept else np.zeros(0, dtype=np.int64)
        sizes = np.concatenate([k[1] for k in self.kept]) if self.kept else np.zeros(0, dtype=np.int64)
        order = np.argsort(firsts, kind="stable")
        firsts, ends = firsts[order], firsts[order] + sizes[order]
        reach = np.maximum.accumulate(ends) if ends.size else ends  # furthest target covered so far
        floor = np.concatenate([[0], reach[:-1]]) if ends.size else ends
        covered = int(np.maximum(ends - np.maximum(firsts, floor), 0).sum())
        repeated = int(sizes.sum()) - covered
        if repeated:
            at = int(np.argmax(firsts < floor))
            self.note(
                "duplicates", f"{repeated} targets appear more than once; the first repeat is in {self._target(int(firsts[at]))}"
            )
        if covered < self.target_count:
            gaps = np.flatnonzero(firsts > floor)
            missing = 0 if not firsts.size or firsts[0] > 0 else int(floor[gaps[0]]) if gaps.size else int(reach[-1])
            self.note(
                "coverage",
                f"{self.target_count - covered} of {self.target_count} targets never appeared; "
                f"the first is {self._target(missing)}",
            )
        wrong = np.flatnonzero(self.rows_per_batch != self.widths)
        if wrong.size:
            at = int(wrong[0])
            self.note(
                "widths",
                f"batch {at} has {int(self.rows_per_batch[at])} rows; "
                f"expected {int(self.widths[at])} (rows, batches [B] * k + [r])",
            )
        return covered, repeated

    def _target(self, number: int) -> str:
        document = int(np.searchsorted(self.target_first, number, side="right")) - 1  # the last one starting at or before
        return f"target {number - int(self.target_first[document])} of {self.store.ids[document]} (document index {document})"
