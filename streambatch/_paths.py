"""How a path appears in a message: `short_path`, the one helper every message that names a file or folder uses.

Relative to the working folder when inside it and shorter, and elided in the middle
when very long, so a refusal stays one readable line.  It sits at the bottom
layer so that the model, io, stages, façades, tools and CLI all share it.
"""

from __future__ import annotations

import os

LONG_PATH = 120  # characters: longer paths are elided in the middle in messages


def printable(path: str | os.PathLike[str] | bytes) -> str:
    """*path* as text, with a NUL byte shown as ``\\0``."""
    text = os.fsdecode(path) if isinstance(path, bytes) else os.fspath(path)
    return text.replace("\0", "\\0")


def short_path(path: str | os.PathLike[str]) -> str:
    """*path* as messages show it: relative to the working folder when inside it and shorter (a path outside it stays
    absolute, so a message does not depend on where the command ran from), elided in the middle when very long.

    >>> import os
    >>> short_path(os.path.join(os.getcwd(), "data", "a.jsonl")) == os.path.join("data", "a.jsonl")
    True
    >>> short_path("/x/" + "d" * 200 + "/tail.jsonl")
    '/x/dddddddddddddddddddddddddddddddddddddddddddddddddddddd...dddddddddddddddddddddddddddddddddddddddddddddd/tail.jsonl'
    """
    text = printable(path)
    if os.path.isabs(text):
        try:
            relative = os.path.relpath(text)
        except ValueError:
            relative = text
        if len(relative) < len(text) and relative != ".." and not relative.startswith(".." + os.sep):
            text = relative
    if len(text) <= LONG_PATH:
        return text
    keep = (LONG_PATH - 3) // 2
    return f"{text[:keep]}...{text[len(text) - (LONG_PATH - 3 - keep) :]}"
