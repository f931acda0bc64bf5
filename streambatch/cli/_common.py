"""Arguments shared by the commands that read a source and build an epoch (inspect, audit, trace)."""

from __future__ import annotations

import argparse
from typing import Any

from ..epoch import Epoch
from ..errors import ConfigError
from ..model.documents import Partition
from ..stages.read.open import Source, open_source, source_epoch


def seed_type(text: str) -> int:
    """``--seed`` values: decimal or ``0x`` hex (range checked by the library)."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r} is not an integer") from None


def add_source(parser: Any, *, required_window: bool) -> None:
    """SOURCE, -T, -B, --stride, --partition and --no-verify."""
    parser.add_argument("source", help="a store directory (streambatch prepare) or a JSONL file of token documents")
    need = "required" if required_window else "optional"
    parser.add_argument("--context-length", "-T", type=int, required=required_window, help=f"tokens per input row ({need})")
    parser.add_argument("--batch-size", "-B", type=int, required=required_window, help=f"windows per batch ({need})")
    parser.add_argument("--stride", type=int, default=None, help="distance between window starts (default 1)")
    parser.add_argument("--partition", choices=[p.value for p in Partition], default=None, help="the partition (default train)")
    parser.add_argument("--no-verify", action="store_true", help="skip a store's fingerprint check (reads every byte)")


def add_order(parser: Any) -> None:
    """--seed N | --sequential (one required)."""
    order = parser.add_mutually_exclusive_group(required=True)
    order.add_argument("--seed", type=seed_type, help="shuffle seed in [0, 2**64)")
    order.add_argument("--sequential", action="store_true", help="document order, then increasing start")


def open_args_source(args: argparse.Namespace) -> Source:
    """The source named on the command line."""
    return open_source(args.source, verify=not args.no_verify)


def args_epoch(args: argparse.Namespace, source: Source) -> Epoch:
    """The epoch the arguments describe over *source* (other partitions may be present)."""
    return source_epoch(
        source,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=1 if args.stride is None else args.stride,
        seed=None if args.sequential else args.seed,
        partition=args.partition or Partition.TRAIN,
    )


def check_stride(args: argparse.Namespace) -> None:
    """--stride means nothing without --context-length."""
    if args.stride is not None and args.context_length is None:
        raise ConfigError(f"--stride {args.stride} needs --context-length; pass -T to count windows")
