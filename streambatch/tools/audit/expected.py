"""The epoch's windows recomputed from the store alone, and each row classified against them."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...epoch import Epoch
from ...errors import ConfigError
from ...items.windows.window_index import window_counts
from ...stages.chunk import batch_widths


class Rows:
    """One piece's rows classified against the store: which are windows of the epoch, and why not."""

    __slots__ = ("cross_document", "cross_partition", "documents", "foreign", "inside", "numbers", "starts", "window")

    def __init__(self, expected: Expected, documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64]) -> None:
        store = expected.store
        self.documents, self.starts = documents, starts
        known = (documents >= 0) & (documents < len(store))
        safe = np.where(known, documents, 0)
        length = store.lengths[safe]
        self.cross_partition = known & (store.partition_codes[safe] != expected.code)
        # all T + 1 tokens inside the row's own document; compare, never add: starts may be anything
        self.inside = known & (starts >= 0) & (starts <= length - expected.source_length)
        self.cross_document = known & ~self.inside
        on_grid = starts % expected.stride == 0
        self.window = self.inside & ~self.cross_partition & on_grid
        self.foreign = ~known | (self.inside & ~self.cross_partition & ~on_grid)
        self.numbers = expected.first[safe] + starts // expected.stride  # valid where `window`


class Expected:
    """The epoch's windows computed from the store alone: per-document counts and first window numbers."""

    def __init__(self, epoch: Epoch) -> None:
        self.store = epoch.store
        self.context_length = epoch.context_length
        self.source_length = self.context_length + 1
        self.stride = epoch.stride
        self.code = epoch.partition.code
        self.batch_size = epoch.batch_size
        included = self.store.partition_codes == self.code
        self.counts = np.where(included, window_counts(self.store.lengths, self.context_length, self.stride), 0)
        self.cumulative = np.cumsum(self.counts)
        self.first = self.cumulative - self.counts
        self.window_count = int(self.cumulative[-1]) if self.cumulative.size else 0
        self.widths = np.asarray(batch_widths(self.window_count, self.batch_size), dtype=np.int64)

    def locate(self, numbers: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        documents = np.searchsorted(self.cumulative, numbers, side="right")
        return documents, (numbers - self.first[documents]) * self.stride

    def origin(self, document: int, start: int) -> str:
        name = self.store.ids[document] if 0 <= document < len(self.store) else f"<no document {document}>"
        return f"{name}@{start} (document index {document})"


def provenance(piece: Any) -> tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(batch index, document indices, starts)`` of a batch-like object or a `Windows` chunk."""
    if not hasattr(piece, "document_indices"):  # a chunk of windows, not yet gathered
        documents, starts = piece.locate()
        return (piece.batch_index or 0), documents.astype(np.int64, copy=False), starts.astype(np.int64, copy=False)
    documents = np.asarray(piece.document_indices, dtype=np.int64).reshape(-1)
    starts = np.asarray(piece.starts, dtype=np.int64).reshape(-1)
    if documents.size != starts.size:
        raise ConfigError(f"batch {piece.index}: {documents.size} document indices but {starts.size} starts; one of each per row")
    return int(piece.index), documents, starts
