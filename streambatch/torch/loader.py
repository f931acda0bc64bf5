"""Elastic loader state: a ``StatefulDataLoader`` checkpoint resumed under any ``num_workers`` (and world size).

torchdata's ``StatefulDataLoader`` saves one state per worker and refuses, deep
inside, a state of another worker count.  Our datasets read the run's global
batches in order (worker ``k`` of ``W`` takes ``s + k, s + k + W, ...``, the loader
takes one from each in turn), so the batches a loader has yielded are exactly the
global batches before ``g`` = the least next batch over its workers (plus the
steps the loader replays after its last snapshot).  `loader_position` computes
``g`` from a saved loader state, in the main process, checking every worker's
state against the dataset (a foreign or damaged state is a `StateError` here,
never a traceback inside a worker); `StatefulDataLoader` is torchdata's loader
whose ``load_state_dict`` moves the dataset to ``g`` and starts afresh from there,
with any number of workers.  The position is global (every rank steps through the
same batches), so a state saved under one world size resumes under another.
"""

from __future__ import annotations

from typing import Any

from ..errors import StateError, missing_dependency
from ..run import Run
from ..state import decode
from .datasets import BatchesDataset, EpochDataset, _RunShare

_SNAPSHOT, _WORKERS, _SINCE = "_snapshot", "_worker_snapshots", "_steps_since_snapshot"

try:
    from torchdata.stateful_dataloader import StatefulDataLoader as _Loader
except ImportError:  # pragma: no cover - the torch extra installs torchdata
    _Loader = None


def _dataset_states(state: Any) -> tuple[list[Any], int]:
    """Each worker's dataset state in a saved ``StatefulDataLoader`` state (one for ``num_workers=0``), and the
    steps the loader replays after its last snapshot."""
    if not isinstance(state, dict):
        raise StateError(f"loader state is a {type(state).__name__}; pass StatefulDataLoader.state_dict() unchanged")
    if _SNAPSHOT in state:  # saved with num_workers > 0
        workers = state[_SNAPSHOT].get(_WORKERS) if isinstance(state[_SNAPSHOT], dict) else None
        if not isinstance(workers, dict) or not workers:
            raise StateError("loader state has no worker snapshots; pass StatefulDataLoader.state_dict() unchanged")
        found: list[dict[str, Any]] = []
        for k in range(len(workers)):
            entry = workers.get(f"worker_{k}")
            if not isinstance(entry, dict):
                raise StateError(f"loader state names workers {sorted(workers)}; pass StatefulDataLoader.state_dict() unchanged")
            found.append(entry)
        since = state.get(_SINCE, 0)
        return [w.get("dataset_state") for w in found], since if isinstance(since, int) and since >= 0 else -1
    if "dataset_state" in state:  # saved with num_workers=0
        return [state["dataset_state"]], 0
    raise StateError("loader state holds neither worker snapshots nor a dataset state; pass StatefulDataLoader.state_dict()")


def loader_position(dataset: Any, state: Any) -> tuple[int, int]:
    """``(next, origin)``: the global batch (a run's step, or a `BatchesDataset` index) a saved loader state of
    *dataset* continues at, and the one its iteration began at.

    Any ``num_workers`` the state was saved with; every worker's state is checked
    against *dataset* (its run, its share, its place), so a state that cannot
    resume is refused now, in this process.
    """
    states, since = _dataset_states(state)
    if since < 0:
        raise StateError("loader state has a negative or non-integer step count; pass StatefulDataLoader.state_dict()")
    count = len(states)
    nexts: list[int] = []
    begin = end = None
    for k, saved in enumerate(states):
        if saved is None:
            raise StateError(f"loader state of worker {k} holds no dataset state; it was saved from another dataset")
        if isinstance(dataset, BatchesDataset):
            found = decode(saved, "batches")
            if found["length"] != len(dataset.batches) or found["start"] != dataset.start_batch:
                raise StateError(
                    f"loader state (length={found['length']!r}, start={found['start']!r}) does not match this dataset "
                    f"(length={len(dataset.batches)}, start={dataset.start_batch}); resume with the same source"
                )
            origin, stop = found.get("begin") or dataset.start_batch, len(dataset.batches)
            last = found["last"]
            if last is not None and not (isinstance(last, int) and origin <= last < stop):
                raise StateError(f"loader state last={last!r} is not a batch index of this source; pass it unchanged")
        else:
            found = decode(saved, "worker")
            run = dataset.run
            origin = run.step_of(*run.check_state(found["run"]))
            stop = run.steps_stop(None if found["stop"] is None else _step(run, found["stop"], "stop"))
            last = None if found["last"] is None else _step(run, found["last"], "last")
        if list(found["worker"]) != [k, count]:
            raise StateError(f"loader state of worker {k} of {count} says worker={found['worker']!r}; pass it unchanged")
        if (begin, end) not in ((None, None), (origin, stop)):
            raise StateError(f"loader state of worker {k} starts or stops elsewhere than worker 0's; pass it unchanged")
        begin, end = origin, stop
        if last is not None and (last < origin + k or (last - origin - k) % count):
            raise StateError(f"loader state last={last!r} is not a batch of worker {k} of {count}; pass it unchanged")
        nexts.append(origin + k if last is None else last + count)
    assert begin is not None
    assert end is not None
    return min(min(nexts) + since, end), begin


def _step(run: Run, pair: object, name: str) -> int:
    if not isinstance(pair, list) or len(pair) != 2:
        raise StateError(f"loader state {name}={pair!r} is not [epoch, batch]; pass it unchanged")
    return int(run.step_of(*run.check_position(pair[0], pair[1], where=f"state {name} ", error=StateError)))


def resume_at(dataset: Any, step: int, origin: int) -> None:
    """Start *dataset*'s next iteration at global batch *step* of the iteration that began at *origin*."""
    if isinstance(dataset, BatchesDataset):
        dataset.resume_at(step)
    elif isinstance(dataset, EpochDataset):  # its epoch's end is an empty iteration, never the next epoch
        epoch = dataset.run.position_of(origin)[0]
        dataset.resume_at(epoch, step - dataset.run.step_of(epoch, 0))
    elif isinstance(dataset, _RunShare):
        dataset.set_position(*dataset.run.position_of(step))
    else:
        raise StateError(f"dataset {type(dataset).__name__} is not a streambatch dataset; nothing to resume")


if _Loader is not None:

    class StatefulDataLoader(_Loader):  # type: ignore[misc]
        """torchdata's ``StatefulDataLoader`` whose saved state resumes under any ``num_workers`` and world size.

        Built exactly as torchdata's, over a streambatch dataset (`RunDataset`,
        `EpochDataset`, `BatchesDataset`).  ``load_state_dict`` checks the state now
        (`StateError`), moves the dataset to the first batch not yet yielded
        (`loader_position`) and starts afresh from there.
        """

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            if state_dict == {}:
                super().load_state_dict(state_dict)
                return
            resume_at(self.dataset, *loader_position(self.dataset, state_dict))
            super().load_state_dict({})  # a fresh iterator (and workers), from the dataset's new position

else:  # pragma: no cover

    def StatefulDataLoader(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]
        raise missing_dependency("streambatch.torch.StatefulDataLoader", "torchdata", "torch")
