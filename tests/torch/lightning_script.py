"""test_lightning's training script: ``python tests/torch/lightning_script.py OUT DEVICES [CKPT [ACCUMULATION]]``.

A tiny float64 LM trained by Lightning (``strategy="ddp"`` on CPU with *DEVICES* processes, gloo) over a packed
`sb.Run` through `streambatch.lightning.RunDataModule`, with ``accumulate_grad_batches=2`` (or *ACCUMULATION*); a checkpoint every
`EVERY` optimizer steps (mid-epoch).  Given *CKPT* it resumes from it, after reading
``trainer.estimated_stepping_batches`` in ``configure_optimizers`` (Lightning #20550).  Rank 0 writes the final
parameters to ``OUT/params.pt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

import streambatch as sb
import streambatch.torch as sbt
from streambatch.lightning import RunDataModule

EVERY = 3
VOCAB = 41


def make_run(batch_size: int | str = 5, epochs: int = 1) -> sb.Run:
    """Packed rows of uneven real targets: 6 steps of 5 rows, the last one short (4 rows: one rank, one micro-batch
    empty); *batch_size* may be a schedule, over *epochs* epochs."""
    rng = np.random.default_rng(3)
    docs = [sb.Document(f"d{i}", "train", rng.integers(0, VOCAB, int(n))) for i, n in enumerate(rng.integers(2, 30, 20))]
    return sb.Run(docs, context_length=8, batch_size=batch_size, seed=7, epochs=epochs, pack=True)


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Tanh(), torch.nn.Linear(16, VOCAB)).double()


class TinyLM(pl.LightningModule):
    def __init__(self, read_estimate: bool = False) -> None:
        super().__init__()
        self.model = make_model()
        self.read_estimate = read_estimate

    def training_step(self, batch: sbt.TensorBatch, batch_idx: int) -> torch.Tensor:
        loss_sum = sbt.cross_entropy_sum(self.model, batch.inputs, batch.targets)
        return sbt.token_mean_loss(loss_sum, batch) * self.trainer.accumulate_grad_batches

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.read_estimate:  # Lightning #20550: the loader is made now, before the loop state is restored
            assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.model.parameters(), lr=0.5)


def main(out: Path, devices: int, checkpoint: str | None, accumulation: int = 2) -> None:
    saver = pl.callbacks.ModelCheckpoint(dirpath=out / "checkpoints", every_n_train_steps=EVERY, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=1,
        accumulate_grad_batches=accumulation, callbacks=[saver], logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(TinyLM(read_estimate=checkpoint is not None), datamodule=RunDataModule(make_run()), ckpt_path=checkpoint)
    if trainer.global_rank == 0:
        torch.save({k: v.detach().clone() for k, v in trainer.lightning_module.model.state_dict().items()}, out / "params.pt")
        (out / "steps.json").write_text(json.dumps({"global_step": trainer.global_step}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None, *map(int, sys.argv[4:5]))
