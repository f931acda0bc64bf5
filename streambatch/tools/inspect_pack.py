"""The two modes side by side, before running either: windows at stride ``T`` against packed rows.

``streambatch inspect --pack`` asks, per partition, what an epoch of each mode
trains on: target tokens covered (and their share of all the partition's
targets, ``sum(L - 1)``), documents seen (at least one target trained on), rows
and the pad share of their positions.  The window mode is counted at stride
``T`` (each target at most once per epoch, the stride packing cuts its pieces
at); packing covers every target of every document of two tokens or more.
Everything is per document with numpy, and the packing is the real one
(`streambatch.items.pack.pack.pack_lengths`, best-fit decreasing), never an estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..items.pack.pack import pack_lengths
from ..items.windows.window_index import window_counts
from ..stages.chunk import batch_count

MODES = ("windows", "packed")


def mode_summaries(lengths: npt.NDArray[Any], T: int, B: int | None) -> dict[str, dict[str, Any]]:
    """Both modes over documents of *lengths* at ``T`` (and batch size *B*): see the module docstring.

    >>> s = mode_summaries(np.array([5, 1, 4, 2]), 2, 2)
    >>> [(s[m]["covered_targets"], s[m]["documents_seen"], s[m]["rows"], s[m]["pad_positions"]) for m in MODES]
    [(6, 2, 3, 0), (8, 3, 4, 0)]
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    targets = int(np.maximum(sizes - 1, 0).sum())
    windows = window_counts(sizes, T, T)
    packed = pack_lengths(sizes, T).report
    out = {
        "windows": _mode(targets, int(windows.sum()) * T, int(np.count_nonzero(windows)), int(windows.sum()), T, B),
        "packed": _mode(targets, packed.targets, int(np.count_nonzero(sizes > 1)), packed.rows, T, B),
    }
    out["packed"].update(skipped_one_token_documents=packed.skipped_pieces, row_lower_bound=packed.lower_bound)
    return out


def _mode(targets: int, covered: int, seen: int, rows: int, T: int, B: int | None) -> dict[str, Any]:
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
        out["batches"] = batch_count(rows, B)
    return out
