"""Prove an epoch right from what its batches say about themselves: the chapter's PROOF line at scale.

`audit_batches` reads each row's provenance (document index, start) and ids and
checks them against the store alone, never against the epoch's own window
index: every window of the partition appears exactly once (coverage,
duplicates), no id is added or altered (padding), every row's ``T + 1`` tokens
lie inside one document (cross_document) of the epoch's partition
(cross_partition), the batches are ``[B] * k + [r]`` rows wide (widths), a
second pass replays the same order (replay), another seed reorders the same
windows (different_seed), and token means folded from per-batch raw sums equal
a direct computation over every token (accumulation).

Memory is per window only where it must be: a uint16 stamp per window (2 bytes;
200 MB at 10**8 windows) finds duplicates, within a batch too, in O(1) per row,
and a bool per window holds the other seed's membership.  Everything else is
numpy per batch, never Python per row.  `audit_epoch` runs it over an `Epoch`
(and the shares of workers and ranks); `audit_batches` over any iterable of
batch-like objects, so a test can hand it tampered batches and watch it fail.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import check_positive, check_seed
from .._progress import Bar
from .._progress import bar as progress_bar
from ..epoch import Epoch
from ..errors import AccumulationError, ConfigError
from ..stages.chunk import Chunks, batch_widths, shard, split_rows
from ..stages.materialize import materialize
from ..stages.reduce import TokenMean, TokenSums, token_mean
from ..stages.windows import Windows, window_counts

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
)
RELATIVE_TOLERANCE = 1e-12
_STAMP_BLOCK = (1 << 16) - 1  # rows per stamp block: stamps 1..65535 fit uint16, 0 means "never seen"
_DIRECT_BLOCK = 1 << 22
_CYCLE = 64  # stand-in losses are ((8d + 2s + t + 1) mod 64) / 8: exact binary fractions, exact sums
_CYCLE_PREFIX = np.concatenate([[0], np.cumsum(np.arange(2 * _CYCLE) % _CYCLE)]).astype(np.int64)


def stand_in_losses(document_indices: npt.ArrayLike, starts: npt.ArrayLike, context_length: int) -> npt.NDArray[np.float64]:
    """The audit's deterministic per-token loss: the chapter's ``(8d + 2s + t + 1) / 8``, taken mod 8.

    Wrapping at 8 keeps every loss a multiple of 1/8 below 8, so float64 sums of
    up to ~10**14 tokens are exact in any order; on the chapter's fixture nothing
    wraps and the values are the chapter's.

    >>> stand_in_losses([1, 0], [1, 0], 2).tolist()
    [[1.375, 1.5], [0.125, 0.25]]
    """
    return _loss_units(np.asarray(document_indices, np.int64), np.asarray(starts, np.int64), context_length) / 8.0


def _loss_units(documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], length: int) -> npt.NDArray[np.int64]:
    base = 8 * (documents % 8) + 2 * (starts % 32) + 1  # reduced first: no overflow for any int64 provenance
    units: npt.NDArray[np.int64] = (base[:, None] + np.arange(length, dtype=np.int64)) % _CYCLE
    return units


def _window_loss_units(documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], length: int) -> int:
    """Sum of `_loss_units` over whole windows in closed form: full cycles plus a prefix-sum difference."""
    base = (8 * (documents % 8) + 2 * (starts % 32) + 1) % _CYCLE
    cycles, rest = divmod(length, _CYCLE)
    per_window = cycles * int(_CYCLE_PREFIX[_CYCLE]) + _CYCLE_PREFIX[base + rest] - _CYCLE_PREFIX[base]
    return int(per_window.sum())


def _sums(loss_units: int, token_count: int) -> TokenSums:
    loss = loss_units / 8.0
    return TokenSums(loss, token_count, np.array([2.0 * loss, 2.0 * token_count - loss]))  # the chapter's [2l, 2 - l]


@dataclass(frozen=True)
class AuditResult:
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

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.failures

    @property
    def first_failure(self) -> tuple[str, str] | None:
        """``(check, message)`` of the first failed check in `CHECKS` order, or None."""
        return next(iter(self.failures.items()), None)

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
        }


class _Rows:
    """One piece's rows classified against the store: which are windows of the epoch, and why not."""

    __slots__ = ("cross_document", "cross_partition", "documents", "foreign", "inside", "numbers", "starts", "window")

    def __init__(self, expected: _Expected, documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]) -> None:
        store = expected.store
        self.documents, self.starts = documents, starts
        known = (documents >= 0) & (documents < len(store))
        safe = np.where(known, documents, 0)
        length = store.lengths[safe]
        self.cross_partition = known & (store.partition_codes[safe] != expected.code)
        # all T + 1 tokens inside the row's own document; compare, never add: starts may be anything
        self.inside = known & (starts >= 0) & (starts <= length - expected.source_length)
        self.cross_document = known & ~self.inside
        on_grid = starts % expected.stride == 0
        self.window = self.inside & ~self.cross_partition & on_grid
        self.foreign = ~known | (self.inside & ~self.cross_partition & ~on_grid)
        self.numbers = expected.first[safe] + starts // expected.stride  # valid where `window`


