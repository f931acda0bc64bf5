"""Run read tasks in a pool of spawned processes, results in task order: how ``prepare --workers N`` tokenizes.

The pool is a `concurrent.futures.ProcessPoolExecutor` (spawn), so a worker that
dies (killed by the OOM killer, a crash in a tokenizer) breaks the pool at once:
`WorkerLostError` names the inputs that worker held, and nothing waits forever
or finishes with documents missing.  Workers ignore SIGINT: a Ctrl-C reaches
the main process alone, which stops the pool (no traceback from each worker);
the command line turns SIGTERM into the same stop (`streambatch._signals`).
*workers* is capped at the CPUs this process may run on (`available_cpus`).
"""

from __future__ import annotations

import ast
import dataclasses
import multiprocessing
import os
import pickle
import signal
import sys
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from types import FrameType
from typing import Any, NamedTuple

import numpy as np

from .._signals import stops_deferred
from ..errors import ConfigError, DataError, WorkerLostError
from ..io.files import open_regular, short_path
from .blocks import Block, ReadOptions
from .inputs import LINE_CHUNK_BYTES
from .tasks import Task, run_task

GROUP_BYTES = LINE_CHUNK_BYTES  # small files and chunks are sent to a worker together, up to about this many bytes
GROUP_FILES = 64
GUARD = 'if __name__ == "__main__":'

Outcome = Iterable[Block] | str


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def capped_workers(workers: int, quiet: bool = False) -> int:
    """*workers* at most `available_cpus`, with a note on stderr when it is cut (unless *quiet*)."""
    cpus = available_cpus()
    if workers <= cpus:
        return workers
    if not quiet:
        print(f"prepare: workers={workers} capped at the {cpus} CPUs available", file=sys.stderr)
    return cpus


class WorkerPlan(NamedTuple):
    """How a run's CPUs are split: *processes* that read and tokenize, *threads* each tokenizer may run."""

    processes: int
    threads: int

    def __str__(self) -> str:
        unit = "process" if self.processes == 1 else "processes"
        return f"{self.processes} {unit} x {self.threads} tokenizer thread{'s' if self.threads != 1 else ''}"


