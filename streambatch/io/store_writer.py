"""Write a store: `StoreWriter` streams documents into a temporary directory and puts it in place atomically.

Everything is written into ``.NAME.partial-PID-XXXXXXXX`` beside the target and
put in place last (`streambatch.io.replace`): a kill at any moment leaves the
complete old store or the complete new one (or, only where renameat2 is
unavailable, the old one under a ``.old-`` name).  Every new writer of a target
first removes the temporaries of writers that no longer run.  Directories and
files are created with modes 0o777 / 0o666 less the umask.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import ConfigError, DataError, StoreError
from ..model.documents import PARTITIONS, Document, Partition
from ..model.mask import check_loss_mask
from ..model.source import is_source
from ..model.store import DocumentStore
from ..model.validate import check_id, check_tokens, check_vocabulary
from .atomic import create_temporary_directory, fsync_path, partial_prefix, remove_stale_temporaries
from .document_log import DocumentLog, Mark
from .files import short_path
from .replace import replace_directory
from .store_header import (
    DTYPES,
    HEADER,
    IDS,
    OFFSETS,
    PARTITIONS_FILE,
    TOKENS,
    fingerprint_files,
    ids_inline,
    is_store,
    new_header,
)
from .store_mask import LOSS_MASK, MaskStage, mask_header
from .store_reader import open_store_at

_READ = 1 << 24
_WIDENING = "tokens.widening"
_NOT_A_STORE = "exists and is not a streambatch store; choose a new output path"

#: Test hook: when set, called with a step name before each step of a write (tests kill the process there).
step_hook: Callable[[str], None] | None = None


def _step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


class Described(Protocol):
    """What made the tokens, as a store header records it (a `streambatch.read.text.tokenizers.Tokenizer`)."""

    def describe(self) -> dict[str, Any]: ...


class StoreWriter:
    """Stream documents into a new store; `commit` puts it in place atomically.

    Use as a context manager: an exception (or a kill) before `commit` leaves no
    store, or the previous one untouched.  A symlink at *path* is followed: the
    directory it points to is replaced, the link is kept.  *tokenizer* (its
    ``describe()`` dict, or anything with ``describe()``, e.g. a `Tokenizer`) is
    recorded in the header, and every token must fit its ``vocab_size``; *header*
    adds entries to the header.

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
        tokenizer: Described | Mapping[str, Any] | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer: dict[str, Any] | None = None
        self.set_tokenizer(tokenizer)
        self.header = dict(header or {})
        target = Path(path)
        self.path = Path(os.path.realpath(target)) if target.is_symlink() else target
        self._where = short_path(self.path)  # what errors name: the store being written
        _check_target(self.path, overwrite)
        self._fixed = None if dtype is None else np.dtype(dtype)
        if self._fixed is not None and self._fixed.name not in DTYPES:
            raise StoreError(f"dtype={self._fixed.name} is not supported; use uint16 or uint32")
        # tokens are staged in the final dtype: uint16 until an id needs more (then widened once), so a
        # killed writer's staging file is never larger than the store it was writing
        self._stage: np.dtype[Any] = (self._fixed or np.dtype(np.uint16)).newbyteorder("<")
        parent = self.path.parent
        self._tmp: Path | None = None
        try:
            _make_parents(parent)
            for kind in ("partial", "old"):  # what killed writers of this target left
                remove_stale_temporaries(parent, partial_prefix(self.path, kind))
            self._tmp = create_temporary_directory(parent, partial_prefix(self.path))
            self._tokens: IO[bytes] = open(self._tmp / TOKENS, "wb")  # noqa: SIM115 - closed in commit/abort
            self._log = DocumentLog(self._tmp)  # ids, codes, offsets: on disk as they come, not in memory
            self._mask = MaskStage(self._tmp)  # the loss mask, once a document brings one
        except OSError as err:
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            raise StoreError(
                f"{short_path(self.path)}: cannot create the store ({err.strerror or err}); choose a writable output path"
            ) from err
        self._max = -1
        self._done = False

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.abort()

    def add(self, doc_id: str, partition: Partition | str, tokens: Any, *, where: str = "", loss_mask: Any = None) -> None:
        """Append one document (validated like `Document`; *loss_mask*: one bool per token, or None)."""
        label = where or f"document id={doc_id!r}"
        _check_storable_id(doc_id, label)
        hashes = self._log.check([doc_id], [label])
        code = Partition.parse(partition, label).code
        array = _valid_tokens(tokens, label)
        mask = None if loss_mask is None else check_loss_mask(loss_mask, array.size, label)
        self._check_vocabulary(array, np.array([array.size]), [label])
        self._write(array, label)
        with self._writing():
            self._mask.add(mask, array.size, self._log.tokens)
            self._log.append([doc_id], [label], bytes([code]), np.array([array.size], np.int64), hashes)

    def add_block(
        self,
        tokens: npt.NDArray[Any],
        lengths: Iterable[int],
        ids: Iterable[str],
        partition: Partition | str | npt.NDArray[np.uint8],
        *,
        wheres: Sequence[str] | None = None,
        loss_mask: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        """Append many documents at once: flat *tokens* split by *lengths* (the fast path of `prepare_store`).

        *partition* is one for all documents or an array of partition codes, one per
        document; *wheres* name each document in errors; *loss_mask* is one bool per
        token (flat, like *tokens*), or None.  Nothing is added if any check fails.
        """
        try:
            sizes = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
        except (TypeError, ValueError, OverflowError) as err:
            raise DataError(f"{self._where}: lengths are not integers in int64 ({err}); pass one length per document") from None
        names = list(ids)
        array = _valid_tokens(tokens, self._where)
        if wheres is not None and len(wheres) != len(names):
            raise DataError(f"{self._where}: {len(wheres)} wheres for {len(names)} ids; pass one where per document")
        if sizes.ndim != 1 or sizes.size != len(names) or (sizes.size and int(sizes.min()) < 0) or int(sizes.sum()) != array.size:
            raise DataError(f"{self._where}: lengths, ids and tokens disagree; pass one length >= 0 and one id per document")
        labels = (
            [f"{w} (document id={i!r})" for i, w in zip(names, wheres, strict=True)] if wheres else [self._where] * len(names)
        )
        if isinstance(partition, np.ndarray):
            if partition.shape != (len(names),) or (partition.size and int(partition.max()) >= len(PARTITIONS)):
                raise DataError(f"{self._where}: partition codes must be one of 0, 1, 2 per document")
            codes = partition.astype(np.uint8).tobytes()
        else:
            codes = bytes([Partition.parse(partition).code]) * len(names)
        for name, label in zip(names, labels, strict=True):
            _check_storable_id(name, label)
        hashes = self._log.check(names, labels)
        mask = None if loss_mask is None else check_loss_mask(loss_mask, array.size, self._where)
        self._check_vocabulary(array, sizes, labels)
        self._write(array, self._where)
        with self._writing():
            self._mask.add(mask, array.size, self._log.tokens)
            self._log.append(names, labels, codes, sizes, hashes)

    def set_tokenizer(self, tokenizer: Described | Mapping[str, Any] | None) -> None:
        """Record *tokenizer* (its ``describe()`` dict, or a `Tokenizer`) in the header; documents added next must fit it."""
        if tokenizer is None or isinstance(tokenizer, Mapping):
            self.tokenizer = dict(tokenizer) if tokenizer else None
        else:
            self.tokenizer = dict(tokenizer.describe())

    def _check_vocabulary(self, array: npt.NDArray[Any], lengths: npt.NDArray[np.int64], labels: list[str]) -> None:
        if self.tokenizer is not None and isinstance(self.tokenizer.get("vocab_size"), int):
            check_vocabulary(array, lengths, labels, self.tokenizer["vocab_size"], str(self.tokenizer.get("name")))

    def mark(self) -> tuple[Mark, int, str, bool]:
        """A point to `rollback` to (e.g. the start of an input file)."""
        return self._log.mark(), self._max, self._stage.name, self._mask.mark()

    def rollback(self, mark: tuple[Mark, int, str, bool]) -> None:
        """Discard every document added after *mark* (and a widening they caused)."""
        log, top, stage, masked = mark
        self._max = top
        with self._writing():
            self._log.rollback(log)
            self._mask.rollback(masked, self._log.tokens)
            self._tokens.flush()
            if self._stage.name != stage:  # every id kept fits the narrower staging dtype again
                self._restage(np.dtype(stage).newbyteorder("<"))
            self._tokens.truncate(self._log.tokens * self._stage.itemsize)
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
            _write_array(self._tokens, np.ascontiguousarray(array, dtype=self._stage))

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
                _write_array(out, source[lo : lo + _READ].astype(dtype))
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
                f"{short_path(self.path)}: cannot write the store ({err.strerror or err}); free space or choose another path"
            ) from err

    def commit(self) -> DocumentStore:
        """Finish the files, then put the store in place atomically; returns it opened."""
        assert self._tmp is not None
        tmp = self._tmp
        _step("finish")
        with self._writing():
            self._tokens.close()
            count = self._log.tokens
            codes, few = self._log.finish()  # ids.jsonl, partitions.bin and offsets.bin are written
            ids: Sequence[str] = few if few is not None else _Count(self._log.count)
            targets = self._mask.finish(np.fromfile(tmp / OFFSETS, dtype="<i8")) if self._mask.active else None
            with _directory_fd(tmp) as dfd:
                fds = [os.open(name, os.O_RDONLY, dir_fd=dfd) for name in (TOKENS, OFFSETS)]
                if targets is not None:
                    fds.append(os.open(LOSS_MASK, os.O_RDONLY, dir_fd=dfd))
                try:
                    fingerprint = fingerprint_files(fds[0], fds[1], ids, codes, id_lines=self._log.id_lines(), mask_fd=fds[2:])
                finally:
                    for fd in fds:
                        os.close(fd)
            extra = self.header if targets is None else {**self.header, "loss_mask": mask_header(targets)}
            header = new_header(self._stage, count, ids, codes, fingerprint, self.tokenizer, extra)
            _step("ids")
            if ids_inline(ids):  # in the header instead
                (tmp / IDS).unlink()
                (tmp / PARTITIONS_FILE).unlink()
            _step("fsync")
            for name in os.listdir(tmp):
                fsync_path(tmp / name)
            _step("header")
            with open(tmp / HEADER, "w", encoding="utf-8") as handle:  # last: a store is complete once it has one
                json.dump(header, handle, indent=1)
                handle.write("\n")
            fsync_path(tmp / HEADER)
            fsync_path(tmp)
            with _directory_fd(tmp) as dfd:  # open before the swap: ours even if another writer replaces it at once
                store = open_store_at(dfd, self.path, verify=False, check_ids=False)  # checked as they came
            _step("replace")
            replace_directory(tmp, self.path, replaceable=is_store, refusal=_NOT_A_STORE, step=_step)
        self._done = True
        return store

    def abort(self) -> None:
        """Discard everything written so far."""
        self._done = True
        with contextlib.suppress(OSError):
            self._tokens.close()
        if hasattr(self, "_log"):
            self._log.close()
            self._mask.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _write_array(handle: IO[bytes], array: npt.NDArray[Any]) -> None:
    """Write *array*'s bytes (a failed write is an `OSError` with its errno: numpy's ``tofile`` loses it)."""
    handle.write(np.ascontiguousarray(array).data.cast("B"))


