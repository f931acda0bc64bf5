"""Token stores on disk: written atomically, memory-mapped read-only, checked on open.

A store is a directory::

    STORE/header.json    format, version, dtype, counts, fingerprint, ids/partitions
    STORE/tokens.bin     every document's tokens, flat, little-endian uint16 or uint32
    STORE/offsets.bin    document_count + 1 little-endian int64 offsets into tokens.bin
    STORE/ids.jsonl      (many documents only) one JSON string id per line
    STORE/partitions.bin (many documents only) one uint8 per document: 0 train, 1 validation, 2 test

``fingerprint`` is ``blake2b-256:`` + the hex BLAKE2b-256 of tokens.bin, then
offsets.bin, then the canonical JSON of the ids and partition codes.  Everything
is written under a temporary name beside the target and renamed into place last,
so an interrupted write leaves either no store or the complete previous one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .documents import PARTITIONS, Document, DocumentStore, Partition, content_fingerprint, smallest_token_dtype
from .errors import DataError, DuplicateIdError, StoreError
from .validate import check_id, check_offsets, check_tokens, check_unique

FORMAT = "streambatch.store"
VERSION = 1
HEADER, TOKENS, OFFSETS, IDS, PARTITIONS_FILE = "header.json", "tokens.bin", "offsets.bin", "ids.jsonl", "partitions.bin"
INLINE_DOCUMENTS = 1024  # more documents than this keep ids and partitions in files of their own
_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_READ = 1 << 24


def _fingerprint(directory: Path, ids: list[str], codes: npt.NDArray[np.uint8]) -> str:
    return content_fingerprint(_file_blocks(directory / TOKENS), _file_blocks(directory / OFFSETS), ids, codes)


def _file_blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ):
            yield chunk


class StoreWriter:
    """Stream documents into a new store; `commit` renames it into place atomically.

    Use as a context manager: an exception (or a kill) before `commit` leaves no store.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "store"
    >>> with StoreWriter(path) as writer:
    ...     writer.add("a", "train", [0, 10, 11, 12, 1])
    ...     store = writer.commit()
    >>> store.ids, store.tokens.dtype.name
    (('a',), 'uint16')
    """

    def __init__(self, path: str | os.PathLike[str], *, dtype: npt.DTypeLike | None = None, overwrite: bool = True) -> None:
        self.path = Path(path)
        _check_target(self.path, overwrite)
        self._fixed = None if dtype is None else np.dtype(dtype)
        if self._fixed is not None and self._fixed.name not in _DTYPES:
            raise StoreError(f"dtype={self._fixed.name} is not supported; use uint16 or uint32")
        parent = self.path.parent if str(self.path.parent) else Path(".")
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_partials(self.path)
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.partial-{os.getpid()}-", dir=parent))
        raw = TOKENS if self._fixed is not None else "tokens.u32"
        self._raw_name = raw
        self._tokens = open(self._tmp / raw, "wb")  # noqa: SIM115 - closed in commit/abort
        self._raw_dtype = (self._fixed or np.dtype(np.uint32)).newbyteorder("<")
        self._offsets: list[int] = [0]
        self._ids: list[str] = []
        self._where: dict[str, str] = {}
        self._codes = bytearray()
        self._max = -1
        self._done = False

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.abort()

    def add(self, doc_id: str, partition: Partition | str, tokens: Any, *, where: str = "") -> None:
        """Append one document (validated like `Document`)."""
        label = where or f"document id={doc_id!r}"
        check_id(doc_id, label)
        first = self._where.get(doc_id)
        if first is not None:
            raise DuplicateIdError(
                f"duplicate document id={doc_id!r}: first at {first}, repeated at {label}; document ids must be unique"
            )
        code = Partition.parse(partition, label).code
        unsigned = isinstance(tokens, np.ndarray) and tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4
        array = tokens if unsigned else check_tokens(tokens, label)  # uint8/16/32 arrays are valid as they are
        self._write(array, label)
        self._where[doc_id] = label
        self._ids.append(doc_id)
        self._codes.append(code)
        self._offsets.append(self._offsets[-1] + int(array.size))

    def add_block(self, tokens: npt.NDArray[Any], lengths: Iterable[int], ids: Iterable[str], partition: Partition | str) -> None:
        """Append many documents at once: flat *tokens* split by *lengths* (a fast path for scripts)."""
        sizes = np.asarray(list(lengths), dtype=np.int64)
        names = list(ids)
        if sizes.size != len(names) or int(sizes.sum()) != tokens.size:
            raise DataError("add_block: lengths, ids and tokens disagree; pass one length and id per document")
        code = Partition.parse(partition).code
        for name in names:
            check_id(name, "add_block")
            if name in self._where:
                raise DuplicateIdError(f"duplicate document id={name!r} in add_block; document ids must be unique")
            self._where[name] = "add_block"
        self._write(tokens, "add_block")
        self._ids.extend(names)
        self._codes.extend(bytes([code]) * len(names))
        ends = self._offsets[-1] + np.cumsum(sizes)
        self._offsets.extend(ends.tolist())

    def _write(self, array: npt.NDArray[Any], label: str) -> None:
        if array.size:
            top = int(array.max())
            if self._fixed is not None and top > np.iinfo(self._fixed).max:
                raise DataError(f"{label}: token id {top} does not fit the store's dtype {self._fixed.name}")
            self._max = max(self._max, top)
            np.ascontiguousarray(array, dtype=self._raw_dtype).tofile(self._tokens)

    def commit(self) -> DocumentStore:
        """Finish the files, then rename the store into place; returns it opened."""
        self._tokens.close()
        count = self._offsets[-1]
        dtype = self._fixed or np.dtype(smallest_token_dtype(self._max)).newbyteorder("<")
        if self._raw_name != TOKENS:
            raw = self._tmp / self._raw_name
            if dtype.itemsize == 4:
                raw.rename(self._tmp / TOKENS)
            else:  # every id fits in 16 bits: narrow in bounded chunks
                source = np.memmap(raw, dtype="<u4", mode="r", shape=(count,)) if count else np.zeros(0, "<u4")
                with open(self._tmp / TOKENS, "wb") as out:
                    for lo in range(0, count, _READ):
                        source[lo : lo + _READ].astype("<u2").tofile(out)
                del source
                raw.unlink()
        np.asarray(self._offsets, dtype="<i8").tofile(self._tmp / OFFSETS)
        codes = np.frombuffer(bytes(self._codes), dtype=np.uint8)
        header: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "dtype": np.dtype(dtype).name,
            "token_count": count,
            "document_count": len(self._ids),
            "fingerprint": _fingerprint(self._tmp, self._ids, codes),
        }
        if len(self._ids) <= INLINE_DOCUMENTS:
            header["ids"] = self._ids
            header["partitions"] = [PARTITIONS[c].value for c in codes.tolist()]
        else:
            with open(self._tmp / IDS, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(i) + "\n" for i in self._ids)
            codes.tofile(self._tmp / PARTITIONS_FILE)
            header["ids_file"] = IDS
            header["partitions_file"] = PARTITIONS_FILE
        for name in os.listdir(self._tmp):
            _fsync(self._tmp / name)
        with open(self._tmp / HEADER, "w", encoding="utf-8") as handle:  # last: a store is complete once it has one
            json.dump(header, handle, indent=1)
            handle.write("\n")
        _fsync(self._tmp / HEADER)
        _swap_into_place(self._tmp, self.path)
        self._done = True
        return open_store(self.path, verify=False)

    def abort(self) -> None:
        """Discard everything written so far."""
        self._done = True
        with contextlib.suppress(OSError):
            self._tokens.close()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_target(path: Path, overwrite: bool) -> None:
    if path.exists():
        if not path.is_dir() or not (path / HEADER).exists():
            raise StoreError(f"{path}: exists and is not a streambatch store; choose a new output path")
        if not overwrite:
            raise StoreError(f"{path}: a store already exists; remove it or allow overwriting")


def _swap_into_place(tmp: Path, path: Path) -> None:
    _check_target(path, True)
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
        os.rename(path, old / "store")
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)
    with contextlib.suppress(OSError):
        _fsync(path.parent)


def _remove_stale_partials(path: Path) -> None:
    """Remove temporary directories left by killed writers of this target."""
    parent = path.parent if str(path.parent) else Path(".")
    for entry in parent.glob(f".{path.name}.partial-*"):
        try:
            pid = int(entry.name.rsplit(".partial-", 1)[1].split("-", 1)[0])
            os.kill(pid, 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            continue


def write_store(path: str | os.PathLike[str], documents: DocumentStore | Iterable[Document]) -> DocumentStore:
    """Write documents (or an in-memory store) to *path* atomically; returns the opened store."""
    with StoreWriter(path) as writer:
        if isinstance(documents, DocumentStore):
            for i in range(len(documents)):
                start, length = int(documents.starts[i]), int(documents.lengths[i])
                writer.add(
                    documents.ids[i],
                    documents.partition(i),
                    documents.tokens[start : start + length],
                    where=f"document index {i}",
                )
        else:
            for i, doc in enumerate(documents):
                writer.add(doc.id, doc.partition, doc.tokens, where=f"document index {i}")
        return writer.commit()


def open_store(path: str | os.PathLike[str], *, verify: bool = True) -> DocumentStore:
    """Memory-map a store read-only after checking it; every failure is a `StoreError`.

    Checks: the header (format, version, dtype, counts), file sizes against the
    header, offsets (start at 0, non-decreasing, end at the token count), ids and
    partitions, and with *verify* (the default) the content fingerprint, which
    reads every byte once.
    """
    root = Path(path)
    header_path = root / HEADER
    if not header_path.is_file():
        raise StoreError(f"{root}: not a streambatch store ({HEADER} is missing); run `streambatch prepare` to build one")
    try:
        header = json.loads(header_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StoreError(f"{header_path}: unreadable header ({err}); prepare the store again") from err
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoreError(f"{header_path}: format is not {FORMAT!r}; this is not a streambatch store")
    if header.get("version") != VERSION:
        raise StoreError(f"{header_path}: version={header.get('version')!r} is not supported (this streambatch reads {VERSION})")
    dtype = _DTYPES.get(str(header.get("dtype")))
    if dtype is None:
        raise StoreError(f"{header_path}: dtype={header.get('dtype')!r} must be 'uint16' or 'uint32'")
    tokens_count = _count(header, "token_count", header_path)
    docs_count = _count(header, "document_count", header_path)
    _check_size(root / TOKENS, tokens_count * dtype.itemsize, f"{tokens_count} tokens of {dtype.name}")
    _check_size(root / OFFSETS, (docs_count + 1) * 8, f"{docs_count + 1} int64 offsets")
    offsets = np.fromfile(root / OFFSETS, dtype="<i8").astype(np.int64)
    try:
        check_offsets(offsets, tokens_count, "offsets")
    except DataError as err:
        raise StoreError(f"{root / OFFSETS}: {err}") from err
    ids, codes = _read_documents(root, header, header_path, docs_count)
    if verify:
        actual = _fingerprint(root, ids, codes)
        if actual != header.get("fingerprint"):
            raise StoreError(
                f"{root}: fingerprint mismatch (header {header.get('fingerprint')!r}, content {actual!r}); "
                "the store's files were changed or corrupted; prepare it again"
            )
    tokens: Any = (
        np.memmap(root / TOKENS, dtype=dtype, mode="r", shape=(tokens_count,)) if tokens_count else np.zeros(0, dtype=dtype)
    )
    return DocumentStore._frozen(tokens, offsets[:-1].copy(), np.diff(offsets), tuple(ids), codes, str(header.get("fingerprint")))


def _count(header: dict[str, Any], name: str, header_path: Path) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StoreError(f"{header_path}: {name}={value!r} must be a non-negative int")
    return value


def _check_size(path: Path, expected: int, what: str) -> None:
    try:
        actual = path.stat().st_size
    except OSError as err:
        raise StoreError(f"{path}: missing ({err.strerror}); the store is incomplete; prepare it again") from err
    if actual != expected:
        state = "truncated" if actual < expected else "longer than the header says"
        raise StoreError(
            f"{path}: size {actual} bytes but the header describes {what} ({expected} bytes): {state}; prepare the store again"
        )


def _read_documents(root: Path, header: dict[str, Any], header_path: Path, count: int) -> tuple[list[str], npt.NDArray[np.uint8]]:
    if "ids_file" in header:
        ids_path, parts_path = root / str(header["ids_file"]), root / str(header.get("partitions_file"))
        try:
            with open(ids_path, encoding="utf-8") as handle:
                ids = [json.loads(line) for line in handle]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise StoreError(f"{ids_path}: unreadable ids ({err}); prepare the store again") from err
        _check_size(parts_path, count, f"{count} partition codes")
        codes = np.fromfile(parts_path, dtype=np.uint8)
        where = ids_path
    else:
        inline_ids = header.get("ids")
        parts = header.get("partitions")
        if not isinstance(inline_ids, list) or not isinstance(parts, list) or len(parts) != len(inline_ids):
            raise StoreError(f"{header_path}: ids and partitions must be lists of equal length")
        ids = inline_ids
        try:
            codes = np.array([Partition.parse(p).code for p in parts], dtype=np.uint8)
        except DataError as err:
            raise StoreError(f"{header_path}: {err}") from err
        where = header_path
    if len(ids) != count:
        raise StoreError(f"{where}: {len(ids)} ids but document_count={count}; prepare the store again")
    if codes.size and int(codes.max()) >= len(PARTITIONS):
        raise StoreError(f"{where}: partition code {int(codes.max())} is not 0, 1 or 2")
    try:
        for index, value in enumerate(ids):
            check_id(value, f"document index {index}")
        check_unique(ids, [f"document index {i}" for i in range(count)])
    except DataError as err:
        raise StoreError(f"{where}: {err}") from err
    return ids, codes
