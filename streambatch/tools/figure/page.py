"""The figure of an epoch as an SVG document or an HTML page, and the files written from them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import IO

from ...epoch import Epoch
from ...errors import ConfigError
from ...io.atomic import atomic_text
from ..inspect import format_count
from .rows import draw_rows
from .summary import draw_summary
from .svg import FONT, INK, INPUT_FILL, MARGIN, MONO, MUTED, PALETTE, TAIL_FILL, TARGET_FILL, Canvas, xml_text

MAX_WINDOWS = 64  # more than this draws the summary


def _order_words(epoch: Epoch) -> str:
    return "document order" if epoch.seed is None else f"seed {epoch.seed}"


def _subtitle(epoch: Epoch) -> str:
    return (
        f"T = {epoch.context_length} · stride {epoch.stride} · requested batch size B = {epoch.batch_size} · "
        f"{_order_words(epoch)} · partition {epoch.partition.value}"
    )


def figure_title(epoch: Epoch) -> str:
    """``5 shuffled windows → 2 batches`` (``in document order`` when sequential)."""
    how = "windows in document order" if epoch.seed is None else "shuffled windows"
    return f"{format_count(epoch.item_count)} {how} → {format_count(epoch.batch_count)} batches"


def epoch_svg(epoch: Epoch, *, notes: Sequence[str] = (), max_windows: int = MAX_WINDOWS) -> str:
    """The epoch's figure as an SVG document: every row up to *max_windows* windows, else the summary.

    *notes* are printed under the figure (e.g. the PROOF line).

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> svg = epoch_svg(sb.Epoch(docs, context_length=2, batch_size=3, seed=7))
    >>> svg.count('class="row"'), svg.count('class="unused"'), 'data-origin="train-b@1"' in svg
    (5, 2, True)
    """
    canvas = Canvas()
    canvas.text(MARGIN, 34, figure_title(epoch), size=20, font_weight="bold")
    canvas.text(MARGIN, 56, _subtitle(epoch), size=13, fill=MUTED)
    y = draw_rows(canvas, epoch, 88) if epoch.item_count <= max_windows else draw_summary(canvas, epoch, 88)
    for note in notes:
        y += 20
        canvas.text(MARGIN, y, note, size=12, font_family=MONO, class_="note")
    return canvas.svg(figure_title(epoch))


LEGEND_ROWS = (
    (INPUT_FILL, "solid", "input ids: the first T tokens of the window"),
    (TARGET_FILL, "solid", "target ids: the last T tokens (the inputs shifted by one)"),
    ("none", "dashed", "unused capacity: rows never created, contributing nothing to any sum or denominator"),
)
LEGEND_SUMMARY = (
    (PALETTE[0], "solid", "window span: tokens up to the end of a document's last complete window"),
    (TAIL_FILL, "solid", "tail: tokens after it, in no window's reach"),
    ("none", "dashed", "unused capacity of the final batch: never created, contributing nothing"),
)


def epoch_html(epoch: Epoch, *, title: str | None = None, notes: Sequence[str] = (), max_windows: int = MAX_WINDOWS) -> str:
    """An HTML page: *title* (default: the figure's), a legend, and `epoch_svg` inline.

    >>> import streambatch as sb
    >>> page = epoch_html(sb.Epoch([sb.Document("a&b", "train", [1, 2, 3])], context_length=1, batch_size=2, seed=7))
    >>> page.startswith("<!DOCTYPE html>"), "a&amp;b@0" in page
    (True, True)
    """
    heading = title or f"streambatch: {figure_title(epoch)}"
    rows = LEGEND_ROWS if epoch.item_count <= max_windows else LEGEND_SUMMARY
    return html_page(heading, rows, epoch_svg(epoch, notes=notes, max_windows=max_windows))


def html_page(heading: str, legend: Sequence[tuple[str, str, str]], svg: str) -> str:
    """The one HTML page of every figure: *heading*, a legend of ``(fill, "solid"|"dashed", words)`` swatches, *svg* inline."""
    dashes = {"dashed": ' stroke-dasharray="5 3"', "solid": ""}
    items = "\n".join(
        f'<li><svg width="26" height="16"><rect x="1" y="1" width="24" height="14" rx="3" fill="{fill}" stroke="#666"'
        f"{dashes[style]}/></svg> {xml_text(words)}</li>"
        for fill, style, words in legend
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{xml_text(heading)}</title>\n"
        "<style>\n"
        f"body {{ font-family: {FONT}; color: {INK}; margin: 24px; background: #ffffff; }}\n"
        "h1 { font-size: 22px; margin: 0 0 10px; }\n"
        "ul.legend { list-style: none; padding: 0; margin: 0 0 4px; display: flex; flex-wrap: wrap; gap: 6px 22px; }\n"
        "ul.legend li { display: flex; align-items: center; gap: 6px; font-size: 13px; }\n"
        "svg { max-width: 100%; height: auto; }\n"
        "</style>\n</head>\n<body>\n"
        f"<h1>{xml_text(heading)}</h1>\n"
        f'<ul class="legend">\n{items}\n</ul>\n'
        f"{svg}"
        "</body>\n</html>\n"
    )


def write_texts(texts: Sequence[tuple[str | None, Callable[[], str]]], stdout: IO[str] | None = None) -> list[str]:
    """Write each ``(path, make)`` with a path atomically (``-``: *stdout*, one at most); returns the paths written."""
    wanted = [(path, make) for path, make in texts if path is not None]
    if sum(path == "-" for path, _ in wanted) > 1:
        raise ConfigError("--svg - and --html - both name standard output; send one of them to a file")
    if stdout is None and any(path == "-" for path, _ in wanted):
        raise ConfigError("'-' (standard output) needs a stream here (stdout=); name a file")
    written = []
    for path, make in wanted:
        assert path is not None
        if path == "-":
            assert stdout is not None
            stdout.write(make())
        else:
            with atomic_text(path) as handle:
                handle.write(make())
        written.append(path)
    return written


def write_figure(
    epoch: Epoch,
    *,
    svg: str | None = None,
    html_path: str | None = None,
    notes: Sequence[str] = (),
    title: str | None = None,
    stdout: IO[str] | None = None,
) -> list[str]:
    """Write the SVG and/or the HTML page atomically; returns the paths written.

    A path ``-`` is *stdout* (one of the two at most).
    """
    return write_texts(
        [(svg, lambda: epoch_svg(epoch, notes=notes)), (html_path, lambda: epoch_html(epoch, title=title, notes=notes))],
        stdout,
    )