def plan_workers(workers: int, tokenizer: Any, quiet: bool = False) -> WorkerPlan:
    """Split the CPUs between worker processes and a tokenizer that runs threads of its own (an HF tokenizer).

    A tokenizer without threads of its own gets one thread per process, and the
    processes asked for (at most the CPUs, `capped_workers`).  One that encodes
    batches on every core (`HFTokenizer`: Rust threads) already keeps the CPUs
    busy from one process: extra processes only add start-up and copying, and on
    a machine of few cores they ran slower (2 workers on 2 cores: 1.5x the time
    of one).  So each process keeps at least 2 threads: processes =
    ``min(workers, cpus // 2)`` (at least 1), threads = ``cpus // processes``.
    """
    cpus = available_cpus()
    if not getattr(tokenizer, "threaded", False):
        return WorkerPlan(capped_workers(workers, quiet), 1)
    processes = max(1, min(workers, cpus // 2))
    if processes < workers and not quiet:
        print(
            f"prepare: workers={workers} run as {WorkerPlan(processes, max(1, cpus // processes))} on {cpus} CPUs: "
            "the tokenizer runs threads of its own",
            file=sys.stderr,
        )
    return WorkerPlan(processes, max(1, cpus // processes))


def check_main_guard(workers: int) -> None:
    """Refuse to start workers from a script's top level that lacks the ``__main__`` guard (or from inside a worker).

    Spawned workers import the script that started them: without the guard each
    would run this call again, and the pool would never start.
    """
    fix = f"spawned worker processes import the script and would run it again: put the call under `{GUARD}`, or pass workers=1"
    if getattr(multiprocessing.current_process(), "_inheriting", False):  # a spawned child running the script again
        raise ConfigError(f"workers={workers} asked for in a worker process, while it imported the main script; {fix}")
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.split(".")[-1] == "__main__":
        return  # `python -m package`: spawn never runs a package's __main__ again
    frame = _main_frame(sys._getframe(1))
    if frame is not None and not _guarded(frame):
        raise ConfigError(f"workers={workers} asked for at the top level of {short_path(frame.f_code.co_filename)}; {fix}")


def check_shareable(opts: ReadOptions, workers: int) -> None:
    """Refuse reading options (a tokenizer) that cannot be sent to worker processes."""
    try:
        data = pickle.dumps(opts)
    except Exception as err:
        raise ConfigError(
            f"workers={workers} needs a tokenizer that can be sent to other processes, and this one cannot be pickled "
            f"({type(err).__name__}: {err}); use a module-level function, a Tokenizer object, or workers=1"
        ) from err
    if b"__main__" in data and getattr(sys.modules.get("__main__"), "__file__", None) is None:
        raise ConfigError(
            f"workers={workers}: the tokenizer is defined in `python -c` or an interactive session, which worker "
            "processes cannot import; define it in a .py file (a module or the script), or pass workers=1"
        )


def _main_frame(frame: FrameType | None) -> FrameType | None:
    """The frame running the ``__main__`` script's top level, if this call comes from it."""
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return frame
        frame = frame.f_back
    return None


def _guarded(frame: FrameType) -> bool:
    """Whether the top-level statement running in *frame* is an ``if __name__ == ...`` block (unknown source: yes)."""
    try:
        with open_regular(frame.f_code.co_filename) as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):
        return True
    line = frame.f_lineno
    for node in tree.body:
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
    return True


# --- in a worker ---------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}
_UNCLAIMED, _IDLE = -2, -1  # a worker's slot in the shared array: unclaimed, idle, or the batch it reads


def _start_worker(opts: ReadOptions, slots: Any, threads: int = 1) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the main process, which stops the pool
    if hasattr(signal, "pthread_sigmask"):  # spawned with SIGTERM blocked (stops_deferred): the pool stops workers with it
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    # the tokenizer's own threads (`plan_workers`): set before its thread pool starts, at its first batch
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    _WORKER["options"] = opts
    with slots.get_lock():
        slot = next((i for i in range(len(slots)) if slots[i] == _UNCLAIMED), None)
        if slot is not None:
            slots[slot] = _IDLE
    _WORKER["slots"], _WORKER["slot"] = slots, slot


def _work(tasks: list[Task], batch: int = _IDLE) -> list[list[Block] | str]:
    opts, slots, slot = _WORKER["options"], _WORKER["slots"], _WORKER["slot"]
    if slot is not None:
        slots[slot] = batch  # left there if this process is killed: the main process names what was lost
    done: list[list[Block] | str] = []
    for task in tasks:
        try:
            done.append([_narrow(block) for block in run_task(task, opts)])
        except DataError as err:  # reported (or skipped) in order by the main process
            done.append(str(err))
    if slot is not None:
        slots[slot] = _IDLE
    return done


def _narrow(block: Block) -> Block:
    """The block with uint16 tokens when they fit: half the bytes back from a worker."""
    tokens = block.tokens
    if tokens.dtype.itemsize > 2 and (tokens.size == 0 or int(tokens.max()) < 1 << 16):
        return dataclasses.replace(block, tokens=tokens.astype(np.uint16))
    return block


# --- in the main process -------------------------------------------------------------------------


def run_tasks(
    tasks: Iterable[Task], opts: ReadOptions, workers: int = 1, threads: int = 1
) -> Generator[tuple[Task, Outcome], None, None]:
    """Each task with its blocks (or its error message), in task order; *workers* > 1 tokenizes in spawned processes
    (each tokenizer with *threads* threads of its own, `plan_workers`)."""
    if workers == 1:
        for task in tasks:
            yield task, run_task(task, opts)
        return
    check_shareable(opts, workers)
    pools: list[ProcessPoolExecutor] = []  # started at the first task that needs one
    try:
        yield from _ordered(pools, tasks, opts, workers, threads)
    finally:
        for pool in pools:
            _stop(pool)


def _stop(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:  # what a worker holds is not needed any more: stop it now
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()


Done = Future[list[list[Block] | str]]


class _Pool(ProcessPoolExecutor):
    """A pool that spawns all its workers at the first submit, from the calling thread, and none later.

    A spawn-context `ProcessPoolExecutor` otherwise starts workers on demand, one
    per submit.  When a worker is killed, its manager thread walks the worker table
    to stop the rest while a submit in the main thread may still be adding to it
    (CPython: ``RuntimeError: dictionary changed size during iteration`` in the
    manager thread), and a worker spawned then finds the pool's pipes and
    semaphores gone (``ValueError: bad value(s) in fds_to_keep``, or a
    ``FileNotFoundError`` traceback from the new child).  Started together, before
    the manager thread, the table never changes after it starts.  This is what the
    executor already does for the fork context (CPython 3.10 to 3.13).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._safe_to_dynamically_spawn_children = False


def _ordered(
    pools: list[ProcessPoolExecutor], tasks: Iterable[Task], opts: ReadOptions, workers: int, threads: int
) -> Iterator[tuple[Task, Outcome]]:
    pending: deque[tuple[list[Task], Done | None]] = deque()
    group: list[Task] = []
    sent: dict[int, list[Task]] = {}  # the batches in the workers, by number
    context = multiprocessing.get_context("spawn")
    slots = context.Array("q", [_UNCLAIMED] * workers)  # what each worker reads now

    def lost(batch: list[Task]) -> WorkerLostError:
        reading = [sent[number] for number in set(slots[:]) if number in sent]
        return _lost(reading or [batch, *(b for b, _ in pending), group])

    def submit() -> None:
        if group:
            if not pools:
                pools.append(_Pool(workers, mp_context=context, initializer=_start_worker, initargs=(opts, slots, threads)))
            number = len(sent)
            sent[number] = list(group)
            try:
                with stops_deferred():  # the workers are spawned at the first submit (`_Pool`)
                    pending.append((sent[number], pools[0].submit(_work, sent[number], number)))
            except (BrokenProcessPool, OSError) as err:  # a worker died already (its pipes may be closed too)
                if isinstance(err, BrokenProcessPool) or getattr(pools[0], "_broken", False):
                    raise lost(sent[number]) from None
                raise
            group.clear()

    def settle(limit: int) -> Iterator[tuple[Task, Outcome]]:
        while len(pending) > limit:
            batch, result = pending.popleft()
            if result is None:
                yield batch[0], run_task(batch[0], opts)
                continue
            try:
                outcomes = result.result()
            except BrokenProcessPool:
                raise lost(batch) from None
            yield from zip(batch, outcomes, strict=True)

    for task in tasks:
        if task.inline(opts):
            submit()
            pending.append(([task], None))
        else:
            group.append(task)
            if not task.size or sum(t.size for t in group) >= GROUP_BYTES or len(group) >= GROUP_FILES:
                submit()  # small files and chunks travel together; row groups and datasets alone
        yield from settle(2 * workers + 2)  # bounded: the main process reads ahead of the workers, not ahead of memory
    submit()
    yield from settle(0)


def _lost(reading: list[list[Task]]) -> WorkerLostError:
    """The inputs the workers were reading when one died (or, if unknown, every input not yet read)."""
    paths = list(dict.fromkeys(short_path(task.path) for batch in reading for task in batch))
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return WorkerLostError(
        f"a worker process died (killed, e.g. by the out-of-memory killer, or crashed) while reading {shown}; "
        "the store was not written: run again, with fewer --workers if memory is short"
    )
