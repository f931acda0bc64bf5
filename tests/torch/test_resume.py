"""Tests for resuming through PyTorch: StatefulDataLoader, persistent workers, elastic ranks and workers."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import streambatch as sb
import streambatch.torch as sbt
from streambatch.errors import OutOfRangeError

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed; pip install torchdata")
StatefulDataLoader = stateful.StatefulDataLoader

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning", "ignore:'set_vital':UserWarning")
WORKERS = [0, *(pytest.param(w, marks=pytest.mark.slow) for w in (1, 2, 3))]  # worker processes: slow


def _docs(count: int = 8) -> list[sb.Document]:
    rng = np.random.default_rng(5)
    return [sb.Document(f"d{i}", "train", rng.integers(0, 50, rng.integers(3, 12))) for i in range(count)]


def _run(**kwargs: Any) -> sb.Run:
    arguments: dict[str, Any] = {"context_length": 3, "batch_size": 4, "seed": 9, "epochs": 2, **kwargs}
    return sb.Run(_docs(), **arguments)


def _key(batch: sbt.TensorBatch) -> tuple[int, int, list[list[int]]]:
    return batch.epoch, batch.index, batch.inputs.tolist()


@pytest.mark.parametrize("workers", WORKERS)
def test_stateful_dataloader_resumes_a_run_exactly(workers: int) -> None:
    """After any number of batches (0, mid-epoch, the boundary, the end), a new loader continues exactly."""
    full = [_key(b) for b in StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)]
    per_epoch = _run().batches_per_epoch
    assert [(e, i) for e in range(2) for i in range(per_epoch)] == [k[:2] for k in full]
    for taken in sorted({0, 1, workers + 1, per_epoch - 1, per_epoch, per_epoch + 1, len(full) - 1, len(full)}):
        loader = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        batches = iter(loader)
        first = [_key(next(batches)) for _ in range(taken)]
        state = loader.state_dict()
        del batches, loader
        resumed = StatefulDataLoader(sbt.RunDataset(_run()), batch_size=None, num_workers=workers)
        resumed.load_state_dict(state)
        assert full == first + [_key(b) for b in resumed], f"interrupted after {taken} batches"


def _epoch_loop(loader: Any, dataset: sbt.EpochDataset, epochs: Iterable[int], stop: int | None = None) -> list[Any]:
    """A training loop over epochs: set_epoch, then the loader; stop after *stop* batches in all."""
    out = []
    for number in epochs:
        dataset.set_epoch(number)
        for batch in loader:
            out.append((number, *_key(batch)[1:]))
            if stop is not None and len(out) == stop:
                return out
    return out


@pytest.mark.parametrize("workers", WORKERS)
def test_stateful_dataloader_over_epoch_dataset_across_epochs(workers: int) -> None:
    """EpochDataset + set_epoch under StatefulDataLoader: save mid-epoch 1, resume in a new loader, same batches."""

    def fresh() -> tuple[Any, sbt.EpochDataset]:
        dataset = sbt.EpochDataset(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=9))
        return StatefulDataLoader(dataset, batch_size=None, num_workers=workers), dataset

    loader, dataset = fresh()
    full = _epoch_loop(loader, dataset, range(2))
    per_epoch = len(dataset)
    for taken in sorted({1, per_epoch, per_epoch + 2}):
        loader, dataset = fresh()
        first = _epoch_loop(loader, dataset, range(2), stop=taken)
        state, epoch = loader.state_dict(), first[-1][0]
        loader, dataset = fresh()
        loader.load_state_dict(state)
        assert full == first + _epoch_loop(loader, dataset, range(epoch, 2)), f"interrupted after {taken} batches"
    loader, dataset = fresh()
    first = _epoch_loop(loader, dataset, range(1))  # saved after epoch 0's loop ended (the loader is finished)
    state = loader.state_dict()
    loader, dataset = fresh()
    loader.load_state_dict(state)
    assert full == first + _epoch_loop(loader, dataset, range(1, 2))


def test_a_worker_state_of_another_worker_count_is_refused() -> None:
    """A worker's state records [id, num_workers]; loading it elsewhere raises and changes nothing."""
    dataset = sbt.RunDataset(_run())
    state = dataset.state_dict()
    assert [0, 1] == state["worker"]
    assert ("streambatch.state", "worker") == (state["format"], state["kind"])
    other = dict(state, worker=[1, 2])
    with pytest.raises(sb.StateError, match=r"state worker=\[1, 2\] but this is worker \[0, 1\]"):
        dataset.load_state_dict(other)
    with pytest.raises(sb.StateError, match=r"state seed=8 but this run has seed=9"):
        dataset.load_state_dict(dict(state, run=dict(state["run"], seed=8)))
    with pytest.raises(sb.StateError, match=r"state format='x' is not 'streambatch.state'"):
        dataset.load_state_dict({"format": "x"})
    assert [_key(b) for b in sbt.RunDataset(_run())] == [_key(b) for b in dataset]


