"""A packed epoch drawn: rows of ``T`` positions, segments coloured by document, padding dashed (``trace --pack``).

Every batch of the epoch's order up to `MAX_ROWS` rows is drawn row by row to
scale: each segment a box as wide as its targets, filled with its document's
colour and labelled ``id@start+length`` where it fits; each row's padding a
dashed, unfilled box that counts in no denominator.  Each batch states its
shape and its denominator (real targets).  A larger epoch draws its first
`MAX_ROWS` rows and says how many follow.  Elements carry ``class`` and
``data-*`` attributes so tests can read the figure back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ...epoch import Epoch
from ...errors import ConfigError
from ...items.pack.rows import Rows
from ..inspect import format_count
from .page import html_page, write_texts
from .svg import MARGIN, MASKED_FILL, MONO, MUTED, PALETTE, Canvas

MAX_ROWS = 64
ROW_WIDTH = 720.0


def packed_title(epoch: Epoch) -> str:
    """``7 packed rows (shuffled) → 3 batches``."""
    how = "in row order" if epoch.seed is None else "shuffled"
    return f"{format_count(epoch.item_count)} packed rows ({how}) → {format_count(epoch.batch_count)} batches"


def _subtitle(epoch: Epoch) -> str:
    report = cast(Rows, epoch.items).report
    order = "row order" if epoch.seed is None else f"seed {epoch.seed}"
    return (
        f"T = {epoch.context_length} · B = {epoch.batch_size} · {order} · partition {epoch.partition.value} · "
        f"{format_count(report.targets)} targets, every one once · pad share {100 * report.pad_share:.2f} %"
    )


def _colour(document: int) -> str:
    return PALETTE[document % len(PALETTE)]


def _grey_masked(canvas: Canvas, batch: Any, r: int, column: int, n: int, x0: float, y: float, scale: float) -> None:
    """Grey the runs of a segment's targets (positions ``column .. column + n - 1`` of row *r*) the loss mask leaves
    out (inside a segment ``loss_mask`` is False only there; nothing for a store without a mask)."""
    trained = np.asarray(batch.loss_mask[r, column : column + n], dtype=np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[1], trained, [1]])))  # where a masked run starts or ends
    for lo, hi in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        canvas.open(class_="masked", data_column=column + lo, data_positions=hi - lo)
        canvas.title(f"masked: {hi - lo} targets the loss mask leaves out, in no denominator")
        canvas.rect(x0 + (column + lo) * scale, y, (hi - lo) * scale, 24, fill=MASKED_FILL, fill_opacity=0.85)
        canvas.close()


def _draw_row(canvas: Canvas, batch: Any, r: int, y: float, scale: float, T: int) -> None:
    pick = batch.segment_rows == r
    docs, starts, lengths = batch.document_indices[pick], batch.starts[pick], batch.segment_lengths[pick]
    ids = batch.document_ids
    names = [ids[i] for i in pick.nonzero()[0].tolist()]
    canvas.open(class_="row", data_row=r, data_number=int(batch.row_numbers[r]), data_segments=int(pick.sum()))
    canvas.text(MARGIN, y + 17, f"row {int(batch.row_numbers[r])}", size=11, fill=MUTED)
    x0, column = MARGIN + 70, 0
    for d, s, n, name in zip(docs.tolist(), starts.tolist(), lengths.tolist(), names, strict=True):
        x, w = x0 + column * scale, n * scale
        label = f"{name}@{s}+{n}"
        canvas.open(class_="segment", data_document=name, data_document_index=d, data_start=s, data_length=n, data_column=column)
        canvas.title(f"{label}: targets {s + 1}..{s + n} of {name}, positions {column}..{column + n - 1}")
        canvas.rect(x, y, w, 24, rx=3, fill=_colour(d), stroke="#ffffff", stroke_width=1)
        _grey_masked(canvas, batch, r, column, n, x0, y, scale)
        if 7.2 * len(label) + 8 <= w:
            canvas.text(x + 4, y + 16, label, size=11, fill="#ffffff", font_family=MONO)
        canvas.close()
        column += n
    if column < T:
        canvas.open(class_="pad", data_positions=T - column)
        canvas.title(f"padding: {T - column} positions, masked, in no denominator")
        canvas.rect(
            x0 + column * scale,
            y,
            (T - column) * scale,
            24,
            rx=3,
            fill="none",
            stroke=MUTED,
            stroke_width=1.5,
            stroke_dasharray="5 3",
        )
        canvas.close()
    canvas.close()


def packed_svg(epoch: Epoch, *, notes: Sequence[str] = (), max_rows: int = MAX_ROWS) -> str:
    """The packed epoch's figure as an SVG document (see the module docstring).

    >>> import streambatch as sb
    >>> docs = [sb.Document("a", "train", range(7)), sb.Document("b&c", "train", range(2))]
    >>> svg = packed_svg(sb.Epoch(docs, context_length=4, batch_size=2, seed=1, pack=True))
    >>> svg.count('class="row"'), svg.count('class="segment"'), svg.count('class="pad"'), 'data-document="b&amp;c"' in svg
    (2, 3, 1, True)
    """
    if not epoch.pack:
        raise ConfigError("packed_svg draws a packed epoch; pass Epoch(..., pack=True), or draw windows with epoch_svg")
    T = epoch.context_length
    canvas = Canvas()
    canvas.text(MARGIN, 34, packed_title(epoch), size=20, font_weight="bold")
    canvas.text(MARGIN, 56, _subtitle(epoch), size=13, fill=MUTED)
    y, drawn, scale = 88.0, 0, ROW_WIDTH / T
    for b, batch in enumerate(epoch):
        if drawn >= max_rows:
            break
        pad = int(batch.pad_count)
        canvas.open(class_="batch", data_index=b, data_width=batch.width, data_denominator=batch.target_count, data_pad=pad)
        canvas.text(
            MARGIN,
            y + 14,
            f"B{b}: shape [{batch.width}, {T}] · denominator {batch.target_count} real targets · {pad} padding positions",
            size=13,
            font_weight="bold",
        )
        y += 24
        for r in range(batch.width):
            if drawn >= max_rows:
                break
            _draw_row(canvas, batch, r, y, scale, T)
            y += 30
            drawn += 1
        canvas.close()
        y += 10
    if epoch.item_count > drawn:
        canvas.text(MARGIN, y + 10, f"… {format_count(epoch.item_count - drawn)} more rows not drawn", size=13, fill=MUTED)
        y += 20
    for note in notes:
        y += 20
        canvas.text(MARGIN, y, note, size=12, font_family=MONO, class_="note")
    return canvas.svg(packed_title(epoch))


LEGEND = (
    (PALETTE[0], "solid", "a segment: one piece of one document (colour by document), its targets only"),
    ("none", "dashed", "padding: masked, attends to no document, in no sum or denominator"),
)


def packed_html(epoch: Epoch, *, title: str | None = None, notes: Sequence[str] = ()) -> str:
    """An HTML page: *title*, a legend, and `packed_svg` inline."""
    heading = title or f"streambatch: {packed_title(epoch)}"
    return html_page(heading, LEGEND, packed_svg(epoch, notes=notes))


def write_packed_figure(
    epoch: Epoch, *, svg: str | None = None, html_path: str | None = None, notes: Sequence[str] = ()
) -> list[str]:
    """Write the SVG and/or the HTML page atomically; returns the paths written."""
    return write_texts([(svg, lambda: packed_svg(epoch, notes=notes)), (html_path, lambda: packed_html(epoch, notes=notes))])
