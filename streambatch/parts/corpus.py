"""A corpus folder from the part plan: n stores, each exactly what ``prepare --part i/n`` writes, and a manifest last.

``prepare_store(inputs, OUT, executor="ray", parts=n)`` (``prepare ... --executor
ray``) writes ``OUT/part-00000`` ... ``OUT/part-{n-1}`` and then ``OUT/corpus.json``
(`streambatch.io.manifest.write_corpus`).  Each part is `run_part`: the one
per-part function, `streambatch.prepare.prepare_with` on ``part=(i, n)`` of the
plan (`streambatch.read.parts`), written atomically by the store writer (or
uploaded header last to ``s3://``/``gs://``), then its marker
``OUT/part-00000.done.json`` recording what it was made from and its
fingerprint.  The executor only decides where `run_part` runs: ``"local"`` (one
part after another in this process) or ``"ray"`` (a Ray task per part; Ray
retries a part whose worker dies, `streambatch.parts.on_ray`).  A part whose
marker records the same inputs (names, sizes, modification times), options and
part count, beside a store of that fingerprint, is skipped on a re-run.  With
``format="megatron"``/``"datatrove"`` each part is one ``.bin``/``.idx`` or
``.ds`` file set and the folder itself is the listing the readers accept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._progress import bar
from ..errors import ConfigError, DataError, StoreError, StreamBatchError
from ..io.atomic import atomic_text
from ..io.files import short_path
from ..io.formats import open_format, output_paths
from ..io.manifest import CORPUS_MANIFEST as MANIFEST
from ..io.manifest import write_corpus
from ..io.remote.location import is_remote
from ..io.store import open_store
from ..read.blocks import ReadOptions
from ..read.parts import sizes_of
from ..read.select import select_inputs
from ..read.workers import available_cpus
from .one import Prepared, prepare_with, report

EXECUTORS = ("local", "ray")
DONE = ".done.json"
MARKER_FORMAT = "streambatch.part"
PART_BYTES = 4 << 20  # the default plan: a part per 4 MiB of input, at least one per CPU (while 1 MiB each), at most 4


def default_parts(total: int, cpus: int) -> int:
    """How many parts *total* bytes of input make on *cpus* CPUs: one per `PART_BYTES`, at least one per CPU (while
    each holds 1 MiB), at most four per CPU.

    >>> default_parts(20 << 20, 2), default_parts(5 << 20, 8), default_parts(1000, 64), default_parts(50 << 30, 16)
    (5, 5, 1, 64)
    """
    by_size = -(-total // PART_BYTES)
    floor = min(cpus, -(-total // (1 << 20)))
    return max(1, min(4 * cpus, max(by_size, floor)))


def part_name(index: int) -> str:
    """The folder (or file prefix) of part *index*: ``part-00000``."""
    return f"part-{index:05d}"


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}" if is_remote(folder) else os.path.join(folder, name)


def _digest(value: Any) -> str:
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, default=str).encode()
    return "blake2b-256:" + hashlib.blake2b(data, digest_size=32).hexdigest()


@dataclass(frozen=True)
class CorpusJob:
    """One corpus run, as every part's process receives it."""

    inputs: tuple[str, ...]
    output: str
    count: int
    include: tuple[str, ...]
    exclude: tuple[str, ...]
    skip_bad: bool
    format: str
    options: bytes = field(repr=False)  # the pickled `ReadOptions` (unpickled once per process: `_options`)
    options_key: str = ""
    inputs_key: str = ""  # the selected files' names and sizes: every part must see the same (`run_part` checks)
    stamps_key: str = ""  # and their modification times: a changed input redoes the parts (the markers' key)

    def path(self, index: int) -> str:
        return _join(self.output, part_name(index))

    def marker(self, index: int) -> str:
        return _join(self.output, part_name(index) + DONE)

    def key(self, index: int) -> str:
        """What part *index* is made from: a marker recording another key is stale."""
        return _digest(
            [MARKER_FORMAT, 1, index, self.count, self.inputs_key, self.stamps_key, self.options_key,
             self.include, self.exclude, self.skip_bad, self.format]
        )  # fmt: skip


@dataclass
class PartDone:
    """What `run_part` reports to the driver."""

    index: int
    fingerprint: str
    documents: int
    tokens: int
    skipped: list[tuple[str, str]]
    host: str = ""
    pid: int = 0
    loads: int = 0  # how many times this process has loaded reading options (a tokenizer): once per job


def inputs_keys(files: Sequence[Any], sizes: Sequence[int]) -> tuple[str, str]:
    """The digests of the selected files' (name, kind, size) and of their modification times."""
    stamps: list[int | None] = []
    for f in files:
        try:
            stamps.append(os.stat(f.path).st_mtime_ns)
        except OSError:
            stamps.append(None)
    return _digest([[f.name, f.kind, s] for f, s in zip(files, sizes, strict=True)]), _digest(stamps)


