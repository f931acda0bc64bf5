"""A real S3 API on loopback for the remote-store tests: moto's ThreadedMotoServer on a free port, and stores on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streambatch as sb

SECRET = "s3cr3t-never-shown"
BUCKET = "data"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (None: unset) environment variables for the block."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_SERVE = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()  # until the test closes the pipe
server.stop()
"""


@contextmanager
def moto_server() -> Iterator[int]:
    """A moto S3 server (ThreadedMotoServer) on 127.0.0.1 (its port), with credentials in the environment and bucket
    `BUCKET` made.  It runs in a child process: DataLoader workers fork this one, and a fork must not copy the
    server's threads mid-request (their locks)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
    pytest.importorskip("obstore", reason="obstore is not installed (the remote extra)")
    port = free_port()
    child = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with environment(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY=SECRET,
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
        ):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/{BUCKET}", method="PUT")
            urllib.request.urlopen(request, timeout=10).close()  # moto does not check signatures
            yield port
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def documents(count: int = 24, seed: int = 0, high: int = 50_000, prefix: str = "d") -> list[sb.Document]:
    """Documents of 8 to 400 tokens, ids d0, d1, ... (*prefix* instead of d)"""
    rng = np.random.default_rng(seed)
    return [sb.Document(f"{prefix}{i}", "train", rng.integers(0, high, int(rng.integers(8, 400)))) for i in range(count)]


def current_version(url: str) -> str:
    """The address of the version the store pointer at *url* names (where that store's objects are)."""
    from streambatch.io.remote.client import ObjectClient
    from streambatch.io.remote.location import Location
    from streambatch.io.remote.open import read_pointer

    pointer = read_pointer(ObjectClient(Location.parse(url)))
    assert pointer is not None, f"no store pointer at {url}"
    return f"{url}/{pointer['current']}"


def uploaded(tmp: Path, name: str, docs: list[sb.Document], **options: Any) -> tuple[sb.DocumentStore, sb.DocumentStore]:
    """``(local, remote)``: *docs* written to a local store and uploaded to ``s3://BUCKET/name``."""
    from streambatch.io.remote.upload import upload_store

    local = sb.write_store(tmp / name, docs)
    return local, upload_store(tmp / name, f"s3://{BUCKET}/{name}", **options)
