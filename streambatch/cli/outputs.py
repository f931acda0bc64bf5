"""The ``epoch`` command's outputs: its formats, the size announced before writing, progress and the summary line.

The formats: JSON lines, or Arrow IPC for trainers that read arrays without parsing JSON.

Both write the same fields (`batch_record`).  An `OutputFormat` turns a run's
batches into bytes (a header, then one record per batch) and reads back the
first and last batch of a kept prefix, so the writer's lock, resume and digest
rules (`streambatch.cli.epoch`) are one code path for both:

- ``jsonl``: one JSON object per line, no header.
- ``arrow``: an Arrow IPC *stream*: one schema message, then one record batch
  per streambatch batch holding one Arrow row.  Its ``inputs`` and ``targets``
  (and, for packed rows, ``segment_ids``, ``position_ids``, ``loss_mask``) are
  ``list<fixed_size_list<T>>`` columns of the store's token dtype, so
  ``pyarrow.ipc.open_stream(path).read_all()["inputs"]`` flattens to numpy with
  no copy of a Python object per token.  The stream carries no end-of-stream
  marker, so a resumed run appends record batches to it; readers stop at the
  end of the file.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import re
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

import numpy as np

from .._progress import Bar, bar
from ..batch.minibatch import MiniBatch
from ..errors import ConfigError
from ..io.files import short_path
from ..io.remote.client import STATS
from ..read.text.tokenizers import require
from ..run import Run
from .records import batch_line, batch_record, record_arrays, record_pieces

FORMATS = ("jsonl", "arrow")
ARROW_SUFFIXES = (".arrow", ".arrows", ".ipc")


def format_of(name: str | None, output: str | None) -> str:
    """The format asked for (``--format``), or the one *output*'s suffix names (``.arrow``/``.ipc``: arrow), else jsonl."""
    if name is not None:
        return name
    return "arrow" if output is not None and output.lower().endswith(ARROW_SUFFIXES) else "jsonl"


class JsonLines:
    """One JSON object per line; no header."""

    name = "jsonl"

    def header(self, first: MiniBatch | None, context_length: int, dtype: Any) -> bytes:
        return b""

    def encode(self, batch: MiniBatch) -> bytes:
        return batch_line(batch)

    def pieces(self, batch: MiniBatch) -> Iterator[bytes]:
        """The record of *batch* in pieces of about a megabyte (`record_pieces`): a long record is never held whole."""
        return record_pieces(batch)

    def records_in(self, handle: IO[bytes], length: int, lines: int, last: bytes) -> tuple[int, list[tuple[int, int]]]:
        """``(records, [(epoch, index) of the first and last])`` of the first *length* bytes of *handle*.

        *lines* and *last* (the newlines counted and the last byte seen while
        hashing the prefix) spare a second pass; -1 records: not whole records.
        """
        if length and last != b"\n":
            return -1, []
        if not lines:
            return 0, []
        handle.seek(0)
        first = handle.read(64)
        end = length - 1  # the last record's newline; find the one before it
        while end > 0:
            lo = max(0, end - _BLOCK)
            handle.seek(lo)
            cut = handle.read(end - lo).rfind(b"\n")
            if cut >= 0:
                end = lo + cut + 1
                break
            end = lo
        handle.seek(end)
        found = [_HEAD.match(first), _HEAD.match(handle.read(64))]
        heads = [(int(f[1]), int(f[2])) for f in found if f is not None]
        return (lines, heads) if len(heads) == 2 else (-1, [])


_HEAD = re.compile(rb'\{"epoch":(\d+),"index":(\d+),')
_BLOCK = 1 << 20


def _pyarrow() -> Any:
    pa = require("pyarrow", "arrow", "writing --format arrow")
    require("pyarrow.ipc", "arrow", "writing --format arrow")
    return pa


