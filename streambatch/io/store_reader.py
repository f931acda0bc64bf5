"""Open a store: every file relative to one open directory, checked, tokens memory-mapped read-only.

`open_store` opens the directory once and every file relative to it, so all
files come from one version; when a concurrent replace removes the version
being opened, the open starts over (a few times) on the new one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import ConfigError, DataError, NotRegularFileError, StoreError, StoreFileMissing
from ..model.documents import PARTITIONS, Partition
from ..model.ids import IdLines, first_repeat
from ..model.mapped import map_readonly
from ..model.store import DocumentStore
from ..model.validate import check_id, check_offsets, duplicate_id
from .bounded_json import decode_string
from .files import open_regular, short_path
from .remote.location import is_remote
from .store_header import (
    HEADER,
    IDS,
    OFFSETS,
    PARTITIONS_FILE,
    TOKENS,
    fingerprint_files,
    header_tokenizer,
    listed_files,
    read_header,
)

OPEN_ATTEMPTS = 20


_Missing = StoreFileMissing  # raised inside one open attempt; the caller decides what it means


def open_store(path: str | os.PathLike[str], *, verify: bool = True, **remote: Any) -> DocumentStore:
    """Memory-map a store read-only after checking it; every failure is a `StoreError`.

    (An address in object storage is opened by `streambatch.io.store.open_store`.)

    Checks: the header (format, version, dtype, counts), file sizes against the
    header, offsets (within the tokens, start at 0, non-decreasing, end at the
    token count), ids and partitions, and with *verify* (the default) the content
    fingerprint, which reads every byte once.  All files are opened relative to
    one open directory, so they belong to one version of the store even while a
    writer replaces it; an open that loses its version to a replace starts over.
    """
    if is_remote(path):
        raise ConfigError(f"{path!r} is an address; open it with streambatch.open_store (streambatch.io.store)")
    if remote:
        raise ConfigError(f"{', '.join(sorted(remote))}: options of a remote store; {short_path(os.fspath(path))} is local")
    root = Path(path)
    for _ in range(OPEN_ATTEMPTS):
        try:
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except ValueError:  # "embedded null byte"
            raise StoreError(f"{short_path(os.fspath(root))!r}: the path holds a NUL byte; pass a store directory") from None
        except (FileNotFoundError, NotADirectoryError):
            raise StoreError(
                f"{short_path(root)}: not a streambatch store ({HEADER} is missing); run `streambatch prepare` to build one"
            ) from None
        except OSError as err:
            raise StoreError(
                f"{short_path(root)}: cannot open the store ({err.strerror or err}); check the path and its permissions"
            ) from err
        try:
            return open_store_at(dfd, root, verify)
        except _Missing as missing:
            if _still_at(dfd, root):  # really missing, not removed by a concurrent replace
                if missing.name == HEADER:
                    raise StoreError(
                        f"{short_path(root)}: not a streambatch store ({HEADER} is missing); "
                        "run `streambatch prepare` to build one"
                    ) from None
                raise StoreError(
                    f"{short_path(root / missing.name)}: missing ({missing.err.strerror}); "
                    "the store is incomplete; prepare it again"
                ) from None
        finally:
            os.close(dfd)
    raise StoreError(f"{short_path(root)}: the store was replaced {OPEN_ATTEMPTS} times while it was being opened; open it again")


def _still_at(dfd: int, root: Path) -> bool:
    """Whether the directory open as *dfd* is still the one at *root*."""
    try:
        here, there = os.fstat(dfd), os.stat(root)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _open_file(dfd: int, name: str, root: Path) -> IO[bytes]:
    """Open a regular file of the store relative to *dfd* (a FIFO or device is refused, never waited on)."""
    try:
        return open_regular(name, dir_fd=dfd)
    except FileNotFoundError as err:
        raise _Missing(name, err) from None
    except NotRegularFileError:
        raise StoreError(f"{short_path(root / name)}: not a regular file; prepare the store again") from None
    except OSError as err:
        raise StoreError(f"{short_path(root / name)}: cannot open ({err.strerror or err}); prepare the store again") from err


def open_store_at(dfd: int, root: Path, verify: bool, *, check_ids: bool = True) -> DocumentStore:
    """Open the store in the directory open as *dfd* (shown as *root*); a missing file raises `_Missing`.

    *check_ids* False skips decoding each id of ``ids.jsonl`` (a `StoreWriter` that just wrote them, checked).
    """
    header_path = root / HEADER
    with _open_file(dfd, HEADER, root) as handle:
        header, dtype, tokens_count, docs_count, fingerprint = read_header(handle, header_path)
    with contextlib.ExitStack() as files:
        # every file is opened before anything is read: all of them belong to the version the header came from
        tokens_file = files.enter_context(_open_file(dfd, TOKENS, root))
        offsets_file = files.enter_context(_open_file(dfd, OFFSETS, root))
        listed = listed_files(header, header_path)
        extra = [files.enter_context(_open_file(dfd, name, root)) for name in listed]
        _check_size(tokens_file, root / TOKENS, tokens_count * dtype.itemsize, f"{tokens_count} tokens of {dtype.name}")
        _check_size(offsets_file, root / OFFSETS, (docs_count + 1) * 8, f"{docs_count + 1} int64 offsets")
        offsets = np.fromfile(offsets_file, dtype="<i8")
        try:
            offsets = check_offsets(offsets, tokens_count, "offsets")
        except DataError as err:
            raise StoreError(f"{short_path(root / OFFSETS)}: {err}") from err
        ids, codes = _read_documents(root, header, header_path, docs_count, extra, check_ids)
        if verify:
            actual = fingerprint_files(tokens_file.fileno(), offsets_file.fileno(), ids, codes)
            if actual != fingerprint:
                raise StoreError(
                    f"{short_path(root)}: fingerprint mismatch (header {short_repr(fingerprint)}, content {actual!r}); "
                    "the store's files were changed or corrupted; prepare it again"
                )
        tokens: Any = np.zeros(0, dtype=dtype)
        if tokens_count:
            # no descriptor kept: 10**4 shards open under `ulimit -n 1024`; pickles by name (DocumentStore.__reduce__)
            tokens = map_readonly(tokens_file.fileno(), dtype, tokens_count, os.path.abspath(root / TOKENS))
            status = os.fstat(tokens_file.fileno())
            tokens.identity = (status.st_dev, status.st_ino)  # reopened only if unchanged
    tokenizer = header_tokenizer(header, header_path)
    # starts: a view of the offsets (no copy: 8 bytes per document less)
    return DocumentStore.from_checked(tokens, offsets[:-1], np.diff(offsets), ids, codes, fingerprint, tokenizer)


def _check_size(handle: IO[bytes], path: Path, expected: int, what: str) -> None:
    actual = os.fstat(handle.fileno()).st_size
    if actual != expected:
        state = "truncated" if actual < expected else "longer than the header says"
        raise StoreError(
            f"{short_path(path)}: size {actual} bytes but the header describes {what} ({expected} bytes): {state}; "
            "prepare the store again"
        )


def _read_documents(
    root: Path, header: dict[str, Any], header_path: Path, count: int, files: list[IO[bytes]], check_ids: bool = True
) -> tuple[Sequence[str], npt.NDArray[np.uint8]]:
    ids: Sequence[str]
    if files:
        ids_file, parts_file = files
        ids, codes, hashes = _read_id_files(root, count, ids_file, parts_file, check_ids)
        where = root / PARTITIONS_FILE
    else:
        inline_ids = header.get("ids")
        parts = header.get("partitions")
        if not isinstance(inline_ids, list) or not isinstance(parts, list) or len(parts) != len(inline_ids):
            raise StoreError(f"{short_path(header_path)}: ids and partitions must be lists of equal length")
        ids = tuple(inline_ids)
        hashes = None
        if len(ids) != count:
            raise StoreError(f"{short_path(header_path)}: {len(ids)} ids but document_count={count}; prepare the store again")
        try:
            codes = np.array([Partition.parse(p, f"document index {i}").code for i, p in enumerate(parts)], dtype=np.uint8)
            for index, value in enumerate(ids):
                check_id(value, f"document index {index}")
        except DataError as err:
            raise StoreError(f"{short_path(header_path)}: {err}") from err
        where = header_path
    if codes.size and int(codes.max()) >= len(PARTITIONS):
        raise StoreError(f"{short_path(where)}: partition code {int(codes.max())} is not 0, 1 or 2")
    repeat = first_repeat(ids, hashes) if check_ids else None  # 8 bytes per id, not a dict of them
    del hashes
    if repeat is not None:
        try:
            duplicate_id(ids[repeat[0]], f"document index {repeat[0]}", f"document index {repeat[1]}")
        except DataError as err:
            raise StoreError(f"{short_path(root / IDS if files else header_path)}: {err}") from err
    return ids, codes


def _read_id_files(
    root: Path, count: int, ids_file: IO[bytes], parts_file: IO[bytes], check_ids: bool
) -> tuple[IdLines, npt.NDArray[np.uint8], npt.NDArray[np.int64] | None]:
    """ids.jsonl kept as one buffer (`IdLines`: no str per id), each line checked once; partitions.bin; the ids' hashes."""
    ids_path = root / IDS
    try:  # mapped: its pages are read when ids are (a writer's own store: never, unless asked for)
        size = os.fstat(ids_file.fileno()).st_size
        data = map_readonly(ids_file.fileno(), np.dtype(np.uint8), size, str(ids_path)) if size else np.zeros(0, np.uint8)
    except OSError as err:
        raise StoreError(f"{short_path(ids_path)}: unreadable ids ({err.strerror or err}); prepare the store again") from err
    ids = IdLines.of(data) if check_ids else IdLines(data, count)
    if len(ids) != count:
        raise StoreError(f"{short_path(ids_path)}: {len(ids)} ids but document_count={count}; prepare the store again")
    hashes = np.empty(count, dtype=np.int64) if check_ids else None
    shown = short_path(ids_path)  # once: a per-id path computation would cost more than the id's check
    try:
        for index, line in enumerate(ids.lines() if hashes is not None else ()):
            value = decode_string(line, f"{shown}:{index + 1}", "a document id", error=StoreError)
            check_id(value, f"document index {index}")
            hashes[index] = hash(value)  # type: ignore[index]
    except DataError as err:
        raise StoreError(f"{shown}: {err}") from err
    _check_size(parts_file, root / PARTITIONS_FILE, count, f"{count} partition codes")
    return ids, np.fromfile(parts_file, dtype=np.uint8), hashes
