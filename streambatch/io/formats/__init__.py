"""The formats of the tools that prepare data at scale: Megatron-LM's ``.bin``/``.idx`` and datatrove's ``.ds``.

Read as stores (`open_megatron`, `open_datatrove`; `streambatch.open_source`
takes their paths) through the `ByteSource` seam, and written from any
documents (`write_format`, `FormatWriter`; ``streambatch prepare --format``).
"""

from __future__ import annotations

import os

from ...errors import ConfigError, DataError
from ...model.corpus import Corpus
from ..files import short_path
from .byte_source import ByteSource, LocalFile, Opener, local_file
from .datatrove import datatrove_files, is_datatrove, open_datatrove, open_datatrove_folder
from .indexed_store import IndexedStore, NumberedIds
from .megatron import is_megatron, megatron_prefixes, open_megatron, open_megatron_folder
from .writer import FORMATS, FormatWriter, output_paths, write_format

KINDS = ("megatron", "datatrove")


def open_format(path: str | os.PathLike[str], kind: str | None = None) -> tuple[str, IndexedStore | Corpus] | None:
    """``(kind, store)`` when *path* names another tool's files (``megatron``/``datatrove``: a file, or a folder of
    them read as one corpus), else None: the one place that tells those paths apart, for every SOURCE.

    A folder holding both kinds is refused naming both, unless *kind* names the one to read.
    """
    name = os.fspath(path)
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"format={kind!r} is not one of {', '.join(map(repr, KINDS))}")
    datatrove, megatron = is_datatrove(name), is_megatron(name)
    if datatrove and megatron and kind is None and os.path.isdir(name):
        raise DataError(
            f"{short_path(name)}: holds both Megatron-LM files ({short_path(megatron_prefixes(name)[0])}.idx) and datatrove "
            f"files ({short_path(datatrove_files(name)[0])}); name the kind (open_source(..., format='megatron' or "
            "'datatrove')), or move one kind to a folder of its own"
        )
    if datatrove and kind != "megatron":  # datatrove's .ds + .ds.index (+ .ds.loss), or a folder of them
        return "datatrove", open_datatrove_folder(name) if os.path.isdir(name) else open_datatrove(name)
    if megatron and kind != "datatrove":  # Megatron-LM's .bin + .idx, or a folder of them
        return "megatron", open_megatron_folder(name) if os.path.isdir(name) else open_megatron(name)
    return None


__all__ = [
    "FORMATS",
    "KINDS",
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
