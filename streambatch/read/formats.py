"""Stage 1, read: the formats corpora come in, one module each; this module lists their readers.

By suffix, in any case (`streambatch.read.select.format_of`):

- ``.jsonl``/``.ndjson`` (`.jsonl`): a document per line, ``tokens``/``input_ids`` as given, or text tokenized;
- any other name (``.txt``...; `.text`): text, a document per file or per non-blank line;
- ``.parquet`` (`.parquet`), ``.arrow``/``.feather`` (`.arrow`; the ``arrow`` extra): a document per row,
  from a token-list or text column (`.tables`);
- ``.npy`` (`.npy`): a token array, one document, or split by ``X.offsets.npy`` beside it;
- ``.bin`` (`.bin`, nanoGPT): flat uint16 tokens, split after each separator id;
- ``.idx`` (`.bin`, Megatron-LM; its ``.bin`` too) and ``.ds`` (datatrove): documents as their index says;
- a folder saved by ``datasets`` (`.hf`; the ``hf`` extra): a document per row, like Parquet.

JSONL and text may be compressed: ``.gz`` (stdlib) or ``.zst`` (``zstd`` extra;
`.inputs`).  Underneath, every format produces `streambatch.read.blocks.Block`s
(consecutive documents packed as flat tokens + lengths), which is what
`streambatch.prepare_store` writes.
"""

from __future__ import annotations

from .bin import iter_bin
from .columns.arrow import iter_arrow
from .columns.hf import iter_hf
from .columns.parquet import iter_parquet
from .jsonl import iter_jsonl, iter_records
from .npy import iter_npy
from .select import format_of, select_inputs
from .text.text import iter_text

__all__ = [
    "format_of",
    "iter_arrow",
    "iter_bin",
    "iter_hf",
    "iter_jsonl",
    "iter_npy",
    "iter_parquet",
    "iter_records",
    "iter_text",
    "select_inputs",
]
