"""Open what a command is pointed at: a store directory or a JSONL file, as one `Source`.

One place decides how a path becomes documents, so the ``inspect``, ``audit``
and ``trace`` commands (and scripts) read sources the same way; a sharded
corpus is one more branch here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ...epoch import Epoch
from ...io.store import open_store
from ...model.corpus import Corpus, open_corpus
from ...model.documents import DocumentStore, Partition, as_store
from ..shuffle import shuffle
from ..windows import windows
from .jsonl import read_jsonl


@dataclass(frozen=True)
class Source:
    """Documents opened from *path*: the store (its header's tokenizer on ``store.tokenizer``) and what kind of source it was."""

    path: str
    kind: str  # "store" (memory-mapped directory), "corpus" (a manifest of stores) or "jsonl" (read into memory)
    store: DocumentStore | Corpus
    verified: bool = False  # the store's fingerprint was checked against its content


def open_source(path: str | os.PathLike[str], *, verify: bool = True) -> Source:
    """Open a store directory (memory-mapped, checked), a corpus manifest (``*.json``) or a JSONL file.

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
    return Source(name, "jsonl", DocumentStore.from_documents(read_jsonl(name)))


def source_store(source: Any) -> DocumentStore | Corpus:
    """The store (or corpus) of a `Source`, a store, or an iterable of documents."""
    return source.store if isinstance(source, Source) else as_store(source)


def source_epoch(
    source: Any,
    *,
    context_length: int,
    batch_size: int,
    stride: int = 1,
    seed: int | None = None,
    partition: Partition | str = Partition.TRAIN,
) -> Epoch:
    """The epoch of *partition* over a whole source, which may hold other partitions too.

    Composes the stages (`Epoch` alone rejects mixed stores): windows of one
    partition, shuffled with *seed* (or in document order), chunked by *batch_size*.

    >>> import streambatch as sb
    >>> store = sb.DocumentStore.from_arrays([0, 10, 11, 12, 1, 0, 20, 21, 1], [0, 5, 9], partition=["train", "test"])
    >>> source_epoch(store, context_length=2, batch_size=2).batch_widths
    [2, 1]
    """
    whole = windows(source_store(source), context_length=context_length, stride=stride, partition=partition)
    return Epoch.from_windows(whole if seed is None else shuffle(whole, seed), batch_size=batch_size)
