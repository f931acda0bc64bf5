"""Tests for `streambatch.io.remote` under faults (a loopback proxy that delays, drops and refuses) and in DataLoader workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.io.remote.client import STATS
from streambatch.tools.proxy import LoopbackProxy

from .remote_server import BUCKET, documents, moto_server, uploaded


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


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda n, line: "503" if "tokens.bin" in line and n % 3 == 0 else None, id="503"),
        pytest.param(lambda n, line: "drop" if "tokens.bin" in line and n % 4 == 0 else None, id="dropped"),
        pytest.param(lambda n, line: "stall" if "tokens.bin" in line and n == 8 else None, id="timeout"),
    ],
)
def test_faults_are_retried_and_the_epoch_is_unchanged(server: int, local: sb.DocumentStore, fault: Any) -> None:
    """503s, dropped connections and a stalled request (past the timeout): retried with backoff, counted, same batches.

    The timeout leaves room for a slow loopback server on a loaded machine (moto answers ~40 requests a second).
    """
    before = STATS.retries
    with LoopbackProxy(server, delay=0.005, fault=fault) as proxy:
        assert _epoch(_through(proxy, timeout=3.0, retries=8)) == _epoch(local)
    assert STATS.retries > before


def test_retries_are_bounded(server: int, local: sb.DocumentStore) -> None:
    """A server that always answers 503: one StoreError line after retries + 1 attempts."""
    with LoopbackProxy(server, fault=lambda n, line: "503" if line.startswith("GET") and "tokens.bin" in line else None) as proxy:
        remote = _through(proxy, retries=2)
        with pytest.raises(StoreError, match=r"faulty/tokens\.bin: request failed after 3 attempts") as failed:
            _epoch(remote)
    assert "\n" not in str(failed.value)


def test_dataloader_workers_read_their_share(server: int, local: sb.DocumentStore) -> None:
    """Through a DataLoader with 0 or 2 workers the batches are the local ones, and two workers together fetch
    no more than one process does (each fetches only its share; response bodies: with windows of a few bytes
    a request's headers would outweigh its range)."""
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
    assert fetched[2] <= 1.2 * fetched[0]


def _raw(tensor: Any, store: sb.DocumentStore) -> bytes:
    return bytes(tensor.numpy().astype(store.dtype).tobytes())


def test_a_forked_child_is_told_to_spawn(server: int, local: sb.DocumentStore) -> None:
    """After this process read from object storage, a forked child gets one clear line instead of a hang."""
    import os

    remote = sb.open_store(f"s3://{BUCKET}/faulty")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            remote.tokens.remote.client.head("tokens.bin")
            os.write(write, b"no error")
        except StoreError as err:
            os.write(write, str(err).encode()[:500])
        os._exit(0)
    os.waitpid(pid, 0)
    assert "multiprocessing_context='spawn'" in os.read(read, 1000).decode()
