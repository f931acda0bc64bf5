"""A remote store's token array: the whole ``tokens.bin`` as virtual memory, readable only where it is held.

`RemoteTokens` is a read-only numpy array over a private anonymous mapping of
the object's full size (``MAP_NORESERVE``: address space only), so every gather
runs unchanged on it.  The guarantee that no road reads bytes that were not
fetched is structural: the mapping is ``PROT_NONE`` except where some caller
*holds* a range.  `TokenFile.hold` makes a range's slots readable (and
writable, for the GETs that fill them), `TokenFile.fetch` fills them, and
`TokenFile.release` gives their memory back (``madvise(MADV_DONTNEED)``) and
makes them unreadable again once nothing holds them.  Every gather reaches the
tokens through `streambatch.io.remote.prefetch.fetched` (each kind's
``gather_batches``, of which ``gather(i)`` is the one-batch case), which holds
and fetches the spans of a batch before the batch is gathered; indexing the
array (``tokens[a:b]``, what ``store.document(i)`` and the tools do) holds and
fetches what it reads, then and there.  A road that forgot to would read an
unreadable page: the process stops with a fault, never with the zeros of an
unfetched range.  (Where ``mprotect`` is missing, not Linux or macOS, the
mapping stays readable and the holds alone order the reads.)

Requests run on one thread per process (`requests_loop`).  `TokenFile.close`
(what ``store.close()`` calls) waits for the file's GETs in flight and gives
its memory back; a closed file refuses to hold or fetch.  At interpreter exit
(`shutdown`, an ``atexit`` hook) no new GET starts, the ones in flight are
waited for, and the loop stops before the interpreter is finalised: a GET
begun ahead by the prefetcher never completes into a finalised process.  A
pickled `RemoteTokens` (a spawned DataLoader worker) travels as its address and
ETag, never as bytes; a forked one starts with nothing held (and nothing
readable).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import mmap
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, StoreError
from .blocks import Blocks
from .client import STATS, ObjectClient
from .mapping import PROTECT as _PROTECT
from .mapping import RemoteTokens
from .mapping import remote_file as remote_file  # its old import path
from .ranges import coalesce as coalesce  # its old import path
from .ranges import distinct as _distinct
from .ranges import parts as parts
from .ranges import whole_blocks as _whole_blocks

SLOT = 1 << 16  # bytes per hold count: memory is returned in runs of whole slots no batch in flight touches
PART = 8 << 20  # the largest single ranged GET (larger ranges are split: parallel requests)
WORKERS = 64  # ranged GETs in flight per process, at most
WHOLE = 1 << 20  # a tokens.bin this small is fetched whole at its first read (one round trip, then nothing)
KEEP = 64 << 20  # bytes of checked blocks a file keeps in memory after no batch holds them (reused, not fetched again)
DRAIN_SECONDS = 60.0  # at exit (or close), how long GETs in flight are waited for, at most
_LOOPS: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore, threading.Thread]] = {}
_LOOPS_LOCK = threading.Lock()
_CLOSING: set[int] = set()  # processes whose request loop is shutting down: no new GET starts


def requests_loop() -> tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]:
    """This process's request thread: an event loop running every ranged GET, and the gate bounding them
    (`WORKERS` at once); made again in a new process.  Refused (`StoreError`) once `shutdown` began."""
    pid = os.getpid()
    with _LOOPS_LOCK:
        if pid in _CLOSING:
            raise StoreError("the interpreter is exiting: no new object-store request is started")
        found = _LOOPS.get(pid)
        if found is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="streambatch-fetch", daemon=True)
            thread.start()
            found = _LOOPS[pid] = (loop, asyncio.Semaphore(WORKERS), thread)
        return found[0], found[1]


def shutdown(timeout: float = DRAIN_SECONDS) -> None:
    """Stop this process's request loop: no new GET starts, those in flight are waited for (at most *timeout*
    seconds), then the loop stops and its thread is joined.  Registered with `atexit`, so a GET the prefetcher
    began ahead never completes after the interpreter was finalised (that crashed the process at exit)."""
    pid = os.getpid()
    with _LOOPS_LOCK:
        found = _LOOPS.pop(pid, None)
        _CLOSING.add(pid)
    if found is None:
        return
    loop, _, thread = found

    async def drain() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # tasks started by calls queued before the flag: waited for too
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            if not tasks:
                return
            await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))

    with contextlib.suppress(Exception):  # at exit: a GET that outlived the drain is not waited for again
        asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout + 1)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


atexit.register(shutdown)


class Link:
    """What this process measured of its link: seconds a ranged GET takes (moving average, read by the prefetcher)."""

    seconds: float = 0.0

    def record(self, seconds: float) -> None:
        """One GET took *seconds*."""
        self.seconds = seconds if self.seconds == 0 else 0.9 * self.seconds + 0.1 * seconds


LINK = Link()


class TokenFile:
    """One remote ``tokens.bin``: its client, size, ETag, the mapping it is read into, and the holds on it."""

    def __init__(
        self, client: ObjectClient, name: str, dtype: np.dtype[Any], count: int, etag: str | None, **settings: Any
    ) -> None:
        self.client, self.name, self.dtype, self.count, self.etag = client, name, dtype, count, etag
        self.nbytes = count * dtype.itemsize
        self.settings = settings  # prefetch depth, cache: read by the prefetcher; blocks: the block digests
        self.cache: Any = settings.get("cache")
        self.blocks: Blocks | None = settings.get("blocks")  # None: a store trusted without digests (--trust-remote)
        self.closed = False
        self._map: mmap.mmap | None = None
        self._address = 0
        self._pid = -1
        self._holds = np.zeros(0, dtype=np.int32)
        self._lock = threading.Lock()
        self._flying: set[Future[None]] = set()  # this file's GETs in flight (waited for by close)
        self._present = np.zeros(0, dtype=bool)  # slots holding checked blocks (kept while within KEEP)
        self._kept: dict[int, None] = {}  # present slots no batch holds, oldest first (unreadable until held)
        self._pending: dict[int, Future[None]] = {}  # slots a GET of this process is bringing now
        self.complete = False  # every block here, checked, and held for good (a file within KEEP): nothing to fetch
        self._held_whole = False  # every slot held once for good (a small or complete file)

    def __repr__(self) -> str:
        return f"TokenFile({self.client.where.url}/{self.name}, {self.nbytes} bytes)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenFile, (self.client, self.name, self.dtype, self.count, self.etag), {"settings": self.settings})

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self.cache = self.settings.get("cache")
        self.blocks = self.settings.get("blocks")

    def array(self) -> RemoteTokens:
        """The token array over this file's mapping (made on first use)."""
        view = np.frombuffer(self._mapping(), dtype=self.dtype, count=self.count)
        tokens: RemoteTokens = view.view(RemoteTokens)
        tokens.remote = self
        tokens.flags.writeable = False
        return tokens

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_NORESERVE", 0)
            self._map = mmap.mmap(-1, max(self.nbytes, 1), flags=flags)
            self._address = int(np.frombuffer(self._map, dtype=np.uint8).ctypes.data)
            self._holds = np.zeros(-(-self.nbytes // SLOT) or 1, dtype=np.int32)
            self._present = np.zeros(self._holds.size, dtype=bool)
            self._kept = {}
            self._pid = os.getpid()
            self._protect(0, len(self._map), readable=False)  # nothing is readable before it is held
        elif self._pid != os.getpid():  # a forked child: nothing it inherited is held (or readable) for it
            self._lock = threading.Lock()  # the parent's may have been taken when it forked
            with self._lock:
                self._holds[:] = 0
                self._present[:] = False
                self._kept = {}
                self._pending = {}
                self.complete = self._held_whole = False
                self._flying = set()
                self._pid = os.getpid()
                self._map.madvise(mmap.MADV_DONTNEED, 0, len(self._map))
                self._protect(0, len(self._map), readable=False)
        return self._map

    def _protect(self, lo: int, hi: int, *, readable: bool) -> None:
        """Make bytes ``[lo, hi)`` of the mapping readable and writable, or neither."""
        if _PROTECT is None or hi <= lo:
            return
        prot = (mmap.PROT_READ | mmap.PROT_WRITE) if readable else getattr(mmap, "PROT_NONE", 0)
        if _PROTECT(self._address + lo, hi - lo, prot) != 0:
            err = ctypes.get_errno()
            raise StoreError(f"{self!r}: mprotect failed ({os.strerror(err)}); the mapping cannot be guarded")

    def _slot_runs(self, slots: npt.NDArray[np.int64]) -> list[tuple[int, int]]:
        """Byte ranges ``[lo, hi)`` of the runs of consecutive sorted, distinct *slots* (within the mapping)."""
        mapping = self._map
        assert mapping is not None
        cuts = np.flatnonzero(np.diff(slots) != 1) + 1
        return [(int(run[0]) * SLOT, min((int(run[-1]) + 1) * SLOT, len(mapping))) for run in np.split(slots, cuts) if run.size]

    def check_open(self) -> None:
        """Refuse (`ConfigError`) a closed file."""
        if self.closed:
            raise ConfigError(
                f"{self.client.where.url} was closed (store.close()); open the store again to read it "
                "(sb.open_store, or leave its `with` block later)"
            )

    # -- holds ---------------------------------------------------------------------------
    def hold(self, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Hold the slots of byte ranges ``[starts, ends)``: readable from now on, none released until `release`;
        the slots held.  A closed file refuses (`ConfigError`)."""
        self.check_open()
        self._mapping()
        slots = _slots(starts, ends)
        with self._lock:
            distinct = _distinct(slots)
            fresh = distinct[self._holds[distinct] == 0]
            np.add.at(self._holds, slots, 1)
            for slot in fresh.tolist():  # held again: no longer among the kept ones to evict
                self._kept.pop(slot, None)
            for lo, hi in self._slot_runs(fresh):
                self._protect(lo, hi, readable=True)
        return slots

    def release(self, slots: npt.NDArray[np.int64]) -> None:
        """Drop the holds of *slots*; return the memory of every slot no longer held (unreadable again)."""
        if not slots.size or self.closed:
            return
        with self._lock:
            if self._pid != os.getpid():  # holds taken in the parent: not this process's
                return
            np.subtract.at(self._holds, slots, 1)
            free = slots[self._holds[slots] == 0]
            if free.size:
                mapping = self._map
                assert mapping is not None
                free = _distinct(free)
                kept = free[self._present[free]]  # checked blocks: kept (unreadable) for the next batch that needs them
                for slot in kept.tolist():
                    self._kept[slot] = None
                for lo, hi in self._slot_runs(free):
                    self._protect(lo, hi, readable=False)
                gone = free[~self._present[free]]
                while len(self._kept) * SLOT > KEEP:  # the oldest kept ones go
                    gone = np.append(gone, next(iter(self._kept)))
                    self._present[gone[-1]] = False
                    del self._kept[int(gone[-1])]
                for lo, hi in self._slot_runs(_distinct(gone)):
                    mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def held_bytes(self) -> int:
        """Bytes of the mapping held now (slots some scheduled batch needs)."""
        return int(np.count_nonzero(self._holds)) * SLOT

    def close(self, timeout: float = DRAIN_SECONDS) -> None:
        """Wait for this file's GETs in flight (at most *timeout* seconds), give its memory back and make it
        unreadable; holding or fetching afterwards is a `ConfigError`.  Closing again does nothing."""
        if self.closed:
            return
        self.closed = True
        deadline = time.monotonic() + timeout
        for future in list(self._flying):
            with contextlib.suppress(Exception):  # a failed or cancelled GET: nothing to wait for
                future.result(max(0.0, deadline - time.monotonic()))
        mapping = self._map
        if mapping is not None and self._pid == os.getpid():
            with self._lock:
                self._holds[:] = 0
                self.complete = self._held_whole = False
                mapping.madvise(mmap.MADV_DONTNEED, 0, len(mapping))
                self._protect(0, len(mapping), readable=False)

    # -- fetching ------------------------------------------------------------------------
    def fetch(
        self, starts: Sequence[int] | npt.NDArray[np.int64], ends: Sequence[int] | npt.NDArray[np.int64]
    ) -> list[Future[None]]:
        """Start fetching byte ranges ``[starts, ends)`` into the mapping (held by the caller), ranges longer
        than `PART` split; one future per GET, in the order of *starts*."""
        self.check_open()
        mapping = memoryview(self._mapping())
        if self.complete:  # every block is here already
            return []
        lo, hi = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        waited: list[Future[None]] = []
        with self._lock:
            if self.blocks is not None:  # whole blocks, each fetched once: none here already, none on its way
                if self.nbytes <= WHOLE:  # a small object: all of it now, held for good once here (`complete`)
                    self._hold_whole()
                    lo, hi = np.array([0], dtype=np.int64), np.array([self.nbytes], dtype=np.int64)
                wanted = _whole_blocks(lo, hi, self.nbytes)
                waited = self._on_their_way(*wanted)
                lo, hi = _whole_blocks(*wanted, self.nbytes, self._present | self._pending_slots())
            size = PART
            if self.blocks is not None and self.nbytes <= WHOLE:  # a small object in a few parallel GETs
                size = max(4 * SLOT, -(-self.nbytes // 8 // SLOT) * SLOT)
            lo, hi = parts(lo, hi, size)
            pieces = list(zip(lo.tolist(), hi.tolist(), strict=True))
            futures: list[Future[None]] = [Future() for _ in pieces]
            if self.blocks is not None:
                for (a, b), future in zip(pieces, futures, strict=True):
                    for slot in range(a // SLOT, -(-b // SLOT)):
                        self._pending[slot] = future
        loop, gate = requests_loop()
        flying = self._flying
        for future in futures:
            flying.add(future)
            future.add_done_callback(flying.discard)

        def start() -> None:  # on the request thread: one task per GET, in order
            for (a, b), future in zip(pieces, futures, strict=True):
                loop.create_task(self._fill(mapping, a, b, gate, future))

        loop.call_soon_threadsafe(start)
        return futures + waited

    def _hold_whole(self) -> None:
        """Hold every slot once, for good (under the lock; once): a small file is fetched whole and kept readable."""
        if not self._held_whole:
            self._held_whole = True
            fresh = np.flatnonzero(self._holds == 0)
            self._holds += 1
            for lo, hi in self._slot_runs(fresh):
                self._protect(lo, hi, readable=True)
            self._kept = {}

    def _pending_slots(self) -> npt.NDArray[np.bool_]:
        """Slots a GET of this process is bringing now (under the lock)."""
        pending = np.zeros(self._present.size, dtype=bool)
        if self._pending:
            pending[np.fromiter(self._pending, dtype=np.int64, count=len(self._pending))] = True
        return pending

    def _on_their_way(self, lo: npt.NDArray[np.int64], hi: npt.NDArray[np.int64]) -> list[Future[None]]:
        """The GETs already bringing some block of ``[lo, hi)`` (under the lock): waited for, not repeated."""
        found: dict[int, Future[None]] = {}
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            for slot in range(a // SLOT, -(-b // SLOT)):
                future = self._pending.get(slot)
                if future is not None:
                    found[id(future)] = future
        return list(found.values())

    def _arrived(self, lo: int, hi: int, future: Future[None], ok: bool) -> None:
        """The GET *future* of blocks ``[lo, hi)`` ended: present if *ok*, no longer on its way either way."""
        with self._lock:
            for slot in range(lo // SLOT, -(-hi // SLOT)):
                if self._pending.get(slot) is future:
                    del self._pending[slot]
            if ok and self._present.size:
                self._present[lo // SLOT : -(-hi // SLOT)] = True
                if not self.complete and self.nbytes <= KEEP and self._present.all():
                    self._hold_whole()  # the whole file, checked: held (readable) until close, nothing fetched again
                    self.complete = True

    async def _fill(self, mapping: memoryview, lo: int, hi: int, gate: asyncio.Semaphore, future: Future[None]) -> None:
        if self.blocks is not None:
            await self._fill_checked(mapping, lo, hi, gate, future)
            return
        try:  # a store trusted without digests (--trust-remote): the range as it comes, no cache (it keeps checked blocks)
            await self._get(lo, hi, mapping[lo:hi], gate)
        except BaseException as err:  # the consumer waiting on *future* gets it
            future.set_exception(err)
        else:
            future.set_result(None)

    async def _fill_checked(self, mapping: memoryview, lo: int, hi: int, gate: asyncio.Semaphore, future: Future[None]) -> None:
        """Whole blocks ``[lo, hi)``: from the cache where it holds them (checked), the rest in one GET into a buffer
        of its own, each block checked against its digest (fetched once more if one does not match) before it
        is copied where a gather reads it; then kept in the cache."""
        blocks = self.blocks
        assert blocks is not None
        where = f"{self.client.where.url}/{self.name}"
        try:
            cached = await asyncio.to_thread(self._from_cache, mapping, lo, hi)
            if cached < hi:
                lo_get = cached
                buffer = bytearray(hi - lo_get)
                for attempt in (1, 2):
                    await self._get(lo_get, hi, memoryview(buffer), gate)
                    bad = blocks.bad_block(lo_get, memoryview(buffer))
                    if bad is None:
                        break
                    STATS.add(retries=1)
                    if attempt == 2:
                        raise blocks.refused(where, bad)
                mapping[lo_get:hi] = buffer
            self._arrived(lo, hi, future, ok=True)
            if cached < hi and self.cache is not None:
                await asyncio.to_thread(self.cache.keep, blocks, lo_get, memoryview(buffer))
        except BaseException as err:  # the consumer waiting on *future* gets it
            self._arrived(lo, hi, future, ok=False)
            future.set_exception(err)
        else:
            future.set_result(None)

    def _from_cache(self, mapping: memoryview, lo: int, hi: int) -> int:
        """Copy the cached leading blocks of ``[lo, hi)`` into the mapping; where the first one not cached begins."""
        if self.cache is None or self.blocks is None:
            return lo
        return int(self.cache.take(self.blocks, lo, hi, mapping))

    async def _get(self, lo: int, hi: int, into: memoryview, gate: asyncio.Semaphore) -> None:
        async with gate:
            if os.getpid() in _CLOSING or self.closed:  # shutting down: GETs not yet begun never begin
                raise StoreError(f"{self.client.where.url}/{self.name}: closed before this range was fetched")
            STATS.flight(1)
            began = time.perf_counter()
            try:
                await self.client.get_range_async(self.name, lo, hi, self.etag, into=into)
            finally:
                STATS.flight(-1)
        LINK.record(time.perf_counter() - began)


def _slots(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    first, last = starts // SLOT, (ends - 1) // SLOT
    counts = last - first + 1
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    slots: npt.NDArray[np.int64] = np.repeat(first, counts) + (np.arange(total) - offsets)
    return slots
