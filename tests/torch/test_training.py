"""Tests for `streambatch.torch`: tensors, the DataLoader dataset, micro-batches and compile."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import streambatch as sb
import streambatch.torch as sbt

from .models import TinyLM, full_batch_reference, gradients, relative_error


def _docs(count: int = 12, vocab: int = 50) -> list[sb.Document]:
    rng = np.random.default_rng(5)
    return [sb.Document(f"d{i}", "train", rng.integers(0, vocab, rng.integers(3, 30))) for i in range(count)]


def test_zero_copy_tensors() -> None:
    """dtype=None shares memory with the numpy buffers; the default converts once to int64."""
    batch = next(iter(sb.Epoch(_docs(), context_length=4, batch_size=3, seed=1)))
    inputs, targets = sbt.as_tensors(batch, dtype=None)
    assert inputs.data_ptr() == batch.inputs.ctypes.data
    assert targets.data_ptr() == batch.targets.ctypes.data
    assert torch.uint32 == inputs.dtype
    long_inputs, _ = sbt.as_tensors(batch)
    assert torch.int64 == long_inputs.dtype
    assert batch.inputs.tolist() == long_inputs.tolist()


@pytest.mark.parametrize("workers", [0, *(pytest.param(w, marks=pytest.mark.slow) for w in (1, 2))])
def test_dataloader_workers_read_back_in_epoch_order(workers: int) -> None:
    """Any number of workers: disjoint whole batches whose union, in order, is the epoch."""
    docs = _docs(20)
    dataset = sbt.EpochDataset(sb.Epoch(docs, context_length=3, batch_size=4, seed=9))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    got = [(b.index, b.inputs.tolist(), b.targets.tolist()) for b in loader]
    expected = [(b.index, b.inputs.tolist(), b.targets.tolist()) for b in sb.Epoch(docs, context_length=3, batch_size=4, seed=9)]
    assert expected == got
    assert sb.Epoch(docs, context_length=3, batch_size=4, seed=None).batch_count == len(dataset)


def test_set_epoch_reshuffles_same_windows() -> None:
    """set_epoch(e) keeps membership, changes order, and epoch 0 is the run seed itself."""
    dataset = sbt.EpochDataset(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=7))
    first = [b.positions.tolist() for b in dataset]
    dataset.set_epoch(1)
    second = [b.positions.tolist() for b in dataset]
    assert sorted(p for b in first for p in b) == sorted(p for b in second for p in b)
    assert first != second
    dataset.set_epoch(0)
    assert first == [b.positions.tolist() for b in dataset]


def test_pin_memory_friendly() -> None:
    """TensorBatch has pin_memory/to, which DataLoader(pin_memory=True) calls when a device exists."""
    batch = next(iter(sbt.EpochDataset(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=7))))
    assert batch.inputs.is_contiguous()
    moved = batch.to("cpu")
    assert torch.equal(batch.inputs, moved.inputs)


@pytest.mark.parametrize("max_rows", [1, 2, 3, 5, 64])
def test_micro_batches_equal_full_batch(max_rows: int) -> None:
    """Every batch of an epoch, final one included: micro-batched token means equal the full batch."""
    model = TinyLM()
    epoch = sb.Epoch(_docs(), context_length=5, batch_size=7, seed=3)
    assert epoch.batch_widths[-1] < 7  # a short final batch is part of the test
    for batch in epoch:
        inputs, targets = sbt.as_tensors(batch)
        loss, grads = full_batch_reference(model, inputs, targets)
        result = sbt.token_mean_backward(model, inputs, targets, micro_batch_rows=max_rows)
        assert batch.token_count == result.token_count
        assert result.loss == pytest.approx(loss, rel=1e-6)
        assert relative_error(gradients(model), grads) < 1e-6
        model.zero_grad(set_to_none=True)


def test_mean_of_micro_batch_means_is_wrong_on_the_final_batch() -> None:
    """The common mistake (mean per micro-batch, averaged over steps) differs on an uneven final batch."""
    model = TinyLM()
    final = list(sb.Epoch(_docs(), context_length=5, batch_size=7, seed=3))[-1]
    inputs, targets = sbt.as_tensors(final)
    assert final.width % 2 == 1  # micro-batches of 2 rows end with a 1-row piece
    loss, grads = full_batch_reference(model, inputs, targets)
    pieces = sbt.micro_batches(inputs, targets, 2)
    wrong = 0.0
    for x, y in pieces:
        logits = model(x)
        piece = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) / len(pieces)
        piece.backward()
        wrong += float(piece.detach())
    assert wrong != pytest.approx(loss, rel=1e-6)
    assert relative_error(gradients(model), grads) > 1e-3


@pytest.mark.slow
def test_compile_short_final_batch_without_recompiling() -> None:
    """With the batch dimension marked dynamic, the smaller final batch reuses the compiled graph."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    model = TinyLM()
    compiled = torch.compile(model, backend=counter)
    widths = []
    for batch in sb.Epoch(_docs(), context_length=5, batch_size=7, seed=3):
        inputs, _ = sbt.as_tensors(batch)
        sbt.mark_batch_dynamic(inputs)
        compiled(inputs)
        widths.append(batch.width)
    assert widths[-1] != widths[0]
    assert 1 == counter.frame_count
    torch._dynamo.reset()


def test_zero_token_step_is_an_error() -> None:
    """A batch with no rows anywhere has nothing to average."""
    model = TinyLM()
    empty = torch.zeros((0, 5), dtype=torch.long)
    with pytest.raises(sb.ConfigError, match="no target tokens"):
        sbt.token_mean_backward(model, empty, empty, distributed=False)


@pytest.mark.slow
def test_resume_from_a_batch_position() -> None:
    """start_batch resumes mid-epoch: the remaining batches, exactly, with any worker count."""
    epoch = sb.Epoch(_docs(20), context_length=3, batch_size=4, seed=9)
    expected = [b.index for b in epoch][3:]
    for workers in (0, 2):
        loader = DataLoader(sbt.EpochDataset(epoch, start_batch=3), batch_size=None, num_workers=workers)
        assert expected == [b.index for b in loader]


def test_dataset_rejects_bad_rank() -> None:
    """rank must lie in [0, world_size)."""
    with pytest.raises(sb.ConfigError, match=r"rank=2 must be an int in \[0, world_size=2\)"):
        sbt.EpochDataset(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=None), rank=2, world_size=2)


@pytest.mark.slow
def test_spawned_workers_over_a_memory_mapped_store(tmp_path: Any) -> None:
    """Workers started with "spawn" reopen the store by name and still read back the epoch in order."""
    store = sb.write_store(tmp_path / "s", _docs(20))
    epoch = sb.Epoch(store, context_length=3, batch_size=4, seed=9)
    loader = DataLoader(sbt.EpochDataset(epoch), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert [b.inputs.tolist() for b in sb.Epoch(store, context_length=3, batch_size=4, seed=9)] == [
        b.inputs.tolist() for b in loader
    ]
