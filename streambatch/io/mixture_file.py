"""Mixture files: ``mixture.json``, the sources of a blend and their weights, read and validated.

::

    {"sources": [{"name": "web", "path": "web", "weight": 0.6},
                 {"name": "code", "path": "code/corpus.json", "weight": 0.3},
                 {"name": "books", "path": "books", "weight": 0.1}],
     "length": 1000000}

``sources`` lists 1 to 255 entries, each with exactly ``name`` (a non-empty
string, distinct), ``path`` (a store directory, a corpus manifest, or Megatron's or datatrove's files, relative
to the file's folder) and ``weight`` (a positive finite number; weights are
normalised to sum 1).  ``length`` (optional; null or absent: the largest source
passed once at its weight) is the number of items.  Nothing else is allowed.

Absolute paths are refused: a mixture file names its sources relative to
itself, so the file and its sources move together (``..`` may climb out of its
folder).  The file is read with the bounded JSON reader (at most 1 MiB); every
refusal is a `ConfigError` naming the file, the entry and what to do, and a
source that cannot be opened is the store's own `StoreError`, prefixed with the
file and the entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..errors import ConfigError, StreamBatchError
from ..model.corpus import Corpus
from ..model.store import DocumentStore
from .bounded_json import read_json_header
from .files import open_regular, short_path
from .formats import open_format
from .manifest import open_corpus
from .remote.location import is_remote
from .store import open_store

PathLike = str | os.PathLike[str]
LIMIT = 1 << 20
_PEEK = 1 << 16  # bytes of a .json file read to tell a mixture file from a corpus manifest
MAX_SOURCES = 255
_TOP = ("sources", "length", "weight_by")
_ENTRY = ("name", "path", "weight")


@dataclass(frozen=True)
class MixtureSpec:
    """What a mixture file says: each source's name, path (resolved against the file) and weight, and the length."""

    path: str
    names: tuple[str, ...]
    paths: tuple[str, ...]
    weights: tuple[int | float, ...]
    length: int | None
    weight_by: str = "items"  # the weights are shares of items, or ("targets") of counted targets


@dataclass(frozen=True)
class MixtureSource:
    """A mixture file opened: its spec and each source's store or corpus, in file order.

    What `streambatch.open_source` returns for a ``mixture.json``; `streambatch.Epoch`,
    `streambatch.Run` and every command accept it where a source goes (they need a
    context length and a seed to make the `streambatch.items.mix.mixture.Mixture`).
    """

    spec: MixtureSpec
    stores: tuple[DocumentStore | Corpus, ...]
    verified: bool = False

    @property
    def path(self) -> str:
        """The mixture file."""
        return self.spec.path

    @property
    def kind(self) -> str:
        """``"mixture"``."""
        return "mixture"


def is_mixture_file(path: PathLike) -> bool:
    """True when the ``.json`` file *path* is meant as a mixture file (a corpus manifest holds ``shards``).

    Decided from its first bytes, not from its decoding: a mixture file that is
    not valid JSON, too large, or not a regular file is still a mixture file,
    refused as one by `read_mixture_file`.  It is one when its start names
    ``"sources"`` and not ``"shards"``, or (unreadable: a FIFO, a device) when its
    name says ``mixture``.
    """
    name = os.fspath(path)
    if not name.lower().endswith(".json") or not os.path.exists(name) or os.path.isdir(name):
        return False
    named = "mixture" in os.path.basename(name).lower()
    try:
        with open_regular(name) as handle:
            start = handle.read(_PEEK)
    except (OSError, StreamBatchError):
        return named
    return b'"sources"' in start and b'"shards"' not in start