def _two_epochs(dataset: sbt.EpochDataset, loader: Any) -> list[list[list[int]]]:
    out = []
    for number in range(2):
        dataset.set_epoch(number)
        out.append([b.positions.tolist() for b in loader])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_see_set_epoch(context: str) -> None:
    """persistent_workers=True: epoch 1 really is epoch 1 (the epoch travels in shared memory)."""
    run = _run()
    expected = [[b.positions.tolist() for b in run.epoch(e)] for e in range(2)]
    assert expected[0] != expected[1]
    dataset = sbt.EpochDataset(sb.Epoch(_docs(), context_length=3, batch_size=4, seed=9))
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    assert expected == _two_epochs(dataset, loader)


@pytest.mark.slow
def test_persistent_workers_see_set_position_of_a_run() -> None:
    """A RunDataset moved with set_position between passes reaches persistent workers."""
    dataset = sbt.RunDataset(_run())
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    whole = [_key(b) for b in loader]
    dataset.set_position(1, 2)
    assert whole[_run().step_of(1, 2) :] == [_key(b) for b in loader]


@pytest.mark.slow
def test_start_batch_and_set_epoch_compose() -> None:
    """An explicit start survives set_epoch until an iteration begins (in a worker too); later epochs start at 0."""
    epoch = sb.Epoch(_docs(), context_length=3, batch_size=4, seed=9)
    run = _run()
    dataset = sbt.EpochDataset(epoch, start_batch=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    dataset.set_epoch(1)
    assert (1, 2) == (dataset.epoch_number, dataset.start_batch)
    assert [(1, i) for i in range(2, run.batches_per_epoch)] == [(b.epoch, b.index) for b in loader]
    dataset.set_epoch(2)  # the workers began iterating: the requested start is used up
    assert [(2, i) for i in range(run.batches_per_epoch)] == [(b.epoch, b.index) for b in loader]
    dataset.set_position(3, 1)
    assert (3, 1) == (dataset.epoch_number, dataset.start_batch)
    assert run.batches_per_epoch - 1 == len(dataset)


def test_dataset_arguments_are_checked() -> None:
    """dtype must be a torch dtype; start_batch within the epoch; a RunDataset needs a Run."""
    epoch = sb.Epoch(_docs(), context_length=3, batch_size=4, seed=9)
    with pytest.raises(sb.ConfigError, match=r"dtype='long' is not a torch.dtype; pass e.g. torch.long"):
        sbt.EpochDataset(epoch, dtype="long")  # type: ignore[arg-type]
    with pytest.raises(OutOfRangeError, match=r"start_batch=99 is beyond the epoch's \d+ batches"):
        sbt.EpochDataset(epoch, start_batch=99)
    with pytest.raises(sb.ConfigError, match=r"run=.* is not a streambatch.Run"):
        sbt.RunDataset(epoch)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an endless run has no length"):
        len(sbt.RunDataset(_run(epochs=None)))
    assert torch.uint32 == next(iter(sbt.EpochDataset(epoch, dtype=None))).inputs.dtype


@pytest.mark.slow
def test_elastic_resume_from_three_ranks_of_two_workers_to_two_ranks_of_one() -> None:
    """The global position saved by 3 ranks x 2 workers resumes on 2 ranks x 1 worker: each window once per epoch.

    The batch in flight (received, its step not done) is not counted by the saved state and comes again after
    the resume: at-least-once for it, exactly once for every completed batch.
    """
    reference = _run()
    done = reference.batches_per_epoch + 1  # global batches completed before the interruption: past an epoch boundary
    seen: Counter[tuple[int, int]] = Counter()

    def count(batch: sbt.TensorBatch) -> None:
        seen.update((batch.epoch, int(w)) for w in reference.items.window_index.windows_at(batch.positions.numpy()))

    old = [sbt.RunDataset(_run(), rank=r, world_size=3) for r in range(3)]
    old_loaders = [iter(DataLoader(d, batch_size=None, num_workers=2)) for d in old]
    saved: list[dict[str, Any]] = []
    for _ in range(done):
        batches = [next(loader) for loader in old_loaders]
        assert len({(b.epoch, b.index) for b in batches}) == 1  # every rank steps through the same global batch
        for batch in batches:
            count(batch)
        saved = [d.state_dict_after(b) for d, b in zip(old, batches, strict=True)]  # the step is done on every rank
    in_flight = [next(loader) for loader in old_loaders]  # received; the interruption comes before its step ends
    del old_loaders
    assert saved[0] == saved[1] == saved[2]

    runs = [_run() for _ in range(2)]
    for run in runs:
        run.load_state_dict(saved[0])
    new_loaders = [DataLoader(sbt.RunDataset(runs[r], rank=r, world_size=2), batch_size=None, num_workers=1) for r in range(2)]
    resumed = list(zip(*new_loaders, strict=True))
    assert {(in_flight[0].epoch, in_flight[0].index)} == {(b.epoch, b.index) for b in resumed[0]}
    assert sorted(p for b in in_flight for p in b.positions.tolist()) == sorted(
        p for b in resumed[0] for p in b.positions.tolist()
    )
    for batches in resumed:
        for batch in batches:
            count(batch)
    assert dict.fromkeys(itertools.product(range(2), range(reference.window_count)), 1) == dict(seen)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_epoch_dataset_of_a_composed_pipeline(workers: int) -> None:
    """EpochDataset takes any sized, indexable source of batches: a hand-composed pipeline reads back in order."""
    windows = sb.shuffle(sb.windows(_docs(), context_length=3), seed=9)
    batches = sb.materialize(sb.split_rows(sb.chunk(windows, 4), 1, 2))
    dataset = sbt.EpochDataset(batches)
    assert isinstance(dataset, sbt.BatchesDataset)
    assert len(dataset) == len(batches)
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    got = [(b.index, b.inputs.tolist()) for b in loader]
    assert got == [(b.index, b.inputs.to(torch.long).tolist()) for b in map(sbt.tensor_batch, batches)]
    with pytest.raises(sb.ConfigError, match=r"split the rows in it with sb\.split_rows"):
        sbt.EpochDataset(batches, world_size=2)
    with pytest.raises(sb.ConfigError, match="not a sized, indexable source"):
        sbt.EpochDataset(iter(batches))


@pytest.mark.parametrize("workers", WORKERS)
def test_batches_dataset_resumes_under_stateful_dataloader(workers: int) -> None:
    """StatefulDataLoader over a composed pipeline: save after k batches, resume in a new loader, same rest."""
    batches = sb.materialize(sb.chunk(sb.shuffle(sb.windows(_docs(), context_length=3), seed=4), 3))

    def loader() -> Any:
        return StatefulDataLoader(sbt.BatchesDataset(batches), batch_size=None, num_workers=workers)

    whole = [b.index for b in loader()]
    first = loader()
    taken, state = [], None
    for batch in first:
        taken.append(batch.index)
        if len(taken) == 3:
            state = first.state_dict()
            break
    second = loader()
    second.load_state_dict(state)
    assert taken + [b.index for b in second] == whole
