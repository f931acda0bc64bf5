"""Parquet files (the ``arrow`` extra): a document per row, from a token-list or text column."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...model.documents import Document, Partition
from .. import inputs as _inputs
from ..blocks import Block, ReadOptions, documents, read_options
from ..text.tokenizers import TokenizerSpec, require
from .tables import TABLE_ROWS, table_block, table_error


def parquet_row_groups(path: str) -> list[int]:
    """The number of rows of each row group of a Parquet file."""
    meta = _metadata(path)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def parquet_row_group_starts(path: str) -> list[int]:
    """The first byte of each row group of a Parquet file (its first column chunk's first page): where a part cuts."""
    meta = _metadata(path)
    starts = []
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        pages = [
            page
            for k in range(group.num_columns)
            for page in (group.column(k).dictionary_page_offset, group.column(k).data_page_offset)
            if page is not None and page > 0  # a writer may record 0 for no dictionary page
        ]
        starts.append(min(pages, default=4))
    return starts


def _metadata(path: str) -> Any:
    pq = require("pyarrow.parquet", "arrow", "reading Parquet files")
    try:
        return pq.ParquetFile(path).metadata
    except Exception as err:
        if _inputs.is_format_error(err):
            raise table_error(path, "Parquet", err) from err
        raise


def parquet_blocks(path: str, name: str, group: int, first_row: int, opts: ReadOptions) -> Iterator[Block]:
    """The rows of one row group of a Parquet file, `TABLE_ROWS` at a time."""
    pa = require("pyarrow", "arrow", "reading Parquet files")
    pq = require("pyarrow.parquet", "arrow", "reading Parquet files")
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=TABLE_ROWS, row_groups=[group])
        for batch in batches:
            yield table_block(pa.Table.from_batches([batch]), path, name, first_row, opts)
            first_row += batch.num_rows
    except Exception as err:
        if _inputs.is_format_error(err):
            raise table_error(path, "Parquet", err) from err
        raise


def iter_parquet(
    path: str | os.PathLike[str],
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """One document per row of a Parquet file (the ``arrow`` extra), lazily.

    *column* holds token ids (a list of integers) or text (a string, tokenized by
    *tokenizer*); by default the first of ``tokens``, ``input_ids``, ``text``.  An
    ``id`` column gives ids (else ``file:row``), a ``partition`` column partitions
    (else *partition*).
    """
    name = os.fspath(path)
    opts = read_options(tokenizer=tokenizer, partition=partition, column=column)
    _inputs.check_input(name)  # a FIFO or device is refused, never opened
    return _iter_parquet(name, opts)


def _iter_parquet(name: str, opts: ReadOptions) -> Iterator[Document]:
    first = 0
    for group, rows in enumerate(parquet_row_groups(name)):
        yield from documents(parquet_blocks(name, Path(name).name, group, first, opts))
        first += rows
