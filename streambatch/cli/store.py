"""Store commands for the CLI: ``prepare`` (``inspect`` lives in `streambatch.cli.inspect`)."""

from __future__ import annotations

import argparse
from typing import IO, Any

from ..documents import Partition
from ..prepare import prepare_store


def _prepare(args: argparse.Namespace, out: IO[str]) -> None:
    store = prepare_store(args.inputs, args.output, per_line=args.per_line, partition=args.partition, quiet=args.quiet)
    if not args.quiet:
        out.write(
            f"wrote {args.output}: {len(store)} documents, {store.tokens.size} tokens ({store.tokens.dtype.name}), "
            f"{store.fingerprint}\n"
        )


def register(commands: Any) -> None:
    """Add ``prepare`` to *commands* (an argparse subparsers object)."""
    prepare = commands.add_parser("prepare", help="build a memory-mappable token store from text or JSONL files")
    prepare.add_argument("inputs", nargs="+", help="text files, folders of them, or .jsonl token files")
    prepare.add_argument("-o", "--output", required=True, help="store directory to create (replaced atomically)")
    prepare.add_argument("--per-line", action="store_true", help="one document per non-blank line of text")
    prepare.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="for text documents")
    prepare.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    prepare.set_defaults(run=_prepare)
