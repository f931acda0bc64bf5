"""Argument checks shared by every stage: raise `ConfigError` at the call, never later."""

from __future__ import annotations

import numbers
from typing import Any

from .errors import ConfigError

U64 = 1 << 64


def is_integer(value: Any) -> bool:
    """True for Python and numpy integers; False for bool, float and everything else.

    >>> is_integer(3), is_integer(True), is_integer(3.0)
    (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


SIZE_LIMIT = 1 << 48
"""Exclusive bound on every size or count argument (context_length, stride, batch_size, counts, ...).

2**48 (about 2.8e14) is far above any real token or window count, and it leaves
15 bits of int64 headroom: a size plus another size, or times a factor below
2**15, still fits, so the numpy int64 arithmetic downstream (``T + 1``,
``index * batch_size``, ``sizes - (T + 1)``) cannot wrap or overflow.
"""


def _check_size(value: Any, name: str, what: str, low: int, rule: str) -> int:
    if not is_integer(value) or int(value) < low:
        raise ConfigError(f"{name}={short_repr(value)} must be {rule}; pass {what}")
    if int(value) >= SIZE_LIMIT:
        raise ConfigError(
            f"{name}={short_repr(value)} must be {rule} below 2**48 (larger sizes overflow int64 arithmetic); pass {what}"
        )
    return int(value)


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened past *limit* characters; safe for ints beyond the int-string limit.

    >>> short_repr(10**100)
    '1000000000000000000000000000000000000000...(101 characters)'
    >>> short_repr(10**5000)
    'an int of 16610 bits'
    """
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than sys.get_int_max_str_digits()
        return f"an int of {int(value).bit_length()} bits" if is_integer(value) else f"a {type(value).__name__}"
    return text if len(text) <= limit else f"{text[:40]}...({len(text)} characters)"


def check_positive(value: Any, name: str, what: str) -> int:
    """Return *value* as an int if it is an integer in [1, 2**48), else raise `ConfigError`.

    >>> check_positive(3, "batch_size", "the number of windows per batch")
    3
    >>> check_positive(2**64, "context_length", "the number of input tokens per window")
    Traceback (most recent call last):
    ...
    streambatch.errors.ConfigError: context_length=18446744073709551616 must be a positive int below 2**48 ...; pass ...
    """
    return _check_size(value, name, what, 1, "a positive int")


def check_non_negative(value: Any, name: str, what: str) -> int:
    """Return *value* as an int if it is an integer in [0, 2**48), else raise `ConfigError`."""
    return _check_size(value, name, what, 0, "a non-negative int")


def check_seed(value: Any, name: str = "seed") -> int:
    """Return a shuffle seed as an int in [0, 2**64), else raise `ConfigError`.

    >>> check_seed(7)
    7
    """
    if not is_integer(value) or not 0 <= int(value) < U64:
        raise ConfigError(
            f"{name}={value!r} must be an int in [0, 2**64); pass a non-negative 64-bit seed, or seed=None for sequential order"
        )
    return int(value)
