"""Mixture plan files: Tijdeman's order of a mixture computed once, written atomically, mapped by every process.

``plan_dir/<key hash>.mixplan`` is one 4,096-byte JSON header (space-padded),
then the `MixPlan`: one uint8 source id per item (padded to 8 bytes), then the
checkpoint table (``length // block + 1`` rows of one little-endian int64 per
source).  The header records the key::

    {"format": "streambatch.mixplan", "version": 1,
     "key": {"sources": [FINGERPRINT, ...], "windows": [N_0, ...], "context_length": T,
             "stride": S, "partition": P, "weights": ["a_0", ...], "length": L or null, "block": 64},
     "items": LENGTH}

The key is everything the order depends on: every source's fingerprint and
window count, the configuration, the exact integer weights and the asked
length.  The seed is not in it: Tijdeman's order does not depend on the seed,
so every epoch of a run (and every seed) maps the same file.  The seed keys the
sources' own epoch plans (`streambatch.plan_file` at
``source_epoch_seed(seed, s, e)``), which a mixture with a plan folder keeps in
the same folder.  Writing, locking and checking follow `streambatch.stages.plan`:
a temporary file renamed into place under an ``flock``; a stale, foreign or
truncated file raises `StoreError` and is never used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import StoreError
from ...io.atomic import atomic_file, exclusive_lock
from ...io.bounded_json import read_json_header
from ...io.files import short_path
from .parts import Part
from .plan import MixPlan, block_for, plan_mix

FORMAT = "streambatch.mixplan"
VERSION = 1
HEADER_BYTES = 4096
SUFFIX = ".mixplan"
PathLike = str | os.PathLike[str]


def mix_plan_key(parts: tuple[Part, ...], weights: tuple[int, ...], length: int | None) -> dict[str, Any]:
    """What the mixture order of *parts* at *weights* and *length* depends on (``windows`` counts a packed part's rows)."""
    first = parts[0]
    return {
        "sources": [p.store.content_fingerprint() for p in parts],
        "windows": [len(p) for p in parts],
        "context_length": first.context_length,
        "stride": first.config.stride,
        "partition": first.partition.value,
        "weights": [str(a) for a in weights],
        "length": length,
        "block": block_for(len(parts)),
    }


def _file_name(key: dict[str, Any]) -> str:
    text = json.dumps([FORMAT, VERSION, key], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + SUFFIX


def _layout(items: int, sources: int, block: int) -> tuple[int, int, int]:
    """``(offset of the table, rows, file size)``."""
    table = HEADER_BYTES + -(-items // 8) * 8
    rows = items // block + 1
    return table, rows, table + rows * sources * 8


def mix_plan_file(
    parts: tuple[Part, ...], weights: tuple[int, ...], length: int | None, plan_dir: PathLike
) -> tuple[MixPlan, Path]:
    """The mixture's `MixPlan` from its plan file in *plan_dir*, computed and written first if missing."""
    key = mix_plan_key(parts, weights, length)
    directory = Path(plan_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StoreError(f"plan_dir={short_path(plan_dir)!r}: cannot create it ({err.strerror}); pass a writable folder") from err
    name = _file_name(key)
    path = directory / name
    if not path.exists():
        with exclusive_lock(directory / (name[: -len(SUFFIX)] + ".lock"), what="mixture plan"):
            if not path.exists():  # another process may have written it while this one waited
                _write(path, key, plan_mix(weights, length, sizes=key["windows"]))
    return open_mix_plan(path, key), path


def _write(path: Path, key: dict[str, Any], plan: MixPlan) -> None:
    items, sources = len(plan), plan.source_count
    table, _, size = _layout(items, sources, plan.block)
    with atomic_file(path) as handle:
        os.fchmod(handle.fileno(), 0o644)
        handle.truncate(size)
        handle.seek(HEADER_BYTES)
        plan.sources.tofile(handle)
        handle.seek(table)
        plan.checkpoints.astype("<i8").tofile(handle)
        text = json.dumps({"format": FORMAT, "version": VERSION, "key": key, "items": items}).encode()
        if len(text) >= HEADER_BYTES:
            raise StoreError(f"mixture plan header of {len(text)} bytes does not fit in {HEADER_BYTES}; use fewer sources")
        handle.seek(0)
        handle.write(text.ljust(HEADER_BYTES - 1) + b"\n")


def reopen_mix_plan(path: PathLike) -> MixPlan:
    """Map the plan file *path* again (a spawned worker), checked against the key its header records."""
    return open_mix_plan(path, None)


def open_mix_plan(path: PathLike, key: dict[str, Any] | None) -> MixPlan:
    """Map *path* read-only after checking its header against *key* (None: the header's own) and its size."""
    where = Path(path)
    shown = short_path(where)
    fix = f"remove {shown} and plan again"
    header = read_json_header(
        where, shown, "mixture plan header", fix, error=StoreError, limit=HEADER_BYTES, padding=b"\0 \n",
        missing="no such mixture plan file; plan it with sb.mix(..., plan_dir=) or `streambatch plan`",
    )  # fmt: skip
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise StoreError(f"{shown}: not a {FORMAT!r} version {VERSION} file; {fix}")
    found = header.get("key")
    if not isinstance(found, dict) or (key is not None and found != key):
        differ = "" if not isinstance(found, dict) or key is None else ", ".join(k for k in key if found.get(k) != key[k])
        raise StoreError(f"{shown}: a mixture plan for another key ({differ or 'no key'}); it is stale or foreign; {fix}")
    items, weights, block = header.get("items"), found.get("weights"), found.get("block")
    if not isinstance(items, int) or not isinstance(weights, list) or not isinstance(block, int) or items < 0 or block < 1:
        raise StoreError(f"{shown}: the header's items, weights or block are malformed; {fix}")
    sources = len(weights)
    table, rows, size = _layout(items, sources, block)
    if where.stat().st_size != size:
        raise StoreError(f"{shown}: {where.stat().st_size} bytes but {items} items of {sources} sources need {size}; {fix}")
    ids = np.memmap(where, dtype=np.uint8, mode="r", offset=HEADER_BYTES, shape=(items,)) if items else np.zeros(0, np.uint8)
    checkpoints = np.memmap(where, dtype="<i8", mode="r", offset=table, shape=(rows, sources))
    return MixPlan(ids.view(np.ndarray), checkpoints.view(np.ndarray), tuple(int(a) for a in weights), block)
