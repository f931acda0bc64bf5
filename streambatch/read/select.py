"""Which files a run reads, in what order, and their formats (by suffix).

>>> [format_of(n) for n in ["a.ndjson", "B.JSONL.GZ", "c.txt.zst", "d.parquet", "e.offsets.npy", "f.bin", "g.npy.gz"]]
['jsonl', 'jsonl', 'text', 'parquet', 'offsets', 'bin', 'unsupported']
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._checks import is_integer
from ..errors import ConfigError, DataError
from ..io.files import short_path
from . import inputs as _inputs
from .columns.hf import is_dataset_folder


def format_of(name: str) -> str:
    """The format of a file, from its suffix in any case: jsonl, text, parquet, arrow, npy, offsets, bin, or unsupported.

    >>> [format_of(n) for n in ["a.ndjson", "B.JSONL.GZ", "c.txt.zst", "d.parquet", "e.offsets.npy", "f.bin", "g.npy.gz"]]
    ['jsonl', 'jsonl', 'text', 'parquet', 'offsets', 'bin', 'unsupported']
    """
    base = _inputs.base_name(name)
    compressed = base != name.lower()
    if base.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    for suffixes, kind in (((".parquet",), "parquet"), ((".arrow", ".feather"), "arrow"), ((".offsets.npy",), "offsets"),
                           ((".npy",), "npy"), ((".bin",), "bin"), ((".idx",), "megatron"), ((".ds",), "datatrove"),
                           ((".ds.index", ".ds.loss"), "datatrove-part")):  # fmt: skip
        if base.endswith(suffixes):
            return "unsupported" if compressed else kind
    return "text"


SKIPPED_FOLDERS = frozenset({"__pycache__"})
"""Folders a walk never enters (besides hidden ones): caches of compiled files, never text to train on."""
SNIFF_BYTES = 8192
"""Bytes read from a text file found in a folder to tell text from binary (a NUL byte: binary)."""


class Selected(list["InputFile"]):
    """The selected input files, in order, with ``left_out``: binary files a folder walk passed over (their paths)."""

    left_out: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputFile:
    """One selected input: its *path*, its document id *name*, the *relative* path globs match, its *kind*."""

    path: Path
    name: str
    relative: str
    kind: str


def parse_part(part: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/n"`` (or ``(i, n)``) as ``(i, n)`` with ``0 <= i < n``; None stays None.

    >>> parse_part("2/8")
    (2, 8)
    """
    if part is None:
        return None
    parts: Any = part.split("/") if isinstance(part, str) else part
    try:
        index, count = (int(p) for p in parts) if isinstance(part, str) else parts
    except (TypeError, ValueError):
        index = count = None
    if not (is_integer(index) and is_integer(count) and 0 <= int(index) < int(count)):  # type: ignore[arg-type]
        raise ConfigError(f"part={part!r} must be i/n with 0 <= i < n (e.g. 0/4); pass this machine's share of n")
    return int(index), int(count)  # type: ignore[arg-type]


def select_inputs(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> Selected:
    """The input files, in order: inputs as given, each folder's files sorted by relative path (hidden
    entries skipped; a folder saved by ``datasets`` is one input; ``X.offsets.npy`` goes with ``X.npy``).

    *include*/*exclude* globs (`fnmatch`, case-sensitive, ``*`` also crosses ``/``)
    match each file's path relative to its input folder (a file given directly:
    its name); a file is kept if it matches some include (when any) and no
    exclude (a part of them, ``--part I/N``: `streambatch.read.parts`).  A file's
    ``name`` (its documents' id) is its path relative to its input folder,
    prefixed with the folder's name when several inputs are given; a file given
    directly keeps the path as given.  A folder walk skips hidden entries and
    ``__pycache__`` folders, and leaves out text-kind files holding binary data
    (a NUL byte near the start: compiled files, images, archives), listing them
    in the result's ``left_out``; a binary file named directly is still refused by its reader.
    """
    if isinstance(inputs, (str, os.PathLike)):
        raise ConfigError(f"inputs={short_path(inputs)!r} is one path; pass a list of files and folders")
    several = len(inputs) > 1
    files: list[InputFile] = []
    left_out: list[str] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            prefix = f"{path.name or path.resolve().name}/" if several else ""
            files.extend(sorted(_walk(path, prefix, os.fspath(raw), left_out), key=lambda f: f.relative))
        elif path.is_file():
            kind = format_of(path.name)
            if kind == "bin" and path.with_name(path.name[:-4] + ".idx").is_file():
                kind = "megatron"  # Megatron's tokens: documents are what its index says, not separator-split
            files.append(InputFile(path, os.fspath(raw), path.name, kind))
        elif path.exists():  # a FIFO, device or socket: never read (it could block or never end)
            raise DataError(f"input {short_path(raw)!r} is not a regular file or a folder; pass files or folders")
        else:
            raise DataError(f"input {short_path(raw)!r} does not exist; pass files or folders")
    kept = [
        f
        for f in files
        if (not include or any(fnmatch.fnmatchcase(f.relative, g) for g in include))
        and not any(fnmatch.fnmatchcase(f.relative, g) for g in exclude)
    ]
    selected = Selected(kept)
    selected.left_out = tuple(left_out)
    return selected


def _ds_of(name: str) -> str:
    """The ``.ds`` file a ``.ds.index`` or ``.ds.loss`` belongs to."""
    return name[: name.lower().rindex(".ds.") + 3]


def is_binary(path: Path) -> bool:
    """Whether a regular file holds binary data: a NUL byte in its first `SNIFF_BYTES`.

    Never opens anything but a regular file (a FIFO would block, a device never
    end): those, and unreadable files, are left to the reader, which refuses them.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        return b"\0" in handle.read(SNIFF_BYTES)


def _walk(folder: Path, prefix: str, given: str, left_out: list[str]) -> Iterator[InputFile]:
    """The files under *folder*, hidden entries and `SKIPPED_FOLDERS` skipped; binary text-kind files go to *left_out*."""
    if is_dataset_folder(folder):
        yield InputFile(folder, prefix.rstrip("/") or given, folder.name, "dataset")
        return
    for root, dirs, names in os.walk(folder):
        here = Path(root)
        for d in sorted(dirs):
            if not d.startswith(".") and is_dataset_folder(here / d):
                relative = (here / d).relative_to(folder).as_posix()
                yield InputFile(here / d, prefix + relative, relative, "dataset")
        dirs[:] = sorted(
            d for d in dirs if not d.startswith(".") and d not in SKIPPED_FOLDERS and not is_dataset_folder(here / d)
        )
        present = set(names)
        for name in sorted(names):
            if name.startswith("."):
                continue
            kind = format_of(name)
            if kind == "offsets" and name[: -len(".offsets.npy")] + ".npy" in present:
                continue  # read with its token file
            if (kind == "bin" and name[:-4] + ".idx" in present) or (kind == "datatrove-part" and _ds_of(name) in present):
                continue  # a Megatron .bin is read through its .idx, a .ds.index or .ds.loss with its .ds
            relative = (here / name).relative_to(folder).as_posix()
            plain = _inputs.base_name(name) == name.lower()  # compressed text is read through its decompressor
            if kind == "text" and plain and is_binary(here / name):  # a compiled file, an image, an archive
                left_out.append(os.fspath(here / name))
                continue
            yield InputFile(here / name, prefix + relative, relative, kind)
