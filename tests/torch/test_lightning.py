"""`streambatch.lightning.RunDataModule` under Lightning's ``strategy="ddp"`` (CPU, gloo, world size 2).

The parameters after an epoch equal a one-process float64 loop over the same global batches that divides each
step's summed loss by its counted targets (rel 1e-6), and a mid-epoch checkpoint resumed (after
``estimated_stepping_batches`` was read, Lightning #20550) under world size 2 and 1 ends at the same parameters.
Lightning relaunches the script for its second rank, so each training runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="lightning is not installed (the lightning extra)")

from . import lightning_script as script

ROOT = Path(__file__).resolve().parents[2]


def _train(out: Path, devices: int, checkpoint: Path | None = None, accumulation: int = 2) -> dict[str, torch.Tensor]:
    done = _script(out, devices, checkpoint, accumulation)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((out / "steps.json").read_text())["global_step"] == script.make_run().batches_per_epoch
    return torch.load(out / "params.pt")  # type: ignore[no-any-return]


def _script(out: Path, devices: int, checkpoint: Path | None, accumulation: int) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "GLOO_SOCKET_IFNAME": "lo"}
    command = [sys.executable, str(Path(script.__file__)), str(out), str(devices)]
    command += [str(checkpoint), str(accumulation)] if checkpoint else []
    return subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=420)


def _reference() -> dict[str, torch.Tensor]:
    """One process, no Lightning: each global batch's summed loss over its counted targets, one SGD step each."""
    import streambatch.torch as sbt

    model = script.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in script.make_run():
        inputs, targets = sbt.as_tensors(batch)
        loss = sbt.cross_entropy_sum(model, inputs, targets) / batch.token_count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rel: float) -> None:
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=rel, atol=rel * float(b[key].abs().max())), key


def test_ddp_equals_the_one_process_token_mean_and_a_mid_epoch_checkpoint_resumes(tmp_path: Path) -> None:
    run = script.make_run()
    counts = [b.token_count for b in run]
    assert len(set(counts)) > 1  # steps count different targets: a wrong denominator would show
    assert run.batches_per_epoch > script.EVERY  # the checkpoint is mid-epoch
    whole = _train(tmp_path / "whole", 2)
    reference = _reference()
    _close(whole, reference, 1e-6)
    initial = script.make_model().state_dict()
    assert all(not torch.allclose(whole[k], initial[k]) for k in whole)  # the model moved: not vacuous
    checkpoint = tmp_path / "whole" / "checkpoints" / f"epoch=0-step={script.EVERY}.ckpt"
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["RunDataModule"]["batch"] == script.EVERY  # the run's position, in Lightning's own checkpoint
    _close(_train(tmp_path / "resumed", 2, checkpoint), whole, 1e-10)
    _close(_train(tmp_path / "resumed-alone", 1, checkpoint), whole, 1e-9)  # and under world size 1


@pytest.mark.parametrize(("devices", "accumulation"), [(2, 4), (1, 5)])
def test_a_checkpoint_resumes_exactly_under_another_accumulation(tmp_path: Path, devices: int, accumulation: int) -> None:
    """Saved at step 3 under accumulation 2 (6 micro-batches into the epoch), resumed under accumulation 4 at world
    size 2, or 5 alone: 6 is no multiple of either, so Lightning's own micro-batch count would step the optimizer
    inside a global batch; `RunDataModule` counts it in the new accumulation's micro-batches instead."""
    whole = _train(tmp_path / "whole", 2)
    checkpoint = tmp_path / "whole" / "checkpoints" / f"epoch=0-step={script.EVERY}.ckpt"
    saved = torch.load(checkpoint, weights_only=False)
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] == 2 * script.EVERY
    assert (2 * script.EVERY) % accumulation  # misaligned: not vacuous
    resumed = _train(tmp_path / "resumed", devices, checkpoint, accumulation)
    _close(resumed, whole, 1e-9)
    _close(resumed, _reference(), 1e-6)
    saved["RunDataModule"]["batch"] = 2  # the run's state edited: it no longer says what Lightning's count says
    torch.save(saved, tmp_path / "edited.ckpt")
    refused = _script(tmp_path / "edited", 1, tmp_path / "edited.ckpt", accumulation)
    assert refused.returncode != 0
    assert "StateError: Lightning restored 6 micro-batches of epoch 0 under accumulation 2" in refused.stderr


