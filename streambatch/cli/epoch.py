"""The ``epoch`` command: one JSON object per batch of one epoch of a run, resumable.

``--pack`` writes packed batches (see `batch_record` for their record); the
saved state then records the packed mode, and a window-mode state is refused.

``--epoch E`` picks epoch E of the run seeded with ``--seed`` (order of
``derive_seed(seed, E)``), ``--start-batch K`` starts at its batch K.  With
``--save-state STATE`` the output file is written batch by batch, locked
against a second writer for the whole run, and after each batch STATE (a
`streambatch.state` of kind ``epoch-command``) is replaced atomically by the
run's position plus what the output holds: its length, its batch count and a
BLAKE2b digest of its bytes.  ``--resume STATE`` checks all of that against the
output (a file overwritten or edited since is refused, so is a state whose
fields disagree; the kept prefix must end in a newline and its first and last
records must be the batches the state names), cuts the output back to that
length (dropping a batch written after the last saved state) and continues, so
the file holds every batch of the epoch exactly once, however often the
command was interrupted.  A plain ``-o FILE`` (replaced atomically) takes the
same lock while it replaces an existing file, so it never cuts a running
writer off.  ``-o`` naming the input or a file of a store (by device and
inode), and a state file that is not a regular file of its own, are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import stat
import sys
from collections.abc import Iterator
from typing import IO, Any

from .._checks import check_non_negative
from ..batch.minibatch import MiniBatch
from ..errors import ConfigError, OutOfRangeError, StateError
from ..io.atomic import atomic_text, writing
from ..io.bounded_json import read_json_header
from ..io.files import short_path
from ..io.mixture_file import MixtureSource
from ..io.remote.location import is_remote
from ..io.remote.prefetch import remote_files
from ..items.untrained import untrained_note
from ..model.source import Source
from ..run import Run
from ..state import decode, encode
from ..tools.mix_report import note_repeats, targets_note
from ._common import add_order, add_source, args_epoch, open_args_source
from .outputs import FORMATS, ArrowStream, JsonLines, Shown, counted, format_of, output_format, token_dtype, warn_size, write_all
from .records import record_pieces

Format = JsonLines | ArrowStream

_BLOCK = 1 << 20


def _run(args: argparse.Namespace, source: Source | MixtureSource, epoch: int) -> Run:
    """The run of the command line, stopping after *epoch* (only that epoch's plan is ever computed)."""
    if args.verify and args.plan_dir is None:
        raise ConfigError("--verify checks a plan file: pass --plan-dir DIR too")
    first = args_epoch(args, source, plan_dir=args.plan_dir, verify_plan=args.verify)
    if first.item_count == 0 and first.pack:  # not an error, but never silent
        print(
            f"streambatch: note: the epoch is empty: no document of partition {first.partition.value!r} "
            f"in {short_path(args.source)} "
            "has the 2 tokens one target needs",
            file=sys.stderr,
        )
    elif first.item_count == 0:
        print(
            f"streambatch: note: the epoch is empty: no document of partition {first.partition.value!r} "
            f"in {short_path(args.source)} "
            f"has the T + 1 = {first.context_length + 1} tokens one window needs",
            file=sys.stderr,
        )
    note_repeats(source, first.items)  # a mixture's repeated source is never silent
    if isinstance(source, MixtureSource):  # what each source trains, whatever the weighting
        weighting = f" (weight_by={source.spec.weight_by})"
        print(
            f"streambatch: note: {short_path(source.path)}: counted targets per source{weighting}: "
            f"{targets_note(source.spec.names, first.items)}",
            file=sys.stderr,
        )
    dropped = untrained_note(first.items)
    if dropped is not None:  # what --skip-untrained left out: counted, never silent
        print(f"streambatch: note: {dropped}", file=sys.stderr)
    return Run.from_epoch(first, epochs=epoch + 1)


def _epoch(args: argparse.Namespace, out: IO[str]) -> None:
    if args.resume is not None and (args.epoch is not None or args.start_batch is not None):
        raise ConfigError("--resume continues where its state file says; drop --epoch and --start-batch")
    if args.resume is not None and args.save_state is not None and args.resume != args.save_state:
        raise ConfigError("--resume STATE saves to STATE again; drop --save-state (or pass the same file)")
    resumable = args.save_state is not None or args.resume is not None
    if resumable and (args.output is None or args.output == "-"):
        raise ConfigError(
            "--save-state/--resume need --output FILE: the state records what the file holds, to cut a resumed run back to it"
        )
    name = format_of(args.format, None if args.output == "-" else args.output)
    if name != "jsonl" and args.output in (None, "-"):
        raise ConfigError(f"--format {name} writes binary: pass --output FILE (standard output takes JSON lines)")
    source = open_args_source(args)
    if args.output not in (None, "-"):
        _check_output(args.output, source)
    state_path = args.save_state if args.save_state is not None else args.resume
    if state_path is not None:
        _check_state_path(state_path, args.output, source)
    if args.save_state is not None and args.resume is None:
        _refuse_saved_state(args.save_state)
    shown = Shown(args)
    fmt = output_format(name)
    if args.resume is not None:
        state = decode(
            read_json_header(
                state_path, short_path(state_path), "state file", "pass the file --save-state wrote", error=StateError
            ),
            "epoch-command",
            short_path(state_path),
        )
        fmt = output_format(args.format or state["output"].get("format", "jsonl"))  # a resume keeps the state's format
        run = _run(args, source, state["epoch"])
        with writing(args.output):  # a failed write names the output
            _write_saving_state(run, state["epoch"], args.output, state_path, state, fmt, shown)
        return
    epoch = check_non_negative(0 if args.epoch is None else args.epoch, "epoch", "the epoch to write (0 for the first)")
    run = _run(args, source, epoch)
    start = 0 if args.start_batch is None else args.start_batch
    count = run.batches_in(epoch)  # a batch-size schedule's epochs may differ: this epoch's own
    if not 0 <= start <= count:
        raise OutOfRangeError(
            f"start_batch={start} is out of range for an epoch of {count} batches; pass 0 <= --start-batch <= {count}"
        )
    run.set_position(epoch, start)
    warn_size(args, run, fmt)
    if state_path is not None:
        with writing(args.output):
            _write_saving_state(run, epoch, args.output, state_path, None, fmt, shown)
    elif args.output in (None, "-"):
        for batch in run:  # a piece at a time: a long record is never held whole
            out.writelines(piece.decode() for piece in record_pieces(batch))
    else:
        with _locked_for_replacing(args.output), atomic_text(args.output) as text:
            progress = shown.bar(count - start)
            buffer: IO[bytes] = text.buffer  # type: ignore[attr-defined]  # atomic_text's handle wraps a binary writer
            written, size = write_all(fmt, counted(run, progress), buffer, run.config.context_length, token_dtype(run))
            progress.close()
        shown.done(written, size, args.output, remote=is_remote(str(args.source)))


def _refuse_saved_state(state_path: str) -> None:
    """--save-state over a state a run already saved would restart from batch 0 and lose it: refused."""
    try:
        size = os.stat(state_path).st_size
    except OSError:
        return
    if size:
        raise StateError(
            f"--save-state {short_path(state_path)}: already holds a run's state; continue it with --resume "
            f"{short_path(state_path)}, or remove the file to start again from batch 0"
        )


def _source_files(source: Source | MixtureSource) -> set[tuple[int, int]]:
    """(device, inode) of every file the source reads: the JSONL file, a store's files, a manifest and its shards'."""
    paths = [source.path]
    stores = source.stores if isinstance(source, MixtureSource) else (source.store,)
    paths += list(source.spec.paths) if isinstance(source, MixtureSource) else []
    paths += [p for store in stores for p in store.flat().paths if p is not None]
    found: set[tuple[int, int]] = set()
    for path in paths:
        entries = [os.path.join(path, name) for name in os.listdir(path)] if os.path.isdir(path) else []
        for name in [path, *entries]:
            try:
                info = os.stat(name)
            except OSError:
                continue
            found.add((info.st_dev, info.st_ino))
    return found


def _check_output(output: str, source: Source | MixtureSource) -> None:
    """Refuse an output that is a directory, or (by device and inode) the input or a file of the source."""
    try:
        info = os.stat(output)
    except FileNotFoundError:
        info = None
    try:
        parent: os.stat_result | None = os.stat(os.path.dirname(os.path.abspath(output)))
    except OSError:  # a missing folder: the writer names it
        parent = None
    mine = _source_files(source)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"output {short_path(output)!r} is a directory; name a file to write the batches to")
    inside = [i for i in (info, parent) if i is not None and (i.st_dev, i.st_ino) in mine]
    if inside:
        raise ConfigError(
            f"--output {short_path(output)}: is the input {short_path(source.path)} or a file inside it; "
            "writing there would destroy the source: "
            "name another file"
        )


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _check_state_path(state_path: str, output: str, source: Source | MixtureSource) -> None:
    """A state file is a regular file of its own: not the output, not a device or FIFO, not a file of the source."""
    try:
        info = os.stat(state_path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"--save-state/--resume {short_path(state_path)}: not a regular file; name a file to keep the run's state in"
        )
    mine = _identity(state_path)
    if os.path.realpath(state_path) == os.path.realpath(output) or (mine is not None and mine == _identity(output)):
        raise ConfigError(f"--save-state {short_path(state_path)} is the --output file; keep the state in a file of its own")
    folder = _identity(os.path.dirname(os.path.abspath(state_path)))
    if {mine, folder} & _source_files(source):
        raise ConfigError(
            f"--save-state {short_path(state_path)}: is the source {short_path(source.path)} or a file "
            "inside it; name another file"
        )


