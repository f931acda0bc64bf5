"""Batches as tensors: zero-copy views of a batch's numpy buffers, or one explicit conversion."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..stages.batch import MiniBatch


def as_tensors(batch: MiniBatch, *, dtype: torch.dtype | None = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` as tensors.

    With ``dtype=None`` the tensors share memory with the batch's numpy buffers
    (zero-copy, in the store's dtype: torch.uint16 or torch.uint32).  The default
    ``dtype=torch.long`` is the one explicit conversion embedding layers and
    ``cross_entropy`` need; it copies once.
    """
    inputs, targets = torch.from_numpy(batch.inputs), torch.from_numpy(batch.targets)
    if dtype is None:
        return inputs, targets
    return inputs.to(dtype), targets.to(dtype)


@dataclass
class TensorBatch:
    """A batch as tensors, with its place in the run; DataLoader's ``pin_memory`` understands it."""

    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor
    epoch: int = 0
    sources: torch.Tensor | None = None  # a mixture's batches: each row's source id (uint8)

    @property
    def width(self) -> int:
        """Rows in this (share of the) batch; may be 0 on a data-parallel rank."""
        return int(self.inputs.shape[0])

    @property
    def token_count(self) -> int:
        """Target tokens present: ``width * T``."""
        return int(self.targets.numel())

    def pin_memory(self) -> TensorBatch:
        """Page-locked copies, for fast host-to-device transfer (called by DataLoader(pin_memory=True))."""
        pinned = self.inputs.pin_memory(), self.targets.pin_memory()
        return TensorBatch(self.index, *pinned, self.positions, self.epoch, self.sources)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorBatch:
        """Move the token tensors to *device*."""
        return TensorBatch(
            self.index,
            self.inputs.to(device, non_blocking=non_blocking),
            self.targets.to(device, non_blocking=non_blocking),
            self.positions,
            self.epoch,
            self.sources,
        )


def tensor_batch(batch: MiniBatch, *, dtype: torch.dtype | None = torch.long) -> TensorBatch:
    """Wrap a `MiniBatch` as a `TensorBatch` (see `as_tensors` for *dtype*)."""
    inputs, targets = as_tensors(batch, dtype=dtype)
    sources = getattr(batch, "sources", None)  # a mixture's batch (streambatch.stages.mix_batch.MixtureBatch)
    mixed = None if sources is None else torch.from_numpy(sources)
    return TensorBatch(batch.index, inputs, targets, torch.from_numpy(batch.positions), batch.epoch, mixed)


def mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dimension 0 (the batch width) dynamic for ``torch.compile``.

    The final batch is smaller (never padded), so a compiled model would otherwise
    see a new shape and recompile once per epoch.  Marking the batch dimension
    dynamic before the first call compiles one graph for every width.
    """
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0)
