"""Test helpers for keyed files (plan, packing, mixture plan): read the header, edit a section, forge the digests.

Test-only code: what an attacker with write access to a plan folder can do.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from streambatch.io.keyed_file import BLOCK, DIGEST_BYTES, MAGIC, block_digest

_PREFIX = len(MAGIC) + 8 + DIGEST_BYTES


def header(path: Path) -> dict[str, Any]:
    """The JSON header of the keyed file *path*."""
    data = Path(path).read_bytes()
    assert data.startswith(MAGIC)
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    found: dict[str, Any] = json.loads(data[_PREFIX : _PREFIX + length])
    return found


def sections(path: Path) -> dict[str, tuple[str, int, int]]:
    """``{name: (dtype, entries, offset)}`` of *path*."""
    return {name: (dtype, entries, offset) for name, dtype, entries, offset in header(path)["sections"]}


def body(path: Path, name: str | None = None) -> np.memmap[Any, Any]:
    """Section *name* (the first when None) of *path*, mapped writable: edits go to the file."""
    found = sections(path)
    dtype, entries, offset = found[name or next(iter(found))]
    return np.memmap(path, dtype=dtype, mode="r+", offset=offset, shape=(entries,))


def section_bytes(path: Path) -> list[tuple[int, int]]:
    """``(offset, bytes)`` of every non-empty section of *path*."""
    return [(offset, entries * np.dtype(dtype).itemsize) for dtype, entries, offset in sections(path).values() if entries]


def redigest(path: Path) -> None:
    """Recompute every block digest, the table's and the header's digests: a forgery the kinds' own checks must catch."""
    data = bytearray(Path(path).read_bytes())
    head = header(path)
    table_at, blocks, old = head["digests"]
    table = bytearray()
    number = 0
    for dtype, entries, offset in sections(path).values():
        size = np.dtype(dtype).itemsize
        for lo in range(0, entries, BLOCK):
            chunk = bytes(data[offset + lo * size : offset + min(lo + BLOCK, entries) * size])
            table += block_digest(chunk, number)
            number += 1
    assert len(table) == blocks * DIGEST_BYTES
    data[table_at : table_at + len(table)] = table
    fresh = hashlib.blake2b(bytes(table), digest_size=32).hexdigest()
    length = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    text = bytes(data[_PREFIX : _PREFIX + length]).replace(old.encode(), fresh.encode(), 1)
    data[_PREFIX : _PREFIX + length] = text
    data[len(MAGIC) + 8 : _PREFIX] = hashlib.blake2b(text, digest_size=DIGEST_BYTES).digest()
    Path(path).write_bytes(bytes(data))