@contextlib.contextmanager
def _locked_for_replacing(output: str) -> Iterator[None]:
    """Hold the lock of an existing regular *output* while it is replaced: a writer with --save-state is never cut off."""
    try:  # never opened unless regular: opening a FIFO's read end would let the writer run without its reader
        regular = stat.S_ISREG(os.stat(output).st_mode)
        fd = os.open(output, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC) if regular else -1
    except OSError:  # nothing there yet (or unreadable: the writer names the problem)
        fd = -1
    if fd < 0:
        yield
        return
    with os.fdopen(fd, "rb") as handle:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _lock(handle, output)
        yield


def _lock(handle: IO[bytes], output: str) -> None:
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            raise ConfigError(
                f"--output {short_path(output)}: another streambatch epoch is writing it; wait for it to "
                "finish, or write elsewhere"
            ) from None
        raise


def _kept_prefix(handle: IO[bytes], output: str, state_path: str, record: dict[str, Any], fmt: Format) -> Any:
    """Hash the output's first ``record["bytes"]`` bytes; refuse unless they are exactly what the state recorded."""
    length, count = record["bytes"], record["batches"]
    size = os.fstat(handle.fileno()).st_size
    if size < length:
        raise StateError(
            f"{short_path(state_path)}: output {short_path(output)} has {size} bytes but the state "
            f"recorded {length}; it was truncated, "
            "replaced or removed: start again without --resume"
        )
    digest, lines, left = hashlib.blake2b(digest_size=32), 0, length
    handle.seek(0)
    last = b""
    while left:
        block = handle.read(min(_BLOCK, left))
        if not block:
            break
        digest.update(block)
        lines += block.count(b"\n")
        last, left = block[-1:], left - len(block)
    found, heads = fmt.records_in(handle, length, lines, last)
    if left or found != count or digest.hexdigest() != record["digest"]:
        raise StateError(
            f"{short_path(state_path)}: output {short_path(output)} does not hold the {count} batches "
            f"the state recorded (its first {length} "
            "bytes changed since, or the state was edited); start again without --resume"
        )
    if count and heads != [(record["epoch"], record["first"]), (record["epoch"], record["first"] + count - 1)]:
        raise StateError(
            f"{short_path(state_path)}: output {short_path(output)} does not hold batches "
            f"{record['first']}..{record['first'] + count - 1} "
            f"of epoch {record['epoch']} as the state says (the state was edited); start again without --resume"
        )
    return digest


