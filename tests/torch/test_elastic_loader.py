"""Elastic loader state: a StatefulDataLoader checkpoint resumes exactly under any num_workers and world size.

Windows, packed rows and mixtures; states saved with 0, 1, 2 and 3 workers, loaded with each of them.  A state
that cannot resume is refused when it is loaded, in this process, never by a traceback inside a worker.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import streambatch as sb
import streambatch.torch as sbt
from streambatch.errors import StateError

pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed; pip install torchdata")

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning", "ignore:'set_vital':UserWarning")

DOCS = [sb.Document(f"d{i}", "train", np.arange(3 + 5 * i) % 41) for i in range(8)]
OTHER = [sb.Document(f"o{i}", "train", np.arange(30 + i) % 17) for i in range(3)]


def _run(kind: str) -> sb.Run:
    if kind == "windows":
        return sb.Run(DOCS, context_length=3, batch_size=4, seed=5, epochs=2)
    if kind == "packed":
        return sb.Run(DOCS, context_length=6, batch_size=2, seed=5, epochs=2, pack=True)
    parts = [sb.windows(DOCS, context_length=3), sb.windows(OTHER, context_length=3)]
    return sb.Run(sb.mix(parts, [2, 1], seed=5, length=40), batch_size=4, seed=5, epochs=2)


def _key(batch: sbt.TensorBatch) -> tuple[int, int, list[list[int]]]:
    return batch.epoch, batch.index, batch.inputs.tolist()


def _loader(dataset: Any, workers: int) -> sbt.StatefulDataLoader:
    return sbt.StatefulDataLoader(dataset, batch_size=None, num_workers=workers)


@pytest.mark.parametrize("kind", ["windows", "packed", "mixture"])
@pytest.mark.parametrize(("saved", "loaded"), [(2, 1), (2, 3), (2, 0), (0, 3), (3, 2), (1, 1)])
def test_a_loader_state_resumes_under_another_worker_count(kind: str, saved: int, loaded: int) -> None:
    """Save after some batches with *saved* workers, load with *loaded*: the rest of the run, exactly once."""
    full = [_key(b) for b in sbt.RunDataset(_run(kind))]
    taken = 5
    loader = _loader(sbt.RunDataset(_run(kind)), saved)
    first = [_key(b) for b in itertools.islice(iter(loader), taken)]
    state = loader.state_dict()
    del loader
    resumed = _loader(sbt.RunDataset(_run(kind)), loaded)
    resumed.load_state_dict(state)
    assert first + [_key(b) for b in resumed] == full


@pytest.mark.parametrize(("saved", "loaded"), [(2, 3), (3, 0)])
def test_an_epoch_dataset_state_resumes_within_its_epoch(saved: int, loaded: int) -> None:
    """An EpochDataset resumed elsewhere yields the rest of its epoch, and at its end nothing (not the next epoch)."""
    epoch = sb.Epoch(DOCS, context_length=3, batch_size=4, seed=5)
    full = [_key(b) for b in sbt.EpochDataset(epoch)]
    loader = _loader(sbt.EpochDataset(epoch), saved)
    batches = iter(loader)
    first = [_key(next(batches)) for _ in range(4)]
    state = loader.state_dict()
    resumed = _loader(sbt.EpochDataset(epoch), loaded)
    resumed.load_state_dict(state)
    assert first + [_key(b) for b in resumed] == full
    done = _loader(sbt.EpochDataset(epoch), saved)
    assert [_key(b) for b in done] == full
    after = _loader(sbt.EpochDataset(epoch), loaded)
    after.load_state_dict(done.state_dict())
    assert list(after) == []


def test_a_composed_pipeline_resumes_under_another_worker_count() -> None:
    """A BatchesDataset (any sized source of batches) too, twice in a row."""
    batches = list(sb.Epoch(DOCS, context_length=3, batch_size=2, seed=1))
    full = [_key(b) for b in sbt.BatchesDataset(batches)]
    loader = _loader(sbt.BatchesDataset(batches), 2)
    first = [_key(b) for b in itertools.islice(iter(loader), 3)]
    middle = _loader(sbt.BatchesDataset(batches), 3)
    middle.load_state_dict(loader.state_dict())
    second = [_key(b) for b in itertools.islice(iter(middle), 4)]
    last = _loader(sbt.BatchesDataset(batches), 1)
    last.load_state_dict(middle.state_dict())
    assert first + second + [_key(b) for b in last] == full


def test_another_world_size_resumes_through_the_position() -> None:
    """Rank 0 of 2 saves; ranks of 3 load it: together they hold every row of every later batch once."""
    loader = _loader(sbt.RunDataset(_run("windows"), rank=0, world_size=2), 2)
    first = [(b.epoch, b.index) for b in itertools.islice(iter(loader), 3)]
    state = loader.state_dict()
    later = []
    for rank in range(3):
        resumed = _loader(sbt.RunDataset(_run("windows"), rank=rank, world_size=3), 1)
        resumed.load_state_dict(state)
        later.append([(b.epoch, b.index, b.inputs.tolist()) for b in resumed])
    whole = list(sbt.RunDataset(_run("windows")))[3:]
    assert first == [(0, 0), (0, 1), (0, 2)]
    for k, batch in enumerate(whole):
        rows = [row for rank in range(3) for row in later[rank][k][2]]
        assert all(later[rank][k][:2] == (batch.epoch, batch.index) for rank in range(3))
        assert rows == batch.inputs.tolist()


def test_a_state_that_cannot_resume_is_refused_when_loaded() -> None:
    """Another run, a damaged worker entry: StateError from load_state_dict itself, nothing changed."""
    loader = _loader(sbt.RunDataset(_run("windows")), 2)
    next(iter(loader))
    state = loader.state_dict()
    other = _loader(sbt.RunDataset(sb.Run(DOCS, context_length=3, batch_size=4, seed=6, epochs=2)), 1)
    with pytest.raises(StateError, match="seed=5 but this run has seed=6"):
        other.load_state_dict(state)
    damaged = {**state, "_snapshot": {**state["_snapshot"], "_worker_snapshots": {"worker_0": None}}}
    target = sbt.RunDataset(_run("windows"))
    with pytest.raises(StateError, match=r"pass StatefulDataLoader\.state_dict"):
        _loader(target, 3).load_state_dict(damaged)
    assert target.position == (0, 0)
    with pytest.raises(StateError, match=r"pass StatefulDataLoader\.state_dict"):
        sbt.loader_position(target, [1, 2])
