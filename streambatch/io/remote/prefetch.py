"""Plan-driven prefetch: fetch the token ranges of the next batches before the consumer asks for them.

A `Reader` serves one lazy sequence of batches (`streambatch.Batches`).  The
plan names every batch's items, so the token spans of batch ``i`` are known
before it is gathered (*spans_of* names those of several batches at once).  When batch ``i`` is asked for, the reader
makes sure its ranges are in memory, gathers it, and keeps the batches the
consumer will ask for next on their way: ``i + step, i + 2 step, ...`` where
*step* is the distance between its last two requests (1 for an epoch, the
worker count for a DataLoader worker's share).

Batches are fetched in *groups*: the token spans of consecutive batches of
the path (one vectorized look-up, *spans_of*) are coalesced together, ranges
closer than `GAP` merged while the gap bytes stay within `SPARE` of the bytes
needed, and split into parts (an eighth of the group, at least `MIN_PART`)
that go out at once as concurrent ranged GETs, in store order, on one request
thread (at most `streambatch.io.remote.tokens.WORKERS` in flight per process).
A batch waits for its group's GETs, so groups are small (about `GROUP`
bytes; those of a new path grow from 4 batches, doubling, so the first ones
arrive soon) and many are on their way: new ones are started when less than
half the *horizon* is still ahead of the consumer.  The horizon (bytes) is sized from
what the reader measures, the consumer's rate times how long a GET takes (a
bandwidth-delay product, four times over), between `MIN_HORIZON` and
`MAX_HORIZON`; ``prefetch=N`` (on `open_store`) fixes the batches ahead instead.

A batch asked for off the path (the first one, a resume at ``p``, a jump) is
fetched first, so a resume fetches nothing before ``p``; after it only the next
batch is started until the second request shows the step, unless the caller
names the step (``along``: an iteration over every batch), and then the batches
after it are started at once, while its own ranges arrive.  Memory stays bounded: a group's ranges are held until its last batch
is served (or dropped) and its GETs are done, then given back.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .ranges import coalesce, parts
from .tokens import LINK, PART, TokenFile

T = TypeVar("T")
Span = tuple[Any, npt.NDArray[np.int64], npt.NDArray[np.int64]]  # (store or corpus, flat starts, lengths)
Ranges = dict[TokenFile, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]
GAP = 1 << 16  # ranges closer than this may be one request (the gap's bytes are fetched too) ...
SPARE = 0.04  # ... while the gap bytes stay within this share of the bytes needed
MIN_PART = 256 << 10  # a group's parts: at least this many bytes (a coalesced range shorter is one GET)
MIN_HORIZON = 1 << 20  # bytes ahead of the consumer, at least ...
MAX_HORIZON = 32 << 20  # ... and at most (the memory a reader holds is about this)
MAX_AHEAD = 4096  # batches ahead at most
GROUP = 1 << 20  # bytes a group needs, about: a batch waits for its group's GETs, so groups stay small
FIRST_GROUPS = 3  # groups a named path's first batch starts before it is waited for (its own GETs go out first)


def remote_files(store: Any) -> list[TokenFile]:
    """The remote token files a store or corpus reads (none: all local)."""
    return [f for f in store.flat().files if f is not None]


def file_ranges(spans: Sequence[Span]) -> Ranges:
    """Byte ranges ``(starts, ends)`` per remote token file of flat token *spans*, as they are (not merged);
    local stores are left out."""
    found: dict[TokenFile, list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]] = {}
    for store, starts, lengths in spans:
        flat = store.flat()
        if not any(f is not None for f in flat.files):
            continue
        sizes = np.asarray(lengths, dtype=np.int64)
        for k, rows, local in flat.split(np.asarray(starts, dtype=np.int64).reshape(-1)):
            file = flat.files[k]
            if file is not None:
                size = file.dtype.itemsize
                found.setdefault(file, []).append((local * size, np.minimum((local + sizes[rows]) * size, file.nbytes)))
    return {file: (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])) for file, parts in found.items()}


def byte_ranges(spans: Sequence[Span], gap: int = GAP, spare: float = SPARE) -> dict[TokenFile, tuple[list[int], list[int]]]:
    """Coalesced byte ranges per remote token file of flat token *spans* (what one batch alone would fetch)."""
    return {file: coalesce(lo, hi, gap, spare) for file, (lo, hi) in file_ranges(spans).items()}


class _Group:
    """Batches fetched together: the ranges held for them and their GETs (each of the batches waits for all)."""

    def __init__(self, batches: Sequence[int]) -> None:
        self.holds: list[tuple[TokenFile, npt.NDArray[np.int64]]] = []
        self.futures: list[Future[None]] = []
        self.count = len(batches)
        self.open = len(batches)  # batches neither served nor dropped
        self.needed = 0  # bytes the batches need
        self.requested = 0  # bytes requested
        self.ready = False  # every GET answered (and none failed)

    def wait(self) -> None:
        """Until every GET of the group is answered (its failure raised); once done, free for its other batches."""
        if not self.ready:
            for future in self.futures:
                future.result()
            self.ready = True
        for file, _ in self.holds:  # closed since: its memory was given back (and made unreadable)
            file.check_open()

    @property
    def share(self) -> float:
        """Bytes needed per batch."""
        return self.needed / max(self.count, 1)

    def leave(self) -> None:
        """One batch is served or dropped; the last one out gives the memory back (once the GETs are done)."""
        self.open -= 1
        if self.open:
            return
        left = [f for f in self.futures if not f.done()]
        if not left:
            self.release()
            return
        remaining = [len(left)]

        def done(_: Future[None]) -> None:
            remaining[0] -= 1
            if remaining[0] == 0:
                self.release()

        for future in left:
            future.add_done_callback(done)

    def release(self) -> None:
        holds, self.holds = self.holds, []
        for file, slots in holds:
            file.release(slots)


def start_group(batches: Sequence[int], spans: Sequence[Span], part: int | None = None) -> _Group:
    """Hold, coalesce and start fetching the token *spans* of *batches*: parts of *part* bytes (default: an
    eighth of the group, between `MIN_PART` and `PART`), in the order of the store."""
    group = _Group(batches)
    for file, (lo, hi) in file_ranges(spans).items():
        merged_lo, merged_hi = (np.asarray(x, dtype=np.int64) for x in coalesce(lo, hi, GAP, SPARE))
        total = int((merged_hi - merged_lo).sum())
        starts, ends = parts(merged_lo, merged_hi, part or max(MIN_PART, min(total // 8, PART)))
        group.holds.append((file, file.hold(merged_lo, merged_hi)))
        group.futures.extend(file.fetch(starts, ends))
        group.needed += int((hi - lo).sum())
        group.requested += total
    return group


class Reader:
    """Fetches the ranges of the batches a consumer asks for, and of those it will ask for next."""

    def __init__(self, spans_of: Callable[[Sequence[int]], Sequence[Span]], count: int, files: list[TokenFile]) -> None:
        self._spans_of, self._count = spans_of, count
        self._files = files
        fixed = [int(f.settings["prefetch"]) for f in files if f.settings.get("prefetch") is not None]
        self._fixed: int | None = fixed[0] if fixed else None
        self._groups: dict[int, _Group] = {}  # each scheduled batch's group
        self._next: int | None = None  # the next batch of the path not yet scheduled
        self._ahead_bytes = 0.0  # bytes of the scheduled batches not yet served
        self._last: int | None = None
        self._step = 1
        self._path_step = 0  # the step the scheduled batches follow (0: none scheduled yet)
        self._steady = False  # the step is known (two requests along one path)
        self._asked_at: float | None = None
        self._interval = 0.0  # consumer: seconds between requests (moving average)
        self._batch_bytes = 0.0  # bytes a batch needs (moving average)
        self._horizon = 4 * MIN_HORIZON
        self._grow = 4  # batches in the next group, at most (doubles with each group)

    @property
    def depth(self) -> int:
        """Batches scheduled ahead now."""
        return len(self._groups)

    @property
    def horizon(self) -> int:
        """Bytes kept on their way ahead of the consumer (tuned; ``prefetch=N``: unbounded by bytes)."""
        return self._horizon

    @property
    def complete(self) -> bool:
        """Every file this reader fetches from is here whole, checked and held for good (nothing left to fetch)."""
        return bool(self._files) and all(f.complete for f in self._files)

    def get(self, index: int, gather: Callable[[], T], along: int | None = None) -> T:
        """Batch *index*, gathered by *gather* once its ranges are in memory; the next ones are started first.

        *along*: the step of the path the caller walks, when it knows it (an iteration over every batch: 1).
        A path's first batch then starts the batches after it at once, while its own ranges arrive, instead
        of one batch ahead until a second request shows the step (that wait is a GET's time)."""
        if self.complete:  # every byte here, checked and held: nothing to fetch
            if self._groups:
                self.close()
            return gather()
        now = time.perf_counter()
        if self._asked_at is not None:  # the consumer's own time per batch (not the time spent waiting here)
            self._interval = _average(self._interval, now - self._asked_at)
        group = self._groups.get(index)
        on_path = group is not None and self._last is not None and index > self._last
        if on_path:
            assert self._last is not None
            self._steady = self._steady or index - self._last == self._step
            self._step = index - self._last
        else:  # off the path: fetched alone, first
            self.close()
            self._steady, self._grow = along is not None, 4
            if along is not None:
                self._step = along
            elif self._last is not None and index > self._last:
                self._step = index - self._last
            group = self._schedule([index])
        self._last = index
        assert group is not None
        early = on_path or self._steady  # the batches ahead go out before this one is waited for
        if early:  # a named path's first batch: its first groups now (4, 8, 16 batches), the rest once it is here
            self._ahead(index, groups=None if on_path else FIRST_GROUPS)
        try:
            group.wait()
            return gather()
        finally:
            self._leave(index)
            if not on_path:
                self._ahead(index)
            self._tune()
            self._asked_at = time.perf_counter()

    def close(self) -> None:
        """Drop every batch still on its way (their memory is returned as their GETs finish)."""
        for index in list(self._groups):
            self._leave(index)
        self._next = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone
            self.close()

    def _schedule(self, batches: Sequence[int]) -> _Group:
        group = start_group(batches, self._spans_of(batches))
        for j in batches:
            self._groups[j] = group
        self._ahead_bytes += group.needed
        if group.needed:
            self._batch_bytes = _average(self._batch_bytes, group.share)
        return group

    def _leave(self, index: int) -> None:
        group = self._groups.pop(index, None)
        if group is not None:
            self._ahead_bytes -= group.share
            group.leave()

    def _ahead(self, index: int, groups: int | None = None) -> None:
        """Drop what the consumer passed or left; start the next group when less than half the horizon is ahead."""
        step = self._step
        if step == self._path_step:  # all scheduled along this path, in order: the passed ones come first
            passed = list(itertools.takewhile(lambda j: j < index, self._groups))
        else:  # a new step: what is off its path goes too, and the path goes on after what stays
            passed = [j for j in self._groups if j != index and (j < index or (j - index) % step)]
            self._path_step, self._next = step, None
        for j in passed:
            self._leave(j)
        if self._next is None or self._next <= index or (self._next - index) % step:
            self._next = max(self._groups, default=index) + step
        if not self._steady:  # the step is a guess: one batch ahead until it is confirmed
            limit_batches, limit_bytes = 1, MAX_HORIZON
        elif self._fixed is not None:
            limit_batches, limit_bytes = self._fixed, MAX_HORIZON * 16
        else:
            limit_batches, limit_bytes = MAX_AHEAD, self._horizon
        current = self._groups.get(index)  # the batch being served (when on the path) is not ahead
        ahead = len(self._groups) - (current is not None)
        ahead_bytes = self._ahead_bytes - (current.share if current is not None else 0.0)
        if ahead > limit_batches // 2 or ahead_bytes > limit_bytes // 2:
            return
        room = limit_batches - ahead
        if self._batch_bytes > 0:
            room = min(room, max(1, int((limit_bytes - ahead_bytes) // self._batch_bytes)))
        wanted = range(self._next, self._count, step)[:room]
        cap = max(4, int(GROUP // self._batch_bytes)) if self._batch_bytes > 0 else 4
        while len(wanted) and groups != 0:  # groups of about GROUP bytes at most; a new path's grow from 4 batches
            groups = None if groups is None else groups - 1
            size = min(self._grow, cap)
            self._grow = 2 * size
            self._schedule(wanted[:size])
            self._next = wanted[:size][-1] + step
            wanted = wanted[size:]

    def _tune(self) -> None:
        """A horizon of a few times the bytes the consumer reads while one GET is answered (bounded)."""
        if self._fixed is not None or self._interval <= 0 or self._batch_bytes <= 0 or LINK.seconds <= 0:
            return
        rate = self._batch_bytes / max(self._interval, 1e-5)  # bytes/s the consumer reads
        self._horizon = int(min(MAX_HORIZON, max(MIN_HORIZON, 4 * rate * LINK.seconds)))


def _average(old: float, new: float) -> float:
    return new if old == 0 else 0.8 * old + 0.2 * new
