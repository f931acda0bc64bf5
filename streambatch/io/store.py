"""Token stores on disk: written atomically, memory-mapped read-only, checked on open.

A store is a directory::

    STORE/header.json    format, version, dtype, counts, fingerprint, ids/partitions, tokenizer (optional)
    STORE/tokens.bin     every document's tokens, flat, little-endian uint16 or uint32
    STORE/offsets.bin    document_count + 1 little-endian int64 offsets into tokens.bin
    STORE/ids.jsonl      (many documents only) one JSON string id per line
    STORE/partitions.bin (many documents only) one uint8 per document: 0 train, 1 validation, 2 test

``fingerprint`` is ``blake2b-256:`` + the hex BLAKE2b-256 of tokens.bin, then
offsets.bin, then the canonical JSON of the ids and partition codes.

Crash and concurrency safety:

* Everything is written into a temporary directory beside the target,
  ``.NAME.partial-PID-XXXXXXXX``, and put in place last.  Replacing an existing
  store is one atomic step on Linux: ``renameat2(RENAME_EXCHANGE)`` swaps the new
  directory with the old one, and the old one (now under the temporary name) is
  removed afterwards.  A kill at any moment leaves the complete old store or the
  complete new one at the target.  Where renameat2 is unavailable (other systems,
  filesystems that refuse the flag) the fallback is two renames (old store aside
  as ``.NAME.old-PID-XXXXXXXX``, new one in); a kill between them leaves no store
  at the target, the old one still whole under the ``.old-`` name.
* Temporaries carry their writer's pid; every new writer of a target removes
  those of writers that are no longer running.
* `open_store` opens the directory once and every file relative to it, so all
  files come from one version; when a concurrent replace removes the version
  being opened, the open starts over (a few times) on the new one.
* Directories and files are created with modes 0o777 / 0o666 less the umask.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import json
import os
import secrets
import shutil
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import ConfigError, DataError, DuplicateIdError, StoreError
from ..model.documents import PARTITIONS, Document, DocumentStore, Partition, content_fingerprint
from ..model.validate import check_id, check_offsets, check_tokens, check_unique
from ..stages.read.tokenizers import Tokenizer, check_vocabulary
from .bounded_json import HEADER_LIMIT, decode_json, decode_string

FORMAT = "streambatch.store"
VERSION = 1
HEADER, TOKENS, OFFSETS, IDS, PARTITIONS_FILE = "header.json", "tokens.bin", "offsets.bin", "ids.jsonl", "partitions.bin"
INLINE_DOCUMENTS = 1024  # more documents than this keep ids and partitions in files of their own
INLINE_ID_CHARS = 1 << 20  # so do ids longer than this in all: the header stays far below HEADER_LIMIT
_DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_READ = 1 << 24
_WIDENING = "tokens.widening"
_OPEN_ATTEMPTS = 20

#: Test hook: when set, called with a step name before each step of a write (tests kill the process there).
step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


def _fingerprint(tokens_fd: int, offsets_fd: int, ids: list[str], codes: npt.NDArray[np.uint8]) -> str:
    return content_fingerprint(_fd_blocks(tokens_fd), _fd_blocks(offsets_fd), ids, codes)


def _fd_blocks(fd: int) -> Iterator[bytes]:
    position = 0
    while chunk := os.pread(fd, _READ, position):
        yield chunk
        position += len(chunk)


class StoreWriter:
    """Stream documents into a new store; `commit` puts it in place atomically.

    Use as a context manager: an exception (or a kill) before `commit` leaves no
    store, or the previous one untouched.  A symlink at *path* is followed: the
    directory it points to is replaced, the link is kept.  *tokenizer* (a
    `Tokenizer` or its ``describe()`` dict) is recorded in the header, and every
    token must fit its ``vocab_size``; *header* adds entries to the header.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "store"
    >>> with StoreWriter(path) as writer:
    ...     writer.add("a", "train", [0, 10, 11, 12, 1])
    ...     store = writer.commit()
    >>> store.ids, store.tokens.dtype.name
    (('a',), 'uint16')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: npt.DTypeLike | None = None,
        overwrite: bool = True,
        tokenizer: Tokenizer | Mapping[str, Any] | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer: dict[str, Any] | None = None
        self.set_tokenizer(tokenizer)
        self.header = dict(header or {})
        target = Path(path)
        self.path = Path(os.path.realpath(target)) if target.is_symlink() else target
        _check_target(self.path, overwrite)
        self._fixed = None if dtype is None else np.dtype(dtype)
        if self._fixed is not None and self._fixed.name not in _DTYPES:
            raise StoreError(f"dtype={self._fixed.name} is not supported; use uint16 or uint32")
        # tokens are staged in the final dtype: uint16 until an id needs more (then widened once), so a
        # killed writer's staging file is never larger than the store it was writing
        self._stage: np.dtype[Any] = (self._fixed or np.dtype(np.uint16)).newbyteorder("<")
        parent = self.path.parent
        self._tmp: Path | None = None
        try:
            _make_parents(parent)
            _remove_stale_temporaries(self.path)
            self._tmp = _make_directory(parent, f".{self.path.name}.partial-{os.getpid()}-")
            self._tokens: IO[bytes] = open(self._tmp / TOKENS, "wb")  # noqa: SIM115 - closed in commit/abort
        except OSError as err:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            raise StoreError(
                f"{self.path}: cannot create the store ({err.strerror or err}); choose a writable output path"
            ) from err
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
        _check_storable_id(doc_id, label)
        first = self._where.get(doc_id)
        if first is not None:
            raise DuplicateIdError(
                f"duplicate document id={doc_id!r}: first at {first}, repeated at {label}; document ids must be unique"
            )
        code = Partition.parse(partition, label).code
        array = _valid_tokens(tokens, label)
        self._check_vocabulary(array, np.array([array.size]), [label])
        self._write(array, label)
        self._where[doc_id] = label
        self._ids.append(doc_id)
        self._codes.append(code)
        self._offsets.append(self._offsets[-1] + int(array.size))

    def add_block(
        self,
        tokens: npt.NDArray[Any],
        lengths: Iterable[int],
        ids: Iterable[str],
        partition: Partition | str | npt.NDArray[np.uint8],
        *,
        wheres: Sequence[str] | None = None,
    ) -> None:
        """Append many documents at once: flat *tokens* split by *lengths* (the fast path of `prepare_store`).

        *partition* is one for all documents or an array of partition codes, one per
        document; *wheres* name each document in errors.  Nothing is added if any check fails.
        """
        try:
            sizes = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as err:
            raise DataError(f"add_block: lengths are not integers in int64 ({err}); pass one length per document") from None
        names = list(ids)
        array = _valid_tokens(tokens, "add_block")
        if wheres is not None and len(wheres) != len(names):
            raise DataError(f"add_block: {len(wheres)} wheres for {len(names)} ids; pass one where per document")
        if sizes.ndim != 1 or sizes.size != len(names) or (sizes.size and int(sizes.min()) < 0) or int(sizes.sum()) != array.size:
            raise DataError("add_block: lengths, ids and tokens disagree; pass one length >= 0 and one id per document")
        labels = (
            [f"{w} (document id={i!r})" for i, w in zip(names, wheres, strict=True)] if wheres else ["add_block"] * len(names)
        )
        if isinstance(partition, np.ndarray):
            if partition.shape != (len(names),) or (partition.size and int(partition.max()) >= len(PARTITIONS)):
                raise DataError("add_block: partition codes must be one of 0, 1, 2 per document")
            codes = partition.astype(np.uint8).tobytes()
        else:
            codes = bytes([Partition.parse(partition).code]) * len(names)
        fresh: dict[str, str] = {}
        for name, label in zip(names, labels, strict=True):
            _check_storable_id(name, label)
            first = self._where.get(name) or fresh.get(name)
            if first is not None:
                raise DuplicateIdError(
                    f"duplicate document id={name!r}: first at {first}, repeated at {label}; document ids must be unique"
                )
            fresh[name] = label
        self._check_vocabulary(array, sizes, labels)
        self._write(array, "add_block")
        self._where.update(fresh)
        self._ids.extend(names)
        self._codes.extend(codes)
        ends = self._offsets[-1] + np.cumsum(sizes)
        self._offsets.extend(ends.tolist())

    def set_tokenizer(self, tokenizer: Tokenizer | Mapping[str, Any] | None) -> None:
        """Record *tokenizer* (a `Tokenizer` or its ``describe()`` dict) in the header; documents added next must fit it."""
        self.tokenizer = dict(tokenizer.describe() if isinstance(tokenizer, Tokenizer) else tokenizer) if tokenizer else None

    def _check_vocabulary(self, array: npt.NDArray[Any], lengths: npt.NDArray[np.int64], labels: list[str]) -> None:
        if self.tokenizer is not None and isinstance(self.tokenizer.get("vocab_size"), int):
            check_vocabulary(array, lengths, labels, self.tokenizer["vocab_size"], str(self.tokenizer.get("name")))

    def mark(self) -> tuple[int, int, str]:
        """A point to `rollback` to (e.g. the start of an input file)."""
        return len(self._ids), self._max, self._stage.name

    def rollback(self, mark: tuple[int, int, str]) -> None:
        """Discard every document added after *mark* (and a widening they caused)."""
        count, top, stage = mark
        for name in self._ids[count:]:
            del self._where[name]
        del self._ids[count:]
        del self._codes[count:]
        del self._offsets[count + 1 :]
        self._max = top
        with self._writing():
            self._tokens.flush()
            if self._stage.name != stage:  # every id kept fits the narrower staging dtype again
                self._restage(np.dtype(stage).newbyteorder("<"))
            self._tokens.truncate(self._offsets[-1] * self._stage.itemsize)
            self._tokens.seek(0, os.SEEK_END)

    def _write(self, array: npt.NDArray[Any], label: str) -> None:
        if not array.size:
            return
        top = int(array.max())
        if self._fixed is not None and top > np.iinfo(self._fixed).max:
            raise DataError(f"{label}: token id {top} does not fit the store's dtype {self._fixed.name}")
        _step("add")
        with self._writing():
            if top > np.iinfo(self._stage).max:
                self._widen()
            self._max = max(self._max, top)
            np.ascontiguousarray(array, dtype=self._stage).tofile(self._tokens)

    def _widen(self) -> None:
        """Rewrite the uint16 tokens staged so far as uint32, once, when the first id >= 2**16 arrives."""
        self._restage(np.dtype("<u4"))

    def _restage(self, dtype: np.dtype[Any]) -> None:
        """Rewrite the staged tokens in *dtype* (widening, or narrowing back after a rollback)."""
        assert self._tmp is not None
        self._tokens.close()
        staged = self._tmp / TOKENS
        count = staged.stat().st_size // self._stage.itemsize
        source: Any = np.memmap(staged, dtype=self._stage, mode="r", shape=(count,)) if count else np.zeros(0, self._stage)
        with open(self._tmp / _WIDENING, "wb") as out:
            for lo in range(0, count, _READ):
                source[lo : lo + _READ].astype(dtype).tofile(out)
        del source
        os.replace(self._tmp / _WIDENING, staged)
        self._tokens = open(staged, "r+b")  # noqa: SIM115 - closed in commit/abort
        self._tokens.seek(0, os.SEEK_END)
        self._stage = dtype

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except OSError as err:  # name the user's store, not the temporary directory
            raise StoreError(
                f"{self.path}: cannot write the store ({err.strerror or err}); free space or choose another path"
            ) from err

    def commit(self) -> DocumentStore:
        """Finish the files, then put the store in place atomically; returns it opened."""
        assert self._tmp is not None
        tmp = self._tmp
        _step("finish")
        with self._writing():
            self._tokens.close()
            count = self._offsets[-1]
            np.asarray(self._offsets, dtype="<i8").tofile(tmp / OFFSETS)
            codes = np.frombuffer(bytes(self._codes), dtype=np.uint8)
            with _directory_fd(tmp) as dfd:
                tokens_fd = os.open(TOKENS, os.O_RDONLY, dir_fd=dfd)
                offsets_fd = os.open(OFFSETS, os.O_RDONLY, dir_fd=dfd)
                try:
                    fingerprint = _fingerprint(tokens_fd, offsets_fd, self._ids, codes)
                finally:
                    os.close(tokens_fd)
                    os.close(offsets_fd)
            header: dict[str, Any] = {
                "format": FORMAT,
                "version": VERSION,
                "dtype": self._stage.name,
                "token_count": count,
                "document_count": len(self._ids),
                "fingerprint": fingerprint,
            }
            if self.tokenizer is not None:
                header["tokenizer"] = self.tokenizer
            header.update({k: v for k, v in self.header.items() if k not in header})
            if len(self._ids) <= INLINE_DOCUMENTS and sum(map(len, self._ids)) <= INLINE_ID_CHARS:
                header["ids"] = self._ids
                header["partitions"] = [PARTITIONS[c].value for c in codes.tolist()]
            else:
                _step("ids")
                with open(tmp / IDS, "w", encoding="utf-8") as handle:
                    handle.writelines(json.dumps(i) + "\n" for i in self._ids)
                codes.tofile(tmp / PARTITIONS_FILE)
                header["ids_file"] = IDS
                header["partitions_file"] = PARTITIONS_FILE
            _step("fsync")
            for name in os.listdir(tmp):
                _fsync(tmp / name)
            _step("header")
            with open(tmp / HEADER, "w", encoding="utf-8") as handle:  # last: a store is complete once it has one
                json.dump(header, handle, indent=1)
                handle.write("\n")
            _fsync(tmp / HEADER)
            _fsync(tmp)
            with _directory_fd(tmp) as dfd:  # open before the swap: ours even if another writer replaces it at once
                store = _open_at(dfd, self.path, verify=False)
            _step("replace")
            _replace(tmp, self.path)
        self._done = True
        return store

    def abort(self) -> None:
        """Discard everything written so far."""
        self._done = True
        with contextlib.suppress(OSError):
            self._tokens.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _valid_tokens(tokens: Any, label: str) -> npt.NDArray[Any]:
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4:
        return tokens  # uint8/16/32 arrays are valid as they are
    return check_tokens(tokens, label)


