"""The ``epoch`` command: one JSON object per batch of one epoch of a run, resumable.

``--epoch E`` picks epoch E of the run seeded with ``--seed`` (order of
``derive_seed(seed, E)``), ``--start-batch K`` starts at its batch K.  With
``--save-state STATE`` the output file is written batch by batch and, after each
batch, STATE is replaced atomically by the run's position plus the output's
length; ``--resume STATE`` cuts the output back to that length (dropping a batch
written after the last saved state) and continues, so the file holds every batch
of the epoch exactly once, however often the command was interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from .._checks import check_non_negative, is_integer
from ..epoch import Epoch
from ..errors import ConfigError, OutOfRangeError, StateError
from ..io.atomic import atomic_text
from ..io.bounded_json import HEADER_LIMIT, decode_json
from ..model.corpus import Corpus
from ..model.documents import Partition
from ..run import Run
from ..stages.batch import MiniBatch
from ..stages.read.open import open_source

STATE_FORMAT = "streambatch.epoch-command"
STATE_VERSION = 1
_STATE_KEYS = ("format", "version", "epoch", "run", "output")


def batch_record(batch: MiniBatch) -> dict[str, Any]:
    """One batch as the JSON object ``streambatch epoch`` writes (rows of a corpus also name their shard)."""
    sharded = isinstance(batch.space.store, Corpus)
    return {
        "epoch": batch.epoch,
        "index": batch.index,
        "shape": list(batch.shape),
        "token_count": batch.token_count,
        "rows": [
            {
                "document": p.document_id,
                "document_index": p.document_index,
                "start": p.start,
                "partition": p.partition.value,
                **({"shard": p.shard} if sharded else {}),
            }
            for p in batch.provenance
        ],
        "inputs": batch.inputs.tolist(),
        "targets": batch.targets.tolist(),
    }


def _line(batch: MiniBatch) -> str:
    return json.dumps(batch_record(batch), separators=(",", ":")) + "\n"


def _run(args: argparse.Namespace, epoch: int) -> Run:
    """The run of the command line, stopping after *epoch* (only that epoch's plan is ever computed)."""
    store = open_source(args.file).store
    documents = store.select(args.partition) if args.keep_partition else store
    first = Epoch(
        documents,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=args.stride,
        seed=None if args.sequential else args.seed,
        partition=args.partition,
        plan_dir=args.plan_dir,
    )
    if first.window_count == 0:  # not an error, but never silent
        print(
            f"streambatch: note: the epoch is empty: no document of partition {first.partition.value!r} in {args.file} "
            f"has the T + 1 = {first.context_length + 1} tokens one window needs",
            file=sys.stderr,
        )
    return Run.from_epoch(first, epochs=epoch + 1)


def _epoch(args: argparse.Namespace, out: IO[str]) -> None:
    if args.resume is not None and (args.epoch is not None or args.start_batch is not None):
        raise ConfigError("--resume continues where its state file says; drop --epoch and --start-batch")
    resumable = args.save_state is not None or args.resume is not None
    if resumable and (args.output is None or args.output == "-"):
        raise ConfigError(
            "--save-state/--resume need --output FILE: the state records the file's length, to cut a resumed run back to it"
        )
    if args.resume is not None:
        state = _read_state(args.resume)
        epoch = state["epoch"]
        run = _run(args, epoch)
        written, length = _check_resume(run, state, args.resume, args.output)
    else:
        epoch = check_non_negative(0 if args.epoch is None else args.epoch, "epoch", "the epoch to write (0 for the first)")
        run = _run(args, epoch)
        start = 0 if args.start_batch is None else args.start_batch
        if not 0 <= start <= run.batches_per_epoch:
            raise OutOfRangeError(
                f"start_batch={start} is out of range for an epoch of {run.batches_per_epoch} batches; "
                f"pass 0 <= --start-batch <= {run.batches_per_epoch}"
            )
        run.set_position(epoch, start)
        written, length = 0, 0
    if not resumable:
        _emit(args.output, out, lambda handle: handle.writelines(map(_line, run)))
        return
    state_path = args.save_state if args.save_state is not None else args.resume
    _write_saving_state(run, epoch, args.output, state_path, written, length)


def _read_state(state_path: str) -> dict[str, Any]:
    """The state file's contents, checked for shape (not yet against the run)."""
    with open(state_path, "rb") as handle:
        state = decode_json(handle.read(HEADER_LIMIT + 1), state_path, "the file --save-state wrote", error=StateError)
    found = state if isinstance(state, dict) else {}
    if found.get("format") != STATE_FORMAT or found.get("version") != STATE_VERSION:
        raise StateError(
            f"{state_path}: format={found.get('format')!r}, version={found.get('version')!r} is not a "
            f"{STATE_FORMAT!r} version {STATE_VERSION} state; pass the file --save-state wrote"
        )
    if sorted(found) != sorted(_STATE_KEYS):
        raise StateError(f"{state_path}: keys {sorted(found)} are not {sorted(_STATE_KEYS)}; pass the file --save-state wrote")
    record = found["output"]
    if not isinstance(record, dict) or sorted(record) != ["batches", "bytes", "path"]:
        raise StateError(f"{state_path}: output={record!r} must hold path, bytes and batches; pass the file unchanged")
    if not is_integer(found["epoch"]) or found["epoch"] < 0:
        raise StateError(f"{state_path}: epoch={found['epoch']!r} must be a non-negative int; pass the file unchanged")
    return found


def _check_resume(run: Run, state: dict[str, Any], state_path: str, output: str) -> tuple[int, int]:
    """Check the saved state against this run and the output; move the run; return (batches written, output length)."""
    try:
        position = run.check_state(state["run"])
    except StateError as err:
        raise StateError(f"{state_path}: {err}") from None
    epoch, record = state["epoch"], state["output"]
    if position[0] != epoch and position != (epoch + 1, 0):
        raise StateError(f"{state_path}: epoch={epoch} does not hold the run position {list(position)}; pass the file unchanged")
    length, written, path = record["bytes"], record["batches"], record["path"]
    if not is_integer(length) or length < 0 or not is_integer(written) or written < 0:
        raise StateError(f"{state_path}: output={record!r} must count bytes and batches; pass the file unchanged")
    if os.path.abspath(output) != path:
        raise StateError(f"{state_path}: the state belongs to output {path!r}, not --output {os.path.abspath(output)!r}")
    size = os.path.getsize(output) if os.path.exists(output) else None
    if size is None or size < length:
        raise StateError(
            f"{state_path}: output {output!r} has {size} bytes but the state recorded {length}; it was truncated, "
            "replaced or removed: start again without --resume"
        )
    run.set_position(*position)
    return written, length


def _write_saving_state(run: Run, epoch: int, output: str, state_path: str, written: int, length: int) -> None:
    """Append batches to *output*; after each, make it durable and replace the state file atomically."""
    path = os.path.abspath(output)
    if os.path.realpath(state_path) == os.path.realpath(output):
        raise ConfigError(f"--save-state {state_path} is the --output file; keep the state in a file of its own")

    def save(size: int, count: int) -> None:
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": epoch,
            "run": run.state_dict(),
            "output": {"path": path, "bytes": size, "batches": count},
        }
        with atomic_text(state_path) as target:
            json.dump(state, target, indent=1)

    save(length, written)  # the state file first: an unwritable one fails before the output is touched
    with open(output, "r+b" if length else "wb") as handle:
        handle.truncate(length)  # drop whatever was written after the last saved state
        handle.seek(length)
        for batch in run:
            handle.write(_line(batch).encode())
            handle.flush()
            os.fsync(handle.fileno())
            written += 1
            save(handle.tell(), written)


