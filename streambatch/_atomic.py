"""Write files atomically: to a temporary name beside the target, renamed into place at the end."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_text(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """Open a text file that appears at *path* only if the block finishes without error.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_text(target) as handle:
    ...     _ = handle.write("done\\n")
    >>> target.read_text()
    'done\\n'
    """
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=".streambatch-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