# --- in the process that runs a part --------------------------------------------------------------

_OPTIONS: dict[str, ReadOptions] = {}
_LOADS = [0]


def _options(job: CorpusJob) -> ReadOptions:
    """The job's reading options, unpickled (its tokenizer loaded) once per process."""
    if job.options_key not in _OPTIONS:
        _OPTIONS.clear()  # one job's options at a time
        _OPTIONS[job.options_key] = pickle.loads(job.options)
        _LOADS[0] += 1
    return _OPTIONS[job.options_key]


def run_part(job: CorpusJob, index: int) -> PartDone:
    """Prepare part *index* of *job*: its store (atomically), then its marker; the same bytes as ``--part index/count``."""
    host = socket.gethostname()
    opts = _options(job)
    files = select_inputs(list(job.inputs), include=job.include, exclude=job.exclude)
    if inputs_keys(files, sizes_of(files))[0] != job.inputs_key:
        raise DataError(
            f"part {index}/{job.count} on {host}: the inputs differ from what the driver saw ({len(files)} files here); "
            "every node must read the same files: put them on a shared filesystem or in object storage"
        )
    done = prepare_with(
        list(job.inputs), job.path(index), opts, job.include, job.exclude, (index, job.count), job.skip_bad, 1, True, job.format
    )
    fingerprint = done.store.fingerprint if job.format == "streambatch" else _files_digest(job.path(index), job.format)
    result = PartDone(index, fingerprint, len(done.store), int(done.store.token_count), done.skipped, host, os.getpid())
    marker = {
        "format": MARKER_FORMAT, "part": [index, job.count], "key": job.key(index), "fingerprint": fingerprint,
        "documents": result.documents, "tokens": result.tokens, "skipped": [list(s) for s in done.skipped],
    }  # fmt: skip
    _write_marker(job.marker(index), marker)
    result.loads = _LOADS[0]
    return result


def _files_digest(prefix: str, format: str) -> str:  # noqa: A002 - the CLI's --format
    digest = hashlib.blake2b(digest_size=32)
    for path in output_paths(prefix, format):
        if os.path.exists(path):
            digest.update(os.path.basename(path).encode() + b"\0")
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    digest.update(chunk)
    return "blake2b-256:" + digest.hexdigest()


def _write_marker(path: str, marker: dict[str, Any]) -> None:
    text = json.dumps(marker, indent=1) + "\n"
    if is_remote(path):
        from ..io.remote.client import ObjectClient
        from ..io.remote.location import Location

        where = Location.parse(path)
        ObjectClient(where.parent()).put(where.prefix.rpartition("/")[2], text.encode())
        return
    with atomic_text(path) as handle:
        handle.write(text)


def _read_marker(path: str) -> Any:
    try:
        if is_remote(path):
            from ..io.remote.client import ObjectClient
            from ..io.remote.location import Location

            where = Location.parse(path)
            data = ObjectClient(where.parent(), retries=0).get(where.prefix.rpartition("/")[2], 1 << 20)[0]
        else:
            data = Path(path).read_bytes()
        return json.loads(data)
    except (OSError, ValueError, StreamBatchError):
        return None


# --- the driver ---------------------------------------------------------------------------------


