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
import ctypes.util
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

SLOT = 1 << 16  # bytes per hold count: memory is returned in runs of whole slots no batch in flight touches
PART = 8 << 20  # the largest single ranged GET (larger ranges are split: parallel requests)
WORKERS = 64  # ranged GETs in flight per process, at most
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


def _mprotect() -> Any:
    """libc's ``mprotect`` (None where there is none: the mapping then stays readable)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        call = libc.mprotect
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    call.restype = ctypes.c_int
    return call


_PROTECT = _mprotect() if hasattr(mmap, "PROT_READ") else None


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
        lo, hi = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        waited: list[Future[None]] = []
        with self._lock:
            if self.blocks is not None:  # whole blocks, each fetched once: none here already, none on its way
                wanted = _whole_blocks(lo, hi, self.nbytes)
                waited = self._on_their_way(*wanted)
                lo, hi = _whole_blocks(*wanted, self.nbytes, self._present | self._pending_slots())
            lo, hi = parts(lo, hi, PART)
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

    async def _fill(self, mapping: memoryview, lo: int, hi: int, gate: asyncio.Semaphore, future: Future[None]) -> None:
        if self.blocks is not None:
            await self._fill_checked(mapping, lo, hi, gate, future)
            return
        try:
            into = mapping[lo:hi]
            if self.cache is not None and await asyncio.to_thread(self.cache.read, self, lo, hi, into):
                future.set_result(None)
                return
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
            if self.cache is not None:
                await asyncio.to_thread(self.cache.write, self, lo, hi, into)
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


def _whole_blocks(
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    nbytes: int,
    present: npt.NDArray[np.bool_] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Byte ranges widened to whole blocks, sorted, cut where they overlap (each block in exactly one range; the
    caller's split into parallel GETs is kept), and without the blocks *present* says are here already.

    >>> [a.tolist() for a in _whole_blocks(np.array([70000, 0]), np.array([140000, 70000]), 1 << 20)]
    [[0, 131072], [131072, 196608]]
    >>> [a.tolist() for a in _whole_blocks(np.array([0]), np.array([200000]), 1 << 20, np.array([False, True, False, False]))]
    [[0, 131072], [65536, 262144]]
    """
    from .blocks import BLOCK

    keep = ends > starts
    order = np.argsort(starts[keep], kind="stable")
    lo = (starts[keep] // BLOCK * BLOCK)[order]
    hi = np.minimum(-(-ends[keep] // BLOCK) * BLOCK, nbytes)[order]
    if lo.size:
        covered = np.maximum.accumulate(hi)
        lo[1:] = np.maximum(lo[1:], covered[:-1])  # what an earlier range already takes
        hi = np.maximum(hi, lo)
    nonempty = hi > lo
    lo, hi = lo[nonempty], hi[nonempty]
    if present is None or not lo.size or not present.any():
        return lo, hi
    counts = (hi - lo + BLOCK - 1) // BLOCK
    first = np.repeat(lo // BLOCK, counts) + (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
    cut = np.repeat(np.arange(lo.size), counts)  # which range each block came from: runs never join two ranges
    wanted = ~present[first]
    first, cut = first[wanted], cut[wanted]
    if not first.size:
        return first, first
    breaks = np.flatnonzero((np.diff(first) != 1) | (np.diff(cut) != 0)) + 1
    heads = np.concatenate([[0], breaks])
    tails = np.concatenate([breaks - 1, [first.size - 1]])
    return first[heads] * BLOCK, np.minimum((first[tails] + 1) * BLOCK, nbytes)


def _positions(key: Any, size: int) -> npt.NDArray[np.int64]:
    """The positions an index array or a mask *key* reads of an array of *size* items (checked: numpy would
    read the ones in range before refusing the others)."""
    found = np.asarray(key)
    if found.dtype == np.bool_:
        if found.shape != (size,):
            raise IndexError(f"boolean index of shape {found.shape} does not match {size} tokens")
        return np.flatnonzero(found).astype(np.int64)
    if found.dtype.kind not in "iu":
        other: npt.NDArray[np.int64] = np.arange(size)[key].astype(np.int64)  # anything else numpy accepts
        return other
    picked = found.astype(np.int64)
    picked = np.where(picked < 0, picked + size, picked)
    if picked.size and (int(picked.min()) < 0 or int(picked.max()) >= size):
        raise IndexError(f"index out of bounds for {size} tokens")
    return picked


def _distinct(slots: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Sorted distinct *slots* (np.unique's first call imports numpy.ma: 40 ms in the middle of an epoch)."""
    ordered = np.sort(slots)
    found: npt.NDArray[np.int64] = ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if ordered.size else ordered
    return found


class RemoteTokens(np.ndarray):
    """A read-only token array whose bytes a `TokenFile` fetches on demand; pickles as the file, not its bytes.

    The gathers read it through the buffer protocol, the bytes of each batch
    fetched first by the prefetcher.  Indexing it (``tokens[a:b]``, ``tokens[i]``,
    an index array: what ``store.document(i)`` and the tools do) fetches the bytes
    it reads, then and there, and returns a plain array of them: never the zeros
    of a range no batch fetched.
    """

    remote: TokenFile | None

    def __array_finalize__(self, obj: Any) -> None:
        self.remote = getattr(obj, "remote", None)

    def __getitem__(self, key: Any) -> Any:
        remote, plain = self.remote, self.view(np.ndarray)
        if remote is None or self.ndim != 1:
            return plain[key]
        if plain.strides[0] != plain.itemsize:  # a strided view: fetch its whole span
            if not len(plain):
                return plain[key].copy()
            span = np.array([((len(plain) - 1) * plain.strides[0]) // plain.itemsize + 1])
            return self._read(plain, np.array([0]), span, lambda: plain[key].copy())
        if isinstance(key, (int, np.integer)):
            index = int(key) + (len(plain) if key < 0 else 0)
            if not 0 <= index < len(plain):
                return plain[key]  # numpy's IndexError
            return self._read(plain, np.array([index]), np.array([index + 1]), lambda: plain[index])
        if isinstance(key, slice):
            start, stop, step = key.indices(len(plain))
            if (step > 0 and start >= stop) or (step < 0 and start <= stop):
                return plain[key].copy()
            lo, hi = (start, stop) if step > 0 else (stop + 1, start + 1)
            return self._read(plain, np.array([lo]), np.array([hi]), lambda: plain[key].copy())
        picked = _positions(key, len(plain))  # an index array or a mask: the positions it reads
        flat = _distinct(picked.reshape(-1))
        if not flat.size:
            return plain[key].copy()
        cuts = np.flatnonzero(np.diff(flat) != 1) + 1
        starts, ends = flat[np.r_[0, cuts]], flat[np.r_[cuts - 1, flat.size - 1]] + 1
        return self._read(plain, starts, ends, lambda: plain[key].copy())

    def _read(self, plain: npt.NDArray[Any], starts: npt.NDArray[Any], ends: npt.NDArray[Any], take: Any) -> Any:
        """Fetch positions ``[starts, ends)`` of this array (counted from its first token, in the strides of its
        items), then return ``take()`` while they are held (released afterwards)."""
        remote = self.remote
        assert remote is not None
        remote._mapping()
        size = plain.itemsize
        first = (plain.ctypes.data - remote._address) // size  # this view's first token within the file
        lo = (np.asarray(starts, dtype=np.int64) + first) * size
        hi = (np.asarray(ends, dtype=np.int64) + first) * size
        slots = remote.hold(lo, hi)
        try:
            for future in remote.fetch(lo.tolist(), hi.tolist()):
                future.result()
            return take()
        finally:
            remote.release(slots)

    def __reduce__(self) -> tuple[Any, ...]:
        remote = self.remote
        if remote is not None and self.size == remote.count and self.ndim == 1:
            return (_reopen, (remote,))
        plain: tuple[Any, ...] = np.asarray(self[...] if remote is None else self[:]).__reduce__()  # type: ignore[assignment]
        return plain

    def close(self) -> None:
        """Close the file behind these tokens (`TokenFile.close`; what ``store.close()`` calls)."""
        if self.remote is not None:
            self.remote.close()

    def __repr__(self) -> str:  # never reads a token (most of them are unreadable until held)
        remote = self.remote
        where = "" if remote is None else f" of {remote.client.where.url}/{remote.name}"
        return f"RemoteTokens({self.size} {self.dtype.name} tokens{where})"

    __str__ = __repr__


def _reopen(remote: TokenFile) -> RemoteTokens:
    return remote.array()


def remote_file(tokens: Any) -> TokenFile | None:
    """The `TokenFile` behind a store's *tokens*, or None for local tokens."""
    return getattr(tokens, "remote", None) if isinstance(tokens, RemoteTokens) else None


def _slots(starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    first, last = starts // SLOT, (ends - 1) // SLOT
    counts = last - first + 1
    total = int(counts.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    slots: npt.NDArray[np.int64] = np.repeat(first, counts) + (np.arange(total) - offsets)
    return slots


def parts(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], size: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Byte ranges ``[starts, ends)`` cut into pieces of at most *size* bytes (in order; empty ranges dropped).

    >>> [a.tolist() for a in parts(np.array([0, 10]), np.array([5, 30]), 8)]
    [[0, 10, 18, 26], [5, 18, 26, 30]]
    """
    counts = np.maximum(-(-(ends - starts) // size), 0)
    total = int(counts.sum())
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    lo = np.repeat(starts, counts) + offsets * size
    return lo, np.minimum(lo + size, np.repeat(ends, counts))


def coalesce(
    starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], gap: int, spare: float = 0.04
) -> tuple[list[int], list[int]]:
    """Sorted, merged byte ranges: overlapping ranges become one, and so do ranges at most *gap* bytes apart,
    smallest gaps first, while the gap bytes fetched stay within *spare* of the bytes needed.

    >>> coalesce(np.array([0, 10, 100]), np.array([5, 20, 110]), gap=8, spare=1.0)
    ([0, 100], [20, 110])
    >>> coalesce(np.array([0, 10, 100]), np.array([5, 20, 110]), gap=8, spare=0.0)
    ([0, 10, 100], [5, 20, 110])
    """
    if not starts.size:
        return [], []
    order = np.argsort(starts, kind="stable")
    lo, hi = starts[order], np.maximum.accumulate(ends[order])
    touching = np.flatnonzero(lo[1:] > hi[:-1]) + 1  # breaks between ranges that do not overlap or touch
    firsts = np.concatenate([[0], touching])
    lasts = np.concatenate([touching - 1, [lo.size - 1]])
    lo, hi = lo[firsts], hi[lasts]
    gaps = lo[1:] - hi[:-1]
    budget = spare * float((hi - lo).sum())
    by_size = np.argsort(gaps, kind="stable")
    taken = by_size[(np.cumsum(gaps[by_size]) <= budget) & (gaps[by_size] <= gap)]
    keep = np.ones(gaps.size, dtype=bool)
    keep[taken] = False  # merged: no break there
    breaks = np.flatnonzero(keep) + 1
    firsts = np.concatenate([[0], breaks])
    lasts = np.concatenate([breaks - 1, [lo.size - 1]])
    return lo[firsts].tolist(), hi[lasts].tolist()
