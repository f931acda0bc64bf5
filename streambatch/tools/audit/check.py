"""`audit_batches` and `audit_epoch`: run the passes and fold them into an `AuditResult`."""

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
from ..stand_in import sums_of_units, window_loss_units
from .expected import Expected
from .ledger import ledger
from .masks import MASK_CHECKS
from .order import OrderPass
from .result import CHECKS, RELATIVE_TOLERANCE, AuditResult
from .shares import epoch_shares
from .tally import Tally

_DIRECT_BLOCK = 1 << 22
AUDIT_BYTES_PER_WINDOW = 3 * 8 + 2 + 1  # three plans (at most 8 bytes an entry), a uint16 stamp, a bool


def _direct_mean(expected: Expected, bar: Bar) -> TokenMean | None:
    """The stand-in token mean over every window of the epoch in document order, in closed form per window."""
    units = 0
    count = expected.item_count
    for lo in range(0, count, _DIRECT_BLOCK):
        numbers = expected.numbers(lo, min(lo + _DIRECT_BLOCK, count))
        documents, starts = expected.locate(numbers)
        units += window_loss_units(documents, starts, expected.context_length)
        bar.update(numbers.size)
    bar.close()
    tokens = count * expected.context_length
    return sums_of_units(units, tokens).mean() if tokens else None


def means_equal(folded: TokenMean | None, direct: TokenMean | None) -> bool:
    if folded is None or direct is None:
        return folded is None and direct is None
    return (
        folded.token_count == direct.token_count
        and math.isclose(folded.mean_loss, direct.mean_loss, rel_tol=RELATIVE_TOLERANCE, abs_tol=0.0)
        and bool(np.allclose(folded.mean_gradient, direct.mean_gradient, rtol=RELATIVE_TOLERANCE, atol=0.0))
    )


def _bar(total: int, desc: str, progress: bool | None) -> Bar:
    return progress_bar(total, desc=desc, unit=" windows", unit_scale=True, progress=progress)


def audit_batches(
    batches: Iterable[Any],
    expected: Epoch,
    *,
    replay: Iterable[Any] | None = None,
    other: Iterable[Any] | None = None,
    progress: bool | None = False,
) -> AuditResult:
    """Audit *batches* (any iterable of `MiniBatch`-like objects) against the epoch *expected* describes.

    A batch-like object has ``index`` (its global batch), ``inputs`` and
    ``targets`` (``[width, T]``) and per-row ``document_indices`` and ``starts``.
    *expected* supplies the store, ``T``, stride, partition and batch size; the
    windows themselves are recomputed from the store.  *replay* (a second pass
    of the same order) and *other* (the same epoch under another seed) are
    iterables of batch-like objects or `Windows` chunks; without them those
    checks read ``unchecked``.  *progress*: tqdm bars on stderr (None: when it
    is a terminal).

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
    tally = Tally(ex)
    bar = _bar(ex.item_count, "audit", progress)

    def audited() -> Iterator[TokenSums]:
        for piece in batches:
            before = tally.rows
            yield tally.piece(piece)
            bar.update(tally.rows - before)

    try:
        folded: TokenMean | None = token_mean(audited())  # raw sums folded, divided once
    except AccumulationError:  # no batch, or no target token in any: nothing to average
        folded = None
    bar.close()
    covered = tally.finish_coverage()
    direct = _direct_mean(ex, _bar(ex.item_count, "direct mean", progress))
    if not means_equal(folded, direct):
        tally.note(
            "accumulation", f"token mean folded from batch raw sums {_show(folded)} != direct over every token {_show(direct)}"
        )

    replay_state = "unchecked"
    if replay is not None:
        again = OrderPass(ex, membership=False).run(replay, _bar(ex.item_count, "replay", progress))
        replay_state = "same" if again.digest.digest() == tally.order.digest.digest() else "different"
        if replay_state != "same":
            tally.note("replay", f"a second pass of the same seed gave a different order ({again.rows} rows vs {tally.rows})")

    different = "unchecked"
    if other is not None:
        changed = OrderPass(ex, membership=True).run(other, _bar(ex.item_count, "other seed", progress))
        assert changed.seen is not None
        same_windows = changed.rows == tally.rows and bool(np.array_equal(changed.seen, tally.stamps != 0))
        if not same_windows:
            different = "windows_changed"
            tally.note("different_seed", "another seed changed which windows the epoch holds, not just their order")
        elif ex.item_count < 2:
            different = "n/a"  # one window has one order
        elif changed.digest.digest() == tally.order.digest.digest():
            different = "same"
            tally.note("different_seed", "another seed gave the same order; pass a different other seed")
        else:
            different = "changed"

    duplicates = tally.valid_rows - covered
    tokens = ledger(ex, tally.stamps != 0)
    if not tokens["balanced"]:
        tally.note("coverage", f"tokens in {tokens['in']} != out {tokens['out']} + left out {tokens['left_out']}")
    failures = {check: tally.first[check] for check in CHECKS if check in tally.first}
    failures.update((check, tally.masks.first[check]) for check in MASK_CHECKS if check in tally.masks.first)
    return AuditResult(
        expected_windows=ex.item_count,
        covered_windows=covered,
        rows=tally.rows,
        batches=tally.pieces,
        duplicate_windows=duplicates,
        padding_ids=tally.padding,
        cross_document_windows=tally.cross_document,
        cross_partition_windows=tally.cross_partition,
        foreign_windows=tally.foreign,
        width_errors=tally.width_errors,
        replay=replay_state,
        different_seed=different,
        folded_mean=folded,
        direct_mean=direct,
        token_count=tally.token_count,
        failures=failures,
        seconds=time.perf_counter() - started,
        mask=tally.masks.fields(),
        mask_proof=tally.masks.proof_fields(),
        tokens=tokens,
    )


def _show(mean: TokenMean | None) -> str:
    return "(no tokens)" if mean is None else f"{mean.mean_loss!r} over {mean.token_count} tokens"


def audit_epoch(
    epoch: Epoch,
    *,
    other_seed: int | None = None,
    workers: int = 1,
    world_size: int = 1,
    progress: bool | None = False,
) -> AuditResult:
    """Audit a whole epoch: every (rank, worker) share, a fresh replay, and the epoch under *other_seed*.

    The replay re-plans the same seed from scratch (``epoch.reseeded``), so it
    proves the shuffle reproducible, not a cached plan.  *other_seed* defaults to
    ``seed + 1`` (the chapter's choice); a sequential epoch is compared with the
    shuffle of seed 0.

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
    fresh = epoch if epoch.plan_dir is None else Epoch(epoch.windows, batch_size=epoch.batch_size, seed=epoch.seed)
    try:
        return audit_batches(
            epoch_shares(epoch, workers=workers, world_size=world_size),
            epoch,
            replay=epoch_shares(fresh.reseeded(epoch.seed), workers=workers, world_size=world_size, gather=False),
            other=epoch_shares(fresh.reseeded(other), workers=workers, world_size=world_size, gather=False),
            progress=progress,
        )
    except MemoryError:  # numpy's _ArrayMemoryError or a bare one: say what the audit needs instead
        need = epoch.window_count * AUDIT_BYTES_PER_WINDOW
        raise StoreError(
            f"audit: {epoch.window_count} windows need about {need} bytes of memory ({AUDIT_BYTES_PER_WINDOW} per window: "
            "three plans, a stamp and a bit) and they could not be allocated; raise the memory limit (ulimit -v)"
        ) from None
