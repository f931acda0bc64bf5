"""A packed batch is a `streambatch.MiniBatch` with the packed columns: what the two packed gathers hand it.

What differs from a batch of windows, and why:

- ``token_count`` is the real targets (``loss_mask.sum()``), the token mean's
  denominator.  Padding never counts, nor, under a loss mask, a target that
  does not train (`mask_pieces` ANDs the documents' masks in).
- Padding positions hold ``pad_id`` (default 0, `sb.pack(..., pad_id=)`) in
  ``inputs`` **and** ``targets``, with ``loss_mask`` False and ``segment_ids``
  -1: the pad target is not a token to learn.  `streambatch.torch.tensor_batch`
  writes ``-100`` (cross-entropy's ``ignore_index``) there in ``long`` targets.
- Provenance is per *segment* (a piece of one document), made with the batch
  (one pass of the C gather, or the numpy gather): ``segments``,
  ``document_indices``, ``starts``, ``document_ids``, ``provenance``
  (`streambatch.batch.minibatch.SegmentProvenance`), ``segment_rows``,
  ``segment_lengths``.  ``positions`` (``row_numbers``) hold the batch's row
  numbers in the packing.
- ``segment_ids``, ``position_ids``, ``loss_mask``, ``cu_seqlens``,
  ``max_seqlen``, ``sequence_is_pad``: see `streambatch.items.pack._pack_gather`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.minibatch import MiniBatch
from ...model.source import TokenSource
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
    index: int,
    outputs: tuple[Any, ...],
    rows: npt.NDArray[Any],
    space: Any,
    sources: Any = None,
    names: Any = None,
    build: Any = None,
) -> MiniBatch:
    """A batch from the C gather's outputs, every array made by it: inputs, targets, segment and position
    ids, loss mask, cu_seqlens, provenance (int64 ``(4, segments)``: row, document, start, targets),
    target count, longest sequence.  ``gather_tokens`` leaves the ids and the mask None: *build* makes them
    on first use (`streambatch.items.pack.rows.packed_columns`)."""
    inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, segments, count, longest = outputs
    return MiniBatch(
        index, inputs, targets, rows, space, sources=sources, names=names,
        loss_mask=loss_mask, segment_ids=segment_ids, position_ids=position_ids,
        cu_seqlens=cu_seqlens, max_seqlen=longest, segments=segments, target_count=count, build=build,
    )  # fmt: skip


def arrays_of(batch: MiniBatch) -> PackedArrays:
    """Every array of a packed *batch* as one `PackedArrays`."""
    rows, documents, starts, lengths = batch._table()
    return PackedArrays(
        batch.inputs, batch.targets, batch.segment_ids, batch.position_ids, batch.loss_mask, batch.target_count,  # type: ignore[arg-type]
        batch.cu_seqlens, batch.max_seqlen, batch.sequence_is_pad, rows, documents, starts, lengths,  # type: ignore[arg-type]
    )  # fmt: skip


def mask_pieces(batch: MiniBatch, stores: Sequence[TokenSource | None], sources: npt.NDArray[Any] | None = None) -> MiniBatch:
    """AND *batch*'s ``loss_mask`` with its documents' loss masks at every real target, and recount (in place).

    *stores* are the sources' stores (one for a packing of one source); *sources*
    the source of each row (a mixture).  Nothing happens when no store has a mask.
    """
    flats = [None if store is None else store.flat() for store in stores]
    if not any(flat is not None and flat.has_loss_mask for flat in flats):
        return batch
    rows, documents, starts, _ = batch._table()
    width, length = batch.inputs.shape
    mask = np.array(batch.loss_mask, dtype=np.bool_).reshape(-1)  # a fresh array: the kernel's may be shared or read-only
    real = np.flatnonzero(mask)
    first = np.searchsorted(rows, np.arange(width), side="left")  # each row's first segment (provenance is row by row)
    segment_ids, position_ids = batch.segment_ids.reshape(-1), batch.position_ids.reshape(-1)  # type: ignore[union-attr]
    segment = first[real // length] + segment_ids[real]
    owner = None if sources is None else np.asarray(sources)[rows]  # each segment's source
    keep = np.ones(real.size, dtype=np.bool_)
    for s, flat in enumerate(flats):
        if flat is None or not flat.has_loss_mask:
            continue
        if owner is None:
            base = flat.starts[documents] + starts + 1  # each segment's first target, in the flat token space
            keep[:] = flat.mask_at(base[segment] + position_ids[real])
            continue
        mine = owner == s
        base = np.zeros(documents.size, dtype=np.int64)
        base[mine] = flat.starts[documents[mine]] + starts[mine] + 1
        chosen = mine[segment]
        keep[chosen] = flat.mask_at(base[segment[chosen]] + position_ids[real[chosen]])
    mask[real[~keep]] = False
    batch.loss_mask = mask.reshape(width, length)  # target_count recounted: the real targets kept
    return batch
