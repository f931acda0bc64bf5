"""A picture of an epoch: the chapter's figure for any small epoch, a summary for a large one.

Pure-Python SVG (strings, every text XML-escaped; no plotting dependency).  A
small epoch shows its window identities in order, every batch's rows with
input and target ids, each batch's shape and token denominator, and the final
batch's actual width against the requested capacity, the unused capacity drawn
as a dashed slot that contributes nothing.  A large one shows document lengths
(the window/tail split) and the batch widths ``[B] * k + [r]``, never one shape
per row.  Elements carry ``class`` and ``data-*`` attributes so tests can read
the figure back.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..epoch import Epoch
from ..io.atomic import atomic_text
from ..stages.windows import window_tails
from .inspect import format_bytes, format_count, plan_bytes

MAX_WINDOWS = 64  # more than this draws the summary
MAX_IDS = 8  # ids drawn per input or target row; the rest are counted
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
INPUT_FILL, TARGET_FILL, TAIL_FILL, INK, MUTED = "#dbe8f6", "#fde3cf", "#e7d9b0", "#222222", "#666666"
MARGIN = 24
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(value: object) -> str:
    """Escape *value* for XML text and attributes; characters XML cannot hold become ``\\xNN``.

    >>> xml_text('a<b & "c"\\x01')
    'a&lt;b &amp; &quot;c&quot;\\\\x01'
    """
    text = _INVALID_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return html.escape(text, quote=True)


@dataclass(frozen=True)
class _Row:
    origin: str
    inputs: list[int]
    targets: list[int]


class _Canvas:
    """SVG elements appended in drawing order; the size grows to fit them."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.width = 0.0
        self.height = 0.0

    def grow(self, x: float, y: float) -> None:
        self.width, self.height = max(self.width, x), max(self.height, y)

    def text(self, x: float, y: float, value: object, *, size: int = 13, **attrs: Any) -> None:
        attrs.setdefault("font-size", size)
        self.parts.append(f"<text x={_n(x)} y={_n(y)}{_attrs(attrs)}>{xml_text(value)}</text>")
        right = {"middle": 0.5, "end": 0.0}.get(str(attrs.get("text_anchor")), 1.0)  # share of the text right of x
        self.grow(x + 0.62 * size * len(str(value)) * right, y + 4)

    def rect(self, x: float, y: float, w: float, h: float, **attrs: Any) -> None:
        self.parts.append(f"<rect x={_n(x)} y={_n(y)} width={_n(w)} height={_n(h)}{_attrs(attrs)}/>")
        self.grow(x + w, y + h)

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: Any) -> None:
        self.parts.append(f"<line x1={_n(x1)} y1={_n(y1)} x2={_n(x2)} y2={_n(y2)}{_attrs(attrs)}/>")
        self.grow(max(x1, x2), max(y1, y2))

    def open(self, **attrs: Any) -> None:
        self.parts.append(f"<g{_attrs(attrs)}>")

    def close(self) -> None:
        self.parts.append("</g>")

    def svg(self, title: str) -> str:
        width, height = math.ceil(self.width + MARGIN), math.ceil(self.height + MARGIN)
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'font-family="{FONT}" fill="{INK}">\n<title>{xml_text(title)}</title>\n'
            f'<rect class="background" x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def _n(value: float) -> str:
    return f'"{round(value, 1):g}"'


def _attrs(attrs: dict[str, Any]) -> str:
    return "".join(f' {k.rstrip("_").replace("_", "-")}="{xml_text(v)}"' for k, v in attrs.items() if v is not None)


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
    return f"{format_count(epoch.window_count)} {how} → {format_count(epoch.batch_count)} batches"


