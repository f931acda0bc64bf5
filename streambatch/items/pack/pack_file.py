"""Packing files: the best-fit packing of one corpus at one ``T``, computed once, memory-mapped by every process.

``sb.pack(source, context_length=T, plan_dir=DIR)`` (and ``Epoch/Run(...,
pack=True, plan_dir=DIR)``) keeps the packing in ``DIR/<key hash>.packing``:
the first process computes it (best-fit decreasing, the expensive part) and
writes it atomically under an ``flock`` of ``<key hash>.lock`` (concurrent
callers wait, then map it); every later process maps it read-only.  The piece
numbering itself (`PieceIndex`) is arithmetic on the document lengths and is
not stored.

The file: one 4,096-byte JSON header (space-padded), then the packed rows'
offsets (little-endian int64, ``packed_rows + 1``) and their tails (uint32, one
per packed piece).  The header's key::

    {"corpus": FINGERPRINT, "context_length": T, "partition": P, "algorithm": "best-fit-decreasing/1"}

Opening checks the header's key, the counts against the corpus (the number of
tails, the last offset) and the file size: a stale, foreign or truncated file
raises `StoreError` and is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, StoreError
from ...io.atomic import atomic_file, exclusive_lock
from ...io.bounded_json import read_json_header
from ...io.files import short_path
from ...model.source import TokenSource
from .pack import PackedRows, PieceIndex, pack_lengths, packed_rows

FORMAT = "streambatch.packing"
VERSION = 1
HEADER_BYTES = 4096
SUFFIX = ".packing"
ALGORITHM = "best-fit-decreasing/1"
"""The packing rule's name and version: part of every packing file's and packed plan file's key."""


def packing_key(store: TokenSource, context_length: int, partition: str) -> dict[str, Any]:
    """What a packing depends on: the corpus (content fingerprint), ``T``, the partition and the algorithm."""
    return {
        "corpus": store.content_fingerprint(),
        "context_length": int(context_length),
        "partition": partition,
        "algorithm": ALGORITHM,
    }


def packing_path(key: dict[str, Any], plan_dir: str | os.PathLike[str]) -> Path:
    """Where the packing of *key* lives in *plan_dir* (it may not exist yet)."""
    text = json.dumps([FORMAT, VERSION, key], sort_keys=True, separators=(",", ":"))
    return Path(plan_dir) / (hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + SUFFIX)


def packing_file(
    store: TokenSource, context_length: int, partition: str, include: npt.ArrayLike | None, plan_dir: str | os.PathLike[str]
) -> PackedRows:
    """The packing of *store*'s documents where *include* is True (all when None): from *plan_dir*, computed once."""
    if not isinstance(plan_dir, (str, os.PathLike)) or not os.fspath(plan_dir):
        raise ConfigError(f"plan_dir={plan_dir!r} is not a folder path; pass a str or pathlib.Path (created if missing)")
    key = packing_key(store, context_length, partition)
    directory = Path(plan_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(f"plan_dir={short_path(plan_dir)!r}: cannot create it ({err.strerror}); pass a writable folder") from err
    path = packing_path(key, directory)
    if not path.exists():
        with exclusive_lock(path.with_suffix(".lock"), what="packing"):
            if not path.exists():  # another process may have written it while this one waited
                _write(path, key, pack_lengths(store.lengths, context_length, include=include))
    return _open(path, key, PieceIndex(store.lengths, context_length, include))


def _write(path: Path, key: dict[str, Any], rows: PackedRows) -> None:
    header = {
        "format": FORMAT,
        "version": VERSION,
        "key": key,
        "packed_rows": int(rows.offsets.size - 1),
        "tails": int(rows.tails.size),
    }
    text = json.dumps(header).encode()
    if len(text) >= HEADER_BYTES:
        raise StoreError(f"packing header of {len(text)} bytes does not fit in {HEADER_BYTES}; shorten the fingerprint")
    with atomic_file(path) as handle:
        os.fchmod(handle.fileno(), 0o644)  # readable by every rank (temporaries are private)
        handle.write(text.ljust(HEADER_BYTES - 1) + b"\n")
        rows.offsets.astype("<i8").tofile(handle)
        rows.tails.astype("<u4").tofile(handle)


def _open(path: Path, key: dict[str, Any], index: PieceIndex) -> PackedRows:
    shown = short_path(path)
    fix = f"remove {shown} and pack again (sb.pack(..., plan_dir=...))"
    header = read_json_header(path, shown, "packing header", fix, error=StoreError, limit=HEADER_BYTES, padding=b"\0 \n")
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise StoreError(f"{shown}: not a {FORMAT!r} version {VERSION} file; {fix}")
    if header.get("key") != key:
        raise StoreError(f"{shown}: a packing for another key ({header.get('key')!r}, expected {key!r}); {fix}")
    rows, tails = header.get("packed_rows"), header.get("tails")
    expected_tails = int(np.count_nonzero(index.tail_sizes()))
    if not isinstance(rows, int) or not isinstance(tails, int) or rows < 0 or tails != expected_tails:
        raise StoreError(f"{shown}: packed_rows={rows!r}, tails={tails!r} but this corpus has {expected_tails} tails; {fix}")
    size = HEADER_BYTES + 8 * (rows + 1) + 4 * tails
    if path.stat().st_size != size:
        raise StoreError(f"{shown}: {path.stat().st_size} bytes but its header says {size}: truncated or damaged; {fix}")
    offsets = np.memmap(path, dtype="<i8", mode="r", offset=HEADER_BYTES, shape=(rows + 1,)).view(np.ndarray)
    placed = np.memmap(path, dtype="<u4", mode="r", offset=HEADER_BYTES + 8 * (rows + 1), shape=(tails,)) if tails else None
    if int(offsets[0]) != 0 or int(offsets[-1]) != tails or (rows and int(np.diff(offsets).min()) < 1):
        raise StoreError(f"{shown}: the row offsets do not cover the {tails} tails; {fix}")
    return packed_rows(index, offsets, np.zeros(0, np.uint32) if placed is None else placed.view(np.ndarray))
