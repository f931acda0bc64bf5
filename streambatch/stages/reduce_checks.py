"""Stage 6, reduce: the checks of the values a token mean adds (losses, gradients), each an `AccumulationError`."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import short_repr
from ..errors import AccumulationError

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


def as_array(values: Any, name: str) -> npt.NDArray[Any]:
    """``np.asarray(values)``; ragged or unconvertible input is an `AccumulationError`, not numpy's ValueError."""
    try:
        return np.asarray(values)
    except (ValueError, TypeError, OverflowError) as err:
        raise AccumulationError(
            f"{name} cannot be read as a numeric array ({err}); pass a rectangular array of floats (every row the same width)"
        ) from None


def vector(values: Any, name: str) -> FloatArray:
    array = as_array(values, name)
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
