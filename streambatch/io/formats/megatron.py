"""Megatron-LM's indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``) read as a `DocumentStore`.

The ``.idx`` file, all little-endian::

    magic        9 bytes   b"MMIDIDX\\x00\\x00"
    version      u64       1
    dtype code   u8        1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    sequences    u64       N
    doc indices  u64       D + 1 (the document count plus one)
    lengths      N x int32 tokens per sequence
    pointers     N x int64 byte offset of each sequence in .bin
    doc indices  (D + 1) x int64: 0, then the sequence index at which each document ends

Megatron document ``d`` (sequences ``doc_idx[d]`` to ``doc_idx[d + 1]``) is
streambatch document ``d`` (id ``"d"``), so no window crosses it.  Its
sequences must be contiguous in ``.bin`` (what ``IndexedDatasetBuilder``
writes), so its tokens are one range of the mapped file; and the index must
cover the ``.bin`` exactly (the builder writes each sequence right after the
one before, and the index once the data is complete): a gap or uncovered bytes
mean the two files do not belong together.  Pointers are checked against the
file's size before any sum, so none can wrap.  uint16 tokens are
mapped as they are and int32 ones viewed as uint32 (checked once for negative
ids, when the tokens are first used); uint8, int8, int16 and int64 tokens are
read into memory as uint16/uint32.  Float dtypes are refused.

Opening reads the 34-byte header and the file sizes; the sequence arrays are
memory-mapped and checked when the documents are first used (a `DataError`
naming the file and the rule).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ConfigError, DataError
from ...model.corpus import Corpus
from ..files import short_path
from .byte_source import ByteSource, Opener, local_file, open_required
from .indexed_store import IndexedStore, NumberedIds

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document-index count: 34 bytes
DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(name).newbyteorder("<")
    for code, name in enumerate(["uint8", "int8", "int16", "int32", "int64", "float64", "float32", "uint16"], start=1)
}
CODES = {dtype.name: code for code, dtype in DTYPES.items()}
_BLOCK = 1 << 24  # tokens checked per step: bounded temporaries
_STEP = 1 << 18  # index entries checked per step: temporaries small enough to be reused, not mapped afresh


def optimal_dtype(vocab_size: int | None) -> np.dtype[Any]:
    """The token dtype ``IndexedDatasetBuilder`` is given for a vocabulary: uint16 below 65,500 ids, else int32.

    >>> optimal_dtype(50_257).name, optimal_dtype(65_500).name, optimal_dtype(None).name
    ('uint16', 'int32', 'int32')
    """
    return DTYPES[CODES["uint16"] if vocab_size is not None and vocab_size < 65_500 else CODES["int32"]]


def megatron_paths(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``(PREFIX.bin, PREFIX.idx)`` for a prefix or either file's path.

    >>> megatron_paths("data/corpus_text_document.idx")
    ('data/corpus_text_document.bin', 'data/corpus_text_document.idx')
    """
    name = os.fspath(path)
    prefix = name[:-4] if name.endswith((".bin", ".idx")) else name
    return prefix + ".bin", prefix + ".idx"


def is_megatron(path: str | os.PathLike[str]) -> bool:
    """Whether *path* names a Megatron dataset (a prefix, or a ``.bin``/``.idx``, with a ``PREFIX.idx``) or a folder of them."""
    name = os.fspath(path)
    if name.endswith(".idx"):
        return True
    if os.path.isdir(name):
        return not os.path.exists(os.path.join(name, "header.json")) and bool(megatron_prefixes(name))
    return os.path.isfile(megatron_paths(name)[1])


def megatron_prefixes(folder: str | os.PathLike[str]) -> list[str]:
    """The prefixes of the ``.idx`` files of *folder*, sorted by name."""
    return _listing(folder)[0]


