"""The audit's loss-mask checks: each batch's ``loss_mask`` and denominator recomputed from the store's mask bits.

Three things are proved for a store with a loss mask (`MASK_CHECKS`):

- ``loss_mask``: at every target of every row the batch's ``loss_mask`` is the
  store's bit for that token: a masked target is never counted, a trained one
  never dropped (packed rows: padding never counted either);
- ``denominator``: every batch's ``token_count`` is the number of its counted
  targets;
- ``counted_once``: the counted targets of all batches sum to the counted
  targets of the epoch's items recomputed from the store (with coverage and no
  duplicates, each counted target is counted exactly once per item holding it).

``global_count`` is the hook for the global count (issue 23, item 4): when a
batch carries ``global_token_count`` it must equal the counted targets of the
whole batch over every share (`MaskTally.global_count`, masked or not: it
runs as soon as the batches carry the attribute).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...model.source import TokenSource

MASK_CHECKS = ("loss_mask", "denominator", "counted_once", "global_count")


class MaskTally:
    """The mask checks of one audit pass over the pieces of an epoch whose store is *store*."""

    def __init__(self, masked: bool, context_length: int, expected_counted: int) -> None:
        self.context_length = context_length
        self.masked = masked
        self.expected_counted = expected_counted  # counted targets of every item of the epoch
        self.counted = 0  # counted targets the pieces' loss masks hold (recomputed, at valid rows)
        self.mask_errors = self.denominator_errors = 0
        self.first: dict[str, str] = {}
        self._batch_counts: dict[int, list[int]] = {}  # batch index -> [counted over its shares, global_token_count]

    def note(self, check: str, message: str) -> None:
        self.first.setdefault(check, message)

    def check(self, index: int, piece: Any, expected: Any, rows: npt.NDArray[np.intp]) -> None:
        """Check *piece*'s ``loss_mask`` (None: every target counts) at rows *rows* against *expected*, a callable
        giving the store's bits there (``[rows, T]``: False at padding), made only for a store with a loss mask."""
        given = getattr(piece, "loss_mask", None)
        if not self.masked:  # every target counts: the other checks prove padding out of the denominators
            if getattr(piece, "global_token_count", None) is not None:
                counted = int(np.size(piece.targets)) if given is None else int(np.count_nonzero(given))
                self.global_count(index, piece, counted)
            return
        T = self.context_length
        width = int(np.shape(piece.targets)[0]) if np.ndim(piece.targets) == 2 else 0
        mask = np.ones((width, T), np.bool_) if given is None else np.asarray(given, dtype=np.bool_)
        if mask.shape != (width, T):
            self.mask_errors += 1
            self.note("loss_mask", f"batch {index}: loss_mask has shape {list(mask.shape)}, not [{width}, {T}]")
            return
        bits = expected()
        self._compare(index, mask[rows], bits, rows)
        self.counted += int(np.count_nonzero(bits))
        self._denominator(index, piece, int(np.count_nonzero(mask)))

    def _compare(
        self, index: int, mask: npt.NDArray[np.bool_], expected: npt.NDArray[np.bool_], rows: npt.NDArray[np.intp]
    ) -> None:
        wrong = mask != expected
        bad = int(np.count_nonzero(wrong))
        if not bad:
            return
        self.mask_errors += bad
        row, column = (int(v) for v in np.argwhere(wrong)[0])
        what = "a masked target (or padding) is counted" if mask[row, column] else "a trained target is not counted"
        self.note("loss_mask", f"batch {index} row {int(rows[row])} target {column}: {what} ({bad} targets differ)")

    def _denominator(self, index: int, piece: Any, counted: int) -> None:
        given = int(piece.token_count)
        if given != counted:
            self.denominator_errors += 1
            self.note("denominator", f"batch {index}: token_count={given} but its loss_mask counts {counted} targets")
        self.global_count(index, piece, counted)

    def global_count(self, index: int, piece: Any, counted: int) -> None:
        """Gather the hook's sums: a share's counted targets under its batch, and the ``global_token_count`` it says."""
        said = getattr(piece, "global_token_count", None)
        entry = self._batch_counts.setdefault(index, [0, -1 if said is None else int(said)])
        entry[0] += counted
        if said is not None and int(said) != entry[1]:
            self.note("global_count", f"batch {index}: shares say global_token_count {entry[1]} and {int(said)}")

    def finish(self) -> None:
        """The epoch-wide checks: counted targets against the items', and each batch's global count."""
        if self.masked and self.counted != self.expected_counted:
            self.note(
                "counted_once",
                f"the batches count {self.counted} targets but the epoch's items hold {self.expected_counted} counted "
                "targets (a target missing or counted twice)",
            )
        for index, (summed, said) in self._batch_counts.items():
            if said >= 0 and said != summed:
                self.note("global_count", f"batch {index}: global_token_count={said} but its shares count {summed}")
                break

    def fields(self) -> dict[str, Any]:
        """The audit result's mask fields."""
        return {
            "masked": self.masked,
            "counted_targets": self.counted,
            "expected_counted_targets": self.expected_counted,
            "mask_errors": self.mask_errors,
            "denominator_errors": self.denominator_errors,
        }

    def proof_fields(self) -> str:
        """The PROOF line's mask fields (only for a masked store: an unmasked proof line is unchanged)."""
        if not self.masked:
            return ""
        return (
            f"|counted={self.counted}/{self.expected_counted}|loss_mask={self.mask_errors}|denominators={self.denominator_errors}"
        )


_UNITS_BLOCK = 1 << 22  # targets read per step of `counted_units`


def counted_units(store: TokenSource, documents: npt.NDArray[np.int64]) -> tuple[int, int]:
    """``(stand-in units, count)`` over the counted targets of *documents* (the packed audit's direct mean under a
    mask: `streambatch.tools.stand_in.target_units` at every target whose bit is set), in bounded blocks."""
    from ..stand_in import target_units

    lengths = np.maximum(store.lengths[documents].astype(np.int64) - 1, 0)
    units = count = 0
    ends = np.cumsum(lengths)
    lo = 0
    while lo < documents.size:
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + _UNITS_BLOCK, side="right")))
        docs, sizes = documents[lo:hi], lengths[lo:hi]
        owner = np.repeat(np.arange(docs.size), sizes)
        targets = np.arange(owner.size) - (np.cumsum(sizes) - sizes)[owner]
        trained = store.mask_at(store.starts[docs[owner]] + targets + 1)
        units += int(target_units(docs[owner][trained], targets[trained]).sum())
        count += int(np.count_nonzero(trained))
        lo = hi
    return units, count
