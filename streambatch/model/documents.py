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
from .mask import all_trained, check_loss_mask
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
    """One tokenized document: a non-empty id, its partition, uint32 token ids and an optional loss mask.

    *loss_mask* holds one bool per token: True trains that token as a target (it
    is predicted from the tokens before it).  Position 0 is never a target, so its
    entry is always stored False; None (the default) trains every target.

    *where* says where it came from (``"docs.jsonl:3"``); errors about it, such
    as a duplicate id found later by a store, name that place.

    >>> doc = Document("train-a", "train", [0, 10, 11, 12, 1])
    >>> doc.partition, doc.tokens.tolist()
    (<Partition.TRAIN: 'train'>, [0, 10, 11, 12, 1])
    >>> Document("sft", "train", [5, 6, 7, 8], loss_mask=[1, 0, 1, 1]).loss_mask.tolist()
    [False, False, True, True]
    """

    id: str
    partition: Partition
    tokens: npt.NDArray[np.uint32] = field(repr=False)
    loss_mask: npt.NDArray[np.bool_] | None = field(default=None, repr=False)
    where: str = field(default="", repr=False, compare=False)

    def __init__(
        self,
        id: str,  # noqa: A002
        partition: Partition | str,
        tokens: Any,
        loss_mask: Any = None,
        *,
        where: str = "",
    ) -> None:
        named = isinstance(id, str) and bool(id)
        label = f"{where} (document id={id!r})" if where and named else where or f"document id={id!r}"
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "id", check_id(id, label))
        object.__setattr__(self, "partition", Partition.parse(partition, label))
        array = check_tokens(tokens, label)
        array.flags.writeable = False
        object.__setattr__(self, "tokens", array)
        mask = None if loss_mask is None else check_loss_mask(loss_mask, array.size, label)
        if mask is not None:
            mask.flags.writeable = False
        object.__setattr__(self, "loss_mask", mask)

    @property
    def trained(self) -> npt.NDArray[np.bool_]:
        """The effective mask: `loss_mask`, or every position but 0 when there is none."""
        return self.loss_mask if self.loss_mask is not None else all_trained(self.tokens.size)

    @property
    def target_count(self) -> int:
        """Targets this document trains (positions 1.. whose mask is set)."""
        return int(np.count_nonzero(self.loss_mask)) if self.loss_mask is not None else max(0, self.tokens.size - 1)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Document):
            return NotImplemented
        same = self.id == other.id and self.partition == other.partition and np.array_equal(self.tokens, other.tokens)
        unmasked = self.loss_mask is None and other.loss_mask is None
        return same and (unmasked or np.array_equal(self.trained, other.trained))

    def __hash__(self) -> int:
        return hash((self.id, self.partition, self.tokens.tobytes()))

    def __len__(self) -> int:
        return int(self.tokens.size)