class _Expected:
    """The epoch's windows computed from the store alone: per-document counts and first window numbers."""

    def __init__(self, epoch: Epoch) -> None:
        self.store = epoch.store
        self.context_length = epoch.context_length
        self.source_length = self.context_length + 1
        self.stride = epoch.stride
        self.code = epoch.partition.code
        self.batch_size = epoch.batch_size
        included = self.store.partition_codes == self.code
        self.counts = np.where(included, window_counts(self.store.lengths, self.context_length, self.stride), 0)
        self.cumulative = np.cumsum(self.counts)
        self.first = self.cumulative - self.counts
        self.window_count = int(self.cumulative[-1]) if self.cumulative.size else 0
        self.widths = np.asarray(batch_widths(self.window_count, self.batch_size), dtype=np.int64)

    def locate(self, numbers: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        documents = np.searchsorted(self.cumulative, numbers, side="right")
        return documents, (numbers - self.first[documents]) * self.stride

    def origin(self, document: int, start: int) -> str:
        name = self.store.ids[document] if 0 <= document < len(self.store) else f"<no document {document}>"
        return f"{name}@{start} (document index {document})"


def _provenance(piece: Any) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(batch index, document indices, starts)`` of a batch-like object or a `Windows` chunk."""
    if isinstance(piece, Windows):
        documents, starts = piece.locate()
        return (piece.batch or 0), documents.astype(np.int64, copy=False), starts.astype(np.int64, copy=False)
    documents = np.asarray(piece.document_indices, dtype=np.int64).reshape(-1)
    starts = np.asarray(piece.starts, dtype=np.int64).reshape(-1)
    if documents.size != starts.size:
        raise ConfigError(f"batch {piece.index}: {documents.size} document indices but {starts.size} starts; one of each per row")
    return int(piece.index), documents, starts


class _OrderPass:
    """A running hash of (batch index, document, start) per row, and optionally the set of windows seen."""

    def __init__(self, expected: _Expected, membership: bool) -> None:
        self.expected = expected
        self.digest = hashlib.blake2b(digest_size=16)
        self.rows = 0
        self.seen = np.zeros(expected.window_count, dtype=bool) if membership else None

    def add(self, index: int, documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], rows: _Rows | None = None) -> None:
        self.digest.update(np.array([index, documents.size], dtype=np.int64).tobytes())
        self.digest.update(documents.tobytes())
        self.digest.update(starts.tobytes())
        self.rows += int(documents.size)
        if self.seen is not None:
            classified = rows or _Rows(self.expected, documents, starts)
            self.seen[classified.numbers[classified.window]] = True

    def run(self, pieces: Iterable[Any], bar: Bar) -> _OrderPass:
        for piece in pieces:
            index, documents, starts = _provenance(piece)
            self.add(index, documents, starts)
            bar.update(documents.size)
        bar.close()
        return self


class _Tally:
    """The primary pass: every check per piece, vectorized; first offending place per check."""

    def __init__(self, expected: _Expected) -> None:
        self.expected = expected
        self.stamps = np.zeros(expected.window_count, dtype=np.uint16)
        self.rows_per_batch = np.zeros(expected.widths.size, dtype=np.int64)
        self.order = _OrderPass(expected, membership=False)
        self.pieces = self.rows = self.valid_rows = 0
        self.padding = self.cross_document = self.cross_partition = self.foreign = self.width_errors = 0
        self.token_count = 0
        self.first: dict[str, str] = {}

    def note(self, check: str, message: str) -> None:
        self.first.setdefault(check, message)

    def piece(self, piece: Any) -> TokenSums:
        ex = self.expected
        index, documents, starts = _provenance(piece)
        rows = _Rows(ex, documents, starts)
        width = documents.size
        self.pieces += 1
        self.rows += width
        self.order.add(index, documents, starts, rows)
        inputs, targets = np.asarray(piece.inputs), np.asarray(piece.targets)
        self._shape(index, width, inputs, targets)
        self._where(index, rows)
        self._content(index, rows, inputs, targets)
        self._stamp(index, rows)
        units = int(_loss_units(documents, starts, ex.context_length).sum())
        self.token_count += int(targets.size)
        return _sums(units, int(targets.size))  # the batch's real denominator: its target ids

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

    def _where(self, index: int, rows: _Rows) -> None:
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

    def _count(self, check: str, index: int, rows: _Rows, mask: npt.NDArray[np.bool_], why: str) -> int:
        count = int(np.count_nonzero(mask))
        if count:
            at = int(np.argmax(mask))
            self.note(
                check, f"batch {index} row {at}: {self.expected.origin(int(rows.documents[at]), int(rows.starts[at]))}: {why}"
            )
        return count

    def _content(self, index: int, rows: _Rows, inputs: npt.NDArray[Any], targets: npt.NDArray[Any]) -> None:
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

    def _stamp(self, index: int, rows: _Rows) -> None:
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
        covered = int(np.count_nonzero(self.stamps))
        ex = self.expected
        if covered < ex.window_count:
            missing = np.flatnonzero(self.stamps == 0)
            documents, starts = ex.locate(missing[:1].astype(np.int64))
            origin = ex.origin(int(documents[0]), int(starts[0]))
            self.note("coverage", f"{missing.size} of {ex.window_count} windows never appeared; the first is {origin}")
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


def _direct_mean(expected: _Expected, bar: Bar) -> TokenMean | None:
    """The stand-in token mean over every window of the epoch in document order, in closed form per window."""
    units = 0
    count = expected.window_count
    for lo in range(0, count, _DIRECT_BLOCK):
        numbers = np.arange(lo, min(lo + _DIRECT_BLOCK, count), dtype=np.int64)
        documents, starts = expected.locate(numbers)
        units += _window_loss_units(documents, starts, expected.context_length)
        bar.update(numbers.size)
    bar.close()
    tokens = count * expected.context_length
    return _sums(units, tokens).mean() if tokens else None


def _means_equal(folded: TokenMean | None, direct: TokenMean | None) -> bool:
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
    ex = _Expected(expected)
    tally = _Tally(ex)
    bar = _bar(ex.window_count, "audit", progress)

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
    direct = _direct_mean(ex, _bar(ex.window_count, "direct mean", progress))
    if not _means_equal(folded, direct):
        tally.note(
            "accumulation", f"token mean folded from batch raw sums {_show(folded)} != direct over every token {_show(direct)}"
        )

    replay_state = "unchecked"
    if replay is not None:
        again = _OrderPass(ex, membership=False).run(replay, _bar(ex.window_count, "replay", progress))
        replay_state = "same" if again.digest.digest() == tally.order.digest.digest() else "different"
        if replay_state != "same":
            tally.note("replay", f"a second pass of the same seed gave a different order ({again.rows} rows vs {tally.rows})")

    different = "unchecked"
    if other is not None:
        changed = _OrderPass(ex, membership=True).run(other, _bar(ex.window_count, "other seed", progress))
        assert changed.seen is not None
        same_windows = changed.rows == tally.rows and bool(np.array_equal(changed.seen, tally.stamps != 0))
        if not same_windows:
            different = "windows_changed"
            tally.note("different_seed", "another seed changed which windows the epoch holds, not just their order")
        elif ex.window_count < 2:
            different = "n/a"  # one window has one order
        elif changed.digest.digest() == tally.order.digest.digest():
            different = "same"
            tally.note("different_seed", "another seed gave the same order; pass a different other seed")
        else:
            different = "changed"

    duplicates = tally.valid_rows - covered
    failures = {check: tally.first[check] for check in CHECKS if check in tally.first}
    return AuditResult(
        expected_windows=ex.window_count,
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
    )


def _show(mean: TokenMean | None) -> str:
    return "(no tokens)" if mean is None else f"{mean.mean_loss!r} over {mean.token_count} tokens"


def epoch_shares(epoch: Epoch, *, workers: int = 1, world_size: int = 1, gather: bool = True) -> Iterator[Any]:
    """Every (rank, worker) share of *epoch*, rank by rank: `MiniBatch`es, or `Windows` chunks without *gather*.

    Rank *r* of *world_size* takes each batch's contiguous share of rows
    (`split_rows`); worker *k* of *workers* takes batches ``k, k + workers, ...``
    of it (`shard`).  Their union is the epoch.

    >>> import streambatch as sb
    >>> epoch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=4)
    >>> [(c.batch, len(c)) for c in epoch_shares(epoch, workers=2, world_size=2, gather=False)]
    [(0, 2), (1, 1), (0, 2), (1, 1)]
    """
    count = check_positive(workers, "workers", "the number of DataLoader workers")
    world = check_positive(world_size, "world_size", "the number of data-parallel ranks")
    return _shares(epoch, count, world, gather)


def _shares(epoch: Epoch, workers: int, world: int, gather: bool) -> Iterator[Any]:
    chunks: Chunks = epoch.chunks()  # plans the order here, when the pass starts, not before
    # ranks past the batch size hold no row of any batch, workers past the batch count no batch:
    # their shares are empty, so a huge --world-size or --workers costs nothing
    for rank in range(min(world, epoch.batch_size)):
        ranked = split_rows(chunks, rank, world) if world > 1 else chunks
        for worker in range(min(workers, max(len(chunks), 1))):
            share = shard(ranked, worker, workers)
            yield from (materialize(share) if gather else share)


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
    return audit_batches(
        epoch_shares(epoch, workers=workers, world_size=world_size),
        epoch,
        replay=epoch_shares(epoch.reseeded(epoch.seed), workers=workers, world_size=world_size, gather=False),
        other=epoch_shares(epoch.reseeded(other), workers=workers, world_size=world_size, gather=False),
        progress=progress,
    )