class ArrowStream:
    """An Arrow IPC stream: the schema (from the first batch), then one record batch (one Arrow row) per batch."""

    name = "arrow"

    def __init__(self) -> None:
        self._pa = _pyarrow()
        self._schema: Any = None

    def _columns(self, record: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> tuple[list[Any], list[str]]:
        pa = self._pa
        meta = pa.RecordBatch.from_pylist([record], schema=None if self._schema is None else self._meta_schema)
        columns, names = list(meta.columns), list(meta.schema.names)
        for name, values in arrays.items():
            width, length = values.shape
            flat = pa.array(np.ascontiguousarray(values).reshape(-1))
            rows = pa.FixedSizeListArray.from_arrays(flat, length)
            columns.append(pa.ListArray.from_arrays(pa.array([0, width], pa.int32()), rows))
            names.append(name)
        return columns, names

    def header(self, first: MiniBatch | None, context_length: int, dtype: Any) -> bytes:
        if first is None:  # an empty epoch: the window columns, no batch
            record = {"epoch": 0, "index": 0, "shape": [0, context_length], "token_count": 0, "rows": []}
            arrays = {name: np.zeros((0, context_length), dtype) for name in ("inputs", "targets")}
        else:
            record, arrays = _split(first)
        self._set_schema(record, arrays)
        return bytes(self._schema.serialize().to_pybytes())

    def _set_schema(self, record: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        pa = self._pa
        self._schema = None
        self._meta_schema = pa.RecordBatch.from_pylist([record]).schema
        columns, names = self._columns(record, arrays)
        self._schema = pa.RecordBatch.from_arrays(columns, names=names).schema

    def pieces(self, batch: MiniBatch) -> Iterator[bytes]:
        """The record batch of *batch*, in one piece."""
        yield self.encode(batch)

    def encode(self, batch: MiniBatch) -> bytes:
        pa = self._pa
        record, arrays = _split(batch)
        if self._schema is None:  # encoded before the header (an estimate of the output): the schema of this batch
            self._set_schema(record, arrays)
        columns, _ = self._columns(record, arrays)
        try:
            made = pa.RecordBatch.from_arrays(columns, schema=self._schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise ConfigError(f"batch {batch.index} does not fit the stream's schema ({err})") from None
        return bytes(made.serialize().to_pybytes())

    def records_in(self, handle: IO[bytes], length: int, lines: int, last: bytes) -> tuple[int, list[tuple[int, int]]]:
        """``(record batches, [(epoch, index) of the first and last])`` of the stream's first *length* bytes (mapped)."""
        pa = self._pa
        if not length:
            return 0, []
        try:
            with mmap.mmap(handle.fileno(), length, access=mmap.ACCESS_READ) as mapped:
                reader = pa.ipc.open_stream(pa.py_buffer(mapped))
                heads = [(int(b.column(0)[0].as_py()), int(b.column(1)[0].as_py())) for b in _batches(reader)]
                del reader
        except (pa.ArrowInvalid, OSError, IndexError, ValueError, TypeError, BufferError):
            return -1, []
        return len(heads), [heads[0], heads[-1]] if heads else []


def _batches(reader: Any) -> Iterator[Any]:
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return


def _split(batch: MiniBatch) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    """The record's fields without its arrays, and the arrays (as numpy)."""
    record = batch_record(batch, arrays=False)
    arrays = record_arrays(batch)
    return record, arrays


def output_format(name: str) -> JsonLines | ArrowStream:
    """The `OutputFormat` called *name* (one of `FORMATS`)."""
    if name == "arrow":
        return ArrowStream()
    return JsonLines()


def write_all(
    fmt: JsonLines | ArrowStream, batches: Iterator[MiniBatch], handle: IO[bytes], context_length: int, dtype: Any
) -> tuple[int, int]:
    """Write the header and every batch of *batches* to *handle*; return ``(batches, bytes)`` written."""
    first = next(batches, None)
    size = handle.write(fmt.header(first, context_length, dtype))
    count = 0
    for batch in itertools.chain(() if first is None else (first,), batches):
        size += sum(handle.write(piece) for piece in fmt.pieces(batch))
        count += 1
    return count, size


def counted(batches: Iterable[MiniBatch], progress: Bar) -> Iterator[MiniBatch]:
    for batch in batches:
        yield batch
        progress.update(1)


class Shown:
    """What the command shows on stderr: a progress bar on a terminal (``--progress``), one summary line at the end."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._progress: bool | None = args.progress

    def bar(self, total: int) -> Bar:
        return bar(max(total, 0), desc="epoch", unit="batch", progress=self._progress)

    def done(self, batches: int, size: int, output: str, *, remote: bool = False) -> None:
        print(f"streambatch: wrote {batches:,} batches ({_bytes(size)}) to {short_path(output)}", file=sys.stderr)
        if remote and (line := STATS.line()):  # a source in object storage: what reading it cost, the cache's hits
            print(f"streambatch: {line}", file=sys.stderr)


def _bytes(size: int) -> str:
    """*size* bytes for a person: ``812 B``, ``3.4 MB``, ``12.8 GB`` (decimal units)."""
    value, unit = float(size), "B"
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if value < 1000 or unit == "PB":
            break
        value /= 1000
    return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"


WARN_RATIO = 64
"""Warn when the output holds this many times the corpus's tokens (inputs and targets of every window)."""


def warn_size(args: argparse.Namespace, run: Run, fmt: JsonLines | ArrowStream) -> None:
    """Before writing: estimate the output, and warn when it is far larger than the corpus (overlapping windows)."""
    corpus = max(sum(int(store.flat_size) for store in run.items.stores), 1)  # a mixture: every source's
    tokens = 2 * run.item_count * run.config.context_length  # inputs and targets of every item
    left = run.batches_in(run.position[0]) - run.position[1]
    if tokens < WARN_RATIO * corpus or left <= 0:
        return
    estimate = sum(map(len, fmt.pieces(run.batch(*run.position)))) * left  # the first record (in pieces), per batch left
    stride, T = run.config.stride, run.config.context_length
    hint = (
        f"; with --stride {stride} each window overlaps the next by {T + 1 - stride} tokens: --stride {T} gives "
        "non-overlapping windows"
        if not run.pack and stride < T
        else ""
    )
    print(
        f"streambatch: warning: the output holds about {tokens:,} tokens ({_bytes(estimate)} as {fmt.name}), "
        f"{tokens / corpus:,.0f}x the corpus's {corpus:,} tokens{hint}",
        file=sys.stderr,
    )


def token_dtype(run: Run) -> np.dtype[Any]:
    """The dtype of the batches' tokens (a mixture's: the widest of its sources')."""
    return np.result_type(*(store.dtype for store in run.items.stores))