def _listing(folder: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """The prefixes of *folder*'s ``.idx`` files (regular files), and the names of its ``.bin`` entries, sorted,
    from one listing (a folder that cannot be listed has none)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return [], []
    indexes = sorted(n for n in names if n.endswith(".idx") and os.path.isfile(os.path.join(folder, n)))
    return [os.path.join(os.fspath(folder), n[:-4]) for n in indexes], sorted(n for n in names if n.endswith(".bin"))


def open_megatron_folder(folder: str | os.PathLike[str], *, opener: Opener = local_file) -> Corpus:
    """Every Megatron dataset of *folder* (its ``.idx`` files, in name order) as one `Corpus` (ids ``"PREFIX:d"``)."""
    prefixes, data = _listing(folder)
    if not prefixes:
        raise ConfigError(f"{os.fspath(folder)}: holds no .idx files; pass a folder of Megatron datasets")
    named = {os.path.basename(p) for p in prefixes}
    orphans = [n for n in data if n[:-4] not in named]
    if orphans:  # a dataset whose index is missing (a write killed part way): never a corpus without it
        raise DataError(
            f"{short_path(os.path.join(os.fspath(folder), orphans[0]))}: its index {orphans[0][:-4]}.idx is missing, "
            "so the folder's corpus would leave it out; write the dataset again, or move the .bin out of the folder"
        )
    shards = [open_megatron(p, opener=opener, id_prefix=os.path.basename(p) + ":") for p in prefixes]
    return Corpus(shards, paths=[p + ".idx" for p in prefixes])


def index_header(dtype: np.dtype[Any], sequences: int, documents: int) -> bytes:
    """The 34 bytes that start an ``.idx`` file of *sequences* sequences and *documents* documents."""
    return HEADER.pack(MAGIC, VERSION, CODES[dtype.name], sequences, documents + 1)


def open_megatron(path: str | os.PathLike[str], *, opener: Opener = local_file, id_prefix: str = "") -> IndexedStore:
    """Open a Megatron dataset (a prefix, or its ``.bin`` or ``.idx`` path) as a memory-mapped `DocumentStore`.

    *opener* turns each file's path into a `ByteSource` (local files by default;
    the seam for object storage); *id_prefix* goes before each document number
    in its id.  The header and sizes are checked here; the sequence arrays when
    the documents are first used.
    """
    bin_path, idx_path = megatron_paths(path)
    idx, data = open_required(opener, idx_path), open_required(opener, bin_path)
    dtype, sequences, documents = _read_header(idx)
    lengths, pointers, doc_index = _index_arrays(idx, sequences, documents)
    if data.size % dtype.itemsize:
        raise DataError(f"{data.name}: {data.size} bytes is not a whole number of {dtype.name} tokens: truncated")

    def index() -> Mapping[str, Any]:
        starts, sizes = _documents(idx.name, data, dtype, lengths, pointers, doc_index)
        return {
            "starts": starts,
            "lengths": sizes,
            "partition_codes": np.zeros(documents, np.uint8),
            "_mask": None,
            "loss_bits": None,
        }

    def tokens() -> Mapping[str, Any]:
        return {"tokens": _tokens(data, dtype)}

    return IndexedStore.lazy(
        kind="megatron",
        name=idx.name,
        ids=NumberedIds(documents, id_prefix),
        groups={("starts", "lengths", "partition_codes", "_mask", "loss_bits"): index, ("tokens",): tokens},
        reopen=(_reopen, (os.fspath(path), opener, id_prefix)),
        identity=(idx.identity(), data.identity()),
    )


def _reopen(path: str, opener: Opener, id_prefix: str) -> IndexedStore:
    return open_megatron(path, opener=opener, id_prefix=id_prefix)


def _read_header(idx: ByteSource) -> tuple[np.dtype[Any], int, int]:
    head = idx.read(0, HEADER.size)
    if head[: len(MAGIC)] != MAGIC[: len(head)] or len(head) < len(MAGIC):
        raise DataError(f"{idx.name}: not a Megatron index (magic {head[:9]!r}, expected {MAGIC!r}); pass a .idx file")
    if len(head) < HEADER.size:
        raise DataError(f"{idx.name}: {len(head)} bytes, shorter than the {HEADER.size}-byte header: truncated")
    _, version, code, sequences, doc_entries = HEADER.unpack(head)
    if version != VERSION:
        raise DataError(f"{idx.name}: version {version}, but only version {VERSION} is known")
    if code not in DTYPES:
        raise DataError(f"{idx.name}: dtype code {code} is not one of 1-8 (uint8 ... uint16)")
    dtype = DTYPES[code]
    if dtype.kind == "f":
        raise DataError(f"{idx.name}: dtype code {code} ({dtype.name}) holds floats, not token ids; pass a token dataset")
    if doc_entries < 1:
        raise DataError(f"{idx.name}: document-index count 0; it is the document count + 1 (at least 1)")
    expected = HEADER.size + 12 * sequences + 8 * doc_entries
    if idx.size != expected:
        state = "truncated" if idx.size < expected else "longer than its header says (a multimodal index?)"
        raise DataError(
            f"{idx.name}: {idx.size} bytes, but {sequences} sequences and {doc_entries} document indices take {expected}: {state}"
        )
    return dtype, sequences, doc_entries - 1


def _index_arrays(idx: ByteSource, sequences: int, documents: int) -> tuple[Any, Any, Any]:
    """The three arrays of the index, mapped (not read)."""
    lengths = idx.array(np.dtype("<i4"), HEADER.size, sequences)
    pointers = idx.array(np.dtype("<i8"), HEADER.size + 4 * sequences, sequences)
    doc_index = idx.array(np.dtype("<i8"), HEADER.size + 12 * sequences, documents + 1)
    return lengths, pointers, doc_index


def _documents(
    name: str, data: ByteSource, dtype: np.dtype[Any], lengths: Any, pointers: Any, doc_index: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each document's first token and length, after checking the three arrays (one pass each, in blocks)."""
    sequences, documents = lengths.size, doc_index.size - 1
    if int(doc_index[0]) != 0 or int(doc_index[-1]) != sequences:
        raise DataError(
            f"{name}: document indices run from {int(doc_index[0])} to {int(doc_index[-1])}; they must start at 0 "
            f"and end at the sequence count {sequences}"
        )
    single = sequences == documents  # one sequence per document (what the builder writes), if every step is 1
    for lo in range(0, documents, _STEP):
        steps = np.diff(doc_index[lo : min(lo + _STEP, documents) + 1])
        if int(steps.min()) < 0:
            bad = lo + int(np.argmax(steps < 0)) + 1
            raise DataError(f"{name}: document indices are not monotone (entry {bad} is below entry {bad - 1})")
        single = single and int(steps.min()) == 1
    opens = None
    if not single:  # which sequences start a document (those may start anywhere)
        opens = np.zeros(sequences + 1, np.bool_)
        opens[doc_index[:-1]] = True
    shift = dtype.itemsize.bit_length() - 1  # itemsizes are powers of two: shifts, not divisions
    firsts = np.empty(sequences, np.int64)  # each sequence's first token
    sizes = np.empty(sequences, np.int64)
    previous_end = 0
    for lo in range(0, sequences, _STEP):
        hi = min(lo + _STEP, sequences)
        _check_sequences(name, data, dtype, lengths, pointers, lo, hi, opens, previous_end, sizes[lo:hi])
        np.right_shift(pointers[lo:hi], shift, out=firsts[lo:hi])
        previous_end = int(pointers[hi - 1]) + (int(sizes[hi - 1]) << shift)
    if previous_end != data.size:
        raise DataError(_uncovered(name, data, f"its sequences end at byte {previous_end} of {data.size}"))
    if single:
        return firsts, sizes
    first, last = doc_index[:-1], doc_index[1:]
    held = last > first  # an empty document starts at 0 (it has no token to point at)
    starts = np.zeros(documents, np.int64)
    totals = np.zeros(documents, np.int64)
    starts[held] = firsts[first[held]]
    tail = last[held] - 1  # each document's last sequence: contiguous, so the document ends where it does
    totals[held] = firsts[tail] + sizes[tail] - starts[held]
    return starts, totals