def epoch_svg(epoch: Epoch, *, notes: Sequence[str] = (), max_windows: int = MAX_WINDOWS) -> str:
    """The epoch's figure as an SVG document: every row up to *max_windows* windows, else the summary.

    *notes* are printed under the figure (e.g. the PROOF line).

    >>> import streambatch as sb
    >>> docs = [sb.Document("train-a", "train", [0, 10, 11, 12, 1]), sb.Document("train-b", "train", [0, 20, 21, 1])]
    >>> svg = epoch_svg(sb.Epoch(docs, context_length=2, batch_size=3, seed=7))
    >>> svg.count('class="row"'), svg.count('class="unused"'), 'data-origin="train-b@1"' in svg
    (5, 2, True)
    """
    canvas = _Canvas()
    canvas.text(MARGIN, 34, figure_title(epoch), size=20, font_weight="bold")
    canvas.text(MARGIN, 56, _subtitle(epoch), size=13, fill=MUTED)
    y = _draw_rows(canvas, epoch, 88) if epoch.window_count <= max_windows else _draw_summary(canvas, epoch, 88)
    for note in notes:
        y += 20
        canvas.text(MARGIN, y, note, size=12, font_family=MONO, class_="note")
    return canvas.svg(figure_title(epoch))


# -- a small epoch: every row ---------------------------------------------------------------


def _batch_rows(epoch: Epoch) -> list[list[_Row]]:
    return [
        [
            _Row(str(origin), batch.input_row(r).tolist(), batch.target_row(r).tolist())
            for r, origin in enumerate(batch.provenance)
        ]
        for batch in epoch
    ]


