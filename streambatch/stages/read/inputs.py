"""Read input files as bytes: ``.gz`` (gzip) and ``.zst`` (the ``[zstd]`` extra) decompressed by suffix.

Read failures (missing, unreadable, corrupt or truncated compressed data) are
`DataError`s naming the file, so ``--skip-bad`` can leave such a file out.
Lines end at ``\\n``; `line_chunks` cuts a file into pieces of whole lines.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...errors import DataError, StreamBatchError
from .tokenizers import require

READ_SIZE = 1 << 20
LINE_CHUNK_BYTES = 1 << 20  # lines are read, parsed and tokenized about 1 MiB at a time (a task)
CODECS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def codec_of(name: str) -> str | None:
    """The compression of a file named *name*, from its suffix (any case).

    >>> codec_of("a.JSONL.GZ"), codec_of("b.txt.zst"), codec_of("c.txt")
    ('gzip', 'zstd', None)
    """
    lower = name.lower()
    return next((codec for suffix, codec in CODECS.items() if lower.endswith(suffix)), None)


def base_name(name: str) -> str:
    """*name* in lower case without its compression suffix: what decides its format.

    >>> base_name("Docs.JSONL.gz")
    'docs.jsonl'
    """
    lower = name.lower()
    for suffix in CODECS:
        if lower.endswith(suffix):
            return lower[: -len(suffix)]
    return lower


def read_error(path: str | os.PathLike[str], err: BaseException) -> DataError:
    """A read or decompression failure as a `DataError` naming the file."""
    reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
    return DataError(f"{os.fspath(path)}: cannot read ({reason}); check the file, or leave it out (--exclude, --skip-bad)")


def is_read_error(err: BaseException) -> bool:
    """True for the errors a damaged or unreadable file raises (I/O, gzip, zlib, zstd)."""
    if isinstance(err, StreamBatchError):
        return False
    return isinstance(err, (OSError, EOFError, zlib.error)) or type(err).__name__ == "ZstdError"


def is_format_error(err: BaseException) -> bool:
    """True for what pyarrow, datasets and numpy raise for a file they cannot read (pyarrow's own classes subclass these)."""
    if isinstance(err, StreamBatchError):
        return False
    return isinstance(err, (OSError, ValueError, EOFError, TypeError, KeyError, IndexError, NotImplementedError))


def iter_bytes(path: str | os.PathLike[str], size: int = READ_SIZE) -> Iterator[bytes]:
    """The decompressed bytes of a file, in pieces of about *size* bytes; read errors are `DataError`s."""
    codec = codec_of(os.fspath(path))
    zstandard = _zstandard() if codec == "zstd" else None
    try:
        with open(path, "rb") as raw:
            if codec == "gzip":
                with gzip.GzipFile(fileobj=raw) as handle:
                    while piece := handle.read(size):
                        yield piece
            elif zstandard is not None:
                yield from _zstd_pieces(zstandard, raw, size)
            else:
                while piece := raw.read(size):
                    yield piece
    except Exception as err:
        if is_read_error(err):
            raise read_error(path, err) from err
        raise


def _zstandard() -> Any:
    return require("zstandard", "zstd", "reading .zst files")


def _zstd_pieces(zstandard: Any, raw: Any, size: int) -> Iterator[bytes]:
    # frame by frame, so that a truncated last frame is an error (stream_reader would stop silently)
    context = zstandard.ZstdDecompressor()
    frame, fed = context.decompressobj(), False
    while data := raw.read(size):
        while data:
            fed = True
            if out := frame.decompress(data):
                yield out
            if not frame.eof:
                break
            data = frame.unused_data
            frame, fed = context.decompressobj(), False
    if fed and not frame.eof:
        raise EOFError("compressed file ended before the end of its last zstd frame")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """All decompressed bytes of a file."""
    return b"".join(iter_bytes(path))


def decode(data: bytes, path: str | os.PathLike[str], offset: int = 0, what: str = "text") -> str:
    """UTF-8 text of *data* (bytes from *offset* in *path*); errors give the file's byte position."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{os.fspath(path)}: not UTF-8 {what} ({err.reason} at byte {offset + err.start}); convert it or leave it out"
        ) from err


@dataclass(frozen=True)
class LineChunk:
    """Whole lines of a file: *data* starts at byte *offset* (decompressed) and line number *first_line*."""

    data: bytes
    offset: int
    first_line: int


def line_chunks(path: str | os.PathLike[str], size: int) -> Iterator[LineChunk]:
    """Cut a (decompressed) file into chunks of about *size* bytes that end at a ``\\n`` (the last may not)."""
    parts: list[bytes] = []
    held, offset, line = 0, 0, 1
    for piece in iter_bytes(path, min(size, READ_SIZE)):
        parts.append(piece)
        held += len(piece)
        if held < size or b"\n" not in piece:
            continue
        pending = b"".join(parts)
        cut = pending.rfind(b"\n") + 1
        yield LineChunk(pending[:cut], offset, line)
        line += pending.count(b"\n", 0, cut)
        offset += cut
        parts, held = [pending[cut:]], len(pending) - cut
    if held:
        yield LineChunk(b"".join(parts), offset, line)


def split_lines(text: str, first_line: int) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` for each line of *text*, without its ``\\n`` or ``\\r\\n``.

    >>> list(split_lines("a\\r\\nb\\n\\nc", 7))
    [(7, 'a'), (8, 'b'), (9, ''), (10, 'c')]
    """
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    for number, line in enumerate(lines, start=first_line):
        yield number, line[:-1] if line.endswith("\r") else line
