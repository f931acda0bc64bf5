"""The ``streambatch`` command line: ``demo``, ``epoch`` and friends.

Bad input anywhere: one line on stderr, exit status 2, no traceback, no partial file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any, NoReturn

from .. import chapter
from .._atomic import atomic_text
from ..batch import MiniBatch
from ..corpus import Corpus, open_source
from ..documents import Partition
from ..epoch import Epoch
from ..errors import StreamBatchError
from ..readers import read_jsonl
from .plan import register as register_plan_command
from .store import register as register_store_commands

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        raise StreamBatchError(f"{self.prog}: {message} (see --help)")


def batch_record(batch: MiniBatch) -> dict[str, Any]:
    """One batch as the JSON object ``streambatch epoch`` writes (rows of a corpus also name their shard)."""
    sharded = isinstance(batch.windows.store, Corpus)
    return {
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


def _demo(args: argparse.Namespace, out: IO[str]) -> None:
    evidence = chapter.learner_evidence()
    out.write(chapter.diagram_trace(evidence) if args.trace else chapter.learner_report(evidence))


def _epoch(args: argparse.Namespace, out: IO[str]) -> None:
    if os.path.isdir(args.file) or args.file.endswith(".json"):  # a prepared store or a corpus manifest
        store = open_source(args.file)
        documents = store.select(args.partition) if args.keep_partition else store
    else:
        documents = read_jsonl(args.file, partition=args.partition if args.keep_partition else None)
    epoch = Epoch(
        documents,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=args.stride,
        seed=None if args.sequential else args.seed,
        partition=args.partition,
        plan_dir=args.plan_dir,
    )

    def write(handle: IO[str]) -> None:
        for batch in epoch:
            handle.write(json.dumps(batch_record(batch), separators=(",", ":")) + "\n")

    _emit(args.output, out, write)


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by ``--help``)."""
    parser = _Parser(prog="streambatch", description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = commands.add_parser("demo", help="print the chapter's worked epoch (report, or --trace)")
    demo.add_argument("--trace", action="store_true", help="print the diagram trace instead of the report")
    demo.set_defaults(run=_demo)

    epoch = commands.add_parser("epoch", help="write one JSON object per batch of an epoch over a JSONL file")
    epoch.add_argument(
        "file",
        help='JSONL file (one {"id", "partition", "tokens"} object per line), a store directory or a corpus manifest (.json)',
    )
    epoch.add_argument("--context-length", "-T", type=int, required=True, help="tokens per input row (T)")
    epoch.add_argument("--batch-size", "-B", type=int, required=True, help="windows per batch (the last may be fewer)")
    epoch.add_argument("--stride", type=int, default=1, help="distance between window starts (default 1)")
    order = epoch.add_mutually_exclusive_group(required=True)
    order.add_argument("--seed", type=_uint64, help="shuffle seed in [0, 2**64)")
    order.add_argument("--sequential", action="store_true", help="document order, then increasing start")
    epoch.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="the epoch's partition")
    epoch.add_argument(
        "--keep-partition", action="store_true", help="skip documents of other partitions instead of rejecting them"
    )
    epoch.add_argument("--output", "-o", help="write to this file atomically instead of stdout")
    epoch.add_argument("--plan-dir", help="map the shuffle plan from this folder (computed there once if missing)")
    epoch.set_defaults(run=_epoch)
    register_store_commands(commands)  # prepare, inspect
    register_plan_command(commands)  # plan
    return parser


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    stream = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
        args.run(args, stream)
        stream.flush()
    except StreamBatchError as err:
        print(f"streambatch: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        if isinstance(err, BrokenPipeError):
            return 0
        print(
            f"streambatch: error: {err.strerror or err}: {getattr(err, 'filename', '') or ''}".rstrip(": "),
            file=sys.stderr,
        )
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