def _recorded_output(state_path: str, recorded: str) -> str:
    """The output a state names: recorded relative to the state file's folder (an absolute path: as it is)."""
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(state_path)), recorded))


def _write_saving_state(
    run: Run, epoch: int, output: str, state_path: str, state: dict[str, Any] | None, fmt: Format, shown: Shown
) -> None:
    """Append batches to *output* under a lock; after each, make it durable and replace the state file atomically."""
    path = os.path.abspath(output)
    if state is not None and _recorded_output(state_path, state["output"]["path"]) != path:
        raise StateError(
            f"{short_path(state_path)}: the state belongs to output "
            f"{short_path(_recorded_output(state_path, state['output']['path']))!r}, not --output {short_path(path)!r}"
        )
    if state is not None and state["output"].get("format", "jsonl") != fmt.name:
        raise StateError(
            f"{short_path(state_path)}: the state's output is {state['output'].get('format', 'jsonl')}, not --format {fmt.name}; "
            "resume with the format it was written in"
        )
    try:  # a resume opens the output it continues, never creates one: a refused resume leaves no file behind
        fd = os.open(output, os.O_RDWR | os.O_CLOEXEC | (0 if state is not None else os.O_CREAT), 0o666)
    except FileNotFoundError:
        raise StateError(
            f"{short_path(state_path)}: output {short_path(output)} is missing (removed since the state was saved); "
            "start again without --resume"
        ) from None
    except OSError as err:
        raise ConfigError(
            f"output {short_path(output)!r}: cannot create a file in its folder ({err.strerror}); pass a writable path"
        ) from None
    with os.fdopen(fd, "r+b") as handle:
        _lock(handle, output)  # held until the run ends: a second writer is refused, never interleaved
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise ConfigError(f"--output {short_path(output)}: not a regular file; --save-state needs a file it can cut back")
        if _identity(output) != (held.st_dev, held.st_ino):  # replaced between the open and the lock
            raise ConfigError(
                f"--output {short_path(output)}: another streambatch epoch replaced it just now; wait "
                "for it to finish, or write elsewhere"
            )
        if state is None:
            first, written, length, digest = run.position[1], 0, 0, hashlib.blake2b(digest_size=32)
        else:
            record = state["output"]
            position = run.check_state(state["run"], f"{short_path(state_path)}: state")
            first, written, length = record["first"], record["batches"], record["bytes"]
            consumed = run.batches_in(epoch) if position == (epoch + 1, 0) else position[1]
            if position[0] not in (epoch, epoch + 1) or consumed - first != written or first > consumed:
                raise StateError(
                    f"{short_path(state_path)}: run position {list(position)}, first batch {first} and {written} batches written "
                    f"disagree for epoch {epoch}; the state was edited: pass the file --save-state wrote"
                )
            digest = _kept_prefix(handle, output, state_path, {**record, "epoch": epoch}, fmt)
            run.set_position(*position)
        relative = os.path.relpath(path, os.path.dirname(os.path.abspath(state_path)))

        def save(size: int, count: int) -> None:
            record = {"path": relative, "bytes": size, "batches": count, "first": first, "digest": digest.hexdigest()}
            if fmt.name != "jsonl":
                record["format"] = fmt.name
            saved = encode("epoch-command", epoch=epoch, run=run.state_dict(), output=record)
            with atomic_text(state_path) as target:
                json.dump(saved, target, indent=1)

        save(length, written)  # the state file first: an unwritable one fails before the output is touched
        handle.truncate(length)  # drop whatever was written after the last saved state
        handle.seek(length)
        batches = iter(run)
        pending: MiniBatch | None = None
        if length == 0:  # a new output: its header (arrow: the schema, from the first batch) goes first
            pending = next(batches, None)
            header = fmt.header(pending, run.config.context_length, token_dtype(run))
            handle.write(header)
            digest.update(header)
            if pending is None:
                save(handle.tell(), written)
        progress = shown.bar(run.batches_in(epoch) - first - written)
        for batch in itertools.chain(() if pending is None else (pending,), batches):
            for piece in fmt.pieces(batch):  # a long record a piece at a time: memory is the batch and one piece
                handle.write(piece)
                digest.update(piece)
            handle.flush()
            os.fsync(handle.fileno())
            written += 1
            save(handle.tell(), written)
            progress.update(1)
            if _identity(output) != (held.st_dev, held.st_ino):  # renamed over by a writer that ignores the lock
                raise ConfigError(
                    f"--output {short_path(output)}: replaced by another process during the run; what this run wrote is no "
                    "longer there: write again (--save-state) and let no other program replace the file meanwhile"
                )
        progress.close()
        shown.done(written, handle.tell(), output, remote=any(remote_files(store) for store in run.items.stores))


