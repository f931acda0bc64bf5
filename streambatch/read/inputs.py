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

import numpy as np

from ..errors import DataError, StreamBatchError
from ..io.files import check_regular, open_regular, short_path
from .text.tokenizers import require

READ_SIZE = 1 << 20
LINE_CHUNK_BYTES = 1 << 20  # lines are read, parsed and tokenized about 1 MiB at a time (a task)
MAX_LINE_BYTES = 64 << 20  # the default limit on one line (a JSONL row, or a text document with --per-line)
MAX_DOCUMENT_BYTES = 256 << 20  # the default limit on one document read whole (a text file)
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
    return DataError(f"{short_path(path)}: cannot read ({reason}); check the file, or leave it out (--exclude, --skip-bad)")


def check_input(path: str | os.PathLike[str]) -> None:
    """Refuse a FIFO, device or socket (a folder entry linking to ``/dev/zero``, say) before any reader opens it."""
    try:
        check_regular(path)
    except OSError as err:
        raise read_error(path, err) from None


def is_read_error(err: BaseException) -> bool:
    """True for the errors a damaged or unreadable file raises (I/O, gzip, zlib, zstd)."""
    if isinstance(err, StreamBatchError):
        return False
    return isinstance(err, (OSError, EOFError, zlib.error)) or type(err).__name__ == "ZstdError"


FORMAT_ERRORS = (
    OSError,
    ValueError,  # UnicodeDecodeError, json's errors, pyarrow's ArrowInvalid
    EOFError,
    TypeError,
    KeyError,
    IndexError,
    NotImplementedError,
    ArithmeticError,  # an overflowing length
    SystemError,  # a C extension's error without an exception set
    MemoryError,  # a corrupt length asking for a huge buffer (pyarrow's ArrowMemoryError)
    AssertionError,
    AttributeError,  # datasets reading a field of the wrong JSON type
)


def is_format_error(err: BaseException) -> bool:
    """True for what pyarrow, datasets and numpy raise for a file they cannot read (pyarrow's own classes subclass these)."""
    if isinstance(err, StreamBatchError):
        return False
    return isinstance(err, FORMAT_ERRORS) or type(err).__module__.split(".")[0] in ("pyarrow", "datasets")


def iter_bytes(path: str | os.PathLike[str], size: int = READ_SIZE) -> Iterator[bytes]:
    """The decompressed bytes of a file, in pieces of about *size* bytes; read errors are `DataError`s."""
    codec = codec_of(os.fspath(path))
    zstandard = _zstandard() if codec == "zstd" else None
    try:
        with open_regular(path) as raw:  # a FIFO or device (/dev/zero) is refused, never waited on or read forever
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


ZSTD_FEED = 1 << 10  # compressed bytes per decompress call: at most ~32 MiB out (a 128 KiB block per 4 bytes)


def _zstd_pieces(zstandard: Any, raw: Any, size: int) -> Iterator[bytes]:
    # frame by frame, so that a truncated last frame is an error (stream_reader would stop silently); fed
    # ZSTD_FEED bytes at a time, since one call returns all it can: a small bomb would be gigabytes at once
    context = zstandard.ZstdDecompressor()
    frame, fed = context.decompressobj(), False
    while read := raw.read(size):
        view = memoryview(read)
        for lo in range(0, len(view), ZSTD_FEED):
            data = view[lo : lo + ZSTD_FEED]
            while data:
                fed = True
                if out := frame.decompress(data):
                    yield out
                if not frame.eof:
                    break
                data = memoryview(frame.unused_data)
                frame, fed = context.decompressobj(), False
    if fed and not frame.eof:
        raise EOFError("compressed file ended before the end of its last zstd frame")


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """All decompressed bytes of a file (one document); more than *limit* is a `DataError`, raised before they are held."""
    parts, held = [], 0
    for piece in iter_bytes(path):
        held += len(piece)
        if held > limit:
            raise DataError(
                f"{short_path(path)}: a document of more than {limit:,} bytes (the limit for one document); "
                "raise it with --max-document-bytes (max_document_bytes=), or split the file"
            )
        parts.append(piece)
    return b"".join(parts)


def decode(data: bytes, path: str | os.PathLike[str], offset: int = 0, what: str = "text") -> str:
    """UTF-8 text of *data* (bytes from *offset* in *path*); errors give the file's byte position.

    Text holding a NUL byte is binary (an archive such as ``.tar.gz``, an image,
    a compiled file): refused, as invalid UTF-8 is, never read as text.
    """
    if what == "text" and (nul := data.find(b"\0")) >= 0:
        raise DataError(
            f"{short_path(path)}: binary data, not text (a NUL byte at byte {offset + nul}); "
            "extract an archive first, or leave the file out (--exclude, --skip-bad)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{short_path(path)}: not UTF-8 {what} ({err.reason} at byte {offset + err.start}): a binary file? "
            "Convert it, or leave it out (--exclude, --skip-bad)"
        ) from err


@dataclass(frozen=True)
class LineChunk:
    """Whole lines of a file: *data* starts at byte *offset* (decompressed) and line number *first_line*."""

    data: bytes
    offset: int
    first_line: int


