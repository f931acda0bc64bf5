"""Open an input file for reading without ever waiting on it, and show paths short in messages.

`open_regular` is the one way streambatch opens a file it reads (inputs, store
files, manifests, plan and state headers, tokenizer files): opened non-blocking
(a FIFO with no writer would otherwise block ``open`` forever), then checked
with ``fstat`` to be a regular file, so a FIFO, ``/dev/zero``, a terminal or a
socket is refused at once instead of hanging or reading forever.  Every failure
is an `OSError` with ``strerror`` set (a path holding a NUL byte too), so each
caller keeps its own message and error class.

`short_path` (defined in `streambatch._paths`, re-exported here) is how a path
appears in a message: relative to the working folder when that is shorter, and
elided in the middle when very long.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import IO

from .._paths import LONG_PATH, short_path
from .._paths import printable as _printable
from ..errors import NotRegularFileError

__all__ = ["LONG_PATH", "NotRegularFileError", "check_regular", "open_regular", "short_path"]


def open_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> IO[bytes]:
    """Open *path* (relative to *dir_fd* if given) read-only as a regular file; anything else raises `OSError`.

    >>> import tempfile, pathlib
    >>> file = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = file.write_bytes(b"hi")
    >>> with open_regular(file) as handle:
    ...     handle.read()
    b'hi'
    >>> open_regular("/dev/zero")
    Traceback (most recent call last):
    ...
    streambatch.errors.NotRegularFileError: [Errno 22] not a regular file (a character device): '/dev/zero'
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except ValueError:  # "embedded null byte"
        raise OSError(errno.EINVAL, "the path holds a NUL byte", _printable(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(errno.EINVAL, f"not a regular file ({_kind(mode)})", os.fspath(path))
        os.set_blocking(fd, True)  # reads of a regular file never block anyway; plain semantics from here
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular(path: str | os.PathLike[str]) -> None:
    """Raise `OSError` unless *path* opens as a regular file (for a library that opens the path itself)."""
    open_regular(path).close()


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a file"
