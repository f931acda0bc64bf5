"""A store's loss mask on disk: ``loss_mask.bin``, one bit per token, and its staging while a `StoreWriter` writes.

The file holds ``ceil(token_count / 8)`` bytes: token ``p`` of ``tokens.bin`` is
bit ``p & 7`` of byte ``p >> 3`` (`streambatch.model.mask`), every document's
first bit clear.  The header names it (``"loss_mask": {"file": "loss_mask.bin",
"bits": "little", "targets": N}``, N the counted targets); a store without a mask
has no such entry and no such file, byte for byte what it always was.

While writing, the mask is staged one byte per token (so a rollback is a
truncate) and packed once at commit; the staging file exists only once a
document with a mask arrives (earlier documents are staged as all-trained).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import StoreError
from .files import short_path

LOSS_MASK = "loss_mask.bin"
_STAGING = "loss_mask.staging"
_READ = 1 << 24  # staged bytes packed per step (a multiple of 8)


def mask_entry(header: dict[str, Any], header_path: Path, token_count: int) -> str | None:
    """The mask file the header names (None: no mask), after checking the entry."""
    entry = header.get("loss_mask")
    if entry is None:
        return None
    if (
        not isinstance(entry, dict)
        or entry.get("file") != LOSS_MASK
        or entry.get("bits") != "little"
        or type(entry.get("targets")) is not int
        or not 0 <= entry["targets"] <= token_count
    ):
        raise StoreError(
            f"{short_path(header_path)}: loss_mask={short_repr(entry)} must be "
            f'{{"file": {LOSS_MASK!r}, "bits": "little", "targets": N}}; prepare the store again'
        )
    return LOSS_MASK


def mask_header(targets: int) -> dict[str, Any]:
    """The header entry of a mask file whose bits count *targets*."""
    return {"file": LOSS_MASK, "bits": "little", "targets": targets}


def mask_bytes(token_count: int) -> int:
    """Size of the mask file of *token_count* tokens."""
    return (token_count + 7) // 8


class MaskStage:
    """The loss mask of the documents written so far, one byte per token, in *folder* (created on the first mask)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._file: IO[bytes] | None = None

    @property
    def active(self) -> bool:
        """Whether any document so far came with a mask."""
        return self._file is not None

    def add(self, mask: npt.NDArray[np.bool_] | None, size: int, before: int) -> None:
        """Stage *size* tokens' mask (None: all trained) after *before* tokens already written."""
        if mask is None and self._file is None:
            return
        if self._file is None:
            self._file = open(self.folder / _STAGING, "w+b")  # noqa: SIM115 - closed in finish/close
            for lo in range(0, before, _READ):  # the unmasked documents so far: all trained
                self._file.write(np.ones(min(_READ, before - lo), dtype=np.uint8).data)
        data = np.ones(size, dtype=np.uint8) if mask is None else np.ascontiguousarray(mask, dtype=np.uint8)
        self._file.write(data.data)

    def mark(self) -> bool:
        """Whether a mask was staged at this point (what `rollback` needs besides the token count)."""
        return self.active

    def rollback(self, active: bool, tokens: int) -> None:
        """Back to *tokens* staged (a mark taken before any mask: no mask at all)."""
        if self._file is None:
            return
        if not active:
            self.close()
            (self.folder / _STAGING).unlink()
            return
        self._file.flush()
        self._file.truncate(tokens)
        self._file.seek(0, os.SEEK_END)

    def finish(self, offsets: npt.NDArray[np.int64]) -> int | None:
        """Pack the staged mask into ``loss_mask.bin`` with each document's first bit cleared; its counted targets.

        None when no document had a mask (then no file is written).
        """
        if self._file is None:
            return None
        self._file.flush()
        count = int(offsets[-1])
        starts = offsets[:-1][offsets[:-1] < offsets[1:]]
        targets = 0
        with open(self.folder / LOSS_MASK, "wb") as out:
            for lo in range(0, count, _READ):
                self._file.seek(lo)
                block = np.frombuffer(self._file.read(min(_READ, count - lo)), dtype=np.uint8).astype(np.bool_)
                left, right = np.searchsorted(starts, [lo, lo + block.size])
                first = starts[left:right] - lo
                block[first] = False
                targets += int(np.count_nonzero(block))
                out.write(np.packbits(block, bitorder="little").data)
        self.close()
        (self.folder / _STAGING).unlink()
        return targets

    def close(self) -> None:
        """Close the staging file (the writer removes its folder)."""
        if self._file is not None:
            self._file.close()
            self._file = None
