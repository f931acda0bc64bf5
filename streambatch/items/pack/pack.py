"""Packing, the second kind of item: pieces of documents packed best-fit into rows of ``T`` positions.

Pieces
    A document of ``L`` tokens is cut at starts ``0, T, 2T, ...`` into pieces of
    ``m = min(T + 1, L - start)`` tokens.  Consecutive pieces share one token, so
    each of the document's ``L - 1`` targets lies in exactly one piece, and a
    piece of ``m`` tokens occupies ``m - 1`` positions (its targets) of a row.
    A document of ``L >= 2`` tokens has ``ceil((L - 1) / T)`` pieces:
    ``(L - 1) // T`` *full* ones (``m = T + 1``: the chapter's windows at stride
    ``T``) and, when ``(L - 1) % T > 0``, one *tail* (its last piece) of that many
    targets.  A document of one token is one piece of one token: no target; it
    is counted (`PackReport.skipped_pieces`) and never packed.  The one-token
    remainder at ``kT`` of a document of ``kT + 1`` tokens is not a piece: its
    token is already the last target of the piece before it.  An empty document
    has no piece.  Pieces are numbered globally in document order; `PieceIndex`
    maps numbers to ``(document, start, m)`` with one ``searchsorted`` on a count
    per document, never an array per piece or per token.

Rows (`PackedRows`, built by `pack_lengths`)
    Row order: first the *full rows*, one full piece each, in piece (document)
    order: row ``r < full_rows`` is the ``r``-th full piece, found arithmetically
    (no array).  Then the *packed rows*, in the order best-fit decreasing opened
    them: tails sorted by targets, largest first, ties by document order; each
    goes into the open row with the fewest free positions that still hold it,
    ties to the lowest row number, else into a new row; never split.  Segment
    order within a packed row: placement order (largest tail first).  Packed row
    ``full_rows + i`` holds the tails of documents ``tails[offsets[i]:offsets[i + 1]]``
    (a document has at most one tail, so its index names the piece): one uint32
    per tail plus one int64 per packed row.  One call packs fewer than 2**32 documents.

The packing kernel is the C extension ``streambatch._best_fit`` (the ``best_fit``
kernel of `streambatch._kernels`), O(n log n) time and O(n) memory for n tails, nothing sized by ``T``;
without a compiler a pure Python fallback (``"python"``)
gives identical rows, slowly.  Gathering tokens for rows: `gather_segments`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..._checks import check_positive
from ..._kernels import legacy_switch
from ...errors import ConfigError, DataError, OutOfRangeError
from ._pack_fit import Backend, best_fit_decreasing
from ._pack_gather import PackedArrays, check_emittable, gather_segments

IntArray = npt.NDArray[np.int64]
_U32 = 1 << 32

__all__ = [
    "PackReport",
    "PackedArrays",
    "PackedRows",
    "PieceIndex",
    "Segments",
    "best_fit_decreasing",
    "check_emittable",
    "gather_segments",
    "pack_lengths",
    "packed_rows",
]

legacy_switch(__name__, "BACKEND", "best_fit", "python")  # the old switch ("c" or "python"), for one release


class PieceIndex:
    """Global piece numbering over documents, mapped arithmetically; nothing per piece.

    Holds the documents' lengths (zero outside the partition) and, for the full
    pieces, the documents that have any and a running count; the running count
    of all pieces is built on first use.

    >>> index = PieceIndex([5, 1, 0, 3], context_length=2)
    >>> index.piece_count, index.full_count, index.skipped_pieces, index.target_count
    (4, 3, 1, 6)
    >>> [a.tolist() for a in index.locate(np.arange(4))]
    [[0, 0, 1, 3], [0, 2, 0, 0], [3, 3, 1, 3]]
    """

    __slots__ = ("_cumulative", "_full_docs", "_full_ends", "context_length", "lengths")

    def __init__(self, lengths: npt.ArrayLike, context_length: int, include: npt.ArrayLike | None = None) -> None:
        self.context_length = check_positive(context_length, "context_length", "the positions of one row (T)")
        sizes = np.asarray(lengths, dtype=np.int64)
        if sizes.ndim != 1:
            raise ConfigError(f"lengths has shape {sizes.shape}; pass one length per document")
        if include is not None:
            sizes = np.where(np.asarray(include, dtype=bool), sizes, 0)
        if sizes.size and int(sizes.min()) < 0:
            raise DataError(f"document {int(np.argmin(sizes))} has length {int(sizes.min())}; lengths are >= 0")
        self.lengths: IntArray = sizes
        full = self.full_counts()
        self._full_docs: IntArray = np.flatnonzero(full)
        self._full_ends: IntArray = np.cumsum(full[self._full_docs])  # inclusive: full pieces in docs up to each
        self._cumulative: IntArray | None = None

    def full_counts(self, documents: npt.ArrayLike | None = None) -> IntArray:
        """Full pieces (``T + 1`` tokens) of each document (of *documents*, else of all): ``(L - 1) // T``."""
        sizes = self.lengths if documents is None else self.lengths[np.asarray(documents, dtype=np.int64)]
        out = sizes - 1
        np.floor_divide(out, self.context_length, out=out)
        return np.maximum(out, 0, out=out)

    def tail_sizes(self, dtype: npt.DTypeLike = np.int64) -> npt.NDArray[Any]:
        """Targets of each document's tail piece (0 when it has none): ``(L - 1) % T`` for ``L >= 2``."""
        out = self.lengths - 1
        np.remainder(out, self.context_length, out=out)
        out[self.lengths < 2] = 0
        return out.astype(dtype, copy=False)

    def counts(self) -> IntArray:
        """Pieces of each document: 0 (empty), 1 (one token: skipped), else ``ceil((L - 1) / T)``."""
        out = self.lengths + (self.context_length - 2)
        np.floor_divide(out, self.context_length, out=out)
        return np.maximum(out, self.lengths > 0, out=out)

    @property
    def cumulative(self) -> IntArray:
        """Pieces before each document, and the total last (``documents + 1`` entries; built on first use)."""
        if self._cumulative is None:
            cumulative = np.zeros(self.lengths.size + 1, dtype=np.int64)
            np.cumsum(self.counts(), out=cumulative[1:])
            self._cumulative = cumulative
        return self._cumulative

    @property
    def piece_count(self) -> int:
        """Pieces of all documents, skipped one-token pieces included."""
        return int(self.cumulative[-1]) if self._cumulative is not None else int(self.counts().sum())

    @property
    def full_count(self) -> int:
        """Full pieces: the chapter's windows at stride ``T``."""
        return int(self._full_ends[-1]) if self._full_ends.size else 0

    @property
    def skipped_pieces(self) -> int:
        """One-token pieces (documents of one token): no target, never packed."""
        return int(np.count_nonzero(self.lengths == 1))

    @property
    def target_count(self) -> int:
        """Targets of all documents: the sum of ``L - 1`` over non-empty documents."""
        return int(self.lengths.sum()) - int(np.count_nonzero(self.lengths))

    def locate(self, pieces: npt.ArrayLike) -> tuple[IntArray, IntArray, IntArray]:
        """Map global piece numbers to ``(document index, start, m)``: ``m`` tokens, ``m - 1`` targets."""
        numbers = np.asarray(pieces, dtype=np.int64)
        cumulative = self.cumulative
        if numbers.size and (int(numbers.min()) < 0 or int(numbers.max()) >= self.piece_count):
            raise OutOfRangeError(f"piece numbers must lie in [0, {self.piece_count}); pass numbers of this index")
        documents = np.searchsorted(cumulative, numbers, side="right") - 1
        starts = (numbers - cumulative[documents]) * self.context_length
        return documents, starts, np.minimum(self.context_length + 1, self.lengths[documents] - starts)

    def number(self, documents: npt.ArrayLike, starts: npt.ArrayLike) -> IntArray:
        """Global piece number of the piece of *documents* at *starts* (multiples of ``T``): `locate`'s inverse."""
        docs = np.asarray(documents, dtype=np.int64)
        return self.cumulative[docs] + np.asarray(starts, dtype=np.int64) // self.context_length

    def full_pieces(self) -> tuple[IntArray, IntArray]:
        """``(documents, ends)``: the documents that have full pieces, and the running count of full pieces up to each."""
        return self._full_docs, self._full_ends

    def locate_full(self, full: npt.ArrayLike) -> tuple[IntArray, IntArray]:
        """Map full-piece numbers (``0 .. full_count - 1``, document order) to ``(document index, start)``."""
        numbers = np.asarray(full, dtype=np.int64)
        at = np.searchsorted(self._full_ends, numbers, side="right")
        documents = self._full_docs[at]
        first = self._full_ends[at] - self.full_counts(documents)
        return documents, (numbers - first) * self.context_length


