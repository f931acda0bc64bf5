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

from .page import MAX_WINDOWS, epoch_html, epoch_svg, figure_title, write_figure
from .svg import xml_text

__all__ = ["MAX_WINDOWS", "epoch_html", "epoch_svg", "figure_title", "write_figure", "xml_text"]
