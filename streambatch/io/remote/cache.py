"""An on-disk cache of fetched token blocks, within a byte limit shared by every process that uses the folder.

Blocks are the digest blocks of a remote ``tokens.bin``
(`streambatch.io.remote.blocks`), each kept under its own digest: the cache is
content-addressed, so the same bytes in two stores are kept once and a replaced
object never matches.  Every fetch is of whole checked blocks, so every block
fetched is kept (while the limit allows).  Nothing in the folder is trusted:
a block is opened without following a link and without blocking
(``O_NOFOLLOW | O_NONBLOCK``), must be a regular file of the block's size, and
is checked against its digest on every read; anything else (a zeroed block, a
link to another file, a FIFO) is removed and the block fetched again.  Hits,
misses and bytes served are counted in `streambatch.io.remote.client.STATS`.
Admission is serialized by one
lock on the folder; the bytes held (temporaries included) are counted in a
small ``usage`` file, and the least recently used blocks are removed before a
new one would pass the limit: the folder never holds more than *cache_bytes*.
The cache only ever holds copies: the folder is marked as a cache when made,
a folder that is not one (a store, anything else) is refused, and eviction
removes only block files.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..atomic import create_temporary_file, exclusive_lock
from ..files import short_path
from .blocks import BLOCK, Blocks, digest
from .client import STATS

DEFAULT_BYTES = 16 << 30  # the limit when only a folder is given (--cache-dir without --cache-bytes)
MARKER = "STREAMBATCH-CACHE"
_USAGE = "usage"
_LOCK = "lock"


class BlockCache:
    """Blocks of remote token files on disk under *folder*, at most *limit* bytes in all."""

    def __init__(self, folder: str | os.PathLike[str], limit: int | None = DEFAULT_BYTES) -> None:
        if limit is None:
            limit = DEFAULT_BYTES
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"cache_bytes={limit!r} must be a non-negative int; pass the cache's size limit in bytes")
        self.folder = Path(folder)
        self.limit = limit
        self.block = BLOCK
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not (self.folder / MARKER).exists():
                if any(self.folder.iterdir()):
                    raise ConfigError(
                        f"cache_dir={short_path(self.folder)} is not empty and not a streambatch cache; "
                        "pass an empty or new folder (a cache never shares a folder with data)"
                    )
                (self.folder / MARKER).write_text("blocks of remote token files; safe to delete\n")
        except OSError as err:
            raise ConfigError(f"cache_dir={short_path(self.folder)}: cannot use it ({err.strerror or err})") from err

    def __reduce__(self) -> tuple[Any, ...]:
        return (BlockCache, (self.folder, self.limit))

    def usage(self) -> int:
        """Bytes the cache holds now (as counted)."""
        try:
            return int((self.folder / _USAGE).read_text() or 0)
        except (OSError, ValueError):
            return 0

    def _path(self, expected: bytes) -> Path:
        return self.folder / f"{expected.hex()}.block"

    def take(self, blocks: Blocks, lo: int, hi: int, into: memoryview) -> int:
        """Copy the leading blocks of ``[lo, hi)`` (whole blocks) that the cache holds, each checked, into
        ``into[lo:...]``; the offset of the first block it does not hold (*hi*: all of them)."""
        if self.limit == 0:
            return lo
        at = lo
        while at < hi:
            index = at // BLOCK
            size = min(BLOCK, blocks.nbytes - at)
            data = self._read(blocks.expected(index), size)
            if data is None:
                STATS.add(cache_misses=1)
                return at
            into[at : at + size] = data
            STATS.add(cache_hits=1, cache_bytes=size)
            at += size
        return at

    def _read(self, expected: bytes, size: int) -> bytes | None:
        """The block named *expected*, if a regular file of *size* bytes whose digest is *expected*; anything else
        under that name is removed (never followed, never waited on)."""
        path = self._path(expected)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return None
        except OSError:  # a link (ELOOP), or unreadable: not a block of ours
            self._drop(path)
            return None
        try:
            status = os.fstat(fd)
            data = os.read(fd, size + 1) if stat.S_ISREG(status.st_mode) and status.st_size == size else b""
        except OSError:
            data = b""
        finally:
            os.close(fd)
        if len(data) != size or digest(data) != expected:
            self._drop(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        return data

    def _kept(self, target: Path, size: int) -> bool:
        """Whether a regular file of *size* bytes is under *target* already (checked when read); anything else
        there (a link, a FIFO, a short file) is removed, never followed."""
        try:
            status = os.lstat(target)
        except OSError:
            return False
        if stat.S_ISREG(status.st_mode) and status.st_size == size:
            return True
        self._drop(target)
        return False

    def _drop(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)  # the name only: a link's target is never touched

    def keep(self, blocks: Blocks, lo: int, data: memoryview) -> None:
        """Keep the whole, checked blocks *data* (from byte *lo*), within the limit."""
        for offset in range(0, len(data), BLOCK):
            index = (lo + offset) // BLOCK
            self._admit(blocks.expected(index), data[offset : offset + BLOCK])

    def _admit(self, expected: bytes, block: memoryview) -> None:
        size = len(block)
        target = self._path(expected)
        if size > self.limit or self._kept(target, size):
            return
        with exclusive_lock(self.folder / _LOCK, what="cache"):
            if self._kept(target, size):  # another process kept it meanwhile
                return
            used = self.usage()
            if used + size > self.limit:
                used -= self._evict(used + size - self.limit)
            if used + size > self.limit:
                return
            self._set_usage(used + size)  # counted before a byte is written: the limit holds throughout
            fd, temporary = create_temporary_file(self.folder, ".block.partial-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(block)
                os.replace(temporary, target)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                self._set_usage(used)

    def _evict(self, wanted: int) -> int:
        """Remove least recently used blocks until *wanted* bytes are freed; the bytes freed."""
        blocks = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(".block") and not entry.name.startswith("."):
                with contextlib.suppress(OSError):
                    status = entry.stat(follow_symlinks=False)
                    blocks.append((status.st_mtime, status.st_size, entry.path))
        freed = 0
        for _, size, path in sorted(blocks):
            if freed >= wanted:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                freed += size
        return freed

    def _set_usage(self, used: int) -> None:
        (self.folder / _USAGE).write_text(str(max(0, used)))
