"""The epoch recomputed from the store alone, and each batch's provenance read as segments.

`Expected` holds what every audit compares against: the store, ``T``, the
partition, the batch widths ``[B] * k + [r]`` over the epoch's items, and the
counted targets of those items.  `Segments` is what the audit reads of a batch:
its provenance as one entry per segment (row, document, start, targets); a
window row is one segment of ``T`` targets, so a batch of windows and a batch of
packed rows are read alike (`streambatch.batch.minibatch.MiniBatch.segments`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ...epoch import Epoch
from ...errors import ConfigError
from ...items.untrained import item_targets
from ...items.windows.windows import windows
from ...stages.chunk import batch_widths

IntArray = npt.NDArray[np.int64]


class Expected:
    """The epoch's store, ``T``, partition and batch widths, and the counted targets of its items."""

    def __init__(self, epoch: Epoch) -> None:
        items = epoch.items
        self.epoch = epoch
        self.store = store = epoch.store
        self.context_length = epoch.context_length
        self.stride = epoch.stride
        self.code = epoch.partition.code
        self.batch_size = epoch.batch_size
        self.packed = items.packed  # items are packed rows: their batches carry the packed columns
        self.masked = bool(store.has_loss_mask)
        self.lengths: IntArray = store.lengths.astype(np.int64)
        self.included = store.partition_codes == self.code
        self.untrained = items.untrained  # skip_untrained's report (None: every item kept)
        self.item_count = len(items)  # the epoch's items (the kept ones under skip_untrained)
        self.widths = np.asarray(batch_widths(self.item_count, self.batch_size), dtype=np.int64)

    def origin(self, document: int, start: int) -> str:
        """``id@start (document index d)``: where a row or segment says it comes from."""
        name = self.store.ids[document] if 0 <= document < len(self.store) else f"<no document {document}>"
        return f"{name}@{start} (document index {document})"

    def all_windows(self) -> Any:
        """Every window of the partition (stride and ``T`` of the epoch), none dropped: what a window epoch holds."""
        return windows(
            self.store, context_length=self.context_length, stride=self.stride, partition=self.epoch.partition,
            keep_partition=True,
        )  # fmt: skip

    def window_targets(self) -> IntArray:
        """Counted targets of every window of the partition, from the store's bits."""
        return item_targets(self.all_windows())


class Segments(NamedTuple):
    """One batch's provenance per segment (int64), and the rows it claims: what every check reads."""

    batch: int  # the batch's index
    width: int  # rows the provenance claims
    rows: IntArray  # each segment's row
    documents: IntArray
    starts: IntArray
    lengths: IntArray  # targets of each segment
    whole: bool  # one segment of T targets per row, in row order: rows of windows (no packed columns needed)


def segments(piece: Any, context_length: int) -> Segments:
    """The `Segments` of a batch (or a batch-like object; or a chunk of items, not yet gathered).

    A batch with packed columns says where each segment lies (``segment_rows``,
    ``segment_lengths``); any other is one segment of ``T`` targets per row.
    """
    if not hasattr(piece, "document_indices"):  # a chunk of windows, not yet gathered
        documents, starts = (a.astype(np.int64, copy=False) for a in piece.locate())
        return _whole(piece.batch_index or 0, documents, starts, context_length)
    index = int(piece.index)
    documents = np.asarray(piece.document_indices, dtype=np.int64).reshape(-1)
    starts = np.asarray(piece.starts, dtype=np.int64).reshape(-1)
    if documents.size != starts.size:
        raise ConfigError(f"batch {index}: {documents.size} document indices but {starts.size} starts; one of each per row")
    if getattr(piece, "segment_ids", None) is None:  # rows of windows: one segment per row
        return _whole(index, documents, starts, context_length)
    width = int(np.asarray(piece.row_numbers).size)
    rows = np.asarray(piece.segment_rows, dtype=np.int64).reshape(-1)
    lengths = np.asarray(piece.segment_lengths, dtype=np.int64).reshape(-1)
    return Segments(index, width, rows, documents, starts, lengths, False)


def _whole(index: int, documents: IntArray, starts: IntArray, T: int) -> Segments:
    count = documents.size
    rows, lengths = _WHOLE.get((count, T)) or _whole_columns(count, T)
    return Segments(index, count, rows, documents, starts, lengths, True)


_WHOLE: dict[tuple[int, int], tuple[IntArray, IntArray]] = {}  # (rows, T) -> read-only row numbers and lengths


def _whole_columns(count: int, T: int) -> tuple[IntArray, IntArray]:
    """The row and length columns of *count* whole rows of ``T`` (made once per width: batches share them)."""
    rows, lengths = np.arange(count, dtype=np.int64), np.full(count, T, np.int64)
    rows.flags.writeable = lengths.flags.writeable = False
    if len(_WHOLE) < 64:
        _WHOLE[count, T] = (rows, lengths)
    return rows, lengths
