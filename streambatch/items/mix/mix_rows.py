"""A mixture of packed rows: its batches are packed batches whose rows also carry their source.

A mixture's parts are `Windows` or, all of them, packed `Rows` (``sb.pack(source,
context_length=T)`` of each source, the same ``T``, partition and pad id).  A
packed mixture's item is ``(source, row number within that source's packing)``;
its batch is a `PackedMixtureBatch`: every field of a
`streambatch.items.pack.packed_batch.PackedBatch` (inputs, targets, segment and
position ids, loss mask, target count, ``cu_seqlens``, ``max_seqlen``,
per-segment provenance) plus ``sources`` (one per row) and ``source_names``.

`RowsGather` gathers a batch with the packed mode's one gather: when every
source has the C kernel (`streambatch._row_gather`) and one token dtype, one
call makes every array of the batch (provenance included) in one pass, each row
read through its own source's gatherer (``Gatherer.gather(rows, kinds, sources)``).
Otherwise (a source gathered by numpy, or mixed dtypes) each source's rows are
gathered by `streambatch.items.pack.rows.emit` into a source-sized block, then placed
at their rows of the batch, each source's ``cu_seqlens`` boundaries and
provenance rows shifted to its rows (a row boundary is always a sequence
boundary, so every sequence stays whole).  A batch of one source is that
source's batch, with no copy.  Either way the batch has the arrays and dtypes of
a single source's `PackedBatch` (ids `streambatch.items.pack._pack_gather.id_dtype`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DataError
from ...model.documents import PARTITIONS, Partition
from ..pack._pack_gather import id_dtype
from ..pack.packed_batch import PackedBatch
from ..pack.rows import RowSpace, emit, row_gatherer
from ..windows.window_index import IntArray
from .mix_batch import SourceArray, present

__all__ = ["PackedMixtureBatch", "RowsGather"]


class PackedMixtureBatch(PackedBatch):
    """A `PackedBatch` of a mixture of packed rows: ``sources[r]`` is row *r*'s source.

    ``positions`` (``rows``) hold each row's number in its own source's packing;
    ``row_spaces[s]`` is source *s*'s packing (``row_space`` is source 0's, kept for
    the `PackedBatch` interface).  Per-segment provenance (document index, start,
    id, partition, store), made with the batch, is that of each segment's own
    source; ``segment_sources`` names it.
    """

    __slots__ = ("names", "row_spaces", "sources")

    sources: SourceArray
    names: tuple[str, ...]
    row_spaces: tuple[RowSpace, ...]

    @property
    def source_names(self) -> list[str]:
        """The name of each row's source."""
        return [self.names[s] for s in self.sources.tolist()]

    @property
    def segment_sources(self) -> SourceArray:
        """Per segment: its row's source."""
        found: SourceArray = self.sources[self.segment_rows]
        return found

    def _per_segment(self, value: Any, dtype: Any) -> npt.NDArray[Any]:
        documents, sources = self.document_indices, self.segment_sources
        out = np.zeros(documents.size, dtype=dtype)
        for s in present(sources):
            chosen = sources == s
            out[chosen] = value(self.row_spaces[s].store, documents[chosen])
        return out

    @property
    def shards(self) -> IntArray:
        """Per segment: the store of its source's `streambatch.Corpus` it came from (0 for a source of one store)."""
        found: IntArray = self._per_segment(lambda store, docs: store.shard_of(docs), np.int64)
        return found

    @property
    def partitions(self) -> tuple[Partition, ...]:
        """Partition of each segment."""
        codes = self._per_segment(lambda store, docs: store.partition_codes[docs], np.uint8)
        return tuple(PARTITIONS[c] for c in codes.tolist())

    @property
    def document_ids(self) -> list[str]:
        """Document id of each segment (within its source)."""
        spaces = self.row_spaces
        pairs = zip(self.segment_sources.tolist(), self.document_indices.tolist(), strict=True)
        return [spaces[s].store.ids[d] for s, d in pairs]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedMixtureBatch):
            return NotImplemented if not isinstance(other, PackedBatch) else False
        return np.array_equal(self.sources, other.sources) and super().__eq__(other)

    __hash__ = None

    def __repr__(self) -> str:
        epoch = f"epoch={self.epoch}, " if self.epoch else ""
        counts = np.bincount(self.sources, minlength=len(self.names)).tolist()
        return (
            f"PackedMixtureBatch({epoch}index={self.index}, shape={self.shape}, target_count={self.target_count}, "
            f"rows per source={counts})"
        )


