"""Batches as tensors: zero-copy views of a batch's numpy buffers, or one explicit conversion.

A packed batch (a `streambatch.MiniBatch` of packed rows) becomes a
`TensorBatch` that also carries ``loss_mask``, ``segment_ids``,
``position_ids``, ``cu_seqlens`` and ``max_seqlen``; converted to a signed
dtype (the default ``torch.long``) its targets hold `IGNORE_INDEX` (-100,
``cross_entropy``'s default ``ignore_index``) at padding, so a summed loss and
the token count (``token_count``: real targets) never include padding.  A
batch with a loss mask (window or packed) holds `IGNORE_INDEX` at its masked
targets too, and carries ``loss_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from ..batch.minibatch import MiniBatch

IGNORE_INDEX = -100
"""The target written at padding in signed (``long``) packed targets: ``cross_entropy``'s default ``ignore_index``."""


def as_tensors(batch: MiniBatch, *, dtype: torch.dtype | None = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` as tensors.

    With a signed *dtype* the targets hold `IGNORE_INDEX` wherever ``loss_mask``
    is False (packed padding, masked targets).  With ``dtype=None`` the tensors share memory with the batch's numpy buffers
    (zero-copy, in the store's dtype: torch.uint16 or torch.uint32).  The default
    ``dtype=torch.long`` is the one explicit conversion embedding layers and
    ``cross_entropy`` need; it copies once.
    """
    inputs, targets = torch.from_numpy(batch.inputs), torch.from_numpy(batch.targets)
    if dtype is None:
        return inputs, targets
    inputs, targets = inputs.to(dtype), targets.to(dtype)
    mask = batch.loss_mask
    if mask is not None and dtype.is_signed and batch.pad_count:  # padding or masked targets
        targets.masked_fill_(~torch.from_numpy(mask), IGNORE_INDEX)
    return inputs, targets


@dataclass
class TensorBatch:
    """A batch as tensors, with its place in the run; DataLoader's ``pin_memory`` understands it."""

    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor
    epoch: int = 0
    loss_mask: torch.Tensor | None = None  # packed batches, and batches of a store with a loss mask
    # packed batches only (None in window mode): see streambatch.batch.minibatch
    segment_ids: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    sources: torch.Tensor | None = None  # a mixture's batches: each row's source id (uint8)
    global_token_count: int | None = None  # counted targets of the whole batch over every rank (see MiniBatch)

    _ROW_FIELDS = ("inputs", "targets", "loss_mask", "segment_ids", "position_ids", "cu_seqlens", "sources")

    @property
    def packed(self) -> bool:
        """True for a packed batch (it has segment and position ids)."""
        return self.segment_ids is not None

    @property
    def width(self) -> int:
        """Rows in this (share of the) batch; may be 0 on a data-parallel rank."""
        return int(self.inputs.shape[0])

    @property
    def token_count(self) -> int:
        """Counted targets present: ``width * T``, or ``loss_mask.sum()`` (packed, or masked)."""
        return int(self.targets.numel()) if self.loss_mask is None else int(self.loss_mask.sum())

    def _map(self, move: str, **options: object) -> TensorBatch:
        moved = {k: getattr(getattr(self, k), move)(**options) for k in self._ROW_FIELDS if getattr(self, k) is not None}
        return replace(self, **moved)

    def pin_memory(self) -> TensorBatch:
        """Page-locked copies, for fast host-to-device transfer (called by DataLoader(pin_memory=True))."""
        return self._map("pin_memory")

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorBatch:
        """Move the token tensors (and a packed batch's masks and ids) to *device*."""
        return self._map("to", device=device, non_blocking=non_blocking)


def tensor_batch(batch: MiniBatch, *, dtype: torch.dtype | None = torch.long) -> TensorBatch:
    """Wrap a `MiniBatch` (or a packed one) as a `TensorBatch` (see `as_tensors` for *dtype*).

    A packed batch's mask and ``cu_seqlens`` are zero-copy views of its numpy
    arrays; its segment and position ids are int32 tensors (torch indexes with
    int32 or int64, not with the int16 the batch holds when ``T < 2**15``: one
    widening copy then, zero-copy when they are already int32).
    """
    inputs, targets = as_tensors(batch, dtype=dtype)
    sources = batch.sources  # a mixture's batch (of windows, or of packed rows)
    mixed = None if sources is None else torch.from_numpy(np.array(sources))  # a copy: w bytes, and writable
    wrapped = TensorBatch(
        batch.index, inputs, targets, torch.from_numpy(batch.positions), batch.epoch, sources=mixed,
        global_token_count=batch.global_token_count,
    )  # fmt: skip
    if batch.loss_mask is None or batch.segment_ids is None or batch.position_ids is None or batch.cu_seqlens is None:
        return wrapped if batch.loss_mask is None else replace(wrapped, loss_mask=torch.from_numpy(batch.loss_mask))
    return replace(
        wrapped,
        loss_mask=torch.from_numpy(batch.loss_mask),
        segment_ids=torch.from_numpy(batch.segment_ids).to(torch.int32),
        position_ids=torch.from_numpy(batch.position_ids).to(torch.int32),
        cu_seqlens=torch.from_numpy(batch.cu_seqlens),
        max_seqlen=batch.max_seqlen,
    )


def mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dimension 0 (the batch width) dynamic for ``torch.compile``.

    The final batch is smaller (never padded), so a compiled model would otherwise
    see a new shape and recompile once per epoch.  Marking the batch dimension
    dynamic before the first call compiles one graph for every width.
    """
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0)
