"""Items with no counted target: counted per window or packed row, and dropped on request (``skip_untrained=True``).

Under a loss mask a window, or a packed row, can hold no target that trains
(a long prompt, say).  By default such items are kept, so a masked epoch holds
the same items as the unmasked one; ``sb.windows(..., skip_untrained=True)``
and ``sb.pack(..., skip_untrained=True)`` (``Epoch``/``Run(skip_untrained=True)``,
``--skip-untrained``) drop them.  The kept items are a plan in natural order
over a copy of the space that carries an `UntrainedReport`: every later stage
(shuffle, plan files, chunk, the façades) reads them as any planned items, and
a plan file's key names the filter.  A packed row is dropped when none of its
pieces trains; a piece with no counted target inside a row that trains keeps
its positions, all masked.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..model.mask import prefix_counts
from .protocol import PlannedItems

_BLOCK = 1 << 22  # items counted per step: bounded temporaries
_I = TypeVar("_I", bound=PlannedItems)


@dataclass(frozen=True)
class UntrainedReport:
    """What ``skip_untrained`` did: ``kept + dropped`` is every item; ``entries`` the kept items' plan entries."""

    kept: int
    dropped: int
    entries: npt.NDArray[Any]

    @property
    def items(self) -> int:
        """Every item before the filter."""
        return self.kept + self.dropped

    def __repr__(self) -> str:
        return f"UntrainedReport(kept={self.kept}, dropped={self.dropped})"


def counted_between(store: Any, first: npt.NDArray[np.int64], last: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Counted targets among flat tokens ``[first, last)`` of *store* (a store, or a corpus: global positions, each
    range inside one shard); ``last - first`` where no mask.

    >>> import streambatch as sb
    >>> store = sb.DocumentStore.from_arrays([0, 5, 6, 7, 8], [0, 5], loss_mask=[0, 0, 1, 1, 0])
    >>> counted_between(store, np.array([1, 3]), np.array([3, 5])).tolist()
    [1, 1]
    """
    out = (last - first).astype(np.int64)
    shards = getattr(store, "shards", None)
    if shards is None:
        bits = getattr(store, "loss_bits", None)
        if bits is not None and first.size:
            counts = prefix_counts(bits, np.concatenate([first, last]))
            out = counts[first.size :] - counts[: first.size]
        return out
    bases = store.bases
    owner = np.searchsorted(bases, first, side="right") - 1
    for k in np.unique(owner).tolist():
        if shards[k].loss_bits is None:
            continue
        chosen = np.flatnonzero(owner == k)
        base = int(bases[k])
        out[chosen] = counted_between(shards[k], first[chosen] - base, last[chosen] - base)
    return out


def item_targets(items: Any) -> npt.NDArray[np.int64]:
    """Counted targets of each of *items* (`Windows` or packed `Rows`, any view or order), in blocks.

    >>> import streambatch as sb
    >>> doc = sb.Document("a", "train", [0, 10, 11, 12, 13], loss_mask=[0, 0, 0, 1, 1])
    >>> item_targets(sb.windows([doc], context_length=2, stride=2)).tolist()
    [0, 2]
    """
    parts = [items[lo : lo + _BLOCK].target_counts() for lo in range(0, len(items), _BLOCK)]  # each kind's own rule
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def drop_untrained(items: _I) -> _I:
    """*items* (whole, in natural order) without those with no counted target, over a space carrying the report.

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
    space.untrained = UntrainedReport(int(entries.size), int(trained.size - entries.size), entries)
    return type(items)(space, entries, 0, entries.size)
