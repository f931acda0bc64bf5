"""Write Megatron's ``.bin``/``.idx`` or datatrove's ``.ds``/``.ds.index``(/``.ds.loss``) from any documents.

`FormatWriter` takes documents the way `streambatch.io.store.StoreWriter`
does (``add_block``, ``mark``/``rollback``, ``set_tokenizer``, ``commit``), so
`streambatch.prepare_store` writes either format from every input it reads.
Tokens are staged in a temporary file beside the target (``.NAME.partial-PID-
XXXXXXXX``, the atomic writer's names) in the dtype the output will have; at
``commit`` the index is written to a temporary too, both are fsynced, then
renamed into place, the data file first and the index last: no reader finds an
index whose data is not whole, and a failed run leaves the previous files (or
none), never a partial one.  The two formats are pairs of plain files, so a
replace cannot be one rename: an old index is moved aside (durably) before the
new data goes in, and put back if that rename fails; a run killed between the
renames leaves the new files or no index (opening then names the missing
file: run again), never an old index over new data.

The dtype is what Megatron's ``preprocess_data.py`` gives
``IndexedDatasetBuilder`` (``DType.optimal_dtype(vocab_size)``): uint16 below
65,500 ids, int32 otherwise, with the tokenizer's vocabulary size when one is
known, else the largest id + 1.  The files are then byte-identical to the
builder's for the same documents (one sequence per document, document indices
``0, 1, ..., N``).  datatrove's token size is 2 bytes up to 65,536 ids, else 4.
Neither format holds ids or partitions: the documents become ``"0", "1", ...``,
and a document outside the train partition is refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, DataError, StoreError
from ...model.documents import PARTITIONS, Partition
from ...model.source import as_source
from ...model.store import DocumentStore
from ...model.validate import check_tokens, check_vocabulary
from ..atomic import create_temporary_file, fsync_path, partial_prefix, remove_stale_temporaries, temporary_name
from ..files import short_path
from .datatrove import INDEX, LOSS, SUFFIX, open_datatrove
from .indexed_store import IndexedStore, document_tokens
from .megatron import index_header, megatron_paths, open_megatron, optimal_dtype

FORMATS = ("megatron", "datatrove")
_BLOCK = 1 << 22  # entries per write: bounded temporaries
_INT32_MAX = (1 << 31) - 1
_LIMITS = {"megatron": _INT32_MAX, "datatrove": (1 << 32) - 1}  # the largest id of int32 and uint32 tokens


def output_paths(path: str | os.PathLike[str], format: str) -> tuple[str, ...]:  # noqa: A002 - the CLI's --format
    """The files *format* writes for *path*: ``(data, index)``, plus ``.ds.loss`` for datatrove.

    >>> output_paths("out/corpus", "megatron"), output_paths("out/corpus", "datatrove")[0]
    (('out/corpus.bin', 'out/corpus.idx'), 'out/corpus.ds')
    """
    name = os.fspath(path)
    if format == "megatron":
        return megatron_paths(name)
    if format == "datatrove":
        data = name if name.endswith(SUFFIX) else name + SUFFIX
        return data, data + INDEX, data + LOSS
    raise ConfigError(f"format={format!r} is not one of {', '.join(FORMATS)} (or 'streambatch')")


class FormatWriter:
    """Stream documents into Megatron's or datatrove's files; `commit` puts them in place (index last).

    >>> import tempfile, pathlib
    >>> prefix = pathlib.Path(tempfile.mkdtemp()) / "corpus"
    >>> with FormatWriter(prefix, "megatron") as writer:
    ...     writer.add_block(np.array([0, 10, 11, 1, 0, 20, 1]), [4, 3], ["a", "b"], "train")
    ...     store = writer.commit()
    >>> store.ids[:], store.lengths.tolist(), store.tokens.dtype.name
    (('0', '1'), [4, 3], 'uint16')
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        format: str,  # noqa: A002 - the CLI's --format
        *,
        tokenizer: Any = None,
        vocab_size: int | None = None,
        masked: bool = False,
    ) -> None:
        self.format = format
        self.paths = output_paths(path, format)
        self._where = short_path(self.paths[0])  # what errors name: the file being written
        self.tokenizer: dict[str, Any] | None = None
        self._lengths: list[npt.NDArray[np.int64]] = []
        if masked and format != "datatrove":
            raise ConfigError(f"masked=True: {format} files hold no loss mask; write datatrove files to keep it")
        self._masks: list[npt.NDArray[np.bool_]] | None = [] if masked else None  # .ds.loss is written when not None
        self._documents = self._tokens = 0
        self._max = -1
        self._vocab = vocab_size
        self._fixed = vocab_size is not None
        self._stage = self._dtype_for(vocab_size - 1 if vocab_size is not None else -1)
        self.set_tokenizer(tokenizer)
        self._done = False
        data = self.paths[0]
        folder = os.path.dirname(os.path.abspath(data))
        try:
            os.makedirs(folder, exist_ok=True)
            for target in self.paths:
                remove_stale_temporaries(folder, partial_prefix(target))
            fd, self._staged = create_temporary_file(folder, partial_prefix(data))
        except OSError as err:
            raise StoreError(
                f"{short_path(data)}: cannot create it ({err.strerror or err}); choose a writable output path"
            ) from err
        self._file: IO[bytes] = os.fdopen(fd, "r+b")
        self._temporaries = [self._staged]

    def __enter__(self) -> FormatWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._done:
            self.abort()

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Record *tokenizer* (a ``describe()`` dict or a `Tokenizer`); its ``vocab_size`` decides the dtype if given first."""
        if tokenizer is None:
            return
        described = dict(tokenizer) if isinstance(tokenizer, Mapping) else dict(tokenizer.describe())
        self.tokenizer = described
        if self._vocab is None and isinstance(described.get("vocab_size"), int) and not self._documents:
            self._vocab = int(described["vocab_size"])
            self._fixed = True
            self._stage = self._dtype_for(self._vocab - 1)

    def _dtype_for(self, top: int) -> np.dtype[Any]:
        if self.format == "megatron":
            return optimal_dtype(top + 1)
        return np.dtype("<u2" if top < 1 << 16 else "<u4")

    def add_block(
        self,
        tokens: Any,
        lengths: Iterable[int],
        ids: Iterable[str],
        partition: Partition | str | npt.NDArray[np.uint8],
        *,
        wheres: Sequence[str] | None = None,
        loss_mask: Any = None,
    ) -> None:
        """Append documents: flat *tokens* split by *lengths* (ids are not kept: neither format holds them).

        *loss_mask* (datatrove only) is one bool per token, for every block or none.
        Nothing is added if a check fails.
        """
        names = list(ids)
        sizes = np.asarray(lengths if isinstance(lengths, np.ndarray) else list(lengths), dtype=np.int64)
        small = isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind == "u" and tokens.dtype.itemsize <= 4
        array = tokens if small else check_tokens(tokens, self._where)  # uint8/16/32 arrays are valid as they are
        if sizes.ndim != 1 or sizes.size != len(names) or (sizes.size and int(sizes.min()) < 0) or int(sizes.sum()) != array.size:
            raise DataError(f"{self._where}: lengths, ids and tokens disagree; pass one length >= 0 and one id per document")
        labels = [
            f"{w} (document id={i!r})" if wheres else f"document id={i!r}" for i, w in zip(names, wheres or names, strict=True)
        ]
        codes = partition if isinstance(partition, np.ndarray) else np.full(len(names), Partition.parse(partition).code)
        outside = np.flatnonzero(codes != Partition.TRAIN.code)
        if outside.size:
            raise DataError(
                f"{labels[int(outside[0])]}: in partition {PARTITIONS[int(codes[outside[0]])].value!r}; {self.format} "
                "files hold no partitions: prepare each partition into files of its own"
            )
        if self.format == "megatron" and sizes.size and int(sizes.max()) > _INT32_MAX:
            raise DataError(f"{labels[int(np.argmax(sizes))]}: {int(sizes.max())} tokens; a Megatron sequence holds < 2**31")
        self._check_mask(loss_mask, array.size)
        if self.tokenizer is not None and isinstance(self.tokenizer.get("vocab_size"), int):
            check_vocabulary(array, sizes, labels, self.tokenizer["vocab_size"], str(self.tokenizer.get("name")))
        top = int(array.max()) if array.size else -1
        if top > _LIMITS[self.format]:
            at = int(np.argmax(array > _LIMITS[self.format]))
            document = int(np.searchsorted(np.cumsum(sizes), at, side="right"))
            raise DataError(
                f"{labels[document]}: token id {top} does not fit {self.format}'s widest dtype (ids <= {_LIMITS[self.format]})"
            )
        if self._fixed and top > np.iinfo(self._stage).max:
            raise DataError(f"{self._where}: token id {top} does not fit {self._stage.name} (vocab_size={self._vocab})")
        with self._writing():
            if not self._fixed and self._dtype_for(max(top, self._max)) != self._stage:
                self._restage(self._dtype_for(max(top, self._max)))
            self._file.write(np.ascontiguousarray(array, dtype=self._stage).data.cast("B"))
        self._max = max(self._max, top)
        self._lengths.append(sizes)
        if loss_mask is not None:
            self._masks = self._masks if self._masks is not None else []
            self._masks.append(np.asarray(loss_mask, dtype=np.bool_))
        self._documents += sizes.size
        self._tokens += array.size

    def _check_mask(self, loss_mask: Any, count: int) -> None:
        if loss_mask is None:
            if self._masks is not None:
                raise DataError(f"{self._where}: this block has no loss mask but earlier ones had; pass one for every block")
            return
        if self.format != "datatrove":
            raise DataError(f"{self._where}: {self.format} files hold no loss mask; write datatrove files to keep it")
        if self._documents and self._masks is None:
            raise DataError(f"{self._where}: this block has a loss mask but earlier ones had none; pass one for every block")
        if np.shape(loss_mask) != (count,):
            raise DataError(f"{self._where}: loss_mask has shape {np.shape(loss_mask)}; pass one bool per token ({count})")

    def mark(self) -> tuple[int, int, int, int]:
        """A point to `rollback` to (e.g. the start of an input file)."""
        return len(self._lengths), self._documents, self._tokens, self._max

    def rollback(self, mark: tuple[int, int, int, int]) -> None:
        """Discard every document added after *mark* (and the wider dtype they caused)."""
        blocks, self._documents, self._tokens, self._max = mark
        del self._lengths[blocks:]
        if self._masks is not None:
            del self._masks[blocks:]
        with self._writing():
            if not self._fixed and self._dtype_for(self._max) != self._stage:
                self._restage(self._dtype_for(self._max), self._tokens)
            self._file.truncate(self._tokens * self._stage.itemsize)
            self._file.seek(0, os.SEEK_END)

    def _restage(self, dtype: np.dtype[Any], count: int | None = None) -> None:
        """Rewrite the staged tokens (the first *count*) in *dtype*: once per widening, or narrowing after a rollback."""
        self._file.flush()
        kept = self._tokens if count is None else count
        folder = os.path.dirname(self._staged)
        fd, other = create_temporary_file(folder, partial_prefix(self.paths[0]))
        self._temporaries.append(other)
        with os.fdopen(fd, "r+b") as out:
            for lo in range(0, kept, _BLOCK):
                self._file.seek(lo * self._stage.itemsize)
                piece = np.frombuffer(self._file.read(min(_BLOCK, kept - lo) * self._stage.itemsize), dtype=self._stage)
                out.write(piece.astype(dtype).data.cast("B"))
        self._file.close()
        os.replace(other, self._staged)
        self._temporaries.remove(other)
        self._file = open(self._staged, "r+b")  # noqa: SIM115 - closed in commit/abort
        self._file.seek(0, os.SEEK_END)
        self._stage = dtype

    @contextlib.contextmanager
    def _writing(self) -> Any:
        try:
            yield
        except OSError as err:  # the user's file, not the temporary
            raise StoreError(
                f"{short_path(self.paths[0])}: cannot write ({err.strerror or err}); free space or choose another path"
            ) from err

    def commit(self) -> IndexedStore:
        """Write the index, put the data file in place and then the index; returns the files opened."""
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        folder = os.path.dirname(self._staged)
        with self._writing():
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            index_fd, index_tmp = create_temporary_file(folder, partial_prefix(self.paths[1]))
            self._temporaries.append(index_tmp)
            with os.fdopen(index_fd, "wb") as index:
                if self.format == "megatron":
                    _write_megatron_index(index, lengths, self._stage)
                else:
                    _write_ends(index, lengths)
                index.flush()
                os.fsync(index.fileno())
            placed = [(self._staged, self.paths[0])]
            if self._masks is not None:
                loss_fd, loss_tmp = create_temporary_file(folder, partial_prefix(self.paths[2]))
                self._temporaries.append(loss_tmp)
                with os.fdopen(loss_fd, "wb") as loss:
                    for mask in self._masks:
                        loss.write(mask.astype(np.uint8).data.cast("B"))
                    loss.flush()
                    os.fsync(loss.fileno())
                placed.append((loss_tmp, self.paths[2]))
            placed.append((index_tmp, self.paths[1]))  # last: the files are complete once the index is in place
            self._place(placed, folder)
        self._done = True
        if self.format == "megatron":
            return open_megatron(self.paths[1])
        return open_datatrove(self.paths[0])

    def _place(self, placed: list[tuple[str, str]], folder: str) -> None:
        """Rename the temporaries *placed* onto their targets, the data first and the index last.

        A replace is several renames of plain files, so the old index goes aside first (and the move is made
        durable): killed part way, the folder holds the new files or the new data with no index, never an old
        index over new data.  If the data's rename fails, the old index comes back and the old files stand as
        they were; once the data is replaced, the old index (and an old mask the new files lack) is removed."""
        index = self.paths[1]
        aside = None
        if os.path.lexists(index):
            aside = os.fspath(temporary_name(folder, partial_prefix(index)))
            os.replace(index, aside)
            self._temporaries.append(aside)  # a failure past the data's rename removes it with the rest
            fsync_path(folder)
        data_tmp, data = placed[0]
        try:
            os.replace(data_tmp, data)
        except OSError:
            if aside is not None:
                os.replace(aside, index)
                self._temporaries.remove(aside)
            raise
        self._temporaries.remove(data_tmp)
        if self._masks is None and self.format == "datatrove" and os.path.lexists(self.paths[2]):
            os.unlink(self.paths[2])  # the old mask describes the old tokens
        for temporary, target in placed[1:]:
            os.replace(temporary, target)
            self._temporaries.remove(temporary)
        if aside is not None:
            os.unlink(aside)
            self._temporaries.remove(aside)
        fsync_path(folder)

    def abort(self) -> None:
        """Discard everything written so far."""
        self._done = True
        with contextlib.suppress(OSError):
            self._file.close()
        for temporary in self._temporaries:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _write_megatron_index(handle: IO[bytes], lengths: npt.NDArray[np.int64], dtype: np.dtype[Any]) -> None:
    """``IndexedDatasetBuilder``'s ``.idx``: header, int32 lengths, int64 byte pointers, int64 document indices."""
    count = int(lengths.size)
    handle.write(index_header(dtype, count, count))
    for lo in range(0, count, _BLOCK):
        handle.write(lengths[lo : lo + _BLOCK].astype("<i4").data.cast("B"))
    base = 0
    for lo in range(0, count, _BLOCK):
        block = lengths[lo : lo + _BLOCK] * dtype.itemsize
        pointers = np.empty(block.size, "<i8")
        pointers[0] = base
        np.cumsum(block[:-1], out=pointers[1:])
        pointers[1:] += base
        base += int(block.sum())
        handle.write(pointers.data.cast("B"))
    for lo in range(0, count + 1, _BLOCK):
        handle.write(np.arange(lo, min(lo + _BLOCK, count + 1), dtype="<i8").data.cast("B"))


