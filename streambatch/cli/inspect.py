"""``streambatch inspect``: what an epoch over a source will contain, as aligned text or ``--json``."""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from ..errors import ConfigError
from ..io.mixture_file import MixtureSource
from ..io.remote.client import STATS
from ..io.remote.location import is_remote
from ..tools.inspect import format_summary, inspect_source
from ..tools.mix_report import format_mixture, inspect_mixture
from ._common import add_source, check_stride, open_args_source


def _inspect(args: argparse.Namespace, out: IO[str]) -> None:
    check_stride(args)
    if args.skip_untrained and args.context_length is None:
        raise ConfigError("--skip-untrained needs --context-length: it counts the windows (rows) an epoch keeps; pass -T")
    source = open_args_source(args)
    if isinstance(source, MixtureSource):  # per source: items, weight, effective share, source epochs, tokens (--pack: rows)
        mixed = inspect_mixture(
            source, context_length=args.context_length, batch_size=args.batch_size,
            stride=1 if args.stride is None else args.stride, partition=args.partition, pack=args.pack,
            skip_untrained=args.skip_untrained, epoch=args.epoch,
        )  # fmt: skip
        out.write(json.dumps(mixed, indent=1) + "\n" if args.json else format_mixture(mixed))
        return
    summary = inspect_source(
        source,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=1 if args.stride is None else args.stride,
        partition=args.partition,
        pack=args.pack,
        skip_untrained=args.skip_untrained,
        epoch=args.epoch,
    )
    remote = is_remote(str(args.source))
    if remote:  # what reading it cost: requests, bytes, the cache's hits
        summary["object_storage"] = STATS.summary()
    out.write(json.dumps(summary, indent=1) + "\n" if args.json else format_summary(summary))
    if remote and not args.json and (line := STATS.line()):
        out.write(line + "\n")


def register(commands: Any) -> None:
    """Add ``inspect`` to *commands* (an argparse subparsers object)."""
    inspect = commands.add_parser(
        "inspect",
        help="documents, tokens and (with -T, -B) windows, tails, batches and plan bytes of a source; "
        "--pack: windows and packed rows side by side",
    )
    add_source(inspect, required_window=False)
    inspect.add_argument("--json", action="store_true", help="print JSON for scripts instead of aligned text")
    inspect.add_argument(
        "--epoch", type=int, default=0, help="with a batch-size schedule: lay out this epoch of the run (default 0)"
    )
    inspect.set_defaults(run=_inspect)
