"""What a `StoreWriter` records per document, written to its temporary directory as it goes, not kept in memory.

Ids go to ``ids.jsonl``, partition codes to ``partitions.bin`` and offsets to
``offsets.bin`` as documents arrive, and each document's label (how errors name
it) to a side file; memory holds the ids' 64-bit hashes only (`IdHashes`, 8
bytes per document), so a writer of 10**7 documents needs ~80 MB, not gigabytes.
A repeated id is confirmed, and its first place found, by reading the files back
(only then).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from ..model.ids import IdHashes, IdLines, hashes_of, json_line
from ..model.validate import duplicate_id
from .store_header import IDS, OFFSETS, PARTITIONS_FILE

LABELS = ".labels.jsonl"  # removed at `finish`: never part of a store
_READ = 1 << 22

Mark = tuple[int, int, int, int]


class DocumentLog:
    """Append-only ids, codes, offsets and labels of the documents written so far, in *folder*."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0  # documents
        self.tokens = 0  # the last offset
        self._hashes = IdHashes()
        self._files: dict[str, IO[bytes]] = {}
        for name in (IDS, PARTITIONS_FILE, OFFSETS, LABELS):
            self._files[name] = open(folder / name, "w+b")  # noqa: SIM115 - closed in finish/close
        self._files[OFFSETS].write(np.zeros(1, dtype="<i8").tobytes())

    def check(self, names: Sequence[str], labels: Sequence[str]) -> npt.NDArray[np.int64]:
        """Raise `DuplicateIdError` at the first of *names* that repeats an id (earlier, or before it in *names*).

        Returns the names' hashes, for `append`.
        """
        hashes = hashes_of(names, len(names))
        earlier, within = self._hashes.candidates(hashes)
        for index in np.flatnonzero(earlier | within).tolist():
            name = names[index]
            first = self._first_label(name) if earlier[index] else None
            if first is None and within[index]:
                first = next((labels[j] for j in range(index) if names[j] == name), None)
            if first is not None:
                duplicate_id(name, first, labels[index])
        return hashes

    def append(
        self,
        names: Sequence[str],
        labels: Sequence[str],
        codes: bytes,
        sizes: npt.NDArray[np.int64],
        hashes: npt.NDArray[np.int64],
    ) -> None:
        """Record documents (checked by `check`, their tokens written)."""
        if not names:
            return
        self._files[IDS].write(b"".join(json_line(n) + b"\n" for n in names))
        self._files[LABELS].write(b"".join(json_line(label) + b"\n" for label in labels))
        self._files[PARTITIONS_FILE].write(codes)
        ends = self.tokens + np.cumsum(sizes, dtype=np.int64)
        self._files[OFFSETS].write(ends.astype("<i8").tobytes())
        self._hashes.add(hashes)
        self.count += len(names)
        self.tokens = int(ends[-1])

    def mark(self) -> Mark:
        """A point to `rollback` to."""
        return self.count, self.tokens, self._files[IDS].tell(), self._files[LABELS].tell()

    def rollback(self, mark: Mark) -> None:
        """Forget every document recorded after *mark* (their hashes too: only their ids are read back)."""
        count, tokens, ids_at, labels_at = mark
        self._hashes.remove(np.fromiter((hash(json.loads(line)) for line in self._lines(IDS, ids_at)), dtype=np.int64))
        for name, size in ((IDS, ids_at), (LABELS, labels_at), (PARTITIONS_FILE, count), (OFFSETS, (count + 1) * 8)):
            handle = self._files[name]
            handle.flush()
            handle.truncate(size)
            handle.seek(0, os.SEEK_END)
        self.count, self.tokens = count, tokens

    def _lines(self, name: str, start: int = 0) -> Iterator[bytes]:
        """The lines of one of the files from byte *start* (without newlines), read back in blocks."""
        handle = self._files[name]
        handle.flush()
        end = handle.tell()
        handle.seek(start)
        rest = b""
        try:
            while handle.tell() < end:
                data = rest + handle.read(min(_READ, end - handle.tell()))
                lines = data.split(b"\n")
                rest = lines.pop()
                yield from lines
        finally:
            handle.seek(0, os.SEEK_END)

    def _first_label(self, name: str) -> str | None:
        """The label of the first document with id *name*, or None (a hash collision)."""
        target = json_line(name)
        index = next((i for i, line in enumerate(self._lines(IDS)) if line == target), None)
        if index is None:
            return None
        label: str = json.loads(next(line for i, line in enumerate(self._lines(LABELS)) if i == index))
        return label

    def finish(self) -> tuple[npt.NDArray[np.uint8], IdLines | None]:
        """Close the files and drop the labels: the partition codes, and the ids when few (for an inline header)."""
        for handle in self._files.values():
            handle.flush()
        codes = np.fromfile(self.folder / PARTITIONS_FILE, dtype=np.uint8)
        ids = IdLines.of((self.folder / IDS).read_bytes()) if self.count <= 1024 else None
        self.close()
        (self.folder / LABELS).unlink()
        self._hashes = IdHashes()
        return codes, ids

    def id_lines(self) -> Iterator[bytes]:
        """The ids' JSON lines from the (finished) ids file, in blocks: what the fingerprint hashes."""
        with open(self.folder / IDS, "rb") as handle:
            rest = b""
            while data := handle.read(_READ):
                lines = (rest + data).split(b"\n")
                rest = lines.pop()
                yield from lines

    def close(self) -> None:
        """Close the files (`StoreWriter.abort` removes the folder)."""
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
