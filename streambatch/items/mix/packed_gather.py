"""A mixture of packed rows: its batches are packed batches whose rows also carry their source.

A mixture's parts are `Windows` or, all of them, packed `Rows` (``sb.pack(source,
context_length=T)`` of each source, the same ``T``, partition and pad id).  A
packed mixture's item is ``(source, row number within that source's packing)``;
its batch is a packed `streambatch.MiniBatch` (inputs, targets, segment and
position ids, loss mask, target count, ``cu_seqlens``, ``max_seqlen``,
per-segment provenance) with ``sources`` (one per row) and ``names``.

`PackedMixGather` gathers a batch with the packed mode's one gather: when every
source has the C kernel (`streambatch._row_gather`) and one token dtype, one
call makes every array of the batch (provenance included) in one pass, each row
read through its own source's gatherer (``Gatherer.gather(rows, kinds, sources)``).
Otherwise (a source gathered by numpy, or mixed dtypes) each source's rows are
gathered by `streambatch.items.pack.rows.emit` into a source-sized block, then placed
at their rows of the batch, each source's ``cu_seqlens`` boundaries and
provenance rows shifted to its rows (a row boundary is always a sequence
boundary, so every sequence stays whole).  A batch of one source is that
source's batch, with no copy.  Either way the batch has the arrays and dtypes of
a single source's packed batch (ids `streambatch.items.pack._pack_gather.id_dtype`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...batch.minibatch import MiniBatch, SourceArray, present
from ...errors import DataError
from ..pack._pack_gather import id_dtype
from ..pack.packed_batch import from_kernel, mask_pieces
from ..pack.rows import RowSpace, emit, masked_after, packed_columns, packed_gatherer
from ..windows.window_index import IntArray

__all__ = ["PackedMixGather"]


_FIELDS = ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")


class PackedMixGather:
    """The gather of a mixture of packed rows (built once per mixture): its sources' packings, names and C gatherers.

    ``one_pass`` is True when every source has the C kernel and the sources share one token dtype.
    """

    __slots__ = ("dtype", "gatherers", "names", "one_pass", "spaces")

    def __init__(self, spaces: tuple[RowSpace, ...], names: tuple[str, ...]) -> None:
        self.spaces = spaces
        self.names = names
        self.dtype = np.result_type(*(space.store.dtype for space in spaces))
        self.gatherers = tuple(packed_gatherer(space) for space in spaces)
        self.one_pass = all(g is not False for g in self.gatherers) and all(sp.store.dtype == self.dtype for sp in spaces)

    def __call__(self, sources: SourceArray, numbers: IntArray, index: int) -> MiniBatch:
        """Batch *index* of rows *numbers* (int64, each within its row's source *sources*).

        >>> import streambatch as sb
        >>> from streambatch.items.mix.mixture import mix
        >>> a = sb.pack([sb.Document("a", "train", [0, 10, 11, 12, 1])], context_length=2)
        >>> b = sb.pack([sb.Document("b", "train", [0, 20, 1])], context_length=2)
        >>> batch = sb.materialize(sb.chunk(mix([a, b], [1, 1], seed=3), 4))[0]
        >>> batch.sources.tolist(), batch.inputs.tolist(), batch.cu_seqlens.tolist(), batch.target_count
        ([0, 1, 0], [[0, 10], [0, 20], [11, 12]], [0, 2, 4, 6], 6)
        """
        if not self.one_pass:
            return self._by_source(sources, numbers, index)
        kinds = np.ascontiguousarray(sources, dtype=np.uint8)
        after = [space.store if masked_after(space) else None for space in self.spaces]
        lean = all(store is None for store in after)  # every mask read by the kernel: the columns on demand
        try:  # one pass: row i read by its source's gatherer
            gather = self.gatherers[0].gather_tokens if lean else self.gatherers[0].gather
            made = gather(numbers, kinds, self.gatherers)
        except ValueError as err:
            raise DataError(
                f"{err}; the rows do not belong to their sources' packings: build the mixture again from its parts "
                "(where a packing or mixture plan file was used, it is stale: remove it and plan again)"
            ) from None
        *arrays, cu_seqlens, provenance, count, longest = made
        if lean:
            outputs = (*arrays, cu_seqlens, provenance, count, longest)
            return from_kernel(index, outputs, numbers, self.spaces, sources, self.names, build=packed_columns)
        batch = self._batch(arrays, (count, cu_seqlens, longest), provenance, sources, numbers, index)
        mask_pieces(batch, after, sources)
        return batch

    def _by_source(self, sources: SourceArray, numbers: IntArray, index: int) -> MiniBatch:
        """Each source's rows by `emit`, placed at their rows; each source's sequence ends and segment rows moved
        to its rows."""
        found, spaces = present(sources), self.spaces
        if len(found) <= 1:  # one source: its own batch, no copy
            part: Any = emit(spaces[found[0] if found else 0], numbers, index)
            arrays = [getattr(part, name) for name in _FIELDS]
            varlen = (part.target_count, part.cu_seqlens, part.max_seqlen)
            return self._batch(arrays, varlen, part._table(), sources, numbers, index)
        T = spaces[0].packing.context_length
        ids = id_dtype(T)
        outputs = [np.empty((sources.size, T), d) for d in (self.dtype, self.dtype, ids, ids, np.bool_)]
        ends: list[npt.NDArray[np.int64]] = []
        segments: list[npt.NDArray[np.int64]] = []
        target_count = longest = 0
        for s in found:
            picked = np.flatnonzero(sources == s)
            part = emit(spaces[s], numbers[picked], index)  # a packed batch: its columns are set
            for out, name in zip(outputs, _FIELDS, strict=True):
                out[picked] = getattr(part, name)
            cu = part.cu_seqlens[1:].astype(np.int64)
            row = (cu - 1) // T  # the row each sequence ends in
            ends.append(cu + (picked[row] - row) * T)
            moved = np.array(part._table(), dtype=np.int64)
            moved[0] = picked[moved[0]]  # each segment's row in the batch
            segments.append(moved)
            target_count += part.target_count
            longest = max(longest, part.max_seqlen)
        cu_seqlens = np.zeros(1 + sum(e.size for e in ends), dtype=np.int32)
        cu_seqlens[1:] = np.sort(np.concatenate(ends))
        joined = np.concatenate(segments, axis=1)
        provenance = joined[:, np.argsort(joined[0], kind="stable")]  # row by row; a row's segments keep their order
        return self._batch(outputs, (target_count, cu_seqlens, longest), provenance, sources, numbers, index)

    def _batch(
        self,
        arrays: list[Any],
        varlen: tuple[int, Any, int],
        provenance: npt.NDArray[np.int64],
        sources: SourceArray,
        numbers: IntArray,
        index: int,
    ) -> MiniBatch:
        count, cu_seqlens, longest = varlen
        outputs = (*arrays, cu_seqlens, provenance, count, longest)
        return from_kernel(index, outputs, numbers, self.spaces, sources, self.names)
