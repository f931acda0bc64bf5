"""The seam the format readers read through: a file's size, a byte range, or a mapped array of it.

A reader of Megatron's or datatrove's files never opens a file itself: it asks
an *opener* (a callable, path -> `ByteSource`) for each file, then reads the
small fixed headers with `ByteSource.read` and every large part (sequence
lengths, pointers, document indices, tokens, end offsets, loss bytes) with
`ByteSource.array`, which a local file answers with a read-only memory map (no
bytes read until used) and an object in remote storage can answer with arrays
whose pages it fetches by range.  Nothing is read whole into Python objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ...errors import DataError
from ...model.mapped import map_readonly
from ..files import NotRegularFileError, open_regular, short_path


class ByteSource(Protocol):
    """One file of a dataset, read by range: what `open_megatron` and `open_datatrove` need of storage."""

    @property
    def name(self) -> str:
        """The file as messages name it (a path, or an object's URL)."""
        ...

    @property
    def size(self) -> int:
        """The file's size in bytes."""
        ...

    def read(self, offset: int, length: int) -> bytes:
        """*length* bytes from *offset* (fewer only past the end)."""
        ...

    def array(self, dtype: np.dtype[Any], offset: int, count: int) -> Any:
        """*count* items of *dtype* from byte *offset*: a read-only array (mapped, not read, where storage allows)."""
        ...

    def identity(self) -> Any:
        """What tells this version of the file from another (local: device and inode; remote: size and ETag)."""
        ...


#: How a reader opens each file: ``opener(path, required)`` gives its `ByteSource`, or None when the file is
#: missing and not *required* (a missing required file is a `DataError` naming it).
Opener = Callable[[str, bool], "ByteSource | None"]


def local_file(path: str, required: bool = True) -> LocalFile | None:
    """The default `Opener`: the local file at *path* (None if it is missing and not *required*)."""
    if not required and not os.path.lexists(path):
        return None
    return LocalFile(path)


def open_required(opener: Opener, path: str) -> ByteSource:
    """The file at *path* through *opener*; a missing one is the opener's `DataError`."""
    source = opener(path, True)
    if source is None:
        raise DataError(f"{short_path(path)}: missing; check the path (a dataset needs all of its files)")
    return source


class LocalFile:
    """A local regular file as a `ByteSource`: `array` views one read-only memory map of the whole file.

    The map is made once, at the first `array`, without keeping a descriptor
    open (`streambatch.model.mapped.map_readonly`); `read` opens the file for the
    call.

    >>> import tempfile, pathlib, numpy as np
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
    >>> _ = path.write_bytes(b"ab" + np.arange(3, dtype="<u2").tobytes())
    >>> source = LocalFile(path)
    >>> source.size, source.read(0, 2), source.array(np.dtype("<u2"), 2, 3).tolist()
    (8, b'ab', [0, 1, 2])
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._shown = short_path(os.fspath(path))
        try:
            with open_regular(self.path) as handle:
                status = os.fstat(handle.fileno())
        except FileNotFoundError:
            raise DataError(f"{self._shown}: missing; check the path (a dataset needs all of its files)") from None
        except NotRegularFileError:
            raise DataError(f"{self._shown}: not a regular file; pass the dataset's files") from None
        except OSError as err:
            raise DataError(f"{self._shown}: cannot open ({err.strerror or err}); check the path and its permissions") from None
        self._size = int(status.st_size)
        self._identity = (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)
        self._bytes: Any = None

    @property
    def name(self) -> str:
        return self._shown

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        with open_regular(self.path) as handle:
            handle.seek(offset)
            return handle.read(length)

    def array(self, dtype: np.dtype[Any], offset: int, count: int) -> Any:
        end = offset + count * dtype.itemsize
        if offset < 0 or count < 0 or end > self._size:
            raise DataError(f"{self._shown}: bytes {offset}..{end} lie past its end ({self._size} bytes): truncated")
        if count == 0:
            return np.zeros(0, dtype)
        if offset == 0 and dtype.itemsize and self._size % dtype.itemsize == 0 and end == self._size:
            return self._whole(dtype)  # its own map: an np.memmap with filename set, so a store pickles by name
        if self._bytes is None:
            self._bytes = self._whole(np.dtype(np.uint8))
        view: Any = np.frombuffer(self._bytes, dtype=dtype, count=count, offset=offset)
        return view

    def _whole(self, dtype: np.dtype[Any]) -> Any:
        with open_regular(self.path) as handle:
            if os.fstat(handle.fileno()).st_size != self._size:
                raise DataError(f"{self._shown}: its size changed while it was being opened; open it again")
            mapped = map_readonly(handle.fileno(), dtype, self._size // dtype.itemsize, self.path)
        mapped.identity = self._identity[:2]
        return mapped

    def identity(self) -> Any:
        return self._identity
