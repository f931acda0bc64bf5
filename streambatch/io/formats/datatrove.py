"""datatrove's tokenized files (``NAME.ds``, ``NAME.ds.index``, ``NAME.ds.loss``) read as a `DocumentStore`.

What datatrove's ``TokenizedFile`` (written by its ``DocumentTokenizer``) holds::

    NAME.ds        every document's tokens, flat, little-endian uint16 (or uint32 for large vocabularies)
    NAME.ds.index  one little-endian uint64 per document: where it ENDS, counted in tokens (not bytes)
    NAME.ds.loss   optional, one byte per token: 1 the token trains as a target, 0 it does not

The ends are in tokens: ``TokenizedFile.write_bytes`` adds ``len(bytes) //
token_size`` to its write position before appending it, and its shuffle copies
``(end - start) * token_size`` bytes from ``start * token_size``.  No file
records the token size, so it is ``size(.ds) / last end`` (2 or 4), unless
*dtype* is given.  Document ``i`` is tokens ``end[i - 1]:end[i]``, id ``"i"``
(``"NAME.ds:i"`` in a folder of files, read as one corpus).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, DataError
from ...model.corpus import Corpus
from .byte_source import ByteSource, Opener, local_file, open_required
from .indexed_store import IndexedStore, NumberedIds

SUFFIX = ".ds"
INDEX = ".index"  # appended to the .ds name
LOSS = ".loss"
_BLOCK = 1 << 24


def is_datatrove(path: str | os.PathLike[str]) -> bool:
    """Whether *path* names a datatrove file (``.ds``, its ``.ds.index`` or ``.ds.loss``) or a folder holding ``.ds`` files."""
    name = os.fspath(path)
    if name.endswith((SUFFIX, SUFFIX + INDEX, SUFFIX + LOSS)):
        return True
    return os.path.isdir(name) and not os.path.exists(os.path.join(name, "header.json")) and bool(datatrove_files(name))


def datatrove_files(folder: str | os.PathLike[str]) -> list[str]:
    """The ``.ds`` files of *folder*, sorted by name (the order datatrove numbers them in)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(SUFFIX) and os.path.isfile(os.path.join(folder, n)))
    except OSError:
        return []
    return [os.path.join(os.fspath(folder), n) for n in names]


