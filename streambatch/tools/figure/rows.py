"""A small epoch drawn whole: window identities in order, every batch's rows, and the final batch's width."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...epoch import Epoch
from ...stages.chunk import fixed_batch_size
from .svg import INK, INPUT_FILL, MARGIN, MASKED_FILL, MONO, MUTED, PALETTE, TARGET_FILL, Canvas

MAX_IDS = 8  # ids drawn per input or target row; the rest are counted


@dataclass(frozen=True)
class _Row:
    origin: str
    inputs: list[int]
    targets: list[int]
    trained: list[bool] | None = None  # the row's loss mask (a masked store): False greys the target


def _batch_rows(epoch: Epoch) -> list[list[_Row]]:
    """Each batch's rows; a row of a masked store carries its loss mask."""
    return [
        [
            _Row(
                str(origin),
                batch.input_row(r).tolist(),
                batch.target_row(r).tolist(),
                None if batch.loss_mask is None else batch.loss_mask[r].tolist(),
            )
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


def draw_rows(canvas: Canvas, epoch: Epoch, y: float) -> float:
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
            canvas.title(f"#{slot} {row.origin} → batch {b}")
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
    T, B = epoch.context_length, fixed_batch_size(epoch.batch_size, "the figure")

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
        counted = _counted(batch, T)
        canvas.open(class_="batch", data_index=b, data_width=width, data_shape=f"[{width}, {T}]", data_denominator=counted)
        canvas.text(MARGIN, y + 14, f"B{b}", size=14, fill=color, font_weight="bold")
        words = (
            f"denominator {width} × {T} = {width * T} target tokens"
            if counted == width * T and all(row.trained is None for row in batch)
            else f"denominator {counted} counted targets (masked ones grey)"
        )
        canvas.text(MARGIN + 34, y + 14, f"shape [{width}, {T}] · {words}", size=13)
        y += 24
        for r, row in enumerate(batch):
            canvas.open(class_="row", data_row=r, data_origin=row.origin)
            canvas.rect(MARGIN, y, row_w, 28, rx=4, fill="#f7f7f7", stroke=color, stroke_width=1)
            canvas.text(MARGIN + 8, y + 18, f"row {r}", size=11, fill=MUTED)
            canvas.text(x_origin, y + 18, _clip(row.origin, int(origin_w / 7.8)), size=13, font_family=MONO)
            _cells(canvas, x_inputs, y + 4, cell, row.inputs, INPUT_FILL, "input")
            _cells(canvas, x_targets, y + 4, cell, row.targets, TARGET_FILL, "target", row.trained)
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


def _counted(batch: list[_Row], T: int) -> int:
    """Counted targets of a batch's rows: ``width * T`` without a mask."""
    return sum(T if row.trained is None else sum(row.trained) for row in batch)


def _cells(
    canvas: Canvas, x: float, y: float, cell: float, values: list[int], fill: str, kind: str, trained: list[bool] | None = None
) -> None:
    """One row of id cells; a target whose *trained* entry is False is grey (masked: never counted)."""
    for i, shown in enumerate(_ids_shown(values)):
        left = x + i * (cell + 3)
        masked = trained is not None and i < len(trained) and not trained[i] and not shown.startswith("+")
        canvas.rect(
            left, y, cell, 20, rx=3, fill=MASKED_FILL if masked else fill, stroke="#9a9a9a", stroke_width=0.5,
            class_=f"{kind} masked" if masked else kind,
        )  # fmt: skip
        grey = {"fill": MUTED} if masked else {}
        canvas.text(left + cell / 2, y + 14, shown, size=12, font_family=MONO, text_anchor="middle", **grey)


def _draw_final(canvas: Canvas, epoch: Epoch, y: float) -> float:
    T, B = epoch.context_length, fixed_batch_size(epoch.batch_size, "the figure")
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
