"""The array over a remote token file's mapping, and the guard that keeps it unreadable outside held ranges.

`RemoteTokens` is what a remote store's ``tokens`` is (`streambatch.io.remote.tokens.TokenFile.array`);
`PROTECT` is libc's ``mprotect``, with which the file makes its mapping ``PROT_NONE`` except where a
caller holds a range (None where there is none: the mapping then stays readable).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from typing import Any

import numpy as np
import numpy.typing as npt

from .ranges import distinct, positions_of


def _mprotect() -> Any:
    """libc's ``mprotect`` (None where there is none: the mapping then stays readable)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        call = libc.mprotect
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    call.restype = ctypes.c_int
    return call


PROTECT = _mprotect() if hasattr(mmap, "PROT_READ") else None


class RemoteTokens(np.ndarray):
    """A read-only token array whose bytes a `TokenFile` fetches on demand; pickles as the file, not its bytes.

    The gathers read it through the buffer protocol, the bytes of each batch
    fetched first by the prefetcher.  Indexing it (``tokens[a:b]``, ``tokens[i]``,
    an index array: what ``store.document(i)`` and the tools do) fetches the bytes
    it reads, then and there, and returns a plain array of them: never the zeros
    of a range no batch fetched.
    """

    remote: Any  # the TokenFile (None: a plain array)

    def __array_finalize__(self, obj: Any) -> None:
        self.remote = getattr(obj, "remote", None)

    def __getitem__(self, key: Any) -> Any:
        remote, plain = self.remote, self.view(np.ndarray)
        if remote is None or self.ndim != 1:
            return plain[key]
        if plain.strides[0] != plain.itemsize:  # a strided view: fetch its whole span
            if not len(plain):
                return plain[key].copy()
            span = np.array([((len(plain) - 1) * plain.strides[0]) // plain.itemsize + 1])
            return self._read(plain, np.array([0]), span, lambda: plain[key].copy())
        if isinstance(key, (int, np.integer)):
            index = int(key) + (len(plain) if key < 0 else 0)
            if not 0 <= index < len(plain):
                return plain[key]  # numpy's IndexError
            return self._read(plain, np.array([index]), np.array([index + 1]), lambda: plain[index])
        if isinstance(key, slice):
            start, stop, step = key.indices(len(plain))
            if (step > 0 and start >= stop) or (step < 0 and start <= stop):
                return plain[key].copy()
            lo, hi = (start, stop) if step > 0 else (stop + 1, start + 1)
            return self._read(plain, np.array([lo]), np.array([hi]), lambda: plain[key].copy())
        picked = positions_of(key, len(plain))  # an index array or a mask: the positions it reads
        flat = distinct(picked.reshape(-1))
        if not flat.size:
            return plain[key].copy()
        cuts = np.flatnonzero(np.diff(flat) != 1) + 1
        starts, ends = flat[np.r_[0, cuts]], flat[np.r_[cuts - 1, flat.size - 1]] + 1
        return self._read(plain, starts, ends, lambda: plain[key].copy())

    def _read(self, plain: npt.NDArray[Any], starts: npt.NDArray[Any], ends: npt.NDArray[Any], take: Any) -> Any:
        """Fetch positions ``[starts, ends)`` of this array (counted from its first token, in the strides of its
        items), then return ``take()`` while they are held (released afterwards)."""
        remote = self.remote
        assert remote is not None
        remote._mapping()
        size = plain.itemsize
        first = (plain.ctypes.data - remote._address) // size  # this view's first token within the file
        lo = (np.asarray(starts, dtype=np.int64) + first) * size
        hi = (np.asarray(ends, dtype=np.int64) + first) * size
        slots = remote.hold(lo, hi)
        try:
            for future in remote.fetch(lo.tolist(), hi.tolist()):
                future.result()
            return take()
        finally:
            remote.release(slots)

    def __reduce__(self) -> tuple[Any, ...]:
        remote = self.remote
        if remote is not None and self.size == remote.count and self.ndim == 1:
            return (_reopen, (remote,))
        plain: tuple[Any, ...] = np.asarray(self[...] if remote is None else self[:]).__reduce__()  # type: ignore[assignment]
        return plain

    def close(self) -> None:
        """Close the file behind these tokens (`TokenFile.close`; what ``store.close()`` calls)."""
        if self.remote is not None:
            self.remote.close()

    def __repr__(self) -> str:  # never reads a token (most of them are unreadable until held)
        remote = self.remote
        where = "" if remote is None else f" of {remote.client.where.url}/{remote.name}"
        return f"RemoteTokens({self.size} {self.dtype.name} tokens{where})"

    __str__ = __repr__


def _reopen(remote: Any) -> RemoteTokens:
    tokens: RemoteTokens = remote.array()
    return tokens


def remote_file(tokens: Any) -> Any:
    """The `TokenFile` behind a store's *tokens*, or None for local tokens."""
    return getattr(tokens, "remote", None) if isinstance(tokens, RemoteTokens) else None
