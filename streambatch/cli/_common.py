"""What the commands share: the SOURCE arguments, the order arguments, the one seed parser, the epoch they describe."""

from __future__ import annotations

import argparse
from typing import Any

from ..epoch import Epoch
from ..errors import ConfigError
from ..io.mixture_file import MixtureSource
from ..model.documents import Partition
from ..model.source import Source
from ..stages.read.open import open_source

SOURCE_HELP = (
    "a store directory (streambatch prepare), a corpus manifest or mixture file (.json) or a JSONL file of token documents"
)


def seed_type(text: str) -> int:
    """``--seed`` values: decimal or ``0x`` hex (range checked by the library)."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r} is not an integer") from None


def add_source(parser: Any, *, required_window: bool, stride_default: int | None = None) -> None:
    """SOURCE, -T, -B, --stride, --partition, --keep-partition and --no-verify."""
    parser.add_argument("source", help=SOURCE_HELP)
    need = "required" if required_window else "optional"
    parser.add_argument("--context-length", "-T", type=int, required=required_window, help=f"tokens per input row ({need})")
    parser.add_argument("--batch-size", "-B", type=int, required=required_window, help=f"windows per batch ({need})")
    parser.add_argument("--stride", type=int, default=stride_default, help="distance between window starts (default 1)")
    parser.add_argument("--partition", choices=[p.value for p in Partition], default=None, help="the partition (default train)")
    parser.add_argument(
        "--keep-partition", action="store_true", help="skip documents of other partitions instead of refusing the source"
    )
    parser.add_argument("--no-verify", action="store_true", help="skip a store's fingerprint check (reads every byte)")


def add_order(parser: Any, *, sequential: bool = True) -> None:
    """--seed N | --sequential (one required); without *sequential*, --seed alone (required)."""
    if not sequential:
        parser.add_argument("--seed", type=seed_type, required=True, help="the run's shuffle seed in [0, 2**64)")
        return
    order = parser.add_mutually_exclusive_group(required=True)
    order.add_argument("--seed", type=seed_type, help="shuffle seed in [0, 2**64); epoch E uses derive_seed(seed, E)")
    order.add_argument("--sequential", action="store_true", help="document order, then increasing start")


def open_args_source(args: argparse.Namespace) -> Source | MixtureSource:
    """The source named on the command line."""
    return open_source(args.source, verify=not args.no_verify)


def args_epoch(args: argparse.Namespace, source: Any, **more: Any) -> Epoch:
    """The epoch the arguments describe over *source*: `streambatch.Epoch`, whose partition rule every command shares."""
    return Epoch(
        source,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=1 if args.stride is None else args.stride,
        seed=None if getattr(args, "sequential", False) else args.seed,
        partition=args.partition or Partition.TRAIN,
        keep_partition=args.keep_partition,
        **more,
    )


def check_stride(args: argparse.Namespace) -> None:
    """--stride means nothing without --context-length."""
    if args.stride is not None and args.context_length is None:
        raise ConfigError(f"--stride {args.stride} needs --context-length; pass -T to count windows")