def line_chunks(
    path: str | os.PathLike[str], size: int, max_line: int = MAX_LINE_BYTES, span: tuple[int, int] | None = None
) -> Iterator[LineChunk]:
    """Cut a (decompressed) file into chunks of about *size* bytes that end at a ``\\n`` (the last may not).

    A line of more than *max_line* bytes (without its ``\\n``) is a `DataError` naming
    the file and line, raised as soon as it is seen: at most about ``max(size,
    max_line)`` + `READ_SIZE` bytes are held, whatever the file holds.  *span*
    ``(lo, hi)`` (an uncompressed file) keeps the lines that start in bytes
    ``[lo, hi)``, numbered as in the whole file (`span_bytes`).
    """
    parts: list[bytes] = []
    held, offset, line, tail = 0, 0, 1, 0  # tail: bytes held after the last \n (the line being read)
    pieces = iter_bytes(path, min(size, READ_SIZE))
    if span is not None:
        offset, line, pieces = span_bytes(path, span, min(size, READ_SIZE))
    for piece in pieces:
        parts.append(piece)
        held += len(piece)
        newline = piece.rfind(b"\n")
        tail = tail + len(piece) if newline < 0 else len(piece) - newline - 1
        if tail > max_line:  # the line being read is too long; an earlier one in hand may be too
            pending = b"".join(parts)
            cut = pending.rfind(b"\n") + 1
            _check_lines(pending, cut, path, line, max_line)
            raise _long_line(path, line + pending.count(b"\n", 0, cut), max_line)
        if held < size or newline < 0:
            continue
        pending = b"".join(parts)
        cut = pending.rfind(b"\n") + 1
        _check_lines(pending, cut, path, line, max_line)
        yield LineChunk(pending[:cut], offset, line)
        line += pending.count(b"\n", 0, cut)
        offset += cut
        parts, held = [pending[cut:]], len(pending) - cut
    if held:
        pending = b"".join(parts)
        _check_lines(pending, len(pending), path, line, max_line)
        yield LineChunk(pending, offset, line)


def span_bytes(path: str | os.PathLike[str], span: tuple[int, int], size: int = READ_SIZE) -> tuple[int, int, Iterator[bytes]]:
    """The lines of an uncompressed file that start in bytes ``[lo, hi)``: their first byte, its line number, their bytes.

    A line starting before *lo* belongs to the part before (its rest is passed
    over); the last line starting before *hi* is read to its end.  The line number
    counts the ``\\n`` before the first line (one read of the bytes before *lo*).
    """
    lo, hi = span
    try:
        handle = open_regular(path)
        line, at, last = 1, 0, b"\n"
        while at < lo and (piece := handle.read(min(size, lo - at))):
            line, at, last = line + piece.count(b"\n"), at + len(piece), piece[-1:]
        while last != b"\n" and (piece := handle.read(size)):  # the rest of a line that started before lo
            cut = piece.find(b"\n")
            at, last = at + (len(piece) if cut < 0 else cut + 1), b"" if cut < 0 else b"\n"
            if cut >= 0:
                line += 1
                handle.seek(at)
    except Exception as err:
        if is_read_error(err):
            raise read_error(path, err) from err
        raise
    return at, line, _lines_until(handle, path, at, hi, size)


def _lines_until(handle: Any, path: str | os.PathLike[str], at: int, hi: int, size: int) -> Iterator[bytes]:
    """The bytes from *at* to the end of the line holding byte ``hi - 1`` (nothing when *at* >= *hi*)."""
    began = at < hi
    try:
        with handle:
            while at < hi and (piece := handle.read(size)):
                if at + len(piece) >= hi and (cut := piece.find(b"\n", hi - 1 - at)) >= 0:
                    yield piece[: cut + 1]
                    return
                yield piece
                at += len(piece)
            if began and at >= hi:  # the last line runs on past hi: to its end
                while piece := handle.read(size):
                    cut = piece.find(b"\n")
                    yield piece if cut < 0 else piece[: cut + 1]
                    if cut >= 0:
                        return
    except Exception as err:
        if is_read_error(err):
            raise read_error(path, err) from err
        raise


def _check_lines(data: bytes, end: int, path: str | os.PathLike[str], first_line: int, max_line: int) -> None:
    """Refuse a line of *data[:end]* longer than *max_line* bytes (vectorized; skipped when none can be)."""
    if end <= max_line:
        return
    ends = np.flatnonzero(np.frombuffer(data, np.uint8, count=end) == 10)
    last = [end] if not ends.size or ends[-1] != end - 1 else []  # an unterminated last line
    bounds = np.concatenate((np.array([-1], np.int64), ends, np.array(last, np.int64)))
    long = np.flatnonzero(np.diff(bounds) - 1 > max_line)
    if long.size:
        raise _long_line(path, first_line + int(long[0]), max_line)


def _long_line(path: str | os.PathLike[str], number: int, max_line: int) -> DataError:
    return DataError(
        f"{short_path(path)}:{number}: a line of more than {max_line:,} bytes (the limit for one line); "
        "raise it with --max-line-bytes (max_line_bytes=), or leave the file out"
    )


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
