"""The full check of a plan file, in one read: its block digests, every entry, and no window twice.

`verify_plan` is what ``verify=True`` (``streambatch plan --verify``, ``epoch
--verify``, ``audit --plan-dir``) adds to opening a plan.  It checks every
block against its digest (`streambatch.io.keyed_file.KeyedFile.verify`), then
reads the plan in blocks of `BLOCK` entries, and for each block

- checks every entry is a window of the source and partition (the check every
  batch makes where the entry is used, `WindowIndex.first_invalid`);
- marks each entry's window number in a bitmap of one bit per window; with
  ``N`` valid entries for ``N`` windows, ``N`` bits set at the end means every
  window appears exactly once (fewer: some entries repeat others).

Memory: the bitmap (``N / 8`` bytes: 125 MB at 10^9 windows) plus a block's
temporaries.  Any failure raises `StoreError` naming the file and the entry.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ..errors import StoreError
from ..io.keyed_file import KeyedFile
from .protocol import Orderable

BLOCK = 1 << 20


def verify_plan(ordered: Orderable, keyed: KeyedFile) -> None:
    """Read the plan behind *ordered* (mapped from *keyed*) once; refuse a block, entry or duplicate that is wrong.

    >>> import tempfile, streambatch as sb
    >>> from streambatch.order.plan import build_plan
    >>> docs = [sb.Document("a", "train", [0, 10, 11, 12, 1])]
    >>> order, _ = build_plan(sb.windows(docs, context_length=2), 7, tempfile.mkdtemp(), verify=True)
    >>> len(order)
    3
    """
    plan = ordered.plan
    assert plan is not None, "a plan-backed Windows"
    count, total = int(plan.size), _total(ordered)
    keyed.verify()
    shown, fix = keyed.shown, keyed.fix
    seen = np.zeros((total + 7) // 8, dtype=np.uint8)
    for lo in range(0, count, BLOCK):
        block = np.ascontiguousarray(plan[lo : lo + BLOCK])
        numbers = _entries(ordered, block, total)
        bad = np.flatnonzero(numbers < 0)
        if bad.size:
            raise StoreError(
                f"{shown}: entry {lo + int(bad[0])} ({int(block[bad[0]])}) is not a {_noun(ordered)} of this source "
                f"and partition; the plan is damaged: {fix}"
            )
        _mark(seen, numbers)
    marked = int(np.bitwise_count(seen).sum())
    if ordered.untrained is not None:  # skip_untrained: the kept items, each once, and no dropped one
        kept = np.zeros_like(seen)
        _mark(kept, ordered.unordered().numbers())
        if marked != count or not np.array_equal(seen, kept):
            noun = _noun(ordered)
            raise StoreError(f"{shown}: its entries are not the {count} kept {noun}s of skip_untrained, each once; {fix}")
        return
    if marked != total:  # N valid entries for N items: an item missing means another repeats
        missing = int(np.flatnonzero(np.unpackbits(seen, bitorder="little")[:total] == 0)[0])
        noun = _noun(ordered)
        raise StoreError(f"{shown}: {total - marked} entries repeat other {noun}s ({noun} {missing} never comes); {fix}")


def _total(ordered: Orderable) -> int:
    """Items a whole plan of *ordered* holds: every window, or every packed row."""
    return ordered.whole_count


def _noun(ordered: Orderable) -> str:
    return ordered.words.item


def _entries(ordered: Orderable, block: npt.NDArray[np.integer], total: int) -> npt.NDArray[np.int64]:
    """Each entry's item number, -1 where the entry names no item (not a window start; a row past the last)."""
    return ordered.plan_entries(block, total)


def _mark(seen: npt.NDArray[np.uint8], numbers: npt.NDArray[np.int64]) -> None:
    """Set the bit of every window of *numbers* in *seen* (a repeat sets a bit already set: counted at the end)."""
    byte = numbers >> 3
    bit = np.left_shift(1, numbers & 7).astype(np.uint8)
    seen[byte] |= bit  # buffered: two entries of one byte keep only one bit ...
    lost = np.flatnonzero((seen[byte] & bit) == 0)
    if lost.size:  # ... so the few lost ones are set unbuffered
        np.bitwise_or.at(seen, byte[lost], bit[lost])
