"""Build a token store from JSONL token documents and plain UTF-8 text files or folders.

``.jsonl`` files are read as token documents (`streambatch.iter_jsonl`); every
other file is text (`streambatch.iter_text`), tokenized by a callable
``str -> ids`` (the byte-level tokenizer by default), one document per file or,
with ``per_line``, one per non-blank line.  Folders are walked in sorted order,
skipping hidden entries.  Documents stream into a `StoreWriter`; nothing holds
the corpus in memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from .documents import DocumentStore, Partition
from .errors import ConfigError
from .readers import Tokenizer, input_files, iter_jsonl, text_units, tokenize_checked
from .store import StoreWriter
from .tokenize import byte_tokenize
from .validate import short


def prepare_store(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    tokenizer: Tokenizer | None = None,
    per_line: bool = False,
    partition: Partition | str = Partition.TRAIN,
    quiet: bool = False,
) -> DocumentStore:
    """Tokenize *inputs* into a new store at *output* (written atomically); returns it opened.

    A progress bar (tqdm, when installed) runs on stderr unless *quiet* or stderr is
    not a terminal.
    """
    if not isinstance(output, (str, os.PathLike)):
        raise ConfigError(
            f"output={short(output)} is not a path; the order is prepare_store(inputs, output) "
            "(write_store takes (path, documents))"
        )
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    tokenize = tokenizer or byte_tokenize
    default_partition = Partition.parse(partition)
    files = input_files(inputs)
    total = sum(f.stat().st_size for f, _ in files)
    bar = _progress(total, quiet)
    try:
        with StoreWriter(output) as writer:
            for file, name in files:
                if file.suffix == ".jsonl":
                    for doc in iter_jsonl(file):
                        writer.add(doc.id, doc.partition, doc.tokens, where=doc.where)
                else:
                    for doc_id, text, where in text_units(file, name, per_line):
                        writer.add(doc_id, default_partition, tokenize_checked(tokenize, text, where), where=where)
                bar.update(file.stat().st_size)
            return writer.commit()
    finally:
        bar.close()


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, quiet: bool) -> Any:
    if quiet or not sys.stderr.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the progress extra is optional
        return _NoBar()
    return tqdm(total=total, unit="B", unit_scale=True, desc="prepare", file=sys.stderr)
