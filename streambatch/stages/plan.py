"""Plan files: a shuffled order computed once, written atomically, memory-mapped read-only by every process.

`plan_file(windows, seed, plan_dir)` is the shuffle stage with its result on
disk: the same windows in the same order as ``shuffle(windows, seed)``, backed
by a read-only ``np.memmap`` of ``plan_dir/<key hash>.plan`` that every rank and
DataLoader worker maps (file pages, shared; no private per-window memory).

A plan file is one 4,096-byte JSON header (space-padded), then the plan: one
little-endian uint32 per window (first-token positions, or window numbers in
sources of 2**32+ tokens; int64 beyond 2**32 windows).  The header records the
full *key* and ``state_after``::

    {"format": "streambatch.plan", "version": 2,
     "key": {"corpus": FINGERPRINT, "context_length": T, "stride": S, "partition": P,
             "seed": SHUFFLE_SEED, "windows": N, "holds": "positions", "dtype": "<u4"},
     "state_after": STATE, "digest": BLAKE2B_256_OF_THE_PLAN, "run": {"seed": RUN_SEED, "epoch": E}}

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

Writing: a temporary file beside the target, filled through a writable memmap
and permuted in place (`streambatch.stages.shuffle.permute`), header last, fsync,
then renamed into place: a crash leaves no plan (and its temporary file is
removed by the next planner).  A plan that does not fit in memory is permuted
in the file's own pages instead (slower, bounded by the disk).  Concurrent
planners of one key serialize on an ``fcntl.flock`` of ``<key hash>.lock``
(which holds the holder's pid): one computes, the others wait, saying so on
stderr after a second and naming the holder, then find the plan and map it.  A
plan folder that cannot be written is refused with `StoreError` (an existing
plan in it is still mapped): there is no silent in-memory fallback.

Checks, from cheap to thorough:

- opening reads the header only: its key against the expected key, the file
  size against the window count (a stale, foreign or truncated plan raises
  `StoreError` and is never used);
- every entry is checked where it is used (`Windows.positions`): it must be a
  window of the source and partition (one ``searchsorted`` per batch), so a
  tampered entry is refused with `DataError`, never emitted;
- ``verify=True`` (``streambatch plan/epoch --verify``, ``audit --plan-dir``)
  reads the plan once: its BLAKE2b digest against the header, every entry, and
  no window twice (`streambatch.stages.plan_check`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from .._checks import check_seed
from ..errors import ConfigError, StoreError
from ..io.atomic import atomic_file, exclusive_lock
from ..io.bounded_json import read_json_header
from ..io.files import short_path
from ..items.pack.pack_file import ALGORITHM
from ..items.pack.rows import Rows
from ..items.protocol import ShuffleOrder
from ..items.windows.windows import Windows
from .shuffle import permute

FORMAT = "streambatch.plan"
VERSION = 2
HEADER_BYTES = 4096  # one page: the plan itself starts page-aligned
SUFFIX = ".plan"
_BLOCK = 1 << 22
PathLike = str | os.PathLike[str]
OrderedT = TypeVar("OrderedT", bound=Windows | Rows)


def plan_key(windows: Windows | Rows, seed: int) -> dict[str, Any]:
    """What a plan of *windows* (or packed rows) in the order of *seed* depends on; the plan file's name hashes it.

    A plan of packed `Rows` holds row numbers; its key names the mode, ``T`` and
    the packing algorithm instead of the stride.

    >>> import streambatch as sb
    >>> key = plan_key(sb.windows([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2), 7)
    >>> key["seed"], key["windows"], key["holds"], key["dtype"]
    (7, 3, 'positions', '<u4')
    """
    _check_whole(windows)
    count = len(windows)
    if isinstance(windows, Rows):
        return {
            "corpus": windows.store.content_fingerprint(),
            "mode": "pack",
            "algorithm": ALGORITHM,
            "context_length": windows.context_length,
            "partition": windows.partition.value,
            "seed": check_seed(seed),
            "rows": count,
            "holds": "rows",
            "dtype": np.dtype(windows.space.plan_dtype(count)).newbyteorder("<").str,
        }
    space = windows.space
    return {
        "corpus": space.store.content_fingerprint(),
        "context_length": space.config.context_length,
        "stride": space.config.stride,
        "partition": space.partition.value,
        "seed": check_seed(seed),
        "windows": count,
        "holds": "positions" if space.plan_holds_positions else "window_numbers",
        "dtype": np.dtype(space.plan_dtype(count)).newbyteorder("<").str,
    }


def plan_path(windows: Windows | Rows, seed: int, plan_dir: PathLike) -> Path:
    """Where the plan of *windows* in the order of *seed* lives in *plan_dir* (it may not exist yet)."""
    return Path(plan_dir) / _file_name(plan_key(windows, seed))


def _file_name(key: dict[str, Any]) -> str:
    text = json.dumps([FORMAT, VERSION, key], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + SUFFIX


def _check_whole(windows: Windows | Rows) -> None:
    if not isinstance(windows, Windows | Rows):
        raise ConfigError(f"windows={windows!r} is not a streambatch.Windows; build one with sb.windows(store, ...)")
    total = len(windows.packing) if isinstance(windows, Rows) else windows.window_index.window_count
    if not windows.is_sequential or len(windows) != total:
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


def check_plan_dir(plan_dir: Any) -> PathLike:
    """Return *plan_dir* if it is a path (str or os.PathLike), else raise `ConfigError`."""
    if not isinstance(plan_dir, (str, os.PathLike)) or not os.fspath(plan_dir):
        raise ConfigError(f"plan_dir={plan_dir!r} is not a folder path; pass a str or pathlib.Path (created if missing)")
    return plan_dir


def build_plan(
    windows: OrderedT, seed: int, plan_dir: PathLike, *, run: dict[str, int] | None = None, verify: bool = False
) -> tuple[OrderedT, bool]:
    """`plan_file`, and whether this call wrote the plan (False: it existed, or another process wrote it).

    *run* (``{"seed": R, "epoch": E}``) is recorded in the header of a new plan.
    """
    key = plan_key(windows, seed)
    directory = Path(check_plan_dir(plan_dir))
    name = _file_name(key)
    path = directory / name
    created = False
    if not path.exists():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            with exclusive_lock(directory / (name[: -len(SUFFIX)] + ".lock"), what="plan"):
                if not path.exists():  # another process may have written it while this one waited
                    _write_plan(path, windows, key, run)
                    created = True
        except OSError as err:  # a read-only or full folder: refused, nothing half-written
            raise StoreError(
                f"plan_dir={short_path(plan_dir)!r}: cannot write the plan there ({err.strerror or err}); "
                "pass a writable folder, or plan it once with `streambatch plan -o` where it can be written"
            ) from None
    plan, header = open_plan(path, key)
    ordered: OrderedT = windows.with_plan(plan, ShuffleOrder(key["seed"], header["state_after"]))  # type: ignore[assignment]
    if verify:
        from .plan_check import verify_plan  # the full read: only when asked for

        verify_plan(ordered, path, header["digest"])
    return ordered, created


def _write_plan(path: Path, windows: Windows | Rows, key: dict[str, Any], run: dict[str, int] | None) -> None:
    """Compute the plan into a temporary file beside *path*, then rename it into place (`atomic_file`)."""
    count, dtype = _count(key), np.dtype(key["dtype"])
    need = count * dtype.itemsize
    with atomic_file(path) as handle:
        os.fchmod(handle.fileno(), 0o644)  # readable by every rank (temporaries are private)
        handle.truncate(HEADER_BYTES + need)
        try:
            # permuted in anonymous memory, then written once, in order: random swaps on a file-backed
            # map would make the kernel write dirty pages back while they happen (measured 9x slower at 10^9)
            values: npt.NDArray[Any] = _scratch(count, dtype)
            in_file = False
        except MemoryError:  # larger than memory: permute in the file's own pages (evictable, slower)
            try:
                values = np.memmap(handle, dtype=dtype, mode="r+", offset=HEADER_BYTES, shape=(count,))
            except (OSError, MemoryError, ValueError) as err:
                raise StoreError(
                    f"{short_path(path)}: a plan of {count} windows needs {need} bytes of memory or address space, and mapping "
                    f"them failed ({err}); raise the memory limit (ulimit -v) or plan on a larger machine"
                ) from None
            in_file = True
        try:
            _fill(values, windows)
            state = permute(values, key["seed"])
        except MemoryError:
            raise StoreError(
                f"{short_path(path)}: out of memory while planning {count} windows ({need} bytes); "
                "raise the memory limit (ulimit -v) or plan on a larger machine"
            ) from None
        digest = hashlib.blake2b(values.view(np.uint8).data if values.size else b"", digest_size=32).hexdigest()
        if in_file:
            values.flush()  # type: ignore[attr-defined]
        else:
            handle.seek(HEADER_BYTES)
            values.tofile(handle)
        del values
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "key": key,
            "state_after": int(state),
            "digest": digest,
        }
        if run is not None:
            header["run"] = run
        text = json.dumps(header).encode()
        if len(text) >= HEADER_BYTES:
            raise StoreError(f"plan header of {len(text)} bytes does not fit in {HEADER_BYTES}; shorten the fingerprint")
        handle.seek(0)
        handle.write(text.ljust(HEADER_BYTES - 1) + b"\n")


def _scratch(count: int, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """Anonymous memory for a plan being computed (`MemoryError` when it does not fit: the file is used instead)."""
    return np.empty(count, dtype=dtype)


def _count(key: dict[str, Any]) -> int:
    """Items a plan of *key* holds: windows, or packed rows."""
    return int(key["rows"] if key.get("mode") == "pack" else key["windows"])


def _fill(values: npt.NDArray[Any], windows: Windows | Rows) -> None:
    """Write every item's plan entry (document order) into *values*, in bounded blocks."""
    if isinstance(windows, Windows) and windows.space.plan_holds_positions:
        windows.space.index.all_positions(values.dtype, out=values)
    else:
        for lo in range(0, values.size, _BLOCK):
            hi = min(lo + _BLOCK, values.size)
            values[lo:hi] = np.arange(lo, hi, dtype=values.dtype)


def open_plan(path: PathLike, key: dict[str, Any]) -> tuple[npt.NDArray[Any], dict[str, Any]]:
    """Map the plan file *path* read-only after checking its header against *key*; return ``(plan, header)``.

    Reads the header only.  Any mismatch (format, key, dtype, size) raises `StoreError`.
    """
    where = Path(path)
    shown = short_path(where)
    fix = f"remove {shown} and plan again (streambatch plan, or Epoch(..., plan_dir=...))"
    header = read_json_header(
        where,
        shown,
        "plan header",
        fix,
        error=StoreError,
        limit=HEADER_BYTES,
        padding=b"\0 \n",
        missing="no such plan file; plan it with sb.plan_file or `streambatch plan`",
    )
    try:
        size = where.stat().st_size
    except OSError as err:
        raise StoreError(f"{shown}: unreadable plan file ({err.strerror or err}); {fix}") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise StoreError(f"{shown}: not a {FORMAT!r} version {VERSION} file; {fix}")
    found = header.get("key")
    if found != key:
        if not isinstance(found, dict):
            raise StoreError(f"{shown}: the header has no key; {fix}")
        differ = ", ".join(f"{k}={found.get(k)!r} (expected {v!r})" for k, v in key.items() if found.get(k) != v)
        raise StoreError(f"{shown}: a plan for another key: {differ or 'extra fields'}; it is stale or foreign; {fix}")
    count, dtype = _count(key), np.dtype(key["dtype"])
    expected = HEADER_BYTES + count * dtype.itemsize
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise StoreError(f"{shown}: {size} bytes but {count} windows of {dtype.name} need {expected}: {state}; {fix}")
    state_after = header.get("state_after")
    if not isinstance(state_after, int) or isinstance(state_after, bool) or not 0 <= state_after < 1 << 64:
        raise StoreError(f"{shown}: state_after={state_after!r} is not a 64-bit state; {fix}")
    digest = header.get("digest")
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise StoreError(f"{shown}: digest={digest!r} is not a BLAKE2b-256 hex digest; {fix}")
    if not count:
        return np.zeros(0, dtype=dtype), header
    try:
        return np.memmap(where, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(count,)), header
    except (OSError, MemoryError, ValueError) as err:  # e.g. ENOMEM under an address-space limit
        raise StoreError(
            f"{shown}: cannot map the plan's {count * dtype.itemsize} bytes ({err}); raise the memory limit (ulimit -v)"
        ) from None