def _ids_shown(values: list[int]) -> list[str]:
    if len(values) <= MAX_IDS:
        return [str(v) for v in values]
    return [str(v) for v in values[: MAX_IDS - 1]] + [f"+{len(values) - MAX_IDS + 1}"]


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _draw_rows(canvas: _Canvas, epoch: Epoch, y: float) -> float:
    batches = _batch_rows(epoch)
    rows = [row for batch in batches for row in batch]
    longest = max([len(r.origin) for r in rows] + [8])
    box = min(220.0, max(104.0, 7.8 * longest + 20))
    chars = int((box - 20) / 7.8)
    per_line = max(1, min(8, len(rows)))

    canvas.text(MARGIN, y, "1. Window identities in epoch order (document@start)", size=15, font_weight="bold")
    y += 14
    slot = 0
    for b, batch in enumerate(batches):
        color = PALETTE[b % len(PALETTE)]
        for row in batch:
            x = MARGIN + (slot % per_line) * (box + 8)
            top = y + (slot // per_line) * 54
            canvas.open(class_="slot", data_slot=slot, data_batch=b, data_origin=row.origin)
            canvas.parts.append(f"<title>{xml_text(f'#{slot} {row.origin} → batch {b}')}</title>")
            canvas.rect(x, top, box, 44, rx=6, fill="#ffffff", stroke=color, stroke_width=2)
            canvas.text(x + 8, top + 14, f"#{slot}", size=11, fill=MUTED)
            canvas.text(x + box - 8, top + 14, f"B{b}", size=11, fill=color, font_weight="bold", text_anchor="end")
            canvas.text(x + 8, top + 34, _clip(row.origin, chars), size=13, font_family=MONO, font_weight="bold")
            canvas.close()
            slot += 1
    y += math.ceil(len(rows) / per_line) * 54 + 24

    values = [v for r in rows for v in (*r.inputs, *r.targets)]
    cell = 8.0 * max([len(s) for s in _ids_shown(values)] + [1]) + 14
    cells = min(epoch.context_length, MAX_IDS)
    origin_w = min(box, 7.8 * longest + 16)
    x_origin, x_inputs = MARGIN + 44, MARGIN + 44 + origin_w + 12
    x_targets = x_inputs + cells * (cell + 3) + 20
    row_w = x_targets + cells * (cell + 3) - MARGIN
    T, B = epoch.context_length, epoch.batch_size

    canvas.text(
        MARGIN, y, "2. Batches: each row's input ids and target ids (the inputs shifted by one)", size=15, font_weight="bold"
    )
    y += 26
    canvas.text(x_inputs, y, "input ids", size=11, fill=MUTED)
    canvas.text(x_targets, y, "target ids", size=11, fill=MUTED)
    y += 10
    for b, batch in enumerate(batches):
        color = PALETTE[b % len(PALETTE)]
        width = len(batch)
        canvas.open(class_="batch", data_index=b, data_width=width, data_shape=f"[{width}, {T}]", data_denominator=width * T)
        canvas.text(MARGIN, y + 14, f"B{b}", size=14, fill=color, font_weight="bold")
        canvas.text(MARGIN + 34, y + 14, f"shape [{width}, {T}] · denominator {width} × {T} = {width * T} target tokens", size=13)
        y += 24
        for r, row in enumerate(batch):
            canvas.open(class_="row", data_row=r, data_origin=row.origin)
            canvas.rect(MARGIN, y, row_w, 28, rx=4, fill="#f7f7f7", stroke=color, stroke_width=1)
            canvas.text(MARGIN + 8, y + 18, f"row {r}", size=11, fill=MUTED)
            canvas.text(x_origin, y + 18, _clip(row.origin, int(origin_w / 7.8)), size=13, font_family=MONO)
            _cells(canvas, x_inputs, y + 4, cell, row.inputs, INPUT_FILL, "input")
            _cells(canvas, x_targets, y + 4, cell, row.targets, TARGET_FILL, "target")
            canvas.close()
            y += 32
        if width < B:
            missing = B - width
            rows_words = f"row {width}" if missing == 1 else f"rows {width}–{B - 1}"
            verb = "contributes" if missing == 1 else "contribute"
            canvas.open(class_="unused", data_rows=missing)
            canvas.rect(MARGIN, y, row_w, 28, rx=4, fill="none", stroke=MUTED, stroke_width=1.5, stroke_dasharray="6 4")
            canvas.text(
                MARGIN + 8, y + 18, f"{rows_words}: not created — {verb} nothing", size=12, fill=MUTED, font_style="italic"
            )
            canvas.close()
            y += 32
        canvas.close()
        y += 10

    return _draw_final(canvas, epoch, y + 12)


def _cells(canvas: _Canvas, x: float, y: float, cell: float, values: list[int], fill: str, kind: str) -> None:
    for i, shown in enumerate(_ids_shown(values)):
        left = x + i * (cell + 3)
        canvas.rect(left, y, cell, 20, rx=3, fill=fill, stroke="#9a9a9a", stroke_width=0.5, class_=kind)
        canvas.text(left + cell / 2, y + 14, shown, size=12, font_family=MONO, text_anchor="middle")


def _draw_final(canvas: _Canvas, epoch: Epoch, y: float) -> float:
    T, B = epoch.context_length, epoch.batch_size
    widths = epoch.batch_widths
    if not widths:
        canvas.text(MARGIN, y, "no complete window: the epoch has no batch", size=13, fill=MUTED)
        return y + 8
    final = widths[-1]
    canvas.text(MARGIN, y, "3. The final batch: actual width against the requested capacity", size=15, font_weight="bold")
    y += 18
    full = 480.0
    actual = full * final / B
    canvas.open(class_="capacity", data_tokens=B * T)
    canvas.text(MARGIN, y + 12, f"requested capacity: {B} × {T} = {B * T} token slots", size=13)
    canvas.rect(MARGIN, y + 20, full, 26, rx=4, fill="none", stroke=INK, stroke_width=1.5, stroke_dasharray="6 4")
    canvas.close()
    y += 58
    canvas.open(class_="final", data_width=final, data_denominator=final * T)
    canvas.text(
        MARGIN,
        y + 12,
        f"actual final width: {final} × {T} = {final * T} target tokens, the denominator",
        size=13,
        font_weight="bold",
    )
    canvas.rect(MARGIN, y + 20, actual, 26, rx=4, fill=PALETTE[(len(widths) - 1) % len(PALETTE)], stroke=INK, stroke_width=1)
    canvas.text(MARGIN + 8, y + 38, f"{final} × {T} = {final * T}", size=13, fill="#ffffff", font_weight="bold")
    if final < B:
        canvas.open(class_="unused", data_rows=B - final)
        canvas.rect(
            MARGIN + actual, y + 20, full - actual, 26, rx=4, fill="none", stroke=MUTED, stroke_width=1.5, stroke_dasharray="6 4"
        )
        canvas.text(
            MARGIN + full + 12,
            y + 38,
            f"{B - final} × {T} = {(B - final) * T} slots not created: contribute nothing",
            size=12,
            fill=MUTED,
            font_style="italic",
        )
        canvas.close()
    canvas.close()
    return y + 54


# -- a large epoch: the summary ----------------------------------------------------------------


def _draw_summary(canvas: _Canvas, epoch: Epoch, y: float) -> float:
    store = epoch.store
    mask = store.partition_codes == epoch.partition.code
    lengths = store.lengths[mask]
    T, stride = epoch.context_length, epoch.stride
    tails = window_tails(lengths, T, stride)[1]
    tokens = int(lengths.sum())
    tail_total = int(tails.sum())
    canvas.text(
        MARGIN,
        y,
        f"1. Document lengths: {format_count(lengths.size)} documents, {format_count(tokens)} tokens (log2 bins)",
        size=15,
        font_weight="bold",
    )
    y += 14
    bins = np.where(lengths > 0, np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64) + 1, 0)  # 0: empty documents
    top = int(bins.max()) if bins.size else 0
    docs = np.bincount(bins, minlength=top + 1)
    windowed = np.bincount(bins, weights=lengths - tails, minlength=top + 1)
    tail = np.bincount(bins, weights=tails, minlength=top + 1)
    used = np.flatnonzero(docs)
    first, last = (int(used[0]), int(used[-1])) if used.size else (0, 0)
    pitch, chart_h = 44.0, 180.0
    peak = float(max((windowed + tail).max(), 1)) if docs.size else 1.0
    base = y + 18 + chart_h
    canvas.line(MARGIN, base, MARGIN + (last - first + 1) * pitch, base, stroke=INK, stroke_width=1)
    for k in range(first, last + 1):
        x = MARGIN + (k - first) * pitch + 4
        low = 0 if k == 0 else 1 << (k - 1)
        h_win = chart_h * float(windowed[k]) / peak
        h_tail = chart_h * float(tail[k]) / peak
        canvas.open(class_="bin", data_from=low, data_to=0 if k == 0 else (1 << k) - 1, data_documents=int(docs[k]))
        canvas.rect(x, base - h_win, pitch - 8, h_win, fill=PALETTE[0], class_="windowed")
        canvas.rect(
            x, base - h_win - h_tail, pitch - 8, h_tail, fill=TAIL_FILL, stroke="#b59a4a", stroke_width=0.5, class_="tail"
        )
        canvas.text(x + (pitch - 8) / 2, base - h_win - h_tail - 4, format_count(int(docs[k])), size=10, text_anchor="middle")
        canvas.text(x + (pitch - 8) / 2, base + 14, format_count(low), size=10, fill=MUTED, text_anchor="middle")
        canvas.close()
    if first <= math.log2(T + 1) + 1 <= last + 1:  # where documents become long enough for one window
        mark = MARGIN + (math.log2(T + 1) + 1 - first) * pitch
        canvas.line(mark, base - chart_h - 6, mark, base + 4, stroke=PALETTE[3], stroke_width=1.5, stroke_dasharray="4 3")
        canvas.text(mark + 4, base - chart_h + 4, f"T + 1 = {T + 1}", size=11, fill=PALETTE[3])
    y = base + 34
    canvas.text(
        MARGIN,
        y,
        f"bars: tokens per length bin (label: documents; axis: shortest length in the bin) · "
        f"blue: window span · sand: tail {format_count(tail_total)} tokens ({100 * tail_total / max(tokens, 1):.1f} %)",
        size=12,
        fill=MUTED,
    )
    y += 36
    return _draw_batch_widths(canvas, epoch, y)


