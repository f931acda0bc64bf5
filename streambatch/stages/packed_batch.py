"""The packed batch: ``[width, T]`` rows of whole pieces of documents, with the ids and masks attention needs.

`PackedBatch` is a `MiniBatch` (same ``index``, ``epoch``, ``inputs``,
``targets``, ``width``, ``shape``, ``in_epoch``), so every consumer of batches
takes it; in window mode nothing changes (`sb.materialize` of windows still
gives a plain `MiniBatch`).  What differs, and why:

- ``token_count`` is ``target_count``: the real targets (``loss_mask.sum()``),
  the token mean's denominator.  Padding never counts.
- Padding positions hold ``pad_id`` (default 0, `sb.pack(..., pad_id=)`) in
  ``inputs`` **and** ``targets``, with ``loss_mask`` False and ``segment_ids``
  -1: the pad target is not a token to learn.  `streambatch.torch.tensor_batch`
  writes ``-100`` (cross-entropy's ``ignore_index``) there in ``long`` targets.
- Provenance is per *segment* (a piece of one document), not per row:
  ``document_indices``, ``starts``, ``document_ids``, ``provenance``
  (`SegmentProvenance`: id, index, start, length, row), ``segment_rows``,
  ``segment_lengths``.  ``positions`` (and ``rows``) hold the batch's row
  numbers in the packing.
- ``segment_ids``, ``position_ids``, ``loss_mask``, ``cu_seqlens``,
  ``max_seqlen``, ``sequence_is_pad``: see `streambatch.stages._pack_gather`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import AccumulationError
from ..model.documents import PARTITIONS, Partition
from ._pack_gather import PackedArrays
from .batch import MiniBatch, WindowProvenance
from .reduce import TokenContribution, TokenMean, token_mean
from .window_index import IntArray


@dataclass(frozen=True)
class SegmentProvenance(WindowProvenance):
    """Where one segment of a packed batch came from: a piece of *length* targets from *start*, in batch *row*."""

    length: int = 0
    row: int = 0

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}+{self.length}"


class PackedBatch(MiniBatch):
    """One ``[width, T]`` stack of packed rows (see the module docstring); made by `sb.materialize` of `Rows`."""

    __slots__ = ("arrays", "row_space")

    def __init__(self, index: int, arrays: PackedArrays, rows: npt.NDArray[Any], space: Any, epoch: int = 0) -> None:
        self.epoch = epoch
        self.index = index
        self.inputs = arrays.inputs
        self.targets = arrays.targets
        self.positions = rows
        self.arrays = arrays
        self.space = space  # a RowSpace: .store and .partition as a WindowSpace has them
        self.row_space = space  # a streambatch.stages.rows.RowSpace: the source, the packing, the partition
        self._located = (arrays.segment_documents, arrays.segment_starts)

    def in_epoch(self, epoch: int) -> PackedBatch:
        """This batch placed in epoch *epoch* of a run: a new `PackedBatch` sharing the same arrays."""
        return PackedBatch(self.index, self.arrays, self.positions, self.row_space, epoch)

    @property
    def rows(self) -> IntArray:
        """Row number (in the packing) of each row of this batch."""
        return self.positions.astype(np.int64, copy=False)

    @property
    def window_numbers(self) -> IntArray:
        """The row numbers (a packed batch's items are rows)."""
        return self.rows

    @property
    def segment_ids(self) -> npt.NDArray[np.int32]:
        """``(w, T)``: 0, 1, ... by segment within each row; -1 at padding."""
        return self.arrays.segment_ids

    @property
    def position_ids(self) -> npt.NDArray[np.int32]:
        """``(w, T)``: 0 at each segment's first position, +1 along it (padding counts on from 0 too)."""
        return self.arrays.position_ids

    @property
    def loss_mask(self) -> npt.NDArray[np.bool_]:
        """``(w, T)``: True at real targets, False at padding."""
        return self.arrays.loss_mask

    @property
    def target_count(self) -> int:
        """Real targets: ``loss_mask.sum()``."""
        return self.arrays.target_count

    @property
    def token_count(self) -> int:
        """The token mean's denominator: the real targets (`target_count`), never padding."""
        return self.arrays.target_count

    @property
    def pad_count(self) -> int:
        """Padding positions: ``width * T - target_count``."""
        return int(self.targets.size) - self.arrays.target_count

    @property
    def cu_seqlens(self) -> npt.NDArray[np.int32]:
        """Varlen boundaries over the flattened ``w * T`` positions (segments, then each row's padding as one)."""
        return self.arrays.cu_seqlens

    @property
    def max_seqlen(self) -> int:
        """The longest sequence of `cu_seqlens`."""
        return self.arrays.max_seqlen

    @property
    def sequence_is_pad(self) -> npt.NDArray[np.bool_]:
        """Per sequence of `cu_seqlens`: True for a row's padding."""
        return self.arrays.sequence_is_pad

    @property
    def segment_rows(self) -> IntArray:
        """Per segment: its row in this batch."""
        return self.arrays.segment_rows

    @property
    def segment_lengths(self) -> IntArray:
        """Per segment: its targets (positions occupied)."""
        return self.arrays.segment_lengths

    @property
    def shards(self) -> IntArray:
        """Per segment: the store of a `streambatch.Corpus` it came from (all 0 for one store)."""
        return self.row_space.store.shard_of(self.document_indices)  # type: ignore[no-any-return]

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Partition of each segment."""
        codes = self.row_space.store.partition_codes[self.document_indices]
        return tuple(PARTITIONS[c] for c in codes.tolist())

    @property
    def document_ids(self) -> list[str]:
        """Document id of each segment."""
        ids = self.row_space.store.ids
        return [ids[i] for i in self.document_indices.tolist()]

    @property
    def provenance(self) -> tuple[SegmentProvenance, ...]:
        """Per segment, row by row: document id, index, start, partition, shard, length (targets), row."""
        ids = self.row_space.store.ids
        columns = zip(
            self.document_indices.tolist(),
            self.starts.tolist(),
            self.partitions,
            self.shards.tolist(),
            self.segment_lengths.tolist(),
            self.segment_rows.tolist(),
            strict=True,
        )
        return tuple(SegmentProvenance(ids[d], d, s, p, k, n, r) for d, s, p, k, n, r in columns)

    def average_token_contributions(self, contributions: Sequence[TokenContribution]) -> TokenMean:
        """Token mean of exactly one contribution per real target, row-major over ``loss_mask``."""
        items = list(contributions)
        if len(items) != self.token_count:
            raise AccumulationError(
                f"got {len(items)} contributions for a packed batch of {self.token_count} real targets "
                f"(shape {list(self.shape)}, {self.pad_count} padding); pass exactly one per real target"
            )
        return token_mean(items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MiniBatch):
            return NotImplemented
        if not isinstance(other, PackedBatch):
            return False
        mine, theirs = self.arrays, other.arrays
        return (
            self.epoch == other.epoch
            and self.index == other.index
            and np.array_equal(self.positions, other.positions)
            and all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(mine, theirs, strict=True))
            and self.document_ids == other.document_ids
        )

    __hash__ = None

    def __repr__(self) -> str:
        epoch = f"epoch={self.epoch}, " if self.epoch else ""
        return f"PackedBatch({epoch}index={self.index}, shape={self.shape}, target_count={self.target_count})"
