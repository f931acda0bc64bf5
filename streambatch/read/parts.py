"""The part plan: which pieces of which input files the i-th of n parts reads (``--part I/N``, ``--executor ray``).

The selected files, in order, lie end to end in one byte space of W bytes (each
file's size on disk; a saved dataset: the files of its folder).  Part ``i`` of
``n`` owns the bytes ``[i·W//n, (i+1)·W//n)``, and every unit of input (a line,
a Parquet row group, a row of a saved dataset, a whole file of any other kind)
belongs to the part that owns its first byte: a line to where it starts, a row
group to where its first column chunk starts, row ``r`` of a dataset of ``R``
rows and ``S`` bytes to byte ``r·S//R``, a whole file to its first byte.  So
the n parts, read in order, hold every unit exactly once and in order, one
large file is cut at line or row-group boundaries, and the plan needs only file
sizes (and a Parquet footer or a dataset's row count where a cut falls inside
one), never a read of the data.

Uncompressed JSONL, uncompressed text read per line (``per_line``), Parquet and
saved datasets are cut; compressed files and the other formats are whole units.

>>> bounds(10, 3)
[0, 3, 6, 10]
>>> owner(bounds(10, 3), 6), owner(bounds(2, 4), 1), owner(bounds(2, 4), 2)
(2, 3, 3)
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from . import inputs as _inputs
from .blocks import ReadOptions
from .select import InputFile

CUT_KINDS = ("jsonl", "parquet", "dataset")  # and text read per line; uncompressed only


@dataclass(frozen=True)
class Piece:
    """What one part reads of one file: the units starting in bytes ``[start, stop)`` of it (None: the whole file)."""

    file: InputFile
    span: tuple[int, int] | None = None

    def describe(self, part: tuple[int, int] | None) -> str:
        """``part I/N, bytes A-B`` (what a skipped piece is named with); empty for a whole file outside parts."""
        where = [f"part {part[0]}/{part[1]}"] if part else []
        if self.span is not None:
            where.append(f"bytes {self.span[0]:,}-{self.span[1]:,}")
        return ", ".join(where)


def file_size(file: InputFile) -> int:
    """A file's weight in the plan: its size (a dataset folder: its files' sizes; 0 when it cannot be read)."""
    try:
        if file.kind == "dataset":
            return sum(e.stat().st_size for e in os.scandir(file.path) if e.is_file())
        return os.stat(file.path).st_size
    except OSError:
        return 0


def is_cut(file: InputFile, opts: ReadOptions) -> bool:
    """Whether a file is cut between parts at unit boundaries (else it is one unit)."""
    if file.kind == "parquet" or file.kind == "dataset":
        return True
    lines = file.kind == "jsonl" or (file.kind == "text" and opts.per_line)
    return lines and _inputs.codec_of(str(file.path)) is None


def bounds(total: int, count: int) -> list[int]:
    """The first byte of each of *count* parts of *total* bytes, and *total*."""
    return [i * total // count for i in range(count)] + [total]


def owner(starts: list[int], position: int) -> int:
    """The part owning byte *position*: the last part starting at or before it (parts may be empty)."""
    return max(0, min(bisect.bisect_right(starts, position) - 1, len(starts) - 2))


def sizes_of(files: Sequence[InputFile]) -> list[int]:
    """Every selected file's `file_size`, in order."""
    return [file_size(f) for f in files]


def part_pieces(
    files: Sequence[InputFile], part: tuple[int, int] | None, opts: ReadOptions, sizes: Sequence[int] | None = None
) -> list[Piece]:
    """The pieces part *part* ``(i, n)`` reads, in order (None: every file, whole)."""
    if part is None:
        return [Piece(f) for f in files]
    index, count = part
    weights = list(sizes) if sizes is not None else sizes_of(files)
    starts = bounds(sum(weights), count)
    lo, hi = starts[index], starts[index + 1]
    pieces: list[Piece] = []
    base = 0
    for file, size in zip(files, weights, strict=True):
        if size and is_cut(file, opts):
            start, stop = max(lo, base), min(hi, base + size)
            if start < stop:
                pieces.append(Piece(file, (start - base, stop - base)))
        elif owner(starts, base) == index:
            pieces.append(Piece(file))
        base += size
    return pieces


def rows_in(span: tuple[int, int], rows: int, size: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a table of *rows* rows and *size* bytes whose byte ``r·size//rows`` lies in *span*.

    >>> [rows_in(s, 10, 100) for s in [(0, 35), (35, 70), (70, 100)]]
    [(0, 4), (4, 7), (7, 10)]
    """
    if size <= 0:
        return (0, rows) if span[0] == 0 else (rows, rows)

    def first(at: int) -> int:  # the first row r with r*size//rows >= at
        return min(rows, -(-at * rows // size))

    return first(span[0]), first(span[1])


def offsets_in(span: tuple[int, int], offsets: Sequence[int]) -> Iterator[int]:
    """The positions of the units (row groups) whose first byte lies in *span*.

    >>> list(offsets_in((0, 50), [4, 40, 90]))
    [0, 1]
    """
    return (k for k, at in enumerate(offsets) if span[0] <= at < span[1])
