"""The packing kernel as it was before it stopped growing with ``T``: a test-only reference.

The old C kernel kept one entry per possible remaining capacity (``T + 1`` of
them): a counting sort over sizes, a heap of bin numbers per capacity, and a
scan for the smallest non-empty capacity that holds the item.  This is that
algorithm, one Python step per item, kept so that a property test can compare
the new kernel (buckets by distinct size, nothing sized by ``T``) with it.
"""

from __future__ import annotations

import heapq


def old_best_fit(sizes: list[int], capacity: int) -> list[list[int]]:
    """Bins of best-fit decreasing as the O(T) kernel computed them: item indices, in placement order."""
    by_size: list[list[int]] = [[] for _ in range(capacity + 1)]  # the counting sort: one bucket per size
    for item, size in enumerate(sizes):
        if size:
            by_size[size].append(item)
    heaps: list[list[int]] = [[] for _ in range(capacity + 1)]  # per remaining capacity: its bins, lowest first
    bins: list[list[int]] = []
    for size in range(capacity, 0, -1):
        for item in by_size[size]:
            room = next((r for r in range(size, capacity + 1) if heaps[r]), None)
            if room is None:
                chosen, left = len(bins), capacity - size
                bins.append([])
            else:
                chosen, left = heapq.heappop(heaps[room]), room - size
            bins[chosen].append(item)
            if left:
                heapq.heappush(heaps[left], chosen)
    return bins