def _check_sequences(
    name: str,
    data: ByteSource,
    dtype: np.dtype[Any],
    lengths: Any,
    pointers: Any,
    lo: int,
    hi: int,
    opens: npt.NDArray[np.bool_] | None,
    previous_end: int,
    sizes: npt.NDArray[np.int64],
) -> None:
    """Check sequences *lo*..*hi* (lengths >= 0, pointers aligned, monotone, in range, each right after the one before).

    Their lengths are left in *sizes*; *previous_end* is where sequence ``lo - 1`` ends.
    """
    itemsize = dtype.itemsize
    sizes[:] = lengths[lo:hi]
    where = np.array(pointers[lo:hi])  # aligned: the .idx arrays sit at odd offsets
    if int(sizes.min()) < 0:
        raise DataError(f"{name}: sequence {lo + int(np.argmin(sizes))} has a negative length {int(sizes.min())}")
    if int(where.min()) < 0 or int(np.bitwise_or.reduce(where)) & (itemsize - 1):
        bad = lo + int(np.argmax((where < 0) | (where & (itemsize - 1) != 0)))
        raise DataError(f"{name}: pointer {int(pointers[bad])} of sequence {bad} is not a {dtype.name} offset >= 0")
    behind = bool(lo) and int(where[0]) < int(pointers[lo - 1])  # the block's first sequence, against the last one
    if behind or (where.size > 1 and bool((where[1:] < where[:-1]).any())):
        bad = lo + (0 if behind else int(np.argmax(where[1:] < where[:-1])) + 1)
        raise DataError(f"{name}: pointers are not monotone (sequence {bad} starts before sequence {bad - 1})")
    if int(where.max()) > data.size:  # before any sum: a pointer near 2**63 would wrap int64
        bad = lo + int(np.argmax(where > data.size))
        raise DataError(
            f"{name}: pointer {int(pointers[bad])} of sequence {bad} is past the end of {data.name} ({data.size} bytes): "
            "out of range"
        )
    ends = where + sizes * itemsize  # each term below 2**62: no overflow
    if int(ends.max()) > data.size:
        bad = lo + int(np.argmax(ends > data.size))
        raise DataError(
            f"{name}: sequence {bad} ends at byte {int(ends[bad - lo])}, past the end of {data.name} "
            f"({data.size} bytes): out of range"
        )
    follows = np.empty_like(where)  # where each sequence must start: right after the one before (the builder's layout)
    follows[0] = previous_end
    follows[1:] = ends[:-1]
    gap = where != follows
    if not gap.any():
        return
    bad = lo + int(np.argmax(gap))
    if bad and opens is not None and not opens[bad]:
        raise DataError(
            f"{name}: sequence {bad} does not start where sequence {bad - 1} of the same document ends; "
            "a document's sequences must be contiguous in .bin"
        )
    raise DataError(_uncovered(name, data, f"sequence {bad} starts at byte {int(where[bad - lo])}, not at byte "
                               f"{int(follows[bad - lo])} where the one before ends"))  # fmt: skip


