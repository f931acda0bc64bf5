"""Arrow IPC files (``.arrow``/``.feather``; the ``arrow`` extra): a document per row, like Parquet."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...model.documents import Document, Partition
from . import inputs as _inputs
from .blocks import Block, ReadOptions, documents, read_options
from .tables import table_block, table_error
from .tokenizers import TokenizerSpec, require


def arrow_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """The rows of an Arrow IPC file (file or stream format; ``.arrow``, ``.feather``)."""
    pa = require("pyarrow", "arrow", "reading Arrow files")
    try:
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            batches: Iterable[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            source.seek(0)
            batches = pa.ipc.open_stream(source)
        first_row = 0
        for batch in batches:
            yield table_block(pa.Table.from_batches([batch]), path, name, first_row, opts)
            first_row += batch.num_rows
    except Exception as err:
        if _inputs.is_format_error(err):
            raise table_error(path, "Arrow IPC", err) from err
        raise


def iter_arrow(
    path: str | os.PathLike[str],
    *,
    column: str | None = None,
    tokenizer: TokenizerSpec = None,
    partition: Partition | str = Partition.TRAIN,
) -> Iterator[Document]:
    """One document per row of an Arrow IPC file (``.arrow``/``.feather``), like `iter_parquet`."""
    name = os.fspath(path)
    return documents(arrow_blocks(name, Path(name).name, read_options(tokenizer=tokenizer, partition=partition, column=column)))
