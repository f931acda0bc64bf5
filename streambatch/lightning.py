"""Lightning integration: `RunDataModule`, a ``LightningDataModule`` over an `sb.Run` that resumes mid-epoch exactly.

The ``lightning`` extra.  ``train_dataloader`` is a `streambatch.torch.RankLoader`
with the trainer's rank, world size and ``accumulate_grad_batches``: each global
batch is one optimizer step, split into that many micro-batches, each carrying
the step's ``global_token_count``.  Its ``state_dict`` is the run's state (one
global cursor), saved in every Lightning checkpoint; ``load_state_dict`` moves
the run (and a loader already built) there.  Lightning restores a datamodule
before it sets up the strategy, so the position holds even when
``trainer.estimated_stepping_batches`` made the loader early
(Lightning #20550), and under another world size or accumulation.

The loss, under ``strategy="ddp"``::

    def training_step(self, batch, batch_idx):
        loss_sum = sbt.cross_entropy_sum(self.model, batch.inputs, batch.targets)
        # Lightning divides a step's loss by accumulate_grad_batches: undo it, the count is already the step's
        return sbt.token_mean_loss(loss_sum, batch) * self.trainer.accumulate_grad_batches
"""

from __future__ import annotations

from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - exercised in a subprocess without lightning
    from .errors import missing_dependency

    raise missing_dependency("streambatch.lightning", err.name or "lightning", "lightning") from err

import torch

from ._checks import short_repr
from .errors import ConfigError
from .run import Run
from .torch.rank_loader import Output, RankLoader

__all__ = ["RunDataModule"]


class RunDataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` of *run*: ``train_dataloader`` is this rank's `RankLoader` (see the module docstring).

    *accumulation* defaults to the trainer's ``accumulate_grad_batches``;
    *output* to ``"tensors"`` (`streambatch.torch.TensorBatch`, which Lightning
    moves to the device).  ``state_dict`` is the run's state at the loader's
    cursor: load it into a run of the same corpus, configuration and seed.
    """

    def __init__(
        self,
        run: Run,
        *,
        num_workers: int = 0,
        prefetch: int = 2,
        accumulation: int | None = None,
        output: Output = "tensors",
        dtype: torch.dtype = torch.long,
    ) -> None:
        super().__init__()
        if not isinstance(run, Run):
            raise ConfigError(f"run={short_repr(run)} is not a streambatch.Run; build one with sb.Run(source, ...)")
        self.run = run
        self.options: dict[str, Any] = {"num_workers": num_workers, "prefetch": prefetch, "output": output, "dtype": dtype}
        self.accumulation = accumulation
        self.loader: RankLoader | None = None

    def train_dataloader(self) -> RankLoader:
        """This rank's micro-batches of the run from its position (built once; Lightning asks once per fit)."""
        trainer = self.trainer
        accumulation = self.accumulation if self.accumulation is not None else int(getattr(trainer, "accumulate_grad_batches", 1))
        rank, world = (0, 1) if trainer is None else (int(trainer.global_rank), int(trainer.world_size))
        if self.loader is None or (self.loader.rank, self.loader.world_size, self.loader.accumulation) != (
            rank,
            world,
            accumulation,
        ):
            self.loader = RankLoader(self.run, rank=rank, world_size=world, accumulation=accumulation, **self.options)
        return self.loader

    def state_dict(self) -> dict[str, Any]:
        """The run's state at the loader's cursor (the run's own position before a loader is built)."""
        return self.run.state_dict() if self.loader is None else self.loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Move the run, and a loader already built, to the state's position (a refused state changes nothing)."""
        if self.loader is None:
            self.run.load_state_dict(state_dict)
        else:
            self.loader.load_state_dict(state_dict)