def read_mixture_file(path: PathLike) -> MixtureSpec:
    """Read and validate *path*; every refusal is a `ConfigError` naming the file and the entry."""
    where = os.fspath(path)
    shown = short_path(where)
    fix = "see the mixture.json schema in docs/mixtures.md"
    strict = (
        f"a mixture file is strict JSON (finite numbers: no NaN, Infinity or 1e309; no trailing comma) of at most 1 MiB; {fix}"
    )
    data = read_json_header(path, shown, "mixture file", strict, error=ConfigError, limit=LIMIT, missing="no such mixture file")
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: the top level must be an object with 'sources' (and optional 'length'); {fix}")
    _check_keys(data, _TOP, shown, fix)
    entries = data.get("sources")
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_SOURCES:
        raise ConfigError(f"{shown}: 'sources' must be a list of 1 to {MAX_SOURCES} entries; {fix}")
    names: list[str] = []
    paths: list[str] = []
    weights: list[int | float] = []
    folder = Path(where).parent
    for k, entry in enumerate(entries):
        at = f"{shown}: sources[{k}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be an object with 'name', 'path' and 'weight'; {fix}")
        _check_keys(entry, _ENTRY, at, fix, required=_ENTRY)
        name, relative, weight = entry["name"], entry["path"], entry["weight"]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{at}.name={name!r} must be a non-empty string; name each source")
        if name in names:
            raise ConfigError(f"{at}.name={name!r} is also sources[{names.index(name)}]'s; give each source its own name")
        if not isinstance(relative, str) or not relative:
            raise ConfigError(f"{at}.path={relative!r} must be a non-empty path to a store or a corpus manifest")
        if is_remote(relative):  # a store or manifest in object storage: its address
            names.append(name)
            paths.append(relative)
            weights.append(weight)
            continue
        if PurePosixPath(relative).is_absolute() or PureWindowsPath(relative).is_absolute() or PureWindowsPath(relative).drive:
            raise ConfigError(f"{at}.path={relative!r} is absolute; write it relative to the mixture file's folder")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < float("inf"):
            raise ConfigError(f"{at}.weight={weight!r} must be a positive finite number; weights are normalised to sum 1")
        names.append(name)
        paths.append(os.fspath(folder / relative))
        weights.append(weight)
    length = data.get("length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or not 0 < length < 1 << 48):
        raise ConfigError(f"{shown}: length={length!r} must be a positive int below 2**48, or null for one pass")
    weight_by = data.get("weight_by", "items")
    if weight_by not in ("items", "targets"):
        raise ConfigError(
            f'{shown}: weight_by={weight_by!r} must be "items" (weights are shares of items, the default) or '
            '"targets" (shares of counted targets)'
        )
    return MixtureSpec(where, tuple(names), tuple(paths), tuple(weights), length, weight_by)


def _check_keys(found: dict[str, Any], allowed: tuple[str, ...], at: str, fix: str, required: tuple[str, ...] = ()) -> None:
    unknown = [key for key in found if key not in allowed]
    if unknown:
        raise ConfigError(f"{at}: unknown key {unknown[0]!r} (allowed: {', '.join(allowed)}); {fix}")
    missing = [key for key in required if key not in found]
    if missing:
        raise ConfigError(f"{at}: missing {missing[0]!r} (each source needs {', '.join(required)}); {fix}")


def open_mixture(path: PathLike, *, verify: bool = True) -> MixtureSource:
    """Read *path* (`read_mixture_file`) and open each source: a store directory, a corpus manifest, or Megatron's
    or datatrove's files (`streambatch.io.formats.open_format`)."""
    spec = read_mixture_file(path)
    stores: list[DocumentStore | Corpus] = []
    for name, where in zip(spec.names, spec.paths, strict=True):
        try:
            if is_remote(where):
                stores.append(open_corpus(where) if where.lower().endswith(".json") else open_store(where))
                continue
            other = open_format(where)  # Megatron's or datatrove's files
            if other is not None:
                stores.append(other[1])
            elif os.path.isdir(where):
                stores.append(open_store(where, verify=verify))
            elif os.path.exists(where):
                stores.append(open_corpus(where, verify=verify))
            else:
                raise ConfigError(f"{short_path(where)}: no such store or corpus manifest")
        except StreamBatchError as err:
            raise type(err)(f"{short_path(spec.path)}: source {name!r}: {err}") from err
    return MixtureSource(spec, tuple(stores), verified=verify)
