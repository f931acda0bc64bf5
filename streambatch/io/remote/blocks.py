"""Block digests: every byte read from object storage is checked before it is used.

An upload (`streambatch.io.remote.upload`) records, for ``tokens.bin``, one
BLAKE2b-128 digest per `BLOCK` bytes (the last block shorter) in a
``digests.bin`` object, and in the header the digest of ``digests.bin`` itself
and of every small object (offsets, ids, partitions, the loss mask: read whole
at open, so each is one block); the store pointer records the header's digest.
So the pointer verifies the header, the header verifies everything else, and
nothing the server sends is trusted by its size or ETag alone.

A remote read of tokens is always of whole blocks: a range is widened to the
blocks it touches, those the cache holds (checked again) are taken from it,
the rest fetched in one GET and each checked against its digest before it is
written where a gather can read it.  A block that does not match is fetched
once more (a byte flipped in transit), then it is a `DataError` naming the
object and the block.  `BLOCK` equals the holds' slot
(`streambatch.io.remote.tokens.SLOT`), so a widened range is exactly the slots
its caller holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import DataError

BLOCK = 1 << 16  # bytes of tokens.bin per digest
DIGEST = 16  # bytes of each BLAKE2b digest
ALGORITHM = "blake2b-128"
DIGESTS = "digests.bin"  # the object of tokens.bin's block digests


def digest(data: bytes | memoryview) -> bytes:
    """The BLAKE2b-128 digest of *data* (one block, or a whole small object)."""
    return hashlib.blake2b(data, digest_size=DIGEST).digest()


def hex_digest(data: bytes | memoryview) -> str:
    """`digest` as hex (what headers and pointers record)."""
    return digest(data).hex()


def block_digests(path: Any) -> bytes:
    """The concatenated digests of every `BLOCK` of the file at *path* (read a block at a time)."""
    out = bytearray()
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            out += digest(block)
    return bytes(out)


def check_whole(where: str, data: bytes | memoryview, expected: Any) -> None:
    """*data* (a whole small object) against its recorded hex digest; `DataError` naming *where* when it differs."""
    if not isinstance(expected, str) or hex_digest(data) != expected:
        raise DataError(
            f"{where}: its bytes do not match the digest the store records ({ALGORITHM}); the object was changed or "
            "damaged in transit: upload the store again"
        )


@dataclass(frozen=True)
class Blocks:
    """The block digests of one ``tokens.bin``: what every fetched block is checked against."""

    digests: npt.NDArray[np.uint8]  # (blocks, DIGEST)
    nbytes: int

    @classmethod
    def parse(cls, where: str, data: bytes, nbytes: int) -> Blocks:
        """The digests of an object of *nbytes* bytes from ``digests.bin``'s *data* (its size checked)."""
        count = -(-nbytes // BLOCK)
        if len(data) != count * DIGEST:
            raise DataError(
                f"{where}: {len(data)} bytes, not the {count * DIGEST} of {count} block digests; upload the store again"
            )
        return cls(np.frombuffer(data, dtype=np.uint8).reshape(count, DIGEST), nbytes)

    def widen(self, lo: int, hi: int) -> tuple[int, int]:
        """``[lo, hi)`` widened to the blocks it touches."""
        return lo // BLOCK * BLOCK, min(-(-hi // BLOCK) * BLOCK, self.nbytes)

    def expected(self, index: int) -> bytes:
        """The digest of block *index*."""
        return bytes(self.digests[index])

    def bad_block(self, lo: int, data: memoryview) -> int | None:
        """The first block of *data* (whole blocks from byte *lo*) that does not match its digest, else None."""
        for offset in range(0, len(data), BLOCK):
            index = (lo + offset) // BLOCK
            if digest(data[offset : offset + BLOCK]) != self.expected(index):
                return index
        return None

    def refused(self, where: str, index: int) -> DataError:
        """The error for block *index* that did not match twice."""
        lo = index * BLOCK
        hi = min(lo + BLOCK, self.nbytes) - 1
        return DataError(
            f"{where}: block {index} (bytes {lo}-{hi}) does not match the store's {ALGORITHM} digest, fetched twice; "
            "the object was changed or is damaged: upload the store again"
        )
