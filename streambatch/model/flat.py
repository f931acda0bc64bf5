"""A source's flat token space as one small frozen value: what every gather and mask read asks of a store.

`TokenSource.flat` (`streambatch.model.source`) gives a `Flat`: each shard's
tokens and loss-mask bits, each shard's base in one flat space of positions,
each document's start in it, each shard's first document, and the remote file
behind each shard's tokens.  A `DocumentStore` is one shard at base 0; a
`streambatch.Corpus` is its shards in order, one after another.  No array is
copied.  The kinds (windows, packed rows, mixtures) and the remote reader read
this value instead of asking which kind of store they hold; the reads that go
shard by shard (`window_tokens`, `target_mask`, `mask_at`, `counted_between`)
are written here once.

>>> from streambatch.model.store import DocumentStore
>>> from streambatch.model.corpus import Corpus
>>> a = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"], loss_mask=[0, 1, 0, 1, 1])
>>> b = DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
>>> flat = Corpus([a, b]).flat()
>>> flat.bases.tolist(), flat.starts.tolist(), flat.shard_of([0, 1]).tolist(), flat.has_loss_mask
([0, 5, 9], [0, 5], [0, 1], True)
>>> flat.window_tokens([6, 1], 2).tolist(), flat.counted_between(np.array([1, 5]), np.array([5, 9])).tolist()
([[20, 21], [10, 11]], [3, 4])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .mask import BitArray, bits_at, prefix_counts, target_mask


def token_file(tokens: Any) -> Any:
    """The remote file a shard's *tokens* are fetched from (a remote store's array carries it as ``remote``), or
    None for local tokens (in memory or memory-mapped)."""
    return getattr(tokens, "remote", None)


@dataclass(frozen=True, eq=False)
class Flat:
    """The flat token space of a source: each shard's arrays, where each shard and document sits, and the files.

    Shard ``k`` holds positions ``[bases[k], bases[k + 1])`` (its own position
    ``p`` is ``bases[k] + p``) and documents ``[document_bases[k],
    document_bases[k + 1])``; ``starts`` are every document's first position in
    the flat space.
    """

    tokens: tuple[npt.NDArray[Any], ...]  # each shard's flat tokens, uint16 or uint32 (a remote store's: on demand)
    bases: npt.NDArray[np.int64]  # shards + 1 positions: shard k begins at bases[k]; bases[-1] is the size
    starts: npt.NDArray[np.int64]  # each document's first position in the flat space
    document_bases: npt.NDArray[np.int64]  # shards + 1: the first document of each shard; the last is the count
    bits: tuple[BitArray | None, ...]  # each shard's loss-mask bits (`streambatch.model.mask`); None: every target trains
    files: tuple[Any, ...]  # each shard's remote token file (`token_file`); None: local tokens
    dtype: np.dtype[Any]  # of every gathered batch: uint32 when any shard is, else uint16
    sharded: bool = False  # a corpus (its rows name their shard), even one of a single shard
    paths: tuple[str | None, ...] = (None,)  # each shard's directory, where it was opened from a path (else None)

    @classmethod
    def of_store(cls, tokens: npt.NDArray[Any], starts: npt.NDArray[np.int64], count: int, bits: BitArray | None) -> Flat:
        """The flat space of one store: its *tokens* at base 0, *count* documents starting at *starts*."""
        bases = _frozen(np.array([0, tokens.size], dtype=np.int64))
        documents = _frozen(np.array([0, count], dtype=np.int64))
        return cls((tokens,), bases, starts, documents, (bits,), (token_file(tokens),), tokens.dtype)

    @property
    def single(self) -> bool:
        """One shard at base 0: a flat position is that shard's own (no shard to find)."""
        return len(self.tokens) == 1

    @property
    def has_loss_mask(self) -> bool:
        """Whether any shard carries a loss mask (the others then train every target)."""
        return any(b is not None for b in self.bits)

    @property
    def size(self) -> int:
        """Positions of the flat space: every shard's tokens."""
        return int(self.bases[-1])

    def shard_of(self, documents: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The shard of each document (a flat document index)."""
        where = np.asarray(documents, dtype=np.int64)
        if self.single:
            return np.zeros(where.shape, dtype=np.int64)
        shards: npt.NDArray[np.int64] = np.searchsorted(self.document_bases, where, side="right") - 1
        return shards

    def shard_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The shard holding each flat position (the end of the space, and an empty range there: the last shard)."""
        where = np.asarray(positions, dtype=np.int64)
        shards: npt.NDArray[np.int64] = np.searchsorted(self.bases[:-1], where, side="right") - 1
        return np.maximum(shards, 0)

    def split(self, positions: npt.ArrayLike) -> Iterator[tuple[int, npt.NDArray[np.intp], npt.NDArray[np.int64]]]:
        """``(shard, rows, local positions)`` for each shard holding some of flat *positions* (1-D), in shard order:
        the one walk of every read that goes shard by shard."""
        where = np.asarray(positions, dtype=np.int64)
        if self.single:
            if where.size:
                yield 0, np.arange(where.size, dtype=np.intp), where
            return
        shards = self.shard_at(where)
        for k in np.unique(shards).tolist():
            rows = np.flatnonzero(shards == k)
            yield k, rows, where[rows] - self.bases[k]

    def window_tokens(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[Any]:
        """``(n, length)`` tokens starting at flat *positions*, each row read from its shard (a plain gather, for
        checks such as the audit)."""
        where = np.asarray(positions, dtype=np.int64).reshape(-1)
        out = np.empty((where.size, length), dtype=self.dtype)
        for k, rows, local in self.split(where):
            out[rows] = self.tokens[k][local[:, None] + np.arange(length)]  # a remote shard's: fetched here
        return out

    def target_mask(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[np.bool_] | None:
        """``(n, length)`` loss-mask bits of the targets of rows starting at flat *positions* (each row inside one
        shard; True where a shard has no mask); None when no shard has a mask."""
        if not self.has_loss_mask:
            return None
        where = np.asarray(positions, dtype=np.int64).reshape(-1)
        if self.single and self.bits[0] is not None:
            return target_mask(self.bits[0], where, length)
        out = np.ones((where.size, length), dtype=np.bool_)
        for k, rows, local in self.split(where):
            bits = self.bits[k]
            if bits is not None:
                out[rows] = target_mask(bits, local, length)
        return out

    def mask_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """The loss-mask bit of each flat token position (any shape; True where its shard has no mask)."""
        where = np.asarray(positions, dtype=np.int64)
        out = np.ones(where.shape, dtype=np.bool_)
        if not self.has_loss_mask:
            return out
        flat = out.reshape(-1)
        for k, rows, local in self.split(where.reshape(-1)):
            bits = self.bits[k]
            if bits is not None:
                flat[rows] = bits_at(bits, local)
        return out

    def counted_between(self, first: npt.NDArray[np.int64], last: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Counted targets among flat tokens ``[first, last)`` (each range inside one shard): the set mask bits,
        ``last - first`` where a shard has no mask."""
        out = (np.asarray(last) - np.asarray(first)).astype(np.int64)
        if not self.has_loss_mask or not out.size:
            return out
        begin, end = np.asarray(first, dtype=np.int64), np.asarray(last, dtype=np.int64)
        for k, rows, local in self.split(begin):
            bits = self.bits[k]
            if bits is not None:
                counts = prefix_counts(bits, np.concatenate([local, end[rows] - (begin[rows] - local)]))
                out[rows] = counts[rows.size :] - counts[: rows.size]
        return out


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.flags.writeable = False
    return array
