"""``streambatch trace``: draw an epoch (every row when small, a summary when large) as SVG and/or HTML.

``--pack`` draws packed rows: segments coloured by document, padding dashed
(`streambatch.tools.figure.packed`), with the packed PROOF line when every row is drawn.
"""

from __future__ import annotations

import argparse
import sys
from typing import IO, Any

from ..errors import ConfigError
from ..io.files import short_path
from ..io.mixture_file import MixtureSource
from ..tools.audit import audit_epoch, audit_packed_epoch
from ..tools.figure import MAX_WINDOWS, write_figure
from ..tools.figure.mixture import write_mixture_figure
from ..tools.figure.packed import MAX_ROWS, write_packed_figure
from ._common import add_order, add_source, args_epoch, open_args_source


def _trace(args: argparse.Namespace, out: IO[str]) -> None:
    if args.svg is None and args.html is None:
        raise ConfigError("trace needs --svg FILE and/or --html FILE; say where to draw the epoch")
    source = open_args_source(args)
    epoch = args_epoch(args, source)
    if isinstance(source, MixtureSource):  # every batch's rows coloured by source, the sources' legend above
        report = sys.stderr if "-" in (args.svg, args.html) else out
        for path in write_mixture_figure(epoch, svg=args.svg, html_path=args.html, stdout=out):
            where = "standard output" if path == "-" else short_path(path)
            report.write(
                f"wrote {where}: {len(epoch.order)} items of {short_path(source.spec.path)}, {epoch.batch_count} batches, "
                "every batch\n"
            )
        return
    if epoch.pack:
        whole = epoch.item_count <= MAX_ROWS
        proof = [audit_packed_epoch(epoch).proof_line()] if whole else []  # a small epoch is audited in milliseconds
        for path in write_packed_figure(epoch, svg=args.svg, html_path=args.html, notes=proof):
            drawn = "every row" if whole else f"the first {MAX_ROWS} rows"
            out.write(f"wrote {short_path(path)}: {epoch.item_count} packed rows, {epoch.batch_count} batches, {drawn}\n")
        return
    small = epoch.item_count <= MAX_WINDOWS
    notes = [audit_epoch(epoch).proof_line()] if small else []  # a small epoch is audited in milliseconds
    report = sys.stderr if "-" in (args.svg, args.html) else out  # the figure itself goes to stdout
    for path in write_figure(epoch, svg=args.svg, html_path=args.html, notes=notes, stdout=out):
        what = "every row" if small else f"a summary (more than {MAX_WINDOWS} windows)"
        where = "standard output" if path == "-" else short_path(path)
        report.write(f"wrote {where}: {epoch.item_count} windows, {epoch.batch_count} batches, {what}\n")


def register(commands: Any) -> None:
    """Add ``trace`` to *commands* (an argparse subparsers object)."""
    trace = commands.add_parser(
        "trace", help="draw an epoch's windows (--pack: packed rows), batches and denominators as SVG or HTML"
    )
    add_source(trace, required_window=True)
    add_order(trace)
    trace.add_argument("--svg", help="write the figure here (SVG, atomically); - for standard output")
    trace.add_argument("--html", help="write an HTML page with the figure, a title and a legend; - for standard output")
    trace.set_defaults(run=_trace)
