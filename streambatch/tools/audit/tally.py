"""The audit's primary pass: every check on each batch, vectorized, with the first offending place of each.

One pass for every item kind.  A batch is read as segments (`Segments`: a window
row is one segment of ``T`` targets) and checked against the store alone:

- shape: rows of windows are ``[width, T]`` with no id beyond the rows
  (``padding``, ``widths``); a batch with packed columns must lay its segments
  out in ``width`` rows of ``T`` (``segments``);
- where: every segment's targets inside its own document (``cross_document``)
  of the epoch's partition (``cross_partition``);
- content: inputs and targets are the document's own tokens, read from the
  store apart from the gather (a whole-row batch compares rows of ``T + 1``
  tokens, any other the pairs at each real position);
- the packed columns, when the batch has them: segment ids 0, 1, ... by segment
  within a row and -1 at padding, position ids restarting at 0 at each segment,
  padding the pad id with ``loss_mask`` False and in no ``token_count``;
- the loss mask and the denominators (`streambatch.tools.audit.masks`);
- the items once (`streambatch.tools.audit.coverage`), and the batch widths.

It returns each batch's stand-in raw sums (`streambatch.tools.stand_in`) for the
accumulation check.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...batch.reduce import TokenSums
from ..stand_in import loss_units, sums_of_units, target_units
from .coverage import Coverage, Order
from .expected import Expected, IntArray, Segments, segments
from .masks import MaskTally


class Where(NamedTuple):
    """Where a batch's segments lie: a known document, its index (0 where unknown), all targets inside it, and
    inside it in the epoch's partition (valid)."""

    known: npt.NDArray[np.bool_]
    safe: IntArray
    inside: npt.NDArray[np.bool_]
    valid: npt.NDArray[np.bool_]


COUNTS = ("padding", "content", "segments", "positions", "cross_document", "cross_partition", "foreign", "duplicates", "widths")


