"""The source protocol: what the stages read, and the one place a user's source becomes one.

A source is a `DocumentStore`, a `streambatch.model.corpus.Corpus` of several
stores, what `streambatch.open_source` returns (a `Source`), or any iterable of
`Document` (read into a store once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, PartitionError
from .corpus import Corpus
from .documents import PARTITIONS, Document, Partition
from .store import DocumentStore
from .validate import short


class TokenSource(Protocol):
    """What the stages read from a corpus: a `DocumentStore`, or a `streambatch.Corpus` of several.

    Documents sit in one flat token space of ``flat_size`` positions (a corpus
    makes it virtual, one range per shard); ``starts`` index it.
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
    def __len__(self) -> int: ...
    def partition(self, index: int) -> Partition: ...
    def content_fingerprint(self) -> str: ...
    def shard_of(self, document_indices: npt.ArrayLike) -> npt.NDArray[np.int64]: ...
    def window_tokens(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[Any]: ...
    @property
    def tokenizer(self) -> dict[str, Any] | None: ...


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


def as_source(source: Any) -> DocumentStore | Corpus:
    """The `DocumentStore` or `Corpus` behind *source*: a store, a corpus, a `Source`, or an iterable of `Document`.

    >>> as_source([Document("a", "train", [1, 2])]).ids
    ('a',)
    """
    if isinstance(source, Source):
        return source.store
    if isinstance(source, (DocumentStore, Corpus)):
        return source
    if isinstance(source, Document):
        raise ConfigError("source=Document(...) is a single document; pass a list of documents or a DocumentStore")
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return DocumentStore.from_documents(source)
    raise ConfigError(
        f"source={short(source)} is not a DocumentStore, Corpus, opened Source or iterable of Document; pass one of those"
    )
