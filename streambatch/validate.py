"""Validators for documents and stores: token ids, document ids, offsets, unique ids.

Every check raises a `DataError` that names where the bad value is (document id,
file and line, array coordinate) and what to do; none of them coerces silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._checks import is_integer
from .errors import DataError, DuplicateIdError

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
                f"{where}: token[{position}]={int(items[position])} is outside [0, 2**32); token ids must fit in uint32"
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
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_id(value: Any, where: str) -> str:
    """Return a document id if it is a non-empty str, else raise `DataError`."""
    if not isinstance(value, str) or not value:
        raise DataError(f"{where}: id={value!r} must be a non-empty string; give every document an id")
    return value


def check_offsets(offsets: npt.NDArray[np.int64], token_count: int, name: str) -> None:
    """Offsets start at 0, never decrease and end at *token_count*; else `DataError`."""
    # compare, never subtract: differences of int64 offsets can wrap around
    if offsets.size == 0 or offsets[0] != 0:
        first = int(offsets[0]) if offsets.size else None
        raise DataError(f"{name}[0]={first} must be 0; offsets start at the first token")
    outside = (offsets < 0) | (offsets > token_count)
    if outside.any():
        at = int(np.argmax(outside))
        raise DataError(f"{name}[{at}]={int(offsets[at])} is outside [0, {token_count}]; every offset must point into the tokens")
    falling = offsets[1:] < offsets[:-1]
    if falling.any():
        at = int(np.argmax(falling))
        raise DataError(
            f"{name}[{at + 1}]={int(offsets[at + 1])} is less than {name}[{at}]={int(offsets[at])}; "
            "offsets must be non-decreasing"
        )
    if int(offsets[-1]) != token_count:
        raise DataError(
            f"{name}[-1]={int(offsets[-1])} but there are {token_count} tokens; the last offset must equal the token count"
        )


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
