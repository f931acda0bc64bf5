"""Mixtures in the commands: what ``inspect`` shows, what ``audit`` proves, for a mixture.

``trace`` draws it: `streambatch.tools.figure.mixture`.

`inspect_mixture`: per source, its items in the mixture, weight, effective
share, source epochs consumed and tokens (the counts do not depend on the seed:
Tijdeman's order does not).  `audit_mixture` iterates an epoch of a mixture
(through the workers' and ranks' shares) and proves: every row's source is
Tijdeman's order recomputed from the weights (a plan file is not trusted), the prefix bound
``|c_s(n) - w_s n| <= 1 - 1/(2k-2)`` at every batch boundary (in exact
integers), each source's rows in its exact order (the concatenation of
``shuffle(part_s, source_epoch_seed(seed, s, e))`` over its epochs ``e``; for
parts of ``skip_untrained``, that order over the kept items), no
window twice inside one source epoch, and every row's tokens read from its own
source.
"""

from __future__ import annotations

import sys
import time
from fractions import Fraction
from typing import Any

import numpy as np

from ..epoch import Epoch
from ..errors import ConfigError
from ..io.files import short_path
from ..io.mixture_file import MixtureSource
from ..items.mix.plan import plan_mix, source_order
from ..items.mix.source import as_mixture
from ..items.mix.targets import source_targets
from ..stages.chunk import batch_count, bind_batch_size, check_batch_size, fixed_batch_size
from ..stages.schedule import BatchSchedule, in_epoch, state_batch_size
from .inspect import format_count
from .mix_audit_rows import check_packed_rows, check_source_targets


def inspect_mixture(
    source: MixtureSource,
    *,
    context_length: int | None,
    batch_size: Any,
    stride: int = 1,
    partition: Any = None,
    pack: bool = False,
    skip_untrained: bool = False,
    epoch: int = 0,
) -> dict[str, Any]:
    """Per source: path, weight, documents, tokens; with ``T``: windows, items, effective share, source epochs.
    *epoch*: the run's epoch whose batches a batch-size schedule lays out (its thresholds count over the run).

    With *pack* the items are packed rows: per source its rows, targets and pad share per source epoch.  With
    *skip_untrained* each source's items are its kept ones, and its row counts what the filter dropped.
    """
    if context_length is None and batch_size is not None:
        raise ConfigError(f"batch_size={batch_size!r} needs a context_length; pass -T to count a mixture's items and batches")
    spec = source.spec
    total = sum(Fraction(w) for w in spec.weights)
    rows: list[dict[str, Any]] = [
        {"name": n, "path": p, "weight": w, "share": float(Fraction(w) / total), "documents": len(s), "tokens": s.token_count}
        for n, p, w, s in zip(spec.names, spec.paths, spec.weights, source.stores, strict=True)
    ]
    summary: dict[str, Any] = {"path": spec.path, "kind": "mixture", "length": spec.length, "sources": rows}
    if context_length is None:
        return summary
    mixture = as_mixture(
        source, context_length=context_length, stride=None if pack else stride, partition=partition, keep_partition=False,
        seed=0, plan_dir=None, pack=pack, skip_untrained=skip_untrained,
    )  # fmt: skip
    assert mixture is not None
    reports = mixture.untrained or (None,) * len(rows)
    counts = mixture.counts().tolist()
    for row, share in zip(rows, target_shares(mixture), strict=True):  # what trains, whatever the weighting (seed 0)
        row.update(share)
    every = zip(rows, counts, mixture.sizes, mixture.source_epochs(), mixture.parts, reports, strict=True)
    for row, count, size, epochs, part, kept in every:
        row.update(windows=size, items=count, effective_share=count / len(mixture), source_epochs=epochs)
        if kept is not None:
            row.update(kept.summary())
        row["item_tokens"] = count * context_length
        if mixture.packed:  # per source epoch: every target of the source once, in its rows
            report: Any = part.report
            row.update(rows=size, targets=report.targets, pad_share=report.pad_share)
    summary.update(context_length=context_length, stride=stride, items=len(mixture), plan_bytes=mixture.plan_nbytes)
    notes = repeat_notes(spec.names, mixture.source_epochs(), default=spec.length is None)
    if notes:
        summary["notes"] = notes
    if pack:
        summary.update(mode="pack", stride=context_length)
    if skip_untrained:
        summary["skip_untrained"] = True
    if batch_size is not None:
        size = bind_batch_size(check_batch_size(batch_size), mixture)  # an int, or a schedule
        summary.update(batch_size=state_batch_size(size), batches=batch_count(len(mixture), in_epoch(size, epoch, len(mixture))))
        if epoch and isinstance(size, BatchSchedule):
            summary["epoch"] = epoch
    return summary


