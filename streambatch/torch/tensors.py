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
from typing import Any

import numpy as np
import numpy.typing as npt
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


class _OnFirstRead:
    """A `TensorBatch` field given a numpy array, read as its tensor: ``torch.from_numpy`` on the first read, kept
    (0.5 us and a tensor per batch saved where nobody reads the field; the value pickles as it is)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = "_" + name

    def __get__(self, batch: object, owner: type | None = None) -> torch.Tensor:
        if batch is None:  # the class's attribute: no default (dataclasses reads this)
            raise AttributeError(self.key[1:])
        value = batch.__dict__[self.key]
        if isinstance(value, np.ndarray):
            value = batch.__dict__[self.key] = torch.from_numpy(value)
        found: torch.Tensor = value
        return found

    def __set__(self, batch: object, value: torch.Tensor | npt.NDArray[Any]) -> None:
        batch.__dict__[self.key] = value


@dataclass
class TensorBatch:
    """A batch as tensors, with its place in the run; DataLoader's ``pin_memory`` understands it."""

    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    positions: _OnFirstRead = _OnFirstRead()  # each row's item position (int64); a tensor when read
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
    wrapped = _new(TensorBatch)  # the dataclass's fields set directly (the others keep their class default None):
    fields = wrapped.__dict__  # 0.2 us, not the 0.6 us of its __init__, in the torch datasets' per-batch cost
    fields["index"], fields["inputs"], fields["targets"], fields["epoch"] = batch.index, inputs, targets, batch.epoch
    fields["_positions"], fields["global_token_count"] = batch.positions, batch.target_count
    if batch.plain:  # windows and nothing more (no mask, sources, packed columns or rank share): the hot path
        return wrapped
    mask, sources = batch.loss_mask, batch.sources
    from_numpy = torch.from_numpy
    wrapped.global_token_count = batch.global_token_count
    if mask is not None:
        wrapped.loss_mask = from_numpy(mask)
    if sources is not None:
        wrapped.sources = from_numpy(np.array(sources))  # a copy: w bytes, and writable
    if batch.cu_seqlens is None:
        return wrapped
    segment_ids, position_ids = batch.segment_ids, batch.position_ids
    assert segment_ids is not None, "a packed batch without its segment ids"
    assert position_ids is not None, "a packed batch without its position ids"
    wrapped.segment_ids = from_numpy(segment_ids).to(torch.int32)
    wrapped.position_ids = from_numpy(position_ids).to(torch.int32)
    wrapped.cu_seqlens, wrapped.max_seqlen = from_numpy(batch.cu_seqlens), batch.max_seqlen
    return wrapped


_new = object.__new__


def mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dimension 0 (the batch width) dynamic for ``torch.compile``.

    The final batch is smaller (never padded), so a compiled model would otherwise
    see a new shape and recompile once per epoch.  Marking the batch dimension
    dynamic before the first call compiles one graph for every width.
    """
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0)
