"""Mixtures of packed rows through PyTorch: tensors with sources and masks, datasets, StatefulDataLoader resume, ranks."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import streambatch as sb
import streambatch.torch as sbt
from streambatch.items.mix.mixture import mix

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed; pip install torchdata")
StatefulDataLoader = stateful.StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning", "ignore:'set_vital':UserWarning")
WORKERS = [0, pytest.param(2, marks=pytest.mark.slow)]


def _mixture() -> Any:
    """web: packed rows of three documents; code: one short document, upsampled over several source epochs."""
    web = sb.pack([sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 10 + 3 * i)) for i in range(3)], context_length=4)
    code = sb.pack([sb.Document("c", "train", range(5000, 5007)), sb.Document("d", "train", [1, 2, 3])], context_length=4)
    return mix([web, code], [2, 1], seed=13, names=["web", "code"])


def _run() -> sb.Run:
    return sb.Run(_mixture(), batch_size=3, seed=None, epochs=2)


def _key(batch: sbt.TensorBatch) -> tuple[Any, ...]:
    assert batch.sources is not None
    assert batch.loss_mask is not None
    assert batch.cu_seqlens is not None
    return (
        batch.epoch,
        batch.index,
        batch.sources.tolist(),
        batch.inputs.tolist(),
        batch.loss_mask.tolist(),
        batch.cu_seqlens.tolist(),
    )


def test_tensor_batch_carries_sources_and_masks() -> None:
    batch = sb.materialize(sb.chunk(_mixture(), 4))[0]
    tensors = sbt.tensor_batch(batch)
    assert tensors.packed
    assert tensors.sources is not None
    assert tensors.sources.tolist() == batch.sources.tolist()
    assert tensors.token_count == batch.target_count
    assert tensors.targets[~tensors.loss_mask].eq(-100).all()
    assert tensors.max_seqlen == batch.max_seqlen


@pytest.mark.parametrize("workers", WORKERS)
def test_stateful_dataloader_resumes_a_packed_mixture_run_exactly(workers: int) -> None:
    full = [_key(b) for b in StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)]
    per_epoch = _run().batches_per_epoch
    assert [k[:2] for k in full] == [(e, i) for e in range(2) for i in range(per_epoch)]
    assert {s for k in full for s in k[2]} == {0, 1}
    for taken in sorted({0, 2, per_epoch, per_epoch + 1, len(full)}):
        loader = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        batches = iter(loader)
        first = [_key(next(batches)) for _ in range(taken)]
        state = loader.state_dict()
        del batches, loader
        resumed = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        resumed.load_state_dict(state)
        assert full == first + [_key(b) for b in resumed], f"interrupted after {taken} batches"


def test_epoch_dataset_of_a_packed_mixture_is_its_epoch() -> None:
    epoch = sb.Epoch(_mixture(), batch_size=3, pack=True)
    got = [_key(b) for b in DataLoader(sbt.EpochDataset(epoch), batch_size=None)]
    assert got == [_key(sbt.tensor_batch(b)) for b in epoch]


def test_elastic_resume_of_a_packed_mixture_from_three_ranks_to_two() -> None:
    """Saved by 3 ranks x 2 workers after some global batches, resumed on 2 ranks: every (epoch, source, row) once."""
    reference = _run()
    done = reference.batches_per_epoch + 1
    seen: Counter[tuple[int, int, int]] = Counter()

    def count(batch: sbt.TensorBatch) -> None:
        assert batch.sources is not None
        for s, p in zip(batch.sources.tolist(), batch.positions.tolist(), strict=True):
            seen[(batch.epoch, s, p)] += 1

    old = [sbt.RunDataset(_run(), rank=r, world_size=3) for r in range(3)]
    loaders = [iter(DataLoader(d, batch_size=None, num_workers=2)) for d in old]
    saved: list[dict[str, Any]] = []
    for _ in range(done):
        batches = [next(loader) for loader in loaders]
        for batch in batches:
            count(batch)
        saved = [d.state_dict_after(b) for d, b in zip(old, batches, strict=True)]
    del loaders
    runs = [_run() for _ in range(2)]
    for run in runs:
        run.load_state_dict(saved[0])
    for batches in zip(
        *[DataLoader(sbt.RunDataset(runs[r], rank=r, world_size=2), batch_size=None) for r in range(2)], strict=True
    ):
        for batch in batches:
            count(batch)
    expected: Counter[tuple[int, int, int]] = Counter()
    for batch in reference:
        assert isinstance(batch.sources, np.ndarray)
        for s, p in zip(batch.sources.tolist(), batch.positions.tolist(), strict=True):
            expected[(batch.epoch, s, p)] += 1
    assert seen == expected


@pytest.mark.slow
def test_spawned_workers_read_a_packed_mixture_with_plan_files(tmp_path: Any) -> None:
    """Spawned workers receive the packed mixture (its plan and packing files by name): the same batches as in one process."""
    docs = [sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 10 + 3 * i)) for i in range(3)]
    web = sb.pack(docs, context_length=4, plan_dir=tmp_path)
    code = sb.pack([sb.Document("c", "train", range(5000, 5007))], context_length=4, plan_dir=tmp_path)
    mixture = mix([web, code], [2, 1], seed=13, plan_dir=tmp_path)
    assert mixture.space.plan_path is not None
    run = sb.Run(mixture, batch_size=3, seed=None, epochs=1)
    loader = DataLoader(sbt.RunDataset(run), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert [_key(b) for b in loader] == [_key(b) for b in DataLoader(sbt.RunDataset(run), batch_size=None)]
