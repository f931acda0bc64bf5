"""The data model's units: `Partition` and `Document`.

A document is a non-empty id, its partition and uint32 token ids.  Many
documents live in one flat `streambatch.model.store.DocumentStore`; a
`streambatch.model.corpus.Corpus` reads several stores as one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DataError
from .validate import check_id, check_tokens, short


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
        raise DataError(f"{where}: partition={short(value)} is not one of {choices}; use one of those")

    @property
    def code(self) -> int:
        """The small integer a store keeps for this partition (train=0, validation=1, test=2)."""
        return _PARTITION_CODES[self]

    def __str__(self) -> str:
        return self.value


_PARTITION_CODES = {p: i for i, p in enumerate(Partition)}
PARTITIONS = tuple(Partition)


@dataclass(frozen=True, eq=False)
class Document:
    """One tokenized document: a non-empty id, its partition and uint32 token ids.

    *where* says where it came from (``"docs.jsonl:3"``); errors about it, such
    as a duplicate id found later by a store, name that place.

    >>> doc = Document("train-a", "train", [0, 10, 11, 12, 1])
    >>> doc.partition, doc.tokens.tolist()
    (<Partition.TRAIN: 'train'>, [0, 10, 11, 12, 1])
    """

    id: str
    partition: Partition
    tokens: npt.NDArray[np.uint32] = field(repr=False)
    where: str = field(default="", repr=False, compare=False)

    def __init__(self, id: str, partition: Partition | str, tokens: Any, *, where: str = "") -> None:  # noqa: A002
        named = isinstance(id, str) and bool(id)
        label = f"{where} (document id={id!r})" if where and named else where or f"document id={id!r}"
        object.__setattr__(self, "where", where)
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
