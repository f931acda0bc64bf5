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