def _write_ends(handle: IO[bytes], lengths: npt.NDArray[np.int64]) -> None:
    """datatrove's ``.ds.index``: each document's end, in tokens, as uint64."""
    base = 0
    for lo in range(0, int(lengths.size), _BLOCK):
        ends = np.cumsum(lengths[lo : lo + _BLOCK], dtype=np.int64) + base
        base = int(ends[-1])
        handle.write(ends.astype("<u8").data.cast("B"))


def write_format(
    path: str | os.PathLike[str],
    source: Any,
    format: str,  # noqa: A002 - the CLI's --format
    *,
    vocab_size: int | None = None,
    loss_mask: Any = None,
) -> IndexedStore:
    """Write the documents of *source* (a store, corpus, or any iterable of `Document`) as *format*'s files.

    *vocab_size* (else the source's tokenizer's, else the largest id + 1) decides
    the dtype (`FormatWriter`); *loss_mask* (datatrove only) is one bool per token of the source's
    flat tokens.  Returns the files opened.

    >>> import tempfile, pathlib, streambatch as sb
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "corpus.ds"
    >>> store = write_format(path, [sb.Document("a", "train", [0, 10, 11, 1])], "datatrove")
    >>> sorted(p.name for p in path.parent.iterdir()), store.lengths.tolist()
    (['corpus.ds', 'corpus.ds.index'], [4])
    """
    store = as_source(source)
    masked = loss_mask is not None
    if masked and np.shape(loss_mask) != (store.flat_size,):
        raise ConfigError(f"loss_mask has shape {np.shape(loss_mask)}; pass one bool per token of the source ({store.flat_size})")
    with FormatWriter(path, format, tokenizer=store.tokenizer, vocab_size=vocab_size, masked=masked) as writer:
        offset = 0
        for shard in store.shards:
            for lo in range(0, len(shard), 1 << 16):
                hi = min(lo + (1 << 16), len(shard))
                tokens, mask = _gathered(shard, lo, hi, loss_mask, offset)
                writer.add_block(tokens, shard.lengths[lo:hi], shard.ids[lo:hi], shard.partition_codes[lo:hi], loss_mask=mask)
            offset += shard.flat_size
        return writer.commit()


def _gathered(store: DocumentStore, lo: int, hi: int, loss_mask: Any, offset: int) -> tuple[npt.NDArray[Any], Any]:
    """Documents *lo*..*hi* of *store* as flat tokens, and their part of *loss_mask* (flat over the source)."""
    tokens, spans = document_tokens(store, lo, hi)
    if loss_mask is None:
        return tokens, None
    flat = np.asarray(loss_mask, dtype=np.bool_)
    return tokens, np.concatenate([flat[offset + a : offset + b] for a, b in spans]) if spans else np.zeros(0, np.bool_)
