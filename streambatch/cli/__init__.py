"""The ``streambatch`` command line: ``demo``, ``epoch`` and friends.

Bad input anywhere: one line on stderr, exit status 2, no traceback, no partial file.
Ctrl-C: exit 130; SIGTERM: exit 143; either way one line, and the same cleanup.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from typing import IO, Any, NoReturn

from .. import __version__
from .._kernels import describe
from .._signals import terminate_as_interrupt
from ..errors import StreamBatchError, Terminated
from ..io.files import short_path
from ..io.remote.location import redact
from ..tools import chapter
from ._common import check_dashes, check_local_paths
from .audit import register as register_audit
from .epoch import register as register_epoch_command
from .inspect import register as register_inspect
from .plan import register as register_plan_command
from .prepare import register as register_prepare
from .records import batch_record
from .trace import register as register_trace

EXIT_USAGE = 2
__all__ = ["batch_record", "build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:  # no abbreviations: --batch is not --batch-size
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        command = self.prog.removeprefix("streambatch").strip()  # main() adds the "streambatch: " prefix
        raise StreamBatchError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


class _Version(argparse.Action):
    """``--version``: the version, then a line saying which path each kernel runs (`streambatch._kernels.describe`)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and the kernels in use, and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        sys.stdout.write(f"streambatch {__version__}\n{describe()}\n")
        parser.exit()


def _demo(args: argparse.Namespace, out: IO[str]) -> None:
    evidence = chapter.learner_evidence()
    figure = args.svg is not None or args.html is not None
    if "-" not in (args.svg, args.html) and (args.trace or not figure):  # a figure replaces the report, as in trace
        out.write(chapter.diagram_trace(evidence) if args.trace else chapter.learner_report(evidence))
    if figure:  # the chapter's figure, its PROOF line underneath
        from ..tools.figure import figure_title, write_figure

        epoch = evidence.epoch
        title = f"Chapter 21's epoch: {figure_title(epoch)}"
        notes = [chapter.proof_line(evidence)]
        report = sys.stderr if "-" in (args.svg, args.html) else out  # the figure itself goes to stdout
        for path in write_figure(epoch, svg=args.svg, html_path=args.html, notes=notes, title=title, stdout=out):
            where = "standard output" if path == "-" else short_path(path)
            report.write(f"wrote {where}: the chapter's epoch, {epoch.window_count} windows, {epoch.batch_count} batches\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also used by ``--help``)."""
    parser = _Parser(prog="streambatch", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = commands.add_parser("demo", help="print the chapter's worked epoch (report, or --trace)")
    demo.add_argument("--trace", action="store_true", help="print the diagram trace instead of the report")
    demo.add_argument(
        "--svg", help="draw the chapter's epoch to this SVG file instead of printing the report (-: standard output)"
    )
    demo.add_argument(
        "--html",
        help="write an HTML page with the figure, a title and a legend instead of printing the report (-: standard output)",
    )
    demo.set_defaults(run=_demo)

    register_epoch_command(commands)
    register_prepare(commands)
    register_inspect(commands)
    register_audit(commands)
    register_trace(commands)
    register_plan_command(commands)
    return parser


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    stream = out or sys.stdout
    try:
        with terminate_as_interrupt():  # SIGTERM cleans up as Ctrl-C does (temporaries, workers)
            args = build_parser().parse_args(argv)
            check_dashes(args)
            check_local_paths(args)
            status = args.run(args, stream)  # None, or a status of its own (audit: 1 when a proof fails)
            stream.flush()
    except StreamBatchError as err:
        print(f"streambatch: error: {redact(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as err:
        if isinstance(err, BrokenPipeError):
            return 0
        name = getattr(err, "filename", None)
        shown = short_path(name) if isinstance(name, (str, os.PathLike)) else name or ""
        print(
            redact(f"streambatch: error: {err.strerror or err}: {shown}".rstrip(": ")),
            file=sys.stderr,
        )
        return EXIT_USAGE
    except MemoryError:  # what no check above foresaw: one line, never a traceback
        print("streambatch: error: out of memory; raise the memory limit (ulimit -v) or use a larger machine", file=sys.stderr)
        return EXIT_USAGE
    except Terminated:
        print("streambatch: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("streambatch: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
