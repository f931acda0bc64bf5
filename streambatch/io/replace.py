"""Put a finished store directory in place atomically: ``renameat2`` where the system has it, two renames where not.

No directory at the target: ``renameat2(RENAME_NOREPLACE)`` (or ``rename``).  One
there: ``renameat2(RENAME_EXCHANGE)`` swaps the two in one atomic step (readers
see the old directory or the new one, never neither), then the old one, now
under the temporary name, is removed.  Only where renameat2 is unavailable
(other systems, filesystems that refuse the flag): the old directory is renamed
aside as ``.NAME.old-PID-XXXXXXXX``, the new one into place, and the old one
removed; a kill between those two renames leaves nothing at the target, the
old directory still whole under the ``.old-`` name (removed by a later writer,
`streambatch.io.atomic.remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .atomic import fsync_path, partial_prefix, temporary_name
from .files import short_path

# renameat2(2) flags and the "current directory" fd, from <linux/fs.h> and <fcntl.h>
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _AT_FDCWD = 1, 2, -100


def _load_renameat2() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.3
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2_function = _load_renameat2()


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    """renameat2(source, target, flags): True when done, False when unavailable here (then fall back).

    Unavailable: no such libc function, or the kernel or filesystem refuses the flag
    (ENOSYS, EINVAL, EOPNOTSUPP).  Other failures raise the matching OSError.
    """
    function = _renameat2_function
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), os.fspath(target))


def _no_step(name: str) -> None:
    pass


def replace_directory(
    tmp: Path,
    path: Path,
    *,
    replaceable: Callable[[Path], bool],
    refusal: str,
    step: Callable[[str], None] = _no_step,
) -> None:
    """Put the finished directory *tmp* at *path*; *tmp* is gone afterwards.

    What is at *path* is replaced only if *replaceable* (else ``StoreError(f"{short_path(path)}: {refusal}")``,
    nothing touched).  *step* is called with each step's name (``placed``,
    ``exchanged``, ``moved-aside``, ``removed``): a test hook.  Concurrent writers
    race by retrying: the last swap wins and nobody fails.
    """
    for _ in range(1000):  # repeats only while concurrent writers keep creating and removing the target
        if not os.path.lexists(path):
            try:
                if not _renameat2(tmp, path, _RENAME_NOREPLACE):
                    os.rename(tmp, path)  # refuses a non-empty directory at path: then we swap with it below
            except OSError as err:
                if err.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue
                raise
            step("placed")
            break
        if not replaceable(path):
            raise StoreError(f"{short_path(path)}: {refusal}")
        try:
            exchanged = _renameat2(tmp, path, _RENAME_EXCHANGE)
        except FileNotFoundError:
            continue  # removed between our check and the swap (a fallback writer): place ours
        if exchanged:
            if not replaceable(tmp):  # something else appeared at path after the check: put it back, touch nothing
                _renameat2(tmp, path, _RENAME_EXCHANGE)
                raise StoreError(f"{short_path(path)}: {refusal}")
            step("exchanged")
            shutil.rmtree(tmp, ignore_errors=True)
            break
        old = temporary_name(path.parent, partial_prefix(path, "old"))
        try:
            os.rename(path, old)
        except FileNotFoundError:
            continue
        step("moved-aside")
        try:
            os.rename(tmp, path)
        except OSError as err:
            if err.errno in (errno.EEXIST, errno.ENOTEMPTY):  # another writer put its store there first
                shutil.rmtree(old, ignore_errors=True)
                continue
            raise
        step("placed")
        shutil.rmtree(old, ignore_errors=True)
        break
    else:
        raise StoreError(f"{short_path(path)}: other writers kept replacing the store; write it again when they are done")
    step("removed")
    with contextlib.suppress(OSError):
        fsync_path(path.parent)
