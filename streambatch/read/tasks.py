"""A file cut into tasks, and each task read by its format's module: how `streambatch.prepare_store` reads.

A task is 1 MiB of lines (JSONL, or text read per line), a whole text file, a
Parquet row group, rows of a saved dataset, or a whole ``.arrow``/``.npy``/``.bin``
file; `run_task` yields its blocks.  A file that cannot be read becomes a
``failed`` task, so a run can skip it (``--skip-bad``) in order.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..io.files import short_path
from . import inputs as _inputs
from .bin import bin_blocks, indexed_blocks
from .blocks import Block, ReadOptions
from .columns.arrow import arrow_blocks
from .columns.hf import dataset_rows_blocks, load_dataset_folder
from .columns.parquet import parquet_blocks, parquet_row_group_starts, parquet_row_groups
from .jsonl import jsonl_blocks
from .npy import npy_blocks
from .parts import file_size, offsets_in, rows_in
from .select import InputFile
from .text.text import text_file_block, text_lines_blocks
from .text.tokenizers import ByteTokenizer

DATASET_TASK_ROWS = 8192  # rows of a saved dataset per task


@dataclass(frozen=True)
class Task:
    """A piece of work on one input file (*file* is its position in the selection)."""

    file: int
    kind: str
    path: str
    name: str
    chunk: _inputs.LineChunk | None = field(default=None, repr=False)
    part: tuple[int, int] = (0, 0)  # Parquet: (row group, first row); saved dataset: (start, stop) rows
    size: int = 0  # bytes, roughly: how tasks are grouped for workers
    error: str = ""

    def inline(self, opts: ReadOptions) -> bool:
        """Runs in the main process even with workers: nothing to tokenize (numpy reads), or only bytes to
        split, which is faster than sending the ids back from a worker."""
        return self.kind in ("npy", "bin", "failed", "empty") or (
            self.kind in ("text", "lines") and isinstance(opts.tokenizer, ByteTokenizer)
        )


def file_tasks(index: int, file: InputFile, opts: ReadOptions, span: tuple[int, int] | None = None) -> Iterator[Task]:
    """The tasks of one file, in order; a file that cannot be read ends with a ``failed`` task.

    *span* (a piece of a part, `streambatch.read.parts`): only the lines, row groups
    or dataset rows that start in those bytes of the file.
    """
    path, kind = str(file.path), file.kind
    try:
        if kind != "dataset":  # a folder; its files are checked where it is loaded
            _inputs.check_input(path)  # one check for every format: a FIFO or device is never opened by a reader
        if kind == "jsonl" or (kind == "text" and opts.per_line):
            lines = "jsonl" if kind == "jsonl" else "lines"
            chunks = _inputs.line_chunks(path, _inputs.LINE_CHUNK_BYTES, opts.max_line_bytes, span)
            for chunk in _first_or(chunks, _inputs.LineChunk(b"", 0, 1)):
                yield Task(index, lines, path, file.name, chunk, size=len(chunk.data))
        elif kind == "parquet":
            groups = parquet_row_groups(path)
            firsts = list(itertools.accumulate(groups[:-1], initial=0)) if groups else []
            chosen = range(len(groups)) if span is None else list(offsets_in(span, parquet_row_group_starts(path)))
            for group in chosen:
                yield Task(index, kind, path, file.name, part=(group, firsts[group]))
            if not chosen:
                yield Task(index, "empty", path, file.name)
        elif kind == "dataset":
            rows = load_dataset_folder(path).num_rows
            first, stop = (0, rows) if span is None else rows_in(span, rows, file_size(file))
            for lo in range(first, max(stop, first + 1), DATASET_TASK_ROWS):
                yield Task(index, kind, path, file.name, part=(lo, min(stop, lo + DATASET_TASK_ROWS)))
        elif kind == "unsupported":
            suffix = Path(_inputs.base_name(path)).suffix
            yield Task(
                index,
                "failed",
                path,
                file.name,
                error=f"{short_path(path)}: compressed {suffix} files are not read; decompress it",
            )
        elif kind == "offsets":
            yield Task(
                index,
                "failed",
                path,
                file.name,
                error=f"{short_path(path)}: an offsets file without {short_path(path[:-12])}.npy beside it",
            )
        else:
            yield Task(index, kind, path, file.name, size=_size(path))
    except DataError as err:
        yield Task(index, "failed", path, file.name, error=str(err))


def _first_or(items: Iterator[Any], empty: Any) -> Iterator[Any]:
    seen = False
    for item in items:
        seen = True
        yield item
    if not seen:
        yield empty


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def run_task(task: Task, opts: ReadOptions) -> Iterator[Block]:
    """The blocks of one task (lazily), their loss masks checked (`Block.with_masks`); a failed task raises its `DataError`."""
    for block in _task_blocks(task, opts):
        yield block.with_masks(opts.skip_untrained_documents)


def _task_blocks(task: Task, opts: ReadOptions) -> Iterator[Block]:
    if task.kind == "text":
        yield text_file_block(task.path, task.name, opts)
    elif task.kind == "lines" and task.chunk is not None:
        yield from text_lines_blocks(task.chunk, task.path, task.name, opts)
    elif task.kind == "jsonl" and task.chunk is not None:
        yield from jsonl_blocks(task.chunk, task.path, task.name, opts)
    elif task.kind == "parquet":
        yield from parquet_blocks(task.path, task.name, task.part[0], task.part[1], opts)
    elif task.kind == "arrow":
        yield from arrow_blocks(task.path, task.name, opts)
    elif task.kind == "dataset":
        yield from dataset_rows_blocks(task.path, task.name, task.part[0], task.part[1], opts)
    elif task.kind == "npy":
        yield from npy_blocks(task.path, task.name, opts)
    elif task.kind == "bin":
        yield from bin_blocks(task.path, task.name, opts)
    elif task.kind in ("megatron", "datatrove", "datatrove-part"):
        yield from indexed_blocks(task.path, task.name, task.kind, opts)
    elif task.kind != "empty":
        raise DataError(task.error or f"{short_path(task.path)}: unknown task kind {task.kind!r}")
