"""Every byte from object storage is checked before it is used, and the disk cache checks what it serves (moto on
loopback, through the fault proxy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import DataError
from streambatch.io.remote.blocks import BLOCK, hex_digest
from streambatch.io.remote.client import STATS, ObjectClient
from streambatch.io.remote.location import Location
from streambatch.io.remote.open import read_pointer
from streambatch.tools.proxy import LoopbackProxy
from tests.remote_server import BUCKET, current_version, documents, moto_server, uploaded

MASKED = [sb.Document(f"m{i}", "train", list(range(i, i + 300)), loss_mask=[j % 3 != 0 for j in range(300)]) for i in range(60)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with moto_server() as port:
        tmp = tmp_path_factory.mktemp("trust")
        uploaded(tmp, "big", documents(400, seed=11))  # about 6 digest blocks of tokens
        sb.write_store(tmp / "masked", MASKED)
        from streambatch.io.remote.upload import upload_store

        upload_store(tmp / "masked", f"s3://{BUCKET}/masked")
        yield port


def _epoch(store: Any) -> list[tuple[int, bytes]]:
    epoch = sb.Epoch(store, context_length=16, stride=16, batch_size=32, seed=3)
    return [(int(b.index), b.inputs.tobytes() + b.targets.tobytes()) for b in epoch]


def _through(proxy: LoopbackProxy, name: str, **options: Any) -> Any:
    return sb.open_store(f"s3://{BUCKET}/{name}", options={"endpoint": proxy.url}, **options)


@pytest.mark.parametrize(("name", "store"), [("tokens.bin", "big"), ("offsets.bin", "big"), ("header.json", "big"),
                                             ("loss_mask.bin", "masked"), ("digests.bin", "big")])  # fmt: skip
def test_a_flipped_byte_is_a_data_error_naming_the_object(server: int, name: str, store: str) -> None:
    """One byte of every response for the object inverted in transit: one DataError line naming the object (tokens:
    and the block), never a batch of other tokens."""

    def fault(number: int, line: str) -> str | None:
        return "flip" if line.startswith("GET") and f"/{name} " in line else None

    with LoopbackProxy(server, fault=fault) as proxy, pytest.raises(DataError) as failed:
        _epoch(_through(proxy, store))
    message = str(failed.value)
    assert name in message
    assert "\n" not in message
    if name == "tokens.bin":
        assert "block " in message


def test_a_store_without_etag_records_whose_tokens_were_replaced_is_refused(server: int, tmp_path: Path) -> None:
    """Copied without ETags (another tool's copy keeps no ETag record), then tokens.bin replaced by other bytes of
    the same size: the block digests still refuse it."""
    url = f"s3://{BUCKET}/noetag"
    local, _ = uploaded(tmp_path, "noetag", documents(200, seed=12))
    version = ObjectClient(Location.parse(current_version(url)))
    header = json.loads(version.get("header.json", 1 << 20)[0])
    for record in header["objects"].values():
        record.pop("etag", None)
    written = json.dumps(header).encode()
    version.put("header.json", written)
    root = ObjectClient(Location.parse(url))
    pointer = read_pointer(root)
    assert pointer is not None
    root.put("current.json", json.dumps({**pointer, "header": hex_digest(written)}).encode())
    assert _epoch(sb.open_store(url)) == _epoch(local)  # no ETags: read, and checked by digests
    version.put("tokens.bin", bytes(reversed(bytes(local.tokens))))
    with pytest.raises(DataError, match=r"tokens\.bin: block \d+ .*does not match"):
        _epoch(sb.open_store(url))


def test_blocks_touched_are_fetched_once_and_the_cache_keeps_them(server: int, tmp_path: Path) -> None:
    """An epoch fetches each digest block it touches once; with a cache folder the second epoch (a new open, a new
    process's view) makes no GET for tokens at all, counted at the server."""
    local = sb.open_store(f"s3://{BUCKET}/big")
    nbytes = local.tokens.nbytes
    cache = tmp_path / "cache"
    with LoopbackProxy(server) as proxy:
        tokens_gets = [0]

        def count(number: int, line: str) -> None:
            tokens_gets[0] += line.startswith("GET") and "/tokens.bin " in line

        proxy.fault = count  # type: ignore[assignment]
        bytes_before = STATS.bytes
        first = _epoch(_through(proxy, "big", cache_dir=cache, cache_bytes=1 << 24))
        assert STATS.bytes - bytes_before <= nbytes + 3 * BLOCK  # each block once (plus the small objects)
        assert tokens_gets[0] >= 1
        tokens_gets[0] = 0
        second = _epoch(_through(proxy, "big", cache_dir=cache, cache_bytes=1 << 24))
        assert tokens_gets[0] == 0
    assert first == second
    assert STATS.cache_hits > 0


@pytest.mark.parametrize("planted", ["zeroed", "symlink", "fifo", "wrong-size"])
def test_a_bad_cache_block_is_fetched_again(server: int, tmp_path: Path, planted: str) -> None:
    """A zeroed block, a link to another file, a FIFO or a short file under a block's name: never served (no outside
    byte read, no hang), removed, and the block fetched again; the epoch equals the store's."""
    cache = tmp_path / "cache"
    expected = _epoch(sb.open_store(f"s3://{BUCKET}/big", cache_dir=cache, cache_bytes=1 << 24))
    blocks = sorted(cache.glob("*.block"))
    assert blocks
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not tokens " * 10000)
    for path in blocks:
        size = path.stat().st_size
        path.unlink()
        if planted == "zeroed":
            path.write_bytes(bytes(size))
        elif planted == "symlink":
            path.symlink_to(outside)
        elif planted == "fifo":
            os.mkfifo(path)
        else:
            path.write_bytes(b"\x01" * (size // 2))
    hits = STATS.cache_hits
    assert _epoch(sb.open_store(f"s3://{BUCKET}/big", cache_dir=cache, cache_bytes=1 << 24)) == expected
    assert STATS.cache_hits == hits  # nothing planted was served
    assert outside.read_bytes() == b"not tokens " * 10000
    assert all(p.is_file() and not p.is_symlink() for p in cache.glob("*.block"))  # fetched again, kept as blocks


_SHARE = """
import sys, streambatch as sb
store = sb.open_store(sys.argv[1], cache_dir=sys.argv[2], cache_bytes=int(sys.argv[3]))
print(sum(b.token_count for b in sb.Epoch(store, context_length=16, stride=16, batch_size=32, seed=int(sys.argv[4]))))
"""


def test_three_processes_share_one_cache_within_its_limit(server: int, tmp_path: Path) -> None:
    """Three processes reading through one cache folder at once: each reads its epoch, and the folder never holds
    more than the limit (fewer blocks than the store has)."""
    cache, limit = tmp_path / "cache", 3 * BLOCK
    url = f"s3://{BUCKET}/big"
    runs = [
        subprocess.Popen([sys.executable, "-c", _SHARE, url, str(cache), str(limit), str(seed)], stdout=subprocess.PIPE)
        for seed in (1, 2, 3)
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert all(int(out) > 0 for out in outputs)
    held = sum(p.stat().st_size for p in cache.iterdir() if p.name.endswith(".block"))
    assert 0 < held <= limit


def test_the_command_line_reads_through_a_cache_and_says_so(server: int, tmp_path: Path) -> None:
    """`epoch --cache-dir` twice in two processes: the second is served by the cache (its summary line counts the
    hits); `inspect` of an address shows what reading it cost; --cache-dir for a local source is one line."""
    url, cache = f"s3://{BUCKET}/big", tmp_path / "cache"
    argv = ["epoch", url, "-T", "16", "--stride", "16", "-B", "32", "--seed", "3", "--cache-dir", str(cache)]
    runs = [
        subprocess.run([sys.executable, "-m", "streambatch", *argv, "-o", str(tmp_path / f"{n}.jsonl")], capture_output=True)
        for n in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0]
    assert (tmp_path / "0.jsonl").read_bytes() == (tmp_path / "1.jsonl").read_bytes()
    assert "cache: 0 hits" in runs[0].stderr.decode()
    second = runs[1].stderr.decode()
    assert "cache:" in second
    assert "cache: 0 hits" not in second
    assert " 0 misses" in second
    shown = subprocess.run([sys.executable, "-m", "streambatch", "inspect", url], capture_output=True, text=True)
    assert shown.returncode == 0
    assert "object storage:" in shown.stdout
    local = tmp_path / "docs.jsonl"
    local.write_text('{"id": "a", "tokens": [1, 2, 3, 4, 5]}\n')
    refused = subprocess.run(
        [sys.executable, "-m", "streambatch", "inspect", str(local), "--cache-dir", str(cache)], capture_output=True, text=True
    )
    assert refused.returncode == 2
    assert "--cache-dir applies to a SOURCE in object storage" in refused.stderr