def _check_storable_id(doc_id: Any, label: str) -> None:
    check_id(doc_id, label)
    try:
        doc_id.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(
            f"{label}: id={doc_id!r} holds a lone surrogate at position {err.start}; a stored id must be valid Unicode text"
        ) from None


def _make_parents(parent: Path) -> None:
    """``parent.mkdir(parents=True)``; a file in the way is named (mkdir would only say 'File exists')."""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        blocker = next((p for p in (parent, *parent.parents) if os.path.lexists(p) and not p.is_dir()), parent)
        raise NotADirectoryError(errno.ENOTDIR, f"{blocker} is not a directory") from err


def _make_directory(parent: Path, prefix: str) -> Path:
    """A new directory ``parent/prefix + 8 hex digits``, mode 0o777 less the umask (mkdtemp's is 0o700)."""
    while True:
        candidate = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(candidate, 0o777)
        except FileExistsError:
            continue
        return candidate


@contextlib.contextmanager
def _directory_fd(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_store(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and os.path.isfile(path / HEADER)
    except OSError:
        return False


def _check_target(path: Path, overwrite: bool) -> None:
    if os.path.lexists(path):
        if not _is_store(path):
            raise StoreError(f"{path}: exists and is not a streambatch store; choose a new output path")
        if not overwrite:
            raise StoreError(f"{path}: a store already exists; remove it or allow overwriting")


# renameat2(2) flags and the "current directory" fd, from <linux/fs.h> and <fcntl.h>
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100


def _load_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.3
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2_function = _load_renameat2()


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    """renameat2(source, target, flags): True when done, False when unavailable here (then fall back).

    Unavailable: no such libc function, or the kernel or filesystem refuses the flag
    (ENOSYS, EINVAL, EOPNOTSUPP).  Other failures raise the matching OSError.
    """
    function = _renameat2_function
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(target))


def _replace(tmp: Path, path: Path) -> None:
    """Put the finished store directory *tmp* at *path*; *tmp* is gone afterwards.

    No store at *path*: ``renameat2(RENAME_NOREPLACE)`` (or ``rename``).  A store
    there: ``renameat2(RENAME_EXCHANGE)`` swaps the two directories in one atomic
    step (readers see the old store or the new one, never neither), then the old
    one, now at *tmp*, is removed.  Only where renameat2 is unavailable: the old
    store is renamed aside, the new one into place, and the old one removed — a
    kill between those two renames leaves no store at *path*.  Concurrent writers
    race by retrying: the last swap wins and nobody fails.
    """
    for _ in range(1000):  # repeats only while concurrent writers keep creating and removing the target
        if not os.path.lexists(path):
            try:
                if not _renameat2(tmp, path, _RENAME_NOREPLACE):
                    os.rename(tmp, path)  # refuses a non-empty directory at path: then we swap with it below
            except OSError as err:
                if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue
                raise
            _step("placed")
            break
        _check_target(path, True)
        try:
            exchanged = _renameat2(tmp, path, _RENAME_EXCHANGE)
        except FileNotFoundError:
            continue  # removed between our check and the swap (a fallback writer): place ours
        if exchanged:
            if not _is_store(tmp):  # a non-store appeared at path after the check: put it back, touch nothing
                _renameat2(tmp, path, _RENAME_EXCHANGE)
                raise StoreError(f"{path}: exists and is not a streambatch store; choose a new output path")
            _step("exchanged")
            shutil.rmtree(tmp, ignore_errors=True)
            break
        old = _make_name(path.parent, f".{path.name}.old-{os.getpid()}-")
        try:
            os.rename(path, old)
        except FileNotFoundError:
            continue
        _step("moved-aside")
        try:
            os.rename(tmp, path)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another writer put its store there first
                shutil.rmtree(old, ignore_errors=True)
                continue
            raise
        _step("placed")
        shutil.rmtree(old, ignore_errors=True)
        break
    else:
        raise StoreError(f"{path}: other writers kept replacing the store; write it again when they are done")
    _step("removed")
    with contextlib.suppress(OSError):
        _fsync(path.parent)


def _make_name(parent: Path, prefix: str) -> Path:
    return parent / f"{prefix}{secrets.token_hex(4)}"


def _remove_stale_temporaries(path: Path) -> None:
    """Remove what killed writers of this target left: ``.NAME.partial-PID-*`` and ``.NAME.old-PID-*`` of dead pids."""
    parent = path.parent
    for kind in ("partial", "old"):
        marker = f".{kind}-"
        for entry in parent.glob(f".{glob.escape(path.name)}{marker}*"):
            try:
                pid = int(entry.name.rsplit(marker, 1)[1].split("-", 1)[0])
                if pid <= 0:
                    continue
                os.kill(pid, 0)
            except (ValueError, IndexError):
                continue
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except PermissionError:  # alive, another user's
                continue


def write_store(
    path: str | os.PathLike[str],
    documents: DocumentStore | Iterable[Document],
    *,
    tokenizer: Tokenizer | Mapping[str, Any] | None = None,
) -> DocumentStore:
    """Write documents (or an in-memory store) to *path* atomically; returns the opened store.

    *tokenizer* (what made the tokens) is recorded in the header; every token must fit its vocabulary.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(
            f"path={short_repr(path)} is not a path; the order is write_store(path, documents) "
            "(prepare_store takes (inputs, output))"
        )
    with StoreWriter(path, tokenizer=tokenizer) as writer:
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


class _Missing(Exception):
    """A store file was not there (raised inside one open attempt; the caller decides what it means)."""

    def __init__(self, name: str, err: OSError) -> None:
        super().__init__(name)
        self.name = name
        self.err = err


def open_store(path: str | os.PathLike[str], *, verify: bool = True) -> DocumentStore:
    """Memory-map a store read-only after checking it; every failure is a `StoreError`.

    Checks: the header (format, version, dtype, counts), file sizes against the
    header, offsets (within the tokens, start at 0, non-decreasing, end at the
    token count), ids and partitions, and with *verify* (the default) the content
    fingerprint, which reads every byte once.  All files are opened relative to
    one open directory, so they belong to one version of the store even while a
    writer replaces it; an open that loses its version to a replace starts over.
    """
    root = Path(path)
    for _ in range(_OPEN_ATTEMPTS):
        try:
            dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            raise StoreError(
                f"{root}: not a streambatch store ({HEADER} is missing); run `streambatch prepare` to build one"
            ) from None
        except OSError as err:
            raise StoreError(
                f"{root}: cannot open the store ({err.strerror or err}); check the path and its permissions"
            ) from err
        try:
            return _open_at(dfd, root, verify)
        except _Missing as missing:
            if _still_at(dfd, root):  # really missing, not removed by a concurrent replace
                if missing.name == HEADER:
                    raise StoreError(
                        f"{root}: not a streambatch store ({HEADER} is missing); run `streambatch prepare` to build one"
                    ) from None
                raise StoreError(
                    f"{root / missing.name}: missing ({missing.err.strerror}); the store is incomplete; prepare it again"
                ) from None
        finally:
            os.close(dfd)
    raise StoreError(f"{root}: the store was replaced {_OPEN_ATTEMPTS} times while it was being opened; open it again")


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
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError as err:
        raise _Missing(name, err) from None
    except OSError as err:
        raise StoreError(f"{root / name}: cannot open ({err.strerror or err}); prepare the store again") from err
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise StoreError(f"{root / name}: not a regular file; prepare the store again")
    return handle


def _open_at(dfd: int, root: Path, verify: bool) -> DocumentStore:
    header_path = root / HEADER
    with _open_file(dfd, HEADER, root) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > HEADER_LIMIT:
            raise StoreError(
                f"{header_path}: {size} bytes, more than a header may have (64 MiB); this is not a streambatch store"
            )
        try:
            data = handle.read(HEADER_LIMIT + 1)
        except OSError as err:
            raise StoreError(f"{header_path}: unreadable header ({err.strerror or err}); prepare the store again") from err
    if len(data) > HEADER_LIMIT:
        raise StoreError(f"{header_path}: more than 64 MiB, more than a header may have; this is not a streambatch store")
    header = decode_json(data, f"{header_path}: unreadable header", "the store header (prepare it again)", error=StoreError)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoreError(f"{header_path}: format is not {FORMAT!r}; this is not a streambatch store")
    version = header.get("version")
    if type(version) is not int or version != VERSION:
        raise StoreError(f"{header_path}: version={short_repr(version)} is not supported (this streambatch reads {VERSION})")
    dtype = _DTYPES.get(header["dtype"]) if isinstance(header.get("dtype"), str) else None
    if dtype is None:
        raise StoreError(f"{header_path}: dtype={short_repr(header.get('dtype'))} must be 'uint16' or 'uint32'")
    tokens_count = _count(header, "token_count", header_path)
    docs_count = _count(header, "document_count", header_path)
    fingerprint = header.get("fingerprint")
    if not isinstance(fingerprint, str):
        raise StoreError(f"{header_path}: fingerprint={short_repr(fingerprint)} must be a string; prepare the store again")
    with contextlib.ExitStack() as files:
        # every file is opened before anything is read: all of them belong to the version the header came from
        tokens_file = files.enter_context(_open_file(dfd, TOKENS, root))
        offsets_file = files.enter_context(_open_file(dfd, OFFSETS, root))
        listed = _listed_files(header, header_path)
        extra = [files.enter_context(_open_file(dfd, name, root)) for name in listed]
        _check_size(tokens_file, root / TOKENS, tokens_count * dtype.itemsize, f"{tokens_count} tokens of {dtype.name}")
        _check_size(offsets_file, root / OFFSETS, (docs_count + 1) * 8, f"{docs_count + 1} int64 offsets")
        offsets = np.fromfile(offsets_file, dtype="<i8")
        try:
            offsets = check_offsets(offsets, tokens_count, "offsets")
        except DataError as err:
            raise StoreError(f"{root / OFFSETS}: {err}") from err
        ids, codes = _read_documents(root, header, header_path, docs_count, extra)
        if verify:
            actual = _fingerprint(tokens_file.fileno(), offsets_file.fileno(), ids, codes)
            if actual != fingerprint:
                raise StoreError(
                    f"{root}: fingerprint mismatch (header {short_repr(fingerprint)}, content {actual!r}); "
                    "the store's files were changed or corrupted; prepare it again"
                )
        tokens: Any = np.zeros(0, dtype=dtype)
        if tokens_count:
            tokens = np.memmap(tokens_file, dtype=dtype, mode="r", shape=(tokens_count,))
            tokens.filename = os.path.abspath(root / TOKENS)  # pickles by name (see DocumentStore.__reduce__)
            stat = os.fstat(tokens_file.fileno())
            tokens.identity = (stat.st_dev, stat.st_ino)  # reopened only if unchanged
    tokenizer = header.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, dict):
        raise StoreError(f"{header_path}: tokenizer={short_repr(tokenizer)} must be an object (name, vocab_size, ...) or absent")
    return DocumentStore._frozen(tokens, offsets[:-1].copy(), np.diff(offsets), tuple(ids), codes, fingerprint, tokenizer)


def _listed_files(header: dict[str, Any], header_path: Path) -> list[str]:
    if "ids_file" not in header:
        return []
    if header.get("ids_file") != IDS or header.get("partitions_file") != PARTITIONS_FILE:
        raise StoreError(
            f"{header_path}: ids_file={short_repr(header.get('ids_file'))} and partitions_file="
            f"{short_repr(header.get('partitions_file'))} must be {IDS!r} and {PARTITIONS_FILE!r}; prepare the store again"
        )
    return [IDS, PARTITIONS_FILE]


def _count(header: dict[str, Any], name: str, header_path: Path) -> int:
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StoreError(f"{header_path}: {name}={short_repr(value)} must be a non-negative int")
    return value


def _check_size(handle: IO[bytes], path: Path, expected: int, what: str) -> None:
    actual = os.fstat(handle.fileno()).st_size
    if actual != expected:
        state = "truncated" if actual < expected else "longer than the header says"
        raise StoreError(
            f"{path}: size {actual} bytes but the header describes {what} ({expected} bytes): {state}; prepare the store again"
        )


def _read_documents(
    root: Path, header: dict[str, Any], header_path: Path, count: int, files: list[IO[bytes]]
) -> tuple[list[str], npt.NDArray[np.uint8]]:
    if files:
        ids_file, parts_file = files
        ids_path = root / IDS
        try:
            data = ids_file.read()
        except OSError as err:
            raise StoreError(f"{ids_path}: unreadable ids ({err.strerror or err}); prepare the store again") from err
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        if len(lines) != count:
            raise StoreError(f"{ids_path}: {len(lines)} ids but document_count={count}; prepare the store again")
        ids = [
            decode_string(line, f"{ids_path}:{number}", "a document id", error=StoreError)
            for number, line in enumerate(lines, start=1)
        ]
        _check_size(parts_file, root / PARTITIONS_FILE, count, f"{count} partition codes")
        codes = np.fromfile(parts_file, dtype=np.uint8)
        where = ids_path
    else:
        inline_ids = header.get("ids")
        parts = header.get("partitions")
        if not isinstance(inline_ids, list) or not isinstance(parts, list) or len(parts) != len(inline_ids):
            raise StoreError(f"{header_path}: ids and partitions must be lists of equal length")
        ids = inline_ids
        if len(ids) != count:
            raise StoreError(f"{header_path}: {len(ids)} ids but document_count={count}; prepare the store again")
        try:
            codes = np.array([Partition.parse(p, f"document index {i}").code for i, p in enumerate(parts)], dtype=np.uint8)
        except DataError as err:
            raise StoreError(f"{header_path}: {err}") from err
        where = header_path
    if codes.size and int(codes.max()) >= len(PARTITIONS):
        raise StoreError(f"{where}: partition code {int(codes.max())} is not 0, 1 or 2")
    try:
        for index, value in enumerate(ids):
            check_id(value, f"document index {index}")
        check_unique(ids, [f"document index {i}" for i in range(count)])
    except DataError as err:
        raise StoreError(f"{where}: {err}") from err
    return ids, codes
