"""Tokenizers for preparing stores: the byte tokenizer, Hugging Face ``tokenizer.json`` files, any callable.

A `Tokenizer` turns text into token ids (`encode`, `encode_batch`, without special
tokens), knows its vocabulary size and its end/beginning-of-document ids, and
describes itself for a store's header (`describe`).  `encode_texts` makes
documents: each text's ids with ``bos_id`` prepended and ``eos_id`` appended, every
id checked against the vocabulary.

>>> tok = ByteTokenizer(eos_id=256)
>>> tokens, lengths = encode_texts(tok, ["hi", ""], ["a.txt", "b.txt"])
>>> tokens.tolist(), lengths.tolist(), tok.vocab_size
([104, 105, 256, 256], [3, 1], 257)

Special ids, when not given, come from the tokenizer's vocabulary: ``eos_id`` is
the first of `EOS_NAMES` it holds, ``bos_id`` the first of `BOS_NAMES`.  The
byte tokenizer and plain callables have none unless given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..._checks import is_integer
from ...errors import ConfigError, DataError, missing_dependency
from ...io.files import open_regular, short_path
from ...model.validate import TOKEN_LIMIT, Labels, check_tokens, check_vocabulary, label_of, short
from .byte_tokens import BYTE_VOCAB_SIZE
from .split_text import encode_pieces, splittable

AUTO: Literal["auto"] = "auto"
SpecialId = int | None | Literal["auto"]
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[SEP]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[CLS]")
_HASH_BLOCK = 1 << 20


@runtime_checkable
class Tokenizer(Protocol):
    """What `prepare_store` needs from a tokenizer (`ByteTokenizer`, `HFTokenizer`, `CallableTokenizer`)."""

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int | None: ...

    @property
    def eos_id(self) -> int | None: ...

    @property
    def bos_id(self) -> int | None: ...

    def encode(self, text: str) -> Any:
        """Token ids of *text*, without special tokens."""

    def encode_batch(self, texts: Sequence[str]) -> Sequence[Any]:
        """`encode` of each text, in order."""

    def describe(self) -> dict[str, Any]:
        """What a store's header records: name, kind, file_hash, vocab_size, eos_id, bos_id."""


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or raise `MissingDependencyError` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise missing_dependency(what, module.split(".")[0], extra) from err


def file_hash(path: str | os.PathLike[str]) -> str:
    """``blake2b-256:`` + the hex BLAKE2b-256 of a file's bytes (as store fingerprints are written)."""
    digest = hashlib.blake2b(digest_size=32)
    with open_regular(path) as handle:
        while chunk := handle.read(_HASH_BLOCK):
            digest.update(chunk)
    return "blake2b-256:" + digest.hexdigest()


def _special(value: Any, name: str) -> SpecialId:
    if value is None or value == AUTO:
        return value  # type: ignore[no-any-return]
    if not is_integer(value) or not 0 <= int(value) < TOKEN_LIMIT:
        raise ConfigError(f"{name}={value!r} must be a token id in [0, 2**32), None for none, or 'auto'")
    return int(value)


def _describe(kind: str, name: str, vocab_size: int | None, eos: int | None, bos: int | None, **more: Any) -> dict[str, Any]:
    return {"name": name, "kind": kind, "file_hash": None, "vocab_size": vocab_size, "eos_id": eos, "bos_id": bos, **more}


def _fits(tokenizer: str, vocab_size: int | None, eos: int | None, bos: int | None) -> None:
    for special, value in (("eos_id", eos), ("bos_id", bos)):
        if value is not None and vocab_size is not None and value >= vocab_size:
            raise ConfigError(
                f"{special}={value} is outside the vocabulary of {tokenizer} (vocab_size={vocab_size}); "
                "pass an id the tokenizer defines"
            )


@dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; special ids, when given, may extend the vocabulary (e.g. ``eos_id=256``).

    >>> ByteTokenizer().encode("hé").tolist(), ByteTokenizer(eos_id=256).describe()["vocab_size"]
    ([104, 195, 169], 257)
    """

    eos_id: int | None = None
    bos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("eos_id", "bos_id"):
            if _special(getattr(self, name), name) == AUTO:
                object.__setattr__(self, name, None)  # bytes name no special tokens

    @property
    def name(self) -> str:
        return "bytes"

    @property
    def vocab_size(self) -> int:
        return max([BYTE_VOCAB_SIZE] + [s + 1 for s in (self.eos_id, self.bos_id) if s is not None])

    def encode(self, text: str) -> npt.NDArray[np.uint8]:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.uint8]]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def describe(self) -> dict[str, Any]:
        return _describe("bytes", self.name, self.vocab_size, self.eos_id, self.bos_id)


@dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` (from a ``tokenizer.json``; the ``[tokenizers]`` extra).

    Text is encoded without the tokenizer's own post-processing
    (``add_special_tokens=False``): documents get exactly ``bos_id`` and ``eos_id``.
    ``eos_id``/``bos_id`` default to ``"auto"``: the first of `EOS_NAMES` / `BOS_NAMES`
    in the vocabulary, else none.  Pickles as its JSON (worker processes).  Long texts are
    encoded in pieces where that gives the same ids (`streambatch.read.text.split_text`),
    and at most about 1 Mi characters at a time, so memory stays bounded.
    """

    tokenizer: Any = field(repr=False)
    name: str = "tokenizer"
    threaded: ClassVar[bool] = True  # encode_batch runs on every core (Rust threads): see read.workers.plan_workers
    file_hash: str | None = None
    eos_id: int | None = AUTO  # type: ignore[assignment]
    bos_id: int | None = AUTO  # type: ignore[assignment]
    vocab_size: int = field(init=False)
    split: bool = field(init=False, repr=False)  # long texts may be cut into pieces (split_text.splittable)

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", splittable(self.tokenizer))
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        object.__setattr__(self, "vocab_size", max(vocab.values(), default=-1) + 1)
        for special, names in (("eos_id", EOS_NAMES), ("bos_id", BOS_NAMES)):
            if _special(getattr(self, special), special) == AUTO:
                found = next((vocab[n] for n in names if n in vocab), None)
                object.__setattr__(self, special, found)
        if self.file_hash is None:
            digest = hashlib.blake2b(self.tokenizer.to_str().encode(), digest_size=32).hexdigest()
            object.__setattr__(self, "file_hash", "blake2b-256:" + digest)
        _fits(repr(self.name), self.vocab_size, self.eos_id, self.bos_id)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, eos_id: SpecialId = AUTO, bos_id: SpecialId = AUTO) -> HFTokenizer:
        """Load a ``tokenizer.json``; its ``file_hash`` is the BLAKE2b-256 of the file."""
        tokenizers = require("tokenizers", "tokenizers", "--tokenizer (a Hugging Face tokenizer.json)")
        name = os.fspath(path)
        try:
            with open_regular(name) as handle:  # a FIFO or device is refused, never waited on
                text = handle.read()
            loaded = tokenizers.Tokenizer.from_str(text.decode("utf-8"))
        except OSError as err:
            raise ConfigError(
                f"tokenizer={short_path(name)!r}: cannot read ({err.strerror}); pass a tokenizer.json file"
            ) from err
        except Exception as err:  # tokenizers raises plain Exception for malformed files
            raise ConfigError(
                f"tokenizer={short_path(name)!r} is not a Hugging Face tokenizer.json ({err}); pass a tokenizer.json file"
            ) from err
        digest = "blake2b-256:" + hashlib.blake2b(text, digest_size=32).hexdigest()
        return cls(loaded, Path(name).name, digest, eos_id, bos_id)  # type: ignore[arg-type]

    def encode(self, text: str) -> npt.NDArray[np.uint32]:
        return encode_pieces(self.tokenizer, [text], self.split)[0]

    def encode_batch(self, texts: Sequence[str]) -> list[npt.NDArray[np.uint32]]:
        return encode_pieces(self.tokenizer, texts, self.split)

    def describe(self) -> dict[str, Any]:
        tokens = {
            f"{s}_token": self.tokenizer.id_to_token(i) for s, i in (("eos", self.eos_id), ("bos", self.bos_id)) if i is not None
        }
        return {
            **_describe("huggingface", self.name, self.vocab_size, self.eos_id, self.bos_id, **tokens),
            "file_hash": self.file_hash,
        }


@dataclass(frozen=True)
class CallableTokenizer:
    """Any ``str -> Sequence[int]`` as a `Tokenizer`; *vocab_size*, when given, bounds its ids.

    >>> tok = CallableTokenizer(lambda s: [len(w) for w in s.split()], name="lengths", vocab_size=50)
    >>> tok.encode("a bb ccc"), tok.describe()["name"]
    ([1, 2, 3], 'lengths')
    """

    function: Callable[[str], Any] = field(repr=False)
    name: str = ""
    vocab_size: int | None = None
    eos_id: int | None = None
    bos_id: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ConfigError(f"tokenizer={short(self.function)} is not callable; pass a function str -> Sequence[int]")
        if not self.name:
            module = getattr(self.function, "__module__", None) or ""
            qualname = getattr(self.function, "__qualname__", type(self.function).__name__)
            object.__setattr__(self, "name", f"{module}.{qualname}" if module else qualname)
        if self.vocab_size is not None and (not is_integer(self.vocab_size) or not 0 < self.vocab_size <= TOKEN_LIMIT):
            raise ConfigError(f"vocab_size={self.vocab_size!r} must be an int in [1, 2**32], or None for unknown")
        for name in ("eos_id", "bos_id"):
            if _special(getattr(self, name), name) == AUTO:
                object.__setattr__(self, name, None)
        _fits(repr(self.name), self.vocab_size, self.eos_id, self.bos_id)

    def encode(self, text: str) -> Any:
        return self.function(text)

    def encode_batch(self, texts: Sequence[str]) -> list[Any]:
        return [self.function(t) for t in texts]

    def describe(self) -> dict[str, Any]:
        return _describe("callable", self.name, self.vocab_size, self.eos_id, self.bos_id)


