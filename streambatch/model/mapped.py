"""Memory-map a file read-only without keeping a file descriptor open.

``numpy.memmap`` (through Python's ``mmap``, before 3.13's ``trackfd``) keeps a
duplicate descriptor for every mapping, so a corpus of a thousand shards hits
the usual ``ulimit -n 1024``.  A mapping does not need its descriptor: here the
file is mapped with the C library's ``mmap`` and the descriptor is the
caller's to close at once; the pages are unmapped when the last array viewing
them is gone.  The result is a read-only ``numpy.memmap`` with ``filename``,
``offset`` and ``mode`` set, so stores pickle by name as before.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from typing import Any

import numpy as np

_FAILED = ctypes.c_void_p(-1).value


def _libc_mmap() -> tuple[Any, Any] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        map_, unmap = libc.mmap, libc.munmap
    except (OSError, AttributeError):
        return None
    map_.restype = ctypes.c_void_p
    map_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    unmap.restype = ctypes.c_int
    unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return map_, unmap


_LIBC = _libc_mmap() if ctypes.sizeof(ctypes.c_void_p) == 8 and hasattr(mmap, "PROT_READ") else None


def map_readonly(fd: int, dtype: np.dtype[Any], count: int, filename: str) -> Any:
    """The first *count* items of type *dtype* of the file open as *fd*, mapped read-only (a `numpy.memmap`).

    *fd* may be closed as soon as this returns.  The file must be at least
    ``count * dtype.itemsize`` bytes long (the caller checked its size); no items
    give an empty array.  Where the C library cannot be called, falls back to
    ``numpy.memmap`` (which keeps a descriptor).  Used by `streambatch.io.store`
    to open stores and by a pickled store to map its tokens again.

    >>> import tempfile, numpy as np
    >>> with tempfile.TemporaryFile() as handle:
    ...     _ = handle.write(np.arange(5, dtype=np.uint16).tobytes())
    ...     handle.flush()
    ...     tokens = map_readonly(handle.fileno(), np.dtype(np.uint16), 5, "tokens.bin")
    >>> tokens.tolist(), tokens.flags.writeable, tokens.filename
    ([0, 1, 2, 3, 4], False, 'tokens.bin')
    """
    size = count * dtype.itemsize
    if size == 0:  # nothing to map (mmap refuses an empty mapping)
        return np.zeros(0, dtype)
    if _LIBC is None:
        with os.fdopen(os.dup(fd), "rb") as handle:
            fallback: Any = np.memmap(handle, dtype=dtype, mode="r", shape=(count,))
        fallback.filename = filename
        return fallback
    map_, unmap = _LIBC
    address = map_(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), filename)
    pages: Any = (ctypes.c_char * size).from_address(address)
    unmapped = weakref.finalize(pages, unmap, address, size)  # when the last view of the pages is gone
    unmapped.atexit = False  # not at exit, while something may still read them: the process's end unmaps them
    array = np.frombuffer(pages, dtype=dtype, count=count)
    array.flags.writeable = False
    mapped: Any = array.view(np.memmap)
    mapped.filename, mapped.offset, mapped.mode = filename, 0, "r"
    return mapped
