"""Store commands for the CLI: ``prepare`` and ``inspect``."""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from ..corpus import Corpus, open_source
from ..documents import Partition
from ..prepare import prepare_store
from ..windowing import window_counts


def _prepare(args: argparse.Namespace, out: IO[str]) -> None:
    store = prepare_store(args.inputs, args.output, per_line=args.per_line, partition=args.partition, quiet=args.quiet)
    if not args.quiet:
        out.write(
            f"wrote {args.output}: {len(store)} documents, {store.tokens.size} tokens ({store.tokens.dtype.name}), "
            f"{store.fingerprint}\n"
        )


def _inspect(args: argparse.Namespace, out: IO[str]) -> None:
    store = open_source(args.store, verify=not args.no_verify)  # a store, or a corpus manifest
    summary: dict[str, Any] = {
        "path": args.store,
        "documents": len(store),
        "tokens": store.flat_size,
        "dtype": store.dtype.name,
        "fingerprint": store.fingerprint,
        "partitions": {p.value: int((store.partition_codes == p.code).sum()) for p in Partition},
    }
    if isinstance(store, Corpus):
        summary["shards"] = [
            {"path": path, "documents": len(s), "tokens": s.flat_size} for path, s in zip(store.paths, store.shards, strict=True)
        ]
    if args.context_length:
        counts = window_counts(store.lengths, args.context_length, args.stride)
        summary["windows"] = int(counts.sum())
        summary["documents_without_windows"] = int((counts == 0).sum())
    out.write(json.dumps(summary, indent=1) + "\n")


def register(commands: Any) -> None:
    """Add ``prepare`` and ``inspect`` to *commands* (an argparse subparsers object)."""
    prepare = commands.add_parser("prepare", help="build a memory-mappable token store from text or JSONL files")
    prepare.add_argument("inputs", nargs="+", help="text files, folders of them, or .jsonl token files")
    prepare.add_argument("-o", "--output", required=True, help="store directory to create (replaced atomically)")
    prepare.add_argument("--per-line", action="store_true", help="one document per non-blank line of text")
    prepare.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="for text documents")
    prepare.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    prepare.set_defaults(run=_prepare)

    inspect = commands.add_parser("inspect", help="check a store and print its summary as JSON")
    inspect.add_argument("store", help="a store directory or a corpus manifest (.json)")
    inspect.add_argument("--no-verify", action="store_true", help="skip the fingerprint check (reads every byte)")
    inspect.add_argument("--context-length", "-T", type=int, help="also count windows of this context length")
    inspect.add_argument("--stride", type=int, default=1)
    inspect.set_defaults(run=_inspect)