def _draw_batch_widths(canvas: _Canvas, epoch: Epoch, y: float) -> float:
    T, B = epoch.context_length, epoch.batch_size
    count = epoch.batch_count
    canvas.text(MARGIN, y, "2. Batches: [B] × k + the smaller final batch", size=15, font_weight="bold")
    y += 16
    if not count:
        canvas.text(MARGIN, y + 14, "no complete window: the epoch has no batch", size=13, fill=MUTED)
        return y + 22
    full_count = epoch.window_count // B
    final = epoch.window_count - full_count * B
    unit = 300.0
    if full_count:
        canvas.open(class_="full-batches", data_count=full_count, data_width=B, data_denominator=B * T)
        canvas.rect(MARGIN, y, unit, 26, rx=4, fill=PALETTE[0], stroke=INK, stroke_width=1)
        canvas.text(MARGIN + 8, y + 18, f"{format_count(full_count)} × [{B}, {T}]", size=13, fill="#ffffff", font_weight="bold")
        canvas.text(MARGIN + unit + 16, y + 18, f"denominator {B} × {T} = {format_count(B * T)} tokens each", size=13)
        canvas.close()
        y += 36
    if final:
        actual = max(2.0, unit * final / B)
        canvas.open(class_="final", data_width=final, data_denominator=final * T)
        canvas.rect(MARGIN, y, actual, 26, rx=4, fill=PALETTE[1], stroke=INK, stroke_width=1)
        canvas.open(class_="unused", data_rows=B - final)
        canvas.rect(
            MARGIN + actual, y, unit - actual, 26, rx=4, fill="none", stroke=MUTED, stroke_width=1.5, stroke_dasharray="6 4"
        )
        canvas.text(MARGIN + actual + 6, y + 18, "not created: contributes nothing", size=11, fill=MUTED, font_style="italic")
        canvas.close()
        canvas.text(
            MARGIN + unit + 16,
            y + 18,
            f"final [{final}, {T}]: denominator {final} × {T} = {format_count(final * T)}, not {format_count(B * T)}",
            size=13,
            font_weight="bold",
        )
        canvas.close()
        y += 36
    else:
        canvas.text(
            MARGIN, y + 14, f"{format_count(epoch.window_count)} windows fill every batch: no smaller final batch", size=13
        )
        y += 26
    shuffled = plan_bytes(epoch.window_count, epoch.store.flat_size)
    canvas.text(
        MARGIN, y + 8, f"plan: {format_bytes(shuffled)} shuffled (4 B per window), none in document order", size=12, fill=MUTED
    )
    return y + 16


