"""What an audit found: `CHECKS` in report order and `AuditResult`, with the chapter's PROOF line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...batch.reduce import TokenMean
from .masks import MASK_CHECKS

CHECKS = (  # causes before consequences: a padded row also breaks widths and the token mean
    "padding",
    "cross_document",
    "cross_partition",
    "duplicates",
    "coverage",
    "widths",
    "accumulation",
    "replay",
    "different_seed",
    *MASK_CHECKS,  # loss masks and denominators (`streambatch.tools.audit.masks`), run for every store
)
RELATIVE_TOLERANCE = 1e-12


class Checked:
    """What every audit result answers from its ``failures`` (check -> first offending place, in check order)."""

    failures: dict[str, str]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.failures

    @property
    def first_failure(self) -> tuple[str, str] | None:
        """``(check, message)`` of the first failed check, in the order the checks run, or None."""
        return next(iter(self.failures.items()), None)


@dataclass(frozen=True)
class AuditResult(Checked):
    """Every check of one audit, its counts, and the first offending place of each failed check."""

    expected_windows: int
    covered_windows: int
    rows: int
    batches: int
    duplicate_windows: int
    padding_ids: int
    cross_document_windows: int
    cross_partition_windows: int
    foreign_windows: int  # rows that are no window of the epoch otherwise (off the stride grid, no such document)
    width_errors: int
    replay: str  # "same", "different" or "unchecked"
    different_seed: str  # "changed", "same" (order), "windows_changed" (membership), "n/a" (< 2 windows), "unchecked"
    folded_mean: TokenMean | None
    direct_mean: TokenMean | None
    token_count: int
    failures: dict[str, str] = field(default_factory=dict)  # check -> first offending place, in CHECKS order
    seconds: float = 0.0
    mask: dict[str, Any] = field(default_factory=dict)  # the loss-mask checks' counts (streambatch.tools.audit.masks)
    mask_proof: str = ""  # their PROOF fields: empty for a store without a loss mask
    tokens: dict[str, Any] = field(default_factory=dict)  # tokens in = out + left out (streambatch.tools.audit.ledger)

    @property
    def replay_matches(self) -> bool:
        """A second pass gave the identical order."""
        return self.replay == "same"

    @property
    def different_seed_changes_order(self) -> bool:
        """Another seed changed the order and kept the windows."""
        return self.different_seed == "changed"

    @property
    def accumulation_equal(self) -> bool:
        """The folded token mean equals the direct one (within `RELATIVE_TOLERANCE`)."""
        return "accumulation" not in self.failures

    def proof_line(self, *, cross_document: bool = True) -> str:
        """The chapter's ``PROOF|...`` line; ``cross_document=N`` is appended after the chapter's fields.

        With ``cross_document=False`` it is exactly the chapter's format.
        """
        line = (
            f"PROOF|coverage={self.covered_windows}/{self.expected_windows}|duplicates={self.duplicate_windows}"
            f"|padding={self.padding_ids}|cross_partition={self.cross_partition_windows}"
            f"|replay={self.replay}|different_seed={self.different_seed}"
            f"|accumulation={'equal' if self.accumulation_equal else 'different'}"
        )
        line += self.mask_proof
        return line + f"|cross_document={self.cross_document_windows}" if cross_document else line

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (means as ``[token_count, mean_loss, mean_gradient]``)."""

        def mean(value: TokenMean | None) -> Any:
            return None if value is None else [value.token_count, value.mean_loss, value.mean_gradient.tolist()]

        return {
            "ok": self.ok,
            "proof": self.proof_line(),
            "expected_windows": self.expected_windows,
            "covered_windows": self.covered_windows,
            "rows": self.rows,
            "batches": self.batches,
            "duplicate_windows": self.duplicate_windows,
            "padding_ids": self.padding_ids,
            "cross_document_windows": self.cross_document_windows,
            "cross_partition_windows": self.cross_partition_windows,
            "foreign_windows": self.foreign_windows,
            "width_errors": self.width_errors,
            "replay": self.replay,
            "different_seed": self.different_seed,
            "folded_mean": mean(self.folded_mean),
            "direct_mean": mean(self.direct_mean),
            "token_count": self.token_count,
            "failures": dict(self.failures),
            "seconds": self.seconds,
            **({"loss_mask": dict(self.mask)} if self.mask.get("masked") else {}),
            **({"tokens": dict(self.tokens)} if self.tokens else {}),
        }
