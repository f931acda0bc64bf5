"""A run: a schedule of epochs, and its position as the whole checkpoint.

``Run(store, context_length=T, batch_size=B, seed=k)`` yields every batch of
epoch 0 (``Epoch(store, ..., seed=k)``: for k = 7 on the chapter's corpus, the
chapter's order), then of epoch 1 (seed ``derive_seed(k, 1)``), and so on;
``epochs=None`` runs for ever, ``epochs=n`` stops after n epochs.  Every epoch
covers every window exactly once, and each batch knows its place
``(batch.epoch, batch.index)``.  The run holds one `Windows` enumeration and the
plan of one epoch at a time.

The position (the epoch and the batches consumed in it) is the checkpoint:
`Run.state_dict` returns it with the configuration and the corpus fingerprint as
a small, versioned, JSON-serializable dict, and `Run.load_state_dict` goes
straight to the next batch (batches are indexable; nothing is replayed).  The
global order depends on the corpus, the configuration and the seed alone, never
on DataLoader workers or data-parallel ranks.

A batch counts as consumed as soon as the run hands it out; save the state once
you are done with a batch.  After a resume, a batch that was handed out but not
covered by the last saved state (the batch in flight) is handed out again:
at-least-once for that batch, exactly once for every other.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from ._checks import check_non_negative, check_positive, is_integer, short_repr
from .batch.minibatch import MiniBatch
from .config import EpochConfig
from .epoch import Epoch
from .errors import ConfigError, OutOfRangeError, StateError
from .items.protocol import EpochItems
from .items.windows.window_index import WindowConfig
from .model.contract import contract_key, contract_of
from .model.documents import Partition
from .model.source import TokenSource
from .order.splitmix import derive_seed
from .stages.chunk import BatchSize
from .stages.materialize import Batches
from .stages.schedule import BatchSchedule, BatchSizeArg, RunSteps, state_batch_size
from .state import RUN_KEYS, check_index, check_position, check_same, decode, encode

STATE_KEYS = RUN_KEYS  # the keys of Run.state_dict(), in order
_ENDLESS = 1 << 62  # the stop of an endless run's step numbers


class Run:
    """Epoch after epoch of one partition of a corpus; the position is the checkpoint.

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]),
    ...         sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> run = sb.Run(docs, context_length=2, batch_size=3, seed=7, epochs=2)
    >>> [(b.epoch, b.index, b.width) for b in run]
    [(0, 0, 3), (0, 1, 2), (1, 0, 3), (1, 1, 2)]

    Resume from a saved position (e.g. ``json.dump``-ed after each batch):

    >>> run = sb.Run(docs, context_length=2, batch_size=3, seed=7, epochs=2)
    >>> first = next(iter(run))
    >>> state = run.state_dict()
    >>> state["epoch"], state["batch"]
    (0, 1)
    >>> again = sb.Run(docs, context_length=2, batch_size=3, seed=7, epochs=2)
    >>> again.load_state_dict(state)
    >>> [(b.epoch, b.index) for b in again]
    [(0, 1), (1, 0), (1, 1)]
    """

    def __init__(
        self,
        source: object = None,
        *,
        context_length: int | None = None,
        batch_size: BatchSizeArg,
        stride: int | None = None,
        seed: int | None,
        partition: Partition | str | None = None,
        keep_partition: bool = False,
        epochs: int | None = None,
        plan_dir: str | os.PathLike[str] | None = None,
        verify_plan: bool = False,
        pack: bool = False,
        skip_untrained: bool = False,
    ) -> None:
        config = EpochConfig(
            batch_size, seed, context_length, stride, partition, keep_partition, plan_dir, verify_plan, pack, skip_untrained
        )
        first = Epoch.from_config(source, config)
        self._start(first, epochs)

    def _start(self, first: Epoch, epochs: int | None) -> None:
        self._epochs = (
            None if epochs is None else check_non_negative(epochs, "epochs", "the number of epochs, or None for an endless run")
        )
        self._seed = first.seed
        self._current: tuple[int, Epoch] = (0, first)
        self._steps = RunSteps(first.batch_size, first.item_count)  # the steps of every epoch, in O(phases)
        self._position = (0, 0)
        self._fingerprint: str | None = None
        self._closed = False

    @classmethod
    def from_epoch(cls, epoch: Epoch, *, epochs: int | None = None) -> Run:
        """The run whose epoch 0 is *epoch* (its seed is the run seed); a plan *epoch* already holds is reused."""
        if not isinstance(epoch, Epoch):
            raise ConfigError(f"epoch={short_repr(epoch)} is not a streambatch.Epoch; build one with sb.Epoch(source, ...)")
        run = cls.__new__(cls)
        run._start(epoch, epochs)  # the same epoch: keep the plan it already holds
        return run

    # -- what the run is ---------------------------------------------------------------
    @property
    def seed(self) -> int | None:
        """The run seed (epoch *e* is shuffled with ``derive_seed(seed, e)``); None: document order every epoch."""
        return self._seed

    @property
    def epochs(self) -> int | None:
        """Epochs in the schedule; None for an endless run."""
        return self._epochs

    @property
    def _filtered(self) -> bool:
        """Whether the run's items are those ``skip_untrained`` kept (a state records it)."""
        return self._current[1].items.untrained is not None

    @property
    def config(self) -> WindowConfig:
        """Context length and stride."""
        return self._current[1].config

    @property
    def batch_size(self) -> BatchSize:
        """``B``: windows per batch (the last batch of each epoch may be smaller)."""
        return self._current[1].batch_size

    @property
    def partition(self) -> Partition:
        """The partition every epoch covers."""
        return self._current[1].partition

    @property
    def store(self) -> TokenSource:
        """The corpus (a store, or a sharded `streambatch.Corpus`)."""
        return self._current[1].store

    @property
    def pack(self) -> bool:
        """True in the packed mode (``pack=True``, or `Rows` as the source): the items are packed rows."""
        return self._current[1].pack

    @property
    def items(self) -> EpochItems:
        """Every window (packed: every row; a mixture's items) of the run, in document order (each epoch shuffles
        these)."""
        return self._current[1].items

    @property
    def windows(self) -> EpochItems:
        """Deprecated name of `items` (kept for one release)."""
        warnings.warn("Run.windows is deprecated; use Run.items", DeprecationWarning, stacklevel=2)
        return self.items

    @property
    def item_count(self) -> int:
        """Items per epoch: windows, packed rows, or a mixture's items."""
        return self._current[1].item_count

    @property
    def window_count(self) -> int:
        """Windows per epoch (a packed run's items are rows: `item_count`)."""
        return self._current[1].window_count

    @property
    def batches_per_epoch(self) -> int:
        """``ceil(item_count / batch_size)``, the same for every epoch under a fixed size.  Under a batch-size
        schedule the epochs a threshold falls in differ: this is then the batches of the epoch at the position
        (`batches_in` gives any epoch's)."""
        return self._steps.count(self._position[0])

    def batches_in(self, epoch: int) -> int:
        """Batches of epoch *epoch*: `batches_per_epoch`, or under a schedule that epoch's own count (its
        thresholds count the items of the earlier epochs too, as Megatron's count from the start of training)."""
        return self._steps.count(check_non_negative(epoch, "epoch", "the epoch number (0 for the first)"))

    @property
    def fingerprint(self) -> str:
        """The corpus fingerprint recorded in every state: a store's own, else its content fingerprint (computed once)."""
        if self._fingerprint is None:  # a mixture's: every source's, the weights, the length
            self._fingerprint = self.items.fingerprint
        return self._fingerprint

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, batch)`` of the next batch: the epoch and the batches consumed in it."""
        return self._position

    @property
    def remaining(self) -> int | None:
        """Batches left in the schedule from the position; None for an endless run."""
        if self._epochs is None:
            return None
        return max(self.steps_stop() - self.step_of(*self._position), 0)

    # -- epochs and batches, by random access ------------------------------------------
    def epoch(self, number: int) -> Epoch:
        """Epoch *number*: the run's windows in the order of ``derive_seed(seed, number)``.

        Only the plan of the epoch asked for last is kept; asking for another epoch
        replaces it (each plan is computed once per switch).
        """
        wanted = check_non_negative(number, "epoch", "the epoch number (0 for the first)")
        held, epoch = self._current
        if wanted != held:
            seed = None if self._seed is None else derive_seed(self._seed, wanted)
            epoch = epoch.reseeded(seed, consumed=self._steps.consumed_before(wanted))  # a schedule goes on
            self._current = (wanted, epoch)
        return epoch

    def batch(self, epoch: int, index: int, *, rank: int = 0, world_size: int = 1) -> MiniBatch:
        """Batch *index* of epoch *epoch* (this *rank*'s rows of it with *world_size* > 1)."""
        chosen = self.epoch(epoch)
        return chosen.batches(rank=rank, world_size=world_size)[check_index(index, chosen.batch_count)].in_epoch(int(epoch))

    def step_of(self, epoch: int, batch: int) -> int:
        """The global batch number of ``(epoch, batch)``: ``epoch * batches_per_epoch + batch`` (under a schedule,
        the batches of the earlier epochs, each its own, plus *batch*)."""
        return self._steps.first(epoch) + batch

    def position_of(self, step: int) -> tuple[int, int]:
        """``(epoch, batch)`` of global batch number *step*."""
        return self._steps.position(check_non_negative(step, "step", "a global batch number"))

    def iter_steps(
        self, start: int = 0, stop: int | None = None, step: int = 1, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[MiniBatch]:
        """Batches of global numbers ``start, start + step, ...`` below *stop* and the schedule's end.

        Does not move the run's position: this is how DataLoader workers take their
        strided shares (`streambatch.torch.RunDataset`).

        >>> import streambatch as sb
        >>> run = sb.Run([sb.Document("a", "train", range(6))], context_length=1, batch_size=2, seed=3, epochs=3)
        >>> [(b.epoch, b.index) for b in run.iter_steps(1, step=2)]
        [(0, 1), (1, 0), (1, 2), (2, 1)]
        """
        first = check_non_negative(start, "start", "the first global batch number")
        end = None if stop is None else check_non_negative(stop, "stop", "the global batch number to stop before")
        stride = check_positive(step, "step", "the distance between yielded batches")
        self.epoch(self.position_of(first)[0]).batches(rank=rank, world_size=world_size)  # checks rank, world_size now
        return self.batches_at(range(first, self.steps_stop(end), stride), rank=rank, world_size=world_size)

    def steps_stop(self, stop: int | None = None) -> int:
        """The global batch number iteration stops before: *stop*, capped by the schedule (an endless run: 2**62)."""
        end = _ENDLESS if stop is None else stop
        return end if self._epochs is None else min(end, self._steps.first(self._epochs))

    def batches_at(self, steps: Iterable[int], *, rank: int = 0, world_size: int = 1) -> Iterator[MiniBatch]:
        """The batches of global batch numbers *steps* (increasing), this *rank*'s rows of each; the position stays.

        Workers take their shares of a run as ``share(range(start, stop), worker=k, workers=W)`` of these numbers.
        """
        self.epoch(self._position[0]).batches(rank=rank, world_size=world_size)  # checks rank, world_size now
        return self._batches_at(steps, rank, world_size)

    def _batches_at(self, steps: Iterable[int], rank: int, world_size: int) -> Iterator[MiniBatch]:
        """A range of steps goes to the fast road epoch by epoch (`Batches.road`: block positions, the next batch's
        hint, a remote store's prefetch along the step); other steps are indexed one by one."""
        self._check_open()
        if not self._steps.items:
            return
        if not isinstance(steps, range):
            held: tuple[int, Batches] | None = None
            for at in steps:
                epoch, index = self._steps.position(at)
                if held is None or held[0] != epoch:
                    held = (epoch, self.epoch(epoch).batches(rank=rank, world_size=world_size))
                yield held[1][index].in_epoch(epoch)
            return
        for epoch, local in self._steps.epoch_ranges(steps):
            for batch in self.epoch(epoch).batches(rank=rank, world_size=world_size).road(local):
                batch.epoch = epoch  # made for this call alone: placed in its epoch as it is (no copy)
                yield batch

    # -- consuming: the position moves as batches are handed out -----------------------
    def iter_batches(self, *, rank: int = 0, world_size: int = 1) -> Iterator[MiniBatch]:
        """Hand out batches from the position on, moving it past each one as it is handed out.

        With *world_size* > 1 each batch holds only this *rank*'s rows of the global
        batch (`streambatch.split_rows`); every rank steps through the same batches.
        """
        self.epoch(self._position[0]).batches(rank=rank, world_size=world_size)  # checks rank, world_size now
        return self._consume(rank, world_size)

    def _consume(self, rank: int, world_size: int) -> Iterator[MiniBatch]:
        """From the position on, an epoch at a time through the fast road; a position moved meanwhile
        (`set_position`, `load_state_dict`) starts the road again there."""
        self._check_open()
        while self._steps.items:
            epoch, index = self._position
            if self._epochs is not None and epoch >= self._epochs:
                return
            road = self.epoch(epoch).batches(rank=rank, world_size=world_size).road(range(index, self.batches_in(epoch)))
            for batch in road:
                if self._position != (epoch, index):  # moved while the last batch was out: go on from there
                    break
                self._position = self._after(epoch, index)
                batch.epoch = epoch  # made for this call alone: placed in its epoch as it is (no copy)
                yield batch
                index += 1

    def __iter__(self) -> Iterator[MiniBatch]:
        return self.iter_batches()

    def _after(self, epoch: int, index: int) -> tuple[int, int]:
        return (epoch + 1, 0) if index + 1 >= self._steps.count(epoch) else (epoch, index + 1)

    def set_position(self, epoch: int, batch: int) -> None:
        """Move to batch *batch* of epoch *epoch* (``batch == batches_per_epoch`` means the next epoch's start)."""
        self._position = self.check_position(epoch, batch)

    def check_position(
        self, epoch: Any, batch: Any, *, where: str = "", error: type[Exception] = OutOfRangeError
    ) -> tuple[int, int]:
        """``(epoch, batch)`` checked against that epoch's batches (`streambatch.state.check_position`), normalised:
        ``batch == batches_in(epoch)`` is ``(epoch + 1, 0)``."""
        return check_position(epoch, batch, self._count(epoch), where=where, error=error)

    def _count(self, epoch: Any) -> int:
        """Batches of *epoch* for a position check (an epoch that is not an int: check_position's own refusal)."""
        return self._steps.count(int(epoch)) if is_integer(epoch) and 0 <= int(epoch) < 1 << 48 else 0

    # -- the checkpoint: one codec, `streambatch.state` --------------------------------
    def state_dict(self, position: tuple[int, int] | None = None) -> dict[str, Any]:
        """The position (or *position*) as a small, versioned, JSON-serializable dict (see `load_state_dict`).

        Keys (`streambatch.state`, kind ``run``): ``format``, ``version``, ``kind``,
        ``seed``, ``epoch``, ``batch`` (batches consumed in that epoch),
        ``context_length``, ``stride``, ``batch_size``, ``partition`` and the corpus
        ``fingerprint``.
        """
        if position is None:
            epoch, batch = self._position
        else:
            epoch, batch = self.check_position(*position)
        return encode("run", epoch=epoch, batch=batch, **self._key(), **self._consumed(epoch, batch))

    def _consumed(self, epoch: int, batch: int) -> dict[str, int]:
        """``{"items": n}``, the items the run consumed before batch *batch* of *epoch* (over every epoch, as
        Megatron's consumed samples), for a batch-size schedule (whose widths vary); nothing for a fixed size
        (``batch * batch_size``), so those states stay as they were."""
        if not isinstance(self.batch_size, BatchSchedule):
            return {}
        return {"items": self._steps.items_before(epoch, batch)}

    def state_dict_after(self, batch: object) -> dict[str, Any]:
        """The state right after *batch* (anything with ``.epoch`` and ``.index``: a batch this run made).

        What every data-parallel rank can save once the global batch is done, whatever
        its worker count: the global position, the same on every rank.
        """
        epoch: Any = getattr(batch, "epoch", None)
        index: Any = getattr(batch, "index", None)
        count = self._count(epoch)
        if not is_integer(epoch) or int(epoch) < 0 or not is_integer(index) or not 0 <= int(index) < count:
            raise OutOfRangeError(
                f"batch={short_repr(batch)} (epoch={epoch!r}, index={index!r}) is not a batch of this run "
                f"({count} batches in that epoch); pass a batch the run (or its dataset) yielded"
            )
        return self.state_dict(self._after(int(epoch), int(index)))

    def state_after(self, batch: object) -> dict[str, Any]:
        """Deprecated name of `state_dict_after` (kept for one release)."""
        warnings.warn("Run.state_after is deprecated; use Run.state_dict_after", DeprecationWarning, stacklevel=2)
        return self.state_dict_after(batch)

    def _key(self) -> dict[str, Any]:
        key = {
            "seed": self._seed,
            "context_length": self.config.context_length,
            "stride": self.config.stride,
            "batch_size": state_batch_size(self.batch_size),
            "partition": self.partition.value,
            "fingerprint": self.fingerprint,
        }
        key = {**key, "mode": "pack"} if self.pack else key  # window states stay as they were
        key = {**key, "skip_untrained": True} if self._filtered else key  # so do unfiltered ones
        contracts = [contract_of(store.tokenizer) for store in self.items.stores]
        found = next((contract_key(c) for c in contracts if c is not None), "")
        return {**key, "contract": found} if found else key  # and those of stores without a data contract

    def check_state(self, state: object, where: str = "state") -> tuple[int, int]:
        """The position ``(epoch, batch)`` *state* records, after checking that it belongs to this run.

        Raises `StateError` naming the problem: not a dict, another format or
        version, missing or unknown keys, a malformed value, or a state of another
        corpus (fingerprint), partition, context length, stride, batch size or seed.
        """
        found = decode(state, "run", where)
        ours = {"mode": "pack" if self.pack else "window", "skip_untrained": self._filtered, **self._key()}
        check_same(found, ours, where)
        position = self.check_position(found["epoch"], found["batch"], where=f"{where} ", error=StateError)
        if self._epochs is not None and position > (self._epochs, 0):
            raise StateError(
                f"{where}: position (epoch {position[0]}, batch {position[1]}) is past the end of this run of "
                f"{self._epochs} epoch(s) ({self.steps_stop()} batches in all); pass a state this run saved, or a run "
                "with more epochs"
            )
        wanted = self._consumed(*position)
        if found.get("items") is not None and {"items": found["items"]} != wanted:
            raise StateError(
                f"{where} items={found['items']!r} but (epoch {found['epoch']}, batch {found['batch']}) of this run's "
                f"schedule follows {wanted.get('items', 'batch * batch_size')} items consumed since the run's start; "
                "pass a state_dict() of this run unchanged"
            )
        return position

    def load_state_dict(self, state: object) -> None:
        """Go straight to the position *state* records (`check_state` first: a refused state changes nothing)."""
        self._position = self.check_state(state)

    # -- closing ----------------------------------------------------------------------
    def close(self) -> None:
        """Close the run and the stores its epochs read (`Epoch.close`: a remote store's requests in flight are
        waited for); its batches are refused from now on.  Closing again does nothing."""
        self._closed = True
        self._current[1].close()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this run was closed (run.close()); build it again (sb.Run) and load its state to go on")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        epochs = "endless" if self._epochs is None else f"epochs={self._epochs}"
        order = "sequential" if self._seed is None else f"seed={self._seed}"
        epoch, batch = self._position
        return (
            f"Run(position=(epoch {epoch}, batch {batch}), {epochs}, "
            f"{'pack=True, rows' if self.pack else 'windows'}={self.item_count}, "
            f"batches_per_epoch={self.batches_per_epoch}, context_length={self.config.context_length}, "
            f"stride={self.config.stride}, "
            f"batch_size={self.batch_size}, {order}, partition={self.partition.value!r})"
        )
