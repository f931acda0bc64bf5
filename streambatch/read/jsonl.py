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
from ..model.mask import all_trained, untrained_reason
from ..model.store import DocumentStore
from ..model.validate import check_id, check_tokens, short
from . import inputs as _inputs
from .blocks import Block, ReadOptions, batches, byte_limit, flat_block, partition_codes, text_block
from .text.masks import MASK_KEYS, Segments, prompt_segments, row_mask, segment_tokens

TOKEN_KEYS = ("tokens", "input_ids")  # streambatch's own key, then Hugging Face's
TEXT_COLUMNS = ("text",)  # a row without tokens holds text to tokenize here (or in the column named)


def record_document(
    record: Any, where: str, default_id: str, default_partition: Partition = Partition.TRAIN, labels_shifted: bool = False
) -> Document:
    """One row (a mapping) as a `Document`; errors name *where*.

    Tokens come from ``tokens`` or ``input_ids``; ``id`` defaults to *default_id*
    and ``partition`` to *default_partition*; a mask from ``labels`` (aligned with
    the tokens, or shifted by one with *labels_shifted*), ``loss_mask`` or
    ``assistant_masks`` (`streambatch.read.text.labels`).

    >>> record_document({"input_ids": [3, 4]}, "row 0", "0").id
    '0'
    """
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: got {type(record).__name__}; each record must be an object with tokens (or input_ids)")
    key = next((k for k in TOKEN_KEYS if k in record), None)
    if key is None:
        raise DataError(f"{where}: missing key(s) tokens; each record needs tokens (or input_ids), and may give id and partition")
    tokens, mask = record[key], None
    if any(k in record for k in MASK_KEYS):
        tokens = check_tokens(tokens, where)
        mask = row_mask(record, tokens, where, labels_shifted)
    return Document(record.get("id", default_id), record.get("partition", default_partition), tokens, mask, where=where)


def trained_or_refused(doc: Document, skip: bool) -> bool:
    """Whether to keep *doc*: False for a masked document that trains nothing when *skip*; without *skip*, refused."""
    if doc.loss_mask is None or doc.loss_mask.any():
        return True
    if skip:
        return False
    raise DataError(untrained_reason(doc.loss_mask, doc.where or f"document id={doc.id!r}"))


def _keep(partition: Partition | str | None) -> Partition | None:
    return None if partition is None else Partition.parse(partition)


def iter_records(
    records: Iterable[Mapping[str, Any]],
    *,
    partition: Partition | str | None = None,
    default_partition: Partition | str = Partition.TRAIN,
    source: str = "record",
    skip_untrained_documents: bool = False,
    labels_shifted: bool = False,
) -> Iterator[Document]:
    """Yield a `Document` per row of *records* (dicts, e.g. a Hugging Face dataset's rows).

    Rows carry ``tokens`` or ``input_ids``; ``id`` defaults to the row number and
    ``partition`` to *default_partition*.  With *partition*, rows of other
    partitions are skipped (after validation).  A row may carry a loss mask
    (``labels``, -100 = not trained, or ``loss_mask``/``assistant_masks``); a row
    whose mask trains nothing is refused, or skipped with *skip_untrained_documents*.
    Labels are aligned with the tokens (HF's convention), or shifted by one with
    *labels_shifted* (`streambatch.read.text.labels`).

    >>> rows = [{"id": "a", "partition": "train", "tokens": [1, 2, 3]},
    ...         {"id": "b", "partition": "test", "tokens": [4, 5]}]
    >>> [d.id for d in iter_records(rows, partition="test")]
    ['b']
    """
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ConfigError(f"records={short(records)} is not an iterable of rows; pass a list of dicts or a dataset")
    keep, fallback = _keep(partition), Partition.parse(default_partition)
    return _iter_records(records, keep, fallback, source, skip_untrained_documents, labels_shifted)


def _iter_records(
    records: Iterable[Any], keep: Partition | None, fallback: Partition, source: str, skip: bool, shifted: bool
) -> Iterator[Document]:
    for index, record in enumerate(records):
        doc = record_document(record, f"{source} {index}", str(index), fallback, shifted)
        if (keep is None or doc.partition is keep) and trained_or_refused(doc, skip):
            yield doc


def iter_jsonl(
    path: str | os.PathLike[str],
    *,
    partition: Partition | str | None = None,
    max_line_bytes: int = _inputs.MAX_LINE_BYTES,
    skip_untrained_documents: bool = False,
    labels_shifted: bool = False,
) -> Iterator[Document]:
    """Yield a `Document` per non-blank line of a JSONL file (``.gz``/``.zst`` too), lazily; errors name file:line.

    Each line is an object with ``tokens`` (or ``input_ids``) and optionally ``id``
    (default: the line number) and ``partition`` (default ``"train"``).  With
    *partition*, documents of other partitions are skipped.  A loss mask rides as in
    `iter_records` (*skip_untrained_documents* and *labels_shifted* likewise).  Lines end at ``\\n``; a
    line of more than *max_line_bytes* is a `DataError` naming it (found without holding it).
    """
    name = os.fspath(path)
    limit = byte_limit(max_line_bytes, "max_line_bytes")
    try:
        check_regular(name)  # fail at the call, not at the first document; a FIFO is refused, never waited on
    except OSError as err:
        raise DataError(f"cannot open {name!r}: {err.strerror}; pass a readable JSONL file") from err
    return _iter_jsonl(name, _keep(partition), limit, skip_untrained_documents, labels_shifted)


