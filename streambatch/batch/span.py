"""One read-only token view spanning every shard of a corpus, for gathers that index global positions.

The shards of a `streambatch.Corpus` are separate arrays; when they share one
dtype and lie at addresses a whole number of tokens apart (the usual case:
memory-mapped or in-memory stores), one view from the lowest shard's first
token to the end of the highest covers them all, and global position ``p`` of
shard ``k`` is span index ``p + shift[k]``.  The view also covers whatever lies
between shards: a gather may read it only inside a shard (every window and
every piece lies inside one document, so inside one shard).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def spanning_tokens(
    tokens: tuple[npt.NDArray[Any], ...], bases: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]] | None:
    """``(span, shift)``: the read-only view over every shard's tokens and each shard's shift; None when impossible.

    None when the shards differ in dtype, are not contiguous, or lie at addresses
    that are not a whole number of tokens apart.

    >>> a, b = np.arange(4, dtype=np.uint16), np.arange(10, 13, dtype=np.uint16)
    >>> found = spanning_tokens((a, b), np.array([0, 4, 7]))
    >>> span, shift = found
    >>> [int(span[p + shift[k]]) for p, k in ((1, 0), (5, 1))]
    [1, 11]
    """
    dtype = tokens[0].dtype
    if any(t.dtype != dtype or not t.flags.c_contiguous for t in tokens):
        return None
    size = dtype.itemsize
    address = [int(t.__array_interface__["data"][0]) for t in tokens]
    live = [k for k, t in enumerate(tokens) if t.size]
    if not live:
        return None
    low = min(address[k] for k in live)
    high = max(address[k] + tokens[k].nbytes for k in live)
    if any((address[k] - low) % size for k in live):
        return None
    anchor = next(tokens[k] for k in live if address[k] == low)
    span = np.lib.stride_tricks.as_strided(anchor, shape=((high - low) // size,), strides=(size,), writeable=False)
    shift = np.array(
        [(address[k] - low) // size - int(bases[k]) if tokens[k].size else 0 for k in range(len(tokens))], dtype=np.int64
    )
    return span, shift
