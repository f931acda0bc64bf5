"""PyTorch integration: zero-copy tensors, a DataLoader dataset, and exact token means.

This is the only module that imports torch (``pip install streambatch[torch]``).

The rule everywhere: sum the loss over target tokens (``reduction="sum"``), let
autograd sum the gradients, add raw sums across micro-batches and (with
torch.distributed) across ranks, then divide once by the global target-token
count.  Never average per-piece means.

    >>> import streambatch as sb, streambatch.torch as sbt
    >>> epoch = sb.Epoch([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2, batch_size=2)
    >>> inputs, targets = sbt.as_tensors(next(iter(epoch)))
    >>> inputs.tolist(), targets.dtype
    ([[0, 10], [10, 11]], torch.int64)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import IterableDataset, get_worker_info

from ._checks import check_non_negative, check_positive
from .accumulate import TokenSums
from .batch import MiniBatch
from .epoch import Epoch, derive_seed
from .errors import ConfigError

LossSum = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


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
    """A batch as tensors, with its global index; DataLoader's ``pin_memory`` understands it."""

    index: int
    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor

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
        return TensorBatch(self.index, self.inputs.pin_memory(), self.targets.pin_memory(), self.positions)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TensorBatch:
        """Move the token tensors to *device*."""
        return TensorBatch(
            self.index,
            self.inputs.to(device, non_blocking=non_blocking),
            self.targets.to(device, non_blocking=non_blocking),
            self.positions,
        )


def tensor_batch(batch: MiniBatch, *, dtype: torch.dtype | None = torch.long) -> TensorBatch:
    """Wrap a `MiniBatch` as a `TensorBatch` (see `as_tensors` for *dtype*)."""
    inputs, targets = as_tensors(batch, dtype=dtype)
    return TensorBatch(batch.index, inputs, targets, torch.from_numpy(batch.positions))


