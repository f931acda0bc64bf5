"""Open what a path names: a store directory, a corpus manifest or a JSONL file, as one `Source`.

One place decides how a path becomes documents, so every command (and script)
reads sources the same way.
"""

from __future__ import annotations

import os

from ...io.manifest import open_corpus
from ...io.store import open_store
from ...model.source import Source
from ...model.store import DocumentStore
from .inputs import MAX_LINE_BYTES
from .jsonl import read_jsonl


def open_source(path: str | os.PathLike[str], *, verify: bool = True, max_line_bytes: int = MAX_LINE_BYTES) -> Source:
    """Open a store directory (memory-mapped, checked), a corpus manifest (``*.json``) or a JSONL file.

    A JSONL line may hold at most *max_line_bytes* (`streambatch.stages.read.jsonl.iter_jsonl`).

    >>> import tempfile, pathlib
    >>> file = pathlib.Path(tempfile.mkdtemp()) / "docs.jsonl"
    >>> _ = file.write_text('{"id": "a", "tokens": [0, 10, 11, 12, 1]}\\n')
    >>> source = open_source(file)
    >>> source.kind, source.store.ids
    ('jsonl', ('a',))
    """
    name = os.fspath(path)
    if os.path.isdir(name):  # a store prepared by `streambatch prepare`
        return Source(name, "store", open_store(name, verify=verify), verified=verify)
    if name.lower().endswith(".json"):  # a manifest listing the stores of a sharded corpus
        return Source(name, "corpus", open_corpus(name, verify=verify), verified=verify)
    return Source(name, "jsonl", DocumentStore.from_documents(read_jsonl(name, max_line_bytes=max_line_bytes)))
