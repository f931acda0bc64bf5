"""UTF-8 text files (``.gz``/``.zst`` too): a document per file, or per non-blank line, tokenized."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from ...io.files import short_path
from ...model.documents import Document, Partition
from .. import inputs as _inputs
from ..blocks import Block, ReadOptions, batches, partition_codes, read_options, text_block
from ..select import InputFile, select_inputs
from .tokenizers import TokenizerSpec


def text_file_block(path: str, name: str, opts: ReadOptions) -> Block:
    """A whole text file as one document (id *name*)."""
    text = _inputs.decode(_inputs.read_bytes(path, opts.max_document_bytes), path)
    return text_block([text], [name], [short_path(path)], partition_codes(1, opts.partition), opts)


def text_lines_blocks(chunk: _inputs.LineChunk, path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """Each non-blank line of a chunk as a document (id ``name:line``), in blocks of at most `BLOCK_DOCUMENTS`."""
    text = _inputs.decode(chunk.data, path, chunk.offset)
    units = ((n, line) for n, line in _inputs.split_lines(text, chunk.first_line) if line.strip())
    shown = short_path(path)
    for group in batches(units):
        ids = [f"{name}:{n}" for n, _ in group]
        wheres = [f"{shown}:{n}" for n, _ in group]
        yield text_block([line for _, line in group], ids, wheres, partition_codes(len(group), opts.partition), opts)


def iter_text(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    tokenizer: TokenizerSpec = None,
    per_line: bool = False,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """Tokenize UTF-8 text files (``.gz``/``.zst`` too) or folders of them into documents, lazily.

    One document per file (id: the path relative to its folder), or with
    *per_line* one per non-blank line (id ``path:line``; lines end at ``\\n``).
    *tokenizer*: a `Tokenizer`, a tokenizer.json path, or any ``str -> ids``
    callable; the byte-level tokenizer by default.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    opts = read_options(tokenizer=tokenizer, partition=partition, per_line=per_line)
    files = select_inputs(items)
    return _iter_text(files, opts)


def _iter_text(files: list[InputFile], opts: ReadOptions) -> Iterator[Document]:
    for file in files:
        if not opts.per_line:
            yield from text_file_block(str(file.path), file.name, opts).documents()
            continue
        for chunk in _inputs.line_chunks(file.path, _inputs.LINE_CHUNK_BYTES, opts.max_line_bytes):
            for block in text_lines_blocks(chunk, str(file.path), file.name, opts):
                yield from block.documents()
