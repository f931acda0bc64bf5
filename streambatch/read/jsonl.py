"""Stage 1, read: lazy readers that yield `Document`s from rows (records) and JSONL files.

(The other formats have a module each: `streambatch.read.formats` lists them.)

Every reader is a generator over documents, so any Python between a reader and
`DocumentStore.from_documents` (a filter, a limit) is a stage too:

>>> rows = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5]}]
>>> docs = (d for d in iter_records(rows) if len(d) > 1)
>>> DocumentStore.from_documents(docs).ids
('0',)

Errors name the file and line (or the row), and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, DataError
from ..io.bounded_json import decode_json, decode_record
from ..io.files import check_regular, short_path
from ..model.documents import Document, Partition
from ..model.store import DocumentStore
from ..model.validate import check_id, short
from . import inputs as _inputs
from .blocks import Block, ReadOptions, batches, byte_limit, flat_block, partition_codes, text_block

TOKEN_KEYS = ("tokens", "input_ids")  # streambatch's own key, then Hugging Face's
TEXT_COLUMNS = ("text",)  # a row without tokens holds text to tokenize here (or in the column named)


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


def iter_jsonl(
    path: str | os.PathLike[str], *, partition: Partition | str | None = None, max_line_bytes: int = _inputs.MAX_LINE_BYTES
) -> Iterator[Document]:
    """Yield a `Document` per non-blank line of a JSONL file (``.gz``/``.zst`` too), lazily; errors name file:line.

    Each line is an object with ``tokens`` (or ``input_ids``) and optionally ``id``
    (default: the line number) and ``partition`` (default ``"train"``).  With
    *partition*, documents of other partitions are skipped.  Lines end at ``\\n``; a
    line of more than *max_line_bytes* is a `DataError` naming it (found without holding it).
    """
    name = os.fspath(path)
    limit = byte_limit(max_line_bytes, "max_line_bytes")
    try:
        check_regular(name)  # fail at the call, not at the first document; a FIFO is refused, never waited on
    except OSError as err:
        raise DataError(f"cannot open {name!r}: {err.strerror}; pass a readable JSONL file") from err
    return _iter_jsonl(name, _keep(partition), limit)


def _iter_jsonl(name: str, keep: Partition | None, max_line: int) -> Iterator[Document]:
    for chunk in _inputs.line_chunks(name, _inputs.LINE_CHUNK_BYTES, max_line):
        for where, number, row in jsonl_rows(chunk, name):
            doc = record_document(row, where, str(number))
            if keep is None or doc.partition is keep:
                yield doc


def jsonl_rows(chunk: _inputs.LineChunk, name: str) -> Iterator[tuple[str, int, Any]]:
    """``(where, line number, decoded row)`` for each non-blank line of a chunk of a JSONL file."""
    text = _inputs.decode(chunk.data, name, chunk.offset, what="JSONL")
    if chunk.offset == 0 and text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark
    shown = short_path(name)
    for number, line in _inputs.split_lines(text, chunk.first_line):
        if line.strip():
            where = f"{shown}:{number}"
            yield where, number, _decode(line, where)


def _decode(line: str, where: str) -> Any:
    """One JSONL line, decoded with bounds: huge integers or deep nesting are a `DataError` naming the JSON path.

    Token rows go through the typed decoder (fast; errors name ``$.tokens[i]``);
    a row without tokens (a text row for `prepare`) is decoded whole.
    """
    record = decode_record(line, where)
    return record if "tokens" in record else decode_json(line, where, "each line (one JSON object per line)")


def read_jsonl(
    path: str | os.PathLike[str], *, partition: Partition | str | None = None, max_line_bytes: int = _inputs.MAX_LINE_BYTES
) -> DocumentStore:
    """Read a whole JSONL file into an in-memory store: ``from_documents(iter_jsonl(...))``."""
    return DocumentStore.from_documents(iter_jsonl(path, partition=partition, max_line_bytes=max_line_bytes))


def read_records(records: Iterable[Mapping[str, Any]], **options: Any) -> DocumentStore:
    """Read rows into an in-memory store: ``from_documents(iter_records(...))``.

    >>> read_records([{"tokens": [1, 2]}, {"tokens": [3]}]).ids
    ('0', '1')
    """
    return DocumentStore.from_documents(iter_records(records, **options))


def jsonl_blocks(chunk: _inputs.LineChunk, path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """Each non-blank line of a JSONL chunk as a document (default id ``name:line``), in blocks of at most `BLOCK_DOCUMENTS`."""
    for group in batches(jsonl_rows(chunk, path)):
        yield rows_block([(w, f"{name}:{n}", row) for w, n, row in group], opts)


def rows_block(rows: Sequence[tuple[str, str, Any]], opts: ReadOptions) -> Block:
    """Rows ``(where, default id, row)``: tokens/input_ids rows as they are, text rows tokenized, in order."""
    column = opts.column or TEXT_COLUMNS[0]
    ids: list[str] = []
    wheres: list[str] = []
    codes = bytearray()
    arrays: list[npt.NDArray[Any]] = []
    texts: list[str] = []
    text_at: list[int] = []
    for where, default_id, row in rows:
        if isinstance(row, Mapping) and not any(k in row for k in TOKEN_KEYS) and column in row:
            text = row[column]
            if not isinstance(text, str):
                raise DataError(f"{where}: {column}={short(text)} is not a string; text rows hold text to tokenize")
            label = f"{where} (document id={row.get('id', default_id)!r})"
            doc_id = check_id(row.get("id", default_id), label)
            codes.append(Partition.parse(row.get("partition", opts.partition), label).code)
            text_at.append(len(arrays))
            texts.append(text)
            arrays.append(np.zeros(0, np.uint32))  # replaced below
        else:
            if isinstance(row, Mapping) and not any(k in row for k in TOKEN_KEYS):
                raise DataError(
                    f"{where}: missing key(s) tokens; each row needs tokens (or input_ids), or {column!r} text to tokenize"
                )
            doc = record_document(row, where, default_id, opts.partition)
            doc_id = doc.id
            codes.append(doc.partition.code)
            arrays.append(doc.tokens)
        ids.append(doc_id)
        wheres.append(where)
    if texts:
        made = text_block(
            texts, [ids[i] for i in text_at], [wheres[i] for i in text_at], partition_codes(len(texts), opts.partition), opts
        )
        for i, piece in zip(text_at, np.split(made.tokens, np.cumsum(made.lengths)[:-1]), strict=True):
            arrays[i] = piece
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
    block = flat_block(tokens, lengths, ids, np.frombuffer(bytes(codes), np.uint8).copy(), wheres, opts)
    return Block(block.tokens, block.lengths, ids, block.codes, wheres, tokenized=len(texts))
