"""Arrow IPC files (``.arrow``/``.feather``; the ``arrow`` extra): a document per row, like Parquet."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...io.files import open_regular
from ...model.documents import Document, Partition
from .. import inputs as _inputs
from ..blocks import Block, ReadOptions, documents, read_options
from ..text.tokenizers import TokenizerSpec, require
from .tables import table_block, table_error, validated


def arrow_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """The rows of an Arrow IPC file (file or stream format; ``.arrow``, ``.feather``), each record batch validated fully."""
    pa = require("pyarrow", "arrow", "reading Arrow files")
    try:
        first_row = 0
        for batch in _batches(pa, path):
            batch = validated(batch, path, "Arrow IPC")
            yield table_block(pa.Table.from_batches([batch]), path, name, first_row, opts)
            first_row += batch.num_rows
    except Exception as err:
        if _inputs.is_format_error(err):
            raise table_error(path, "Arrow IPC", err) from err
        raise


def _batches(pa: Any, path: str) -> Iterator[Any]:
    with open_regular(path) as handle:  # never waits on a FIFO; a device is refused
        size = os.fstat(handle.fileno()).st_size
        data: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    source = pa.BufferReader(pa.py_buffer(data))
    try:
        reader = pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        yield from pa.ipc.open_stream(source)
        return
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


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
