"""The one progress helper: a tqdm bar on stderr when tqdm is installed and progress is wanted, else a no-op.

`bar` returns either a ``tqdm`` instance or a `NoBar`; both have ``update``,
``set_postfix_str`` and ``close``, so callers never branch.  *progress* is
``True`` (draw whenever tqdm is installed), ``False`` (never) or ``None`` (only
when stderr is a terminal).  `FileProgress` is a bar over files with documents,
tokens and tokens/s as its postfix (prepare's bar).

>>> b = bar(3, desc="demo", unit="file", progress=False)
>>> b.update(1); b.set_postfix_str("x"); b.close()
>>> type(b).__name__
'NoBar'
"""

from __future__ import annotations

import sys
import time
from typing import Protocol


class Bar(Protocol):
    """What a progress bar offers: tqdm's ``update``, ``set_postfix_str`` and ``close``."""

    def update(self, n: int = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> object: ...

    def close(self) -> object: ...


class NoBar:
    """A bar that draws nothing: the stand-in when progress is not wanted or tqdm is not installed."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def wanted(progress: bool | None) -> bool:
    """Whether to draw: *progress* itself, or with None whether stderr is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def bar(total: int, *, desc: str, unit: str, progress: bool | None = None, unit_scale: bool = False) -> Bar:
    """A tqdm bar of *total* *unit*\\ s on stderr when `wanted` and tqdm is installed; a `NoBar` otherwise."""
    if not wanted(progress):
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:  # the progress extra is optional
        return NoBar()
    drawn: Bar = tqdm(total=total, unit=unit, unit_scale=unit_scale, desc=desc, file=sys.stderr)
    return drawn


class FileProgress:
    """A bar over *files* with documents, tokens and tokens/s as its postfix, refreshed at most twice a second."""

    def __init__(self, files: int, *, desc: str = "prepare", progress: bool | None = None) -> None:
        self.bar = bar(files, desc=desc, unit="file", progress=progress)
        self.start = self.shown = time.perf_counter()
        self.documents = self.tokens = 0

    def add(self, documents: int, tokens: int) -> None:
        """Count *documents* and *tokens* (negative to take back a skipped file's)."""
        self.documents += documents
        self.tokens += tokens
        now = time.perf_counter()
        if now - self.shown >= 0.5:
            self.shown = now
            self._postfix(refresh=True)

    def _postfix(self, refresh: bool) -> None:
        rate = self.tokens / max(self.seconds(), 1e-9)
        self.bar.set_postfix_str(f"{self.documents:,} docs, {self.tokens:,} tokens, {rate:,.0f} tokens/s", refresh=refresh)

    def file_done(self, done: bool) -> None:
        """One file finished (when *done*): the bar advances and shows the counts."""
        if done:
            self._postfix(refresh=False)
            self.bar.update(1)

    def seconds(self) -> float:
        """Seconds since the bar was made."""
        return time.perf_counter() - self.start

    def close(self) -> None:
        """Close the bar."""
        self.bar.close()
