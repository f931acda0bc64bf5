"""The Ray executor of a corpus run: each part of the plan is a Ray task running `streambatch.parts.corpus.run_part`.

Ray only schedules; the part, its bytes and its marker are `run_part`'s.  The job
goes to the object store once; each worker process unpickles its reading options
(loads the tokenizer) once, and runs its tokenizer on one thread (a task holds one
CPU).  A worker that dies mid-part (killed, out of memory) is retried by Ray (up to
`RETRIES` times): the store writer never shows a partial part, and a new writer
of the part removes what a dead one left.  An error of the part itself (a bad
input without ``--skip-bad``, an input the node cannot read) comes back as that
error, named with its part and node, and the other parts are cancelled.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .. import errors
from ..errors import StreamBatchError, WorkerLostError
from ..read.text.tokenizers import require
from .corpus import CorpusJob, PartDone, run_part

RETRIES = 3  # a part whose worker dies is run again up to this many times


def ray_module(what: str = "prepare --executor ray") -> Any:
    """``import ray``, or a `MissingDependencyError` naming the ``ray`` extra."""
    return require("ray", "ray", what)


LOOPBACK = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # Ray's single-machine mode: its node address is 127.0.0.1


def local_cluster(ray: Any, **options: Any) -> None:
    """``ray.init`` of a cluster on this machine alone: every server on 127.0.0.1, no dashboard."""
    saved = os.environ.get(LOOPBACK)
    os.environ[LOOPBACK] = "0"  # read by the processes it starts
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    before = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if constants is not None:  # read when ray was imported: set for this init
        constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(include_dashboard=False, log_to_driver=False, **options)
    finally:
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = before
        if saved is None:
            os.environ.pop(LOOPBACK, None)
        else:
            os.environ[LOOPBACK] = saved


def _ray_part(job: CorpusJob, index: int) -> PartDone | tuple[str, str]:
    """A Ray task: `run_part`, with the tokenizer on one thread; a streambatch error comes back as (class name, message)."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before the tokenizer's first batch starts its thread pool
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        return run_part(job, index)
    except StreamBatchError as err:
        import socket

        return type(err).__name__, f"part {index}/{job.count} (on {socket.gethostname()}): {err}"


class RayRunner:
    """Connects to a Ray cluster (*address*; None: the one this process runs, else a local one on loopback)."""

    def __init__(self, address: str | None) -> None:
        self.ray = ray_module()
        self.started = False
        if not self.ray.is_initialized():
            if address is None:  # a local cluster, for this run only: nothing listens beyond loopback
                local_cluster(self.ray)
            else:
                self.ray.init(address=address, log_to_driver=False)
            self.started = True
        self.cpus = max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def run(self, job: CorpusJob, todo: list[int]) -> Iterator[PartDone]:
        """Each part's result as its task finishes (in any order)."""
        if not todo:
            return
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=RETRIES, retry_exceptions=False)(_ray_part)
        shared = ray.put(job)
        pending = {task.remote(shared, index): index for index in todo}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    index = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except ray.exceptions.RayTaskError:  # the part's own bug (not a streambatch error): its traceback
                        raise
                    except ray.exceptions.RayError as err:  # the worker died RETRIES + 1 times, or the node is gone
                        raise WorkerLostError(
                            f"part {index}/{job.count}: its Ray worker died {RETRIES + 1} times ({type(err).__name__}); "
                            "the corpus was not finished: run again (finished parts are kept), with more memory per worker"
                        ) from None
                    if isinstance(result, tuple):
                        kind = getattr(errors, result[0], None)
                        raise (kind if isinstance(kind, type) else StreamBatchError)(result[1])
                    yield result
        finally:
            for ref in pending:  # an error (or Ctrl-C): the other parts are not needed
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