def _emit(output: str | None, out: IO[str], write: Callable[[IO[str]], None]) -> None:
    if output is None or output == "-":
        write(out)
    else:
        with atomic_text(output) as handle:
            write(handle)


def _uint64(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r} is not an integer") from None


def register(commands: Any) -> None:
    """Add ``epoch`` to *commands* (an argparse subparsers object)."""
    epoch = commands.add_parser("epoch", help="write one JSON object per batch of an epoch over a JSONL file or store")
    epoch.add_argument(
        "file",
        help='JSONL file (one {"id", "partition", "tokens"} object per line), a store directory or a corpus manifest (.json)',
    )
    epoch.add_argument("--context-length", "-T", type=int, required=True, help="tokens per input row (T)")
    epoch.add_argument("--batch-size", "-B", type=int, required=True, help="windows per batch (the last may be fewer)")
    epoch.add_argument("--stride", type=int, default=1, help="distance between window starts (default 1)")
    order = epoch.add_mutually_exclusive_group(required=True)
    order.add_argument("--seed", type=_uint64, help="run seed in [0, 2**64); epoch E uses derive_seed(seed, E)")
    order.add_argument("--sequential", action="store_true", help="document order, then increasing start")
    epoch.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="the epoch's partition")
    epoch.add_argument(
        "--keep-partition", action="store_true", help="skip documents of other partitions instead of rejecting them"
    )
    epoch.add_argument("--epoch", type=int, help="which epoch of the run to write (default 0)")
    epoch.add_argument("--start-batch", type=int, help="first batch to write: batches already consumed (default 0)")
    epoch.add_argument("--output", "-o", help="write to this file (atomically, unless the state is saved) instead of stdout")
    epoch.add_argument(
        "--save-state", metavar="STATE", help="write --output batch by batch; after each, save the position to STATE atomically"
    )
    epoch.add_argument(
        "--resume", metavar="STATE", help="continue a run from STATE (cutting --output back to it), saving to STATE again"
    )
    epoch.add_argument("--plan-dir", help="map the shuffle plan from this folder (computed there once if missing)")
    epoch.set_defaults(run=_epoch)
