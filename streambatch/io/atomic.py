"""Write output files atomically: to a temporary name beside the target, renamed into place at the end.

What is already at the path decides how it is written:

* nothing, or a regular file: the text goes to ``.streambatch-PID-XXXXXXXX.tmp``
  in the same folder and is renamed over the path once complete, so a failed or
  killed run leaves the previous file (or none), never a partial one.
* a symbolic link: followed.  The file it points to is replaced atomically as
  above and the link itself is kept (a dangling link: the file it names is
  created).  A link is never replaced by a regular file.
* a FIFO or character device (a named pipe, ``/dev/null``, a terminal), and the
  names of already-open descriptors (``/dev/stdout``, ``/dev/stderr``,
  ``/dev/fd/N``, ``/proc/self/fd/N``): written through directly, not replaced;
  such a target cannot be written atomically.  The descriptor names write to
  the descriptor itself (a duplicate), so ``-o /dev/stdout >> log`` appends
  instead of truncating ``log``.
* a directory, block device or socket: refused with `ConfigError`.

New files get mode 0o666 less the umask, like any file a shell redirect creates.
Temporaries of writers that were killed (their pid is in the name and no longer
runs) are removed by the next write into the same folder.  Errors name the
user's path, never the temporary.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from typing import IO

from ..errors import ConfigError

_PREFIX, _SUFFIX = ".streambatch-", ".tmp"
_OPEN_DESCRIPTORS = ("/dev/stdout", "/dev/stderr", "/dev/fd/", "/proc/self/fd/")


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
    shown = os.fspath(path)
    target = _target(shown)
    if target is None:  # a pipe, device or open descriptor: written through
        with _write_through(shown) as handle:
            yield handle
        return
    directory = os.path.dirname(os.path.abspath(target))
    _remove_stale_temporaries(directory)
    try:
        fd, temporary = _create_temporary(directory)
    except OSError as err:
        raise ConfigError(
            f"output {shown!r}: cannot create a file in {directory!r} ({err.strerror or err}); "
            "pass a path in an existing, writable folder"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yield handle
            try:
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as err:
                raise ConfigError(
                    f"output {shown!r}: cannot write ({err.strerror or err}); free space or pass another path"
                ) from None
        try:
            os.replace(temporary, target)
        except OSError as err:
            raise ConfigError(f"output {shown!r}: cannot replace it ({err.strerror or err}); pass a regular file path") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _target(shown: str) -> str | None:
    """The regular file to replace for the user's path *shown*, or None to write through."""
    if shown in _OPEN_DESCRIPTORS or shown.startswith(_OPEN_DESCRIPTORS[2:]):
        return None
    try:
        mode = os.stat(shown).st_mode  # follows a symlink to what it points at
    except FileNotFoundError:  # nothing there yet, or a dangling link
        mode = None
    except OSError as err:
        raise ConfigError(f"output {shown!r}: {err.strerror or err}; pass a file path in an existing folder") from None
    if mode is not None:
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            return None
        if stat.S_ISDIR(mode):
            raise ConfigError(
                f"output {shown!r} is a directory; pass a file path (e.g. {os.path.join(shown, 'batches.jsonl')!r})"
            )
        if not stat.S_ISREG(mode):
            raise ConfigError(f"output {shown!r} is neither a regular file, a pipe nor a character device; pass a file path")
    return os.path.realpath(shown) if os.path.islink(shown) else shown


def _descriptor(shown: str) -> int | None:
    """The descriptor number an already-open-descriptor name stands for (``/dev/stdout`` -> 1), else None."""
    if shown in _OPEN_DESCRIPTORS[:2]:
        return 1 if shown == "/dev/stdout" else 2
    number = shown.rsplit("/", 1)[1] if shown.startswith(_OPEN_DESCRIPTORS[2:]) else ""
    return int(number) if number.isdigit() and len(number) < 10 else None


@contextlib.contextmanager
def _write_through(shown: str) -> Iterator[IO[str]]:
    descriptor = _descriptor(shown)
    try:
        if descriptor is not None:  # reuse the open descriptor: reopening would truncate a `>>` log
            handle = os.fdopen(os.dup(descriptor), "w", encoding="utf-8")
        else:
            handle = open(shown, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as err:
        raise ConfigError(f"output {shown!r}: cannot open ({err.strerror or err}); pass a writable path") from None
    with handle:
        yield handle
        try:
            handle.flush()
        except OSError as err:
            if isinstance(err, BrokenPipeError):
                raise
            raise ConfigError(f"output {shown!r}: cannot write ({err.strerror or err})") from None


def _create_temporary(directory: str) -> tuple[int, str]:
    """A new empty file ``.streambatch-PID-XXXXXXXX.tmp`` in *directory*, mode 0o666 less the umask."""
    while True:
        name = os.path.join(directory, f"{_PREFIX}{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}")
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:
            continue


def _remove_stale_temporaries(directory: str) -> None:
    """Remove ``.streambatch-PID-*.tmp`` files whose writer (PID) no longer runs."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
            continue
        pid_text, dash, _ = name[len(_PREFIX) :].partition("-")
        if not dash or not pid_text.isdigit() or int(pid_text) <= 0:
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.unlink(path)
        except (PermissionError, OverflowError):  # alive (another user's), or no such pid at all
            continue
