"""PyTorch integration: zero-copy tensors, DataLoader datasets, and exact token means.

The only package that imports torch (the ``torch`` extra: ``pip install -e '.[torch]'`` from a checkout).

The rule everywhere: sum the loss over target tokens (``reduction="sum"``), let
autograd sum the gradients, add raw sums across micro-batches and ranks, then
divide once by the global count of counted targets.  Never average per-piece means.

Which path: wrap the model in DistributedDataParallel or FSDP2 and call
`token_mean_loss` (``loss_sum * world_size / batch.global_token_count``): the
count comes from the plan, so the framework's own gradient averaging is the only
collective.  `token_mean_backward` is for a model not wrapped in either; it
all-reduces a float64 copy of every gradient itself.

    >>> import streambatch as sb, streambatch.torch as sbt
    >>> epoch = sb.Epoch([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2, batch_size=2, seed=7)
    >>> inputs, targets = sbt.as_tensors(next(iter(epoch)))
    >>> inputs.tolist(), targets.dtype
    ([[10, 11], [11, 12]], torch.int64)
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as err:  # pragma: no cover - exercised in a subprocess without torch (tests/test_newcomer.py)
    from ..errors import missing_dependency

    raise missing_dependency("streambatch.torch", "torch", "torch") from err

from .attention import block_mask, cu_seqlens, document_mask
from .backward import StepResult, cross_entropy_sum, micro_batches, token_mean_backward
from .datasets import BatchesDataset, EpochDataset, RunDataset
from .loader import StatefulDataLoader, loader_position
from .loss import step_token_count, token_mean_loss
from .rank_loader import RankLoader
from .tensors import TensorBatch, as_tensors, mark_batch_dynamic, tensor_batch

__all__ = [
    "BatchesDataset",
    "EpochDataset",
    "RankLoader",
    "RunDataset",
    "StatefulDataLoader",
    "StepResult",
    "TensorBatch",
    "as_tensors",
    "block_mask",
    "cross_entropy_sum",
    "cu_seqlens",
    "document_mask",
    "loader_position",
    "mark_batch_dynamic",
    "micro_batches",
    "step_token_count",
    "tensor_batch",
    "token_mean_backward",
    "token_mean_loss",
]
