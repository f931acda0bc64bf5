"""`RankLoader`: one rank's micro-batches of a run, prefetched in the background, with one global cursor as its state.

One streambatch batch is one optimizer step.  Rank ``r`` of ``R`` takes its
share of every step's global batch by the package's share rule
(`streambatch.share`), and ``accumulation=k`` splits that share into ``k``
micro-batches (`streambatch.stages.chunk.part_share`).  Every micro-batch carries
the whole step's ``global_token_count`` from the plan, so
``sbt.token_mean_loss(loss_sum, micro)`` is the exact token mean under DDP or
FSDP2 with no collective for the count and no division by ``k``.

The state is one global cursor: the run's state (`streambatch.Run.state_dict`)
at the first step not yet handed out in full.  It names no rank, worker,
accumulation or micro-batch size, so a state saved under one (world size,
workers, accumulation) resumes exactly under any other; `RankLoader` is a
``torch.distributed.checkpoint.stateful.Stateful``, saved with ``dcp.save`` and
loaded with ``dcp.load``.  torchdata is not needed.

Background workers are threads (the gathers release the GIL): ``num_workers``
threads gather whole steps ahead of the consumer, at most ``num_workers *
prefetch`` steps, and hand them out in order.  Nothing is pickled and nothing
is spawned, so it works under any start method.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import torch

from .._checks import check_non_negative, check_positive, short_repr
from ..batch.minibatch import MiniBatch
from ..errors import ConfigError
from ..items.protocol import EpochItems, counted_targets
from ..run import Run
from ..stages.chunk import Chunks
from ..stages.materialize import Batches, materialize
from ..stages.share import share
from .tensors import as_tensors, tensor_batch

Output = Literal["batch", "tensors", "torchtitan"]
_OUTPUTS = ("batch", "tensors", "torchtitan")


class RankLoader:
    """This rank's micro-batches of *run*, step after step, from the run's position; `Stateful` for DCP.

    *output*: ``"batch"`` yields `streambatch.MiniBatch` (numpy), ``"tensors"`` a
    `TensorBatch` (in *dtype*), ``"torchtitan"`` ``({"input": inputs}, labels)`` as
    torchtitan's ``BaseDataLoader`` does (labels hold -100 where a target does not
    count).  Each iteration yields the rest of the current epoch (a DataLoader's
    pass; the next iteration starts the next epoch), or with ``whole_run=True`` the
    rest of the run (an endless run: an endless iterator).  ``len`` counts the
    micro-batches of that whole epoch (or run), as a DataLoader's does; `steps`
    is the optimizer steps the next iteration yields.

    >>> import streambatch as sb, streambatch.torch as sbt
    >>> run = sb.Run([sb.Document("a", "train", range(12))], context_length=2, batch_size=4, seed=None, epochs=1)
    >>> loader = sbt.RankLoader(run, rank=1, world_size=2, accumulation=2)
    >>> [(b.index, b.width, b.global_token_count) for b in loader]
    [(0, 1, 8), (0, 1, 8), (1, 1, 8), (1, 1, 8), (2, 1, 4), (2, 0, 4)]
    >>> loader.state_dict()["epoch"], len(loader)
    (1, 0)
    """

    def __init__(
        self,
        run: Run,
        *,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        prefetch: int = 2,
        accumulation: int = 1,
        output: Output = "batch",
        dtype: torch.dtype = torch.long,
        whole_run: bool = False,
    ) -> None:
        if not isinstance(run, Run):
            raise ConfigError(f"run={short_repr(run)} is not a streambatch.Run; build one with sb.Run(source, ...)")
        if output not in _OUTPUTS:
            raise ConfigError(f"output={output!r} is not one of {_OUTPUTS}; pass output='batch', 'tensors' or 'torchtitan'")
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"dtype={dtype!r} is not a torch.dtype; pass e.g. torch.long")
        self.num_workers = check_non_negative(num_workers, "num_workers", "the background threads (0: gather inline)")
        self.prefetch = check_positive(prefetch, "prefetch", "the steps each worker gathers ahead")
        self.accumulation = check_positive(accumulation, "accumulation", "the micro-batches per optimizer step")
        share(range(0), rank=rank, world_size=world_size)  # the share rule's own checks of rank and world_size
        self.run, self.rank, self.world_size = run, int(rank), int(world_size)
        self.output, self.dtype, self.whole_run = output, dtype, bool(whole_run)
        self._cursor = run.step_of(*run.position)  # the first global step not yet handed out in full
        self._last: int | None = None  # the step of the micro-batch handed out last
        self._held: tuple[int, Chunks[EpochItems], list[Batches]] | None = None  # one epoch's chunks, and its parts

    # -- what the next iteration covers -------------------------------------------------
    @property
    def step(self) -> int:
        """The cursor: the global step (``run.step_of(epoch, batch)``) the next iteration starts at."""
        return self._cursor

    def _stop(self) -> int:
        run = self.run
        if self.whole_run:
            return run.steps_stop()
        return min(run.step_of(run.position_of(self._cursor)[0] + 1, 0), run.steps_stop())

    @property
    def steps(self) -> int:
        """Optimizer steps the next iteration yields (the rest of the epoch, or of the run)."""
        if self.whole_run and self.run.epochs is None:
            raise TypeError("an endless run has no length; pass epochs= to sb.Run, or whole_run=False")
        return max(self._stop() - self._cursor, 0)

    def __len__(self) -> int:
        """Micro-batches of the whole epoch the next iteration belongs to (0 past the run's end), as a
        DataLoader's length counts its whole pass even when resumed mid-epoch (Lightning relies on it); with
        ``whole_run=True``, of the whole run.  `steps` is what the next iteration yields."""
        run = self.run
        if self.whole_run:
            if run.epochs is None:
                raise TypeError("an endless run has no length; pass epochs= to sb.Run, or whole_run=False")
            return run.steps_stop() * self.accumulation
        return (run.batches_in(run.position_of(self._cursor)[0]) if self._cursor < run.steps_stop() else 0) * self.accumulation

    def global_token_count(self, step: int | None = None) -> int:
        """The counted targets of global step *step* over every rank (None: the step handed out last), from the plan."""
        at = self._last if step is None else check_non_negative(step, "step", "a global step number")
        if at is None:
            raise ConfigError("no micro-batch was handed out yet; pass step= the global step number")
        epoch, index = self.run.position_of(at)
        self._parts(epoch)
        assert self._held is not None
        return counted_targets(self._held[1][index])

    # -- iteration ----------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        start, stop = self._cursor, self._stop()
        if start < stop:
            self._parts(self.run.position_of(start)[0])  # checks and plans now, in this thread
        return self._iterate(start, stop)

    def _parts(self, epoch: int) -> list[Batches]:
        """Epoch *epoch*'s micro-batch sequences of this rank, one per part (planned once per epoch, in this thread)."""
        if self._held is None or self._held[0] != epoch:
            chunks = self.run.epoch(epoch).chunks()
            parts = [
                materialize(share(chunks, rank=self.rank, world_size=self.world_size, part=j, parts=self.accumulation))
                for j in range(self.accumulation)
            ]
            self._held = (epoch, chunks, parts)
        return self._held[2]

    def _job(self, step: int) -> Callable[[], list[Any]]:
        epoch, index = self.run.position_of(step)
        parts, made = self._parts(epoch), self._made
        return lambda: [made(part[index].in_epoch(epoch)) for part in parts]

    def _made(self, batch: MiniBatch) -> Any:
        if self.output == "batch":
            return batch
        if self.output == "tensors":
            return tensor_batch(batch, dtype=self.dtype)
        inputs, labels = as_tensors(batch, dtype=self.dtype)
        return {"input": inputs}, labels

    def _iterate(self, start: int, stop: int) -> Iterator[Any]:
        if self.num_workers == 0:
            for step in range(start, stop):
                yield from self._hand_out(step, self._job(step)())
            return
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="streambatch-rank-loader")
        ahead: deque[Future[list[Any]]] = deque()
        steps = iter(range(start, stop))
        try:
            for step in range(start, stop):
                while len(ahead) < self.num_workers * self.prefetch:
                    following = next(steps, None)
                    if following is None:
                        break
                    ahead.append(pool.submit(self._job(following)))
                yield from self._hand_out(step, ahead.popleft().result())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _hand_out(self, step: int, micros: list[Any]) -> Iterator[Any]:
        self._last = step
        for k, micro in enumerate(micros):
            if k == len(micros) - 1:  # before yielding the step's last micro-batch: the state counts the step
                self._move(step + 1)
            yield micro

    def _move(self, step: int) -> None:
        self._cursor = step
        self.run.set_position(*self.run.position_of(step))

    # -- the state: one global cursor ------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run's state at the cursor (`streambatch.Run.state_dict`): the same on every rank, for any workers,
        accumulation or micro-batch size.  Save it once the step's last micro-batch is done."""
        return self.run.state_dict(self.run.position_of(self._cursor))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue at the step *state_dict* records (`Run.check_state` first: a refused state changes nothing)."""
        position = self.run.check_state(state_dict)
        self._move(self.run.step_of(*position))
        self._last = None

    def __repr__(self) -> str:
        return (
            f"RankLoader(step={self._cursor}, rank={self.rank}/{self.world_size}, accumulation={self.accumulation}, "
            f"num_workers={self.num_workers}, output={self.output!r}, {self.run!r})"
        )
