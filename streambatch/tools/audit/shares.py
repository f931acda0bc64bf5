"""Every (rank, worker) share of an epoch, as the training loop would take them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..._checks import check_positive
from ...epoch import Epoch
from ...stages.chunk import Chunks, largest_batch
from ...stages.materialize import materialize
from ...stages.share import share


def epoch_shares(epoch: Epoch, *, workers: int = 1, world_size: int = 1, gather: bool = True) -> Iterator[Any]:
    """Every (rank, worker) share of *epoch*, rank by rank: `MiniBatch`es, or `Windows` chunks without *gather*.

    Each is `streambatch.stages.share.share`: rank *r* of *world_size* holds each
    batch's contiguous share of rows, worker *k* of *workers* batches
    ``k, k + workers, ...`` of it.  Their union is the epoch.

    >>> import streambatch as sb
    >>> epoch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=4, seed=7)
    >>> [(c.batch_index, len(c)) for c in epoch_shares(epoch, workers=2, world_size=2, gather=False)]
    [(0, 2), (1, 1), (0, 2), (1, 1)]
    """
    count = check_positive(workers, "workers", "the number of DataLoader workers")
    world = check_positive(world_size, "world_size", "the number of data-parallel ranks")
    return _shares(epoch, count, world, gather)


def _shares(epoch: Epoch, workers: int, world: int, gather: bool) -> Iterator[Any]:
    chunks: Chunks[Any] = epoch.chunks()  # plans the order here, when the pass starts, not before
    # ranks past the batch size hold no row of any batch, workers past the batch count no batch:
    # their shares are empty, so a huge --world-size or --workers costs nothing
    for rank in range(min(world, largest_batch(epoch.batch_size))):
        for worker in range(min(workers, max(len(chunks), 1))):
            part = share(chunks, worker=worker, workers=workers, rank=rank, world_size=world)
            yield from (materialize(part) if gather else part)
