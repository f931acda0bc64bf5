"""The ``prepare`` command: files, folders and datasets -> a token store (see `streambatch.prepare_store`)."""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from ..errors import ConfigError, WorkerLostError
from ..io.files import short_path
from ..io.formats import FORMATS, output_paths
from ..model.documents import Partition
from ..prepare import prepare_store
from ..read.inputs import MAX_DOCUMENT_BYTES
from ..read.text.chat import RENDER_SECONDS
from ..read.text.tokenizers import AUTO, SpecialId
from ._common import add_max_line, byte_size


def _special(text: str) -> SpecialId:
    if text in ("auto", "none"):
        return AUTO if text == "auto" else None
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token id, 'auto' or 'none'") from None


def _prepare(args: argparse.Namespace, out: IO[str]) -> int:
    if args.old_shard is not None:  # a shard is one store of a corpus; this flag picks a part of the input list
        raise ConfigError(
            f"--shard {args.old_shard} is now --part {args.old_shard}: pass --part I/N (a shard is a store of a corpus)"
        )
    try:
        store = _run(args)
    except WorkerLostError as err:  # not a refusal: the run failed (exit 1)
        print(f"streambatch: error: prepare: {err}", file=sys.stderr)
        return 1
    if not args.quiet:
        written = (
            short_path(args.output)
            if args.format == "streambatch" or _corpus_run(args)
            else " + ".join(short_path(p) for p in output_paths(args.output, args.format)[:2])
        )
        out.write(
            f"wrote {written}: {len(store)} documents, {store.token_count} tokens ({store.dtype.name}), "
            f"{store.fingerprint or args.format}\n"
        )
    return 0


def _corpus_run(args: argparse.Namespace) -> bool:
    return args.executor is not None or args.parts is not None


def _run(args: argparse.Namespace) -> Any:
    if _corpus_run(args) and args.workers != 1:
        raise ConfigError(
            f"--workers {args.workers} with --executor/--parts: each part runs on one CPU of the cluster; drop --workers"
        )
    extra = {"executor": args.executor, "parts": args.parts, "ray_address": args.ray_address} if _corpus_run(args) else {}
    return prepare_store(
        args.inputs,
        args.output,
        tokenizer=args.tokenizer,
        eos_id=args.eos_id,
        bos_id=args.bos_id,
        per_line=args.per_line,
        partition=args.partition,
        column=args.column,
        bin_separator=args.bin_separator,
        bin_dtype=args.bin_dtype,
        max_line_bytes=args.max_line_bytes,
        max_document_bytes=args.max_document_bytes,
        prompt_field=args.prompt_field,
        completion_field=args.completion_field,
        chat_template=args.chat_template,
        skip_untrained_documents=args.skip_untrained_documents,
        labels_shifted=args.labels_shifted,
        chat_render_seconds=args.chat_render_seconds,
        include=args.include,
        exclude=args.exclude,
        part=args.part,
        skip_bad=args.skip_bad,
        workers=args.workers,
        quiet=args.quiet,
        format=args.format,
        **extra,
    )


def register(commands: Any) -> None:
    """Add ``prepare`` to *commands* (an argparse subparsers object)."""
    p = commands.add_parser("prepare", help="build a memory-mappable token store from text, JSONL, Parquet, .npy, .bin, datasets")
    p.add_argument(
        "inputs",
        nargs="+",
        help="files or folders: text, .jsonl/.ndjson (+.gz/.zst), .parquet, .arrow, .npy, .bin, Megatron .idx, datatrove .ds",
    )
    p.add_argument(
        "-o", "--output", required=True, help="store directory to create (replaced atomically); with --format, a prefix"
    )
    p.add_argument(
        "--format",
        default="streambatch",
        choices=["streambatch", *FORMATS],
        help="streambatch (a store, default), megatron (OUTPUT.bin + OUTPUT.idx), datatrove (OUTPUT.ds + OUTPUT.ds.index)",
    )
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer.json for text (default: UTF-8 bytes)")
    p.add_argument("--eos-id", type=_special, default=AUTO, help="id appended to each text document: ID, none, auto (default)")
    p.add_argument("--bos-id", type=_special, default=AUTO, help="id prepended to each text document: ID, none, auto (default)")
    p.add_argument("--per-line", action="store_true", help="one document per non-blank line of text")
    p.add_argument("--partition", default="train", choices=[p.value for p in Partition], help="for documents that name none")
    p.add_argument("--column", help="Parquet/Arrow/dataset (and JSONL text) column: token ids or text")
    p.add_argument("--bin-separator", type=int, help=".bin files: the id that ends each document (default: the eos id)")
    p.add_argument("--bin-dtype", default="uint16", choices=["uint16", "uint32"], help=".bin token width (default uint16)")
    add_max_line(p)
    p.add_argument(
        "--max-document-bytes",
        type=byte_size,
        default=MAX_DOCUMENT_BYTES,
        metavar="SIZE",
        help="refuse a text document (a whole file, or a row's text) larger than this (default 256MiB)",
    )
    p.add_argument("--prompt-field", metavar="NAME", help="prompt/completion rows: the prompt's text field (not trained)")
    p.add_argument("--completion-field", metavar="NAME", help="prompt/completion rows: the completion's text field (trained)")
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="render rows' messages with this Jinja chat template (or tokenizer_config.json); assistant turns train",
    )
    p.add_argument(
        "--skip-untrained-documents",
        action="store_true",
        help="leave out (and count) documents whose loss mask trains nothing, instead of refusing them",
    )
    p.add_argument(
        "--labels-shifted",
        action="store_true",
        help="token rows' labels are shifted by one (labels[i] is input_ids[i+1] or -100); default: aligned, as HF's",
    )
    p.add_argument(
        "--chat-render-seconds",
        type=float,
        default=RENDER_SECONDS,
        metavar="S",
        help=f"refuse a chat whose template renderings take longer than this (default {RENDER_SECONDS:g})",
    )
    p.add_argument("--include", action="append", default=[], metavar="GLOB", help="keep only matching files (repeatable)")
    p.add_argument("--exclude", action="append", default=[], metavar="GLOB", help="leave matching files out (repeatable)")
    p.add_argument("--skip-bad", action="store_true", help="leave out files that cannot be read, listing them on stderr")
    p.add_argument("--workers", type=int, default=1, help="tokenizing processes (default 1, at most the CPUs); same store")
    p.add_argument(
        "--part", metavar="I/N", help="prepare only the I-th of N parts of the inputs (cut by bytes, at lines/row groups)"
    )
    p.add_argument(
        "--executor",
        choices=["ray", "local"],
        help="write a corpus folder OUTPUT (part-00000, ..., corpus.json), each part a Ray task (ray) or here (local)",
    )
    p.add_argument("--parts", type=int, metavar="N", help="with --executor: how many parts (default: enough for the cluster)")
    p.add_argument("--ray-address", metavar="ADDRESS", help="with --executor ray: the cluster (default: a local one)")
    p.add_argument("--shard", dest="old_shard", help=argparse.SUPPRESS)  # 0.3's name of --part: refused, with the new one
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar or summary")
    p.set_defaults(run=_prepare)
