"""What the commands share: the SOURCE arguments, the order arguments, the one seed parser, the epoch they describe."""

from __future__ import annotations

import argparse
from typing import Any

from ..epoch import Epoch
from ..errors import ConfigError
from ..io.mixture_file import MixtureSource
from ..io.remote.location import is_remote, redact
from ..model.documents import Partition
from ..model.source import Source
from ..read.inputs import MAX_LINE_BYTES
from ..read.open import open_source
from ..stages.schedule import BatchSchedule

STDIO = "-"
STREAMS = {("epoch", "output"), ("trace", "svg"), ("trace", "html"), ("demo", "svg"), ("demo", "html")}
"""The options where ``-`` means standard output: a stream written front to back. Everywhere else it is refused."""

SOURCE_HELP = (
    "a store directory (streambatch prepare), a corpus manifest or mixture file (.json) or a JSONL file of token documents"
)


def check_dashes(args: argparse.Namespace) -> None:
    """``-`` has one meaning, standard output, and only for a stream (`STREAMS`); anywhere else it is refused.

    A store, a plan folder, a state file or a source is reopened, mapped or
    replaced by name, so ``-`` there would only create a file or folder named ``-``.
    """
    for dest, value in vars(args).items():
        if value == STDIO or (isinstance(value, list) and STDIO in value):
            if (args.command, dest) in STREAMS:
                continue
            option = dest.upper() if dest in ("source", "inputs") else "--" + dest.replace("_", "-")
            streams = ", ".join(f"{c} --{d}" for c, d in sorted(STREAMS))
            raise ConfigError(
                f"{args.command} {option} -: '-' (standard input or output) is accepted only where a stream is written "
                f"({streams}); name a file or folder"
            )


LOCAL_ONLY = {  # options naming a file or folder that is mapped, locked or renamed in place: local (or shared) paths only
    ("epoch", "output"): "the batches are written and cut back in place",
    ("epoch", "save_state"): "the state is replaced in place after every batch",
    ("epoch", "resume"): "the state is replaced in place after every batch",
    ("epoch", "plan_dir"): "plan files are memory-mapped and locked",
    ("audit", "plan_dir"): "plan files are memory-mapped and locked",
    ("inspect", "plan_dir"): "plan files are memory-mapped and locked",
    ("plan", "output"): "plan files are memory-mapped and locked",
    ("trace", "svg"): "the figure is written atomically beside itself",
    ("trace", "html"): "the page is written atomically beside itself",
}


def check_local_paths(args: argparse.Namespace) -> None:
    """An object-storage address where only a local path works is refused in one line (never a local folder
    named ``s3:``); `LOCAL_ONLY` says which options and why.  Sources and ``prepare -o`` take addresses."""
    for dest, value in vars(args).items():
        why = LOCAL_ONLY.get((str(getattr(args, "command", "")), dest))
        if why is not None and isinstance(value, str) and "://" in value:
            option = "--" + dest.replace("_", "-")
            raise ConfigError(
                f"{args.command} {option} {redact(value)}: an object-storage address is not accepted here ({why}); "
                "name a local or shared-file-system path"
            )


def seed_type(text: str) -> int:
    """``--seed`` values: decimal or ``0x`` hex (range checked by the library)."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed={text!r} is not an integer") from None


def byte_size(text: str) -> int:
    """``--max-line-bytes`` values: bytes, or with a unit: ``64MiB``, ``1GiB``, ``512K`` (binary units)."""
    number = text.strip().rstrip("iBb")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(number[-1:].upper(), 1)
    try:
        value = int(number[:-1] if scale > 1 else number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 67108864, 64MiB, 1GiB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 byte")
    return value


def add_max_line(parser: Any) -> None:
    """--max-line-bytes: the most one JSONL (or text) line may hold."""
    parser.add_argument(
        "--max-line-bytes",
        type=byte_size,
        default=MAX_LINE_BYTES,
        metavar="SIZE",
        help="refuse a line longer than this (default 64MiB; units K, M, G)",
    )


def batch_size_arg(text: str) -> int | BatchSchedule:
    """``--batch-size``: an int, or a batch-size schedule (`streambatch.stages.schedule`)."""
    try:
        return BatchSchedule.parse(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_remote(parser: Any) -> None:
    """--cache-dir, --cache-bytes and --trust-remote: how a SOURCE in object storage is read."""
    parser.add_argument(
        "--cache-dir", metavar="DIR", help="object storage: keep fetched, checked token blocks here (shared by processes)"
    )
    parser.add_argument(
        "--cache-bytes", type=byte_size, metavar="SIZE", help="object storage: the cache's limit (default 16GiB with --cache-dir)"
    )
    parser.add_argument(
        "--trust-remote",
        action="store_true",
        help="object storage: read a store uploaded without block digests, unchecked (logged)",
    )


def remote_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords the remote options give `open_source` (refused in one line for a source not in object storage)."""
    given = {"cache_dir": args.cache_dir, "cache_bytes": args.cache_bytes, "trust_remote": args.trust_remote or None}
    keywords = {k: v for k, v in given.items() if v is not None}
    if keywords and not is_remote(str(args.source)):
        option = "--" + next(iter(keywords)).replace("_", "-")
        raise ConfigError(f"{option} applies to a SOURCE in object storage (s3://, gs://, https://), not {args.source!r}")
    return keywords


