"""Keyed files: a result computed once, written atomically, memory-mapped read-only by every process.

Plan files (``.plan``), packings (``.packing``) and mixture plans
(``.mixplan``) are one kind of file: their name is a hash of a *key* (what the
content depends on), the first process to need one computes it under a lock and
writes it atomically, and every later process maps it.  This module is that
kind, once: the naming rule (`file_name`), the lock and the write
(`computed_once`, `write_keyed`), the layout, the checks, and one rule for
operating-system errors: a folder or file that cannot be created, written or
read is a `StoreError` naming it, never a bare ``OSError``.

The layout::

    MAGIC (8 bytes) | JSON length (uint64 LE) | BLAKE2b-128 of the JSON | JSON header, space-padded to a page
    boundary
    sections, each page-aligned: little-endian arrays
    digest table: 16 bytes per block of every section, in section order

The header, sized to its content (a key of 255 sources fits), records the kind
(``format``, ``version``), the ``key``, the kind's own fields, ``block`` (entries
per block, `BLOCK`), each section's name, dtype, count and offset, and the digest
table's offset, block count and BLAKE2b-256 digest; the header's own digest
precedes it, and its padding must be spaces, so no byte of the header or the table can change unnoticed.  A
section's padding to the next page must be zeros, checked with its last block.  A block's digest is its
bytes' BLAKE2b-128, salted with its number in the file (a block copied over
another does not match).  Files of the earlier layouts (a JSON header at byte 0)
are refused with a message that says to plan again.

Checks.  `open_keyed` reads the header and the digest table only (a few hundred
kB at 10^9 entries): the kind, the key, the sizes against the file's size, the
table against its digest; any mismatch is a `StoreError`.  The body is checked
where it is read: `check_blocks` (one call wherever entries of a mapped section
are read for a batch) checks each block the first time this process reads it,
against its digest, and remembers it in a bitmap: a damaged or edited block is
a `StoreError` (a `DataError`) naming the file and the block, at a cost per
batch of the blocks it touches first, never of the file.  `KeyedFile.verify`
checks every block up front (``--verify``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, StoreError
from .atomic import atomic_file, exclusive_lock
from .bounded_json import decode_json
from .files import NotRegularFileError, open_regular, short_path

MAGIC = b"SBKEYF3\n"
"""The first bytes of every keyed file of this layout (3: plan 2, packing 1 and mixture plan 1 came before)."""
BLOCK = 1 << 16
"""Entries per digest block: 256 kB of a uint32 plan, checked in well under a millisecond."""
PAGE = 4096
DIGEST_BYTES = 16
_PREFIX = len(MAGIC) + 8 + DIGEST_BYTES  # the mark, the header's length and its digest
HEADER_LIMIT = 16 << 20  # bytes of JSON: a key of 255 sources is about 30 kB
PathLike = str | os.PathLike[str]


def file_name(fmt: str, version: int, key: dict[str, Any], suffix: str) -> str:
    """The one naming rule: ``<BLAKE2b-128 of the kind and key>`` + *suffix*.

    >>> file_name("streambatch.plan", 2, {"seed": 7}, ".plan")
    'a8231065707c307c8bf8ff21722b7d89.plan'
    """
    text = json.dumps([fmt, version, key], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest() + suffix


def check_plan_dir(plan_dir: Any) -> PathLike:
    """Return *plan_dir* if it is a path (str or os.PathLike), else raise `ConfigError`."""
    if not isinstance(plan_dir, (str, os.PathLike)) or not os.fspath(plan_dir):
        raise ConfigError(f"plan_dir={plan_dir!r} is not a folder path; pass a str or pathlib.Path (created if missing)")
    return plan_dir


def computed_once(plan_dir: PathLike, name: str, what: str, write: Callable[[Path], None]) -> tuple[Path, bool]:
    """``(plan_dir/name, created)``: *write* (given the path) runs unless the file exists, under the name's lock.

    Concurrent callers of one name wait on ``<name stem>.lock`` (`exclusive_lock`), then find the file.
    A folder that cannot be created or written is a `StoreError` naming it (an existing file is still used).
    """
    directory = Path(check_plan_dir(plan_dir))
    path = directory / name
    if path.exists():
        return path, False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(directory / (Path(name).stem + ".lock"), what=what):
            if path.exists():  # another process wrote it while this one waited
                return path, False
            write(path)
    except OSError as err:  # a read-only or full folder: refused, nothing half-written
        raise StoreError(
            f"plan_dir={short_path(plan_dir)!r}: cannot write the {what} there ({err.strerror or err}); "
            "pass a writable folder, or plan it once with `streambatch plan -o` where it can be written"
        ) from None
    return path, True


class Section(NamedTuple):
    """One array of a keyed file: its name, dtype, entries, byte offset and its first block's number."""

    name: str
    dtype: np.dtype[Any]
    entries: int
    offset: int
    first_block: int

    @property
    def blocks(self) -> int:
        return -(-self.entries // BLOCK)

    @property
    def nbytes(self) -> int:
        return self.entries * self.dtype.itemsize


def _layout(header_bytes: int, specs: list[tuple[str, str, int]]) -> tuple[list[Section], int, int]:
    """Sections after a header of *header_bytes*: ``(sections, digest table offset, blocks)``."""
    sections, at, block = [], header_bytes, 0
    for name, dtype, count in specs:
        section = Section(name, np.dtype(dtype), int(count), at, block)
        sections.append(section)
        at = -(-(at + section.nbytes) // PAGE) * PAGE
        block += section.blocks
    return sections, at, block


def block_digest(data: Any, number: int) -> bytes:
    """BLAKE2b-128 of one block's bytes, salted with the block's number in the file."""
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES, salt=number.to_bytes(16, "little")).digest()


def _digests(values: npt.NDArray[Any], first: int) -> bytes:
    flat = np.ascontiguousarray(values).reshape(-1)
    return b"".join(
        block_digest(flat[lo : lo + BLOCK].view(np.uint8).data, first + i) for i, lo in enumerate(range(0, flat.size, BLOCK))
    )


class KeyedWriter:
    """The file being written by `write_keyed`: fill each section with `put` (an array) or through `mapped`."""

    def __init__(self, handle: IO[bytes], sections: list[Section]) -> None:
        self._handle = handle
        self._sections = {s.name: s for s in sections}
        self._digests: dict[str, bytes] = {}
        self._mapped: dict[str, np.memmap[Any, Any]] = {}
        self.fields: dict[str, Any] = {}
        """The kind's own header fields (e.g. ``state_after``), set while writing."""

    def put(self, name: str, values: npt.ArrayLike) -> None:
        """Write section *name* from *values* (converted to its dtype)."""
        section = self._sections[name]
        array = np.ascontiguousarray(values, dtype=section.dtype).reshape(-1)
        assert array.size == section.entries, (name, array.size, section.entries)
        self._digests[name] = _digests(array, section.first_block)
        self._handle.seek(section.offset)
        array.tofile(self._handle)

    def mapped(self, name: str) -> np.memmap[Any, Any]:
        """A writable map of section *name* in the file (for data that is larger than memory)."""
        section = self._sections[name]
        found = self._mapped[name] = np.memmap(
            self._handle, dtype=section.dtype, mode="r+", offset=section.offset, shape=(section.entries,)
        )
        return found

    def _table(self) -> bytes:
        for name, values in self._mapped.items():
            values.flush()
            self._digests[name] = _digests(values, self._sections[name].first_block)
        self._mapped.clear()
        return b"".join(self._digests.get(s.name, b"") for s in self._sections.values())


@contextlib.contextmanager
def write_keyed(
    path: Path, fmt: str, version: int, key: dict[str, Any], specs: list[tuple[str, str, int]]
) -> Iterator[KeyedWriter]:
    """Write a keyed file at *path* atomically (`atomic_file`): the sections of *specs* ``(name, dtype, count)``.

    OS errors pass through (`computed_once` names the folder); a file is complete or absent.
    """
    room = len(json.dumps(key)) + 64 * len(specs) + 2048  # the key dominates; the kind's fields are a few numbers
    header_bytes = -(-(_PREFIX + room) // PAGE) * PAGE
    sections, table_at, blocks = _layout(header_bytes, specs)
    with atomic_file(path) as handle:
        os.fchmod(handle.fileno(), 0o644)  # readable by every rank (temporaries are private)
        handle.truncate(table_at + blocks * DIGEST_BYTES)
        writer = KeyedWriter(handle, sections)
        yield writer
        table = writer._table()
        assert len(table) == blocks * DIGEST_BYTES, "every section written"
        handle.seek(table_at)
        handle.write(table)
        header = {
            "format": fmt,
            "version": version,
            "key": key,
            **writer.fields,
            "block": BLOCK,
            "sections": [[s.name, s.dtype.str, s.entries, s.offset] for s in sections],
            "digests": [table_at, blocks, hashlib.blake2b(table, digest_size=32).hexdigest()],
        }
        text = json.dumps(header).encode()
        if _PREFIX + len(text) > header_bytes:
            raise AssertionError(f"keyed header of {len(text)} bytes outgrew its {header_bytes}")
        handle.seek(0)
        digest = hashlib.blake2b(text, digest_size=DIGEST_BYTES).digest()
        handle.write(MAGIC + len(text).to_bytes(8, "little") + digest + text.ljust(header_bytes - _PREFIX))


class KeyedFile:
    """An opened keyed file: its header, its sections (read-only maps) and the blocks this process has checked."""

    def __init__(
        self, path: Path, header: dict[str, Any], sections: list[Section], table: npt.NDArray[np.uint8], fix: str
    ) -> None:
        self.path = path
        self.shown = short_path(path)
        self.header = header
        self.sections = {s.name: s for s in sections}
        self.fix = fix
        self.validate: Callable[[str, npt.NDArray[Any]], str | None] | None = None
        """The kind's check of a block's entries once its digest matched (section name, entries): a complaint or None."""
        self._table = table
        self._checked = np.zeros(len(table), dtype=bool)

    def array(self, name: str) -> npt.NDArray[Any]:
        """Section *name*, mapped read-only (a plain ndarray view); its reads are checked by `check_blocks`."""
        section = self.sections[name]
        if not section.entries:
            return np.zeros(0, dtype=section.dtype)
        try:
            mapped = np.memmap(self.path, dtype=section.dtype, mode="r", offset=section.offset, shape=(section.entries,))
        except (OSError, MemoryError, ValueError) as err:  # e.g. ENOMEM under an address-space limit
            raise StoreError(
                f"{self.shown}: cannot map its {section.nbytes} bytes of {section.name} ({err}); "
                "raise the memory limit (ulimit -v)"
            ) from None
        buffer: Any = mapped.base
        _REGISTRY[buffer] = _Mapped(self, section, mapped.__array_interface__["data"][0])
        return mapped.view(np.ndarray)

    def check(self, name: str, lo: int, hi: int) -> None:
        """Check the blocks holding entries ``lo .. hi - 1`` of section *name* not yet checked in this process."""
        section = self.sections[name]
        if hi <= lo:
            return
        first, last = section.first_block + lo // BLOCK, section.first_block + (hi - 1) // BLOCK
        if self._checked[first : last + 1].all():
            return
        self._check_blocks(section, first, last + 1)

    def verify(self) -> None:
        """Check every block of every section (``--verify``): a `StoreError` names the first damaged one."""
        for section in self.sections.values():
            self._check_blocks(section, section.first_block, section.first_block + section.blocks)

    def _check_blocks(self, section: Section, first: int, stop: int) -> None:
        todo = np.flatnonzero(~self._checked[first:stop]) + first
        if not todo.size:
            return
        try:
            with open_regular(self.path) as handle:
                for number in todo.tolist():
                    entry = (number - section.first_block) * BLOCK
                    size = min(BLOCK, section.entries - entry) * section.dtype.itemsize
                    handle.seek(section.offset + entry * section.dtype.itemsize)
                    data = handle.read(size)
                    where = f"block {number - section.first_block} of its {section.name} (entries {entry}.."
                    where += f"{entry + max(len(data) // section.dtype.itemsize, 1) - 1})"
                    if len(data) != size or block_digest(data, number) != self._table[number].tobytes():
                        raise StoreError(
                            f"{self.shown}: {where} does not match its digest: the file is damaged or was edited; {self.fix}"
                        )
                    if number == section.first_block + section.blocks - 1:  # the last block: and the padding after it
                        end = section.offset + section.nbytes
                        if handle.read(-(-end // PAGE) * PAGE - end).strip(b"\0"):
                            raise StoreError(
                                f"{self.shown}: the padding after its {section.name} is not zeros: damaged or edited; {self.fix}"
                            )
                    complaint = None if self.validate is None else self.validate(section.name, np.frombuffer(data, section.dtype))
                    if complaint:
                        raise StoreError(f"{self.shown}: {where}: {complaint}; the file is damaged: {self.fix}")
                    self._checked[number] = True
        except (OSError, NotRegularFileError) as err:
            raise StoreError(f"{self.shown}: unreadable ({err.strerror or err}); {self.fix}") from None


class _Mapped(NamedTuple):
    keyed: KeyedFile
    section: Section
    address: int


_REGISTRY: weakref.WeakKeyDictionary[mmap.mmap, _Mapped] = weakref.WeakKeyDictionary()
"""The keyed file behind each mapped section of this process, by the map (gone with it)."""


def check_blocks(array: npt.NDArray[Any], lo: int, hi: int) -> None:
    """Check the blocks behind entries ``lo .. hi - 1`` of *array* if it views a keyed file's section; else nothing.

    The one call where entries of a plan, packing or mixture plan are read for a batch.  A map made
    in another way (a worker re-mapping the file by name) is described once from the file's header.
    """
    base: Any = array
    memmap: np.memmap[Any, Any] | None = None
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            memmap = base
        base = base.base
    if not isinstance(base, mmap.mmap):
        return  # in memory: computed by this process, nothing to check
    found = _REGISTRY.get(base)
    if found is None:
        if memmap is None or memmap.filename is None:
            return
        found = _describe(memmap, base)
    at = (array.__array_interface__["data"][0] - found.address) // found.section.dtype.itemsize
    found.keyed.check(found.section.name, at + lo, at + hi)


def _describe(memmap: np.memmap[Any, Any], buffer: mmap.mmap) -> _Mapped:
    keyed = open_keyed(str(memmap.filename), None, None, None, "plan it again")
    for section in keyed.sections.values():
        if section.offset == memmap.offset:
            found = _REGISTRY[buffer] = _Mapped(keyed, section, memmap.__array_interface__["data"][0])
            return found
    raise StoreError(f"{keyed.shown}: no section at offset {memmap.offset}; {keyed.fix}")


def open_keyed(
    path: PathLike,
    fmt: str | None,
    version: int | None,
    key: dict[str, Any] | None,
    fix: str,
    *,
    what: str = "file",
    missing: str | None = None,
) -> KeyedFile:
    """Open the keyed file *path*: check its layout, kind (*fmt*, *version*), *key* and sizes; read its digest table.

    None skips that comparison (a worker re-mapping a file it was handed).  Every mismatch is a `StoreError`
    ``{path}: ...; {fix}``; a missing file is ``{path}: {missing}`` when given.
    """
    where = Path(path)
    shown = short_path(where)
    try:
        with open_regular(where) as handle:
            size = os.fstat(handle.fileno()).st_size
            start = handle.read(_PREFIX)
            if start[:1] == b"{":
                raise StoreError(
                    f"{shown}: a file of an earlier layout (streambatch 0.3, without block digests); plan again: {fix}"
                )
            if not start.startswith(MAGIC):
                raise StoreError(
                    f"{shown}: not a streambatch plan, packing or mixture plan file (no {MAGIC[:-1].decode()} mark); {fix}"
                )
            length = int.from_bytes(start[len(MAGIC) : len(MAGIC) + 8], "little")
            if length > HEADER_LIMIT:
                raise StoreError(f"{shown}: a header of {length} bytes, more than {HEADER_LIMIT}; {fix}")
            if len(start) < _PREFIX or _PREFIX + length > size:
                raise StoreError(f"{shown}: {size} bytes, truncated within its header; {fix}")
            text = handle.read(length)
            if hashlib.blake2b(text, digest_size=DIGEST_BYTES).digest() != start[len(MAGIC) + 8 :]:
                raise StoreError(f"{shown}: its header does not match its digest: damaged or edited; {fix}")
            header = decode_json(text, shown, "a keyed file header", error=StoreError)
            sections, table_at, blocks = _sections(header, shown, fix)
            padding = handle.read((sections[0].offset if sections else table_at) - _PREFIX - length)
            if padding.strip(b" "):
                raise StoreError(f"{shown}: its header's padding is not blank: damaged or edited; {fix}")
            handle.seek(table_at)
            table = handle.read(blocks * DIGEST_BYTES)
    except FileNotFoundError:
        raise StoreError(f"{shown}: {missing}" if missing else f"{shown}: no such file; {fix}") from None
    except NotRegularFileError:
        raise StoreError(f"{shown}: not a regular file; {fix}") from None
    except OSError as err:
        raise StoreError(f"{shown}: unreadable ({err.strerror or err}); {fix}") from None
    expected = table_at + blocks * DIGEST_BYTES
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise StoreError(f"{shown}: {size} bytes but its header says {expected}: {state}; {fix}")
    if hashlib.blake2b(table, digest_size=32).hexdigest() != header["digests"][2]:
        raise StoreError(f"{shown}: its table of block digests does not match the header: damaged or edited; {fix}")
    if fmt is not None and (header.get("format") != fmt or header.get("version") != version):
        raise StoreError(f"{shown}: not a {fmt!r} version {version} file; {fix}")
    found = header.get("key")
    if not isinstance(found, dict):
        raise StoreError(f"{shown}: the header has no key; {fix}")
    if key is not None and found != key:
        differ = ", ".join(f"{k}={found.get(k)!r} (expected {v!r})" for k, v in key.items() if found.get(k) != v)
        raise StoreError(f"{shown}: a {what} for another key: {differ or 'extra fields'}; it is stale or foreign; {fix}")
    return KeyedFile(where, header, sections, np.frombuffer(table, dtype=np.uint8).reshape(blocks, DIGEST_BYTES), fix)


def _sections(header: Any, shown: str, fix: str) -> tuple[list[Section], int, int]:
    """The header's sections, checked against the layout's rule: ``(sections, table offset, blocks)``."""
    try:
        specs = [(str(n), str(d), int(c)) for n, d, c, _ in header["sections"]]
        offsets = [int(s[3]) for s in header["sections"]]
        table_at, blocks, digest = header["digests"]
        header_bytes = offsets[0] if offsets else int(table_at)
        sections, expected_at, expected_blocks = _layout(header_bytes, specs)
        ok = (
            header["block"] == BLOCK
            and [s.offset for s in sections] == offsets
            and header_bytes % PAGE == 0
            and (table_at, blocks) == (expected_at, expected_blocks)
            and isinstance(digest, str)
            and all(s.entries >= 0 and s.dtype.byteorder in "|=" and s.dtype.kind in "iu" for s in sections)
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise StoreError(f"{shown}: its header's block, sections or digest table are malformed; {fix}")
    return sections, int(table_at), int(blocks)
