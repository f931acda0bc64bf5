"""Build a token store from JSONL token documents and plain UTF-8 text files or folders.

``.jsonl`` files are read as token documents (``{"id", "partition", "tokens"}``
per line); every other file is text, tokenized by a callable ``str -> ids``
(the byte-level tokenizer by default), one document per file or, with
``per_line``, one per non-blank line.  Folders are walked in sorted order,
skipping hidden entries.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .documents import DocumentStore, Partition, check_tokens, iter_jsonl
from .errors import DataError
from .store import StoreWriter
from .tokenize import byte_tokenize

Tokenizer = Callable[[str], Any]


def input_files(inputs: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, str]]:
    """``(file, document id prefix)`` for every input file, folders expanded in sorted order."""
    files: list[tuple[Path, str]] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith("."):
                        file = Path(root) / name
                        files.append((file, file.relative_to(path).as_posix()))
        elif path.is_file():
            files.append((path, str(raw)))
        else:
            raise DataError(f"input {str(raw)!r} does not exist; pass text files, folders or .jsonl files")
    return files


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
    tokenize = tokenizer or byte_tokenize
    default_partition = Partition.parse(partition)
    files = input_files(inputs)
    total = sum(f.stat().st_size for f, _ in files)
    bar = _progress(total, quiet)
    try:
        with StoreWriter(output) as writer:
            for file, name in files:
                if file.suffix == ".jsonl":
                    for number, doc in iter_jsonl(file):
                        writer.add(doc.id, doc.partition, doc.tokens, where=f"{file}:{number}")
                else:
                    for doc_id, text, where in _text_documents(file, name, per_line):
                        tokens = check_tokens(_call(tokenize, text, where), f"{where}: tokenizer output")
                        writer.add(doc_id, default_partition, tokens, where=where)
                bar.update(file.stat().st_size)
            return writer.commit()
    finally:
        bar.close()


def _call(tokenize: Tokenizer, text: str, where: str) -> Any:
    try:
        return tokenize(text)
    except Exception as err:  # a user's tokenizer: report where it failed
        raise DataError(f"{where}: the tokenizer raised {type(err).__name__}: {err}") from err


def _text_documents(file: Path, name: str, per_line: bool) -> Iterator[tuple[str, str, str]]:
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{file}: not UTF-8 text ({err.reason} at byte {err.start}); convert it or leave it out") from err
    if not per_line:
        yield name, text, str(file)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{name}:{number}", line, f"{file}:{number}"


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
