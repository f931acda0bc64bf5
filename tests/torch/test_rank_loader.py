"""`sbt.RankLoader`: a rank's micro-batches of each step, one global cursor as its state, DCP across world sizes.

The DCP tests save a loader mid-run with ``torch.distributed.checkpoint`` under one (world size, workers,
accumulation) and load it under another (DP 2->1, 1->2, 2->3, workers 2->0): the micro-batches every rank hands
out, put back together step by step, are the run's global batches, each exactly once, byte for byte.  The
hypothesis property checks the same in one process (ranks simulated, no DCP) for many settings and item kinds.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.stateful import Stateful

import streambatch as sb
import streambatch.torch as sbt
from streambatch.errors import ConfigError, StateError

from . import rank_loader_worker as worker
from .spawn import spawn_ranks

KINDS = ["windows", "packed", "mixture", "schedule"]
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _global(run: sb.Run, step: int) -> sb.MiniBatch:
    return run.batch(*run.position_of(step))


def _assemble(phases: list[list[list[dict[str, Any]]]], kind: str) -> None:
    """Every phase's ranks' micro-batches, put back together step by step, are the run's batches in order, once."""
    run = worker.make_run(kind)
    seen: list[int] = []
    for ranks in phases:
        steps = sorted({r["step"] for r in ranks[0]})
        for rank in ranks:  # every rank steps through the same steps, accumulation micro-batches each
            assert sorted({r["step"] for r in rank}) == steps
        for step in steps:
            whole = _global(run, step)
            rows = [r["inputs"] for rank in ranks for r in rank if r["step"] == step]  # rank order, then part order
            assert [row for part in rows for row in part] == whole.inputs.tolist()
            counts = {r["count"] for rank in ranks for r in rank if r["step"] == step}
            assert counts == {whole.token_count}  # the step's count on every rank and micro-batch, from the plan
        seen += steps
    assert seen == list(range(run.steps_stop()))  # no gap, no repeat, in order


def _phase(folder: Path, world: int, **config: Any) -> list[list[dict[str, Any]]]:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"output": "batch", **config}))
    if world == 1:  # in this process, with no process group: DCP saves and loads alone
        worker.run_rank(0, 1, "", str(folder))
    else:
        spawn_ranks(worker.run_rank, world, folder, timeout=180)
    found = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
    assert all(f["state"] == found[0]["state"] for f in found)  # one global cursor: the same state on every rank
    return [f["records"] for f in found]


@pytest.mark.parametrize(
    ("kind", "before", "after"),
    [
        ("windows", (2, 2, 1), (1, 0, 3)),  # DP 2 -> 1, workers 2 -> 0, accumulation 1 -> 3
        ("packed", (1, 0, 2), (2, 1, 1)),  # DP 1 -> 2
        ("mixture", (2, 0, 2), (3, 2, 1)),  # DP 2 -> 3
    ],
)
def test_a_dcp_checkpoint_resumes_under_another_world_size(tmp_path: Path, kind: str, before: tuple, after: tuple) -> None:
    """(world, workers, accumulation) before and after a dcp.save / dcp.load: the rest of the run, exactly."""
    checkpoint = str(tmp_path / "checkpoint")
    world, workers, acc = before
    saved = _phase(tmp_path / "save", world, kind=kind, workers=workers, accumulation=acc, steps=3, save=checkpoint)
    world, workers, acc = after
    output = "torchtitan" if kind == "mixture" else "batch"
    loaded = _phase(tmp_path / "load", world, kind=kind, workers=workers, accumulation=acc, load=checkpoint, output=output)
    _assemble([saved, loaded], kind)


@pytest.mark.parametrize(("before", "after"), [((2, 1, 2), (1, 0, 3)), ((1, 0, 1), (3, 2, 2))])
def test_a_dcp_checkpoint_resumes_across_a_schedule_change_in_a_later_epoch(tmp_path: Path, before: tuple, after: tuple) -> None:
    """The schedule's thresholds count over the run: saved in epoch 1 after its change (4 -> 3), loaded under another
    (world, workers, accumulation), the rest crosses epoch 2's change (3 -> 5) exactly."""
    run = worker.make_run("schedule")
    assert [run.batches_in(e) for e in range(3)] == [35, 45, 36]  # epochs differ: the thresholds fall in 1 and 2
    at = run.step_of(1, 10)  # past item 167: epoch 1's batches of 3
    assert run.batch(*run.position_of(at - 1)).width == 3
    checkpoint = str(tmp_path / "checkpoint")
    world, workers, acc = before
    saved = _phase(tmp_path / "save", world, kind="schedule", workers=workers, accumulation=acc, steps=at, save=checkpoint)
    world, workers, acc = after
    loaded = _phase(tmp_path / "load", world, kind="schedule", workers=workers, accumulation=acc, load=checkpoint)
    _assemble([saved, loaded], "schedule")


