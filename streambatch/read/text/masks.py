"""Loss masks from rows: HF ``labels``, ``loss_mask``/``assistant_masks``, prompt/completion pairs and chat ``messages``.

Token rows bring their mask as a column (`row_mask`, `streambatch.read.text.labels`).  Text rows bring it
as *segments*: pieces of text, each trained or not, tokenized one by one and
joined (`segment_tokens`), so every token knows which piece it came from:

* a prompt/completion pair is two segments, the completion trained;
* a chat (`streambatch.read.text.chat.ChatTemplate`) trains the text inside its
  template's ``{% generation %}`` blocks, or without them what each assistant
  turn adds to the rendering (the rules: `streambatch.read.text.chat`).

A document whose mask trains nothing is refused by name (`untrained_reason`),
unless the reader skips such documents (``skip_untrained_documents``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DataError
from ...model.validate import short
from .chat import ChatTemplate, Segments
from .labels import MASK_KEYS, row_mask
from .tokenizers import Tokenizer, encode_texts, wrap_documents

__all__ = ["MASK_KEYS", "ChatTemplate", "Segments", "prompt_segments", "row_mask", "segment_tokens"]


def prompt_segments(row: Mapping[str, Any], prompt: str, completion: str, where: str) -> Segments:
    """A prompt/completion row's two segments: the prompt not trained, the completion trained.

    >>> prompt_segments({"q": "2+2=", "a": "4"}, "q", "a", "row 0")
    [('2+2=', False), ('4', True)]
    """
    pieces = []
    for field, trained in ((prompt, False), (completion, True)):
        if field not in row:
            raise DataError(f"{where}: missing field {field!r}; each row needs {prompt!r} and {completion!r} text")
        text = row[field]
        if not isinstance(text, str):
            raise DataError(f"{where}: {field}={short(text)} is not a string; prompt and completion are text to tokenize")
        pieces.append((text, trained))
    return pieces


def segment_tokens(
    tokenizer: Tokenizer, documents: Sequence[Segments], label: Callable[[int], str]
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Tokenize each document's segments (one by one, all in one batch) and join them, bos/eos around each document.

    Returns flat tokens, one length per document and the flat mask: a trained
    segment's tokens are set, and eos when the last segment is trained; bos never.
    """
    texts = [text for pieces in documents for text, _ in pieces]
    owner = np.repeat(np.arange(len(documents)), [len(p) for p in documents])
    raw = _Raw(tokenizer)
    body, sizes = encode_texts(raw, texts, lambda k: label(int(owner[k])))
    trained = np.repeat(np.fromiter((t for pieces in documents for _, t in pieces), dtype=np.bool_, count=len(texts)), sizes)
    per_doc = np.zeros(len(documents), dtype=np.int64)
    np.add.at(per_doc, owner, sizes)
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    lengths = per_doc + (bos is not None) + (eos is not None)
    tokens, keep = wrap_documents(body.astype(np.uint32, copy=False), lengths, bos, eos)
    mask = np.zeros(tokens.size, dtype=np.bool_)
    if eos is not None:  # the eos trains when the document's last segment does
        last = np.fromiter((bool(p) and p[-1][1] for p in documents), dtype=np.bool_, count=len(documents))
        mask[(np.cumsum(lengths) - 1)[last]] = True
    mask[keep] = trained
    return tokens, lengths, mask


class _Raw:
    """*tokenizer* without its bos/eos (segments are joined first, then wrapped once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.name, self.vocab_size = tokenizer.name, tokenizer.vocab_size
        self.eos_id = self.bos_id = None

    def encode(self, text: str) -> Any:
        return self._tokenizer.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> Sequence[Any]:
        return self._tokenizer.encode_batch(texts)

    def describe(self) -> dict[str, Any]:
        return self._tokenizer.describe()