_FIELDS = ("inputs", "targets", "segment_ids", "position_ids", "loss_mask")


class RowsGather:
    """The gather of a mixture of packed rows (built once per mixture): its sources' packings, names and C gatherers.

    ``one_pass`` is True when every source has the C kernel and the sources share one token dtype.
    """

    __slots__ = ("dtype", "gatherers", "names", "one_pass", "spaces")

    def __init__(self, spaces: tuple[RowSpace, ...], names: tuple[str, ...]) -> None:
        self.spaces = spaces
        self.names = names
        self.dtype = np.result_type(*(space.store.dtype for space in spaces))
        self.gatherers = tuple(row_gatherer(space) for space in spaces)
        self.one_pass = all(g is not False for g in self.gatherers) and all(sp.store.dtype == self.dtype for sp in spaces)

    def __call__(self, sources: SourceArray, numbers: IntArray, index: int) -> PackedMixtureBatch:
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
        try:  # one pass: row i read by its source's gatherer
            made = self.gatherers[0].gather(numbers, kinds, self.gatherers)
        except ValueError as err:
            raise DataError(
                f"{err}; the rows do not belong to their sources' packings (remove the plan files and plan again)"
            ) from None
        *arrays, cu_seqlens, provenance, count, longest = made
        return self._batch(arrays, (count, cu_seqlens, longest), provenance, sources, numbers, index)

    def _by_source(self, sources: SourceArray, numbers: IntArray, index: int) -> PackedMixtureBatch:
        """Each source's rows by `emit`, placed at their rows; each source's sequence ends and segment rows moved
        to its rows."""
        found, spaces = present(sources), self.spaces
        if len(found) <= 1:  # one source: its own batch, no copy
            part = emit(spaces[found[0] if found else 0], numbers, index)
            arrays = [getattr(part, name) for name in _FIELDS]
            varlen = (part.target_count, part.cu_seqlens, part.max_seqlen)
            return self._batch(arrays, varlen, part._segments, sources, numbers, index)
        T = spaces[0].rows.context_length
        ids = id_dtype(T)
        outputs = [np.empty((sources.size, T), d) for d in (self.dtype, self.dtype, ids, ids, np.bool_)]
        ends: list[npt.NDArray[np.int64]] = []
        segments: list[npt.NDArray[np.int64]] = []
        target_count = longest = 0
        for s in found:
            picked = np.flatnonzero(sources == s)
            part = emit(spaces[s], numbers[picked], index)
            for out, name in zip(outputs, _FIELDS, strict=True):
                out[picked] = getattr(part, name)
            cu = part.cu_seqlens[1:].astype(np.int64)
            row = (cu - 1) // T  # the row each sequence ends in
            ends.append(cu + (picked[row] - row) * T)
            moved = np.array(part._segments, dtype=np.int64)
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
    ) -> PackedMixtureBatch:
        batch = object.__new__(PackedMixtureBatch)
        batch.inputs, batch.targets, batch.segment_ids, batch.position_ids, batch.loss_mask = arrays
        batch.target_count, batch.cu_seqlens, batch.max_seqlen = varlen
        batch.epoch, batch.index, batch.positions = 0, index, numbers
        first: Any = self.spaces[0]  # `space` is typed as a window space in `MiniBatch`
        batch.space = batch.row_space = first
        batch._located, batch._segments = None, provenance
        batch.sources, batch.row_spaces, batch.names = sources, self.spaces, self.names
        return batch
