"""Stage 1, read: lazy readers that yield `Document`s from files and rows.

Every reader is a generator over documents, so any Python between a reader and
`DocumentStore.from_documents` (a filter, a limit) is a stage too:

>>> import streambatch as sb
>>> rows = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5]}]
>>> docs = (d for d in sb.iter_records(rows) if len(d) > 1)
>>> sb.DocumentStore.from_documents(docs).ids
('0',)

Errors name the file and line (or the row), and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ._json import decode_record
from .documents import Document, DocumentStore, Partition
from .errors import ConfigError, DataError
from .tokenize import byte_tokenize
from .validate import check_tokens, short

Tokenizer = Callable[[str], Any]
TOKEN_KEYS = ("tokens", "input_ids")  # streambatch's own key, then Hugging Face's


def record_document(record: Any, where: str, default_id: str, default_partition: Partition = Partition.TRAIN) -> Document:
    """One row (a mapping) as a `Document`; errors name *where*.

    Tokens come from ``tokens`` or ``input_ids``; ``id`` defaults to *default_id*
    and ``partition`` to *default_partition*.

    >>> record_document({"input_ids": [3, 4]}, "row 0", "0").id
    '0'
    """
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: got {type(record).__name__}; each record must be an object with tokens (or input_ids)")
    key = next((k for k in TOKEN_KEYS if k in record), None)
    if key is None:
        raise DataError(f"{where}: missing key(s) tokens; each record needs tokens (or input_ids), and may give id and partition")
    return Document(record.get("id", default_id), record.get("partition", default_partition), record[key], where=where)


def _keep(partition: Partition | str | None) -> Partition | None:
    return None if partition is None else Partition.parse(partition)


def iter_records(
    records: Iterable[Mapping[str, Any]],
    *,
    partition: Partition | str | None = None,
    default_partition: Partition | str = Partition.TRAIN,
    source: str = "record",
) -> Iterator[Document]:
    """Yield a `Document` per row of *records* (dicts, e.g. a Hugging Face dataset's rows).

    Rows carry ``tokens`` or ``input_ids``; ``id`` defaults to the row number and
    ``partition`` to *default_partition*.  With *partition*, rows of other
    partitions are skipped (after validation).

    >>> rows = [{"id": "a", "partition": "train", "tokens": [1, 2, 3]},
    ...         {"id": "b", "partition": "test", "tokens": [4, 5]}]
    >>> [d.id for d in iter_records(rows, partition="test")]
    ['b']
    """
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ConfigError(f"records={short(records)} is not an iterable of rows; pass a list of dicts or a dataset")
    keep, fallback = _keep(partition), Partition.parse(default_partition)
    return _iter_records(records, keep, fallback, source)


def _iter_records(records: Iterable[Any], keep: Partition | None, fallback: Partition, source: str) -> Iterator[Document]:
    for index, record in enumerate(records):
        doc = record_document(record, f"{source} {index}", str(index), fallback)
        if keep is None or doc.partition is keep:
            yield doc


def iter_jsonl(path: str | os.PathLike[str], *, partition: Partition | str | None = None) -> Iterator[Document]:
    """Yield a `Document` per non-blank line of a JSONL file, lazily; errors name file:line.

    Each line is an object with ``tokens`` (or ``input_ids``) and optionally ``id``
    (default: the line number) and ``partition`` (default ``"train"``).  With
    *partition*, documents of other partitions are skipped.
    """
    name = os.fspath(path)
    try:
        handle = open(name, encoding="utf-8-sig")  # noqa: SIM115 - closed by the generator
    except OSError as err:
        raise DataError(f"cannot open {name!r}: {err.strerror}; pass a readable JSONL file") from err
    return _iter_jsonl(handle, name, _keep(partition))


def _iter_jsonl(handle: Any, name: str, keep: Partition | None) -> Iterator[Document]:
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{name}:{number}"
                doc = record_document(decode_record(line, where), where, str(number))  # bounded JSON
                if keep is None or doc.partition is keep:
                    yield doc
        except UnicodeDecodeError as err:
            raise DataError(f"{name}: not UTF-8 text ({err.reason} at byte {err.start}); JSONL files must be UTF-8") from err


def read_jsonl(path: str | os.PathLike[str], *, partition: Partition | str | None = None) -> DocumentStore:
    """Read a whole JSONL file into an in-memory store: ``from_documents(iter_jsonl(...))``."""
    return DocumentStore.from_documents(iter_jsonl(path, partition=partition))


def read_records(records: Iterable[Mapping[str, Any]], **options: Any) -> DocumentStore:
    """Read rows into an in-memory store: ``from_documents(iter_records(...))``.

    >>> read_records([{"tokens": [1, 2]}, {"tokens": [3]}]).ids
    ('0', '1')
    """
    return DocumentStore.from_documents(iter_records(records, **options))


def input_files(inputs: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, str]]:
    """``(file, document id)`` for every input file, folders walked in sorted order.

    Hidden files and folders are skipped; a file inside a folder is named by its
    path relative to that folder.
    """
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


def iter_text(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: Tokenizer | None = None,
    per_line: bool = False,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """Tokenize UTF-8 text files (or folders of them) into documents, lazily.

    One document per file (id: the path relative to its folder), or with
    *per_line* one per non-blank line (id ``path:line``).  *tokenizer* is any
    ``str -> Sequence[int]``; the byte-level tokenizer by default.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = input_files(items)
    return _iter_text(files, tokenizer or byte_tokenize, per_line, Partition.parse(partition))


def _iter_text(files: list[tuple[Path, str]], tokenize: Tokenizer, per_line: bool, partition: Partition) -> Iterator[Document]:
    for file, name in files:
        for doc_id, text, where in text_units(file, name, per_line):
            yield Document(doc_id, partition, tokenize_checked(tokenize, text, where), where=where)


def text_units(file: Path, name: str, per_line: bool) -> Iterator[tuple[str, str, str]]:
    """``(document id, text, where)`` for one text file: the whole file or each non-blank line."""
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{file}: not UTF-8 text ({err.reason} at byte {err.start}); convert it or leave it out") from err
    except OSError as err:
        raise DataError(f"{file}: cannot read ({err.strerror}); check the file or leave it out") from err
    if not per_line:
        yield name, text, str(file)
        return
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield f"{name}:{number}", line, f"{file}:{number}"


def tokenize_checked(tokenize: Tokenizer, text: str, where: str) -> Any:
    """``tokenize(text)`` validated as token ids; a failing tokenizer is reported at *where*."""
    try:
        ids = tokenize(text)
    except Exception as err:  # a user's tokenizer: report where it failed
        raise DataError(f"{where}: the tokenizer raised {type(err).__name__}: {err}") from err
    return check_tokens(ids, f"{where}: tokenizer output")