def _uncovered(name: str, data: ByteSource, how: str) -> str:
    return (
        f"{name} does not cover {data.name} exactly ({how}); Megatron's builder writes every sequence right after the "
        "one before and the index to the end of the data, so these two files do not belong together: pair the .bin "
        "with its own .idx"
    )


def _tokens(data: ByteSource, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The ``.bin`` tokens as uint16 or uint32: mapped where the bytes allow, checked for negative ids."""
    count = data.size // dtype.itemsize
    raw = data.array(dtype, 0, count)
    if dtype.name == "uint16":
        return raw  # type: ignore[no-any-return]
    if dtype.kind == "i":
        for lo in range(0, count, _BLOCK):
            block = raw[lo : lo + _BLOCK]
            if int(block.min()) < 0:
                bad = lo + int(np.argmax(block < 0))
                raise DataError(f"{data.name}: token {bad} is the negative id {int(raw[bad])}; token ids are >= 0")
    if dtype.name == "int32":
        return raw.view(np.dtype("<u4"))  # type: ignore[no-any-return]  # the same bytes: no copy
    if dtype.itemsize == 8 and count and int(raw.max()) >= 1 << 32:
        raise DataError(f"{data.name}: token id {int(raw.max())} does not fit uint32; streambatch stores ids below 2**32")
    return np.asarray(raw, dtype=np.uint16 if dtype.itemsize < 4 else np.uint32)
