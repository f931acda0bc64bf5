"""The built-in byte-level tokenizer: UTF-8 bytes as token ids 0..255."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BYTE_VOCAB_SIZE = 256


def byte_tokenize(text: str) -> npt.NDArray[np.uint16]:
    """Token ids of *text*: its UTF-8 bytes (vocabulary of 256).

    >>> byte_tokenize("hé").tolist()
    [104, 195, 169]
    """
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def byte_detokenize(tokens: npt.ArrayLike) -> str:
    """Inverse of `byte_tokenize` (invalid UTF-8 is replaced).

    >>> byte_detokenize([104, 195, 169])
    'hé'
    """
    return np.asarray(tokens, dtype=np.uint8).tobytes().decode("utf-8", errors="replace")
