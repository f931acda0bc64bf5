"""Replacing a store in object storage is atomic: a reader sees the old store or the complete new one, never neither,
wherever the upload stops; old versions go only after the switch and their grace period (moto on loopback)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import DataError, StoreError
from streambatch.io.remote.client import ObjectClient
from streambatch.io.remote.location import Location
from streambatch.io.remote.upload import upload_store
from tests.remote_server import BUCKET, documents, moto_server

_UPLOAD = """
import sys
from streambatch.io.remote.upload import upload_store
print("start", flush=True)
upload_store(sys.argv[1], sys.argv[2], grace=0.0)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with moto_server() as port:
        yield port


def _epoch(store: Any) -> list[tuple[int, bytes]]:
    return [
        (int(b.index), b.inputs.tobytes() + b.targets.tobytes())
        for b in sb.Epoch(store, context_length=16, stride=256, batch_size=64, seed=4)
    ]


def _objects(url: str) -> list[str]:
    return sorted(name for name, _ in ObjectClient(Location.parse(url)).listing(""))


def test_a_replacement_switches_whole_and_removes_the_old_after_its_grace(server: int, tmp_path: Path) -> None:
    """Old store, then new: each upload is a version, the pointer names the newest; the old version is kept while
    its grace lasts (a reader that opened it reads on) and removed by a later upload once it is over."""
    old = sb.write_store(tmp_path / "old", documents(8, seed=1))
    new = sb.write_store(tmp_path / "new", documents(9, seed=2))
    url = f"s3://{BUCKET}/graced"
    first = upload_store(tmp_path / "old", url)
    assert _epoch(first) == _epoch(old)
    second = upload_store(tmp_path / "new", url)  # grace of a day: the old version stays
    assert _epoch(second) == _epoch(new)
    assert _epoch(first) == _epoch(old)  # the reader of the old version reads on
    versions = {name.split("/")[1] for name in _objects(url) if name.startswith("v/")}
    assert len(versions) == 2
    upload_store(tmp_path / "new", url, grace=0.0)  # a third upload: the retired versions are past a grace of 0
    assert len({name.split("/")[1] for name in _objects(url) if name.startswith("v/")}) == 1
    assert _epoch(sb.open_store(url)) == _epoch(new)


def test_a_store_from_before_versions_is_read_then_replaced(server: int, tmp_path: Path) -> None:
    """Objects at the address itself (an upload before versions, or another tool's): read as they are; a versioned
    upload over them switches whole, and removes them (only the store's own files) once retired past the grace."""
    old = sb.write_store(tmp_path / "old", documents(5, seed=3))
    url = f"s3://{BUCKET}/legacy"
    client = ObjectClient(Location.parse(url))
    for path in sorted((tmp_path / "old").iterdir()):
        client.put(path.name, path)
    client.put("README.txt", b"not the store's")
    with pytest.raises(StoreError, match=r"records no block digests.*--trust-remote"):
        sb.open_store(url)  # its bytes cannot be checked: refused unless trusted
    assert _epoch(sb.open_store(url, trust_remote=True)) == _epoch(old)
    new = sb.write_store(tmp_path / "new", documents(6, seed=4))
    upload_store(tmp_path / "new", url, grace=0.0)
    upload_store(tmp_path / "new", url, grace=0.0)
    names = _objects(url)
    assert "README.txt" in names
    assert "tokens.bin" not in names
    assert _epoch(sb.open_store(url)) == _epoch(new)


def test_a_damaged_pointer_is_one_data_error(server: int, tmp_path: Path) -> None:
    """A pointer that names no version of this layout (``..``, another format) is refused naming it."""
    url = f"s3://{BUCKET}/pointed"
    ObjectClient(Location.parse(url)).put(
        "current.json", b'{"format": "streambatch.store-pointer", "version": 1, "current": "../x"}'
    )
    with pytest.raises(DataError, match=r"pointed/current\.json: not a store pointer"):
        sb.open_store(url)


@pytest.mark.slow
def test_an_upload_killed_at_random_moments_leaves_the_old_store_or_the_new(server: int, tmp_path: Path) -> None:
    """SIGKILL of `upload_store` at 10 random moments of its run: each time, the store at the address is the old one
    or the new one, whole, and a later upload completes over whatever was left."""
    old = sb.write_store(tmp_path / "old", documents(300, seed=5))
    new = sb.write_store(tmp_path / "new", documents(320, seed=6))
    url = f"s3://{BUCKET}/killed"
    upload_store(tmp_path / "old", url, grace=0.0)
    expected = {"old": _epoch(old), "new": _epoch(new)}
    timing = subprocess.Popen([sys.executable, "-c", _UPLOAD, str(tmp_path / "new"), url], stdout=subprocess.PIPE)
    assert timing.stdout is not None
    timing.stdout.readline()  # imported: the upload starts now
    began = time.perf_counter()
    assert timing.stdout.readline().strip() == b"done"
    whole = time.perf_counter() - began  # the upload alone: the window the kills fall in
    timing.wait()
    upload_store(tmp_path / "old", url, grace=0.0)
    rng = random.Random(7)
    seen = set()
    for _ in range(10):
        child = subprocess.Popen([sys.executable, "-c", _UPLOAD, str(tmp_path / "new"), url], stdout=subprocess.PIPE)
        assert child.stdout is not None
        child.stdout.readline()  # imported and started
        time.sleep(rng.uniform(0.0, whole))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        got = _epoch(sb.open_store(url))
        kind = "old" if got == expected["old"] else "new" if got == expected["new"] else "neither"
        assert kind != "neither"
        seen.add(kind)
        upload_store(tmp_path / "old", url, grace=0.0)  # back to the old store for the next kill
    assert _epoch(sb.open_store(url)) == expected["old"]
