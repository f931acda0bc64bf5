"""``streambatch plan``: compute an epoch's shuffle plan once, into a plan file every process maps."""

from __future__ import annotations

import argparse
import json
import time
from typing import IO, Any

from .._checks import check_non_negative, check_positive, check_seed
from ..epoch import derive_seed
from ..model.documents import Partition
from ..stages.chunk import batch_count
from ..stages.plan import _plan_file, plan_path
from ..stages.read.open import open_source
from ..stages.windows import windows


def _source(path: str) -> Any:
    """A store directory, a corpus manifest (``*.json``) or a JSONL file of documents."""
    return open_source(path).store


def _plan(args: argparse.Namespace, out: IO[str]) -> None:
    check_positive(args.batch_size, "batch_size", "the number of windows per batch")
    epoch = check_non_negative(args.epoch, "epoch", "the epoch number (0 for the first)")
    seed = derive_seed(check_seed(args.seed), epoch)
    source = _source(args.source)
    # documents of other partitions add no windows: the plan is the one of source.select(partition)
    ordered = windows(source, context_length=args.context_length, stride=args.stride, partition=args.partition)
    path = plan_path(ordered, seed, args.output)
    existed = path.exists()
    started = time.perf_counter()
    plan = _plan_file(ordered, seed, args.output, run={"seed": args.seed, "epoch": args.epoch})
    summary = {
        "plan": str(path),
        "created": not existed,
        "seconds": round(time.perf_counter() - started, 3),
        "windows": len(plan),
        "batches": batch_count(len(plan), args.batch_size),
        "bytes": plan.plan_nbytes,
        "seed": args.seed,
        "epoch": args.epoch,
        "shuffle_seed": seed,
        "state_after": plan.state_after,
        "corpus": source.content_fingerprint(),
    }
    out.write(json.dumps(summary, indent=1) + "\n")


def _seed(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r} is not an integer") from None


def register(commands: Any) -> None:
    """Add ``plan`` to *commands* (an argparse subparsers object)."""
    plan = commands.add_parser("plan", help="compute an epoch's shuffle plan once, into a plan file shared by every process")
    plan.add_argument("source", help="a store directory, a corpus manifest (.json) or a JSONL file of documents")
    plan.add_argument("--context-length", "-T", type=int, required=True, help="tokens per input row (T)")
    plan.add_argument("--stride", type=int, default=1, help="distance between window starts (default 1)")
    plan.add_argument("--batch-size", "-B", type=int, required=True, help="windows per batch (reported)")
    plan.add_argument("--seed", type=_seed, required=True, help="the run's shuffle seed in [0, 2**64)")
    plan.add_argument("--epoch", type=int, default=0, help="epoch number: the shuffle seed is derive_seed(seed, epoch)")
    plan.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="the epoch's partition")
    plan.add_argument("--output", "-o", required=True, help="plan directory (created if missing)")
    plan.set_defaults(run=_plan)
