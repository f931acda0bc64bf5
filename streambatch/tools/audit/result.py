"""What an audit found, in the two PROOF lines: `AuditResult` (windows: the chapter's line) and `PackAuditResult`
(packed rows: ``PROOF|mode=pack|...``), each with its checks in report order (`CHECKS`, `PACK_CHECKS`)."""

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
PACK_CHECKS = (
    "segments",
    "positions",
    "padding",
    "content",
    "cross_document",
    "cross_partition",
    "duplicates",
    "coverage",
    "widths",
    "accumulation",
    "replay",
    "different_seed",
    *MASK_CHECKS,
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


def _mean(value: TokenMean | None) -> Any:
    """A token mean as JSON: ``[token_count, mean_loss, mean_gradient]``."""
    return None if value is None else [value.token_count, value.mean_loss, value.mean_gradient.tolist()]


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
            "folded_mean": _mean(self.folded_mean),
            "direct_mean": _mean(self.direct_mean),
            "token_count": self.token_count,
            "failures": dict(self.failures),
            "seconds": self.seconds,
            **({"loss_mask": dict(self.mask)} if self.mask.get("masked") else {}),
            **({"tokens": dict(self.tokens)} if self.tokens else {}),
        }


@dataclass(frozen=True)
class PackAuditResult(Checked):
    """Every check of one packed audit, its counts, and the first offending place of each failed check."""

    targets: int
    covered_targets: int
    repeated_targets: int
    rows: int
    expected_rows: int
    batches: int
    counts: dict[str, int]
    replay: str
    different_seed: str
    folded_mean: TokenMean | None
    direct_mean: TokenMean | None
    real_positions: int
    denominator: int
    failures: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    mask: dict[str, Any] = field(default_factory=dict)  # the loss-mask checks' counts (streambatch.tools.audit.masks)
    mask_proof: str = ""  # their PROOF fields: empty for a store without a loss mask

    def proof_line(self) -> str:
        """``PROOF|mode=pack|targets=N/N|duplicates=0|...``: the packed counterpart of the chapter's line."""
        c = self.counts
        return (
            f"PROOF|mode=pack|targets={self.covered_targets}/{self.targets}"
            f"|duplicates={self.repeated_targets + c['duplicate_rows']}|cross_document={c['cross_document']}"
            f"|cross_partition={c['cross_partition']}|content={c['content']}|segments={c['segments']}"
            f"|positions={c['positions']}|padding={c['padding']}|replay={self.replay}|different_seed={self.different_seed}"
            f"|accumulation={'different' if 'accumulation' in self.failures else 'equal'}{self.mask_proof}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (means as ``[token_count, mean_loss, mean_gradient]``)."""
        return {
            "ok": self.ok,
            "proof": self.proof_line(),
            "mode": "pack",
            "targets": self.targets,
            "covered_targets": self.covered_targets,
            "repeated_targets": self.repeated_targets,
            "rows": self.rows,
            "expected_rows": self.expected_rows,
            "batches": self.batches,
            **self.counts,
            "replay": self.replay,
            "different_seed": self.different_seed,
            "folded_mean": _mean(self.folded_mean),
            "direct_mean": _mean(self.direct_mean),
            "real_positions": self.real_positions,
            "denominator": self.denominator,
            "failures": dict(self.failures),
            "seconds": self.seconds,
            **({"loss_mask": dict(self.mask)} if self.mask.get("masked") else {}),
        }
