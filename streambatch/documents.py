"""Stage 1, documents: `Partition`, `Document`, the flat `DocumentStore` and its readers.

A store keeps every document's tokens in one flat array (uint16 or uint32) plus
int64 ``starts``/``lengths``; ids and partitions ride alongside.  Nothing here is
per-token Python work except validating tokens that arrive as Python lists.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from ._checks import is_integer, short_repr
from ._json import decode_record
from .errors import ConfigError, DataError, DuplicateIdError, PartitionError

TOKEN_LIMIT = 1 << 32
TokenArray = npt.NDArray[np.uint32] | npt.NDArray[np.uint16]


class Partition(str, Enum):
    """Which split a document belongs to; the plain strings are accepted too.

    >>> Partition.parse("validation") is Partition.VALIDATION
    True
    """

    TRAIN = "train"
    VALIDATION = "validation"
    TEST = "test"

    @classmethod
    def parse(cls, value: Any, where: str = "partition") -> Partition:
        """Return the `Partition` named by *value*, else raise `DataError` naming *where*."""
        if isinstance(value, Partition):
            return value
        if isinstance(value, str):
            try:
                return cls(value)
            except ValueError:
                pass
        choices = ", ".join(repr(p.value) for p in cls)
        raise DataError(f"{where}: partition={_short(value)} is not one of {choices}; use one of those")

    @property
    def code(self) -> int:
        """The small integer a store keeps for this partition (train=0, validation=1, test=2)."""
        return _PARTITION_CODES[self]

    def __str__(self) -> str:
        return self.value


_PARTITION_CODES = {p: i for i, p in enumerate(Partition)}
PARTITIONS = tuple(Partition)


def check_tokens(tokens: Any, where: str) -> npt.NDArray[np.uint32]:
    """Validate token ids and return them as a fresh uint32 array.

    Token ids are integers in [0, 2**32); bools and floats are rejected, not coerced.

    >>> check_tokens([0, 10, 11], "document 'a'").tolist()
    [0, 10, 11]
    >>> check_tokens([0, True], "document 'a'")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: document 'a': token[1]=True is not an integer token id; ...
    """
    if isinstance(tokens, np.ndarray):
        array = tokens
        if array.ndim != 1:
            raise DataError(f"{where}: tokens have shape {array.shape}; pass a 1-D sequence of ids")
        if array.dtype.kind not in "ui":
            raise DataError(
                f"{where}: tokens have dtype {array.dtype}; token ids must be integers "
                "in [0, 2**32) (bool and float arrays are not accepted)"
            )
    else:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise DataError(f"{where}: tokens={_short(tokens)} is not a sequence; pass a list of integer ids")
        items = tokens if isinstance(tokens, Sequence) else list(tokens)
        if not all(type(t) is int for t in items):
            for position, token in enumerate(items):
                if not is_integer(token):
                    raise DataError(
                        f"{where}: token[{position}]={token!r} is not an integer token id; "
                        "token ids must be integers in [0, 2**32), not bools or floats"
                    )
        try:
            array = np.asarray(items, dtype=np.int64).reshape(-1)
        except OverflowError:  # beyond int64: name the first id out of range as given
            position = next(i for i, t in enumerate(items) if not 0 <= int(t) < TOKEN_LIMIT)
            raise DataError(
                f"{where}: token[{position}]={_short(int(items[position]))} is outside [0, 2**32); token ids must fit in uint32"
            ) from None
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= TOKEN_LIMIT:
            position = int(np.argmax((array < 0) | (array >= TOKEN_LIMIT)))
            raise DataError(
                f"{where}: token[{position}]={int(array[position])} is outside [0, 2**32); token ids must fit in uint32"
            )
    return np.array(array, dtype=np.uint32)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond the int-string limit
        return short_repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_id(value: Any, where: str) -> str:
    """Return a document id if it is a non-empty str, else raise `DataError`."""
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: id={_short(value)} must be a non-empty string; give every document an id")
    return value


@dataclass(frozen=True, eq=False)
class Document:
    """One tokenized document: a non-empty id, its partition and uint32 token ids.

    >>> doc = Document("train-a", "train", [0, 10, 11, 12, 1])
    >>> doc.partition, doc.tokens.tolist()
    (<Partition.TRAIN: 'train'>, [0, 10, 11, 12, 1])
    """

    id: str
    partition: Partition
    tokens: npt.NDArray[np.uint32] = field(repr=False)

    def __init__(self, id: str, partition: Partition | str, tokens: Any, *, where: str = "") -> None:  # noqa: A002
        label = where or f"document id={id!r}"
        object.__setattr__(self, "id", check_id(id, label))
        object.__setattr__(self, "partition", Partition.parse(partition, label))
        array = check_tokens(tokens, label)
        array.flags.writeable = False
        object.__setattr__(self, "tokens", array)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Document):
            return NotImplemented
        return self.id == other.id and self.partition == other.partition and np.array_equal(self.tokens, other.tokens)

    def __hash__(self) -> int:
        return hash((self.id, self.partition, self.tokens.tobytes()))

    def __len__(self) -> int:
        return int(self.tokens.size)


def smallest_token_dtype(max_token: int) -> type[np.unsignedinteger[Any]]:
    """uint16 when every id fits, else uint32.

    >>> smallest_token_dtype(50_256).__name__, smallest_token_dtype(70_000).__name__
    ('uint16', 'uint32')
    """
    return np.uint16 if max_token < (1 << 16) else np.uint32


@dataclass(frozen=True, eq=False)
class DocumentStore:
    """Documents as one flat token array plus per-document starts, lengths, ids, partitions.

    ``tokens`` may be an in-memory array or a read-only memory map (see
    `streambatch.open_store`).  A store never copies token data to select or view.

    >>> store = DocumentStore.from_arrays([0, 10, 11, 12, 1, 0, 20, 21, 1], [0, 5, 9])
    >>> store.ids, store.lengths.tolist(), store.document(1).tokens.tolist()
    (('0', '1'), [5, 4], [0, 20, 21, 1])
    """

    tokens: TokenArray
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    ids: tuple[str, ...]
    partition_codes: npt.NDArray[np.uint8]
    fingerprint: str | None = None

    @classmethod
    def from_documents(cls, documents: Iterable[Document], *, where: Sequence[str] | None = None) -> DocumentStore:
        """Build an in-memory store; rejects duplicate ids, naming both positions.

        *where* optionally describes each document's position (e.g. ``"line 3"``).
        """
        docs = list(documents)
        for index, doc in enumerate(docs):
            if not isinstance(doc, Document):
                raise DataError(
                    f"document index {index}: got {type(doc).__name__}; pass streambatch.Document objects or a DocumentStore"
                )
        labels = list(where) if where is not None else [f"document index {i}" for i in range(len(docs))]
        _check_unique([d.id for d in docs], labels)
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        starts = np.zeros(len(docs), dtype=np.int64)
        if len(docs) > 1:
            np.cumsum(lengths[:-1], out=starts[1:])
        tokens = np.concatenate([d.tokens for d in docs]) if docs else np.zeros(0, dtype=np.uint32)
        codes = np.fromiter((d.partition.code for d in docs), dtype=np.uint8, count=len(docs))
        return cls._frozen(tokens.astype(np.uint32, copy=False), starts, lengths, tuple(d.id for d in docs), codes)

    @classmethod
    def from_arrays(
        cls,
        tokens: Any,
        offsets: Any,
        ids: Sequence[str] | None = None,
        partition: Partition | str | Sequence[Partition | str] = Partition.TRAIN,
    ) -> DocumentStore:
        """Build a store from a flat token array and ``len(documents) + 1`` offsets.

        Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.  *ids* default to
        ``"0", "1", ...``; *partition* is one partition for all or one per document.
        uint16 token arrays stay uint16; every other integer array becomes uint32.
        """
        token_array = _token_array(tokens)
        offs = np.asarray(offsets)
        if offs.ndim != 1 or offs.size == 0 or offs.dtype.kind not in "ui":
            raise DataError(
                f"offsets has dtype {offs.dtype} and shape {offs.shape}; pass a 1-D integer array "
                "of len(documents) + 1 offsets starting at 0"
            )
        offs = _check_offsets(offs, int(token_array.size), "offsets")  # uint64 beyond int64 is rejected, not wrapped
        count = offs.size - 1
        if ids is None:
            id_tuple = tuple(str(i) for i in range(count))
        else:
            id_tuple = tuple(ids)
            if len(id_tuple) != count:
                raise DataError(
                    f"ids has {len(id_tuple)} entries but offsets describe {count} documents; pass one id per document"
                )
            for index, value in enumerate(id_tuple):
                check_id(value, f"document index {index}")
            _check_unique(list(id_tuple), [f"document index {i}" for i in range(count)])
        if isinstance(partition, (Partition, str)):
            codes = np.full(count, Partition.parse(partition).code, dtype=np.uint8)
        else:
            parts = list(partition)
            if len(parts) != count:
                raise DataError(
                    f"partition has {len(parts)} entries for {count} documents; pass one per document or a single partition"
                )
            codes = np.fromiter(
                (Partition.parse(p, f"document index {i}").code for i, p in enumerate(parts)),
                dtype=np.uint8,
                count=count,
            )
        return cls._frozen(token_array, offs[:-1].copy(), np.diff(offs), id_tuple, codes)

    @classmethod
    def _frozen(
        cls, tokens: Any, starts: Any, lengths: Any, ids: tuple[str, ...], codes: Any, fingerprint: str | None = None
    ) -> DocumentStore:
        for array in (starts, lengths, codes):
            array.flags.writeable = False
        if isinstance(tokens, np.ndarray) and tokens.flags.writeable and tokens.flags.owndata:
            tokens.flags.writeable = False
        return cls(tokens, starts, lengths, ids, codes, fingerprint)

    def __len__(self) -> int:
        return len(self.ids)

    def __reduce__(self) -> tuple[Any, ...]:
        # a memory-mapped store pickles as its file name (e.g. for DataLoader workers
        # started with "spawn"), never as a copy of its tokens
        tokens = self.tokens
        if isinstance(tokens, np.memmap) and tokens.filename is not None and tokens.offset == 0:
            spec = (str(tokens.filename), tokens.dtype.str, int(tokens.size))
            fields = (self.starts, self.lengths, self.ids, self.partition_codes, self.fingerprint)
            return (_reopen_memmap, (spec, *fields))
        return (DocumentStore._frozen, (tokens, self.starts, self.lengths, self.ids, self.partition_codes, self.fingerprint))

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """``len(self) + 1`` offsets into ``tokens`` (for contiguous stores; a `select` view may have gaps).

        >>> DocumentStore.from_arrays([1, 2, 3], [0, 1, 3]).offsets.tolist()
        [0, 1, 3]
        """
        ends = self.starts + self.lengths
        if self.starts.size and not np.array_equal(self.starts[1:], ends[:-1]):
            raise DataError("this store view is not contiguous (documents were selected); use starts and lengths")
        return np.concatenate([self.starts[:1] if self.starts.size else np.zeros(1, np.int64), ends])

    @property
    def token_count(self) -> int:
        """Tokens over all documents of this store (view)."""
        return int(self.lengths.sum())

    def partition(self, index: int) -> Partition:
        """The partition of document *index*."""
        return PARTITIONS[int(self.partition_codes[index])]

    def document(self, index: int) -> Document:
        """Document *index* as a `Document` (its tokens copied to uint32)."""
        start, length = int(self.starts[index]), int(self.lengths[index])
        return Document(self.ids[index], self.partition(index), self.tokens[start : start + length])

    def __iter__(self) -> Iterator[Document]:
        return (self.document(i) for i in range(len(self)))

    def select(self, partition: Partition | str) -> DocumentStore:
        """A view of the documents in one partition (tokens are shared, not copied).

        >>> store = DocumentStore.from_arrays([1, 2, 3, 4], [0, 2, 4], partition=["train", "test"])
        >>> store.select("test").ids
        ('1',)
        """
        code = Partition.parse(partition).code
        keep = np.flatnonzero(self.partition_codes == code)
        return DocumentStore._frozen(
            self.tokens,
            self.starts[keep],
            self.lengths[keep],
            tuple(self.ids[i] for i in keep.tolist()),
            self.partition_codes[keep],
            self.fingerprint,
        )

    def check_partition(self, partition: Partition | str) -> Partition:
        """Raise `PartitionError` naming the first document outside *partition*."""
        wanted = Partition.parse(partition)
        outside = np.flatnonzero(self.partition_codes != wanted.code)
        if outside.size:
            index = int(outside[0])
            raise PartitionError(
                f"document id={self.ids[index]!r} (document index {index}) is in partition "
                f"{self.partition(index).value!r}, not the epoch's {wanted.value!r}; keep one partition "
                f"per epoch (store.select({wanted.value!r}) or the reader's partition= filter)"
            )
        return wanted


def _reopen_memmap(spec: tuple[str, str, int], *fields: Any) -> DocumentStore:
    filename, dtype, size = spec
    tokens = np.memmap(filename, dtype=np.dtype(dtype), mode="r", shape=(size,))
    return DocumentStore._frozen(tokens, *fields)


def _token_array(tokens: Any) -> TokenArray:
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.uint16 and tokens.ndim == 1:
        return tokens
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.uint32 and tokens.ndim == 1:
        return tokens
    return check_tokens(tokens, "tokens")


def _check_offsets(offsets: npt.NDArray[Any], token_count: int, name: str) -> npt.NDArray[np.int64]:
    """Check integer *offsets* against *token_count* and return them as int64.

    Only comparisons, no arithmetic (``np.diff`` wraps in int64), so no value can
    overflow into a valid-looking one: every offset lies in [0, token_count],
    the first is 0, each is >= the one before and the last is the token count.
    """
    if offsets.dtype.kind == "u" and int(offsets.max()) > np.iinfo(np.int64).max:
        at = int(np.argmax(offsets > np.uint64(np.iinfo(np.int64).max)))
        raise DataError(f"{name}[{at}]={int(offsets[at])} is outside [0, {token_count}]; every offset must index the tokens")
    values = offsets.astype(np.int64)  # exact: every value fits int64 now
    outside = (values < 0) | (values > token_count)
    if outside.any():
        at = int(np.argmax(outside))
        raise DataError(f"{name}[{at}]={int(values[at])} is outside [0, {token_count}]; every offset must index the tokens")
    if values[0] != 0:
        raise DataError(f"{name}[0]={int(values[0])} must be 0; offsets start at the first token")
    down = values[1:] < values[:-1]
    if down.any():
        at = int(np.argmax(down))
        raise DataError(
            f"{name}[{at + 1}]={int(values[at + 1])} is less than {name}[{at}]={int(values[at])}; offsets must be non-decreasing"
        )
    if int(values[-1]) != token_count:
        raise DataError(
            f"{name}[-1]={int(values[-1])} but there are {token_count} tokens; the last offset must equal the token count"
        )
    return values


def _check_unique(ids: list[str], labels: Sequence[str]) -> None:
    seen: dict[str, int] = {}
    for index, value in enumerate(ids):
        first = seen.setdefault(value, index)
        if first != index:
            raise DuplicateIdError(
                f"duplicate document id={value!r}: first at {labels[first]}, repeated at "
                f"{labels[index]}; document ids must be unique"
            )


def read_records(
    records: Iterable[Mapping[str, Any]],
    *,
    partition: Partition | str | None = None,
    source: str = "record",
) -> DocumentStore:
    """Build a store from dicts ``{"id", "partition", "tokens"}`` (e.g. a dataset's rows).

    With *partition*, documents of other partitions are skipped (after validation).

    >>> rows = [{"id": "a", "partition": "train", "tokens": [1, 2, 3]},
    ...         {"id": "b", "partition": "test", "tokens": [4, 5]}]
    >>> read_records(rows, partition="train").ids
    ('a',)
    """
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ConfigError(f"records={_short(records)} is not an iterable of records; pass a list (or iterable) of dicts")
    keep = None if partition is None else Partition.parse(partition)
    docs: list[Document] = []
    labels: list[str] = []
    for index, record in enumerate(records):
        label = f"{source} {index}"
        docs.append(_record_document(record, label))
        labels.append(label)
    return _keep(docs, labels, keep)


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Document]]:
    """Yield ``(line number, Document)`` for each non-blank line of a JSONL file."""
    name = os.fspath(path)
    try:
        handle = open(name, encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except OSError as err:
        raise DataError(f"cannot open {name!r}: {err.strerror}; pass a readable JSONL file") from err
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                where = f"{name}:{number}"
                yield number, _record_document(decode_record(line, where), where)  # bounded JSON; BOM accepted
        except UnicodeDecodeError as err:
            raise DataError(f"{name}: not UTF-8 text ({err.reason} at byte {err.start}); JSONL files must be UTF-8") from err


def read_jsonl(path: str | os.PathLike[str], *, partition: Partition | str | None = None) -> DocumentStore:
    """Read a JSONL file of ``{"id", "partition", "tokens"}`` objects into a store.

    Errors name the file and line; duplicate ids name both lines.  With
    *partition*, documents of other partitions are skipped.
    """
    keep = None if partition is None else Partition.parse(partition)
    docs: list[Document] = []
    labels: list[str] = []
    for number, doc in iter_jsonl(path):
        docs.append(doc)
        labels.append(f"{os.fspath(path)}:{number}")
    return _keep(docs, labels, keep)


def _keep(docs: list[Document], labels: list[str], keep: Partition | None) -> DocumentStore:
    if keep is not None:
        pairs = [(d, w) for d, w in zip(docs, labels, strict=True) if d.partition is keep]
        docs, labels = [d for d, _ in pairs], [w for _, w in pairs]
    return DocumentStore.from_documents(docs, where=labels)


def _record_document(record: Any, where: str) -> Document:
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: got {type(record).__name__}; each record must be an object with id, partition, tokens")
    missing = [key for key in ("id", "partition", "tokens") if key not in record]
    if missing:
        raise DataError(f"{where}: missing key(s) {', '.join(missing)}; each record needs id, partition, tokens")
    doc_id = record["id"]
    label = f"{where} (document id={doc_id!r})" if isinstance(doc_id, str) and doc_id else where
    return Document(doc_id, record["partition"], record["tokens"], where=label)


def as_store(source: Any) -> DocumentStore:
    """Return *source* as a `DocumentStore` (a store, or an iterable of `Document`)."""
    if isinstance(source, DocumentStore):
        return source
    if isinstance(source, Document):
        raise ConfigError("documents=Document(...) is a single document; pass a list of documents or a DocumentStore")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return DocumentStore.from_documents(source)
    raise ConfigError(f"documents={_short(source)} is not a DocumentStore or an iterable of Document; pass one of those")
