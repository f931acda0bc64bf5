"""Lightning integration: `RunDataModule`, a ``LightningDataModule`` over an `sb.Run` that resumes mid-epoch exactly.

The ``lightning`` extra.  ``train_dataloader`` is a `streambatch.torch.RankLoader`
with the trainer's rank, world size and ``accumulate_grad_batches``: each global
batch is one optimizer step, split into that many micro-batches, each carrying
the step's ``global_token_count``.  Its ``state_dict`` is the run's state (one
global cursor), saved in every Lightning checkpoint; ``load_state_dict`` moves
the run (and a loader already built) there.  Lightning restores a datamodule
before it sets up the strategy, so the position holds even when
``trainer.estimated_stepping_batches`` made the loader early
(Lightning #20550), and under another world size.

**Another accumulation on resume.**  Lightning restores its own count of the
epoch's micro-batches (``fit_loop.epoch_loop.batch_progress``) and steps the
optimizer when that count reaches a multiple of ``accumulate_grad_batches``: a
checkpoint after ``k`` steps under accumulation ``a`` holds ``k * a``, which
under another accumulation ``a'`` would step inside a global batch.
`ElasticAccumulation`, a ``Callback`` that `RunDataModule.setup` adds to the
trainer (once), rewrites that count on ``on_train_start`` (after Lightning
restored its loops, before the epoch loop reads them) as ``k * a'``, the
micro-batches the loader's position means under this fit's accumulation; the
optimizer steps, ``global_step`` and ``_batches_that_stepped`` count steps and
stay.  It touches Lightning internals: the ``ready``, ``started``,
``processed`` and ``completed`` counters of ``batch_progress.current`` and
``.total``, as Lightning 2.4 to 2.6 keep them (the ``lightning`` extra pins
``lightning>=2.4,<3``; tested on 2.6).

**Batch-size schedules.**  Under a schedule (``batch_size="0:768 250B:1536"``)
the run's epochs hold different numbers of steps (`Run.batches_in`), and
Lightning reads a loader's length, which ends its epoch, only when it loads the
loader: once per fit unless ``reload_dataloaders_every_n_epochs`` says more
often.  `RunDataModule.setup` sets that Trainer argument to 1 when it was left
at 0, so every epoch re-reads the loader (the same `RankLoader`, whose length
is the epoch it is in) and Lightning's epochs are the run's; another value is a
`ConfigError`.  ``trainer.estimated_stepping_batches`` still multiplies the
first epoch's length by ``max_epochs``: use ``run.steps_stop()`` for a
scheduler's total steps.

The loss, under ``strategy="ddp"``::

    def training_step(self, batch, batch_idx):
        loss_sum = sbt.cross_entropy_sum(self.model, batch.inputs, batch.targets)
        # Lightning divides a step's loss by accumulate_grad_batches: undo it, the count is already the step's
        return sbt.token_mean_loss(loss_sum, batch) * self.trainer.accumulate_grad_batches
"""

from __future__ import annotations

from typing import Any, cast

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - exercised in a subprocess without lightning
    from .errors import missing_dependency

    raise missing_dependency("streambatch.lightning", err.name or "lightning", "lightning") from err

import torch

from ._checks import short_repr
from .errors import ConfigError, StateError
from .run import Run
from .stages.schedule import BatchSchedule
from .torch.rank_loader import Output, RankLoader

__all__ = ["ElasticAccumulation", "RunDataModule"]

_COUNTERS = ("ready", "started", "processed", "completed")  # Lightning's _ProcessedTracker fields


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

    def setup(self, stage: str) -> None:
        """Add `ElasticAccumulation` to the trainer's callbacks (once), so a resume under another accumulation is exact;
        under a batch-size schedule, have Lightning re-read the loader's length every epoch (see the module)."""
        trainer = cast(Any, self.trainer)  # set by Lightning before it calls setup
        if trainer is None:
            return
        if isinstance(self.run.batch_size, BatchSchedule):  # epochs may hold different numbers of steps
            every = int(trainer.reload_dataloaders_every_n_epochs)
            if every > 1:
                raise ConfigError(
                    f"reload_dataloaders_every_n_epochs={every} with a batch-size schedule ({self.run.batch_size}): "
                    "its epochs hold different numbers of steps and Lightning keeps a loader's length until it "
                    "reloads it; pass reload_dataloaders_every_n_epochs=1 (or leave it at 0: RunDataModule sets 1)"
                )
            trainer.reload_dataloaders_every_n_epochs = 1  # the Trainer argument's own attribute
        if not any(isinstance(c, ElasticAccumulation) for c in trainer.callbacks):
            trainer.callbacks.append(ElasticAccumulation())

    def train_dataloader(self) -> RankLoader:
        """This rank's micro-batches of the run from its position (built once; Lightning asks once per fit, or per epoch)."""
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


class ElasticAccumulation(pl.Callback):
    """On ``on_train_start``: Lightning's restored micro-batch count of the epoch, in this fit's accumulation.

    A checkpoint ``k`` steps into an epoch holds ``k * a`` micro-batches (accumulation ``a`` when saved);
    the epoch loop steps the optimizer when its count reaches a multiple of ``accumulate_grad_batches``.  The
    count becomes ``k * a'`` for this fit's ``a'``, ``k`` read off the `RunDataModule`'s loader (its global
    cursor) and the trainer's epoch, so the optimizer steps on the same global batches as an uninterrupted run.
    Added by `RunDataModule.setup`; nothing to do on a fresh start or under the same accumulation.  Its state
    (saved in every checkpoint) is the accumulation, so a count that disagrees with the run's position is refused.
    """

    def __init__(self) -> None:
        self._accumulation: int | None = None  # this fit's, recorded in its checkpoints
        self._saved: int | None = None  # the accumulation a loaded checkpoint was saved under

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._accumulation = int(trainer.accumulate_grad_batches)

    def state_dict(self) -> dict[str, Any]:
        return {"accumulation": self._accumulation}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict.get("accumulation")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = cast(Any, trainer).datamodule  # an attribute Lightning sets
        loader = module.loader if isinstance(module, RunDataModule) else None
        progress = trainer.fit_loop.epoch_loop.batch_progress
        held = int(progress.current.ready)
        if loader is None or not held:
            return
        epoch = int(trainer.current_epoch)
        done = loader.step - loader.run.step_of(epoch, 0)  # the steps of this epoch the run's position says are done
        saved = self._saved
        if not 0 < done <= loader.run.batches_in(epoch) or (held != done * saved if saved else held % done):
            under = f" under accumulation {saved}" if saved else ""
            raise StateError(
                f"Lightning restored {held} micro-batches of epoch {epoch}{under} but the run's state is {done} steps "
                "into it; resume from a checkpoint whose RunDataModule state was saved with it, unedited"
            )
        shift = done * int(trainer.accumulate_grad_batches) - held
        for counts in (progress.current, progress.total):
            for name in _COUNTERS:
                setattr(counts, name, getattr(counts, name) + shift)
