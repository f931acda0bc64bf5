"""The mixture's order: exact weights and Tijdeman's chairman-assignment rule.

Weights are any positive finite real numbers.  Every float is an exact dyadic
rational, so `integer_weights` turns them into exact integers ``a`` with no
common factor (``w = a / sum(a)``), and every comparison of the rule is made in
integer arithmetic; nothing is ever rounded.

`tijdeman_order` runs the rule on one of two paths, the ``mix_order`` kernel's
switch (`streambatch._kernels`: ``backend("mix_order")``, ``use("mix_order", "python")``):

``"c"``
    The compiled extension ``streambatch._mix_order`` (built by ``pip install``
    where a C compiler is present): 128-bit state, exact products (256-bit ones
    once ``sum(a) >= 2**58``).  It takes weights with ``sum(a) < 2**116``
    (`KERNEL_LIMIT`), i.e. float weights whose ratio is below about ``2**60``;
    beyond that the order silently uses the Python loop (exact, slow).
``"python"``
    The fallback when the extension is missing: the same integer rule, one
    Python step per item (about a microsecond per item per source).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from math import gcd, lcm
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._checks import check_non_negative, is_integer, short_repr
from ..._kernels import extension, legacy_switch
from ...errors import ConfigError

legacy_switch(__name__, "BACKEND", "mix_order", "python")  # the old switch ("c" or "python"), for one release

MAX_SOURCES = 255
"""Most sources in one mixture: a source id is one uint8."""

KERNEL_LIMIT = 1 << 116
"""The C kernel takes integer weights whose sum is below this; larger sums run in Python."""

SourceArray = npt.NDArray[np.uint8]
CountArray = npt.NDArray[np.int64]


def check_weights(weights: Any) -> tuple[tuple[int, int], ...]:
    """Each weight as an exact ``(numerator, denominator)``, or `ConfigError` naming the first bad one.

    >>> check_weights([0.5, 3, 0.25])
    ((1, 2), (3, 1), (1, 4))
    >>> check_weights([0.6, float("nan")])
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: weights[1]=nan must be a positive finite number; ...
    """
    if isinstance(weights, (str, bytes, numbers.Number)) or not isinstance(weights, Iterable):
        raise ConfigError(
            f"weights={short_repr(weights)} must be a sequence of 1 to {MAX_SOURCES} positive numbers; "
            "pass one weight per source, e.g. [0.6, 0.3, 0.1]"
        )
    values = list(weights)
    if not 1 <= len(values) <= MAX_SOURCES:
        raise ConfigError(
            f"weights has {len(values)} entries; a mixture takes 1 to {MAX_SOURCES} sources (a source id is one byte); "
            "pass one weight per source"
        )
    return tuple(_exact(value, f"weights[{index}]") for index, value in enumerate(values))


def _exact(value: Any, name: str) -> tuple[int, int]:
    """*value* as an exact ratio of ints if it is a positive finite real number, else `ConfigError`."""
    ratio: tuple[int, int] | None = None
    if not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Real):
        try:
            numerator, denominator = value.as_integer_ratio()  # type: ignore[attr-defined]
            ratio = (int(numerator), int(denominator))
        except (AttributeError, ValueError, OverflowError, TypeError):  # nan, inf, or no exact form
            ratio = None
    if ratio is None or ratio[0] <= 0 or ratio[1] <= 0:
        raise ConfigError(
            f"{name}={short_repr(value)} must be a positive finite number; "
            "pass each source's share as a positive int, float or Fraction (weights are normalised to sum 1)"
        )
    return ratio


def integer_weights(weights: Any) -> tuple[int, ...]:
    """Exact integers ``a`` without a common factor, with ``a / sum(a)`` the normalised *weights*.

    >>> integer_weights([6, 3, 1]), integer_weights([0.5, 0.25, 0.25])
    ((6, 3, 1), (2, 1, 1))

    Floats are taken at their exact binary value: 0.1 is slightly above 1/10.

    >>> integer_weights([0.6, 0.3, 0.1])
    (21617278211378380, 10808639105689190, 3602879701896397)
    """
    ratios = check_weights(weights)
    common = lcm(*(denominator for _, denominator in ratios))
    scaled = [numerator * (common // denominator) for numerator, denominator in ratios]
    factor = gcd(*scaled)
    return tuple(value // factor for value in scaled)


def block_for(sources: int) -> int:
    """Items between two checkpoint rows: a power of two >= 64 and >= 16 per source.

    A row is one int64 per source, so the table costs at most half a byte per item.

    >>> block_for(3), block_for(255)
    (64, 4096)
    """
    return max(64, 1 << (16 * sources - 1).bit_length())


def tijdeman_order(weights: Any, length: int, block: int | None = None) -> tuple[SourceArray, CountArray]:
    """Return ``(sources, checkpoints)``: Tijdeman's order of *length* items at *weights*.

    ``sources[i]`` is the source (uint8) of item ``i``; ``checkpoints[r, s]`` is how
    many of the first ``r * block`` items source ``s`` holds (``length // block + 1``
    rows; *block* defaults to `block_for`).  With ``k >= 2`` sources, normalised
    weights ``w`` and ``mu = 1 / (2k - 2)``: at step ``n`` (1-based), with counts
    ``c`` before the step, source ``s`` is eligible when ``c_s <= w_s n - mu``; the
    item goes to the eligible source with the smallest ``(c_s + 1 - mu) / w_s``,
    ties to the lowest index.  Every prefix then keeps ``|c_s - w_s n| <= 1 - mu``.

    >>> sources, checkpoints = tijdeman_order([0.6, 0.3, 0.1], 10, block=4)
    >>> sources.tolist(), checkpoints.tolist()
    ([0, 1, 0, 0, 1, 0, 2, 0, 1, 0], [[0, 0, 0], [3, 1, 0], [5, 2, 1]])
    """
    ints = integer_weights(weights)
    length = check_non_negative(length, "length", "the number of items of the mixture")
    block = block_for(len(ints)) if block is None else _check_block(block)
    sources = np.zeros(length, dtype=np.uint8)
    checkpoints = np.zeros((length // block + 1, len(ints)), dtype=np.int64)
    if len(ints) == 1:  # one source takes every item
        checkpoints[:, 0] = np.arange(checkpoints.shape[0], dtype=np.int64) * block
        return sources, checkpoints
    kernel = extension("mix_order")
    if kernel is not None and sum(ints) < KERNEL_LIMIT:
        kernel.tijdeman(sources, checkpoints, block, b"".join(value.to_bytes(16, "little") for value in ints))
    else:
        _python_order(ints, sources)
        _fill_checkpoints(sources, checkpoints, block)
    return sources, checkpoints


def _check_block(block: Any) -> int:
    if not is_integer(block) or int(block) < 1 or int(block) & (int(block) - 1):
        raise ConfigError(f"block={short_repr(block)} must be a positive power of two; pass None for the default")
    return int(block)


def _python_order(weights: tuple[int, ...], out: SourceArray) -> None:
    """The rule in Python ints, written into *out*: exact for any weights, one Python step per item."""
    k = len(weights)
    total = sum(weights)
    m = 2 * k - 2
    threshold = -(-total // m)  # eligible: m * d >= total  <=>  d >= ceil(total / m)
    scale = total * (m - 1)
    deficit = [0] * k  # d_s = a_s n - total c_s
    chosen = bytearray(out.size)
    for position in range(out.size):
        best = -1
        best_x = best_a = 0
        for s in range(k):
            d = deficit[s] = deficit[s] + weights[s]
            if d >= threshold:
                x = scale - m * d  # deadline - n = x / (m a_s): compare x_s / a_s
                if best < 0 or x * best_a < best_x * weights[s]:
                    best, best_x, best_a = s, x, weights[s]
        deficit[best] -= total
        chosen[position] = best
    out[:] = np.frombuffer(bytes(chosen), dtype=np.uint8)


def _fill_checkpoints(sources: SourceArray, checkpoints: CountArray, block: int) -> None:
    """``checkpoints[r, s]``: the count of *s* among ``sources[: r * block]``, one bincount per block."""
    k = checkpoints.shape[1]
    for row in range(1, checkpoints.shape[0]):
        counts = np.bincount(sources[(row - 1) * block : row * block], minlength=k)
        checkpoints[row] = checkpoints[row - 1] + counts
