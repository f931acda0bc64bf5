"""Tests for `streambatch.io.remote` under faults (a loopback proxy that delays, drops and refuses) and in DataLoader workers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import DataError, StoreError
from streambatch.io.remote.client import STATS
from streambatch.tools.proxy import LoopbackProxy
from tests.remote_server import BUCKET, documents, moto_server, uploaded


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def local(server: int, tmp_path_factory: pytest.TempPathFactory) -> sb.DocumentStore:
    store, _ = uploaded(tmp_path_factory.mktemp("faults"), "faulty", documents(16, seed=3))
    return store


def _epoch(store: sb.DocumentStore) -> list[Any]:
    return [
        (b.index, b.inputs.tobytes(), b.targets.tobytes())
        for b in sb.Epoch(store, context_length=16, batch_size=8, stride=16, seed=2)
    ]


def _through(proxy: LoopbackProxy, **options: Any) -> sb.DocumentStore:
    return sb.open_store(f"s3://{BUCKET}/faulty", options={"endpoint": proxy.url}, **options)


def _tokens_gets(action: str, every: int) -> Any:
    """A fault: *action* for the first GET of tokens.bin and every *every*-th after it (whole checked blocks make
    few range requests, so the faults are counted among those, not among all requests)."""
    seen = [0]

    def fault(number: int, line: str) -> str | None:
        if not (line.startswith("GET") and "tokens.bin" in line):
            return None
        seen[0] += 1
        return action if seen[0] % every == 1 else None

    return fault


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda: _tokens_gets("503", every=3), id="503"),
        pytest.param(lambda: _tokens_gets("drop", every=4), id="dropped"),
        pytest.param(lambda: _tokens_gets("stall", every=1000), id="timeout"),
    ],
)
def test_faults_are_retried_and_the_epoch_is_unchanged(server: int, local: sb.DocumentStore, fault: Any) -> None:
    """503s, dropped connections and a stalled request (past the timeout): retried with backoff, counted, same batches.

    The timeout leaves room for a slow loopback server on a loaded machine (moto answers ~40 requests a second).
    """
    before = STATS.retries
    with LoopbackProxy(server, delay=0.005, fault=fault()) as proxy:
        assert _epoch(_through(proxy, timeout=3.0, retries=8)) == _epoch(local)
    assert STATS.retries > before


def test_retries_are_bounded(server: int, local: sb.DocumentStore) -> None:
    """A server that always answers 503: one StoreError line after retries + 1 attempts."""
    with LoopbackProxy(server, fault=lambda n, line: "503" if line.startswith("GET") and "tokens.bin" in line else None) as proxy:
        remote = _through(proxy, retries=2)
        with pytest.raises(StoreError, match=r"faulty/v/[0-9a-f-]+/tokens\.bin: request failed after 3 attempts") as failed:
            _epoch(remote)
    assert "\n" not in str(failed.value)


def test_dataloader_workers_read_their_share(server: int, local: sb.DocumentStore) -> None:
    """Through a DataLoader with 0 or 2 workers the batches are the local ones, and every process fetches each
    digest block it touches once (checked blocks are kept for the next batch that needs them): one process the
    store's token bytes once, two workers at most twice (a shuffled share touches every block of a small store)."""
    torch_data = pytest.importorskip("torch.utils.data", reason="torch is not installed")
    import streambatch.torch as sbt

    expected = sorted(_epoch(local))
    fetched = {}
    for workers in (0, 2):
        with LoopbackProxy(server) as proxy:
            remote = _through(proxy)
            opened = proxy.body_bytes
            epoch = sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=2)
            context = {"multiprocessing_context": "spawn"} if workers else {}  # obstore's runtime does not survive a fork
            loader = torch_data.DataLoader(sbt.EpochDataset(epoch), batch_size=None, num_workers=workers, **context)
            got = sorted((int(b.index), _raw(b.inputs, local), _raw(b.targets, local)) for b in loader)
            fetched[workers] = proxy.body_bytes - opened
        assert got == expected
    assert fetched[0] <= 1.05 * local.tokens.nbytes + 4096
    assert fetched[2] <= 2 * (1.05 * local.tokens.nbytes + 4096)


def _raw(tensor: Any, store: sb.DocumentStore) -> bytes:
    return bytes(tensor.numpy().astype(store.dtype).tobytes())


def test_a_forked_child_reads_through_its_helper(server: int, local: sb.DocumentStore) -> None:
    """After this process read from object storage, a forked child (whose copy of obstore cannot run) still reads:
    its requests go to a helper process it starts, and the answers are the parent's."""
    import os

    remote = sb.open_store(f"s3://{BUCKET}/faulty")
    expected = _epoch(remote)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, repr(_epoch(remote) == expected).encode())
        except BaseException as err:
            os.write(write, repr(err).encode()[:500])
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1000).decode() == "True"


def test_forked_dataloader_workers_give_the_local_epoch(server: int, local: sb.DocumentStore) -> None:
    """DataLoader(num_workers=2) with Linux's default start method (fork), over a store this process already
    read: the batches are the local epoch's."""
    torch_data = pytest.importorskip("torch.utils.data", reason="torch is not installed")
    import streambatch.torch as sbt

    remote = sb.open_store(f"s3://{BUCKET}/faulty")
    _epoch(remote)  # obstore's runtime now runs in this process
    epoch = sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=2)
    loader = torch_data.DataLoader(sbt.EpochDataset(epoch), batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = sorted((int(b.index), _raw(b.inputs, local), _raw(b.targets, local)) for b in loader)
    assert got == sorted(_epoch(local))


@pytest.mark.parametrize("name", ["header.json", "offsets.bin", "tokens.bin"])
def test_a_lying_content_length_is_a_data_error(server: int, local: sb.DocumentStore, name: str) -> None:
    """A server announcing 2**40 bytes (and sending a few) is one DataError line naming the object: nothing of
    that size is allocated, and the process lives on."""
    huge = b'HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nETag: "x"\r\n'
    huge += b"Content-Range: bytes 0-1099511627775/1099511627776\r\n\r\n"

    def fault(number: int, line: str) -> bytes | None:
        return huge + b"x" * 4096 if line.startswith("GET") and name in line else None

    with LoopbackProxy(server, fault=fault) as proxy, pytest.raises(DataError) as failed:
        _epoch(_through(proxy, retries=1))
    assert re.search(rf"faulty/v/[0-9a-f-]+/{re.escape(name)}", str(failed.value))
    assert "\n" not in str(failed.value)


def test_a_presigned_query_and_retries_are_not_printed(server: int, local: sb.DocumentStore, caplog: Any) -> None:
    """An address with a query string (a presigned URL) is shown redacted in the error line, and the retries are
    summarised in that line (counted), not logged one warning each."""
    from streambatch.io.remote.location import Location, redact

    signed = "https://127.0.0.1/data/faulty?X-Amz-Credential=AKIA&X-Amz-Signature=deadbeefcafe"
    assert "deadbeefcafe" not in Location.parse(signed).url
    assert "deadbeefcafe" not in redact(f"GET {signed} failed: token=abc123 sig=deadbeefcafe")
    assert "abc123" not in redact("token=abc123")
    with LoopbackProxy(server, fault=lambda n, line: "503" if line.startswith("GET") and "tokens.bin" in line else None) as proxy:
        remote = _through(proxy, retries=3)
        with caplog.at_level("WARNING", logger="streambatch.remote"), pytest.raises(StoreError) as failed:
            _epoch(remote)
    assert "after 4 attempts" in str(failed.value)
    assert "status 503 x3" in str(failed.value)
    assert [r for r in caplog.records if r.levelname == "WARNING"] == []
