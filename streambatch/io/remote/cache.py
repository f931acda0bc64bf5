"""An on-disk cache of fetched token blocks, within a byte limit shared by every process that uses the folder.

Blocks are aligned pieces of a remote ``tokens.bin`` (`BLOCK` bytes; the
object's last one shorter), named by the object's address, size and ETag, so a
replaced object never matches.  A block is kept only when a fetch covered it
whole (the cache never makes a fetch bigger).  Admission is serialized by one
lock on the folder; the bytes held (temporaries included) are counted in a
small ``usage`` file, and the least recently used blocks are removed before a
new one would pass the limit: the folder never holds more than *cache_bytes*.
The cache only ever holds copies: the folder is marked as a cache when made,
a folder that is not one (a store, anything else) is refused, and eviction
removes only block files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..atomic import create_temporary_file, exclusive_lock
from ..files import short_path

BLOCK = 1 << 20
MARKER = "STREAMBATCH-CACHE"
_USAGE = "usage"
_LOCK = "lock"


class BlockCache:
    """Blocks of remote token files on disk under *folder*, at most *limit* bytes in all."""

    def __init__(self, folder: str | os.PathLike[str], limit: int | None) -> None:
        if limit is None or isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
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

    def _key(self, file: Any) -> str:
        name = f"{file.client.where.url}/{file.name}|{file.nbytes}|{file.etag}"
        return hashlib.blake2b(name.encode(), digest_size=12).hexdigest()

    def _path(self, file: Any, index: int) -> Path:
        return self.folder / f"{self._key(file)}-{index}.block"

    def read(self, file: Any, lo: int, hi: int, into: memoryview) -> bool:
        """Copy bytes ``[lo, hi)`` of *file* into *into* when every block they touch is cached; else False."""
        if self.limit == 0:
            return False
        first, last = lo // self.block, (hi - 1) // self.block
        paths = [self._path(file, i) for i in range(first, last + 1)]
        if not all(p.exists() for p in paths):
            return False
        try:
            for index, path in zip(range(first, last + 1), paths, strict=True):
                base = index * self.block
                a, b = max(lo, base), min(hi, base + self.block)
                with open(path, "rb") as handle:
                    handle.seek(a - base)
                    data = handle.read(b - a)
                if len(data) != b - a:
                    return False
                into[a - lo : b - lo] = data
                os.utime(path)  # recently used
        except OSError:
            return False  # evicted meanwhile: fetch
        return True

    def write(self, file: Any, lo: int, hi: int, data: memoryview) -> None:
        """Keep the blocks that ``[lo, hi)`` (just fetched) covers whole, within the limit."""
        first = -(-lo // self.block)
        for index in range(first, file.nbytes // self.block + 1):
            base = index * self.block
            end = min(base + self.block, file.nbytes)
            if end > hi or end <= base:
                break
            self._admit(file, index, data[base - lo : end - lo])

    def _admit(self, file: Any, index: int, block: memoryview) -> None:
        size = len(block)
        target = self._path(file, index)
        if size > self.limit or target.exists():
            return
        with exclusive_lock(self.folder / _LOCK, what="cache"):
            if target.exists():  # another process kept it meanwhile
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
                    status = entry.stat()
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
