"""Document ids without a Python object per document: `IdLines` holds them, `IdHashes` finds a repeat.

A store of 10**7 documents held its ids as a tuple of ``str`` (about 75 bytes
each) and found repeats with a dict (about 100 more).  `IdLines` keeps a store's
``ids.jsonl`` as one buffer plus one int64 line end per id, and decodes an id
when it is read; `IdHashes` keeps the 64-bit hashes of the ids seen so far in
sorted runs (a log-structured merge: 8 bytes per id, and a search per run),
which name the candidates for a repeat; the caller compares the ids themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

_BLOCK = 1 << 16  # ids decoded, hashed or searched this many at a time


def json_line(doc_id: str) -> bytes:
    """An id as one line of ``ids.jsonl`` (no newline): what a store's file and its fingerprint hold."""
    return json.dumps(doc_id).encode()


def hashes_of(ids: Iterable[str], count: int) -> npt.NDArray[np.int64]:
    """The 64-bit hashes of *count* ids (Python's ``hash``: stable within one process, all `IdHashes` needs)."""
    return np.fromiter(map(hash, ids), dtype=np.int64, count=count)


class IdLines(Sequence[str]):
    """Ids as JSON lines (each followed by ``\\n``) in one buffer: `len`, indexing, iteration and ``==`` as a tuple's.

    >>> ids = IdLines.of(b'"a"\\n"b\\\\u00e9"\\n')
    >>> len(ids), ids[1], list(ids), ids == ("a", "bé")
    (2, 'bé', ['a', 'bé'], True)
    """

    __slots__ = ("_data", "_ends")

    def __init__(self, data: bytes, ends: npt.NDArray[np.int64]) -> None:
        self._data = data
        self._ends = ends  # the position of each line's \n

    @classmethod
    def of(cls, data: bytes) -> IdLines:
        """Index a buffer of lines (the caller has checked each line decodes to an id)."""
        view = np.frombuffer(data, dtype=np.uint8)
        ends = np.empty(data.count(b"\n"), dtype=np.int64)
        done = 0
        for lo in range(0, view.size, 1 << 24):
            found = np.flatnonzero(view[lo : lo + (1 << 24)] == 10)
            ends[done : done + found.size] = found + lo
            done += found.size
        return cls(data, ends)

    def __len__(self) -> int:
        return int(self._ends.size)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        count = len(self)
        at = int(index) + count if int(index) < 0 else int(index)
        if not 0 <= at < count:
            raise IndexError("id index out of range")
        start = int(self._ends[at - 1]) + 1 if at else 0
        decoded: str = json.loads(self._data[start : int(self._ends[at])])
        return decoded

    def lines(self) -> Iterator[bytes]:
        """Each id's JSON line, without its newline, in order."""
        start = 0
        for lo in range(0, len(self), _BLOCK):
            end = int(self._ends[min(lo + _BLOCK, len(self)) - 1])
            yield from self._data[start:end].split(b"\n")
            start = end + 1

    def __iter__(self) -> Iterator[str]:
        return map(json.loads, self.lines())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdLines):
            return self._data == other._data
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self)) if len(self) <= 6 else f"IdLines({len(self):,} ids: {self[0]!r}, ..., {self[-1]!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return IdLines, (self._data, self._ends)


class IdHashes:
    """The hashes of the ids seen so far, in sorted runs: which new ids may repeat one (8 bytes per id).

    >>> seen = IdHashes()
    >>> seen.add(hashes_of(["a", "b"], 2))
    >>> earlier, within = seen.candidates(hashes_of(["c", "b", "c"], 3))
    >>> earlier.tolist(), within.tolist()
    ([False, True, False], [False, False, True])
    """

    def __init__(self) -> None:
        self._runs: list[npt.NDArray[np.int64]] = []

    def __len__(self) -> int:
        return sum(int(run.size) for run in self._runs)

    def candidates(self, hashes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """For each new hash: equal to one added before (*earlier*), or to one before it in *hashes* (*within*)."""
        earlier = np.zeros(hashes.size, dtype=bool)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, hashes), run.size - 1)
            earlier |= run[at] == hashes
        within = np.zeros(hashes.size, dtype=bool)
        if hashes.size > 1:
            order = np.argsort(hashes, kind="stable")
            ordered = hashes[order]
            within[order[1:][ordered[1:] == ordered[:-1]]] = True  # every later one of equal hashes
        return earlier, within

    def add(self, hashes: npt.NDArray[np.int64]) -> None:
        """Remember *hashes* (checked first with `candidates`); runs of similar size are merged."""
        if not hashes.size:
            return
        self._runs.append(np.sort(hashes))
        while len(self._runs) > 1 and self._runs[-2].size <= 2 * self._runs[-1].size:
            last = self._runs.pop()
            merged = np.concatenate((self._runs.pop(), last))
            del last
            merged.sort()
            self._runs.append(merged)


def first_repeat(ids: Sequence[str], hashes: npt.NDArray[np.int64] | None = None) -> tuple[int, int] | None:
    """``(first, repeated)``: the indices of the first id that repeats an earlier one, or None; 8 bytes per id.

    *hashes* (`hashes_of` the ids, in order) may be given, and are then sorted in place.

    >>> first_repeat(["a", "b", "c", "b", "a"]), first_repeat(["a", "b"])
    ((1, 3), None)
    """
    ordered = hashes_of(ids, len(ids)) if hashes is None else hashes
    ordered.sort()
    same = ordered[1:] == ordered[:-1]
    if not same.any():
        return None
    repeated = set(ordered[1:][same].tolist())  # candidates only: the ids themselves decide
    seen: dict[str, int] = {}
    for index, name in enumerate(ids):
        if hash(name) in repeated and seen.setdefault(name, index) != index:
            return seen[name], index
    return None
