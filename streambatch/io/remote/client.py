"""The requests a remote store makes: HEAD, whole and ranged GETs, PUTs; retried with backoff, counted.

One client per location and process (the object-store handle is built again in
a forked or spawned worker, never shared across a fork).  Timeouts, 5xx
responses and dropped connections are retried ``retries`` times with
exponential backoff and jitter; each retry is counted in `Stats` (and logged at
DEBUG level on the ``streambatch.remote`` logger, never printed one by one); the
last failure is one `StoreError` line saying how many attempts were made and
what the retries met.  A missing bucket, object or credentials is one clear
line, never retried.  A ranged GET names the ETag recorded at open
(``If-Match``): an object replaced since is a `DataError` naming it.

Every response is read as a stream under a cap: a whole GET under the limit its
caller gives (the header's own sizes), a range under its length, so a server
announcing ``Content-Length: 2**40`` is a `DataError`, never an allocation of
that size.  Every message is redacted (`streambatch.io.remote.location.redact`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ...errors import DataError, MissingObject, StoreError, missing_dependency
from .location import Location, client_config, is_secret, redact

log = logging.getLogger("streambatch.remote")
_STATUS = re.compile(r"status code: (\d{3})")


@dataclass
class Stats:
    """What one process's client did: requests, bytes received, retries (read by benchmarks and tests)."""

    requests: int = 0
    range_requests: int = 0
    bytes: int = 0
    retries: int = 0
    puts: int = 0
    cache_hits: int = 0  # blocks served by the disk cache ...
    cache_misses: int = 0  # ... and not found there (fetched)
    cache_bytes: int = 0  # bytes the cache served
    in_flight: int = 0  # ranged GETs under way now ...
    peak_in_flight: int = 0  # ... and at most so far
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(
        self,
        *,
        requests: int = 0,
        ranges: int = 0,
        size: int = 0,
        retries: int = 0,
        puts: int = 0,
        cache_hits: int = 0,
        cache_misses: int = 0,
        cache_bytes: int = 0,
    ) -> None:
        """Count requests, ranged requests, bytes, retries, uploads and the cache's hits (thread-safe)."""
        with self._lock:
            self.cache_hits += cache_hits
            self.cache_misses += cache_misses
            self.cache_bytes += cache_bytes
            self.requests += requests
            self.range_requests += ranges
            self.bytes += size
            self.retries += retries
            self.puts += puts

    def summary(self) -> dict[str, int]:
        """What the command line shows: requests, ranged ones, bytes received, retries and the cache's counts."""
        with self._lock:
            return {
                "requests": self.requests, "range_requests": self.range_requests, "bytes": self.bytes,
                "retries": self.retries, "cache_hits": self.cache_hits, "cache_misses": self.cache_misses,
                "cache_bytes": self.cache_bytes,
            }  # fmt: skip

    def line(self) -> str:
        """`summary` as one line for stderr (empty when no request was made)."""
        found = self.summary()
        if not found["requests"] and not found["cache_hits"]:
            return ""
        text = f"object storage: {found['requests']:,} requests ({found['range_requests']:,} ranged), {found['bytes']:,} bytes"
        if found["retries"]:
            text += f", {found['retries']:,} retries"
        if found["cache_hits"] or found["cache_misses"]:
            text += (
                f"; cache: {found['cache_hits']:,} hits, {found['cache_misses']:,} misses, {found['cache_bytes']:,} bytes served"
            )
        return text

    def flight(self, change: int) -> None:
        """A ranged GET starts (+1) or ends (-1); the peak is kept."""
        with self._lock:
            self.in_flight += change
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)


STATS = Stats()  # this process's, over every remote store
_RUNTIME_PID: int | None = None  # the process whose object-store runtime is running (not a forked child's)


