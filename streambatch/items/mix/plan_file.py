"""Mixture plan files: Tijdeman's order of a mixture computed once, written atomically, mapped by every process.

``plan_dir/<key hash>.mixplan`` is a keyed file (`streambatch.io.keyed_file`: a
header sized to its content, so 255 sources fit, and a digest per block): the
`MixPlan` as two sections, ``sources`` (one uint8 source id per item) and
``checkpoints`` (``length // block + 1`` rows of one little-endian int64 per
source, flat).  The header records the key::

    {"format": "streambatch.mixplan", "version": 1,
     "key": {"sources": [FINGERPRINT, ...], "windows": [N_0, ...], "context_length": T,
             "stride": S, "partition": P, "weights": ["a_0", ...], "length": L or null, "block": 64},
     "items": LENGTH, ...the layout's fields}

The key is everything the order depends on: every source's fingerprint and
window count, the configuration, the exact integer weights and the asked
length (for parts built with ``skip_untrained``, ``"skip_untrained"``: each
source's dropped count, so a filtered and an unfiltered mixture never share a
file).  The seed is not in it: Tijdeman's order does not depend on the seed,
so every epoch of a run (and every seed) maps the same file.  The seed keys the
sources' own epoch plans (`streambatch.plan_file` at
``source_epoch_seed(seed, s, e)``), which a mixture with a plan folder keeps in
the same folder.  Writing, locking and checking are the keyed file's:
a temporary file renamed into place under an ``flock``; a stale, foreign,
truncated or earlier-layout file raises `StoreError` and is never used; each
block is checked against its digest the first time a process reads it
(`MixPlan.ids`, `MixPlan.counts`), and the first checkpoint row at opening.
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
from .parts import Part
from .plan import MixPlan, block_for, plan_mix

FORMAT = "streambatch.mixplan"
VERSION = 1
SUFFIX = ".mixplan"
PathLike = str | os.PathLike[str]


def mix_plan_key(parts: tuple[Part, ...], weights: tuple[int, ...], length: int | None) -> dict[str, Any]:
    """What the mixture order of *parts* at *weights* and *length* depends on (``windows`` counts a packed part's rows)."""
    first = parts[0]
    filtered = {} if first.untrained is None else {"skip_untrained": [p.untrained.dropped for p in parts]}
    return {
        **filtered,
        "sources": [p.store.content_fingerprint() for p in parts],
        "windows": [len(p) for p in parts],
        "context_length": first.context_length,
        "stride": first.config.stride,
        "partition": first.partition.value,
        "weights": [str(a) for a in weights],
        "length": length,
        "block": block_for(len(parts)),
    }


def mix_plan_file(
    parts: tuple[Part, ...], weights: tuple[int, ...], length: int | None, plan_dir: PathLike
) -> tuple[MixPlan, Path]:
    """The mixture's `MixPlan` from its plan file in *plan_dir*, computed and written first if missing."""
    key = mix_plan_key(parts, weights, length)

    def write(path: Path) -> None:
        _write(path, key, plan_mix(weights, length, sizes=key["windows"]))

    path, _ = computed_once(plan_dir, file_name(FORMAT, VERSION, key, SUFFIX), "mixture plan", write)
    return open_mix_plan(path, key), path


def _write(path: Path, key: dict[str, Any], plan: MixPlan) -> None:
    specs = [("sources", "|u1", len(plan)), ("checkpoints", "<i8", plan.checkpoints.size)]
    with write_keyed(path, FORMAT, VERSION, key, specs) as writer:
        writer.put("sources", plan.sources)
        writer.put("checkpoints", plan.checkpoints)
        writer.fields["items"] = len(plan)


def reopen_mix_plan(path: PathLike) -> MixPlan:
    """Map the plan file *path* again (a spawned worker), checked against the key its header records."""
    return open_mix_plan(path, None)


def open_mix_plan(path: PathLike, key: dict[str, Any] | None) -> MixPlan:
    """Map *path* read-only after checking its header against *key* (None: the header's own) and its sections."""
    shown = short_path(path)
    fix = f"remove {shown} and plan again"
    missing = "no such mixture plan file; plan it with sb.mix(..., plan_dir=) or `streambatch plan`"
    keyed = open_keyed(path, FORMAT, VERSION, key, fix, what="mixture plan", missing=missing)
    found, items = keyed.header["key"], keyed.header.get("items")
    weights, block, sizes = found.get("weights"), found.get("block"), found.get("windows")
    if (
        not isinstance(items, int) or not isinstance(weights, list) or not isinstance(block, int) or items < 0
        or block < 1 or not 1 <= len(weights) <= 255 or not isinstance(sizes, list) or len(sizes) != len(weights)
        or not all(isinstance(w, str) and w.isdigit() and int(w) > 0 for w in weights)
    ):  # fmt: skip
        raise StoreError(f"{shown}: the header's items, weights or block are malformed; {fix}")
    sources, rows = len(weights), items // block + 1
    sections = keyed.sections
    if set(sections) != {"sources", "checkpoints"} or (sections["sources"].entries, sections["checkpoints"].entries) != (
        items,
        rows * sources,
    ):
        raise StoreError(f"{shown}: its sections are not {items} items and {rows} checkpoint rows of {sources} sources; {fix}")
    keyed.validate = lambda name, values: _complaint(name, values, sources, items)
    ids = keyed.array("sources")
    checkpoints = keyed.array("checkpoints").reshape(rows, sources)
    return MixPlan(ids, checkpoints, tuple(int(a) for a in weights), block, shown)


def _complaint(name: str, values: npt.NDArray[np.integer], sources: int, items: int) -> str | None:
    """What is wrong with a block of *name* whose digest matched (a forged file): a source id or count out of range."""
    if name == "sources" and values.size and int(values.max()) >= sources:
        return f"a source id {int(values.max())}, but the mixture has {sources} sources"
    if name == "checkpoints" and values.size and (int(values.min()) < 0 or int(values.max()) > items):
        return f"a checkpoint count outside 0..{items}"
    return None
