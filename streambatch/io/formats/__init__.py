"""The formats of the tools that prepare data at scale: Megatron-LM's ``.bin``/``.idx`` and datatrove's ``.ds``.

Read as stores (`open_megatron`, `open_datatrove`; `streambatch.open_source`
takes their paths) through the `ByteSource` seam, and written from any
documents (`write_format`, `FormatWriter`; ``streambatch prepare --format``).
"""

from __future__ import annotations

from .byte_source import ByteSource, LocalFile, Opener, local_file
from .datatrove import is_datatrove, open_datatrove, open_datatrove_folder
from .indexed_store import IndexedStore, NumberedIds
from .megatron import is_megatron, open_megatron, open_megatron_folder
from .writer import FORMATS, FormatWriter, output_paths, write_format

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
    "open_megatron",
    "open_megatron_folder",
    "output_paths",
    "write_format",
]
