"""Write a store (or a corpus manifest) to object storage so that no reader ever sees a partial one.

Replacing is atomic.  Each upload writes a new *version*, under a fresh prefix
``ADDRESS/v/<fingerprint>-<time>/``: the data parts first (``tokens.bin``,
``offsets.bin``, ``ids.jsonl``, ``partitions.bin``, ``loss_mask.bin``), then
its header, with each part's size and ETag recorded under ``objects``.  Then
one small pointer object, ``ADDRESS/current.json``, is switched to it: a single
PUT, which object stores make visible whole.  A reader resolves the pointer
first (`streambatch.io.remote.open`), so it sees the old store or the complete
new one, never neither, whenever the upload stops.  A store written before
versions (its objects at ``ADDRESS/`` itself) is read as it is until it is
replaced.

The old version is retired, not removed, at the switch (the pointer lists it
with the time); an upload removes the versions retired more than *grace*
seconds ago (`GRACE`, a day, by default: readers that opened the old store keep
reading it meanwhile), and the leftovers of an upload killed before its switch
once they are that old.  A corpus's shards go up before its manifest (one PUT);
the manifest records each shard's fingerprint.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, StoreError
from ...model.corpus import FORMAT as CORPUS_FORMAT
from ...model.corpus import VERSION as CORPUS_VERSION
from ...model.store import DocumentStore
from ..store_header import HEADER, OFFSETS, TOKENS, listed_files
from ..store_mask import LOSS_MASK, mask_entry
from .blocks import ALGORITHM, BLOCK, DIGESTS, block_digests, hex_digest
from .client import ObjectClient
from .location import Location
from .open import DIGEST_KEY, OBJECTS, POINTER, POINTER_FORMAT, STORE_FILES, VERSIONS, open_remote_store, read_pointer

GRACE = 24 * 3600.0  # seconds a retired version is kept for the readers that opened it


def upload_store(
    local: str | os.PathLike[str], url: str, *, options: Mapping[str, Any] | None = None, grace: float = GRACE
) -> DocumentStore:
    """Upload the local store directory *local* to *url* as a new version, switch the pointer to it last, and
    remove versions retired more than *grace* seconds ago; return the remote store, opened."""
    from ..store_reader import open_store

    where = _writable(url, options)
    folder = Path(local)
    opened = open_store(folder, verify=False)  # a store, whole, before anything goes up
    with open(folder / HEADER, "rb") as handle:
        header = json.loads(handle.read())
    client = ObjectClient(where)
    pointer = read_pointer(client)  # before anything goes up: a damaged pointer is refused now
    version = f"{VERSIONS}/{(opened.fingerprint or 'store').rpartition(':')[2][:16]}-{time.time_ns():x}"
    target = ObjectClient(where.child(version))
    objects, written = version_objects(folder, header, len(opened.tokens))
    etags = {name: target.put(name, body) for name, body in objects}  # data first, the header last
    del opened
    written = _with_etags(written, etags)
    target.put(HEADER, written)
    now = time.time()
    retired = [r for r in (pointer or {}).get("retired", []) if isinstance(r, dict)]
    legacy = pointer is None and client.exists(HEADER)  # a store from before versions
    previous = pointer.get("current") if pointer is not None else ("" if legacy else None)
    if isinstance(previous, str):
        retired.append({"path": previous, "at": now})
    switched = json.loads(pointer_to(version, written, retired))
    client.put(POINTER, pointer_to(version, written, retired))  # the switch: one PUT
    _remove_old(client, switched, now, grace)
    return open_remote_store(url, options=options)


def version_objects(folder: Path, header: dict[str, Any], tokens: int) -> tuple[list[tuple[str, Any]], bytes]:
    """What one version of the local store *folder* uploads, in order: ``(name, path or bytes)`` of its data
    objects and block digests, then its header's bytes (each object's size and whole digest recorded, the block
    digests' entry; ETags are added as the PUTs answer)."""
    records: dict[str, dict[str, Any]] = {}
    mask = [] if mask_entry(header, folder / HEADER, tokens) is None else [LOSS_MASK]
    objects: list[tuple[str, Any]] = []
    for name in [TOKENS, OFFSETS, *listed_files(header, folder / HEADER), *mask]:
        path = folder / name
        objects.append((name, path))
        records[name] = {"size": path.stat().st_size}
        if name != TOKENS:  # read whole at open: one digest for the whole object
            records[name][DIGEST_KEY] = hex_digest(path.read_bytes())
    digests = block_digests(folder / TOKENS)  # tokens: one digest per block, in an object of their own
    objects.append((DIGESTS, digests))
    header = {**header, OBJECTS: records}
    header["blocks"] = {"algorithm": ALGORITHM, "size": BLOCK, "object": DIGESTS, "digest": hex_digest(digests)}
    return objects, json.dumps(header, indent=1).encode() + b"\n"


def _with_etags(header: bytes, etags: Mapping[str, str | None]) -> bytes:
    """*header* with the ETag each PUT answered recorded beside its object's size."""
    decoded = json.loads(header)
    for name, etag in etags.items():
        if name in decoded[OBJECTS]:
            decoded[OBJECTS][name]["etag"] = etag
    return json.dumps(decoded, indent=1).encode() + b"\n"


def pointer_to(version: str, header: bytes, retired: list[dict[str, Any]] | None = None) -> bytes:
    """The bytes of a store pointer naming *version*, whose header is *header*."""
    return (
        json.dumps(
            {"format": POINTER_FORMAT, "version": 1, "current": version, "header": hex_digest(header), "retired": retired or []},
            indent=1,
        ).encode()
        + b"\n"
    )


def _remove_old(client: ObjectClient, pointer: dict[str, Any], now: float, grace: float) -> None:
    """Remove the versions retired more than *grace* seconds ago, and the leftovers of killed uploads (versions the
    pointer never named) once every object of theirs is that old; the pointer keeps listing the rest."""
    current = pointer["current"]
    kept, gone = [], []
    for record in pointer["retired"]:
        path, at = record.get("path"), record.get("at")
        if not isinstance(path, str) or path == current:
            continue
        if isinstance(at, (int, float)) and now - at >= grace:
            gone.append(path)
        else:
            kept.append(record)
    named = {current, *(r["path"] for r in kept)}
    versions: dict[str, float] = {}
    for name, modified in client.listing(VERSIONS):
        folder = "/".join(name.split("/")[:2])
        versions[folder] = max(versions.get(folder, 0.0), modified)
    gone += [v for v, modified in versions.items() if v not in named and now - modified >= grace]
    names = []
    for path in dict.fromkeys(gone):
        if path == "":  # a store from before versions: its own files at the address, nothing else
            names += [n for n, _ in client.listing("") if n in STORE_FILES]
        else:
            names += [n for n, _ in client.listing(path)]
    client.delete(names)
    if len(kept) != len(pointer["retired"]):
        pointer = {**pointer, "retired": kept}
        client.put(POINTER, json.dumps(pointer, indent=1).encode() + b"\n")


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
