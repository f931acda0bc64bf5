"""The source protocol: what the stages read, and the one place a user's source becomes one.

A source is a `DocumentStore`, a `streambatch.model.corpus.Corpus` of several
stores, what `streambatch.open_source` returns (a `Source`), or any iterable of
`Document` (read into a store once).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, PartitionError
from .corpus import Corpus
from .documents import PARTITIONS, Document, Partition
from .flat import Flat
from .store import DocumentStore
from .validate import short


class TokenSource(Protocol):
    """What the stages and the item kinds read from a corpus: a `DocumentStore` (a remote one too), or a
    `streambatch.Corpus` of several.

    Documents sit in one flat token space of ``flat_size`` positions (a corpus
    makes it virtual, one range per shard); ``starts`` index it.  What a gather
    reads (each shard's tokens and mask bits, where shards and documents sit,
    the files behind them) is one value, `flat`: no reader asks which kind of
    store it holds.
    """

    @property
    def starts(self) -> npt.NDArray[np.int64]: ...
    @property
    def lengths(self) -> npt.NDArray[np.int64]: ...
    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def partition_codes(self) -> npt.NDArray[np.uint8]: ...
    @property
    def fingerprint(self) -> str | None: ...
    @property
    def flat_size(self) -> int: ...
    @property
    def token_count(self) -> int: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def tokenizer(self) -> dict[str, Any] | None: ...
    @property
    def shards(self) -> tuple[DocumentStore, ...]:
        """The stores behind the source, in order (a store: itself)."""
        ...

    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Document]: ...
    def partition(self, index: int) -> Partition: ...
    def document(self, index: int) -> Document: ...
    def content_fingerprint(self) -> str: ...
    def shard_of(self, document_indices: npt.ArrayLike) -> npt.NDArray[np.int64]: ...
    def flat(self) -> Flat:
        """The flat token space: each shard's tokens and mask bits, bases, document starts, files (`Flat`)."""
        ...

    def window_tokens(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[Any]: ...
    @property
    def closed(self) -> bool:
        """Whether `close` was called (a remote store's requests were drained and its memory given back)."""
        ...

    def close(self) -> None:
        """Drain a remote store's requests in flight and give its memory back (a local store: nothing to do)."""
        ...

    # -- the loss mask (`streambatch.model.mask`): without one, every target trains ---------------
    @property
    def has_loss_mask(self) -> bool:
        """Whether the source carries a loss mask (a corpus: any shard)."""
        ...

    def loss_mask(self, index: int) -> npt.NDArray[np.bool_]:
        """Document *index*'s effective loss mask (position 0 never trains)."""
        ...

    def target_mask(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[np.bool_] | None:
        """``(n, length)`` mask bits of the targets of rows at flat *positions*; None without a mask."""
        ...

    def mask_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """The mask bit of each flat token position (True without a mask)."""
        ...


def partition_documents(
    source: TokenSource, partition: Partition | str, *, keep_partition: bool = False
) -> npt.NDArray[np.bool_] | None:
    """The rule every epoch follows: which documents of *source* it reads.

    An epoch reads one partition.  A document of another partition is refused
    (`PartitionError` naming the first one: the chapter's rule, so validation
    text never reaches a training epoch by accident) unless *keep_partition* is
    set, which keeps the documents of *partition* and skips the others.  Returns
    None when every document is in *partition*, else the mask of those that are.

    >>> from streambatch.model.store import DocumentStore
    >>> store = DocumentStore.from_arrays([1, 2, 3, 4], [0, 2, 4], partition=["train", "test"])
    >>> partition_documents(store, "train", keep_partition=True).tolist()
    [True, False]
    """
    wanted = Partition.parse(partition)
    inside: npt.NDArray[np.bool_] = np.asarray(source.partition_codes == wanted.code)
    if bool(inside.all()):
        return None
    if not keep_partition and not bool(inside.any()):  # --keep-partition would give an empty epoch: name the partition
        present = [PARTITIONS[int(c)].value for c in np.unique(np.asarray(source.partition_codes))]
        raise PartitionError(
            f"no document is in the epoch's partition {wanted.value!r} (the source holds "
            f"{', '.join(repr(p) for p in present)}); read them with --partition {present[0]} on the command line "
            f"(partition={present[0]!r} in Python)"
        )
    if not keep_partition:
        index = int(np.flatnonzero(~inside)[0])
        raise PartitionError(
            f"document id={source.ids[index]!r} (document index {index}) is in partition "
            f"{source.partition(index).value!r}, not the epoch's {wanted.value!r}; keep one partition "
            f"per epoch: on the command line add --keep-partition (with --partition {wanted.value}); in Python "
            f"pass keep_partition=True, use store.select({wanted.value!r}) or the reader's partition= filter"
        )
    return inside


@dataclass(frozen=True)
class Source:
    """Documents opened from *path* by `streambatch.open_source`: the store (or corpus) and what kind of source it was.

    Accepted wherever a source is: the stages and façades read ``.store``.
    """

    path: str
    kind: str  # "store" (memory-mapped directory), "corpus" (a manifest of stores), "jsonl" (read into memory),
    # "megatron" or "datatrove" (another tool's files, memory-mapped)
    store: DocumentStore | Corpus
    verified: bool = False  # the store's fingerprint was checked against its content


def is_source(value: object) -> TypeGuard[DocumentStore | Corpus]:
    """Whether *value* is a token source already (a store, a remote one too, or a corpus), not documents to read:
    the one place that asks (what `as_source`, `write_store` and `open_corpus` take differs by it)."""
    return isinstance(value, (DocumentStore, Corpus))


def as_source(source: Any) -> DocumentStore | Corpus:
    """The `DocumentStore` or `Corpus` behind *source*: a store, a corpus, a `Source`, or an iterable of `Document`.

    >>> as_source([Document("a", "train", [1, 2])]).ids
    ('a',)
    """
    if isinstance(source, Source):
        return source.store
    if is_source(source):
        return source
    if isinstance(source, Document):
        raise ConfigError("source=Document(...) is a single document; pass a list of documents or a DocumentStore")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return DocumentStore.from_documents(source)
    raise ConfigError(
        f"source={short(source)} is not a DocumentStore, Corpus, opened Source or iterable of Document; pass one of those"
    )
