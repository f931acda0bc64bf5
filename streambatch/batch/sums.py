"""The reducer's values: one token's `TokenContribution`, a piece's raw `TokenSums`, the final `TokenMean`.

Every reducer call takes raw sums in one order, ``(loss_sum, token_count,
gradient_sum)``: `TokenSums`, `TokenMeanAccumulator.add_sums`, ``merge`` and
``add``.  The checks here raise `AccumulationError` naming the bad value.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import is_integer, short_repr
from ..errors import AccumulationError

__all__ = [
    "FloatArray",
    "TokenContribution",
    "TokenMean",
    "TokenSums",
    "check_finite",
    "float_vector",
    "merge_sources",
    "real",
    "to_array",
]

FloatArray = npt.NDArray[np.float64]


def real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AccumulationError(f"{name}={short_repr(value)} is not a real number; pass a finite float")
    try:
        result = float(value)
    except OverflowError:  # e.g. an int of hundreds of digits
        raise AccumulationError(
            f"{name}={short_repr(value)} is too large for a float; a token's loss must be a finite float"
        ) from None
    if not math.isfinite(result):
        raise AccumulationError(f"{name}={result!r} is not finite; a token's loss must be a finite float")
    return result


def to_array(values: Any, name: str) -> npt.NDArray[Any]:
    """``np.asarray(values)``; ragged or unconvertible input is an `AccumulationError`, not numpy's ValueError."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError) as err:
        raise AccumulationError(
            f"{name} cannot be read as a numeric array ({err}); pass a rectangular array of floats (every row the same width)"
        ) from None


def float_vector(values: Any, name: str) -> FloatArray:
    array = to_array(values, name)
    if array.dtype.kind not in "fiu" or array.ndim != 1:
        raise AccumulationError(f"{name} has dtype {array.dtype} and shape {array.shape}; pass a 1-D sequence of floats")
    result = np.array(array, dtype=np.float64)
    check_finite(result, name)
    return result


def check_finite(values: FloatArray, name: str, what: str = "every gradient coordinate") -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), values.shape))
        where = at[0] if len(at) == 1 else at
        value = float(values[at])
        raise AccumulationError(f"{name}[{where}]={value!r} is not finite; {what} must be finite")


@dataclass(frozen=True, eq=False)
class TokenContribution:
    """One target token's finite loss and non-empty finite gradient.

    >>> TokenContribution(0.125, [0.25, 1.875]).gradient.tolist()
    [0.25, 1.875]
    """

    loss: float
    gradient: FloatArray

    def __init__(self, loss: Any, gradient: Any) -> None:
        object.__setattr__(self, "loss", real(loss, "loss"))
        vector = float_vector(gradient, "gradient")
        if vector.size == 0:
            raise AccumulationError("gradient=[] is empty; a contribution needs at least one coordinate")
        vector.flags.writeable = False
        object.__setattr__(self, "gradient", vector)

    @property
    def gradient_width(self) -> int:
        """Number of gradient coordinates."""
        return int(self.gradient.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenContribution):
            return NotImplemented
        return self.loss == other.loss and np.array_equal(self.gradient, other.gradient)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class TokenMean:
    """The token-mean loss and gradient: raw sums divided once by ``token_count``."""

    token_count: int
    mean_loss: float
    mean_gradient: FloatArray
    sources: Mapping[int, TokenMean] | None = None  # each source's mean, when the pieces carried per-source sums

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenMean):
            return NotImplemented
        return (
            self.token_count == other.token_count
            and self.mean_loss == other.mean_loss
            and np.array_equal(self.mean_gradient, other.mean_gradient)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class TokenSums:
    """One piece's raw sums: loss sum, target-token count, gradient sums (never a mean).

    ``gradient_sum`` is any array supporting ``+`` and ``/`` (numpy, or a torch
    tensor in `streambatch.torch`).  Pieces add as raw sums; `mean` divides once.
    ``sources`` (a mixture's batches: `streambatch.items.mix.gather.source_sums`)
    holds the same raw sums per source id; they add per source, never as means.

    >>> a = TokenSums(1.5, 2, np.array([1.0, 4.0]))
    >>> b = TokenSums(0.25, 1, np.array([0.5, 2.0]))
    >>> (a + b).mean().mean_loss
    0.5833333333333334
    """

    loss_sum: float
    token_count: int
    gradient_sum: Any
    sources: Mapping[int, TokenSums] | None = None

    def __post_init__(self) -> None:
        count = self.token_count
        try:  # an int, a numpy int, or a one-element integer tensor: kept as a plain int
            number = -1 if isinstance(count, bool) else operator.index(count)
        except TypeError:
            number = -1
        if number < 0:
            swapped = " (arguments in the order loss_sum, gradient_sum, token_count?)" if is_integer(self.gradient_sum) else ""
            raise AccumulationError(
                f"token_count={short_repr(count)} must be a non-negative int{swapped}; "
                "TokenSums takes (loss_sum, token_count, gradient_sum), the order of every reducer call"
            )
        object.__setattr__(self, "token_count", number)

    def __add__(self, other: TokenSums) -> TokenSums:
        if not isinstance(other, TokenSums):
            return NotImplemented
        total = (self.loss_sum + other.loss_sum, self.token_count + other.token_count, self.gradient_sum + other.gradient_sum)
        return TokenSums(*total, merge_sources(self.sources, other.sources))

    def mean(self) -> TokenMean:
        """Divide the raw sums once by the token count (an error when there are no tokens)."""
        if self.token_count == 0:
            raise AccumulationError("cannot take the mean of token_count=0; add at least one token first")
        means = None if self.sources is None else {s: p.mean() for s, p in self.sources.items() if p.token_count}
        return TokenMean(self.token_count, self.loss_sum / self.token_count, self.gradient_sum / self.token_count, means)


def merge_sources(a: Mapping[int, TokenSums] | None, b: Mapping[int, TokenSums] | None) -> dict[int, TokenSums] | None:
    """Per-source raw sums of two pieces added source by source (None when neither has any)."""
    if a is None or b is None:
        return None if a is None and b is None else dict(a or b or {})
    return {s: a[s] + b[s] if s in a and s in b else a.get(s) or b[s] for s in sorted({*a, *b})}
