"""Validators for documents and stores: token ids, document ids, offsets, unique ids, vocabularies, tokenizers.

Every check raises a `DataError` that names where the bad value is (document id,
file and line, array coordinate) and what to do; none of them coerces silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from .._checks import is_integer, short_repr
from ..errors import DataError, DuplicateIdError

TOKEN_LIMIT = 1 << 32


def check_tokens(tokens: Any, where: str) -> npt.NDArray[np.uint32]:
    """Validate token ids and return them as a fresh uint32 array.

    Token ids are integers in [0, 2**32); bools and floats are rejected, not coerced, and so are
    a str, a mapping (its keys) and a set (no order).

    >>> check_tokens([0, 10, 11], "document 'a'").tolist()
    [0, 10, 11]
    >>> check_tokens([0, True], "document 'a'")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: document 'a': token[1]=True is not an integer token id; ...
    >>> check_tokens({1: 2}, "document 'a'")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: document 'a': tokens={1: 2} is not a sequence; pass a list of integer ids
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
        if isinstance(tokens, (str, bytes, bytearray, Mapping, Set)) or not isinstance(tokens, Iterable):
            # a str is characters, a mapping its keys, a set has no order: none of them is a token sequence
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


def duplicate_id(doc_id: str, first: str, repeated: str, rule: str = "document ids must be unique") -> NoReturn:
    """Raise the one `DuplicateIdError`: *doc_id* was *first* at one place and *repeated* at another.

    >>> duplicate_id("a", "a.jsonl:1", "a.jsonl:7")
    Traceback (most recent call last):
    ...
    streambatch.errors.DuplicateIdError: duplicate document id='a': first at a.jsonl:1, repeated at a.jsonl:7; ...
    """
    raise DuplicateIdError(f"duplicate document id={doc_id!r}: first at {first}, repeated at {repeated}; {rule}")


def check_unique(ids: list[str], labels: Sequence[str]) -> None:
    """Raise `DuplicateIdError` naming both positions of the first repeated id."""
    seen: dict[str, int] = {}
    for index, value in enumerate(ids):
        first = seen.setdefault(value, index)
        if first != index:
            duplicate_id(value, labels[first], labels[index])


Labels = Sequence[str] | Callable[[int], str]  # how errors name document i: a list, or built only when needed


def label_of(labels: Labels, index: int) -> str:
    """How errors name document *index*."""
    return labels(index) if callable(labels) else labels[index]


def check_vocabulary(
    tokens: npt.NDArray[Any], lengths: npt.NDArray[np.int64], labels: Labels, vocab_size: int | None, name: str
) -> None:
    """Raise `DataError` naming the document and position of the first id >= *vocab_size* (None: no bound).

    *name* is the tokenizer's, as its description (a store header's ``tokenizer``) gives it.

    >>> check_vocabulary(np.array([1, 300]), np.array([1, 1]), ["a:1", "a:2"], 256, "bytes")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: a:2: token[0]=300 is outside the vocabulary of tokenizer 'bytes' (vocab_size=256); ...
    """
    if vocab_size is None or tokens.size == 0 or int(tokens.max()) < vocab_size:
        return
    at = int(np.argmax(tokens >= vocab_size))
    ends = np.cumsum(lengths)
    document = int(np.searchsorted(ends, at, side="right"))
    position = at - int(ends[document] - lengths[document])
    raise DataError(
        f"{label_of(labels, document)}: token[{position}]={int(tokens[at])} is outside the vocabulary of tokenizer {name!r} "
        f"(vocab_size={vocab_size}); token ids must be below vocab_size: pass the tokenizer that made them (--tokenizer) "
        "or leave the document out"
    )


def tokenizer_label(tokenizer: dict[str, Any]) -> str:
    """A tokenizer recorded in a store header, for a message: its name, kind and vocabulary size.

    >>> tokenizer_label({"name": "bpe.json", "kind": "huggingface", "vocab_size": 8192})
    "'bpe.json' (huggingface, vocab_size=8192)"
    """
    return f"{short(tokenizer.get('name'))} ({tokenizer.get('kind')}, vocab_size={tokenizer.get('vocab_size')})"


def _tokenizer_key(tokenizer: dict[str, Any]) -> tuple[Any, ...]:
    """What makes token ids mean the same: the kind, the file's hash (else the name) and the vocabulary size."""
    return (tokenizer.get("kind"), tokenizer.get("file_hash") or tokenizer.get("name"), tokenizer.get("vocab_size"))


def check_one_tokenizer(labels: Sequence[str], tokenizers: Sequence[dict[str, Any] | None], what: str) -> None:
    """Refuse parts (shards of a corpus, sources of a mixture) whose headers record different tokenizers, or one
    tokenizer with different BOS/EOS ids (the data contract, `streambatch.model.contract`).

    A part that records no tokenizer (written from token ids) agrees with any.

    >>> byte = {"name": "bytes", "kind": "bytes", "vocab_size": 256}
    >>> check_one_tokenizer(["a", "b", "c"], [byte, None, dict(byte)], "a corpus")
    >>> check_one_tokenizer(["a", "b"], [byte, {"name": "bpe.json", "kind": "huggingface", "vocab_size": 8192}], "a corpus")
    Traceback (most recent call last):
    ...
    streambatch.errors.DataError: b was tokenized by 'bpe.json' (huggingface, vocab_size=8192) but a by 'bytes' (bytes, ...); ...
    """
    first: tuple[str, dict[str, Any]] | None = None
    for label, tokenizer in zip(labels, tokenizers, strict=True):
        if not isinstance(tokenizer, dict):
            continue
        if first is None:
            first = (label, tokenizer)
        elif _tokenizer_key(tokenizer) != _tokenizer_key(first[1]):
            raise DataError(
                f"{label} was tokenized by {tokenizer_label(tokenizer)} but {first[0]} by {tokenizer_label(first[1])}; "
                f"{what} mixes the token ids of one tokenizer: prepare every part with the same --tokenizer"
            )
        elif _policy(tokenizer) != _policy(first[1]):  # one tokenizer, another BOS/EOS policy: the data contract
            raise DataError(
                f"{label} wraps each text document in bos_id={tokenizer.get('bos_id')}, eos_id={tokenizer.get('eos_id')} "
                f"but {first[0]} in bos_id={first[1].get('bos_id')}, eos_id={first[1].get('eos_id')}; {what} mixes "
                "documents of one BOS/EOS policy: prepare every part with the same --bos-id/--eos-id"
            )


def _policy(tokenizer: dict[str, Any]) -> tuple[Any, Any]:
    return tokenizer.get("bos_id"), tokenizer.get("eos_id")
