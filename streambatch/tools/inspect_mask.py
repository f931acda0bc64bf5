"""What a source's loss mask trains, for ``streambatch inspect``: counted targets, and what holds none.

Per partition: the counted targets as a share of all targets, the documents
with no trained target, and (given ``T``) the windows and (``--pack``) the
packed rows with none: what ``skip_untrained=True`` would drop.  Computed from
the mask bits (`streambatch.items.untrained`); documents are counted with one
prefix count each, windows and rows in bounded blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..items.pack.rows import pack
from ..items.untrained import counted_between, item_targets
from ..items.windows.windows import windows
from ..model.documents import Partition
from ..model.source import TokenSource


def mask_summary(
    store: TokenSource, part: Partition, T: int | None, stride: int, packed: bool, skip_untrained: bool = False
) -> dict[str, Any]:
    """The loss-mask summary of partition *part* of *store* (which has a mask); with *skip_untrained* the windows
    (and rows) an epoch with ``skip_untrained=True`` keeps.

    >>> import streambatch as sb
    >>> docs = [sb.Document("a", "train", [0, 1, 2, 3, 4], loss_mask=[0, 0, 0, 1, 1]),
    ...         sb.Document("b", "train", [0, 1, 2], loss_mask=[0, 0, 1])]
    >>> summary = mask_summary(sb.DocumentStore.from_documents(docs), Partition.TRAIN, 2, 2, True)
    >>> summary["counted_targets"], summary["targets"], summary["untrained_windows"], summary["untrained_rows"]
    (3, 6, 1, 1)
    """
    chosen = np.flatnonzero(store.partition_codes == part.code)
    starts = store.starts[chosen].astype(np.int64)
    ends = starts + store.lengths[chosen].astype(np.int64)
    counted = counted_between(store, np.minimum(starts + 1, ends), ends)
    targets = int(np.maximum(ends - starts - 1, 0).sum())
    total = int(counted.sum())
    out: dict[str, Any] = {
        "targets": targets,
        "counted_targets": total,
        "counted_share": total / targets if targets else 0.0,
        "untrained_documents": int(np.count_nonzero(counted == 0)),
    }
    if T is None:
        return out
    items = windows(store, context_length=T, stride=stride, partition=part, keep_partition=True)
    per = item_targets(items)
    out.update(windows=int(per.size), untrained_windows=int(np.count_nonzero(per == 0)))
    if skip_untrained:
        out.update(kept_windows=int(np.count_nonzero(per)), dropped_windows=int(np.count_nonzero(per == 0)))
    if packed:
        rows = item_targets(pack(store, context_length=T, partition=part, keep_partition=True))
        out.update(rows=int(rows.size), untrained_rows=int(np.count_nonzero(rows == 0)))
        if skip_untrained:  # pieces with no counted target are left out before packing: fewer rows, less padding
            kept = pack(store, context_length=T, partition=part, keep_partition=True, skip_untrained=True)
            out.update(kept.untrained.summary(), pad_share_kept=kept.report.pad_share)
    return out


def mask_rows(parts: dict[str, Any], count: Callable[[int], str]) -> list[tuple[str, list[str]]]:
    """Labelled rows of the partition table for a masked source (empty when no partition has a summary); *count*
    writes a count for people (`streambatch.tools.inspect.format_count`)."""
    found = [p.get("loss_mask") for p in parts.values()]
    if not any(found):
        return []
    cells = [m or {} for m in found]
    rows = [
        ("counted targets", [f"{count(m['counted_targets'])} ({100 * m['counted_share']:.1f} %)" if m else "-" for m in cells]),
        ("documents training nothing", [str(m["untrained_documents"]) if m else "-" for m in cells]),
    ]
    if any("untrained_windows" in m for m in cells):
        rows.append(("windows training nothing", [str(m.get("untrained_windows", "-")) for m in cells]))
    if any("untrained_rows" in m for m in cells):
        rows.append(("packed rows training nothing", [str(m.get("untrained_rows", "-")) for m in cells]))
    if any("kept_windows" in m for m in cells):
        rows.append(("windows kept (--skip-untrained)", [str(m.get("kept_windows", "-")) for m in cells]))
    if any("kept_rows" in m for m in cells):
        rows.append(("packed rows kept (--skip-untrained)", [str(m.get("kept_rows", "-")) for m in cells]))
        rows.append(("pieces dropped (--skip-untrained)", [str(m.get("dropped_pieces", "-")) for m in cells]))
    return rows
