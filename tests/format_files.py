"""Independent writers of Megatron's and datatrove's files, built from the formats' descriptions (struct and numpy).

They share no code with `streambatch.io.formats`: the tests write files with
these, read them with the library, and compare; and they compare the library's
written bytes with these.

Megatron (``IndexedDatasetBuilder``): ``.bin`` is the tokens in the builder's
dtype; ``.idx`` is ``b"MMIDIDX\\x00\\x00"``, ``<Q`` version 1, ``<B`` dtype code,
``<Q`` sequence count, ``<Q`` len(document_indices), then the int32 sequence
lengths, int64 byte pointers (cumulative) and int64 document indices (0, then
one entry per ``end_document``: the sequence count so far).

datatrove (``TokenizedFile``): ``.ds`` the tokens (uint16 or uint32),
``.ds.index`` one ``<Q`` per document, its end counted in tokens, ``.ds.loss``
one ``<?`` per token.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}


def builder_dtype(vocab_size: int | None) -> str:
    """``DType.optimal_dtype``: uint16 when the cardinality is below 65,500, else int32."""
    return "uint16" if vocab_size is not None and vocab_size < 65500 else "int32"


def megatron_files(documents: Sequence[Sequence[Sequence[int]]], dtype: str, *, code: int | None = None) -> tuple[bytes, bytes]:
    """``(bin, idx)`` for *documents*, each a list of sequences (lists of ids), as the builder writes them."""
    data = bytearray()
    lengths: list[int] = []
    document_indices = [0]
    itemsize = np.dtype(dtype).itemsize
    for sequences in documents:
        for sequence in sequences:  # add_item / add_document: the tokens, then the length
            data += np.array(sequence, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
            lengths.append(len(sequence))
        document_indices.append(len(lengths))  # end_document
    pointers, position = [], 0
    for length in lengths:
        pointers.append(position)
        position += length * itemsize
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_CODES[dtype] if code is None else code)
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(document_indices))
    idx += struct.pack(f"<{len(lengths)}i", *lengths)
    idx += struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(document_indices)}q", *document_indices)
    return bytes(data), idx


def write_megatron(prefix: Path, documents: Sequence[Sequence[Sequence[int]]], dtype: str) -> Path:
    """Write ``PREFIX.bin`` and ``PREFIX.idx``; returns the prefix."""
    data, idx = megatron_files(documents, dtype)
    prefix.with_name(prefix.name + ".bin").write_bytes(data)
    prefix.with_name(prefix.name + ".idx").write_bytes(idx)
    return prefix


def datatrove_files(
    documents: Sequence[Sequence[int]], token_size: int, masks: Sequence[Sequence[bool]] | None = None
) -> tuple[bytes, bytes, bytes | None]:
    """``(.ds, .ds.index, .ds.loss or None)`` for *documents*, as ``TokenizedFile`` writes them."""
    letter = "H" if token_size == 2 else "I"
    tokens = b"".join(struct.pack(f"<{len(d)}{letter}", *d) for d in documents)
    ends, position = [], 0
    for document in documents:
        position += len(document)
        ends.append(position)
    index = struct.pack(f"<{len(ends)}Q", *ends)
    loss = None if masks is None else b"".join(struct.pack(f"<{len(m)}?", *m) for m in masks)
    return tokens, index, loss


def write_datatrove(
    path: Path, documents: Sequence[Sequence[int]], token_size: int = 2, masks: Sequence[Sequence[bool]] | None = None
) -> Path:
    """Write ``NAME.ds``, ``NAME.ds.index`` (and ``NAME.ds.loss``); returns the ``.ds`` path."""
    tokens, index, loss = datatrove_files(documents, token_size, masks)
    path.write_bytes(tokens)
    Path(str(path) + ".index").write_bytes(index)
    if loss is not None:
        Path(str(path) + ".loss").write_bytes(loss)
    return path


def write_jsonl(
    path: Path,
    documents: Sequence[Sequence[int]],
    ids: Sequence[str] | None = None,
    masks: Sequence[Sequence[bool]] | None = None,
) -> Path:
    """The same documents as JSONL (ids ``"0", "1", ...`` unless given; *masks*: each one's ``loss_mask``)."""
    names = ids if ids is not None else [str(i) for i in range(len(documents))]
    records = [{"id": n, "tokens": list(map(int, d))} for n, d in zip(names, documents, strict=True)]
    for record, mask in zip(records, masks or (), strict=False):
        record["loss_mask"] = [bool(m) for m in mask]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def assert_same_epochs(source: object, reference: object, *, context_length: int, batch_size: int, seed: int | None) -> int:
    """The windows epoch and the packed epoch of *source* equal *reference*'s, batch by batch; returns the batches."""
    import dataclasses

    import streambatch as sb

    count = 0
    for pack in (False, True):
        mine = sb.Epoch(source, context_length=context_length, batch_size=batch_size, seed=seed, pack=pack)
        theirs = sb.Epoch(reference, context_length=context_length, batch_size=batch_size, seed=seed, pack=pack)
        assert (mine.item_count, len(mine)) == (theirs.item_count, len(theirs))
        for a, b in zip(mine, theirs, strict=True):
            assert a.inputs.tolist() == b.inputs.tolist()
            assert a.targets.tolist() == b.targets.tolist()
            assert a.token_count == b.token_count
            assert [dataclasses.replace(p, shard=0) for p in a.provenance] == list(b.provenance)  # a folder is sharded
            for name in ("segment_ids", "position_ids", "loss_mask", "cu_seqlens"):
                if hasattr(b, name):
                    assert np.array_equal(getattr(a, name), getattr(b, name)), name
            count += 1
    return count


class MemoryFile:
    """A `streambatch.io.formats.ByteSource` over bytes in memory (a stand-in for an object in remote storage).

    Records each ``read`` (offset, length), so a test can check that only headers are read as bytes.
    """

    def __init__(self, name: str, data: bytes) -> None:
        self.name, self._data, self.reads = name, data, []  # type: list[tuple[int, int]]

    @property
    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self._data[offset : offset + length]

    def array(self, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        return np.frombuffer(self._data, dtype=dtype, count=count, offset=offset)

    def identity(self) -> object:
        return (self.name, len(self._data))


def memory_opener(files: dict[str, bytes], opened: dict[str, MemoryFile]):
    """An opener over *files* (path -> bytes) that keeps each `MemoryFile` it makes in *opened*."""

    def opener(path: str, required: bool = True) -> MemoryFile | None:
        if path not in files:
            if required:
                raise KeyError(path)
            return None
        opened[path] = MemoryFile(path, files[path])
        return opened[path]

    return opener


DAMAGED_COPIES = 200  # per damage sweep: seconds in all
READ_SHARE = 0.08  # at least this share of damaged copies must still read (a flip in a value that does not matter)


def damage_sweep(
    seed: int, make: Callable[[Path, random.Random], tuple[Path, Path]], read: Callable[[Path], None], root: Path
) -> None:
    """`DAMAGED_COPIES` seeded damages, each a fresh copy: cut somewhere (half the time), then 1-4 bytes overwritten.

    *make*(folder, rng) writes a good input and returns ``(what to open, the file to damage)``; *read*(opened)
    reads it all.  Every copy must read or raise a `DataError` naming the damaged file; at least `READ_SHARE` of them
    read and as many are refused, so the sweep can never pass with every copy refused, or none.
    """
    from streambatch.errors import DataError

    rng = random.Random(seed)
    outcomes = {"read": 0, "refused": 0}
    for n in range(DAMAGED_COPIES):
        folder = root / f"copy-{n}"
        folder.mkdir()
        opened, victim = make(folder, rng)
        raw = bytearray(victim.read_bytes())
        if rng.random() < 0.5:
            raw = raw[: rng.randint(0, len(raw))]
        for _ in range(rng.randint(1, 4)):
            if raw:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        victim.write_bytes(bytes(raw))
        refusal: DataError | None = None
        try:
            read(opened)
        except DataError as err:
            refusal = err
        outcomes["read" if refusal is None else "refused"] += 1
        assert refusal is None or str(victim) in str(refusal), f"copy {n}: the refusal does not name {victim}: {refusal}"
    least = int(READ_SHARE * DAMAGED_COPIES)
    assert outcomes["read"] >= least, outcomes
    assert outcomes["refused"] >= least, outcomes