class Tally:
    """Every check per batch; ``first`` holds the first offending place of each failed check."""

    def __init__(self, expected: Expected, coverage: Coverage) -> None:
        self.expected, self.coverage = expected, coverage
        self.masks = MaskTally(expected.masked, expected.context_length, coverage.counted_targets)
        self.rows_per_batch = np.zeros(expected.widths.size, dtype=np.int64)
        self.order = Order()
        self.counts = dict.fromkeys(COUNTS, 0)
        self.pieces = self.rows = self.token_count = self.real_positions = self.denominator = 0
        self.first: dict[str, str] = {}
        if expected.packed:
            self.pad_id = int(expected.epoch.items.space.pad_id)  # one packing's (epoch.store refuses a mixture)

    def note(self, check: str, message: str) -> None:
        self.first.setdefault(check, message)

    def count_at(self, check: str, key: str, seg: Segments, bad: npt.NDArray[np.bool_], why: str) -> None:
        """Count the segments *bad* under *key*; note the first under *check* (a row of windows, or a segment)."""
        count = int(np.count_nonzero(bad))
        if count:
            self.counts[key] += count
            at = int(np.argmax(bad))
            where = self.expected.origin(int(seg.documents[at]), int(seg.starts[at]))
            self.note(check, f"batch {seg.batch} {'row' if seg.whole else 'segment'} {at}: {where}: {why}")

    # -- one batch ------------------------------------------------------------------------------
    def piece(self, piece: Any) -> TokenSums:
        """Check one batch (or batch-like object); return its stand-in raw sums over its own denominator."""
        ex = self.expected
        seg = segments(piece, ex.context_length)
        self.pieces += 1
        self.rows += seg.width
        index, keys = self.coverage.key(piece, seg)
        self.order.add(index, keys)
        inputs, targets = np.asarray(piece.inputs), np.asarray(piece.targets)
        self._batch_rows(seg, inputs.shape[0] if seg.whole and inputs.ndim == 2 else seg.width)
        self.coverage.rows(self, seg, piece)
        if not seg.whole:
            columns = self._packed_shape(seg, piece, inputs, targets)
            if columns is None:
                return sums_of_units(0, int(piece.token_count))
            where = self._where(seg)
            self.coverage.primary(self, seg, where)
            return self._packed(seg, piece, where.valid, columns)
        shaped = self._window_shape(seg, inputs, targets)
        where = self._where(seg)
        window = self.coverage.primary(self, seg, where)  # the rows that are windows of the epoch
        if shaped:
            self._content(seg, np.flatnonzero(where.inside), inputs, targets)
            self.masks.check(seg.batch, piece, lambda: self._window_bits(seg, window), np.flatnonzero(window))
        self.token_count += int(targets.size)
        units = int(loss_units(seg.documents, seg.starts, ex.context_length).sum())
        return sums_of_units(units, int(targets.size))  # the batch's real denominator: its target ids

    def _batch_rows(self, seg: Segments, shown: int) -> None:
        if 0 <= seg.batch < self.rows_per_batch.size:
            self.rows_per_batch[seg.batch] += shown
        else:
            self.counts["widths"] += 1
            self.note("widths", f"batch index {seg.batch} is outside the epoch's {self.rows_per_batch.size} batches")

    def _where(self, seg: Segments) -> Where:
        """Segments whose targets lie inside their own document, and those of a document of another partition
        (counts and notes ``cross_document`` and ``cross_partition``)."""
        ex = self.expected
        known = (seg.documents >= 0) & (seg.documents < ex.lengths.size)
        safe = np.where(known, seg.documents, 0)
        other = known & ~ex.included[safe]
        # every target of the segment inside its document: start >= 0 and start + length <= L - 1 (compare, never add)
        last = ex.lengths[safe] - (1 + ex.context_length) if seg.whole else ex.lengths[safe] - 1 - seg.lengths
        inside = known & (seg.starts >= 0) & (seg.starts <= last)
        if seg.whole:  # a row naming no document is no window of the epoch (coverage), not a crossing
            self.count_at("cross_document", "cross_document", seg, known & ~inside, "its T + 1 tokens leave the document")
        else:
            self.count_at("cross_document", "cross_document", seg, ~inside, "its targets leave the document")
        self.count_at("cross_partition", "cross_partition", seg, other, "the document is in another partition")
        return Where(known, safe, inside, inside & ~other)

    # -- rows of windows -------------------------------------------------------------------------
    def _window_shape(self, seg: Segments, inputs: npt.NDArray[Any], targets: npt.NDArray[Any]) -> bool:
        T, width = self.expected.context_length, seg.width
        extra = max(0, inputs.size - width * T) + max(0, targets.size - width * T)
        if extra:
            self.counts["padding"] += extra
            self.note("padding", f"batch {seg.batch}: {extra} ids beyond its {width} rows of {T} (shape {list(inputs.shape)})")
        if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.shape[1] != T:
            self.counts["widths"] += 1
            self.note(
                "widths", f"batch {seg.batch}: inputs {list(inputs.shape)} and targets {list(targets.shape)} are not [width, {T}]"
            )
        return inputs.ndim == 2 and targets.shape == inputs.shape and inputs.shape[0] >= width and inputs.shape[1] == T

    def _window_bits(self, seg: Segments, valid: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        picked = np.flatnonzero(valid)
        positions = self.expected.store.starts[seg.documents[picked]] + seg.starts[picked]
        store: Any = self.expected.store  # a store or a corpus with a loss mask
        bits: npt.NDArray[np.bool_] = store.target_mask(positions.astype(np.int64), self.expected.context_length)
        return bits

    def _content(self, seg: Segments, inside: npt.NDArray[np.intp], inputs: npt.NDArray[Any], targets: npt.NDArray[Any]) -> None:
        """Rows of windows: each inside row's ``T + 1`` tokens read from the store, apart from the epoch."""
        if not inside.size:
            return
        ex = self.expected
        T = ex.context_length
        positions = ex.store.starts[seg.documents[inside]] + seg.starts[inside]
        window = ex.store.window_tokens(positions, T + 1)
        wrong = (inputs[inside] != window[:, :T]).sum(axis=1) + (targets[inside] != window[:, 1:]).sum(axis=1)
        bad = int(wrong.sum())
        if bad:
            self.counts["padding"] += bad
            at = int(inside[np.argmax(wrong > 0)])
            origin = ex.origin(int(seg.documents[at]), int(seg.starts[at]))
            self.note(
                "padding", f"batch {seg.batch} row {at}: {origin}: ids differ from the document's tokens (padding or altered ids)"
            )

    # -- packed rows ------------------------------------------------------------------------------
    def _packed_shape(
        self, seg: Segments, piece: Any, inputs: npt.NDArray[Any], targets: npt.NDArray[Any]
    ) -> tuple[npt.NDArray[Any], ...] | None:
        """The packed columns, when they and the provenance form ``width`` rows of ``T`` (else None, noted)."""
        T, width, rows, lengths = self.expected.context_length, seg.width, seg.rows, seg.lengths
        arrays = (inputs, targets, *(np.asarray(a) for a in (piece.segment_ids, piece.position_ids, piece.loss_mask)))
        if width == 0 and seg.documents.size == 0 and all(a.shape == (0, T) for a in arrays):  # a rank's empty share
            if int(piece.token_count):
                self.counts["padding"] += 1
                self.note("padding", f"batch {seg.batch}: an empty share claims {int(piece.token_count)} targets")
            return None
        fill = np.bincount(rows, weights=lengths, minlength=width) if rows.size else np.zeros(width)
        if (
            any(a.shape != (width, T) for a in arrays)
            or seg.documents.size == 0
            or rows.size != seg.documents.size
            or np.any(np.diff(rows) < 0)
            or int(rows.min()) < 0
            or int(rows.max()) >= width
            or int(lengths.min()) < 1
            or np.any(fill > T)
            or np.any(np.bincount(rows, minlength=width) == 0)
        ):
            self.counts["segments"] += 1
            shapes = [list(a.shape) for a in arrays]
            self.note("segments", f"batch {seg.batch}: arrays {shapes} and segment provenance do not form {width} rows of T={T}")
            return None
        return arrays

    def _packed(self, seg: Segments, piece: Any, inside: npt.NDArray[np.bool_], arrays: Any) -> TokenSums:
        """The packed columns, content and mask of a batch that lays out its segments; its stand-in sums."""
        ex = self.expected
        T, width, index = ex.context_length, seg.width, seg.batch
        inputs, targets, segment_ids, position_ids, loss_mask = (a.reshape(-1) for a in arrays)
        loss_mask = loss_mask.astype(np.bool_)
        docs, starts, lengths, rows = seg.documents, seg.starts, seg.lengths, seg.rows
        # where each segment lies: its row's segments laid left to right from column 0
        before = np.cumsum(lengths) - lengths
        row_first = np.searchsorted(rows, np.arange(width))  # first segment of each row
        column = before - before[row_first][rows]
        owner = np.repeat(np.arange(docs.size), lengths)  # segment of each real position
        offset = np.arange(owner.size) - before[owner]
        flat = rows[owner] * T + column[owner] + offset
        expected_ids = np.full(width * T, -1, dtype=np.int64)
        expected_ids[flat] = (np.arange(docs.size) - row_first[rows])[owner]
        real = expected_ids >= 0
        self._flag("segments", segment_ids != expected_ids, f"batch {index} position {{at}}: segment id is not the expected one")
        self._flag(
            "positions",
            position_ids[flat] != offset,
            f"batch {index} real position {{at}}: position id does not restart at 0 at its segment and count up by 1",
        )
        pad_wrong = ~real & (loss_mask | (inputs != self.pad_id) | (targets != self.pad_id))
        if not ex.masked:  # no mask: every real target counts (a masked store's are the mask checks')
            pad_wrong |= real & ~loss_mask
        self._flag("padding", pad_wrong, f"batch {index} position {{at}}: loss_mask or pad id wrong (padding is pad_id, masked)")
        claimed = int(piece.token_count)
        ok = inside[owner]
        source = ex.store.starts[docs[owner[ok]]] + starts[owner[ok]] + offset[ok]  # each real input's flat position
        trained = real.copy()  # the store's bit at each real target (recomputed from the provenance)
        if ex.masked and ok.any():
            trained[flat[ok]] = ex.store.mask_at(source + 1)
        if not ex.masked:
            counted = int(np.count_nonzero(trained))
            if claimed != counted or int(getattr(piece, "target_count", claimed)) != counted:
                self.counts["padding"] += 1
                self.note("padding", f"batch {index}: denominator {claimed} but {counted} counted targets; padding never counts")
        self.masks.check(index, piece, lambda: trained.reshape(width, T), np.arange(width))
        if ok.any():
            pair = ex.store.window_tokens(source, 2)  # input and target token, read from the store independently
            wrong = (inputs[flat[ok]] != pair[:, 0]) | (targets[flat[ok]] != pair[:, 1])
            if wrong.any():
                self.counts["content"] += int(np.count_nonzero(wrong))
                s = int(owner[np.flatnonzero(ok)[int(np.argmax(wrong))]])
                origin = ex.origin(int(docs[s]), int(starts[s]))
                self.note("content", f"batch {index}: segment {origin}: ids differ from the document's tokens")
        # stand-in loss at every position, masked by the batch's own loss_mask: a pad counted would change the sum
        units = np.full(width * T, 1, dtype=np.int64)
        units[flat] = target_units(docs[owner], starts[owner] + offset)
        self.real_positions += owner.size
        self.denominator += claimed
        self.token_count += claimed
        return sums_of_units(int(units[loss_mask].sum()), claimed)

    def _flag(self, check: str, bad: npt.NDArray[np.bool_], message: str) -> None:
        count = int(np.count_nonzero(bad))
        if count:
            self.counts[check] += count
            self.note(check, message.format(at=int(np.argmax(bad))))

    # -- the end of the pass ------------------------------------------------------------------------
    def finish(self) -> tuple[int, int]:
        """``(covered, repeated)`` items of the coverage; notes coverage, the epoch-wide mask checks and widths."""
        covered, repeated = self.coverage.finish(self)
        self.masks.finish()
        ex = self.expected
        wrong = np.flatnonzero(self.rows_per_batch != ex.widths)
        if wrong.size:
            self.counts["widths"] += int(wrong.size)
            at = int(wrong[0])
            self.note(
                "widths",
                f"batch {at} has {int(self.rows_per_batch[at])} rows; expected {int(ex.widths[at])} "
                f"(batch_size={ex.batch_size}, widths [B] * k + [r])",
            )
        return covered, repeated