TokenizerSpec = Tokenizer | Callable[[str], Any] | str | os.PathLike[str] | None


def as_tokenizer(spec: TokenizerSpec = None, *, eos_id: SpecialId = AUTO, bos_id: SpecialId = AUTO) -> Tokenizer:
    """A `Tokenizer` from what a user passes: None (bytes), a tokenizer.json path, a Tokenizer, or a callable.

    *eos_id*/*bos_id* override the tokenizer's own (None: none; ``"auto"``: keep).

    >>> as_tokenizer(None, eos_id=0).describe()["eos_id"]
    0
    """
    eos, bos = _special(eos_id, "eos_id"), _special(bos_id, "bos_id")
    overrides = {k: v for k, v in (("eos_id", eos), ("bos_id", bos)) if v != AUTO}
    if spec is None:
        return ByteTokenizer(**overrides)
    if isinstance(spec, (str, os.PathLike)):
        return HFTokenizer.from_file(spec, eos_id=eos, bos_id=bos)
    if isinstance(spec, (ByteTokenizer, HFTokenizer, CallableTokenizer)):
        return dataclasses.replace(spec, **overrides) if overrides else spec  # type: ignore[arg-type]
    if isinstance(spec, Tokenizer):
        if overrides:
            raise ConfigError(f"eos_id/bos_id cannot be set on tokenizer={short(spec)}; give your tokenizer object those ids")
        return spec
    if callable(spec):
        return CallableTokenizer(spec, **overrides)  # type: ignore[arg-type]
    raise ConfigError(
        f"tokenizer={short(spec)} is not a tokenizer; pass a tokenizer.json path, a Tokenizer or a str -> ids callable"
    )


def _ids(piece: Any, labels: Labels, index: int) -> npt.NDArray[Any]:
    if isinstance(piece, np.ndarray) and piece.ndim == 1 and piece.dtype.kind == "u" and piece.dtype.itemsize <= 4:
        return piece  # already valid ids (the built-in tokenizers return these)
    return check_tokens(piece, f"{label_of(labels, index)}: tokenizer output")


def encode_texts(
    tokenizer: Tokenizer, texts: Sequence[str], labels: Labels
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """Tokenize documents: flat uint32 ids and one length per text, with bos/eos added and the vocabulary checked.

    *labels* name each text in errors (``file:line``).  A tokenizer that raises, or
    returns something other than integer ids, is reported at the text it failed on.
    """
    try:
        pieces = tokenizer.encode_batch(texts)
    except Exception as err:  # a user's tokenizer: find the text it fails on
        for index, text in enumerate(texts):
            try:
                tokenizer.encode(text)
            except Exception as single:
                raise DataError(f"{label_of(labels, index)}: the tokenizer raised {type(single).__name__}: {single}") from single
        raise DataError(
            f"{label_of(labels, 0) if texts else 'texts'}: the tokenizer's encode_batch raised {type(err).__name__}: {err}"
        ) from err
    if len(pieces) != len(texts):
        raise DataError(
            f"{label_of(labels, 0)}: the tokenizer returned {len(pieces)} results for {len(texts)} texts; "
            "encode_batch must return one per text"
        )
    arrays = [_ids(p, labels, i) for i, p in enumerate(pieces)]
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    sizes = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    lengths = sizes + (bos is not None) + (eos is not None)
    body = np.concatenate(arrays).astype(np.uint32, copy=False) if arrays else np.zeros(0, np.uint32)
    tokens = body if bos is None and eos is None else wrap_documents(body, lengths, bos, eos)[0]
    check_vocabulary(tokens, lengths, labels, tokenizer.vocab_size, tokenizer.name)
    return tokens, lengths


def wrap_documents(
    body: npt.NDArray[np.uint32], lengths: npt.NDArray[np.int64], bos: int | None, eos: int | None
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.bool_]]:
    """The flat tokens of documents of *lengths* (each counting its bos and eos): *bos* first, *eos* last, *body*
    between; and where the body went (False at each bos and eos).

    >>> tokens, keep = wrap_documents(np.array([5, 6, 7], np.uint32), np.array([3, 2]), None, 0)
    >>> tokens.tolist(), keep.tolist()
    ([5, 6, 0, 7, 0], [True, True, False, True, False])
    """
    ends = np.cumsum(lengths)
    tokens = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.uint32)
    keep = np.ones(tokens.size, dtype=np.bool_)
    if bos is not None:
        tokens[ends - lengths] = bos
        keep[ends - lengths] = False
    if eos is not None:
        tokens[ends - 1] = eos
        keep[ends - 1] = False
    tokens[keep] = body
    return tokens, keep
