"""The formats of the tools that prepare data at scale: Megatron-LM's ``.bin``/``.idx`` and datatrove's ``.ds``.

Read as stores (`open_megatron`, `open_datatrove`; `streambatch.open_source`
takes their paths) through the `ByteSource` seam, and written from any
documents (`write_format`, `FormatWriter`; ``streambatch prepare --format``).
"""

from __future__ import annotations

import os

from ...model.corpus import Corpus
from .byte_source import ByteSource, LocalFile, Opener, local_file
from .datatrove import is_datatrove, open_datatrove, open_datatrove_folder
from .indexed_store import IndexedStore, NumberedIds
from .megatron import is_megatron, open_megatron, open_megatron_folder
from .writer import FORMATS, FormatWriter, output_paths, write_format


def open_format(path: str | os.PathLike[str]) -> tuple[str, IndexedStore | Corpus] | None:
    """``(kind, store)`` when *path* names another tool's files (``megatron``/``datatrove``: a file, or a folder of
    them read as one corpus), else None: the one place that tells those paths apart, for every SOURCE."""
    name = os.fspath(path)
    if is_datatrove(name):  # datatrove's .ds + .ds.index (+ .ds.loss), or a folder of them
        return "datatrove", open_datatrove_folder(name) if os.path.isdir(name) else open_datatrove(name)
    if is_megatron(name):  # Megatron-LM's .bin + .idx, or a folder of them
        return "megatron", open_megatron_folder(name) if os.path.isdir(name) else open_megatron(name)
    return None


__all__ = [
    "FORMATS",
    "ByteSource",
    "FormatWriter",
    "IndexedStore",
    "LocalFile",
    "NumberedIds",
    "Opener",
    "is_datatrove",
    "is_megatron",
    "local_file",
    "open_datatrove",
    "open_datatrove_folder",
    "open_format",
    "open_megatron",
    "open_megatron_folder",
    "output_paths",
    "write_format",
]
