"""Megatron's ``.bin``/``.idx`` and datatrove's ``.ds`` as inputs of `streambatch.prepare_store`.

Each file's documents are read through its memory-mapped store
(`streambatch.io.formats`), about `BLOCK_TOKENS` tokens at a time, with ids
``NAME:k`` (*k* the document's number in the file), so ``prepare`` converts
between the formats and a store.  A Megatron ``.bin`` beside its ``.idx`` is
read through the index, never as a raw token file.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import DataError
from ..io.files import short_path
from ..io.formats import open_datatrove, open_megatron
from ..io.formats.indexed_store import document_tokens
from .blocks import BLOCK_TOKENS, Block, ReadOptions, flat_block, partition_codes

KINDS = ("megatron", "datatrove")


def indexed_blocks(path: str, name: str, kind: str, opts: ReadOptions) -> Iterator[Block]:
    """The documents of a Megatron dataset (*kind* ``megatron``: its ``.idx`` or ``.bin``) or a ``.ds`` file, in blocks."""
    if kind not in KINDS:
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
