"""Stage 5, materialize: gather one batch's rows straight into its final arrays.

Token buffers are created only when a batch is emitted: one vectorized gather
per buffer from a read-only sliding view of the flat token array, giving
C-contiguous ``inputs[w, T]`` and ``targets[w, T]``.  No per-window staging copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from .accumulate import TokenContribution, TokenMean, TokenMeanAccumulator
from .documents import PARTITIONS, DocumentStore, Partition
from .errors import AccumulationError, StreamBatchError
from .windows import IntArray, WindowIndex


class RowIndexError(StreamBatchError, IndexError):
    """A batch row index is out of range."""


@dataclass(frozen=True)
class WindowProvenance:
    """Where one batch row came from."""

    document_id: str
    document_index: int
    start: int
    partition: Partition

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}"


class MiniBatch:
    """One row-major ``[width, T]`` stack of complete windows; no padding rows or ids.

    ``inputs`` and ``targets`` are C-contiguous numpy arrays in the store's token
    dtype (uint16 or uint32).  Provenance is kept as arrays and resolved to ids on
    demand by `provenance`.
    """

    __slots__ = ("_ids", "document_indices", "index", "inputs", "partition", "starts", "targets", "windows")

    def __init__(
        self,
        *,
        index: int,
        inputs: npt.NDArray[Any],
        targets: npt.NDArray[Any],
        windows: IntArray,
        document_indices: IntArray,
        starts: IntArray,
        partition: Partition,
        ids: Sequence[str],
    ) -> None:
        self.index = index
        self.inputs = inputs
        self.targets = targets
        self.windows = windows
        self.document_indices = document_indices
        self.starts = starts
        self.partition = partition
        self._ids = ids

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
        return [self._ids[i] for i in self.document_indices.tolist()]

    @property
    def provenance(self) -> tuple[WindowProvenance, ...]:
        """Per row: document id, document index, start, partition."""
        return tuple(
            WindowProvenance(self._ids[d], d, s, self.partition)
            for d, s in zip(self.document_indices.tolist(), self.starts.tolist(), strict=True)
        )

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
        first = items[0]
        if not isinstance(first, TokenContribution):
            raise AccumulationError(f"contributions[0]={first!r} is not a TokenContribution")
        accumulator = TokenMeanAccumulator(first.gradient_width)
        for item in items:
            accumulator.add_token(item)
        return accumulator.finish()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MiniBatch):
            return NotImplemented
        return (
            self.index == other.index
            and self.partition == other.partition
            and np.array_equal(self.inputs, other.inputs)
            and np.array_equal(self.targets, other.targets)
            and np.array_equal(self.document_indices, other.document_indices)
            and np.array_equal(self.starts, other.starts)
            and self.document_ids == other.document_ids
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MiniBatch(index={self.index}, shape={self.shape}, partition={self.partition.value!r})"


class Materializer:
    """Gathers batches from one store for one window numbering.

    >>> store = DocumentStore.from_arrays([0, 10, 11, 12, 1], [0, 5])
    >>> from streambatch.windows import WindowConfig
    >>> batch = Materializer(store, WindowIndex(store.lengths, WindowConfig(2)))(np.array([2, 0]))
    >>> batch.inputs.tolist(), batch.targets.tolist()
    ([[11, 12], [0, 10]], [[12, 1], [10, 11]])
    """

    __slots__ = ("_index", "_store", "_view")

    def __init__(self, store: DocumentStore, index: WindowIndex) -> None:
        self._store = store
        self._index = index
        length = index.config.context_length
        tokens = store.tokens
        # rows of the view are every T-token run of the flat array; only rows whose
        # T + 1 tokens lie inside one document are ever selected
        self._view = sliding_window_view(tokens, length) if tokens.size >= length else None

    def __call__(self, windows: npt.ArrayLike, index: int = 0) -> MiniBatch:
        numbers = np.asarray(windows, dtype=np.int64)
        documents, starts = self._index.locate(numbers)
        if self._view is None or numbers.size == 0:
            length = self._index.config.context_length
            empty = np.zeros((0, length), dtype=self._store.tokens.dtype)
            inputs, targets = empty, empty.copy()
        else:
            positions = self._store.starts[documents] + starts
            inputs = self._view[positions]
            positions += 1
            targets = self._view[positions]
        codes = self._store.partition_codes
        partition = PARTITIONS[int(codes[documents[0]])] if documents.size else Partition.TRAIN
        return MiniBatch(
            index=index,
            inputs=inputs,
            targets=targets,
            windows=numbers,
            document_indices=documents,
            starts=starts,
            partition=partition,
            ids=self._store.ids,
        )
