"""Long texts are tokenized in pieces, cut where the tokenizer never joins tokens, so the ids are those of the whole.

A Hugging Face tokenizer holds about 140 bytes per character while it encodes
(its `Encoding`: ids, offsets, token strings), so one 12.7 MB text took 3.3 GB.
`encode_pieces` gives a tokenizer at most `BATCH_CHARS` characters at a time:
texts longer than `PIECE_CHARS` are cut into pieces of about that size, and each
text's ids are the concatenation of its pieces' ids.

A cut is safe when no token can span it.  The model (BPE, WordPiece, ...) never
merges across the pre-tokenizer's pieces, so a cut is made only:

- after a ``\\n`` between two characters that are not whitespace, or (in text
  without newlines) before such a lone space (the character after either not a
  combining mark or format character, not a Hangul vowel or final consonant), for a tokenizer whose normalizer works character by
  character (none, NFC/NFD/NFKC/NFKD, Lowercase, BertNormalizer, or a sequence of
  them), whose pre-tokenizer splits at whitespace (ByteLevel without a prefix
  space, Whitespace, WhitespaceSplit, BertPreTokenizer, regex Split, or a
  sequence holding one), and whose added tokens hold no ``\\n``; and
- where the pre-tokenizer itself, run on the text around the cut, makes the same
  pieces whole as in two halves (checked at each cut).

Any other tokenizer (e.g. Metaspace or a prefix space, which add a character to
each call's first word) encodes each text whole.  Tests compare pieces against
whole encodings with real tokenizers (byte-level BPE, GPT-4-style Split +
ByteLevel, Whitespace WordPiece).
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

PIECE_CHARS = 1 << 16  # a text longer than this many characters is cut into pieces of about this size
BATCH_CHARS = 1 << 20  # the tokenizer is given at most about this many characters at a time
WINDOW_CHARS = 512  # the text either side of a cut that the pre-tokenizer is run on to check it

_LOCAL_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertNormalizer"}
_SPLITTING = {"Whitespace", "WhitespaceSplit", "BertPreTokenizer", "Split"}  # pieces end at whitespace (Split: checked)
_KEEPING = {"Digits", "Punctuation", "UnicodeScripts"}  # only ever cut pieces further
_NEWLINE = re.compile("(?<=\\S)\n(?=\\S)")  # a lone \n between two other characters
_SPACE = re.compile("(?<=\\S)(?= \\S)")  # before a lone space between two other characters


def splittable(tokenizer: Any) -> bool:
    """Whether a `tokenizers.Tokenizer` may encode a text in pieces cut after ``\\n`` (see the module's rules)."""
    config = json.loads(tokenizer.to_str())
    if any("\n" in str(added.get("content", "")) for added in config.get("added_tokens") or []):
        return False
    return _local(config.get("normalizer")) and _splits(config.get("pre_tokenizer"))


def _local(normalizer: Any) -> bool:
    if normalizer is None:
        return True
    if normalizer.get("type") == "Sequence":
        return all(_local(n) for n in normalizer.get("normalizers", []))
    return normalizer.get("type") in _LOCAL_NORMALIZERS


def _kind(pre: dict[str, Any]) -> str:
    """``split`` (pieces end at whitespace), ``keep`` (only cuts more) or ``no``."""
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space"):
            return "no"
        return "split" if pre.get("use_regex", True) else "keep"
    return "split" if kind in _SPLITTING else "keep" if kind in _KEEPING else "no"


def _splits(pre: Any) -> bool:
    if pre is None:
        return False
    kinds = [_kind(p) for p in pre.get("pretokenizers", [])] if pre.get("type") == "Sequence" else [_kind(pre)]
    return "split" in kinds and "no" not in kinds


def _safe_start(char: str) -> bool:
    code = ord(char)
    return (
        unicodedata.category(char)[0] != "M"
        and unicodedata.category(char) != "Cf"
        and not (0x1160 <= code <= 0x11FF or 0xD7B0 <= code <= 0xD7FF)
    )


def cuts(text: str, pre_tokenizer: Any, size: int = PIECE_CHARS) -> list[int]:
    """Where to cut *text* into pieces of about *size* characters (or more), each checked by *pre_tokenizer*.

    After a lone ``\\n`` when one comes within ``4 * size`` characters, else before a
    lone space (text without newlines), else at the next lone ``\\n``.
    """
    found: list[int] = []
    at = size
    while at < len(text):
        match = _NEWLINE.search(text, at, at + 4 * size) or _SPACE.search(text, at) or _NEWLINE.search(text, at)
        if match is None:
            break
        cut = match.end() if match.re is _NEWLINE else match.start()
        if _safe_start(text[cut + (match.re is _SPACE)]) and _same_pieces(pre_tokenizer, text, cut):
            found.append(cut)
            at = cut + size
        else:
            at = cut + 1
    return found


def _same_pieces(pre_tokenizer: Any, text: str, cut: int) -> bool:
    """Whether the pre-tokenizer, on the text around *cut*, makes the same pieces whole as in two halves."""
    lo, hi = max(0, cut - WINDOW_CHARS), cut + WINDOW_CHARS
    whole = pre_tokenizer.pre_tokenize_str(text[lo:hi])
    left = pre_tokenizer.pre_tokenize_str(text[lo:cut])
    right = [(s, (a + cut - lo, b + cut - lo)) for s, (a, b) in pre_tokenizer.pre_tokenize_str(text[cut:hi])]
    return bool(whole == left + right)


def _pieces(texts: Sequence[str], pre_tokenizer: Any | None) -> Iterator[tuple[int, str]]:
    """``(text index, piece)``: each text whole, or cut when *pre_tokenizer* is given and the text is long."""
    for index, text in enumerate(texts):
        if pre_tokenizer is None or len(text) <= PIECE_CHARS:
            yield index, text
            continue
        bounds = [0, *cuts(text, pre_tokenizer, PIECE_CHARS), len(text)]
        for lo, hi in itertools.pairwise(bounds):
            yield index, text[lo:hi]


def encode_pieces(tokenizer: Any, texts: Sequence[str], split: bool) -> list[npt.NDArray[np.uint32]]:
    """The ids of each text (no special tokens), the tokenizer given at most `BATCH_CHARS` characters at a time.

    With *split* (`splittable`), long texts are cut into pieces first.
    """
    batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # fast: no offsets
    parts: list[list[npt.NDArray[np.uint32]]] = [[] for _ in texts]
    group: list[tuple[int, str]] = []
    held = 0

    def flush() -> None:
        nonlocal held
        encodings = batch([piece for _, piece in group], add_special_tokens=False)
        for (index, _), encoding in zip(group, encodings, strict=True):
            parts[index].append(np.array(encoding.ids, dtype=np.uint32))
        group.clear()
        held = 0

    for index, piece in _pieces(texts, tokenizer.pre_tokenizer if split else None):
        if group and held + len(piece) > BATCH_CHARS:
            flush()
        group.append((index, piece))
        held += len(piece)
    if group:
        flush()
    return [p[0] if len(p) == 1 else np.concatenate(p) if p else np.zeros(0, np.uint32) for p in parts]
