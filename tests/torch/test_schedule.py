"""Batch-size schedules (thresholds in consumed tokens): widths, exact resume across a change, kills, the audit.

The killed run: one epoch under the schedule 2 -> 4 -> 3, each life a subprocess that SIGKILLs itself at a step
(after writing the step, before saving the state), resumed under another world size, accumulation and worker
count; the steps written equal the uninterrupted run's, byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import streambatch as sb
from streambatch.errors import ConfigError, StateError
from streambatch.tools.audit.check import audit_epoch

from . import schedule_worker
from .rank_loader_worker import DOCS, OTHER

ROOT = Path(__file__).resolve().parents[2]


def _life(out: Path, world: int, accumulation: int, workers: int, kill_at: int, whole: bool = False) -> int:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "tests.torch.schedule_worker", str(out), str(world), str(accumulation), str(workers)]
    command += [str(kill_at), *(["run"] if whole else [])]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, -9), done.stderr
    return done.returncode


def _steps(out: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(out.glob("step-*.bin"))]


def test_a_killed_schedule_run_resumes_byte_for_byte(tmp_path: Path) -> None:
    """Kills at random steps (one inside each phase change's neighbourhood), each life under other settings."""
    run = schedule_worker.make_run()
    widths = run.epoch(0).batch_widths
    assert sorted(set(widths)) == [2, 3, 4]
    changes = [i for i in range(1, len(widths)) if widths[i] != widths[i - 1]]
    rng = random.Random(2026)
    kills = sorted({rng.randrange(max(c - 2, 0), c + 2) for c in changes[:2]} | {rng.randrange(len(widths) - 1)})
    epoch = run.epoch(0)
    expected = [b.inputs.tobytes() + b.targets.tobytes() for b in epoch]  # the uninterrupted run: the epoch itself
    killed = tmp_path / "killed"
    killed.mkdir()
    settings = [(2, 2, 2), (3, 1, 0), (1, 3, 1)]
    for kill, (world, acc, workers) in zip(kills, settings, strict=False):
        assert _life(killed, world, acc, workers, kill) == -9  # SIGKILL
        assert len(_steps(killed)) == kill + 1
    assert _life(killed, 2, 1, 2, -1) == 0
    assert _steps(killed) == expected
    assert audit_epoch(epoch, workers=2, world_size=3).ok  # coverage of the schedule epoch, proved by the audit


def test_a_run_killed_after_a_change_in_a_later_epoch_resumes_byte_for_byte(tmp_path: Path) -> None:
    """Three epochs whose schedule changes in epoch 1 (4 -> 3) and epoch 2 (3 -> 5), thresholds counted over the
    run: killed mid-epoch 2 after its change (and once in epoch 1 after its), each life under other settings."""
    run = schedule_worker.make_epochs()
    expected = [b.inputs.tobytes() + b.targets.tobytes() for b in run]  # the uninterrupted run
    assert len(expected) == run.steps_stop() == sum(run.batches_in(e) for e in range(3))
    widths2 = run.epoch(2).batch_widths
    change = run.step_of(2, widths2.index(5))  # the first batch of 5, mid-epoch 2
    rng = random.Random(40)
    kills = [rng.randrange(run.step_of(1, 8), run.step_of(2, 0)), rng.randrange(change, change + 6)]
    kills.append(rng.randrange(kills[-1] + 1, len(expected) - 1))
    killed = tmp_path / "killed"
    killed.mkdir()
    for kill, (world, acc, workers) in zip(kills, [(2, 2, 2), (3, 1, 0), (1, 3, 1)], strict=True):
        assert _life(killed, world, acc, workers, kill, whole=True) == -9  # SIGKILL
        assert len(_steps(killed)) == kill + 1
        saved = json.loads((killed / "state.json").read_text())
        assert saved["items"] == run.state_dict(run.position_of(kill))["items"]  # items consumed since the start
    assert _life(killed, 2, 1, 2, -1, whole=True) == 0
    assert _steps(killed) == expected
    for e in range(3):
        assert audit_epoch(run.epoch(e), workers=2, world_size=3).ok  # each epoch of the run: coverage, widths


@pytest.mark.parametrize("kind", ["windows", "packed", "mixture"])
def test_five_save_resume_cycles_inside_one_epoch_give_the_same_stream(kind: str) -> None:
    def make() -> sb.Run:
        if kind == "windows":
            return sb.Run(DOCS, context_length=3, batch_size="0:2 60:4 240:3", seed=4, epochs=1)
        if kind == "packed":
            return sb.Run(DOCS, context_length=5, batch_size=[(0, 1), (30, 3), (90, 2)], seed=4, epochs=1, pack=True)
        parts = [sb.windows(DOCS, context_length=3), sb.windows(OTHER, context_length=3)]
        return sb.Run(sb.mix(parts, [2, 1], seed=4, length=90), batch_size="0:2 60:4 240:3", seed=4, epochs=1)

    stream = [b.inputs.tobytes() + b.targets.tobytes() for b in make()]
    widths = make().epoch(0).batch_widths
    assert len(set(widths[:-1])) == 3  # three phases, and the final batch
    assert sum(widths) == make().item_count
    cuts = sorted(random.Random(kind).sample(range(1, len(stream)), 5))
    got: list[bytes] = []
    state = None
    for stop in [*cuts, len(stream)]:
        run = make()
        if state is not None:
            run.load_state_dict(state)
        batches = iter(run)
        while run.step_of(*run.position) < stop:
            b = next(batches)
            got.append(b.inputs.tobytes() + b.targets.tobytes())
        state = run.state_dict()
        assert state["items"] == sum(widths[:stop])  # the items consumed since the run's start
    assert got == stream


def test_schedule_widths_follow_the_thresholds() -> None:
    """B_i starts at the first batch boundary where t_i tokens (items x T) were consumed; the final batch is short."""
    epoch = sb.Epoch(DOCS, context_length=3, batch_size="0:2 60:4 240:3", seed=None)
    widths = epoch.batch_widths
    consumed = np.concatenate([[0], np.cumsum(widths)]) * 3  # tokens consumed before each batch
    for width, tokens in zip(widths[:-1], consumed[:-2], strict=True):
        assert width == (2 if tokens < 60 else 4 if tokens < 240 else 3)
    assert widths[-1] <= 3
    assert [b.width for b in epoch] == widths
    assert sb.Epoch(DOCS, context_length=3, batch_size="0:5", seed=None).batch_size == 5  # one phase: the int path


def test_a_fixed_size_state_is_unchanged_and_schedules_refuse_each_other() -> None:
    fixed = sb.Run(DOCS, context_length=3, batch_size=4, seed=1)
    assert "items" not in fixed.state_dict()
    assert fixed.state_dict()["batch_size"] == 4
    a = sb.Run(DOCS, context_length=3, batch_size="0:2 60:4", seed=1)
    b = sb.Run(DOCS, context_length=3, batch_size="0:2 90:4", seed=1)
    with pytest.raises(StateError, match="batch_size='0:2 60:4' but this run has batch_size='0:2 90:4'"):
        b.load_state_dict(a.state_dict())
    forged = {**a.state_dict((0, 12)), "items": 23}
    with pytest.raises(StateError, match="items=23"):
        a.load_state_dict(forged)
    assert a.position == (0, 0)
    with pytest.raises(ConfigError, match="first threshold"):
        sb.Epoch(DOCS, context_length=3, batch_size="5:2 60:4", seed=1)
