"""nanoGPT-style ``.bin`` files: flat little-endian tokens, split after each separator id; and the indexed token files.

Megatron-LM's ``.bin`` beside its ``.idx``, and datatrove's ``.ds``, are split by
their indexes instead (`indexed_blocks`, through `streambatch.io.formats`): ids
``NAME:k``, *k* the document's number in the file, so ``prepare`` converts
between the formats and a store.

>>> import numpy as np, tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "train.bin"
>>> np.array([5, 6, 0, 7, 0, 8], dtype=np.uint16).tofile(path)
>>> [(d.id, d.tokens.tolist()) for d in iter_bin(path, separator=0)]
[('train.bin:0', [5, 6, 0]), ('train.bin:1', [7, 0]), ('train.bin:2', [8])]
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, DataError
from ..io.files import short_path
from ..io.formats import open_datatrove, open_megatron
from ..io.formats.indexed_store import document_tokens
from ..model.documents import Document, Partition
from . import inputs as _inputs
from .blocks import BLOCK_TOKENS, Block, ReadOptions, documents, flat_block, partition_codes, read_options


def check_bin_separator(path: str, opts: ReadOptions) -> None:
    """Raise `ConfigError` unless .bin files can be split: a separator is set and fits the dtype."""
    if opts.bin_separator is None:
        raise ConfigError(
            f"{short_path(path)}: .bin files are split at a separator token, and none is set; pass --bin-separator ID "
            "(e.g. 50256 for GPT-2's <|endoftext|>) or --eos-id"
        )
    if opts.bin_separator > np.iinfo(opts.bin_dtype).max:
        raise ConfigError(
            f"{short_path(path)}: the separator (the eos id, {opts.bin_separator}) does not fit {opts.bin_dtype}; "
            "pass --bin-separator ID or --bin-dtype uint32"
        )


def bin_blocks(path: str, name: str, opts: ReadOptions) -> Iterator[Block]:
    """A flat nanoGPT-style token file, split after every separator id (it ends its document).

    The documents' concatenation is the file; ids are ``name:k``.
    """
    check_bin_separator(path, opts)
    dtype = np.dtype(opts.bin_dtype).newbyteorder("<")
    try:
        size = os.path.getsize(path)
        if size % dtype.itemsize:
            raise DataError(
                f"{short_path(path)}: {size} bytes is not a whole number of {opts.bin_dtype} tokens; "
                "pass --bin-dtype or check the file"
            )
        data = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except OSError as err:
        raise _inputs.read_error(path, err) from err
    start, doc, total = 0, 0, int(data.size)
    for lo in range(0, total, BLOCK_TOKENS):
        ends = np.flatnonzero(data[lo : lo + BLOCK_TOKENS] == opts.bin_separator) + (lo + 1)
        if ends.size:
            yield _bin_block(data, path, name, start, doc, ends, opts)
            start, doc = int(ends[-1]), doc + int(ends.size)
    if start < total:
        yield _bin_block(data, path, name, start, doc, np.array([total]), opts)


def _bin_block(data: Any, path: str, name: str, start: int, doc: int, ends: npt.NDArray[Any], opts: ReadOptions) -> Block:
    lengths = np.diff(ends, prepend=start)
    ids = [f"{name}:{k}" for k in range(doc, doc + ends.size)]
    shown = short_path(path)
    wheres = [f"{shown} document {k}" for k in range(doc, doc + ends.size)]
    return flat_block(
        np.asarray(data[start : int(ends[-1])]), lengths, ids, partition_codes(ends.size, opts.partition), wheres, opts
    )


def iter_bin(
    path: str | os.PathLike[str], *, separator: int, dtype: str = "uint16", partition: Partition | str = Partition.TRAIN
) -> Iterator[Document]:
    """A nanoGPT-style flat token file (little-endian *dtype*), split after each *separator* id, lazily.

    Each document ends with its separator (the last one may not), so the
    documents' concatenation is the file.
    """
    name = os.fspath(path)
    _inputs.check_input(name)  # a FIFO or device is refused, never opened
    opts = read_options(partition=partition, bin_separator=separator, bin_dtype=dtype)
    return documents(bin_blocks(name, Path(name).name, opts))


INDEXED = ("megatron", "datatrove")


def indexed_blocks(path: str, name: str, kind: str, opts: ReadOptions) -> Iterator[Block]:
    """The documents of a Megatron dataset (*kind* ``megatron``: its ``.idx`` or ``.bin``) or a ``.ds`` file, in blocks."""
    if kind not in INDEXED:
        raise DataError(f"{short_path(path)}: part of datatrove's files; pass the .ds file it belongs to")
    store = open_megatron(path) if kind == "megatron" else open_datatrove(path)
    count, shown = len(store), short_path(path)
    ends = np.cumsum(store.lengths)
    k = 0
    while k < count:
        done = int(ends[k - 1]) if k else 0
        stop = min(count, max(k + 1, int(np.searchsorted(ends, done + BLOCK_TOKENS, side="right"))))
        tokens, _ = document_tokens(store, k, stop)
        ids = [f"{name}:{j}" for j in range(k, stop)]
        wheres = [f"{shown} document {j}" for j in range(k, stop)]
        yield flat_block(tokens, store.lengths[k:stop], ids, partition_codes(stop - k, opts.partition), wheres, opts)
        k = stop
