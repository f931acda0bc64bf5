"""Bounded, checked JSON decoding for every JSON streambatch reads (JSONL records, store headers, ids).

`read_json_header` is the one reader of small JSON files (store headers, corpus
manifests, plan headers, state files): a size limit, no waiting on a FIFO, and
the bounded decoder below.

The standard library's ``json`` turns hostile input into exceptions of the wrong
kind: an integer literal of thousands of digits hits Python's int-string limit
(``ValueError``) and deeply nested arrays raise ``RecursionError``.  Here every
document is decoded by ``msgspec``, which bounds both (integers of more than
4,300 digits are refused; nesting is limited by the interpreter's recursion
limit and fails cleanly), and every failure becomes a `DataError` (or the
caller's subclass, e.g. `StoreError`) naming where, the JSON path
(``$.tokens[0]``) and what to do.  A UTF-8 byte-order mark at the start is
accepted and dropped.

>>> decode_record(b'{"id": "a", "partition": "train", "input_ids": [1, 2]}', "docs.jsonl:1")
{'id': 'a', 'partition': 'train', 'tokens': [1, 2]}
>>> decode_record(b'{"id": "a", "tokens": [1, 1' + b"0" * 5000 + b"]}", "docs.jsonl:2")
Traceback (most recent call last):
...
streambatch.errors.DataError: docs.jsonl:2: invalid JSON value at $.tokens[1] (Integer value out of range); ...
"""

from __future__ import annotations

import os
import stat
from typing import IO, Any

import msgspec

from ..errors import DataError, NotRegularFileError, StreamBatchError
from .files import open_regular

BOM = "\ufeff"
HEADER_LIMIT = 64 << 20  # bytes: a store header is a few kB; ids beyond the inline limit live in ids.jsonl


class _TokenRecord(msgspec.Struct):
    """One JSONL token document; unknown fields (e.g. ``text``, ``attention_mask``) are skipped unbuilt."""

    id: Any = msgspec.UNSET
    partition: Any = msgspec.UNSET
    tokens: Any = msgspec.UNSET
    input_ids: Any = msgspec.UNSET  # Hugging Face rows name their tokens input_ids


_ANY = msgspec.json.Decoder()
_RECORD = msgspec.json.Decoder(_TokenRecord)
_STRING = msgspec.json.Decoder(str)


def _strip_bom(data: bytes | str) -> bytes | str:
    if isinstance(data, str):
        return data[1:] if data.startswith(BOM) else data
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes | str, where: str, fix: str, error: type[StreamBatchError]) -> Any:
    try:
        return decoder.decode(_strip_bom(data))
    except msgspec.ValidationError as err:  # well-formed JSON, unacceptable value: name the JSON path
        reason, _, path = str(err).partition(" - at `")
        raise error(f"{where}: invalid JSON value at {path.rstrip('`') or '$'} ({reason}); {fix}") from None
    except msgspec.DecodeError as err:
        raise error(f"{where}: invalid JSON ({err}); {fix}") from None
    except RecursionError:
        raise error(f"{where}: invalid JSON (nested too deeply); {fix}") from None
    except UnicodeEncodeError as err:  # a str argument holding lone surrogates
        raise error(f"{where}: invalid text ({err.reason}); {fix}") from None


def decode_json(data: bytes | str, where: str, what: str, *, error: type[StreamBatchError] = DataError) -> Any:
    """Decode one JSON document of any shape; failures raise *error* naming *where* and *what*.

    >>> decode_json(b'{"a": [1]}', "header.json", "the store header")
    {'a': [1]}
    """
    return _decode(_ANY, data, where, f"{what} must be valid JSON", error)


def decode_string(data: bytes | str, where: str, what: str, *, error: type[StreamBatchError] = DataError) -> str:
    """Decode one JSON string (e.g. a line of a store's ids.jsonl).

    >>> decode_string(b'"doc-1"', "ids.jsonl:1", "a document id")
    'doc-1'
    """
    value: str = _decode(_STRING, data, where, f"{what} must be one JSON string", error)
    return value


