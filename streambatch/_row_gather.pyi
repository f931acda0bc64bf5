"""Type stub of the C extension built from ``_row_gather.c``, ``_gather_packed.c``, ``_gather_windows.c`` and
``_mask_bits.c``: the packed and window modes' one-pass gathers."""

from typing import Any

import numpy as np
import numpy.typing as npt
from _typeshed import ReadableBuffer

class Gatherer:
    """Read-only views of a source's tokens and a packing, made once per packing."""

    def __init__(
        self,
        tokens: ReadableBuffer,
        starts: ReadableBuffer,
        lengths: ReadableBuffer,
        full_docs: ReadableBuffer,
        full_ends: ReadableBuffer,
        offsets: ReadableBuffer,
        tails: ReadableBuffer,
        context_length: int,
        full_rows: int,
        pad_id: int,
        bits: ReadableBuffer | None = None,
        /,
    ) -> None: ...
    def gather(
        self,
        rows: ReadableBuffer,
        kinds: ReadableBuffer = ...,
        sources: tuple[Gatherer, ...] = ...,
        /,
    ) -> tuple[
        npt.NDArray[Any],
        npt.NDArray[Any],
        npt.NDArray[np.signedinteger[Any]],
        npt.NDArray[np.signedinteger[Any]],
        npt.NDArray[np.bool_],
        npt.NDArray[np.int32],
        npt.NDArray[np.int64],
        int,
        int,
    ]:
        """Every array of the batch of int64 *rows*, made here.

        Returns (inputs, targets, segment_ids, position_ids, loss_mask, cu_seqlens, provenance, target_count,
        max_seqlen): tokens in the source's dtype, ids int16 when ``T < 2**15`` else int32, provenance int64
        ``(4, segments)`` (row in the batch, document, start, targets).  A mixture passes *kinds* (uint8, one
        per row) and *sources* (Gatherers of one T, token size and pad id): row i is read by ``sources[kinds[i]]``.
        """

    def gather_tokens(
        self,
        rows: ReadableBuffer,
        kinds: ReadableBuffer = ...,
        sources: tuple[Gatherer, ...] = ...,
        /,
    ) -> tuple[Any, ...]:
        """`gather`'s tuple with None for segment_ids, position_ids and loss_mask (target_count still counts the
        masked targets, in the bits): the emission's pass."""
    def columns(
        self,
        rows: ReadableBuffer,
        kinds: ReadableBuffer = ...,
        sources: tuple[Gatherer, ...] = ...,
        /,
    ) -> tuple[Any, ...]:
        """`gather`'s tuple with None for inputs and targets: a batch's columns on demand (no token read)."""
    def row_counts(
        self,
        rows: ReadableBuffer,
        kinds: ReadableBuffer = ...,
        sources: tuple[Gatherer, ...] = ...,
        /,
    ) -> npt.NDArray[np.uint32]:
        """Each row's counted targets (its segments' set mask bits; every target without bits): no batch array made."""
    def use_row_counts(self, counts: ReadableBuffer | None, /) -> None:
        """Hold *counts* (uint32, `row_counts` of every row of the packing, in row order; None drops them):
        `gather_tokens` then sums its rows' entries, and its token pass reads no mask bit."""

def cpu_features() -> dict[str, bool]:
    """Each CPU feature the loops dispatch on (AVX2, AVX512F, AVX512BW, BMI2, POPCNT, FSRM): True where it is in use
    (the CPU has it and ``STREAMBATCH_DISABLE_CPU_FEATURES`` leaves it on, read at import)."""

def window_counts(bits: ReadableBuffer, context_length: int, positions: ReadableBuffer, /) -> int:
    """The set mask bits ``positions[i] + 1 .. positions[i] + T`` over every row (the window mask's sum)."""

def window_mask(bits: ReadableBuffer, context_length: int, positions: ReadableBuffer, /) -> npt.NDArray[np.bool_]:
    """``(n, T)`` bool: row i holds mask bits ``positions[i] + 1 .. positions[i] + T`` (the window's targets)."""

class WindowGatherer:
    """A read-only view of a store's tokens (uint16 or uint32) for one context length: the window mode's gather."""

    def __init__(self, tokens: ReadableBuffer, context_length: int, bits: ReadableBuffer | None = None, /) -> None: ...
    def gather_counted(self, rows: ReadableBuffer, /) -> tuple[npt.NDArray[Any], npt.NDArray[Any], int]:
        """`gather`'s arrays and the set *bits* of their targets (``rows[i] + 1 .. rows[i] + T``), counted in the copy."""
    def gather(self, rows: ReadableBuffer, /) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
        """``(inputs, targets)``: new C-contiguous ``(w, T)`` arrays of the windows starting at int64 *rows*.

        Row i holds ``tokens[p : p + T]`` and ``tokens[p + 1 : p + T + 1]``, ``p = rows[i]``; IndexError when a
        position lies outside ``[0, len(tokens) - T)`` (nothing is read), TypeError when *rows* are not int64.
        """
