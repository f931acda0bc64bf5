"""Write a store (or a corpus manifest) to object storage so that no reader ever sees a partial one.

The data parts go up first (``tokens.bin``, ``offsets.bin``, ``ids.jsonl``,
``partitions.bin``), then the header, with each part's size and ETag recorded
under ``objects``: a reader finds either no header (no store yet), the old
header (whose recorded ETags no longer match: a `DataError` naming the object,
never mixed tokens) or the complete new store.  A corpus's shards go up before
its manifest; the manifest records each shard's fingerprint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, StoreError
from ...model.corpus import FORMAT as CORPUS_FORMAT
from ...model.corpus import VERSION as CORPUS_VERSION
from ...model.store import DocumentStore
from ..store_header import HEADER, OFFSETS, TOKENS, listed_files
from ..store_mask import LOSS_MASK, mask_entry
from .client import ObjectClient
from .location import Location
from .open import OBJECTS, open_remote_store


def upload_store(local: str | os.PathLike[str], url: str, *, options: Mapping[str, Any] | None = None) -> DocumentStore:
    """Upload the local store directory *local* to *url*, header last; return the remote store, opened."""
    from ..store_reader import open_store

    where = _writable(url, options)
    folder = Path(local)
    opened = open_store(folder, verify=False)  # a store, whole, before anything goes up
    with open(folder / HEADER, "rb") as handle:
        header = json.loads(handle.read())
    client = ObjectClient(where)
    objects: dict[str, dict[str, Any]] = {}
    mask = [] if mask_entry(header, folder / HEADER, len(opened.tokens)) is None else [LOSS_MASK]
    for name in [TOKENS, OFFSETS, *listed_files(header, folder / HEADER), *mask]:
        path = folder / name
        etag = client.put(name, path)
        objects[name] = {"size": path.stat().st_size, "etag": etag}
    header[OBJECTS] = objects
    client.put(HEADER, json.dumps(header, indent=1).encode() + b"\n")
    del opened
    return open_remote_store(url, options=options)


def write_remote_corpus(url: str, shards: Sequence[str], *, options: Mapping[str, Any] | None = None) -> Any:
    """Write a corpus manifest at *url* listing remote *shards* (already uploaded), relative to it; return the corpus."""
    from ..manifest import open_corpus

    where = _writable(url, options)
    folder = where.parent()
    corpus = open_corpus(list(shards), options=options)
    entries = []
    for shard, store in zip(shards, corpus.shards, strict=True):
        target = Location.parse(shard)
        if (target.scheme, target.bucket) != (where.scheme, where.bucket):
            raise ConfigError(f"shard {shard!r} is not in {where.scheme}://{where.bucket}; a manifest lists shards beside it")
        entries.append({"path": _relative(target.prefix, folder.prefix), "fingerprint": store.fingerprint})
    manifest = {"format": CORPUS_FORMAT, "version": CORPUS_VERSION, "fingerprint": corpus.fingerprint, "shards": entries}
    name = where.prefix.rpartition("/")[2]
    ObjectClient(folder).put(name, json.dumps(manifest, indent=1).encode() + b"\n")
    return corpus


def check_writable(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Refuse, before any work, an address stores cannot be written to (``https://``) or with no credentials."""
    ObjectClient(_writable(url, options))


def _writable(url: str, options: Mapping[str, Any] | None) -> Location:
    where = Location.parse(url, options)
    if not where.writable:
        raise StoreError(f"{where.url}: {where.scheme}:// is read-only; write stores to s3:// or gs://")
    return where


def _relative(path: str, folder: str) -> str:
    """*path* relative to *folder* (both keys in one bucket)."""
    return os.path.relpath("/" + path, "/" + folder) if folder else path