def _simulate(kind: str, cuts: list[int], settings_: list[tuple[int, int, int]]) -> None:
    """Ranks simulated in one process: phase p runs under settings_[p] (world, workers, accumulation) for cuts[p]
    steps (None: to the end), resumed from the previous phase's state."""
    state: dict[str, Any] | None = None
    phases = []
    for steps, (world, workers, acc) in zip(cuts, settings_, strict=True):
        ranks, states = [], []
        for rank in range(world):
            loader = sbt.RankLoader(
                worker.make_run(kind), rank=rank, world_size=world, num_workers=workers, accumulation=acc, whole_run=True
            )
            if state is not None:
                loader.load_state_dict(state)
            ranks.append(worker.take(loader, steps))
            states.append(loader.state_dict())
        assert all(s == states[0] for s in states)
        state = states[0]
        phases.append(ranks)
    _assemble(phases, kind)


SETTING = st.tuples(st.integers(1, 4), st.integers(0, 2), st.integers(1, 3))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), first=SETTING, second=SETTING, third=SETTING, data=st.data())
def test_any_settings_before_and_after_give_the_plan_exactly_once(
    kind: str, first: tuple[int, int, int], second: tuple[int, int, int], third: tuple[int, int, int], data: Any
) -> None:
    """Property: any (world, workers, accumulation) for each of three stretches of the run: the consumed multiset
    is the plan's prefix at every cut (no duplicate, no gap), and the whole is the run."""
    total = worker.make_run(kind).steps_stop()
    a = data.draw(st.integers(0, total))
    b = data.draw(st.integers(0, total - a))
    _simulate(kind, [a, b, None], [first, second, third])


def test_micro_batches_split_the_rank_share_and_carry_the_step_count() -> None:
    """accumulation=k splits each rank's share (the same rows as accumulation=1) into k micro-batches, in order."""
    run = worker.make_run("packed")
    for rank in range(3):
        plain = list(sbt.RankLoader(worker.make_run("packed"), rank=rank, world_size=3))
        split = list(sbt.RankLoader(worker.make_run("packed"), rank=rank, world_size=3, accumulation=2))
        assert len(split) == 2 * len(plain) == 2 * run.batches_per_epoch
        for whole, (a, b) in zip(plain, zip(split[::2], split[1::2], strict=True), strict=True):
            assert np.array_equal(np.concatenate([a.inputs, b.inputs]), whole.inputs)
            assert a.global_token_count == b.global_token_count == whole.global_token_count
            assert a.token_count + b.token_count == whole.token_count


def test_output_forms_and_lengths() -> None:
    """'tensors' gives TensorBatch, 'torchtitan' ({'input': inputs}, labels) with -100 where a target does not
    count; len is the next iteration's micro-batches (the rest of the epoch), global_token_count the plan's."""
    run = worker.make_run("packed")
    loader = sbt.RankLoader(worker.make_run("packed"), output="torchtitan", accumulation=2)
    assert isinstance(loader, Stateful)
    assert len(loader) == 2 * run.batches_per_epoch
    assert loader.steps == run.batches_per_epoch
    first = list(itertools.islice(loader, 3))
    inputs, _labels = first[0]
    assert set(inputs) == {"input"}
    assert inputs["input"].dtype == torch.long
    assert loader.global_token_count(0) == run.batch(0, 0).token_count
    assert loader.global_token_count() == run.batch(0, 1).token_count
    assert loader.step == 1
    assert loader.steps == run.batches_per_epoch - 1
    assert len(loader) == 2 * run.batches_per_epoch  # the whole epoch's, as a DataLoader's length (Lightning)
    rest = list(loader)
    assert len(rest) == 2 * (run.batches_per_epoch - 1)
    assert loader.step == run.batches_per_epoch
    assert loader.run.position == (1, 0)
    assert len(loader) == 2 * run.batches_per_epoch
    padded = 0
    for index, (a, b) in enumerate(zip([first[0], *rest[::2]], [first[1], *rest[1::2]], strict=True)):
        whole = run.batch(0, index)
        assert int((a[1] != -100).sum() + (b[1] != -100).sum()) == whole.token_count
        padded += whole.token_count < whole.targets.size
    assert padded  # some steps hold padding, which the labels leave out
    tensors = next(iter(sbt.RankLoader(worker.make_run("windows"), output="tensors", num_workers=1)))
    assert isinstance(tensors, sbt.TensorBatch)
    assert tensors.inputs.dtype == torch.long


def test_each_iteration_is_one_epoch_unless_whole_run() -> None:
    run = worker.make_run("windows")
    loader = sbt.RankLoader(run, num_workers=2)
    epochs = [[(b.epoch, b.index) for b in loader] for _ in range(3)]
    per = run.batches_per_epoch
    assert epochs == [[(0, i) for i in range(per)], [(1, i) for i in range(per)], []]
    whole = sbt.RankLoader(worker.make_run("windows"), whole_run=True)
    assert len(whole) == len(list(whole)) == 2 * per
    assert len(loader) == 0  # past the run's end


def test_refusals_change_nothing() -> None:
    run = worker.make_run("windows")
    with pytest.raises(ConfigError, match="rank=2"):
        sbt.RankLoader(run, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="output="):
        sbt.RankLoader(run, output="hf")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="accumulation"):
        sbt.RankLoader(run, accumulation=0)
    loader = sbt.RankLoader(run)
    next(iter(loader))
    before = loader.state_dict()
    other = worker.make_run("packed")
    with pytest.raises(StateError, match="state"):
        loader.load_state_dict(sbt.RankLoader(other).state_dict())
    assert loader.state_dict() == before
