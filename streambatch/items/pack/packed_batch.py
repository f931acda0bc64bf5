"""A packed batch is a `streambatch.MiniBatch` with the packed columns: what the two packed gathers hand it.

What differs from a batch of windows, and why:

- ``token_count`` is the real targets (``loss_mask.sum()``), the token mean's
  denominator.  Padding never counts.
- Padding positions hold ``pad_id`` (default 0, `sb.pack(..., pad_id=)`) in
  ``inputs`` **and** ``targets``, with ``loss_mask`` False and ``segment_ids``
  -1: the pad target is not a token to learn.  `streambatch.torch.tensor_batch`
  writes ``-100`` (cross-entropy's ``ignore_index``) there in ``long`` targets.
- Provenance is per *segment* (a piece of one document), made with the batch
  (one pass of the C gather, or the numpy gather): ``segments``,
  ``document_indices``, ``starts``, ``document_ids``, ``provenance``
  (`streambatch.stages.batch.SegmentProvenance`), ``segment_rows``,
  ``segment_lengths``.  ``positions`` (``row_numbers``) hold the batch's row
  numbers in the packing.
- ``segment_ids``, ``position_ids``, ``loss_mask``, ``cu_seqlens``,
  ``max_seqlen``, ``sequence_is_pad``: see `streambatch.items.pack._pack_gather`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...stages.batch import MiniBatch
from ._pack_gather import PackedArrays


def from_arrays(index: int, arrays: PackedArrays, rows: npt.NDArray[Any], space: Any) -> MiniBatch:
    """The batch of the numpy gather's `PackedArrays` of rows *rows* of *space*."""
    segments = np.stack([arrays.segment_rows, arrays.segment_documents, arrays.segment_starts, arrays.segment_lengths])
    return MiniBatch(
        index, arrays.inputs, arrays.targets, rows, space,
        loss_mask=arrays.loss_mask, segment_ids=arrays.segment_ids, position_ids=arrays.position_ids,
        cu_seqlens=arrays.cu_seqlens, max_seqlen=arrays.max_seqlen, segments=segments.astype(np.int64, copy=False),
        target_count=arrays.target_count,
    )  # fmt: skip


def from_kernel(
    index: int, outputs: tuple[Any, ...], rows: npt.NDArray[Any], space: Any, sources: Any = None, names: Any = None
) -> MiniBatch:
    """A batch from the C gather's outputs, every array made by it: inputs, targets, segment and position
    ids, loss mask, cu_seqlens, provenance (int64 ``(4, segments)``: row, document, start, targets),
    target count, longest sequence."""
    inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, segments, count, longest = outputs
    return MiniBatch(
        index, inputs, targets, rows, space, sources=sources, names=names,
        loss_mask=loss_mask, segment_ids=segment_ids, position_ids=position_ids,
        cu_seqlens=cu_seqlens, max_seqlen=longest, segments=segments, target_count=count,
    )  # fmt: skip


def arrays_of(batch: MiniBatch) -> PackedArrays:
    """Every array of a packed *batch* as one `PackedArrays`."""
    rows, documents, starts, lengths = batch._table()
    return PackedArrays(
        batch.inputs, batch.targets, batch.segment_ids, batch.position_ids, batch.loss_mask, batch.target_count,  # type: ignore[arg-type]
        batch.cu_seqlens, batch.max_seqlen, batch.sequence_is_pad, rows, documents, starts, lengths,  # type: ignore[arg-type]
    )  # fmt: skip