def open_datatrove(
    path: str | os.PathLike[str], *, dtype: Any = None, opener: Opener = local_file, id_prefix: str = ""
) -> IndexedStore:
    """Open a datatrove ``.ds`` file (with its ``.ds.index``, and ``.ds.loss`` if present) as a memory-mapped store.

    *dtype* (uint16 or uint32) overrides the token size found from the sizes;
    *id_prefix* goes before each document number in its id.
    """
    name = os.fspath(path)
    for part in (INDEX, LOSS):  # one of its other files names the .ds
        if name.endswith(SUFFIX + part):
            name = name[: -len(part)]
    data, index = open_required(opener, name), open_required(opener, name + INDEX)
    loss = opener(name + LOSS, False)
    if index.size % 8:
        raise DataError(f"{index.name}: {index.size} bytes is not a whole number of uint64 document ends: truncated")
    ends = index.array(np.dtype("<u8"), 0, index.size // 8)
    token_dtype = _token_dtype(data, index, ends, dtype)
    count = data.size // token_dtype.itemsize
    if loss is not None and loss.size != count:
        raise DataError(f"{loss.name}: {loss.size} bytes, but {data.name} holds {count} tokens (one loss byte each)")

    def documents() -> Mapping[str, Any]:
        starts, lengths = _documents(index.name, ends, count)
        return {"starts": starts, "lengths": lengths, "partition_codes": np.zeros(ends.size, np.uint8)}

    def mask() -> Mapping[str, Any]:
        # hand-off once DocumentStore has loss_bits (the loss-mask issue): also return "loss_bits": the mask packed by
        # streambatch.model.mask.pack_mask with each document's position 0 cleared, and name "loss_bits" in this group
        return {"_mask": None if loss is None else _mask(loss, count)}

    def tokens() -> Mapping[str, Any]:
        return {"tokens": data.array(token_dtype, 0, count)}

    return IndexedStore.lazy(
        kind="datatrove",
        name=data.name,
        ids=NumberedIds(int(ends.size), id_prefix),
        groups={("starts", "lengths", "partition_codes"): documents, ("_mask",): mask, ("tokens",): tokens},
        reopen=(_reopen, (name, None if dtype is None else np.dtype(dtype).name, opener, id_prefix)),
        identity=tuple(s.identity() for s in (data, index, loss) if s is not None),
    )


def open_datatrove_folder(folder: str | os.PathLike[str], *, opener: Opener = local_file) -> Corpus:
    """Every ``.ds`` file of *folder*, in name order, as one `Corpus` (ids ``"NAME.ds:i"``)."""
    files = datatrove_files(folder)
    if not files:
        raise ConfigError(f"{os.fspath(folder)}: holds no .ds files; pass a folder of datatrove's tokenized files")
    shards = [open_datatrove(f, opener=opener, id_prefix=os.path.basename(f) + ":") for f in files]
    return Corpus(shards, paths=files)


def _reopen(name: str, dtype: str | None, opener: Opener, id_prefix: str) -> IndexedStore:
    return open_datatrove(name, dtype=dtype, opener=opener, id_prefix=id_prefix)


def _token_dtype(data: ByteSource, index: ByteSource, ends: Any, dtype: Any) -> np.dtype[Any]:
    if dtype is not None:
        chosen = np.dtype(dtype)
        if chosen.name not in ("uint16", "uint32"):
            raise ConfigError(f"dtype={chosen.name} is not a datatrove token size; pass uint16 or uint32")
        if data.size % chosen.itemsize:
            raise DataError(f"{data.name}: {data.size} bytes is not a whole number of {chosen.name} tokens: truncated")
        found: np.dtype[Any] = chosen.newbyteorder("<")
    else:
        last = int(ends[-1]) if ends.size else 0
        if last == 0 or data.size == 0:
            found = np.dtype("<u2")
        elif data.size in (2 * last, 4 * last):
            found = np.dtype("<u2" if data.size == 2 * last else "<u4")
        else:
            raise DataError(
                f"{data.name}: {data.size} bytes, but {index.name} ends at token {last}: neither 2 nor 4 bytes per "
                "token (truncated, or the index belongs to another file)"
            )
    last = int(ends[-1]) if ends.size else 0
    if last != data.size // found.itemsize:
        state = "truncated" if data.size // found.itemsize < last else "longer than its index says"
        raise DataError(
            f"{data.name}: {data.size // found.itemsize} {found.name} tokens, but {index.name} ends at token {last}: {state}"
        )
    return found


def _documents(name: str, ends: Any, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Starts and lengths from the end offsets, after checking they never decrease."""
    documents = int(ends.size)
    starts = np.zeros(documents, np.int64)
    lengths = np.empty(documents, np.int64)
    for lo in range(0, documents, _BLOCK):
        hi = min(lo + _BLOCK, documents)
        block = ends[lo:hi]
        before = ends[lo - 1 : hi - 1] if lo else np.concatenate([np.zeros(1, np.uint64), ends[: hi - 1]])
        back = block < before
        if bool(back.any()):
            bad = lo + int(np.argmax(back))
            raise DataError(
                f"{name}: document ends are not monotone (document {bad} ends at token {int(ends[bad])}, before the "
                f"end of the one before)"
            )
        lengths[lo:hi] = (block - before).astype(np.int64)
        starts[lo:hi] = before.astype(np.int64)
    del count  # the last end was checked against the token count at open
    return starts, lengths


def _mask(loss: ByteSource, count: int) -> npt.NDArray[np.bool_]:
    """The ``.ds.loss`` bytes as bools (mapped), after checking each is 0 or 1."""
    raw = loss.array(np.dtype(np.uint8), 0, count)
    for lo in range(0, count, _BLOCK):
        block = raw[lo : lo + _BLOCK]
        if block.size and int(block.max()) > 1:
            bad = lo + int(np.argmax(block > 1))
            raise DataError(f"{loss.name}: byte {bad} is {int(raw[bad])}; a loss byte is 0 or 1")
    mask: npt.NDArray[np.bool_] = raw.view(np.bool_)
    return mask
