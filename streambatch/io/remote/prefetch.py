"""Plan-driven prefetch: fetch the token ranges of the next batches before the consumer asks for them.

A `Reader` serves one lazy sequence of batches (`streambatch.Batches`).  The
plan names every batch's items, so the token spans of batch ``i`` are known
before it is gathered (*spans_of*).  When batch ``i`` is asked for, the reader
makes sure its ranges are in memory (fetching now what is not on its way),
gathers it, drops its holds, and starts fetching the batches the consumer will
ask for next: ``i + step, i + 2 step, ...`` where *step* is the distance between
its last two requests (1 for an epoch, the worker count for a DataLoader
worker's share), up to *depth* batches ahead.  A resume at ``p`` asks for ``p``
first, so nothing before it is fetched.

The depth is chosen from what the reader measures: how long a batch takes to
arrive (latency and rate) against how often the consumer asks, so enough
batches are on their way to hide the latency; ``prefetch=N`` (on `open_store`)
fixes it.  Memory stays bounded: at most *depth* batches' ranges are held.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ...model.corpus import Corpus
from ...model.store import DocumentStore
from .tokens import TokenFile, coalesce, remote_file

T = TypeVar("T")
Span = tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]  # (store or corpus, flat starts, lengths)
GAP = 4096  # ranges closer than this are one request (the gap's bytes are fetched too)
MAX_DEPTH = 64
MAX_HELD = 512 << 20  # bytes of batches in flight at most (the depth shrinks to stay below)


def remote_files(store: Any) -> list[TokenFile]:
    """The remote token files a store or corpus reads (none: all local)."""
    shards = store.shards if isinstance(store, Corpus) else [store] if isinstance(store, DocumentStore) else []
    return [f for f in (remote_file(s.tokens) for s in shards) if f is not None]


def byte_ranges(spans: Sequence[Span]) -> dict[TokenFile, tuple[list[int], list[int]]]:
    """Coalesced byte ranges per remote token file of flat token *spans* (local stores are left out)."""
    found: dict[TokenFile, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]] = {}
    for store, starts, lengths in spans:
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if isinstance(store, Corpus):
            shard_of = np.searchsorted(store.bases, starts, side="right") - 1
            pieces = [
                (store.shards[k], starts[shard_of == k] - store.bases[k], lengths[shard_of == k])
                for k in np.unique(shard_of).tolist()
            ]
        else:
            pieces = [(store, starts, lengths)]
        for shard, local, sizes in pieces:
            file = remote_file(getattr(shard, "tokens", None))
            if file is not None and local.size:
                size = file.dtype.itemsize
                found.setdefault(file, []).append((local * size, (local + sizes) * size))
    out = {}
    for file, parts in found.items():
        lo = np.concatenate([p[0] for p in parts])
        hi = np.minimum(np.concatenate([p[1] for p in parts]), file.nbytes)
        out[file] = coalesce(lo, hi, GAP)
    return out


@dataclass
class _Pending:
    """One batch on its way: its holds and requests."""

    holds: list[tuple[TokenFile, npt.NDArray[np.int64]]]
    futures: list[Future[None]]
    nbytes: int
    started: float = field(default_factory=time.perf_counter)


class Reader:
    """Fetches the ranges of the batches a consumer asks for, and of those it will ask for next."""

    def __init__(self, spans_of: Callable[[int], Sequence[Span]], count: int, files: list[TokenFile]) -> None:
        self._spans_of, self._count = spans_of, count
        fixed = [int(f.settings["prefetch"]) for f in files if f.settings.get("prefetch") is not None]
        self._fixed: int | None = fixed[0] if fixed else None
        self._depth = self._fixed if self._fixed is not None else 4
        self._pending: dict[int, _Pending] = {}
        self._last: int | None = None
        self._step = 1
        self._asked_at: float | None = None
        self._interval = 0.0  # consumer: seconds between requests (moving average)
        self._arrival = 0.0  # link: seconds a batch takes to arrive (moving average)
        self._batch_bytes = 0.0

    @property
    def depth(self) -> int:
        """Batches fetched ahead now."""
        return self._depth

    def get(self, index: int, gather: Callable[[], T]) -> T:
        """Batch *index*, gathered by *gather* once its ranges are in memory; the next ones are started first."""
        now = time.perf_counter()
        if self._asked_at is not None:  # the consumer's own time per batch (not the time spent waiting here)
            self._interval = _average(self._interval, now - self._asked_at)
        if self._last is not None and index > self._last:
            self._step = index - self._last
        cold = self._last is None
        self._last = index
        pending = self._pending.pop(index, None) or self._start(index)
        if not cold:  # the first batch comes alone: a resume fetches nothing past it before it is served
            self._ahead(index)
        try:
            for future in pending.futures:
                future.result()
            if pending.futures:
                self._arrival = _average(self._arrival, time.perf_counter() - pending.started)
                self._batch_bytes = _average(self._batch_bytes, pending.nbytes)
            return gather()
        finally:
            _release(pending)
            if cold:
                self._ahead(index)
            self._tune()
            self._asked_at = time.perf_counter()

    def close(self) -> None:
        """Drop every batch still on its way (their memory is returned as they arrive)."""
        for index in list(self._pending):
            self._drop(index)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone
            self.close()

    def _start(self, index: int) -> _Pending:
        holds, futures, total = [], [], 0
        for file, (starts, ends) in byte_ranges(self._spans_of(index)).items():
            lo, hi = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
            holds.append((file, file.hold(lo, hi)))
            futures.extend(file.fetch(starts, ends))
            total += int((hi - lo).sum())
        return _Pending(holds, futures, total)

    def _ahead(self, index: int) -> None:
        wanted = range(index + self._step, self._count, self._step)[: self._depth]
        for j in [j for j in self._pending if j <= index or (j - index) % self._step]:
            self._drop(j)  # the consumer went elsewhere (batches further along the same path are kept)
        for j in wanted:
            if j not in self._pending:
                self._pending[j] = self._start(j)

    def _drop(self, index: int) -> None:
        pending = self._pending.pop(index)
        left = [f for f in pending.futures if not f.done()]
        if not left:
            _release(pending)
            return
        remaining = [len(left)]

        def done(_: Future[None]) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                _release(pending)

        for future in left:
            future.add_done_callback(done)

    def _tune(self) -> None:
        """Enough batches on their way to cover one batch's arrival time at the consumer's pace (bounded)."""
        if self._fixed is not None or self._interval <= 0 or self._arrival <= 0:
            return
        need = int(np.ceil(self._arrival / max(self._interval, 2e-4))) + 2
        memory = int(MAX_HELD // max(self._batch_bytes, 1.0))
        self._depth = max(2, min(MAX_DEPTH, need, memory))


def _release(pending: _Pending) -> None:
    for file, slots in pending.holds:
        file.release(slots)
    pending.holds = []


def _average(old: float, new: float) -> float:
    return new if old == 0 else 0.8 * old + 0.2 * new