def add_source(parser: Any, *, required_window: bool, stride_default: int | None = None) -> None:
    """SOURCE, -T, -B, --stride, --partition, --keep-partition, --no-verify and --max-line-bytes."""
    parser.add_argument("source", help=SOURCE_HELP)
    need = "required" if required_window else "optional"
    parser.add_argument("--context-length", "-T", type=int, required=required_window, help=f"tokens per input row ({need})")
    parser.add_argument(
        "--batch-size", "-B", type=batch_size_arg, required=required_window,
        help=f"windows per batch, or a schedule by consumed tokens such as '0:2 64:4 200:3' ({need})",
    )  # fmt: skip
    parser.add_argument("--stride", type=int, default=stride_default, help="distance between window starts (default 1)")
    parser.add_argument("--partition", choices=[p.value for p in Partition], default=None, help="the partition (default train)")
    parser.add_argument(
        "--keep-partition", action="store_true", help="skip documents of other partitions instead of refusing the source"
    )
    parser.add_argument("--no-verify", action="store_true", help="skip a store's fingerprint check (reads every byte)")
    add_max_line(parser)
    add_remote(parser)
    parser.add_argument(
        "--pack",
        action="store_true",
        help="packed rows: every target of every document, pieces at stride T packed best-fit into rows of T positions",
    )
    parser.add_argument(
        "--skip-untrained",
        action="store_true",
        help="drop the windows (--pack: pieces, before packing) with no counted target under the loss mask; "
        "a mixture filters each source (default: keep them)",
    )


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
    return open_source(args.source, verify=not args.no_verify, max_line_bytes=args.max_line_bytes, remote=remote_keywords(args))


def args_epoch(args: argparse.Namespace, source: object, **more: Any) -> Epoch:
    """The epoch the arguments describe over *source*: `streambatch.Epoch`, whose partition rule every command shares.

    With ``--pack`` it is ``Epoch(..., pack=True)``: packed rows, no stride (refused).
    """
    packed = bool(getattr(args, "pack", False))
    if packed:
        check_pack(args)
        more["pack"] = True
    if getattr(args, "skip_untrained", False):
        more["skip_untrained"] = True
    return Epoch(
        source,
        context_length=args.context_length,
        batch_size=args.batch_size,
        stride=None if packed else 1 if args.stride is None else args.stride,
        seed=None if getattr(args, "sequential", False) else args.seed,
        partition=args.partition or Partition.TRAIN,
        keep_partition=args.keep_partition,
        **more,
    )


def check_stride(args: argparse.Namespace) -> None:
    """--stride means nothing without --context-length, nor with --pack (pieces are cut at stride T); --pack needs -T."""
    if args.stride is not None and args.context_length is None:
        raise ConfigError(f"--stride {args.stride} needs --context-length; pass -T to count windows")
    check_pack(args)


def check_pack(args: argparse.Namespace) -> None:
    """--pack refuses --stride (packing cuts every document into pieces at stride T) and needs --context-length."""
    if not getattr(args, "pack", False):
        return
    if args.stride is not None:
        raise ConfigError(
            f"--pack with --stride {args.stride}: packing cuts every document into pieces at stride T, "
            "each target once; drop --stride"
        )
    if args.context_length is None:
        raise ConfigError("--pack needs --context-length; pass -T, the positions of one packed row")