def target_shares(mixture: Any) -> list[dict[str, Any]]:
    """Each source's counted targets in *mixture* (`source_targets`) and its share of them."""
    counted = source_targets(mixture)
    total = max(sum(counted), 1)
    return [{"counted_targets": c, "target_share": c / total} for c in counted]


def targets_note(names: Any, mixture: Any) -> str:
    """One line: each source's counted targets in *mixture* and its share, e.g. ``web 1,200 (60.0%), code 800 (40.0%)``."""
    shares = target_shares(mixture)
    return ", ".join(f"{n} {s['counted_targets']:,} ({s['target_share']:.1%})" for n, s in zip(names, shares, strict=True))


def repeat_notes(names: Any, source_epochs: list[float], *, default: bool) -> list[str]:
    """One note per source that one pass of the mixture repeats (more than one source epoch).

    >>> repeat_notes(["web", "code"], [1.0, 3.5], default=True)
    ["source 'code' repeats: 3.500 source epochs per pass of the mixture (each of its items comes 3 or 4 times); ..."]
    """
    why = "; the default length passes the largest source once: set a length, or other weights, to change that" if default else ""
    notes = []
    for name, epochs in zip(names, source_epochs, strict=True):
        if epochs > 1:
            low, high = int(epochs), -(-epochs // 1)
            times = f"{low} times" if low == high else f"{low} or {int(high)} times"
            notes.append(
                f"source {name!r} repeats: {epochs:.3f} source epochs per pass of the mixture "
                f"(each of its items comes {times}){why}"
            )
    return notes


def note_repeats(source: Any, items: Any) -> None:
    """Print `repeat_notes` on stderr when *source* is a mixture file and *items* its `Mixture` (else nothing)."""
    if isinstance(source, MixtureSource):  # a mixture file: *items* is its mixture (`streambatch.config.items_of`)
        for note in repeat_notes(source.spec.names, items.source_epochs(), default=source.spec.length is None):
            print(f"streambatch: note: {short_path(source.path)}: {note}", file=sys.stderr)


def format_mixture(summary: dict[str, Any]) -> str:
    """`inspect_mixture`'s result as aligned text: one line per source."""
    lines = [f"mixture   {summary['path']} ({len(summary['sources'])} sources)"]
    if "items" in summary:
        batches = f", {summary['batches']} batches of B={summary['batch_size']}" if "batches" in summary else ""
        what = "packed rows" if summary.get("mode") == "pack" else "windows"
        lines.append(f"items     {summary['items']} {what} of T={summary['context_length']}{batches}")
        lines.append(f"plan      {summary['plan_bytes']} bytes (Tijdeman's order, one byte per item + checkpoints)")
    packed = summary.get("mode") == "pack"
    head = ["source", "weight", "share", "documents", "tokens"]
    if "items" in summary:
        head += (["rows", "targets", "pad share"] if packed else ["windows"]) + ["items", "effective", "source epochs"]
        head += ["item positions" if packed else "item tokens", "counted targets", "target share"]
    filtered = summary.get("skip_untrained", False)
    if filtered:
        head += ["dropped pieces" if packed else "dropped windows"]
    table = [head]
    for row in summary["sources"]:
        cells = [row["name"], f"{row['weight']:g}", f"{row['share']:.4f}", str(row["documents"]), str(row["tokens"])]
        if "items" in row:
            cells += [str(row["rows"]), str(row["targets"]), f"{row['pad_share']:.4%}"] if packed else [str(row["windows"])]
            cells += [str(row["items"]), f"{row['effective_share']:.4f}", f"{row['source_epochs']:.3f}", str(row["item_tokens"])]
            cells += [str(row["counted_targets"]), f"{row['target_share']:.4f}"]
            if filtered:
                cells.append(str(row["dropped_pieces" if packed else "dropped_windows"]))
        table.append(cells)
    widths = [max(len(r[c]) for r in table) for c in range(len(head))]
    lines += [
        "  ".join(cell.rjust(w) if c else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths, strict=True))) for r in table
    ]
    lines += [f"note: {note}" for note in summary.get("notes", ())]
    return "\n".join(lines) + "\n"


