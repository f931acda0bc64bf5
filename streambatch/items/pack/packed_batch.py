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
  ``max_seqlen``, ``sequence_is_pad``: see `streambatch.items.pack._pack_gather`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ...errors import AccumulationError
from ...model.documents import PARTITIONS, Partition
from ...stages.batch import MiniBatch, WindowProvenance
from ...stages.reduce import TokenContribution, TokenMean, token_mean
from ..windows.window_index import IntArray
from ._pack_gather import PackedArrays


@dataclass(frozen=True)
class SegmentProvenance(WindowProvenance):
    """Where one segment of a packed batch came from: a piece of *length* targets from *start*, in batch *row*."""

    length: int = 0
    row: int = 0

    def __str__(self) -> str:
        return f"{self.document_id}@{self.start}+{self.length}"


_Batch = TypeVar("_Batch", bound="PackedBatch")


class PackedBatch(MiniBatch):
    """One ``[width, T]`` stack of packed rows (see the module docstring); made by `sb.materialize` of `Rows`.

    Every array, per-segment provenance included, is made when the batch is made
    (one pass of the C gather, or the numpy gather); ``sequence_is_pad`` is read from them on use.
    """

    __slots__ = (
        "_segments",
        "cu_seqlens",
        "loss_mask",
        "max_seqlen",
        "position_ids",
        "row_space",
        "segment_ids",
        "target_count",
    )

    def __init__(self, index: int, arrays: PackedArrays, rows: npt.NDArray[Any], space: Any, epoch: int = 0) -> None:
        self.epoch = epoch
        self.index = index
        self.inputs = arrays.inputs
        self.targets = arrays.targets
        self.segment_ids = arrays.segment_ids  # (w, T) ids (`id_dtype`): 0, 1, ... by segment within each row; -1 at padding
        self.position_ids = arrays.position_ids  # (w, T) ids (`id_dtype`): 0 at each segment's first position, +1 along it
        self.loss_mask = arrays.loss_mask  # (w, T) bool: True at real targets, False at padding
        self.target_count = arrays.target_count  # real targets: loss_mask.sum()
        self.cu_seqlens = arrays.cu_seqlens  # int32 varlen boundaries over the flattened w * T positions
        self.max_seqlen = arrays.max_seqlen  # the longest sequence of cu_seqlens
        self.positions = rows
        self.space = space  # a RowSpace: .store and .partition as a WindowSpace has them
        self.row_space = space  # a streambatch.items.pack.rows.RowSpace: the source, the packing, the partition
        self._located = None
        self._segments = np.stack(
            [arrays.segment_rows, arrays.segment_documents, arrays.segment_starts, arrays.segment_lengths]
        ).astype(np.int64, copy=False)

    @classmethod
    def from_kernel(cls, index: int, outputs: tuple[Any, ...], rows: npt.NDArray[Any], space: Any) -> PackedBatch:
        """A batch from the C gather's outputs, every array made by it: inputs, targets, segment and position
        ids, loss mask, cu_seqlens, provenance (int64 ``(4, segments)``: row, document, start, targets),
        target count, longest sequence."""
        self = object.__new__(cls)
        (self.inputs, self.targets, self.segment_ids, self.position_ids, self.loss_mask, self.cu_seqlens, self._segments,
         self.target_count, self.max_seqlen) = outputs  # fmt: skip
        self.epoch, self.index, self.positions = 0, index, rows
        self.space = self.row_space = space
        self._located = None
        return self

    def _provenance(self) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """``(segment_rows, documents, starts, lengths)``: rows of the provenance made with the batch."""
        found = self._segments
        return found[0], found[1], found[2], found[3]

    def _locate(self) -> tuple[IntArray, IntArray]:
        found = self._provenance()
        return found[1], found[2]

    @property
    def arrays(self) -> PackedArrays:
        """Every array of the batch as one `PackedArrays`."""
        rows, documents, starts, lengths = self._provenance()
        return PackedArrays(
            self.inputs, self.targets, self.segment_ids, self.position_ids, self.loss_mask, self.target_count,
            self.cu_seqlens, self.max_seqlen, self.sequence_is_pad, rows, documents, starts, lengths,
        )  # fmt: skip

    def in_epoch(self: _Batch, epoch: int) -> _Batch:
        """This batch placed in epoch *epoch* of a run: a new batch of the same class sharing the same arrays."""
        twin = object.__new__(type(self))
        for name in _slots(type(self)):
            setattr(twin, name, getattr(self, name))
        twin.epoch = epoch
        return twin

    @property
    def rows(self) -> IntArray:
        """Row number (in the packing) of each row of this batch."""
        return self.positions.astype(np.int64, copy=False)

    @property
    def window_numbers(self) -> IntArray:
        """The row numbers (a packed batch's items are rows)."""
        return self.rows

    @property
    def token_count(self) -> int:
        """The token mean's denominator: the real targets (`target_count`), never padding."""
        return self.target_count

    @property
    def pad_count(self) -> int:
        """Padding positions: ``width * T - target_count``."""
        return int(self.targets.size) - self.target_count

    @property
    def sequence_is_pad(self) -> npt.NDArray[np.bool_]:
        """Per sequence of `cu_seqlens`: True for a row's padding."""
        return ~self.loss_mask.reshape(-1)[self.cu_seqlens[:-1]]

    @property
    def segment_rows(self) -> IntArray:
        """Per segment: its row in this batch."""
        return self._provenance()[0]

    @property
    def segment_lengths(self) -> IntArray:
        """Per segment: its targets (positions occupied)."""
        return self._provenance()[3]

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
        columns = zip(
            self.document_ids,
            self.document_indices.tolist(),
            self.starts.tolist(),
            self.partitions,
            self.shards.tolist(),
            self.segment_lengths.tolist(),
            self.segment_rows.tolist(),
            strict=True,
        )
        return tuple(SegmentProvenance(i, d, s, p, k, n, r) for i, d, s, p, k, n, r in columns)

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


def _slots(cls: type) -> tuple[str, ...]:
    """Every slot of *cls* and its bases (a subclass such as a packed mixture batch adds its own)."""
    return tuple(name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ()))
