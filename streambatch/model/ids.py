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

_SCAN = 1 << 22  # bytes of ids scanned at a time
_FRESH = 1 << 12  # ids added in small groups are kept in a set up to this many, then sorted into a run


def json_line(doc_id: str) -> bytes:
    """An id as one line of ``ids.jsonl`` (no newline): what a store's file and its fingerprint hold."""
    return json.dumps(doc_id).encode()


def hashes_of(ids: Iterable[str], count: int) -> npt.NDArray[np.int64]:
    """The 64-bit hashes of *count* ids (Python's ``hash``: stable within one process, all `IdHashes` needs)."""
    return np.fromiter(map(hash, ids), dtype=np.int64, count=count)


class IdLines(Sequence[str]):
    """Ids as JSON lines (``\\n`` after each; the last may lack it) in one buffer: a tuple's `len`, indexing, iteration, ``==``.

    *data* is bytes or a uint8 array (a store maps its ``ids.jsonl``: pages are read
    only when ids are); the line ends (4 bytes per id) are found at the first indexing.

    >>> ids = IdLines.of(b'"a"\\n"b\\\\u00e9"\\n')
    >>> len(ids), ids[1], list(ids), ids == ("a", "bé")
    (2, 'bé', ['a', 'bé'], True)
    """

    __slots__ = ("_count", "_ends", "_view")

    def __init__(self, data: bytes | npt.NDArray[np.uint8], count: int) -> None:
        self._view = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        self._count = count
        self._ends: npt.NDArray[Any] | None = None  # each line's end (its \n, or the buffer's end)

    @classmethod
    def of(cls, data: bytes | npt.NDArray[np.uint8]) -> IdLines:
        """Lines of *data*, counted (the caller checks each decodes to an id)."""
        view = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        newlines = sum(int(np.count_nonzero(view[lo : lo + _SCAN] == 10)) for lo in range(0, view.size, _SCAN))
        return cls(view, newlines + int(bool(view.size) and int(view[-1]) != 10))

    def _index(self) -> npt.NDArray[Any]:
        if self._ends is None:
            size = self._view.size
            ends = np.empty(self._count, dtype=np.uint32 if size < 1 << 32 else np.int64)
            done = 0
            for lo in range(0, size, _SCAN):
                found = np.flatnonzero(self._view[lo : lo + _SCAN] == 10)[: self._count - done]
                ends[done : done + found.size] = found + lo
                done += found.size
            ends[done:] = size  # a last line without \n
            self._ends = ends
        return self._ends

    def __len__(self) -> int:
        return self._count

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
        ends = self._index()
        start = int(ends[at - 1]) + 1 if at else 0
        decoded: str = json.loads(self._view[start : int(ends[at])].tobytes())
        return decoded

    def lines(self) -> Iterator[bytes]:
        """Each id's JSON line, without its newline, in order (read in blocks: no index needed)."""
        rest, left = b"", self._count
        for lo in range(0, self._view.size, _SCAN):
            lines = (rest + self._view[lo : lo + _SCAN].tobytes()).split(b"\n")
            rest = lines.pop()
            yield from lines[:left]
            left -= min(left, len(lines))
        if left and rest:
            yield rest

    def __iter__(self) -> Iterator[str]:
        return map(json.loads, self.lines())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdLines):
            return len(self) == len(other) and all(a == b for a, b in zip(self.lines(), other.lines(), strict=True))
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(self)) if len(self) <= 6 else f"IdLines({len(self):,} ids: {self[0]!r}, ..., {self[-1]!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return IdLines, (self._view.tobytes(), self._count)  # a mapped file pickles as its bytes


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
        self._fresh: set[int] = set()  # the latest few (documents added one at a time): a set, not a run each

    def __len__(self) -> int:
        return sum(int(run.size) for run in self._runs) + len(self._fresh)

    def candidates(self, hashes: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """For each new hash: equal to one added before (*earlier*), or to one before it in *hashes* (*within*)."""
        earlier = np.zeros(hashes.size, dtype=bool)
        if self._fresh:
            earlier |= np.fromiter((h in self._fresh for h in hashes.tolist()), dtype=bool, count=hashes.size)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, hashes), run.size - 1)
            earlier |= run[at] == hashes
        within = np.zeros(hashes.size, dtype=bool)
        if hashes.size > 1:
            order = np.argsort(hashes, kind="stable")
            ordered = hashes[order]
            within[order[1:][ordered[1:] == ordered[:-1]]] = True  # every later one of equal hashes
        return earlier, within

    def remove(self, hashes: npt.NDArray[np.int64]) -> None:
        """Forget *hashes* (ids rolled back): one pass over the runs, vectorized."""
        if not hashes.size:
            return
        self._fresh.difference_update(hashes.tolist())
        kept = [run[~np.isin(run, hashes)] for run in self._runs]
        self._runs = [run for run in kept if run.size]

    def add(self, hashes: npt.NDArray[np.int64]) -> None:
        """Remember *hashes* (checked first with `candidates`); runs of similar size are merged."""
        if not hashes.size:
            return
        if hashes.size < _FRESH and len(self._fresh) + hashes.size <= _FRESH:
            self._fresh.update(hashes.tolist())
            return
        if self._fresh:
            hashes = np.concatenate((np.fromiter(self._fresh, dtype=np.int64, count=len(self._fresh)), hashes))
            self._fresh.clear()
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