def audit_mixture(epoch: Epoch, *, workers: int = 1, world_size: int = 1) -> dict[str, Any]:
    """Iterate *epoch* (of a mixture) through every share and check the mixture's four claims; failures by name."""
    mixture: Any = epoch.order  # a mixture's epoch (the CLI checks)
    started = time.perf_counter()
    k, length, B = len(mixture.parts), len(mixture), fixed_batch_size(epoch.batch_size, "a mixture's audit")
    sources = np.empty(length, dtype=np.uint8)
    windows = np.empty(length, dtype=np.uint32 if max(mixture.sizes) < 1 << 32 else np.int64)
    seen = np.zeros(length, dtype=np.uint8)  # 1 byte per item: a count of 256 or more shows as "not 1" too
    targets = np.zeros(length if mixture.packed else 0, dtype=np.uint32)  # packed: each row's real targets
    counted = np.zeros(k, dtype=np.int64)  # each source's counted targets, from the batches handed out
    failures: dict[str, str] = {}
    for rank in range(world_size):
        for worker in range(workers):
            for batch in epoch.batches(worker=worker, workers=workers, rank=rank, world_size=world_size):
                lo = batch.index * B + _row_offset(batch.index, B, length, rank, world_size)
                rows = slice(lo, lo + batch.width)
                if batch.packed:
                    targets[rows] = check_packed_rows(batch, failures)
                else:
                    _check_tokens(batch, failures)
                sources[rows], windows[rows] = batch.sources, batch.item_numbers  # type: ignore[assignment]
                mask = batch.loss_mask
                per_row = np.full(batch.width, batch.context_length) if mask is None else np.count_nonzero(mask, axis=1)
                counted += np.bincount(sources[rows], weights=per_row, minlength=k).astype(np.int64)
                seen[rows] += 1
    covered, duplicates = int(np.count_nonzero(seen == 1)), int(np.count_nonzero(seen > 1))
    if (seen != 1).any():
        failures["coverage"] = f"item {int(np.argmax(seen != 1))} was handed out {int(seen[np.argmax(seen != 1)])} times"
    if not np.array_equal(sources, mixture.sources()):
        failures["sources"] = f"row {int(np.argmax(sources != mixture.sources()))} is not of the plan's source"
    _check_tijdeman(mixture, sources, failures)
    _check_prefix(mixture, B, failures)
    _check_order(mixture, sources, windows, failures)
    if mixture.packed:
        check_source_targets(mixture, sources, targets, failures)
    expected = source_targets(mixture)
    if counted.tolist() != expected:
        s = int(np.argmax(counted != np.array(expected)))
        why = f"source {s}'s batches counted {int(counted[s])} targets; its items hold {expected[s]}"
        failures.setdefault("tokens", why)
    result = {
        **({"mode": "pack"} if mixture.packed else {}),
        "items": length,
        "covered": covered,
        "duplicates": duplicates,
        "batches": epoch.batch_count,
        "sources": k,
        "source_epochs": [round(e, 6) for e in mixture.source_epochs()],
        "bound": f"1 - 1/{2 * k - 2}" if k > 1 else "0",
        "names": list(mixture.names),
        "counted_targets": counted.tolist(),
        "target_shares": [round(c / max(int(counted.sum()), 1), 6) for c in counted.tolist()],
        "workers": workers,
        "world_size": world_size,
        **({"untrained": [r.summary() for r in mixture.untrained]} if mixture.untrained is not None else {}),
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 3),
    }
    return {"ok": not failures, "proof": mixture_proof_line(result), **result}


def _row_offset(index: int, batch_size: int, length: int, rank: int, world: int) -> int:
    from ..stages.chunk import row_share

    return row_share(min(batch_size, length - index * batch_size), rank, world)[0]


def _check_tokens(batch: Any, failures: dict[str, str]) -> None:
    """Every row's inputs and targets are its window's tokens, read from its own source with a plain gather."""
    for s in np.flatnonzero(np.bincount(batch.sources, minlength=len(batch.spaces))).tolist():
        rows = batch.sources == s
        tokens = batch.spaces[s].store.window_tokens(batch.positions[rows], batch.context_length + 1)
        if not (np.array_equal(batch.inputs[rows], tokens[:, :-1]) and np.array_equal(batch.targets[rows], tokens[:, 1:])):
            failures.setdefault("tokens", f"batch {batch.index}: rows of source {s} are not their windows' tokens")


def _check_tijdeman(mixture: Any, sources: Any, failures: dict[str, str]) -> None:
    """The rows' sources and the plan's checkpoints are Tijdeman's order recomputed from the weights (no file trusted)."""
    plan = mixture.plan
    fresh = plan_mix(plan.integer_weights, len(plan), block=plan.block)
    mine = fresh.sources[: sources.size]
    if not np.array_equal(sources, mine):
        at = int(np.argmax(sources != mine))
        failures["tijdeman"] = (
            f"item {at} is of source {int(sources[at])}; Tijdeman's order recomputed from the weights gives {int(mine[at])}"
        )
    elif not np.array_equal(np.asarray(plan.checkpoints), fresh.checkpoints):
        row = int(np.argmax((np.asarray(plan.checkpoints) != fresh.checkpoints).any(axis=1)))
        failures["tijdeman"] = f"checkpoint row {row} of the plan is not the counts of Tijdeman's order"