class Segments(NamedTuple):
    """The pieces of a set of rows, row by row: row ``i`` holds segments ``offsets[i]:offsets[i + 1]``.

    ``lengths`` are targets (positions occupied): ``m - 1`` for a piece of ``m`` tokens.
    """

    offsets: IntArray
    documents: IntArray
    starts: IntArray
    lengths: IntArray


@dataclass(frozen=True)
class PackReport:
    """What packing did with one corpus at one ``T``; every count is exact.

    ``window_targets`` is what the window mode at stride ``T`` trains on (the full
    pieces); packing covers every target (``targets``).  ``documents`` counts the
    non-empty documents packed.  Under ``skip_untrained`` ``dropped_pieces``
    counts the pieces with no counted target left out (``targets`` and
    ``pieces`` count only those packed).
    """

    context_length: int
    documents: int
    targets: int
    pieces: int
    skipped_pieces: int
    full_rows: int
    packed_rows: int
    window_targets: int
    dropped_pieces: int = 0

    @property
    def rows(self) -> int:
        """All rows: full and packed."""
        return self.full_rows + self.packed_rows

    @property
    def positions(self) -> int:
        """``rows * T``."""
        return self.rows * self.context_length

    @property
    def pad_positions(self) -> int:
        """Positions that hold padding: ``positions - targets``."""
        return self.positions - self.targets

    @property
    def pad_share(self) -> float:
        """Padding as a share of all positions (0.0 when there are none)."""
        return self.pad_positions / self.positions if self.positions else 0.0

    @property
    def lower_bound(self) -> int:
        """No packing has fewer rows: ``ceil(targets / T)``."""
        return -(-self.targets // self.context_length)

    @property
    def window_coverage(self) -> float:
        """Share of the targets the window mode at stride ``T`` covers (1.0 for a corpus without targets)."""
        return self.window_targets / self.targets if self.targets else 1.0


class PackedRows:
    """Rows of ``T`` positions holding whole pieces, as integers; see the module docstring for the order.

    Documents of 5, 1, 4 and 2 tokens at ``T = 2``: full pieces (0, 0), (0, 2) and
    (2, 0) fill rows 0-2; the one-target tails of documents 2 and 3 share row 3.

    >>> rows = pack_lengths([5, 1, 4, 2], context_length=2)
    >>> len(rows), rows.full_rows, rows.tails.tolist(), rows.offsets.tolist()
    (4, 3, [2, 3], [0, 2])
    >>> [a.tolist() for a in rows.segments([3, 0, 2])]  # offsets, documents, starts, lengths
    [[0, 2, 3, 4], [2, 3, 0, 2], [2, 0, 0, 0], [1, 1, 2, 2]]
    """

    __slots__ = ("index", "offsets", "report", "tails")

    def __init__(self, index: PieceIndex, offsets: IntArray, tails: npt.NDArray[Any], report: PackReport) -> None:
        self.index = index
        self.offsets = offsets  # packed row i holds tails[offsets[i]:offsets[i + 1]]
        self.tails = tails  # document index of each packed tail, row by row, in placement order
        self.report = report

    @property
    def context_length(self) -> int:
        """``T``: positions per row."""
        return self.index.context_length

    @property
    def full_rows(self) -> int:
        """Rows ``0 .. full_rows - 1`` hold one full piece each, in document order."""
        return self.report.full_rows

    def __len__(self) -> int:
        return self.report.rows

    def __repr__(self) -> str:
        r = self.report
        return f"PackedRows({r.rows} rows, context_length={r.context_length}, pad_share={r.pad_share:.4%})"

    def segments(self, rows: npt.ArrayLike) -> Segments:
        """The pieces of *rows* (row numbers, any order, repeats allowed), row by row, in segment order."""
        numbers = np.asarray(rows, dtype=np.int64).reshape(-1)
        if numbers.size and (int(numbers.min()) < 0 or int(numbers.max()) >= len(self)):
            raise OutOfRangeError(f"row numbers must lie in [0, {len(self)}); pass rows of this packing")
        full = numbers < self.full_rows
        packed = np.where(full, 0, numbers - self.full_rows)
        counts = np.ones(numbers.size, dtype=np.int64)
        inside = packed[~full]
        counts[~full] = self.offsets[inside + 1] - self.offsets[inside]
        offsets = np.zeros(numbers.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        total = int(offsets[-1])
        documents = np.empty(total, dtype=np.int64)
        starts = np.empty(total, dtype=np.int64)
        lengths = np.empty(total, dtype=np.int64)
        at = offsets[:-1][full]  # a full row has one segment
        documents[at], starts[at] = self.index.locate_full(numbers[full])
        lengths[at] = self.context_length
        if at.size < total:
            rows_of = np.repeat(np.arange(numbers.size), counts)
            where = np.flatnonzero(~full[rows_of])
            within = where - offsets[rows_of[where]]
            docs = self.tails[self.offsets[packed[rows_of[where]]] + within].astype(np.int64)
            before = self.index.lengths[docs] - 1
            documents[where] = docs
            lengths[where] = before % self.context_length
            starts[where] = before - lengths[where]
        return Segments(offsets, documents, starts, lengths)

    def gather(
        self, tokens: npt.NDArray[Any], document_starts: npt.ArrayLike, rows: npt.ArrayLike, *, pad_id: int = 0
    ) -> PackedArrays:
        """Tokens, ids, masks and provenance of *rows*, from the flat *tokens* (see `gather_segments`)."""
        seg = self.segments(rows)
        return gather_segments(
            tokens, document_starts, seg.offsets, seg.documents, seg.starts, seg.lengths, self.context_length, pad_id=pad_id
        )


def pack_lengths(
    lengths: npt.ArrayLike,
    context_length: int,
    *,
    include: npt.ArrayLike | None = None,
    backend: Backend | None = None,
    drop_tails: npt.NDArray[np.int64] | None = None,
) -> PackedRows:
    """Cut documents of *lengths* (those where *include* is True) into pieces and pack them into rows.

    *drop_tails* (document indices) leaves those documents' tail pieces out of packing (``skip_untrained``:
    tails with no counted target); their full pieces stay, numbered as ever.

    Deterministic for given lengths and ``T``.  Memory: the lengths (copied only
    with *include*), two int64 per document that has a full piece, one uint32
    per tail and one int64 per packed row; packing peaks at about 28 bytes per
    piece when every piece is a tail (``scripts/bench_pack.py``).

    >>> rows = pack_lengths([7, 3, 2, 1], context_length=4)
    >>> r = rows.report
    >>> (r.rows, r.full_rows, r.targets, r.pad_positions, r.skipped_pieces, r.lower_bound)
    (3, 1, 9, 3, 1, 3)
    """
    index = PieceIndex(lengths, context_length, include)
    T = index.context_length
    if index.lengths.size >= _U32 or T >= _U32:
        raise ConfigError(f"pack_lengths packs fewer than 2**32 documents with T below 2**32; got {index.lengths.size}, T={T}")
    tails = index.tail_sizes(np.uint32)
    if drop_tails is not None:
        tails[drop_tails] = 0
    offsets, packed = best_fit_decreasing(tails, T, backend=backend)
    del tails
    return packed_rows(index, offsets, packed, drop_tails)


def packed_rows(
    index: PieceIndex, offsets: IntArray, tails: npt.NDArray[Any], drop_tails: npt.NDArray[np.int64] | None = None
) -> PackedRows:
    """The `PackedRows` of *index* whose packed rows are *offsets* into *tails* (best-fit's output, or a packing file);
    *drop_tails*: the documents whose tails were left out (their targets are not packed)."""
    T = index.context_length
    dropped = 0 if drop_tails is None else int(drop_tails.size)
    left_out = 0 if not dropped else int(index.tail_sizes()[drop_tails].sum())
    report = PackReport(
        context_length=T,
        documents=int(np.count_nonzero(index.lengths)),
        targets=index.target_count - left_out,
        pieces=int(index.counts().sum()) - dropped,
        skipped_pieces=index.skipped_pieces,
        full_rows=index.full_count,
        packed_rows=int(offsets.size - 1),
        window_targets=index.full_count * T,
        dropped_pieces=dropped,
    )
    return PackedRows(index, offsets, tails, report)
