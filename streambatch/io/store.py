"""Token stores on disk: written atomically, memory-mapped read-only, checked on open.

A store is a directory::

    STORE/header.json    format, version, dtype, counts, fingerprint, ids/partitions, tokenizer (optional)
    STORE/tokens.bin     every document's tokens, flat, little-endian uint16 or uint32
    STORE/offsets.bin    document_count + 1 little-endian int64 offsets into tokens.bin
    STORE/ids.jsonl      (many documents only) one JSON string id per line
    STORE/partitions.bin (many documents only) one uint8 per document: 0 train, 1 validation, 2 test

``fingerprint`` is ``blake2b-256:`` + the hex BLAKE2b-256 of tokens.bin, then
offsets.bin, then the canonical JSON of the ids and partition codes.

Crash and concurrency safety:

* Everything is written into a temporary directory beside the target,
  ``.NAME.partial-PID-XXXXXXXX``, and put in place last.  Replacing an existing
  store is one atomic step on Linux: ``renameat2(RENAME_EXCHANGE)`` swaps the new
  directory with the old one, and the old one (now under the temporary name) is
  removed afterwards.  A kill at any moment leaves the complete old store or the
  complete new one at the target.  Where renameat2 is unavailable (other systems,
  filesystems that refuse the flag) the fallback is two renames (old store aside
  as ``.NAME.old-PID-XXXXXXXX``, new one in); a kill between them leaves no store
  at the target, the old one still whole under the ``.old-`` name.
* Temporaries carry their writer's pid; every new writer of a target removes
  those of writers that are no longer running.
* `open_store` opens the directory once and every file relative to it, so all
  files come from one version; when a concurrent replace removes the version
  being opened, the open starts over (a few times) on the new one.
* Directories and files are created with modes 0o777 / 0o666 less the umask.

The work is split by job: `streambatch.io.store_header` (the header and file
names), `streambatch.io.store_writer` (`StoreWriter`, `write_store`),
`streambatch.io.replace` (the atomic directory swap) and
`streambatch.io.store_reader` (`open_store`); this module names the public ones.
"""

from __future__ import annotations

import os
from typing import Any

from ..model.store import DocumentStore
from .remote.location import is_remote
from .store_header import FORMAT, HEADER, INLINE_DOCUMENTS, VERSION, fingerprint_files
from .store_reader import open_store as open_local_store
from .store_writer import StoreWriter, write_store


def open_store(path: str | os.PathLike[str], *, verify: bool = True, **remote: Any) -> DocumentStore:
    """Open the store at *path*: a local directory (`streambatch.io.store_reader.open_store`: memory-mapped,
    checked) or an address in object storage (`streambatch.io.remote.open.open_remote_store`: *remote* keywords
    ``options``, ``prefetch``, ``cache_dir``, ``cache_bytes``, ``retries``, ``timeout``; the objects' sizes and
    ETags stand in for *verify*'s read of every byte)."""
    if is_remote(path):
        from .remote.open import open_remote_store

        return open_remote_store(path, **remote)  # type: ignore[arg-type]
    return open_local_store(path, verify=verify, **remote)


__all__ = ["FORMAT", "HEADER", "INLINE_DOCUMENTS", "VERSION", "StoreWriter", "fingerprint_files", "open_store", "write_store"]
