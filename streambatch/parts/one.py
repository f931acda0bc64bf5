"""Build one token store from the files corpora come in, on several cores (`streambatch.prepare.prepare_store`'s run).

Inputs are files and folders, selected by `streambatch.read.select.select_inputs`
(include/exclude globs, then ``part=(i, n)``: the i-th of n contiguous runs of
the file list, so that the n stores (the shards of one corpus), read in order, hold exactly the
documents of the whole); each file is read by its format's module
(`streambatch.read.formats` lists them).

The work is cut into tasks (`streambatch.read.tasks`: 1 MiB of lines, a
Parquet row group, rows of a saved dataset, a file), run in order, in this
process or, with ``workers > 1``, small ones grouped and sent to a pool of
spawned processes whose results are written in input order: the store is the
same either way.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._progress import FileProgress
from ..errors import ConfigError, DataError
from ..io.files import short_path
from ..io.formats import FormatWriter
from ..io.remote.location import is_remote
from ..io.store import StoreWriter
from ..model.documents import Document
from ..model.validate import check_vocabulary
from ..read.bin import check_bin_separator
from ..read.blocks import Block, ReadKeywords, ReadOptions, documents, read_options
from ..read.parts import Piece, part_pieces
from ..read.select import parse_part, select_inputs
from ..read.tasks import Task, file_tasks, run_task
from ..read.workers import Outcome, check_main_guard, check_shareable, plan_workers, run_tasks

if TYPE_CHECKING:
    from typing_extensions import Unpack

# --- the store -----------------------------------------------------------------------------------


def iter_files(
    inputs: Sequence[str | os.PathLike[str]],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    part: str | tuple[int, int] | None = None,
    **read: Unpack[ReadKeywords],
) -> Iterator[Document]:
    """The documents `prepare_store` writes, lazily, in order (one process; the first bad file raises).

    *read*: the reading keywords (tokenizer, eos_id, bos_id, per_line, partition,
    column, bin_separator, bin_dtype; `streambatch.read.blocks.ReadKeywords`).

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.txt").write_text("hi")
    >>> _ = (folder / "b.jsonl").write_text('{"tokens": [7, 8]}\\n')
    >>> [(d.id, d.tokens.tolist()) for d in iter_files([folder], eos_id=256)]
    [('a.txt', [104, 105, 256]), ('b.jsonl:1', [7, 8])]
    """
    refuse_renamed(read)
    opts = read_options(**read)
    pieces = _selected(inputs, include, exclude, part, opts)
    return _iter_files(pieces, opts)


def refuse_renamed(read: Any) -> None:
    """0.3's ``shard=`` (``--shard``) is ``part=``: a shard is one store of a corpus, a part this machine's inputs."""
    if "shard" in read:
        raise ConfigError(
            f"shard={read['shard']!r} is now part={read['shard']!r}: pass part='I/N' (a shard is one store of a corpus)"
        )


def _selected(
    inputs: Sequence[str | os.PathLike[str]],
    include: Sequence[str],
    exclude: Sequence[str],
    part: str | tuple[int, int] | None,
    opts: ReadOptions,
) -> Selection:
    """The pieces of files this run reads: every file, or part ``i/n``'s (`streambatch.read.parts`)."""
    files = select_inputs(inputs, include=include, exclude=exclude)
    share = parse_part(part)
    pieces = Selection(part_pieces(files, share, opts))
    pieces.left_out, pieces.part = files.left_out, share
    first_bin = next((p.file for p in pieces if p.file.kind == "bin"), None)
    if first_bin is not None:  # before any work, not at the first .bin
        check_bin_separator(str(first_bin.path), opts)
    return pieces


class Selection(list[Piece]):
    """The pieces a run reads, with the binary files a folder walk left out and the part (None: everything)."""

    left_out: tuple[str, ...] = ()
    part: tuple[int, int] | None = None


def _tasks(pieces: Selection, opts: ReadOptions) -> Iterator[Task]:
    return (task for index, piece in enumerate(pieces) for task in file_tasks(index, piece.file, opts, piece.span))


def _iter_files(pieces: Selection, opts: ReadOptions) -> Iterator[Document]:
    for task in _tasks(pieces, opts):
        yield from documents(run_task(task, opts))


@dataclass
class _FileCount:
    documents: int = 0
    tokens: int = 0
    tokenized: bool = False
    outside: str | None = None  # the first token input beyond the byte tokenizer's vocabulary
    untrained: int = 0  # documents left out because their loss mask trains nothing


@dataclass
class Prepared:
    """What `prepare_with` wrote: the store, the files it skipped (path, why), and what its summary says."""

    store: Any  # a DocumentStore, or another format's store
    skipped: list[tuple[str, str]]
    line: str  # the summary line


