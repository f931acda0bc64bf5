"""The flat `DocumentStore`: every document's tokens in one array, plus starts, lengths, ids, partitions.

A store keeps every document's tokens in one flat array (uint16 or uint32) plus
int64 ``starts``/``lengths``; ids and partitions ride alongside.  The store's
files on disk are `streambatch.io.store`'s business; this module is the model.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .._paths import short_path
from ..errors import DataError, StoreError
from .documents import PARTITIONS, Document, Partition
from .flat import Flat
from .ids import IdLines, json_line
from .mapped import map_readonly
from .mask import BitArray, all_trained, check_loss_mask, pack_mask, unpack_range
from .validate import check_id, check_offsets, check_tokens, check_unique

TokenArray = npt.NDArray[np.uint32] | npt.NDArray[np.uint16]
_BLOCK = 1 << 24  # tokens hashed or scanned per step: bounded temporaries


def smallest_token_dtype(max_token: int) -> type[np.unsignedinteger[Any]]:
    """uint16 when every id fits, else uint32.

    >>> smallest_token_dtype(50_256).__name__, smallest_token_dtype(70_000).__name__
    ('uint16', 'uint32')
    """
    return np.uint16 if max_token < (1 << 16) else np.uint32


@dataclass(frozen=True, eq=False)
class DocumentStore:
    """Documents as one flat token array plus per-document starts, lengths, ids, partitions.

    ``tokens`` may be an in-memory array or a read-only memory map (see
    `streambatch.open_store`).  A store never copies token data to select or view.
    ``tokenizer`` is what made a prepared store (its header's entry: name, kind,
    file_hash, vocab_size, eos_id, bos_id), or None.  ``loss_bits`` is the loss
    mask, one bit per token of the flat token space (`streambatch.model.mask`;
    a document's first bit always clear), or None: every target trains.

    >>> store = DocumentStore.from_arrays([0, 10, 11, 12, 1, 0, 20, 21, 1], [0, 5, 9])
    >>> store.ids, store.lengths.tolist(), store.document(1).tokens.tolist()
    (('0', '1'), [5, 4], [0, 20, 21, 1])
    """

    tokens: TokenArray
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    ids: Sequence[str]  # a tuple, or a store file's `IdLines` (decoded on access)
    partition_codes: npt.NDArray[np.uint8]
    fingerprint: str | None = None
    tokenizer: dict[str, Any] | None = None
    loss_bits: BitArray | None = None

    @classmethod
    def from_documents(cls, documents: Iterable[Document]) -> DocumentStore:
        """Build an in-memory store from any iterable of documents, consumed lazily once.

        Duplicate ids are rejected naming both places (each document's ``where``,
        else its position).

        >>> DocumentStore.from_documents(d for d in [Document("a", "train", [1, 2])]).ids
        ('a',)
        """
        arrays: list[npt.NDArray[np.uint32]] = []
        ids: list[str] = []
        labels: list[str] = []
        masks: list[npt.NDArray[np.bool_] | None] = []
        codes = bytearray()
        for index, doc in enumerate(documents):
            if not isinstance(doc, Document):
                raise DataError(
                    f"document index {index}: got {type(doc).__name__}; pass streambatch.Document objects or a DocumentStore"
                )
            arrays.append(doc.tokens)
            masks.append(doc.loss_mask)
            ids.append(doc.id)
            labels.append(doc.where or f"document index {index}")
            codes.append(doc.partition.code)
        check_unique(ids, labels)
        bits = None
        if any(m is not None for m in masks):
            bits = pack_mask(
                np.concatenate([all_trained(a.size) if m is None else m for a, m in zip(arrays, masks, strict=True)])
            )
        lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        starts = np.zeros(len(arrays), dtype=np.int64)
        if len(arrays) > 1:
            np.cumsum(lengths[:-1], out=starts[1:])
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.uint32)
        partition_codes = np.frombuffer(bytes(codes), dtype=np.uint8).copy()
        return cls.from_checked(
            tokens.astype(np.uint32, copy=False), starts, lengths, tuple(ids), partition_codes, loss_bits=bits
        )

    @classmethod
    def from_arrays(
        cls,
        tokens: Any,
        offsets: Any,
        ids: Sequence[str] | None = None,
        partition: Partition | str | Sequence[Partition | str] = Partition.TRAIN,
        *,
        loss_mask: Any = None,
    ) -> DocumentStore:
        """Build a store from a flat token array and ``len(documents) + 1`` offsets.

        Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.  *ids* default to
        ``"0", "1", ...``; *partition* is one partition for all or one per document.
        uint16 token arrays stay uint16; every other integer array becomes uint32.
        *loss_mask* (one bool per token, True = trains as a target) is kept as bits;
        each document's position 0 is never a target, whatever its entry says.

        >>> store = DocumentStore.from_arrays([0, 5, 6, 7, 0, 8, 9], [0, 4, 7], loss_mask=[1, 0, 1, 1, 1, 1, 0])
        >>> store.document(0).loss_mask.astype(int).tolist(), store.document(1).loss_mask.astype(int).tolist()
        ([0, 0, 1, 1], [0, 1, 0])
        """
        token_array = _token_array(tokens)
        offs = np.asarray(offsets)
        if offs.ndim != 1 or offs.size == 0 or offs.dtype.kind not in "ui":
            raise DataError(
                f"offsets has dtype {offs.dtype} and shape {offs.shape}; pass a 1-D integer array "
                "of len(documents) + 1 offsets starting at 0"
            )
        offs = check_offsets(offs, int(token_array.size), "offsets")  # uint64 beyond int64 is rejected, not wrapped
        count = offs.size - 1
        if ids is None:
            id_tuple = tuple(str(i) for i in range(count))
        else:
            id_tuple = tuple(ids)
            if len(id_tuple) != count:
                raise DataError(
                    f"ids has {len(id_tuple)} entries but offsets describe {count} documents; pass one id per document"
                )
            for index, value in enumerate(id_tuple):
                check_id(value, f"document index {index}")
            check_unique(list(id_tuple), [f"document index {i}" for i in range(count)])
        if isinstance(partition, (Partition, str)):
            codes = np.full(count, Partition.parse(partition).code, dtype=np.uint8)
        else:
            parts = list(partition)
            if len(parts) != count:
                raise DataError(
                    f"partition has {len(parts)} entries for {count} documents; pass one per document or a single partition"
                )
            codes = np.fromiter(
                (Partition.parse(p, f"document index {i}").code for i, p in enumerate(parts)),
                dtype=np.uint8,
                count=count,
            )
        bits = None
        if loss_mask is not None:
            mask = check_loss_mask(loss_mask, int(token_array.size), "loss_mask")
            mask[offs[:-1][offs[:-1] < offs[1:]]] = False  # each document's position 0
            bits = pack_mask(mask)
        return cls.from_checked(token_array, offs[:-1].copy(), np.diff(offs), id_tuple, codes, loss_bits=bits)

    @classmethod
    def from_checked(
        cls,
        tokens: Any,
        starts: Any,
        lengths: Any,
        ids: Sequence[str],
        codes: Any,
        fingerprint: str | None = None,
        tokenizer: dict[str, Any] | None = None,
        loss_bits: BitArray | None = None,
    ) -> DocumentStore:
        """A store of arrays already checked (by `from_arrays`, or read from a store file), made read-only."""
        for array in (starts, lengths, codes):
            array.flags.writeable = False
        for flat in (tokens, loss_bits):
            if isinstance(flat, np.ndarray) and flat.flags.writeable and flat.flags.owndata:
                flat.flags.writeable = False
        return cls(tokens, starts, lengths, ids, codes, fingerprint, tokenizer, loss_bits)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        kind = "memory-mapped" if isinstance(self.tokens, np.memmap) else "in-memory"
        return (
            f"DocumentStore({len(self)} documents, {self.token_count} tokens, {self.tokens.dtype.name}, {kind}, "
            f"fingerprint={self.fingerprint!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # a memory-mapped store pickles as its file name (e.g. for DataLoader workers
        # started with "spawn"), never as a copy of its tokens
        tokens = self.tokens
        bits = None if self.loss_bits is None else np.asarray(self.loss_bits)
        fields = (self.starts, self.lengths, self.ids, self.partition_codes, self.fingerprint, self.tokenizer, bits)
        if isinstance(tokens, np.memmap) and tokens.filename is not None and tokens.offset == 0:
            spec = (str(tokens.filename), tokens.dtype.str, int(tokens.size), getattr(tokens, "identity", None))
            return (_reopen_memmap, (spec, *fields))
        return (DocumentStore.from_checked, (tokens, *fields))

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """``len(self) + 1`` offsets into ``tokens`` (for contiguous stores; a `select` view may have gaps).

        >>> DocumentStore.from_arrays([1, 2, 3], [0, 1, 3]).offsets.tolist()
        [0, 1, 3]
        """
        ends = self.starts + self.lengths
        if self.starts.size and not np.array_equal(self.starts[1:], ends[:-1]):
            raise DataError("this store view is not contiguous (documents were selected); use starts and lengths")
        return np.concatenate([self.starts[:1] if self.starts.size else np.zeros(1, np.int64), ends])

    @property
    def token_count(self) -> int:
        """Tokens over all documents of this store (view)."""
        return int(self.lengths.sum())

    @property
    def flat_size(self) -> int:
        """Size of the flat token space that window positions index (``tokens.size``)."""
        return int(self.tokens.size)

    # -- closing ------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether `close` was called: every road to its batches then refuses (`ConfigError`)."""
        return bool(self.__dict__.get("_closed", False))

    def close(self) -> None:
        """Close the store: a remote store's requests in flight are waited for and its memory is given back (see
        `streambatch.io.remote.tokens`); its batches are refused from now on.  Closing again does nothing.

        >>> with DocumentStore.from_arrays([0, 10, 11, 1], [0, 4]) as store:
        ...     store.closed
        False
        >>> store.closed
        True
        """
        object.__setattr__(self, "_closed", True)  # a state, not a field (a view or a pickle is open)
        remote = getattr(self.tokens, "close", None)  # remote tokens close their file; local arrays have nothing to
        if callable(remote):
            remote()

    def __enter__(self) -> DocumentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def has_loss_mask(self) -> bool:
        """Whether this store carries a loss mask (without one, every target trains)."""
        return self.loss_bits is not None

    @property
    def dtype(self) -> np.dtype[Any]:
        """Token dtype (uint16 or uint32): the dtype of every batch gathered from this store."""
        return self.tokens.dtype

    def flat(self) -> Flat:
        """The flat token space these documents sit in (`streambatch.model.flat`): one shard, at base 0.

        >>> DocumentStore.from_arrays([5, 6, 7, 8], [0, 1, 4]).flat().bases.tolist()
        [0, 4]
        """
        found: Flat | None = self.__dict__.get("_flat")
        if found is None:
            found = Flat.of_store(self.tokens, self.starts, len(self), self.loss_bits)
            object.__setattr__(self, "_flat", found)  # a cache, not a field
        return found

    @property
    def shards(self) -> tuple[DocumentStore, ...]:
        """The stores behind this source: the store itself (a `streambatch.Corpus` has several)."""
        return (self,)

    def window_tokens(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[Any]:
        """``(n, length)`` tokens starting at flat *positions* (a plain gather, for checks such as the audit).

        >>> DocumentStore.from_arrays([5, 6, 7, 8], [0, 4]).window_tokens([2, 0], 2).tolist()
        [[7, 8], [5, 6]]
        """
        return self.flat().window_tokens(positions, length)

    def target_mask(self, positions: npt.ArrayLike, length: int) -> npt.NDArray[np.bool_] | None:
        """``(n, length)`` loss-mask bits of the targets of rows starting at flat *positions*; None without a mask.

        >>> store = DocumentStore.from_arrays([0, 5, 6, 7, 8], [0, 5], loss_mask=[0, 0, 1, 1, 0])
        >>> store.target_mask([0, 1], 3).astype(int).tolist()
        [[0, 1, 1], [1, 1, 0]]
        """
        return self.flat().target_mask(positions, length)

    def mask_at(self, positions: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """The loss-mask bit of each flat token position (all True without a mask)."""
        return self.flat().mask_at(positions)

    def shard_of(self, document_indices: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Shard of each document: always 0 (a store is one shard; see `streambatch.Corpus`)."""
        return np.zeros(np.shape(document_indices), dtype=np.int64)

    def content_fingerprint(self) -> str:
        """``fingerprint`` if the store has one (opened from disk), else the same hash computed from content.

        Equal to the fingerprint `write_store` records for the same documents, so
        an in-memory store and its copy on disk share plan files.  Computed once
        (one pass over the tokens), then remembered.

        >>> docs = [Document("a", "train", [0, 10, 11, 12, 1])]
        >>> DocumentStore.from_documents(docs).content_fingerprint()[:12]
        'blake2b-256:'
        """
        if self.fingerprint is not None:
            return self.fingerprint
        known: str | None = self.__dict__.get("_content_fingerprint")
        if known is None:
            offsets = np.zeros(len(self) + 1, dtype="<i8")
            np.cumsum(self.lengths, out=offsets[1:])
            dtype = np.dtype(smallest_token_dtype(self._max_token()) if self.tokens.dtype != np.uint16 else np.uint16)
            blocks = (piece.astype(dtype.newbyteorder("<"), copy=False) for piece in self._pieces())
            known = content_fingerprint(blocks, [offsets], self.ids, self.partition_codes, mask_blocks=self._mask_blocks())
            object.__setattr__(self, "_content_fingerprint", known)  # a cache, not a field
        return known

    def _pieces(self) -> Iterator[npt.NDArray[Any]]:
        """Every document's tokens in order, in bounded blocks (the flat array itself when contiguous)."""
        if not len(self):
            return
        ends = self.starts + self.lengths
        contiguous = int(self.starts[0]) == 0 and np.array_equal(self.starts[1:], ends[:-1]) and int(ends[-1]) == self.tokens.size
        spans = [(0, int(self.tokens.size))] if contiguous else zip(self.starts.tolist(), ends.tolist(), strict=True)
        for start, end in spans:
            for lo in range(start, end, _BLOCK):
                yield self.tokens[lo : min(lo + _BLOCK, end)]

    def _mask_blocks(self) -> list[BitArray] | None:
        """The mask bits as `write_store` writes them (the documents' tokens, contiguous), for the fingerprint."""
        if self.loss_bits is None:
            return None
        ends = self.starts + self.lengths
        if not len(self) or (int(self.starts[0]) == 0 and np.array_equal(self.starts[1:], ends[:-1])):
            return [np.asarray(self.loss_bits[: (int(ends[-1]) + 7) >> 3 if len(self) else 0])]
        return [pack_mask(np.concatenate([self.loss_mask(i) for i in range(len(self))]))]

    def loss_mask(self, index: int) -> npt.NDArray[np.bool_]:
        """Document *index*'s effective loss mask (position 0 False; every other True without a store mask)."""
        start, length = int(self.starts[index]), int(self.lengths[index])
        mask: npt.NDArray[np.bool_] = unpack_range(self.loss_bits, start, length).copy()
        mask[:1] = False
        return mask

    def _max_token(self) -> int:
        return max((int(piece.max()) for piece in self._pieces() if piece.size), default=-1)

    def partition(self, index: int) -> Partition:
        """The partition of document *index*."""
        return PARTITIONS[int(self.partition_codes[index])]

    def document(self, index: int) -> Document:
        """Document *index* as a `Document` (its tokens copied to uint32)."""
        start, length = int(self.starts[index]), int(self.lengths[index])
        mask = None if self.loss_bits is None else self.loss_mask(index)
        return Document(self.ids[index], self.partition(index), self.tokens[start : start + length], mask)

    def __iter__(self) -> Iterator[Document]:
        return (self.document(i) for i in range(len(self)))

    def select(self, partition: Partition | str) -> DocumentStore:
        """A view of the documents in one partition (tokens are shared, not copied).

        >>> store = DocumentStore.from_arrays([1, 2, 3, 4], [0, 2, 4], partition=["train", "test"])
        >>> store.select("test").ids
        ('1',)
        """
        code = Partition.parse(partition).code
        keep = np.flatnonzero(self.partition_codes == code)
        return DocumentStore.from_checked(
            self.tokens,
            self.starts[keep],
            self.lengths[keep],
            tuple(self.ids[i] for i in keep.tolist()),
            self.partition_codes[keep],
            self.fingerprint,
            self.tokenizer,
            self.loss_bits,
        )


def content_fingerprint(
    token_blocks: Iterable[Any],
    offset_blocks: Iterable[Any],
    ids: Sequence[str],
    codes: npt.NDArray[np.uint8],
    *,
    id_lines: Iterable[bytes] | None = None,
    mask_blocks: Iterable[Any] | None = None,
) -> str:
    """``blake2b-256:`` + BLAKE2b-256 of the token bytes, the offset bytes, then ids and partition codes as JSON.

    A store with a loss mask hashes its packed bits last, after ``,loss_mask:``
    (*mask_blocks*); a store without one hashes exactly what it always did.

    The one definition of a store's fingerprint: `open_store` and `write_store`
    feed it the files' bytes, `DocumentStore.content_fingerprint` an in-memory
    store's arrays (little-endian, the dtype `write_store` would choose).  The JSON
    is ``json.dumps([ids, codes], separators=(",", ":"))``, hashed as it is made
    (from *id_lines*, each id's ``json.dumps``, when given instead of *ids*).
    """
    digest = hashlib.blake2b(digest_size=32)
    for block in itertools.chain(token_blocks, offset_blocks):
        digest.update(np.ascontiguousarray(block).view(np.uint8).data if isinstance(block, np.ndarray) else block)
    lines = id_lines if id_lines is not None else ids.lines() if isinstance(ids, IdLines) else map(json_line, ids)
    digest.update(b"[[")
    for index, line in enumerate(lines):
        digest.update(b"," + line if index else line)
    digest.update(b"],[")
    flat = np.asarray(codes, dtype=np.uint8).ravel()
    for lo in range(0, flat.size, _BLOCK):
        part = flat[lo : lo + _BLOCK]
        text = np.full(2 * part.size, ord(","), dtype=np.uint8)
        text[0::2] = part + ord("0")  # codes are 0, 1, 2: one digit each
        digest.update(text[: -1 if lo + part.size == flat.size else None].data)
    digest.update(b"]]")
    if mask_blocks is not None:
        digest.update(b",loss_mask:")
        for block in mask_blocks:
            digest.update(np.ascontiguousarray(block).view(np.uint8).data if isinstance(block, np.ndarray) else block)
    return "blake2b-256:" + digest.hexdigest()


def _reopen_memmap(spec: tuple[str, str, int, Any], *fields: Any) -> DocumentStore:
    filename, dtype, size, identity = spec
    with open(filename, "rb") as handle:
        stat = os.fstat(handle.fileno())
        if identity is not None and (stat.st_dev, stat.st_ino) != tuple(identity):
            raise StoreError(
                f"{short_path(filename)}: the store was replaced after this process opened it (a pickled store, e.g. in a "
                "DataLoader worker, must map the same files); reopen it with streambatch.open_store"
            )
        tokens = map_readonly(handle.fileno(), np.dtype(dtype), size, filename)  # no descriptor kept
    tokens.identity = identity
    return DocumentStore.from_checked(tokens, *fields)


def _token_array(tokens: Any) -> TokenArray:
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.uint16 and tokens.ndim == 1:
        return tokens
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.uint32 and tokens.ndim == 1:
        return tokens
    return check_tokens(tokens, "tokens")
