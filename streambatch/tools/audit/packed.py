"""Prove a packed epoch right at scale: the packed PROOF line (``streambatch audit --pack``).

`audit_packed_epoch` iterates every (rank, worker) share of an
``Epoch(..., pack=True)`` and checks, from what each batch says about itself
and the store alone (`streambatch.tools.audit.pack_tally`):

- ``targets=covered/total``, ``duplicates``: every target of every document of
  the partition lies in exactly one segment of the epoch (segments sorted by
  their first target tile the partition's targets), and no row repeats;
- ``cross_document`` / ``cross_partition``: every segment's targets lie inside
  its own document, of the epoch's partition;
- ``content``: inputs and targets are the document's own tokens;
- ``segments`` / ``positions``: segment ids are 0, 1, ... by segment within a
  row and -1 at padding, position ids restart at 0 at each segment;
- ``padding``: padding holds the pad id with ``loss_mask`` False and is in no
  ``token_count`` (a batch's denominator is its real targets);
- ``accumulation``: a per-target stand-in loss, masked by each batch's own
  ``loss_mask`` and folded from raw sums over each batch's own ``token_count``,
  equals the direct mean over every target of the partition;
- ``replay``: a fresh plan of the same seed gives the same rows in the same
  batches; ``different_seed``: another seed the same rows in another order.

Memory: a bool per row, three integers per segment; everything per batch is
numpy over whole arrays, never a Python loop over positions or segments.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._checks import check_seed
from ..._progress import bar as progress_bar
from ...batch.reduce import TokenMean, TokenSums, token_mean
from ...epoch import Epoch
from ...errors import AccumulationError, ConfigError
from ..stand_in import span_units, sums_of_units
from .check import means_equal
from .masks import MASK_CHECKS
from .pack_tally import PackTally
from .result import Checked
from .shares import epoch_shares

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
)


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

        def mean(value: TokenMean | None) -> Any:
            return None if value is None else [value.token_count, value.mean_loss, value.mean_gradient.tolist()]

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
            "folded_mean": mean(self.folded_mean),
            "direct_mean": mean(self.direct_mean),
            "real_positions": self.real_positions,
            "denominator": self.denominator,
            "failures": dict(self.failures),
            "seconds": self.seconds,
            **({"loss_mask": dict(self.mask)} if self.mask.get("masked") else {}),
        }


def _direct_mean(tally: PackTally) -> TokenMean | None:
    """The stand-in mean over every target of the partition, in closed form per document."""
    included = tally.store.partition_codes == tally.code
    if tally.masked:  # over the counted targets only
        counted = tally.masks.expected_counted
        return sums_of_units(tally.counted_units, counted).mean() if counted else None
    docs = np.flatnonzero(included & (tally.lengths >= 2))
    units = int(span_units(8 * (docs % 8) + 1, tally.lengths[docs] - 1).sum())
    return sums_of_units(units, tally.target_count).mean() if tally.target_count else None


def _order(chunks: Iterator[Any], rows: int) -> tuple[bytes, Any]:
    """The order of a pass of row chunks (batch index, row numbers), and the rows it holds."""
    digest, seen = hashlib.blake2b(digest_size=16), np.zeros(rows, dtype=bool)
    for chunk in chunks:
        numbers = np.asarray(chunk.numbers(), dtype=np.int64)
        digest.update(np.array([chunk.batch_index or 0, numbers.size], dtype=np.int64).tobytes())
        digest.update(numbers.tobytes())
        seen[numbers] = True
    return digest.digest(), seen


def audit_packed_epoch(
    epoch: Epoch,
    *,
    other_seed: int | None = None,
    workers: int = 1,
    world_size: int = 1,
    batches: Any = None,
    progress: bool | None = False,
) -> PackAuditResult:
    """Audit a packed epoch: every (rank, worker) share, a fresh replay, and the epoch under *other_seed*.

    *batches* replaces the epoch's own shares (a test hands tampered batches);
    *other_seed* defaults to ``seed + 1`` (0 for a sequential epoch); *progress*:
    a tqdm bar over the primary pass's rows on stderr (None: when it is a terminal).

    >>> import streambatch as sb
    >>> docs = [sb.Document(f"d{i}", "train", range(3 * i + 1)) for i in range(6)]
    >>> epoch = sb.Epoch(docs, context_length=4, batch_size=3, seed=5, pack=True)
    >>> audit_packed_epoch(epoch, workers=2, world_size=2).proof_line()
    'PROOF|mode=pack|targets=45/45|duplicates=0|cross_document=0|cross_partition=0|content=0|segments=0|positions=0|padding=0|replay=same|different_seed=changed|accumulation=equal'
    """
    if not epoch.pack:
        raise ConfigError("audit_packed_epoch needs Epoch(..., pack=True); audit a window epoch with audit_epoch")
    if epoch.seed is None:
        other = 0 if other_seed is None else check_seed(other_seed, "other_seed")
    else:
        other = (epoch.seed + 1) % (1 << 64) if other_seed is None else check_seed(other_seed, "other_seed")
        if other == epoch.seed:
            raise ConfigError(f"other_seed={other_seed} equals the epoch's seed; pass a different seed to compare orders with")
    started = time.perf_counter()
    tally = PackTally(epoch)
    pieces = epoch_shares(epoch, workers=workers, world_size=world_size) if batches is None else batches
    bar = progress_bar(tally.row_count, desc="audit --pack", unit=" rows", unit_scale=True, progress=progress)

    def checked() -> Iterator[TokenSums]:
        for batch in pieces:
            before = tally.rows
            yield tally.piece(batch)
            bar.update(tally.rows - before)

    sums = checked()
    try:
        folded: TokenMean | None = token_mean(sums)  # raw sums folded, divided once
    except AccumulationError:  # no batch, or no target in any
        folded = None
    bar.close()
    covered, repeated = tally.finish()
    direct = _direct_mean(tally)
    if not means_equal(folded, direct):
        tally.note("accumulation", f"token mean folded from batch raw sums {folded} != direct over every target {direct}")

    mine = tally.digest.digest()

    def chunks(seed: int | None) -> Iterator[Any]:  # row chunks of a fresh plan: nothing gathered
        return epoch_shares(epoch.reseeded(seed), workers=workers, world_size=world_size, gather=False)

    again, _ = _order(chunks(epoch.seed), tally.row_total)
    replay = "same" if again == mine else "different"
    if replay != "same":
        tally.note("replay", "a second pass of the same seed (planned afresh) gave other rows or another order")
    other_order, other_rows = _order(chunks(other), tally.row_total)
    if not np.array_equal(other_rows | tally.dropped, tally.row_seen):
        different = "rows_changed"
        tally.note("different_seed", "another seed changed which rows the epoch holds, not just their order")
    elif tally.row_count < 2:
        different = "n/a"  # one row has one order
    elif other_order == mine:
        different = "same"
        tally.note("different_seed", "another seed gave the same order; pass a different other seed")
    else:
        different = "changed"
    return PackAuditResult(
        targets=tally.target_count,
        covered_targets=covered,
        repeated_targets=repeated,
        rows=tally.rows,
        expected_rows=tally.row_count,
        batches=tally.batches,
        counts=dict(tally.counts),
        replay=replay,
        different_seed=different,
        folded_mean=folded,
        direct_mean=direct,
        real_positions=tally.real_positions,
        denominator=tally.denominator,
        failures={
            **{check: tally.first[check] for check in PACK_CHECKS if check in tally.first},
            **{check: tally.masks.first[check] for check in MASK_CHECKS if check in tally.masks.first},
        },
        seconds=time.perf_counter() - started,
        mask=tally.masks.fields(),
        mask_proof=tally.masks.proof_fields(),
    )
