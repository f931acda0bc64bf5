"""The exact token mean under DistributedDataParallel or FSDP2: scale each rank's summed loss, let the framework average.

Every batch (and every rank's share of it) carries ``global_token_count``: the
counted targets of the whole batch over every rank, computed from the plan
before the forward pass, the same on every rank.  A rank scales its summed loss
by ``world_size / global_token_count``; DDP's gradient all-reduce (or FSDP2's
reduce-scatter), which averages over ranks, then leaves exactly
``sum of every rank's gradient sums / global count``: the one-process token
mean.  No collective for the count, and no copy of the gradients.

The loop, with ``accumulation`` micro-batches (consecutive global batches) per
optimizer step::

    model = DistributedDataParallel(model)            # or fully_shard(model) (FSDP2)
    for step in steps:                                # `step`: this rank's shares of the step's batches
        count = sbt.step_token_count(step)            # the whole step's counted targets, on every rank
        for k, batch in enumerate(step):
            last = k == len(step) - 1
            with contextlib.nullcontext() if last else model.no_sync():  # FSDP2: set_requires_gradient_sync(last)
                loss_sum = sbt.cross_entropy_sum(model, batch.inputs, batch.targets)
                sbt.token_mean_loss(loss_sum, batch, count=count).backward()
        optimizer.step()
        optimizer.zero_grad()

A rank whose share has no rows (a final batch narrower than the world) still
runs its forward and backward on the empty share, so it joins DDP's all-reduce;
a step with no counted target gives a loss of 0 and zero gradients.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from .._checks import is_integer
from ..errors import ConfigError


def _count_of(batch: Any) -> int:
    count = getattr(batch, "global_token_count", None)
    if count is None:
        raise ConfigError(
            f"batch={type(batch).__name__} has no global_token_count; pass a batch of streambatch (sb.Epoch, "
            "sb.materialize, sbt.EpochDataset) or count= the step's counted targets"
        )
    return int(count)


def step_token_count(batches: Iterable[Any]) -> int:
    """The counted targets of a whole step over every rank: the sum of its micro-batches' ``global_token_count``.

    >>> import streambatch as sb
    >>> epoch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=2, seed=None)
    >>> step_token_count(epoch.batches(rank=1, world_size=2))  # every batch of the epoch, counted on rank 1
    12
    """
    return sum(_count_of(batch) for batch in batches)


def _world_size(world_size: int | None, group: Any) -> int:
    if world_size is not None:
        if not is_integer(world_size) or int(world_size) <= 0:
            raise ConfigError(f"world_size={world_size!r} must be a positive int; pass the number of data-parallel ranks")
        return int(world_size)
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size(group))
    return 1


def token_mean_loss(
    loss_sum: torch.Tensor,
    batch: Any = None,
    *,
    count: int | None = None,
    world_size: int | None = None,
    group: Any = None,
) -> torch.Tensor:
    """``loss_sum * world_size / count``: backward on it under DDP or FSDP2 leaves the exact token-mean gradient.

    *loss_sum* is this rank's loss summed over its counted targets
    (``reduction="sum"``, e.g. `cross_entropy_sum`).  *count* defaults to
    ``batch.global_token_count`` (the whole batch over every rank); with
    gradient accumulation pass the whole step's, `step_token_count` of its
    micro-batches.  *world_size* defaults to torch.distributed's (of *group*)
    when it is initialised, else 1.  With a count of 0 (no counted target in the
    whole batch) the result is ``loss_sum * 0``: a loss of 0 and zero gradients,
    never a division by zero.

    Use this path with a model wrapped in DistributedDataParallel or FSDP2 (or a
    lone process): the framework's own gradient averaging is the only
    collective.  `token_mean_backward` is the path for a model not wrapped (it
    all-reduces a float64 copy of every gradient itself).

    >>> import torch, streambatch as sb
    >>> batch = sb.Epoch([sb.Document("a", "train", range(8))], context_length=2, batch_size=4, seed=None).batch(0)
    >>> float(token_mean_loss(torch.tensor(6.0), batch)), float(token_mean_loss(torch.tensor(6.0), batch, world_size=2))
    (0.75, 1.5)
    """
    total = _count_of(batch) if count is None else count
    if not is_integer(total) or int(total) < 0:
        raise ConfigError(f"count={total!r} must be a non-negative int; pass the step's counted targets (step_token_count)")
    ranks = _world_size(world_size, group)
    if int(total) == 0:
        return loss_sum * 0.0  # nothing counts: a loss of 0 whose gradients are 0, on every rank
    return loss_sum * (ranks / int(total))
