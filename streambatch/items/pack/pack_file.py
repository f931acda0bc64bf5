"""Packing files: the best-fit packing of one corpus at one ``T``, computed once, memory-mapped by every process.

``sb.pack(source, context_length=T, plan_dir=DIR)`` (and ``Epoch/Run(...,
pack=True, plan_dir=DIR)``) keeps the packing in ``DIR/<key hash>.packing``:
the first process computes it (best-fit decreasing, the expensive part) and
writes it atomically under an ``flock`` of ``<key hash>.lock`` (concurrent
callers wait, then map it); every later process maps it read-only.  The piece
numbering itself (`PieceIndex`) is arithmetic on the document lengths and is
not stored.

The file is a keyed file (`streambatch.io.keyed_file`): a header, then two
sections, ``offsets`` (the packed rows' offsets, little-endian int64,
``packed_rows + 1``) and ``tails`` (uint32, one per packed piece), with a
digest per block.  The header's key::

    {"corpus": FINGERPRINT, "context_length": T, "partition": P, "algorithm": "best-fit-decreasing/1"}

and, for a packing of ``skip_untrained`` (tails with no counted target left
out), ``"skip_untrained": true, "dropped_tails": N`` too: a filtered and an
unfiltered packing never share a file.

A packing is opened once per process and costs O(documents) to open anyway
(the piece index reads every length), so opening checks it whole: the key, the
sizes, every block's digest, and the rows against the partition's documents
(every tail of a document of this partition that has one, each once, no row
over ``T`` positions).  A stale, foreign, truncated, damaged or edited file
raises `StoreError` (a `DataError`) naming it, and is never used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import StoreError
from ...io.files import short_path
from ...io.keyed_file import computed_once, file_name, open_keyed, write_keyed
from ...model.source import TokenSource
from .pack import PackedRows, PieceIndex, pack_lengths, packed_rows

FORMAT = "streambatch.packing"
VERSION = 1
SUFFIX = ".packing"
ALGORITHM = "best-fit-decreasing/1"
"""The packing rule's name and version: part of every packing file's and packed plan file's key."""


def packing_key(
    store: TokenSource, context_length: int, partition: str, drop_tails: npt.NDArray[np.int64] | None = None
) -> dict[str, Any]:
    """What a packing depends on: the corpus (content fingerprint), ``T``, the partition and the algorithm (and the
    tails ``skip_untrained`` left out)."""
    key: dict[str, Any] = {
        "corpus": store.content_fingerprint(),
        "context_length": int(context_length),
        "partition": partition,
        "algorithm": ALGORITHM,
    }
    if drop_tails is not None:
        key.update(skip_untrained=True, dropped_tails=int(drop_tails.size))
    return key


def packing_path(key: dict[str, Any], plan_dir: str | os.PathLike[str]) -> Path:
    """Where the packing of *key* lives in *plan_dir* (it may not exist yet)."""
    return Path(plan_dir) / file_name(FORMAT, VERSION, key, SUFFIX)


def packing_file(
    store: TokenSource,
    context_length: int,
    partition: str,
    include: npt.ArrayLike | None,
    plan_dir: str | os.PathLike[str],
    drop_tails: npt.NDArray[np.int64] | None = None,
) -> PackedRows:
    """The packing of *store*'s documents where *include* is True (all when None), the tails of *drop_tails* left
    out: from *plan_dir*, computed once."""
    key = packing_key(store, context_length, partition, drop_tails)

    def write(path: Path) -> None:
        _write(path, key, pack_lengths(store.lengths, context_length, include=include, drop_tails=drop_tails))

    path, _ = computed_once(plan_dir, file_name(FORMAT, VERSION, key, SUFFIX), "packing", write)
    return _open(path, key, PieceIndex(store.lengths, context_length, include), drop_tails)


def _write(path: Path, key: dict[str, Any], rows: PackedRows) -> None:
    specs = [("offsets", "<i8", rows.offsets.size), ("tails", "<u4", rows.tails.size)]
    with write_keyed(path, FORMAT, VERSION, key, specs) as writer:
        writer.put("offsets", rows.offsets)
        writer.put("tails", rows.tails)


def _open(path: Path, key: dict[str, Any], index: PieceIndex, drop_tails: npt.NDArray[np.int64] | None) -> PackedRows:
    shown = short_path(path)
    fix = f"remove {shown} and pack again (sb.pack(..., plan_dir=...))"
    keyed = open_keyed(path, FORMAT, VERSION, key, fix, what="packing")
    sections = keyed.sections
    if set(sections) != {"offsets", "tails"} or sections["offsets"].entries < 1:
        raise StoreError(f"{shown}: not the sections of a packing (offsets, tails); {fix}")
    rows, tails = sections["offsets"].entries - 1, sections["tails"].entries
    sizes = index.tail_sizes()
    if drop_tails is not None:
        sizes[drop_tails] = 0  # left out of packing: no row may hold them
    expected_tails = int(np.count_nonzero(sizes))
    if tails != expected_tails:
        raise StoreError(f"{shown}: {tails} tails but this corpus has {expected_tails}; {fix}")
    keyed.verify()  # read whole below anyway: every block against its digest first
    offsets, placed = keyed.array("offsets"), keyed.array("tails")
    if int(offsets[0]) != 0 or int(offsets[-1]) != tails or (rows and int(np.diff(offsets).min()) < 1):
        raise StoreError(f"{shown}: the row offsets do not cover the {tails} tails; {fix}")
    _check_rows(shown, fix, offsets, placed, sizes, index.context_length)
    return packed_rows(index, offsets, placed, drop_tails)


def _check_rows(
    shown: str, fix: str, offsets: npt.NDArray[np.int64], tails: npt.NDArray[Any], sizes: npt.NDArray[np.int64], T: int
) -> None:
    """Refuse rows that are not a packing of the partition's tails: each tail once, of a document that has one, none over T."""
    if not tails.size:
        return
    if int(tails.max()) >= sizes.size:
        raise StoreError(f"{shown}: a tail of document {int(tails.max())}, beyond the corpus's {sizes.size}; {fix}")
    targets = sizes[tails]
    if not targets.all():
        document = int(tails[np.flatnonzero(targets == 0)[0]])
        raise StoreError(f"{shown}: a tail of document {document}, which has no tail in this partition at T={T}; {fix}")
    seen = np.zeros(sizes.size, dtype=bool)
    seen[tails] = True
    if int(np.count_nonzero(seen)) != tails.size:
        twice = int(np.bincount(tails, minlength=sizes.size).argmax())
        raise StoreError(f"{shown}: document {twice}'s tail is packed more than once; {fix}")
    fill = np.add.reduceat(targets, offsets[:-1])
    if int(fill.max()) > T:
        row = int(np.argmax(fill))
        raise StoreError(f"{shown}: packed row {row} holds {int(fill[row])} targets, more than T={T}; {fix}")
