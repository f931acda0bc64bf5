"""The audit's primary pass: every check on each batch, vectorized, with the first offending place of each."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.reduce import TokenSums
from ..stand_in import loss_units, sums_of_units
from .expected import Expected, Rows, provenance
from .masks import MaskTally
from .order import OrderPass

_STAMP_BLOCK = (1 << 16) - 1  # rows per stamp block: stamps 1..65535 fit uint16, 0 means "never seen"


class Tally:
    """The primary pass: every check per piece, vectorized; first offending place per check."""

    def __init__(self, expected: Expected) -> None:
        self.expected = expected
        self.masks = MaskTally(expected.store, expected.context_length, expected.counted_targets)
        self.stamps = np.zeros(expected.window_count, dtype=np.uint16)
        self.rows_per_batch = np.zeros(expected.widths.size, dtype=np.int64)
        self.order = OrderPass(expected, membership=False)
        self.pieces = self.rows = self.valid_rows = 0
        self.padding = self.cross_document = self.cross_partition = self.foreign = self.width_errors = 0
        self.token_count = 0
        self.first: dict[str, str] = {}

    def note(self, check: str, message: str) -> None:
        self.first.setdefault(check, message)

    def piece(self, piece: Any) -> TokenSums:
        ex = self.expected
        index, documents, starts = provenance(piece)
        rows = Rows(ex, documents, starts)
        width = documents.size
        self.pieces += 1
        self.rows += width
        self.order.add(index, documents, starts, rows)
        inputs, targets = np.asarray(piece.inputs), np.asarray(piece.targets)
        self._shape(index, width, inputs, targets)
        self._where(index, rows)
        self._content(index, rows, inputs, targets)
        self._masks(index, piece, rows, inputs)
        self._stamp(index, rows)
        units = int(loss_units(documents, starts, ex.context_length).sum())
        self.token_count += int(targets.size)
        return sums_of_units(units, int(targets.size))  # the batch's real denominator: its target ids

    def _shape(self, index: int, width: int, inputs: npt.NDArray[Any], targets: npt.NDArray[Any]) -> None:
        T = self.expected.context_length
        extra = max(0, inputs.size - width * T) + max(0, targets.size - width * T)
        if extra:
            self.padding += extra
            self.note("padding", f"batch {index}: {extra} ids beyond its {width} rows of {T} (shape {list(inputs.shape)})")
        shown = inputs.shape[0] if inputs.ndim == 2 else width  # rows the model is fed
        if inputs.ndim != 2 or inputs.shape != targets.shape or inputs.shape[1] != T:
            self.width_errors += 1
            self.note(
                "widths", f"batch {index}: inputs {list(inputs.shape)} and targets {list(targets.shape)} are not [width, {T}]"
            )
        if 0 <= index < self.rows_per_batch.size:
            self.rows_per_batch[index] += shown
        else:
            self.width_errors += 1
            self.note("widths", f"batch index {index} is outside the epoch's {self.rows_per_batch.size} batches")

    def _where(self, index: int, rows: Rows) -> None:
        ex = self.expected
        self.cross_document += self._count(
            "cross_document", index, rows, rows.cross_document, "its T + 1 tokens leave the document"
        )
        self.cross_partition += self._count(
            "cross_partition", index, rows, rows.cross_partition, "the document is in another partition"
        )
        self.foreign += self._count(
            "coverage", index, rows, rows.foreign, f"no such window (no such document, or off the stride-{ex.stride} grid)"
        )

    def _count(self, check: str, index: int, rows: Rows, mask: npt.NDArray[np.bool_], why: str) -> int:
        count = int(np.count_nonzero(mask))
        if count:
            at = int(np.argmax(mask))
            self.note(
                check, f"batch {index} row {at}: {self.expected.origin(int(rows.documents[at]), int(rows.starts[at]))}: {why}"
            )
        return count

    def _content(self, index: int, rows: Rows, inputs: npt.NDArray[Any], targets: npt.NDArray[Any]) -> None:
        ex = self.expected
        T = ex.context_length
        width = rows.documents.size
        if inputs.ndim != 2 or targets.shape != inputs.shape or inputs.shape[0] < width or inputs.shape[1] != T:
            return  # reported under widths
        inside = np.flatnonzero(rows.inside)
        if not inside.size:
            return
        positions = ex.store.starts[rows.documents[inside]] + rows.starts[inside]
        window = ex.store.window_tokens(positions, T + 1)  # gathered independently of the epoch
        wrong = (inputs[inside] != window[:, :T]).sum(axis=1) + (targets[inside] != window[:, 1:]).sum(axis=1)
        bad = int(wrong.sum())
        if bad:
            self.padding += bad
            at = int(inside[np.argmax(wrong > 0)])
            origin = ex.origin(int(rows.documents[at]), int(rows.starts[at]))
            self.note(
                "padding", f"batch {index} row {at}: {origin}: ids differ from the document's tokens (padding or altered ids)"
            )

    def _masks(self, index: int, piece: Any, rows: Rows, inputs: npt.NDArray[Any]) -> None:
        """The loss-mask checks at the rows that are windows (`streambatch.tools.audit.masks`)."""
        ex = self.expected
        if inputs.ndim != 2 or inputs.shape[0] < rows.documents.size or inputs.shape[1] != ex.context_length:
            return  # reported under widths
        picked = np.flatnonzero(rows.window)
        positions = ex.store.starts[rows.documents[picked]] + rows.starts[picked]
        self.masks.windows(index, piece, positions.astype(np.int64), picked)

    def _stamp(self, index: int, rows: Rows) -> None:
        picked = np.flatnonzero(rows.window)
        self.valid_rows += picked.size
        for lo in range(0, picked.size, _STAMP_BLOCK):
            block = picked[lo : lo + _STAMP_BLOCK]
            numbers = rows.numbers[block]
            mine = np.arange(1, block.size + 1, dtype=np.uint16)
            earlier = self.stamps[numbers] != 0  # seen in an earlier block
            # two rows of one window: only one stamp survives, so the other row reads a stamp not its own
            # (written back to front so that, as numpy stores the last write, the first row keeps its stamp
            # and the message names the repeat; the count is exact either way)
            self.stamps[numbers[::-1]] = mine[::-1]
            again = earlier | (self.stamps[numbers] != mine)
            if again.any():
                at = int(block[np.argmax(again)])
                origin = self.expected.origin(int(rows.documents[at]), int(rows.starts[at]))
                self.note("duplicates", f"batch {index} row {at}: window {origin} appears more than once")

    def finish_coverage(self) -> int:
        ex = self.expected
        if ex.kept is not None:  # skip_untrained: a dropped window must never appear, and counts as not expected
            shown = self.stamps != 0
            emitted = shown & ~ex.kept
            if emitted.any():
                documents, starts = ex.locate(np.flatnonzero(emitted)[:1].astype(np.int64))
                origin = ex.origin(int(documents[0]), int(starts[0]))
                self.note("coverage", f"window {origin} has no counted target but appears (skip_untrained dropped it)")
            self.stamps[~ex.kept] = 0
            self.foreign += int(np.count_nonzero(emitted))
        covered = int(np.count_nonzero(self.stamps))
        self.masks.finish()
        if covered < ex.item_count:
            missing = np.flatnonzero((self.stamps == 0) if ex.kept is None else (self.stamps == 0) & ex.kept)
            documents, starts = ex.locate(missing[:1].astype(np.int64))
            origin = ex.origin(int(documents[0]), int(starts[0]))
            self.note("coverage", f"{missing.size} of {ex.item_count} windows never appeared; the first is {origin}")
        wrong = np.flatnonzero(self.rows_per_batch != ex.widths)
        if wrong.size:
            self.width_errors += int(wrong.size)
            at = int(wrong[0])
            self.note(
                "widths",
                f"batch {at} has {int(self.rows_per_batch[at])} rows; expected {int(ex.widths[at])} "
                f"(batch_size={ex.batch_size}, widths [B] * k + [r])",
            )
        return covered
