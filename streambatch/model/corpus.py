"""Sharded corpora: several stores read as one source, without copying tokens.

A `Corpus` looks like one `DocumentStore` to the stages: its documents are the
shards' documents in order, in a *virtual* flat token space where shard ``k``
occupies ``[bases[k], bases[k + 1])``.  ``starts`` are global int64 positions in
that space, so windows, shuffle plans and provenance work across shards
unchanged; only the gather (`streambatch.stages.materialize`) maps positions back to
(shard, local position).

Document ids must be unique across the whole corpus (a `DuplicateIdError` names
both shards otherwise), so a row's document id means the same as in one store
holding the same documents.  The corpus fingerprint is the BLAKE2b-256 of the
shards' fingerprints, in order (for shards held in memory: of their content
fingerprints, computed when a plan file needs it).

A manifest (``corpus.json``) lists shard store directories relative to itself::

    {"format": "streambatch.corpus", "version": 1, "fingerprint": "blake2b-256:...",
     "shards": [{"path": "shard-0", "fingerprint": "blake2b-256:..."}, ...]}

(plus ``"tokenizer"`` when the shards record one: they never record two, `check_one_tokenizer`)

(an entry may also be a plain path string); `write_corpus` writes one,
`open_corpus` reads one (or takes a list of stores or their paths).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._paths import short_path
from ..errors import ConfigError
from .documents import PARTITIONS, Document, Partition
from .flat import Flat, token_file
from .store import DocumentStore
from .validate import check_one_tokenizer, duplicate_id

FORMAT = "streambatch.corpus"
VERSION = 1
PathLike = str | os.PathLike[str]


def corpus_fingerprint(fingerprints: Sequence[str]) -> str:
    """The fingerprint of a corpus: BLAKE2b-256 over its shards' fingerprints, in order.

    >>> corpus_fingerprint(["blake2b-256:aa", "blake2b-256:bb"]) != corpus_fingerprint(["blake2b-256:bb", "blake2b-256:aa"])
    True
    """
    digest = hashlib.blake2b(digest_size=32)
    digest.update(json.dumps([FORMAT, list(fingerprints)], separators=(",", ":")).encode())
    return "blake2b-256:" + digest.hexdigest()


class Corpus:
    """Several `DocumentStore` shards read as one source, in order; no token is copied.

    Per document it holds what a store holds (global ``starts``, ``lengths``,
    ``ids``, ``partition_codes``), concatenated; per shard its base in the
    virtual token space (``bases``) and its first document (``document_bases``).
    Batches have dtype uint32 if any shard is uint32, else uint16.

    >>> a = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"])
    >>> b = DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
    >>> corpus = Corpus([a, b])
    >>> len(corpus), corpus.starts.tolist(), corpus.bases.tolist(), corpus.shard_of([0, 1]).tolist()
    (2, [0, 5], [0, 5, 9], [0, 1])
    """

    __slots__ = (
        "_closed",
        "_content",
        "_flat",
        "bases",
        "document_bases",
        "dtype",
        "fingerprint",
        "ids",
        "lengths",
        "partition_codes",
        "paths",
        "shards",
        "starts",
    )

    def __init__(
        self, shards: Sequence[DocumentStore], *, paths: Sequence[str | None] | None = None, _checked: bool = False
    ) -> None:
        stores = tuple(shards)
        if not stores:
            raise ConfigError("shards=[] is empty; pass one or more DocumentStores (or their paths) to make a corpus")
        for k, shard in enumerate(stores):
            if not isinstance(shard, DocumentStore):
                raise ConfigError(f"shard {k} is a {type(shard).__name__}, not a DocumentStore; open it with sb.open_store")
        self.shards = stores
        self._flat: Flat | None = None
        self.paths: tuple[str | None, ...] = tuple(paths) if paths is not None else (None,) * len(stores)
        sizes = np.array([s.flat_size for s in stores], dtype=np.int64)
        self.bases = _frozen(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
        counts = np.array([len(s) for s in stores], dtype=np.int64)
        self.document_bases = _frozen(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        self.starts = _frozen(np.concatenate([s.starts + base for s, base in zip(stores, self.bases.tolist(), strict=False)]))
        self.lengths = _frozen(np.concatenate([s.lengths for s in stores]))
        self.partition_codes = _frozen(np.concatenate([s.partition_codes for s in stores]))
        self.ids: tuple[str, ...] = tuple(i for s in stores for i in s.ids)
        self.dtype: np.dtype[Any] = np.dtype(np.uint32 if any(s.dtype == np.uint32 for s in stores) else np.uint16)
        if not _checked:  # a restored corpus was checked before
            self._check_unique_ids()
            check_one_tokenizer([self._shard_label(k) for k in range(len(stores))], [s.tokenizer for s in stores], "a corpus")
        recorded = [s.fingerprint for s in stores if s.fingerprint is not None]
        # like a store's: known when every shard has one (opened from disk), else None (see content_fingerprint)
        self.fingerprint: str | None = corpus_fingerprint(recorded) if len(recorded) == len(stores) else None
        self._content: str | None = self.fingerprint
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether `close` was called (or a shard was closed): its batches are then refused (`ConfigError`)."""
        return self._closed or any(shard.closed for shard in self.shards)

    def close(self) -> None:
        """Close every shard (`DocumentStore.close`: a remote shard's requests in flight are waited for)."""
        self._closed = True
        for shard in self.shards:
            shard.close()

    def __enter__(self) -> Corpus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_unique_ids(self) -> None:
        if len(set(self.ids)) == len(self.ids):
            return
        first: dict[str, int] = {}
        for index, name in enumerate(self.ids):
            seen = first.setdefault(name, index)
            if seen != index:
                duplicate_id(
                    name,
                    self._where(seen),
                    self._where(index),
                    rule="document ids must be unique across a corpus's shards (give each shard its own id prefix)",
                )

    def _where(self, index: int) -> str:
        shard, local = self.locate_document(index)
        return f"{self._shard_label(shard)} document index {local}"

    def _shard_label(self, shard: int) -> str:
        path = self.paths[shard]
        return f"shard {shard}{f' ({short_path(path)})' if path else ''}"

    def __reduce__(self) -> tuple[Any, ...]:
        # shards pickle as themselves (a memory-mapped store as its file name); nothing is re-checked
        return (_restore, (self.shards, self.paths))

    # -- what the stages read (see `streambatch.model.documents.TokenSource`) -------------
    def __len__(self) -> int:
        return len(self.ids)

    @property
    def flat_size(self) -> int:
        """Size of the virtual flat token space: the sum of the shards' ``flat_size``."""
        return int(self.bases[-1])

    @property
    def token_count(self) -> int:
        """Tokens over all documents of all shards."""
        return int(self.lengths.sum())

    def content_fingerprint(self) -> str:
        """``fingerprint``, or for shards held in memory the same hash over their content fingerprints (computed once)."""
        if self._content is None:
            self._content = corpus_fingerprint([s.content_fingerprint() for s in self.shards])
        return self._content

    def partition(self, index: int) -> Partition:
        """The partition of document *index* (a corpus-wide index)."""
        return PARTITIONS[int(self.partition_codes[index])]

    def shard_of(self, document_indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Shard of each corpus-wide document index."""
        return self.flat().shard_of(document_indices)

    @property
    def tokenizer(self) -> dict[str, Any] | None:
        """The shards' tokenizer (they never record two: `check_one_tokenizer`), or None when none records one."""
        return next((s.tokenizer for s in self.shards if s.tokenizer is not None), None)

    def flat(self) -> Flat:
        """The virtual flat token space of the shards (`streambatch.model.flat`): shard ``k`` at ``bases[k]``."""
        if self._flat is None:
            self._flat = Flat(
                tuple(s.tokens for s in self.shards), self.bases, self.starts, self.document_bases,
                tuple(s.loss_bits for s in self.shards), tuple(token_file(s.tokens) for s in self.shards), self.dtype,
                sharded=True, paths=self.paths,
            )  # fmt: skip
        return self._flat

    def window_tokens(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[Any]:
        """``(n, length)`` tokens starting at global *positions*, read from each position's shard.

        >>> a = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"])
        >>> b = DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
        >>> Corpus([a, b]).window_tokens([6, 1], 2).tolist()
        [[20, 21], [10, 11]]
        """
        return self.flat().window_tokens(positions, length)

    @property
    def has_loss_mask(self) -> bool:
        """Whether any shard carries a loss mask (the others then train every target)."""
        return self.flat().has_loss_mask

    def loss_mask(self, index: int) -> npt.NDArray[np.bool_]:
        """Document *index*'s (corpus-wide) effective loss mask."""
        shard, local = self.locate_document(index)
        return self.shards[shard].loss_mask(local)

    def target_mask(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[np.bool_] | None:
        """``(n, length)`` loss-mask bits of the targets of rows at global *positions*, per shard; None without masks.

        >>> a = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5], ids=["a"], loss_mask=[0, 1, 0, 1, 1])
        >>> b = DocumentStore.from_arrays([0, 20, 21, 1], [0, 4], ids=["b"])
        >>> Corpus([a, b]).target_mask([6, 0], 2).astype(int).tolist()
        [[1, 1], [1, 0]]
        """
        return self.flat().target_mask(positions, length)

    def mask_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """The loss-mask bit of each global token position, read from its shard (True where a shard has no mask)."""
        return self.flat().mask_at(positions)

    def locate_document(self, index: int) -> tuple[int, int]:
        """``(shard, index within the shard)`` of corpus-wide document *index*."""
        shard = int(self.shard_of(index))
        return shard, int(index) - int(self.document_bases[shard])

    def document(self, index: int) -> Document:
        """Document *index* (corpus-wide) as a `Document`."""
        shard, local = self.locate_document(index)
        return self.shards[shard].document(local)

    def __iter__(self) -> Iterator[Document]:
        return (doc for shard in self.shards for doc in shard)

    def select(self, partition: Partition | str) -> Corpus:
        """The corpus of each shard's documents in one partition (tokens shared; same fingerprint, like `select`)."""
        return _restore(tuple(s.select(partition) for s in self.shards), self.paths)

    def __repr__(self) -> str:
        return (
            f"Corpus({len(self.shards)} shards, {len(self)} documents, {self.flat_size} tokens, {self.dtype.name}, "
            f"fingerprint={self.fingerprint!r})"
        )


def _frozen(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    array.flags.writeable = False
    return array


def _restore(shards: tuple[DocumentStore, ...], paths: tuple[str | None, ...]) -> Corpus:
    return Corpus(shards, paths=paths, _checked=True)
