"""Exact token means in a PyTorch step for a model NOT wrapped in DDP or FSDP: raw sums all-reduced here, one division.

Use `streambatch.torch.token_mean_loss` with DistributedDataParallel or FSDP2
instead wherever the model is (or can be) wrapped: the count comes from the
plan and the framework's own gradient averaging is the only collective.  This
module's `token_mean_backward` is the path for a model kept unwrapped (a custom
data-parallel loop, or one process splitting a batch into micro-batches); it
costs two all-reduces per step, one of them a float64 copy of every gradient.

The rule: sum the loss over target tokens (``reduction="sum"``), let autograd
sum the gradients, add raw sums (`streambatch.TokenSums`) across micro-batches
and, with torch.distributed, across ranks, then divide once by the global
target-token count.  Never average per-piece means.

Packed batches: targets at padding hold ``IGNORE_INDEX`` (-100, what
`streambatch.torch.tensor_batch` writes); ``cross_entropy``'s default
``ignore_index`` leaves them out of the summed loss, and every count here is
of real targets only (``targets != -100``), so micro-batches and ranks holding
different numbers of real targets still give the exact token mean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._checks import check_positive
from ..batch.reduce import TokenSums
from ..errors import ConfigError
from .tensors import IGNORE_INDEX

LossSum = Callable[..., torch.Tensor]  # (model, inputs, targets, *row_inputs) -> summed loss over real targets


def micro_batches(inputs: torch.Tensor, targets: torch.Tensor, max_rows: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split rows into micro-batches of at most *max_rows* (the last may be shorter; views, no copy).

    >>> x = torch.arange(10).reshape(5, 2)
    >>> [m[0].shape[0] for m in micro_batches(x, x, 2)]
    [2, 2, 1]
    """
    rows = check_positive(max_rows, "max_rows", "the most rows per micro-batch")
    return list(zip(inputs.split(rows), targets.split(rows), strict=True))  # type: ignore[no-untyped-call]


def cross_entropy_sum(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *row_inputs: torch.Tensor) -> torch.Tensor:
    """Summed (not averaged) next-token cross-entropy of ``model(inputs, *row_inputs)`` logits ``[w, T, V]``.

    Targets equal to ``IGNORE_INDEX`` (a packed batch's padding) are left out.
    """
    logits = model(inputs, *row_inputs)
    flat = logits.reshape(-1, logits.shape[-1])
    return nn.functional.cross_entropy(flat, targets.reshape(-1), reduction="sum", ignore_index=IGNORE_INDEX)


def target_count(targets: torch.Tensor) -> int:
    """Real targets in *targets*: every entry, except ``IGNORE_INDEX`` ones (a packed batch's padding)."""
    if targets.dtype.is_signed:
        return int((targets != IGNORE_INDEX).sum())
    return int(targets.numel())


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
    row_inputs: tuple[torch.Tensor, ...] = (),
) -> StepResult:
    """Leave the exact token-mean gradient in ``param.grad``; return the token-mean loss.

    Each micro-batch (at most *micro_batch_rows* rows) runs forward, a summed loss
    and backward, so gradients add up as raw sums.  With torch.distributed
    initialised (or ``distributed=True``), loss sums, token counts and every
    gradient are all-reduced as sums over *group* — a rank with zero rows still
    joins every collective — and everything is divided once by the global number
    of real target tokens (targets other than ``IGNORE_INDEX``).  *row_inputs*
    (e.g. a packed batch's ``segment_ids`` and ``position_ids``, or a document
    mask) are split into the same micro-batches along dimension 0 and passed to
    ``loss_sum(model, inputs, targets, *row_inputs)``.  Gradients must be zero (or None) on entry: call
    ``optimizer.zero_grad()`` first.  Not for a model wrapped in
    DistributedDataParallel or FSDP (their averaging would divide once more):
    use `streambatch.torch.token_mean_loss` there.
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    rows = int(inputs.shape[0])
    step = rows if micro_batch_rows is None else check_positive(micro_batch_rows, "micro_batch_rows", "rows per micro-batch")
    pieces: list[TokenSums] = []  # loss sum and token count per micro-batch; autograd sums their gradients
    size = max(step, 1)
    extras = list(zip(*(t.split(size) for t in row_inputs), strict=True)) if row_inputs else None  # type: ignore[no-untyped-call]
    for k, (micro_inputs, micro_targets) in enumerate(micro_batches(inputs, targets, size) if rows else []):
        loss = loss_sum(model, micro_inputs, micro_targets, *(extras[k] if extras is not None else ()))
        loss.backward()  # type: ignore[no-untyped-call]
        pieces.append(TokenSums(float(loss.detach()), target_count(micro_targets), 0.0))
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
