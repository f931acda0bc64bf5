"""The rank's micro-batches of each step of a run: one global batch per optimizer step, split in two stages.

Each rank takes its share of the step's global batch by the share rule
(`streambatch.Run.batch` with ``rank``/``world_size``), and the share is split
into ``accumulation`` micro-batches by the same rule (`row_share`: contiguous,
sizes differ by at most one, empty when the share is narrower).  Every
micro-batch carries the step's ``global_token_count``, its ``epoch`` and
``index``.  One pass (`iter`) hands out the steps from the run's position to
the end of that epoch, moving the position as it goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..run import Run
from ..stages.chunk import row_share
from ..torch.tensors import TensorBatch, tensor_batch

_ROWS = ("inputs", "targets", "positions", "loss_mask", "segment_ids", "position_ids", "sources")


class StepLoader:
    """The micro-batches of *rank* of *world_size*, *accumulation* per step, from *run*'s position on."""

    def __init__(self, run: Run, *, rank: int, world_size: int, accumulation: int) -> None:
        run.batch(*run.position_of(0), rank=rank, world_size=world_size)  # checks rank and world_size now
        self.run, self.rank, self.world_size, self.accumulation = run, rank, world_size, accumulation

    def __len__(self) -> int:
        return self.run.batches_per_epoch * self.accumulation

    def set_epoch(self, epoch: int) -> None:
        """HF calls this before each of its epochs; the run's own position decides (no reshuffle here)."""

    def __iter__(self) -> Iterator[TensorBatch]:
        run = self.run
        if run.remaining == 0 or not run.batches_per_epoch:
            return
        epoch, _ = run.position
        for batch in run.iter_batches(rank=self.rank, world_size=self.world_size):
            yield from micro_batches(tensor_batch(batch), self.accumulation)
            if run.position[0] != epoch:  # the epoch ended: HF starts its next epoch with a new pass
                return


def micro_batches(share: TensorBatch, parts: int) -> list[TensorBatch]:
    """*share* in *parts* micro-batches of contiguous, balanced rows; every one keeps the step's count and place."""
    return [_rows(share, *row_share(share.width, part, parts)) for part in range(parts)]


def _rows(share: TensorBatch, lo: int, hi: int) -> TensorBatch:
    moved: dict[str, Any] = {k: getattr(share, k)[lo:hi] for k in _ROWS if getattr(share, k) is not None}
    return replace(share, **moved, cu_seqlens=None, max_seqlen=None)
