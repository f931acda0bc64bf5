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

The same temporaries serve every atomic write in streambatch: a name is
``PREFIX + PID + "-" + 8 hex digits + SUFFIX`` (`temporary_name`), made with
`create_temporary_file` or `create_temporary_directory`, and
`remove_stale_temporaries` removes those of writers that no longer run.
`atomic_file` is the binary form of `atomic_text` for files streambatch owns
(plan files): ``.NAME.partial-PID-XXXXXXXX`` beside the target, fsynced, renamed
over it; store directories use the same names (`streambatch.io.replace`).
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from ..errors import ConfigError
from .files import short_path

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
    remove_stale_temporaries(directory, _PREFIX, _SUFFIX)
    try:
        fd, temporary = create_temporary_file(directory, _PREFIX, _SUFFIX)
    except OSError as err:
        raise ConfigError(
            f"output {short_path(shown)!r}: cannot create a file in {short_path(directory)!r} ({err.strerror or err}); "
            "pass a path in an existing, writable folder"
        ) from None
    try:
        with _NamedText(shown, io.BufferedWriter(io.FileIO(fd, "w")), encoding="utf-8") as handle:
            yield handle
            try:
                handle.flush()
                os.fsync(handle.fileno())
            except OSError as err:
                raise _cannot_write(shown, err) from None
        try:
            os.replace(temporary, target)
        except OSError as err:
            raise ConfigError(
                f"output {short_path(shown)!r}: cannot replace it ({err.strerror or err}); pass a regular file path"
            ) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _cannot_write(shown: str, err: OSError) -> ConfigError:
    return ConfigError(f"output {short_path(shown)!r}: cannot write ({err.strerror or err}); free space or pass another path")


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an `OSError` of the block (writing *path* through a handle of its own) into a `ConfigError` naming *path*.

    A failed write says only "File too large" or "No space left on device"; this
    says which output.  A broken pipe passes through (the reader went away).
    """
    try:
        yield
    except OSError as err:
        if isinstance(err, BrokenPipeError):
            raise
        raise _cannot_write(os.fspath(path), err) from None


class _NamedText(io.TextIOWrapper):
    """A text file whose write failures ("File too large", "No space left on device") name the user's path."""

    def __init__(self, shown: str, raw: io.BufferedWriter, encoding: str) -> None:
        super().__init__(raw, encoding=encoding)
        self.shown = shown

    def write(self, text: str, /) -> int:
        try:
            return super().write(text)
        except OSError as err:
            if isinstance(err, BrokenPipeError):  # the reader went away: not a failure (the CLI exits 0)
                raise
            raise _cannot_write(self.shown, err) from None

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as err:
            if isinstance(err, BrokenPipeError):
                raise
            raise _cannot_write(self.shown, err) from None

    def close(self) -> None:
        try:
            super().close()  # flushes what is buffered: the write failure may come only now
        except OSError as err:
            if isinstance(err, BrokenPipeError):
                raise
            raise _cannot_write(self.shown, err) from None

    def writelines(self, lines: Iterable[str], /) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)


def _target(shown: str) -> str | None:
    """The regular file to replace for the user's path *shown*, or None to write through."""
    if shown in _OPEN_DESCRIPTORS or shown.startswith(_OPEN_DESCRIPTORS[2:]):
        return None
    if "\0" in shown:
        raise ConfigError(f"output {short_path(shown)!r}: the path holds a NUL byte; pass a file path")
    try:
        mode = os.stat(shown).st_mode  # follows a symlink to what it points at
    except FileNotFoundError:  # nothing there yet, or a dangling link
        mode = None
    except OSError as err:
        raise ConfigError(
            f"output {short_path(shown)!r}: {err.strerror or err}; pass a file path in an existing folder"
        ) from None
    if mode is not None:
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            return None
        if stat.S_ISDIR(mode):
            raise ConfigError(
                f"output {short_path(shown)!r} is a directory; pass a file path (e.g. "
                f"{os.path.join(short_path(shown), 'batches.jsonl')!r})"
            )
        if not stat.S_ISREG(mode):
            raise ConfigError(
                f"output {short_path(shown)!r} is neither a regular file, a pipe nor a character device; pass a file path"
            )
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
        # reuse an open descriptor (reopening would truncate a `>>` log)
        raw = io.FileIO(os.dup(descriptor), "w") if descriptor is not None else io.FileIO(shown, "w")
        handle = _NamedText(shown, io.BufferedWriter(raw), encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"output {short_path(shown)!r}: cannot open ({err.strerror or err}); pass a writable path") from None
    with handle:
        yield handle
        try:
            handle.flush()
        except OSError as err:
            if isinstance(err, BrokenPipeError):
                raise
            raise _cannot_write(shown, err) from None


