"""Open a store in object storage: header, offsets, ids, partitions (and a loss mask) fetched once; tokens on demand.

The header is read and checked as a local one is (`streambatch.io.store_header`).
Each object's size is checked against the header, and against the sizes and
ETags the uploader recorded (``objects`` in the header, see
`streambatch.io.remote.upload`); every later ranged GET names that ETag, so an
object replaced after the open is a `DataError` naming it, never wrong tokens.
Reading every token byte to check the fingerprint is what a remote open avoids:
the ETags stand in for it.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from ...errors import DataError, StoreError
from ...model.store import DocumentStore
from ...model.validate import check_offsets
from ..bounded_json import HEADER_LIMIT
from ..store_header import HEADER, OFFSETS, PARTITIONS_FILE, TOKENS, header_tokenizer, listed_files, read_header
from ..store_mask import LOSS_MASK, mask_bytes, mask_entry
from .blocks import ALGORITHM, BLOCK, DIGEST, DIGESTS, Blocks, check_whole
from .client import ObjectClient
from .location import Location
from .tokens import TokenFile

log = logging.getLogger("streambatch.remote")
OBJECTS = "objects"  # header key: {name: {"size": int, "etag": str, "blake2b": hex}} of each uploaded object
DIGEST_KEY = "blake2b"  # an object's whole digest in its record
POINTER = "current.json"  # which version of the store at an address is current (`streambatch.io.remote.upload`)
POINTER_FORMAT = "streambatch.store-pointer"
POINTER_LIMIT = 1 << 20
VERSIONS = "v"  # the folder of the versions beside the pointer
STORE_FILES = (HEADER, TOKENS, OFFSETS, "ids.jsonl", PARTITIONS_FILE, LOSS_MASK)  # a store's own files


class RemotePath(str):
    """A remote address shown in messages as a path is (``where / name`` joins with ``/``)."""

    __slots__ = ()

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{self.rstrip('/')}/{name}")


def open_remote_store(
    url: str,
    *,
    options: Mapping[str, Any] | None = None,
    prefetch: int | None = None,
    cache_dir: Any = None,
    cache_bytes: int | None = None,
    retries: int = 5,
    timeout: float = 30.0,
    trust_remote: bool = False,
) -> DocumentStore:
    """Open the store at *url* (``s3://``, ``gs://``, ``https://``): every failure is one `StoreError` or `DataError` line.

    *options* configure the client (credentials, ``endpoint``, ``region``, ``skip_signature``; the
    environment's are the defaults); *prefetch* fixes how many batches are fetched ahead (default:
    chosen from the measured latency and rate); *cache_dir* and *cache_bytes* keep fetched blocks on
    disk within that many bytes (`streambatch.io.remote.cache`); *retries* bounds the retries of a
    request that timed out (*timeout* seconds), failed with 5xx or lost its connection.  A store uploaded
    without block digests (`streambatch.io.remote.blocks`) is refused unless *trust_remote* (logged) reads it
    unchecked.
    """
    where = Location.parse(url, options)
    client = ObjectClient(where, retries=retries, timeout=timeout)
    pointer = read_pointer(client)
    header_digest = None
    if pointer is not None:  # a versioned store: the version the pointer names, whole
        client = ObjectClient(where.child(pointer["current"]), retries=retries, timeout=timeout)
        header_digest = pointer.get("header")
    return open_at(
        client, prefetch=prefetch, cache=_cache(cache_dir, cache_bytes), trust=trust_remote, header_digest=header_digest
    )


def read_pointer(client: ObjectClient) -> dict[str, Any] | None:
    """The store pointer at *client*'s address (None: no pointer, a store from before versions or none), checked."""
    from ..bounded_json import read_json_header

    found = client.get_optional(POINTER, POINTER_LIMIT)
    if found is None:
        return None
    where = f"{client.where.url}/{POINTER}"
    with tempfile.TemporaryFile() as handle:
        handle.write(found[0])
        handle.seek(0)
        pointer = read_json_header(handle, where, "store pointer", "upload the store again", error=DataError)
    current = pointer.get("current") if isinstance(pointer, dict) else None
    if (
        not isinstance(pointer, dict)
        or pointer.get("format") != POINTER_FORMAT
        or pointer.get("version") != 1
        or not isinstance(current, str)
        or not current.startswith(f"{VERSIONS}/")
        or ".." in current.split("/")
        or not isinstance(pointer.get("retired", []), list)
    ):
        raise DataError(
            f"{where}: not a store pointer of this streambatch (format {POINTER_FORMAT!r}, version 1, "
            f"current 'v/...'); upload the store again"
        )
    return pointer


def _cache(cache_dir: Any, cache_bytes: int | None) -> Any:
    if cache_dir is None:
        if cache_bytes is not None:
            raise StoreError(f"cache_bytes={cache_bytes} needs cache_dir: pass the folder to keep fetched blocks in")
        return None
    from .cache import BlockCache

    return BlockCache(cache_dir, cache_bytes)


def _unchecked(root: str, trust: bool) -> None:
    """A store without block digests: refused, unless the caller trusts it (then logged)."""
    if not trust:
        raise StoreError(
            f"{root}: this store records no block digests (uploaded before streambatch 0.5, or copied up by another "
            "tool), so its bytes cannot be checked as they are read; upload it again from its local folder "
            "(streambatch prepare ... -o ADDRESS, or streambatch.io.remote.upload.upload_store), or pass "
            "--trust-remote (trust_remote=True) to read it unchecked"
        )
    log.warning("%s: read without block digests (--trust-remote): its bytes are not checked", root)


def open_at(
    client: ObjectClient,
    *,
    prefetch: int | None = None,
    cache: Any = None,
    trust: bool = False,
    header_digest: Any = None,
) -> DocumentStore:
    """Open the store *client* reaches (see `open_remote_store`); *header_digest*: what its pointer records."""
    root = RemotePath(client.where.url)
    with _spooled(client, HEADER, HEADER_LIMIT, header_digest) as (handle, _):
        header, dtype, tokens_count, docs_count, fingerprint = read_header(handle, root / HEADER)  # type: ignore[arg-type]
    found = header.get(OBJECTS)
    recorded: dict[str, Any] = found if isinstance(found, dict) else {}
    blocks_entry = header.get("blocks")
    checked = isinstance(blocks_entry, dict)
    if not checked:
        _unchecked(root, trust)
    if checked and header_digest is None:  # digests without a pointer that vouches for the header: not a store we wrote
        raise DataError(f"{root / HEADER}: records block digests but no store pointer names it; upload the store again")

    def expect(name: str) -> Any:  # the recorded digest of a small object (None: unchecked, trusted)
        record = recorded.get(name)
        return (record.get(DIGEST_KEY) if isinstance(record, dict) else None) or ("?" if checked else None)

    tokens_size, tokens_etag = client.head(TOKENS)
    _check(root / TOKENS, tokens_size, tokens_count * dtype.itemsize, f"{tokens_count} tokens of {dtype.name}")
    _check_recorded(root / TOKENS, recorded.get(TOKENS), tokens_size, tokens_etag)
    with _spooled(client, OFFSETS, (docs_count + 1) * 8, expect(OFFSETS)) as (handle, etag):
        size = len(handle.read())
        _check(root / OFFSETS, size, (docs_count + 1) * 8, f"{docs_count + 1} int64 offsets")
        _check_recorded(root / OFFSETS, recorded.get(OFFSETS), size, etag)
        handle.seek(0)
        offsets = np.fromfile(handle, dtype="<i8")
    try:
        offsets = check_offsets(offsets, tokens_count, "offsets")
    except DataError as err:
        raise StoreError(f"{root / OFFSETS}: {err}") from err
    from ..store_reader import _read_documents

    listed = listed_files(header, root / HEADER)  # type: ignore[arg-type]
    spooled = [_spooled(client, name, _limit(name, docs_count, recorded.get(name)), expect(name)) for name in listed]
    handles = [s.__enter__() for s in spooled]
    try:
        for name, (handle, etag) in zip(listed, handles, strict=True):
            _check_recorded(root / name, recorded.get(name), _size(handle), etag)
        ids, codes = _read_documents(root, header, root / HEADER, docs_count, [h for h, _ in handles])  # type: ignore[arg-type]
    finally:
        for s in spooled:
            s.__exit__(None, None, None)
    bits = _mask_bits(client, root, header, tokens_count, recorded, expect(LOSS_MASK))
    settings: dict[str, Any] = {"prefetch": prefetch, "cache": cache if checked else None}
    if isinstance(blocks_entry, dict):
        settings["blocks"] = _blocks(client, root, blocks_entry, tokens_count * dtype.itemsize)
    tokens: Any = (
        TokenFile(client, TOKENS, dtype, tokens_count, tokens_etag, **settings).array() if tokens_count else np.zeros(0, dtype)
    )
    tokenizer = header_tokenizer(header, root / HEADER)  # type: ignore[arg-type]
    return DocumentStore.from_checked(tokens, offsets[:-1], np.diff(offsets), ids, codes, fingerprint, tokenizer, bits)


def _blocks(client: ObjectClient, root: RemotePath, entry: dict[str, Any], nbytes: int) -> Blocks:
    """The block digests of ``tokens.bin`` (``digests.bin``, checked against the header's digest of it)."""
    if entry.get("algorithm") != ALGORITHM or entry.get("size") != BLOCK or entry.get("object") != DIGESTS:
        raise DataError(
            f"{root / HEADER}: blocks={entry!r} is not {BLOCK}-byte {ALGORITHM} blocks in {DIGESTS}; "
            "upload the store again with this streambatch"
        )
    limit = -(-nbytes // BLOCK) * DIGEST
    data, _ = client.get(DIGESTS, limit)
    check_whole(root / DIGESTS, data, entry.get("digest"))
    return Blocks.parse(root / DIGESTS, data, nbytes)


def _mask_bits(
    client: ObjectClient, root: RemotePath, header: dict[str, Any], count: int, recorded: Any, expected: Any = None
) -> Any:
    """The store's loss-mask bits when its header names a mask (None without), fetched once, whole: one bit per
    token (1/16 of a uint16 store's token bytes), held in memory like the offsets."""
    if mask_entry(header, root / HEADER, count) is None:  # type: ignore[arg-type]
        return None
    with _spooled(client, LOSS_MASK, mask_bytes(count), expected) as (handle, etag):
        size = _size(handle)
        _check(root / LOSS_MASK, size, mask_bytes(count), f"a loss mask of {count} bits")
        _check_recorded(root / LOSS_MASK, recorded.get(LOSS_MASK), size, etag)
        bits = np.fromfile(handle, dtype=np.uint8)
    bits.flags.writeable = False
    return bits


def open_remote_manifest(url: str, remote: Mapping[str, Any]) -> tuple[Any, Any]:
    """A remote corpus manifest's decoded JSON, and where each of its shards is (an address beside it)."""
    from ..bounded_json import read_json_header

    where = Location.parse(url, remote.get("options"))
    folder = where.parent()
    client = ObjectClient(folder, retries=remote.get("retries", 5), timeout=remote.get("timeout", 30.0))
    name = where.prefix.rpartition("/")[2]
    with _spooled(client, name, HEADER_LIMIT) as (handle, _):
        manifest = read_json_header(handle, where.url, "corpus manifest", "write it again", error=StoreError)
    return manifest, lambda relative: folder.child(relative).url


ID_BYTES = 4096  # bytes of ids.jsonl per document, at most, where the uploader recorded no size


def _limit(name: str, documents: int, record: Any) -> int:
    """The most bytes object *name* (ids or partitions) may hold: its recorded size, else what the header's
    document count allows."""
    if isinstance(record, dict) and isinstance(record.get("size"), int):
        return int(record["size"])
    return documents if name == PARTITIONS_FILE else documents * ID_BYTES + (64 << 10)


class _spooled:
    """A small object fetched once into an anonymous temporary file (the local readers take files), refused
    past *limit* bytes (read as a stream: a lying ``Content-Length`` allocates nothing)."""

    def __init__(self, client: ObjectClient, name: str, limit: int, expected: Any = None) -> None:
        self.client, self.name, self.limit, self.expected = client, name, limit, expected
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> tuple[IO[bytes], str | None]:
        data, etag = self.client.get(self.name, self.limit)
        if self.expected is not None:  # a checked store: the object whole against its recorded digest
            check_whole(f"{self.client.where.url}/{self.name}", data, self.expected)
        self.handle = tempfile.TemporaryFile()
        self.handle.write(data)
        self.handle.flush()
        self.handle.seek(0)
        return self.handle, etag

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()


def _size(handle: IO[bytes]) -> int:
    handle.seek(0, 2)
    size = handle.tell()
    handle.seek(0)
    return size


def _check(where: str, actual: int, expected: int, what: str) -> None:
    if actual != expected:
        state = "truncated" if actual < expected else "longer than the header says"
        raise DataError(
            f"{where}: size {actual} bytes but the header describes {what} ({expected} bytes): {state}; upload the store again"
        )


def _check_recorded(where: str, record: Any, size: int, etag: str | None) -> None:
    """The object's size and ETag against what the uploader recorded (nothing recorded: nothing to check)."""
    if not isinstance(record, dict):
        return
    if record.get("size") is not None and record["size"] != size:
        raise DataError(
            f"{where}: size {size} bytes but the header records {record['size']}: the object was replaced; upload the store again"
        )
    if record.get("etag") and etag and record["etag"] != etag:
        raise DataError(
            f"{where}: ETag {etag} but the header records {record['etag']}: the object was replaced; upload the store again"
        )
