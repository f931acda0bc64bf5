"""`Trainer` and `SFTTrainer` over a streambatch run: one batch per optimizer step, the plan's count, no replay.

`StreamBatchMixin` goes in front of ``transformers.Trainer`` (or TRL's
``SFTTrainer``, or any subclass of ``Trainer``).  It changes nothing unless
``train_dataset=`` or ``eval_dataset=`` is an `sb.Run` or an `sb.Epoch`:

- **Steps.** One streambatch batch is one optimizer step.  Each rank takes its
  share of it by the share rule and ``gradient_accumulation_steps`` splits the
  share into micro-batches: `streambatch.torch.RankLoader`, whose background
  threads gather ahead (``dataloader_num_workers``, ``dataloader_prefetch_factor``).
  The loader is handed to the Trainer as is: it never goes through ``accelerator.prepare``, so
  Accelerate neither re-shards nor dispatches it (no ``DataLoaderShard``, no
  ``BatchSamplerShard``, ``even_batches`` and ``split_batches`` do not apply).
- **The count.** ``num_items_in_batch`` is the step's ``global_token_count``
  from the plan, read off the step's first micro-batch: the Trainer's own
  ``get_batch_samples`` (which prefetches the whole accumulation window and
  all-gathers a label count) is replaced; the window's other micro-batches are
  built only as the loop reaches them.  HF's loss divides each micro-batch's
  summed loss by it and multiplies by the world size
  (``average_tokens_across_devices``); DDP's average over ranks then leaves
  exactly the one-process token mean.  A step with no counted target passes 1
  (its loss sum is 0): a loss of 0 and zero gradients.
- **Checkpoints.** Every checkpoint folder gets ``streambatch_state.json`` (the
  run's position after the step, written before HF's own files), and
  ``train(resume_from_checkpoint=...)`` starts the run there: HF's batch skipping
  is answered with the loader as it stands, so nothing is replayed, under any
  world size, accumulation or worker count.
- **Epochs.** HF plans every epoch from the one loader length it reads; here
  each HF epoch steps the run's own count (``run.batches_in(e)``: a batch-size
  schedule's epochs differ), ``max_steps`` is the steps of the first
  ``num_train_epochs`` epochs (capped at the run's end), or given ``max_steps``,
  ``num_train_epochs`` the epochs it reaches, and a resume starts HF's epoch
  and step count at the run's position.
- **Eval.** ``evaluate`` over an `sb.Epoch` (or a run's epoch 0) is the exact
  token mean: every rank sums its share's loss, the sums are added across ranks
  once, and divided by the epoch's counted targets (known from the plan).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import transformers

from .._checks import short_repr
from ..epoch import Epoch
from ..errors import ConfigError, StateError
from ..io.atomic import atomic_text
from ..run import Run
from ..stages.chunk import largest_batch, part_share
from ..torch.rank_loader import RankLoader
from .collate import hf_batch

STATE_FILE = "streambatch_state.json"
"""The file beside HF's in every checkpoint folder: the run's state after the checkpoint's step."""

HF_DEFAULT_BATCH_SIZE = 8  # TrainingArguments' default per_device_train_batch_size: read as "not set"


def _ours(dataset: Any) -> bool:
    return isinstance(dataset, (Run, Epoch))


def as_run(dataset: Run | Epoch) -> Run:
    """A run over *dataset*: the run itself, or the endless run whose epoch 0 is the epoch (HF's epochs decide)."""
    return dataset if isinstance(dataset, Run) else Run.from_epoch(dataset, epochs=None)


def as_epoch(dataset: Run | Epoch) -> Epoch:
    """The epoch an evaluation covers: the epoch itself, or a run's epoch 0."""
    return dataset if isinstance(dataset, Epoch) else dataset.epoch(0)


def micro_batch_rows(batch_size: int, world_size: int, accumulation: int) -> int:
    """The most rows of one rank's micro-batch, ``ceil(ceil(B / world_size) / accumulation)``: the share rule's
    first part of rank 0 (the first ranks and parts take the extra rows)."""
    lo, hi = part_share(batch_size, 0, world_size, 0, accumulation)
    return hi - lo


class StepWindow:
    """One optimizer step's micro-batches, as HF's loop asks for them: the first is already here (it carries the
    count), each other one is taken from the loader only when the loop reaches it."""

    def __init__(self, first: dict[str, Any], rest: Iterator[Any], size: int, place: tuple[int, int]) -> None:
        self._first, self._rest, self._size, self._place = first, rest, size, place

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        yield self._first
        for _ in range(self._size - 1):
            batch = next(self._rest)
            if (batch.epoch, batch.index) != self._place:
                raise ConfigError(
                    f"micro-batch of (epoch {batch.epoch}, batch {batch.index}) inside the step of "
                    f"(epoch {self._place[0]}, batch {self._place[1]}); the loader must yield gradient_accumulation_steps "
                    "micro-batches per step"
                )
            yield hf_batch(batch)