def register(commands: Any) -> None:
    """Add ``epoch`` to *commands* (an argparse subparsers object)."""
    epoch = commands.add_parser("epoch", help="write one JSON object per batch of an epoch over a JSONL file or store")
    add_source(epoch, required_window=True)
    add_order(epoch)
    epoch.add_argument("--epoch", type=int, help="which epoch of the run to write (default 0)")
    epoch.add_argument("--start-batch", type=int, help="first batch to write: batches already consumed (default 0)")
    epoch.add_argument("--output", "-o", help="write to this file (atomically, unless the state is saved); - or none: stdout")
    epoch.add_argument(
        "--save-state", metavar="STATE", help="write --output batch by batch; after each, save the position to STATE atomically"
    )
    epoch.add_argument(
        "--resume", metavar="STATE", help="continue a run from STATE (cutting --output back to it), saving to STATE again"
    )
    epoch.add_argument("--plan-dir", help="map the shuffle plan from this folder (computed there once if missing)")
    epoch.add_argument(
        "--verify", action="store_true", help="with --plan-dir: read the plan once first (digest, entries, no window twice)"
    )
    epoch.add_argument(
        "--format",
        choices=FORMATS,
        help="jsonl: one JSON object per batch (default); arrow: an Arrow IPC stream, one record batch per batch "
        "(default for an --output ending in .arrow or .ipc)",
    )
    epoch.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw a progress bar on stderr (default: when stderr is a terminal)",
    )
    epoch.set_defaults(run=_epoch)