def partial_prefix(target: str | os.PathLike[str], kind: str = "partial") -> str:
    """The prefix of the temporaries beside *target*: ``.NAME.partial-`` (or ``.NAME.old-`` for *kind* ``old``)."""
    return f".{os.path.basename(os.fspath(target))}.{kind}-"


def temporary_name(directory: str | os.PathLike[str], prefix: str, suffix: str = "") -> Path:
    """A fresh name ``directory/PREFIX + PID + "-" + 8 hex digits + SUFFIX`` (nothing is created)."""
    return Path(directory) / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def create_temporary_file(directory: str | os.PathLike[str], prefix: str, suffix: str = "") -> tuple[int, str]:
    """A new empty file at a `temporary_name`, open read/write; mode 0o666 less the umask (mkstemp's is 0o600)."""
    while True:
        name = os.fspath(temporary_name(directory, prefix, suffix))
        try:
            return os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), name
        except FileExistsError:
            continue


def create_temporary_directory(directory: str | os.PathLike[str], prefix: str) -> Path:
    """A new directory at a `temporary_name`, mode 0o777 less the umask (mkdtemp's is 0o700)."""
    while True:
        candidate = temporary_name(directory, prefix)
        try:
            os.mkdir(candidate, 0o777)
        except FileExistsError:
            continue
        return candidate


def remove_stale_temporaries(directory: str | os.PathLike[str], prefix: str, suffix: str = "") -> None:
    """Remove the temporaries ``PREFIX + PID + "-..." + SUFFIX`` in *directory* whose writer (PID) no longer runs.

    Files are unlinked and directories removed whole; links and other entries,
    names without a pid, and those of live (or other users') processes are kept.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)) or len(name) < len(prefix) + len(suffix):
            continue
        pid_text, dash, _ = name[len(prefix) : len(name) - len(suffix)].partition("-")
        if not dash or not (pid_text.isascii() and pid_text.isdigit()) or int(pid_text) <= 0:  # "²".isdigit() too
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            _remove(os.path.join(directory, name))
        except (PermissionError, OverflowError):  # alive (another user's), or no such pid at all
            continue


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        mode = os.lstat(path).st_mode
        if stat.S_ISDIR(mode):
            shutil.rmtree(path, ignore_errors=True)
        elif stat.S_ISREG(mode):
            os.unlink(path)


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A binary file (read/write) that replaces *path* only if the block finishes without error.

    Written as ``.NAME.partial-PID-XXXXXXXX`` beside *path* (stale ones of killed
    writers are removed first), fsynced, renamed over *path*, then the folder
    fsynced.  OS errors pass through unchanged (the caller names its file).

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "data.bin"
    >>> with atomic_file(target) as handle:
    ...     _ = handle.write(b"done")
    >>> target.read_bytes()
    b'done'
    """
    directory = os.path.dirname(os.path.abspath(path))
    prefix = partial_prefix(path)
    remove_stale_temporaries(directory, prefix)
    fd, temporary = create_temporary_file(directory, prefix)
    try:
        with os.fdopen(fd, "r+b") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):
        fsync_path(directory)


WAIT_NOTE_SECONDS = 1.0  # a process waiting on another's lock says so after this long


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], *, what: str = "file") -> Iterator[None]:
    """Hold an exclusive ``flock`` on *path* (created if missing) for the block; released on close, also by a crash.

    What concurrent writers of one file computed once (plan files, packings)
    serialize on.  The holder writes its pid into the lock; a process that
    waits longer than `WAIT_NOTE_SECONDS` says so on stderr, naming the holder,
    then waits on.
    """

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _acquire(fd, path, what)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the processes that wait
        yield
    finally:
        os.close(fd)


def _acquire(fd: int, path: str | os.PathLike[str], what: str) -> None:
    """Lock *fd*; after `WAIT_NOTE_SECONDS` of waiting say so on stderr, naming the holder's pid, then wait on."""
    import fcntl  # POSIX

    deadline = time.monotonic() + WAIT_NOTE_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
    holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
    who = f"pid {holder}" if holder.isdigit() else "another process"
    print(
        f"streambatch: waiting for the {what} lock {short_path(path)}: {who} is computing this {what}; "
        "it is mapped here once written",
        file=sys.stderr,
        flush=True,
    )
    fcntl.flock(fd, fcntl.LOCK_EX)