def prepare_corpus(
    inputs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    executor: str = "local",
    parts: int | None = None,
    runner: Any = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    skip_bad: bool = False,
    quiet: bool = False,
    format: str = "streambatch",  # noqa: A002 - the CLI's --format
    opts: ReadOptions,
) -> Any:
    """Write the corpus folder *output* (see the module); returns its `Corpus` (formats: the folder's corpus).

    *runner* makes what runs the parts (``run(job, todo)`` yields `PartDone`, ``cpus``,
    ``close()``): `streambatch.parts.on_ray.RayRunner`, or by default this process.
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"executor={executor!r} is not one of {', '.join(EXECUTORS)}; pass ray (a Ray cluster) or local")
    if parts is not None and (isinstance(parts, bool) or not isinstance(parts, int) or parts < 1):
        raise ConfigError(f"parts={parts!r} must be a positive int: how many stores the corpus has")
    if isinstance(inputs, (str, os.PathLike)):
        raise ConfigError(f"inputs={short_path(inputs)!r} is one path; pass a list of files and folders")
    out = os.fspath(output)
    if format != "streambatch" and is_remote(out):
        raise ConfigError(f"format={format!r} writes local files; an address ({out}) takes stores: leave format out")
    _check_folder(out)
    files = select_inputs(inputs, include=include, exclude=exclude)  # a missing input is refused before any work
    sizes = sizes_of(files)
    inputs_key, stamps_key = inputs_keys(files, sizes)
    try:
        options = pickle.dumps(opts)
    except Exception as err:
        raise ConfigError(
            f"executor={executor!r} sends the tokenizer to other processes, and this one cannot be pickled "
            f"({type(err).__name__}: {err}); use a module-level function, a Tokenizer object, or a tokenizer.json path"
        ) from err
    runner = runner() if runner is not None else _Local()  # started once the inputs are known good
    try:
        count = parts or default_parts(sum(sizes), runner.cpus)
        job = CorpusJob(
            tuple(os.fspath(i) for i in inputs), out, count, tuple(include), tuple(exclude), skip_bad, format,
            options, _digest(options), inputs_key, stamps_key,
        )  # fmt: skip
        done = {i: _complete(job, i) for i in range(count)}
        todo = [i for i in range(count) if done[i] is None]
        if todo:
            _remove_manifest(out)  # no manifest stands while its parts change
        progress = bar(count, desc=f"prepare ({executor})", unit="part", progress=False if quiet else None)
        progress.update(count - len(todo))
        documents = sum(d.documents for d in done.values() if d is not None)
        tokens = sum(d.tokens for d in done.values() if d is not None)
        try:
            for result in runner.run(job, todo):
                done[result.index] = result
                documents, tokens = documents + result.documents, tokens + result.tokens
                progress.update(1)
                progress.set_postfix_str(f"{documents:,} docs, {tokens:,} tokens")
                report_skipped(result)
        finally:
            progress.close()
    finally:
        runner.close()
    corpus = _finish(job, done)
    if not quiet:
        print(
            f"prepare: {count} parts ({count - len(todo)} already complete, {len(todo)} prepared by {executor}), "
            f"{documents:,} documents, {tokens:,} tokens, {sum(len(d.skipped) for d in done.values() if d)} skipped"
            f" -> {short_path(out)}",
            file=sys.stderr,
        )
    return corpus


def report_skipped(result: PartDone) -> None:
    """Print a part's skipped files on stderr, as `prepare_store` does."""
    report(Prepared(None, result.skipped, ""), True)


def _check_folder(out: str) -> None:
    if is_remote(out):
        return
    if os.path.lexists(out) and not os.path.isdir(out):
        raise StoreError(f"{short_path(out)}: exists and is not a folder; a corpus run writes a folder of parts there")
    if os.path.isfile(os.path.join(out, "header.json")):
        raise StoreError(f"{short_path(out)}: is a store; a corpus run writes a folder of parts: choose a new output path")


def _complete(job: CorpusJob, index: int) -> PartDone | None:
    """The marker of part *index*, when it records this job's key and the part beside it has its fingerprint."""
    marker = _read_marker(job.marker(index))
    if not isinstance(marker, dict) or marker.get("key") != job.key(index):
        return None
    try:
        if job.format == "streambatch":
            found = open_store(job.path(index), verify=False).fingerprint
        else:
            found = _files_digest(job.path(index), job.format)
    except (StreamBatchError, OSError):
        return None
    if found != marker.get("fingerprint"):
        return None
    skipped = [(str(p), str(r)) for p, r in marker.get("skipped", [])]
    return PartDone(index, str(found), int(marker.get("documents", 0)), int(marker.get("tokens", 0)), skipped)


def _remove_manifest(out: str) -> None:
    if is_remote(out):
        return  # a remote manifest is replaced at the end; its recorded fingerprints refuse changed parts until then
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(out, MANIFEST))


def _finish(job: CorpusJob, done: dict[int, PartDone | None]) -> Any:
    """Check every part against what its run reported, then write the manifest (last) and open the corpus."""
    paths = [job.path(i) for i in range(job.count)]
    if job.format != "streambatch":
        opened = open_format(job.output, job.format)
        if opened is None:
            raise StoreError(f"{short_path(job.output)}: holds no {job.format} files after the run")
        return opened[1]
    for i, path in enumerate(paths):
        result = done[i]
        found = open_store(path, verify=False).fingerprint  # header, sizes and fingerprint; the bytes were hashed as written
        if result is None or found != result.fingerprint:
            raise StoreError(
                f"{short_path(path)}: fingerprint {found!r}, but its run reported {result and result.fingerprint!r}; "
                "another run wrote it meanwhile: run again"
            )
    if is_remote(job.output):
        from ..io.remote.upload import write_remote_corpus

        return write_remote_corpus(_join(job.output, MANIFEST), paths)
    return write_corpus(os.path.join(job.output, MANIFEST), paths)


class _Local:
    """Runs the parts one after another in this process."""

    cpus = available_cpus()

    def run(self, job: CorpusJob, todo: list[int]) -> Iterator[PartDone]:
        for index in todo:
            try:
                yield run_part(job, index)
            except StreamBatchError as err:
                raise type(err)(f"part {index}/{job.count}: {err}") from None

    def close(self) -> None:
        pass
