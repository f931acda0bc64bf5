"""The picture of a mixture's epoch: which source every row of every batch came from, with a legend in view.

Every batch is drawn, whatever the epoch's size.  Up to `MAX_STRIPS` batches,
one strip per batch and one cell per row, coloured by its source; beyond that,
each strip stands for *g* consecutive batches and shows the share of their
rows each source holds (stacked, in source order), and the figure says so.
The title, subtitle and legend sit above the strips, within the drawing's
width, so nothing is clipped or off-screen; the HTML page is the one page of
every figure (`streambatch.tools.figure.page.html_page`).

>>> import streambatch as sb
>>> a = sb.windows([sb.Document("a", "train", range(40))], context_length=2)
>>> b = sb.windows([sb.Document("b", "train", range(20))], context_length=2)
>>> epoch = sb.Epoch(sb.mix([a, b], [2, 1], seed=3), batch_size=4)
>>> svg = mixture_svg(epoch)
>>> svg.count('class="row"') == len(epoch.order), 'class="legend"' in svg
(True, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any, cast

import numpy as np

from ...epoch import Epoch
from ...items.mix.mixture import Mixture
from ...stages.chunk import fixed_batch_size
from ..inspect import format_count
from .page import html_page, write_texts
from .svg import MARGIN, MONO, MUTED, PALETTE, Canvas, text_width

MAX_STRIPS = 256
"""The most strips drawn; an epoch of more batches draws each strip as a group of consecutive batches."""
CELLS_WIDE = 720
"""About how wide the strips are drawn, in pixels (cells shrink for a large batch size)."""


def mixture_title(epoch: Epoch) -> str:
    """``1,024 items of 3 sources → 64 batches``."""
    k = len(_mixture(epoch).names)
    items, batches = format_count(len(epoch.order)), format_count(epoch.batch_count)
    return f"{items} items of {k} source{'s' if k != 1 else ''} → {batches} batches"


def _mixture(epoch: Epoch) -> Mixture:
    return cast(Mixture, epoch.order)


def _subtitle(epoch: Epoch) -> str:
    order = "document order" if epoch.seed is None else f"seed {epoch.seed}"
    what = "packed rows" if epoch.pack else f"stride {epoch.stride}"
    return f"T = {epoch.context_length} · {what} · requested batch size B = {epoch.batch_size} · {order}"


def _legend(epoch: Epoch) -> list[tuple[str, str]]:
    """``(colour, words)`` per source: its name, weight and the share of the epoch's items it holds, its source epochs."""
    mixture = _mixture(epoch)
    counts = mixture.counts().tolist()
    total = max(sum(counts), 1)
    weights = mixture.weights
    epochs = mixture.source_epochs()
    return [
        (
            PALETTE[s % len(PALETTE)],
            f"{name}: weight {float(weights[s]):.4g}, {counts[s]:,} items ({counts[s] / total:.1%}), "
            f"{epochs[s]:.2f} source epochs",
        )
        for s, name in enumerate(mixture.names)
    ]


def mixture_svg(epoch: Epoch, *, notes: Sequence[str] = (), legend: bool = True) -> str:
    """The figure as an SVG document (see the module docstring); *legend*: draw the sources' legend in it."""
    mixture = _mixture(epoch)
    B, batches, k = fixed_batch_size(epoch.batch_size, "the figure"), epoch.batch_count, len(mixture.names)
    sources = mixture.sources().astype(np.int64)
    group = max(1, -(-batches // MAX_STRIPS))  # batches per strip
    strips = -(-batches // group) if batches else 0
    cell = max(2.0, min(14.0, CELLS_WIDE / max(B, 1)))
    width = cell * B if group == 1 else max(cell * B, 480.0)  # a strip of shares reads better wide
    canvas = Canvas()
    canvas.text(MARGIN, 34, mixture_title(epoch), size=20, font_weight="bold")
    canvas.text(MARGIN, 56, _subtitle(epoch), size=13, fill=MUTED)
    y = 76.0
    canvas.open(class_="legend")
    x = float(MARGIN)
    for colour, words in _legend(epoch) if legend else ():  # wrapped to the strips' width (or the title's), never off-screen
        span = 18 + text_width(words, 12) + 18
        if x > MARGIN and x + span > MARGIN + max(width + 60, 520):
            x, y = float(MARGIN), y + 20
        canvas.rect(x, y, 12, 12, fill=colour, rx=2)
        canvas.text(x + 18, y + 10, words, size=12)
        x += span
    canvas.close()
    y += 30 if legend else 10
    how = "one strip per batch, one cell per row, coloured by its source" if group == 1 else (
        f"each strip is {group} consecutive batches ({strips} strips): the share of their rows from each source"
    )  # fmt: skip
    canvas.text(MARGIN, y, f"every batch drawn: {how}", size=12, fill=MUTED, class_="drawn")
    y += 12
    left = MARGIN + 56.0
    height = cell if group == 1 else max(3.0, min(cell, 6.0))
    for strip in range(strips):
        lo, hi = strip * group * B, min((strip + 1) * group * B, sources.size)
        top = y + strip * height
        if strip % max(1, strips // 16) == 0:  # a batch number now and then
            canvas.text(left - 6, top + height - 1, strip * group, size=9, fill=MUTED, text_anchor="end", font_family=MONO)
        rows = sources[lo:hi]
        if group == 1:
            for r, s in enumerate(rows.tolist()):
                canvas.rect(
                    left + r * cell, top, max(cell - 1, 1), max(height - 1, 1), fill=PALETTE[s % len(PALETTE)],
                    class_="row", data_batch=strip, data_source=s,
                )  # fmt: skip
            continue
        counts = np.bincount(rows, minlength=k)
        x = left
        for s, count in enumerate(counts.tolist()):
            if count:
                share = width * count / rows.size
                canvas.rect(x, top, share, max(height - 0.5, 1), fill=PALETTE[s % len(PALETTE)], class_="share", data_source=s)
                x += share
    y += strips * height + 8
    for note in notes:
        y += 18
        canvas.text(MARGIN, y, note, size=12, font_family=MONO, class_="note")
    return canvas.svg(mixture_title(epoch))


def mixture_html(epoch: Epoch, *, notes: Sequence[str] = ()) -> str:
    """The HTML page of the figure: a heading, the sources' legend, the SVG."""
    legend = [(colour, "solid", words) for colour, words in _legend(epoch)]
    return html_page(f"streambatch: {mixture_title(epoch)}", legend, mixture_svg(epoch, notes=notes, legend=False))


def write_mixture_figure(
    epoch: Epoch,
    *,
    svg: str | None = None,
    html_path: str | None = None,
    notes: Sequence[str] = (),
    stdout: IO[str] | None = None,
) -> list[str]:
    """Write the SVG and/or the HTML page atomically (``-``: *stdout*); returns the paths written."""
    pages: list[tuple[str | None, Any]] = [
        (svg, lambda: mixture_svg(epoch, notes=notes)),
        (html_path, lambda: mixture_html(epoch, notes=notes)),
    ]
    return write_texts(pages, stdout)
