"""A `DocumentStore` over another tool's files whose arrays are mapped, derived and checked at first use.

Opening a Megatron index of 10**8 sequences must not touch 10**8 entries: the
open reads and checks the fixed header and the file sizes (O(1)), and the
per-document arrays (``starts``, ``lengths``, ``partition_codes``) and the
tokens are made on first access, each group by one function of the reader that
checks what it reads (a bad file is a `DataError` then, naming the file).  Ids
are the document numbers (`NumberedIds`), made when one is read.

A store pickles as the call that opened it (a DataLoader worker opens the files
again, O(1)), and refuses a file replaced in between.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ...errors import StoreError
from ...model.store import DocumentStore

Derive = Callable[[], Mapping[str, Any]]


class NumberedIds(Sequence[str]):
    """The ids ``PREFIX + "0"``, ``PREFIX + "1"``, ...: a tuple's `len`, indexing, iteration, ``==``, without a str per id.

    >>> ids = NumberedIds(3, "a.ds:")
    >>> len(ids), ids[2], ids[-1], ids[:2], ids == ("a.ds:0", "a.ds:1", "a.ds:2")
    (3, 'a.ds:2', 'a.ds:2', ('a.ds:0', 'a.ds:1'), True)
    """

    __slots__ = ("_count", "_prefix")

    def __init__(self, count: int, prefix: str = "") -> None:
        self._count = count
        self._prefix = prefix

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(f"{self._prefix}{i}" for i in range(*index.indices(self._count)))
        number = index.__index__()
        if number < 0:
            number += self._count
        if not 0 <= number < self._count:
            raise IndexError(f"id index {index} out of range for {self._count} ids")
        return f"{self._prefix}{number}"

    def __iter__(self) -> Iterator[str]:
        return (f"{self._prefix}{i}" for i in range(self._count))

    def lines(self) -> Iterator[bytes]:
        """Each id as its JSON line (what a store's fingerprint hashes)."""
        prefix = json.dumps(self._prefix).encode()[:-1]
        return (b'%s%d"' % (prefix, i) for i in range(self._count))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumberedIds):
            return (self._count, self._prefix) == (other._count, other._prefix)
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != self._count:
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # like a list: equal to tuples, so not hashable

    def __repr__(self) -> str:
        return f"NumberedIds({self._count}, {self._prefix!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (NumberedIds, (self._count, self._prefix))


class _Derived:
    """A field of an `IndexedStore` made at first access by its reader's function (an instance attribute from then on)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, store: IndexedStore | None, owner: type | None = None) -> Any:
        if store is None:
            return self
        return store.derived(self.name)


class IndexedStore(DocumentStore):
    """A `DocumentStore` whose ``tokens``, ``starts``, ``lengths`` and ``partition_codes`` are made at first access.

    Made by a format's reader (`streambatch.io.formats.megatron`,
    `streambatch.io.formats.datatrove`) with `lazy`; it is a `DocumentStore` in
    every other respect (``select`` gives a plain one).  ``loss_mask`` is the
    files' per-token mask (datatrove's ``.ds.loss``) or None.
    """

    # not a dataclass of its own: DocumentStore's fields are set by `lazy`, or made on first access by these
    # (non-data descriptors: the value made is stored on the instance, which is read from then on)
    tokens = _Derived()
    starts = _Derived()
    lengths = _Derived()
    partition_codes = _Derived()
    _mask = _Derived()
    # hand-off (loss-mask issue): ``loss_bits = _Derived()`` here, with megatron's index group giving it None and
    # datatrove's mask group the packed .ds.loss (see streambatch.io.formats.datatrove)

    @classmethod
    def lazy(
        cls,
        *,
        kind: str,
        name: str,
        ids: Sequence[str],
        groups: Mapping[tuple[str, ...], Derive],
        reopen: tuple[Callable[..., IndexedStore], tuple[Any, ...]],
        identity: Any,
        tokenizer: dict[str, Any] | None = None,
    ) -> IndexedStore:
        """A store of *ids* whose other fields each come from the function of *groups* that names them."""
        store = object.__new__(cls)
        for field, value in (("ids", ids), ("fingerprint", None), ("tokenizer", tokenizer)):
            object.__setattr__(store, field, value)
        derive = {field: function for fields, function in groups.items() for field in fields}
        meta = {"_derive": derive, "_kind": kind, "_name": name, "_reopen": reopen, "_identity": identity}
        for field, value in meta.items():
            object.__setattr__(store, field, value)
        return store

    def derived(self, name: str) -> Any:
        """Field *name*, made now (with the others its reader's function makes) if it was not made yet."""
        if name in self.__dict__:
            return self.__dict__[name]
        values = self.__dict__["_derive"][name]()
        for field, value in values.items():
            if isinstance(value, np.ndarray) and value.flags.writeable:
                value.flags.writeable = False
            self.__dict__[field] = value  # an instance attribute now: read before the class's descriptor
        return values[name]

    @property
    def loss_mask(self) -> npt.NDArray[np.bool_] | None:
        """One bool per token of ``tokens`` (True: the token trains as a target), or None when the files hold none."""
        mask: npt.NDArray[np.bool_] | None = self._mask
        return mask

    @property
    def source_kind(self) -> str:
        """Which tool's files these are: ``megatron`` or ``datatrove``."""
        kind: str = self.__dict__["_kind"]
        return kind

    def __repr__(self) -> str:
        return f"DocumentStore({len(self)} documents, {self.source_kind} files {self.__dict__['_name']}, memory-mapped)"

    def __reduce__(self) -> tuple[Any, ...]:
        # as the call that opened it: a worker maps the same files again (O(1)), never a copy of the arrays
        function, args = self.__dict__["_reopen"]
        return (_reopened, (function, args, self.__dict__["_identity"]))


def _reopened(function: Callable[..., IndexedStore], args: tuple[Any, ...], identity: Any) -> IndexedStore:
    store = function(*args)
    if store.__dict__["_identity"] != identity:
        raise StoreError(
            f"{store.__dict__['_name']}: the files were replaced after this process opened them (a pickled store, e.g. in "
            "a DataLoader worker, must map the same files); open them again"
        )
    return store


def document_tokens(store: DocumentStore, lo: int, hi: int) -> tuple[npt.NDArray[Any], list[tuple[int, int]]]:
    """The tokens of documents *lo*..*hi* of *store*, flat, and the spans of ``store.tokens`` they came from.

    One slice when the documents are contiguous (a file's own order), else their pieces joined.

    >>> store = DocumentStore.from_arrays([1, 2, 3, 4, 5], [0, 2, 3, 5])
    >>> tokens, spans = document_tokens(store, 1, 3)
    >>> tokens.tolist(), spans
    ([3, 4, 5], [(2, 5)])
    """
    starts, lengths = store.starts[lo:hi], store.lengths[lo:hi]
    if not starts.size:
        return np.zeros(0, store.tokens.dtype), []
    ends = starts + lengths
    if np.array_equal(starts[1:], ends[:-1]):
        spans = [(int(starts[0]), int(ends[-1]))]
    else:
        spans = list(zip(starts.tolist(), ends.tolist(), strict=True))
    pieces = [store.tokens[a:b] for a, b in spans]
    return (np.asarray(pieces[0]) if len(pieces) == 1 else np.concatenate(pieces)), spans
