"""Items with no counted target: counted per window or packed row, and dropped on request (``skip_untrained=True``).

Under a loss mask a window, or a packed row, can hold no target that trains
(a long prompt, say).  By default such items are kept, so a masked epoch holds
the same items as the unmasked one; ``sb.windows(..., skip_untrained=True)``
and ``sb.pack(..., skip_untrained=True)`` (``Epoch``/``Run(skip_untrained=True)``,
``--skip-untrained``) drop them.  The kept items are a plan in natural order
over a copy of the space that carries an `UntrainedReport`: every later stage
(shuffle, plan files, chunk, the façades) reads them as any planned items, and
a plan file's key names the filter.

Packed rows drop *pieces*, before packing: a document's tail with no counted
target is left out of best-fit (`streambatch.items.pack.rows.pack`), and a full
piece with none is its own row, dropped here; so every kept row holds only
pieces that train.  The full pieces keep their numbering (row ``r`` is still
the ``r``-th full piece), so the gathers locate them as without the filter.

A mixture filters each source before mixing (``sb.mix`` of filtered parts):
the sizes it mixes are the kept counts, and `Mixture.untrained` holds each
source's report.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..model.source import TokenSource
from .protocol import PlannedItems

_BLOCK = 1 << 22  # items counted per step: bounded temporaries
_I = TypeVar("_I", bound=PlannedItems)


@dataclass(frozen=True)
class UntrainedReport:
    """What ``skip_untrained`` did: *kept* items (their plan entries: *entries*), *dropped* windows or, for
    packed rows, pieces: the full ones (rows of their own) and the tails left out of packing (*tails*: their
    documents; *packing*: the `PackReport` of the kept rows)."""

    kept: int
    dropped: int
    entries: npt.NDArray[Any]
    tails: npt.NDArray[np.int64] | None = None  # packed: documents whose tail piece was left out of packing
    packing: Any = None  # packed: the PackReport of the kept rows

    @property
    def items(self) -> int | None:
        """Windows: every window before the filter.  Packed rows: None, as no count of rows before the filter
        exists (the kept pieces are packed anew: *kept* rows, *dropped* pieces are not rows)."""
        return self.kept + self.dropped if self.packing is None else None

    @property
    def dropped_tails(self) -> int:
        """Tail pieces left out of packing (0 for windows)."""
        return 0 if self.tails is None else int(self.tails.size)

    def summary(self) -> dict[str, int]:
        """The counts, as the commands show them: kept and dropped items (packed: pieces, and of them tails)."""
        if self.packing is None:
            return {"kept_windows": self.kept, "dropped_windows": self.dropped}
        return {"kept_rows": self.kept, "dropped_pieces": self.dropped, "dropped_tails": self.dropped_tails}

    def __repr__(self) -> str:
        return f"UntrainedReport(kept={self.kept}, dropped={self.dropped})"


def counted_between(store: TokenSource, first: npt.NDArray[np.int64], last: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Counted targets among flat tokens ``[first, last)`` of *store* (a store, or a corpus: global positions, each
    range inside one shard); ``last - first`` where no mask.

    >>> import streambatch as sb
    >>> store = sb.DocumentStore.from_arrays([0, 5, 6, 7, 8], [0, 5], loss_mask=[0, 0, 1, 1, 0])
    >>> counted_between(store, np.array([1, 3]), np.array([3, 5])).tolist()
    [1, 1]
    """
    return store.flat().counted_between(first, last)


def item_targets(items: Any) -> npt.NDArray[np.int64]:
    """Counted targets of each of *items* (`Windows` or packed `Rows`, any view or order), in blocks.

    >>> import streambatch as sb
    >>> doc = sb.Document("a", "train", [0, 10, 11, 12, 13], loss_mask=[0, 0, 0, 1, 1])
    >>> item_targets(sb.windows([doc], context_length=2, stride=2)).tolist()
    [0, 2]
    """
    parts = [items[lo : lo + _BLOCK].target_counts() for lo in range(0, len(items), _BLOCK)]  # each kind's own rule
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def drop_untrained(items: _I, *, tails: npt.NDArray[np.int64] | None = None, packing: Any = None) -> _I:
    """*items* (whole, in natural order) without those with no counted target, over a space carrying the report.

    Packed rows pass the *tails* their packing left out and *packing* (a function of the kept row numbers
    giving their `PackReport`): both go into the report.

    >>> import streambatch as sb
    >>> doc = sb.Document("a", "train", [0, 10, 11, 12, 13], loss_mask=[0, 0, 0, 1, 1])
    >>> kept = drop_untrained(sb.windows([doc], context_length=1))
    >>> len(kept), kept.positions().tolist(), kept.untrained
    (2, [2, 3], UntrainedReport(kept=2, dropped=2))
    """
    trained = item_targets(items) > 0
    kind: Any = items  # Windows or Rows: each kind says what its plan entries are
    entries = kind.plan_values()[trained]
    space = copy.copy(items.space)  # the same store, index and packing; its own caches and report
    space.cache = {}
    dropped = int(trained.size - entries.size) + (0 if tails is None else int(tails.size))
    report = None if packing is None else packing(entries)
    space.untrained = UntrainedReport(int(entries.size), dropped, entries, tails, report)
    return type(items)(space, entries, 0, entries.size)


def untrained_note(items: Any) -> str | None:
    """What ``skip_untrained`` dropped from *items* (windows, packed rows or a mixture), for a command's note; None
    when nothing was filtered.

    >>> import streambatch as sb
    >>> doc = sb.Document("a", "train", [0, 10, 11, 12, 13], loss_mask=[0, 0, 0, 1, 1])
    >>> untrained_note(sb.windows([doc], context_length=1, skip_untrained=True))
    'skip_untrained dropped 2 windows with no counted target (2 kept)'
    """
    reports = items.untrained  # every kind has it (EpochItems)
    if reports is None:
        return None
    if not isinstance(reports, tuple):
        return f"skip_untrained dropped {_dropped(reports)}"
    names = items.names
    each = "; ".join(f"{n!r}: {_dropped(r)}" for n, r in zip(names, reports, strict=True))
    return f"skip_untrained dropped, per source: {each}"


def _dropped(report: UntrainedReport) -> str:
    if report.packing is None:
        return f"{report.dropped} windows with no counted target ({report.kept} kept)"
    return (
        f"{report.dropped} pieces with no counted target ({report.dropped_tails} of them tails left out of packing; "
        f"{report.kept} rows kept)"
    )
