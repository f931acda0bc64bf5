"""The batch: one ``[width, T]`` stack of complete windows and where each row came from.

`streambatch.materialize` makes them; the trainer and the reducer consume them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import AccumulationError, RowIndexError
from ..items.windows.window_index import IntArray
from ..items.windows.windows import WindowSpace
from ..model.documents import PARTITIONS, Partition
from .reduce import TokenContribution, TokenMean, token_mean


@dataclass(frozen=True)
class WindowProvenance:
    """Where one batch row came from (*shard*: the store of a `streambatch.Corpus`; 0 for a store)."""

    document_id: str
    document_index: int
    start: int
    partition: Partition
    shard: int = 0

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}"


class MiniBatch:
    """One row-major ``[width, T]`` stack of complete windows; no padding rows or ids.

    ``inputs`` and ``targets`` are C-contiguous numpy arrays in the store's token
    dtype (uint16 or uint32).  ``positions`` holds each row's first token in the
    store; provenance (document index, start, id) is resolved from it on demand.
    ``(epoch, index)`` is the batch's place in a run (`streambatch.Run`); a batch
    of a lone `Epoch` has ``epoch`` 0.
    """

    __slots__ = ("_located", "epoch", "index", "inputs", "positions", "space", "targets")

    def __init__(
        self,
        index: int,
        inputs: npt.NDArray[Any],
        targets: npt.NDArray[Any],
        positions: npt.NDArray[Any],
        space: WindowSpace,
        epoch: int = 0,
    ) -> None:
        self.epoch = epoch
        self.index = index
        self.inputs = inputs
        self.targets = targets
        self.positions = positions
        self.space = space  # the store and window numbering the rows come from
        self._located: tuple[IntArray, IntArray] | None = None

    def in_epoch(self, epoch: int) -> MiniBatch:
        """This batch placed in epoch *epoch* of a run: a new `MiniBatch` sharing the same arrays."""
        return MiniBatch(self.index, self.inputs, self.targets, self.positions, self.space, epoch)

    def _locate(self) -> tuple[IntArray, IntArray]:
        if self._located is None:
            self._located = self.space.index.locate_positions(self.positions)
        return self._located

    @property
    def document_indices(self) -> IntArray:
        """Document index of each row (resolved on first use)."""
        return self._locate()[0]

    @property
    def starts(self) -> IntArray:
        """Start of each row within its document."""
        return self._locate()[1]

    @property
    def shards(self) -> IntArray:
        """Shard of each row: which store of a `streambatch.Corpus` it came from (all 0 for one store)."""
        return self.space.store.shard_of(self.document_indices)

    @property
    def window_numbers(self) -> IntArray:
        """Global window number of each row."""
        return self.space.index.windows_at(self.positions)

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Partition of each row."""
        codes = self.space.store.partition_codes[self.document_indices]
        return tuple(PARTITIONS[c] for c in codes.tolist())

    @property
    def partition(self) -> Partition | None:
        """The partition of every row (None for an empty batch)."""
        parts = set(self.partitions)
        return parts.pop() if len(parts) == 1 else None

    @property
    def width(self) -> int:
        """Rows actually present (never the requested capacity)."""
        return int(self.inputs.shape[0])

    @property
    def context_length(self) -> int:
        """``T``: input and target length of every row."""
        return int(self.inputs.shape[1])

    @property
    def shape(self) -> tuple[int, int]:
        """``(width, T)``."""
        return (self.width, self.context_length)

    @property
    def token_count(self) -> int:
        """Target tokens in this batch: ``width * T``; the token-mean denominator."""
        return int(self.targets.size)

    @property
    def document_ids(self) -> list[str]:
        """Document id of each row."""
        ids = self.space.store.ids
        return [ids[i] for i in self.document_indices.tolist()]

    @property
    def provenance(self) -> tuple[WindowProvenance, ...]:
        """Per row: document id, document index, start, partition."""
        ids = self.space.store.ids
        rows = zip(self.document_indices.tolist(), self.starts.tolist(), self.partitions, self.shards.tolist(), strict=True)
        return tuple(WindowProvenance(ids[d], d, s, p, k) for d, s, p, k in rows)

    def _row(self, buffer: npt.NDArray[Any], row: int) -> npt.NDArray[Any]:
        if not isinstance(row, (int, np.integer)) or not 0 <= row < self.width:
            raise RowIndexError(f"row={row!r} is out of range for a batch of width {self.width}; use 0 <= row < width")
        row_view: npt.NDArray[Any] = buffer[row]
        return row_view

    def input_row(self, row: int) -> npt.NDArray[Any]:
        """Input ids of *row*; raises `RowIndexError` (an IndexError) when out of range."""
        return self._row(self.inputs, row)

    def target_row(self, row: int) -> npt.NDArray[Any]:
        """Target ids of *row*; raises `RowIndexError` (an IndexError) when out of range."""
        return self._row(self.targets, row)

    def average_token_contributions(self, contributions: Sequence[TokenContribution]) -> TokenMean:
        """Token mean of exactly one contribution per target token, in row-major order."""
        items = list(contributions)
        if len(items) != self.token_count:
            raise AccumulationError(
                f"got {len(items)} contributions for a batch of {self.token_count} target tokens "
                f"(shape {list(self.shape)}); pass exactly one per target token"
            )
        return token_mean(items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MiniBatch):
            return NotImplemented
        return (
            self.epoch == other.epoch
            and self.index == other.index
            and self.partitions == other.partitions
            and np.array_equal(self.inputs, other.inputs)
            and np.array_equal(self.targets, other.targets)
            and np.array_equal(self.document_indices, other.document_indices)
            and np.array_equal(self.starts, other.starts)
            and self.document_ids == other.document_ids
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        epoch = f"epoch={self.epoch}, " if self.epoch else ""
        return f"MiniBatch({epoch}index={self.index}, shape={self.shape})"
