"""Packed batches in PyTorch: tensors with masks and -100 pad targets, exact token means, DataLoader resume."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import streambatch as sb
import streambatch.torch as sbt
from streambatch.torch.tensors import IGNORE_INDEX

from .models import TinyLM, gradients, relative_error

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed; pip install torchdata")
StatefulDataLoader = stateful.StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning", "ignore:'set_vital':UserWarning")


def _docs(count: int = 24, vocab: int = 50, T: int = 5) -> list[sb.Document]:
    rng = np.random.default_rng(3)
    return [sb.Document(f"d{i}", "train", rng.integers(0, vocab, int(rng.integers(1, 4 * T)))) for i in range(count)]


def _packed_batch(width: int = 8) -> Any:
    rows = sb.shuffle(sb.pack(_docs(), context_length=5, pad_id=3), seed=2)
    batches = [b for b in sb.materialize(sb.chunk(rows, width)) if b.pad_count]
    return batches[0]


def test_tensor_batch_of_a_packed_batch() -> None:
    """long targets hold -100 at padding; the mask is zero-copy, ids int32; token_count counts real targets only."""
    batch = _packed_batch()
    wrapped = sbt.tensor_batch(batch)
    assert wrapped.packed
    assert wrapped.token_count == batch.target_count < batch.targets.size
    pad = ~batch.loss_mask
    assert (wrapped.targets[torch.from_numpy(pad)] == IGNORE_INDEX).all()
    assert wrapped.targets[torch.from_numpy(batch.loss_mask)].tolist() == batch.targets[batch.loss_mask].tolist()
    assert wrapped.segment_ids is not None
    assert wrapped.loss_mask is not None
    assert wrapped.loss_mask.data_ptr() == batch.loss_mask.ctypes.data
    assert batch.segment_ids.dtype == np.int16  # T < 2**15: int16 in the batch, int32 for torch indexing
    assert wrapped.segment_ids.dtype == wrapped.position_ids.dtype == torch.int32
    assert wrapped.segment_ids.tolist() == batch.segment_ids.tolist()
    assert wrapped.position_ids is not None
    assert wrapped.position_ids.tolist() == batch.position_ids.tolist()
    assert wrapped.cu_seqlens is not None
    assert wrapped.cu_seqlens.tolist() == batch.cu_seqlens.tolist()
    assert wrapped.max_seqlen == batch.max_seqlen
    raw = sbt.tensor_batch(batch, dtype=None)  # zero-copy tokens: the pad id stays, the mask says what counts
    assert (raw.targets[torch.from_numpy(pad)] == 3).all()
    assert raw.token_count == batch.target_count
    moved = wrapped.to("cpu")
    assert moved.loss_mask is not None
    assert moved.loss_mask.tolist() == batch.loss_mask.tolist()
    window = sbt.tensor_batch(next(iter(sb.Epoch(_docs(), context_length=5, batch_size=4, seed=None))))
    assert not window.packed
    assert window.loss_mask is None
    assert window.token_count == window.targets.numel()


def _direct(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """The ground truth: one full-batch mean over the real targets only."""
    model.zero_grad(set_to_none=True)
    logits = model(inputs)
    keep = targets != IGNORE_INDEX
    loss = nn.functional.cross_entropy(logits[keep], targets[keep], reduction="mean")
    loss.backward()
    result = float(loss.detach()), gradients(model)
    model.zero_grad(set_to_none=True)
    return result


@pytest.mark.parametrize("rows", [None, 1, 3])
def test_token_mean_backward_is_exact_over_uneven_micro_batches(rows: int | None) -> None:
    """Micro-batches holding different numbers of real targets still give the mean over all real targets."""
    wrapped = sbt.tensor_batch(_packed_batch())
    counts = [int((t != IGNORE_INDEX).sum()) for t in wrapped.targets.split(rows or wrapped.width)]
    assert rows is None or len(set(counts)) > 1  # the micro-batches really differ
    model = TinyLM()
    expected_loss, expected_grads = _direct(model, wrapped.inputs, wrapped.targets)
    step = sbt.token_mean_backward(model, wrapped.inputs, wrapped.targets, micro_batch_rows=rows, distributed=False)
    assert step.token_count == wrapped.token_count
    assert step.loss == pytest.approx(expected_loss, rel=1e-12)
    assert relative_error(gradients(model), expected_grads) < 1e-9


def test_row_inputs_follow_the_micro_batches() -> None:
    """row_inputs are split with the rows and reach loss_sum beside inputs and targets."""
    wrapped = sbt.tensor_batch(_packed_batch())
    assert wrapped.position_ids is not None
    assert wrapped.segment_ids is not None
    seen: list[tuple[int, int]] = []

    def loss_sum(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        assert positions.shape == inputs.shape
        seen.append((inputs.shape[0], int(positions.sum())))
        return sbt.cross_entropy_sum(model, inputs, targets)

    sbt.token_mean_backward(
        TinyLM(), wrapped.inputs, wrapped.targets, loss_sum=loss_sum, micro_batch_rows=3, row_inputs=(wrapped.position_ids,)
    )
    expected = [(int(p.shape[0]), int(p.sum())) for p in wrapped.position_ids.split(3)]
    assert seen == expected


def _key(batch: sbt.TensorBatch) -> tuple[int, int, list[list[int]], list[list[int]]]:
    assert batch.segment_ids is not None
    return batch.epoch, batch.index, batch.inputs.tolist(), batch.segment_ids.tolist()


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_stateful_dataloader_resumes_a_packed_run(workers: int) -> None:
    """Workers read a packed run back in order; a saved loader state continues exactly."""

    def run() -> sb.Run:
        return sb.Run(_docs(), context_length=5, batch_size=3, seed=4, epochs=2, pack=True)

    full = [_key(b) for b in StatefulDataLoader(sbt.RunDataset(run()), batch_size=None, num_workers=workers)]
    per_epoch = run().batches_per_epoch
    assert [k[:2] for k in full] == [(e, i) for e in range(2) for i in range(per_epoch)]
    loader = StatefulDataLoader(sbt.RunDataset(run()), batch_size=None, num_workers=workers)
    batches = iter(loader)
    first = [_key(next(batches)) for _ in range(per_epoch + 1)]
    state = loader.state_dict()
    del batches, loader
    resumed = StatefulDataLoader(sbt.RunDataset(run()), batch_size=None, num_workers=workers)
    resumed.load_state_dict(state)
    assert full == first + [_key(b) for b in resumed]


def test_epoch_dataset_ranks_cover_every_target_once() -> None:
    """EpochDataset over ranks: the ranks' real targets add up to the corpus's targets."""
    epoch = sb.Epoch(_docs(), context_length=5, batch_size=4, seed=1, pack=True)
    counts = [sum(b.token_count for b in sbt.EpochDataset(epoch, rank=r, world_size=3)) for r in range(3)]
    assert sum(counts) == epoch.items.report.targets
    assert all(counts)
