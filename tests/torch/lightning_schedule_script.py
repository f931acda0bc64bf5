"""test_lightning's schedule run: ``python tests/torch/lightning_schedule_script.py OUT DEVICES ACCUMULATION [CKPT]``.

`lightning_script`'s tiny float64 LM over three epochs of `SCHEDULE` (5 rows a step, 3 from 340 tokens: the change
falls inside epoch 1, so the epochs hold 6, 8 and 10 steps), ``reload_dataloaders_every_n_epochs`` left at 0, a
checkpoint after every optimizer step.  Rank 0 writes the final parameters to ``OUT/params.pt`` and, per epoch that
ended, Lightning's ``global_step`` and the run's position to ``OUT/steps.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from streambatch.lightning import RunDataModule
from tests.torch import lightning_script as base  # the repository root is on PYTHONPATH (test_lightning sets it)

SCHEDULE = "0:5 340:3"
EPOCHS = 3


def make_run() -> Any:
    return base.make_run(SCHEDULE, EPOCHS)


class EpochEnds(pl.Callback):
    def __init__(self) -> None:
        self.ends: list[dict[str, Any]] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = trainer.datamodule.state_dict()  # type: ignore[attr-defined]
        run = [state["epoch"], state["batch"]]
        self.ends.append({"epoch": trainer.current_epoch, "global_step": trainer.global_step, "run": run})


def main(out: Path, devices: int, accumulation: int, checkpoint: str | None) -> None:
    saver = pl.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=1, save_top_k=-1)
    ends = EpochEnds()
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=EPOCHS,
        accumulate_grad_batches=accumulation, callbacks=[saver, ends], logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(base.TinyLM(read_estimate=checkpoint is not None), datamodule=RunDataModule(make_run()), ckpt_path=checkpoint)
    if trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in trainer.lightning_module.model.state_dict().items()}, out / "params.pt")
        (out / "steps.json").write_text(json.dumps({"global_step": trainer.global_step, "ends": ends.ends}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