class _Count(Sequence[str]):
    """A sequence of *count* ids that are not read (what `new_header` needs of many ids: their number)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: Any) -> Any:
        raise IndexError("the ids are in ids.jsonl")


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


@contextlib.contextmanager
def _directory_fd(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _check_target(path: Path, overwrite: bool) -> None:
    if os.path.lexists(path):
        if not is_store(path):
            raise StoreError(f"{short_path(path)}: {_NOT_A_STORE}")
        if not overwrite:
            raise StoreError(f"{short_path(path)}: a store already exists; remove it or allow overwriting")


def write_store(
    path: str | os.PathLike[str],
    documents: DocumentStore | Iterable[Document],
    *,
    tokenizer: Described | Mapping[str, Any] | None = None,
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
        if is_source(documents):  # a store or a corpus: each shard's arrays, no Document made
            i = 0
            for shard in documents.shards:
                masked = shard.has_loss_mask
                for local in range(len(shard)):
                    start, length = int(shard.starts[local]), int(shard.lengths[local])
                    writer.add(
                        shard.ids[local],
                        shard.partition(local),
                        shard.tokens[start : start + length],
                        where=f"document index {i}",
                        loss_mask=shard.loss_mask(local) if masked else None,
                    )
                    i += 1
        else:
            for i, doc in enumerate(documents):
                writer.add(doc.id, doc.partition, doc.tokens, where=f"document index {i}", loss_mask=doc.loss_mask)
        return writer.commit()
