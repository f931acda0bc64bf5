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


def check_positive(value: Any, name: str, what: str) -> int:
    """Return *value* as an int if it is a positive integer, else raise `ConfigError`.

    >>> check_positive(3, "batch_size", "the number of windows per batch")
    3
    """
    if not is_integer(value) or int(value) <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive int; pass {what}")
    return int(value)


def check_non_negative(value: Any, name: str, what: str) -> int:
    """Return *value* as an int if it is an integer >= 0, else raise `ConfigError`."""
    if not is_integer(value) or int(value) < 0:
        raise ConfigError(f"{name}={value!r} must be a non-negative int; pass {what}")
    return int(value)


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