def prepare_with(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    opts: ReadOptions,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    part: str | tuple[int, int] | None = None,
    skip_bad: bool = False,
    workers: int = 1,
    quiet: bool = True,
    format: str = "streambatch",  # noqa: A002 - the CLI's --format
) -> Prepared:
    """`prepare_store` with checked reading options, printing nothing: one store (or one part of a corpus run)."""
    if is_remote(os.fspath(output)):  # prepared here, then uploaded with the header last (no reader sees a partial store)
        if format != "streambatch":
            raise ConfigError(
                f"format={format!r} writes local files; an address ({short_path(os.fspath(output))}) takes a streambatch "
                "store: write the files to a local path and copy them, or leave format out"
            )
        from ..io.remote.upload import check_writable, upload_store

        check_writable(os.fspath(output))
        with tempfile.TemporaryDirectory(prefix="streambatch-upload-") as folder:
            done = prepare_with(inputs, Path(folder) / "store", opts, include, exclude, part, skip_bad, workers, quiet)
            done.store = upload_store(Path(folder) / "store", os.fspath(output))
            return done
    if workers > 1:  # what was asked for is checked, then capped: a script that fails elsewhere fails here too
        check_main_guard(workers)
        check_shareable(opts, workers)
    split = plan_workers(workers, opts.tokenizer, quiet)
    files = _selected(inputs, include, exclude, part, opts)
    share = files.part
    header = {"shard": {"index": share[0], "count": share[1]}} if share else {}  # the store format's name
    tasks = _tasks(files, opts)
    progress = FileProgress(len(files), desc="prepare", progress=False if quiet else None)
    skipped: list[tuple[str, str]] = []
    try:
        named = opts.tokenizer if opts.named_tokenizer else None
        writer: StoreWriter | FormatWriter = (
            StoreWriter(output, tokenizer=named, header=header)
            if format == "streambatch"
            else FormatWriter(output, format, tokenizer=named)
        )
        with writer:
            with contextlib.closing(
                run_tasks(tasks, opts, split.processes, split.threads)
            ) as outcomes:  # closing stops the workers
                totals = _write(outcomes, files, writer, opts, skip_bad, skipped, progress)
            if not opts.named_tokenizer and totals.tokenized:
                if totals.outside:
                    raise DataError(totals.outside)
                writer.set_tokenizer(opts.tokenizer)
            if totals.untrained and isinstance(writer, StoreWriter):  # recorded: `inspect` shows how many the mask left out
                writer.header["untrained_documents_skipped"] = totals.untrained
            store = writer.commit()
            untrained = f"{_count_of(totals.untrained, 'untrained document')} left out, " if totals.untrained else ""
    finally:
        progress.close()
    seconds = progress.seconds()
    line = (
        f"prepare: {_count_of(len(files) - len(skipped), 'file')}, {_count_of(len(store), 'document')}, "
        f"{store.token_count:,} tokens, "
        f"{len(skipped)} skipped, {untrained}{_left_out(files)}{split}, "
        f"{seconds:.2f} s ({store.token_count / max(seconds, 1e-9):,.0f} tokens/s)"
    )
    return Prepared(store, skipped, line)


def report(done: Prepared, quiet: bool) -> None:
    """Print the skipped files (always) and the summary line (unless *quiet*) on stderr."""
    for path, reason in done.skipped:
        shown = short_path(path)
        print(f"prepare: skipped {reason if reason.startswith(shown) else f'{shown}: {reason}'}", file=sys.stderr)
    if not quiet:
        print(done.line, file=sys.stderr)


def _left_out(files: Selection) -> str:
    """The summary's note of binary files a folder walk passed over (none: nothing)."""
    if not files.left_out:
        return ""
    return f"{_count_of(len(files.left_out), 'binary file')} in folders left out (e.g. {short_path(files.left_out[0])}), "


def _count_of(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def _write(
    outcomes: Iterable[tuple[Task, Outcome]],
    files: Selection,
    writer: StoreWriter | FormatWriter,
    opts: ReadOptions,
    skip_bad: bool,
    skipped: list[tuple[str, str]],
    progress: FileProgress,
) -> _FileCount:
    totals, count = _FileCount(), _FileCount()
    mark: Any  # the writer's own kind of mark
    current, mark, failed = -1, writer.mark(), False
    for task, outcome in outcomes:
        if task.file != current:
            if current >= 0 and not failed:
                _merge(totals, count)
            progress.file_done(current >= 0)
            current, mark, failed, count = task.file, writer.mark(), False, _FileCount()
        if failed:
            continue
        try:
            if isinstance(outcome, str):
                raise DataError(outcome)
            for block in outcome:
                writer.add_block(
                    block.tokens, block.lengths, block.ids, block.codes, wheres=block.wheres, loss_mask=block.loss_mask
                )
                _count(count, block, opts)
                progress.add(len(block), int(block.tokens.size))
        except DataError as err:
            if not skip_bad:
                raise
            writer.rollback(mark)
            failed = True
            where = files[current].describe(files.part)
            skipped.append((str(files[current].file.path), f"{err} ({where})" if where else str(err)))
            progress.add(-count.documents, -count.tokens)
    if current >= 0 and not failed:
        _merge(totals, count)
    progress.file_done(current >= 0)
    return totals


def _count(count: _FileCount, block: Block, opts: ReadOptions) -> None:
    count.documents += len(block)
    count.tokens += int(block.tokens.size)
    count.untrained += block.untrained
    count.tokenized = count.tokenized or block.tokenized > 0
    if count.outside is None and block.tokenized < len(block):
        try:  # without a tokenizer named, token inputs may not exceed the byte tokenizer's vocabulary if text is tokenized too
            check_vocabulary(block.tokens, block.lengths, block.label, opts.tokenizer.vocab_size, opts.tokenizer.name)
        except DataError as err:
            count.outside = f"{err} (the text inputs are tokenized by {opts.tokenizer.name!r}: name the tokenizer of both)"


def _merge(totals: _FileCount, count: _FileCount) -> None:
    totals.documents += count.documents
    totals.tokens += count.tokens
    totals.untrained += count.untrained
    totals.tokenized = totals.tokenized or count.tokenized
    totals.outside = totals.outside or count.outside
