"""DataLoader datasets: a run's or an epoch's batches, strided over workers, split over ranks, resumable.

Worker ``k`` of ``W`` takes global batches ``s + k, s + k + W, ...`` from the
start ``s`` (`streambatch.share`'s rule), so the DataLoader, which takes one
item from each worker in turn, yields the run's own order for any number of
workers.  Every state they save is a `streambatch.state`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .._checks import check_non_negative, short_repr
from ..batch.minibatch import MiniBatch
from ..epoch import Epoch
from ..errors import ConfigError, OutOfRangeError, StateError
from ..run import Run
from ..stages.materialize import Batches
from ..stages.share import share
from ..state import decode, encode
from ._shared import SharedPosition
from .tensors import TensorBatch, tensor_batch


class _RunShare(IterableDataset[TensorBatch]):
    """A stretch of a run's global batches, strided over DataLoader workers, split over ranks.

    DataLoader worker ``k`` of ``W`` yields global batches ``s + k, s + k + W, ...``
    from the start ``s``; the DataLoader takes one item from each worker in turn,
    so they arrive in the run's order for any number of workers.  The start lives
    in shared memory (`SharedPosition`), read at each iteration, so it reaches
    persistent workers too.  ``state_dict``/``load_state_dict`` give each worker's
    exact place (the global batch it yielded last) to torchdata's
    ``StatefulDataLoader``.
    """

    def __init__(
        self, run: Run, *, rank: int, world_size: int, dtype: torch.dtype | None, epoch: int, batch: int, pending: bool
    ) -> None:
        super().__init__()
        _check_dtype(dtype)
        first = run.epoch(epoch)
        first.batches(rank=rank, world_size=world_size)  # validates rank and world_size now
        first.shuffle_state_after  # noqa: B018 - plan now, in the parent process: forked workers share it
        run.fingerprint  # noqa: B018 - hash an in-memory corpus once, here, not in every worker
        self.run = run
        self.rank, self.world_size = rank, world_size
        self.dtype = dtype
        self._shared = SharedPosition(epoch, batch, pending)
        self._restored: tuple[int, int | None, int | None] | None = None
        self._origin: int | None = None
        self._stop: int | None = None
        self._share = (0, 1)
        self._last: int | None = None

    def _stop_for(self, epoch: int) -> int | None:
        """The global batch an iteration that starts in *epoch* stops before (None: the run's end)."""
        return None

    def set_position(self, epoch: int, batch: int) -> None:
        """Start the next iteration at batch *batch* of epoch *epoch* (reaches persistent workers too)."""
        number, start = self.run.check_position(epoch, batch)
        self._shared.set(number, start, True)
        self.run.epoch(number).shuffle_state_after  # noqa: B018 - plan in the parent process

    def resume_at(self, epoch: int, batch: int) -> None:
        """Start the next iteration at batch *batch* of *epoch* as given (``batch`` may be the epoch's batch count:
        the epoch consumed, an empty iteration of an `EpochDataset`); `streambatch.torch.loader` checked it."""
        self._shared.set(epoch, batch, True)
        self._restored = None
        self.run.epoch(epoch).shuffle_state_after  # noqa: B018 - plan in the parent process

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, batch)`` where the next iteration starts."""
        epoch, batch, _ = self._shared.get()
        return epoch, batch

    def __iter__(self) -> Iterator[TensorBatch]:
        worker, workers = _worker_share()
        if self._restored is not None:  # StatefulDataLoader.load_state_dict gave this worker its place
            origin, stop, last = self._restored
            self._restored = None
        else:
            epoch, batch, _ = self._shared.get()
            origin, stop, last = self.run.step_of(epoch, batch), self._stop_for(epoch), None
        self._shared.clear_pending()
        self._origin, self._stop, self._share, self._last = origin, stop, (worker, workers), last
        steps = _after(share(range(origin, self.run.steps_stop(stop)), worker=worker, workers=workers), last)
        batches = self.run.batches_at(steps, rank=self.rank, world_size=self.world_size)
        return self._tensors(steps, batches)

    def close(self) -> None:
        """Close the run and the stores it reads (`streambatch.Run.close`: a remote store's requests in flight are
        waited for); iterating again is refused.  Workers close theirs as they exit."""
        self.run.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tensors(self, steps: range, batches: Iterator[MiniBatch]) -> Iterator[TensorBatch]:
        dtype = self.dtype
        for step, batch in zip(steps, batches, strict=False):  # batches_at gives one batch per step, in order
            self._last = step  # before yielding: the state counts it
            yield tensor_batch(batch, dtype=dtype)

    def state_dict(self) -> dict[str, Any]:
        """This worker's exact place, for ``StatefulDataLoader``: a `streambatch.state` of kind ``worker``.

        ``run``: the run state at the iteration's start; ``stop``: where it ends
        (None: the run's end); ``worker``: ``[id, num_workers]``; ``last``: the
        global ``[epoch, batch]`` this worker yielded last (None: none yet).
        """
        if self._origin is None:
            epoch, batch, _ = self._shared.get()
            origin, stop = self.run.step_of(epoch, batch), self._stop_for(epoch)
        else:
            origin, stop = self._origin, self._stop
        position = self.run.position_of
        return encode(
            "worker",
            run=self.run.state_dict(position(origin)),
            stop=None if stop is None else list(position(stop)),
            worker=list(self._share),
            last=None if self._last is None else list(position(self._last)),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume this worker where `state_dict` left it (the next iteration continues after ``last``).

        Refuses (`StateError`) a state of another run, another worker or worker
        count, or a malformed one; a refused state changes nothing.
        """
        found = decode(state, "worker")
        origin = self.run.step_of(*self.run.check_state(found["run"]))
        share = _worker_share()
        if list(found["worker"]) != share:
            raise StateError(
                f"state worker={found['worker']!r} but this is worker {share} ([id, num_workers]); resume with the same "
                "num_workers, or load the state with streambatch.torch.StatefulDataLoader (any num_workers)"
            )
        stop, last = self._step(found["stop"], "stop"), self._step(found["last"], "last")
        if last is not None and (last < origin + share[0] or (last - origin - share[0]) % share[1]):
            raise StateError(
                f"state last={found['last']!r} is not a batch of worker {share}'s share; pass a state_dict() unchanged"
            )
        self._restored = (origin, stop, last)

    def _step(self, pair: Any, name: str) -> int | None:
        """The global batch number of a saved ``[epoch, batch]`` (None stays None), checked like any position."""
        if pair is None:
            return None
        position = self.run.check_position(pair[0], pair[1], where=f"state {name} ", error=StateError)
        return self.run.step_of(*position)


def _after(steps: range, last: int | None) -> range:
    """The rest of a worker's share *steps* after the batch it yielded *last* (all of it when None)."""
    return steps if last is None else steps[(last - steps.start) // steps.step + 1 :]


def _worker_share() -> list[int]:
    """``[id, num_workers]`` of the DataLoader worker running this code (``[0, 1]`` in the main process)."""
    info = get_worker_info()
    return [0, 1] if info is None else [info.id, info.num_workers]


def _check_dtype(dtype: Any) -> None:
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(
            f"dtype={dtype!r} is not a torch.dtype; pass e.g. torch.long, or None for the store's dtype (zero-copy)"
        )


class BatchesDataset(IterableDataset[TensorBatch]):
    """Any sized, indexable source of batches as an `IterableDataset`: a user's composed pipeline.

    ``sb.materialize(sb.split_rows(sb.chunk(sb.shuffle(sb.windows(store, ...), 7), B), rank, world))``
    is such a source (a lazy `Batches`), so is a list of `MiniBatch`.  Worker ``k``
    of ``W`` indexes batches ``s + k, s + k + W, ...`` from the start ``s``, so the
    DataLoader reads them back in order; ``state_dict``/``load_state_dict`` give
    ``StatefulDataLoader`` each worker's place.  `EpochDataset` of such a source is
    one of these.
    """

    def __init__(self, batches: Any, *, dtype: torch.dtype | None = torch.long, start_batch: int = 0) -> None:
        super().__init__()
        if not (hasattr(batches, "__len__") and hasattr(batches, "__getitem__")) or isinstance(batches, (str, bytes)):
            raise ConfigError(
                f"batches={short_repr(batches)} is not a sized, indexable source of batches; pass an sb.Epoch, "
                "sb.materialize(chunks) or a list of MiniBatch"
            )
        _check_dtype(dtype)
        self.batches = batches
        self.dtype = dtype
        self.start_batch = check_non_negative(start_batch, "start_batch", "the number of batches already consumed")
        if self.start_batch > len(batches):
            raise OutOfRangeError(f"start_batch={self.start_batch} is beyond the source's {len(batches)} batches")
        self._last: int | None = None
        self._restored: int | None = None
        self._begin: int | None = None  # set by resume_at: where the next iteration starts (the start_batch otherwise)
        self._began: int | None = None  # where the current iteration began
        self._share = (0, 1)
        self._closed = False

    def __len__(self) -> int:
        return len(self.batches) - self.start_batch

    def __iter__(self) -> Iterator[TensorBatch]:
        worker, workers = _worker_share()
        begin = self.start_batch if self._begin is None else self._begin
        steps = _after(share(range(begin, len(self.batches)), worker=worker, workers=workers), self._restored)
        self._restored, self._share, self._last, self._began = None, (worker, workers), None, begin
        return self._iter(steps)

    def resume_at(self, index: int) -> None:
        """Start the next iteration at batch *index* (what `streambatch.torch.loader` found in a loader state)."""
        self._begin, self._restored = index, None

    def _iter(self, steps: range) -> Iterator[TensorBatch]:
        if self._closed:
            raise ConfigError("this dataset was closed (dataset.close()); build it again to read its batches")
        source = self.batches
        made = source.road(steps) if isinstance(source, Batches) else (source[i] for i in steps)  # the fast road
        for index, batch in zip(steps, made, strict=False):
            self._last = index  # before yielding: the state counts it
            yield tensor_batch(batch, dtype=self.dtype)

    def close(self) -> None:
        """Close the dataset, and the stores of a `streambatch.Batches` source; iterating again is refused."""
        self._closed = True
        if isinstance(self.batches, Batches):
            for store in self.batches.chunks.items.stores:
                store.close()

    def __enter__(self) -> BatchesDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """This worker's place for ``StatefulDataLoader``: a `streambatch.state` of kind ``batches``."""
        begin = self._began if self._began is not None else self._begin
        moved = {} if begin is None or begin == self.start_batch else {"begin": begin}
        return encode(
            "batches", length=len(self.batches), start=self.start_batch, worker=list(self._share), last=self._last, **moved
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the state's last batch at the next iteration; a foreign state is a `StateError`."""
        found = decode(state, "batches")
        share = _worker_share()
        if found["length"] != len(self.batches) or found["start"] != self.start_batch or list(found["worker"]) != share:
            raise StateError(
                f"state (length={found['length']!r}, start={found['start']!r}, worker={found['worker']!r}) "
                f"does not match this dataset (length={len(self.batches)}, start={self.start_batch}, worker={share}); "
                "resume with the same source and num_workers"
            )
        last = found["last"]
        if last is not None and not last < len(self.batches):
            raise StateError(f"state last={last!r} is not a batch index of this source; pass a state_dict() unchanged")
        self._restored, self._begin = last, found.get("begin")


class EpochDataset(_RunShare):
    """An `IterableDataset` of whole batches of one epoch (use ``DataLoader(ds, batch_size=None)``).

    DataLoader worker ``k`` of ``W`` yields global batches ``k, k + W, ...``; read
    back through the DataLoader (which takes one item from each worker in turn)
    they arrive in the epoch's order, for any number of workers.  With
    *world_size* > 1 every rank sees every global batch but holds only its own
    rows (see `Epoch.iter_batches`), so all ranks step through the same batches.

    *epoch* is epoch 0 of a run seeded with its seed; `set_epoch` switches to
    another epoch of that run (same windows, the order of ``derive_seed``).
    *start_batch* skips the batches a resumed run already consumed, by indexing
    (nothing is replayed).  An explicit start (*start_batch*, `set_position`)
    holds until an iteration begins, so ``EpochDataset(epoch, start_batch=200)``
    then ``set_epoch(3)`` starts epoch 3 at batch 200; once the dataset has been
    iterated, `set_epoch` to another epoch starts that epoch at batch 0.  Epoch and
    start reach persistent workers (``persistent_workers=True``) at their next
    iteration.  ``StatefulDataLoader`` (torchdata) saves and restores each
    worker's exact place through `state_dict`/`load_state_dict`.

    The shuffle plan is computed in the constructing process (and by `set_epoch`),
    so forked workers share it instead of recomputing it.

    Any other sized, indexable source of batches (``sb.materialize(chunks)`` of a
    composed pipeline, a list of batches) gives a `BatchesDataset` (no epochs or
    rank split of its own: compose `sb.split_rows` into the pipeline).
    """

    def __new__(cls, epoch: Any = None, **options: Any) -> Any:
        if epoch is None or isinstance(epoch, Epoch):  # None: unpickling (a spawned worker)
            return super().__new__(cls)
        if options.get("rank", 0) != 0 or options.get("world_size", 1) != 1:
            raise ConfigError(
                "rank/world_size apply to an sb.Epoch; for a composed pipeline split the rows in it with sb.split_rows"
            )
        return BatchesDataset(epoch, dtype=options.get("dtype", torch.long), start_batch=options.get("start_batch", 0))

    def __init__(
        self,
        epoch: Epoch,
        *,
        rank: int = 0,
        world_size: int = 1,
        dtype: torch.dtype | None = torch.long,
        start_batch: int = 0,
    ) -> None:
        if not isinstance(epoch, Epoch):
            raise ConfigError(f"epoch={epoch!r} is not a streambatch.Epoch; build one with sb.Epoch(store, ...)")
        start = check_non_negative(start_batch, "start_batch", "the number of batches already consumed")
        if start > epoch.batch_count:
            raise OutOfRangeError(
                f"start_batch={start} is beyond the epoch's {epoch.batch_count} batches; "
                f"pass 0 <= start_batch <= {epoch.batch_count}"
            )
        super().__init__(Run.from_epoch(epoch), rank=rank, world_size=world_size, dtype=dtype, epoch=0, batch=start, pending=True)

    def _stop_for(self, epoch: int) -> int | None:
        return self.run.step_of(epoch + 1, 0)

    @property
    def run_seed(self) -> int | None:
        """The seed of epoch 0; epoch *e* is shuffled with ``derive_seed(run_seed, e)``."""
        return self.run.seed

    @property
    def epoch_number(self) -> int:
        """The epoch the next iteration yields."""
        return self.position[0]

    @property
    def start_batch(self) -> int:
        """The batch the next iteration starts at."""
        return self.position[1]

    @property
    def epoch(self) -> Epoch:
        """The `Epoch` the next iteration yields."""
        return self.run.epoch(self.epoch_number)

    def set_epoch(self, epoch: int) -> None:
        """Switch to epoch *epoch* of the run (same windows, a new seeded order).

        An explicit start that no iteration has used yet is kept; otherwise the new
        epoch starts at batch 0.  Setting the current epoch again changes nothing.
        """
        number = check_non_negative(epoch, "epoch", "the epoch number")
        current, start, pending = self._shared.get()
        if number == current:
            return
        self._shared.set(number, start if pending else 0, pending)
        self.run.epoch(number).shuffle_state_after  # noqa: B018 - plan in the parent process

    def __len__(self) -> int:
        return max(self.run.batches_in(self.epoch_number) - self.start_batch, 0)


class RunDataset(_RunShare):
    """An `IterableDataset` of a whole `Run` from its position: epoch after epoch, one DataLoader pass.

    Worker ``k`` of ``W`` takes the run's global batches ``s + k, s + k + W, ...``
    across epoch boundaries, so the DataLoader yields the run's own order for any
    number of workers; with *world_size* > 1 each rank holds its rows of every
    global batch.  Batches carry ``(epoch, index)``; `state_after` gives the run
    state after a batch, the same on every rank and for any worker count (the
    elastic checkpoint).  ``StatefulDataLoader`` works as is through
    `state_dict`/`load_state_dict` (same worker count); `streambatch.torch.StatefulDataLoader`
    resumes its state under any worker count and world size.  Load a run's state before
    building its dataset, or move the dataset with `set_position`.

    >>> import streambatch as sb, streambatch.torch as sbt
    >>> run = sb.Run([sb.Document("a", "train", range(7))], context_length=2, batch_size=2, seed=1, epochs=2)
    >>> [(b.epoch, b.index, b.width) for b in sbt.RunDataset(run)]
    [(0, 0, 2), (0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 1, 2), (1, 2, 1)]
    """

    def __init__(self, run: Run, *, rank: int = 0, world_size: int = 1, dtype: torch.dtype | None = torch.long) -> None:
        if not isinstance(run, Run):
            raise ConfigError(f"run={short_repr(run)} is not a streambatch.Run; build one with sb.Run(store, ...)")
        epoch, batch = run.position
        super().__init__(run, rank=rank, world_size=world_size, dtype=dtype, epoch=epoch, batch=batch, pending=False)

    def state_dict_after(self, batch: TensorBatch | MiniBatch) -> dict[str, Any]:
        """The run state right after *batch* (see `Run.state_dict_after`): what to save once a step is done."""
        return self.run.state_dict_after(batch)

    def state_after(self, batch: TensorBatch | MiniBatch) -> dict[str, Any]:
        """Deprecated name of `state_dict_after` (kept for one release)."""
        warnings.warn("RunDataset.state_after is deprecated; use state_dict_after", DeprecationWarning, stacklevel=2)
        return self.run.state_dict_after(batch)

    def __len__(self) -> int:
        if self.run.epochs is None:
            raise TypeError("an endless run has no length; pass epochs= to sb.Run for a finite schedule")
        epoch, batch = self.position
        return max(self.run.steps_stop() - self.run.step_of(epoch, batch), 0)
