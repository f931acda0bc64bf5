"""Tests for `streambatch.torch.token_mean_loss` and `step_token_count` in one process; DDP and FSDP2 are in test_ddp."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import streambatch as sb
import streambatch.torch as sbt
from streambatch import ConfigError

from .models import TinyLM, gradients, relative_error

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed; pip install torchdata")


def _docs() -> list[sb.Document]:
    return [sb.Document(f"d{i}", "train", [(7 * i + 3 * j) % 50 for j in range(n)]) for i, n in enumerate([9, 5, 7, 3, 8])]


def test_the_loss_is_the_sum_times_world_over_the_global_count() -> None:
    """loss_sum * world_size / global_token_count; world_size is 1 without torch.distributed, or given."""
    batch = sb.Epoch(_docs(), context_length=3, batch_size=4, seed=2).batches(rank=1, world_size=3)[0]
    assert (batch.width, batch.token_count, batch.global_token_count) == (1, 3, 12)
    assert float(sbt.token_mean_loss(torch.tensor(6.0), batch)) == 6.0 / 12
    assert float(sbt.token_mean_loss(torch.tensor(6.0), batch, world_size=3)) == 6.0 * 3 / 12
    assert float(sbt.token_mean_loss(torch.tensor(6.0), count=4, world_size=2)) == 3.0


def test_accumulated_micro_batches_give_the_one_batch_token_mean() -> None:
    """Micro-batches (whole batches of the plan) scaled by the step's count: one process's token-mean gradient."""
    epoch = sb.Epoch(_docs(), context_length=3, batch_size=3, seed=4, pack=True)
    batches = [sbt.tensor_batch(b) for b in epoch]
    model = TinyLM()
    count = sbt.step_token_count(batches)
    for batch in batches:
        sbt.token_mean_loss(sbt.cross_entropy_sum(model, batch.inputs, batch.targets), batch, count=count).backward()
    actual = gradients(model)
    model.zero_grad(set_to_none=True)
    total = sum(sbt.cross_entropy_sum(model, b.inputs, b.targets) for b in batches)
    (total / sum(b.token_count for b in batches)).backward()
    assert relative_error(actual, gradients(model)) <= 1e-12


def test_nothing_to_count_gives_zero_loss_and_zero_gradients() -> None:
    """A count of 0, or an empty share: loss 0, gradients 0, never NaN or a division by zero."""
    model = TinyLM()
    share = sbt.tensor_batch(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=2).batches(rank=3, world_size=4)[-1])
    assert share.width == 0
    assert share.global_token_count > 0
    loss = sbt.token_mean_loss(sbt.cross_entropy_sum(model, share.inputs, share.targets), share)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(bool((g == 0).all()) for g in gradients(model))
    full = sbt.tensor_batch(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=2).batch(0))
    model.zero_grad(set_to_none=True)
    loss = sbt.token_mean_loss(sbt.cross_entropy_sum(model, full.inputs, full.targets), full, count=0)
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(bool(torch.isfinite(g).all() and (g == 0).all()) for g in gradients(model))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: sbt.token_mean_loss(torch.tensor(1.0), count=-1), "count=-1 must be a non-negative int"),
        (lambda: sbt.token_mean_loss(torch.tensor(1.0), count=2, world_size=0), "world_size=0 must be a positive int"),
        (lambda: sbt.token_mean_loss(torch.tensor(1.0), object()), "has no global_token_count"),
        (lambda: sbt.step_token_count([object()]), "has no global_token_count"),
    ],
    ids=["negative count", "zero world", "foreign batch", "foreign step"],
)
def test_invalid_arguments(call: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call()  # type: ignore[operator]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning", "ignore:.set_vital.:UserWarning")
def test_the_datasets_batches_carry_the_global_count() -> None:
    """EpochDataset, RunDataset and StatefulDataLoader (torchdata's, sbt's) over them: each rank's batches carry the
    whole batch's count."""
    docs = _docs()
    epoch = sb.Epoch(docs, context_length=3, batch_size=4, seed=2)
    run = sb.Run(docs, context_length=3, batch_size=4, seed=2, epochs=2)
    whole = [b.token_count for b in epoch] * 2
    for rank in range(3):
        for dataset, expected in (
            (sbt.EpochDataset(epoch, rank=rank, world_size=3), whole[: len(epoch)]),
            (sbt.RunDataset(run, rank=rank, world_size=3), whole),
        ):
            assert [b.global_token_count for b in dataset] == expected
            for loader in (stateful.StatefulDataLoader, sbt.StatefulDataLoader):
                assert [b.global_token_count for b in loader(dataset, batch_size=None, num_workers=0)] == expected
    composed = sb.materialize(sb.split_rows(sb.chunk(sb.shuffle(sb.windows(docs, context_length=3), 2), 4), 2, 3))
    assert [b.global_token_count for b in DataLoader(sbt.BatchesDataset(composed), batch_size=None)] == whole[: len(epoch)]