class ObjectClient:
    """Requests against one `Location`: built lazily per process, retried, counted in `STATS`."""

    def __init__(self, where: Location, *, retries: int = 5, backoff: float = 0.05, timeout: float = 30.0) -> None:
        self.where = where
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self._config = client_config(where)  # refuses missing credentials now, before any request
        self._secrets = [str(v) for k, v in self._config.items() if is_secret(k) and v]
        self._store: Any = None
        self._pid = -1
        self._lock = threading.Lock()
        self._spawned: Any = None  # a forked child's request helper (made on its first request)
        self._spawned_pid = -1

    def __repr__(self) -> str:
        return f"ObjectClient({self.where.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _pid=-1, _lock=None, _spawned=None, _spawned_pid=-1)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _forked(self) -> Any:
        """The helper process making this client's requests when this process was forked after obstore ran in
        its parent (`streambatch.io.remote.forked`), else None: obstore runs here."""
        if _RUNTIME_PID in (None, os.getpid()):
            return None
        with self._lock:
            if self._spawned is None or self._spawned_pid != os.getpid():
                from .forked import Spawned

                self._spawned, self._spawned_pid = Spawned(self), os.getpid()
        return self._spawned

    def _handle(self) -> Any:
        global _RUNTIME_PID
        _RUNTIME_PID = os.getpid()
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._store, self._pid = self._build(), os.getpid()
        return self._store

    def _build(self) -> Any:
        try:
            from obstore.store import from_url
        except ImportError:
            raise missing_dependency("reading a store in object storage", "obstore", "remote") from None
        config = dict(self._config)
        endpoint = str(config.get("endpoint") or config.get("base_url") or "")  # S3's or GCS's
        url = f"{self.where.scheme}://{self.where.bucket}"  # rooted at the bucket: keys carry the prefix
        client: dict[str, Any] = {"timeout": f"{self.timeout}s", "connect_timeout": f"{min(self.timeout, 10.0)}s"}
        if endpoint.startswith("http://") or self.where.scheme == "http":
            client["allow_http"] = True
        client.update(config.pop("client_options", {}) or {})
        try:
            return from_url(url, client_options=client, retry_config={"max_retries": 0}, **config)  # type: ignore[call-overload]
        except Exception as err:  # an unknown option, a bad endpoint
            raise StoreError(f"{self.where.url}: cannot configure the object-store client ({self._short(err)})") from None

    # -- requests -------------------------------------------------------------------
    def head(self, name: str) -> tuple[int, str | None]:
        """``(size, etag)`` of object *name*."""
        if (forked := self._forked()) is not None:
            return forked.call("head", name)  # type: ignore[no-any-return]
        import obstore

        meta = self._retried(name, lambda: obstore.head(self._handle(), self.where.key(name)))
        self._count(1, 0, 0)
        return int(meta["size"]), meta.get("e_tag")

    def get(self, name: str, limit: int) -> tuple[bytes, str | None]:
        """The whole object *name* and its ETag (one GET), refused (`DataError`) past *limit* bytes."""
        if (forked := self._forked()) is not None:
            return forked.call("get", name, limit)  # type: ignore[no-any-return]
        import obstore

        def fetch() -> tuple[bytes, str | None]:
            result = obstore.get(self._handle(), self.where.key(name))
            self._within(name, int(result.meta["size"]), limit, "the whole object")
            chunks, total = [], 0
            for chunk in result.stream(min_chunk_size=min(limit, 8 << 20) or 1):
                total += len(chunk)
                self._within(name, total, limit, "the whole object")
                chunks.append(bytes(chunk))
            return b"".join(chunks), result.meta.get("e_tag")

        data, etag = self._retried(name, fetch)
        self._count(1, 0, len(data))
        return data, etag

    def get_optional(self, name: str, limit: int) -> tuple[bytes, str | None] | None:
        """`get`, or None when there is no object *name*."""
        try:
            return self.get(name, limit)
        except MissingObject:
            return None

    def exists(self, name: str) -> bool:
        """Whether there is an object *name* (one HEAD)."""
        try:
            self.head(name)
        except MissingObject:
            return False
        return True

    def listing(self, folder: str) -> list[tuple[str, float]]:
        """``(name, last modified, seconds since the epoch)`` of every object in *folder* and below (names relative
        to this location; ``""``: everything under it)."""
        if (forked := self._forked()) is not None:
            return forked.call("listing", folder)  # type: ignore[no-any-return]
        import obstore

        root = self.where.key("")
        found = []
        prefix = self.where.key(folder.strip("/"))
        for chunk in self._retried(folder or ".", lambda: list(obstore.list(self._handle(), prefix))):
            for meta in chunk:
                found.append((str(meta["path"])[len(root) :], meta["last_modified"].timestamp()))
        self._count(1, 0, 0)
        return found

    def delete(self, names: list[str]) -> None:
        """Delete objects *names* (bulk where the store can)."""
        if (forked := self._forked()) is not None:
            forked.call("delete", names)
            return
        if not names:
            return
        import obstore

        self._retried(names[0], lambda: obstore.delete(self._handle(), [self.where.key(n) for n in names]))
        self._count(1, 0, 0)

    def _within(self, name: str, size: int, limit: int, what: str) -> None:
        if size > limit:
            raise DataError(
                f"{self.where.url}/{name}: the server sent {size} bytes or more for {what}, which holds at most {limit}; "
                "the object or the server is not what the store's header describes: check the address and upload the store again"
            )

    def get_range(self, name: str, start: int, end: int, etag: str | None, into: memoryview | None = None) -> bytes | None:
        """Bytes ``[start, end)`` of object *name* (into *into* when given); *etag*: the object must still be that one."""
        if (forked := self._forked()) is not None:
            data = forked.call("get_range", name, start, end, etag)
            self._count(1, 1, end - start)
            if into is None:
                return data  # type: ignore[no-any-return]
            into[:] = memoryview(data)
            return None
        import obstore

        options: dict[str, Any] = {"range": (start, end)}
        if etag:
            options["if_match"] = etag

        def fetch() -> Any:
            result = obstore.get(self._handle(), self.where.key(name), options=options)  # type: ignore[arg-type]
            chunks, total = [], 0
            for chunk in result.stream(min_chunk_size=max(end - start, 1)):
                total += len(chunk)
                self._within(name, total, end - start, f"a range of {end - start} bytes from {start}")
                chunks.append(chunk)
            return b"".join(bytes(c) for c in chunks) if len(chunks) != 1 else chunks[0]

        data = self._retried(name, fetch)
        return self._received(name, start, end, data, into)

    def _received(self, name: str, start: int, end: int, data: Any, into: memoryview | None) -> bytes | None:
        if len(data) != end - start:
            raise DataError(
                f"{self.where.url}/{name}: a range of {end - start} bytes from {start} returned {len(data)}; "
                "the object is shorter than the store's header records (it changed): open the store again"
            )
        self._count(1, 1, end - start)
        if into is None:
            return bytes(data)
        into[:] = memoryview(data)
        return None

    async def get_range_async(self, name: str, start: int, end: int, etag: str | None, into: memoryview) -> None:
        """`get_range` on the running event loop: bytes ``[start, end)`` of object *name* written into *into*."""
        if self._forked() is not None:  # a forked child: its helper process, from a thread
            await asyncio.to_thread(self.get_range, name, start, end, etag, into)
            return
        import obstore

        options: dict[str, Any] = {"range": (start, end)}
        if etag:
            options["if_match"] = etag

        async def fetch() -> Any:
            result = await obstore.get_async(self._handle(), self.where.key(name), options=options)  # type: ignore[arg-type]
            chunks, total = [], 0
            async for chunk in result.stream(min_chunk_size=max(end - start, 1)):
                total += len(chunk)
                self._within(name, total, end - start, f"a range of {end - start} bytes from {start}")
                chunks.append(chunk)
            return b"".join(bytes(c) for c in chunks) if len(chunks) != 1 else chunks[0]

        attempt, met = 0, list[str]()
        while True:
            try:
                data = await fetch()
                break
            except Exception as err:
                attempt += 1
                await asyncio.sleep(self._pause(name, err, attempt, met))
        self._received(name, start, end, data, into)

    def put(self, name: str, data: bytes | os.PathLike[str]) -> str | None:
        """Upload *data* (bytes, or a local file's path) as object *name*; its ETag."""
        if (forked := self._forked()) is not None:
            return forked.call("put", name, data)  # type: ignore[no-any-return]
        from pathlib import Path

        import obstore

        body: Any = Path(data) if isinstance(data, os.PathLike) else data
        result = self._retried(name, lambda: obstore.put(self._handle(), self.where.key(name), body))
        STATS.add(puts=1)
        return result.get("e_tag")  # type: ignore[no-any-return]

    def _count(self, requests: int, ranges: int, size: int) -> None:
        STATS.add(requests=requests, ranges=ranges, size=size)

    def _retried(self, name: str, call: Any) -> Any:
        attempt, met = 0, list[str]()
        while True:
            try:
                return call()
            except Exception as err:
                attempt += 1
                time.sleep(self._pause(name, err, attempt, met))

    def _pause(self, name: str, err: Exception, attempt: int, met: list[str]) -> float:
        """Seconds to wait before retry *attempt* after *err* (counted, logged at DEBUG, noted in *met*); the
        failure itself, one line summarising *met*, when it is not retried or the retries are spent."""
        status = _status(err)
        if not _retryable(err, status) or attempt > self.retries:
            raise self._failure(name, err, status, attempt, met) from None
        STATS.add(retries=1)
        met.append(f"status {status}" if status else type(err).__name__)
        pause = float(min(2.0, self.backoff * 2 ** (attempt - 1)) * (0.5 + random.random()))
        log.debug("%s/%s: %s; retry %d of %d in %.2fs", self.where.url, name, self._short(err), attempt, self.retries, pause)
        return pause

    def _failure(self, name: str, err: Exception, status: int | None, attempts: int, met: list[str] | None = None) -> DataError:
        if isinstance(err, DataError):  # a response that is not what it claims: said as it is
            return err
        where = f"{self.where.url}/{name}"
        text = self._clean(err)
        kind = type(err).__name__
        if kind == "PreconditionError" or status == 412:
            return DataError(f"{where}: the object changed since the store was opened (its ETag differs); open the store again")
        if isinstance(err, FileNotFoundError) or kind == "NotFoundError" or status == 404:
            if "NoSuchBucket" in text:
                return StoreError(f"{self.where.scheme}://{self.where.bucket}: no such bucket; check the address")
            return MissingObject(f"{where}: no such object; check the address (is a store there?)")
        if isinstance(err, PermissionError) or kind in ("PermissionDeniedError", "UnauthenticatedError") or status in (401, 403):
            return StoreError(f"{where}: access denied (status {status or '?'}); check the credentials and their permissions")
        tried = f" after {attempts} attempts" if attempts > 1 else ""
        if met:
            counts = {m: met.count(m) for m in dict.fromkeys(met)}
            tried += " (retries met " + ", ".join(f"{m} x{n}" if n > 1 else m for m, n in counts.items()) + ")"
        return StoreError(f"{where}: request failed{tried}: {self._short(err)}")

    def _clean(self, err: Exception) -> str:
        text = str(err)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact(text)

    def _short(self, err: Exception) -> str:
        first = self._clean(err).splitlines()[0] if str(err) else type(err).__name__
        return first[:300]


def _status(err: Exception) -> int | None:
    found = _STATUS.search(str(err))
    return int(found.group(1)) if found else None


def _retryable(err: Exception, status: int | None) -> bool:
    """Timeouts, 5xx, 408/429 and connection failures: retried; anything else answers for itself."""
    if isinstance(err, (FileNotFoundError, PermissionError, DataError)):
        return False
    if type(err).__name__ in (
        "PreconditionError",
        "NotFoundError",
        "PermissionDeniedError",
        "UnauthenticatedError",
        "InvalidPathError",
        "UnknownConfigurationKeyError",
        "NotSupportedError",
    ):
        return False
    if status is not None:
        return (status >= 500 and status != 501) or status in (408, 429)
    return True  # no status: the connection dropped, timed out or was refused
