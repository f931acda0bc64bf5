"""`streambatch.hf.Trainer` over a three-epoch run whose batch-size schedule changes inside epoch 1 (world size 1).

The epochs hold 6, 8 and 9 steps (`Run.batches_in`), while HF plans every epoch from the one length it reads:
the Trainer's ``max_steps`` is the run's 23 steps, each HF epoch steps its own count (HF's epoch ends where the
run's does), the parameters equal the one-process loop over the same global batches, ``max_steps`` inside epoch 2
stops there with HF's fractional epoch right, and a checkpoint mid-epoch 2 resumes exactly, also under another
accumulation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (the transformers extra)")

import streambatch as sb
import streambatch.hf as sbh

from .common import moved_error, one_process, sft_documents, tiny_llama, training_args

SCHEDULE = "0:6 200:4"  # 36 four-token windows an epoch: 200 tokens fall in epoch 1


def make_run() -> sb.Run:
    return sb.Run(sft_documents(), context_length=4, batch_size=SCHEDULE, seed=3, epochs=3)


def recorder() -> tuple[Any, list[tuple[int, float]]]:
    """A callback, and the ``(global_step, epoch)`` HF's state holds at each epoch's end."""
    from transformers import TrainerCallback

    ends: list[tuple[int, float]] = []

    class EpochEnds(TrainerCallback):
        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append((state.global_step, state.epoch))

    return EpochEnds(), ends


def train(out: Path, accumulation: int, resume: Path | None = None, **extra: Any) -> tuple[Any, list[tuple[int, float]]]:
    callback, ends = recorder()
    args = training_args(str(out), accumulation, num_train_epochs=3, save_strategy="steps", save_steps=1, **extra)
    trainer = sbh.Trainer(model=tiny_llama(), args=args, train_dataset=make_run(), callbacks=[callback])
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return trainer, ends


def params(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_schedule_epochs_of_different_lengths_step_their_own_counts_and_resume_mid_epoch_2(tmp_path: Path) -> None:
    run = make_run()
    counts = [run.batches_in(e) for e in range(3)]
    assert counts[0] < counts[1] < counts[2]  # HF's one length would cut epochs 1 and 2 short
    trainer, ends = train(tmp_path / "whole", 2)
    assert trainer.state.max_steps == run.steps_stop() == sum(counts)
    assert ends == [(sum(counts[: e + 1]), e + 1.0) for e in range(3)]  # HF's epochs end where the run's do
    whole = params(trainer)
    reference = one_process(make_run())  # every global batch of the three epochs, over its counted targets
    assert moved_error(whole, reference) < 1e-6
    assert moved_error(whole, one_process(make_run(), denominator=lambda b: b.token_count + 1)) > 1e-6  # not vacuous

    middle = run.step_of(2, 4)
    checkpoint = tmp_path / "whole" / f"checkpoint-{middle}"
    assert json.loads((checkpoint / sbh.STATE_FILE).read_text())["epoch"] == 2
    for accumulation in (2, 3):  # saved under 2: 8 micro-batches into epoch 2, no multiple of 3
        resumed, again = train(tmp_path / f"resumed-{accumulation}", accumulation, checkpoint)
        assert again == [(sum(counts), 3.0)]
        assert resumed.state.global_step == sum(counts)
        assert moved_error(params(resumed), whole) < 1e-9

    stopped, ends = train(tmp_path / "stopped", 1, max_steps=middle)  # max_steps inside epoch 2
    assert stopped.state.global_step == middle
    assert ends[:2] == [(counts[0], 1.0), (counts[0] + counts[1], 2.0)]
    assert ends[2] == (middle, pytest.approx(2 + 4 / counts[2]))
    assert moved_error(params(stopped), one_process(make_run().iter_steps(0, middle))) < 1e-6
