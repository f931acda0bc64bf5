"""Loss masks: one bit per token of the flat token space; a set bit trains that token as a target.

A token is a target when it is predicted from the tokens before it, so a
document's position 0 is never one: its bit is always stored clear.  A store
without a mask trains every target.  Bits are packed little-endian
(``np.packbits(..., bitorder="little")``): token ``p`` is bit ``p & 7`` of byte
``p >> 3``.

>>> bits = pack_mask(np.array([0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=bool))
>>> bits.tolist(), target_mask(bits, np.array([0, 3]), 3).astype(int).tolist()
([118, 1], [[1, 1, 0], [1, 1, 1]])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from .._kernels import extension
from ..errors import DataError

BoolArray = npt.NDArray[np.bool_]
BitArray = npt.NDArray[np.uint8]
_BLOCK = 1 << 24  # bytes of packed bits unpacked per step: bounded temporaries


def check_loss_mask(mask: Any, length: int, where: str) -> BoolArray:
    """A document's loss mask as a fresh bool array of *length* with position 0 clear; errors name *where*.

    Bools and the integers 0 and 1 are accepted (``loss_mask``, ``assistant_masks``).

    >>> check_loss_mask([1, 1, 0, 1], 4, "doc 'a'").astype(int).tolist()
    [0, 1, 0, 1]
    >>> check_loss_mask([1, 2], 2, "doc 'a'")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: doc 'a': loss_mask[1]=2 is not 0/1 or a bool; a loss mask holds one bool per token
    """
    if isinstance(mask, (str, bytes, bytearray, Mapping, Set)):
        raise DataError(f"{where}: loss_mask={type(mask).__name__} is not a sequence; pass one bool per token")
    try:
        array = np.asarray(mask)
    except (TypeError, ValueError) as err:
        raise DataError(f"{where}: loss_mask is not a flat sequence of bools ({err}); pass one bool per token") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "biu"):
        raise DataError(f"{where}: loss_mask has dtype {array.dtype} and shape {array.shape}; pass one bool (or 0/1) per token")
    if array.size != length:
        raise DataError(f"{where}: loss_mask has {array.size} entries for {length} tokens; pass one bool per token")
    if array.dtype.kind != "b" and array.size:
        bad = (array != 0) & (array != 1)
        if bad.any():
            at = int(np.argmax(bad))
            raise DataError(
                f"{where}: loss_mask[{at}]={array[at].item()!r} is not 0/1 or a bool; a loss mask holds one bool per token"
            )
    out = np.array(array, dtype=np.bool_)
    if out.size:
        out[0] = False  # position 0 is never a target
    return out


def all_trained(length: int) -> BoolArray:
    """The mask of a document without one: every position but 0.

    >>> all_trained(3).tolist()
    [False, True, True]
    """
    mask = np.ones(length, dtype=np.bool_)
    mask[:1] = False
    return mask


def labels_mask(labels: Any, length: int, where: str) -> BoolArray:
    """The loss mask of Hugging Face ``labels`` (aligned with ``input_ids``; -100 = not trained).

    >>> labels_mask([-100, -100, 7, 8], 4, "row 0").astype(int).tolist()
    [0, 0, 1, 1]
    """
    try:
        array = np.asarray(labels)
    except (TypeError, ValueError) as err:
        raise DataError(f"{where}: labels is not a flat sequence of ints ({err}); pass one label per input id") from None
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise DataError(f"{where}: labels has dtype {array.dtype} and shape {array.shape}; pass one int per input id")
    if array.size != length:
        raise DataError(
            f"{where}: labels has {array.size} entries for {length} input_ids; labels must be aligned with input_ids "
            "(the Hugging Face convention, -100 = not trained)"
        )
    return check_loss_mask(array != -100, length, where)


def untrained_reason(mask: BoolArray, where: str) -> str:
    """The message refusing a document whose mask trains no target, with the likely cause."""
    if mask.size < 2:
        cause = f"it has {mask.size} token(s), so no target at all"
    elif not mask.any():
        cause = "every target is masked out: an empty completion or assistant turn, or a chat template that masks everything"
    else:
        cause = "only position 0 is set, which is never a target"
    return (
        f"{where}: the loss mask trains no target ({cause}); fix the data, or skip such documents "
        "(skip_untrained_documents=True, --skip-untrained-documents)"
    )


def pack_mask(mask: BoolArray) -> BitArray:
    """Pack a flat bool mask into bits (little-endian within each byte)."""
    return np.packbits(np.asarray(mask, dtype=np.bool_), bitorder="little")


def unpack_range(bits: BitArray | None, start: int, length: int) -> BoolArray:
    """The mask of flat tokens ``[start, start + length)`` (all True without *bits*).

    >>> unpack_range(pack_mask(np.array([1, 0, 1, 1], dtype=bool)), 1, 3).astype(int).tolist()
    [0, 1, 1]
    """
    if bits is None:
        return np.ones(length, dtype=np.bool_)
    lo, hi = start >> 3, (start + length + 7) >> 3
    chunk = np.unpackbits(np.asarray(bits[lo:hi]), bitorder="little")
    skip = start - (lo << 3)
    return chunk[skip : skip + length].view(np.bool_)


def target_mask(bits: BitArray, positions: npt.NDArray[Any], length: int) -> BoolArray:
    """``(n, length)`` mask bits of the targets of rows starting at flat *positions* (tokens ``p + 1 .. p + length``).

    The C kernel (``streambatch._row_gather.window_mask``, the ``mask_bits`` kernel) unpacks each row's
    bits straight into the row; `target_mask_numpy` makes the same array.
    """
    rows = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    kernel = extension("mask_bits")
    if kernel is None or not isinstance(bits, np.ndarray) or bits.dtype != np.uint8:
        return target_mask_numpy(bits, rows, length)
    found: BoolArray = kernel.window_mask(bits, length, rows)
    return found


def target_reader(bits: BitArray, length: int) -> Callable[[npt.NDArray[np.intp]], BoolArray]:
    """`target_mask` of *bits* and *length* as one callable of int64 positions (the C kernel bound: no wrapper per
    batch, the emission's hot path).

    >>> target_reader(pack_mask(np.array([0, 1, 0, 1], dtype=bool)), 2)(np.array([1, 0])).astype(int).tolist()
    [[0, 1], [1, 0]]
    """
    kernel = extension("mask_bits")
    if kernel is not None and isinstance(bits, np.ndarray) and bits.dtype == np.uint8 and bits.flags.c_contiguous:
        return partial(kernel.window_mask, bits, length)
    return lambda positions: target_mask(bits, positions, length)


def count_reader(bits: BitArray, length: int) -> Callable[[npt.NDArray[np.intp]], int] | None:
    """The counted targets of window rows at int64 positions, ``target_mask(...).sum()`` counted in the bits (the C
    kernel bound), or None without the kernel (the mask is then made with the batch and counted).

    >>> count = count_reader(pack_mask(np.array([0, 1, 0, 1, 1], dtype=bool)), 2)
    >>> count is None or count(np.array([1, 0, 2])) == 4
    True
    """
    kernel = extension("mask_bits")
    if kernel is not None and isinstance(bits, np.ndarray) and bits.dtype == np.uint8 and bits.flags.c_contiguous:
        return partial(kernel.window_counts, bits, length)
    return None


def target_mask_numpy(bits: BitArray, positions: npt.NDArray[Any], length: int) -> BoolArray:
    """`target_mask` in numpy.

    One record gather of whole bytes per row, one unpack, one copy at each row's
    bit offset: no per-row Python and no index array of ``n * length``.
    """
    rows = np.asarray(positions, dtype=np.intp).reshape(-1)
    n = rows.size
    out = np.zeros((n, length), dtype=np.bool_)
    if not n or not length:
        return out
    first = rows + 1  # the first target's flat position
    span = (length + 7) // 8 + 1  # bytes holding any `length` consecutive bits
    size = int(bits.size)
    if size < span:  # a store of very few tokens: unpack it all
        flat = np.unpackbits(np.asarray(bits), bitorder="little").view(np.bool_)
        small: BoolArray = flat[first[:, None] + np.arange(length)]
        return small
    start = np.minimum(first >> 3, size - span)  # rows near the end read the last `span` bytes
    shift = first - (start << 3)
    record = np.dtype((np.void, span))
    records = np.ndarray(shape=(size - span + 1,), dtype=record, buffer=np.ascontiguousarray(bits), strides=(1,))
    gathered = np.ndarray((n, span), np.uint8, records[start])
    unpacked = np.unpackbits(gathered, axis=1, bitorder="little")  # (n, 8 * span)
    width = 8 * span
    offsets = width - length + 1
    shifted = np.lib.stride_tricks.as_strided(unpacked, shape=(n, offsets, length), strides=(width, 1, 1), writeable=False)
    found: BoolArray = shifted[np.arange(n), shift].view(np.bool_)
    return found


def prefix_counts(bits: BitArray, positions: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Set bits below each flat position (positions in ``[0, 8 * bits.size]``), in bounded blocks.

    >>> prefix_counts(pack_mask(np.array([1, 1, 0, 1], dtype=bool)), np.array([0, 2, 4])).tolist()
    [0, 2, 3]
    """
    where = np.asarray(positions, dtype=np.int64)
    out = np.zeros(where.shape, dtype=np.int64)
    order = np.argsort(where, kind="stable")
    sorted_at = where[order]
    total = 0
    counts = np.zeros(where.size, dtype=np.int64)
    block_bits = 8 * _BLOCK
    for lo in range(0, int(bits.size), _BLOCK):
        chunk = np.unpackbits(np.asarray(bits[lo : lo + _BLOCK]), bitorder="little")
        base = 8 * lo
        left, right = np.searchsorted(sorted_at, [base, base + block_bits], side="left")
        if right > left:
            cumulative = np.concatenate([[0], np.cumsum(chunk, dtype=np.int64)])
            counts[left:right] = total + cumulative[sorted_at[left:right] - base]
        total += int(np.count_nonzero(chunk))
    counts[sorted_at >= 8 * int(bits.size)] = total
    out[order] = counts
    return out


def document_targets(bits: BitArray | None, starts: npt.NDArray[Any], lengths: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Counted targets of each document (tokens ``start + 1 .. start + length - 1`` whose bit is set).

    >>> document_targets(pack_mask(np.array([0, 1, 0, 0, 1], dtype=bool)), np.array([0, 3]), np.array([3, 2])).tolist()
    [1, 1]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if bits is None:
        whole: npt.NDArray[np.int64] = np.maximum(lengths - 1, 0)
        return whole
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + lengths
    counts = prefix_counts(bits, np.concatenate([np.minimum(starts + 1, ends), ends]))
    half = starts.size
    targets: npt.NDArray[np.int64] = counts[half:] - counts[:half]
    return targets


def bits_at(bits: BitArray, positions: npt.NDArray[Any]) -> BoolArray:
    """The mask bit of each flat position (any shape).

    >>> bits_at(pack_mask(np.array([1, 0, 1], dtype=bool)), np.array([[2, 1]])).tolist()
    [[True, False]]
    """
    where = np.asarray(positions, dtype=np.intp)
    found: BoolArray = ((np.asarray(bits)[where >> 3] >> (where & 7).astype(np.uint8)) & 1).astype(np.bool_)
    return found
