"""Open what a path names: a store directory, a corpus manifest or a JSONL file, as one `Source`.

One place decides how a path becomes documents, so every command (and script)
reads sources the same way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._paths import short_path
from ..errors import DataError, StoreError
from ..io.formats import open_format
from ..io.manifest import CORPUS_MANIFEST, is_corpus_folder, open_corpus
from ..io.mixture_file import MixtureSource, is_mixture_file, open_mixture
from ..io.remote.location import is_remote
from ..io.store import open_store
from ..model.source import Source
from ..model.store import DocumentStore
from .inputs import MAX_LINE_BYTES
from .jsonl import read_jsonl


def open_source(
    path: str | os.PathLike[str],
    *,
    verify: bool = True,
    max_line_bytes: int = MAX_LINE_BYTES,
    format: str | None = None,  # noqa: A002
    remote: Mapping[str, Any] | None = None,
) -> Source | MixtureSource:
    """Open a store directory (memory-mapped, checked), a corpus manifest or a mixture file (``*.json``), or a JSONL file.

    A corpus folder (``prepare --executor ray``: ``part-00000``, ... and ``corpus.json``) opens as its manifest.

    An address (``s3://``, ``gs://``, ``https://``) opens a store or a corpus manifest in object storage;
    *remote* holds its keywords (`streambatch.io.remote.open.open_remote_store`: ``cache_dir``,
    ``cache_bytes``, ``trust_remote``, ``options``, ...).

    A mixture file (``{"sources": [...]}``, see `streambatch.io.mixture_file`) gives a
    `MixtureSource`: every source opened, to blend once a context length and a seed are given.

    Megatron-LM's datasets (a prefix, or its ``.bin`` or ``.idx`` path) and datatrove's
    tokenized files (a ``.ds`` file; a folder of either is read as one corpus) are
    memory-mapped too (`streambatch.io.formats`); their arrays are checked at first use.
    A folder holding both kinds is refused unless *format* (``"megatron"`` or
    ``"datatrove"``) names the one to read.

    A JSONL line may hold at most *max_line_bytes* (`streambatch.read.jsonl.iter_jsonl`).

    >>> import tempfile, pathlib
    >>> file = pathlib.Path(tempfile.mkdtemp()) / "docs.jsonl"
    >>> _ = file.write_text('{"id": "a", "tokens": [0, 10, 11, 12, 1]}\\n')
    >>> source = open_source(file)
    >>> source.kind, source.store.ids
    ('jsonl', ('a',))
    """
    name = os.fspath(path)
    if is_remote(name):  # in object storage: a corpus manifest (*.json), a store, or a corpus folder (its corpus.json)
        keywords = dict(remote or {})
        if name.lower().endswith(".json"):
            return Source(name, "corpus", open_corpus(name, **keywords), verified=False)
        try:
            return Source(name, "store", open_store(name, **keywords), verified=False)
        except DataError:
            manifest = f"{name.rstrip('/')}/{CORPUS_MANIFEST}"
            if not _remote_exists(manifest):
                raise
            return Source(name, "corpus", open_corpus(manifest, **keywords), verified=False)
    other = open_format(name, format)  # Megatron-LM's .bin + .idx, datatrove's .ds, or a folder of either
    if other is not None:
        return Source(name, other[0], other[1])
    if not os.path.lexists(name) and os.path.isfile(name + ".bin"):  # a Megatron prefix whose .idx is missing
        raise DataError(_no_index(name + ".bin"))
    if _missing_store(name):  # `data/store` that is not there (nor a Megatron prefix): say what was looked for
        shown = short_path(name)
        raise StoreError(
            f"{shown}: no such store folder (a SOURCE is a store folder, a Megatron-LM prefix, a corpus manifest or "
            f"mixture file ending in .json, or a JSONL file); prepare the store with `streambatch prepare INPUT -o {shown}`"
        )
    if is_corpus_folder(name):  # a corpus folder (`prepare --executor ray`): its parts, read through its corpus.json
        return Source(name, "corpus", open_corpus(name, verify=verify), verified=verify)
    if os.path.isdir(name):  # a store prepared by `streambatch prepare`
        return Source(name, "store", open_store(name, verify=verify), verified=verify)
    if is_mixture_file(name):  # sources and their weights: a blend
        return open_mixture(name, verify=verify)
    if name.lower().endswith(".json"):  # a manifest listing the stores of a sharded corpus
        return Source(name, "corpus", open_corpus(name, verify=verify), verified=verify)
    if name.endswith(".bin"):  # a Megatron-LM .bin whose .idx is not beside it (open_format found none)
        raise DataError(_no_index(name))
    return Source(name, "jsonl", DocumentStore.from_documents(read_jsonl(name, max_line_bytes=max_line_bytes)))


def _no_index(path: str) -> str:
    return (
        f"{short_path(path)}: a Megatron-LM .bin opens with its index {short_path(path[:-4] + '.idx')}, which is "
        "missing (a write killed part way leaves none: write it again); a flat nanoGPT .bin is read by "
        "`streambatch prepare FILE.bin -o STORE` (--bin-separator)"
    )


def _missing_store(name: str) -> bool:
    """Whether *name* is a store folder's bare name (no suffix such as ``.jsonl``, no ``s3://``) that does not exist."""
    named_as_file = "." in os.path.basename(name.rstrip(os.sep)).lstrip(".")
    return not named_as_file and "://" not in name and not os.path.lexists(name)


def _remote_exists(url: str) -> bool:
    from ..io.remote.client import ObjectClient
    from ..io.remote.location import Location

    where = Location.parse(url)
    try:
        ObjectClient(where.parent(), retries=0).head(where.prefix.rpartition("/")[2])
    except DataError:
        return False
    return True