def decode_record(line: bytes | str, where: str) -> dict[str, Any]:
    """Decode one JSONL token record into a dict of the fields present among ``id``, ``partition``, ``tokens``.

    ``input_ids`` stands in for ``tokens`` when ``tokens`` is absent.  Other fields
    are skipped.  The values are not validated here (`Document` does that); only
    the JSON itself is.
    """
    fix = 'write one JSON object per line: {"id": ..., "partition": ..., "tokens": [...]}'
    try:
        record: _TokenRecord = _decode(_RECORD, line, where, fix, DataError)
    except DataError:
        value = _try_any(line)
        if value is not _INVALID and not isinstance(value, dict):
            raise DataError(
                f"{where}: got {type(value).__name__}; each record must be an object with id, partition, tokens"
            ) from None
        raise
    if record.tokens is msgspec.UNSET and record.input_ids is not msgspec.UNSET:
        record.tokens = record.input_ids
    fields = {"id": record.id, "partition": record.partition, "tokens": record.tokens}
    return {key: value for key, value in fields.items() if value is not msgspec.UNSET}


_INVALID = object()


def _try_any(line: bytes | str) -> Any:
    """The line decoded without a schema, or `_INVALID` when it is not valid JSON at all."""
    try:
        return _ANY.decode(_strip_bom(line))
    except (msgspec.MsgspecError, RecursionError, UnicodeError):
        return _INVALID


def read_json_header(
    source: str | os.PathLike[str] | IO[bytes],
    where: str,
    what: str,
    fix: str,
    *,
    error: type[StreamBatchError] = DataError,
    limit: int = HEADER_LIMIT,
    missing: str | None = None,
    padding: bytes = b"",
) -> Any:
    """Read and decode a small JSON file: a path, or a binary handle already open on it.

    At most *limit* bytes: a larger file is refused unread (or with *padding*, e.g.
    ``b"\\0 \\n"``, only its first *limit* bytes are read, that padding stripped: a
    fixed-size header before other data).  A FIFO or device is refused, never
    waited on.  Every failure raises *error*: ``{where}: unreadable {what} (...); {fix}``,
    ``{where}: N bytes, more than a {what} may have (64 MiB); {fix}``, or with
    *missing* a missing file ``{where}: {missing}``.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "h.json"
    >>> _ = path.write_text('{"format": "x"}')
    >>> read_json_header(path, str(path), "header", "write it again")
    {'format': 'x'}
    """
    if isinstance(source, (str, os.PathLike)):
        try:
            opened = open_regular(source)  # a FIFO or device is refused, never waited on
        except FileNotFoundError as err:
            if missing is not None:
                raise error(f"{where}: {missing}") from err
            raise error(f"{where}: unreadable {what} ({err.strerror or err}); {fix}") from err
        except NotRegularFileError:
            raise error(f"{where}: not a regular file; {fix}") from None
        except OSError as err:
            raise error(f"{where}: unreadable {what} ({err.strerror or err}); {fix}") from err
        with opened as handle:
            data = _read_bounded(handle, where, what, fix, error, limit, padding)
    else:
        data = _read_bounded(source, where, what, fix, error, limit, padding)
    return _decode(_ANY, data.rstrip(padding) if padding else data, f"{where}: unreadable {what}", fix, error)


def _read_bounded(
    handle: IO[bytes], where: str, what: str, fix: str, error: type[StreamBatchError], limit: int, padding: bytes
) -> bytes:
    shown = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
    try:
        status = os.fstat(handle.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise error(f"{where}: not a regular file; {fix}")
        if status.st_size > limit and not padding:
            raise error(f"{where}: {status.st_size} bytes, more than a {what} may have ({shown}); {fix}")
        # no more than the file holds: read(limit) would allocate *limit* bytes up front (64 MiB per small header)
        data = handle.read(min(limit, status.st_size) + (0 if padding else 1))
        if not padding and len(data) > status.st_size:  # it grew while it was read: read on, bounded
            data += handle.read(limit + 1 - len(data))
    except OSError as err:
        raise error(f"{where}: unreadable {what} ({err.strerror or err}); {fix}") from err
    if len(data) > limit:  # grew while it was read
        raise error(f"{where}: more than {shown}, more than a {what} may have; {fix}")
    return data
