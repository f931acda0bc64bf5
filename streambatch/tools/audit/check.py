"""`audit_batches` and `audit_epoch`: one audit for every item kind, folded into its PROOF line.

The primary pass (`streambatch.tools.audit.tally`) checks every batch; a replay
and another seed's order are hashed from their chunks without gathering
(`streambatch.tools.audit.coverage`); the folded stand-in mean is compared with
the direct one.  A window epoch gives an `AuditResult` (the chapter's line), a
packed epoch a `PackAuditResult` (``PROOF|mode=pack|...``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..._checks import check_seed
from ..._progress import Bar
from ..._progress import bar as progress_bar
from ...batch.reduce import TokenMean, TokenSums, token_mean
from ...epoch import Epoch
from ...errors import AccumulationError, ConfigError, StoreError
from .coverage import Coverage, TargetCoverage, WindowCoverage, coverage_of, order_pass
from .expected import Expected
from .ledger import ledger
from .result import CHECKS, PACK_CHECKS, RELATIVE_TOLERANCE, AuditResult, PackAuditResult
from .shares import epoch_shares
from .tally import Tally

AUDIT_BYTES_PER_WINDOW = 3 * 8 + 2 + 1  # three plans (at most 8 bytes an entry), a uint16 stamp, a bool


def means_equal(folded: TokenMean | None, direct: TokenMean | None) -> bool:
    if folded is None or direct is None:
        return folded is None and direct is None
    return (
        folded.token_count == direct.token_count
        and math.isclose(folded.mean_loss, direct.mean_loss, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0)
        and bool(np.allclose(folded.mean_gradient, direct.mean_gradient, rtol=RELATIVE_TOLERANCE, atol=0.0))
    )


def audit_batches(
    batches: Iterable[Any],
    expected: Epoch,
    *,
    replay: Iterable[Any] | None = None,
    other: Iterable[Any] | None = None,
    progress: bool | None = False,
) -> Any:
    """Audit *batches* (any iterable of `MiniBatch`-like objects) against the epoch *expected* describes.

    A batch-like object has ``index`` (its global batch), ``inputs`` and
    ``targets`` (``[width, T]``) and per-row ``document_indices`` and ``starts``
    (a packed batch: per segment, with ``segment_rows``, ``segment_lengths``,
    ``row_numbers``, ``token_count`` and its packed columns).  *expected*
    supplies the store, ``T``, stride, partition and batch size; the items
    themselves are recomputed from the store.  *replay* (a second pass of the
    same order) and *other* (the same epoch under another seed) are iterables of
    batch-like objects or chunks; without them those checks read ``unchecked``.
    *progress*: tqdm bars on stderr (None: when it is a terminal).  Returns an
    `AuditResult` for windows, a `PackAuditResult` for packed rows.

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> epoch = sb.Epoch(docs, context_length=2, batch_size=3, seed=7)
    >>> audit_batches(epoch, epoch, replay=epoch.reseeded(7), other=epoch.reseeded(8)).proof_line()
    'PROOF|coverage=5/5|duplicates=0|padding=0|cross_partition=0|replay=same|different_seed=changed|accumulation=equal|cross_document=0'

    A duplicated row fails the proof:

    >>> tampered = [epoch[0], epoch[0], epoch[1]]
    >>> audit_batches(tampered, epoch).first_failure[0]
    'duplicates'
    """
    if not isinstance(expected, Epoch):
        raise ConfigError(f"expected={expected!r} is not a streambatch.Epoch; pass the epoch the batches should form")
    started = time.perf_counter()
    ex = Expected(expected)
    coverage = coverage_of(ex)
    tally = Tally(ex, coverage)
    noun = coverage.NOUN

    def bar(desc: str) -> Bar:
        return progress_bar(ex.item_count, desc=desc, unit=f" {noun}", unit_scale=True, progress=progress)

    primary = bar("audit")

    def audited() -> Iterator[TokenSums]:
        for piece in batches:
            before = tally.rows
            yield tally.piece(piece)
            primary.update(tally.rows - before)

    try:
        folded: TokenMean | None = token_mean(audited())  # raw sums folded, divided once
    except AccumulationError:  # no batch, or no target in any: nothing to average
        folded = None
    primary.close()
    covered, repeated = tally.finish()
    direct = coverage.direct(bar("direct mean"))
    if not means_equal(folded, direct):
        every = f"direct over every {coverage.TARGET} {_show(direct)}"
        tally.note("accumulation", f"token mean folded from batch raw sums {_show(folded)} != {every}")
    tokens: dict[str, Any] = {}
    if isinstance(coverage, WindowCoverage):  # tokens in = out + left out, over the windows shown
        tokens = ledger(coverage, coverage.stamps != 0)
        if not tokens["balanced"]:
            tally.note("coverage", f"tokens in {tokens['in']} != out {tokens['out']} + left out {tokens['left_out']}")
    replayed = _replay(coverage, tally, replay, bar)
    different = _other_seed(coverage, tally, other, bar)
    checks = PACK_CHECKS if isinstance(coverage, TargetCoverage) else CHECKS
    failures = {c: m for c in checks if (m := tally.first.get(c) or tally.masks.first.get(c)) is not None}
    seconds = time.perf_counter() - started
    mask, mask_proof = tally.masks.fields(), tally.masks.proof_fields()
    c = tally.counts
    if isinstance(coverage, TargetCoverage):  # packed rows: the packed PROOF line
        kept = ("content", "segments", "positions", "padding", "cross_document", "cross_partition")
        return PackAuditResult(
            targets=coverage.target_count, covered_targets=covered, repeated_targets=repeated, rows=tally.rows,
            expected_rows=ex.item_count, batches=tally.pieces,
            counts={**{k: c[k] for k in kept}, "duplicate_rows": c["duplicates"]}, replay=replayed,
            different_seed=different, folded_mean=folded, direct_mean=direct, real_positions=tally.real_positions,
            denominator=tally.denominator, failures=failures, seconds=seconds, mask=mask, mask_proof=mask_proof,
        )  # fmt: skip
    return AuditResult(
        expected_windows=ex.item_count, covered_windows=covered, rows=tally.rows, batches=tally.pieces,
        duplicate_windows=repeated, padding_ids=c["padding"], cross_document_windows=c["cross_document"],
        cross_partition_windows=c["cross_partition"], foreign_windows=c["foreign"], width_errors=c["widths"],
        replay=replayed, different_seed=different, folded_mean=folded, direct_mean=direct,
        token_count=tally.token_count, failures=failures, seconds=seconds, mask=mask, mask_proof=mask_proof,
        tokens=tokens,
    )  # fmt: skip


def _replay(coverage: Coverage, tally: Tally, replay: Iterable[Any] | None, bar: Any) -> str:
    """``same`` when a second pass of the same seed gives the same order (``unchecked`` without one)."""
    if replay is None:
        return "unchecked"
    again, _ = order_pass(coverage, replay, bar("replay"), membership=False)
    if again.digest.digest() == tally.order.digest.digest():
        return "same"
    tally.note("replay", f"a second pass of the same seed gave a different order ({again.rows} rows vs {tally.rows})")
    return "different"


def _other_seed(coverage: Coverage, tally: Tally, other: Iterable[Any] | None, bar: Any) -> str:
    """``changed`` when another seed holds the same items in another order (``unchecked`` without one)."""
    if other is None:
        return "unchecked"
    changed, seen = order_pass(coverage, other, bar("other seed"), membership=True)
    noun = coverage.NOUN
    if not coverage.same_items(seen, changed.rows, tally.rows):
        tally.note("different_seed", f"another seed changed which {noun} the epoch holds, not just their order")
        return f"{noun}_changed"
    if tally.expected.item_count < 2:
        return "n/a"  # one item has one order
    if changed.digest.digest() == tally.order.digest.digest():
        tally.note("different_seed", "another seed gave the same order; pass a different other seed")
        return "same"
    return "changed"


def _show(mean: TokenMean | None) -> str:
    return "(no tokens)" if mean is None else f"{mean.mean_loss!r} over {mean.token_count} tokens"


def audit_epoch(
    epoch: Epoch,
    *,
    other_seed: int | None = None,
    workers: int = 1,
    world_size: int = 1,
    batches: Iterable[Any] | None = None,
    progress: bool | None = False,
) -> Any:
    """Audit a whole epoch, of windows or packed rows: every (rank, worker) share, a fresh replay, and the epoch
    under *other_seed*.

    The replay re-plans the same seed from scratch (``epoch.reseeded``), so it
    proves the shuffle reproducible, not a cached plan.  *other_seed* defaults to
    ``seed + 1`` (the chapter's choice); a sequential epoch is compared with the
    shuffle of seed 0.  *batches* replaces the epoch's own shares (a test hands
    tampered batches).  Returns an `AuditResult` (windows) or a `PackAuditResult`.

    >>> import streambatch as sb
    >>> docs = [sb.Document(f"d{i}", "train", range(20 + i)) for i in range(5)]
    >>> epoch = sb.Epoch(docs, context_length=4, batch_size=8, seed=3)
    >>> result = audit_epoch(epoch, workers=2, world_size=3)
    >>> result.ok, result.covered_windows == epoch.window_count
    (True, True)
    """
    if epoch.seed is None:
        other = 0 if other_seed is None else check_seed(other_seed, "other_seed")
    else:
        other = (epoch.seed + 1) % (1 << 64) if other_seed is None else check_seed(other_seed, "other_seed")
        if other == epoch.seed:
            raise ConfigError(f"other_seed={other_seed} equals the epoch's seed; pass a different seed to compare orders with")
    # the replay and the other order are shuffled in memory: a plan file is compared, never reused or written
    fresh = epoch if epoch.plan_dir is None else Epoch(epoch.items, batch_size=epoch.batch_size, seed=epoch.seed)
    shares = epoch_shares(epoch, workers=workers, world_size=world_size) if batches is None else batches
    try:
        return audit_batches(
            shares,
            epoch,
            replay=epoch_shares(fresh.reseeded(epoch.seed), workers=workers, world_size=world_size, gather=False),
            other=epoch_shares(fresh.reseeded(other), workers=workers, world_size=world_size, gather=False),
            progress=progress,
        )
    except MemoryError:  # numpy's _ArrayMemoryError or a bare one: say what the audit needs instead
        need = epoch.item_count * AUDIT_BYTES_PER_WINDOW
        raise StoreError(
            f"audit: {epoch.item_count} items need about {need} bytes of memory ({AUDIT_BYTES_PER_WINDOW} per item: "
            "three plans, a stamp and a bit) and they could not be allocated; raise the memory limit (ulimit -v)"
        ) from None


def audit_packed_epoch(
    epoch: Epoch,
    *,
    other_seed: int | None = None,
    workers: int = 1,
    world_size: int = 1,
    batches: Any = None,
    progress: bool | None = False,
) -> PackAuditResult:
    """`audit_epoch` of a packed epoch (``Epoch(..., pack=True)``), refusing a window epoch.

    >>> import streambatch as sb
    >>> docs = [sb.Document(f"d{i}", "train", range(3 * i + 1)) for i in range(6)]
    >>> epoch = sb.Epoch(docs, context_length=4, batch_size=3, seed=5, pack=True)
    >>> audit_packed_epoch(epoch, workers=2, world_size=2).proof_line()
    'PROOF|mode=pack|targets=45/45|duplicates=0|cross_document=0|cross_partition=0|content=0|segments=0|positions=0|padding=0|replay=same|different_seed=changed|accumulation=equal'
    """
    if not epoch.pack:
        raise ConfigError("audit_packed_epoch needs Epoch(..., pack=True); audit a window epoch with audit_epoch")
    found: PackAuditResult = audit_epoch(
        epoch, other_seed=other_seed, workers=workers, world_size=world_size, batches=batches, progress=progress
    )
    return found
