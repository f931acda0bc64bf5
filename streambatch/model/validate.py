"""Validators for documents and stores: token ids, document ids, offsets, unique ids.

Every check raises a `DataError` that names where the bad value is (document id,
file and line, array coordinate) and what to do; none of them coerces silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .._checks import is_integer, short_repr
from ..errors import DataError, DuplicateIdError

TOKEN_LIMIT = 1 << 32


def check_tokens(tokens: Any, where: str) -> npt.NDArray[np.uint32]:
    """Validate token ids and return them as a fresh uint32 array.

    Token ids are integers in [0, 2**32); bools and floats are rejected, not coerced.

    >>> check_tokens([0, 10, 11], "document 'a'").tolist()
    [0, 10, 11]
    >>> check_tokens([0, True], "document 'a'")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: document 'a': token[1]=True is not an integer token id; ...
    """
    if isinstance(tokens, np.ndarray):
        array = tokens
        if array.ndim != 1:
            raise DataError(f"{where}: tokens have shape {array.shape}; pass a 1-D sequence of ids")
        if array.dtype.kind not in "ui":
            raise DataError(
                f"{where}: tokens have dtype {array.dtype}; token ids must be integers "
                "in [0, 2**32) (bool and float arrays are not accepted)"
            )
    else:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise DataError(f"{where}: tokens={short(tokens)} is not a sequence; pass a list of integer ids")
        items = tokens if isinstance(tokens, Sequence) else list(tokens)
        if not all(type(t) is int for t in items):
            for position, token in enumerate(items):
                if not is_integer(token):
                    raise DataError(
                        f"{where}: token[{position}]={token!r} is not an integer token id; "
                        "token ids must be integers in [0, 2**32), not bools or floats"
                    )
        try:
            array = np.asarray(items, dtype=np.int64).reshape(-1)
        except OverflowError:  # beyond int64: name the first id out of range as given
            position = next(i for i, t in enumerate(items) if not 0 <= int(t) < TOKEN_LIMIT)
            raise DataError(
                f"{where}: token[{position}]={short(int(items[position]))} is outside [0, 2**32); token ids must fit in uint32"
            ) from None
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= TOKEN_LIMIT:
            position = int(np.argmax((array < 0) | (array >= TOKEN_LIMIT)))
            raise DataError(
                f"{where}: token[{position}]={int(array[position])} is outside [0, 2**32); token ids must fit in uint32"
            )
    return np.array(array, dtype=np.uint32)


def short(value: Any) -> str:
    """``repr(value)`` for a message, at most about 40 characters (`short_repr`)."""
    return short_repr(value, limit=40)


def check_id(value: Any, where: str) -> str:
    """Return a document id if it is a non-empty str, else raise `DataError`."""
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: id={short(value)} must be a non-empty string; give every document an id")
    return value


def check_offsets(offsets: npt.NDArray[Any], token_count: int, name: str) -> npt.NDArray[np.int64]:
    """Check integer *offsets* against *token_count* and return them as int64; else `DataError`.

    Only comparisons, no arithmetic (``np.diff`` wraps in int64), so no value can
    overflow into a valid-looking one: every offset lies in [0, token_count],
    the first is 0, each is >= the one before and the last is the token count.

    >>> check_offsets(np.array([0, 2**63 - 1, -2, 30]), 30, "offsets")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: offsets[1]=9223372036854775807 is outside [0, 30]; every offset must index the tokens
    """
    if offsets.size == 0:
        raise DataError(f"{name} is empty; pass len(documents) + 1 offsets starting at 0")
    if offsets.dtype.kind == "u" and int(offsets.max()) > np.iinfo(np.int64).max:
        at = int(np.argmax(offsets > np.uint64(np.iinfo(np.int64).max)))
        raise DataError(f"{name}[{at}]={int(offsets[at])} is outside [0, {token_count}]; every offset must index the tokens")
    values = offsets.astype(np.int64)  # exact: every value fits int64 now
    outside = (values < 0) | (values > token_count)
    if outside.any():
        at = int(np.argmax(outside))
        raise DataError(f"{name}[{at}]={int(values[at])} is outside [0, {token_count}]; every offset must index the tokens")
    if values[0] != 0:
        raise DataError(f"{name}[0]={int(values[0])} must be 0; offsets start at the first token")
    down = values[1:] < values[:-1]
    if down.any():
        at = int(np.argmax(down))
        raise DataError(
            f"{name}[{at + 1}]={int(values[at + 1])} is less than {name}[{at}]={int(values[at])}; offsets must be non-decreasing"
        )
    if int(values[-1]) != token_count:
        raise DataError(
            f"{name}[-1]={int(values[-1])} but there are {token_count} tokens; the last offset must equal the token count"
        )
    return values


def check_unique(ids: list[str], labels: Sequence[str]) -> None:
    """Raise `DuplicateIdError` naming both positions of the first repeated id."""
    seen: dict[str, int] = {}
    for index, value in enumerate(ids):
        first = seen.setdefault(value, index)
        if first != index:
            raise DuplicateIdError(
                f"duplicate document id={value!r}: first at {labels[first]}, repeated at "
                f"{labels[index]}; document ids must be unique"
            )
