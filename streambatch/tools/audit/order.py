"""The order of a pass as a running hash of (batch index, document, start) per row."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._progress import Bar
from .expected import Expected, Rows, provenance


class OrderPass:
    """A running hash of (batch index, document, start) per row, and optionally the set of windows seen."""

    def __init__(self, expected: Expected, membership: bool) -> None:
        self.expected = expected
        self.digest = hashlib.blake2b(digest_size=16)
        self.rows = 0
        self.seen = np.zeros(expected.window_count, dtype=bool) if membership else None

    def add(self, index: int, documents: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], rows: Rows | None = None) -> None:
        self.digest.update(np.array([index, documents.size], dtype=np.int64).tobytes())
        self.digest.update(documents.tobytes())
        self.digest.update(starts.tobytes())
        self.rows += int(documents.size)
        if self.seen is not None:
            classified = rows or Rows(self.expected, documents, starts)
            self.seen[classified.numbers[classified.window]] = True

    def run(self, pieces: Iterable[Any], bar: Bar) -> OrderPass:
        for piece in pieces:
            index, documents, starts = provenance(piece)
            self.add(index, documents, starts)
            bar.update(documents.size)
        bar.close()
        return self