def _check_prefix(mixture: Any, batch_size: int, failures: dict[str, str]) -> None:
    """``|a_s n - A c_s(n)| * (2k - 2) <= A (2k - 3)`` at every batch boundary, in integers."""
    ints = mixture.plan.integer_weights
    k, total = len(ints), sum(ints)
    if k < 2:
        return
    for n in [*range(batch_size, len(mixture), batch_size), len(mixture)]:
        counts = mixture.counts(n).tolist()
        for s, (a, c) in enumerate(zip(ints, counts, strict=True)):
            if abs(a * n - total * c) * (2 * k - 2) > total * (2 * k - 3):
                failures.setdefault("prefix", f"after {n} items source {s} holds {c}, beyond w n +- (1 - 1/(2k-2))")


def _check_order(mixture: Any, sources: Any, windows: Any, failures: dict[str, str]) -> None:
    """Each source's rows are its epochs' exact shuffles, concatenated; no window twice inside one source epoch."""
    for s, part in enumerate(mixture.parts):
        got = windows[sources == s]
        size = len(part)
        kept = None if part.untrained is None else part.numbers()  # skip_untrained: the kept items' numbers, in order
        for e in range(-(-got.size // size)):
            piece = got[e * size : (e + 1) * size]
            if np.unique(piece).size != piece.size:
                failures.setdefault("repeat", f"source {s} repeats a window inside its source epoch {e}")
            expected = source_order(size, mixture.seed, s, e)[: piece.size]  # the order, computed apart from the stages
            if kept is not None:
                expected = kept[expected]
            if not np.array_equal(piece, expected):
                failures.setdefault("order", f"source {s} epoch {e} is not shuffle(part, source_epoch_seed(seed, {s}, {e}))")


MIXTURE_CHECKS = ("tijdeman_order", "prefix_bound", "source_order", "no_repeat_in_source_epoch", "tokens")
PACKED_CHECKS = ("every_target_once_per_source_epoch", "padding_masked")
_FAILURE_OF = {
    "tijdeman_order": "tijdeman",
    "prefix_bound": "prefix",
    "source_order": "order",
    "no_repeat_in_source_epoch": "repeat",
    "tokens": "tokens",
}


def mixture_proof_line(result: dict[str, Any]) -> str:
    """The mixture's PROOF line, in the store audit's ``PROOF|name=value|...`` form: coverage and duplicates as counts,
    then each claim ``ok`` or ``FAIL``."""
    failures = result["failures"]
    checks = MIXTURE_CHECKS + (PACKED_CHECKS if result.get("mode") == "pack" else ())
    fields = [f"coverage={result['covered']}/{result['items']}", f"duplicates={result['duplicates']}"]
    fields += [f"{check}={'FAIL' if _FAILURE_OF.get(check, check) in failures else 'ok'}" for check in checks]
    return "PROOF|" + "|".join(fields) + f"|sources={result['sources']}"


def format_mixture_audit(result: dict[str, Any]) -> str:
    """The PROOF line, one ``FAIL|check=...`` line per failed check, then the summary: the store audit's format."""
    lines = [result["proof"]]
    lines += [f"FAIL|check={k}|{v}" for k, v in result["failures"].items()]
    what = "packed rows" if result.get("mode") == "pack" else "windows"
    lines.append(
        f"epoch: {format_count(result['items'])} items ({what}) of {result['sources']} sources in "
        f"{format_count(result['batches'])} batches"
    )
    epochs = ", ".join(f"{n} {e:g}" for n, e in zip(result["names"], result["source_epochs"], strict=True))
    lines.append(f"sources: source epochs {epochs}; prefix bound |c_s(n) - w_s n| <= {result['bound']} at every batch")
    shares = zip(result["names"], result["counted_targets"], result["target_shares"], strict=True)
    lines.append("targets: " + ", ".join(f"{n} {format_count(c)} ({share:.1%})" for n, c, share in shares))
    if "untrained" in result:  # skip_untrained: what each source dropped before mixing
        each = zip(result["names"], result["untrained"], strict=True)
        dropped = "; ".join(f"{n} {', '.join(f'{k}={v}' for k, v in r.items())}" for n, r in each)
        lines.append(f"skip_untrained: {dropped}")
    if result["workers"] > 1 or result["world_size"] > 1:
        lines.append(f"shares: {result['world_size']} ranks x {result['workers']} workers, union checked")
    rate = result["items"] / result["seconds"] if result["seconds"] > 0 else 0.0
    lines.append(f"time: {result['seconds']:.2f} s, {format_count(int(rate))} items/s")
    return "\n".join(lines) + "\n"