if TYPE_CHECKING:  # the mixin is only ever put in front of a transformers.Trainer
    _TrainerBase = transformers.Trainer
else:
    _TrainerBase = object


class EpochLoader:
    """A `RankLoader` as HF's Trainer reads a DataLoader: ``len`` is a whole epoch's micro-batches (HF reads it once
    to plan its epochs and steps, also when resuming mid-epoch: under a batch-size schedule whose epochs differ,
    that of the epoch the loader is in); each pass is the rest of the current epoch."""

    def __init__(self, loader: RankLoader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


class StreamBatchMixin(_TrainerBase):
    """Put in front of ``transformers.Trainer`` (or a subclass): `sb.Run` / `sb.Epoch` datasets (see the module)."""

    _sb_train: Run | None = None
    _sb_loader: RankLoader | None = None
    _sb_resume: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init = super().__init__  # the next class's: Trainer, SFTTrainer, or another subclass
        bound = inspect.signature(init).bind_partial(*args, **kwargs)
        train, evaluation = bound.arguments.get("train_dataset"), bound.arguments.get("eval_dataset")
        if _ours(train):
            bound.arguments["train_dataset"] = self._stand_in()
        if _ours(evaluation):
            bound.arguments["eval_dataset"] = self._stand_in()
        init(*bound.args, **bound.kwargs)
        if isinstance(train, (Run, Epoch)):
            self._sb_train = as_run(train)
            setattr(self, "train_dataset", self._sb_train)  # what the user passed, for anyone who reads it  # noqa: B010
            self._check_training()
        if isinstance(evaluation, (Run, Epoch)):
            setattr(self, "eval_dataset", evaluation)  # noqa: B010

    # -- what the base class must be handed instead of a run ----------------------------
    @classmethod
    def _stand_in(cls) -> Any:
        """A one-row dataset the base class's constructor accepts in place of a run (never read)."""
        return _StandIn()

    def _check_training(self) -> None:
        run, args = self._sb_train, self.args
        assert run is not None
        accumulation, world = int(args.gradient_accumulation_steps), int(args.world_size)
        rows = micro_batch_rows(largest_batch(run.batch_size), world, accumulation)  # a schedule: its widest phase
        given = int(args.per_device_train_batch_size)
        if given not in (rows, HF_DEFAULT_BATCH_SIZE):
            raise ConfigError(
                f"per_device_train_batch_size={given} disagrees with the run: batch_size={run.batch_size} over "
                f"world_size={world} in gradient_accumulation_steps={accumulation} gives micro-batches of at most {rows} "
                f"rows; pass per_device_train_batch_size={rows} or leave it at HF's default ({HF_DEFAULT_BATCH_SIZE})"
            )
        if args.auto_find_batch_size:
            raise ConfigError("auto_find_batch_size=True with a streambatch run: the plan fixes the batch; pass False")
        if not args.average_tokens_across_devices:
            raise ConfigError(
                "average_tokens_across_devices=False with a streambatch run: streambatch.hf divides every rank's loss "
                "sum by the step's global count (from the plan, no gather) and HF's DDP average needs the world-size "
                "factor that setting applies; leave it True"
            )
        if int(args.n_gpu) > 1:
            raise ConfigError(f"n_gpu={args.n_gpu} (nn.DataParallel) with a streambatch run; launch one process per GPU")
        if not (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            raise ConfigError(
                "the model's forward takes no loss kwargs (num_items_in_batch), so HF would average each micro-batch "
                "on its own; pass compute_loss_func= or a model whose forward accepts **kwargs"
            )
        self._train_batch_size = rows

    # -- training -------------------------------------------------------------------------
    def _inner_training_loop(self, *args: Any, **kwargs: Any) -> Any:
        self._sb_resume = kwargs.get("resume_from_checkpoint")
        self._sb_loader = None
        return super()._inner_training_loop(*args, **kwargs)

    def get_train_dataloader(self) -> Any:
        run = self._sb_train
        if run is None:
            return super().get_train_dataloader()
        args = self.args
        loader = RankLoader(
            run, rank=int(args.process_index), world_size=int(args.world_size),
            num_workers=int(args.dataloader_num_workers), prefetch=int(args.dataloader_prefetch_factor or 2),
            accumulation=int(args.gradient_accumulation_steps), output="tensors",
        )  # fmt: skip
        if self._sb_resume is not None:
            loader.load_state_dict(read_state(self._sb_resume))
        self._sb_loader = loader
        return EpochLoader(loader)

    def set_initial_training_values(self, args: Any, dataloader: Any) -> tuple[Any, ...]:
        """HF's numbers from one epoch's length, made the run's: ``max_steps`` is the steps of the first
        ``num_train_epochs`` epochs (each its own count, capped by the run's end), or ``num_train_epochs`` the
        epochs ``max_steps`` reaches."""
        values = super().set_initial_training_values(args, dataloader)
        run = self._sb_train
        if run is None:
            return values
        epochs, per_epoch, examples, samples, total, steps_in_epoch, max_steps = values
        if int(args.max_steps) > 0:
            epochs = run.position_of(max(min(max_steps, run.steps_stop()) - 1, 0))[0] + 1
        else:
            wanted = float(args.num_train_epochs)
            whole = math.floor(wanted)
            within = math.ceil((wanted - whole) * run.batches_in(whole))
            max_steps = max(min(run.step_of(whole, within), run.steps_stop()), 1)
            epochs = math.ceil(wanted) if run.epochs is None else min(math.ceil(wanted), run.epochs)
        return epochs, per_epoch, examples, samples, total, steps_in_epoch, max_steps

    def _init_training_state(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        trained: tuple[int, int] = super()._init_training_state(*args, **kwargs)
        loader = self._sb_loader
        if self._sb_train is None or loader is None or self._sb_resume is None:
            return trained
        epoch, batch = loader.run.position_of(loader.step)  # HF's global_step // its one epoch length is not it
        return epoch, batch * int(self.args.gradient_accumulation_steps)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        run = self._sb_train
        if run is not None:  # each epoch its own length (a batch-size schedule's epochs differ), not the first's
            steps = run.batches_in(int(kwargs["epoch"]))
            kwargs["num_update_steps_per_epoch"] = steps
            kwargs["steps_in_epoch"] = steps * int(self.args.gradient_accumulation_steps)
        return super()._run_epoch(*args, **kwargs)  # type: ignore[no-untyped-call]

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        if self._sb_train is None:
            return super().get_resumed_dataloader(dataloader, num_batches)
        return dataloader  # the run is already at the checkpoint's next step: nothing to skip, nothing replayed

    def get_batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int, device: Any) -> tuple[Any, Any]:
        if self._sb_train is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        first = next(epoch_iterator, None)
        if first is None:  # the run (or its epoch) has no step left
            return [], None
        place = (int(first.epoch), int(first.index))
        window = StepWindow(hf_batch(first), epoch_iterator, num_batches, place)
        return window, max(int(first.global_token_count), 1)  # a step that counts nothing: its loss sum is 0

    # -- checkpoints ----------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if self._sb_train is not None and self._sb_loader is not None and self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial),
                f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{self.state.global_step}",
            )
            write_state(folder, self._sb_loader.state_dict())  # the step after the one just done, on every rank
        super()._save_checkpoint(model, trial)

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        target: Any = self.eval_dataset if eval_dataset is None else eval_dataset
        if not isinstance(target, (Run, Epoch)):
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        start = time.time()
        args = self.args
        epoch = as_epoch(target)
        shares = epoch.batches(rank=int(args.process_index), world_size=int(args.world_size))
        loss_sum, count = token_loss_sum(self.model, shares, args.device)
        metrics = {
            f"{metric_key_prefix}_loss": loss_sum / count if count else 0.0,
            f"{metric_key_prefix}_tokens": float(count),
            f"{metric_key_prefix}_runtime": round(time.time() - start, 4),
        }
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(args, self.state, self.control, metrics)
        return metrics


def token_loss_sum(model: Any, shares: Iterable[Any], device: Any) -> tuple[float, int]:
    """``(loss sum over every rank, counted targets of every batch)``: each rank's loss sum over its *shares*, added
    across ranks in one float64 all-reduce; the count is the plan's (``global_token_count``), no collective."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    with torch.no_grad():
        for share in shares:
            count += int(share.global_token_count)
            if share.width == 0 or share.token_count == 0:
                continue
            inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in hf_batch(share).items()}
            total += model(**inputs, num_items_in_batch=1).loss.to(torch.float64)  # the summed loss
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total)
    model.train(was_training)
    return float(total), count


def write_state(folder: str, state: dict[str, Any]) -> None:
    """Write *state* to *folder*'s `STATE_FILE` atomically (the folder is made if needed)."""
    os.makedirs(folder, exist_ok=True)
    with atomic_text(os.path.join(folder, STATE_FILE)) as handle:
        json.dump(state, handle, sort_keys=True)


def read_state(folder: str) -> Any:
    """The run state saved in checkpoint *folder*; `StateError` when it holds none."""
    path = os.path.join(folder, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise StateError(
            f"checkpoint {short_repr(folder)} holds no {STATE_FILE}: it was not saved by streambatch.hf's Trainer; "
            "resume from a checkpoint it saved, or train from the start"
        ) from None
    except (OSError, ValueError) as err:
        raise StateError(f"{path}: cannot read the run state ({err}); resume from another checkpoint") from None


class _StandIn(torch.utils.data.Dataset[Any]):
    """What ``transformers.Trainer.__init__`` sees in place of a run: one row, never read."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> Any:
        raise ConfigError("streambatch.hf: the stand-in dataset was read; this Trainer feeds the run's own loader")


class Trainer(StreamBatchMixin, transformers.Trainer):
    """``transformers.Trainer`` whose ``train_dataset`` / ``eval_dataset`` may be an `sb.Run` or `sb.Epoch`."""