class EpochDataset(IterableDataset[TensorBatch]):
    """An `IterableDataset` of whole batches of one epoch (use ``DataLoader(ds, batch_size=None)``).

    DataLoader worker ``k`` of ``W`` yields global batches ``k, k + W, ...``; read
    back through the DataLoader (which takes one item from each worker in turn)
    they arrive in the epoch's order, for any number of workers.  With
    *world_size* > 1 every rank sees every global batch but holds only its own
    rows (see `Epoch.iter_batches`), so all ranks step through the same batches.
    `set_epoch` reshuffles for the next epoch with a seed derived from the run seed.

    The shuffle plan is computed in the constructing process, so forked workers
    share it instead of recomputing it.
    """

    def __init__(
        self,
        epoch: Epoch,
        *,
        rank: int = 0,
        world_size: int = 1,
        dtype: torch.dtype | None = torch.long,
        start_batch: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(epoch, Epoch):
            raise ConfigError(f"epoch={epoch!r} is not a streambatch.Epoch; build one with sb.Epoch(store, ...)")
        epoch.iter_batches(rank=rank, world_size=world_size)  # validates rank and world_size now
        self.run_seed = epoch.seed
        self.rank, self.world_size = rank, world_size
        self.dtype = dtype
        self.start_batch = check_non_negative(start_batch, "start_batch", "the number of batches already consumed")
        self.epoch_number = 0
        self.epoch = epoch
        epoch.shuffle_state_after  # noqa: B018 - plan now, in the parent process

    def set_epoch(self, epoch: int) -> None:
        """Switch to epoch *epoch* of the run (same windows, a new seeded order)."""
        number = check_non_negative(epoch, "epoch", "the epoch number")
        if number == self.epoch_number:
            return
        self.epoch = self.epoch.reseeded(None if self.run_seed is None else derive_seed(self.run_seed, number))
        self.epoch.shuffle_state_after  # noqa: B018
        self.epoch_number = number
        self.start_batch = 0

    def __len__(self) -> int:
        return max(self.epoch.batch_count - self.start_batch, 0)

    def __iter__(self) -> Iterator[TensorBatch]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        batches = self.epoch.iter_batches(self.start_batch + worker, step=workers, rank=self.rank, world_size=self.world_size)
        return (tensor_batch(b, dtype=self.dtype) for b in batches)


def micro_batches(inputs: torch.Tensor, targets: torch.Tensor, max_rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split rows into micro-batches of at most *max_rows* (the last may be shorter; views, no copy).

    >>> x = torch.arange(10).reshape(5, 2)
    >>> [m[0].shape[0] for m in micro_batches(x, x, 2)]
    [2, 2, 1]
    """
    rows = check_positive(max_rows, "max_rows", "the most rows per micro-batch")
    return list(zip(inputs.split(rows), targets.split(rows), strict=True))  # type: ignore[no-untyped-call]


def cross_entropy_sum(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed (not averaged) next-token cross-entropy of ``model(inputs)`` logits ``[w, T, V]``."""
    logits = model(inputs)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


@dataclass(frozen=True)
class StepResult:
    """What one token-mean step saw: the global token count and the token-mean loss."""

    token_count: int
    loss: float
    loss_sum: float


def token_mean_backward(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    loss_sum: LossSum = cross_entropy_sum,
    micro_batch_rows: int | None = None,
    group: Any = None,
    distributed: bool | None = None,
) -> StepResult:
    """Leave the exact token-mean gradient in ``param.grad``; return the token-mean loss.

    Each micro-batch (at most *micro_batch_rows* rows) runs forward, a summed loss
    and backward, so gradients add up as raw sums.  With torch.distributed
    initialised (or ``distributed=True``), loss sums, token counts and every
    gradient are all-reduced as sums over *group* — a rank with zero rows still
    joins every collective — and everything is divided once by the global number
    of target tokens.  Gradients must be zero (or None) on entry: call
    ``optimizer.zero_grad()`` first.  Do not wrap the model in
    DistributedDataParallel: it would average per-rank means.
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    rows = int(inputs.shape[0])
    step = rows if micro_batch_rows is None else check_positive(micro_batch_rows, "micro_batch_rows", "rows per micro-batch")
    pieces: list[TokenSums] = []  # loss sum and token count per micro-batch; autograd sums their gradients
    for micro_inputs, micro_targets in micro_batches(inputs, targets, max(step, 1)) if rows else []:
        loss = loss_sum(model, micro_inputs, micro_targets)
        loss.backward()  # type: ignore[no-untyped-call]
        pieces.append(TokenSums(float(loss.detach()), int(micro_targets.numel()), 0.0))
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1).to(torch.float64) for g in grads]) if grads else torch.zeros(0, dtype=torch.float64)
    local = sum(pieces, TokenSums(0.0, 0, 0.0))
    local = TokenSums(local.loss_sum, local.token_count, flat)  # this rank's raw sums
    use_dist = dist.is_available() and dist.is_initialized() if distributed is None else distributed
    total = _all_reduce_sums(local, group) if use_dist else local
    if total.token_count == 0:
        raise ConfigError("the batch has no target tokens on any rank; there is nothing to average")
    mean = total.mean()  # the one division, by the global target-token count
    flat_mean = torch.as_tensor(mean.mean_gradient)  # already a tensor: no copy
    offset = 0
    for parameter, grad in zip(parameters, grads, strict=True):
        grad.copy_(flat_mean[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
        parameter.grad = grad
    return StepResult(total.token_count, mean.mean_loss, total.loss_sum)


def _all_reduce_sums(local: TokenSums, group: Any) -> TokenSums:
    """Add every rank's raw sums (loss, tokens, gradients); a rank with zero rows still joins."""
    scalars = torch.tensor([local.loss_sum, float(local.token_count)], dtype=torch.float64)
    gradient = local.gradient_sum.clone()
    dist.all_reduce(scalars, group=group)
    dist.all_reduce(gradient, group=group)
    return TokenSums(float(scalars[0]), int(scalars[1]), gradient)


def mark_batch_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dimension 0 (the batch width) dynamic for ``torch.compile``.

    The final batch is smaller (never padded), so a compiled model would otherwise
    see a new shape and recompile once per epoch.  Marking the batch dimension
    dynamic before the first call compiles one graph for every width.
    """
    import torch._dynamo

    for tensor in tensors:
        torch._dynamo.mark_dynamic(tensor, 0)


def relative_error(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """Largest ``|a - e| / max(|e|, tiny)`` over paired tensors (for checking exactness)."""
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        scale = e.abs().clamp_min(1e-12)
        worst = max(worst, float(((a - e).abs() / scale).max()) if e.numel() else 0.0)
    return worst if math.isfinite(worst) else math.inf


__all__ = [
    "EpochDataset",
    "StepResult",
    "TensorBatch",
    "as_tensors",
    "cross_entropy_sum",
    "mark_batch_dynamic",
    "micro_batches",
    "relative_error",
    "tensor_batch",
    "token_mean_backward",
]
