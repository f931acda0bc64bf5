"""A small SVG canvas (strings, every text XML-escaped; no plotting dependency) and the figure's fonts and colours."""

from __future__ import annotations

import html
import math
import re
from typing import Any

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
INPUT_FILL, TARGET_FILL, TAIL_FILL, INK, MUTED = "#dbe8f6", "#fde3cf", "#e7d9b0", "#222222", "#666666"
MASKED_FILL = "#d4d4d4"  # a target the loss mask leaves out (never counted)
MARGIN = 24
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(value: object) -> str:
    """Escape *value* for XML text and attributes; characters XML cannot hold become ``\\xNN``.

    >>> xml_text('a<b & "c"\\x01')
    'a&lt;b &amp; &quot;c&quot;\\\\x01'
    """
    text = _INVALID_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return html.escape(text, quote=True)


def text_width(value: object, size: float) -> float:
    """About how wide *value* is drawn at font *size* (0.62 em a character: wide enough for digits in DejaVu Sans)."""
    return 0.62 * size * len(str(value))


class Canvas:
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
        self.grow(x + text_width(value, size) * right, y + 4)

    def rect(self, x: float, y: float, w: float, h: float, **attrs: Any) -> None:
        self.parts.append(f"<rect x={_n(x)} y={_n(y)} width={_n(w)} height={_n(h)}{_attrs(attrs)}/>")
        self.grow(x + w, y + h)

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: Any) -> None:
        self.parts.append(f"<line x1={_n(x1)} y1={_n(y1)} x2={_n(x2)} y2={_n(y2)}{_attrs(attrs)}/>")
        self.grow(max(x1, x2), max(y1, y2))

    def title(self, value: object) -> None:
        """A ``<title>`` element: the tooltip of the group it opens."""
        self.parts.append(f"<title>{xml_text(value)}</title>")

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
