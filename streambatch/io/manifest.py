"""Corpus manifests: ``corpus.json`` files listing a sharded corpus's stores, read and written.

A manifest lists shard store directories relative to itself::

    {"format": "streambatch.corpus", "version": 1, "fingerprint": "blake2b-256:...",
     "shards": [{"path": "shard-0", "fingerprint": "blake2b-256:..."}, ...]}

(an entry may also be a plain path string); `write_corpus` writes one,
`open_corpus` reads one (or takes a list of stores or their paths).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .._checks import short_repr
from ..errors import ConfigError, StoreError
from ..model.corpus import FORMAT, VERSION, Corpus
from ..model.source import is_source
from ..model.store import DocumentStore
from .atomic import atomic_text
from .bounded_json import read_json_header
from .files import short_path
from .remote.location import is_remote
from .store import open_store

PathLike = str | os.PathLike[str]


def open_corpus(source: PathLike | Sequence[PathLike | DocumentStore], *, verify: bool = True, **remote: Any) -> Corpus:
    """Open a corpus: a manifest file (``corpus.json``), a folder holding one, or a list of stores and/or store paths.

    Stores named by path are opened with `open_store` (*verify* checks their
    fingerprints: one read of every byte).  A manifest that records fingerprints
    must match the shards it names.

    >>> a = DocumentStore.from_arrays([1, 2, 3], [0, 3], ids=["a"])
    >>> b = DocumentStore.from_arrays([4, 5], [0, 2], ids=["b"])
    >>> open_corpus([a, b]).ids
    ('a', 'b')
    """
    if is_remote(source):  # a manifest in object storage: its shards are beside it there
        return _open_manifest(source, verify, remote)  # type: ignore[arg-type]
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        return _open_manifest(path / CORPUS_MANIFEST if is_corpus_folder(path) else path, verify, remote)
    items: Any = source
    if is_source(items):
        raise ConfigError(
            f"source={type(items).__name__}(...) is one store; pass a list of stores, or the store itself to the stages"
        )
    shards: list[DocumentStore] = []
    paths: list[str | None] = []
    if not isinstance(items, Iterable):
        raise ConfigError(f"source={items!r} is not a manifest path or a list of stores; pass one of those")
    listed = list(items)
    for k, item in enumerate(listed):  # every entry checked before any path is opened
        if not isinstance(item, (str, os.PathLike)) and not is_source(item):
            raise ConfigError(f"shard {k}={item!r} is not a DocumentStore or a store path; pass stores or their paths")
    for item in listed:
        opened = isinstance(item, (str, os.PathLike))
        shards.append(open_store(item, verify=verify, **remote) if opened else item)
        paths.append(os.fspath(item) if opened else None)
    return Corpus(shards, paths=paths)  # a corpus among the entries is refused there, by name


CORPUS_MANIFEST = "corpus.json"  # a corpus folder's manifest (`streambatch.parts.corpus`)


def is_corpus_folder(path: PathLike) -> bool:
    """Whether *path* is a folder holding a ``corpus.json`` and no store header: a corpus folder, read through it."""
    return os.path.isfile(os.path.join(path, CORPUS_MANIFEST)) and not os.path.exists(os.path.join(path, "header.json"))


def shard_limit() -> int:
    """Shards one corpus may have: half of the system's memory-map limit (Linux ``vm.max_map_count``; 65530 if unknown).

    Each shard maps its tokens once; the other half is left to Python, numpy and the plan files.
    """
    try:
        with open("/proc/sys/vm/max_map_count") as handle:
            count = int(handle.read().strip())
    except (OSError, ValueError):
        count = 65530
    return max(count // 2, 1)


def _open_manifest(path: Path | str, verify: bool, remote: dict[str, Any]) -> Corpus:
    if isinstance(path, str):  # an address: the manifest fetched once, its shards opened beside it
        from .remote.open import open_remote_manifest

        manifest, shard_at = open_remote_manifest(path, remote)
    else:
        manifest, shard_at = _local_manifest(path), lambda relative: path.parent / relative
    return _manifest_corpus(manifest, path, shard_at, verify, remote)


def _local_manifest(path: Path) -> Any:
    if path.is_dir():
        raise StoreError(f"{short_path(path)}: is a directory (a store?), not a corpus manifest; pass the corpus.json file")
    return read_json_header(
        path,
        short_path(path),
        "corpus manifest",
        "write it again with sb.write_corpus",
        error=StoreError,
        missing="no such corpus manifest; write one with sb.write_corpus",
    )


def _manifest_corpus(manifest: Any, path: Any, shard_at: Any, verify: bool, remote: dict[str, Any]) -> Corpus:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise StoreError(f"{short_path(path)}: format is not {FORMAT!r}; this is not a streambatch corpus manifest")
    if type(manifest.get("version")) is not int or manifest.get("version") != VERSION:  # not true, not 1.0
        raise StoreError(
            f"{short_path(path)}: version={manifest.get('version')!r} is not supported (this streambatch reads {VERSION})"
        )
    entries = manifest.get("shards")
    if not isinstance(entries, list) or not entries:
        raise StoreError(f"{short_path(path)}: shards must be a non-empty list of store paths (relative to the manifest)")
    limit = shard_limit()
    if len(entries) > limit:  # refused before any is opened: past the limit, mapping the next shard fails
        raise StoreError(
            f"{short_path(path)}: {len(entries)} shards, more than the {limit} one process can map at once (one memory map "
            f"per shard's tokens, at most half of vm.max_map_count={limit * 2}); merge shards into fewer, larger stores "
            "(streambatch prepare) or raise vm.max_map_count"
        )
    shards: list[DocumentStore] = []
    names: list[str | None] = []
    for k, entry in enumerate(entries):
        relative = entry.get("path") if isinstance(entry, dict) else entry
        if not isinstance(relative, str) or not relative or "\0" in relative or os.path.isabs(relative):
            raise StoreError(
                f"{short_path(path)}: shard {k}={short_repr(entry)} is not a store path relative to the manifest; "
                "list relative paths (write it again with sb.write_corpus)"
            )
        shard = open_store(shard_at(relative), verify=verify, **remote)
        recorded = entry.get("fingerprint") if isinstance(entry, dict) else None
        if recorded is not None and recorded != shard.fingerprint:
            raise StoreError(
                f"{short_path(path)}: shard {k} ({relative}) has fingerprint {shard.fingerprint!r} but the manifest records "
                f"{recorded!r}; the shard changed since the manifest was written: write the manifest again"
            )
        shards.append(shard)
        names.append(str(shard_at(relative)))
    corpus = Corpus(shards, paths=names)
    recorded = manifest.get("fingerprint")
    if recorded is not None and recorded != corpus.fingerprint:
        raise StoreError(f"{short_path(path)}: fingerprint {recorded!r} does not match its shards ({corpus.fingerprint!r})")
    return corpus


def write_corpus(path: PathLike, shards: Sequence[PathLike], *, verify: bool = False) -> Corpus:
    """Write a corpus manifest listing *shards* (store directories) relative to it, atomically; return the corpus.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> from streambatch.io.store import write_store
    >>> from streambatch.model.documents import Document
    >>> _ = write_store(root / "a", [Document("a", "train", [1, 2, 3])])
    >>> _ = write_store(root / "b", [Document("b", "train", [4, 5])])
    >>> write_corpus(root / "corpus.json", [root / "a", root / "b"]).ids
    ('a', 'b')
    """
    target = Path(path)
    folder = target.parent.resolve()
    corpus = open_corpus([Path(s) for s in shards], verify=verify)
    entries = [
        {"path": os.path.relpath(Path(s).resolve(), folder), "fingerprint": shard.fingerprint}
        for s, shard in zip(shards, corpus.shards, strict=True)
    ]
    manifest = {"format": FORMAT, "version": VERSION, "fingerprint": corpus.fingerprint, "shards": entries}
    if corpus.tokenizer is not None:  # for a reader of the file; the shards' headers stay the truth (one tokenizer)
        manifest["tokenizer"] = corpus.tokenizer
    with atomic_text(target) as handle:
        json.dump(manifest, handle, indent=1)
        handle.write("\n")
    return corpus