# -- pages and files ----------------------------------------------------------------------------


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
    >>> page = epoch_html(sb.Epoch([sb.Document("a&b", "train", [1, 2, 3])], context_length=1, batch_size=2))
    >>> page.startswith("<!DOCTYPE html>"), "a&amp;b@0" in page
    (True, True)
    """
    heading = title or f"streambatch: {figure_title(epoch)}"
    dashes = {"dashed": ' stroke-dasharray="5 3"', "solid": ""}
    rows = LEGEND_ROWS if epoch.window_count <= max_windows else LEGEND_SUMMARY
    legend = "\n".join(
        f'<li><svg width="26" height="16"><rect x="1" y="1" width="24" height="14" rx="3" fill="{fill}" stroke="#666"'
        f"{dashes[style]}/></svg> {xml_text(words)}</li>"
        for fill, style, words in rows
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{xml_text(heading)}</title>\n"
        "<style>\n"
        f"body {{ font-family: {FONT}; color: {INK}; margin: 24px; background: #ffffff; }}\n"
        "h1 { font-size: 22px; margin: 0 0 10px; }\n"
        "ul.legend { list-style: none; padding: 0; margin: 0 0 4px; display: flex; flex-wrap: wrap; gap: 6px 22px; }\n"
        "ul.legend li { display: flex; align-items: center; gap: 6px; font-size: 13px; }\n"
        "</style>\n</head>\n<body>\n"
        f"<h1>{xml_text(heading)}</h1>\n"
        f'<ul class="legend">\n{legend}\n</ul>\n'
        f"{epoch_svg(epoch, notes=notes, max_windows=max_windows)}"
        "</body>\n</html>\n"
    )


def write_figure(
    epoch: Epoch,
    *,
    svg: str | None = None,
    html_path: str | None = None,
    notes: Sequence[str] = (),
    title: str | None = None,
) -> list[str]:
    """Write the SVG and/or the HTML page atomically; returns the paths written."""
    written = []
    if svg is not None:
        with atomic_text(svg) as handle:
            handle.write(epoch_svg(epoch, notes=notes))
        written.append(svg)
    if html_path is not None:
        with atomic_text(html_path) as handle:
            handle.write(epoch_html(epoch, title=title, notes=notes))
        written.append(html_path)
    return written
