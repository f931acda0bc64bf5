"""Plan files: a shuffled order computed once, written atomically, memory-mapped read-only by every process.

`plan_file(windows, seed, plan_dir)` is the shuffle stage with its result on
disk: the same windows in the same order as ``shuffle(windows, seed)``, backed
by a read-only ``np.memmap`` of ``plan_dir/<key hash>.plan`` that every rank and
DataLoader worker maps (file pages, shared; no private per-window memory).

A plan file is a keyed file (`streambatch.io.keyed_file`: a header sized to its
content, the body in blocks of 64 Ki entries with a digest each), whose one
section ``plan`` holds one little-endian uint32 per window (first-token
positions, or window numbers in sources of 2**32+ tokens; int64 beyond 2**32
windows).  The header records the full *key* and ``state_after``::

    {"format": "streambatch.plan", "version": 2,
     "key": {"corpus": FINGERPRINT, "context_length": T, "stride": S, "partition": P,
             "seed": SHUFFLE_SEED, "windows": N, "holds": "positions", "dtype": "<u4"},
     "state_after": STATE, "run": {"seed": RUN_SEED, "epoch": E}, ...the layout's fields}

The file name is a hash of the key.  The key's ``seed`` is the shuffle seed
itself: epoch ``E`` of a run seeded ``R`` shuffles with ``derive_seed(R, E)``, so
``streambatch plan --seed R --epoch E`` and ``Epoch(seed=derive_seed(R, E))``
(what ``EpochDataset.set_epoch(E)`` builds) name the same file; ``run`` only
records how it was asked for.  In-memory stores are keyed by their content
fingerprint (`DocumentStore.content_fingerprint`, the one `write_store` would
record).

A plan of packed rows (`sb.pack`) is the same file holding one uint32 row
number per row; its key has ``"mode": "pack"``, the packing ``algorithm``,
``T``, the partition, the seed and ``"rows": N`` (no stride): it is shared by
processes exactly as a window plan is.

Writing: a temporary file beside the target, the plan permuted in memory
(`streambatch.order.shuffle.permute`) and written once, header last, fsync,
then renamed into place: a crash leaves no plan (and its temporary file is
removed by the next planner).  A plan that does not fit in memory is permuted
in the file's own pages instead (slower, bounded by the disk).  Concurrent
planners of one key serialize on an ``fcntl.flock`` of ``<key hash>.lock``
(`streambatch.io.keyed_file.computed_once`).  A plan folder that cannot be
written is refused with `StoreError` (an existing plan in it is still mapped):
there is no silent in-memory fallback.

Checks, from cheap to thorough:

- opening reads the header and the block digests only: its key against the
  expected key, the file size against the window count (a stale, foreign,
  truncated or earlier-layout plan raises `StoreError` and is never used);
- every block is checked against its digest the first time this process reads
  it for a batch, and every entry where it is used (`Windows.positions`): it
  must be a window of the source and partition; a damaged block or entry is
  refused (`StoreError`, `DataError`), never emitted;
- ``verify=True`` (``streambatch plan/epoch --verify``, ``audit --plan-dir``)
  reads the plan once: every block, every entry, and no window twice
  (`streambatch.order.plan_check`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import check_seed
from ..errors import ConfigError, StoreError
from ..io.files import short_path
from ..io.keyed_file import KeyedFile, KeyedWriter, computed_once, file_name, open_keyed, write_keyed
from .protocol import Orderable, OrderedT, ShuffleOrder
from .shuffle import permute

FORMAT = "streambatch.plan"
VERSION = 2
SUFFIX = ".plan"
_BLOCK = 1 << 22
PathLike = str | os.PathLike[str]


def plan_key(windows: Orderable, seed: int) -> dict[str, Any]:
    """What a plan of *windows* (or packed rows) in the order of *seed* depends on; the plan file's name hashes it.

    A plan of packed `Rows` holds row numbers; its key names the mode, ``T`` and
    the packing algorithm instead of the stride.

    >>> import streambatch as sb
    >>> key = plan_key(sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2), 7)
    >>> key["seed"], key["windows"], key["holds"], key["dtype"]
    (7, 3, 'positions', '<u4')
    """
    _check_whole(windows)
    return {**windows.plan_key_fields(), "seed": check_seed(seed), **_filter_key(windows)}


def _filter_key(windows: Orderable) -> dict[str, Any]:
    """What a plan of items filtered by ``skip_untrained`` adds to its key (nothing for unfiltered items: their keys,
    and so their files' names, are unchanged)."""
    return {} if windows.untrained is None else {"skip_untrained": True, "dropped": windows.untrained.dropped}


def plan_path(windows: Orderable, seed: int, plan_dir: PathLike) -> Path:
    """Where the plan of *windows* in the order of *seed* lives in *plan_dir* (it may not exist yet)."""
    return Path(plan_dir) / _file_name(plan_key(windows, seed))


def _file_name(key: dict[str, Any]) -> str:
    return file_name(FORMAT, VERSION, key, SUFFIX)


def _check_whole(windows: Orderable) -> None:
    if getattr(windows, "plan_key_fields", None) is None:  # the items a plan file orders: windows, packed rows
        raise ConfigError(f"windows={windows!r} is not a streambatch.Windows; build one with sb.windows(store, ...)")
    if not windows.is_whole:
        raise ConfigError(
            f"windows={windows!r} is a view or already ordered; a plan file orders every window of a source: "
            "pass sb.windows(source, ...) itself"
        )


def plan_file(windows: OrderedT, seed: int, plan_dir: PathLike, *, verify: bool = False) -> OrderedT:
    """``shuffle(windows, seed)`` backed by a plan file in *plan_dir*: computed once, then memory-mapped.

    The first caller computes and writes the plan (atomically; concurrent callers
    wait on a file lock, then map it); every later call, in any process, maps the
    file read-only.  A plan file that does not match (another seed, configuration
    or corpus; truncated) raises `StoreError`.  ``verify=True`` also reads the
    plan once to check its digest, every entry and that no window repeats.

    >>> import tempfile, streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> order = sb.plan_file(sb.windows(docs, context_length=2), 7, tempfile.mkdtemp())
    >>> list(order), order.plan_path.endswith(".plan")
    ([4, 1, 3, 0, 2], True)
    """
    return build_plan(windows, seed, plan_dir, verify=verify)[0]


def build_plan(
    windows: OrderedT, seed: int, plan_dir: PathLike, *, run: dict[str, int] | None = None, verify: bool = False
) -> tuple[OrderedT, bool]:
    """`plan_file`, and whether this call wrote the plan (False: it existed, or another process wrote it).

    *run* (``{"seed": R, "epoch": E}``) is recorded in the header of a new plan.
    """
    key = plan_key(windows, seed)
    path, created = computed_once(plan_dir, _file_name(key), "plan", lambda target: _write_plan(target, windows, key, run))
    plan, keyed = open_plan(path, key)
    ordered: OrderedT = windows.with_plan(plan, ShuffleOrder(key["seed"], keyed.header["state_after"]))
    if verify:
        from .plan_check import verify_plan  # the full read: only when asked for

        verify_plan(ordered, keyed)
    return ordered, created


def _write_plan(path: Path, windows: Orderable, key: dict[str, Any], run: dict[str, int] | None) -> None:
    """Compute the plan into a temporary file beside *path*, then rename it into place (`write_keyed`)."""
    count, dtype = _count(key), np.dtype(key["dtype"])
    need = count * dtype.itemsize
    with write_keyed(path, FORMAT, VERSION, key, [("plan", dtype.str, count)]) as writer:
        try:
            # permuted in anonymous memory, then written once, in order: random swaps on a file-backed
            # map would make the kernel write dirty pages back while they happen (measured 9x slower at 10^9)
            values: npt.NDArray[Any] = _scratch(count, dtype)
            in_file = False
        except MemoryError:  # larger than memory: permute in the file's own pages (evictable, slower)
            values = _in_file(writer, path, count, need)
            in_file = True
        try:
            _fill(values, windows)
            state = permute(values, key["seed"])
        except MemoryError:
            raise StoreError(
                f"{short_path(path)}: out of memory while planning {count} windows ({need} bytes); "
                "raise the memory limit (ulimit -v) or plan on a larger machine"
            ) from None
        if not in_file:
            writer.put("plan", values)
        del values
        writer.fields["state_after"] = int(state)
        if run is not None:
            writer.fields["run"] = run


def _in_file(writer: KeyedWriter, path: Path, count: int, need: int) -> npt.NDArray[Any]:
    """The plan section mapped writable in the file being written; `StoreError` stating the bytes when it cannot be."""
    try:
        return writer.mapped("plan")
    except (OSError, MemoryError, ValueError) as err:
        raise StoreError(
            f"{short_path(path)}: a plan of {count} windows needs {need} bytes of memory or address space, and mapping "
            f"them failed ({err}); raise the memory limit (ulimit -v) or plan on a larger machine"
        ) from None


def _scratch(count: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """Anonymous memory for a plan being computed (`MemoryError` when it does not fit: the file is used instead)."""
    return np.empty(count, dtype=dtype)


def _count(key: dict[str, Any]) -> int:
    """Items a plan of *key* holds: windows, or packed rows."""
    return int(key["rows"] if key.get("mode") == "pack" else key["windows"])


def _fill(values: npt.NDArray[Any], windows: Orderable) -> None:
    """Write every item's plan entry (document order) into *values*, in bounded blocks."""
    if windows.untrained is not None:  # the kept items of skip_untrained
        values[:] = windows.untrained.entries
    else:
        windows.fill_plan(values)


def open_plan(path: PathLike, key: dict[str, Any]) -> tuple[npt.NDArray[Any], KeyedFile]:
    """Map the plan file *path* read-only after checking its header against *key*; return ``(plan, keyed file)``.

    Reads the header and the block digests only.  Any mismatch (layout, format, key, dtype, size) raises `StoreError`.
    """
    shown = short_path(path)
    fix = f"remove {shown} and plan again (streambatch plan, or Epoch(..., plan_dir=...))"
    missing = "no such plan file; plan it with sb.plan_file or `streambatch plan`"
    keyed = open_keyed(path, FORMAT, VERSION, key, fix, what="plan", missing=missing)
    count, dtype = _count(key), np.dtype(key["dtype"])
    section = keyed.sections.get("plan")
    if section is None or section.entries != count or section.dtype != dtype or len(keyed.sections) != 1:
        raise StoreError(f"{shown}: its plan section is not {count} windows of {dtype.name}; {fix}")
    state_after = keyed.header.get("state_after")
    if not isinstance(state_after, int) or isinstance(state_after, bool) or not 0 <= state_after < 1 << 64:
        raise StoreError(f"{shown}: state_after={state_after!r} is not a 64-bit state; {fix}")
    return keyed.array("plan"), keyed