def _schedule_train(
    out: Path, devices: int, accumulation: int, checkpoint: Path | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from . import lightning_schedule_script as schedule

    out.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "GLOO_SOCKET_IFNAME": "lo"}
    command = [sys.executable, str(Path(schedule.__file__)), str(out), str(devices), str(accumulation)]
    command += [str(checkpoint)] if checkpoint else []
    done = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return torch.load(out / "params.pt"), json.loads((out / "steps.json").read_text())


@pytest.mark.slow
def test_schedule_epochs_of_different_lengths_are_lightnings_epochs_and_resume_mid_epoch_2(tmp_path: Path) -> None:
    """A schedule whose change falls inside epoch 1 of 3 (6, 8 and 10 steps), ``reload_dataloaders_every_n_epochs``
    left at 0: `RunDataModule` has Lightning re-read the loader's length each epoch, so every Lightning epoch steps
    `Run.batches_in` times and the parameters equal the one-process loop over the run's global batches; a checkpoint
    mid-epoch 2 resumes exactly at world size 2 and, under another accumulation, alone."""
    from . import lightning_schedule_script as schedule

    run = schedule.make_run()
    counts = [run.batches_in(e) for e in range(schedule.EPOCHS)]
    assert counts[0] < counts[1] < counts[2]  # Lightning's first length would cut epochs 1 and 2 short
    whole, steps = _schedule_train(tmp_path / "whole", 2, 2)
    ends = [(end["epoch"], end["global_step"], end["run"]) for end in steps["ends"]]
    assert ends == [(e, sum(counts[: e + 1]), [e + 1, 0]) for e in range(schedule.EPOCHS)]
    assert steps["global_step"] == run.steps_stop() == sum(counts)
    model = script.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for batch in schedule.make_run():  # the one-process loop over the same global batches
        import streambatch.torch as sbt

        inputs, targets = sbt.as_tensors(batch)
        (sbt.cross_entropy_sum(model, inputs, targets) / batch.token_count).backward()
        optimizer.step()
        optimizer.zero_grad()
    _close(whole, {k: v.detach() for k, v in model.state_dict().items()}, 1e-6)
    middle = run.step_of(2, 4)  # batch 4 of epoch 2
    checkpoint = tmp_path / "whole" / "checkpoints" / f"epoch=2-step={middle}.ckpt"
    assert torch.load(checkpoint, weights_only=False)["RunDataModule"]["epoch"] == 2
    resumed, again = _schedule_train(tmp_path / "resumed", 2, 2, checkpoint)
    _close(resumed, whole, 1e-10)
    assert (again["global_step"], again["ends"][-1]["run"]) == (sum(counts), [3, 0])
    alone, _ = _schedule_train(tmp_path / "resumed-alone", 1, 3, checkpoint)  # 8 micro-batches saved: no multiple of 3
    _close(alone, whole, 1e-9)


def test_a_schedule_refuses_a_reload_interval_that_keeps_an_epochs_length() -> None:
    """``reload_dataloaders_every_n_epochs=2`` would keep epoch 0's length through epoch 1: a `ConfigError` naming it,
    before setup changes anything; 0 becomes 1; a fixed batch size leaves it alone."""
    import lightning.pytorch as pl

    from streambatch.errors import ConfigError
    from streambatch.lightning import ElasticAccumulation, RunDataModule

    from . import lightning_schedule_script as schedule

    def trainer(every: int) -> pl.Trainer:
        return pl.Trainer(accelerator="cpu", devices=1, logger=False, reload_dataloaders_every_n_epochs=every)

    data, refused = RunDataModule(schedule.make_run()), trainer(2)
    data.trainer = refused
    before = list(refused.callbacks)
    with pytest.raises(ConfigError, match="reload_dataloaders_every_n_epochs=2 with a batch-size schedule"):
        data.setup("fit")
    assert (refused.callbacks, refused.reload_dataloaders_every_n_epochs) == (before, 2)
    for run, wanted in ((schedule.make_run(), 1), (script.make_run(), 0)):
        data, taken = RunDataModule(run), trainer(0)
        data.trainer = taken
        data.setup("fit")
        assert taken.reload_dataloaders_every_n_epochs == wanted
        assert sum(isinstance(c, ElasticAccumulation) for c in taken.callbacks) == 1
