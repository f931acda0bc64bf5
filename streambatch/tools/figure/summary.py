"""A large epoch drawn as a summary: document lengths (window span and tail) and the batch widths ``[B] * k + [r]``."""

from __future__ import annotations

import math

import numpy as np

from ...epoch import Epoch
from ...items.windows.window_index import window_tails
from ...stages.chunk import fixed_batch_size
from ..inspect import format_bytes, format_count, plan_bytes
from .svg import INK, MARGIN, MUTED, PALETTE, TAIL_FILL, Canvas, text_width

UNUSED_NOTE = "not created: contributes nothing"


def draw_summary(canvas: Canvas, epoch: Epoch, y: float) -> float:
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
        # the label goes under the axis labels, where no bar's count label can be (those sit on the bars)
        canvas.line(mark, base - chart_h - 6, mark, base + 20, stroke=PALETTE[3], stroke_width=1.5, stroke_dasharray="4 3")
        canvas.text(mark + 4, base + 29, f"T + 1 = {T + 1}", size=11, fill=PALETTE[3], class_="threshold")
    y = base + 50
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


def _draw_batch_widths(canvas: Canvas, epoch: Epoch, y: float) -> float:
    T, B = epoch.context_length, fixed_batch_size(epoch.batch_size, "the figure")
    count = epoch.batch_count
    canvas.text(MARGIN, y, "2. Batches: [B] × k + the smaller final batch", size=15, font_weight="bold")
    y += 16
    if not count:
        canvas.text(MARGIN, y + 14, "no complete window: the epoch has no batch", size=13, fill=MUTED)
        return y + 22
    full_count = epoch.item_count // B
    final = epoch.item_count - full_count * B
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
        inside = unit - actual - 12 >= text_width(UNUSED_NOTE, 11)  # else under the final batch's words
        at = (MARGIN + actual + 6, y + 18) if inside else (MARGIN + unit + 16, y + 36)
        canvas.text(*at, UNUSED_NOTE, size=11, fill=MUTED, font_style="italic")
        canvas.close()
        canvas.text(
            MARGIN + unit + 16,
            y + 18,
            f"final [{final}, {T}]: denominator {final} × {T} = {format_count(final * T)}, not {format_count(B * T)}",
            size=13,
            font_weight="bold",
        )
        canvas.close()
        y += 36 if inside else 52
    else:
        canvas.text(MARGIN, y + 14, f"{format_count(epoch.item_count)} windows fill every batch: no smaller final batch", size=13)
        y += 26
    shuffled = plan_bytes(epoch.item_count, epoch.store.flat_size)
    canvas.text(
        MARGIN, y + 8, f"plan: {format_bytes(shuffled)} shuffled (4 B per window), none in document order", size=12, fill=MUTED
    )
    return y + 16
