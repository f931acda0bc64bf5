"""Tokens in = tokens out: every token of the partition is handed out by a window of the epoch, or left out for a
reason the layout gives (a document shorter than ``T + 1``, a tail after its last window, a gap of a stride above
``T + 1``, a window ``skip_untrained`` dropped).

``in`` counts the partition's tokens; ``out`` the distinct tokens the windows the batches handed out hold (each
window its ``T + 1``); ``left_out`` what the epoch's own windows (recomputed from the store) never hold.  The audit
proves ``in == out + left_out``: a window missing, or handed out where none belongs, breaks it.

>>> spans_union(np.array([0, 2, 4]), np.array([0, 0, 0]), 3)
7
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

_BLOCK = 1 << 22  # window numbers located per step: bounded temporaries


def spans_union(starts: npt.NDArray[np.int64], documents: npt.NDArray[np.int64], width: int) -> int:
    """Tokens held by windows of *width* tokens at *starts* of *documents* (sorted by document, then start)."""
    if not starts.size:
        return 0
    step = np.diff(starts)
    same = documents[1:] == documents[:-1]
    held = np.where(same, np.minimum(step, width), width)
    return int(held.sum()) + width


def _held(windows: Any, flags: npt.NDArray[np.bool_]) -> int:
    """`spans_union` of the windows whose *flags* are set, located block by block."""
    width, total = windows.expected.context_length + 1, 0
    pending: tuple[int, int] | None = None  # the last window of the blocks before: its share waits for the next one
    for lo in range(0, flags.size, _BLOCK):
        picked = lo + np.flatnonzero(flags[lo : lo + _BLOCK])
        if not picked.size:
            continue
        documents, starts = windows.locate(picked.astype(np.int64))
        if pending is not None:
            total += min(width, int(starts[0]) - pending[1]) if int(documents[0]) == pending[0] else width
        total += spans_union(starts, documents, width) - width  # every window of the block but its last
        pending = (int(documents[-1]), int(starts[-1]))
    return total + (width if pending is not None else 0)


def ledger(windows: Any, shown: npt.NDArray[np.bool_]) -> dict[str, Any]:
    """``in``, ``out``, ``left_out`` (``short_documents`` and ``tails_and_gaps``) and whether ``in == out + left_out``,
    for the windows *shown* (one flag per window number of *windows*, a
    `streambatch.tools.audit.coverage.WindowCoverage`) against the epoch's own windows."""
    included, lengths = windows.expected.included, windows.expected.lengths
    tokens_in = int(lengths[included].sum())
    wanted = np.ones(windows.window_count, dtype=np.bool_) if windows.kept is None else windows.kept
    out = _held(windows, shown)
    short = int(lengths[included & (windows.counts == 0)].sum())
    left_out = tokens_in - _held(windows, wanted)
    return {
        "in": tokens_in,
        "out": out,
        "left_out": left_out,
        "short_documents": short,
        "tails_and_gaps": left_out - short,
        "balanced": tokens_in == out + left_out,
    }
