"""Build token stores from the files corpora come in: `prepare_store`, the door to one store or a corpus folder.

One store (or the part ``part="i/n"`` of the inputs) is `streambatch.parts.one`'s
run: tasks read in this process or a pool of worker processes.  With *executor*
or *parts*, `streambatch.parts.corpus` writes a corpus folder of the n parts,
run here or as Ray tasks (`streambatch.parts.on_ray`); `iter_files` yields the
documents a run writes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, overload

from ._checks import check_positive
from .errors import ConfigError
from .io.formats import FORMATS
from .model.store import DocumentStore
from .model.validate import short
from .parts.corpus import prepare_corpus
from .parts.one import Prepared, iter_files, prepare_with, refuse_renamed, report
from .read.blocks import ReadKeywords, read_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["Prepared", "iter_files", "prepare_store", "prepare_with"]


@overload
def prepare_store(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    part: str | tuple[int, int] | None = None,
    skip_bad: bool = False,
    workers: int = 1,
    quiet: bool = False,
    format: str = "streambatch",
    executor: None = None,
    parts: None = None,
    ray_address: str | None = None,
    **read: Unpack[ReadKeywords],
) -> DocumentStore: ...


@overload
def prepare_store(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    part: str | tuple[int, int] | None = None,
    skip_bad: bool = False,
    workers: int = 1,
    quiet: bool = False,
    format: str = "streambatch",
    executor: str | None = None,
    parts: int | None = None,
    ray_address: str | None = None,
    **read: Unpack[ReadKeywords],
) -> Any: ...


def prepare_store(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    part: str | tuple[int, int] | None = None,
    skip_bad: bool = False,
    workers: int = 1,
    quiet: bool = False,
    format: str = "streambatch",  # noqa: A002 - the CLI's --format
    executor: str | None = None,
    parts: int | None = None,
    ray_address: str | None = None,
    **read: Unpack[ReadKeywords],
) -> Any:
    """Read *inputs* (files, folders; every format of `streambatch.read.formats`) into a new store at *output*.

    *format* ``"megatron"`` writes Megatron-LM's ``OUTPUT.bin`` + ``OUTPUT.idx``
    instead, ``"datatrove"`` datatrove's ``OUTPUT.ds`` + ``OUTPUT.ds.index``
    (`streambatch.io.formats.writer`: the same atomic rules; ids and partitions
    are not kept, so every document must be in the train partition).

    *read* are the reading keywords (`streambatch.read.blocks.ReadKeywords`).
    *tokenizer* (a tokenizer.json path, a `Tokenizer`, any ``str -> ids`` callable;
    bytes by default) tokenizes text, with *bos_id*/*eos_id* around each document
    (``"auto"``: the tokenizer's own, `streambatch.read.text.tokenizers.EOS_NAMES`); token
    inputs are stored as given.  The header records the tokenizer when one is given
    or when text was tokenized, and every token must fit its vocabulary.  With
    *skip_bad*, a file that cannot be read or holds bad documents is left out
    (listed on stderr) instead of stopping the run.  *workers* > 1 tokenizes in that
    many processes; the store is identical.  *part* ``"i/n"`` prepares the i-th of
    n parts of the inputs (`streambatch.read.parts`: a large file is cut at line or
    row-group boundaries).  Written atomically; returns it opened.
    A progress bar (tqdm) runs on stderr when it is a terminal, and a summary line
    is printed there, unless *quiet*.

    *executor* (``"ray"``, or ``"local"``: in this process) or *parts* writes a
    corpus folder at *output* instead: the *parts* parts of the plan, each a store
    ``part-00000``, ..., the same bytes as ``part="i/parts"``, then ``corpus.json``;
    returns the `Corpus` (`streambatch.parts.corpus.prepare_corpus`; *ray_address*:
    the cluster, default a local one).
    """
    if not isinstance(output, (str, os.PathLike)):
        raise ConfigError(
            f"output={short(output)} is not a path; the order is prepare_store(inputs, output) "
            "(write_store takes (path, documents))"
        )
    refuse_renamed(read)
    if format != "streambatch" and format not in FORMATS:
        raise ConfigError(f"format={short(format)} is not one of streambatch, {', '.join(FORMATS)}; pass one of them")
    if executor is not None or parts is not None:
        if part is not None:
            raise ConfigError(f"part={part!r} with executor={executor!r}: a corpus run prepares every part; pass one of them")
        if workers != 1:
            raise ConfigError(f"workers={workers!r} with executor={executor!r}: each part runs on one CPU; leave workers out")
        return prepare_corpus(
            inputs, output, executor=executor or "local", parts=parts, include=include, exclude=exclude,
            skip_bad=skip_bad, quiet=quiet, format=format, opts=read_options(**read), runner=_runner(executor, ray_address),
        )  # fmt: skip
    workers = check_positive(workers, "workers", "the number of processes that tokenize (1: this one)")
    done = prepare_with(inputs, output, read_options(**read), include, exclude, part, skip_bad, workers, quiet, format)
    report(done, quiet)
    return done.store


def _runner(executor: str | None, address: str | None) -> Any:
    """Where the parts run: a maker of Ray tasks' runner (``"ray"``, imported only then), else None (this process)."""
    if executor == "ray":
        from .parts.on_ray import RayRunner

        return lambda: RayRunner(address)
    return None
