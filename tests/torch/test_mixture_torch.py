"""Mixtures through PyTorch: RunDataset/EpochDataset, StatefulDataLoader resume, workers, ranks and elastic resume."""

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
    """web: 30 windows; code: 4 windows at a third of the items (upsampled: several source epochs)."""
    web = sb.windows([sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 12)) for i in range(3)], context_length=2)
    code = sb.windows([sb.Document("c", "train", range(5000, 5006))], context_length=2)
    return mix([web, code], [2, 1], seed=13, names=["web", "code"])


def _run() -> sb.Run:
    return sb.Run(_mixture(), batch_size=4, seed=None, epochs=2)


def _key(batch: sbt.TensorBatch) -> tuple[int, int, list[int], list[list[int]]]:
    assert batch.sources is not None
    return batch.epoch, batch.index, batch.sources.tolist(), batch.inputs.tolist()


@pytest.mark.parametrize("workers", WORKERS)
def test_stateful_dataloader_resumes_a_mixture_run_exactly(workers: int) -> None:
    full = [_key(b) for b in StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)]
    per_epoch = _run().batches_per_epoch
    assert [k[:2] for k in full] == [(e, i) for e in range(2) for i in range(per_epoch)]
    assert {s for k in full for s in k[2]} == {0, 1}
    for taken in sorted({0, 3, per_epoch, per_epoch + 2, len(full)}):
        loader = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        batches = iter(loader)
        first = [_key(next(batches)) for _ in range(taken)]
        state = loader.state_dict()
        del batches, loader
        resumed = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        resumed.load_state_dict(state)
        assert full == first + [_key(b) for b in resumed], f"interrupted after {taken} batches"


def test_epoch_dataset_of_a_mixture_is_its_epoch() -> None:
    epoch = sb.Epoch(_mixture(), batch_size=4)
    dataset = sbt.EpochDataset(epoch)
    got = [_key(b) for b in DataLoader(dataset, batch_size=None)]
    assert got == [(0, b.index, b.sources.tolist(), b.inputs.tolist()) for b in epoch]  # type: ignore[attr-defined]


def test_elastic_resume_of_a_mixture_from_three_ranks_of_two_workers_to_two_ranks() -> None:
    """Saved by 3 ranks x 2 workers after some global batches, resumed on 2 ranks x 1 worker: every item once."""
    reference = _run()
    done = reference.batches_per_epoch + 2
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
    for batch in reference:  # the whole schedule in one process: (epoch, source, start) with multiplicity
        assert isinstance(batch.sources, np.ndarray)
        for s, p in zip(batch.sources.tolist(), batch.positions.tolist(), strict=True):
            expected[(batch.epoch, s, p)] += 1
    assert seen == expected


@pytest.mark.slow
def test_spawned_workers_map_the_mixture_plan_file(tmp_path: Any) -> None:
    """Spawned workers receive the plan file's name and map it again: the same batches as in one process."""
    web = sb.windows([sb.Document(f"w{i}", "train", range(100 * i, 100 * i + 12)) for i in range(3)], context_length=2)
    code = sb.windows([sb.Document("c", "train", range(5000, 5006))], context_length=2)
    mixture = mix([web, code], [2, 1], seed=13, plan_dir=tmp_path)
    assert mixture.space.plan_path is not None
    run = sb.Run(mixture, batch_size=4, seed=None, epochs=1)
    loader = DataLoader(sbt.RunDataset(run), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert [_key(b) for b in loader] == [_key(b) for b in DataLoader(sbt.RunDataset(run), batch_size=None)]
