"""A store's header and file names: what ``header.json`` holds, and the checks it must pass on open.

The header records the format, version, token dtype, counts, the content
fingerprint, the tokenizer (optional) and either the ids and partitions inline
or the names of the files holding them (``ids.jsonl``, ``partitions.bin``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import StoreError
from ..model.contract import contract_of
from ..model.documents import PARTITIONS
from ..model.store import content_fingerprint
from .bounded_json import read_json_header
from .files import short_path

FORMAT = "streambatch.store"
VERSION = 1
HEADER, TOKENS, OFFSETS, IDS, PARTITIONS_FILE = "header.json", "tokens.bin", "offsets.bin", "ids.jsonl", "partitions.bin"
INLINE_DOCUMENTS = 1024  # more documents than this keep ids and partitions in files of their own
INLINE_ID_CHARS = 1 << 20  # so do ids longer than this in all: the header stays far below HEADER_LIMIT
DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_READ = 1 << 24


def new_header(
    dtype: np.dtype[Any],
    token_count: int,
    ids: Sequence[str],
    codes: npt.NDArray[np.uint8],
    fingerprint: str,
    tokenizer: dict[str, Any] | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The header of a new store; ids and partitions inline when few and short (else see `ids_inline`).

    *ids* may be any sequence: only its length is read unless it is short enough to be inline.
    """
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype.name,
        "token_count": token_count,
        "document_count": len(ids),
        "fingerprint": fingerprint,
    }
    if tokenizer is not None:
        header["tokenizer"] = tokenizer
        header["contract"] = contract_of(tokenizer)  # an optional field of version 1: older stores derive theirs
    header.update({k: v for k, v in extra.items() if k not in header})
    if ids_inline(ids):
        header["ids"] = list(ids)
        header["partitions"] = [PARTITIONS[c].value for c in codes.tolist()]
    else:
        header["ids_file"] = IDS
        header["partitions_file"] = PARTITIONS_FILE
    return header


def ids_inline(ids: Sequence[str]) -> bool:
    """Whether a store's ids and partitions go in its header (few, short ids) rather than files of their own."""
    return len(ids) <= INLINE_DOCUMENTS and sum(map(len, ids)) <= INLINE_ID_CHARS


def read_header(handle: IO[bytes], header_path: Path) -> tuple[dict[str, Any], np.dtype[Any], int, int, str]:
    """Read and check an open ``header.json``: ``(header, dtype, token_count, document_count, fingerprint)``."""
    header = read_json_header(handle, short_path(header_path), "header", "prepare the store again", error=StoreError)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoreError(f"{short_path(header_path)}: format is not {FORMAT!r}; this is not a streambatch store")
    version = header.get("version")
    if type(version) is not int or version != VERSION:
        raise StoreError(
            f"{short_path(header_path)}: version={short_repr(version)} is not supported (this streambatch reads {VERSION})"
        )
    dtype = DTYPES.get(header["dtype"]) if isinstance(header.get("dtype"), str) else None
    if dtype is None:
        raise StoreError(f"{short_path(header_path)}: dtype={short_repr(header.get('dtype'))} must be 'uint16' or 'uint32'")
    tokens_count = _count(header, "token_count", header_path)
    docs_count = _count(header, "document_count", header_path)
    fingerprint = header.get("fingerprint")
    if not isinstance(fingerprint, str):
        raise StoreError(
            f"{short_path(header_path)}: fingerprint={short_repr(fingerprint)} must be a string; prepare the store again"
        )
    return header, dtype, tokens_count, docs_count, fingerprint


def header_tokenizer(header: dict[str, Any], header_path: Path) -> dict[str, Any] | None:
    """The header's tokenizer description, or None; a ``contract`` recorded beside it must be that tokenizer's."""
    tokenizer = header.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, dict):
        raise StoreError(
            f"{short_path(header_path)}: tokenizer={short_repr(tokenizer)} must be an object (name, vocab_size, ...) or absent"
        )
    recorded = header.get("contract")
    if recorded is not None and recorded != contract_of(tokenizer):
        raise StoreError(
            f"{short_path(header_path)}: contract={short_repr(recorded)} is not the contract of its tokenizer entry "
            f"({short_repr(contract_of(tokenizer))}); the header was edited: prepare the store again"
        )
    return tokenizer


def listed_files(header: dict[str, Any], header_path: Path) -> list[str]:
    """The files the header names for ids and partitions (none when they are inline)."""
    if "ids_file" not in header:
        return []
    if header.get("ids_file") != IDS or header.get("partitions_file") != PARTITIONS_FILE:
        raise StoreError(
            f"{short_path(header_path)}: ids_file={short_repr(header.get('ids_file'))} and partitions_file="
            f"{short_repr(header.get('partitions_file'))} must be {IDS!r} and {PARTITIONS_FILE!r}; prepare the store again"
        )
    return [IDS, PARTITIONS_FILE]


def _count(header: dict[str, Any], name: str, header_path: Path) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StoreError(f"{short_path(header_path)}: {name}={short_repr(value)} must be a non-negative int")
    return value


def fingerprint_files(
    tokens_fd: int,
    offsets_fd: int,
    ids: Sequence[str],
    codes: npt.NDArray[np.uint8],
    *,
    id_lines: Iterable[bytes] | None = None,
    mask_fd: Sequence[int] = (),
) -> str:
    """The content fingerprint of a store's open tokens.bin and offsets.bin, ids (or their JSON lines) and partition codes.

    *mask_fd*: the open ``loss_mask.bin`` of a store with a mask (one descriptor), else empty.
    """
    masks = _fd_blocks(mask_fd[0]) if mask_fd else None
    return content_fingerprint(_fd_blocks(tokens_fd), _fd_blocks(offsets_fd), ids, codes, id_lines=id_lines, mask_blocks=masks)


def _fd_blocks(fd: int) -> Iterator[bytes]:
    position = 0
    while chunk := os.pread(fd, _READ, position):
        yield chunk
        position += len(chunk)


def is_store(path: Path) -> bool:
    """A directory with a header file: a store (what a writer may replace)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and os.path.isfile(path / HEADER)
    except OSError:
        return False
