"""Store commands for the CLI: ``inspect`` (``prepare`` is in `streambatch.cli.prepare`)."""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from ..documents import Partition
from ..store import open_store
from ..windowing import window_counts


def _inspect(args: argparse.Namespace, out: IO[str]) -> None:
    store = open_store(args.store, verify=not args.no_verify)
    summary: dict[str, Any] = {
        "path": args.store,
        "documents": len(store),
        "tokens": int(store.tokens.size),
        "dtype": store.tokens.dtype.name,
        "fingerprint": store.fingerprint,
        "partitions": {p.value: int((store.partition_codes == p.code).sum()) for p in Partition},
        "tokenizer": store.tokenizer,
    }
    if args.context_length:
        counts = window_counts(store.lengths, args.context_length, args.stride)
        summary["windows"] = int(counts.sum())
        summary["documents_without_windows"] = int((counts == 0).sum())
    out.write(json.dumps(summary, indent=1) + "\n")


def register(commands: Any) -> None:
    """Add ``inspect`` to *commands* (an argparse subparsers object)."""
    inspect = commands.add_parser("inspect", help="check a store and print its summary as JSON")
    inspect.add_argument("store")
    inspect.add_argument("--no-verify", action="store_true", help="skip the fingerprint check (reads every byte)")
    inspect.add_argument("--context-length", "-T", type=int, help="also count windows of this context length")
    inspect.add_argument("--stride", type=int, default=1)
    inspect.set_defaults(run=_inspect)