def _iter_jsonl(name: str, keep: Partition | None, max_line: int, skip: bool, shifted: bool) -> Iterator[Document]:
    for chunk in _inputs.line_chunks(name, _inputs.LINE_CHUNK_BYTES, max_line):
        for where, number, row in jsonl_rows(chunk, name):
            doc = record_document(row, where, str(number), Partition.TRAIN, shifted)
            if (keep is None or doc.partition is keep) and trained_or_refused(doc, skip):
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
    """Rows ``(where, default id, row)``: token rows as they are (with their mask), text rows tokenized, in order.

    A text row is plain text (the ``text`` column, or the one named), a
    prompt/completion pair (``opts.prompt_field``/``completion_field``) or a chat
    (``messages``, with ``opts.chat_template``); the last two carry a loss mask.
    """
    column = opts.column or TEXT_COLUMNS[0]
    ids: list[str] = []
    wheres: list[str] = []
    codes = bytearray()
    arrays: list[npt.NDArray[Any]] = []
    masks: list[npt.NDArray[np.bool_] | None] = []
    texts: list[Segments] = []
    text_at: list[int] = []
    plain: list[bool] = []  # per text row: plain text (no mask of its own), or a chat / prompt-completion pair
    for where, default_id, row in rows:
        label = f"{where} (document id={row.get('id', default_id)!r})" if isinstance(row, Mapping) else where
        found = _text_pieces(row, where, label, column, opts) if isinstance(row, Mapping) else None
        if found is not None:
            pieces, has_mask = found
            plain.append(not has_mask)
            doc_id = check_id(row.get("id", default_id), label)
            codes.append(Partition.parse(row.get("partition", opts.partition), label).code)
            text_at.append(len(arrays))
            texts.append(pieces)
            arrays.append(np.zeros(0, np.uint32))  # replaced below
            masks.append(None)
        else:
            doc = record_document(row, where, default_id, opts.partition, opts.labels_shifted)
            doc_id = doc.id
            codes.append(doc.partition.code)
            arrays.append(doc.tokens)
            masks.append(doc.loss_mask)
        ids.append(doc_id)
        wheres.append(where)
    masked = any(m is not None for m in masks)
    tokenized = len(texts)
    if texts:
        text_ids, text_wheres = [ids[i] for i in text_at], [wheres[i] for i in text_at]
        if all(plain):  # plain text rows only: no mask
            made = text_block([p[0][0] for p in texts], text_ids, text_wheres, partition_codes(len(texts), opts.partition), opts)
            made_tokens, made_lengths, made_mask = made.tokens, made.lengths, None
        else:
            _check_sizes([t for p in texts for t, _ in p], text_ids, text_wheres, opts)
            texts = [[(p[0][0], True)] if alone else p for p, alone in zip(texts, plain, strict=True)]  # plain: all train
            made_tokens, made_lengths, made_mask = segment_tokens(
                opts.tokenizer, texts, lambda k: f"{text_wheres[k]} (document id={text_ids[k]!r})"
            )
            masked = True
        cuts = np.cumsum(made_lengths)[:-1]
        for i, piece in zip(text_at, np.split(made_tokens, cuts), strict=True):
            arrays[i] = piece
        if made_mask is not None:
            for i, piece in zip(text_at, np.split(made_mask, cuts), strict=True):
                masks[i] = piece
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.uint32)
    mask = None
    if masked:
        mask = np.concatenate([all_trained(a.size) if m is None else m for a, m in zip(arrays, masks, strict=True)])
    block = flat_block(tokens, lengths, ids, np.frombuffer(bytes(codes), np.uint8).copy(), wheres, opts, mask)
    return Block(block.tokens, block.lengths, ids, block.codes, wheres, tokenized=tokenized, loss_mask=block.loss_mask)


def _text_pieces(row: Mapping[str, Any], where: str, label: str, column: str, opts: ReadOptions) -> tuple[Segments, bool] | None:
    """A row without token ids as text segments, and whether they carry a mask (see `rows_block`); None for a token
    row.  A chat or a prompt/completion pair always carries one, even when nothing in it trains (then it is refused or
    left out, by name, as any untrained document is)."""
    if any(k in row for k in TOKEN_KEYS):
        return None
    if opts.chat_template is not None and "messages" in row:
        pieces = opts.chat_template.segments(
            row["messages"], label, limit=opts.max_document_bytes, seconds=opts.chat_render_seconds
        )
        return pieces, True
    if opts.prompt_field is not None and opts.completion_field is not None and opts.prompt_field in row:
        return prompt_segments(row, opts.prompt_field, opts.completion_field, where), True
    if column in row:
        text = row[column]
        if not isinstance(text, str):
            raise DataError(f"{where}: {column}={short(text)} is not a string; text rows hold text to tokenize")
        return [(text, False)], False
    if "messages" in row and opts.chat_template is None:
        raise DataError(
            f"{where}: a chat row (messages) but no chat template; pass --chat-template FILE (chat_template=), "
            "a Jinja template or a tokenizer_config.json holding one"
        )
    wanted = [f"{column!r} text to tokenize"]
    if opts.prompt_field is not None:
        wanted.append(f"{opts.prompt_field!r}/{opts.completion_field!r} text")
    if opts.chat_template is not None:
        wanted.append("'messages' for the chat template")
    raise DataError(f"{where}: missing key(s) tokens; each row needs tokens (or input_ids), or {' or '.join(wanted)}")


def _check_sizes(texts: Sequence[str], ids: list[str], wheres: list[str], opts: ReadOptions) -> None:
    """Each segment within `max_document_bytes` (a document's segments are checked one by one)."""
    limit = opts.max_document_bytes
    for text in texts:
        if len(text) > limit // 4 and len(text.encode("utf-8", "surrogatepass")) > limit:
            raise DataError(
                f"{wheres[0]}: a text of more than {limit:,} bytes (the limit for one document); "
                "raise it with --max-document-bytes (max_document_bytes=), or split it"
            )
