"""What an epoch over a source will contain, before running it: documents, windows, tails, batches, plan bytes.

`inspect_source` computes everything per document with numpy (nothing per
window) and returns plain JSON-ready data; ``streambatch inspect`` only formats it.
With ``pack``, `mode_summaries` puts the item kinds side by side (`MODES`: windows
at stride ``T`` and packed rows), each counted by the same questions: target
tokens covered (and their share of all the partition's targets, ``sum(L - 1)``),
documents seen (at least one target trained on), rows and the pad share of their
positions.  The window mode is counted at stride ``T`` (each target at most once
per epoch, the stride packing cuts its pieces at); packing covers every target
of every document of two tokens or more, by the real packing
(`streambatch.items.pack.pack.pack_lengths`, best-fit decreasing), never an estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import check_non_negative, check_positive
from ..errors import ConfigError
from ..items.pack.pack import pack_lengths
from ..items.windows.window_index import window_counts, window_tails
from ..items.windows.windows import POSITION_LIMIT
from ..model.documents import Partition
from ..model.source import Source, as_source
from ..stages.chunk import BatchSize, batch_count, final_batch
from ..stages.schedule import BatchSchedule, in_epoch, state_batch_size
from .inspect_mask import mask_rows, mask_summary

MODES = ("windows", "packed")  # the item kinds `mode_summaries` counts, in the order of its table


def plan_bytes(window_count: int, token_count: int) -> int:
    """Bytes of a shuffled plan: 4 per window (uint32 positions or numbers), 8 beyond 2**32 of both.

    >>> plan_bytes(5, 9), plan_bytes(2**32, 2**33)
    (20, 34359738368)
    """
    return window_count * (4 if token_count < POSITION_LIMIT or window_count < POSITION_LIMIT else 8)


def inspect_source(
    source: Any,
    *,
    context_length: int | None = None,
    batch_size: int | None = None,
    stride: int = 1,
    partition: Partition | str | None = None,
    pack: bool = False,
    skip_untrained: bool = False,
    epoch: int = 0,
) -> dict[str, Any]:
    """Summarize *source* (a `Source`, a store or documents) and, given ``T`` (and ``B``), its epochs.

    Per partition (only *partition* when given, else every partition that has
    documents): documents and tokens; with *context_length*: windows, documents
    too short for one window, tokens in incomplete tails and their share, and the
    bytes of a shuffled plan; with *batch_size*: batches and the final batch's
    width, actual denominator (``width * T``) and capacity (``B * T``).  With
    *pack* (needs *context_length*, and stride ``T`` or none): per partition,
    ``modes`` holds the window mode at stride ``T`` and packing side by side
    (`mode_summaries`).  A store with a loss mask adds, per
    partition, ``loss_mask`` (`streambatch.tools.inspect_mask`); with
    *skip_untrained* it also counts the windows and rows an epoch then keeps.
    A batch-size schedule's thresholds count over the run (`streambatch.stages.schedule`): *epoch* ``e`` lays
    out epoch ``e``'s batches, after ``e`` epochs of the partition's items (``epoch`` is then in the summary).

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> train = inspect_source(docs, context_length=2, batch_size=3)["partitions"]["train"]
    >>> train["windows"], train["batches"], train["final_batch"]
    (5, 2, {'width': 2, 'tokens': 4, 'capacity_tokens': 6})
    """
    if context_length is None and batch_size is not None:
        raise ConfigError(f"batch_size={batch_size!r} needs a context_length; pass context_length=T to count batches")
    T = None if context_length is None else check_positive(context_length, "context_length", "the input tokens per window")
    B = None if batch_size is None or T is None else BatchSchedule.parse(batch_size)  # an int, or a schedule
    B = B.bound(T) if isinstance(B, BatchSchedule) and T is not None else B
    s = check_positive(stride, "stride", "the distance between window starts")
    number = check_non_negative(epoch, "epoch", "the epoch of the run to lay out (0 for the first)")
    if pack and T is None:
        raise ConfigError("pack=True needs a context_length; pass context_length=T to pack rows of T positions")
    if pack and s not in (1, T):
        raise ConfigError(f"stride={s} with pack=True: packing cuts pieces at stride T; drop the stride")
    if pack and T is not None:
        s = T  # the window mode beside packing: windows at the stride packing cuts its pieces at
    store = as_source(source)
    lengths = store.lengths
    summary: dict[str, Any] = {
        "documents": len(store),
        "tokens": int(lengths.sum()),
        "dtype": store.dtype.name,
        "fingerprint": store.fingerprint,
        "tokenizer": store.tokenizer,
    }
    if isinstance(source, Source):
        summary = {"path": source.path, "kind": source.kind, "verified": source.verified, **summary}
    if store.has_loss_mask:
        summary["loss_mask"] = True  # the per-partition summaries say what it trains
    flat = store.flat()
    if flat.sharded:
        summary["shards"] = [
            {"path": path, "documents": len(shard), "tokens": shard.token_count}
            for path, shard in zip(flat.paths, store.shards, strict=True)
        ]
    if T is not None:
        summary.update(context_length=T, stride=s)
        if pack:
            summary["pack"] = True
        if skip_untrained:
            summary["skip_untrained"] = True
        if B is not None:
            summary["batch_size"] = state_batch_size(B)  # a schedule as its text
            if number and isinstance(B, BatchSchedule):
                summary["epoch"] = number  # the run's epoch whose batches are laid out
    wanted = [Partition.parse(partition)] if partition is not None else list(Partition)
    parts = {}
    for part in wanted:
        mask = store.partition_codes == part.code
        if partition is None and not mask.any():
            continue
        parts[part.value] = _partition_summary(lengths[mask], T, B, s, store.flat_size, number)
        if pack and T is not None:
            parts[part.value]["modes"] = mode_summaries(lengths[mask], T, B, number)
        if store.has_loss_mask:
            parts[part.value]["loss_mask"] = mask_summary(store, part, T, s, pack, skip_untrained)
    summary["partitions"] = parts
    return summary


def mode_summaries(lengths: npt.NDArray[Any], T: int, B: BatchSize | None, epoch: int = 0) -> dict[str, dict[str, Any]]:
    """Each item kind of `MODES` over documents of *lengths* at ``T`` (and batch size *B*, in the run's *epoch*):
    see the module docstring.

    >>> s = mode_summaries(np.array([5, 1, 4, 2]), 2, 2)
    >>> [(s[m]["covered_targets"], s[m]["documents_seen"], s[m]["rows"], s[m]["pad_positions"]) for m in MODES]
    [(6, 2, 3, 0), (8, 3, 4, 0)]
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    targets = int(np.maximum(sizes - 1, 0).sum())
    windows = window_counts(sizes, T, T)
    packed = pack_lengths(sizes, T).report
    out = {  # per kind: (targets covered, documents seen, rows)
        "windows": _mode(targets, int(windows.sum()) * T, int(np.count_nonzero(windows)), int(windows.sum()), T, B, epoch),
        "packed": _mode(targets, packed.targets, int(np.count_nonzero(sizes > 1)), packed.rows, T, B, epoch),
    }
    out["packed"].update(skipped_one_token_documents=packed.skipped_pieces, row_lower_bound=packed.lower_bound)
    return out


def _mode(targets: int, covered: int, seen: int, rows: int, T: int, B: BatchSize | None, epoch: int = 0) -> dict[str, Any]:
    positions = rows * T
    out: dict[str, Any] = {
        "covered_targets": covered,
        "coverage": covered / targets if targets else 1.0,
        "documents_seen": seen,
        "rows": rows,
        "positions": positions,
        "pad_positions": positions - covered,
        "pad_share": (positions - covered) / positions if positions else 0.0,
    }
    if B is not None:
        out["batches"] = batch_count(rows, in_epoch(B, epoch, rows))
    return out


def _partition_summary(
    lengths: Any, T: int | None, B: BatchSize | None, stride: int, store_tokens: int, epoch: int = 0
) -> dict[str, Any]:
    tokens = int(lengths.sum())
    out: dict[str, Any] = {"documents": int(lengths.size), "tokens": tokens}
    if T is None:
        return out
    counts = window_counts(lengths, T, stride)
    windows = int(counts.sum())
    tails = int(window_tails(lengths, T, stride)[1].sum())
    out.update(
        windows=windows,
        short_documents=int(np.count_nonzero(counts == 0)),
        tail_tokens=tails,
        tail_share=tails / tokens if tokens else 0.0,
        plan_bytes=plan_bytes(windows, store_tokens),
    )
    if B is None:
        return out
    B = in_epoch(B, epoch, windows)
    count = batch_count(windows, B)
    full, width, capacity = final_batch(windows, B)
    out.update(
        batches=count,
        full_batches=full,
        final_batch={"width": width, "tokens": width * T, "capacity_tokens": capacity * T} if count else None,
    )
    if isinstance(B, BatchSchedule):
        out["width_runs"] = [list(run) for run in B.runs(windows)]
    return out


def _scaled(value: int, units: tuple[str, ...]) -> str:
    for power, unit in zip((12, 9, 6, 3), units, strict=True):
        if value >= 10**power:
            scaled = value / 10**power
            return f"{scaled:.{0 if scaled >= 100 else 1}f} {unit}"
    return str(value)


def format_count(value: int) -> str:
    """A count for people: exact below 10,000, else one decimal (none from 100 up) with k, M, G, T.

    >>> format_count(9_999), format_count(12_345), format_count(1_234_567), format_count(100_000_000)
    ('9999', '12.3 k', '1.2 M', '100 M')
    """
    return str(value) if value < 10_000 else _scaled(value, ("T", "G", "M", "k"))


def format_bytes(value: int) -> str:
    """Bytes for people, in decimal units (kB = 1000 B).

    >>> format_bytes(20), format_bytes(4_000), format_bytes(400_000_000)
    ('20 B', '4.0 kB', '400 MB')
    """
    return f"{value} B" if value < 1000 else _scaled(value, ("TB", "GB", "MB", "kB"))


def format_tokenizer(value: Any) -> str:
    """A header's tokenizer entry on one line: its name, then its other fields.

    >>> format_tokenizer({"name": "byte", "vocab_size": 256}), format_tokenizer("gpt2")
    ('byte (vocab_size=256)', 'gpt2')
    """
    if isinstance(value, dict):
        rest = ", ".join(f"{k}={v}" for k, v in value.items() if k != "name")
        name = str(value.get("name", ""))
        return f"{name} ({rest})" if name and rest else name or rest
    return str(value)


def _kind_words(summary: dict[str, Any]) -> str:
    """What kind of source a summary describes, as `Source.kind` says (never a manifest called a JSONL file)."""
    kind = summary["kind"]
    if kind == "corpus":
        shards = len(summary.get("shards", ()))
        return f"corpus manifest of {shards} store{'s' if shards != 1 else ''}, memory-mapped"
    return {"store": "store directory, memory-mapped", "jsonl": "JSONL file, read into memory"}.get(kind, str(kind))


def format_summary(summary: dict[str, Any]) -> str:
    """`inspect_source`'s result as aligned text: the corpus, then one column per partition."""
    lines: list[tuple[str, str]] = []
    if "path" in summary:
        lines.append(("source", f"{summary['path']} ({_kind_words(summary)})"))
    lines.append(("documents", format_count(summary["documents"])))
    lines.append(("tokens", f"{format_count(summary['tokens'])} ({summary['dtype']})"))
    if summary["fingerprint"]:
        checked = "verified" if summary.get("verified") else "not verified"
        lines.append(("fingerprint", f"{summary['fingerprint']} ({checked})"))
    if summary["tokenizer"] is not None:
        lines.append(("tokenizer", format_tokenizer(summary["tokenizer"])))
    if summary.get("loss_mask"):
        lines.append(("loss mask", "yes: only targets whose bit is set train (1 bit per token)"))
    text = _aligned(lines)
    parts = summary["partitions"]
    if not parts:
        return text
    T: int | None = summary.get("context_length")
    corner = "partition" if T is None else f"T={T}, stride={summary['stride']}"
    if "batch_size" in summary:
        corner += f", B={summary['batch_size']}"
    if "epoch" in summary:
        corner += f", epoch {summary['epoch']}"
    if T is not None and summary.get("pack"):
        corner = f"windows: {corner}"  # below the packed table: the window mode it is compared with
    rows = [("documents", [format_count(p["documents"]) for p in parts.values()])]
    rows.append(("tokens", [format_count(p["tokens"]) for p in parts.values()]))
    if T is not None:
        rows += [
            ("windows", [format_count(p["windows"]) for p in parts.values()]),
            (f"short documents (< {T + 1} tokens)", [format_count(p["short_documents"]) for p in parts.values()]),
            ("tail tokens", [f"{format_count(p['tail_tokens'])} ({100 * p['tail_share']:.1f} %)" for p in parts.values()]),
        ]
    if T is not None and "batch_size" in summary:
        B = summary["batch_size"]
        rows += [
            ("batches", [format_count(p["batches"]) for p in parts.values()]),
            ("batch widths", [_widths(p, B) for p in parts.values()]),
            ("final batch", [_final(p, "shape", T) for p in parts.values()]),
            ("final denominator", [_final(p, "tokens", T) for p in parts.values()]),
        ]
    if T is not None:
        rows.append(("plan (shuffled)", [format_bytes(p["plan_bytes"]) for p in parts.values()]))
    rows += mask_rows(parts, format_count)
    windows = "\n" + _table(corner, list(parts), rows)
    if T is None or not summary.get("pack"):
        return text + windows
    names, pack_rows = _pack_rows(parts, T)  # the mode asked for first, the window mode's table after it
    return text + "\n" + _table(f"T={T}: packed vs windows at stride {T}", names, pack_rows) + windows


def _pack_rows(parts: dict[str, Any], T: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Column names (``train: packed``, ``train: windows``, ...) and labelled rows for the side-by-side table."""
    order = MODES[::-1]  # packed first: the mode asked for
    names = [f"{part}: {mode}" for part in parts for mode in order]
    cells = [parts[part]["modes"][mode] for part in parts for mode in order]
    rows = [
        ("target tokens covered", [f"{format_count(c['covered_targets'])} ({100 * c['coverage']:.1f} %)" for c in cells]),
        ("documents seen", [format_count(c["documents_seen"]) for c in cells]),
        (f"rows of {T} positions", [format_count(c["rows"]) for c in cells]),
        ("pad share of positions", [f"{100 * c['pad_share']:.3f} %" for c in cells]),
    ]
    if cells and "batches" in cells[0]:
        rows.append(("batches", [format_count(c["batches"]) for c in cells]))
    return names, rows


def _widths(part: dict[str, Any], batch_size: int) -> str:
    full, final = part["full_batches"], part["final_batch"]
    if final is None:
        return "none"
    if "width_runs" in part:  # a schedule: each run of equal widths
        return " + ".join(f"[{w}] x {format_count(n)}" for w, n in part["width_runs"])
    pieces = [f"[{batch_size}] x {format_count(full)}"] if full else []
    if final["width"] != batch_size:
        pieces.append(f"[{final['width']}]")
    return " + ".join(pieces)


def _final(part: dict[str, Any], what: str, T: int) -> str:
    final = part["final_batch"]
    if final is None:
        return "none"
    if what == "shape":
        return f"[{final['width']}, {T}]"
    return f"{format_count(final['tokens'])} of {format_count(final['capacity_tokens'])} tokens"


def _aligned(lines: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in lines)
    return "".join(f"{k:<{width}}  {v}\n" for k, v in lines)


def _table(corner: str, names: list[str], rows: list[tuple[str, list[str]]]) -> str:
    label = max([len(corner)] + [len(k) for k, _ in rows])
    widths = [max([len(n)] + [len(values[i]) for _, values in rows]) for i, n in enumerate(names)]
    head = f"{corner:<{label}}" + "".join(f"  {n:>{w}}" for n, w in zip(names, widths, strict=True))
    body = [f"{k:<{label}}" + "".join(f"  {v:>{w}}" for v, w in zip(values, widths, strict=True)) for k, values in rows]
    return "\n".join([head, *body]) + "\n"
